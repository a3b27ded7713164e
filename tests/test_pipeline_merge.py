"""The merge stage module on its own (pitlab/pipeline/merge.py): its report in JSON, the Merged message, the merge
run as its own process (the command it is given, its report read back, its failure in words) and the merge Job's
side."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from stage_ctx import World, ctx, example

from pitlab.api import ResourceStatus, stages
from pitlab.api.status import get_condition
from pitlab.operator import builders
from pitlab.pipeline import merge
from pitlab.pipeline.merge import MergeReport

REPORT = MergeReport(model_uri="/o/t/model", kind="lora", tensors=3, shards=2, bytes=4096, logits_probe="close")


def test_the_report_is_camel_case_json_and_ignores_unknown_keys() -> None:
    assert json.loads(REPORT.to_json()) == {"modelUri": "/o/t/model", "kind": "lora", "tensors": 3, "shards": 2,
                                            "bytes": 4096, "logitsProbe": "close"}
    doc = {**json.loads(REPORT.to_json()), "paramSha256": {"w": "ab"}, "seconds": 1.5}
    assert MergeReport.model_validate(doc) == REPORT
    assert MergeReport.model_validate({"model_uri": "/m", "logits_probe": "equal"}).logits_probe == "equal"


def test_to_status_records_the_model_uri_only() -> None:
    status = ResourceStatus(checkpoint_uri="/o/t/checkpoint")
    assert merge.to_status(REPORT, status) == "model written to /o/t/model"
    assert status == ResourceStatus(checkpoint_uri="/o/t/checkpoint", model_uri="/o/t/model")


def test_run_merge_runs_the_merge_command_and_reads_its_report(tmp_path, monkeypatch) -> None:
    calls = []
    out = tmp_path / "model"

    def fake_run(cmd, capture_output, text):
        calls.append(cmd)
        out.mkdir()
        (out / "merge_report.json").write_text(json.dumps({"kind": "full", "tensors": 7}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(merge.subprocess, "run", fake_run)
    summary = tmp_path / "train" / "summary.json"
    assert merge.run_merge(tmp_path / "ck", tmp_path / "base", out, summary=summary) == {"kind": "full", "tensors": 7}
    assert calls == [[sys.executable, "-m", "pitlab.cli", "merge", "--checkpoint", str(tmp_path / "ck"),
                      "--base", str(tmp_path / "base"), "--out", str(out), "--summary", str(summary)]]


def test_run_merge_without_a_summary_does_not_ask_for_one(tmp_path, monkeypatch) -> None:
    calls = []
    (tmp_path / "merge_report.json").write_text("{}")
    monkeypatch.setattr(merge.subprocess, "run",
                        lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", ""))
    assert merge.run_merge("s3://b/ck", "/base", tmp_path) == {}
    assert calls[0][-6:] == ["--checkpoint", "s3://b/ck", "--base", "/base", "--out", str(tmp_path)]


def test_a_failed_merge_says_its_exit_code_and_the_last_15_lines(tmp_path, monkeypatch) -> None:
    stderr = "\n".join(f"line {i}" for i in range(20)) + "\n"
    monkeypatch.setattr(merge.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 3, "stdout text", stderr))
    with pytest.raises(RuntimeError) as err:
        merge.run_merge(tmp_path / "ck", tmp_path / "base", tmp_path / "model")
    assert str(err.value) == "merge exited with code 3:\n" + "\n".join(f"line {i}" for i in range(5, 20))
    monkeypatch.setattr(merge.subprocess, "run",  # nothing on stderr: stdout is what it said
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "Traceback\nMergeError: shapes\n", ""))
    with pytest.raises(RuntimeError, match="^merge exited with code 1:\nTraceback\nMergeError: shapes$"):
        merge.run_merge(tmp_path / "ck", tmp_path / "base", tmp_path / "model")


def test_reconcile_creates_the_merge_job_then_records_the_model() -> None:
    pt = example("pittraining.yaml")
    world = World()
    c = ctx(pt, world)
    assert merge.reconcile(c, stages.MERGE, pt) is False
    job = builders.build_merge_job(pt, c.cfg, c.body)
    assert [m["metadata"]["name"] for m in c.plan.creates] == ["qwen35-a3b-pit-2020-merge"] == [
        job["metadata"]["name"]]
    assert get_condition(c.status, "Merged").reason == "Merging" and c.status.model_uri is None

    world.finish_job(job)
    c = ctx(pt, world, c.status)
    assert merge.reconcile(c, stages.MERGE, pt) is True
    cond = get_condition(c.status, "Merged")
    assert (cond.status, cond.reason, cond.message) == ("True", "MergeSucceeded",
                                                        "model written to /pitlab/out/qwen35-a3b-pit-2020/model")
    assert c.status.model_uri == "/pitlab/out/qwen35-a3b-pit-2020/model"
    assert c.status.children == {"mergeJob": "qwen35-a3b-pit-2020-merge"}
    c = ctx(pt, World(), c.status)
    assert merge.reconcile(c, stages.MERGE, pt) is True and c.plan.creates == []
