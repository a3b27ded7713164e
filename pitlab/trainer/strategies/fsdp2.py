"""FSDP2: every decoder layer and the root ``fully_shard``-ed over the world (:mod:`pitlab.trainer.fsdp`); every
multi-GPU run, LoRA without layer streaming, and world size 1 when the single-device path does not apply."""

from __future__ import annotations

from pathlib import Path

import torch

from pitlab.trainer.plan import MemoryPlan, ModelShape, plan_checkpointing, plan_inputs
from pitlab.trainer.single_device import FSDP2_LABEL
from pitlab.trainer.strategies.base import Strategy, checkpointing_choice


class FSDP2Strategy(Strategy):
    """The model built on the meta device, each rank reading its rows from the safetensors (about one model
    copy per node), sharded with FSDP2; gradients reduce-scattered per microbatch unless
    ``gradientSyncEveryMicrobatch: false``; torch's AdamW on the float32 shards."""

    label = FSDP2_LABEL

    def plan(self, spec, shape: ModelShape | None = None, gpu_memory_gib: float | None = None,
             adapter=None) -> MemoryPlan:
        """The FSDP2 plan (:func:`pitlab.trainer.plan.plan_checkpointing` with ``single=False``)."""
        shape, adapter, capacity = plan_inputs(spec, shape, gpu_memory_gib, adapter)
        return plan_checkpointing(spec, shape, adapter, capacity, False)

    def build(self, base: Path, run_dir: Path, spec, device: torch.device, mesh, plan: MemoryPlan | None,
              lora: dict | None) -> str:
        """:func:`pitlab.trainer.loading.load_sharded_model` over ``mesh``, then the loss
        (:func:`pitlab.trainer.loss.install_loss`). Returns the loss label."""
        from pitlab.trainer.loading import load_sharded_model
        from pitlab.trainer.loss import install_loss

        tr = spec.training
        self.device = device
        self.activation_checkpointing = checkpointing_choice(plan, tr)
        self.model = self.forward_model = load_sharded_model(base, mesh, tr.precision, device,
                                                             self.activation_checkpointing, lora=lora, seed=tr.seed)
        loss_impl = install_loss(self.model, tr.loss)
        self.model.train()
        return loss_impl

    def before_microbatch(self, micro: int, accum: int, sync_every_micro: bool) -> None:
        """Without per-microbatch sync: keep the unsharded gradients until the last microbatch."""
        if not sync_every_micro:
            self.model.set_requires_gradient_sync(micro == accum - 1)
