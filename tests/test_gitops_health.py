"""GitOps health of PitTraining and LeakageEval, as the chart ships it: the Argo CD Lua check
(charts/pitlab/files/health/argocd.lua, run by a real Lua 5.1 interpreter through lupa), the Flux
``healthCheckExprs`` (files/health/flux-healthcheckexprs.yaml, evaluated with the ``cel`` package the way
kustomize-controller does) and the generic kstatus reading, all on statuses written by pitlab's own code: the
operator's reconcile against an in-memory cluster (tests/test_operator_lifecycle.py's FakeWorld), its
handlers' status for a blocked child, and ``pitlab run``'s recorder. Every phase, with its exact health."""

from __future__ import annotations

import copy
import functools
import json
import subprocess
from typing import Any, Callable

import cel
import lupa.lua51
import pytest
import yaml
from kubernetes.client import ApiException
from test_builders_schemas import validate, validate_pitlab
from test_chart import CHART, helm, of_kind, render
from test_operator_lifecycle import AUDIT, BODY, CFG, LE_BODY, NOW, FakeWorld, finish, step

from pitlab.api import ResourceStatus, stages
from pitlab.api.recorder import Recorder
from pitlab.api.summary import PROGRESS_PREFIX, progress_record
from pitlab.operator import handlers, lifecycle

HEALTH = CHART / "files" / "health"
LUA = HEALTH / "argocd.lua"
FLUX = HEALTH / "flux-healthcheckexprs.yaml"
KINDS = ("PitTraining", "LeakageEval")
MASTER_LOG = ("t-train-master-0", "progress")


# ---------------------------------------------------------------- the three readers
def argo_health(obj: dict[str, Any], runtime: Callable[[], Any] = lupa.lua51.LuaRuntime) -> tuple[str, str]:
    """(status, message) of the shipped Lua check, run as Argo CD runs it: a fresh interpreter with the global
    ``obj``, the script's returned table read back."""
    lua = runtime()
    lua.globals().obj = lua.table_from(copy.deepcopy(obj), recursive=True)
    hs = lua.execute(LUA.read_text())
    return hs["status"], hs["message"]


@functools.cache
def flux_entries() -> dict[str, dict[str, str]]:
    """The shipped healthCheckExprs entries by kind."""
    return {e["kind"]: e for e in yaml.safe_load(FLUX.read_text())}


def _stale(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    return "observedGeneration" in status and status["observedGeneration"] != obj["metadata"].get("generation")


def flux_health(obj: dict[str, Any]) -> str:
    """kustomize-controller's reading with healthCheckExprs: its own observedGeneration rule, then inProgress,
    failed and current in that order (the first true one wins, none: InProgress). ``Error`` when an expression
    cannot be evaluated (Flux reports it and polls again)."""
    if _stale(obj):
        return "InProgress"
    entry = flux_entries()[obj["kind"]]
    assert entry["apiVersion"] == obj["apiVersion"]
    for key, result in (("inProgress", "InProgress"), ("failed", "Failed"), ("current", "Current")):
        try:
            if cel.evaluate(entry[key], obj):
                return result
        except RuntimeError:
            return "Error"
    return "InProgress"


def kstatus(obj: dict[str, Any]) -> str:
    """The generic kstatus rules for a custom resource (what Flux uses without healthCheckExprs): an observed
    generation behind: InProgress; Reconciling=True: InProgress; Stalled=True: Failed; else Current."""
    if _stale(obj):
        return "InProgress"
    conds = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
    if conds.get("Reconciling") == "True":
        return "InProgress"
    if conds.get("Stalled") == "True":
        return "Failed"
    return "Current"


# ---------------------------------------------------------------- fixtures: the operator's own statuses
def _with_status(body: dict[str, Any], status: ResourceStatus) -> dict[str, Any]:
    return {**copy.deepcopy(body), "status": status.to_yaml_dict()}


def _bumped(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` after a metadata.generation bump the operator has not reconciled yet."""
    out = copy.deepcopy(body)
    out["metadata"]["generation"] = 2
    return out


def _waiting(w: FakeWorld, body: dict[str, Any], queue: str | None) -> dict[str, Any]:
    """The operator's reconcile of a PitTraining whose PyTorchJob is suspended, as Kueue holds it (``queue``: the
    child's LocalQueue label; None: suspended without Kueue). Queued before it ran, Preempted after (``body`` has
    progress), Suspended without a queue: the reasons the health checks read (conditions.WAITING_REASONS)."""
    key = (lifecycle.PYTORCHJOBS, "t-train")
    saved = copy.deepcopy(w.objects[key])
    job = w.objects[key]
    if queue:
        job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = queue
    job["status"] = {"conditions": [{"type": "Suspended", "status": "True", "reason": "PyTorchJobSuspended",
                                     "message": "PyTorchJob t-train is suspended."}]}
    waiting = step(w, copy.deepcopy(body))[0]
    w.objects[key] = saved
    return waiting


def _blocked(w: FakeWorld, body: dict[str, Any]) -> dict[str, Any]:
    """The status run_plan patches when the API server has no PyTorchJob kind (404): the handler's own code."""
    plan = lifecycle.reconcile_training(copy.deepcopy(body), w, CFG, NOW)
    (job,) = plan.creates
    err = ApiException(status=404, reason="Not Found")
    return {**copy.deepcopy(body), "status": handlers.blocked_status(err, plan.status, body, job, 60)}


def _metrics(step_: int) -> str:
    """The progress sidecar's line for a trainer record at ``step_`` of 1,000 (1.2 s a step since step 0)."""
    rec = {"step": step_, "total_steps": 1000, "loss": 2.5, "mean_tokens_per_second": 8150.0,
           "elapsed_s": 1.2 * step_, "start_step": 0}
    return PROGRESS_PREFIX + json.dumps(progress_record(rec)) + "\n"


def _training_run(out: dict[str, dict]) -> FakeWorld:
    """Drive one PitTraining (one evaluation) from creation to Succeeded, keeping the body of each phase."""
    w = FakeWorld()
    body = copy.deepcopy(BODY)
    body["spec"]["evaluations"] = [{"name": "leak", "spec": {
        "models": [{"name": "pit", "trainingRef": {"name": "t"}}], "dataset": {"kind": "ohlcv", "uri": "p.csv"},
        "protocol": {"trainEnd": "2020-12-31", "testStart": "2021-01-01"}}}]
    out["created"] = copy.deepcopy(body)
    out["preparing"] = body = step(w, body)[0]
    finish(w, lifecycle.JOBS, "t-prepare", container="prepare", msg=json.dumps(AUDIT))
    out["blocked"] = _blocked(w, body)
    out["training-created"] = body = step(w, body)[0]
    out["training-queued"] = _waiting(w, body, "gpu-queue")
    w.logs[MASTER_LOG] = _metrics(120)
    w.objects[(lifecycle.PYTORCHJOBS, "t-train")]["status"] = {"conditions": [
        {"type": "Running", "status": "True", "reason": "PyTorchJobRunning"}]}
    out["training"] = body = step(w, body)[0]
    out["training-preempted"] = _waiting(w, body, "gpu-queue")
    out["training-suspended"] = _waiting(w, body, None)
    out["training-stale"] = _bumped(body)
    finish(w, lifecycle.PYTORCHJOBS, "t-train")
    out["merging"] = body = step(w, body)[0]
    finish(w, lifecycle.JOBS, "t-merge")
    out["evaluating"] = body = step(w, body)[0]
    w.objects[(lifecycle.LEAKAGEEVALS, "t-leak")]["status"] = {"phase": "Succeeded", "results": {"models": {}}}
    out["succeeded"] = body = step(w, body)[0]
    out["succeeded-stale"] = edited = _bumped(body)
    edited["spec"]["tokens"] = 200
    out["spec-edited-after-success"] = step(w, edited)[0]
    return w


def _local_runs(out: dict[str, dict]) -> None:
    """``pitlab run``'s recorder (status.json): validating, and a training stopped by a signal."""
    rec = Recorder(ResourceStatus(), generation=1, now=NOW)
    rec.running(stages.VALIDATE, "checking the spec and its inputs")
    out["local-validating"] = _with_status(BODY, rec.status)
    rec.done(stages.VALIDATE, "spec is valid")
    rec.running(stages.PREPARE)
    rec.done(stages.PREPARE)
    rec.running(stages.TRAIN, "torchrun, 2 processes")
    rec.interrupted(stages.TRAIN, "stopped at step 20 of 40; checkpoint step-20 is durable")
    out["local-interrupted"] = _with_status(BODY, rec.status)


@functools.cache
def training_fixtures() -> dict[str, dict]:
    """PitTraining bodies by name, each with the status pitlab's code wrote."""
    out: dict[str, dict] = {}
    _training_run(out)
    w = FakeWorld()
    body = step(w, copy.deepcopy(BODY))[0]
    finish(w, lifecycle.JOBS, "t-prepare", ok=False, container="prepare", msg="error: no column 'date'")
    out["failed"] = step(w, body)[0]
    _local_runs(out)
    return out


@functools.cache
def eval_fixtures() -> dict[str, dict]:
    """LeakageEval bodies by name, from its reconcile against an in-memory cluster."""
    out: dict[str, dict] = {}
    w = FakeWorld()
    le = copy.deepcopy(LE_BODY)
    le["spec"]["models"] = [{"name": "m0", "uri": "models/m0"}]
    out["embedding"] = le = w.apply(lifecycle.reconcile_eval(le, w, CFG, NOW), le)
    finish(w, lifecycle.JOBS, "e-embed-m0")
    out["analyzing"] = le = w.apply(lifecycle.reconcile_eval(le, w, CFG, NOW), le)
    out["analyzing-stale"] = _bumped(le)
    results = {"models": {"m0": {"premium": 0.1, "premiumCI": [0.0, 0.2], "verdict": "not significant"}},
               "reductions": []}
    finish(w, lifecycle.JOBS, "e-analyze", container="analyze",
           msg=json.dumps({"results": results, "reportUri": "/r.md"}))
    out["succeeded"] = w.apply(lifecycle.reconcile_eval(le, w, CFG, NOW), le)
    w2 = FakeWorld()
    w2.objects[(lifecycle.PITTRAININGS, "t")] = {**BODY, "status": {"phase": "Failed", "conditions": [
        {"type": "Stalled", "status": "True", "reason": "PyTorchJobFailed", "lastTransitionTime": NOW,
         "message": "PyTorchJob t-train: 1 Master replica(s) failed."}]}}
    out["failed"] = w2.apply(lifecycle.reconcile_eval(copy.deepcopy(LE_BODY), w2, CFG, NOW), LE_BODY)
    return out


def fixture(kind: str, name: str) -> dict[str, Any]:
    return copy.deepcopy((training_fixtures() if kind == "PitTraining" else eval_fixtures())[name])


# ---------------------------------------------------------------- expected health, exactly
SUSPENDED = "PyTorchJobSuspended: PyTorchJob t-train is suspended."
BLOCKED = ("ChildKindMissing: PyTorchJob t-train cannot be created: the API server has no PyTorchJob kind (404 Not "
           "Found: ); install the Kubeflow training operator (the kubeflow.org/v1 PyTorchJob CRD). Retrying every 60 s")
EDITED = ("SpecImmutable: spec changed after the run finished (Succeeded, generation 2); nothing is run again. The "
          "run's spec is in ConfigMap t-pit-spec: revert the edit, or create a new PitTraining")
STALE = "waiting for the pitlab operator to observe generation 2 (status is of generation 1)"
# name: (Argo CD status, Argo CD message, Flux with healthCheckExprs, generic kstatus)
TRAINING = {
    "created": ("Progressing", "waiting for the pitlab operator to take it up", "Error", "Current"),
    "preparing": ("Progressing", "Preparing: Job t-prepare: Created", "InProgress", "InProgress"),
    "blocked": ("Degraded", BLOCKED, "Failed", "InProgress"),
    "training-created": ("Progressing", "Training: PyTorchJob t-train: Created", "InProgress", "InProgress"),
    "training": ("Progressing", "Training: step 120/1000 (12.0%), ETA 17m36s", "InProgress", "InProgress"),
    "training-queued": ("Suspended", "Training: Queued: PyTorchJob t-train: waiting for admission by Kueue "
                        f"LocalQueue gpu-queue ({SUSPENDED})", "InProgress", "InProgress"),
    "training-preempted": ("Suspended", "Training: Preempted: PyTorchJob t-train: evicted by Kueue LocalQueue "
                           f"gpu-queue ({SUSPENDED}); it resumes from its last checkpoint when readmitted (step "
                           "120/1000)", "InProgress", "InProgress"),
    "training-suspended": ("Suspended", f"Training: Suspended: PyTorchJob t-train: {SUSPENDED} (step 120/1000)",
                           "InProgress", "InProgress"),
    "training-stale": ("Progressing", STALE, "InProgress", "InProgress"),
    "merging": ("Progressing", "Merging: Job t-merge: Created", "InProgress", "InProgress"),
    "evaluating": ("Progressing", "Evaluating: waiting for LeakageEval t-leak (Created)", "InProgress", "InProgress"),
    "succeeded": ("Healthy", "Succeeded: model at /pitlab/out/t/model", "Current", "Current"),
    "succeeded-stale": ("Progressing", STALE, "InProgress", "InProgress"),
    "spec-edited-after-success": ("Degraded", EDITED, "Failed", "Failed"),
    "failed": ("Degraded", "BackoffLimitExceeded: Job t-prepare: BackoffLimitExceeded: Job has reached the "
               "specified backoff limit; error: no column 'date'", "Failed", "Failed"),
    "local-validating": ("Progressing", "Validating: checking the spec and its inputs", "InProgress", "InProgress"),
    "local-interrupted": ("Suspended", "Interrupted: stopped at step 20 of 40; checkpoint step-20 is durable (resume "
                          "with pitlab run --resume)", "Failed", "Failed"),
}
EVAL = {
    "embedding": ("Progressing", "Embedding: Created", "InProgress", "InProgress"),
    "analyzing": ("Progressing", "Analyzing: Job e-analyze: Created", "InProgress", "InProgress"),
    "analyzing-stale": ("Progressing", STALE, "InProgress", "InProgress"),
    "succeeded": ("Healthy", "Succeeded: m0 +0.100 [+0.000, +0.200]", "Current", "Current"),
    "failed": ("Degraded", "TrainingFailed: model pit: PitTraining t failed before its model was written "
               "(PyTorchJobFailed: PyTorchJob t-train: 1 Master replica(s) failed.)", "Failed", "Failed"),
}
CASES = [("PitTraining", n, *v) for n, v in TRAINING.items()] + [("LeakageEval", n, *v) for n, v in EVAL.items()]


def test_fixtures_cover_every_phase_the_operator_and_pitlab_run_write() -> None:
    phases = {(k, (fixture(k, n).get("status") or {}).get("phase", "<none>")) for k, n, *_ in CASES}
    assert phases == {("PitTraining", p) for p in ("<none>", "Validating", "Preparing", "Training", "Merging",
                                                   "Evaluating", "Succeeded", "Failed", "Interrupted")} | {
        ("LeakageEval", p) for p in ("Embedding", "Analyzing", "Succeeded", "Failed")}


@pytest.mark.parametrize("kind, name, argo, message, flux, kstat", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_health_of_each_fixture(kind, name, argo, message, flux, kstat) -> None:
    obj = fixture(kind, name)
    assert argo_health(obj) == (argo, message)
    assert flux_health(obj) == flux
    assert kstatus(obj) == kstat


@pytest.mark.parametrize("kind, name", [(k, n) for k, n, *_ in CASES])
def test_fixtures_are_valid_resources_with_consistent_kstatus_conditions(kind, name) -> None:
    """Each fixture validates against the CRD (status included); the operator keeps the kstatus conditions in
    line with the phase: Ready=True only when Succeeded (and then unless an edit stalled it), Reconciling=True
    only while not finished, Ready and Stalled of the status's generation."""
    obj = fixture(kind, name)
    assert validate_pitlab(obj) == []
    status = obj.get("status")
    if status is None:
        return
    conds = {c["type"]: c for c in status["conditions"]}
    ready, stalled = conds["Ready"]["status"] == "True", conds["Stalled"]["status"] == "True"
    assert ready == (status["phase"] == "Succeeded" and not stalled)
    assert not (ready and stalled)
    assert conds["Reconciling"]["status"] == ("False" if status["phase"] in ("Succeeded", "Failed", "Interrupted")
                                              else "True")
    assert {conds[t]["observedGeneration"] for t in ("Ready", "Stalled")} == {status["observedGeneration"]}


@pytest.mark.parametrize("runtime", [lupa.lua51.LuaRuntime, lupa.lua54.LuaRuntime],
                         ids=["lua5.1", "lua5.4"])
def test_the_script_reads_the_same_in_newer_lua(runtime) -> None:
    """Argo CD runs Lua 5.1 (gopher-lua); the script keeps to what 5.4 reads the same (integer formats, no
    5.1-only library calls)."""
    for kind, name, argo, message, *_ in CASES:
        assert argo_health(fixture(kind, name), runtime) == (argo, message), (kind, name)


def test_argo_message_without_progress_or_conditions() -> None:
    obj = fixture("PitTraining", "training")
    obj["status"]["progress"] = {"step": 120}  # no total yet: the condition's message instead
    assert argo_health(obj) == ("Progressing", "Training: PyTorchJob t-train: PyTorchJobRunning (step 120/1000)")
    obj["status"] = {"phase": "Failed"}  # a hand-written failure: no conditions, the phase is enough
    assert argo_health(obj) == ("Degraded", "Failed")
    obj["status"] = {"phase": "Pending", "observedGeneration": 1}
    assert argo_health(obj) == ("Progressing", "Pending: in progress")


def test_flux_entries_are_one_per_kind_and_the_same_rules() -> None:
    entries = yaml.safe_load(FLUX.read_text())
    assert [(e["apiVersion"], e["kind"]) for e in entries] == [("pitlab.io/v1alpha1", k) for k in KINDS]
    assert entries[0]["inProgress"] == entries[1]["inProgress"] and entries[0]["current"] == entries[1]["current"]
    assert all(set(e) == {"apiVersion", "kind", "inProgress", "failed", "current"} for e in entries)


# ---------------------------------------------------------------- the chart ships the same file
def test_chart_renders_the_argocd_keys_from_the_shipped_file() -> None:
    assert of_kind(render(), "ConfigMap") == []  # off by default
    (cm,) = of_kind(render("--set", "argocd.healthChecks.enabled=true"), "ConfigMap")
    assert (cm["metadata"]["name"], cm["metadata"]["namespace"]) == ("pitlab-argocd-health", "pitlab-system")
    assert cm["data"] == {f"resource.customizations.health.pitlab.io_{k}": LUA.read_text() for k in KINDS}
    assert validate(cm) == []
    (cm,) = of_kind(render("--set", "argocd.healthChecks.enabled=true", "--set", "argocd.healthChecks.namespace=argocd",
                           "--set", "argocd.healthChecks.configMapName=pitlab-health"), "ConfigMap")
    assert (cm["metadata"]["name"], cm["metadata"]["namespace"]) == ("pitlab-health", "argocd")


def test_helm_lint_is_clean_with_the_health_checks_on() -> None:
    out = subprocess.run([helm(), "lint", "--strict", str(CHART), "--set", "argocd.healthChecks.enabled=true",
                          "--set", "argocd.healthChecks.namespace=argocd"], capture_output=True, text=True)
    assert out.returncode == 0 and "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout, out.stdout


def test_the_rendered_check_is_the_tested_check() -> None:
    """What Argo CD would run (the rendered key) gives the tested answers."""
    (cm,) = of_kind(render("--set", "argocd.healthChecks.enabled=true"), "ConfigMap")
    lua = lupa.lua51.LuaRuntime()
    lua.globals().obj = lua.table_from(fixture("PitTraining", "training"), recursive=True)
    hs = lua.execute(cm["data"]["resource.customizations.health.pitlab.io_PitTraining"])
    assert (hs["status"], hs["message"]) == TRAINING["training"][:2]
