"""The operator against an API server that argues back: conflicts, admission refusals, watches that end,
restarts and deletion.

The real kopf operator runs in process against :class:`kube_faults.ArguingApiServer` (kmock plus
resourceVersions, 409 on a taken name or a stale write, one-shot injected faults, watch endings and garbage
collection), with the Cluster, resources and controller playing of test_operator_e2e.py. Each test drives a
PitTraining through its whole lifecycle (prepare → train → merge → evaluate → Succeeded) with one fault in
the way and asserts the exact outcome: the children (one of each, by uid), the create attempts, and the
parent's conditions.

Each test runs on each training backend (``backend``: trainjob, jobset, pytorchjob), on a cluster that serves the
kinds where ``auto`` picks it (test_operator_e2e.SERVED), its training child played as its controller reports it
(Cluster.play_training; the PyTorchJob's through Cluster.finish_pytorchjob).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import kmock
import pytest
import pytest_asyncio

from kube_faults import ArguingApiServer, Fault
from pitlab.operator.handlers import API_RETRY_DELAY_S
from test_operator_e2e import (AUDIT_MESSAGE, CFG, CHILD, CM, JOBS, LE, NS, PIT, RESULTS_MESSAGE, SERVED,
                               TEST_AGENT, TRAIN_FAILED, TRAINING, WARNED, Cluster, _kstatus, _training_conds, cond,
                               conds, running_cluster)
from test_operator_restart import (BACKENDS, EVAL_SUCCEEDED, KINDS, PLURALS, _eval_names, _training_names, children,
                                   expected, stable, training_succeeded)

T = _training_names()
E = _eval_names(T["eval"])
NAME, LE_NAME = T["name"], E["name"]


each_backend = pytest.mark.parametrize("backend", BACKENDS)  # every test: the cluster fixture needs ``backend``


@pytest_asyncio.fixture()
async def cluster(backend: str):
    async with running_cluster(ArguingApiServer, served=SERVED[backend]) as c:
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


def warnings(backend: str) -> list[tuple[str, str]]:
    """(type, reason) of the warning events of an ordinary run: the PyTorchJob backend's about Kueue, else none."""
    return [("Warning", WARNED[2])] if backend == "pytorchjob" else []


def warned(backend: str) -> list[tuple[str, str, str]]:
    """The Warning condition of an ordinary run: the PyTorchJob backend's about Kueue, else none."""
    return [WARNED] if backend == "pytorchjob" else []


def finish_training(c: Cluster, backend: str, ok: bool = True) -> None:
    """Play the training child's controller: the child succeeded (or failed)."""
    if backend == "pytorchjob":
        c.finish_pytorchjob(T["train"], ok=ok)
    else:
        c.play_training(backend, T["train"], "succeeded" if ok else "failed")


def names(c: Cluster) -> dict[str, list[str]]:
    """kind → sorted names of the owned children of the PitTraining NAME (and of its LeakageEval)."""
    return {k: sorted(n for n in v if n.startswith(f"{NAME}-")) for k, v in children(c).items()}


async def until(check: Callable[[], Any], what: str, timeout: float = 15) -> Any:
    """Wait for ``check()`` to be truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return got


async def _sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    fn(*args, **kwargs)


def stages(c: Cluster, backend: str) -> list[tuple[str, Callable[[], Any], tuple[str, ...]]]:
    """The lifecycle as (stage, what moves the run into it, the phases PitTraining [and LeakageEval] show)."""
    async def finish_embeds() -> None:
        for j in E["embed"]:
            c.finish_job(j)
    return [
        ("Preparing", lambda: c.apply(TRAINING), ("Preparing",)),
        ("Training", lambda: _sync(c.finish_job, T["prepare"], message=AUDIT_MESSAGE), ("Training",)),
        ("Merging", lambda: _sync(finish_training, c, backend), ("Merging",)),
        ("Embedding", lambda: _sync(c.finish_job, T["merge"]), ("Evaluating", "Embedding")),
        ("Analyzing", finish_embeds, ("Evaluating", "Analyzing")),
        ("Succeeded", lambda: _sync(c.finish_job, E["analyze"], message=RESULTS_MESSAGE), ("Succeeded", "Succeeded")),
    ]


async def show(c: Cluster, shown: tuple[str, ...]) -> dict:
    """Wait for the PitTraining (and its LeakageEval) to show ``shown``; returns the PitTraining."""
    if len(shown) > 1:
        await c.phase(LE, LE_NAME, shown[1])
    return await c.phase(PIT, NAME, shown[0])


async def run_to_success(c: Cluster, backend: str, between: Callable[[str], Any] | None = None) -> dict:
    """Drive the whole lifecycle on ``backend``; ``between(stage)`` is awaited once each stage shows. Returns the
    final PitTraining after asserting the final conditions of both resources and one child of each name."""
    for stage, enter, shown in stages(c, backend):
        await enter()
        await show(c, shown)
        if between is not None:
            await between(stage)
    pit, le = c.get(PIT, NAME), c.get(LE, LE_NAME)
    assert pit["status"]["backend"]["name"] == backend  # the scenario's cluster made ``auto`` pick it
    assert conds(pit) == training_succeeded(backend) and conds(le) == EVAL_SUCCEEDED
    assert names(c) == expected("Succeeded", T, E, backend)
    return pit



# ------------------------------------------------------------------------------ 409 on a status patch
CONFLICT = ('Operation cannot be fulfilled on pittrainings.pitlab.io "fomc-2016": the object has been modified; '
            'please apply your changes to the latest version and try again')


def _to_phase(phase: str) -> Callable[[kmock.Request], bool]:
    return lambda r: isinstance(r.data, dict) and (r.data.get("status") or {}).get("phase") == phase


@each_backend
@pytest.mark.parametrize("phase", ["Preparing", "Training", "Evaluating"])
@pytest.mark.asyncio
async def test_status_patch_conflict_is_retried_and_converges(cluster: Cluster, backend: str, phase: str) -> None:
    """The API server answers the status write that moves the PitTraining into ``phase`` with 409 Conflict
    (a stale write): the write is retried, the status converges, no condition is lost and no child is created
    twice."""
    c = cluster
    fault = c.server.inject(Fault("UPDATE", PIT, 409, "Conflict", CONFLICT, name=NAME, subresource="status",
                                  when=_to_phase(phase)))
    pit = await run_to_success(c, backend)
    assert len(fault.hits) == 1
    writes = [r.data["status"]["phase"] for r in c.server if r.resource == PIT and r.subresource == "status"
              and r.headers.get("User-Agent") != TEST_AGENT]
    assert writes.count(phase) >= 2  # refused once, then written
    assert pit["status"]["corpusAudit"]["included"] == 159  # what the prepare Job reported is kept
    assert pit["status"]["children"] == {"configMap": T["configMap"], "prepareJob": T["prepare"],
                                         CHILD[backend][2]: T["train"], "mergeJob": T["merge"],
                                         f"leakageEval.{LE_NAME}": LE_NAME}
    assert sorted(creates(c)) == sorted((k, n) for k, ns in expected("Succeeded", T, E, backend).items()
                                        for n in ns)


# ------------------------------------------------------------------------------ 409 on create
CONFLICTED = {  # which child's create is answered 409: (resource, name, the stage it is created in)
    "configmap": lambda backend: (CM, T["configMap"], "Preparing"),
    "training-child": lambda backend: (CHILD[backend][0], T["train"], "Training"),
    "leakageeval": lambda backend: (LE, LE_NAME, "Embedding"),
    "embed-job": lambda backend: (JOBS, E["embed"][0], "Embedding"),
}


@each_backend
@pytest.mark.parametrize("which", list(CONFLICTED))
@pytest.mark.asyncio
async def test_create_conflict_adopts_the_child_that_exists(cluster: Cluster, backend: str, which: str) -> None:
    """A child's create is answered 409 AlreadyExists because the object exists (a previous operator instance
    created it and died before recording it; here it is stored by the API server as it refuses the create):
    the operator adopts that object, creates it no second time and the run succeeds."""
    c = cluster
    resource, child, stage = CONFLICTED[which](backend)
    fault = c.server.inject(Fault("CREATE", resource, 409, "AlreadyExists", f'"{child}" already exists',
                                  name=child, store=True))
    uid: list[str] = []

    async def between(now: str) -> None:
        if now == stage:  # shown before an API error's retry could have come: adopted, no error backoff (it
            # took 2.1 s on a loaded 2-core machine: the bound is the retry delay, not a few reconciles)
            assert len(fault.hits) == 1 and time.monotonic() - fault.at[0] < API_RETRY_DELAY_S
            uid.append(c.get(resource, child)["metadata"]["uid"])
    await run_to_success(c, backend, between)
    assert len(fault.hits) == 1 and creates(c, child) == [(fault.hits[0].data["kind"], child)]  # one attempt
    assert c.get(resource, child)["metadata"]["uid"] == uid[0]  # the object that existed, adopted
    made = expected("Succeeded", T, E, backend)
    assert sorted(creates(c)) == sorted((k, n) for k, ns in made.items() for n in ns)
    assert [r for r, _ in c.server.refused if r.action.name == "CREATE"] == fault.hits  # no duplicate create
    # no error, no other warning than the PyTorchJob backend's about Kueue: an ordinary adoption
    assert [(t, r) for t, r, _ in events(c) if t != "Normal"] == warnings(backend)
    created = sorted(m for t, r, m in events(c) if r == "Created")
    assert created == sorted(f"created {k} {n}" for k, ns in made.items() for n in ns
                             if n != child)  # an adopted child is not announced as created


# ------------------------------------------------------------------------------ 422 from admission
# What each backend's admission webhook answers for its training child (the Kubeflow Trainer's, the JobSet
# controller's, the training operator's)
WEBHOOK = {
    "trainjob": 'admission webhook "validate.trainjob.trainer.kubeflow.org" denied the request: TrainJob.trainer.'
                'kubeflow.org "fomc-2016-train" is invalid: spec.runtimeRef: Invalid value: "pitlab-torch": '
                'ClusterTrainingRuntime.trainer.kubeflow.org "pitlab-torch" not found',
    "jobset": 'admission webhook "vjobset.kb.io" denied the request: JobSet.jobset.x-k8s.io "fomc-2016-train" is '
              'invalid: spec.replicatedJobs[0].template.spec.completions: Invalid value: 2: must not exceed the '
              'cluster\'s GPU nodes (1)',
    "pytorchjob": 'admission webhook "validation.pytorchjob.kubeflow.org" denied the request: PyTorchJob.kubeflow.org '
                  '"fomc-2016-train" is invalid: spec.pytorchReplicaSpecs.Worker.replicas: Invalid value: 1: must be '
                  'at least 2',
}
REFUSED = {  # which child admission refuses: (resource, name, its kind, the stage, its condition, the message)
    "training-child-webhook": lambda backend: (CHILD[backend][0], T["train"], CHILD[backend][1], "Training",
                                               "Trained", WEBHOOK[backend]),
    "merge-job-cel": lambda backend: (
        JOBS, T["merge"], "Job", "Merging", "Merged",
        'Job.batch "fomc-2016-merge" is invalid: spec.template.spec.containers[0].resources.limits: Invalid value: '
        '"8": must be less than or equal to nvidia.com/gpu quota of 4 (CEL rule of ValidatingAdmissionPolicy '
        'gpu-limits)'),
}


@each_backend
@pytest.mark.parametrize("which", list(REFUSED))
@pytest.mark.asyncio
async def test_admission_refusal_fails_the_stage_with_the_servers_message(cluster: Cluster, backend: str,
                                                                          which: str) -> None:
    """A child refused by admission (422 Invalid: a webhook or a CEL rule) fails the stage that needed it with
    reason CreateFailed and the API server's message, once: no retry storm, nothing created after it."""
    c = cluster
    resource, child, kind, stage, condition, message = REFUSED[which](backend)
    fault = c.server.inject(Fault("CREATE", resource, 422, "Invalid", message, name=child, times=1000))
    for now, enter, shown in stages(c, backend):
        await enter()
        if now == stage:
            break
        await show(c, shown)
    pit = await c.phase(PIT, NAME, "Failed")
    done = conds(pit)[:conds(pit).index((condition, "False", "CreateFailed"))]
    assert all(s == "True" for _, s, _ in done) and conds(pit)[len(done):] == [
        (condition, "False", "CreateFailed"), *warned(backend), ("Ready", "False", "CreateFailed"),
        ("Reconciling", "False", "CreateFailed"), ("Stalled", "True", "CreateFailed")]
    want = f"{kind} {child} was refused: 422 Unprocessable Entity: {message}"
    assert cond(pit, condition)["message"] == want and cond(pit, "Stalled")["message"] == want
    await asyncio.sleep(20 * CFG.reconcile_interval)
    assert len(fault.hits) == 1 and creates(c, child) == [(kind, child)]  # one attempt, no retry storm
    assert c.get(resource, child) is None and c.get(PIT, NAME)["status"] == pit["status"]
    posted = sorted(e for e in events(c) if e[0] != "Normal")
    assert [e[:2] for e in posted] == [("Warning", "CreateFailed"), *warnings(backend)] and posted[0][2] == want
    assert names(c) == {k: [n for n in v if n != child] for k, v in expected(stage, T, None, backend).items()}
    # status.children names only what exists (found in a trial: it named the refused TrainJob)
    assert child not in pit["status"].get("children", {}).values()


# ------------------------------------------------------------------------------ a watch that ends
def _watches(c: Cluster, resource: str) -> int:
    return sum(1 for r in c.server if r.resource == resource and r.action is not None and r.action.name == "WATCH")


@each_backend
@pytest.mark.parametrize("gone", [False, True], ids=["closed", "410-gone"])
@pytest.mark.asyncio
async def test_watch_that_ends_mid_run_is_resumed(cluster: Cluster, backend: str, gone: bool) -> None:
    """The watch streams of both kinds end while the PitTraining trains (closed by the API server, or after
    an ERROR 410 Gone): the operator watches again, sees the LeakageEval it creates afterwards and a
    PitTraining applied afterwards, and both runs go on."""
    c = cluster
    second = {**TRAINING, "metadata": {**TRAINING["metadata"], "name": "fomc-2017", "uid": "uid-pit-2"},
              "spec": {**TRAINING["spec"], "evaluations": []}}

    async def between(stage: str) -> None:
        if stage == "Training":
            before = {r: _watches(c, r) for r in (PIT, LE)}
            for r in (PIT, LE):
                await c.server.end_watches(r, gone=gone)
            await until(lambda: all(_watches(c, r) > before[r] for r in (PIT, LE)), "the watches to resume")
            await c.apply(second)
            await c.phase(PIT, "fomc-2017", "Preparing")
    await run_to_success(c, backend, between)
    assert [n for n in c.names(JOBS) if n.startswith("fomc-2017")] == ["fomc-2017-prepare"]


# ------------------------------------------------------------------------------ restarts
async def _restart(c: Cluster) -> None:
    """Crash the operator and start a new one; return once it watches both kinds and, unless the
    PitTraining finished, has read its children twice."""
    await c.stop()
    seen = len(list(c.server))
    c.start()
    finished = c.get(PIT, NAME)["status"]["phase"] in ("Succeeded", "Failed")

    def reconciled() -> bool:
        new = [r for r in list(c.server)[seen:] if r.action is not None and r.headers.get("User-Agent") != TEST_AGENT
               and r.resource is not None]
        watching = {r.resource.plural for r in new if r.action.name == "WATCH"} >= {"pittrainings", "leakageevals"}
        reads = [r for r in new if r.action.name == "FETCH" and r.resource.plural in PLURALS]
        return watching and (finished or len(reads) >= 2)
    await until(reconciled, "the restarted operator to reconcile")
    await asyncio.sleep(5 * CFG.reconcile_interval)


@each_backend
@pytest.mark.asyncio
async def test_restart_in_every_phase_creates_no_duplicate(cluster: Cluster, backend: str) -> None:
    """The operator is restarted once the run shows each phase (Preparing, Training, Merging, Evaluating with
    its LeakageEval Embedding then Analyzing, and Succeeded): every child is created once (no create is
    answered 409, no object is replaced: the uids stay), the conditions do not move (their messages may: a
    child's state is read afresh), the run succeeds."""
    c = cluster
    uids: dict[str, dict[str, str]] = {}
    restarts: list[str] = []

    async def between(stage: str) -> None:
        before = children(c)
        st = {r: stable(c.get(r, n)) for r, n in ((PIT, NAME), (LE, LE_NAME)) if c.get(r, n)}
        await _restart(c)
        restarts.append(stage)
        assert children(c) == before, stage  # same names, same uids
        assert {r: stable(c.get(r, n)) for r, n in ((PIT, NAME), (LE, LE_NAME)) if c.get(r, n)} == st, stage
        for kind, got in before.items():
            uids.setdefault(kind, {}).update(got)
    await run_to_success(c, backend, between)
    assert restarts == ["Preparing", "Training", "Merging", "Embedding", "Analyzing", "Succeeded"]
    assert children(c) == uids
    assert sorted(creates(c)) == sorted((k, n) for k, ns in expected("Succeeded", T, E, backend).items()
                                        for n in ns)
    assert [r for r, code in c.server.refused if r.action.name == "CREATE"] == []


@each_backend
@pytest.mark.asyncio
async def test_restart_after_failure_creates_nothing(cluster: Cluster, backend: str) -> None:
    """A run whose training child failed is Failed with the child's reason and message (Trained and Stalled), and
    stays so across a restart: nothing is created again."""
    c = cluster
    for stage, enter, shown in stages(c, backend)[:2]:
        await enter()
        await show(c, shown)
    finish_training(c, backend, ok=False)
    pit = await c.phase(PIT, NAME, "Failed")
    reason, message = TRAIN_FAILED[backend]
    assert conds(pit) == _training_conds(backend, ("Trained", "False", reason), _kstatus("Failed", reason))
    assert cond(pit, "Trained")["message"] == message == cond(pit, "Stalled")["message"]
    before = children(c)
    await _restart(c)
    assert children(c) == before and c.get(PIT, NAME)["status"] == pit["status"]
    assert sorted(creates(c)) == sorted((k, n) for k, ns in expected("Training", T, None, backend).items()
                                        for n in ns)


# ------------------------------------------------------------------------------ deletion
def _owners(c: Cluster) -> dict[str, list[tuple[str, str, str, bool, bool]]]:
    """child name → its ownerReferences as (kind, name, uid, controller, blockOwnerDeletion)."""
    out = {}
    for kind, res in KINDS.items():
        for n in c.names(res):
            refs = c.get(res, n)["metadata"].get("ownerReferences") or []
            out[n] = [(r["kind"], r["name"], r["uid"], r.get("controller"), r.get("blockOwnerDeletion"))
                      for r in refs]
    return out


async def _delete(c: Cluster, resource: str, name: str) -> None:
    plural = resource.split("/")[-1]
    await c.request("DELETE", f"/apis/pitlab.io/v1alpha1/namespaces/{NS}/{plural}/{name}")


@each_backend
@pytest.mark.parametrize("operator_down", [False, True], ids=["running", "operator-down"])
@pytest.mark.asyncio
async def test_deletion_mid_run_releases_the_finalizer_and_collects_every_child(cluster: Cluster, backend: str,
                                                                                  operator_down: bool) -> None:
    """Every child has one controller owner reference to its parent (the LeakageEval's children to the
    LeakageEval), so deleting the PitTraining while it evaluates deletes them all (garbage collection). The
    operator's finalizer holds the PitTraining while the operator is down, and is released by the operator
    (once it is back); nothing is created after the deletion."""
    c = cluster
    for stage, enter, shown in stages(c, backend)[:4]:
        await enter()
        await show(c, shown)
    pit, le = c.get(PIT, NAME), c.get(LE, LE_NAME)
    owner = (("PitTraining", NAME, pit["metadata"]["uid"], True, True),
             ("LeakageEval", LE_NAME, le["metadata"]["uid"], True, True))
    want = {n: [owner[1] if n in (E["configMap"], *E["embed"]) else owner[0]]
            for ns in expected("Embedding", T, E, backend).values() for n in ns}
    assert _owners(c) == want
    assert pit["metadata"]["finalizers"] == ["pitlab.io/finalizer"] == le["metadata"]["finalizers"]
    if operator_down:
        await c.stop()
    made = len(creates(c))
    await _delete(c, PIT, NAME)
    if operator_down:
        await asyncio.sleep(10 * CFG.reconcile_interval)
        held = c.get(PIT, NAME)
        assert held["metadata"]["deletionTimestamp"] and held["metadata"]["finalizers"] == ["pitlab.io/finalizer"]
        assert _owners(c) == want  # the owner is not gone yet: its children stay
        c.start()
    await until(lambda: c.get(PIT, NAME) is None and c.get(LE, LE_NAME) is None, "both parents to be deleted")
    await until(lambda: not _owners(c), "the children to be collected")
    await asyncio.sleep(10 * CFG.reconcile_interval)
    assert _owners(c) == {} and len(creates(c)) == made


def test_a_deleted_resources_timer_is_checked_every_second() -> None:
    """kopf's default of 60 s between checks that a deleted resource's timer has ended held the finalizer (and the
    children's garbage collection) of a run deleted mid-reconcile for a minute; the deletion tests above waited
    15 s and failed about once in eight runs."""
    import kopf

    from pitlab.operator import handlers

    settings = kopf.OperatorSettings()
    assert settings.background.cancellation_polling == 60  # kopf's default, which this guards against
    handlers.configure(settings)
    assert settings.background.cancellation_polling == 1.0
