"""The chart's imagePullSecrets reach every pod the operator creates (prepare, the training pods of each backend,
merge, embed, analyze), not only the operator's own: with the images in a private registry, a workload pod without
them stays in ImagePullBackOff. Each manifest stays valid against its schema, which checks the new field."""

from __future__ import annotations

import copy
import dataclasses
import subprocess

import pytest
from test_backends import _trainjob_on_runtime
from test_builders import PIT_BODY
from test_builders_schemas import validate
from test_chart import CHART, helm, of_kind, render

from pitlab.api import parse_resource
from pitlab.operator import builders, jobset_builders
from pitlab.operator.config import OperatorConfig

SECRETS = [{"name": "regcred"}, {"name": "mirror.example-creds"}]
SET_SECRETS = ("--set", "imagePullSecrets[0].name=regcred", "--set", "imagePullSecrets[1].name=mirror.example-creds")


def _config(*args: str) -> tuple[OperatorConfig, dict]:
    """The operator's settings as the chart's Deployment gives them, and the rendered objects."""
    objs = render("--set", "trainingBackend=trainjob", *args)
    (dep,) = of_kind(objs, "Deployment")
    env = {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    return OperatorConfig.from_env(env), objs


def _manifests(cfg: OperatorConfig) -> dict[str, tuple[dict, list[dict]]]:
    """Every workload manifest the operator builds, by kind, with the pod specs in it (the TrainJob's: its
    runtime patch's pod)."""
    pt = parse_resource(copy.deepcopy(PIT_BODY))
    child = builders.build_evaluation(pt, pt.spec.evaluations[0], PIT_BODY)
    le = parse_resource({**child, "metadata": {"name": child["metadata"]["name"], "namespace": "research"}})
    child["metadata"]["uid"] = "u-2"
    out: dict[str, tuple[dict, list[dict]]] = {}
    for name, job in (("prepare", builders.build_prepare_job(pt, cfg, PIT_BODY)),
                      ("merge", builders.build_merge_job(pt, cfg, PIT_BODY)),
                      ("merge-gpu", builders.build_merge_job(pt, dataclasses.replace(cfg, merge_gpus=1), PIT_BODY)),
                      ("embed", builders.build_embed_jobs(le, cfg, child, indexed=False)[0]),
                      ("embed-indexed", builders.build_embed_jobs(le, cfg, child, indexed=True)[0]),
                      ("analyze", builders.build_analyze_job(le, cfg, child))):
        out[name] = (job, [job["spec"]["template"]["spec"]])
    ptj = builders.build_pytorchjob(pt, cfg, PIT_BODY)
    out["pytorchjob"] = (ptj, [r["template"]["spec"] for r in ptj["spec"]["pytorchReplicaSpecs"].values()])
    js = jobset_builders.build_jobset(pt, cfg, PIT_BODY)
    out["jobset"] = (js, [r["template"]["spec"]["template"]["spec"] for r in js["spec"]["replicatedJobs"]])
    tj = jobset_builders.build_trainjob(pt, cfg, PIT_BODY)
    (patch,) = tj["spec"]["runtimePatches"]
    out["trainjob"] = (tj, [r["template"]["spec"]["template"]["spec"]
                            for r in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]])
    return out


def test_the_charts_pull_secrets_reach_the_operator_config() -> None:
    cfg, objs = _config(*SET_SECRETS)
    assert cfg.image_pull_secrets == ("regcred", "mirror.example-creds")
    (dep,) = of_kind(objs, "Deployment")
    assert dep["spec"]["template"]["spec"]["imagePullSecrets"] == SECRETS  # the operator's own pod, as before
    plain, objs = _config()
    assert plain.image_pull_secrets == () and "imagePullSecrets" not in of_kind(objs, "Deployment")[0]["spec"][
        "template"]["spec"]


def test_every_workload_pod_lists_the_pull_secrets_and_validates() -> None:
    cfg, _ = _config(*SET_SECRETS)
    manifests = _manifests(cfg)
    assert sorted(manifests) == ["analyze", "embed", "embed-indexed", "jobset", "merge", "merge-gpu", "prepare",
                                 "pytorchjob", "trainjob"]
    for kind, (obj, pods) in manifests.items():
        assert len(pods) == (2 if kind == "pytorchjob" else 1), kind  # the PyTorchJob: Master and Worker
        for pod in pods:
            assert pod["imagePullSecrets"] == SECRETS, kind
        assert validate(obj) == [], kind
        # the schema checks the field: a list of names instead of references is refused
        bad = copy.deepcopy(obj)
        for pod in _manifests_pods(bad, kind):
            pod["imagePullSecrets"] = ["regcred"]
        assert validate(bad) != [], kind
    # without pull secrets the pods carry no imagePullSecrets field
    for kind, (obj, pods) in _manifests(OperatorConfig()).items():
        assert all("imagePullSecrets" not in p for p in pods), kind


def _manifests_pods(obj: dict, kind: str) -> list[dict]:
    """The pod specs inside ``obj`` (of ``kind`` as in :func:`_manifests`), as references into it."""
    if kind == "pytorchjob":
        return [r["template"]["spec"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    if kind == "jobset":
        return [r["template"]["spec"]["template"]["spec"] for r in obj["spec"]["replicatedJobs"]]
    if kind == "trainjob":
        return [r["template"]["spec"]["template"]["spec"] for p in obj["spec"]["runtimePatches"]
                for r in p["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]
    return [obj["spec"]["template"]["spec"]]


def test_a_trainjob_on_the_charts_runtime_pulls_with_the_secrets() -> None:
    """The runtime is cluster-wide and knows no namespace's Secrets: the TrainJob's patch brings them, and the Job
    Kubeflow Trainer makes of the two lists them like the JobSet backend's."""
    cfg, objs = _config(*SET_SECRETS)
    (runtime,) = of_kind(objs, "ClusterTrainingRuntime")
    assert runtime["metadata"]["name"] == cfg.training_runtime
    pt = parse_resource(copy.deepcopy(PIT_BODY))
    job = _trainjob_on_runtime(runtime, jobset_builders.build_trainjob(pt, cfg, PIT_BODY))
    assert job["template"]["spec"]["imagePullSecrets"] == SECRETS
    assert validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": job}) == []
    js = jobset_builders.build_jobset(pt, cfg, PIT_BODY)
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["imagePullSecrets"] == SECRETS


def test_pull_secret_names_are_parsed_and_checked() -> None:
    assert OperatorConfig.from_env({"PITLAB_IMAGE_PULL_SECRETS": " regcred , ,other"}).image_pull_secrets == (
        "regcred", "other")
    assert OperatorConfig.from_env({"PITLAB_IMAGE_PULL_SECRETS": ""}).image_pull_secrets == ()
    assert OperatorConfig(image_pull_secrets="regcred").pull_secrets() == [{"name": "regcred"}]
    with pytest.raises(ValueError, match=r"PITLAB_IMAGE_PULL_SECRETS \(chart value imagePullSecrets\): 'Reg_Cred'"):
        OperatorConfig.from_env({"PITLAB_IMAGE_PULL_SECRETS": "regcred,Reg_Cred"})
    out = subprocess.run([helm(), "template", "pitlab", str(CHART), "--set", "imagePullSecrets[0].name=Reg_Cred"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "at '/imagePullSecrets/0/name'" in out.stderr, out.stderr


def test_the_workload_service_account_reaches_every_workload_pod_and_validates() -> None:
    """For IRSA / Workload Identity the pods must run as a ServiceAccount bound to a cloud role; before, they ran as
    the namespace's default account, so s3:// worked only with a storage Secret of static keys."""
    cfg, objs = _config("--set", "workloads.serviceAccountName=pitlab-runs")
    assert cfg.workload_service_account == "pitlab-runs"
    (dep,) = of_kind(objs, "Deployment")
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] != "pitlab-runs"  # the operator keeps its own
    for kind, (obj, pods) in _manifests(cfg).items():
        for pod in pods:
            assert pod["serviceAccountName"] == "pitlab-runs", kind
            assert pod.get("automountServiceAccountToken", False) is False, kind  # still no API token mounted
        assert validate(obj) == [], kind
    (runtime,) = of_kind(objs, "ClusterTrainingRuntime")
    pt = parse_resource(copy.deepcopy(PIT_BODY))
    job = _trainjob_on_runtime(runtime, jobset_builders.build_trainjob(pt, cfg, PIT_BODY))
    assert job["template"]["spec"]["serviceAccountName"] == "pitlab-runs"  # what Kubeflow Trainer's Job gets
    for kind, (obj, pods) in _manifests(_config()[0]).items():  # unset: the namespace's default, as before
        assert all("serviceAccountName" not in p for p in pods), kind
    with pytest.raises(ValueError, match=r"PITLAB_WORKLOAD_SERVICE_ACCOUNT \(chart value "
                                         r"workloads.serviceAccountName\): 'Runs_SA' is not a ServiceAccount name"):
        OperatorConfig.from_env({"PITLAB_WORKLOAD_SERVICE_ACCOUNT": "Runs_SA"})
    out = subprocess.run([helm(), "template", "pitlab", str(CHART), "--set", "workloads.serviceAccountName=Runs_SA"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "at '/workloads/serviceAccountName'" in out.stderr, out.stderr
