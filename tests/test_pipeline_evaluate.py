"""The evaluate stage module on its own (pitlab/pipeline/evaluate.py): its report in JSON, the Evaluated message
locally and on a cluster, which evaluation folder counts as succeeded, the local walk over ``spec.evaluations``
(a resume keeps a succeeded one) and the child LeakageEvals' side."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from stage_ctx import World, ctx, example

from pitlab.api import LeakageEval, ResourceStatus, stages
from pitlab.api.layout import EvaluationLayout
from pitlab.api.status import get_condition
from pitlab.api.summary import compact_results
from pitlab.pipeline import evaluate
from pitlab.pipeline.base import SilentReporter, StatusWriter, TrainingRun
from pitlab.pipeline.evaluate import EvaluateReport

FULL = {"models": [{"name": "pit-2016", "r2_off": 0.01, "r2_on": 0.0125, "premium": 0.0025,
                    "premium_ci": [-0.001, 0.006], "verdict": "not significant"}], "reductions": []}
SUMMARY = {"models": {"pit-2016": {"r2Off": 0.01, "r2On": 0.0125, "premium": 0.0025, "premiumCI": [-0.001, 0.006],
                                   "verdict": "not significant"}}, "reductions": []}


def test_the_report_is_camel_case_json_and_ignores_unknown_keys() -> None:
    report = EvaluateReport(results={"e": SUMMARY}, cluster=True)
    assert json.loads(report.to_json()) == {"results": {"e": SUMMARY}, "cluster": True}
    assert EvaluateReport.model_validate({"results": {"e": SUMMARY}, "cluster": True, "phase": "x"}) == report
    with pytest.raises(ValidationError, match="results"):
        EvaluateReport.model_validate({"cluster": True})


def test_to_status_counts_the_evaluations_in_the_executors_words() -> None:
    assert compact_results(FULL) == SUMMARY
    status = ResourceStatus(model_uri="/m")
    assert evaluate.to_status(EvaluateReport(results={"a": SUMMARY, "b": {}}), status) == "2 LeakageEval(s) succeeded"
    assert status == ResourceStatus(model_uri="/m", results={"a": SUMMARY, "b": {}})
    status = ResourceStatus()
    assert evaluate.to_status(EvaluateReport(results={"a": SUMMARY}, cluster=True), status) == \
        "1 evaluation(s) succeeded"
    assert status.results == {"a": SUMMARY}


def _evaluation_folder(root: Path, phase: str | None, results: str | None = json.dumps(FULL)) -> Path:
    paths = EvaluationLayout(root)
    paths.outputs.results.parent.mkdir(parents=True, exist_ok=True)
    if phase is not None:
        paths.status.write_text(json.dumps({"kind": "LeakageEval", "status": {"phase": phase}}))
    if results is not None:
        paths.outputs.results.write_text(results)
    return root


def test_only_a_succeeded_evaluation_folder_gives_its_results(tmp_path) -> None:
    assert evaluate.succeeded_results(_evaluation_folder(tmp_path / "ok", "Succeeded")) == FULL
    assert evaluate.succeeded_results(_evaluation_folder(tmp_path / "failed", "Failed")) is None
    assert evaluate.succeeded_results(_evaluation_folder(tmp_path / "no-status", None)) is None
    assert evaluate.succeeded_results(_evaluation_folder(tmp_path / "no-results", "Succeeded", None)) is None
    assert evaluate.succeeded_results(_evaluation_folder(tmp_path / "torn", "Succeeded", '{"models": [')) is None
    assert evaluate.succeeded_results(tmp_path / "missing") is None
    unstarted = _evaluation_folder(tmp_path / "unstarted", None)
    EvaluationLayout(unstarted).status.write_text(json.dumps({"kind": "LeakageEval"}))  # no status yet
    assert evaluate.succeeded_results(unstarted) is None


def _training_run(tmp_path: Path, pt, resume: bool, calls: list) -> TrainingRun:
    def run_evaluation(child, out_root, reporter, overwrite, model_dirs, checked):
        calls.append((child, out_root, overwrite, model_dirs, checked))
        return FULL

    run_dir = tmp_path / pt.metadata.name
    st = StatusWriter(run_dir / "status.json", pt)
    run_dir.mkdir(parents=True)
    checked = SimpleNamespace(evaluations=["checked sp500-leakage"])  # what the preflight read, per evaluation
    return TrainingRun(pt, tmp_path, run_dir, st, SilentReporter(), checked, 1, run_evaluation,
                       base_dir=run_dir / "base", resume=resume)


def test_run_evaluates_each_evaluation_with_the_training_models(tmp_path) -> None:
    pt = example("local-sp500-fomc.yaml")
    calls: list = []
    # a succeeded folder of an earlier run counts only on a resume (without one it was emptied before training)
    _evaluation_folder(tmp_path / "sp500-leakage", "Succeeded", json.dumps({"models": []}))
    run = _training_run(tmp_path, pt, False, calls)
    evaluate.run(run, stages.EVALUATE)
    (child, out_root, overwrite, model_dirs, checked), = calls
    assert isinstance(child, LeakageEval) and child.metadata.name == "sp500-leakage"
    assert child.metadata.labels == {"pitlab.io/training": "sp500-fomc-demo"}
    assert child.spec == pt.spec.evaluations[0].spec
    assert (out_root, overwrite, checked) == (tmp_path, False, "checked sp500-leakage")
    assert model_dirs == {"base": run.run_dir / "base", "pit-2016": run.run_dir / "model"}  # not the uri model
    cond = get_condition(run.st.status, "Evaluated")
    assert (cond.status, cond.reason, cond.message) == ("True", "EvaluationsSucceeded", "1 LeakageEval(s) succeeded")
    assert run.st.status.results == {"sp500-leakage": SUMMARY}
    assert run.st.status.children == {"leakageeval/sp500-leakage": str(tmp_path / "sp500-leakage")}
    written = json.loads((run.run_dir / "status.json").read_text())["status"]
    assert written["results"] == {"sp500-leakage": SUMMARY}


def test_a_resume_keeps_a_succeeded_evaluation_and_reruns_an_unfinished_one(tmp_path) -> None:
    pt = example("local-sp500-fomc.yaml")
    calls: list = []
    _evaluation_folder(tmp_path / "sp500-leakage", "Succeeded",
                       json.dumps({**FULL, "models": [{**FULL["models"][0], "premium": 0.5}]}))
    run = _training_run(tmp_path, pt, True, calls)
    evaluate.run(run, stages.EVALUATE)
    assert calls == [] and run.st.status.results["sp500-leakage"]["models"]["pit-2016"]["premium"] == 0.5
    EvaluationLayout(tmp_path / "sp500-leakage").status.write_text(json.dumps({"status": {"phase": "Analyzing"}}))
    run = _training_run(tmp_path / "again", pt, True, calls)
    run.out_root = tmp_path
    evaluate.run(run, stages.EVALUATE)
    assert [(c[0].metadata.name, c[2]) for c in calls] == [("sp500-leakage", True)]  # its folder is overwritten


def test_no_evaluations_is_done_with_its_own_reason(tmp_path) -> None:
    pt = example("local-sp500-fomc.yaml")
    pt = pt.model_copy(update={"spec": pt.spec.model_copy(update={"evaluations": []})})
    calls: list = []
    run = _training_run(tmp_path, pt, False, calls)
    evaluate.run(run, stages.EVALUATE)
    c = ctx(pt)
    assert evaluate.reconcile(c, stages.EVALUATE, pt) is True and c.plan.creates == []
    for status in (run.st.status, c.status):
        cond = get_condition(status, "Evaluated")
        assert (cond.status, cond.reason, cond.message) == ("True", "NoEvaluations", "spec.evaluations is empty")
        assert status.results is None
    assert calls == []


def test_reconcile_waits_for_the_child_leakageevals_and_gathers_their_results() -> None:
    pt = example("pittraining.yaml")
    child = "qwen35-a3b-pit-2020-jpx"
    world = World()
    c = ctx(pt, world)
    assert evaluate.reconcile(c, stages.EVALUATE, pt) is False
    manifest, = c.plan.creates
    assert (manifest["kind"], manifest["metadata"]["name"]) == ("LeakageEval", child)
    assert c.status.children == {"leakageEval.qwen35-a3b-pit-2020-jpx": child}
    assert get_condition(c.status, "Evaluated").message == f"waiting for LeakageEval {child} (Created)"

    world.add(manifest, {"phase": "Analyzing"})
    c = ctx(pt, world, c.status)
    assert evaluate.reconcile(c, stages.EVALUATE, pt) is False
    assert get_condition(c.status, "Evaluated").message == f"waiting for LeakageEval {child} (Analyzing)"

    world.add(manifest, {"phase": "Succeeded", "results": SUMMARY})
    c = ctx(pt, world, c.status)
    assert evaluate.reconcile(c, stages.EVALUATE, pt) is True
    cond = get_condition(c.status, "Evaluated")
    assert (cond.status, cond.reason, cond.message) == ("True", "EvaluationsSucceeded", "1 evaluation(s) succeeded")
    assert c.status.results == {"qwen35-a3b-pit-2020-jpx": SUMMARY}


def test_a_failed_child_leakageeval_fails_the_stage_with_its_reason() -> None:
    pt = example("pittraining.yaml")
    world = World()
    c = ctx(pt, world)
    evaluate.reconcile(c, stages.EVALUATE, pt)
    world.add(c.plan.creates[0], {"phase": "Failed", "conditions": [
        {"type": "Stalled", "status": "True", "reason": "BackoffLimitExceeded", "message": "embedding failed"}]})
    c = ctx(pt, world, c.status)
    assert evaluate.reconcile(c, stages.EVALUATE, pt) is False
    cond = get_condition(c.status, "Evaluated")
    assert (cond.status, cond.reason, c.status.phase) == ("False", "BackoffLimitExceeded", "Failed")
    assert cond.message == "LeakageEval qwen35-a3b-pit-2020-jpx: embedding failed"
