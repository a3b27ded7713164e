"""One reconciliation's context: the cluster view, the plan being built, the children looked up or queued, and
the status recorder every stage writes its conditions with (docs/design.md, "Operator"). The stage modules of
:mod:`pitlab.pipeline` act on it; :mod:`pitlab.operator.lifecycle` walks them."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from pydantic import ValidationError

from pitlab.api import SpecError, conditions, stages
from pitlab.api.recorder import Recorder
from pitlab.api.stages import Stage
from pitlab.api.status import ResourceStatus
from pitlab.errors import StageError
from pitlab.operator import validation
from pitlab.operator.config import OperatorConfig
from pitlab.operator.mirroring import FAILED, SUCCEEDED, ChildState, StuckPod, batch_job_state, failed_create, \
    last_lines, message_json, of_job, stuck_pod, termination_message
from pitlab.operator.naming import RESOURCE_OF_KIND


class World(Protocol):
    """Read-only view of one namespace (implemented over the API by :class:`pitlab.operator.kube.Kube`)."""

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None: ...
    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]: ...
    def job_events(self, namespace: str, job: str) -> list[dict[str, Any]]: ...
    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...
    def pod_log(self, namespace: str, pod: str, container: str) -> str | None: ...
    def serves(self, resource: str) -> bool: ...


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


def problems(err: ValidationError, root: str = "") -> str:
    """A pydantic error as ``field: problem; field: problem`` (fields as written in YAML)."""
    return validation.message(SpecError.from_validation_error(err, root=root).problems)


class Children:
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


class Ctx(Recorder):
    """One reconciliation of one resource: its body, the cluster view, the configuration, the plan being built
    (whose status it records into) and the generation and time that every condition written now carries."""

    def __init__(self, body: dict[str, Any], world: World, cfg: OperatorConfig, plan: Plan, gen: int | None,
                 now: str | None, kind: str):
        assert plan.status is not None
        super().__init__(plan.status, gen, now)
        self.body, self.world, self.cfg, self.plan, self.kind = body, world, cfg, plan, kind
        self.kids = Children(world, body, plan)

    @property
    def gen(self) -> int | None:
        """The resource's ``metadata.generation``."""
        return self.generation

    @property
    def name(self) -> str:
        """The resource's name."""
        return self.body["metadata"]["name"]

    @property
    def ns(self) -> str | None:
        """The resource's namespace."""
        return self.body["metadata"].get("namespace")

    def fail_current(self, reason: str, message: str) -> None:
        """The stage in progress (the first whose condition is not True) failed."""
        self.fail(conditions.current_stage(self.status, stages.conditions_of(self.kind)), reason, message)

    def stuck(self, what: str, pods: list[dict[str, Any]], job_name: str | None = None) -> str:
        """``"; <pod that cannot start>"`` for a running child's condition message (:func:`stuck_pod` of ``pods``,
        only those of Job ``job_name`` when given), "" when none is stuck. A stuck pod is also posted as a Warning
        event (reason: the kubelet's, message: ``<what>: <pod...>``; once per message and operator process). The
        stage keeps its reason and phase: the kubelet retries, and a pull back-off, say, resolves once the image
        exists."""
        return self._report_stuck(what, self._stuck_or_uncreated(pods, job_name))

    def stuck_in_jobs(self, jobs: list[tuple[str, str]]) -> str:
        """:meth:`stuck` of the first of ``jobs`` (``(what, Job name)`` pairs, in order) with a pod that cannot
        start, each Job's pods listed until one is found; "" when none has."""
        for what, job in jobs:
            found = self._stuck_or_uncreated(self.world.job_pods(self.ns, job), job)
            if found is not None:
                return self._report_stuck(what, found)
        return ""

    def _stuck_or_uncreated(self, pods: list[dict[str, Any]], job_name: str | None) -> StuckPod | None:
        """:func:`stuck_pod` of ``pods``; when Job ``job_name`` has no pod at all, its newest ``FailedCreate``
        event (:func:`~pitlab.operator.mirroring.failed_create`: the Job controller could not create one)."""
        found = stuck_pod(pods, job_name)
        if found is None and job_name is not None and not any(of_job(p, job_name) for p in pods):
            found = failed_create(self.world.job_events(self.ns, job_name), job_name)
        return found

    def _report_stuck(self, what: str, found: StuckPod | None) -> str:
        if found is None:
            return ""
        self.plan.warnings.append((found.reason, f"{what}: {found.text}"))
        return f"; {found.text}"

    def labelled_pods(self, selector: str) -> list[dict[str, Any]]:
        """The pods of this namespace matching the label selector ``selector`` (:meth:`World.list_pods`)."""
        return self.world.list_pods(self.ns, selector)

    def termination_doc(self, job_name: str, container: str) -> dict[str, Any]:
        """The JSON termination message of ``job_name``'s pod (container ``container``), {} when there is none."""
        return message_json(termination_message(self.world.job_pods(self.ns, job_name), job_name, container)) or {}


def job_message(world: World, ns: str | None, job: dict[str, Any] | None, stage: Stage, state: ChildState) -> str:
    """A failed child (``stage.child``, a Job) in words: its reason and message, and the log tail of the
    termination message of its container (named like ``stage``)."""
    name = job["metadata"]["name"] if job else "?"
    msg = termination_message(world.job_pods(ns, name), name, stage.name) if job else None
    detail = last_lines(msg) if msg and message_json(msg) is None else ""
    return f"{stage.child} {name}: {state.reason}: {state.message}" + (f"; {detail}" if detail else "")


def job_stage(ctx: Ctx, stage: Stage, manifest: dict[str, Any], child_key: str) -> dict[str, Any] | None:
    """One stage run by a single batch Job (prepare, merge, analyze): create or adopt the Job, record it in
    ``status.children[child_key]`` and mirror its state onto ``stage``. Returns the Job once it succeeded;
    None while it runs (condition False, reason ``stage.phase``) or after it failed (condition False with the
    Job's reason, its message and the log tail of its container, named like ``stage``). While it runs, a pod of
    it that cannot start (:func:`~pitlab.operator.mirroring.stuck_pod`) is named in the message."""
    job = ctx.kids.ensure(manifest)
    job_name = manifest["metadata"]["name"]
    ctx.status.children[child_key] = job_name
    st = batch_job_state(job) if job else ChildState("Pending", "Created")
    if st.state == FAILED:
        ctx.failed(stage, job_message(ctx.world, ctx.ns, job, stage, st), reason=st.reason)
        return None
    if st.state != SUCCEEDED:
        what = f"{stage.child} {job_name}"
        stuck = ctx.stuck(what, ctx.world.job_pods(ctx.ns, job_name), job_name) if job else ""
        ctx.running(stage, f"{what}: {st.reason}{stuck}")
        return None
    return job
