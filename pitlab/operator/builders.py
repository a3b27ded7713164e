"""Pure manifest builders: a resource (and the operator's settings) in, a Kubernetes object as a plain dict out.

No API calls here. Every object carries the owner reference to its parent, the ``app.kubernetes.io/*``
labels and a deterministic name (:mod:`pitlab.operator.naming`), so that the handlers can create it,
find it again after a restart, and let the garbage collector delete it with its parent.

The pods share one volume (:class:`~pitlab.operator.config.OperatorConfig`: a PVC mounted at the same path
everywhere) and read the resolved spec from a ConfigMap mounted at ``/etc/pitlab``. Jobs that report
something to the operator write it as JSON to their termination message (see
:mod:`pitlab.operator.workload`); on failure the container's last log lines are the message instead.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from typing import Any

from pitlab.api import GROUP_VERSION, LeakageEval, PitTraining, dump_resource, layout, stages
from pitlab.api.layout import EvalOutputs, TrainingLayout
from pitlab.api.leakageeval import LeakageEvalTemplate, TrainingRef
from pitlab.api.scheduling import INHERITED, PodScheduling
from pitlab.operator import naming
from pitlab.operator.pod_parts import pod_failure_policy, with_storage
from pitlab.operator.config import EVAL_SPEC_FILE, SPEC_DIR, TRAINING_SPEC_FILE, OperatorConfig
from pitlab.trainer import command

PYTORCHJOB_API = "kubeflow.org/v1"
TRAINING_SPEC_PATH = posixpath.join(SPEC_DIR, TRAINING_SPEC_FILE)
EVAL_SPEC_PATH = posixpath.join(SPEC_DIR, EVAL_SPEC_FILE)
WORKLOAD = ["python", "-m", "pitlab.operator.workload"]
RUN_AS_USER = 1000


# ---------------------------------------------------------------- shared pieces
def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    """The controller owner reference to ``owner`` (a resource body: apiVersion, kind, metadata.name/uid)."""
    ref = {"apiVersion": owner.get("apiVersion", GROUP_VERSION), "kind": owner["kind"],
           "name": owner["metadata"]["name"], "controller": True, "blockOwnerDeletion": True}
    if owner["metadata"].get("uid"):
        ref["uid"] = owner["metadata"]["uid"]
    return ref


def _metadata(name: str, owner: dict[str, Any], component: str, **extra_labels: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner["metadata"].get("namespace"),
        "labels": naming.labels(owner["kind"], owner["metadata"]["name"], component, **extra_labels),
        "ownerReferences": [owner_reference(owner)],
    }


def spec_digest(spec: dict[str, Any]) -> str:
    """sha256 of a spec's canonical JSON: the identity of the run's inputs (``status.specDigest``)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _resources(cpu: str | None, memory: str | None, gpus: int = 0) -> dict[str, Any]:
    req: dict[str, Any] = {}
    if cpu:
        req["cpu"] = cpu
    if memory:
        req["memory"] = memory
    lim = {"memory": memory} if memory else {}
    if gpus:
        req["nvidia.com/gpu"] = str(gpus)
        lim["nvidia.com/gpu"] = str(gpus)
    out: dict[str, Any] = {}
    if req:
        out["requests"] = req
    if lim:
        out["limits"] = lim
    return out


def env_list(cfg: OperatorConfig, extra: dict[str, str] | None = None) -> list[dict[str, str]]:
    """The variables every pitlab container gets (``PITLAB_DATA_ROOT``, ``PYTHONUNBUFFERED``, ``HOME``, the
    kernel caches of :meth:`OperatorConfig.kernel_cache_env`) and ``extra``, as a container's ``env`` list."""
    env = {"PITLAB_DATA_ROOT": cfg.data_root, "PYTHONUNBUFFERED": "1", "HOME": "/tmp", **cfg.kernel_cache_env()}
    env.update(extra or {})
    return [{"name": k, "value": v} for k, v in env.items()]


def _container(name: str, image: str, command: list[str], cfg: OperatorConfig, resources: dict[str, Any],
               env: dict[str, str] | None = None, spec_file: str | None = None) -> dict[str, Any]:
    mounts = [{"name": "data", "mountPath": cfg.mount_path}]
    if spec_file:
        mounts.append({"name": "spec", "mountPath": SPEC_DIR, "readOnly": True})
    c = {
        "name": name,
        "image": image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": command,
        "workingDir": cfg.mount_path,  # relative spec URIs resolve on the shared volume, as in the operator
        "env": env_list(cfg, env),
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    if resources:
        c["resources"] = resources
    return c


def _pod_spec(containers: list[dict[str, Any]], cfg: OperatorConfig, configmap: str | None, spec_file: str | None,
              restart_policy: str, placement: PodScheduling | None = None, shm: bool = False,
              init_containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [{"name": "data", "persistentVolumeClaim": {"claimName": cfg.pvc}}]
    if configmap:
        volumes.append({"name": "spec", "configMap": {"name": configmap,
                                                      "items": [{"key": spec_file, "path": spec_file}]}})
    if shm:  # NCCL and data loader workers need more than the default 64 MiB of /dev/shm
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        for c in containers:
            c["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    spec: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                            "fsGroup": RUN_AS_USER,
                            # chown the shared volume only when its root's group differs, not recursively
                            # through every file (a multi-TB volume) at each pod start
                            "fsGroupChangePolicy": "OnRootMismatch",
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": containers,
        "volumes": volumes,
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if cfg.image_pull_secrets:  # the chart's imagePullSecrets: the images may live in a private registry
        spec["imagePullSecrets"] = cfg.pull_secrets()
    spec.update(cfg.pod_identity())  # the chart's workloads.serviceAccountName (IRSA, Workload Identity)
    if placement is not None:
        spec.update(placement.placement())
    return spec


def _queue_label(queue_name: str | None) -> dict[str, str]:
    """The Kueue label for ``queue_name`` (none without one). It goes on the workload object's metadata only
    (Kueue reads it there for batch/v1 Jobs and PyTorchJobs), never on the pod template; the Job is not
    created suspended: Kueue's webhook suspends a queued Job at creation, as for the PyTorchJob."""
    return {naming.KUEUE_QUEUE_KEY: queue_name} if queue_name else {}


def _batch_job(name: str, owner: dict[str, Any], component: str, pod_spec: dict[str, Any], backoff_limit: int | None,
               extra_labels: dict[str, str] | None = None, queue_name: str | None = None,
               **job_spec: Any) -> dict[str, Any]:
    """A batch/v1 Job around ``pod_spec`` (restartPolicy Never), failed at once when its first container exits
    with the bad-input code (:func:`pod_failure_policy`); ``backoff_limit`` None leaves ``backoffLimit`` to the
    API server (an indexed Job with ``backoffLimitPerIndex``)."""
    meta = _metadata(name, owner, component, **(extra_labels or {}), **_queue_label(queue_name))
    pod_labels = {k: v for k, v in meta["labels"].items() if k != naming.KUEUE_QUEUE_KEY}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            **({} if backoff_limit is None else {"backoffLimit": backoff_limit}),
            "podFailurePolicy": pod_failure_policy(pod_spec["containers"][0]["name"]),
            **job_spec,
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }


def _configmap(name: str, owner: dict[str, Any], component: str, key: str, doc: dict[str, Any]) -> dict[str, Any]:
    # JSON is YAML: `pitlab prepare` reads the file as YAML, the trainer as JSON.
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(name, owner, component),
            "data": {key: json.dumps(doc, indent=2, sort_keys=True) + "\n"}}


def _pod_document(res: PitTraining | LeakageEval) -> dict[str, Any]:
    """The resource as its pods read it (:func:`pitlab.api.dump_resource`), metadata cut to name and namespace."""
    doc = dump_resource(res)
    doc["metadata"] = {k: v for k, v in {"name": res.metadata.name, "namespace": res.metadata.namespace}.items() if v}
    return doc


# ---------------------------------------------------------------- PitTraining
def resolved_training(pt: PitTraining) -> dict[str, Any]:
    """The PitTraining as the pods read it: every default filled in, camelCase, no status."""
    return _pod_document(pt)


def training_run_dir(pt: PitTraining, cfg: OperatorConfig) -> str:
    """``RUN`` of a PitTraining: ``<spec.output.uri>/<metadata.name>`` on the shared volume."""
    return cfg.run_dir(pt.spec.output.uri, pt.metadata.name)


def build_training_configmap(pt: PitTraining, owner: dict[str, Any]) -> dict[str, Any]:
    """ConfigMap ``<name>-pit-spec`` with the resolved PitTraining as ``spec.yaml``."""
    return _configmap(naming.training_spec_configmap(pt.metadata.name), owner, "config", TRAINING_SPEC_FILE,
                      resolved_training(pt))


def build_prepare_job(pt: PitTraining, cfg: OperatorConfig, owner: dict[str, Any]) -> dict[str, Any]:
    """The CPU Job running ``pitlab prepare``; reports the corpus audit in its termination message."""
    run = training_run_dir(pt, cfg)
    res = pt.spec.resources
    command = WORKLOAD + ["report-audit", "--audit", layout.join(run, layout.CORPUS_AUDIT), "--",
                          *stages.PREPARE.entry_point, "--spec", TRAINING_SPEC_PATH, "--run-dir", run]
    c = _container(stages.PREPARE.name, res.image or cfg.trainer_image, command, cfg,
                   _resources(cfg.prepare_cpu, cfg.prepare_memory), spec_file=TRAINING_SPEC_FILE)
    pod = _pod_spec([c], cfg, naming.training_spec_configmap(pt.metadata.name), TRAINING_SPEC_FILE, "Never", res)
    with_storage(pod, pt.spec.storage)
    return _batch_job(naming.prepare_job(pt.metadata.name), owner, stages.PREPARE.name, pod, cfg.backoff_limit)


def torchrun_command(nodes: int, gpus_per_node: int, spec_path: str, run_dir: str,
                     base: str | None = None) -> list[str]:
    """``torchrun`` for one PyTorchJob replica (:func:`pitlab.trainer.command.torchrun_command` with ``nodes``).
    ``base``: the base model folder as the pods see it (default ``RUN/base``; see :func:`base_model_dir`)."""
    return command.torchrun_command(spec_path, run_dir, gpus_per_node, base, nodes=nodes)


def base_model_dir(pt: PitTraining, cfg: OperatorConfig) -> str:
    """Where the training and merge pods read the base model.

    A volume path in ``spec.baseModel.uri`` is read where it is (a 70 GB base is not copied per run);
    otherwise ``RUN/base``, written by the prepare Job (``randomInit``, or the verified copy of an ``s3://``
    base).
    """
    uri = pt.spec.base_model.uri
    if uri and not uri.startswith("s3://"):
        return cfg.resolve(uri).rstrip("/")
    return TrainingLayout(training_run_dir(pt, cfg)).base


def training_ref_uri(pt: PitTraining, ref: TrainingRef, cfg: OperatorConfig) -> str:
    """Where the pods read a ``trainingRef`` model of PitTraining ``pt``: its base model folder
    (:func:`base_model_dir`) for ``artifact: base``, else ``RUN/<artifact>`` (``RUN/model``, the merged model)."""
    if ref.artifact == "base":
        return base_model_dir(pt, cfg)
    return layout.join(training_run_dir(pt, cfg), ref.artifact)


def nccl_env(timeout_seconds: int) -> dict[str, str]:
    """Environment bounding how long a hung collective may block a rank before the job fails (and frees GPUs)."""
    return {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(timeout_seconds),
        "PITLAB_PG_TIMEOUT_SECONDS": str(timeout_seconds),
        "NCCL_DEBUG": "WARN",
    }


def training_metadata(pt: PitTraining, owner: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The training child's metadata (:func:`naming.training_job`, with the Kueue queue label when
    ``spec.resources.queueName`` is set) and the labels of its pods (the same, without the queue label)."""
    meta = _metadata(naming.training_job(pt.metadata.name), owner, "training",
                     **_queue_label(pt.spec.resources.queue_name))
    return meta, {k: v for k, v in meta["labels"].items() if k != naming.KUEUE_QUEUE_KEY}


def training_image(pt: PitTraining, cfg: OperatorConfig) -> str:
    """The trainer image: ``spec.resources.image``, else the operator's."""
    return pt.spec.resources.image or cfg.trainer_image


def training_resources(pt: PitTraining) -> dict[str, Any]:
    """One node's requests and limits: ``spec.resources`` cpu, memory and ``gpusPerNode`` GPUs."""
    res = pt.spec.resources
    return _resources(res.cpu, res.memory, res.gpus_per_node)


def training_env(cfg: OperatorConfig) -> dict[str, str]:
    """The training container's own variables besides the common ones (the NCCL watchdog's bounds)."""
    return nccl_env(cfg.nccl_timeout_seconds)


def training_container(name: str, pt: PitTraining, cfg: OperatorConfig, argv: list[str]) -> dict[str, Any]:
    """The container running ``argv`` (a torchrun command) on every training node, with the spec mounted."""
    return _container(name, training_image(pt, cfg), argv, cfg, training_resources(pt), training_env(cfg),
                      spec_file=TRAINING_SPEC_FILE)


def progress_sidecar(pt: PitTraining, cfg: OperatorConfig) -> dict[str, Any]:
    """The ``progress`` native sidecar (an init container with ``restartPolicy: Always``) that prints the newest
    training metrics line for the operator to read; it mounts the shared volume read-only."""
    side = _container("progress", training_image(pt, cfg), progress_command(TrainingLayout(training_run_dir(pt, cfg))
                                                                            .metrics, cfg), cfg,
                      _resources("50m", "64Mi"))
    side["restartPolicy"] = "Always"
    side["volumeMounts"][0]["readOnly"] = True
    return side


def progress_command(metrics: str, cfg: OperatorConfig) -> list[str]:
    """The progress sidecar's command for the metrics file ``metrics``."""
    return WORKLOAD + ["progress", "--metrics", metrics, "--interval", str(cfg.progress_interval_seconds)]


def training_pod(pt: PitTraining, cfg: OperatorConfig, main: dict[str, Any], sidecar: bool,
                 restart_policy: str) -> dict[str, Any]:
    """A training node's pod spec: ``main`` (and the progress sidecar when ``sidecar``), the spec ConfigMap, the
    shared volume, a memory-backed ``/dev/shm``, the placement of ``spec.resources`` and the storage settings."""
    res = pt.spec.resources
    spec = _pod_spec([main], cfg, naming.training_spec_configmap(pt.metadata.name), TRAINING_SPEC_FILE,
                     restart_policy, res, shm=True,
                     init_containers=[progress_sidecar(pt, cfg)] if sidecar else None)
    return with_storage(spec, pt.spec.storage)


def build_pytorchjob(pt: PitTraining, cfg: OperatorConfig, owner: dict[str, Any]) -> dict[str, Any]:
    """The Kubeflow PyTorchJob (legacy backend): Master ×1 + Worker ×(nodes−1), ``nprocPerNode`` = gpusPerNode.

    Container ``pytorch`` runs ``torchrun … -m pitlab.cli train``; the master also runs the ``progress``
    sidecar that prints the latest training metrics for the operator to read. ``cleanPodPolicy: Running`` frees
    the GPUs of a failed job.
    """
    res = pt.spec.resources
    run = training_run_dir(pt, cfg)
    meta, pod_labels = training_metadata(pt, owner)

    def template(role: str) -> dict[str, Any]:
        main = training_container("pytorch", pt, cfg, torchrun_command(res.nodes, res.gpus_per_node,
                                                                       TRAINING_SPEC_PATH, run,
                                                                       base_model_dir(pt, cfg)))
        main["ports"] = [{"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"}]
        spec = training_pod(pt, cfg, main, sidecar=role == "Master", restart_policy="OnFailure")
        spec.pop("restartPolicy")  # set per replica type by the training operator
        return {"metadata": {"labels": dict(pod_labels)}, "spec": spec}

    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template("Master")}}
    if res.nodes > 1:
        replicas["Worker"] = {"replicas": res.nodes - 1, "restartPolicy": "OnFailure", "template": template("Worker")}
    return {
        "apiVersion": PYTORCHJOB_API,
        "kind": "PyTorchJob",
        "metadata": meta,
        "spec": {
            "nprocPerNode": str(res.gpus_per_node),
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": cfg.backoff_limit},
            "pytorchReplicaSpecs": replicas,
        },
    }


def merge_command(run_dir: str, checkpoint: str | None = None, base: str | None = None) -> list[str]:
    """``pitlab merge`` of the final checkpoint (``checkpoint``: ``spec.checkpoint.uri`` as the pods see it,
    e.g. ``s3://...``; default ``RUN/checkpoint``) and the base model folder (``base``, default ``RUN/base``)
    into ``RUN/model`` (one process, no process group)."""
    run = TrainingLayout(run_dir)
    return [*stages.MERGE.entry_point, "--checkpoint", checkpoint or run.checkpoint, "--base", base or run.base,
            "--out", run.model]


def training_checkpoint_uri(pt: PitTraining, cfg: OperatorConfig) -> str:
    """Where the trainer writes checkpoints: ``spec.checkpoint.uri`` (``s3://`` or a volume path) or
    ``RUN/checkpoint``."""
    uri = pt.spec.checkpoint.uri
    return cfg.resolve(uri).rstrip("/") if uri else TrainingLayout(training_run_dir(pt, cfg)).checkpoint


def build_merge_job(pt: PitTraining, cfg: OperatorConfig, owner: dict[str, Any]) -> dict[str, Any]:
    """The single-pod merge Job: no process group (so no NCCL watchdog); GPUs only if ``cfg.merge_gpus``, and
    then also the training's nodeSelector, tolerations and Kueue queue (a CPU merge gets none of them)."""
    res = pt.spec.resources
    run = training_run_dir(pt, cfg)
    command = merge_command(run, training_checkpoint_uri(pt, cfg), base_model_dir(pt, cfg))
    c = _container(stages.MERGE.name, res.image or cfg.trainer_image, command, cfg,
                   _resources(cfg.merge_cpu, cfg.merge_memory, cfg.merge_gpus))
    pod = _pod_spec([c], cfg, None, None, "Never", res if cfg.merge_gpus else None)
    with_storage(pod, pt.spec.storage)
    return _batch_job(naming.merge_job(pt.metadata.name), owner, stages.MERGE.name, pod, cfg.backoff_limit,
                      queue_name=res.queue_name if cfg.merge_gpus else None, completions=1, parallelism=1)


def build_evaluation(pt: PitTraining, template: LeakageEvalTemplate, owner: dict[str, Any]) -> dict[str, Any]:
    """A LeakageEval child of a PitTraining (``spec.evaluations[]``), named by :func:`naming.evaluation` from
    the parent's and the evaluation's names; its output defaults to the parent's.

    An evaluation that requests GPUs inherits the parent's ``nodeSelector``, ``tolerations`` and ``queueName``
    (the GPU nodes and queue of the training), each unless the template sets it itself, even to an empty
    value. A CPU-only evaluation inherits none, as a CPU merge Job gets none: they describe GPU nodes."""
    spec = template.spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    res, parent = template.spec.resources, pt.spec.resources
    if res.gpus > 0:
        inherited = spec.setdefault("resources", {})
        for field in INHERITED:
            value = getattr(parent, field)
            if field not in res.model_fields_set and value:
                dumped = parent.model_dump(by_alias=True, mode="json", exclude_none=True, include={field})
                inherited.update(dumped)
    spec.setdefault("output", {"uri": pt.spec.output.uri})
    if pt.spec.storage is not None:  # the evaluation reads the parent's storage unless it names its own
        spec.setdefault("storage", pt.spec.storage.model_dump(by_alias=True, mode="json", exclude_none=True))
    meta = _metadata(naming.evaluation(pt.metadata.name, template.name), owner, "evaluation")
    return {"apiVersion": GROUP_VERSION, "kind": "LeakageEval", "metadata": meta, "spec": spec}


# ---------------------------------------------------------------- LeakageEval
def eval_dir(le: LeakageEval, cfg: OperatorConfig) -> str:
    """``EVALDIR`` = ``<spec.output.uri or out>/<name>/eval`` on the shared volume (as ``pitlab run``)."""
    return posixpath.join(cfg.run_dir(le.spec.output.uri if le.spec.output else "out", le.metadata.name), layout.EVAL)


def resolved_eval(le: LeakageEval, model_uris: dict[str, str]) -> dict[str, Any]:
    """The LeakageEval as the pods read it: defaults filled in, ``trainingRef`` models given as their URI."""
    doc = _pod_document(le)
    for m in doc["spec"]["models"]:
        if "trainingRef" in m:
            m.pop("trainingRef")
            m["uri"] = model_uris[m["name"]]
    return doc


def build_eval_configmap(le: LeakageEval, model_uris: dict[str, str], owner: dict[str, Any]) -> dict[str, Any]:
    """ConfigMap ``<name>-eval-spec`` with the resolved LeakageEval as ``leakageeval.yaml``."""
    return _configmap(naming.eval_spec_configmap(le.metadata.name), owner, "config", EVAL_SPEC_FILE,
                      resolved_eval(le, model_uris))


def embed_command(model: str, out: str) -> list[str]:
    """``pitlab embed`` of one model of the panel."""
    return [*stages.EMBED.entry_point, "--spec", EVAL_SPEC_PATH, "--model", model, "--out", out]


def build_embed_jobs(le: LeakageEval, cfg: OperatorConfig, owner: dict[str, Any],
                     indexed: bool | None = None) -> list[dict[str, Any]]:
    """One embedding Job per model, or one indexed Job (completion index = model): ``indexed`` when given
    (the choice a resource already made), else above ``cfg.indexed_embed_threshold``. Each model is retried
    ``cfg.backoff_limit`` times: in the indexed Job per index (``backoffLimitPerIndex``; a model that fails
    them all fails the Job at once, ``maxFailedIndexes: 0``, as the analysis needs every model). Every Job gets the
    evaluation's ``nodeSelector``, ``tolerations`` and Kueue ``queueName`` (a label on the Job)."""
    r = le.spec.resources
    out = eval_dir(le, cfg)
    image = r.image or cfg.evaluator_image
    cm = naming.eval_spec_configmap(le.metadata.name)
    models = [m.name for m in le.spec.models]

    def pod(command: list[str]) -> dict[str, Any]:
        c = _container(stages.EMBED.name, image, command, cfg,
                       _resources(r.cpu or cfg.embed_cpu, r.memory or cfg.embed_memory, r.gpus),
                       spec_file=EVAL_SPEC_FILE)
        return with_storage(_pod_spec([c], cfg, cm, EVAL_SPEC_FILE, "Never", r,
                                       shm=r.gpus > 0), le.spec.storage)

    if indexed is None:
        indexed = len(models) > cfg.indexed_embed_threshold
    if indexed:
        command = WORKLOAD + ["embed-index", "--models", ",".join(models), "--", *embed_command("{model}", out)]
        return [_batch_job(naming.embed_indexed_job(le.metadata.name, len(models)), owner, stages.EMBED.name,
                           pod(command), None, queue_name=r.queue_name, completionMode="Indexed",
                           completions=len(models), backoffLimitPerIndex=cfg.backoff_limit, maxFailedIndexes=0,
                           parallelism=min(cfg.embed_parallelism, len(models)))]
    return [_batch_job(naming.embed_job(le.metadata.name, m), owner, stages.EMBED.name, pod(embed_command(m, out)),
                       cfg.backoff_limit, {naming.MODEL_KEY: naming.dns_label(m)}, r.queue_name,
                       completions=1, parallelism=1)
            for m in models]


def analyze_command(out: str) -> list[str]:
    """``pitlab analyze`` wrapped so that its results summary becomes the termination message."""
    files = EvalOutputs(out)
    return WORKLOAD + ["report-results", "--results", files.results, "--report", files.report, "--",
                       *stages.ANALYZE.entry_point, "--spec", EVAL_SPEC_PATH, "--out", out]


def build_analyze_job(le: LeakageEval, cfg: OperatorConfig, owner: dict[str, Any]) -> dict[str, Any]:
    """The CPU Job running protocols, bootstrap and report (``pitlab analyze``). It takes only ``image`` from
    ``spec.resources``: it requests no GPUs, its size is the operator's (``OperatorConfig.analyze_cpu`` and
    ``analyze_memory``), and it gets neither the evaluation's nodeSelector/tolerations (GPU nodes) nor its
    Kueue queue (GPU quota)."""
    out = eval_dir(le, cfg)
    c = _container(stages.ANALYZE.name, le.spec.resources.image or cfg.evaluator_image, analyze_command(out), cfg,
                   _resources(cfg.analyze_cpu, cfg.analyze_memory), spec_file=EVAL_SPEC_FILE)
    pod = _pod_spec([c], cfg, naming.eval_spec_configmap(le.metadata.name), EVAL_SPEC_FILE, "Never")
    with_storage(pod, le.spec.storage)
    return _batch_job(naming.analyze_job(le.metadata.name), owner, stages.ANALYZE.name, pod, cfg.backoff_limit,
                      completions=1, parallelism=1)

