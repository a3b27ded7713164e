"""A real ``moto_server`` process on 127.0.0.1 for the storage tests (``moto[s3,server]``).

Faults: :meth:`MotoServer.freeze` stops the process (SIGSTOP: it accepts no more work, in-flight requests
get no answer) and :meth:`MotoServer.thaw` lets it run again with its buckets and objects, as a restarted
MinIO or Ceph would have them on disk (moto keeps state in memory only, so a killed moto comes back empty;
its request recorder cannot replay parallel multipart uploads). :meth:`MotoServer.kill` and :meth:`start`
are the hard fault (SIGKILL, the objects are gone).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ACCESS_KEY, SECRET_KEY = "pitlab-test-key", "pitlab-test-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """``python -m moto.server`` on ``127.0.0.1:<port>`` as a subprocess (``start``/``kill``/``restart``)."""

    def __init__(self, workdir: Path, port: int | None = None):
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.workdir = Path(workdir)
        self.log = self.workdir / "moto-server.log"
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        """The variables a client needs: endpoint, dummy credentials, region, few retries and short timeouts."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "3",
                "PITLAB_S3_TIMEOUT_S": "5"}

    def start(self) -> None:
        env = dict(os.environ)
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.pop(k, None)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                          str(self.port)], stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {self.endpoint}; see {self.log}")
                time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the server (no shutdown: in-flight requests get a reset connection)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def freeze(self) -> None:
        """SIGSTOP the server: connections are still accepted by the kernel, nothing is answered."""
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT: the server runs again with the buckets and objects it held."""
        self.proc.send_signal(signal.SIGCONT)

    def reset(self) -> None:
        """Forget every bucket and object."""
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"),
                               timeout=30).read()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
