"""One optimizer step of a training run, and the loop that reads each step's loss while the next one runs.

:func:`launch_step` issues a step's work (batches to the device, forward-backward and the optimizer step through
the run's strategy, the loss's all-reduce) without waiting for the device; :func:`finish_step` reads its loss and
gradient norm (the one host sync of a step) and refuses non-finite values. :func:`run_steps` launches step
``s + 1`` before it reads step ``s``, so the host prepares the next step while the device still runs this one
(docs/training.md, "The step loop"). A step whose state the caller needs before the next update (a checkpoint
save) is read before the next one is launched. The values and their order are those of :func:`train_step`, which
launches and reads one step at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist
from torch.profiler import record_function

from pitlab.trainer.gcpolicy import SteadyGC
from pitlab.trainer.metrics import LossHistory

if TYPE_CHECKING:
    from pitlab.trainer.train import TrainRun


@dataclass(frozen=True)
class StepResult:
    """One optimizer step: mean loss over all ranks and microbatches (nats), gradient norm before clipping,
    the learning rate it used, and its wall time in seconds (this rank)."""

    loss: float
    grad_norm: float
    lr: float
    seconds: float


@dataclass(frozen=True)
class PendingStep:
    """A launched step: ``values`` (float32 ``[2]``: the loss summed over ranks and microbatches, the gradient norm)
    on the host, valid once ``ready`` (a CUDA event after their non-blocking copy into pinned memory; None on the
    CPU, where they are already there); ``lr``; ``started``: ``time.perf_counter()`` at launch."""

    step: int
    values: torch.Tensor
    ready: torch.cuda.Event | None
    lr: float
    started: float


def to_host_async(values: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """``values`` copied to pinned host memory without waiting, and the event after the copy: waiting on it waits
    for this point of the stream only, not for work launched later (``tolist()`` on a CUDA tensor would wait for
    everything queued before it, the next step included). A CPU tensor is returned as it is, with None."""
    if values.device.type != "cuda":
        return values, None
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (a CPU tensor) on ``device``. On CUDA through page-locked memory with ``non_blocking``: a copy from
    pageable memory waits for the stream, which would make the host wait for the previous step's device work."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def launch_step(run: TrainRun, step: int) -> PendingStep:
    """Collective: issue optimizer step ``step`` (0-based) through the run's strategy: every microbatch's forward +
    backward (gradients reduce-scattered per microbatch unless ``gradientSyncEveryMicrobatch: false``; on the
    single-device path cast into the float32 masters' gradients, inside ``step.backward``), clipping, AdamW, the
    LR schedule (and the masters cast into the compute copy, inside ``step.optimizer``), and the loss summed over
    all ranks. Nothing here waits for the device; the phases are ``record_function`` ranges (``step.forward``,
    ``step.backward``, ``step.clip``, ``step.optimizer``) for ``bench/profile_step.py``."""
    tr = run.spec.training
    t = time.perf_counter()
    accum = tr.gradient_accumulation_steps
    lr = run.optimizer.param_groups[0]["lr"]
    batches = [tuple(to_device(x, run.device) for x in run.data.microbatch(step, micro)) for micro in range(accum)]
    loss_sum = run.strategy.forward_backward(batches, accum, tr.gradient_sync_every_microbatch or accum == 1)
    grad_norm = run.strategy.optimizer_step(run.optimizer, run.scheduler, tr.grad_clip)
    dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
    host, ready = to_host_async(torch.stack([loss_sum, grad_norm.to(loss_sum)]))
    return PendingStep(step, host, ready, lr, t)


def finish_step(run: TrainRun, pending: PendingStep, since: float | None = None) -> StepResult:
    """Read ``pending``'s loss (averaged over ranks and microbatches) and gradient norm, waiting for that step
    only; its ``seconds`` run from its launch, or from ``since`` when that is later (the previous step's read,
    in :func:`run_steps`). Raises ``FloatingPointError`` for a non-finite loss or gradient norm."""
    with record_function("step.loss_read"):
        if pending.ready is not None:
            pending.ready.synchronize()
        loss_total, grad_norm = pending.values.tolist()
    step_loss = loss_total / (run.world * run.spec.training.gradient_accumulation_steps)
    step = pending.step
    if not np.isfinite(step_loss):
        raise FloatingPointError(f"step {step + 1}: loss is {step_loss}; lower spec.training.learningRate")
    if not np.isfinite(grad_norm):
        raise FloatingPointError(nonfinite_gradient_message(run, step, step_loss, grad_norm))
    end = time.perf_counter()
    return StepResult(step_loss, grad_norm, pending.lr, end - max(pending.started, since or 0.0))


def train_step(run: TrainRun, step: int) -> StepResult:
    """Collective: :func:`launch_step` then :func:`finish_step` of step ``step``: the host waits for the device
    once, at the end. Raises ``FloatingPointError`` for a non-finite loss or gradient norm."""
    return finish_step(run, launch_step(run, step))


def watched_step(run: TrainRun, step: int, history: LossHistory) -> StepResult:
    """:func:`train_step`, recorded in ``history``; a non-finite step of a run that diverged before it
    (:meth:`LossHistory.diverged`) raises ``FloatingPointError`` saying so, with the learning rate."""
    return _watched(run, history, lambda: train_step(run, step), step)


def _watched(run: TrainRun, history: LossHistory, read: Callable[[], StepResult], step: int) -> StepResult:
    try:
        result = read()
    except FloatingPointError as err:
        raise FloatingPointError(history.diverged(step, run.spec.training.learning_rate) or str(err)) from None
    history.add(step, result)
    return result


def run_steps(run: TrainRun, steps: range, history: LossHistory,
              read_now: Callable[[int], bool] = lambda done: False) -> Iterator[tuple[int, StepResult]]:
    """Collective: the optimizer steps ``steps`` in order, yielding ``(step, result)`` for each (recorded in
    ``history`` as :func:`watched_step` does). Step ``s`` is read after step ``s + 1`` was launched, unless
    ``read_now(s + 1)`` (``s + 1`` steps done: e.g. a checkpoint is saved then), so that the caller sees the state
    after step ``s`` when it handles that step. A step's ``seconds`` run from its launch or from the caller's
    return from the previous step, whichever is later (in a steady loop, the device's time per step; a checkpoint
    save is not counted). Raises ``FloatingPointError`` as :func:`watched_step`, for the
    first non-finite step (the step after it may have been launched; its result is never yielded). Python's
    garbage collection runs after each launch, not inside steps (:class:`pitlab.trainer.gcpolicy.SteadyGC`)."""
    since = None  # when the caller last handed control back (a step's time leaves out the caller's own work)

    def read(p: PendingStep) -> tuple[int, StepResult]:
        return p.step, _watched(run, history, lambda: finish_step(run, p, since), p.step)

    pending: PendingStep | None = None
    with SteadyGC() as collector:
        for step in steps:
            launched = launch_step(run, step)
            collector.after_launch()  # while the device runs the step just launched
            if pending is not None:
                yield read(pending)
                since = time.perf_counter()
            pending = launched
            if read_now(step + 1):
                yield read(pending)
                since, pending = time.perf_counter(), None
        if pending is not None:
            yield read(pending)


def nonfinite_gradient_message(run: TrainRun, step: int, loss: float, grad_norm: float) -> str:
    """The error for a finite loss whose gradient norm is not finite (step ``step``, 0-based): it names the
    token chunks of every rank's microbatches (:meth:`PackedSequences.chunk_ids`), since the cause is the data
    or the model rather than the learning rate (the gradient is computed before the step's update)."""
    chunks = sorted({int(c) for micro in range(run.spec.training.gradient_accumulation_steps)
                     for r in range(run.world) for c in run.data.chunk_ids(step, micro, r)})
    span = run.spec.training.seq_len + 1
    return (f"step {step + 1}: gradient norm is {grad_norm} with a finite loss ({loss:.6g}); the gradient was "
            f"computed before this step's update, so lowering spec.training.learningRate does not help. The "
            f"step's token chunks (all ranks): {chunks} (chunk c = corpus tokens [c*{span}, (c+1)*{span})). "
            "A known cause: a random-initialised model whose padding token has a zero embedding row fed "
            "that token; exactly-zero hidden states make every RMSNorm's gradient 1/sqrt(eps) times larger and "
            "it overflows after about 10-20 layers (bench/RESULTS.md, layer streaming)")
