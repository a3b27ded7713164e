"""FSDP2 sharding of a Hugging Face decoder-only causal LM."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a causal LM (``model.model.layers`` for llama, qwen3_moe, qwen3_5_moe_text), also
    of one wrapped by peft (``PeftModel.get_base_model()``).

    Raises ``TypeError`` naming the model class if it has no such ``ModuleList``.
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(inner, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise TypeError(f"{type(model).__name__}: expected decoder layers at model.model.layers (a non-empty "
                        "ModuleList); this architecture is not supported by the FSDP2 wrapper")
    return layers


def mixed_precision_policy(precision: str) -> MixedPrecisionPolicy:
    """``bf16``: bfloat16 parameters in forward/backward, float32 gradient reduction (sharded params and
    optimizer state stay float32). ``fp32``: no casting. Raises ``ValueError`` for another value."""
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if precision == "fp32":
        return MixedPrecisionPolicy()
    raise ValueError(f"spec.training.precision: must be fp32 or bf16 (got {precision!r})")


def reshard_after_forward(world_size: int, lora: bool) -> bool:
    """Whether each layer frees its gathered compute-dtype parameters after forward (and gathers them again in
    backward). Full-weight training on one GPU keeps them: there is nothing to shard, and keeping them saves the
    second gather (a cast of every parameter) for ``c × P`` bytes, which the memory planner counts. LoRA keeps
    resharding (its frozen base is already stored in the compute dtype: a second copy would double it)."""
    return world_size > 1 or lora


def reduces_every_microbatch(world_size: int, sync_every_microbatch: bool) -> bool:
    """Whether FSDP2 reduce-scatters after every microbatch of a step (``gradientSyncEveryMicrobatch``): never with
    one rank, whose float32 sums of the unsharded gradients are the sharded gradients' size and bits; otherwise as
    the spec says. Else the unsharded gradients are kept until the last microbatch."""
    return sync_every_microbatch and world_size > 1


def keep_gathered_between_microbatches(world_size: int, lora: bool) -> bool:
    """Whether the gathered compute-dtype parameters stay gathered from one microbatch's backward to the next
    microbatch's forward (FSDP2's ``set_reshard_after_backward(False)`` on every microbatch but the last): where
    the layers keep them through forward anyway (:func:`reshard_after_forward` is False), so that the step's peak
    memory is unchanged and only the first microbatch of a step all-gathers (and casts) the parameters."""
    return not reshard_after_forward(world_size, lora)


def shard_model(model: nn.Module, mesh: DeviceMesh, precision: str, lora: bool = False) -> nn.Module:
    """Apply FSDP2 ``fully_shard`` to each decoder layer, then to the root module; returns ``model``.

    Parameters become ``DTensor`` shards (dim-0 ``Shard`` over ``mesh``) on the mesh's device; names from
    ``named_parameters()`` are unchanged. Gradients are reduce-scattered after every backward (also per
    microbatch under gradient accumulation), so no unsharded gradient is kept between microbatches. Layers are
    resharded after forward as :func:`reshard_after_forward` says for the mesh's size.
    """
    policy = mixed_precision_policy(precision)
    reshard = reshard_after_forward(mesh.size(), lora)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    return model
