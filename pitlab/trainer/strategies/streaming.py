"""The layer-streaming strategy: one GPU, ``method: lora``, the frozen decoder layers streamed from host memory
(:mod:`pitlab.trainer.streaming`; planned by :mod:`pitlab.trainer.plan_streaming`)."""

from __future__ import annotations

from pathlib import Path

import torch

from pitlab.trainer.plan import MemoryPlan, ModelShape
from pitlab.trainer.strategies.base import Strategy


class StreamingStrategy(Strategy):
    """``model``: the peft LoRA model, its decoder layers bound to the streamer's device slots; the loss is the
    streamer's chunked cross-entropy (no tokens × vocab float32 logits). Not compiled by default; no activation
    checkpointing (the streamer checks its own budget and recomputes layer by layer)."""

    label = "layer streaming (one device)"
    compiled_by_default = False

    def __init__(self) -> None:
        self.streamer = None

    def plan(self, spec, shape: ModelShape | None = None, gpu_memory_gib: float | None = None,
             adapter=None) -> MemoryPlan:
        """:func:`pitlab.trainer.plan_streaming.plan_streaming` (``adapter`` is not used: it plans its own)."""
        from pitlab.trainer.plan_streaming import plan_streaming
        return plan_streaming(spec, shape, gpu_memory_gib=gpu_memory_gib)

    def build(self, base: Path, run_dir: Path, spec, device: torch.device, mesh, plan: MemoryPlan | None,
              lora: dict | None) -> str:
        """:func:`pitlab.trainer.streaming.load_streamed_model` (its store file, if any, under ``run_dir``;
        raises its budget errors before any weight is read). Returns the loss label."""
        from pitlab.trainer.streaming import STORE_DIR, load_streamed_model
        self.device = device
        self.activation_checkpointing = False
        self.model, self.streamer = load_streamed_model(base, spec, device, store_dir=run_dir / STORE_DIR)
        self.forward_model = self.model
        self.model.train()
        return "chunked cross-entropy (pitlab.trainer.streaming)"

    def loss(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The streamer's chunked loss head (:meth:`pitlab.trainer.streaming.LayerStreamer.loss`)."""
        return self.streamer.loss(self.model, input_ids, labels)

    def report(self) -> dict:
        """``layer_streaming``: the streamer's report (slots, bytes moved, host store)."""
        return {"layer_streaming": self.streamer.report()}
