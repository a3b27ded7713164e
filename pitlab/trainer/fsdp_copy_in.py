"""FSDP2's reduce-scatter copy-in without per-block host metadata.

Before each reduce-scatter FSDP2 packs a parameter group's unsharded gradients into one buffer, each gradient's
dim 0 padded to a multiple of the world size and split into one row block per rank, cast to the reduce dtype
(``foreach_reduce_scatter_copy_in`` in ``torch.distributed.fsdp._fully_shard._fsdp_collectives``, through
``torch._chunk_cat``). On CUDA torch's ``_chunk_cat`` builds an ``int64`` host vector with one entry per 2,048 bytes
of the buffer, copies it into pinned memory and then to the device before the kernel runs: 16 MB for the float32
embedding and LM head of a 248,320-token vocabulary at hidden size 2,048, whose host work FSDP2 does after the
whole backward has been launched, so the GPU can wait for it (docs/training.md, "FSDP2's reduce-scatter
copy-in"). :func:`reduce_scatter_copy_in` writes the same buffer with one ``copy_`` per gradient (at most two copies
and two fills where dim 0 does not divide): the same bytes (a cast to a wider float type is exact), and host work
that does not grow with the gradients' size. A float32 sum given :func:`add_on_copy_in` is written with the
microbatch gradient it still lacks added in the same pass (:mod:`pitlab.trainer.fsdp_grads`).
"""

from __future__ import annotations

import torch

from pitlab.trainer.knobs import COPY_IN_ENV, copy_in_mode

LABEL = "pitlab.trainer.fsdp_copy_in (one copy per gradient)"
TORCH_LABEL = "torch _chunk_cat (FSDP2's own)"
_ADD_ON_COPY: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(sum) -> (sum, gradient to add as it is copied)


def add_on_copy_in(total: torch.Tensor, grad: torch.Tensor) -> None:
    """Have the next :func:`reduce_scatter_copy_in` that packs ``total`` (a float32 gradient sum) write
    ``total + grad`` instead (``grad`` the same shape, cast exactly; one rounding, the bits of ``total += grad``
    followed by the copy)."""
    _ADD_ON_COPY[id(total)] = (total, grad)


def pending_adds(tensors: list) -> int:
    """How many of ``tensors`` still wait for :func:`add_on_copy_in`'s add (0 once a copy-in packed them)."""
    return sum(1 for t in tensors if id(t) in _ADD_ON_COPY and _ADD_ON_COPY[id(t)][0] is t)


def _write(dst: torch.Tensor, src: torch.Tensor, extra: torch.Tensor | None) -> None:
    if extra is None:
        dst.copy_(src)
    else:
        torch.add(src, extra, out=dst)


def reduce_scatter_copy_in(unsharded_grads: list[torch.Tensor], reduce_scatter_input: torch.Tensor,
                           world_size: int) -> None:
    """Write ``unsharded_grads`` (each at least 1-D) into ``reduce_scatter_input`` (1-D, the reduce dtype) as
    FSDP2's copy-in does: viewed as ``[world_size, chunk]``, rank r's row holds, for each gradient in order, its
    rows ``[r·p, (r + 1)·p)`` (``p`` = dim 0 rounded up to a multiple of ``world_size``, divided by it), flattened,
    zeros past the gradient's last row. One ``copy_`` per gradient whose dim 0 divides, at most two copies and two
    fills otherwise (an add instead of a copy for a sum given :func:`add_on_copy_in`). Raises ``ValueError``,
    before writing anything, if the buffer's size is not ``world_size`` × the gradients' padded total."""
    layout = []  # (rows, rows per rank, elements per row) of each gradient
    for grad in unsharded_grads:
        rows = grad.size(0)
        layout.append((rows, -(-rows // world_size), grad.numel() // rows if rows else 0))
    per_rank_total = sum(per_rank * trailing for _, per_rank, trailing in layout)
    if reduce_scatter_input.numel() != world_size * per_rank_total:
        raise ValueError(f"reduce_scatter_copy_in: a buffer of {reduce_scatter_input.numel()} elements for "
                         f"{world_size} ranks × {per_rank_total} padded gradient elements")
    out = reduce_scatter_input.view(world_size, -1)
    offset = 0
    for grad, (rows, per_rank, trailing) in zip(unsharded_grads, layout):
        width = per_rank * trailing
        entry = _ADD_ON_COPY.pop(id(grad), None)
        extra = entry[1].reshape(rows, trailing) if entry is not None and entry[0] is grad else None
        if width == 0:  # nothing to write
            continue
        dst = out[:, offset:offset + width].view(world_size, per_rank, trailing)
        src = grad.reshape(rows, trailing)
        full, rest = divmod(rows, per_rank)
        _write(dst[:full], src[:full * per_rank].view(full, per_rank, trailing),
               None if extra is None else extra[:full * per_rank].view(full, per_rank, trailing))
        if rest:  # the rank holding the gradient's last rows, then padding
            _write(dst[full, :rest], src[full * per_rank:], None if extra is None else extra[full * per_rank:])
            dst[full, rest:].zero_()
        if full + bool(rest) < world_size:  # ranks past the gradient's rows
            dst[full + bool(rest):].zero_()
        offset += width


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
