"""The embed stage of a LeakageEval: the panel's prompts embedded with every model (``pitlab embed``; one Job
per model, or one indexed Job, on a cluster). Its report names the models embedded."""

from __future__ import annotations

from pitlab.api import LeakageEval, ResourceStatus, stages
from pitlab.api.stages import Stage
from pitlab.operator import builders, naming
from pitlab.operator.context import Ctx, World
from pitlab.operator.mirroring import FAILED, SUCCEEDED, ChildState, batch_job_state, jobs_state
from pitlab.operator.naming import JOBS
from pitlab.pipeline.base import EvalRun, Report, StageStep


def fetch_models(*args, **kwargs):
    """:func:`pitlab.evaluator.inputs.fetch_models`, imported when a local run calls it: the operator, which
    imports this module, has no numpy or pandas."""
    from pitlab.evaluator.inputs import fetch_models as fetch

    return fetch(*args, **kwargs)


class EmbedReport(Report):
    """The models whose embeddings were written."""

    models: list[str]


def to_status(report: EmbedReport, status: ResourceStatus) -> str:
    """Nothing to record but the condition; returns the Embedded message."""
    return f"{len(report.models)} model(s) embedded"


def run(run: EvalRun, stage: Stage) -> None:
    """Embed the panel's prompts with every model (cached by model digest, settings and prompts)."""
    from pitlab.data.sampling import dropped_note
    from pitlab.evaluator.run import embed_panel

    run.models = fetch_models(run.checked.models, run.model_dirs)  # located by the preflight; s3:// downloaded now
    run.st.running(stage, f"embedding the panel's prompts with {len(run.models)} models")
    rows = run.checked.panel.rows
    run.reporter.stage("panel", f"{run.res.spec.dataset.kind} panel")
    note = dropped_note(run.checked.panel.dropped, len(rows), run.checked.panel.dropped_rows)
    run.reporter.done("panel", f"{len(rows):,} rows ({rows.security.nunique()} securities, {rows.date.nunique()} "
                               f"dates){note}")
    prompts = rows["prompt"].astype(str).tolist()
    for name, (path, kind) in run.models.items():
        run.reporter.stage(f"embed {name}", str(path))
        info: dict = {}
        run.embedded[name] = info
        X = embed_panel(run.res.spec, prompts, path, kind, cache_dir=run.cache, info=info,
                        progress=lambda d, t, n=name: run.reporter.progress(f"embed {n}", d, t))
        run.reporter.done(f"embed {name}", f"{X.shape[1]}-dim {info.get('kind', kind)} embeddings"
                                           f"{' (cached)' if info.get('cache_hit') else ''}")
    run.st.done(stage, to_status(EmbedReport(models=list(run.models)), run.st.status))


def reconcile(ctx: Ctx, stage: Stage, le: LeakageEval) -> bool:
    """The embedding Jobs (one per model, or one indexed Job); while they run, the condition names a pod of theirs
    that cannot start."""
    status = ctx.status
    if ctx.is_done(stage):
        return True
    jobs = []
    for manifest in builders.build_embed_jobs(le, ctx.cfg, ctx.body, _embed_indexed(status, le, ctx.world, ctx.ns)):
        jobs.append(ctx.kids.ensure(manifest))
        status.children[f"embedJob.{manifest['metadata']['labels'].get(naming.MODEL_KEY, 'all')}"] = \
            manifest["metadata"]["name"]
    st = jobs_state([j for j in jobs if j is not None]) if all(jobs) else ChildState("Pending", "Created")
    if st.state == FAILED:
        ctx.failed(stage, st.message, reason=st.reason)
        return False
    if st.state != SUCCEEDED:
        ctx.running(stage, (st.message or st.reason) + _stuck(ctx, stage, [j for j in jobs if j is not None]))
        return False
    ctx.done(stage, to_status(EmbedReport(models=[m.name for m in le.spec.models]), status))
    return True


def _stuck(ctx: Ctx, stage: Stage, jobs: list[dict]) -> str:
    """``"; <pod that cannot start>"`` of the first unfinished embedding Job with one (:meth:`Ctx.stuck_in_jobs`),
    else ""."""
    names = [j["metadata"]["name"] for j in jobs if not batch_job_state(j).done]
    return ctx.stuck_in_jobs([(f"{stage.child} {name}", name) for name in names])


def _embed_indexed(status: ResourceStatus, le: LeakageEval, world: World, ns: str | None) -> bool | None:
    """Whether the panel embeds in one indexed Job (else one Job per model; None: not decided yet, the
    builders apply ``indexed_embed_threshold``). Decided once per resource: the
    choice recorded in ``status.children`` (``embedJob.all`` is the indexed Job), else the embedding Jobs that
    exist (a restart before the status was written), else ``indexed_embed_threshold`` of the configuration
    at the time. A configuration change never starts a second, differently named set of Jobs."""
    name = le.metadata.name
    indexed = naming.embed_indexed_job(name, len(le.spec.models))
    recorded = {k: v for k, v in status.children.items() if k.startswith("embedJob.")}
    if recorded:
        return "embedJob.all" in recorded
    if world.get(JOBS, ns, indexed) is not None:
        return True
    if any(world.get(JOBS, ns, naming.embed_job(name, m.name)) is not None for m in le.spec.models):
        return False
    return None


STEP = StageStep(stages.EMBED, EmbedReport, to_status, run, reconcile)
