"""The training backends: how one is chosen, the TrainJob and JobSet manifests (exact fields, valid against the
vendored CRDs and CEL rules), the chart's ClusterTrainingRuntime as the seam between them, the torchrun launcher's
exit codes, and the operator's cached discovery of what the cluster serves."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import ApiException
from test_builders import CFG, PIT_BODY
from test_builders_schemas import REPO, validate
from test_chart import of_kind, render

from pitlab.api import parse_resource
from pitlab.operator import backends, builders, jobset_builders, naming
from pitlab.operator.config import OperatorConfig
from pitlab.operator.kube import Kube
from pitlab.trainer import torchrun

TJ, JS, PTJ = naming.TRAINJOBS, naming.JOBSETS, naming.PYTORCHJOBS


@pytest.fixture()
def pit():
    return parse_resource(copy.deepcopy(PIT_BODY))


# ---------------------------------------------------------------- choosing
@pytest.mark.parametrize("served, kind, reason", [
    ({TJ, JS, PTJ}, "TrainJob", "auto; the cluster serves trainjobs.trainer.kubeflow.org"),
    ({JS, PTJ}, "JobSet", "auto; the cluster serves jobsets.jobset.x-k8s.io (not trainjobs.trainer.kubeflow.org)"),
    ({PTJ}, "PyTorchJob", "auto; the cluster serves pytorchjobs.kubeflow.org (not trainjobs.trainer.kubeflow.org nor "
                          "jobsets.jobset.x-k8s.io)"),
    ({TJ}, "TrainJob", "auto; the cluster serves trainjobs.trainer.kubeflow.org"),
])
def test_auto_prefers_trainjob_then_jobset_then_pytorchjob(served: set[str], kind: str, reason: str) -> None:
    choice = backends.choose(None, "auto", served.__contains__)
    assert choice.backend.kind == kind
    assert choice.reason == f"the operator's default (chart value trainingBackend): {reason}"
    assert backends.choose("auto", "jobset", served.__contains__).reason == f"spec.resources.backend: {reason}"


def test_a_named_backend_is_taken_when_the_cluster_serves_it() -> None:
    assert backends.choose("jobset", "auto", {JS}.__contains__) == backends.Choice(
        backends.JOBSET, "spec.resources.backend: jobset")
    assert backends.choose(None, "trainjob", {TJ}.__contains__, lambda: True, "pitlab-torch") == backends.Choice(
        backends.TRAINJOB, "the operator's default (chart value trainingBackend): trainjob")


def test_a_named_backend_the_cluster_cannot_run_stops_the_run_before_its_prepare_job() -> None:
    """Found in a platform engineer's trial: backend trainjob on a cluster without Trainer, or without the
    runtime, ran the prepare Job (hours on a large corpus) before the TrainJob was refused."""
    choice = backends.choose("trainjob", "auto", {JS, PTJ}.__contains__)
    assert choice.backend is None and choice.reason == (
        "spec.resources.backend: trainjob, but the cluster serves no trainjobs.trainer.kubeflow.org: install "
        "Kubeflow Trainer v2 (the trainer.kubeflow.org/v1alpha1 TrainJob CRD) and the chart's "
        "ClusterTrainingRuntime, or name another backend (auto takes what the cluster serves)")
    choice = backends.choose(None, "trainjob", {TJ}.__contains__, lambda: False, "pitlab-torch")
    assert choice.backend is None and choice.reason == (
        "the operator's default (chart value trainingBackend): trainjob, but the ClusterTrainingRuntime "
        "pitlab-torch does not exist (Trainer's webhook refuses a TrainJob without it): install it with the "
        "chart, trainingRuntime.install=true")
    assert backends.choose("pytorchjob", "auto", {TJ}.__contains__).reason.startswith(
        "spec.resources.backend: pytorchjob, but the cluster serves no pytorchjobs.kubeflow.org: install")


def test_auto_with_nothing_served_names_what_to_install() -> None:
    choice = backends.choose("auto", "pytorchjob", lambda r: False)
    assert choice.backend is None and choice.reason == (
        "spec.resources.backend is auto and the cluster serves none of trainjobs.trainer.kubeflow.org, "
        "jobsets.jobset.x-k8s.io, pytorchjobs.kubeflow.org: install Kubeflow Trainer v2 (the "
        "trainer.kubeflow.org/v1alpha1 TrainJob CRD) and the chart's ClusterTrainingRuntime, or JobSet (the "
        "jobset.x-k8s.io/v1alpha2 JobSet CRD), or the Kubeflow training operator v1.9 (the kubeflow.org/v1 "
        "PyTorchJob CRD)")


def test_only_a_queued_pytorchjob_gets_the_kueue_warning() -> None:
    assert backends.kueue_warning(backends.TRAINJOB, "h200") is None
    assert backends.kueue_warning(backends.JOBSET, "h200") is None
    assert backends.kueue_warning(backends.PYTORCHJOB, None) is None
    warning = backends.kueue_warning(backends.PYTORCHJOB, "h200")
    assert warning.startswith("PyTorchJob is the legacy Kubeflow API: Kueue >= 0.19 admits it against LocalQueue "
                              "h200 only when kubeflow.org/pytorchjob is listed in its integrations.frameworks")


def test_a_run_without_a_recorded_backend_is_a_pytorchjob() -> None:
    from pitlab.api.status import ResourceStatus

    assert backends.chosen(ResourceStatus()) is backends.PYTORCHJOB
    assert backends.chosen(ResourceStatus(backend=backends.JOBSET.status("x"))) is backends.JOBSET


def test_the_operator_refuses_an_unknown_default_backend_naming_the_value() -> None:
    with pytest.raises(ValueError, match="PITLAB_TRAINING_BACKEND \\(chart value trainingBackend\\): 'trainjobs' is "
                                         "not one of auto, trainjob, jobset, pytorchjob"):
        OperatorConfig.from_env({"PITLAB_TRAINING_BACKEND": "trainjobs"})
    assert OperatorConfig.from_env({"PITLAB_TRAINING_BACKEND": "jobset"}).training_backend == "jobset"


def test_the_spec_refuses_an_unknown_backend_naming_the_field() -> None:
    from pitlab.api import SpecError

    body = copy.deepcopy(PIT_BODY)
    body["spec"]["resources"]["backend"] = "mpijob"
    with pytest.raises(SpecError) as err:
        parse_resource(body)
    assert [p for p, _ in err.value.problems] == ["spec.resources.backend"]


# ---------------------------------------------------------------- TrainJob
def test_trainjob_shape(pit) -> None:
    tj = jobset_builders.build_trainjob(pit, CFG, PIT_BODY)
    assert validate(tj) == []
    assert (tj["apiVersion"], tj["kind"], tj["metadata"]["name"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob",
                                                                      "qwen-2020-train")
    assert tj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "h200"
    assert tj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert tj["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                        "name": "pitlab-torch"}
    trainer = tj["spec"]["trainer"]
    assert (trainer["image"], trainer["numNodes"], trainer["numProcPerNode"]) == ("reg.example/pitlab-trainer:1", 3, 8)
    assert trainer["resourcesPerNode"] == {"requests": {"cpu": "64", "memory": "900Gi", "nvidia.com/gpu": "8"},
                                           "limits": {"memory": "900Gi", "nvidia.com/gpu": "8"}}
    # torchrun reads PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT: pitlab sets none
    assert trainer["command"] == ["python", "-m", "pitlab.trainer.torchrun", "-m", "pitlab.cli", "train", "--spec",
                                  "/etc/pitlab/spec.yaml", "--run-dir", "/pitlab/out/qwen-2020", "--base",
                                  "/pitlab/models/Qwen3.5-35B-A3B-Base"]
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert not any(k.startswith("PET_") for k in env) and env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "1800"
    assert env["PITLAB_DATA_ROOT"] == "/pitlab/data"
    (patch,) = tj["spec"]["runtimePatches"]
    assert patch["manager"] == "pitlab.io/operator"
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = rjob["template"]["spec"]["template"]
    assert rjob["name"] == "node" and naming.KUEUE_QUEUE_KEY not in pod["metadata"]["labels"]
    assert pod["metadata"]["labels"][naming.INSTANCE_KEY] == "qwen-2020"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert pod["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["spec"]["volumes"] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": "pitlab-data"}},
        {"name": "spec", "configMap": {"name": "qwen-2020-pit-spec", "items": [{"key": "spec.yaml",
                                                                              "path": "spec.yaml"}]}}]
    assert pod["spec"]["containers"] == [{"name": "node", "volumeMounts": [
        {"name": "data", "mountPath": "/pitlab"}, {"name": "spec", "mountPath": "/etc/pitlab", "readOnly": True}]}]
    assert pod["spec"]["initContainers"] == [{"name": "progress", "env": [
        {"name": "PITLAB_METRICS", "value": "/pitlab/out/qwen-2020/train/metrics.jsonl"}],
        "volumeMounts": [{"name": "data", "mountPath": "/pitlab", "readOnly": True}]}]


def test_trainjob_storage_reaches_the_node_container_as_secret_keys(pit) -> None:
    body = copy.deepcopy(PIT_BODY)
    body["spec"]["storage"] = {"secretName": "s3-creds", "endpointUrl": "http://minio:9000", "region": "eu-west-1"}
    body["spec"]["resources"] = {"nodes": 1, "gpusPerNode": 1}
    tj = jobset_builders.build_trainjob(parse_resource(body), CFG, body)
    assert validate(tj) == [] and naming.KUEUE_QUEUE_KEY not in tj["metadata"]["labels"]
    env = tj["spec"]["trainer"]["env"]
    assert env[-6:] == [
        {"name": "AWS_ENDPOINT_URL", "value": "http://minio:9000"}, {"name": "AWS_REGION", "value": "eu-west-1"},
        *({"name": k, "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": k,
                                                      "optional": k in ("AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION")}}}
          for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"))]
    pod = tj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert "nodeSelector" not in pod["template"]["spec"]["template"]["spec"]


# ---------------------------------------------------------------- JobSet
def test_jobset_shape(pit) -> None:
    js = jobset_builders.build_jobset(pit, CFG, PIT_BODY)
    assert validate(js) == []
    assert (js["apiVersion"], js["kind"], js["metadata"]["name"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet",
                                                                      "qwen-2020-train")
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "h200"
    assert js["spec"]["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True,
                                     "subdomain": "qwen-2020-train"}
    assert js["spec"]["failurePolicy"] == {"maxRestarts": 2, "restartStrategy": "Recreate", "rules": [
        {"name": "bad-input", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
         "targetReplicatedJobs": ["node"]}]}
    (rjob,) = js["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert (rjob["name"], rjob["replicas"]) == ("node", 1)
    assert {k: job[k] for k in ("completionMode", "completions", "parallelism", "backoffLimit")} == {
        "completionMode": "Indexed", "completions": 3, "parallelism": 3, "backoffLimit": 0}
    assert job["podFailurePolicy"] == {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "In", "values": [2]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] == 300
    assert [c["name"] for c in pod["containers"]] == ["node"] and [c["name"] for c in pod["initContainers"]] == \
        ["progress"]
    node = pod["containers"][0]
    assert node["command"] == [
        "python", "-m", "pitlab.trainer.torchrun", "--nnodes=3", "--nproc-per-node=8",
        "--node-rank=$(JOB_COMPLETION_INDEX)", "--master-addr=qwen-2020-train-node-0-0.qwen-2020-train",
        "--master-port=29500", "-m", "pitlab.cli", "train", "--spec", "/etc/pitlab/spec.yaml", "--run-dir",
        "/pitlab/out/qwen-2020", "--base", "/pitlab/models/Qwen3.5-35B-A3B-Base"]
    assert {v["name"] for v in pod["volumes"]} == {"data", "spec", "dshm"}
    assert {m["mountPath"] for m in node["volumeMounts"]} == {"/pitlab", "/etc/pitlab", "/dev/shm"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}


def test_jobset_command_parses_as_torchrun_on_every_node() -> None:
    """The JobSet's command is what torchrun accepts once the kubelet expanded $(JOB_COMPLETION_INDEX)."""
    from torch.distributed.run import get_args_parser

    from pitlab.trainer import command

    argv = command.jobset_command("/etc/pitlab/spec.yaml", "/pitlab/out/x", 8, None, nodes=4,
                                  master_addr="x-train-node-0-0.x-train")
    assert argv[:3] == ["python", "-m", "pitlab.trainer.torchrun"]
    for rank in range(4):
        args = get_args_parser().parse_args([a.replace("$(JOB_COMPLETION_INDEX)", str(rank)) for a in argv[3:]])
        assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("4", "8", rank)
        assert (args.master_addr, args.master_port, args.training_script) == ("x-train-node-0-0.x-train", 29500,
                                                                               "pitlab.cli")
    with pytest.raises(ValueError, match="spec.resources.nodes: must be >= 1"):
        command.jobset_command("s", "r", 8, nodes=0, master_addr="m")


def test_trainjob_command_leaves_the_rendezvous_to_the_pet_variables() -> None:
    from torch.distributed.run import get_args_parser

    from pitlab.trainer import command

    env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "m",
           "PET_MASTER_PORT": "29400"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        args = get_args_parser().parse_args(command.trainjob_command("/s.yaml", "/r")[3:])
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert (args.nnodes, args.nproc_per_node, args.node_rank, args.master_addr, args.master_port) == (
        "2", "4", 1, "m", 29400)


@pytest.mark.parametrize("name", ["a" * 63, "qwen3.5-pit", "2016.fomc", "x" * 200])
def test_every_backend_manifest_of_an_awkward_name_is_valid(name: str) -> None:
    body = copy.deepcopy(PIT_BODY)
    body["metadata"]["name"] = name
    body["spec"]["evaluations"] = []
    body["spec"]["resources"]["nodes"] = 9999  # the longest hostname: <name>-node-0-9998
    pt = parse_resource(body)
    for build in (jobset_builders.build_trainjob, jobset_builders.build_jobset, builders.build_pytorchjob):
        obj = build(pt, CFG, body)
        assert validate(obj) == [], (build.__name__, obj["metadata"]["name"])
        assert obj["metadata"]["name"] == naming.training_job(name)


def test_the_trainjob_example_builds_a_valid_queued_trainjob() -> None:
    import yaml

    doc = yaml.safe_load((REPO / "examples" / "pittraining-trainjob.yaml").read_text())
    doc["metadata"].update(namespace="research", uid="u-9")
    pt = parse_resource(copy.deepcopy(doc))
    choice = backends.choose(pt.spec.resources.backend, "auto", {TJ}.__contains__)
    assert choice == backends.Choice(backends.TRAINJOB, "spec.resources.backend: trainjob")
    tj = choice.backend.build(pt, OperatorConfig(), doc)
    assert validate(tj) == [] and tj["metadata"]["name"] == "qwen35-a3b-pit-2020-tj-train"
    assert (tj["spec"]["trainer"]["numNodes"], tj["spec"]["trainer"]["numProcPerNode"]) == (2, 8)
    assert tj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert backends.kueue_warning(choice.backend, pt.spec.resources.queue_name) is None


# ---------------------------------------------------------------- the runtime: the seam of the TrainJob
def _merge_named(base: list[dict], patch: list[dict]) -> list[dict]:
    """Items merged by name, as Kubeflow Trainer applies a runtime patch (env and volumeMounts merged too)."""
    out = {i["name"]: copy.deepcopy(i) for i in base}
    for item in patch:
        cur = out.setdefault(item["name"], {})
        for k, v in item.items():
            cur[k] = _merge_named(cur.get(k, []), v) if k in ("env", "volumeMounts") else copy.deepcopy(v)
    return list(out.values())


def _trainjob_on_runtime(runtime: dict, tj: dict) -> dict:
    """The Job of replicated job ``node`` that Kubeflow Trainer makes of ``runtime`` and TrainJob ``tj``: the
    trainer fields on container ``node``, ``numNodes`` pods, then pitlab's runtime patch."""
    (rjob,) = copy.deepcopy(runtime["spec"]["template"]["spec"]["replicatedJobs"])
    job, trainer = rjob["template"]["spec"], tj["spec"]["trainer"]
    pod = job["template"]["spec"]
    node = next(c for c in pod["containers"] if c["name"] == "node")
    node.update(image=trainer["image"], command=trainer["command"], resources=trainer["resourcesPerNode"])
    node["env"] = _merge_named(node.get("env", []), trainer["env"])
    job["completions"] = job["parallelism"] = trainer["numNodes"]
    (patch,) = [p for p in tj["spec"]["runtimePatches"] if p["manager"] == jobset_builders.PATCH_MANAGER]
    (prjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    ppod = prjob["template"]["spec"]["template"]
    job["template"].setdefault("metadata", {}).setdefault("labels", {}).update(ppod["metadata"]["labels"])
    for k, v in ppod["spec"].items():
        pod[k] = _merge_named(pod.get(k, []), v) if k in ("containers", "initContainers", "volumes") else v
    return job


def _normal(job: dict) -> dict:
    """A Job spec with its named lists as dicts, the launch (command, ports) of container node left out and the
    progress sidecar's $(PITLAB_METRICS) expanded."""
    job = copy.deepcopy(job)
    pod = job["template"]["spec"]
    for key in ("containers", "initContainers"):
        items = {}
        for c in pod.get(key, []):
            env = {e["name"]: e for e in c.get("env", [])}
            metrics = env.pop(jobset_builders.METRICS_ENV, {}).get("value")
            if metrics:
                c["command"] = [a.replace(f"$({jobset_builders.METRICS_ENV})", metrics) for a in c["command"]]
            if c["name"] == "node":
                c.pop("command"), c.pop("ports", None)
            items[c["name"]] = {**c, "env": env, "volumeMounts": {m["name"]: m for m in c.get("volumeMounts", [])}}
        pod[key] = items
    pod["volumes"] = {v["name"]: v for v in pod.get("volumes", [])}
    return job


def test_a_trainjob_on_the_charts_runtime_runs_the_pods_of_the_jobset_backend(pit) -> None:
    """The chart's ClusterTrainingRuntime plus what a TrainJob adds give the JobSet backend's Job, launch aside:
    one failure policy, one pod (volumes, mounts, environment, security, placement, sidecar) for both backends."""
    objs = render("--set", "trainingBackend=trainjob", "--set", "storage.pvc=pitlab-data")
    (runtime,) = of_kind(objs, "ClusterTrainingRuntime")
    (dep,) = of_kind(objs, "Deployment")
    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    cfg = OperatorConfig.from_env({e["name"]: e["value"] for e in env})
    assert validate(runtime) == []
    assert runtime["metadata"]["name"] == cfg.training_runtime == "pitlab-torch.pitlab-system"  # per release
    assert runtime["spec"]["template"]["spec"]["failurePolicy"] == jobset_builders.failure_policy(cfg.backoff_limit)
    (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    tj = jobset_builders.build_trainjob(pit, cfg, PIT_BODY)
    js = jobset_builders.build_jobset(pit, cfg, PIT_BODY)
    on_runtime = _trainjob_on_runtime(runtime, tj)
    wanted = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": on_runtime}) == []
    assert _normal(on_runtime) == _normal(wanted)
    assert on_runtime["template"]["spec"]["containers"][0]["command"] == tj["spec"]["trainer"]["command"]


# ---------------------------------------------------------------- the launcher
def test_the_launcher_exit_code_says_whether_a_retry_can_help() -> None:
    assert torchrun.exit_code({}) == 0
    assert torchrun.exit_code({0: 1, 1: 2}) == 2  # one rank reported bad input
    assert torchrun.exit_code({0: -9, 3: 1}) == 1  # killed, crashed: retry from the checkpoint


@pytest.mark.parametrize("code, expected", [(2, 2), (7, 1), (0, 0)])
def test_the_launcher_passes_a_ranks_bad_input_exit_code(tmp_path: Path, code: int, expected: int) -> None:
    """torchrun itself exits 1 whatever its ranks' codes; the launcher ends with 2 when rank 1 exits 2."""
    script = tmp_path / "rank.py"
    script.write_text("import os, sys\nsys.exit(int(os.environ['CODE']) if os.environ['RANK'] == '1' else 0)\n")
    env = {**os.environ, "CODE": str(code), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "pitlab.trainer.torchrun", "--standalone", "--nproc-per-node=2",
                          str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == expected, out.stderr[-2000:]


# ---------------------------------------------------------------- discovery
class _Discovery:
    """A CustomObjectsApi stand-in answering get_api_resources from ``served`` (group/version → names)."""

    def __init__(self, served: dict[str, list[str]]):
        self.served, self.calls = served, []

    def get_api_resources(self, group: str, version: str, _preload_content: bool = True):
        self.calls.append(f"{group}/{version}")
        if f"{group}/{version}" not in self.served:
            raise ApiException(status=404, reason="Not Found")
        names = self.served[f"{group}/{version}"]
        return SimpleNamespace(data=json.dumps({"resources": [{"name": n} for n in names]}).encode())


def test_discovery_is_cached_for_its_ttl_then_asked_again() -> None:
    now = [100.0]
    kube = Kube.__new__(Kube)
    kube.discovery_ttl, kube.clock, kube._served = 30.0, lambda: now[0], {}
    kube.custom = _Discovery({"jobset.x-k8s.io/v1alpha2": ["jobsets", "jobsets/status"]})
    assert kube.serves(JS) is True and kube.serves(TJ) is False and kube.serves(TJ) is False
    assert kube.custom.calls == ["jobset.x-k8s.io/v1alpha2", "trainer.kubeflow.org/v1alpha1"]
    kube.custom.served["trainer.kubeflow.org/v1alpha1"] = ["trainjobs"]  # Kubeflow Trainer installed meanwhile
    now[0] += 29
    assert kube.serves(TJ) is False  # still the cached answer
    now[0] += 2
    assert kube.serves(TJ) is True and kube.custom.calls[-1] == "trainer.kubeflow.org/v1alpha1"
    assert len(kube.custom.calls) == 3


def test_discovery_errors_other_than_404_are_raised() -> None:
    kube = Kube.__new__(Kube)
    kube.discovery_ttl, kube.clock, kube._served = 30.0, lambda: 0.0, {}

    class Broken:
        def get_api_resources(self, *a: Any, **k: Any):
            raise ApiException(status=503, reason="ServiceUnavailable")

    kube.custom = Broken()
    with pytest.raises(ApiException):
        kube.serves(TJ)
