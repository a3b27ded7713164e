"""The status vocabulary shared by the operator and ``pitlab run``: conditions, written only through
:func:`pitlab.api.status.set_condition` / ``set_phase``.

Each resource has the kstatus conditions ``Ready``, ``Reconciling`` and ``Stalled`` (kept consistent with
the phase by ``set_phase``) plus one condition per stage (:mod:`pitlab.api.stages`): PitTraining ``Validated``,
``Prepared``, ``Trained``, ``Merged``, ``Evaluated``; LeakageEval ``Validated``, ``Embedded``, ``Analyzed``. A stage's
condition is False with an in-progress reason while it runs, True when it is done, and False with the
child's reason when it failed. ``lastTransitionTime`` only moves when a condition's status changes.
"""

from __future__ import annotations

from pitlab.api.status import ResourceStatus, get_condition, set_condition, set_phase

SPEC_IMMUTABLE = "SpecImmutable"
WAITING_REASONS = ("Queued", "Preempted", "Suspended")
"""Reasons of a stage that waits for admission (e.g. its child suspended by Kueue) while Reconciling=True: the
shipped GitOps health checks show such a resource as Suspended, not Progressing (charts/pitlab/files/health)."""


def is_true(status: ResourceStatus, type_: str) -> bool:
    """Whether condition ``type_`` is present with status True."""
    return any(c.type == type_ and c.status == "True" for c in status.conditions)


def current_stage(status: ResourceStatus, stages: tuple[str, ...]) -> str:
    """The stage in progress: the first of ``stages`` whose condition is not True (the last when all are)."""
    return next((s for s in stages if not is_true(status, s)), stages[-1])


def stage_running(status: ResourceStatus, stage: str, phase: str, reason: str, message: str,
                  generation: int | None, now: str | None = None) -> None:
    """Stage ``stage`` is in progress: its condition False/``reason``, phase ``phase`` (Reconciling=True)."""
    set_condition(status, stage, "False", reason, message, generation, now)
    set_phase(status, phase, reason, message, generation, now)


def stage_done(status: ResourceStatus, stage: str, reason: str, message: str, generation: int | None,
               now: str | None = None) -> None:
    """Stage ``stage`` finished: its condition True/``reason`` (the phase moves with the next stage)."""
    set_condition(status, stage, "True", reason, message, generation, now)


def stage_failed(status: ResourceStatus, stage: str, reason: str, message: str, generation: int | None,
                 now: str | None = None) -> None:
    """Stage ``stage`` failed: its condition False and phase Failed (Stalled=True), both with the child's
    ``reason`` and ``message``."""
    set_condition(status, stage, "False", reason, message, generation, now)
    set_phase(status, "Failed", reason, message, generation, now)


INTERRUPTED = "Interrupted"


def stage_interrupted(status: ResourceStatus, stage: str, message: str, generation: int | None,
                      now: str | None = None) -> None:
    """Stage ``stage`` was stopped by a signal (``pitlab run`` only): its condition False/Interrupted and phase
    Interrupted (Stalled=True), with ``message`` saying what was durable (e.g. the last checkpoint)."""
    set_condition(status, stage, "False", INTERRUPTED, message, generation, now)
    set_phase(status, "Interrupted", INTERRUPTED, message, generation, now)


def succeeded(status: ResourceStatus, reason: str, message: str, generation: int | None,
              now: str | None = None) -> None:
    """The whole resource succeeded: phase Succeeded, Ready=True."""
    set_phase(status, "Succeeded", reason, message, generation, now)


def refuse_spec_change(status: ResourceStatus, message: str, generation: int | None,
                       now: str | None = None) -> None:
    """The spec was edited after the run started: the run goes on with the spec it started with, and the
    resource reports Stalled=True / Ready=False with reason SpecImmutable until the edit is reverted."""
    status.observed_generation = generation
    set_condition(status, "Ready", "False", SPEC_IMMUTABLE, message, generation, now)
    set_condition(status, "Stalled", "True", SPEC_IMMUTABLE, message, generation, now)


def restore_finished(status: ResourceStatus, generation: int | None, now: str | None = None) -> None:
    """A finished resource whose spec is back to the one it ran: its kstatus conditions as they were when it
    finished (the outcome's reason and message are kept on ``Reconciling``, which a refusal leaves alone)."""
    rec = get_condition(status, "Reconciling")
    reason = rec.reason if rec else status.phase
    message = rec.message if rec else ""
    set_phase(status, status.phase, reason, message, generation, now)


def stage_blocked(status: ResourceStatus, stage: str, reason: str, message: str, generation: int | None,
                  now: str | None = None) -> None:
    """Stage ``stage`` cannot go on until something outside the operator changes (a missing CRD, RBAC, a
    quota): its condition False/``reason``, Stalled=True and Ready=False with ``reason``/``message``, while
    the phase stays and the operator keeps retrying (Reconciling=True)."""
    set_condition(status, stage, "False", reason, message, generation, now)
    status.observed_generation = generation
    set_condition(status, "Ready", "False", reason, message, generation, now)
    set_condition(status, "Reconciling", "True", reason, message, generation, now)
    set_condition(status, "Stalled", "True", reason, message, generation, now)
