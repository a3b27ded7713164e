"""Pods that cannot start (image pull back-off, a missing Secret, a crash loop): named in the running stage's
condition message and posted as a Warning event, the stage keeping its reason and phase; normal start-up says
nothing (docs/kubernetes.md, "Pods that cannot start")."""

from __future__ import annotations

import copy
import json

import pytest

from pitlab.operator import lifecycle
from pitlab.operator.mirroring import StuckPod, stuck_pod
from test_operator_lifecycle import AUDIT, BODY, CFG, NOW, FakeWorld, conds, finish, message, step

JOB_NAME = "batch.kubernetes.io/job-name"
PULL = 'Back-off pulling image "registry.example/pitlab-trainer:t"'
SECRET = 'secret "s3-credentials" not found'
CRASH = "back-off 40s restarting failed container=embed pod=e-embed-pit-q7w8e_ns(uid-9)"


def waiting(reason: str, message: str = "") -> dict:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def pod(name: str, labels: dict, container: str, state: dict, phase: str = "Pending", init: dict | None = None,
        last: dict | None = None) -> dict:
    """A pod as the API server returns it: ``container`` in ``state``; ``init``: the progress sidecar's state."""
    cs = {"name": container, "state": state, "ready": "running" in state, "restartCount": 3 if last else 0,
          **({"lastState": {"terminated": last}} if last else {})}
    status = {"phase": phase, "containerStatuses": [cs]}
    if init is not None:
        status["initContainerStatuses"] = [{"name": "progress", "state": init, "restartCount": 0}]
    return {"metadata": {"name": name, "labels": labels, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": status}


RUNNING = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
# a container starting normally, or running: nothing to say
NORMAL = [RUNNING, waiting("ContainerCreating"), waiting("PodInitializing")]


# ------------------------------------------------------------------------------------------ the pure function
@pytest.mark.parametrize("reason", ["ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                                    "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff"])
def test_each_start_failure_is_found(reason) -> None:
    pods = [pod("j-b", {JOB_NAME: "j"}, "main", waiting(reason, "why")), pod("j-a", {JOB_NAME: "j"}, "main", RUNNING)]
    assert stuck_pod(pods) == StuckPod("j-b", "main", reason, "why")
    assert stuck_pod(pods).text == f"pod j-b: container main waiting: {reason}: why"


@pytest.mark.parametrize("state", NORMAL + [{"terminated": {"exitCode": 0}}, {}])
def test_normal_start_up_running_or_finished_is_not_stuck(state) -> None:
    assert stuck_pod([pod("j-a", {JOB_NAME: "j"}, "main", state, init=waiting("PodInitializing"))]) is None
    assert stuck_pod([{"metadata": {"name": "j-a"}}]) is None  # no status yet


def test_the_first_stuck_pod_by_name_of_the_job_asked_for() -> None:
    pods = [pod("k-a", {JOB_NAME: "k"}, "main", waiting("ErrImagePull")),
            pod("j-c", {JOB_NAME: "j"}, "main", waiting("CrashLoopBackOff")),
            pod("j-b", {"job-name": "j"}, "main", waiting("ImagePullBackOff"))]
    assert stuck_pod(pods, "j").pod == "j-b" and stuck_pod(pods).pod == "j-b"
    assert stuck_pod(pods, "other") is None


def test_pods_being_deleted_or_finished_are_skipped() -> None:
    gone = pod("j-a", {JOB_NAME: "j"}, "main", waiting("ImagePullBackOff"))
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    failed = pod("j-b", {JOB_NAME: "j"}, "main", waiting("ImagePullBackOff"), phase="Failed")
    assert stuck_pod([gone, failed]) is None


def test_an_init_container_is_looked_at_first_and_said_so() -> None:
    p = pod("j-a", {JOB_NAME: "j"}, "main", waiting("PodInitializing"), init=waiting("ImagePullBackOff", PULL))
    assert stuck_pod([p]).text == f"pod j-a: init container progress waiting: ImagePullBackOff: {PULL}"


def test_the_kubelets_message_is_cut_and_a_crash_says_how_it_ended() -> None:
    long = "x" * 290 + " line\nbreak " + "y" * 50
    p = pod("j-a", {JOB_NAME: "j"}, "main", waiting("CrashLoopBackOff", long),
            last={"exitCode": 137, "reason": "OOMKilled"})
    text = stuck_pod([p]).text
    kept = ("x" * 290 + " line break " + "y" * 50)[:297] + "..."
    assert text == (f"pod j-a: container main waiting: CrashLoopBackOff: {kept} (last terminated: OOMKilled, "
                    "exit code 137)")
    assert stuck_pod([pod("j-a", {}, "main", waiting("CreateContainerError"))]).text == \
        "pod j-a: container main waiting: CreateContainerError"


def test_the_back_off_delay_is_left_out_so_the_message_stays_the_same() -> None:
    texts = {stuck_pod([pod("j-a", {}, "main", waiting("CrashLoopBackOff", f"back-off {d} restarting failed "
                                                         "container=main pod=j-a_ns(uid)"))]).text
             for d in ("10s", "40s", "1m20s", "5m0s")}
    assert texts == {"pod j-a: container main waiting: CrashLoopBackOff: back-off restarting failed container=main "
                     "pod=j-a_ns(uid)"}


def test_a_pod_no_node_can_take_is_named_with_the_schedulers_message() -> None:
    """Unscheduled (PodScheduled False, reason Unschedulable), e.g. no node with free GPUs; a pod waiting for
    the scheduler's first pass (no condition yet) or scheduled is not stuck."""
    why = "0/8 nodes are available: 8 Insufficient nvidia.com/gpu. preemption: 0/8 nodes are available."
    p = {"metadata": {"name": "t-train-node-0-0-abcde", "labels": {JOB_NAME: "t-train-node-0"}},
         "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                        "reason": "Unschedulable", "message": why}]}}
    assert stuck_pod([p]).text == f"pod t-train-node-0-0-abcde: not scheduled: Unschedulable: {why}"
    fresh = copy.deepcopy(p)
    fresh["status"] = {"phase": "Pending"}
    scheduled = copy.deepcopy(p)
    scheduled["status"]["conditions"][0].update(status="True", reason="", message="")
    assert stuck_pod([fresh]) is None and stuck_pod([scheduled]) is None


# ------------------------------------------------------------------------------------------ training
def to_training(backend: str, start: dict = BODY) -> tuple[FakeWorld, dict]:
    """PitTraining ``start`` on ``backend`` (its kind served alone) in phase Training, its child created."""
    resource = {"trainjob": lifecycle.TRAINJOBS, "jobset": lifecycle.JOBSETS, "pytorchjob": lifecycle.PYTORCHJOBS}
    w = FakeWorld(served=(resource[backend],))
    body, _ = step(w, copy.deepcopy(start))
    finish(w, lifecycle.JOBS, "t-prepare", container="prepare", msg=json.dumps(AUDIT))
    body, plan = step(w, body)
    assert [m["metadata"]["name"] for m in plan.creates] == ["t-train"]
    return w, body


CHILD_RUNNING = {  # (resource, running status, the Trained message's state, the training container)
    "trainjob": (lifecycle.TRAINJOBS, {"jobsStatus": [{"name": "node", "active": 1, "ready": 0}]},
                 "TrainJob t-train: Running: 1 Job(s) active, 0 ready", "node"),
    "jobset": (lifecycle.JOBSETS, {"replicatedJobsStatus": [{"name": "node", "active": 1, "ready": 0}]},
               "JobSet t-train: Running: 1 Job(s) active, 0 ready", "node"),
    "pytorchjob": (lifecycle.PYTORCHJOBS, {"conditions": [{"type": "Running", "status": "True",
                                                           "reason": "PyTorchJobRunning",
                                                           "message": "PyTorchJob t-train is running."}]},
                   "PyTorchJob t-train: PyTorchJobRunning: PyTorchJob t-train is running.", "pytorch"),
}


def training_pods(backend: str, state: dict, init: dict | None = None) -> tuple[str, list[dict]]:
    """The training child's pods: rank 0 running (its progress sidecar at step 3 of 30) and rank 1 in ``state``;
    returns the name of rank 1's pod and the pods."""
    if backend == "pytorchjob":
        labels = {"training.kubeflow.org/job-name": "t-train", "training.kubeflow.org/replica-type": "master"}
        first, second = "t-train-master-0", "t-train-worker-0"
        second_labels = {**labels, "training.kubeflow.org/replica-type": "worker"}
    else:
        labels = {JOB_NAME: "t-train-node-0", "batch.kubernetes.io/job-completion-index": "0"}
        first, second = "t-train-node-0-0-abcde", "t-train-node-0-1-fghij"
        second_labels = {**labels, "batch.kubernetes.io/job-completion-index": "1"}
    c = CHILD_RUNNING[backend][3]
    return second, [pod(first, labels, c, RUNNING, phase="Running"), pod(second, second_labels, c, state, init=init)]


def run_training(backend: str, state: dict, init: dict | None = None) -> tuple[dict, lifecycle.Plan, str]:
    w, body = to_training(backend)
    resource, status, _, _ = CHILD_RUNNING[backend]
    w.objects[(resource, "t-train")]["status"] = status
    name, pods = training_pods(backend, state, init)
    w.pods += pods
    w.logs[(pods[0]["metadata"]["name"], "progress")] = 'PITLAB_PROGRESS {"step": 3, "totalSteps": 30}\n'
    body, plan = step(w, body)
    return body, plan, name


@pytest.mark.parametrize("backend", ["trainjob", "jobset", "pytorchjob"])
def test_a_training_pod_in_image_pull_back_off_is_named_in_trained(backend) -> None:
    body, plan, name = run_training(backend, waiting("ImagePullBackOff", PULL))
    _, _, state, c = CHILD_RUNNING[backend]
    stuck = f"pod {name}: container {c} waiting: ImagePullBackOff: {PULL}"
    assert message(body, "Trained") == f"{state} (step 3/30); {stuck}"
    assert conds(body)[2:] == [("Trained", "False", "Training"), ("Ready", "False", "Training"),
                               ("Reconciling", "True", "Training"), ("Stalled", "False", "Training")]
    assert body["status"]["phase"] == "Training" and message(body, "Ready") == message(body, "Trained")
    kind = state.split(":")[0]
    assert plan.warnings == [("ImagePullBackOff", f"{kind}: {stuck}")]


@pytest.mark.parametrize("backend", ["trainjob", "jobset", "pytorchjob"])
@pytest.mark.parametrize("state", NORMAL, ids=["running", "ContainerCreating", "PodInitializing"])
def test_a_training_pod_starting_normally_changes_nothing(backend, state) -> None:
    body, plan, _ = run_training(backend, state, init=waiting("PodInitializing") if "waiting" in state else None)
    assert message(body, "Trained") == f"{CHILD_RUNNING[backend][2]} (step 3/30)" and plan.warnings == []


def test_a_pod_of_another_pytorchjob_is_not_the_trainings() -> None:
    w, body = to_training("pytorchjob")
    w.objects[(lifecycle.PYTORCHJOBS, "t-train")]["status"] = CHILD_RUNNING["pytorchjob"][1]
    w.pods.append(pod("u-train-master-0", {"training.kubeflow.org/job-name": "u-train"}, "pytorch",
                      waiting("ImagePullBackOff", PULL)))
    body, plan = step(w, body)
    assert message(body, "Trained") == CHILD_RUNNING["pytorchjob"][2] and plan.warnings == []


# ------------------------------------------------------------------------------------------ merge
def to_merging(start: dict = BODY) -> tuple[FakeWorld, dict]:
    w, body = to_training("pytorchjob", start)
    finish(w, lifecycle.PYTORCHJOBS, "t-train")
    body, plan = step(w, body)
    assert [m["metadata"]["name"] for m in plan.creates] == ["t-merge"]
    w.objects[(lifecycle.JOBS, "t-merge")]["status"] = {"active": 1}
    return w, body


def test_a_merge_pod_without_its_secret_is_named_in_merged_until_it_starts() -> None:
    w, body = to_merging()
    p = pod("t-merge-x1b2c", {JOB_NAME: "t-merge"}, "merge", waiting("CreateContainerConfigError", SECRET))
    w.pods.append(p)
    body, plan = step(w, body)
    stuck = f"pod t-merge-x1b2c: container merge waiting: CreateContainerConfigError: {SECRET}"
    assert message(body, "Merged") == f"Job t-merge: Running; {stuck}"
    assert conds(body)[3:] == [("Merged", "False", "Merging"), ("Ready", "False", "Merging"),
                               ("Reconciling", "True", "Merging"), ("Stalled", "False", "Merging")]
    assert body["status"]["phase"] == "Merging"
    assert plan.warnings == [("CreateContainerConfigError", f"Job t-merge: {stuck}")]
    p["status"] = pod("t-merge-x1b2c", {}, "merge", RUNNING, phase="Running")["status"]  # the Secret was created
    body, plan = step(w, body)
    assert message(body, "Merged") == "Job t-merge: Running" and plan.warnings == []


SA_MISSING = ('Error creating: pods "t-merge-{}" is forbidden: error looking up service account ns/pitlab-runs: '
              'serviceaccount "pitlab-runs" not found')


def failed_create_event(job: str, message: str, at: str) -> dict:
    """An event of the Job controller that could not create Job ``job``'s pod."""
    return {"metadata": {"name": f"{job}.17e", "namespace": "ns"}, "type": "Warning", "reason": "FailedCreate",
            "message": message, "lastTimestamp": at, "involvedObject": {"kind": "Job", "name": job}}


def test_a_job_whose_pod_cannot_be_created_is_named_in_merged_until_its_pod_exists() -> None:
    """The chart's workloads.serviceAccountName missing from the namespace (or a quota, or an admission webhook):
    the Job controller creates no pod, only FailedCreate events, and the run sat in Merging without a word."""
    w, body = to_merging()
    w.events += [failed_create_event("t-merge", SA_MISSING.format("ab1c2"), "2026-01-01T00:00:00Z"),
                 failed_create_event("t-merge", SA_MISSING.format("zz9y8"), "2026-01-01T00:00:10Z"),
                 failed_create_event("other", "Error creating: quota", "2026-01-01T00:00:20Z")]
    body, plan = step(w, body)
    stuck = ("Job t-merge: its pod cannot be created: FailedCreate: Error creating: pods is forbidden: error looking "
             'up service account ns/pitlab-runs: serviceaccount "pitlab-runs" not found')
    assert message(body, "Merged") == f"Job t-merge: Running; {stuck}"
    assert body["status"]["phase"] == "Merging" and conds(body)[3] == ("Merged", "False", "Merging")
    assert plan.warnings == [("FailedCreate", f"Job t-merge: {stuck}")]  # the same text whichever pod was tried
    w.pods.append(pod("t-merge-x1b2c", {JOB_NAME: "t-merge"}, "merge", RUNNING, phase="Running"))  # account made
    body, plan = step(w, body)
    assert message(body, "Merged") == "Job t-merge: Running" and plan.warnings == []  # old events are not news


@pytest.mark.parametrize("state", NORMAL, ids=["running", "ContainerCreating", "PodInitializing"])
def test_a_merge_pod_starting_normally_changes_nothing(state) -> None:
    w, body = to_merging()
    w.pods.append(pod("t-merge-x1b2c", {JOB_NAME: "t-merge"}, "merge", state))
    body, plan = step(w, body)
    assert message(body, "Merged") == "Job t-merge: Running" and plan.warnings == []


# ------------------------------------------------------------------------------------------ evaluation
LE = {"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval",
      "metadata": {"name": "e", "namespace": "ns", "uid": "ue", "generation": 1},
      "spec": {"models": [{"name": "pit", "uri": "models/pit"}], "dataset": {"kind": "ohlcv", "uri": "p.csv"},
               "protocol": {"trainEnd": "2020-12-31", "testStart": "2021-01-01"}}}
CRASHING = pod("e-embed-pit-q7w8e", {JOB_NAME: "e-embed-pit"}, "embed", waiting("CrashLoopBackOff", CRASH),
               phase="Running", last={"exitCode": 137, "reason": "OOMKilled"})
# the kubelet's growing delay ("back-off 40s", "back-off 1m20s") is left out: one message, and one event, per pod
CRASH_TEXT = ("pod e-embed-pit-q7w8e: container embed waiting: CrashLoopBackOff: back-off restarting failed "
              "container=embed pod=e-embed-pit-q7w8e_ns(uid-9) (last terminated: OOMKilled, exit code 137)")


def embedding(pods: list[dict]) -> tuple[dict, lifecycle.Plan]:
    """The LeakageEval reconciled with its embedding Job running with ``pods``."""
    w = FakeWorld()
    le = w.apply(lifecycle.reconcile_eval(copy.deepcopy(LE), w, CFG, NOW), copy.deepcopy(LE))
    w.objects[(lifecycle.JOBS, "e-embed-pit")]["status"] = {"active": 1}
    w.pods += copy.deepcopy(pods)
    plan = lifecycle.reconcile_eval(le, w, CFG, NOW)
    return w.apply(plan, le), plan


def test_an_embedding_job_that_cannot_create_its_pod_is_named_in_embedded() -> None:
    w = FakeWorld()
    le = w.apply(lifecycle.reconcile_eval(copy.deepcopy(LE), w, CFG, NOW), copy.deepcopy(LE))
    w.objects[(lifecycle.JOBS, "e-embed-pit")]["status"] = {}
    quota = ('Error creating: pods "e-embed-pit-q7w8e" is forbidden: exceeded quota: gpu-quota, requested: '
             'requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8')
    w.events.append(failed_create_event("e-embed-pit", quota, "2026-01-01T00:00:00Z"))
    plan = lifecycle.reconcile_eval(le, w, CFG, NOW)
    body = w.apply(plan, le)
    text = ("Job e-embed-pit: its pod cannot be created: FailedCreate: Error creating: pods is forbidden: exceeded "
            "quota: gpu-quota, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8, limited: "
            "requests.nvidia.com/gpu=8")
    assert message(body, "Embedded") == f"0/1 Jobs complete; {text}"
    assert plan.warnings == [("FailedCreate", f"Job e-embed-pit: {text}")]


def test_an_embedding_pod_in_crash_loop_back_off_is_named_in_embedded() -> None:
    body, plan = embedding([CRASHING])
    assert message(body, "Embedded") == f"0/1 Jobs complete; {CRASH_TEXT}"
    assert conds(body)[1:] == [("Embedded", "False", "Embedding"), ("Ready", "False", "Embedding"),
                               ("Reconciling", "True", "Embedding"), ("Stalled", "False", "Embedding")]
    assert plan.warnings == [("CrashLoopBackOff", f"Job e-embed-pit: {CRASH_TEXT}")]


@pytest.mark.parametrize("state", NORMAL, ids=["running", "ContainerCreating", "PodInitializing"])
def test_an_embedding_pod_starting_normally_changes_nothing(state) -> None:
    body, plan = embedding([pod("e-embed-pit-q7w8e", {JOB_NAME: "e-embed-pit"}, "embed", state)])
    assert message(body, "Embedded") == "0/1 Jobs complete" and plan.warnings == []


def test_an_analyze_pod_in_crash_loop_back_off_is_named_in_analyzed() -> None:
    w = FakeWorld()
    le = w.apply(lifecycle.reconcile_eval(copy.deepcopy(LE), w, CFG, NOW), copy.deepcopy(LE))
    finish(w, lifecycle.JOBS, "e-embed-pit")
    le = w.apply(lifecycle.reconcile_eval(le, w, CFG, NOW), le)
    w.objects[(lifecycle.JOBS, "e-analyze")]["status"] = {"active": 1}
    w.pods.append(pod("e-analyze-z9y8x", {JOB_NAME: "e-analyze"}, "analyze", waiting("CrashLoopBackOff", "back-off"),
                      phase="Running", last={"exitCode": 1, "reason": "Error"}))
    plan = lifecycle.reconcile_eval(le, w, CFG, NOW)
    stuck = ("pod e-analyze-z9y8x: container analyze waiting: CrashLoopBackOff: back-off (last terminated: Error, "
             "exit code 1)")
    assert plan.status.phase == "Analyzing" and plan.status.conditions[2].type == "Analyzed"
    assert (plan.status.conditions[2].reason, plan.status.conditions[2].message) == (
        "Analyzing", f"Job e-analyze: Running; {stuck}")
    assert plan.warnings == [("CrashLoopBackOff", f"Job e-analyze: {stuck}")]


def test_a_pittraining_names_the_stuck_pod_of_its_leakageeval() -> None:
    w, body = to_merging({**BODY, "spec": {**BODY["spec"], "evaluations": [{"name": "leak", "spec": LE["spec"]}]}})
    finish(w, lifecycle.JOBS, "t-merge")
    body, plan = step(w, body)
    assert [m["metadata"]["name"] for m in plan.creates] == ["t-leak"]
    leak = w.objects[(lifecycle.LEAKAGEEVALS, "t-leak")]
    leak["status"] = {"phase": "Embedding", "children": {"configMap": "t-leak-eval-spec",
                                                         "embedJob.pit": "t-leak-embed-pit"}}
    crashing = copy.deepcopy(CRASHING)
    crashing["metadata"]["labels"][JOB_NAME] = "t-leak-embed-pit"
    w.pods.append(crashing)
    body, plan = step(w, body)
    assert message(body, "Evaluated") == f"waiting for LeakageEval t-leak (Embedding; {CRASH_TEXT})"
    assert conds(body)[4] == ("Evaluated", "False", "Evaluating") and body["status"]["phase"] == "Evaluating"
    assert plan.warnings == [("CrashLoopBackOff", f"LeakageEval t-leak: Job t-leak-embed-pit: {CRASH_TEXT}")]
    leak["status"]["phase"] = "Analyzing"  # its embedding Job is no longer looked at
    body, plan = step(w, body)
    assert message(body, "Evaluated") == "waiting for LeakageEval t-leak (Analyzing)" and plan.warnings == []
