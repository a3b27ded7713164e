"""Interrupted local runs: the torchrun ranks die with `pitlab run` (even when it is SIGKILLed), and SIGINT or
SIGTERM leave status Interrupted naming the last durable checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

EXAMPLE = "examples/local-sp500-fomc.yaml"


def _long_spec(tmp_path: Path) -> Path:
    """The demo PitTraining with a token budget that trains for minutes, a checkpoint every 2 steps."""
    with open(EXAMPLE) as f:
        doc = yaml.safe_load(f)
    doc["spec"]["output"]["uri"] = str(tmp_path / "out")
    doc["spec"]["tokens"] = 5_000_000
    doc["spec"]["training"].update(seqLen=64, microBatchSize=4, warmupSteps=2)
    doc["spec"]["checkpoint"] = {"everySteps": 2, "keep": 2}
    path = tmp_path / "pit.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line holds ``text`` (this test's run folder)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((line for line in (d / "status").read_text().splitlines() if line.startswith("State:")), "")
        except OSError:
            continue
        if text in cmd and "zombie" not in state:
            out.append(int(d.name))
    return out


def _start(tmp_path: Path, data_root: Path) -> tuple[subprocess.Popen, Path]:
    spec = _long_spec(tmp_path)
    env = {**os.environ, "PITLAB_DATA_ROOT": str(data_root)}
    proc = subprocess.Popen([sys.executable, "-m", "pitlab.cli", "run", str(spec), "--nproc", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    run_dir = tmp_path / "out" / "sp500-fomc-demo"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # until a durable checkpoint exists and the ranks are training
        if (run_dir / "checkpoint" / "latest").exists() and len(_processes_mentioning(str(run_dir))) >= 3:
            return proc, run_dir
        if proc.poll() is not None:
            pytest.fail(f"pitlab run ended early ({proc.returncode}): {proc.stdout.read().decode()[-3000:]}")
        time.sleep(0.5)
    proc.kill()
    pytest.fail("no checkpoint within 600 s")


@pytest.mark.slow
def test_sigkill_of_pitlab_run_leaves_no_rank_alive(tmp_path, data_root):
    proc, run_dir = _start(tmp_path, data_root)
    ranks = _processes_mentioning(str(run_dir))
    assert len(ranks) >= 3  # torchrun and its 2 ranks
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while _processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_mentioning(str(run_dir)) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sigint_and_sigterm_leave_status_interrupted(tmp_path, data_root, sig):
    proc, run_dir = _start(tmp_path, data_root)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    text = out.decode()
    assert proc.returncode == 130, text[-3000:]
    assert f"interrupted by {sig.name}; status Interrupted" in " ".join(text.split())
    status = json.loads((run_dir / "status.json").read_text())["status"]
    assert status["phase"] == "Interrupted"
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Trained"]["status"] == "False" and conds["Trained"]["reason"] == "Interrupted"
    assert conds["Stalled"]["status"] == "True" and conds["Ready"]["status"] == "False"
    latest = (run_dir / "checkpoint" / "latest").read_text().strip()
    assert f"interrupted by {sig.name} during train; last durable checkpoint: " in conds["Trained"]["message"]
    assert latest.split("/")[-1] in conds["Trained"]["message"]
    assert _processes_mentioning(str(run_dir)) == []


def _small_spec(tmp_path: Path, models: tuple[str, ...] | None = None) -> Path:
    """The demo spec scaled down as in test_local (40k tokens, 40 securities × 10 dates), a checkpoint every 5
    steps; ``models``: the evaluation's models kept (by name; all by default)."""
    with open(EXAMPLE) as f:
        doc = yaml.safe_load(f)
    doc["spec"]["tokens"] = 40_000
    doc["spec"]["training"].update(seqLen=64, microBatchSize=4, warmupSteps=2)
    doc["spec"]["checkpoint"] = {"everySteps": 5, "keep": 2}
    ev = doc["spec"]["evaluations"][0]["spec"]
    ev["dataset"].update(universeSize=40, dates={"count": 10})
    ev["protocol"]["groupKFolds"] = 3
    ev["bootstrap"]["resamples"] = 40
    ev["regression"] = {"innerFolds": 3}
    if models is not None:
        ev["models"] = [m for m in ev["models"] if m["name"] in models]
    path = tmp_path / "pit.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _comparable(doc, root: str):
    """results.json without what differs between two runs of one spec: paths under the output root, the
    creation time, timings and the description of the host (its BLAS libraries are listed in load order)."""
    if isinstance(doc, dict):
        return {k: _comparable(v, root) for k, v in doc.items()
                if k not in ("created", "timings", "device") and not k.endswith("_s") and "seconds" not in k}
    if isinstance(doc, list):
        return [_comparable(v, root) for v in doc]
    return doc.replace(root, "<out>") if isinstance(doc, str) else doc


@pytest.mark.slow
def test_resume_after_sigint_equals_an_uninterrupted_run(tmp_path, data_root):
    spec = _small_spec(tmp_path, models=("pit-2016",))  # the trained model's evaluation: what a resume can change
    env = {**os.environ, "PITLAB_DATA_ROOT": str(data_root)}
    cmd = [sys.executable, "-m", "pitlab.cli", "run", str(spec), "--nproc", "2", "--out"]
    whole = subprocess.run(cmd + [str(tmp_path / "a")], capture_output=True, text=True, env=env)
    assert whole.returncode == 0, whole.stderr[-3000:]

    proc = subprocess.Popen(cmd + [str(tmp_path / "b")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    run_dir = tmp_path / "b" / "sp500-fomc-demo"
    deadline = time.monotonic() + 600
    while not (run_dir / "checkpoint" / "latest").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out.decode()[-3000:]
    status = json.loads((run_dir / "status.json").read_text())["status"]
    assert status["phase"] == "Interrupted" and status["progress"]["step"] < status["progress"]["totalSteps"]

    resumed = subprocess.run(cmd + [str(tmp_path / "b"), "--resume"], capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run_dir / "status.json").read_text())["status"]["phase"] == "Succeeded"
    a, b = tmp_path / "a" / "sp500-fomc-demo", run_dir
    sa, sb = (json.loads((d / "train" / "summary.json").read_text()) for d in (a, b))
    assert sa["param_sha256"] == sb["param_sha256"] and sa["steps"] == sb["steps"]
    shards = sorted(p.name for p in (a / "model").glob("*.safetensors"))
    assert shards and all((a / "model" / n).read_bytes() == (b / "model" / n).read_bytes() for n in shards)
    for ev in ("sp500-leakage",):
        ra = json.loads((tmp_path / "a" / ev / "eval" / "results.json").read_text())
        rb = json.loads((tmp_path / "b" / ev / "eval" / "results.json").read_text())
        assert _comparable(ra, str(tmp_path / "a")) == _comparable(rb, str(tmp_path / "b"))
