"""The checkpoint disk-space preflight: a run whose checkpoints cannot fit is refused before step 1.

Found on the H200 (64 GiB disk): a 2.91 B-parameter run saving at steps 15 and 20 with keep 2 wrote the
first 34.9 GB checkpoint, trained 5 more steps and died writing the second.
"""

from __future__ import annotations

import pytest
import torch

from pitlab.trainer.checkpoint import CheckpointError, check_disk_space, checkpoint_bytes, checkpoint_steps

GB = 10**9


def test_checkpoint_steps() -> None:
    assert checkpoint_steps(0, 20, 15) == [15, 20]
    assert checkpoint_steps(0, 20, 5) == [5, 10, 15, 20]  # the end is saved once
    assert checkpoint_steps(10, 20, 5) == [15, 20]  # resumed at 10
    assert checkpoint_steps(0, 7, 0) == [7]
    assert checkpoint_steps(20, 20, 5) == []  # already finished


def test_checkpoint_bytes_counts_parameters_and_two_adam_moments() -> None:
    params = [torch.zeros(10, 4), torch.zeros(6, dtype=torch.bfloat16)]
    assert checkpoint_bytes(params) == 3 * (40 * 4 + 6 * 2)


def test_refuses_the_run_that_died_on_the_h200(tmp_path) -> None:
    one = 3 * 2_910_834_816 * 4  # 2.91 B fp32 parameters + AdamW moments = 34.9 GB
    with pytest.raises(CheckpointError) as err:
        check_disk_space(tmp_path / "ckpt", one, saves=2, keep=2, free_bytes=64 * 2**30)
    assert str(err.value) == (
        f"spec.checkpoint: this run saves 2 checkpoint(s) of about 34.9 GB (parameters + AdamW moments) and "
        f"keeps 2: up to 2 more on {tmp_path / 'ckpt'} (69.9 GB), which has 68.7 GB free; lower "
        f"spec.checkpoint.keep, raise spec.checkpoint.everySteps, use an s3:// checkpoint.uri or free space")
    # keep 1 still holds the old one while the new one is written: 2 copies, the same refusal
    with pytest.raises(CheckpointError):
        check_disk_space(tmp_path / "ckpt", one, saves=2, keep=1, free_bytes=64 * 2**30)
    check_disk_space(tmp_path / "ckpt", one, saves=1, keep=2, free_bytes=64 * 2**30)  # one save fits


def test_existing_checkpoints_are_already_on_disk(tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    for n in (5, 10):
        (ckpt / f"step-{n}").mkdir(parents=True)
    (ckpt / "step-15.tmp").mkdir()  # incomplete: not counted
    # keep 2 with 2 complete: the next save adds 1 (then prunes), so 1 more checkpoint whatever the count
    check_disk_space(ckpt, 10 * GB, saves=4, keep=2, free_bytes=11 * GB)
    with pytest.raises(CheckpointError, match=r"up to 1 more .* \(10\.0 GB\), which has 9\.0 GB free"):
        check_disk_space(ckpt, 10 * GB, saves=4, keep=2, free_bytes=9 * GB)


def test_free_space_is_read_from_the_nearest_existing_parent(tmp_path) -> None:
    check_disk_space(tmp_path / "a" / "b" / "ckpt", 1, saves=1, keep=1)  # 1 byte fits any test disk
    with pytest.raises(CheckpointError, match="which has"):
        check_disk_space(tmp_path / "a" / "b" / "ckpt", 10**18, saves=1, keep=1)  # 1 EB does not


def test_an_uncaught_rank_exception_heads_the_launch_error(tmp_path) -> None:
    """torchrun ends stderr with its own ChildFailedError traceback; the rank's exception must lead the message."""
    from pitlab.trainer.launch import _failure_message

    log = tmp_path / "stderr.log"
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "OSError: [Errno 28] No space left on device: '/ckpt/step-20.tmp/__0_0.distcp'\n"
                   "Traceback (most recent call last):\n  File \"run.py\", line 9\n"
                   "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" + "=\n" * 40)
    msg = _failure_message("training failed (exit code 1)", ["torchrun", "-m", "pitlab.trainer.train"], log)
    assert msg.splitlines()[:3] == [
        "training failed (exit code 1):",
        "OSError: [Errno 28] No space left on device: '/ckpt/step-20.tmp/__0_0.distcp'",
        "command: torchrun -m pitlab.trainer.train"]


def test_a_native_abort_in_a_rank_heads_the_launch_error(tmp_path) -> None:
    """A rank killed by std::terminate (SIGABRT) leaves no Python exception; its abort lines lead the message
    (this CI failure's stderr, shortened: the abort lines came 60 lines before torchrun's 30-line tail)."""
    from pitlab.trainer.launch import _failure_message

    log = tmp_path / "stderr.log"
    log.write_text("pitlab.trainer.train: s3-test: world_size=2 backend=gloo\n"
                   "terminate called without an active exception\nFatal Python error: Aborted\n\n"
                   "Thread 0x00007f40eb5e2b80 (most recent call first):\n  <no Python frame>\n"
                   + "x\n" * 60 + "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    msg = _failure_message("training failed (exit code 1)", ["torchrun"], log)
    assert msg.splitlines()[:4] == [
        "training failed (exit code 1):",
        "terminate called without an active exception",
        "Fatal Python error: Aborted",
        "command: torchrun"]


def test_a_reported_rank_error_is_the_whole_launch_error(tmp_path) -> None:
    """The trainer's own error line (a NaN loss, a spec field) is the message, with the log's path: torchrun's
    ChildFailedError traceback after it is left in the log."""
    from pitlab.trainer.launch import ERROR_PREFIX, _failure_message

    log = tmp_path / "stderr.log"
    log.write_text(f"{ERROR_PREFIX}: step 2: loss is nan; lower spec.training.learningRate\n" * 2
                   + "Traceback (most recent call last):\n  File \"run.py\", line 9\n"
                   "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" + "=\n" * 40)
    msg = _failure_message("training failed (exit code 1)", ["torchrun"], log)
    assert msg.splitlines() == [
        "training failed (exit code 1):",
        f"{ERROR_PREFIX}: step 2: loss is nan; lower spec.training.learningRate",
        f"(torchrun's output: {log})"]


def test_refusal_names_the_runs_overwrite_kept_aside(tmp_path) -> None:
    """out/<name>/checkpoint on a disk that also holds out/.replaced/ (runs `pitlab run --overwrite` keeps until
    its new run succeeds): the refusal names that folder as space to free."""
    ckpt = tmp_path / "out" / "run" / "checkpoint"
    with pytest.raises(CheckpointError) as err:
        check_disk_space(ckpt, 10 * GB, saves=1, keep=1, free_bytes=9 * GB)
    assert "replaced" not in str(err.value)
    (tmp_path / "out" / ".replaced" / "run.20261205T050000Z").mkdir(parents=True)
    with pytest.raises(CheckpointError) as err:
        check_disk_space(ckpt, 10 * GB, saves=1, keep=1, free_bytes=9 * GB)
    assert str(err.value).endswith(
        f"or free space ({tmp_path / 'out' / '.replaced'} holds the runs `pitlab run --overwrite` replaced, kept "
        "until this run succeeds: delete them if they are not needed)")
