"""FSDP2's reduce-scatter copy-in without per-block host metadata.

Before each reduce-scatter FSDP2 packs a parameter group's unsharded gradients into one buffer, each gradient's
dim 0 padded to a multiple of the world size and split into one row block per rank, cast to the reduce dtype
(``foreach_reduce_scatter_copy_in`` in ``torch.distributed.fsdp._fully_shard._fsdp_collectives``, through
``torch._chunk_cat``). On CUDA torch's ``_chunk_cat`` builds an ``int64`` host vector with one entry per 2,048 bytes
of the buffer, copies it into pinned memory and then to the device before the kernel runs: 16 MB for the float32
embedding and LM head of a 248,320-token vocabulary at hidden size 2,048, whose host work FSDP2 does after the
whole backward has been launched, so the GPU waits for it (5.1-19.7 ms per step on an H100, bench/RESULTS.md,
2026-12-06). :func:`reduce_scatter_copy_in` writes the same buffer with one ``copy_`` per gradient (a padded row
block per rank where dim 0 does not divide): the same bytes (a cast to a wider float type is exact), and host work
that does not grow with the gradients' size.
"""

from __future__ import annotations

import torch

from pitlab.trainer.knobs import COPY_IN_ENV, copy_in_mode

LABEL = "pitlab.trainer.fsdp_copy_in (one copy per gradient)"
TORCH_LABEL = "torch _chunk_cat (FSDP2's own)"


def reduce_scatter_copy_in(unsharded_grads: list[torch.Tensor], reduce_scatter_input: torch.Tensor,
                           world_size: int) -> None:
    """Write ``unsharded_grads`` into ``reduce_scatter_input`` (1-D, the reduce dtype) as FSDP2's copy-in does:
    viewed as ``[world_size, chunk]``, rank r's row holds, for each gradient in order, its rows
    ``[r·p, (r + 1)·p)`` (``p`` = dim 0 rounded up to a multiple of ``world_size``, divided by it), flattened,
    zeros past the gradient's last row. Raises ``ValueError`` if the buffer's size is not the gradients' padded
    total."""
    out = reduce_scatter_input.view(world_size, -1)
    offset = 0
    for grad in unsharded_grads:
        rows = grad.size(0) if grad.dim() else 1
        per_rank = -(-rows // world_size)
        trailing = grad.numel() // rows if rows else 0
        width = per_rank * trailing
        dst = out[:, offset:offset + width].view(world_size, per_rank, trailing)
        src = grad.reshape(rows, trailing)
        if per_rank * world_size == rows:
            dst.copy_(src.view(world_size, per_rank, trailing))
        else:
            for r in range(world_size):
                lo, hi = min(r * per_rank, rows), min((r + 1) * per_rank, rows)
                dst[r, :hi - lo].copy_(src[lo:hi])
                dst[r, hi - lo:].zero_()
        offset += width
    if offset != out.size(1):
        raise ValueError(f"reduce_scatter_copy_in: the buffer holds {out.size(1)} elements per rank, the gradients "
                         f"{offset}")


def install_copy_in(env: dict | None = None) -> str:
    """Make FSDP2 use :func:`reduce_scatter_copy_in` for its reduce-scatter copy-in in this process, or its own
    where ``PITLAB_FSDP_COPY_IN=torch`` in ``env`` (default ``os.environ``); returns the copy-in's label for the
    run's ``kernels`` report. Raises ``ValueError`` for another value of the variable, and ``RuntimeError`` if this
    torch has no ``foreach_reduce_scatter_copy_in`` to replace."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

    choice = copy_in_mode(env)
    original = getattr(collectives, "_torch_copy_in", None) or getattr(collectives,
                                                                      "foreach_reduce_scatter_copy_in", None)
    if original is None:
        raise RuntimeError(f"torch {torch.__version__}: FSDP2 has no foreach_reduce_scatter_copy_in; set "
                           f"{COPY_IN_ENV}=torch")
    collectives._torch_copy_in = original
    collectives.foreach_reduce_scatter_copy_in = reduce_scatter_copy_in if choice == "pitlab" else original
    return LABEL if choice == "pitlab" else TORCH_LABEL
