"""The two state machines, as pure-ish functions: a resource body and a read-only view of the cluster in,
the children to create and the new status out (a :class:`Plan`). The handlers execute plans.

PitTraining: Validating → Preparing (prepare Job) → Training (PyTorchJob) → Merging (merge Job) →
Evaluating (LeakageEval children) → Succeeded; or Failed with the failing child's reason and message.
LeakageEval: Validating → Embedding (one Job per model, or an indexed Job) → Analyzing (one Job) → Succeeded.

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

from pitlab.api import LeakageEval, PitTraining, SpecError
from pitlab.api.status import TERMINAL_PHASES, CorpusAuditStatus, Progress, ResourceStatus, get_condition
from pitlab.operator import builders, conditions, naming, validation
from pitlab.operator.config import EVAL_SPEC_FILE, TRAINING_SPEC_FILE, OperatorConfig
from pitlab.operator.mirroring import (FAILED, SUCCEEDED, ChildState, batch_job_state, jobs_state, last_lines,
                                       leakageeval_state, message_json, progress_from_log, pytorchjob_state,
                                       termination_message)
from pitlab.operator.summary import premium_summary

# Resource keys of the World (group/version/plural)
CONFIGMAPS = "v1/configmaps"
JOBS = "batch/v1/jobs"
PYTORCHJOBS = "kubeflow.org/v1/pytorchjobs"
PITTRAININGS = "pitlab.io/v1alpha1/pittrainings"
LEAKAGEEVALS = "pitlab.io/v1alpha1/leakageevals"
RESOURCE_OF_KIND = {"ConfigMap": CONFIGMAPS, "Job": JOBS, "PyTorchJob": PYTORCHJOBS, "LeakageEval": LEAKAGEEVALS}


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


class NameConflict(Exception):
    """A child's name is taken by an object this resource does not own."""


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


def _generation(body: dict[str, Any]) -> int | None:
    return (body.get("metadata") or {}).get("generation")


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


def _job_stage(kids: _Children, status: ResourceStatus, manifest: dict[str, Any], child_key: str, stage: str,
               phase: str, container: str, gen: int | None, now: str | None) -> dict[str, Any] | None:
    """One stage run by a single batch Job (prepare, merge, analyze): create or adopt the Job, record it in
    ``status.children[child_key]`` and mirror its state onto ``stage``. Returns the Job once it succeeded;
    None while it runs (``stage`` False, reason ``phase``) or after it failed (``stage`` False with the Job's
    reason, its message and log tail)."""
    job = kids.ensure(manifest)
    job_name = manifest["metadata"]["name"]
    status.children[child_key] = job_name
    st = batch_job_state(job) if job else ChildState("Pending", "Created")
    if st.state == FAILED:
        conditions.stage_failed(status, stage, st.reason, _job_message(kids.world, kids.ns, job, container, st),
                                gen, now)
        return None
    if st.state != SUCCEEDED:
        conditions.stage_running(status, stage, phase, phase, f"Job {job_name}: {st.reason}", gen, now)
        return None
    return job


def _begin(body: dict[str, Any], kind: str, check: Any, cfg: OperatorConfig, now: str | None):
    """The common start of a reconciliation: a Plan when there is nothing to run (finished at its current
    generation: ``Plan(None)``; a finished run whose spec was edited: :func:`_finished_edit`), else
    (generation, status, plan, parsed spec or None, validation problems)."""
    gen = _generation(body)
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
    return gen, status, Plan(status), current, problems


def _finished_edit(body: dict[str, Any], kind: str, status: ResourceStatus, gen: int | None,
                   now: str | None) -> Plan:
    """A spec edit of a run that finished (Succeeded or Failed after its first child existed): nothing is
    created again (children a user deleted stay deleted). The edit is refused (Stalled=True, SpecImmutable);
    an edit back to the run's spec restores the conditions the run finished with."""
    name = body["metadata"]["name"]
    cm = naming.training_spec_configmap(name) if kind == "PitTraining" else naming.eval_spec_configmap(name)
    if status.spec_digest != builders.spec_digest(body.get("spec") or {}):
        conditions.refuse_spec_change(
            status, f"spec changed after the run finished ({status.phase}, generation {gen}); nothing is run "
                    f"again. The run's spec is in ConfigMap {cm}: revert the edit, or create a new {kind}",
            gen, now)
    else:
        conditions.restore_finished(status, gen, now)
    return Plan(status)


# ---------------------------------------------------------------- PitTraining
def reconcile_training(body: dict[str, Any], world: World, cfg: OperatorConfig, now: str | None = None) -> Plan:
    """One reconciliation of a PitTraining body: the children to create and its next status."""
    begun = _begin(body, "PitTraining", validation.check_training, cfg, now)
    if isinstance(begun, Plan):
        return begun
    gen, status, plan, current, problems = begun
    if status.spec_digest is None:  # nothing started yet: the spec must be valid to start
        if problems:
            conditions.stage_failed(status, "Validated", "InvalidSpec", validation.message(problems), gen, now)
            return plan
        conditions.stage_done(status, "Validated", "SpecValid", "spec is valid", gen, now)
    try:
        _advance_training(body, current, world, cfg, plan, gen, now)
    except NameConflict as err:
        conditions.stage_failed(status, conditions.current_stage(status, conditions.TRAINING_STAGES), "NameConflict", str(err), gen, now)
    digest = builders.spec_digest(body.get("spec") or {})
    if status.spec_digest is not None and status.spec_digest != digest:
        conditions.refuse_spec_change(
            status, f"spec changed after the run started (generation {gen}); the run continues with the spec "
                    f"stored in ConfigMap {naming.training_spec_configmap(body['metadata']['name'])}. Revert the "
                    "edit, or create a new PitTraining", gen, now)
    return plan


def _advance_training(body: dict[str, Any], current: PitTraining | None, world: World, cfg: OperatorConfig,
                      plan: Plan, gen: int | None, now: str | None) -> None:
    status = plan.status
    assert status is not None
    name, ns = body["metadata"]["name"], body["metadata"].get("namespace")
    kids = _Children(world, body, plan)
    cm = kids.ensure(builders.build_training_configmap(current, body)) if current and status.spec_digest is None \
        else world.get(CONFIGMAPS, ns, naming.training_spec_configmap(name))
    stored = _stored_spec(cm, TRAINING_SPEC_FILE)
    if status.spec_digest is None:
        pt = current
        status.spec_digest = builders.spec_digest(body.get("spec") or {})
    elif stored is not None:
        try:
            pt = PitTraining.model_validate(stored)
        except ValidationError as err:
            conditions.stage_failed(status, conditions.current_stage(status, conditions.TRAINING_STAGES), "StoredSpecInvalid",
                                    f"ConfigMap {naming.training_spec_configmap(name)}: the run's spec no longer "
                                    f"parses: {_problems(err)}; delete and recreate the PitTraining", gen, now)
            return
    else:
        conditions.stage_failed(status, conditions.current_stage(status, conditions.TRAINING_STAGES), "SpecConfigMapMissing",
                                f"ConfigMap {naming.training_spec_configmap(name)} with the run's spec is gone; "
                                "delete and recreate the PitTraining", gen, now)
        return
    run = builders.training_run_dir(pt, cfg)
    status.children.setdefault("configMap", naming.training_spec_configmap(name))

    # Preparing
    if not conditions.is_true(status, "Prepared"):
        job = _job_stage(kids, status, builders.build_prepare_job(pt, cfg, body), "prepareJob",
                         "Prepared", "Preparing", "prepare", gen, now)
        if job is None:
            return
        doc = message_json(termination_message(world.job_pods(ns, job["metadata"]["name"]), job["metadata"]["name"],
                                               "prepare")) or {}
        audit = _corpus_audit(doc.get("corpusAudit"), job["metadata"]["name"], plan)
        if audit is not None:
            status.corpus_audit = audit
            plan.warnings.extend(("CorpusWarning", w) for w in audit.warnings or [])
        msg = (f"{audit.included} documents up to {pt.spec.knowledge_cutoff}, {audit.excluded_by_date} after it"
               if audit is not None else "corpus filtered")
        conditions.stage_done(status, "Prepared", "CorpusFiltered", msg, gen, now)

    # Training
    if not conditions.is_true(status, "Trained"):
        job = kids.ensure(builders.build_pytorchjob(pt, cfg, body))
        job_name = naming.pytorchjob(name)
        status.children["pytorchJob"] = job_name
        st = pytorchjob_state(job) if job else ChildState("Pending", "Created")
        status.checkpoint_uri = builders.training_checkpoint_uri(pt, cfg)
        if st.state == FAILED:
            conditions.stage_failed(status, "Trained", st.reason, f"PyTorchJob {job_name}: {st.message}", gen, now)
            return
        if st.state != SUCCEEDED:
            log = world.pod_log(ns, naming.master_pod(name), "progress") if job else None
            prog = _progress(log, naming.master_pod(name), plan) if job else None
            if prog is not None:
                status.progress = prog
            step = f" (step {prog.step}/{prog.total_steps or '?'})" if prog is not None else ""
            warning = kernel_warning(log)
            conditions.stage_running(status, "Trained", "Training", "Training",
                                     f"PyTorchJob {job_name}: {st.reason}{step}"
                                     + (f"; WARNING: {warning}" if warning else ""), gen, now)
            return
        if status.progress is not None and status.progress.total_steps:
            status.progress.step = status.progress.total_steps
        conditions.stage_done(status, "Trained", st.reason or "Succeeded", f"PyTorchJob {job_name}: {st.message}",
                              gen, now)

    # Merging
    if not conditions.is_true(status, "Merged"):
        if _job_stage(kids, status, builders.build_merge_job(pt, cfg, body), "mergeJob", "Merged",
                      "Merging", "merge", gen, now) is None:
            return
        status.model_uri = f"{run}/model"
        conditions.stage_done(status, "Merged", "MergeSucceeded", f"model written to {status.model_uri}", gen, now)

    # Evaluating
    if not pt.spec.evaluations:
        conditions.stage_done(status, "Evaluated", "NoEvaluations", "spec.evaluations is empty", gen, now)
        conditions.succeeded(status, "Succeeded", f"model at {status.model_uri}", gen, now)
        return
    results: dict[str, Any] = {}
    pending = []
    for tpl in pt.spec.evaluations:
        child_name = naming.evaluation(name, tpl.name)
        child = kids.ensure(builders.build_evaluation(pt, tpl, body))
        status.children[f"leakageEval.{tpl.name}"] = child_name
        st = leakageeval_state(child) if child else ChildState("Pending", "Created")
        if st.state == FAILED:
            conditions.stage_failed(status, "Evaluated", st.reason, f"LeakageEval {child_name}: {st.message}", gen,
                                    now)
            return
        if st.state == SUCCEEDED:
            results[tpl.name] = ((child or {}).get("status") or {}).get("results") or {}
        else:
            pending.append(f"{child_name} ({st.reason})")
    if pending:
        conditions.stage_running(status, "Evaluated", "Evaluating", "Evaluating",
                                 "waiting for LeakageEval " + ", ".join(pending), gen, now)
        return
    status.results = results
    conditions.stage_done(status, "Evaluated", "EvaluationsSucceeded",
                          f"{len(results)} evaluation(s) succeeded", gen, now)
    conditions.succeeded(status, "Succeeded", f"model at {status.model_uri}", gen, now)


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
                        else f"{builders.training_run_dir(pt, cfg)}/{ref.artifact}")
    return uris, None, None


def reconcile_eval(body: dict[str, Any], world: World, cfg: OperatorConfig, now: str | None = None) -> Plan:
    """One reconciliation of a LeakageEval body: the children to create and its next status."""
    begun = _begin(body, "LeakageEval", validation.check_eval, cfg, now)
    if isinstance(begun, Plan):
        return begun
    gen, status, plan, current, problems = begun
    name, ns = body["metadata"]["name"], body["metadata"].get("namespace")
    kids = _Children(world, body, plan)
    try:
        if status.spec_digest is None:
            if problems:
                conditions.stage_failed(status, "Validated", "InvalidSpec", validation.message(problems), gen, now)
                return plan
            uris, wait, fail = _model_uris(current, world, cfg)
            if fail:
                conditions.stage_failed(status, "Validated", fail[0], fail[1], gen, now)
                return plan
            if wait:
                conditions.stage_running(status, "Validated", "Validating", "WaitingForModel", wait, gen, now)
                return plan
            conditions.stage_done(status, "Validated", "SpecValid", "spec is valid", gen, now)
            kids.ensure(builders.build_eval_configmap(current, uris, body))
            status.spec_digest = builders.spec_digest(body.get("spec") or {})
            le = current
        else:
            stored = _stored_spec(world.get(CONFIGMAPS, ns, naming.eval_spec_configmap(name)), EVAL_SPEC_FILE)
            if stored is None:
                conditions.stage_failed(status, "Embedded", "SpecConfigMapMissing",
                                        f"ConfigMap {naming.eval_spec_configmap(name)} with the run's spec is gone",
                                        gen, now)
                return plan
            try:
                le = LeakageEval.model_validate(stored)
            except ValidationError as err:
                conditions.stage_failed(status, "Embedded", "StoredSpecInvalid",
                                        f"ConfigMap {naming.eval_spec_configmap(name)}: the run's spec no longer "
                                        f"parses: {_problems(err)}; delete and recreate the LeakageEval", gen, now)
                return plan
        status.children.setdefault("configMap", naming.eval_spec_configmap(name))
        _advance_eval(body, le, world, cfg, kids, plan, gen, now)
    except NameConflict as err:
        conditions.stage_failed(status, "Embedded", "NameConflict", str(err), gen, now)
    if status.spec_digest is not None and status.spec_digest != builders.spec_digest(body.get("spec") or {}):
        conditions.refuse_spec_change(
            status, f"spec changed after the evaluation started (generation {gen}); it continues with the spec "
                    f"stored in ConfigMap {naming.eval_spec_configmap(name)}. Revert the edit, or create a new "
                    "LeakageEval", gen, now)
    return plan


def _advance_eval(body: dict[str, Any], le: LeakageEval, world: World, cfg: OperatorConfig, kids: _Children,
                  plan: Plan, gen: int | None, now: str | None) -> None:
    status = plan.status
    assert status is not None
    name, ns = body["metadata"]["name"], body["metadata"].get("namespace")
    out = builders.eval_dir(le, cfg)
    if not conditions.is_true(status, "Embedded"):
        jobs = []
        for manifest in builders.build_embed_jobs(le, cfg, body, _embed_indexed(status, le, world, ns)):
            jobs.append(kids.ensure(manifest))
            status.children[f"embedJob.{manifest['metadata']['labels'].get(naming.MODEL_KEY, 'all')}"] = \
                manifest["metadata"]["name"]
        st = jobs_state([j for j in jobs if j is not None]) if all(jobs) else ChildState("Pending", "Created")
        if st.state == FAILED:
            conditions.stage_failed(status, "Embedded", st.reason, st.message, gen, now)
            return
        if st.state != SUCCEEDED:
            conditions.stage_running(status, "Embedded", "Embedding", "Embedding", st.message or st.reason, gen, now)
            return
        conditions.stage_done(status, "Embedded", "EmbeddingsWritten", f"{len(le.spec.models)} model(s) embedded",
                              gen, now)
    if _job_stage(kids, status, builders.build_analyze_job(le, cfg, body), "analyzeJob", "Analyzed",
                  "Analyzing", "analyze", gen, now) is None:
        return
    doc = message_json(termination_message(world.job_pods(ns, naming.analyze_job(name)), naming.analyze_job(name),
                                           "analyze")) or {}
    results, report = doc.get("results"), doc.get("reportUri") or f"{out}/report.md"
    if not isinstance(results, dict) or not isinstance(report, str):
        conditions.stage_failed(status, "Analyzed", "ResultsUnavailable",
                                f"Job {naming.analyze_job(name)} succeeded but its pod has no results termination "
                                f"message; see {out}/results.json", gen, now)
        return
    try:
        summary = premium_summary(results)
    except (TypeError, ValueError, AttributeError):
        plan.warnings.append(("MalformedResults", f"Job {naming.analyze_job(name)}: results summary has an "
                                                  "unexpected shape; no premium summary"))
        summary = ""
    status.results = results
    status.report_uri = report
    status.premium_summary = summary or None
    conditions.stage_done(status, "Analyzed", "ResultsWritten", f"report at {status.report_uri}", gen, now)
    conditions.succeeded(status, "Succeeded", status.premium_summary or "evaluation complete", gen, now)


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
