"""bench/multigpu_qwen35.py, issue 27 item 4's command, rehearsed on the CPU (gloo) at the tiny shape: the base
run on 2 processes, the same spec on one (pitlab's single-device path) and the scaling efficiency between them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
multigpu = pytest.importorskip("multigpu_qwen35")


def test_scaling_is_the_ratio_of_per_gpu_rates():
    """1,000 tokens/s on one GPU and 1,800 per GPU on two: efficiency 1.8; without either stage's rate: None."""
    stages = {"single": {"tokens_per_second_per_gpu": 1000.0, "parallelism": "single-device"},
              "base": {"tokens_per_second_per_gpu": 1800.0, "parallelism": "FSDP2"}}
    got = multigpu.scaling(stages, 2)
    assert got == {"tokens_per_second_per_gpu": {"1": 1000.0, "2": 1800.0}, "efficiency": 1.8,
                   "parallelism": {"1": "single-device", "2": "FSDP2"}}
    assert multigpu.scaling({"base": stages["base"], "single": {"error": "OOM"}}, 2) is None
    assert multigpu.scaling({"single": stages["single"]}, 2) is None


def test_the_item_4_command_runs_base_and_single_on_gloo(tmp_path):
    """The stages base (2 ranks, FSDP2) and single (1 process, single-device path) with ``--checkpointing auto``
    (the planner turns it off: the tiny model fits) and ``--final-checkpoint-only``: both measured, the base
    run's checkpoint deleted (neither merge nor resume asked for), 10 steps each, the efficiency their ratio."""
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(ROOT / "bench" / "multigpu_qwen35.py"), "--work", str(tmp_path / "mg"),
                    "--out", str(out), "--tiny", "--nproc", "2", "--stages", "base,single", "--steps", "10",
                    "--final-checkpoint-only", "--checkpointing", "auto"], check=True, cwd=ROOT, timeout=600,
                   capture_output=True)
    res = json.loads((out / "multigpu.json").read_text())
    base, single = res["stages"]["base"], res["stages"]["single"]
    assert (base["world_size"], single["world_size"]) == (2, 1)
    assert (base["parallelism"], single["parallelism"]) == ("FSDP2", "single-device (fp32 master + bf16 compute copy)")
    assert base["activation_checkpointing"] is False and single["activation_checkpointing"] is False
    assert base["summary"]["steps"] == single["summary"]["steps"] == 10
    assert base["checkpoint_removed"] == "neither merge nor resume in --stages"
    assert not (tmp_path / "mg" / "run-base" / "checkpoint").exists()
    assert not (tmp_path / "mg" / "run-single" / "checkpoint").exists()
    assert res["scaling"]["efficiency"] == pytest.approx(
        base["tokens_per_second_per_gpu"] / single["tokens_per_second_per_gpu"], rel=1e-12)
    assert res["skipped"]["resume"] == "--final-checkpoint-only: no mid-run checkpoint"
