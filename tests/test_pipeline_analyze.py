"""The analyze stage module on its own (pitlab/pipeline/analyze.py): its report in JSON, what the Analyzed status
records, and the analyze Job's termination message read as the report."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from stage_ctx import World, ctx, example

from pitlab.api import ResourceStatus, stages
from pitlab.api.status import get_condition
from pitlab.api.summary import compact_results, premium_summary
from pitlab.operator import builders
from pitlab.pipeline import analyze
from pitlab.pipeline.analyze import AnalyzeReport

# an evaluator results.json, reduced to what the status summary reads
RESULTS = compact_results({"models": [
    {"name": "pit", "r2_off": 0.01, "r2_on": 0.0125, "premium": 0.0025, "premium_ci": [-0.001, 0.006],
     "verdict": "not significant",
     "market_neutral": {"premium": 0.002, "premium_ci": [-0.001, 0.006], "verdict": "not significant"}},
    {"name": "base", "r2_off": 0.01, "r2_on": 0.14, "premium": 0.13, "premium_ci": [0.07, 0.26],
     "verdict": "unreliable", "verdict_reasons": ["few dates"]}]})
SUMMARY = "pit neutral +0.002 [-0.001, +0.006]; base +0.130 [+0.070, +0.260] unreliable"
LE_EVAL = "/pitlab/out/jpx-leakage-2021/eval"


def test_the_report_is_camel_case_json_and_ignores_unknown_keys() -> None:
    report = AnalyzeReport(results=RESULTS, report_uri="/o/e/eval/report.md", premium_summary=SUMMARY)
    assert json.loads(report.to_json()) == {"results": RESULTS, "reportUri": "/o/e/eval/report.md",
                                            "premiumSummary": SUMMARY}
    assert AnalyzeReport.model_validate({**json.loads(report.to_json()), "seconds": 12}) == report
    assert AnalyzeReport.model_validate({"results": {}, "report_uri": "/r.md"}).premium_summary is None
    with pytest.raises(ValidationError, match="results"):
        AnalyzeReport.model_validate({"results": [1, 2], "reportUri": "/r.md"})


def test_to_status_records_results_report_and_premium() -> None:
    assert premium_summary(RESULTS) == SUMMARY
    status = ResourceStatus(model_uri="/m")
    report = AnalyzeReport(results=RESULTS, report_uri="/o/e/eval/report.md", premium_summary=SUMMARY)
    assert analyze.to_status(report, status) == "report at /o/e/eval/report.md"
    assert status == ResourceStatus(model_uri="/m", results=RESULTS, report_uri="/o/e/eval/report.md",
                                    premium_summary=SUMMARY)
    status = ResourceStatus(premium_summary="stale")
    analyze.to_status(AnalyzeReport(results={}, report_uri="/r.md", premium_summary=""), status)
    assert status == ResourceStatus(results={}, report_uri="/r.md")  # an empty summary is no summary


def _analyzed(message: str | None) -> tuple:
    le = example("leakageeval.yaml")
    world = World()
    c = ctx(le, world)
    assert analyze.reconcile(c, stages.ANALYZE, le) is False  # the Job is created first
    job, = c.plan.creates
    assert job["metadata"]["name"] == "jpx-leakage-2021-analyze" == builders.build_analyze_job(
        le, c.cfg, c.body)["metadata"]["name"]
    world.finish_job(job, message, container="analyze")
    c = ctx(le, world, c.status)
    return analyze.reconcile(c, stages.ANALYZE, le), c


def test_reconcile_reads_the_jobs_termination_message_as_the_report() -> None:
    done, c = _analyzed(json.dumps({"results": RESULTS, "reportUri": "s3://b/e/report.md", "bytes": 10}))
    assert done is True
    cond = get_condition(c.status, "Analyzed")
    assert (cond.status, cond.reason, cond.message) == ("True", "ResultsWritten", "report at s3://b/e/report.md")
    assert (c.status.results, c.status.premium_summary) == (RESULTS, SUMMARY)
    assert c.status.children == {"analyzeJob": "jpx-leakage-2021-analyze"} and c.plan.warnings == []


def test_a_message_without_report_uri_points_at_the_eval_folder() -> None:
    done, c = _analyzed(json.dumps({"results": RESULTS}))
    assert done is True and c.status.report_uri == f"{LE_EVAL}/report.md"


def test_a_message_without_results_fails_the_stage() -> None:
    done, c = _analyzed(None)
    cond = get_condition(c.status, "Analyzed")
    assert done is False and (cond.status, cond.reason, c.status.phase) == ("False", "ResultsUnavailable", "Failed")
    assert cond.message == (f"Job jpx-leakage-2021-analyze succeeded but its pod has no results termination message; "
                            f"see {LE_EVAL}/results.json")


def test_results_of_an_unexpected_shape_lose_only_the_premium_line() -> None:
    done, c = _analyzed(json.dumps({"results": {"models": ["pit"]}, "reportUri": "/r.md"}))
    assert done is True and c.status.premium_summary is None and c.status.results == {"models": ["pit"]}
    assert c.plan.warnings == [("MalformedResults", "Job jpx-leakage-2021-analyze: results summary has an unexpected "
                                                    "shape; no premium summary")]


class _Lines:
    """A reporter that keeps each progress call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, str]] = []

    def progress(self, task: str, done: int, total: int, info: str = "") -> None:
        self.calls.append((task, done, total, info))


def test_progress_counts_finished_statistics_when_they_run_in_parallel() -> None:
    """A new user's trial: with the statistics in parallel processes (every start note first) the stage said
    "3/4 (pit-2016-lora done)" when minilm's started, before pit-2016-lora had finished."""
    names = ["date-only", "base", "pit", "minilm"]
    lines = _Lines()
    note = analyze.StatisticsProgress(names, lines)
    for n in names:  # pitlab.evaluator.run._evaluate_models with a StatisticsPool: every start, then each result
        note(f"statistics:{n}", 0, 1)
    note("embed:base", 5, 9)  # not a statistics task: ignored
    for n in names:
        note(f"statistics:{n}", 1, 1)
    text = "statistics of the date-only baseline and each model"
    assert lines.calls == [
        ("analyze", 0, 4, f"{text} (running: date-only)"),
        ("analyze", 0, 4, f"{text} (running: date-only, base)"),
        ("analyze", 0, 4, f"{text} (running: date-only, base, pit)"),
        ("analyze", 0, 4, f"{text} (running: date-only, base, pit, minilm)"),
        ("analyze", 1, 4, f"{text} (date-only done; running: base, pit, minilm)"),
        ("analyze", 2, 4, f"{text} (base done; running: pit, minilm)"),
        ("analyze", 3, 4, f"{text} (pit done; running: minilm)"),
        ("analyze", 4, 4, f"{text} (minilm done)")]


def test_progress_one_model_after_the_other() -> None:
    lines = _Lines()
    note = analyze.StatisticsProgress(["date-only", "m"], lines)
    for n in ["date-only", "m"]:
        note(f"statistics:{n}", 0, 1)
        note(f"statistics:{n}", 1, 1)
    assert [(c[1], c[3].split("model")[1]) for c in lines.calls] == [
        (0, " (running: date-only)"), (1, " (date-only done)"), (1, " (running: m)"), (2, " (m done)")]


def test_a_log_gets_every_statistics_line(monkeypatch) -> None:
    """Found by a quant's trial: in a log (no terminal) the 15-s throttle hid "1/2 (date-only baseline done)" and
    "1/2 (running: minilm)", so for the 5 minutes of minilm's statistics the log said the baseline was running. A
    task of a few units prints every change; one of many (prompts) a line per 15 s and its end."""
    from pitlab.cli import output

    said: list[str] = []
    monkeypatch.setattr(output, "say", said.append)
    monkeypatch.setattr(type(output.console), "is_terminal", property(lambda self: False))
    reporter = output.RichReporter(output.progress(terminal_only=True))
    note = analyze.StatisticsProgress(["date-only baseline", "minilm"], reporter)
    for n in ["date-only baseline", "minilm"]:
        note(f"statistics:{n}", 0, 1)
        note(f"statistics:{n}", 1, 1)
    text = "analyze: {}/2 statistics of the date-only baseline and each model ({})"
    assert said == ["  " + text.format(0, "running: date-only baseline"),
                    "  " + text.format(1, "date-only baseline done"), "  " + text.format(1, "running: minilm"),
                    "  " + text.format(2, "minilm done")]
    said.clear()
    for done in range(0, 301, 50):  # 300 prompts within a second: the first line and the last
        reporter.progress("embed minilm", done, 300, "prompts")
    assert said == ["  embed minilm: 0/300 prompts", "  embed minilm: 300/300 prompts"]
