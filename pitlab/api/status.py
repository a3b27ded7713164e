"""Status blocks and Kubernetes-style conditions, written by one function for the operator and the local runner.

Conditions follow the Kubernetes API convention (type, status, reason, message, lastTransitionTime,
observedGeneration) plus the kstatus types ``Ready``, ``Reconciling`` and ``Stalled``, so ``kubectl wait
--for=condition=Ready`` works. ``lastTransitionTime`` changes only when a condition's status changes.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from pitlab.api.base import SpecModel
from pitlab.api.progress import format_eta, percent_done

Phase = Literal["Pending", "Validating", "Preparing", "Training", "Merging", "Evaluating", "Embedding", "Analyzing",
                "Succeeded", "Failed", "Interrupted"]
"""``Interrupted``: ``pitlab run`` was stopped (SIGINT/SIGTERM) and can be resumed (``pitlab run --resume``)."""
TERMINAL_PHASES = ("Succeeded", "Failed")


class Condition(SpecModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class Progress(SpecModel):
    """How far training is (PitTraining): the latest step, loss and speed, percent done and the time left."""
    # percent and eta are derived on every validation (from step/totalSteps and etaSeconds, pitlab.api.progress),
    # so they never disagree with the fields they come from.

    model_config = ConfigDict(allow_inf_nan=True)  # a diverged run's loss is reported as it is (NaN)

    step: int = 0
    total_steps: int | None = None
    loss: float | None = None
    tokens_per_second: float | None = Field(
        None, description="mean training speed (input tokens per second, all GPUs) from the start of the "
                          "training attempt to the latest step (not the latest step's own speed)")
    percent: float | None = Field(
        None, ge=0, le=100, description="training steps done, in percent (step / totalSteps, floored to 0.1)")
    eta_seconds: int | None = Field(
        None, ge=0, description="seconds of training left at the latest step: the current attempt's mean seconds "
                                "per step times the steps left (0 once training is done)")
    eta: str | None = Field(None, description="etaSeconds for people (45s, 12m05s, 3h07m, 2d04h)")

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        pick = lambda alias, name: data[alias] if alias in data else data.get(name)  # noqa: E731
        step, total = pick("step", "step") or 0, pick("totalSteps", "total_steps")
        out = {k: v for k, v in data.items() if k not in ("percent", "eta")}
        if isinstance(step, int) and (total is None or isinstance(total, int)):  # else the field errors say why
            out["percent"] = percent_done(step, total)
        eta_seconds = pick("etaSeconds", "eta_seconds")
        out["eta"] = format_eta(eta_seconds) if isinstance(eta_seconds, int) else None
        return out

    def stopped(self) -> "Progress":
        """This progress without a time left (etaSeconds, eta): training stopped before its last step (failed or
        interrupted), so no ETA is running."""
        return Progress.model_validate({**self.model_dump(), "eta_seconds": None})

    def finished(self) -> "Progress":
        """This progress at its last step (training done): step = totalSteps, 100 %, ETA 0s."""
        total = self.total_steps if self.total_steps is not None else self.step
        return Progress.model_validate({**self.model_dump(), "step": total, "total_steps": total,
                                        "eta_seconds": 0})


class CorpusAuditStatus(SpecModel):
    included: int
    excluded_by_date: int
    rejected_timestamp: int
    rejected_empty_text: int | None = Field(None, description="documents dropped for an empty text "
                                                              "(onEmptyText: drop)")
    max_included_timestamp: str | None
    included_ids_sha256: str
    included_sha256: str | None = Field(None, description="sha256 of the kept documents themselves (id, timestamp "
                                                          "and text, in file order)")
    timestamp_format: str | None = Field(None, description="format the timestamps were read with (iso8601, a "
                                                           "strftime pattern or epoch_s/epoch_ms/epoch_us)")
    warnings: list[str] | None = Field(None, description="what looks wrong without being an error (a knowledge "
                                                         "cutoff after the latest document or after today)")


class BackendStatus(SpecModel):
    """The training backend a PitTraining runs on (operator): chosen once, before the first child, and kept."""

    name: Literal["trainjob", "jobset", "pytorchjob"]
    kind: Literal["TrainJob", "JobSet", "PyTorchJob"]
    reason: str = Field("", description="why this backend: the spec's or the operator's choice, or what auto found")


class ResourceStatus(SpecModel):
    """``status`` of a PitTraining or a LeakageEval (fields a kind does not use stay unset)."""

    phase: Phase = "Pending"
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    progress: Progress | None = None
    corpus_audit: CorpusAuditStatus | None = None
    checkpoint_uri: str | None = None
    model_uri: str | None = None
    report_uri: str | None = None
    children: dict[str, str] = Field(default_factory=dict)
    backend: BackendStatus | None = Field(None, description="PitTraining: the kind that runs its training stage, "
                                                           "and why (operator)")
    results: dict[str, Any] | None = None
    premium_summary: str | None = Field(
        None, description="one-line leakage premium summary (model premium [CI]) for `kubectl get` (operator)")
    spec_digest: str | None = Field(
        None, description="sha256 of the spec the run executes; set when the first child is created, after which "
                          "the spec is immutable (operator)")


CONDITION_ORDER = ("Validated", "Prepared", "Trained", "Merged", "Evaluated", "Embedded", "Analyzed",
                   "Ready", "Reconciling", "Stalled")
"""Order in which conditions are listed: stages in pipeline order, then the kstatus types. A fixed order keeps
``kubectl describe`` (and any diff of the status) stable whatever order the reconciles happened to run in."""


def _order(cond: Condition) -> float:
    try:
        return CONDITION_ORDER.index(cond.type)
    except ValueError:
        return CONDITION_ORDER.index("Ready") - 0.5  # unknown types after the stages, before the kstatus types


def now_rfc3339() -> str:
    """Current UTC time as RFC 3339 with second precision (the Kubernetes ``metav1.Time`` format)."""
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(status: ResourceStatus, type_: str, state: Literal["True", "False", "Unknown"], reason: str,
                  message: str = "", generation: int | None = None, now: str | None = None) -> ResourceStatus:
    """Set (or add) condition ``type_`` on ``status`` in place and return it.

    ``lastTransitionTime`` is kept when ``state`` equals the current status; reason, message and
    observedGeneration are always updated. The list is kept in :data:`CONDITION_ORDER`.
    """
    now = now or now_rfc3339()
    conds = list(status.conditions)
    for i, c in enumerate(conds):
        if c.type == type_:
            ltt = c.last_transition_time if c.status == state else now
            conds[i] = Condition(type=type_, status=state, reason=reason, message=message,
                                 last_transition_time=ltt, observed_generation=generation)
            break
    else:
        conds.append(Condition(type=type_, status=state, reason=reason, message=message,
                               last_transition_time=now, observed_generation=generation))
    status.conditions = sorted(conds, key=_order)
    return status


def set_phase(status: ResourceStatus, phase: str, reason: str, message: str = "",
              generation: int | None = None, now: str | None = None) -> ResourceStatus:
    """Move to ``phase`` and keep the kstatus conditions consistent with it.

    Non-terminal phases: Reconciling=True, Ready=False, Stalled=False. Succeeded: Ready=True, Reconciling=False.
    Failed and Interrupted: Stalled=True (reason/message from the failure or the signal), Ready=False,
    Reconciling=False.
    """
    status.phase = phase
    status.observed_generation = generation
    if phase == "Succeeded":
        set_condition(status, "Ready", "True", reason, message, generation, now)
        set_condition(status, "Reconciling", "False", reason, message, generation, now)
        set_condition(status, "Stalled", "False", reason, "", generation, now)
    elif phase in ("Failed", "Interrupted"):
        set_condition(status, "Ready", "False", reason, message, generation, now)
        set_condition(status, "Reconciling", "False", reason, message, generation, now)
        set_condition(status, "Stalled", "True", reason, message, generation, now)
    else:
        set_condition(status, "Ready", "False", reason, message, generation, now)
        set_condition(status, "Reconciling", "True", reason, message, generation, now)
        set_condition(status, "Stalled", "False", reason, "", generation, now)
    return status


def get_condition(status: ResourceStatus, type_: str) -> Condition | None:
    """The condition of type ``type_``, or None."""
    return next((c for c in status.conditions if c.type == type_), None)
