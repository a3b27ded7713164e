"""Content digests of tensors, shared by the trainer (summary) and the merge (verification)."""

from __future__ import annotations

import hashlib

import torch
from torch import nn


def tensor_sha256(t: torch.Tensor) -> str:
    """Hex sha256 of a (local, non-distributed) tensor's raw bytes in row-major order.

    The dtype's bytes are hashed as they are in memory (little-endian on supported hosts); shape and
    dtype are not part of the digest. Works for every dtype, including bfloat16 and 0-d tensors.
    """
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


def parameter_sha256(model: nn.Module) -> dict[str, str]:
    """``{name: sha256}`` of every parameter of a non-distributed ``model`` (``named_parameters()`` order)."""
    return {name: tensor_sha256(p) for name, p in model.named_parameters()}
