"""The prepare stage: the corpus filtered at the knowledge cutoff, the tokenizer, the base model and the packed
tokens (``pitlab prepare``; the prepare Job on a cluster). Its report carries the corpus audit."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from pitlab.api import PitTraining, ResourceStatus, stages
from pitlab.api.stages import Stage
from pitlab.api.status import CorpusAuditStatus
from pitlab.operator import builders
from pitlab.operator.context import Ctx, Plan, job_stage, problems
from pitlab.pipeline.base import Report, StageStep, TrainingRun


def prepare_run(*args, **kwargs):
    """:func:`pitlab.trainer.inputs.prepare_run`, imported when a local run calls it: the operator, which
    imports this module, has no torch, numpy or pandas."""
    from pitlab.trainer.inputs import prepare_run as prepare

    return prepare(*args, **kwargs)


class PrepareReport(Report):
    """The corpus audit (None when the pod reported none); ``tokens``: the packed corpus tokens (``pitlab run``
    counts them); ``cluster``: reported by the prepare Job, whose condition names the knowledge cutoff."""

    corpus_audit: CorpusAuditStatus | None = None
    tokens: int | None = None
    knowledge_cutoff: str | None = None
    cluster: bool = False


def audit_status(audit: Any) -> CorpusAuditStatus:
    """The corpus audit (:class:`pitlab.data.corpus.CorpusAudit`) as the status records it."""
    return CorpusAuditStatus(included=audit.included, excluded_by_date=audit.excluded_by_date,
                             rejected_timestamp=audit.rejected_timestamp, rejected_empty_text=audit.rejected_empty_text,
                             max_included_timestamp=audit.max_included_timestamp,
                             included_ids_sha256=audit.included_ids_sha256,
                             included_sha256=getattr(audit, "included_sha256", None) or None,
                             timestamp_format=audit.timestamp_format,
                             warnings=audit.warnings or None)


def to_status(report: PrepareReport, status: ResourceStatus) -> str:
    """``status.corpusAudit``; returns the Prepared message."""
    a = report.corpus_audit
    if a is not None:
        status.corpus_audit = a
    if report.cluster:
        return (f"{a.included} documents up to {report.knowledge_cutoff}, {a.excluded_by_date} after it"
                if a is not None else "corpus filtered")
    if a is None:  # a report without an audit (the type allows it): no counts to give
        return f"corpus filtered; {report.tokens} tokens"
    return (f"{a.included} documents kept, {a.excluded_by_date} after the cutoff, {a.rejected_empty_text} dropped "
            f"for an empty text, {a.rejected_timestamp} rejected for their timestamp; {report.tokens} tokens")


def run(run: TrainingRun, stage: Stage) -> None:
    """The tokenizer, the base model and the packed tokens from the corpus the preflight filtered."""
    st = run.st
    st.running(stage, "filtering the corpus, training the tokenizer")
    run.reporter.stage("prepare", "tokenizer + base model + packed tokens")
    run.base_dir, n_tokens = prepare_run(run.res, run.checked.corpus, run.run_dir)
    report = PrepareReport(corpus_audit=audit_status(run.checked.corpus.audit), tokens=n_tokens)
    st.done(stage, to_status(report, st.status))
    run.reporter.done("prepare", f"{n_tokens:,} corpus tokens")


def _corpus_audit(doc: Any, job: str, plan: Plan) -> CorpusAuditStatus | None:
    """The prepare Job's corpus audit; None (plus a warning) when it is missing or malformed: the audit is
    informative, never a reason to fail a run."""
    if not doc:
        return None
    try:
        return CorpusAuditStatus.model_validate(doc)
    except ValidationError as err:
        plan.warnings.append(("MalformedCorpusAudit",
                              f"Job {job}: corpus audit ignored: {problems(err, 'corpusAudit')}"[:1000]))
        return None


def reconcile(ctx: Ctx, stage: Stage, pt: PitTraining) -> bool:
    """The prepare Job; once it succeeded, the corpus audit of its termination message goes to the status."""
    if ctx.is_done(stage):
        return True
    job = job_stage(ctx, stage, builders.build_prepare_job(pt, ctx.cfg, ctx.body), "prepareJob")
    if job is None:
        return False
    job_name = job["metadata"]["name"]
    audit = _corpus_audit(ctx.termination_doc(job_name, stage.name).get("corpusAudit"), job_name, ctx.plan)
    report = PrepareReport(corpus_audit=audit, knowledge_cutoff=str(pt.spec.knowledge_cutoff), cluster=True)
    message = to_status(report, ctx.status)
    if audit is not None:
        ctx.plan.warnings.extend(("CorpusWarning", w) for w in audit.warnings or [])
    ctx.done(stage, message)
    return True


STEP = StageStep(stages.PREPARE, PrepareReport, to_status, run, reconcile)
