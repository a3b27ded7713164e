"""Object storage throughput: upload and download MB/s of one large object through ``pitlab.storage``, to a
local ``moto_server`` process and to a local-disk folder, in the same run, with the same calls.

    .venv/bin/python bench/bench_s3.py --size-mib 1024 --out bench/results/s3-moto-1gib.json

Each transfer goes through :func:`pitlab.storage.upload_file` / :func:`pitlab.storage.download_file`: the
sha256 is computed once before the upload (timed separately, ``hash_s``) and verified after the download
(included in the download time, as in every real read). S3 uses multipart transfers (``--part-mib`` parts,
``--concurrency`` in parallel); the local target is a copy to a ``.part`` file, fsync and rename. The peak
resident memory of this process above its baseline is sampled every 10 ms during each transfer, to show that
memory stays bounded by the parts in flight, not by the object size. MB = 10^6 bytes; MiB = 2^20 bytes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test suite's moto_server launcher

from s3server import MotoServer  # noqa: E402

MiB = 1 << 20


class PeakRss:
    """Peak RSS (bytes) of this process above the value at start, sampled every 10 ms in a thread."""

    def __enter__(self):
        self.proc = psutil.Process()
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()
        return self

    def _run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.01)

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join()
        self.delta = self.peak - self.base


def timed(fn):
    with PeakRss() as mem:
        t0 = time.perf_counter()
        out = fn()
        secs = time.perf_counter() - t0
    return out, secs, mem.delta


def machine() -> dict:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    return {"nproc": os.cpu_count(), "cpu": model, "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "platform": platform.platform()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024, help="object size in MiB (default 1024 = 1 GiB)")
    ap.add_argument("--part-mib", type=int, default=64, help="multipart part size in MiB (default 64)")
    ap.add_argument("--concurrency", type=int, default=8, help="parallel parts (default 8)")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-s3-", dir=args.workdir))
    server = MotoServer(work)
    server.start()
    try:
        os.environ.update(server.env())
        os.environ.update(PITLAB_S3_PART_SIZE_MIB=str(args.part_mib), PITLAB_S3_CONCURRENCY=str(args.concurrency),
                          AWS_MAX_ATTEMPTS="5", PITLAB_S3_TIMEOUT_S="120")
        from pitlab import storage
        from pitlab.storage import s3

        s3.client()[0].create_bucket(Bucket="bench")
        size = args.size_mib * MiB
        src = work / "object.bin"
        rng = np.random.default_rng(0)
        with open(src, "wb") as f:  # incompressible content, written in 64 MiB blocks
            for _ in range(0, size, 64 * MiB):
                f.write(rng.integers(0, 256, min(64 * MiB, size - f.tell()), dtype=np.uint8).tobytes())
        entry, hash_s, _ = timed(lambda: storage.file_sha256(src))
        results = {"size_bytes": size, "part_size_bytes": args.part_mib * MiB, "concurrency": args.concurrency,
                   "hash_s": hash_s, "hash_MBps": size / hash_s / 1e6, "targets": {}}
        targets = {"local-disk": work / "local-copy" / "object.bin", "moto-s3": "s3://bench/object.bin"}
        for name, uri in targets.items():
            _, up_s, up_mem = timed(lambda: storage.upload_file(src, uri, entry=entry))
            back = work / f"back-{name}.bin"
            got, down_s, down_mem = timed(lambda: storage.download_file(uri, back, expected_sha256=entry.sha256))
            assert got == entry, (got, entry)
            results["targets"][name] = {"upload_s": up_s, "upload_MBps": size / up_s / 1e6,
                                        "upload_peak_rss_delta_bytes": up_mem, "download_s": down_s,
                                        "download_MBps": size / down_s / 1e6,
                                        "download_peak_rss_delta_bytes": down_mem, "sha256_verified": True}
            back.unlink()
            print(f"{name:>10}: upload {size / up_s / 1e6:8.1f} MB/s ({up_s:6.2f} s, +{up_mem / MiB:6.1f} MiB RSS)   "
                  f"download+verify {size / down_s / 1e6:8.1f} MB/s ({down_s:6.2f} s, +{down_mem / MiB:6.1f} MiB RSS)",
                  flush=True)
        s3r, loc = results["targets"]["moto-s3"], results["targets"]["local-disk"]
        results["ratio_s3_over_local"] = {"upload": s3r["upload_MBps"] / loc["upload_MBps"],
                                          "download": s3r["download_MBps"] / loc["download_MBps"]}
        results["date"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        results["machine"] = machine()
        results["command"] = " ".join([Path(sys.executable).name] + sys.argv)
        import boto3
        import moto

        results["versions"] = {"boto3": boto3.__version__, "moto": moto.__version__}
        print(json.dumps(results["ratio_s3_over_local"]), flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
