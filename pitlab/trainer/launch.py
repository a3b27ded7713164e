"""Run the trainer as a local torchrun job and follow its progress."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Callable

from pitlab.api import PitTraining, layout
from pitlab.errors import TrainingError
from pitlab.trainer.checkpoint import checkpoint_location, read_train_state
from pitlab.trainer.checkpointer import latest_checkpoint
from pitlab.trainer.command import torchrun_command as build_torchrun_command  # noqa: F401 - pitlab run's command
from pitlab.trainer.files import write_spec  # noqa: F401 - where the benches and tests import it from
from pitlab.trainer.lifetime import set_parent_death_signal, stop_group
from pitlab.trainer.metrics import MetricsTail, truncate_metrics

STDERR_TAIL_LINES = 30
ERROR_PREFIX = "pitlab.trainer.train: error"  # how train.py reports a known error


def training_env(nproc: int, cuda: bool, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of the job: ``environ`` (default ``os.environ``) with ``OMP_NUM_THREADS`` set for CPU
    ranks to ``max(1, cpu_count // nproc)`` so the ranks do not oversubscribe the cores."""
    env = dict(os.environ if environ is None else environ)
    if not cuda:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_training(spec_path: Path, run_dir: Path, nproc: int, on_step: Callable[[dict], None] | None = None,
                 base: Path | None = None, poll_s: float = 0.5) -> dict:
    """Run the training job to completion and return ``run_dir/train/summary.json`` as a dict.

    Removes a previous run's ``summary.json`` (and ``metrics.jsonl`` unless the checkpoint location's
    ``latest`` exists, ``spec.checkpoint.uri`` (local or ``s3://``) or else ``run_dir/checkpoint``: then the
    trainer resumes from it and keeps the lines up to that step), starts the torchrun command
    of :func:`build_torchrun_command` (stdout/stderr to ``run_dir/train/{stdout,stderr}.log``), and calls
    ``on_step(record)`` for each metrics line as it appears (see :mod:`pitlab.trainer.metrics`); a resumed run's
    kept lines are delivered as one call, with the checkpoint's step, so that a progress bar starts there.
    Raises :class:`TrainingError` when the job fails or finishes without a summary; its message holds
    the exit code, the errors the ranks reported (e.g. a spec field), the command and the last 30
    lines of stderr.
    """
    import torch  # deferred: the parent only needs it to pick the environment

    run_dir = Path(run_dir)
    train_dir = run_dir / layout.TRAIN
    train_dir.mkdir(parents=True, exist_ok=True)
    metrics_path, summary_path = run_dir / layout.METRICS, run_dir / layout.SUMMARY
    summary_path.unlink(missing_ok=True)
    resume = latest_checkpoint(_checkpoint_dir(spec_path, run_dir))
    if resume is None:
        metrics_path.unlink(missing_ok=True)
    else:  # the trainer resumes: keep the lines up to its checkpoint (reported as one), drop the redone ones
        truncate_metrics(metrics_path, int(read_train_state(resume)["step"]))
    cmd = build_torchrun_command(spec_path, run_dir, nproc, base)
    env = training_env(nproc, torch.cuda.is_available())
    tail = MetricsTail(metrics_path)
    kept = tail.poll()  # a resumed run's lines up to its checkpoint; none after the unlink above
    if kept and on_step is not None:
        on_step(kept[-1])
    stderr_path = train_dir / "stderr.log"
    with open(train_dir / "stdout.log", "wb") as out, open(stderr_path, "wb") as err:
        # its own session (stopped as a group) and SIGTERM from the kernel if this process dies, even by SIGKILL
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True,
                                preexec_fn=set_parent_death_signal)
        try:
            while True:
                rc = proc.poll()
                for rec in tail.poll():
                    if on_step is not None:
                        on_step(rec)
                if rc is not None:
                    break
                time.sleep(poll_s)
        except BaseException:  # interrupted (SIGINT/SIGTERM) or failed here: no rank outlives this call
            stop_group(proc)
            raise
    if rc != 0:
        raise TrainingError(_failure_message(f"training failed (exit code {rc})", cmd, stderr_path))
    if not summary_path.is_file():
        raise TrainingError(_failure_message(f"training exited 0 but wrote no {summary_path}", cmd, stderr_path))
    return json.loads(summary_path.read_text())


def _checkpoint_dir(spec_path: Path, run_dir: Path) -> Path | str:
    """The run's checkpoint location (``spec.checkpoint.uri`` or ``run_dir/checkpoint``); a spec that does not
    load falls back to the default and is reported by the trainer itself, naming the field."""
    from pitlab.api import SpecError, load_resource

    try:
        res = load_resource(spec_path)
        uri = res.spec.checkpoint.uri if isinstance(res, PitTraining) else None
    except SpecError:
        uri = None
    return checkpoint_location(uri, run_dir)


_FATAL_LINE = re.compile(r"^(?:\[rank\d+\]:)?(?:terminate called|Fatal Python error:|Segmentation fault)")
_EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:)?[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)(?::|$)")


def _failure_message(headline: str, cmd: list[str], stderr_path: Path) -> str:
    """``headline`` and the errors the ranks reported (deduplicated) with the log's path; for a failure no rank
    explained (an uncaught exception, a native abort), also the command and the end of stderr."""
    with open(stderr_path, "r", encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    reported = list(dict.fromkeys(line.rstrip() for line in lines if line.startswith(ERROR_PREFIX)))
    if reported:  # the trainer said why (a spec field, a NaN loss): torchrun's traceback after it is noise
        return "\n".join([headline + ":"] + reported + [f"(torchrun's output: {stderr_path})"])
    # an uncaught exception or a native abort in a rank, not torchrun's own ChildFailedError
    reported = list(dict.fromkeys(
        line.rstrip() for line in lines
        if (_EXCEPTION_LINE.match(line) and "ChildFailedError" not in line) or _FATAL_LINE.match(line)))[-3:]
    parts = [headline + (":" if reported else "")] + reported
    parts.append(f"command: {' '.join(cmd)}")
    parts.append(f"last {STDERR_TAIL_LINES} lines of {stderr_path}:")
    return "\n".join(parts) + "\n" + "".join(lines[-STDERR_TAIL_LINES:])
