"""Interrupted local runs: the torchrun ranks die with `pitlab run` (even when it is SIGKILLed), and SIGINT or
SIGTERM leave status Interrupted naming the last durable checkpoint, with ``status.progress`` at the last step
logged (step 0 of the planned steps when none was), whether or not the metrics follower had read it."""

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

from pitlab import local
from pitlab.api import load_resource, stages
from pitlab.errors import TrainingError
from pitlab.pipeline.base import SilentReporter, StatusWriter, TrainingRun

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
    flat = " ".join(text.split())
    assert f"interrupted by {sig.name}; status Interrupted" in flat
    # a log (not a terminal) gets plain progress lines, no bars, and the error is its last line
    assert "━" not in text and text.rstrip().splitlines()[-1].endswith(" --nproc 2`"), text[-3000:]
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


def _train_stage_with(tmp_path: Path, monkeypatch, fake_training) -> tuple[BaseException, dict]:
    """The train stage walked as `pitlab run` walks it (:func:`pitlab.local._walk`), ``fake_training(metrics,
    on_step)`` standing in for torchrun; returns what the walk raised and the status.json it left."""
    res = load_resource(_small_spec(tmp_path))
    run_dir = tmp_path / "out" / res.metadata.name
    run_dir.mkdir(parents=True)
    st = StatusWriter(run_dir / "status.json", res)
    st.done(stages.VALIDATE, "spec is valid")
    run = TrainingRun(res, tmp_path / "out", run_dir, st, SilentReporter(), None, 2, local.run_leakage_eval_local)

    def run_training(spec_path, run_dir_, nproc, on_step=None, base=None, poll_s=0.5):
        assert (run_dir_, nproc) == (run_dir, 2)
        fake_training(run_dir / "train" / "metrics.jsonl", on_step)

    monkeypatch.setattr("pitlab.trainer.launch.run_training", run_training)
    with pytest.raises(BaseException) as err:
        local._walk((stages.TRAIN,), run, st)
    return err.value, json.loads((run_dir / "status.json").read_text())["status"]


def _record(step: int, total: int = 79) -> dict:
    """A trainer metrics line (:mod:`pitlab.trainer.metrics`) of step ``step``, 0.1 s a step since step 0."""
    return {"step": step, "total_steps": total, "loss": 8.0 - step / 10, "mean_tokens_per_second": 5000.0 + step,
            "elapsed_s": step / 10, "start_step": 0}


def _log(metrics: Path, steps: range, partial: bool = False) -> None:
    metrics.parent.mkdir(parents=True, exist_ok=True)
    with open(metrics, "a") as f:
        f.writelines(json.dumps(_record(s)) + "\n" for s in steps)
        if partial:  # the trainer was writing the next line when it stopped
            f.write(json.dumps(_record(steps[-1] + 1))[:20])


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM", "failure"])
def test_an_interrupt_before_the_follower_read_the_steps_leaves_the_logged_progress(tmp_path, monkeypatch, stop):
    """The race of test_resume_after_sigint_equals_an_uninterrupted_run made certain: the follower reported step 2
    (then polls every 0.5 s); steps 3 to 5 were logged (and step 5's checkpoint written) before the signal came.
    The status written as Interrupted (or Failed) has the progress at step 5, not 2, and not none at all, without
    an ETA (the run stopped)."""
    def training(metrics: Path, on_step) -> None:
        _log(metrics, range(1, 3))
        on_step(_record(2))
        _log(metrics, range(3, 6), partial=True)
        raise local.Interrupted(stop) if stop != "failure" else TrainingError("training failed (exit code 1)")

    err, status = _train_stage_with(tmp_path, monkeypatch, training)
    assert isinstance(err, local.Interrupted if stop != "failure" else local.RunError)
    assert status["phase"] == ("Interrupted" if stop != "failure" else "Failed")
    assert status["progress"] == {"step": 5, "totalSteps": 79, "loss": 7.5, "tokensPerSecond": 5005.0,
                                  "percent": 6.3}  # a stopped run keeps its step, not its ETA
    assert status["checkpointUri"] == str(tmp_path / "out" / "sp500-fomc-demo" / "checkpoint")


def test_an_interrupt_before_any_step_was_logged_leaves_step_0_of_the_planned_steps(tmp_path, monkeypatch):
    """Interrupted while torchrun started (no metrics file yet): progress is step 0 of the steps the trainer will
    count for the spec's token budget (40,000 tokens in steps of 64 × 4 × 2 processes: 79), 0 %."""
    from pitlab.trainer.data import steps_for_budget

    def training(metrics: Path, on_step) -> None:
        assert not metrics.exists()
        raise local.Interrupted("SIGINT")

    err, status = _train_stage_with(tmp_path, monkeypatch, training)
    assert isinstance(err, local.Interrupted) and status["phase"] == "Interrupted"
    assert status["progress"] == {"step": 0, "totalSteps": 79, "percent": 0.0}
    assert load_resource(tmp_path / "pit.yaml").spec.optimizer_steps(2) == steps_for_budget(40_000, 64, 4, 1, 2) == 79
    for tokens, nproc in ((1, 1), (512, 2), (513, 2), (5_000_000, 3)):
        res = load_resource(tmp_path / "pit.yaml")
        res.spec.tokens = tokens
        assert res.spec.optimizer_steps(nproc) == steps_for_budget(tokens, 64, 4, 1, nproc)


def test_an_interrupted_training_without_checkpoints_says_how_to_make_it_resumable(tmp_path, monkeypatch):
    """No checkpoint yet: with ``checkpoint.everySteps: 5`` the message says the stage starts over; with 0 (only
    at the end, the local examples' setting) it also names the field and what to set, since --resume cannot
    continue such a training."""
    def training(metrics: Path, on_step) -> None:
        raise local.Interrupted("SIGINT")

    _, status = _train_stage_with(tmp_path, monkeypatch, training)
    trained = next(c for c in status["conditions"] if c["type"] == "Trained")["message"]
    assert trained == "interrupted by SIGINT during train; no durable checkpoint: the stage starts over"
    res = load_resource(_small_spec(tmp_path))
    res.spec.checkpoint.every_steps = 0
    run = TrainingRun(res, tmp_path / "out", tmp_path / "out" / "x", None, SilentReporter(), None, 2, None)
    assert local.durable_state(run) == (
        "no durable checkpoint: the stage starts over (checkpoint.everySteps: 0 saves only at the end; set it to N "
        "for a checkpoint every N steps that --resume continues from)")
