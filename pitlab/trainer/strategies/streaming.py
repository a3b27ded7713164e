"""The layer-streaming strategy: one GPU, ``method: lora``, the frozen decoder layers streamed from host memory
(:mod:`pitlab.trainer.streaming`; planned by :mod:`pitlab.trainer.plan_streaming`), in layer-major order when a
step has several microbatches (:mod:`pitlab.trainer.layer_major`)."""

from __future__ import annotations

from pathlib import Path

import torch

from pitlab.trainer.plan import MemoryPlan, ModelShape
from pitlab.trainer.strategies.base import Strategy


class StreamingStrategy(Strategy):
    """``model``: the peft LoRA model, its decoder layers bound to the streamer's device slots; the loss is the
    streamer's chunked cross-entropy (no tokens × vocab float32 logits). Not compiled by default; no activation
    checkpointing (the streamer checks its own budget and recomputes layer by layer). ``layer_major``: the
    :class:`~pitlab.trainer.layer_major.LayerMajor` driver when ``training.layerStreaming.layerMajor`` and
    ``gradientAccumulationSteps`` > 1, else None (one microbatch at a time)."""

    label = "layer streaming (one device)"
    compiled_by_default = False

    def __init__(self) -> None:
        self.streamer = None
        self.layer_major = None

    def plan(self, spec, shape: ModelShape | None = None, gpu_memory_gib: float | None = None,
             adapter=None) -> MemoryPlan:
        """:func:`pitlab.trainer.plan_streaming.plan_streaming` (``adapter`` is not used: it plans its own)."""
        from pitlab.trainer.plan_streaming import plan_streaming
        return plan_streaming(spec, shape, gpu_memory_gib=gpu_memory_gib)

    def build(self, base: Path, run_dir: Path, spec, device: torch.device, mesh, plan: MemoryPlan | None,
              lora: dict | None) -> str:
        """:func:`pitlab.trainer.streaming.load_streamed_model` (its store file, if any, under ``run_dir``;
        raises its budget errors before any weight is read), and the layer-major driver with the boundary
        placement of the plan checked on the device. Returns the loss label."""
        from pitlab.trainer.layer_major import LayerMajor
        from pitlab.trainer.streaming import STORE_DIR, load_streamed_model
        self.device = device
        self.activation_checkpointing = False
        self.model, self.streamer = load_streamed_model(base, spec, device, store_dir=run_dir / STORE_DIR)
        self.forward_model = self.model
        self.model.train()
        checked = self.streamer.plan
        if checked is not None and checked.layer_major:
            self.layer_major = LayerMajor(self.model, self.streamer, checked.microbatches,
                                          checked.boundary_gpu_layers, pin=spec.training.layer_streaming.pin_host)
        return "chunked cross-entropy (pitlab.trainer.streaming)"

    def forward_backward(self, batches: list[tuple[torch.Tensor, torch.Tensor]], accum: int,
                         sync_every_micro: bool) -> torch.Tensor:
        """Layer-major (:meth:`~pitlab.trainer.layer_major.LayerMajor.step`) when enabled, else one microbatch
        at a time (:meth:`Strategy.forward_backward`); the same gradients bit for bit."""
        if self.layer_major is None:
            return super().forward_backward(batches, accum, sync_every_micro)
        return self.layer_major.step(batches, accum)

    def loss(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The streamer's chunked loss head (:meth:`pitlab.trainer.streaming.LayerStreamer.loss`)."""
        return self.streamer.loss(self.model, input_ids, labels)

    def report(self) -> dict:
        """``layer_streaming``: the streamer's report (slots, bytes moved, host store) with ``order``
        (``layer-major`` or ``microbatch-major``), ``layer_major`` (the driver's report: boundary placement and
        bytes, or None) and ``planned_host_to_gpu_bytes_per_step`` (layers and boundaries)."""
        out = self.streamer.report()
        out["order"] = "microbatch-major" if self.layer_major is None else "layer-major"
        out["layer_major"] = None if self.layer_major is None else self.layer_major.report()
        plan = self.streamer.plan
        out["planned_host_to_gpu_bytes_per_step"] = None if plan is None else plan.host_to_gpu_bytes
        return {"layer_streaming": out}
