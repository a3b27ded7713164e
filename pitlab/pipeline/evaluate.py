"""The evaluate stage of a PitTraining: one LeakageEval per ``spec.evaluations`` entry (run by ``pitlab run``
in its own folder; a child LeakageEval on a cluster). Its report is the results summary of each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pitlab.api import LeakageEval, PitTraining, ResourceStatus, stages
from pitlab.api.layout import EvaluationLayout, TrainingLayout
from pitlab.api.runfolders import TRAINING_LABEL
from pitlab.api.stages import Stage
from pitlab.api.summary import compact_results
from pitlab.operator import builders, naming
from pitlab.operator.context import Ctx
from pitlab.operator.mirroring import FAILED, SUCCEEDED, ChildState, leakageeval_state
from pitlab.pipeline.base import Report, StageStep, TrainingRun


class EvaluateReport(Report):
    """The results summary of each evaluation, by name; ``cluster``: gathered from the child LeakageEvals."""

    results: dict[str, Any]
    cluster: bool = False


def to_status(report: EvaluateReport, status: ResourceStatus) -> str:
    """``status.results``; returns the Evaluated message."""
    status.results = report.results
    noun = "evaluation(s)" if report.cluster else "LeakageEval(s)"
    return f"{len(report.results)} {noun} succeeded"


def succeeded_results(run_dir: Path) -> dict | None:
    """``eval/results.json`` of an evaluation folder whose status says Succeeded, else None."""
    try:
        paths = EvaluationLayout(run_dir)
        phase = json.loads(paths.status.read_text())["status"]["phase"]
        return json.loads(paths.outputs.results.read_text()) if phase == stages.SUCCEEDED else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run(run: TrainingRun, stage: Stage) -> None:
    """One LeakageEval per ``spec.evaluations`` entry, on the panels and models the preflight read."""
    res, st = run.res, run.st
    if not res.spec.evaluations:
        st.done(stage, "spec.evaluations is empty", reason=stage.empty)
        return
    st.running(stage, f"{len(res.spec.evaluations)} LeakageEval(s)")
    dirs = {"base": run.base_dir, "model": TrainingLayout(run.run_dir).model}
    results = {}
    for tmpl, checked in zip(res.spec.evaluations, run.checked.evaluations):
        child = LeakageEval(metadata={"name": tmpl.name, "labels": {TRAINING_LABEL: res.metadata.name}},
                            spec=tmpl.spec)
        st.status.children[f"leakageeval/{tmpl.name}"] = str(run.out_root / tmpl.name)
        model_dirs = {m.name: dirs[m.training_ref.artifact] for m in tmpl.spec.models if m.training_ref}
        done = succeeded_results(run.out_root / tmpl.name) if run.resume else None
        # its folder was claimed (checked, and emptied with --overwrite) before the training started; a resume
        # keeps a succeeded evaluation and runs an unfinished one again in its own folder
        out = done if done is not None else run.run_evaluation(
            child, run.out_root, run.reporter, overwrite=run.resume, model_dirs=model_dirs, checked=checked)
        results[tmpl.name] = compact_results(out)
    st.done(stage, to_status(EvaluateReport(results=results), st.status))


# The LeakageEval's phase → the prefix of the status.children keys of the Jobs it runs then
_EVAL_JOBS = {stages.EMBED.phase: "embedJob.", stages.ANALYZE.phase: "analyzeJob"}


def _stuck(ctx: Ctx, child: dict[str, Any] | None) -> str:
    """``"; <pod that cannot start>"`` of the Jobs the LeakageEval ``child`` runs in its current phase (its
    ``status.children``; :meth:`Ctx.stuck`), else "": the PitTraining's condition says what the LeakageEval's does."""
    st = (child or {}).get("status") or {}
    prefix = _EVAL_JOBS.get(st.get("phase") or "")
    if prefix is None:
        return ""
    jobs = [job for key, job in sorted((st.get("children") or {}).items()) if key.startswith(prefix)
            and isinstance(job, str)]
    return ctx.stuck_in_jobs([(f"{stages.EVALUATE.child} {child['metadata']['name']}: Job {job}", job)
                              for job in jobs])


def reconcile(ctx: Ctx, stage: Stage, pt: PitTraining) -> bool:
    """One LeakageEval child per ``spec.evaluations`` entry; their results summaries go to ``status.results``. While
    one runs, a pod of its Jobs that cannot start is named in the condition's message."""
    if not pt.spec.evaluations:
        ctx.done(stage, "spec.evaluations is empty", reason=stage.empty)
        return True
    results: dict[str, Any] = {}
    pending = []
    for tpl in pt.spec.evaluations:
        child_name = naming.evaluation(ctx.name, tpl.name)
        child = ctx.kids.ensure(builders.build_evaluation(pt, tpl, ctx.body))
        ctx.status.children[f"leakageEval.{tpl.name}"] = child_name
        st = leakageeval_state(child) if child else ChildState("Pending", "Created")
        if st.state == FAILED:
            ctx.failed(stage, f"{stage.child} {child_name}: {st.message}", reason=st.reason)
            return False
        if st.state == SUCCEEDED:
            results[tpl.name] = ((child or {}).get("status") or {}).get("results") or {}
        else:
            pending.append(f"{child_name} ({st.reason}{_stuck(ctx, child)})")
    if pending:
        ctx.running(stage, f"waiting for {stage.child} " + ", ".join(pending))
        return False
    ctx.done(stage, to_status(EvaluateReport(results=results, cluster=True), ctx.status))
    return True


STEP = StageStep(stages.EVALUATE, EvaluateReport, to_status, run, reconcile)
