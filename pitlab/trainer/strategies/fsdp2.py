"""FSDP2: every decoder layer and the root ``fully_shard``-ed over the world (:mod:`pitlab.trainer.fsdp`); every
multi-GPU run, LoRA without layer streaming, and world size 1 when the single-device path does not apply. The
optimizer step is torch's clipping and AdamW, or the fused clip + AdamW of :mod:`pitlab.trainer.fused_step` over
each rank's local shards where enabled."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import record_function

from pitlab.trainer.fsdp import keep_gathered_between_microbatches, reduces_every_microbatch
from pitlab.trainer.fused_step import SHARDED_LABEL, MasterAdamW, fused_step_enabled, model_groups
from pitlab.trainer.plan import MemoryPlan, ModelShape, plan_checkpointing, plan_inputs
from pitlab.trainer.single_device import FSDP2_LABEL
from pitlab.trainer.strategies.base import Strategy, checkpointing_choice


class FSDP2Strategy(Strategy):
    """The model built on the meta device, each rank reading its rows from the safetensors (about one model
    copy per node), sharded with FSDP2; gradients reduce-scattered per microbatch unless
    ``gradientSyncEveryMicrobatch: false``; AdamW on the float32 shards (torch's, or
    :class:`~pitlab.trainer.fused_step.MasterAdamW` when ``fused``)."""

    label = FSDP2_LABEL

    def __init__(self) -> None:
        self.fused = False  # the optimizer is MasterAdamW over the DTensor parameters
        self.world = 1
        self.keep_gathered = False  # the parameters stay gathered between a step's microbatches
        self.lora = False  # the trainable parameters are LoRA adapters
        self.copy_in = ""  # the reduce-scatter copy-in's label (pitlab.trainer.fsdp_copy_in)
        self.grads = ""  # the accumulation and one-rank reduce's label (pitlab.trainer.fsdp_grads)

    def plan(self, spec, shape: ModelShape | None = None, gpu_memory_gib: float | None = None,
             adapter=None) -> MemoryPlan:
        """The FSDP2 plan (:func:`pitlab.trainer.plan.plan_checkpointing` with ``single=False``)."""
        shape, adapter, capacity = plan_inputs(spec, shape, gpu_memory_gib, adapter)
        return plan_checkpointing(spec, shape, adapter, capacity, False)

    def build(self, base: Path, run_dir: Path, spec, device: torch.device, mesh, plan: MemoryPlan | None,
              lora: dict | None) -> str:
        """:func:`pitlab.trainer.loading.load_sharded_model` over ``mesh`` with FSDP2's reduce-scatter copy-in
        as ``PITLAB_FSDP_COPY_IN`` says (:func:`pitlab.trainer.fsdp_copy_in.install_copy_in`), its gradient
        accumulation and one-rank reduce as ``PITLAB_FSDP_GRADS`` says
        (:func:`pitlab.trainer.fsdp_grads.install_grads`), then the loss (:func:`pitlab.trainer.loss.install_loss`).
        Returns the loss label."""
        from pitlab.trainer.fsdp_copy_in import install_copy_in
        from pitlab.trainer.fsdp_grads import install_grads
        from pitlab.trainer.loading import load_sharded_model
        from pitlab.trainer.loss import install_loss

        tr = spec.training
        self.copy_in = install_copy_in()
        self.device = device
        self.lora = lora is not None
        self.keep_gathered = keep_gathered_between_microbatches(mesh.size(), self.lora)
        self.world = mesh.size()
        self.activation_checkpointing = checkpointing_choice(plan, tr)
        self.model = self.forward_model = load_sharded_model(base, mesh, tr.precision, device,
                                                             self.activation_checkpointing, lora=lora, seed=tr.seed)
        self.grads = install_grads(self.model, self.world, device.type == "cuda")
        loss_impl = install_loss(self.model, tr.loss)
        self.model.train()
        return loss_impl

    def kernel_labels(self) -> dict:
        """``reduce_scatter_copy_in`` and ``fsdp_grads``: which copy-in (:mod:`pitlab.trainer.fsdp_copy_in`) and
        which accumulation and one-rank reduce (:mod:`pitlab.trainer.fsdp_grads`) FSDP2 uses."""
        return {"reduce_scatter_copy_in": self.copy_in, "fsdp_grads": self.grads}

    def before_microbatch(self, micro: int, accum: int, sync_every_micro: bool) -> None:
        """Unless FSDP2 reduces every microbatch (:func:`pitlab.trainer.fsdp.reduces_every_microbatch`: never with
        one rank, tests/test_single_device.py), keep the unsharded gradients until the last microbatch. Where the
        layers keep their gathered parameters through forward (one GPU, full weights:
        :func:`pitlab.trainer.fsdp.keep_gathered_between_microbatches`), also keep them after every backward but
        the last, so that a step all-gathers its parameters once, not once per microbatch."""
        if accum == 1:  # FSDP2's defaults: sync and reshard after the one backward
            return
        last = micro == accum - 1
        if not reduces_every_microbatch(self.world, sync_every_micro):
            self.model.set_requires_gradient_sync(last)
        if self.keep_gathered:
            self.model.set_reshard_after_backward(last)

    def build_optimizer(self, trainable: list, training, device: torch.device) -> tuple[torch.optim.Optimizer, str]:
        """:class:`~pitlab.trainer.fused_step.MasterAdamW` over the DTensor parameters ``trainable`` when
        :func:`~pitlab.trainer.fused_step.fused_step_enabled` (clipping and AdamW in one pass per local shard;
        compiled on CUDA), else torch's AdamW (:meth:`Strategy.build_optimizer`)."""
        cuda = device.type == "cuda"
        self.fused = fused_step_enabled(training, cuda, fsdp2=True, lora=self.lora)
        if not self.fused:
            return super().build_optimizer(trainable, training, device)
        optimizer = MasterAdamW(trainable, compiled=cuda, lr=training.learning_rate,
                                weight_decay=training.weight_decay, groups=model_groups(self.model, trainable))
        return optimizer, SHARDED_LABEL + ("" if cuda else ", eager on the CPU")

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scheduler, max_norm: float) -> torch.Tensor:
        """The fused step (:meth:`~pitlab.trainer.fused_step.MasterAdamW.clip_step_cast` on the float32 DTensor
        gradients, no copies), or torch's clipping and AdamW (:meth:`Strategy.optimizer_step`); then the
        gradients dropped and the schedule stepped. Returns the gradient norm before clipping (0-d float32 tensor,
        the same on every rank, not read)."""
        if not self.fused:
            return super().optimizer_step(optimizer, scheduler, max_norm)
        with record_function("step.optimizer"):  # clipping and AdamW in one pass per local shard
            grads = [p.grad for p in optimizer.param_groups[0]["params"]]
            grad_norm = optimizer.clip_step_cast(grads, None, max_norm)
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        return grad_norm
