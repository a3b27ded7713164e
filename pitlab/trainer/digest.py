"""Content digests of tensors, shared by the trainer (summary) and the merge (verification)."""

from __future__ import annotations

import hashlib

import torch


def tensor_sha256(t: torch.Tensor) -> str:
    """Hex sha256 of a (local, non-distributed) tensor's raw bytes in row-major order.

    The dtype's bytes are hashed as they are in memory (little-endian on supported hosts); shape and
    dtype are not part of the digest. Works for every dtype, including bfloat16 and 0-d tensors.
    """
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    # hashlib reads the tensor's memory through the buffer protocol (no copy) and releases the GIL while it hashes
    return hashlib.sha256(memoryview(flat.view(torch.uint8).numpy())).hexdigest()

