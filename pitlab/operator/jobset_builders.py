"""Pure builders of the two JobSet-shaped training backends: the TrainJob (Kubeflow Trainer v2, on the
ClusterTrainingRuntime ``OperatorConfig.training_runtime`` that the chart ships, one per release, as a JobSet
template) and the plain JobSet. Both run one replicated job ``node`` (an Indexed Job, one pod per node, container
``node``) under the same failure policy.

The TrainJob carries only what differs per run: ``spec.trainer`` (image, command, environment, nodes, processes and
resources per node) and, under pitlab's own manager name in ``spec.runtimePatches``, the pod settings the runtime
cannot know (the shared volume's claim, the run's spec ConfigMap, placement, the progress sidecar's metrics file,
the image pull secrets). Everything fixed (restart and failure policies, ``/dev/shm``, security context, the
sidecar itself) is in the runtime (charts/pitlab/templates/trainingruntime.yaml); tests/test_chart.py checks that
the two agree.
"""

from __future__ import annotations

from typing import Any

from pitlab.api import PitTraining
from pitlab.api.layout import TrainingLayout
from pitlab.operator import builders, naming, pod_parts
from pitlab.operator.config import SPEC_DIR, TRAINING_SPEC_FILE, OperatorConfig
from pitlab.trainer import command

TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
RUNTIME_KIND = "ClusterTrainingRuntime"
PATCH_MANAGER = "pitlab.io/operator"  # runtimePatches entries are keyed by manager: pitlab's, never Kueue's
NODE = naming.NODE_JOB
METRICS_ENV = "PITLAB_METRICS"  # the runtime's progress sidecar reads its metrics file from this variable
BAD_INPUT_RULE = "bad-input"
# Keys of a storage Secret given to a TrainJob's node container (a TrainJob has no envFrom): the required ones
# (pod_parts.REQUIRED_SECRET_KEYS, as in every other pod), then the optional ones.
STORAGE_SECRET_KEYS = (*pod_parts.REQUIRED_SECRET_KEYS, "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION",
                       "AWS_DEFAULT_REGION")


# ---------------------------------------------------------------- the shared failure policy
def pod_failure_policy() -> dict[str, Any]:
    """The ``podFailurePolicy`` of the Job ``node`` (:func:`pitlab.operator.pod_parts.pod_failure_policy` of its
    container ``node``; the bad-input code is passed through by :mod:`pitlab.trainer.torchrun`), and with
    ``backoffLimit: 0`` any other failure fails the Job."""
    return pod_parts.pod_failure_policy(NODE)


def failure_policy(max_restarts: int) -> dict[str, Any]:
    """The JobSet ``failurePolicy``: a Job failed by the bad-input rule (reason PodFailurePolicy) fails the JobSet;
    any other failed Job restarts the whole JobSet (every node: torchrun's ranks start together) up to
    ``max_restarts`` times, each run resuming from the newest checkpoint."""
    return {"maxRestarts": max_restarts, "restartStrategy": "Recreate", "rules": [
        {"name": BAD_INPUT_RULE, "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
         "targetReplicatedJobs": [NODE]}]}


def node_job_spec(nodes: int, pod_template: dict[str, Any]) -> dict[str, Any]:
    """The Job of the replicated job ``node``: Indexed, one pod per node (completions = parallelism = ``nodes``), no
    retry of its own (a failure restarts the JobSet), the shared :func:`pod_failure_policy`."""
    return {"completionMode": "Indexed", "completions": nodes, "parallelism": nodes, "backoffLimit": 0,
            "podFailurePolicy": pod_failure_policy(), "template": pod_template}


# ---------------------------------------------------------------- JobSet
def build_jobset(pt: PitTraining, cfg: OperatorConfig, owner: dict[str, Any]) -> dict[str, Any]:
    """The JobSet backend: one replicated job ``node`` (:func:`node_job_spec`), container ``node`` running torchrun
    with a static rendezvous at the pod of completion index 0 through the JobSet's headless Service
    (:func:`naming.jobset_master`), the node rank being the completion index; every pod runs the progress sidecar.
    ``failurePolicy``: :func:`failure_policy` with ``cfg.backoff_limit`` restarts. Kueue: the queue label on the
    JobSet's metadata."""
    res = pt.spec.resources
    meta, pod_labels = builders.training_metadata(pt, owner)
    argv = command.jobset_command(builders.TRAINING_SPEC_PATH, builders.training_run_dir(pt, cfg), res.gpus_per_node,
                                  builders.base_model_dir(pt, cfg), nodes=res.nodes,
                                  master_addr=naming.jobset_master(pt.metadata.name))
    main = builders.training_container(NODE, pt, cfg, argv)
    main["ports"] = [{"name": "torchrun", "containerPort": command.JOBSET_MASTER_PORT, "protocol": "TCP"}]
    pod = builders.training_pod(pt, cfg, main, sidecar=True, restart_policy="Never")
    pod["terminationGracePeriodSeconds"] = cfg.termination_grace_seconds
    job = node_job_spec(res.nodes, {"metadata": {"labels": dict(pod_labels)}, "spec": pod})
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": meta,
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True,
                        "subdomain": meta["name"]},
            "failurePolicy": failure_policy(cfg.backoff_limit),
            "replicatedJobs": [{"name": NODE, "replicas": 1,
                                "template": {"metadata": {"labels": dict(pod_labels)}, "spec": job}}],
        },
    }


# ---------------------------------------------------------------- TrainJob
def storage_env(pt: PitTraining) -> list[dict[str, Any]]:
    """``spec.storage`` as the variables of a TrainJob's node container: the settings as values, the Secret's
    standard keys (:data:`STORAGE_SECRET_KEYS`) as ``secretKeyRef`` (a TrainJob has no ``envFrom``): AWS_ACCESS_KEY_ID
    and AWS_SECRET_ACCESS_KEY required, as in every other pod (:func:`pod_parts.with_storage`: a missing Secret or
    key stops the pod from starting), the others optional; a key the settings already set is not read from the
    Secret."""
    storage = pt.spec.storage
    if storage is None:
        return []
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in storage.env().items()]
    if storage.secret_name:
        set_ = {e["name"] for e in env}
        required = tuple(k for k in pod_parts.REQUIRED_SECRET_KEYS if k not in set_)
        optional = tuple(k for k in STORAGE_SECRET_KEYS if k not in set_ and k not in pod_parts.REQUIRED_SECRET_KEYS)
        env += pod_parts.secret_key_env(storage.secret_name, required, optional=False)
        env += pod_parts.secret_key_env(storage.secret_name, optional, optional=True)
    return env


def runtime_patch(pt: PitTraining, cfg: OperatorConfig, pod_labels: dict[str, str]) -> dict[str, Any]:
    """pitlab's ``runtimePatches`` entry: the pods' labels, placement, the shared volume and the spec ConfigMap
    (mounted into container ``node``), the progress sidecar's metrics file and read-only volume, and the
    operator's ``imagePullSecrets`` and workload ``serviceAccountName``."""
    res = pt.spec.resources
    pod: dict[str, Any] = res.placement()
    spec_items = [{"key": TRAINING_SPEC_FILE, "path": TRAINING_SPEC_FILE}]
    pod["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": cfg.pvc}},
                      {"name": "spec", "configMap": {"name": naming.training_spec_configmap(pt.metadata.name),
                                                     "items": spec_items}}]
    pod["containers"] = [{"name": NODE, "volumeMounts": [{"name": "data", "mountPath": cfg.mount_path},
                                                         {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True}]}]
    metrics = TrainingLayout(builders.training_run_dir(pt, cfg)).metrics
    pod["initContainers"] = [{"name": "progress", "env": [{"name": METRICS_ENV, "value": metrics}],
                              "volumeMounts": [{"name": "data", "mountPath": cfg.mount_path, "readOnly": True}]}]
    if cfg.image_pull_secrets:  # the runtime is shared by every namespace: the pull secrets are per run
        pod["imagePullSecrets"] = cfg.pull_secrets()
    pod.update(cfg.pod_identity())  # likewise the ServiceAccount whose cloud identity reaches s3://
    template = {"spec": {"template": {"metadata": {"labels": dict(pod_labels)}, "spec": pod}}}
    return {"manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{"name": NODE, "template": template}]}}}}


def build_trainjob(pt: PitTraining, cfg: OperatorConfig, owner: dict[str, Any]) -> dict[str, Any]:
    """The TrainJob backend (Kubeflow Trainer v2): ``runtimeRef`` to the ClusterTrainingRuntime
    ``cfg.training_runtime``; ``trainer`` with the image, torchrun reading the ``PET_*`` variables the trainer
    injects (:func:`pitlab.trainer.command.trainjob_command`; pitlab sets none), the environment, ``numNodes``,
    ``numProcPerNode`` and ``resourcesPerNode``; the pod settings in :func:`runtime_patch`. Kueue: the queue label
    on the TrainJob's metadata. A TrainJob's spec is immutable: the operator creates it once and never updates it."""
    res = pt.spec.resources
    meta, pod_labels = builders.training_metadata(pt, owner)
    argv = command.trainjob_command(builders.TRAINING_SPEC_PATH, builders.training_run_dir(pt, cfg),
                                    builders.base_model_dir(pt, cfg))
    env = builders.env_list(cfg, builders.training_env(cfg)) + storage_env(pt)
    trainer = {"image": builders.training_image(pt, cfg), "command": argv, "env": env, "numNodes": res.nodes,
               "numProcPerNode": res.gpus_per_node}
    resources = builders.training_resources(pt)
    if resources:
        trainer["resourcesPerNode"] = resources
    return {
        "apiVersion": TRAINJOB_API,
        "kind": "TrainJob",
        "metadata": meta,
        "spec": {
            "runtimeRef": {"apiGroup": TRAINJOB_API.split("/")[0], "kind": RUNTIME_KIND, "name": cfg.training_runtime},
            "trainer": trainer,
            "runtimePatches": [runtime_patch(pt, cfg, pod_labels)],
        },
    }
