"""The pipeline written once (docs/design.md, "Architecture"): every stage of the stage table has one stage module
whose report round-trips through the termination message and the local status record, and both executors reach
the same stage object."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from pitlab import pipeline
from pitlab.api import ResourceStatus, stages
from pitlab.api.layout import TrainingLayout
from pitlab.api.status import CorpusAuditStatus
from pitlab.pipeline.analyze import AnalyzeReport
from pitlab.pipeline.embed import EmbedReport
from pitlab.pipeline.evaluate import EvaluateReport
from pitlab.pipeline.merge import MergeReport
from pitlab.pipeline.prepare import PrepareReport
from pitlab.pipeline.train import TrainReport

AUDIT = CorpusAuditStatus(included=2, excluded_by_date=1, rejected_timestamp=0, rejected_empty_text=0,
                          max_included_timestamp="2020-12-30T12:00:00+00:00", included_ids_sha256="ab",
                          warnings=["late cutoff"])
EXAMPLES = {
    "prepare": [PrepareReport(corpus_audit=AUDIT, tokens=1000),
                PrepareReport(corpus_audit=AUDIT, knowledge_cutoff="2020-12-31", cluster=True),
                PrepareReport(knowledge_cutoff="2020-12-31", cluster=True)],
    "train": [TrainReport(checkpoint_uri="/o/t/checkpoint", steps=2, first_loss=7.0, final_loss=5.0,
                          mean_tokens_per_second=1234.5, kernel_warning="slow"),
              TrainReport(checkpoint_uri="s3://b/ck", child="PyTorchJob t-train", child_message="done", cluster=True)],
    "merge": [MergeReport(model_uri="/o/t/model", kind="full", tensors=3, shards=1, bytes=10, logits_probe="equal")],
    "evaluate": [EvaluateReport(results={"e": {"models": [{"name": "pit", "premium": 0.1}]}}),
                 EvaluateReport(results={}, cluster=True)],
    "embed": [EmbedReport(models=["base", "pit"])],
    "analyze": [AnalyzeReport(results={"models": [{"name": "pit"}]}, report_uri="/o/e/eval/report.md",
                              premium_summary="pit: +0.1")],
}
TABLE = [s for s in stages.PITTRAINING + stages.LEAKAGEEVAL if s is not stages.VALIDATE]


def test_every_stage_of_the_table_has_one_stage_module() -> None:
    assert sorted(pipeline.STEPS) == sorted(s.name for s in TABLE) == sorted(EXAMPLES)
    for stage in TABLE:
        assert pipeline.step(stage).stage is stage


@pytest.mark.parametrize("stage", TABLE, ids=[s.name for s in TABLE])
def test_the_report_round_trips_through_the_termination_message_and_the_status(stage) -> None:
    step = pipeline.step(stage)
    for report in EXAMPLES[stage.name]:
        assert isinstance(report, step.report)
        message = report.to_json()  # what a pod writes to its termination log
        assert step.report.model_validate(json.loads(message)) == report
        status = ResourceStatus()
        said = step.to_status(report, status)
        assert isinstance(said, str) and said
        recorded = ResourceStatus.model_validate(status.model_dump(by_alias=True, mode="json", exclude_none=True))
        assert recorded == status  # what status.json (and the resource's .status) keeps reads back the same
        again = ResourceStatus()
        assert step.to_status(step.report.model_validate_json(message), again) == said and again == status


def test_both_executors_reach_the_same_stage_objects(monkeypatch) -> None:
    """``pitlab run`` and the operator walk the stage table through :func:`pitlab.pipeline.step`: the step object
    each executor reaches for a stage is the one stage module's, and neither defines a stage step itself."""
    import pitlab.local as local
    import pitlab.operator.lifecycle as lifecycle

    reached: dict[str, list] = {"local": [], "operator": []}
    for name, step in list(pipeline.STEPS.items()):
        module = f"pitlab.pipeline.{name}"
        assert step.run.__module__ == step.reconcile.__module__ == step.to_status.__module__ == module
        recording = dataclasses.replace(
            step, run=lambda run, stage: reached["local"].append(pipeline.STEPS[stage.name]),
            reconcile=lambda ctx, stage, res: reached["operator"].append(pipeline.STEPS[stage.name]) or True)
        monkeypatch.setitem(pipeline.STEPS, name, recording)
    for table in (stages.PITTRAINING[1:], stages.LEAKAGEEVAL[1:]):
        local._walk(table, object(), object())
    lifecycle._advance_eval(SimpleNamespace(status=ResourceStatus(), succeeded=lambda message: None), object())
    for stage in stages.PITTRAINING[1:]:  # the training walk's loop, without the ConfigMap around it
        pipeline.step(stage).reconcile(None, stage, None)
    assert reached["local"] == [pipeline.STEPS[s.name] for s in TABLE]
    assert reached["operator"][:2] == reached["local"][4:] and reached["operator"][2:] == reached["local"][:4]
    for executor in (local, lifecycle):
        assert not {f"_{s.name}" for s in TABLE} & set(vars(executor)), executor.__name__


def test_the_layout_places_every_artifact_of_the_stage_table(tmp_path) -> None:
    paths = TrainingLayout(tmp_path)
    for stage in stages.PITTRAINING[1:4]:
        for name in stage.produces + tuple(c for c in stage.consumes if "/" in c or "." in c):
            assert str(paths.artifact(name)).startswith(str(tmp_path / name.split("/")[0]))
    assert paths.summary == tmp_path / "train" / "summary.json" and paths.tokens == tmp_path / "data" / "tokens.npy"
    assert TrainingLayout("s3://b/run").model == "s3://b/run/model"


@pytest.mark.parametrize("msg, reason", [
    ("", "ResultsUnavailable"),  # no termination message
    (json.dumps({"results": [1, 2], "reportUri": "/r.md"}), "ResultsUnavailable"),  # not the report's shape
    (json.dumps({"results": {"models": 3}}), None),  # a report whose summary cannot be read: a warning, no summary
])
def test_the_analyze_jobs_termination_message_is_the_stages_report(msg, reason) -> None:
    """On a cluster the analyze Job's termination message is read as :class:`AnalyzeReport`; a message that is not
    one fails the stage (ResultsUnavailable), a summary of an unexpected shape only loses the premium line."""
    import copy

    from test_operator_lifecycle import CFG, LE_BODY, NOW, FakeWorld, finish

    from pitlab.operator import lifecycle

    w = FakeWorld()
    le = copy.deepcopy(LE_BODY)
    le["spec"]["models"] = [{"name": "m0", "uri": "models/m0"}]
    for _ in range(2):
        plan = lifecycle.reconcile_eval(le, w, CFG, NOW)
        le = w.apply(plan, le)
        for m in plan.creates:
            if m["kind"] == "Job":
                finish(w, lifecycle.JOBS, m["metadata"]["name"], container="analyze", msg=msg)
    plan = lifecycle.reconcile_eval(le, w, CFG, NOW)
    analyzed = next(c for c in plan.status.conditions if c.type == "Analyzed")
    if reason:
        assert (analyzed.status, analyzed.reason, plan.status.phase) == ("False", reason, "Failed")
        assert "has no results termination message" in analyzed.message
    else:
        assert analyzed.status == "True" and plan.status.premium_summary is None
        assert [r for r, _ in plan.warnings] == ["MalformedResults"]
        assert plan.status.report_uri.endswith("/e/eval/report.md")
