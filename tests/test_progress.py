"""Percent done and ETA of a training run (pitlab.api.progress), from the trainer's metrics records to
``status.progress`` (operator and ``pitlab run``) and the ``Done%`` / ``ETA`` columns of ``kubectl get``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_builders_schemas import REPO, validate_pitlab

from pitlab.api import parse_resource, stages
from pitlab.api.progress import Estimate, estimate, estimate_record, format_eta, percent_done
from pitlab.api.status import Progress
from pitlab.api.summary import progress_record

# The published recipe's run: 56,430 steps in 18 h 36 min (66,960 s), 1.18660 s a step.
STEPS, SECONDS = 56_430, 66_960


@pytest.mark.parametrize("step, total, percent", [
    (0, 100, 0.0), (1, 3, 33.3), (2, 3, 66.6), (28_215, STEPS, 50.0), (56_429, STEPS, 99.9), (STEPS, STEPS, 100.0),
    (120, 100, 100.0), (5, None, None), (5, 0, None)])
def test_percent_is_floored_so_that_100_means_done(step, total, percent) -> None:
    assert percent_done(step, total) == percent


@pytest.mark.parametrize("step, total, elapsed, start, expected", [
    (28_215, STEPS, SECONDS / 2, 0, Estimate(50.0, 33_480)),          # half way: as long again
    (10_000, STEPS, 11_866.0, 0, Estimate(17.7, 55_094)),               # 1.1866 s a step x 46,430 steps left
    (30_000, STEPS, 11_866.0, 20_000, Estimate(53.1, 31_362)),          # resumed at 20,000: timed from there
    (30_000, STEPS, 11_866.0, 0, Estimate(53.1, 10_454)),               # (what ignoring the resume would say)
    (20_000, STEPS, 0.0, 20_000, Estimate(35.4, None)),                 # the attempt has not timed a step yet
    (1, 40, 0.0, 0, Estimate(2.5, None)),                               # no time measured
    (40, 40, 30.0, 0, Estimate(100.0, 0)),                              # done: nothing left
    (3, None, 30.0, 0, Estimate(None, None)),                           # total unknown
])
def test_eta_is_the_attempts_pace_times_the_steps_left(step, total, elapsed, start, expected) -> None:
    assert estimate(step, total, elapsed, start) == expected


@pytest.mark.parametrize("seconds, text", [
    (None, None), (0, "0s"), (45, "45s"), (59, "59s"), (60, "1m00s"), (725, "12m05s"), (3_599, "59m59s"),
    (3_600, "1h00m"), (11_220, "3h07m"), (33_480, "9h18m"), (86_400, "1d00h"), (187_200, "2d04h"), (-5, "0s")])
def test_eta_for_people(seconds, text) -> None:
    assert format_eta(seconds) == text


def _record(step: int, elapsed: float, start: int = 0, total: int = 40) -> dict:
    """A metrics line as pitlab.trainer.train writes it."""
    return {"step": step, "total_steps": total, "loss": 3.25, "lr": 1e-3, "grad_norm": 1.5, "tokens": step * 512,
            "tokens_per_second": 2048.0, "mean_tokens_per_second": 2000.0, "mfu": None, "peak_memory_bytes": 1,
            "elapsed_s": elapsed, "start_step": start}


def test_progress_line_carries_the_eta_and_the_status_derives_percent_and_eta() -> None:
    rec = _record(10, 25.0)
    assert estimate_record(rec) == Estimate(25.0, 75)
    line = progress_record(rec)
    assert line == {"step": 10, "totalSteps": 40, "loss": 3.25, "tokensPerSecond": 2000.0, "etaSeconds": 75}
    assert Progress.model_validate(line).to_yaml_dict() == {**line, "percent": 25.0, "eta": "1m15s"}
    # an older trainer's record (no start_step) is timed from step 0; one without elapsed_s has no ETA
    assert estimate_record({k: v for k, v in _record(30, 60.0).items() if k != "start_step"}) == Estimate(75.0, 20)
    assert "etaSeconds" not in progress_record({"step": 3, "total_steps": 9})


def test_derived_fields_follow_their_sources() -> None:
    p = Progress(step=10, total_steps=40, eta_seconds=75)
    p.step = 30
    p.eta_seconds = 20
    assert (p.percent, p.eta) == (75.0, "20s")
    assert Progress.model_validate({"step": 3, "totalSteps": 9, "percent": 99.0, "eta": "soon"}).to_yaml_dict() == {
        "step": 3, "totalSteps": 9, "percent": 33.3}
    assert p.finished().to_yaml_dict() == {"step": 40, "totalSteps": 40, "percent": 100.0, "etaSeconds": 0,
                                           "eta": "0s"}
    assert Progress(step=7).to_yaml_dict() == {"step": 7}


def test_status_with_progress_validates_against_the_crd() -> None:
    doc = yaml.safe_load((REPO / "examples" / "pittraining.yaml").read_text())
    doc["status"] = {"phase": "Training", "progress": Progress.model_validate(progress_record(
        _record(28_215, SECONDS / 2, total=STEPS))).to_yaml_dict()}
    assert doc["status"]["progress"]["percent"] == 50.0 and doc["status"]["progress"]["eta"] == "9h18m"
    assert validate_pitlab(doc) == []
    doc["status"]["progress"]["percent"] = 101
    assert validate_pitlab(doc) == ["status.progress.percent: 101 is greater than the maximum of 100"]


def test_pitlab_run_writes_percent_and_eta_into_status_json(tmp_path: Path, monkeypatch) -> None:
    """The train stage of ``pitlab run`` (torchrun replaced by a stand-in that reports two steps): status.json
    shows the same progress fields the operator writes, while training and at its end."""
    from pitlab.pipeline import train
    from pitlab.pipeline.base import SilentReporter, StatusWriter, TrainingRun

    res = parse_resource(yaml.safe_load((REPO / "examples" / "local-sp500-fomc.yaml").read_text()))
    status_json = tmp_path / "status.json"
    seen: list[dict] = []

    def fake_run_training(spec_path, run_dir, nproc, on_step=None, base=None):
        for rec in (_record(10, 25.0), _record(40, 100.0)):
            on_step(rec)
            seen.append(json.loads(status_json.read_text())["status"]["progress"])
        return {"checkpoint": str(run_dir / "checkpoint"), "steps": 40, "first_loss": 7.5, "final_loss": 3.25,
                "mean_tokens_per_second": 2000.0}

    monkeypatch.setattr("pitlab.trainer.launch.run_training", fake_run_training)
    st = StatusWriter(status_json, res)
    run = TrainingRun(res=res, out_root=tmp_path, run_dir=tmp_path / "run", st=st, reporter=SilentReporter(),
                      checked=None, nproc=2, run_evaluation=lambda *a, **k: {})
    train.run(run, stages.TRAIN)
    common = {"totalSteps": 40, "loss": 3.25, "tokensPerSecond": 2000.0}
    assert seen == [{"step": 10, **common, "percent": 25.0, "etaSeconds": 75, "eta": "1m15s"},
                    {"step": 40, **common, "percent": 100.0, "etaSeconds": 0, "eta": "0s"}]
    final = json.loads(status_json.read_text())["status"]
    assert final["progress"] == seen[-1] and final["phase"] == "Training"


def test_newest_record_is_the_last_whole_step_line_of_the_metrics_file(tmp_path):
    """``newest_record``: the last complete line that is a JSON object with an integer step (step 3 here: the line
    after it is half written, the one before has no step); only the file's last ``window`` bytes are read; a
    missing file, a directory and a file without a step give None."""
    from pitlab.api.progress import newest_record

    m = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s, "pad": "x" * 200}) for s in (1, 2, 3)]
    m.write_text("\n".join(lines + ['{"note": "no step"}', '{"step": 4, "lo']))
    assert newest_record(m) == {"step": 3, "loss": 1.0 / 3, "pad": "x" * 200}
    assert newest_record(m, window=len(lines[2]) + 40) == newest_record(m)  # the tail alone holds step 3
    assert newest_record(m, window=30) is None  # no whole step line in the last 30 bytes
    assert newest_record(tmp_path / "missing.jsonl") is None and newest_record(tmp_path) is None
    m.write_text('{"step": "3"}\n[1, 2]\n')
    assert newest_record(m) is None
