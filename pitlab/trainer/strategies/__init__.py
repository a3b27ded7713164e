"""The trainer's execution strategies behind one protocol (:class:`~pitlab.trainer.strategies.base.Strategy`):
FSDP2, single device and layer streaming (docs/design.md, "Trainer": strategies)."""

from __future__ import annotations

from pitlab.trainer.single_device import uses_compute_copy
from pitlab.trainer.strategies.base import Strategy, clip_grad_norm
from pitlab.trainer.strategies.fsdp2 import FSDP2Strategy
from pitlab.trainer.strategies.single import SingleDeviceStrategy
from pitlab.trainer.strategies.streaming import StreamingStrategy

__all__ = ["FSDP2Strategy", "SingleDeviceStrategy", "Strategy", "StreamingStrategy", "choose_strategy",
           "clip_grad_norm"]


def choose_strategy(spec, world_size: int, plan=None) -> Strategy:
    """The strategy of a run of ``spec`` (a ``PitTrainingSpec``) on ``world_size`` ranks: layer streaming when
    ``training.layerStreaming.enabled``; single device when
    :func:`~pitlab.trainer.single_device.uses_compute_copy` holds, unless ``plan`` (a
    :class:`~pitlab.trainer.plan.MemoryPlan` of this world size; None: not planned) chose FSDP2 because only
    its plan fits; otherwise FSDP2."""
    if spec.training.layer_streaming.enabled:
        return StreamingStrategy()
    if uses_compute_copy(spec, world_size) and (plan is None or plan.world_size != world_size or plan.single_device):
        return SingleDeviceStrategy()
    return FSDP2Strategy()
