"""Operator settings: images, the shared volume, defaults. Read once from the environment (the Helm chart's
values become the Deployment's environment); the builders take them as an argument."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re

SPEC_DIR = "/etc/pitlab"
TRAINING_SPEC_FILE = "spec.yaml"
EVAL_SPEC_FILE = "leakageeval.yaml"
TRAINING_BACKENDS = ("auto", "trainjob", "jobset", "pytorchjob")  # spec.resources.backend, chart trainingBackend
# a Secret's or a ServiceAccount's name: a DNS-1123 subdomain
SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _check_name(name: str, setting: str, kind: str) -> None:
    """Raise ``ValueError`` naming ``setting`` unless ``name`` is a DNS-1123 subdomain (a ``kind``'s name)."""
    if not SECRET_NAME.match(name) or len(name) > 253:
        raise ValueError(f"{setting}: {name!r} is not a {kind} name (lowercase letters, digits, '-' and '.')")


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    """What the operator needs besides the resources themselves.

    ``pvc``/``mount_path``: the PersistentVolumeClaim (same name in every watched namespace) that every pod
    mounts at ``mount_path``; relative spec URIs (``output.uri: out``) resolve under it, and
    ``${PITLAB_DATA_ROOT}`` in spec URIs is ``data_root``. ``nccl_timeout_seconds`` goes to the training pods'
    environment. ``reconcile_interval`` is how often (s) a running resource's children are looked at.
    ``indexed_embed_threshold``: panels with more models than this embed in one indexed Job (decided once per
    LeakageEval). ``create_retry_delay``: seconds between attempts to create a child the API server cannot
    take yet (kind not installed, forbidden, quota exceeded). ``training_backend``: what runs a PitTraining's
    training stage when its ``spec.resources.backend`` is unset (``auto``, ``trainjob``, ``jobset`` or
    ``pytorchjob``; :mod:`pitlab.operator.backends`). ``training_runtime``: the ClusterTrainingRuntime a
    TrainJob names (the chart ships it). ``termination_grace_seconds``: how long a TrainJob or JobSet training
    pod may take to stop (preemption, eviction) before it is killed. ``kernel_cache``: the folder on the shared
    volume (relative to ``mount_path``, or absolute) where every pod keeps the GPU kernels it compiles
    (``TRITON_CACHE_DIR`` = ``<kernel_cache>/triton``, which also holds fla's autotuning results,
    ``TORCHINDUCTOR_CACHE_DIR`` = ``<kernel_cache>/inductor``), so a later pod with the same kernels skips
    compiling them; ``none`` leaves both in the pod's ``/tmp``. ``image_pull_secrets``: names of Secrets
    (``kubernetes.io/dockerconfigjson``) that every pod the operator creates lists as ``imagePullSecrets`` (the
    chart's ``imagePullSecrets``, the operator's own; ``PITLAB_IMAGE_PULL_SECRETS``, comma-separated); each must
    exist in every namespace with runs. ``workload_service_account``: the ServiceAccount every workload pod runs
    as (``PITLAB_WORKLOAD_SERVICE_ACCOUNT``, chart value ``workloads.serviceAccountName``; empty: the namespace's
    ``default``), so that pods can reach ``s3://`` with a cloud identity bound to it (EKS IRSA or Pod Identity, GKE
    Workload Identity) instead of a storage Secret; it must exist in every namespace with runs. The pods still
    mount no API token (``automountServiceAccountToken: false``): the identity webhooks project their own.
    """

    trainer_image: str = "ghcr.io/pitlab/pitlab-trainer:0.1.0"
    evaluator_image: str = "ghcr.io/pitlab/pitlab-evaluator:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    pvc: str = "pitlab-data"
    mount_path: str = "/pitlab"
    data_root: str = "/pitlab/data"
    nccl_timeout_seconds: int = 1800
    backoff_limit: int = 2
    merge_gpus: int = 0
    merge_cpu: str = "8"
    merge_memory: str = "64Gi"
    prepare_cpu: str = "4"
    prepare_memory: str = "16Gi"
    analyze_cpu: str = "4"
    analyze_memory: str = "16Gi"
    embed_cpu: str = "8"
    embed_memory: str = "64Gi"
    indexed_embed_threshold: int = 8
    embed_parallelism: int = 4
    progress_interval_seconds: int = 15
    reconcile_interval: float = 10.0
    create_retry_delay: float = 60.0
    training_backend: str = "auto"
    training_runtime: str = "pitlab-torch"
    termination_grace_seconds: int = 300
    kernel_cache: str = ".cache/kernels"
    image_pull_secrets: tuple[str, ...] = ()
    workload_service_account: str = ""

    def __post_init__(self) -> None:
        if self.training_backend not in TRAINING_BACKENDS:
            raise ValueError(f"PITLAB_TRAINING_BACKEND (chart value trainingBackend): {self.training_backend!r} is "
                             f"not one of {', '.join(TRAINING_BACKENDS)}")
        if isinstance(self.image_pull_secrets, str):  # one name given as a string, not its characters
            object.__setattr__(self, "image_pull_secrets", (self.image_pull_secrets,))
        object.__setattr__(self, "image_pull_secrets", tuple(self.image_pull_secrets))
        for name in self.image_pull_secrets:
            _check_name(name, "PITLAB_IMAGE_PULL_SECRETS (chart value imagePullSecrets)", "Secret")
        if self.workload_service_account:
            _check_name(self.workload_service_account,
                        "PITLAB_WORKLOAD_SERVICE_ACCOUNT (chart value workloads.serviceAccountName)", "ServiceAccount")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "OperatorConfig":
        """Settings from ``PITLAB_<FIELD>`` variables (e.g. ``PITLAB_TRAINER_IMAGE``, ``PITLAB_PVC``); a list
        (``PITLAB_IMAGE_PULL_SECRETS``) is comma-separated."""
        env = os.environ if env is None else env
        kwargs: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            key = "PITLAB_" + f.name.upper()
            if env.get(key):
                if isinstance(f.default, tuple):
                    kwargs[f.name] = tuple(v.strip() for v in env[key].split(",") if v.strip())
                else:
                    kwargs[f.name] = type(f.default)(env[key])
        return cls(**kwargs)

    def pull_secrets(self) -> list[dict[str, str]]:
        """``image_pull_secrets`` as a pod's ``imagePullSecrets`` list (empty without any)."""
        return [{"name": n} for n in self.image_pull_secrets]

    def pod_identity(self) -> dict[str, str]:
        """``serviceAccountName`` for a workload pod's spec (empty without ``workload_service_account``)."""
        return {"serviceAccountName": self.workload_service_account} if self.workload_service_account else {}

    def resolve(self, uri: str) -> str:
        """A spec URI as a path in the pods: ``${PITLAB_DATA_ROOT}`` expanded, relative paths under the mount.

        ``s3://bucket/prefix`` URIs are returned as they are (the pods read them with ``spec.storage``).
        Raises ``ValueError`` for other URI schemes and invalid bucket names.
        """
        path = uri.replace("${PITLAB_DATA_ROOT}", self.data_root)
        if path.startswith("file://"):
            path = path[len("file://"):]
        if path.startswith("package://"):
            return uri
        if path.startswith("s3://"):
            from pitlab.storage import StorageError, parse_s3

            try:
                parse_s3(path)
            except StorageError as err:
                raise ValueError(str(err)) from None
            return path
        if "://" in path:
            raise ValueError(f"{uri!r}: give a path on the shared volume or s3://bucket/prefix")
        return posixpath.normpath(path if path.startswith("/") else posixpath.join(self.mount_path, path))

    def kernel_cache_env(self) -> dict[str, str]:
        """``TRITON_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` under ``kernel_cache`` on the shared volume, or
        ``{}`` when ``kernel_cache`` is ``none``."""
        if self.kernel_cache.strip().lower() in ("", "none"):
            return {}
        root = posixpath.normpath(posixpath.join(self.mount_path, self.kernel_cache))
        return {"TRITON_CACHE_DIR": posixpath.join(root, "triton"),
                "TORCHINDUCTOR_CACHE_DIR": posixpath.join(root, "inductor")}

    def run_dir(self, output_uri: str, name: str) -> str:
        """``RUN`` = ``<output.uri>/<name>`` on the shared volume."""
        return posixpath.join(self.resolve(output_uri), name)
