"""The two state machines, as pure-ish functions: a resource body and a read-only view of the cluster in,
the children to create and the new status out (a :class:`Plan`). The handlers execute plans.

Both walk the stage tables of :mod:`pitlab.api.stages`. PitTraining: Validating → Preparing (prepare Job) →
Training (PyTorchJob) → Merging (merge Job) → Evaluating (LeakageEval children) → Succeeded; or Failed with the
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
from typing import Any, Protocol

from pydantic import ValidationError

from pitlab.api import LeakageEval, PitTraining, SpecError, conditions, layout, stages
from pitlab.api.layout import EvalOutputs, TrainingLayout
from pitlab.api.stages import Stage
from pitlab.api.status import TERMINAL_PHASES, CorpusAuditStatus, Progress, ResourceStatus, get_condition
from pitlab.api.summary import premium_summary
from pitlab.errors import StageError
from pitlab.operator import builders, naming, validation
from pitlab.operator.config import EVAL_SPEC_FILE, TRAINING_SPEC_FILE, OperatorConfig
from pitlab.operator.mirroring import (FAILED, SUCCEEDED, ChildState, batch_job_state, jobs_state, last_lines,
                                       leakageeval_state, message_json, progress_from_log, pytorchjob_state,
                                       termination_message)
from pitlab.operator.naming import (CONFIGMAPS, JOBS, LEAKAGEEVALS, PITTRAININGS,  # noqa: F401 - re-exported
                                    PYTORCHJOBS, RESOURCE_OF_KIND)


class World(Protocol):
    """Read-only view of one namespace (implemented over the API by :class:`pitlab.operator.kube.Kube`)."""

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None: ...
    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]: ...
    def pod_log(self, namespace: str, pod: str, container: str) -> str | None: ...


@dataclasses.dataclass
class Plan:
    """What to do: create ``creates`` (in order), then write ``status`` (None: leave the status alone), and
    post ``warnings`` (reason, message) as Warning events (e.g. a malformed progress line, which is ignored)."""

    status: ResourceStatus | None
    creates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    warnings: list[tuple[str, str]] = dataclasses.field(default_factory=list)


class NameConflict(StageError):
    """A child's name is taken by an object this resource does not own. Exit code 1, ``NameConflict``."""

    reason = "NameConflict"


def load_status(body: dict[str, Any]) -> ResourceStatus:
    """The body's status as a model (an unreadable status starts afresh)."""
    try:
        return ResourceStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return ResourceStatus()


def owned_by(child: dict[str, Any], owner: dict[str, Any]) -> bool:
    """Whether ``child`` has an owner reference to ``owner`` (kind and name; uid too when both have one)."""
    uid = owner["metadata"].get("uid")
    for ref in (child.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == owner["kind"] and ref.get("name") == owner["metadata"]["name"]:
            if not uid or not ref.get("uid") or ref["uid"] == uid:
                return True
    return False


class _Children:
    """Looks children up by name, checks they are ours, and queues the missing ones for creation."""

    def __init__(self, world: World, owner: dict[str, Any], plan: Plan):
        self.world, self.owner, self.plan = world, owner, plan
        self.ns = owner["metadata"].get("namespace")

    def ensure(self, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """The existing child named like ``manifest`` (None if it is being created now)."""
        name = manifest["metadata"]["name"]
        found = self.world.get(RESOURCE_OF_KIND[manifest["kind"]], self.ns, name)
        if found is None:
            self.plan.creates.append(manifest)
            return None
        if not owned_by(found, self.owner):
            raise NameConflict(f"{manifest['kind']} {name} exists and is not owned by "
                               f"{self.owner['kind']} {self.owner['metadata']['name']}")
        return found


def _problems(err: ValidationError, root: str = "") -> str:
    """A pydantic error as ``field: problem; field: problem`` (fields as written in YAML)."""
    return validation.message(SpecError.from_validation_error(err, root=root).problems)


def _stored_spec(cm: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    try:
        return json.loads((cm or {}).get("data", {})[key])
    except (KeyError, TypeError, json.JSONDecodeError):
        return None


def _job_message(world: World, ns: str, job: dict[str, Any] | None, container: str, state: ChildState) -> str:
    name = job["metadata"]["name"] if job else "?"
    msg = termination_message(world.job_pods(ns, name), name, container) if job else None
    detail = last_lines(msg) if msg and message_json(msg) is None else ""
    return f"Job {name}: {state.reason}: {state.message}" + (f"; {detail}" if detail else "")


@dataclasses.dataclass
class _Ctx:
    """One reconciliation of one resource: its body, the cluster view, the configuration, the plan being built
    (whose status it changes) and the generation and time that every condition written now carries."""

    body: dict[str, Any]
    world: World
    cfg: OperatorConfig
    plan: Plan
    gen: int | None
    now: str | None
    kind: str
    kids: _Children = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.kids = _Children(self.world, self.body, self.plan)

    @property
    def status(self) -> ResourceStatus:
        assert self.plan.status is not None
        return self.plan.status

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    @property
    def ns(self) -> str | None:
        return self.body["metadata"].get("namespace")

    def running(self, stage: Stage, message: str, reason: str | None = None) -> None:
        """``stage`` in progress: its condition False with ``reason`` (default: its phase), phase ``stage.phase``."""
        conditions.stage_running(self.status, stage.condition, stage.phase, reason or stage.phase, message,
                                 self.gen, self.now)

    def done(self, stage: Stage, message: str, reason: str | None = None) -> None:
        """``stage`` finished: its condition True with ``reason`` (default ``stage.done``)."""
        conditions.stage_done(self.status, stage.condition, reason or stage.done, message, self.gen, self.now)

    def failed(self, condition: str, reason: str, message: str) -> None:
        """Condition ``condition`` False and phase Failed, with ``reason`` and ``message``."""
        conditions.stage_failed(self.status, condition, reason, message, self.gen, self.now)

    def fail_current(self, reason: str, message: str) -> None:
        """The stage in progress (the first whose condition is not True) failed."""
        self.failed(conditions.current_stage(self.status, stages.conditions_of(self.kind)), reason, message)

    def succeeded(self, message: str) -> None:
        conditions.succeeded(self.status, stages.SUCCEEDED, message, self.gen, self.now)


def _job_stage(ctx: _Ctx, stage: Stage, manifest: dict[str, Any], child_key: str) -> dict[str, Any] | None:
    """One stage run by a single batch Job (prepare, merge, analyze): create or adopt the Job, record it in
    ``status.children[child_key]`` and mirror its state onto ``stage``. Returns the Job once it succeeded;
    None while it runs (condition False, reason ``stage.phase``) or after it failed (condition False with the
    Job's reason, its message and the log tail of its container, named like ``stage``)."""
    job = ctx.kids.ensure(manifest)
    job_name = manifest["metadata"]["name"]
    ctx.status.children[child_key] = job_name
    st = batch_job_state(job) if job else ChildState("Pending", "Created")
    if st.state == FAILED:
        ctx.failed(stage.condition, st.reason, _job_message(ctx.world, ctx.ns, job, stage.name, st))
        return None
    if st.state != SUCCEEDED:
        ctx.running(stage, f"Job {job_name}: {st.reason}")
        return None
    return job


@dataclasses.dataclass
class _Begun:
    """What every reconciliation starts from: its context (plan and status), the spec as it is now (None when
    it does not parse) and the problems validation found in it."""

    ctx: _Ctx
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
    return _Begun(_Ctx(body, world, cfg, Plan(status), gen, now, kind), current, problems)


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


def _refuse_edit(ctx: _Ctx) -> None:
    """Once the run started its spec is fixed: an edited spec is refused (Stalled=True, SpecImmutable) and the
    run goes on with the spec stored in its ConfigMap."""
    status = ctx.status
    if status.spec_digest is not None and status.spec_digest != builders.spec_digest(ctx.body.get("spec") or {}):
        conditions.refuse_spec_change(
            status, f"spec changed after {_STARTED[ctx.kind].format(ctx.gen)} with the spec stored in ConfigMap "
                    f"{_spec_configmap(ctx.body, ctx.kind)}. Revert the edit, or create a new {ctx.kind}",
            ctx.gen, ctx.now)


def _stored_resource(ctx: _Ctx, cm: dict[str, Any] | None, key: str, condition: str, gone_hint: str):
    """The run's spec from its ConfigMap, parsed; None after marking ``condition`` failed (reason
    SpecConfigMapMissing or StoredSpecInvalid) when it is gone or no longer parses."""
    cm_name = _spec_configmap(ctx.body, ctx.kind)
    stored = _stored_spec(cm, key)
    if stored is None:
        ctx.failed(condition, "SpecConfigMapMissing", f"ConfigMap {cm_name} with the run's spec is gone{gone_hint}")
        return None
    model = PitTraining if ctx.kind == "PitTraining" else LeakageEval
    try:
        return model.model_validate(stored)
    except ValidationError as err:
        ctx.failed(condition, "StoredSpecInvalid", f"ConfigMap {cm_name}: the run's spec no longer parses: "
                                                   f"{_problems(err)}; delete and recreate the {ctx.kind}")
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
            ctx.failed(stages.VALIDATE.condition, stages.VALIDATE.failed, validation.message(begun.problems))
            return ctx.plan
        ctx.done(stages.VALIDATE, "spec is valid")
    try:
        _advance_training(ctx, begun.current)
    except NameConflict as err:
        ctx.fail_current("NameConflict", str(err))
    _refuse_edit(ctx)
    return ctx.plan


def _advance_training(ctx: _Ctx, current: PitTraining | None) -> None:
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
        if not TRAINING_STEPS[stage.name](ctx, stage, pt):
            return
    ctx.succeeded(f"model at {status.model_uri}")


def _prepare(ctx: _Ctx, stage: Stage, pt: PitTraining) -> bool:
    """The prepare Job; once it succeeded, the corpus audit of its termination message goes to the status."""
    if conditions.is_true(ctx.status, stage.condition):
        return True
    job = _job_stage(ctx, stage, builders.build_prepare_job(pt, ctx.cfg, ctx.body), "prepareJob")
    if job is None:
        return False
    job_name = job["metadata"]["name"]
    doc = message_json(termination_message(ctx.world.job_pods(ctx.ns, job_name), job_name, stage.name)) or {}
    audit = _corpus_audit(doc.get("corpusAudit"), job_name, ctx.plan)
    if audit is not None:
        ctx.status.corpus_audit = audit
        ctx.plan.warnings.extend(("CorpusWarning", w) for w in audit.warnings or [])
    ctx.done(stage, f"{audit.included} documents up to {pt.spec.knowledge_cutoff}, {audit.excluded_by_date} after "
                    f"it" if audit is not None else "corpus filtered")
    return True


def _train(ctx: _Ctx, stage: Stage, pt: PitTraining) -> bool:
    """The PyTorchJob; while it runs, the progress sidecar's newest line goes to ``status.progress``."""
    status = ctx.status
    if conditions.is_true(status, stage.condition):
        return True
    job = ctx.kids.ensure(builders.build_pytorchjob(pt, ctx.cfg, ctx.body))
    job_name = naming.pytorchjob(ctx.name)
    status.children["pytorchJob"] = job_name
    st = pytorchjob_state(job) if job else ChildState("Pending", "Created")
    status.checkpoint_uri = builders.training_checkpoint_uri(pt, ctx.cfg)
    if st.state == FAILED:
        ctx.failed(stage.condition, st.reason, f"PyTorchJob {job_name}: {st.message}")
        return False
    if st.state != SUCCEEDED:
        pod = naming.master_pod(ctx.name)
        log = ctx.world.pod_log(ctx.ns, pod, "progress") if job else None
        prog = _progress(log, pod, ctx.plan) if job else None
        if prog is not None:
            status.progress = prog
        step = f" (step {prog.step}/{prog.total_steps or '?'})" if prog is not None else ""
        warning = kernel_warning(log)
        ctx.running(stage, f"PyTorchJob {job_name}: {st.reason}{step}" + (f"; WARNING: {warning}" if warning else ""))
        return False
    if status.progress is not None and status.progress.total_steps:
        status.progress.step = status.progress.total_steps
    ctx.done(stage, f"PyTorchJob {job_name}: {st.message}", reason=st.reason or stage.done)
    return True


def _merge(ctx: _Ctx, stage: Stage, pt: PitTraining) -> bool:
    """The merge Job; the merged model's URI goes to ``status.modelURI``."""
    if conditions.is_true(ctx.status, stage.condition):
        return True
    if _job_stage(ctx, stage, builders.build_merge_job(pt, ctx.cfg, ctx.body), "mergeJob") is None:
        return False
    ctx.status.model_uri = TrainingLayout(builders.training_run_dir(pt, ctx.cfg)).model
    ctx.done(stage, f"model written to {ctx.status.model_uri}")
    return True


def _evaluate(ctx: _Ctx, stage: Stage, pt: PitTraining) -> bool:
    """One LeakageEval child per ``spec.evaluations`` entry; their results summaries go to ``status.results``."""
    status = ctx.status
    if not pt.spec.evaluations:
        ctx.done(stage, "spec.evaluations is empty", reason=stage.empty)
        return True
    results: dict[str, Any] = {}
    pending = []
    for tpl in pt.spec.evaluations:
        child_name = naming.evaluation(ctx.name, tpl.name)
        child = ctx.kids.ensure(builders.build_evaluation(pt, tpl, ctx.body))
        status.children[f"leakageEval.{tpl.name}"] = child_name
        st = leakageeval_state(child) if child else ChildState("Pending", "Created")
        if st.state == FAILED:
            ctx.failed(stage.condition, st.reason, f"LeakageEval {child_name}: {st.message}")
            return False
        if st.state == SUCCEEDED:
            results[tpl.name] = ((child or {}).get("status") or {}).get("results") or {}
        else:
            pending.append(f"{child_name} ({st.reason})")
    if pending:
        ctx.running(stage, "waiting for LeakageEval " + ", ".join(pending))
        return False
    status.results = results
    ctx.done(stage, f"{len(results)} evaluation(s) succeeded")
    return True


TRAINING_STEPS = {"prepare": _prepare, "train": _train, "merge": _merge, "evaluate": _evaluate}


def _corpus_audit(doc: Any, job: str, plan: Plan) -> CorpusAuditStatus | None:
    """The prepare Job's corpus audit for ``status.corpusAudit``; None (plus a warning) when it is missing or
    malformed: the audit is informative, never a reason to fail a run."""
    if not doc:
        return None
    try:
        return CorpusAuditStatus.model_validate(doc)
    except ValidationError as err:
        plan.warnings.append(("MalformedCorpusAudit",
                              f"Job {job}: corpus audit ignored: {_problems(err, 'corpusAudit')}"[:1000]))
        return None


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
        plan.warnings.append(("MalformedProgress", f"pod {pod}: progress line ignored: {_problems(err)}"[:1000]))
        return None


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
        uris[m.name] = (builders.base_model_dir(pt, cfg) if ref.artifact == "base"
                        else layout.join(builders.training_run_dir(pt, cfg), ref.artifact))
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
        ctx.failed(stages.EMBED.condition, "NameConflict", str(err))
    _refuse_edit(ctx)
    return ctx.plan


def _validate_eval(ctx: _Ctx, begun: _Begun) -> LeakageEval | None:
    """The LeakageEval to run: before the first child, the current spec once it is valid and its trainingRef
    models exist (then the spec ConfigMap is created); after, the spec stored in the ConfigMap. None while it
    waits for a model or after a failure."""
    status, stage = ctx.status, stages.VALIDATE
    if status.spec_digest is not None:
        cm = ctx.world.get(CONFIGMAPS, ctx.ns, naming.eval_spec_configmap(ctx.name))
        return _stored_resource(ctx, cm, EVAL_SPEC_FILE, stages.EMBED.condition, "")
    if begun.problems:
        ctx.failed(stage.condition, stage.failed, validation.message(begun.problems))
        return None
    current = begun.current
    uris, wait, fail = _model_uris(current, ctx.world, ctx.cfg)
    if fail:
        ctx.failed(stage.condition, fail[0], fail[1])
        return None
    if wait:
        ctx.running(stage, wait, reason="WaitingForModel")
        return None
    ctx.done(stage, "spec is valid")
    ctx.kids.ensure(builders.build_eval_configmap(current, uris, ctx.body))
    status.spec_digest = builders.spec_digest(ctx.body.get("spec") or {})
    return current


def _advance_eval(ctx: _Ctx, le: LeakageEval) -> None:
    """Walk the LeakageEval's stages from the first not done; stop at the first still running or failed."""
    for stage in stages.LEAKAGEEVAL[1:]:
        if not EVAL_STEPS[stage.name](ctx, stage, le):
            return
    ctx.succeeded(ctx.status.premium_summary or "evaluation complete")


def _embed(ctx: _Ctx, stage: Stage, le: LeakageEval) -> bool:
    """The embedding Jobs (one per model, or one indexed Job)."""
    status = ctx.status
    if conditions.is_true(status, stage.condition):
        return True
    jobs = []
    for manifest in builders.build_embed_jobs(le, ctx.cfg, ctx.body, _embed_indexed(status, le, ctx.world, ctx.ns)):
        jobs.append(ctx.kids.ensure(manifest))
        status.children[f"embedJob.{manifest['metadata']['labels'].get(naming.MODEL_KEY, 'all')}"] = \
            manifest["metadata"]["name"]
    st = jobs_state([j for j in jobs if j is not None]) if all(jobs) else ChildState("Pending", "Created")
    if st.state == FAILED:
        ctx.failed(stage.condition, st.reason, st.message)
        return False
    if st.state != SUCCEEDED:
        ctx.running(stage, st.message or st.reason)
        return False
    ctx.done(stage, f"{len(le.spec.models)} model(s) embedded")
    return True


def _analyze(ctx: _Ctx, stage: Stage, le: LeakageEval) -> bool:
    """The analyze Job; its termination message carries the results summary and the report's URI."""
    status = ctx.status
    out = builders.eval_dir(le, ctx.cfg)
    if _job_stage(ctx, stage, builders.build_analyze_job(le, ctx.cfg, ctx.body), "analyzeJob") is None:
        return False
    job_name = naming.analyze_job(ctx.name)
    doc = message_json(termination_message(ctx.world.job_pods(ctx.ns, job_name), job_name, stage.name)) or {}
    results, report = doc.get("results"), doc.get("reportUri") or EvalOutputs(out).report
    if not isinstance(results, dict) or not isinstance(report, str):
        ctx.failed(stage.condition, "ResultsUnavailable", f"Job {job_name} succeeded but its pod has no results "
                                                          f"termination message; see {EvalOutputs(out).results}")
        return False
    try:
        summary = premium_summary(results)
    except (TypeError, ValueError, AttributeError):
        ctx.plan.warnings.append(("MalformedResults", f"Job {job_name}: results summary has an unexpected shape; "
                                                      "no premium summary"))
        summary = ""
    status.results = results
    status.report_uri = report
    status.premium_summary = summary or None
    ctx.done(stage, f"report at {status.report_uri}")
    return True


EVAL_STEPS = {"embed": _embed, "analyze": _analyze}


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
