"""Pure builders: exact manifest fields, and every manifest valid against the real schemas."""

from __future__ import annotations

import copy
import json
import re

import pytest
from test_builders_schemas import validate

from pitlab.api import LeakageEval, PitTraining, parse_resource
from pitlab.operator import builders, naming
from pitlab.operator.config import OperatorConfig

CFG = OperatorConfig(trainer_image="reg.example/pitlab-trainer:1", evaluator_image="reg.example/pitlab-evaluator:1",
                     pvc="pitlab-data", mount_path="/pitlab", data_root="/pitlab/data")
PIT_BODY = {
    "apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining",
    "metadata": {"name": "qwen-2020", "namespace": "research", "uid": "u-1", "generation": 1},
    "spec": {
        "baseModel": {"uri": "models/Qwen3.5-35B-A3B-Base"},
        "corpus": {"uri": "${PITLAB_DATA_ROOT}/news/news.jsonl", "format": "jsonl"},
        "knowledgeCutoff": "2020-12-31", "tokens": 1_000_000_000,
        "training": {"seqLen": 4096, "activationCheckpointing": True},
        "resources": {"nodes": 3, "gpusPerNode": 8, "cpu": "64", "memory": "900Gi", "queueName": "h200",
                      "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
                      "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        "evaluations": [{"name": "qwen-2020-jpx", "spec": {
            "models": [{"name": "base", "trainingRef": {"name": "qwen-2020", "artifact": "base"}},
                       {"name": "pit_2020.v1", "trainingRef": {"name": "qwen-2020"}}],
            "dataset": {"kind": "jpx", "uri": "${PITLAB_DATA_ROOT}/jpx"},
            "protocol": {"trainEnd": "2020-12-31", "testStart": "2021-01-01"}, "resources": {"gpus": 1}}}],
    },
}


@pytest.fixture()
def pit() -> PitTraining:
    return parse_resource(copy.deepcopy(PIT_BODY))


def eval_of(pit: PitTraining, n_models: int | None = None) -> tuple[LeakageEval, dict]:
    child = builders.build_evaluation(pit, pit.spec.evaluations[0], PIT_BODY)
    if n_models:
        child["spec"]["models"] = [{"name": f"m{i}", "uri": f"models/m{i}"} for i in range(n_models)]
    child["metadata"]["uid"] = "u-2"
    return parse_resource({**child, "metadata": {k: child["metadata"][k] for k in ("name", "namespace")}}), child


def test_configmap_holds_the_resolved_spec(pit: PitTraining) -> None:
    cm = builders.build_training_configmap(pit, PIT_BODY)
    assert cm["metadata"]["name"] == "qwen-2020-pit-spec"
    doc = json.loads(cm["data"]["spec.yaml"])
    assert doc["spec"]["training"]["seqLen"] == 4096 and doc["spec"]["training"]["learningRate"] == 1e-5  # defaults
    assert doc["metadata"] == {"name": "qwen-2020", "namespace": "research"} and "status" not in doc
    assert parse_resource(doc) == pit.model_copy(update={"status": None}) or parse_resource(doc).spec == pit.spec
    assert validate(cm) == []


def test_pytorchjob_shape(pit: PitTraining) -> None:
    job = builders.build_pytorchjob(pit, CFG, PIT_BODY)
    assert validate(job) == []
    assert job["metadata"]["name"] == "qwen-2020-train"
    assert job["metadata"]["labels"] == {
        "app.kubernetes.io/name": "pitlab", "app.kubernetes.io/instance": "qwen-2020",
        "app.kubernetes.io/component": "training", "app.kubernetes.io/part-of": "pitlab",
        "app.kubernetes.io/managed-by": "pitlab-operator", "pitlab.io/owner-kind": "pittraining",
        "kueue.x-k8s.io/queue-name": "h200"}
    assert job["metadata"]["ownerReferences"] == [{"apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining",
                                                   "name": "qwen-2020", "uid": "u-1", "controller": True,
                                                   "blockOwnerDeletion": True}]
    spec = job["spec"]
    assert spec["nprocPerNode"] == "8"
    assert spec["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 2}
    reps = spec["pytorchReplicaSpecs"]
    assert (reps["Master"]["replicas"], reps["Worker"]["replicas"]) == (1, 2)
    master, worker = reps["Master"]["template"]["spec"], reps["Worker"]["template"]["spec"]
    main = master["containers"][0]
    assert main["name"] == "pytorch" and main["image"] == "reg.example/pitlab-trainer:1"
    assert main["workingDir"] == "/pitlab"  # relative spec URIs (baseModel.uri: models/...) live on the volume
    assert main["command"] == [
        "torchrun", "--nnodes=3", "--nproc-per-node=8", "--node-rank=$(RANK)", "--master-addr=$(MASTER_ADDR)",
        "--master-port=$(MASTER_PORT)", "-m", "pitlab.cli", "train", "--spec", "/etc/pitlab/spec.yaml",
        "--run-dir", "/pitlab/out/qwen-2020", "--base", "/pitlab/models/Qwen3.5-35B-A3B-Base"]
    assert main["resources"] == {"requests": {"cpu": "64", "memory": "900Gi", "nvidia.com/gpu": "8"},
                                 "limits": {"memory": "900Gi", "nvidia.com/gpu": "8"}}
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "1800" and env["PITLAB_DATA_ROOT"] == "/pitlab/data"
    assert master["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert master["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert {v["name"] for v in master["volumes"]} == {"data", "spec", "dshm"}
    assert master["volumes"][0] == {"name": "data", "persistentVolumeClaim": {"claimName": "pitlab-data"}}
    # progress sidecar on the master only, as a native sidecar
    assert [c["name"] for c in master["initContainers"]] == ["progress"]
    assert master["initContainers"][0]["restartPolicy"] == "Always"
    assert master["initContainers"][0]["command"][-4:] == ["--metrics", "/pitlab/out/qwen-2020/train/metrics.jsonl",
                                                            "--interval", "15"]
    assert "initContainers" not in worker and worker["containers"][0]["command"] == main["command"]
    assert master["securityContext"]["runAsNonRoot"] is True and master["automountServiceAccountToken"] is False


def test_single_node_pytorchjob_has_no_worker_and_no_queue_label(pit: PitTraining) -> None:
    body = copy.deepcopy(PIT_BODY)
    body["spec"]["resources"] = {"nodes": 1, "gpusPerNode": 1}
    job = builders.build_pytorchjob(parse_resource(body), CFG, body)
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"] and job["spec"]["nprocPerNode"] == "1"
    assert naming.KUEUE_QUEUE_KEY not in job["metadata"]["labels"]
    assert validate(job) == []


def test_torchrun_command_parses_as_torchrun_and_pitlab_train() -> None:
    """The built command is what torchrun and the pitlab CLI accept (after the kubelet expands $(VAR))."""
    from torch.distributed.run import get_args_parser

    argv = builders.torchrun_command(2, 8, "/etc/pitlab/spec.yaml", "/pitlab/out/x", "/pitlab/models/b")
    expanded = [a.replace("$(RANK)", "1").replace("$(MASTER_ADDR)", "x-train-master-0")
                .replace("$(MASTER_PORT)", "23456") for a in argv]
    args = get_args_parser().parse_args(expanded[1:])
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("2", "8", 1)
    assert (args.master_addr, args.master_port, args.module) == ("x-train-master-0", 23456, True)
    assert args.training_script == "pitlab.cli"
    assert args.training_script_args == ["train", "--spec", "/etc/pitlab/spec.yaml", "--run-dir", "/pitlab/out/x",
                                         "--base", "/pitlab/models/b"]

    import typer.main

    from pitlab.cli import app
    cmd = typer.main.get_command(app)
    sub = cmd.commands[args.training_script_args[0]]
    params = sub.make_context("train", args.training_script_args[1:]).params
    assert {k: str(v) for k, v in params.items()} == {"spec": "/etc/pitlab/spec.yaml", "run_dir": "/pitlab/out/x",
                                                      "base": "/pitlab/models/b"}


def test_prepare_and_merge_jobs(pit: PitTraining) -> None:
    prep = builders.build_prepare_job(pit, CFG, PIT_BODY)
    merge = builders.build_merge_job(pit, CFG, PIT_BODY)
    assert validate(prep) == [] and validate(merge) == []
    c = prep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["python", "-m", "pitlab.operator.workload", "report-audit", "--audit",
                            "/pitlab/out/qwen-2020/corpus_audit.json", "--", "pitlab", "prepare", "--spec",
                            "/etc/pitlab/spec.yaml", "--run-dir", "/pitlab/out/qwen-2020"]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    m = merge["spec"]["template"]["spec"]
    # a base model on the volume is read where it is (not copied into RUN/base), by the merge and the ranks
    assert m["containers"][0]["command"] == [
        "pitlab", "merge", "--checkpoint", "/pitlab/out/qwen-2020/checkpoint", "--base",
        "/pitlab/models/Qwen3.5-35B-A3B-Base", "--out", "/pitlab/out/qwen-2020/model"]
    train = builders.build_pytorchjob(pit, CFG, PIT_BODY)["spec"]["pytorchReplicaSpecs"]["Master"]
    assert train["template"]["spec"]["containers"][0]["command"][-2:] == [
        "--base", "/pitlab/models/Qwen3.5-35B-A3B-Base"]
    random_init = copy.deepcopy(PIT_BODY)
    random_init["spec"]["baseModel"] = {"randomInit": {"modelType": "llama",
                                                       "config": {"max_position_embeddings": 4096}}}
    assert builders.base_model_dir(parse_resource(random_init), CFG) == "/pitlab/out/qwen-2020/base"
    assert "nvidia.com/gpu" not in json.dumps(m["containers"][0]["resources"])  # no GPUs unless asked
    assert "nodeSelector" not in m and m["restartPolicy"] == "Never"
    assert merge["spec"]["completions"] == 1 and merge["spec"]["backoffLimit"] == 2
    gpu_merge = builders.build_merge_job(pit, OperatorConfig(merge_gpus=1), PIT_BODY)
    assert gpu_merge["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert validate(gpu_merge) == []


def test_evaluation_child_and_its_jobs(pit: PitTraining) -> None:
    le, child = eval_of(pit)
    assert validate(child) == []
    assert child["metadata"]["name"] == "qwen-2020-jpx" and child["spec"]["output"] == {"uri": "out"}
    uris = {"base": "/pitlab/out/qwen-2020/base", "pit_2020.v1": "/pitlab/out/qwen-2020/model"}
    cm = builders.build_eval_configmap(le, uris, child)
    resolved = json.loads(cm["data"]["leakageeval.yaml"])
    assert [m.get("uri") for m in resolved["spec"]["models"]] == list(uris.values())
    assert parse_resource(resolved).spec.models[1].uri == "/pitlab/out/qwen-2020/model"
    jobs = builders.build_embed_jobs(le, CFG, child)
    assert [j["metadata"]["name"] for j in jobs] == ["qwen-2020-jpx-embed-base",
                                                     f"qwen-2020-jpx-embed-pit-2020-v1-{naming.short_hash('pit_2020.v1')}"]
    assert jobs[1]["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "pitlab", "embed", "--spec", "/etc/pitlab/leakageeval.yaml", "--model", "pit_2020.v1",
        "--out", "/pitlab/out/qwen-2020-jpx/eval"]
    assert jobs[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    analyze = builders.build_analyze_job(le, CFG, child)
    assert analyze["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "python", "-m", "pitlab.operator.workload", "report-results", "--results",
        "/pitlab/out/qwen-2020-jpx/eval/results.json", "--report", "/pitlab/out/qwen-2020-jpx/eval/report.md", "--",
        "pitlab", "analyze", "--spec", "/etc/pitlab/leakageeval.yaml", "--out", "/pitlab/out/qwen-2020-jpx/eval"]
    assert "nvidia.com/gpu" not in json.dumps(analyze)
    for m in [cm, *jobs, analyze]:
        assert validate(m) == [], m["metadata"]["name"]
        assert m["metadata"]["ownerReferences"][0]["kind"] == "LeakageEval"


def test_large_panel_embeds_in_one_indexed_job(pit: PitTraining) -> None:
    le, child = eval_of(pit, n_models=10)
    (job,) = builders.build_embed_jobs(le, CFG, child)
    assert job["metadata"]["name"] == "qwen-2020-jpx-embed"
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("Indexed", 10, 4)
    # each model gets the chart's retries (2) on its own; one that exhausts them fails the Job at once; no Job-wide
    # backoffLimit (three flaky models out of ten would otherwise fail the evaluation)
    assert (job["spec"]["backoffLimitPerIndex"], job["spec"]["maxFailedIndexes"]) == (CFG.backoff_limit, 0) == (2, 0)
    assert "backoffLimit" not in job["spec"]
    cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[:6] == ["python", "-m", "pitlab.operator.workload", "embed-index", "--models",
                       ",".join(f"m{i}" for i in range(10))]
    assert cmd[6:] == ["--", "pitlab", "embed", "--spec", "/etc/pitlab/leakageeval.yaml", "--model", "{model}",
                       "--out", "/pitlab/out/qwen-2020-jpx/eval"]
    assert validate(job) == []


@pytest.mark.parametrize("name", ["qwen3.5-pit", "2016.fomc", "9" * 57, ".".join(["a1-" * 20 + "z"] * 4)[:253]])
def test_every_manifest_of_a_dotted_digit_leading_or_long_name_is_valid(name: str) -> None:
    """Any name the API server accepts for a PitTraining (``qwen3.5-pit``, found refused by a new user; a
    253-character dotted name) gives manifests the API server and the training operator accept: Jobs and
    ConfigMaps named by DNS-1123 labels, a DNS-1035 PyTorchJob, an indexed Job whose last pod hostname fits."""
    body = copy.deepcopy(PIT_BODY)
    body["metadata"]["name"] = name
    for m in body["spec"]["evaluations"][0]["spec"]["models"]:
        m["trainingRef"]["name"] = name
    pt = parse_resource(body)
    assert pt.metadata.name == name
    job = builders.build_pytorchjob(pt, CFG, body)
    manifests = [builders.build_training_configmap(pt, body), builders.build_prepare_job(pt, CFG, body), job,
                 builders.build_merge_job(pt, CFG, body)]
    child = builders.build_evaluation(pt, pt.spec.evaluations[0], body)
    child["spec"]["models"] = [{"name": f"m{i}", "uri": f"models/m{i}"} for i in range(64)]
    le = parse_resource({**child, "metadata": {k: child["metadata"][k] for k in ("name", "namespace")}})
    child["metadata"]["uid"] = "u-2"
    (indexed,) = builders.build_embed_jobs(le, CFG, child)
    per_model = builders.build_embed_jobs(le, CFG, child, indexed=False)
    manifests += [child, builders.build_eval_configmap(le, {}, child), indexed, per_model[0], per_model[-1],
                  builders.build_analyze_job(le, CFG, child)]
    for m in manifests:
        assert validate(m) == [], m["metadata"]["name"]
    for m in manifests + per_model:
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", m["metadata"]["name"]), m["metadata"]["name"]
    assert len({m["metadata"]["name"] for m in per_model}) == 64
    assert re.fullmatch(r"[a-z][-a-z0-9]*", job["metadata"]["name"])
    assert len(f"{job['metadata']['name']}-worker-9999") <= 63  # the replicas' pods and Services
    assert indexed["spec"]["completions"] == 64 and len(f"{indexed['metadata']['name']}-63") <= 63
    assert job["metadata"]["labels"]["app.kubernetes.io/instance"] == naming.label_value(name)


def test_spec_digest_is_canonical() -> None:
    assert builders.spec_digest({"a": 1, "b": [1, 2]}) == builders.spec_digest({"b": [1, 2], "a": 1})
    assert builders.spec_digest({"a": 1}) != builders.spec_digest({"a": 2})


def test_storage_secret_and_settings_reach_every_pod(pit: PitTraining) -> None:
    """spec.storage: the Secret as envFrom and endpoint/region/addressing style as AWS_* variables in every
    container of every pod (prepare, both PyTorchJob replicas and the progress sidecar, merge, embed,
    analyze); the evaluation child inherits the parent's storage; s3:// checkpoints reach the merge Job."""
    body = copy.deepcopy(PIT_BODY)
    body["spec"]["storage"] = {"secretName": "minio-creds", "endpointUrl": "http://minio.storage:9000",
                               "region": "eu-central-1", "addressingStyle": "path"}
    body["spec"]["checkpoint"] = {"uri": "s3://pit-ckpt/qwen-2020", "everySteps": 500}
    pt = parse_resource(body)
    want_env = {"AWS_ENDPOINT_URL": "http://minio.storage:9000", "AWS_REGION": "eu-central-1",
                "PITLAB_S3_ADDRESSING_STYLE": "path"}
    job = builders.build_pytorchjob(pt, CFG, body)
    merge = builders.build_merge_job(pt, CFG, body)
    child = builders.build_evaluation(pt, pt.spec.evaluations[0], body)
    assert child["spec"]["storage"] == body["spec"]["storage"]
    le = parse_resource({**child, "metadata": {"name": child["metadata"]["name"], "namespace": "research"}})
    pods = [builders.build_prepare_job(pt, CFG, body)["spec"]["template"]["spec"], merge["spec"]["template"]["spec"],
            *[r["template"]["spec"] for r in job["spec"]["pytorchReplicaSpecs"].values()],
            *[j["spec"]["template"]["spec"] for j in builders.build_embed_jobs(le, CFG, child)],
            builders.build_analyze_job(le, CFG, child)["spec"]["template"]["spec"]]
    containers = [c for p in pods for c in p["containers"] + p.get("initContainers", [])]
    assert len(pods) == 7 and len(containers) == 8  # 3 nodes: Master + Worker templates; the Master's sidecar
    required = {k: {"secretKeyRef": {"name": "minio-creds", "key": k, "optional": False}}
                for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    for c in containers:
        # the Secret and its two credential keys are required, as in a TrainJob's pods (the test below)
        assert c["envFrom"] == [{"secretRef": {"name": "minio-creds", "optional": False}}], c["name"]
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
        assert {k: env[k] for k in want_env} == want_env, c["name"]
        assert {k: env[k] for k in required} == required, c["name"]
    assert merge["spec"]["template"]["spec"]["containers"][0]["command"][:4] == [
        "pitlab", "merge", "--checkpoint", "s3://pit-ckpt/qwen-2020"]
    for obj in (job, merge, child, builders.build_prepare_job(pt, CFG, body)):
        assert validate(obj) == []
    # without spec.storage nothing is added
    plain = builders.build_merge_job(pit, CFG, PIT_BODY)["spec"]["template"]["spec"]["containers"][0]
    assert "envFrom" not in plain and not {e["name"] for e in plain["env"]} & set(want_env)


def _starts(env: list[dict], env_from: list[dict], secrets: dict[str, dict[str, str]]) -> dict[str, str] | str:
    """What the kubelet makes of a container's ``env`` and ``envFrom`` given the namespace's ``secrets`` (name ->
    data): the container's variables, or the CreateContainerConfigError message when it cannot start."""
    out: dict[str, str] = {}
    for src in env_from:
        ref = src["secretRef"]
        if ref["name"] not in secrets:
            if not ref.get("optional", False):
                return f'secret "{ref["name"]}" not found'
            continue
        out.update(secrets[ref["name"]])
    for e in env:
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref is None:
            out[e["name"]] = e["value"]
        elif ref["key"] in secrets.get(ref["name"], {}):
            out[e["name"]] = secrets[ref["name"]][ref["key"]]
        elif not ref.get("optional", False):
            return (f'secret "{ref["name"]}" not found' if ref["name"] not in secrets
                    else f'couldn\'t find key {ref["key"]} in Secret research/{ref["name"]}')
    return out


def test_the_storage_secret_is_required_alike_by_every_kind_of_pod(pit: PitTraining) -> None:
    """spec.storage.secretName: every pod of every kind (prepare, the PyTorchJob's, JobSet's and TrainJob's training
    pods, merge, embed, indexed embed, analyze) refuses to start without the Secret or without its
    AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, and starts with their values when both are there. (A TrainJob used to
    mark every key optional, so its training ran without credentials while every other pod waited for the
    Secret.)"""
    from pitlab.operator import jobset_builders

    body = copy.deepcopy(PIT_BODY)
    body["spec"]["storage"] = {"secretName": "s3-creds", "endpointUrl": "http://minio:9000"}
    pt = parse_resource(body)
    child = builders.build_evaluation(pt, pt.spec.evaluations[0], body)
    le = parse_resource({**child, "metadata": {"name": child["metadata"]["name"], "namespace": "research"}})
    child["metadata"]["uid"] = "u-2"
    pytorchjob = builders.build_pytorchjob(pt, CFG, body)
    jobset = jobset_builders.build_jobset(pt, CFG, body)
    trainjob = jobset_builders.build_trainjob(pt, CFG, body)
    jobs = [builders.build_prepare_job(pt, CFG, body), builders.build_merge_job(pt, CFG, body),
            *builders.build_embed_jobs(le, CFG, child, indexed=False),
            *builders.build_embed_jobs(le, CFG, child, indexed=True), builders.build_analyze_job(le, CFG, child)]
    pods = {j["metadata"]["name"]: j["spec"]["template"]["spec"] for j in jobs}
    pods |= {f"pytorchjob/{r}": t["template"]["spec"] for r, t in pytorchjob["spec"]["pytorchReplicaSpecs"].items()}
    pods["jobset/node"] = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    containers = {f"{pod}/{c['name']}": (c["env"], c.get("envFrom", []))
                  for pod, spec in pods.items() for c in spec["containers"] + spec.get("initContainers", [])}
    containers["trainjob/node"] = (trainjob["spec"]["trainer"]["env"], [])  # a TrainJob has no envFrom
    assert len(containers) == 12, sorted(containers)
    for obj in (pytorchjob, jobset, trainjob, *jobs):
        assert validate(obj) == [], obj["metadata"]["name"]

    creds = {"AWS_ACCESS_KEY_ID": "AKIA-TEST", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    for where, (env, env_from) in containers.items():
        assert _starts(env, env_from, {}) == 'secret "s3-creds" not found', where
        assert _starts(env, env_from, {"s3-creds": {"AWS_ACCESS_KEY_ID": "AKIA-TEST"}}) == \
            "couldn't find key AWS_SECRET_ACCESS_KEY in Secret research/s3-creds", where
        started = _starts(env, env_from, {"s3-creds": {**creds, "AWS_SESSION_TOKEN": "tok"}})
        assert isinstance(started, dict), (where, started)
        assert {k: started.get(k) for k in (*creds, "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL")} == {
            **creds, "AWS_SESSION_TOKEN": "tok", "AWS_ENDPOINT_URL": "http://minio:9000"}, where
    # no secret reference anywhere is optional except the TrainJob's optional keys (a Secret may lack them)
    optional = {e["name"] for e in trainjob["spec"]["trainer"]["env"]
                if e.get("valueFrom", {}).get("secretKeyRef", {}).get("optional")}
    assert optional == {"AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION"}  # AWS_ENDPOINT_URL: spec's value
    for where, (env, env_from) in containers.items():
        refs = [src["secretRef"] for src in env_from] + [e["valueFrom"]["secretKeyRef"] for e in env
                                                         if "secretKeyRef" in e.get("valueFrom", {})]
        assert all(r["optional"] is False for r in refs if r.get("key") not in optional), where


def test_evaluation_children_of_two_trainings_do_not_collide(pit: PitTraining) -> None:
    names = []
    for parent in ("qwen-2020", "qwen-2021"):
        body = copy.deepcopy(PIT_BODY)
        body["metadata"]["name"] = parent
        body["spec"]["evaluations"][0]["name"] = "jpx"
        for m in body["spec"]["evaluations"][0]["spec"]["models"]:
            m["trainingRef"]["name"] = parent
        pt = parse_resource(body)
        child = builders.build_evaluation(pt, pt.spec.evaluations[0], body)
        assert child["metadata"]["ownerReferences"][0]["name"] == parent
        names.append(child["metadata"]["name"])
    assert names == ["qwen-2020-jpx", "qwen-2021-jpx"]


# ---------------------------------------------------------------- scheduling: nodeSelector, tolerations, Kueue
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _example(path: str) -> dict:
    import yaml

    with open(path) as f:
        doc = yaml.safe_load(f)
    doc["metadata"].update(namespace="research", uid="u-ex")
    return doc


def _child_and_jobs(pt_body: dict, cfg: OperatorConfig = CFG, index: int = 0) -> tuple[dict, list[dict], dict]:
    """The evaluation child ``index`` of a PitTraining body, its embed Jobs and its analyze Job. The child is
    built as the operator builds it, from the spec stored in the run's ConfigMap (read back, every default filled
    in), and must equal the one built from the body itself."""
    from pitlab.operator.lifecycle import _stored_spec

    pt = parse_resource(copy.deepcopy(pt_body))
    direct = builders.build_evaluation(pt, pt.spec.evaluations[index], pt_body)
    cm = builders.build_training_configmap(pt, pt_body)
    stored = PitTraining.model_validate(_stored_spec(cm, "spec.yaml"))
    child = builders.build_evaluation(stored, stored.spec.evaluations[index], pt_body)
    assert child == direct
    assert validate(child) == []
    le = parse_resource({**child, "metadata": {k: child["metadata"][k] for k in ("name", "namespace")}})
    child["metadata"]["uid"] = "u-2"
    child["metadata"]["uid"] = "u-child"
    return child, builders.build_embed_jobs(le, cfg, child), builders.build_analyze_job(le, cfg, child)


def _placement(job: dict) -> tuple:
    pod = job["spec"]["template"]["spec"]
    return (pod.get("nodeSelector"), pod.get("tolerations"), job["metadata"]["labels"].get(naming.KUEUE_QUEUE_KEY))


def _assert_queue_label_on_job_only(job: dict) -> None:
    assert naming.KUEUE_QUEUE_KEY not in job["spec"]["template"]["metadata"]["labels"]
    assert "suspend" not in job["spec"]  # Kueue's webhook suspends a queued Job, as for the PyTorchJob


def test_evaluation_of_the_cluster_example_inherits_the_trainings_placement() -> None:
    """examples/pittraining.yaml: its evaluation's GPU embed Jobs tolerate the GPU taint, select the GPU nodes
    and (with queueName) are queued in Kueue; the CPU analyze Job gets none of it."""
    body = _example("examples/pittraining.yaml")
    body["spec"]["resources"]["queueName"] = "gpu-queue"  # commented out in the example
    child, jobs, analyze = _child_and_jobs(body)
    assert child["spec"]["resources"] == {
        "gpus": 1, "cpu": "8", "memory": "200Gi", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
        "tolerations": [GPU_TOLERATION], "queueName": "gpu-queue"}
    assert [j["metadata"]["name"] for j in jobs] == ["qwen35-a3b-pit-2020-jpx-embed-base",
                                                     "qwen35-a3b-pit-2020-jpx-embed-pit-2020"]
    for job in jobs:
        assert _placement(job) == ({"nvidia.com/gpu.product": "NVIDIA-H200"}, [GPU_TOLERATION], "gpu-queue")
        _assert_queue_label_on_job_only(job)
        assert validate(job) == []
    assert _placement(analyze) == (None, None, None)
    assert validate(analyze) == []
    # the example as written (no queueName): placement without a queue label
    _, jobs, _ = _child_and_jobs(_example("examples/pittraining.yaml"))
    assert [_placement(j) for j in jobs] == [({"nvidia.com/gpu.product": "NVIDIA-H200"}, [GPU_TOLERATION], None)] * 2


def test_evaluation_template_placement_overrides_the_trainings() -> None:
    body = _example("examples/pittraining.yaml")
    body["spec"]["resources"]["queueName"] = "gpu-queue"
    res = body["spec"]["evaluations"][0]["spec"]["resources"]
    res.update(nodeSelector={"pool": "eval-l40s"}, tolerations=[{"key": "eval", "operator": "Equal",
                                                                 "value": "yes", "effect": "NoExecute"}],
               queueName="eval-queue")
    _, jobs, analyze = _child_and_jobs(body)
    for job in jobs:
        assert _placement(job) == ({"pool": "eval-l40s"},
                                   [{"key": "eval", "operator": "Equal", "value": "yes", "effect": "NoExecute"}],
                                   "eval-queue")
        assert validate(job) == []
    assert _placement(analyze) == (None, None, None)
    # per field: an explicit empty value opts out, an unset field is still inherited
    res.clear()
    res.update(gpus=1, tolerations=[], nodeSelector={})
    child, jobs, _ = _child_and_jobs(body)
    assert child["spec"]["resources"]["queueName"] == "gpu-queue"
    assert [_placement(j) for j in jobs] == [(None, None, "gpu-queue")] * 2
    # a CPU-only evaluation inherits nothing: the training's placement describes its GPU nodes and quota
    res.clear()
    res.update(gpus=0)
    child, jobs, _ = _child_and_jobs(body)
    assert child["spec"]["resources"] == {"gpus": 0, "nodeSelector": {}, "tolerations": []}
    assert [_placement(j) for j in jobs] == [(None, None, None)] * 2


@pytest.mark.parametrize("indexed", [False, True])
def test_standalone_leakageeval_placement_reaches_its_embed_jobs(indexed: bool) -> None:
    body = _example("examples/leakageeval.yaml")
    body["spec"]["resources"]["queueName"] = "gpu-queue"
    le = parse_resource(copy.deepcopy(body))
    assert validate(body) == []
    jobs = builders.build_embed_jobs(le, CFG, body, indexed=indexed)
    assert len(jobs) == (1 if indexed else 3)
    for job in jobs:
        assert _placement(job) == ({"nvidia.com/gpu.present": "true"}, [GPU_TOLERATION], "gpu-queue")
        _assert_queue_label_on_job_only(job)
        assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert validate(job) == []
    analyze = builders.build_analyze_job(le, CFG, body)
    assert _placement(analyze) == (None, None, None) and validate(analyze) == []
    # without the fields: no nodeSelector, tolerations or queue label
    for key in ("nodeSelector", "tolerations", "queueName"):
        body["spec"]["resources"].pop(key)
    plain = builders.build_embed_jobs(parse_resource(body), CFG, body, indexed=indexed)
    assert {_placement(j) for j in plain} == {(None, None, None)}


def test_gpu_merge_is_queued_and_placed_like_the_training(pit: PitTraining) -> None:
    cpu = builders.build_merge_job(pit, CFG, PIT_BODY)
    gpu = builders.build_merge_job(pit, OperatorConfig(merge_gpus=1), PIT_BODY)
    assert _placement(cpu) == (None, None, None)
    assert _placement(gpu) == ({"nvidia.com/gpu.product": "NVIDIA-H200"}, [GPU_TOLERATION], "h200")
    _assert_queue_label_on_job_only(gpu)
    assert validate(gpu) == []


def test_every_pod_skips_the_recursive_chown_of_the_shared_volume(pit: PitTraining) -> None:
    """fsGroup with fsGroupChangePolicy OnRootMismatch: no recursive chown of a multi-TB volume per pod."""
    le, child = eval_of(pit)
    job = builders.build_pytorchjob(pit, CFG, PIT_BODY)
    pods = [builders.build_prepare_job(pit, CFG, PIT_BODY)["spec"]["template"]["spec"],
            builders.build_merge_job(pit, CFG, PIT_BODY)["spec"]["template"]["spec"],
            *[r["template"]["spec"] for r in job["spec"]["pytorchReplicaSpecs"].values()],
            *[j["spec"]["template"]["spec"] for j in builders.build_embed_jobs(le, CFG, child)],
            builders.build_analyze_job(le, CFG, child)["spec"]["template"]["spec"]]
    for pod in pods:
        sc = pod["securityContext"]
        assert (sc["fsGroup"], sc["fsGroupChangePolicy"]) == (1000, "OnRootMismatch")


def test_every_container_keeps_compiled_kernels_on_the_shared_volume(pit: PitTraining) -> None:
    """TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR under ``kernel_cache`` on the mount, in every container of
    every pod (PyTorchJob, JobSet, TrainJob, prepare, merge, embed, analyze); ``none`` leaves both unset."""
    import dataclasses

    from pitlab.operator import jobset_builders

    le, child = eval_of(pit)
    want = {"TRITON_CACHE_DIR": "/pitlab/.cache/kernels/triton",
            "TORCHINDUCTOR_CACHE_DIR": "/pitlab/.cache/kernels/inductor"}
    cfg_off = dataclasses.replace(CFG, kernel_cache="none")
    for cfg, expected in ((CFG, want), (cfg_off, {})):
        job = builders.build_pytorchjob(pit, cfg, PIT_BODY)
        js = jobset_builders.build_jobset(pit, cfg, PIT_BODY)
        pods = [builders.build_prepare_job(pit, cfg, PIT_BODY)["spec"]["template"]["spec"],
                builders.build_merge_job(pit, cfg, PIT_BODY)["spec"]["template"]["spec"],
                *[r["template"]["spec"] for r in job["spec"]["pytorchReplicaSpecs"].values()],
                js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"],
                *[j["spec"]["template"]["spec"] for j in builders.build_embed_jobs(le, cfg, child)],
                builders.build_analyze_job(le, cfg, child)["spec"]["template"]["spec"]]
        envs = [{e["name"]: e["value"] for e in c["env"]}
                for p in pods for c in p["containers"] + p.get("initContainers", [])]
        trainer = jobset_builders.build_trainjob(pit, cfg, PIT_BODY)["spec"]["trainer"]
        envs.append({e["name"]: e["value"] for e in trainer["env"]})
        assert len(envs) >= 9
        for env in envs:
            assert {k: v for k, v in env.items() if k in want} == expected
    absolute = dataclasses.replace(CFG, kernel_cache="/scratch/k").kernel_cache_env()
    assert absolute["TRITON_CACHE_DIR"] == "/scratch/k/triton"


@pytest.mark.parametrize("indexed", [False, True])
def test_every_batch_job_fails_at_once_on_bad_input(pit: PitTraining, indexed: bool) -> None:
    """Found in a platform engineer's trial: a prepare, merge, embedding or analyze Job whose stage refused its
    input (exit 2: a missing S3 object, a file it cannot read) ran three times (backoffLimit 2) before failing."""
    body = copy.deepcopy(PIT_BODY)
    pt = parse_resource(body)
    child = builders.build_evaluation(pt, pt.spec.evaluations[0], body)
    le = parse_resource({**child, "metadata": {"name": child["metadata"]["name"], "namespace": "research"}})
    child["metadata"]["uid"] = "u-2"
    jobs = [builders.build_prepare_job(pt, CFG, body), builders.build_merge_job(pt, CFG, body),
            *builders.build_embed_jobs(le, CFG, child, indexed=indexed), builders.build_analyze_job(le, CFG, child)]
    assert len(jobs) == (4 if indexed else 5)
    for job in jobs:
        spec = job["spec"]
        main = spec["template"]["spec"]["containers"][0]["name"]
        assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it
        assert spec["podFailurePolicy"]["rules"] == [
            {"action": "FailJob", "onExitCodes": {"containerName": main, "operator": "In", "values": [2]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
        retries = spec["backoffLimitPerIndex"] if spec.get("completionMode") == "Indexed" else spec["backoffLimit"]
        assert retries == CFG.backoff_limit and validate(job) == [], job["metadata"]["name"]
    assert [j["spec"]["template"]["spec"]["containers"][0]["name"] for j in jobs][:2] == ["prepare", "merge"]


def test_an_embedding_job_without_cpu_or_memory_gets_the_operators_defaults(pit: PitTraining) -> None:
    """Found in a platform engineer's trial: an evaluation that set no resources ran its embedding pods
    BestEffort (no requests: placed anywhere, evicted first)."""
    body = copy.deepcopy(PIT_BODY)
    body["spec"]["evaluations"][0]["spec"]["resources"] = {"gpus": 1}
    pt = parse_resource(body)
    child = builders.build_evaluation(pt, pt.spec.evaluations[0], body)
    le = parse_resource({**child, "metadata": {"name": child["metadata"]["name"], "namespace": "research"}})
    res = lambda cfg: [j["spec"]["template"]["spec"]["containers"][0]["resources"]  # noqa: E731
                       for j in builders.build_embed_jobs(le, cfg, child)]
    got = res(CFG)
    assert got and all(r == {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
                             "limits": {"memory": "64Gi", "nvidia.com/gpu": "1"}} for r in got)
    cfg = OperatorConfig.from_env({"PITLAB_EMBED_CPU": "16", "PITLAB_EMBED_MEMORY": "200Gi"})  # the chart's values
    assert all(r["requests"]["cpu"] == "16" and r["limits"]["memory"] == "200Gi" for r in res(cfg))
    # the LeakageEval's own values win
    le.spec.resources.cpu, le.spec.resources.memory = "2", "8Gi"
    assert all(r["requests"] == {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"} for r in res(cfg))
