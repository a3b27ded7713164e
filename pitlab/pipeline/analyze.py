"""The analyze stage of a LeakageEval: protocols, clustered bootstrap and report (``pitlab analyze``; one Job
on a cluster, whose termination message is this stage's report)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from pitlab.api import LeakageEval, ResourceStatus, stages
from pitlab.api.layout import EvalOutputs, EvaluationLayout
from pitlab.api.stages import Stage
from pitlab.api.summary import compact_results, premium_summary
from pitlab.operator import builders, naming
from pitlab.operator.context import Ctx, job_stage
from pitlab.pipeline.base import EvalRun, Report, StageStep


class AnalyzeReport(Report):
    """The results summary (:func:`pitlab.api.summary.compact_results`), where the report is, and the premium
    in one line (None when the results have none or an unexpected shape)."""

    results: dict[str, Any]
    report_uri: str
    premium_summary: str | None = None


def to_status(report: AnalyzeReport, status: ResourceStatus) -> str:
    """``status.results``, ``reportURI`` and ``premiumSummary``; returns the Analyzed message."""
    status.results = report.results
    status.report_uri = report.report_uri
    status.premium_summary = report.premium_summary or None
    return f"report at {status.report_uri}"


class StatisticsProgress:
    """The analyze stage's progress, counted in finished statistics (the date-only baseline's and each model's):
    called as ``run_leakage_eval``'s ``progress(task, done, total)``, it reports ``analyze`` k/len(names) with the
    one just finished and those still running (several at once where the statistics run in parallel processes,
    whose start notes all come first); tasks other than ``statistics:<name>`` of ``names`` are ignored."""

    def __init__(self, names: list[str], reporter) -> None:
        self.names, self.reporter = names, reporter
        self.finished: set[str] = set()
        self.running: set[str] = set()

    def __call__(self, task: str, done: int, total: int) -> None:
        name = task.split(":", 1)[1] if task.startswith("statistics:") else None
        if name not in self.names:
            return
        finished = done >= total
        if finished:
            self.finished.add(name)
            self.running.discard(name)
        else:
            self.running.add(name)
        parts = [f"{name} done"] if finished else []
        running = [n for n in self.names if n in self.running]
        if running:
            parts.append(f"running: {', '.join(running)}")
        self.reporter.progress("analyze", len(self.finished), len(self.names),
                               "statistics of the date-only baseline and each model"
                               + (f" ({'; '.join(parts)})" if parts else ""))


def run(run: EvalRun, stage: Stage) -> None:
    """Protocols, clustered bootstrap and report into ``eval/``; the results summary goes to the status."""
    from pitlab.evaluator.decompose import DATE_ONLY
    from pitlab.evaluator.run import run_leakage_eval

    spec, st, models = run.res.spec, run.st, run.models
    st.running(stage, "protocols, clustered bootstrap and report")
    run.reporter.stage("analyze", f"{spec.bootstrap.resamples} bootstrap resamples, {spec.regression.selection} "
                                  "penalty selection")

    progress = StatisticsProgress([DATE_ONLY, *models], run.reporter)  # the baseline's statistics run first
    out = EvaluationLayout(run.run_dir)
    run.results = run_leakage_eval(spec, run.checked.panel, models, out.eval_dir, progress=progress,
                                   cache_dir=run.cache, embedded=run.embedded)
    run.reporter.done("analyze", str(out.eval_dir))
    results = compact_results(run.results)
    report = AnalyzeReport(results=results, report_uri=str(out.outputs.report),
                           premium_summary=premium_summary(results))
    st.done(stage, to_status(report, st.status))


def reconcile(ctx: Ctx, stage: Stage, le: LeakageEval) -> bool:
    """The analyze Job; its termination message carries the results summary and the report's URI."""
    out = EvalOutputs(builders.eval_dir(le, ctx.cfg))
    if job_stage(ctx, stage, builders.build_analyze_job(le, ctx.cfg, ctx.body), "analyzeJob") is None:
        return False
    job_name = naming.analyze_job(ctx.name)
    doc = ctx.termination_doc(job_name, stage.name)
    try:  # the pod's termination message is this stage's report (the report's path defaults to EVALDIR/report.md)
        report = AnalyzeReport.model_validate({"results": doc.get("results"),
                                               "reportUri": doc.get("reportUri") or out.report})
    except ValidationError:
        ctx.fail(stage.condition, "ResultsUnavailable", f"Job {job_name} succeeded but its pod has no results "
                                                        f"termination message; see {out.results}")
        return False
    try:
        report.premium_summary = premium_summary(report.results)
    except (TypeError, ValueError, AttributeError):
        ctx.plan.warnings.append(("MalformedResults", f"Job {job_name}: results summary has an unexpected shape; "
                                                      "no premium summary"))
    ctx.done(stage, to_status(report, ctx.status))
    return True


STEP = StageStep(stages.ANALYZE, AnalyzeReport, to_status, run, reconcile)
