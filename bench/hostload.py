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


class GpuSampler:
    """The GPU's SM clock (MHz), power (W), temperature (°C) and clock-event reasons sampled by ``nvidia-smi -lms
    interval_ms`` while the ``with`` block runs; :meth:`summary` gives their median/min/max and the reasons seen
    (an H200's SM clock is 1,980 MHz at most: a step time that moves with it is the GPU's, not pitlab's). Without
    ``nvidia-smi`` the summary is ``{"unavailable": reason}``."""

    QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"

    def __init__(self, interval_ms: int = 100):
        self.interval_ms = interval_ms
        self.proc = None
        self.error = None
        self.lines: list[str] = []

    def __enter__(self):
        import subprocess
        import tempfile
        self.out = tempfile.TemporaryFile(mode="w+")
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
        try:
            self.proc = subprocess.Popen(["nvidia-smi", f"--id={gpu}", f"--query-gpu={self.QUERY}",
                                          "--format=csv,noheader,nounits", f"-lms={self.interval_ms}"],
                                         stdout=self.out, stderr=subprocess.DEVNULL)
        except OSError as err:
            self.error = f"{type(err).__name__}: {err}"
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.out.seek(0)
            self.lines = [ln.strip() for ln in self.out if ln.strip()]
        self.out.close()
        return False

    def summary(self) -> dict:
        if self.error or not self.lines:
            return {"unavailable": self.error or "no samples"}
        clocks, power, temp, reasons = [], [], [], set()
        for line in self.lines:
            parts = [p.strip() for p in line.split(",")]
            try:
                clocks.append(float(parts[0]))
                power.append(float(parts[1]))
                temp.append(float(parts[2]))
            except (ValueError, IndexError):
                continue
            if len(parts) > 3 and parts[3] not in ("0x0000000000000000", "[N/A]"):
                reasons.add(parts[3])
        if not clocks:
            return {"unavailable": f"unreadable samples: {self.lines[:2]}"}
        med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
        return {"samples": len(clocks), "sm_mhz_median": med(clocks), "sm_mhz_min": min(clocks),
                "power_w_median": med(power), "power_w_max": max(power), "temp_c_max": max(temp),
                "clock_event_reasons": sorted(reasons)}
