"""The train stage module on its own (pitlab/pipeline/train.py): its report in JSON, the Trained message locally
and on a cluster, the progress sidecar's line read into ``status.progress``, and the training child's side."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from stage_ctx import World, ctx, example

from pitlab.api import ResourceStatus, stages
from pitlab.api.status import Progress, get_condition, set_condition
from pitlab.api.summary import PROGRESS_PREFIX
from pitlab.operator import backends
from pitlab.operator.context import Plan
from pitlab.pipeline import train
from pitlab.pipeline.train import TrainReport

LOCAL = TrainReport(checkpoint_uri="/o/t/checkpoint", steps=40, first_loss=7.6543, final_loss=5.0,
                    mean_tokens_per_second=12345.6, kernel_warning="reference kernels on a GPU")
CLUSTER = TrainReport(checkpoint_uri="s3://bucket/ckpt", child="PyTorchJob t-train", child_message="done",
                      cluster=True)


def progress_line(**fields) -> str:
    return PROGRESS_PREFIX + json.dumps(fields)


def test_the_report_is_camel_case_json_and_ignores_unknown_keys() -> None:
    assert json.loads(LOCAL.to_json()) == {
        "checkpointUri": "/o/t/checkpoint", "steps": 40, "firstLoss": 7.6543, "finalLoss": 5.0,
        "meanTokensPerSecond": 12345.6, "kernelWarning": "reference kernels on a GPU", "resumedFromStep": None,
        "parallelism": None, "child": None, "childMessage": None, "cluster": False}
    assert TrainReport.model_validate({**json.loads(CLUSTER.to_json()), "paramSha256": "ab"}) == CLUSTER
    assert TrainReport.model_validate({"checkpoint_uri": "/c", "first_loss": 1.5}).first_loss == 1.5
    with pytest.raises(ValidationError, match="checkpointUri"):
        TrainReport.model_validate({"steps": 3})  # where the checkpoints are is what the report is for


def test_local_message_gives_steps_losses_speed_and_the_kernel_warning() -> None:
    status = ResourceStatus()
    assert train.to_status(LOCAL, status) == ("40 steps, loss 7.654 → 5.000, 12,346 tokens/s (mean over the run); "
                                              "WARNING: reference kernels on a GPU")
    assert status == ResourceStatus(checkpoint_uri="/o/t/checkpoint")
    resumed = LOCAL.model_copy(update={"resumed_from_step": 20, "kernel_warning": None})
    assert train.to_status(resumed, ResourceStatus()) == (
        "40 steps (resumed at step 20), loss 7.654 → 5.000, 12,346 tokens/s (mean over the run)")
    plain = LOCAL.model_copy(update={"mean_tokens_per_second": None, "kernel_warning": ""})
    assert train.to_status(plain, ResourceStatus()) == "40 steps, loss 7.654 → 5.000"
    # a resumed run with no metrics kept (its last checkpoint at the final step) has no losses to give
    resumed = plain.model_copy(update={"steps": 40, "first_loss": None, "final_loss": None})
    assert train.to_status(resumed, ResourceStatus()) == "40 steps"
    # the trainer's summary names how the model was held (one process: the single-device path or FSDP2)
    held = plain.model_copy(update={"parallelism": "FSDP2", "resumed_from_step": 8})
    assert train.to_status(held, ResourceStatus()) == "40 steps (resumed at step 8) on FSDP2, loss 7.654 → 5.000"


def test_local_message_leaves_the_progress_as_it_is() -> None:
    progress = Progress(step=39, total_steps=40, eta_seconds=3)
    status = ResourceStatus(progress=progress)
    train.to_status(LOCAL, status)
    assert status.progress == progress


def test_cluster_message_names_the_child_and_finishes_the_progress() -> None:
    status = ResourceStatus(progress=Progress(step=30, total_steps=40, loss=5.5, eta_seconds=60))
    assert train.to_status(CLUSTER, status) == "PyTorchJob t-train: done"
    assert status.checkpoint_uri == "s3://bucket/ckpt"
    assert (status.progress.step, status.progress.total_steps, status.progress.percent, status.progress.eta_seconds,
            status.progress.eta, status.progress.loss) == (40, 40, 100.0, 0, "0s", 5.5)
    unknown_total = Progress(step=30)
    status = ResourceStatus(progress=unknown_total)
    train.to_status(CLUSTER, status)
    assert status.progress == unknown_total  # no total: nothing to finish
    status = ResourceStatus()
    train.to_status(CLUSTER, status)
    assert status == ResourceStatus(checkpoint_uri="s3://bucket/ckpt")


def test_kernel_warning_comes_from_the_newest_progress_line() -> None:
    log = "\n".join([progress_line(step=1, kernelWarning="old"), "noise", progress_line(step=2, kernelWarning="new")])
    assert train.kernel_warning(log) == "new"
    assert train.kernel_warning(progress_line(step=2, kernelWarning="x" * 600)) == "x" * 500
    for log in (None, "", "no progress here", progress_line(step=2), progress_line(step=2, kernelWarning=""),
                progress_line(step=2, kernelWarning=["not", "text"])):
        assert train.kernel_warning(log) is None, log


def test_the_progress_line_gives_its_known_fields() -> None:
    plan = Plan(status=ResourceStatus())
    log = progress_line(step=10, totalSteps=40, loss=6.25, tokensPerSecond=900.0, etaSeconds=125, kernelWarning="w",
                        somethingNew=1)
    assert train._progress(log, "t-train-master-0", plan) == Progress(step=10, total_steps=40, loss=6.25,
                                                                      tokens_per_second=900.0, eta_seconds=125)
    assert train._progress(log, "p", plan).eta == "2m05s" and plan.warnings == []
    assert train._progress(None, "p", plan) is None and train._progress("starting\n", "p", plan) is None
    assert train._progress(progress_line(step=10, loss="low"), "t-train-master-0", plan) is None
    assert plan.warnings == [("MalformedProgress", "pod t-train-master-0: progress line ignored: loss: Input should "
                                                   "be a valid number, unable to parse string as a number (got 'low')")]


def test_ran_means_progress_was_seen_or_the_child_was_preempted() -> None:
    pt = example("pittraining.yaml")
    assert train._ran(ctx(pt), stages.TRAIN) is False
    assert train._ran(ctx(pt, status=ResourceStatus(progress=Progress(step=1))), stages.TRAIN) is True
    for reason, ran in (("Preempted", True), ("Queued", False)):
        status = set_condition(ResourceStatus(), "Trained", "False", reason)
        assert train._ran(ctx(pt, status=status), stages.TRAIN) is ran


def test_progress_names_are_the_status_aliases() -> None:
    assert train.PROGRESS_FIELDS == ("step", "totalSteps", "loss", "tokensPerSecond", "percent", "etaSeconds", "eta")


def test_reconcile_follows_the_pytorchjob_to_trained() -> None:
    pt = example("pittraining.yaml")
    world = World()
    c = ctx(pt, world)
    assert train.reconcile(c, stages.TRAIN, pt) is False
    job = c.plan.creates[0]
    assert (job["kind"], job["metadata"]["name"]) == ("PyTorchJob", "qwen35-a3b-pit-2020-train")
    assert c.status.children == {"pytorchJob": "qwen35-a3b-pit-2020-train"}
    assert c.status.checkpoint_uri == "/pitlab/out/qwen35-a3b-pit-2020/checkpoint"
    cond = get_condition(c.status, "Trained")
    assert (cond.status, cond.reason, cond.message) == ("False", "Training", "PyTorchJob qwen35-a3b-pit-2020-train: "
                                                                             "Created")

    world.add(job, {"conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning"}]})
    world.logs[("qwen35-a3b-pit-2020-train-master-0", "progress")] = progress_line(step=5, totalSteps=40)
    c = ctx(pt, world, c.status)
    assert train.reconcile(c, stages.TRAIN, pt) is False
    assert get_condition(c.status, "Trained").message == ("PyTorchJob qwen35-a3b-pit-2020-train: PyTorchJobRunning "
                                                         "(step 5/40)")
    assert (c.status.progress.step, c.status.progress.percent) == (5, 12.5)

    world.add(job, {"conditions": [{"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded",
                                    "message": "PyTorchJob qwen35-a3b-pit-2020-train is successfully completed."}]})
    c = ctx(pt, world, c.status)
    assert train.reconcile(c, stages.TRAIN, pt) is True
    cond = get_condition(c.status, "Trained")
    assert (cond.status, cond.reason, cond.message) == (
        "True", "PyTorchJobSucceeded",
        "PyTorchJob qwen35-a3b-pit-2020-train: PyTorchJob qwen35-a3b-pit-2020-train is successfully completed.")
    assert (c.status.progress.step, c.status.progress.percent) == (40, 100.0)
    assert backends.chosen(c.status) is backends.PYTORCHJOB
    c = ctx(pt, World(), c.status)
    assert train.reconcile(c, stages.TRAIN, pt) is True and c.plan.creates == []
