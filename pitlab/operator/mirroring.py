"""Reading the children's state: TrainJob, JobSet, PyTorchJob and Job conditions, LeakageEval status, pod
termination messages, pods that cannot start (:func:`stuck_pod`), progress lines. Pure functions of the objects as
the API server returns them (plain dicts).

A training child held by Kueue is not running and has not failed: while it is suspended it is ``Queued`` (waiting
for admission by its LocalQueue) or, once Kueue evicted it, ``Preempted`` (it resumes from its last checkpoint when
readmitted). Both are :data:`PENDING` states with that reason.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from pitlab.api.summary import parse_progress_log

RUNNING, SUCCEEDED, FAILED, PENDING = "Running", "Succeeded", "Failed", "Pending"
QUEUED, PREEMPTED = "Queued", "Preempted"  # the reasons of a training child Kueue holds
KUEUE_QUEUE_KEY = "kueue.x-k8s.io/queue-name"
_EVICTION = ("Preempted", "Evicted")  # a condition type or reason starting with one of these: Kueue evicted the child


@dataclasses.dataclass(frozen=True)
class ChildState:
    """Where a child stands: ``state`` is Pending, Running, Succeeded or Failed; ``reason``/``message`` come
    from the child's own condition (so a parent's failure names the child's reason)."""

    state: str
    reason: str = ""
    message: str = ""

    @property
    def done(self) -> bool:
        return self.state in (SUCCEEDED, FAILED)


def _true(conds: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conds if c.get("type") == type_ and c.get("status") == "True"), None)


def _conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return (obj.get("status") or {}).get("conditions") or []


def _finished(obj: dict[str, Any], kind: str, failed: str, succeeded: str) -> ChildState | None:
    """Failed (condition ``failed`` True) or Succeeded (``succeeded`` True) with the child's reason and message."""
    conds = _conditions(obj)
    for type_, state in ((failed, FAILED), (succeeded, SUCCEEDED)):
        c = _true(conds, type_)
        if c:
            return ChildState(state, c.get("reason") or f"{kind}{type_}", c.get("message", ""))
    return None


def _is_eviction(cond: dict[str, Any]) -> bool:
    return cond.get("status") == "True" and any(str(cond.get(k) or "").startswith(_EVICTION)
                                                for k in ("type", "reason"))


def held_by_kueue(obj: dict[str, Any], suspended: bool, ran: bool = False) -> ChildState | None:
    """Kueue's hold on a suspended training child (None when it is not suspended). ``Preempted`` when Kueue evicted
    it: the child says so (a True condition whose type or reason starts with Preempted or Evicted), or it is queued
    (a ``kueue.x-k8s.io/queue-name`` label) and suspended again after it ran (``ran``: the operator saw it report
    progress; Kueue suspends an evicted TrainJob or JobSet without a condition saying why). Else ``Queued`` when it
    is queued, else ``Suspended``. The message names the queue and the child's own reason."""
    if not suspended:
        return None
    conds = _conditions(obj)
    queue = ((obj.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_KEY)
    where = f"Kueue LocalQueue {queue}" if queue else "Kueue"
    held = next((c for c in conds if _is_eviction(c)), None) or _true(conds, "Suspended") or \
        {"reason": "Suspended", "message": "spec.suspend is true"}
    why = f"{held.get('reason') or 'Suspended'}: {held.get('message', '')}".rstrip(": ")
    if _is_eviction(held) or (ran and queue):
        return ChildState(PENDING, PREEMPTED, f"evicted by {where} ({why}); it resumes from its last checkpoint "
                                              "when readmitted")
    if queue:
        return ChildState(PENDING, QUEUED, f"waiting for admission by {where} ({why})")
    return ChildState(PENDING, "Suspended", why)


def pytorchjob_state(job: dict[str, Any], ran: bool = False) -> ChildState:
    """State of a Kubeflow PyTorchJob from its conditions (Created, Running, Restarting, Succeeded, Failed,
    Suspended: Queued or Preempted, :func:`held_by_kueue`; ``ran``: it ran before)."""
    done = _finished(job, "PyTorchJob", "Failed", "Succeeded")
    if done is not None:
        return done
    conds = _conditions(job)
    suspended = bool(_true(conds, "Suspended")) or bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))
    held = held_by_kueue(job, suspended, ran)
    if held is not None:
        return held
    for type_ in ("Restarting", "Running", "Created"):
        c = _true(conds, type_)
        if c:
            return ChildState(RUNNING if type_ in ("Running", "Restarting") else PENDING,
                              c.get("reason") or type_, c.get("message", ""))
    return ChildState(PENDING, "Created", "")


def _counts(jobs: list[dict[str, Any]]) -> dict[str, int]:
    return {k: sum(int(j.get(k) or 0) for j in jobs) for k in ("active", "ready", "succeeded", "failed")}


def trainjob_state(job: dict[str, Any], ran: bool = False) -> ChildState:
    """State of a Kubeflow Trainer v2 TrainJob from its conditions (Complete, Failed, Suspended: Queued or
    Preempted, :func:`held_by_kueue`; ``ran``: it ran before) and, while it runs, its ``jobsStatus`` (the child
    Jobs' counts)."""
    done = _finished(job, "TrainJob", "Failed", "Complete")
    if done is not None:
        return done
    suspended = bool(_true(_conditions(job), "Suspended")) or bool((job.get("spec") or {}).get("suspend"))
    held = held_by_kueue(job, suspended, ran)
    if held is not None:
        return held
    n = _counts((job.get("status") or {}).get("jobsStatus") or [])
    if n["active"]:
        return ChildState(RUNNING, "Running", f"{n['active']} Job(s) active, {n['ready']} ready")
    return ChildState(PENDING, "Created", "")


def jobset_state(jobset: dict[str, Any], ran: bool = False) -> ChildState:
    """State of a JobSet from its conditions (Completed, Failed, Suspended: Queued or Preempted,
    :func:`held_by_kueue`; ``ran``: it ran before), its ``replicatedJobsStatus`` and ``restarts`` (of
    ``failurePolicy.maxRestarts``)."""
    done = _finished(jobset, "JobSet", "Failed", "Completed")
    if done is not None:
        return done
    suspended = bool(_true(_conditions(jobset), "Suspended")) or bool((jobset.get("spec") or {}).get("suspend"))
    held = held_by_kueue(jobset, suspended, ran)
    if held is not None:
        return held
    status = jobset.get("status") or {}
    n = _counts(status.get("replicatedJobsStatus") or [])
    restarts = int(status.get("restarts") or 0)
    budget = ((jobset.get("spec") or {}).get("failurePolicy") or {}).get("maxRestarts", 0)
    again = f"; restart {restarts} of {budget}" if restarts else ""
    if n["active"]:
        return ChildState(RUNNING, "Restarted" if restarts else "Running",
                          f"{n['active']} Job(s) active, {n['ready']} ready{again}")
    if restarts:
        return ChildState(PENDING, "Restarting", f"restart {restarts} of {budget}")
    return ChildState(PENDING, "Created", "")


def batch_job_state(job: dict[str, Any]) -> ChildState:
    """State of a ``batch/v1`` Job: its Complete/Failed conditions, else its pod counts."""
    st = job.get("status") or {}
    conds = st.get("conditions") or []
    c = _true(conds, "Failed")
    if c:
        return ChildState(FAILED, c.get("reason") or "JobFailed", c.get("message", ""))
    c = _true(conds, "Complete")
    completions = (job.get("spec") or {}).get("completions") or 1
    if c or (st.get("succeeded") or 0) >= completions and not st.get("active"):
        return ChildState(SUCCEEDED, (c or {}).get("reason") or "Completed", (c or {}).get("message", ""))
    if st.get("active"):
        return ChildState(RUNNING, "Running", f"{st.get('active')} pod(s) running")
    return ChildState(PENDING, "Pending", "")


def jobs_state(jobs: list[dict[str, Any]]) -> ChildState:
    """Combined state of several Jobs: Failed if any failed, Succeeded if all succeeded, else Running."""
    states = [(j["metadata"]["name"], batch_job_state(j)) for j in jobs]
    for name, s in states:
        if s.state == FAILED:
            return ChildState(FAILED, s.reason, f"Job {name}: {s.message}".rstrip(": "))
    done = sum(s.state == SUCCEEDED for _, s in states)
    if states and done == len(states):
        return ChildState(SUCCEEDED, "Completed", f"{done}/{len(states)} Jobs complete")
    return ChildState(RUNNING, "Running", f"{done}/{len(states)} Jobs complete")


def leakageeval_state(le: dict[str, Any]) -> ChildState:
    """State of a LeakageEval from its phase, with the reason/message of its Stalled (or Ready) condition."""
    st = le.get("status") or {}
    phase = st.get("phase") or "Pending"
    conds = st.get("conditions") or []
    if phase == "Failed":
        c = _true(conds, "Stalled") or {}
        return ChildState(FAILED, c.get("reason", "Failed"), c.get("message", ""))
    if phase == "Succeeded":
        return ChildState(SUCCEEDED, "Succeeded", "")
    return ChildState(RUNNING if phase != "Pending" else PENDING, phase, "")


def of_job(pod: dict[str, Any], job_name: str) -> bool:
    """True when Job ``job_name`` created ``pod`` (its ``batch.kubernetes.io/job-name`` label, or the older
    ``job-name``)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return job_name in (labels.get("batch.kubernetes.io/job-name"), labels.get("job-name"))


def index_pod(pods: list[dict[str, Any]], job_name: str, index: int) -> str | None:
    """The name of the newest pod of Indexed Job ``job_name`` with completion index ``index`` (its
    ``batch.kubernetes.io/job-completion-index`` label), None when there is none (yet)."""
    best: tuple[str, str] | None = None
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if not of_job(pod, job_name):
            continue
        if labels.get("batch.kubernetes.io/job-completion-index") != str(index) or meta.get("deletionTimestamp"):
            continue
        key = meta.get("creationTimestamp") or ""
        if best is None or key >= best[0]:
            best = (key, meta.get("name", ""))
    return best[1] if best else None


def termination_message(pods: list[dict[str, Any]], job_name: str, container: str) -> str | None:
    """The termination message of ``container`` in the newest terminated pod of Job ``job_name``."""
    best: tuple[str, str] | None = None
    for pod in pods:
        if not of_job(pod, job_name):
            continue
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated")
            if cs.get("name") == container and term and term.get("message"):
                key = term.get("finishedAt") or ""
                if best is None or key >= best[0]:
                    best = (key, term["message"])
    return best[1] if best else None


START_FAILURES = frozenset({
    "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",  # the image cannot be pulled
    "CreateContainerConfigError",  # e.g. a Secret or ConfigMap (or one of its keys) the container needs is missing
    "CreateContainerError", "RunContainerError",  # the runtime cannot create or start the container
    "CrashLoopBackOff",  # it starts and keeps exiting: the kubelet waits longer before each restart
})
"""The reasons of a waiting container whose pod is stuck (unlike ContainerCreating or PodInitializing, the normal
start-up): the kubelet retries, which may resolve it (a pull back-off once the image or its pull secret exists), but
nothing changes until someone acts."""
STUCK_MESSAGE_LIMIT = 300  # characters of the kubelet's message kept in a condition
FAILED_CREATE = "FailedCreate"  # the Job controller could not create a pod (a missing ServiceAccount, a quota)
UNSCHEDULABLE = "Unschedulable"  # PodScheduled False: no node can take the pod (GPUs, memory, taints, selectors)
_BACK_OFF_DELAY = re.compile(r"\b([Bb]ack-off) (?:\d+(?:\.\d+)?(?:ms|h|m|s))+\b")  # a Go duration: 40s, 2m40s


@dataclasses.dataclass(frozen=True)
class StuckPod:
    """A pod that cannot start: its ``pod`` name, the ``container`` waiting (``init``: an init container, e.g.
    the progress sidecar), the kubelet's ``reason`` (one of :data:`START_FAILURES`) and ``message``; ``last``: how
    the container last terminated (a CrashLoopBackOff), e.g. ``Error, exit code 1``."""

    pod: str
    container: str
    reason: str
    message: str = ""
    init: bool = False
    last: str = ""

    @property
    def text(self) -> str:
        """In words, for a condition's message: ``pod P: container C waiting: REASON: message`` (``pod P: not
        scheduled: Unschedulable: message`` for a pod no node can take), the message cut to
        :data:`STUCK_MESSAGE_LIMIT` characters and the kubelet's growing back-off delay left out (``back-off 40s``
        reads ``back-off``), so that the message, and the Warning event posted once per message, stays the same
        from one retry to the next."""
        msg = _BACK_OFF_DELAY.sub(r"\1", " ".join(self.message.split()))
        if len(msg) > STUCK_MESSAGE_LIMIT:
            msg = msg[:STUCK_MESSAGE_LIMIT - 3] + "..."
        if self.reason == FAILED_CREATE:  # ``pod`` names the Job here: it has no pod
            return f"Job {self.pod}: its pod cannot be created: {FAILED_CREATE}" + (f": {msg}" if msg else "")
        if self.reason == UNSCHEDULABLE:
            return f"pod {self.pod}: not scheduled: {UNSCHEDULABLE}" + (f": {msg}" if msg else "")
        return (f"pod {self.pod}: {'init container' if self.init else 'container'} {self.container} waiting: "
                f"{self.reason}" + (f": {msg}" if msg else "") + (f" (last terminated: {self.last})" if self.last
                                                                  else ""))


def _last_termination(cs: dict[str, Any]) -> str:
    term = (cs.get("lastState") or {}).get("terminated") or {}
    if not term:
        return ""
    code = term.get("exitCode")
    return ", ".join(x for x in (term.get("reason") or "", f"exit code {code}" if code is not None else "") if x)


def stuck_pod(pods: list[dict[str, Any]], job_name: str | None = None) -> StuckPod | None:
    """The first pod (by name) of ``pods`` (only those of Job ``job_name`` when given) with a container waiting
    for one of the :data:`START_FAILURES` reasons (its init containers looked at first: they block the others) or
    that no node can take (condition PodScheduled False, reason Unschedulable: the scheduler's message says why);
    None when every pod is starting normally, running or finished. Pods being deleted or finished are skipped."""
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name") or ""):
        meta = pod.get("metadata") or {}
        if job_name is not None and not of_job(pod, job_name):
            continue
        status = pod.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        for key, init in (("initContainerStatuses", True), ("containerStatuses", False)):
            for cs in status.get(key) or []:
                waiting = (cs.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") in START_FAILURES:
                    return StuckPod(meta.get("name", "?"), cs.get("name", "?"), waiting["reason"],
                                    waiting.get("message") or "", init, _last_termination(cs))
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and \
                    cond.get("reason") == UNSCHEDULABLE:
                return StuckPod(meta.get("name", "?"), "", UNSCHEDULABLE, cond.get("message") or "")
    return None


_POD_NAME = re.compile(r'(pods?) "[^"]*"')  # the Job controller names the pod it tried, a new one each retry


def failed_create(events: list[dict[str, Any]], job_name: str) -> StuckPod | None:
    """The newest ``FailedCreate`` event the Job controller posted on Job ``job_name`` (it could not create a pod:
    ``error looking up service account``, ``exceeded quota``, an admission webhook's refusal), as a
    :class:`StuckPod` whose ``pod`` is the Job's name (the tried pod's own name left out of the message, so that it
    stays the same from one retry to the next); None when there is none. Look only while the Job has no pod: the
    events outlive the problem."""
    found = [e for e in events if e.get("reason") == FAILED_CREATE
             and (e.get("involvedObject") or {}).get("name") == job_name]
    if not found:
        return None
    newest = max(found, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime")
                                          or (e.get("metadata") or {}).get("creationTimestamp") or ""))
    return StuckPod(job_name, "", FAILED_CREATE, _POD_NAME.sub(r"\1", newest.get("message") or ""))


def message_json(message: str | None) -> dict[str, Any] | None:
    """A termination message parsed as a JSON object, or None if it is missing or not JSON (e.g. logs)."""
    if not message:
        return None
    try:
        doc = json.loads(message)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def last_lines(text: str | None, n: int = 3, limit: int = 600) -> str:
    """The last ``n`` non-empty lines of a log-like message, at most ``limit`` characters (for conditions)."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    out = " | ".join(lines[-n:])
    return out if len(out) <= limit else "..." + out[-(limit - 3):]


def progress_from_log(text: str | None) -> dict[str, Any] | None:
    """``status.progress`` from the progress sidecar's log, or None."""
    return parse_progress_log(text or "")
