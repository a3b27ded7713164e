"""The protocol every execution strategy of the trainer follows, and the steps they share.

A strategy is one way of holding and stepping the model: :mod:`~pitlab.trainer.strategies.fsdp2` (FSDP2, every
multi-GPU run), :mod:`~pitlab.trainer.strategies.single` (world size 1: float32 masters and a bf16 compute copy)
and :mod:`~pitlab.trainer.strategies.streaming` (one GPU, LoRA, decoder layers streamed from host memory).
:func:`pitlab.trainer.strategies.choose_strategy` picks one; the planner asks it for its memory plan, and
:func:`pitlab.trainer.train.setup_run` / :func:`~pitlab.trainer.step.launch_step` drive it (docs/design.md,
"Trainer": strategies).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import record_function

from pitlab.trainer.fused_step import TORCH_LABEL as TORCH_STEP_LABEL
from pitlab.trainer.fused_step import total_norm
from pitlab.trainer.kernels import cudagraph_step_begin
from pitlab.trainer.plan import MemoryPlan, ModelShape


class Strategy:
    """How a run holds its model and runs one optimizer step; subclasses implement :meth:`plan` and :meth:`build`.

    After :meth:`build`: ``model`` (the module AdamW, clipping, checkpoints, the merge and the summary's digests
    see), ``forward_model`` (the module forward and backward run on; ``model`` unless the strategy keeps a
    compute copy), ``activation_checkpointing`` (bool) and ``device``. ``label``: the summary's ``parallelism``;
    ``compiled_by_default``: whether ``training.compile`` unset compiles the decoder layers (full-weight runs);
    ``cuda_graphs_by_default``: whether they may be compiled with CUDA graphs (:func:`~pitlab.trainer.kernels.
    auto_compile_mode`).
    ``compute`` (a :class:`~pitlab.trainer.single_device.ComputeCopy`) and ``streamer`` (a
    :class:`~pitlab.trainer.streaming.LayerStreamer`) are None unless the strategy has one.
    """

    label = ""
    compiled_by_default = True
    cuda_graphs_by_default = False
    compute = None
    streamer = None
    model: torch.nn.Module | None = None
    forward_model: torch.nn.Module | None = None
    activation_checkpointing = False
    device: torch.device | None = None

    def plan(self, spec, shape: ModelShape | None = None, gpu_memory_gib: float | None = None,
             adapter=None) -> MemoryPlan:
        """The memory plan of ``spec`` (a ``PitTrainingSpec``) on this strategy, bytes per GPU
        (:func:`pitlab.trainer.plan.plan_memory` documents the arguments). Raises ``SpecError`` as it does."""
        raise NotImplementedError

    def build(self, base: Path, run_dir: Path, spec, device: torch.device, mesh, plan: MemoryPlan | None,
              lora: dict | None) -> str:
        """Collective: load the model of ``base`` (HF directory) for ``spec`` on ``device`` (``mesh``: the
        world's device mesh; ``plan``: the planner's, None when it could not plan; ``lora``: the adapter record
        or None), put it in training mode and install the loss. Returns the loss implementation's label.
        Raises as the loaders do (``FileNotFoundError``, ``SpecError``, budget errors)."""
        raise NotImplementedError

    def build_optimizer(self, trainable: list, training, device: torch.device) -> tuple[torch.optim.Optimizer, str]:
        """Torch's AdamW over ``trainable`` (``training``: a ``TrainingSpec``; fused kernels on CUDA) and its label
        for the ``kernels`` report (layer streaming; FSDP2 and the single device override it)."""
        optimizer = torch.optim.AdamW(trainable, lr=training.learning_rate, weight_decay=training.weight_decay,
                                      fused=device.type == "cuda")
        return optimizer, TORCH_STEP_LABEL + (
            " (fusedOptimizer: FSDP2 and the single-device path only)" if training.fused_optimizer else "")

    def forward_backward(self, batches: list[tuple[torch.Tensor, torch.Tensor]], accum: int,
                         sync_every_micro: bool) -> torch.Tensor:
        """Forward and backward of every microbatch ``(input_ids, labels)`` (int64 ``[batch, seq]`` on the
        device), the loss scaled by ``1 / accum``; gradients as the strategy keeps them. ``sync_every_micro``:
        reduce gradients after every microbatch (else FSDP2 keeps them unsharded until the last). Returns the sum
        of the microbatches' mean losses (0-d float32 tensor on the device, not read)."""
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        for micro, (input_ids, labels) in enumerate(batches):
            cudagraph_step_begin()
            self.before_microbatch(micro, accum, sync_every_micro)
            with record_function("step.forward"):
                loss = self.loss(input_ids, labels)
            with record_function("step.backward"):
                (loss / accum).backward()
                self.after_backward(accum)
            loss_sum += loss.detach()
        return loss_sum

    def loss(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One microbatch's mean next-token loss (0-d, nats) from ``forward_model``."""
        return self.forward_model(input_ids=input_ids, labels=labels).loss

    def before_microbatch(self, micro: int, accum: int, sync_every_micro: bool) -> None:
        """Called before microbatch ``micro`` (0-based) of ``accum``; nothing by default."""

    def after_backward(self, accum: int) -> None:
        """Called after each microbatch's backward; nothing by default."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scheduler, max_norm: float) -> torch.Tensor:
        """Clip the gradients to global L2 norm ``max_norm``, step ``optimizer``, drop the gradients, step the
        LR ``scheduler``. Returns the gradient norm before clipping (0-d tensor on the device, not read)."""
        with record_function("step.clip"):
            grad_norm = clip_grad_norm(self.model, max_norm)
        with record_function("step.optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            self.after_update()
        return grad_norm

    def after_update(self) -> None:
        """Called inside ``step.optimizer`` after AdamW and the schedule; nothing by default."""

    def after_load(self) -> None:
        """After ``model`` was loaded from a checkpoint; nothing by default."""

    def kernel_labels(self) -> dict:
        """The strategy's own entries of the run's ``kernels`` report (none by default)."""
        return {}

    def report(self) -> dict:
        """The strategy's entries of ``summary.json``: ``layer_streaming`` (None unless streaming)."""
        return {"layer_streaming": None}

    def close(self) -> None:
        """Drop the references to the model (its memory is freed once nothing else holds it)."""
        self.model = self.forward_model = None


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip gradients to global L2 norm ``max_norm``; return the norm before clipping (a 0-d tensor on the
    gradients' device, not read here: :func:`pitlab.trainer.step.finish_step` reads it with the loss, so the
    host does not wait for backward before launching the optimizer step). DTensor gradients (FSDP2) give the
    norm over all shards."""
    total = total_norm([p.grad for p in model.parameters() if p.grad is not None])
    torch.nn.utils.clip_grads_with_norm_([p for p in model.parameters() if p.grad is not None], max_norm, total)
    return total


def checkpointing_choice(plan: MemoryPlan | None, training) -> bool:
    """Activation checkpointing of a run: the plan's choice, or ``training.activationCheckpointing`` (off when
    unset) when there is no plan."""
    return plan.activation_checkpointing if plan is not None else bool(training.activation_checkpointing)
