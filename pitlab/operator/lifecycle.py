"""The two state machines, as pure-ish functions: a resource body and a read-only view of the cluster in,
the children to create and the new status out (a :class:`Plan`). The handlers execute plans.

Both walk the stage tables of :mod:`pitlab.api.stages`. PitTraining: Validating (and the training backend chosen)
→ Preparing (prepare Job) → Training (TrainJob, JobSet or PyTorchJob) → Merging (merge Job) → Evaluating
(LeakageEval children) → Succeeded; or Failed with the
failing child's reason and message. LeakageEval: Validating → Embedding (one Job per model, or an indexed Job)
→ Analyzing (one Job) → Succeeded.

Every call starts from what exists (level-triggered): a child that exists is adopted, never created twice,
so an operator restarted in any phase carries on. A finished stage is remembered in the status (its
condition is True), so its child is not looked at again. Once the first child exists the run's spec is fixed
(``status.specDigest``); later edits are refused with Stalled=True / reason SpecImmutable, and the run
continues from the spec stored in its ConfigMap.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pydantic import ValidationError

from pitlab import pipeline
from pitlab.api import LeakageEval, PitTraining, SpecError, conditions, stages
from pitlab.api.status import TERMINAL_PHASES, ResourceStatus, get_condition, set_condition
from pitlab.operator import backends, builders, naming, validation
from pitlab.operator.config import EVAL_SPEC_FILE, TRAINING_SPEC_FILE, OperatorConfig
from pitlab.operator.context import (Ctx, NameConflict, Plan, World, load_status,  # noqa: F401 - re-exported
                                     owned_by, problems)
from pitlab.operator.naming import (CONFIGMAPS, JOBS, JOBSETS, LEAKAGEEVALS,  # noqa: F401 - re-exported
                                    PITTRAININGS, PYTORCHJOBS, RESOURCE_OF_KIND, TRAINJOBS)

NO_BACKEND = "NoTrainingBackend"  # Validated=False: auto found no training backend in the cluster
WARNING = "Warning"  # a condition type: something the run works around or the user should know (True while so)
KUEUE_INTEGRATION = "KueueIntegrationRequired"  # Warning's reason: a PyTorchJob queued through Kueue >= 0.19


def _stored_spec(cm: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    try:
        return json.loads((cm or {}).get("data", {})[key])
    except (KeyError, TypeError, json.JSONDecodeError):
        return None


@dataclasses.dataclass
class _Begun:
    """What every reconciliation starts from: its context (plan and status), the spec as it is now (None when
    it does not parse) and the problems validation found in it."""

    ctx: Ctx
    current: PitTraining | LeakageEval | None
    problems: list[tuple[str, str]]


def _begin(body: dict[str, Any], kind: str, world: World, check: Any, cfg: OperatorConfig,
           now: str | None) -> Plan | _Begun:
    """The common start of a reconciliation: a Plan when there is nothing to run (finished at its current
    generation: ``Plan(None)``; a finished run whose spec was edited: :func:`_finished_edit`), else a
    :class:`_Begun`."""
    gen = (body.get("metadata") or {}).get("generation")
    status = load_status(body)
    if status.phase in TERMINAL_PHASES:
        if status.observed_generation == gen:
            return Plan(None)
        if status.spec_digest is not None:
            return _finished_edit(body, kind, status, gen, now)
    try:
        current = validation.parse(body, kind)
        problems = check(current, cfg)
    except SpecError as err:
        current, problems = None, err.problems
    return _Begun(Ctx(body, world, cfg, Plan(status), gen, now, kind), current, problems)


def _spec_configmap(body: dict[str, Any], kind: str) -> str:
    name = body["metadata"]["name"]
    return naming.training_spec_configmap(name) if kind == "PitTraining" else naming.eval_spec_configmap(name)


def _finished_edit(body: dict[str, Any], kind: str, status: ResourceStatus, gen: int | None,
                   now: str | None) -> Plan:
    """A spec edit of a run that finished (Succeeded or Failed after its first child existed): nothing is
    created again (children a user deleted stay deleted). The edit is refused (Stalled=True, SpecImmutable);
    an edit back to the run's spec restores the conditions the run finished with."""
    if status.spec_digest != builders.spec_digest(body.get("spec") or {}):
        conditions.refuse_spec_change(
            status, f"spec changed after the run finished ({status.phase}, generation {gen}); nothing is run "
                    f"again. The run's spec is in ConfigMap {_spec_configmap(body, kind)}: revert the edit, or create "
                    f"a new {kind}", gen, now)
    else:
        conditions.restore_finished(status, gen, now)
    return Plan(status)


_STARTED = {"PitTraining": "the run started (generation {}); the run continues",
            "LeakageEval": "the evaluation started (generation {}); it continues"}


def _refuse_edit(ctx: Ctx) -> None:
    """Once the run started its spec is fixed: an edited spec is refused (Stalled=True, SpecImmutable) and the
    run goes on with the spec stored in its ConfigMap."""
    status = ctx.status
    if status.spec_digest is not None and status.spec_digest != builders.spec_digest(ctx.body.get("spec") or {}):
        conditions.refuse_spec_change(
            status, f"spec changed after {_STARTED[ctx.kind].format(ctx.gen)} with the spec stored in ConfigMap "
                    f"{_spec_configmap(ctx.body, ctx.kind)}. Revert the edit, or create a new {ctx.kind}",
            ctx.gen, ctx.now)


def _stored_resource(ctx: Ctx, cm: dict[str, Any] | None, key: str, condition: str, gone_hint: str):
    """The run's spec from its ConfigMap, parsed; None after marking ``condition`` failed (reason
    SpecConfigMapMissing or StoredSpecInvalid) when it is gone or no longer parses."""
    cm_name = _spec_configmap(ctx.body, ctx.kind)
    stored = _stored_spec(cm, key)
    if stored is None:
        ctx.fail(condition, "SpecConfigMapMissing", f"ConfigMap {cm_name} with the run's spec is gone{gone_hint}")
        return None
    model = PitTraining if ctx.kind == "PitTraining" else LeakageEval
    try:
        return model.model_validate(stored)
    except ValidationError as err:
        ctx.fail(condition, "StoredSpecInvalid", f"ConfigMap {cm_name}: the run's spec no longer parses: "
                                                 f"{problems(err)}; delete and recreate the {ctx.kind}")
        return None


# ---------------------------------------------------------------- PitTraining
def reconcile_training(body: dict[str, Any], world: World, cfg: OperatorConfig, now: str | None = None) -> Plan:
    """One reconciliation of a PitTraining body: the children to create and its next status."""
    begun = _begin(body, "PitTraining", world, validation.check_training, cfg, now)
    if isinstance(begun, Plan):
        return begun
    ctx = begun.ctx
    if ctx.status.spec_digest is None:  # nothing started yet: the spec must be valid to start
        if begun.problems:
            ctx.failed(stages.VALIDATE, validation.message(begun.problems))
            return ctx.plan
        if not _choose_backend(ctx, begun.current):
            return ctx.plan
        ctx.done(stages.VALIDATE, "spec is valid")
    try:
        _advance_training(ctx, begun.current)
    except NameConflict as err:
        ctx.fail_current("NameConflict", str(err))
    _refuse_edit(ctx)
    return ctx.plan


def _choose_backend(ctx: Ctx, pt: PitTraining) -> bool:
    """Before the run starts: its training backend and why (``status.backend``, :func:`backends.choose`) and, for a
    PyTorchJob queued through Kueue, condition Warning=True (reason KueueIntegrationRequired) and a Warning event.
    False when ``auto`` finds no backend: Validated=False and Stalled=True with reason NoTrainingBackend, naming
    what to install; nothing is created and the operator looks again at every reconcile."""
    runtime = ctx.cfg.training_runtime
    choice = backends.choose(pt.spec.resources.backend, ctx.cfg.training_backend, ctx.world.serves,
                             lambda: ctx.world.get(naming.CLUSTERTRAININGRUNTIMES, None, runtime) is not None,
                             runtime)
    if choice.backend is None:
        ctx.running(stages.VALIDATE, choice.reason, reason=NO_BACKEND)
        conditions.stage_blocked(ctx.status, stages.VALIDATE.condition, NO_BACKEND, choice.reason, ctx.gen, ctx.now)
        ctx.plan.warnings.append((NO_BACKEND, choice.reason))
        return False
    ctx.status.backend = choice.backend.status(choice.reason)
    warning = backends.kueue_warning(choice.backend, pt.spec.resources.queue_name)
    ctx.status.conditions = [c for c in ctx.status.conditions if c.type != WARNING]
    if warning:
        set_condition(ctx.status, WARNING, "True", KUEUE_INTEGRATION, warning, ctx.gen, ctx.now)
        ctx.plan.warnings.append((KUEUE_INTEGRATION, warning))
    return True


def _advance_training(ctx: Ctx, current: PitTraining | None) -> None:
    """Walk the PitTraining's stages from the first not done; stop at the first that is still running or failed."""
    status = ctx.status
    if current is not None and status.spec_digest is None:
        cm = ctx.kids.ensure(builders.build_training_configmap(current, ctx.body))
    else:
        cm = ctx.world.get(CONFIGMAPS, ctx.ns, naming.training_spec_configmap(ctx.name))
    if status.spec_digest is None:
        pt = current
        status.spec_digest = builders.spec_digest(ctx.body.get("spec") or {})
    else:
        pt = _stored_resource(ctx, cm, TRAINING_SPEC_FILE, conditions.current_stage(
            status, stages.conditions_of("PitTraining")), "; delete and recreate the PitTraining")
        if pt is None:
            return
    status.children.setdefault("configMap", naming.training_spec_configmap(ctx.name))
    for stage in stages.PITTRAINING[1:]:
        if not pipeline.step(stage).reconcile(ctx, stage, pt):
            return
    ctx.succeeded(f"model at {status.model_uri}")


# ---------------------------------------------------------------- LeakageEval
def _model_uris(le: LeakageEval, world: World, cfg: OperatorConfig
                ) -> tuple[dict[str, str], str | None, tuple[str, str] | None]:
    """URIs of the ``trainingRef`` models: (uris, None, None); or (partial, reason to wait, None); or
    (partial, None, (reason, message)) when a model can never come (its PitTraining failed without it, or
    its spec does not parse)."""
    uris: dict[str, str] = {}
    ns = le.metadata.namespace
    for m in le.spec.models:
        if m.training_ref is None:
            continue
        ref = m.training_ref
        body = world.get(PITTRAININGS, ns, ref.name)
        if body is None:
            return uris, f"model {m.name}: PitTraining {ref.name} not found", None
        st = load_status(body)
        ready = conditions.is_true(st, "Merged" if ref.artifact == "model" else "Prepared")
        if not ready and st.phase == "Failed":
            stalled = get_condition(st, "Stalled")
            why = f"{stalled.reason}: {stalled.message}" if stalled else "no reason given"
            return uris, None, ("TrainingFailed", f"model {m.name}: PitTraining {ref.name} failed before its "
                                                  f"{ref.artifact} was written ({why})")
        if not ready:
            return uris, f"model {m.name}: PitTraining {ref.name} has no {ref.artifact} yet (phase {st.phase})", None
        try:
            pt = validation.parse(body, "PitTraining")
        except SpecError as err:
            return uris, None, ("TrainingRefInvalid", f"model {m.name}: the spec of PitTraining {ref.name} does "
                                                      f"not parse: {validation.message(err.problems)}")
        uris[m.name] = builders.training_ref_uri(pt, ref, cfg)
    return uris, None, None


def reconcile_eval(body: dict[str, Any], world: World, cfg: OperatorConfig, now: str | None = None) -> Plan:
    """One reconciliation of a LeakageEval body: the children to create and its next status."""
    begun = _begin(body, "LeakageEval", world, validation.check_eval, cfg, now)
    if isinstance(begun, Plan):
        return begun
    ctx = begun.ctx
    try:
        le = _validate_eval(ctx, begun)
        if le is None:  # waiting for a model, or failed (an edit of the spec is not looked at then)
            return ctx.plan
        ctx.status.children.setdefault("configMap", naming.eval_spec_configmap(ctx.name))
        _advance_eval(ctx, le)
    except NameConflict as err:
        ctx.failed(stages.EMBED, str(err), reason="NameConflict")
    _refuse_edit(ctx)
    return ctx.plan


def _validate_eval(ctx: Ctx, begun: _Begun) -> LeakageEval | None:
    """The LeakageEval to run: before the first child, the current spec once it is valid and its trainingRef
    models exist (then the spec ConfigMap is created); after, the spec stored in the ConfigMap. None while it
    waits for a model or after a failure."""
    status, stage = ctx.status, stages.VALIDATE
    if status.spec_digest is not None:
        cm = ctx.world.get(CONFIGMAPS, ctx.ns, naming.eval_spec_configmap(ctx.name))
        return _stored_resource(ctx, cm, EVAL_SPEC_FILE, stages.EMBED.condition, "")
    if begun.problems:
        ctx.failed(stage, validation.message(begun.problems))
        return None
    current = begun.current
    uris, wait, fail = _model_uris(current, ctx.world, ctx.cfg)
    if fail:
        ctx.failed(stage, fail[1], reason=fail[0])
        return None
    if wait:
        ctx.running(stage, wait, reason="WaitingForModel")
        return None
    ctx.done(stage, "spec is valid")
    ctx.kids.ensure(builders.build_eval_configmap(current, uris, ctx.body))
    status.spec_digest = builders.spec_digest(ctx.body.get("spec") or {})
    return current


def _advance_eval(ctx: Ctx, le: LeakageEval) -> None:
    """Walk the LeakageEval's stages from the first not done; stop at the first still running or failed."""
    for stage in stages.LEAKAGEEVAL[1:]:
        if not pipeline.step(stage).reconcile(ctx, stage, le):
            return
    ctx.succeeded(ctx.status.premium_summary or "evaluation complete")
