"""Training processes live no longer than the process that started them (Linux).

``pitlab run`` starts ``torchrun`` in its own session (process group) with a parent-death signal, and every rank
watches its parent: when ``pitlab run`` is killed (even with SIGKILL, which it cannot handle) ``torchrun`` gets
SIGTERM from the kernel and stops its ranks, and a rank whose ``torchrun`` is gone exits within a second. An
interrupted ``pitlab run`` stops the whole group itself (:func:`stop_group`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time

PR_SET_PDEATHSIG = 1
PARENT_POLL_S = 0.5


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when the thread that started it ends (``prctl``; Linux
    only, a no-op elsewhere). Used as ``preexec_fn`` of the torchrun child (started from the main thread)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def exit_with_parent(poll_s: float = PARENT_POLL_S, code: int = 143) -> threading.Thread:
    """Start a daemon thread that ends this process (``os._exit(code)``) once its parent is gone (it was
    re-parented: ``os.getppid()`` changed). Used by every rank, whose parent is torchrun."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(code)

    t = threading.Thread(target=watch, name="pitlab-parent-watch", daemon=True)
    t.start()
    return t


def stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Stop ``proc`` and every process of its session (it was started with ``start_new_session=True``): SIGTERM
    to the group, then SIGKILL after ``grace_s`` seconds if any member remains."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # ranks that outlived torchrun, or a torchrun stuck in teardown
    except ProcessLookupError:
        pass
    proc.wait()
