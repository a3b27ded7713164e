"""The operator against an API server that argues back: conflicts, admission refusals, watches that end,
restarts and deletion.

The real kopf operator runs in process against :class:`kube_faults.ArguingApiServer` (kmock plus
resourceVersions, 409 on a taken name or a stale write, one-shot injected faults, watch endings and garbage
collection), with the Cluster, resources and controller playing of test_operator_e2e.py. Each test drives a
PitTraining through its whole lifecycle (prepare → train → merge → evaluate → Succeeded) with one fault in
the way and asserts the exact outcome: the children (one of each, by uid), the create attempts, and the
parent's conditions.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import kmock
import pytest
import pytest_asyncio

from kube_faults import ArguingApiServer, Fault
from test_operator_e2e import (AUDIT_MESSAGE, CFG, CM, JOBS, LE, NS, PIT, PTJ, RESULTS_MESSAGE, TEST_AGENT,
                               TRAINING, Cluster, cond, conds, running_cluster)
from test_operator_restart import (EVAL_SUCCEEDED, KINDS, PLURALS, TRAINING_SUCCEEDED, _eval_names,
                                   _training_names, children, expected)

T = _training_names()
E = _eval_names(T["eval"])
NAME, LE_NAME = T["name"], E["name"]


@pytest_asyncio.fixture()
async def cluster():
    async with running_cluster(ArguingApiServer) as c:
        yield c


# ------------------------------------------------------------------------------ helpers
def creates(c: Cluster, name: str | None = None) -> list[tuple[str, str]]:
    """(kind, name) of the operator's create requests (events aside), accepted or refused, in order."""
    kind_of = {res: kind for kind, res in KINDS.items()}
    out = []
    for r in c.server:
        if (r.action is not None and r.action.name == "CREATE" and r.headers.get("User-Agent") != TEST_AGENT
                and r.resource is not None and r.resource.plural in PLURALS):
            n = ((r.data or {}).get("metadata") or {}).get("name")
            if name is None or n == name:
                out.append((kind_of[PLURALS[r.resource.plural]], n))
    return out


def events(c: Cluster) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the events the operator posted."""
    return [(r.data["type"], r.data["reason"], r.data["message"]) for r in c.server
            if r.resource == "v1/events" and r.action is not None and r.action.name == "CREATE"]


def names(c: Cluster) -> dict[str, list[str]]:
    """kind → sorted names of the owned children."""
    return {k: sorted(v) for k, v in children(c).items()}


async def until(check: Callable[[], Any], what: str, timeout: float = 15) -> Any:
    """Wait for ``check()`` to be truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return got


async def _sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    fn(*args, **kwargs)


def stages(c: Cluster) -> list[tuple[str, Callable[[], Any], tuple[str, ...]]]:
    """The lifecycle as (stage, what moves the run into it, the phases PitTraining [and LeakageEval] show)."""
    async def finish_embeds() -> None:
        for j in E["embed"]:
            c.finish_job(j)
    return [
        ("Preparing", lambda: c.apply(TRAINING), ("Preparing",)),
        ("Training", lambda: _sync(c.finish_job, T["prepare"], message=AUDIT_MESSAGE), ("Training",)),
        ("Merging", lambda: _sync(c.finish_pytorchjob, T["train"]), ("Merging",)),
        ("Embedding", lambda: _sync(c.finish_job, T["merge"]), ("Evaluating", "Embedding")),
        ("Analyzing", finish_embeds, ("Evaluating", "Analyzing")),
        ("Succeeded", lambda: _sync(c.finish_job, E["analyze"], message=RESULTS_MESSAGE), ("Succeeded", "Succeeded")),
    ]


async def show(c: Cluster, shown: tuple[str, ...]) -> dict:
    """Wait for the PitTraining (and its LeakageEval) to show ``shown``; returns the PitTraining."""
    if len(shown) > 1:
        await c.phase(LE, LE_NAME, shown[1])
    return await c.phase(PIT, NAME, shown[0])


async def run_to_success(c: Cluster, between: Callable[[str], Any] | None = None) -> dict:
    """Drive the whole lifecycle; ``between(stage)`` is awaited once each stage shows. Returns the final
    PitTraining after asserting the final conditions of both resources and one child of each name."""
    for stage, enter, shown in stages(c):
        await enter()
        await show(c, shown)
        if between is not None:
            await between(stage)
    pit, le = c.get(PIT, NAME), c.get(LE, LE_NAME)
    assert conds(pit) == TRAINING_SUCCEEDED and conds(le) == EVAL_SUCCEEDED
    assert names(c) == expected("Succeeded", T, E)
    return pit



# ------------------------------------------------------------------------------ 409 on a status patch
CONFLICT = ('Operation cannot be fulfilled on pittrainings.pitlab.io "fomc-2016": the object has been modified; '
            'please apply your changes to the latest version and try again')


def _to_phase(phase: str) -> Callable[[kmock.Request], bool]:
    return lambda r: isinstance(r.data, dict) and (r.data.get("status") or {}).get("phase") == phase


@pytest.mark.parametrize("phase", ["Preparing", "Training", "Evaluating"])
@pytest.mark.asyncio
async def test_status_patch_conflict_is_retried_and_converges(cluster: Cluster, phase: str) -> None:
    """The API server answers the status write that moves the PitTraining into ``phase`` with 409 Conflict
    (a stale write): the write is retried, the status converges, no condition is lost and no child is created
    twice."""
    c = cluster
    fault = c.server.inject(Fault("UPDATE", PIT, 409, "Conflict", CONFLICT, name=NAME, subresource="status",
                                  when=_to_phase(phase)))
    pit = await run_to_success(c)
    assert len(fault.hits) == 1
    writes = [r.data["status"]["phase"] for r in c.server if r.resource == PIT and r.subresource == "status"
              and r.headers.get("User-Agent") != TEST_AGENT]
    assert writes.count(phase) >= 2  # refused once, then written
    assert pit["status"]["corpusAudit"]["included"] == 159  # what the prepare Job reported is kept
    assert pit["status"]["children"] == {"configMap": T["configMap"], "prepareJob": T["prepare"],
                                         "pytorchJob": T["train"], "mergeJob": T["merge"],
                                         f"leakageEval.{LE_NAME}": LE_NAME}
    assert sorted(creates(c)) == sorted((k, n) for k, ns in expected("Succeeded", T, E).items() for n in ns)
