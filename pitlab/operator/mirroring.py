"""Reading the children's state: PyTorchJob and Job conditions, LeakageEval status, pod termination
messages, progress lines. Pure functions of the objects as the API server returns them (plain dicts).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pitlab.api.summary import parse_progress_log

RUNNING, SUCCEEDED, FAILED, PENDING = "Running", "Succeeded", "Failed", "Pending"


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


def pytorchjob_state(job: dict[str, Any]) -> ChildState:
    """State of a Kubeflow PyTorchJob from its conditions (Created, Running, Restarting, Succeeded, Failed,
    Suspended)."""
    conds = (job.get("status") or {}).get("conditions") or []
    for type_, state in (("Failed", FAILED), ("Succeeded", SUCCEEDED)):
        c = _true(conds, type_)
        if c:
            return ChildState(state, c.get("reason") or f"PyTorchJob{type_}", c.get("message", ""))
    for type_ in ("Restarting", "Running", "Suspended", "Created"):
        c = _true(conds, type_)
        if c:
            return ChildState(RUNNING if type_ in ("Running", "Restarting") else PENDING,
                              c.get("reason") or type_, c.get("message", ""))
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


def termination_message(pods: list[dict[str, Any]], job_name: str, container: str) -> str | None:
    """The termination message of ``container`` in the newest terminated pod of Job ``job_name``."""
    best: tuple[str, str] | None = None
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if job_name not in (labels.get("batch.kubernetes.io/job-name"), labels.get("job-name")):
            continue
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated")
            if cs.get("name") == container and term and term.get("message"):
                key = term.get("finishedAt") or ""
                if best is None or key >= best[0]:
                    best = (key, term["message"])
    return best[1] if best else None


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
