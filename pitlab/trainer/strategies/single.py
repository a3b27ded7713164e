"""The single-device strategy: world size 1, ``method: full``, ``precision: bf16`` without FSDP2; float32 masters
and a bf16 compute copy (:mod:`pitlab.trainer.single_device`, bit-identical to FSDP2 at world size 1), with the
fused clip + AdamW + cast step (:mod:`pitlab.trainer.fused_step`) where enabled."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import record_function

from pitlab.trainer.fused_step import LABEL as FUSED_STEP_LABEL
from pitlab.trainer.fused_step import TORCH_LABEL as TORCH_STEP_LABEL
from pitlab.trainer.fused_step import (MasterAdamW, compiled_add_sums, compiled_pair_sums, fused_step_enabled,
                                       model_groups)
from pitlab.trainer.kernels import cuda_graphs_recorded
from pitlab.trainer.plan import GiB, MemoryPlan, ModelShape, plan_checkpointing, plan_inputs
from pitlab.trainer.single_device import LABEL, load_single_device_model
from pitlab.trainer.strategies.base import Strategy, checkpointing_choice


class SingleDeviceStrategy(Strategy):
    """``model``: the float32 master; ``forward_model``: its bf16 compute copy (``compute.model``)."""

    label = LABEL
    cuda_graphs_by_default = True  # measured: bench/RESULTS.md, "CUDA graphs over the compiled layers"

    def __init__(self) -> None:
        self.compute = None
        self.fused = False  # the optimizer is MasterAdamW
        self.micro = 0  # the microbatch (0-based) whose backward is in progress
        self.pair_fn = None  # pitlab.trainer.fused_step.pair_sums compiled (CUDA), or None: eager
        self.add_fn = None  # pitlab.trainer.fused_step.add_sums compiled (CUDA), or None: torch._foreach_add_

    def plan(self, spec, shape: ModelShape | None = None, gpu_memory_gib: float | None = None,
             adapter=None) -> MemoryPlan:
        """The single-device plan, or FSDP2's when only FSDP2's fits (it frees each layer's bf16 copy and
        gradients in backward; ``MemoryPlan.single_device`` says which, and a note says why)."""
        shape, adapter, capacity = plan_inputs(spec, shape, gpu_memory_gib, adapter)
        chosen = plan_checkpointing(spec, shape, adapter, capacity, True)
        if chosen.fits is False:
            fsdp2 = plan_checkpointing(spec, shape, adapter, capacity, False)
            if fsdp2.fits:
                fsdp2.notes.append(f"world size 1 on FSDP2: the single-device path (float32 masters + bf16 compute "
                                   f"copy, faster) would need {chosen.peak_bytes / GiB:.2f} GiB")
                return fsdp2
        return chosen

    def build(self, base: Path, run_dir: Path, spec, device: torch.device, mesh, plan: MemoryPlan | None,
              lora: dict | None) -> str:
        """The master and its compute copy (:func:`pitlab.trainer.single_device.load_single_device_model`), the
        loss installed on the copy. Returns the loss label."""
        from pitlab.trainer.loss import install_loss

        tr = spec.training
        self.device = device
        self.activation_checkpointing = checkpointing_choice(plan, tr)
        self.model, self.compute = load_single_device_model(base, spec, device, self.activation_checkpointing)
        self.compute.model.train()
        self.forward_model = self.compute.model
        loss_impl = install_loss(self.compute.model, tr.loss)
        self.model.train()
        return loss_impl

    def build_optimizer(self, trainable: list, training, device: torch.device) -> tuple[torch.optim.Optimizer, str]:
        """:class:`~pitlab.trainer.fused_step.MasterAdamW` when
        :func:`~pitlab.trainer.fused_step.fused_step_enabled` (clipping, AdamW and the cast into the copy in one
        pass per parameter; compiled on CUDA), else torch's AdamW."""
        cuda = device.type == "cuda"
        self.fused = fused_step_enabled(training, cuda)
        if not self.fused:
            optimizer = torch.optim.AdamW(trainable, lr=training.learning_rate,
                                          weight_decay=training.weight_decay, fused=cuda)
            return optimizer, TORCH_STEP_LABEL
        optimizer = MasterAdamW(trainable, compiled=cuda, lr=training.learning_rate,
                                weight_decay=training.weight_decay, groups=model_groups(self.model, trainable))
        if cuda and training.gradient_accumulation_steps > 2:  # only then are two held gradients summed
            self.pair_fn = compiled_pair_sums(self.compute.pair_signatures())
        if cuda and training.gradient_accumulation_steps > 3:  # and only then added to
            self.add_fn = compiled_add_sums(self.compute.pair_signatures())
        return optimizer, FUSED_STEP_LABEL + ("" if cuda else ", eager on the CPU")

    def before_microbatch(self, micro: int, accum: int, sync_every_micro: bool) -> None:
        """Remember which microbatch of the step runs (:meth:`after_backward` keeps its gradients by it)."""
        self.micro = micro

    def after_backward(self, accum: int) -> None:
        """The copy's bf16 gradients added into the float32 masters' (FSDP2's reduce of one rank); with the fused
        step (:meth:`~pitlab.trainer.single_device.ComputeCopy.gather_grads`) the first held, the second summed
        with it, and the last left for the step to read."""
        if not self.fused:
            self.compute.accumulate_grads()
            return
        self.compute.gather_grads(self.micro == accum - 1, self.compute.in_place_holds(cuda_graphs_recorded()),
                                  pair_fn=self.pair_fn, add_fn=self.add_fn)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scheduler, max_norm: float) -> torch.Tensor:
        """The fused step (:meth:`~pitlab.trainer.single_device.ComputeCopy.fused_step`), or torch's clipping and
        AdamW followed by the masters' cast into the copy. Returns the gradient norm before clipping (0-d float32
        tensor, not read)."""
        if not self.fused:
            return super().optimizer_step(optimizer, scheduler, max_norm)
        with record_function("step.optimizer"):  # clipping, AdamW and the cast into the copy in one pass
            grad_norm = self.compute.fused_step(optimizer, max_norm)
            scheduler.step()
        return grad_norm

    def after_update(self) -> None:
        """The updated masters cast into the bf16 copy (FSDP2's copy-in cast)."""
        self.compute.refresh()

    def after_load(self) -> None:
        """The loaded float32 masters cast into the bf16 copy."""
        self.compute.refresh()

    def close(self) -> None:
        """Drop the master and the compute copy."""
        super().close()
        self.compute = None
