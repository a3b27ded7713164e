"""The train stage: ``torchrun`` with every rank running ``pitlab train`` (locally); on a cluster the child of the
run's training backend (a TrainJob, a JobSet or a PyTorchJob: :mod:`pitlab.operator.backends`). Its report is the
trainer's summary (steps, losses, throughput) and where the checkpoints are."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pitlab.api import PitTraining, ResourceStatus, conditions, stages
from pitlab.api.layout import TrainingLayout
from pitlab.api.progress import estimate_record, newest_record
from pitlab.api.stages import Stage
from pitlab.api.status import Progress, get_condition
from pitlab.operator import backends, builders, naming
from pitlab.operator.backends import Backend
from pitlab.operator.context import Ctx, Plan, problems
from pitlab.operator.mirroring import FAILED, PENDING, PREEMPTED, SUCCEEDED, ChildState, index_pod, progress_from_log
from pitlab.pipeline.base import Report, StageStep, TrainingRun


class TrainReport(Report):
    """Where the checkpoints are and, from ``pitlab run``, the trainer's summary; on a cluster (``cluster``) the
    child (``<kind> <name>``: TrainJob, JobSet or PyTorchJob) and its final message."""

    checkpoint_uri: str
    steps: int | None = None
    first_loss: float | None = None
    final_loss: float | None = None
    mean_tokens_per_second: float | None = None
    kernel_warning: str | None = None
    resumed_from_step: int | None = None
    parallelism: str | None = None
    child: str | None = None
    child_message: str | None = None
    cluster: bool = False


def to_status(report: TrainReport, status: ResourceStatus) -> str:
    """``status.checkpointURI`` (and, on a cluster, the progress at its last step); returns the Trained message."""
    status.checkpoint_uri = report.checkpoint_uri
    if report.cluster:
        if status.progress is not None and status.progress.total_steps:
            status.progress = status.progress.finished()
        return f"{report.child}: {report.child_message}"
    tps = report.mean_tokens_per_second
    losses = report.first_loss is not None and report.final_loss is not None  # None: no step's loss was kept
    resumed = f" (resumed at step {report.resumed_from_step})" if report.resumed_from_step else ""
    on = f" on {report.parallelism}" if report.parallelism else ""
    return (f"{report.steps} steps{resumed}{on}"
            + (f", loss {report.first_loss:.3f} → {report.final_loss:.3f}" if losses else "")
            + (f", {tps:,.0f} tokens/s (mean over the run)" if tps is not None else "")
            + (f"; WARNING: {report.kernel_warning}" if report.kernel_warning else ""))


def step_progress(m: dict) -> Progress:
    """``status.progress`` of one trainer metrics record (:mod:`pitlab.trainer.metrics`)."""
    return Progress(step=m["step"], total_steps=m.get("total_steps"), loss=m.get("loss"),
                    tokens_per_second=m.get("mean_tokens_per_second"), eta_seconds=estimate_record(m).eta_seconds)


def catch_up(status: ResourceStatus, metrics: Path) -> None:
    """Set ``status.progress`` from the newest step logged in ``metrics``, read again when training ends, fails or is
    interrupted: the follower polls the file, so the last steps (or all of them) may not have reached it yet.
    Kept as it is when no step was logged (or the newest record is not a valid progress)."""
    rec = newest_record(metrics)
    if rec is not None:
        try:
            status.progress = step_progress(rec)
        except ValidationError:  # this runs while an error or an interrupt propagates: it must not replace it
            pass


def run(run: TrainingRun, stage: Stage) -> None:
    """``torchrun`` with ``nproc`` ranks (:func:`pitlab.trainer.launch.run_training`), its metrics followed into
    ``status.progress``: step 0 of the planned steps (``PitTrainingSpec.optimizer_steps``) from the start, the
    newest step logged at the end (also when training fails or is interrupted)."""
    st, n, tr = run.st, run.nproc, run.res.spec.training
    if st.status.progress is None:  # before torch is imported; a resumed run keeps its progress until a step is logged
        st.status.progress = Progress(step=0, total_steps=run.res.spec.optimizer_steps(n))
    from pitlab.trainer.checkpoint import checkpoint_location
    from pitlab.trainer.launch import run_training

    # where the checkpoints go, from the start (as the operator's status says): an interrupted run names it too
    st.status.checkpoint_uri = str(checkpoint_location(run.res.spec.checkpoint.uri, run.run_dir))
    procs = f"torchrun, {n} process{'es' if n != 1 else ''}"
    st.running(stage, procs)
    # one process: the single-device path or FSDP2, as the memory plan decides (the Trained line says which)
    how = "layer streaming" if tr.layer_streaming.enabled else "FSDP2" if n > 1 else ""
    run.reporter.stage("train", procs + (f", {how}" if how else ""))
    last_write = [0.0]
    warned = [False]

    def on_step(m: dict) -> None:
        if m.get("kernel_warning") and not warned[0]:  # a GPU run on reference kernels: say so in the status
            warned[0] = True
            st.running(stage, f"{procs}; WARNING: {m['kernel_warning']}")
        st.status.progress = step_progress(m)
        run.reporter.progress("train", m["step"], m.get("total_steps") or m["step"],
                              f"loss {m.get('loss', float('nan')):.3f}")
        if time.monotonic() - last_write[0] > 2 or m["step"] == m.get("total_steps"):
            last_write[0] = time.monotonic()
            st.write()

    paths = TrainingLayout(run.run_dir)
    try:
        summary = run_training(paths.spec, run.run_dir, n, on_step=on_step, base=run.base_dir)
    finally:  # before the caller writes the stage's end (done, failed or interrupted) into the status
        catch_up(st.status, paths.metrics)
    report = TrainReport(checkpoint_uri=str(summary.get("checkpoint", paths.checkpoint)), steps=summary["steps"],
                         first_loss=summary["first_loss"], final_loss=summary["final_loss"],
                         mean_tokens_per_second=summary.get("mean_tokens_per_second"),
                         kernel_warning=summary.get("kernel_warning") or None,
                         resumed_from_step=summary.get("resumed_from_step"),
                         parallelism=summary.get("parallelism"))
    trained = to_status(report, st.status)
    st.done(stage, trained)
    run.reporter.done("train", trained)


PROGRESS_FIELDS = tuple(f.alias or n for n, f in Progress.model_fields.items())  # camelCase, as in status


def kernel_warning(log: str | None) -> str | None:
    """The trainer's warning about slow reference kernels on a GPU (``kernelWarning`` of the newest progress line,
    see :func:`pitlab.trainer.kernels.reference_kernel_warning`), None when there is none."""
    doc = progress_from_log(log)
    value = doc.get("kernelWarning") if doc else None
    return value[:500] if isinstance(value, str) and value else None


def _progress(log: str | None, pod: str, plan: Plan) -> Progress | None:
    """``status.progress`` from the progress sidecar's log: the known fields of its newest progress line
    (unknown fields are left out). A malformed line is ignored with a warning: progress never stops a run."""
    prog = progress_from_log(log)
    if prog is None:
        return None
    try:
        return Progress.model_validate({k: prog[k] for k in PROGRESS_FIELDS if k in prog})
    except ValidationError as err:
        plan.warnings.append(("MalformedProgress", f"pod {pod}: progress line ignored: {problems(err)}"[:1000]))
        return None


def _ran(ctx: Ctx, stage: Stage) -> bool:
    """Whether the training child ran before: it reported progress, or the stage already showed it Preempted."""
    cond = get_condition(ctx.status, stage.condition)
    return ctx.status.progress is not None or (cond is not None and cond.reason == PREEMPTED)


def _pods(ctx: Ctx, backend: Backend) -> list[dict[str, Any]]:
    """The training child's pods: the PyTorchJob's master and workers (by the training operator's label), or the
    pods of a TrainJob's or JobSet's Job ``<name>-node-0`` (one per node)."""
    if backend is backends.PYTORCHJOB:
        return ctx.labelled_pods(naming.pytorchjob_pods(ctx.name))
    return ctx.world.job_pods(ctx.ns, naming.node_job(ctx.name))


def _progress_pod(ctx: Ctx, backend: Backend, pods: list[dict[str, Any]]) -> str | None:
    """The pod whose progress sidecar the operator reads: the PyTorchJob's master, or the pod of completion index 0
    of a TrainJob's or JobSet's Job ``<name>-node-0`` (its name has a random suffix: looked up in ``pods``)."""
    if backend is backends.PYTORCHJOB:
        return naming.master_pod(ctx.name)
    return index_pod(pods, naming.node_job(ctx.name), 0)


def _running(ctx: Ctx, stage: Stage, backend: Backend, job: Any, what: str, st: ChildState) -> None:
    """While the child has not finished: the progress sidecar's newest line goes to ``status.progress``; the stage's
    condition has the child's state (reason Queued, Preempted or Suspended while it waits for admission) and names
    a pod of the child that cannot start (:func:`~pitlab.operator.mirroring.stuck_pod`: its image cannot be pulled,
    its Secret is missing, it keeps crashing...), which is also posted as a Warning event."""
    pods = _pods(ctx, backend) if job else []
    pod = _progress_pod(ctx, backend, pods) if job else None
    log = ctx.world.pod_log(ctx.ns, pod, "progress") if pod else None
    prog = _progress(log, pod, ctx.plan) if pod else None
    if prog is not None:
        ctx.status.progress = prog
    step = f" (step {prog.step}/{prog.total_steps or '?'})" if prog is not None else ""
    stuck = ctx.stuck(what, pods, None if backend is backends.PYTORCHJOB else naming.node_job(ctx.name))
    warning = kernel_warning(log)
    waiting = st.reason in conditions.WAITING_REASONS  # the condition's reason: not repeated in its message
    state = st.message if waiting else st.reason + (f": {st.message}" if st.message else "")
    ctx.running(stage, f"{what}: {state}{step}{stuck}" + (f"; WARNING: {warning}" if warning else ""),
                reason=st.reason if waiting else None)


def reconcile(ctx: Ctx, stage: Stage, pt: PitTraining) -> bool:
    """The training child of the run's backend (``status.backend``, chosen before the run started); while it runs,
    the progress sidecar's newest line goes to ``status.progress``; its failure's reason and message reach the
    stage's condition."""
    if ctx.is_done(stage):
        return True
    backend = backends.chosen(ctx.status)
    job = ctx.kids.ensure(backend.build(pt, ctx.cfg, ctx.body))
    job_name = naming.training_job(ctx.name)
    ctx.status.children[backend.child_key] = job_name
    st = backend.state(job, _ran(ctx, stage)) if job else ChildState(PENDING, "Created")
    ctx.status.checkpoint_uri = builders.training_checkpoint_uri(pt, ctx.cfg)
    what = f"{backend.kind} {job_name}"
    if st.state == FAILED:
        ctx.failed(stage, f"{what}: {st.message}", reason=st.reason)
        return False
    if st.state != SUCCEEDED:
        _running(ctx, stage, backend, job, what, st)
        return False
    report = TrainReport(checkpoint_uri=ctx.status.checkpoint_uri, child=what, child_message=st.message, cluster=True)
    ctx.done(stage, to_status(report, ctx.status), reason=(st.reason if stage.done_from_child else None) or stage.done)
    return True


STEP = StageStep(stages.TRAIN, TrainReport, to_status, run, reconcile)
