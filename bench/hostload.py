"""How busy a device call's host is, recorded beside a timing: the same code has run 1.37 x apart on two
machines of one kind (bench/RESULTS.md, trainer throughput, 2026-12-05), and pitlab's compiled path is more
sensitive to the host than the plain loop."""

from __future__ import annotations

import os
import time

import torch


def host_load(launches: int = 5000) -> dict:
    """The host's 1-minute load average, its CPU count and the host time of one small kernel launch
    (microseconds: mean of ``launches`` ``add_`` calls on a 1-element tensor, not synchronised in between; on the
    CPU the same on a CPU tensor)."""
    cuda = torch.cuda.is_available()
    x = torch.zeros(1, device="cuda" if cuda else "cpu")
    for _ in range(500):
        x.add_(1)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    launch_us = (time.perf_counter() - t0) / launches * 1e6
    if cuda:
        torch.cuda.synchronize()
    return {"loadavg_1min": os.getloadavg()[0], "cpus": os.cpu_count(), "launch_us": round(launch_us, 2)}
