"""Reading children: Kubeflow and batch Job conditions, LeakageEval phases, termination messages, progress."""

from pitlab.operator import mirroring as m
from pitlab.api.summary import PROGRESS_PREFIX, compact_results, premium_summary, progress_record


def test_pytorchjob_state() -> None:
    job = lambda *c: {"status": {"conditions": list(c)}}  # noqa: E731
    created = {"type": "Created", "status": "True", "reason": "PyTorchJobCreated"}
    running = {"type": "Running", "status": "True", "reason": "PyTorchJobRunning"}
    failed = {"type": "Failed", "status": "True", "reason": "PyTorchJobFailed", "message": "1 Master failed"}
    assert m.pytorchjob_state({}) == m.ChildState("Pending", "Created", "")
    assert m.pytorchjob_state(job(created)).state == "Pending"
    assert m.pytorchjob_state(job(created, running)) == m.ChildState("Running", "PyTorchJobRunning", "")
    assert m.pytorchjob_state(job(created, dict(running, status="False"), failed)) == m.ChildState(
        "Failed", "PyTorchJobFailed", "1 Master failed")


def _c(type_: str, status: str, reason: str, message: str = "") -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message}


QUEUED = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "h200"}}}


def test_trainjob_state_from_conditions_and_jobs_status() -> None:
    tj = lambda *c, **st: {**QUEUED, "status": {"conditions": list(c), **st}}  # noqa: E731
    assert m.trainjob_state({}) == m.ChildState("Pending", "Created", "")
    assert m.trainjob_state(tj(_c("Suspended", "True", "Suspended", "TrainJob is suspended"))) == m.ChildState(
        "Pending", "Queued", "waiting for admission by Kueue LocalQueue h200 (Suspended: TrainJob is suspended)")
    # suspended again after it ran: Kueue evicted it
    assert m.trainjob_state(tj(_c("Suspended", "True", "Suspended", "TrainJob is suspended")), ran=True) == \
        m.ChildState("Pending", "Preempted", "evicted by Kueue LocalQueue h200 (Suspended: TrainJob is suspended); "
                                             "it resumes from its last checkpoint when readmitted")
    running = tj(_c("Suspended", "False", "Resumed"), jobsStatus=[{"name": "node", "active": 1, "ready": 1}])
    assert m.trainjob_state(running) == m.ChildState("Running", "Running", "1 Job(s) active, 1 ready")
    assert m.trainjob_state(tj(_c("Complete", "True", "JobSetCompleted", "done"))) == m.ChildState(
        "Succeeded", "JobSetCompleted", "done")
    failed = tj(_c("Suspended", "True", "Suspended"), _c("Failed", "True", "JobSetFailed", "node 0: exit 2"))
    assert m.trainjob_state(failed) == m.ChildState("Failed", "JobSetFailed", "node 0: exit 2")  # Failed wins
    # suspended before its controller wrote a condition, and not queued through Kueue
    assert m.trainjob_state({"spec": {"suspend": True}}) == m.ChildState("Pending", "Suspended",
                                                                         "Suspended: spec.suspend is true")


def test_jobset_state_counts_restarts_of_its_budget() -> None:
    js = lambda *c, **st: {**QUEUED, "spec": {"failurePolicy": {"maxRestarts": 2}},  # noqa: E731
                           "status": {"conditions": list(c), **st}}
    assert m.jobset_state(js(_c("Suspended", "True", "SuspendedJobs", "jobset is suspended"))) == m.ChildState(
        "Pending", "Queued", "waiting for admission by Kueue LocalQueue h200 (SuspendedJobs: jobset is suspended)")
    active = [{"name": "node", "active": 1, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}]
    assert m.jobset_state(js(replicatedJobsStatus=active)) == m.ChildState("Running", "Running",
                                                                          "1 Job(s) active, 0 ready")
    assert m.jobset_state(js(replicatedJobsStatus=active, restarts=1)) == m.ChildState(
        "Running", "Restarted", "1 Job(s) active, 0 ready; restart 1 of 2")
    assert m.jobset_state(js(restarts=2)) == m.ChildState("Pending", "Restarting", "restart 2 of 2")
    assert m.jobset_state(js(_c("Completed", "True", "AllJobsCompleted", "jobset completed"))).state == "Succeeded"
    assert m.jobset_state(js(_c("Failed", "True", "ReachedMaxRestarts", "jobset failed: max restarts"))) == \
        m.ChildState("Failed", "ReachedMaxRestarts", "jobset failed: max restarts")


def test_an_eviction_condition_is_preempted_and_a_suspension_without_queue_is_suspended() -> None:
    evicted = {**QUEUED, "spec": {"suspend": True}, "status": {"conditions": [
        _c("Suspended", "True", "SuspendedJobs", "jobset is suspended"),
        _c("Evicted", "True", "Preempted", "Preempted to accommodate a higher priority Workload")]}}
    assert m.jobset_state(evicted) == m.ChildState(
        "Pending", "Preempted", "evicted by Kueue LocalQueue h200 (Preempted: Preempted to accommodate a higher "
                                "priority Workload); it resumes from its last checkpoint when readmitted")
    ptj = {"spec": {"runPolicy": {"suspend": True}},
           "status": {"conditions": [_c("Suspended", "True", "PyTorchJobSuspended", "PyTorchJob x is suspended.")]}}
    assert m.pytorchjob_state(ptj) == m.ChildState("Pending", "Suspended",
                                                   "PyTorchJobSuspended: PyTorchJob x is suspended.")
    assert m.pytorchjob_state(ptj, ran=True).reason == "Suspended"  # no queue: not Kueue's eviction
    assert m.pytorchjob_state({**ptj, **QUEUED}).reason == "Queued"
    assert m.pytorchjob_state({**ptj, **QUEUED}, ran=True).reason == "Preempted"


def test_index_pod_is_the_newest_live_pod_of_that_index() -> None:
    pod = lambda name, index, t, gone=False: {"metadata": {  # noqa: E731
        "name": name, "creationTimestamp": t, "labels": {"batch.kubernetes.io/job-name": "x-train-node-0",
                                                         "batch.kubernetes.io/job-completion-index": str(index)},
        **({"deletionTimestamp": t} if gone else {})}}
    pods = [pod("a", 0, "2026-01-01T00:00:00Z"), pod("b", 1, "2026-01-01T00:00:09Z"),
            pod("c", 0, "2026-01-01T00:00:05Z"), pod("d", 0, "2026-01-01T00:00:07Z", gone=True)]
    assert m.index_pod(pods, "x-train-node-0", 0) == "c"
    assert m.index_pod(pods, "x-train-node-0", 1) == "b" and m.index_pod(pods, "other", 0) is None


def test_batch_job_state() -> None:
    assert m.batch_job_state({"status": {}}).state == "Pending"
    assert m.batch_job_state({"status": {"active": 1}}) == m.ChildState("Running", "Running", "1 pod(s) running")
    assert m.batch_job_state({"spec": {"completions": 3}, "status": {"succeeded": 2}}).state == "Pending"
    assert m.batch_job_state({"status": {"succeeded": 1}}).state == "Succeeded"
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                         "message": "too slow"}]}}
    assert m.batch_job_state(failed) == m.ChildState("Failed", "DeadlineExceeded", "too slow")
    jobs = [{"metadata": {"name": "a"}, "status": {"succeeded": 1}}, {"metadata": {"name": "b"}, **failed}]
    assert m.jobs_state(jobs) == m.ChildState("Failed", "DeadlineExceeded", "Job b: too slow")
    assert m.jobs_state(jobs[:1]) == m.ChildState("Succeeded", "Completed", "1/1 Jobs complete")


def test_leakageeval_state_carries_the_stalled_reason() -> None:
    le = {"status": {"phase": "Failed", "conditions": [
        {"type": "Stalled", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job x-analyze: oom"}]}}
    assert m.leakageeval_state(le) == m.ChildState("Failed", "BackoffLimitExceeded", "Job x-analyze: oom")
    assert m.leakageeval_state({"status": {"phase": "Embedding"}}) == m.ChildState("Running", "Embedding", "")


def test_termination_message_of_the_newest_pod() -> None:
    pod = lambda name, job, msg, t: {"metadata": {"name": name, "labels": {"batch.kubernetes.io/job-name": job}},  # noqa: E731
                                     "status": {"containerStatuses": [{"name": "analyze", "state": {
                                         "terminated": {"message": msg, "finishedAt": t}}}]}}
    pods = [pod("p1", "j", "old", "2026-01-01T00:00:00Z"), pod("p2", "j", "new", "2026-01-01T01:00:00Z"),
            pod("p3", "other", "x", "2027-01-01T00:00:00Z")]
    assert m.termination_message(pods, "j", "analyze") == "new"
    assert m.termination_message(pods, "j", "merge") is None
    assert m.message_json('{"a": 1}') == {"a": 1} and m.message_json("Traceback ...") is None
    assert m.last_lines("a\n\nb\nc\nd\n") == "b | c | d"


def test_progress_lines_and_summaries() -> None:
    rec = {"step": 7, "total_steps": 70, "loss": 2.123456789, "tokens_per_second": 9000.5,
           "mean_tokens_per_second": 8151.234, "lr": 1e-5}  # the status reports the mean, not the last step
    assert progress_record(rec) == {"step": 7, "totalSteps": 70, "loss": 2.12346, "tokensPerSecond": 8151.0}
    log = f"noise\n{PROGRESS_PREFIX}{{\"step\": 6}}\n{PROGRESS_PREFIX}{{\"step\": 7, \"loss\": 2.1}}\n{PROGRESS_PREFIX}oops"
    assert m.progress_from_log(log) == {"step": 7, "loss": 2.1}
    assert m.progress_from_log(None) is None
    res = compact_results({"models": [{"name": "base", "r2_off": 0.011111111, "r2_on": 0.2, "premium": 0.21,
                                        "premium_ci": [0.14, 0.35], "verdict": "significant", "n_test": 5817}],
                           "reductions": [{"model_a": "base", "model_b": "pit", "reduction": 0.07,
                                           "ci": [-0.03, 0.24]}]})
    assert res == {"models": {"base": {"r2Off": 0.0111111, "r2On": 0.2, "premium": 0.21, "premiumCI": [0.14, 0.35],
                                       "verdict": "significant"}},
                   "reductions": [{"from": "base", "to": "pit", "reduction": 0.07, "ci": [-0.03, 0.24]}]}
    assert premium_summary(res) == "base +0.210 [+0.140, +0.350]"
