"""glibc's malloc told to keep freed memory (pitlab.evaluator.heap): in force on Linux, off on request, and the
statistics bit-identical either way."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code_or_args: list[str], keep: str) -> str:
    env = {**os.environ, "PITLAB_KEEP_FREED_MEMORY": keep, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *code_or_args], env=env, cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=600).stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_freed_memory_in_force_and_off_on_request():
    code = "from pitlab.evaluator.heap import keep_freed_memory as k; print(k(), k())"
    assert _run(["-c", code], "1").split() == ["True", "True"]
    assert _run(["-c", code], "0").split() == ["False", "False"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_block_is_reused_without_page_faults(monkeypatch):
    # 256 MiB allocated, touched, freed, allocated and touched again; 4 KiB pages (numpy's huge-page advice off):
    # kept, the second touch faults almost nothing; returned to the system, it faults all 65,536 pages again
    code = ("import resource, numpy as np\n"
            "from pitlab.evaluator.heap import keep_freed_memory\n"
            "keep_freed_memory()\n"
            "a = np.ones(1 << 25); del a\n"
            "f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "b = np.ones(1 << 25)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)")
    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "0")
    kept, returned = int(_run(["-c", code], "1")), int(_run(["-c", code], "0"))  # measured: 0 and 65,537
    assert kept < 1_000 and returned >= 60_000, (kept, returned)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_statistics_bit_identical_with_and_without(tmp_path):
    args = ["bench/bench_statistics.py", "--dim", "12", "--securities", "40", "--dates", "20", "--resamples", "10"]
    out = {}
    for keep in ("1", "0"):
        _run([*args, "--out", str(tmp_path / f"s{keep}.json")], keep)
        out[keep] = json.loads((tmp_path / f"s{keep}.json").read_text())
    for k in ("premium", "premium_ci", "r2_on", "r2_off", "protocol_r2"):
        assert out["1"][k] == out["0"][k], k
    assert math.isfinite(out["1"]["premium"]) and out["1"]["premium_ci"][0] < out["1"]["premium_ci"][1]
