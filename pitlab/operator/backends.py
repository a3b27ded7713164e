"""The training backends: which kind runs a PitTraining's training stage on a cluster, and how ``auto`` chooses.

- **TrainJob** (``trainer.kubeflow.org/v1alpha1``, Kubeflow Trainer v2): the current Kubeflow API, on the chart's
  ClusterTrainingRuntime; Kueue integration ``trainer.kubeflow.org/trainjob`` (enabled by default from v0.19).
- **JobSet** (``jobset.x-k8s.io/v1alpha2``): clusters without Kubeflow; Kueue integration ``jobset.x-k8s.io/jobset``.
- **PyTorchJob** (``kubeflow.org/v1``): the legacy Kubeflow training operator, maintained on a release branch only;
  Kueue from v0.19 no longer enables its integration ``kubeflow.org/pytorchjob`` by default.

``spec.resources.backend`` (else the operator's ``training_backend``) names one, or ``auto``: the first of TrainJob,
JobSet, PyTorchJob that the cluster serves. The choice is made once, before the first child, and kept in
``status.backend`` (:func:`choose` is pure: what the cluster serves comes in as a function).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from pitlab.api import PitTraining
from pitlab.api.status import BackendStatus, ResourceStatus
from pitlab.operator import builders, jobset_builders, naming
from pitlab.operator.config import OperatorConfig
from pitlab.operator.mirroring import ChildState, jobset_state, pytorchjob_state, trainjob_state

DEFAULT_SOURCE = "the operator's default (chart value trainingBackend)"
SPEC_SOURCE = "spec.resources.backend"


@dataclasses.dataclass(frozen=True)
class Backend:
    """One training backend: its ``spec.resources.backend`` value, its kind and resource key, the CRD that serves
    it, the ``status.children`` key of its child, what to install for it, its Kueue integration, how to build its
    child and how to read the child's state."""

    name: str
    kind: str
    resource: str
    crd: str
    child_key: str
    install: str
    kueue_integration: str
    build: Callable[[PitTraining, OperatorConfig, dict[str, Any]], dict[str, Any]]
    state: Callable[[dict[str, Any], bool], ChildState]
    legacy: bool = False

    def status(self, reason: str) -> BackendStatus:
        """``status.backend`` for this backend, chosen for ``reason``."""
        return BackendStatus(name=self.name, kind=self.kind, reason=reason)


TRAINJOB = Backend("trainjob", "TrainJob", naming.TRAINJOBS, "trainjobs.trainer.kubeflow.org", "trainJob",
                   "Kubeflow Trainer v2 (the trainer.kubeflow.org/v1alpha1 TrainJob CRD) and the chart's "
                   "ClusterTrainingRuntime", "trainer.kubeflow.org/trainjob", jobset_builders.build_trainjob,
                   trainjob_state)
JOBSET = Backend("jobset", "JobSet", naming.JOBSETS, "jobsets.jobset.x-k8s.io", "jobSet",
                 "JobSet (the jobset.x-k8s.io/v1alpha2 JobSet CRD)", "jobset.x-k8s.io/jobset",
                 jobset_builders.build_jobset, jobset_state)
PYTORCHJOB = Backend("pytorchjob", "PyTorchJob", naming.PYTORCHJOBS, "pytorchjobs.kubeflow.org", "pytorchJob",
                     "the Kubeflow training operator v1.9 (the kubeflow.org/v1 PyTorchJob CRD)",
                     "kubeflow.org/pytorchjob", builders.build_pytorchjob, pytorchjob_state, legacy=True)
AUTO_ORDER = (TRAINJOB, JOBSET, PYTORCHJOB)
BACKENDS = {b.name: b for b in AUTO_ORDER}
BY_KIND = {b.kind: b for b in AUTO_ORDER}


@dataclasses.dataclass(frozen=True)
class Choice:
    """The outcome of :func:`choose`: a backend and why, or (``backend`` None) why none could be chosen."""

    backend: Backend | None
    reason: str


def choose(spec_backend: str | None, default: str, serves: Callable[[str], bool],
           runtime: Callable[[], bool] | None = None, runtime_name: str = "") -> Choice:
    """The backend of a run: ``spec_backend`` (``spec.resources.backend``), else ``default`` (the operator's). A named
    backend is taken when the cluster serves its kind (and, for TrainJob, ``runtime()`` finds its runtime), else no
    backend and a reason naming what is missing: the run then waits before its prepare Job rather than after it
    (a kind removed later is reported when its child is created). ``auto`` asks ``serves``
    (resource key → whether the API server serves it) for TrainJob, JobSet, PyTorchJob in that order, a TrainJob
    only where ``runtime()`` says its ClusterTrainingRuntime ``runtime_name`` exists (Trainer's webhook refuses a
    TrainJob created before its runtime; the chart renders it only where Helm saw Trainer's API); with none
    served, no backend and a reason naming what to install."""
    requested, source = (spec_backend, SPEC_SOURCE) if spec_backend else (default, DEFAULT_SOURCE)
    if requested != "auto":
        backend, said = BACKENDS[requested], f"{source}: {requested}"
        if not serves(backend.resource):
            return Choice(None, f"{said}, but the cluster serves no {backend.crd}: install {backend.install}, "
                                "or name another backend (auto takes what the cluster serves)")
        if backend is TRAINJOB and runtime is not None and not runtime():
            return Choice(None, f"{said}, but the ClusterTrainingRuntime {runtime_name} does not exist (Trainer's "
                                "webhook refuses a TrainJob without it): install it with the chart, "
                                "trainingRuntime.install=true")
        return Choice(backend, said)
    missing: list[str] = []
    for backend in AUTO_ORDER:
        if serves(backend.resource):
            if backend is TRAINJOB and runtime is not None and not runtime():
                missing.append(f"{backend.crd} with the ClusterTrainingRuntime {runtime_name} (absent: install it "
                               "with the chart, trainingRuntime.install=true)")
                continue
            passed = f" (not {' nor '.join(missing)})" if missing else ""
            return Choice(backend, f"{source}: auto; the cluster serves {backend.crd}{passed}")
        missing.append(backend.crd)
    return Choice(None, f"{source} is auto and the cluster serves none of {', '.join(missing)}: install "
                        f"{TRAINJOB.install}, or {JOBSET.install}, or {PYTORCHJOB.install}")


def chosen(status: ResourceStatus) -> Backend:
    """The backend recorded in ``status.backend``; PyTorchJob for a run started before backends were recorded."""
    return BACKENDS[status.backend.name] if status.backend is not None else PYTORCHJOB


def kueue_warning(backend: Backend, queue_name: str | None) -> str | None:
    """What a run queued through Kueue must know about its backend: a PyTorchJob is admitted only when Kueue's
    ``kubeflow.org/pytorchjob`` integration is enabled, which Kueue no longer does by default from v0.19."""
    if not (backend.legacy and queue_name):
        return None
    return (f"{backend.kind} is the legacy Kubeflow API: Kueue >= 0.19 admits it against LocalQueue {queue_name} only "
            f"when {backend.kueue_integration} is listed in its integrations.frameworks (no longer a default); "
            "without it the label is ignored and the job bypasses the quota. Use backend trainjob or jobset "
            "(integrations trainer.kubeflow.org/trainjob, jobset.x-k8s.io/jobset)")
