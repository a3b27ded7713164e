"""Packed training sequences: a deterministic, seeded, rank-sliced order over a flat token array.

The token array is cut into ``n_chunks = len(tokens) // (seq_len + 1)`` non-overlapping chunks of
``seq_len + 1`` tokens (the tail that does not fill a chunk is dropped); a chunk gives
``input_ids = chunk[:-1]`` and ``labels = chunk[1:]``. Epoch ``e`` visits the chunks in the order
``numpy.random.default_rng(seed + e).permutation(n_chunks)``; epochs follow each other in one stream.
Optimizer step ``s`` consumes the next ``micro_batch * grad_accum * world_size`` chunks of the stream;
inside a step, microbatch ``a`` of rank ``r`` takes the ``micro_batch`` chunks at offset
``(a * world_size + r) * micro_batch``. The global order therefore depends only on the seed, the
sequence length and the world size (through the chunks per step), never on timing.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from pitlab.api import SpecError


def steps_for_budget(tokens: int, seq_len: int, micro_batch: int, grad_accum: int, world_size: int) -> int:
    """Optimizer steps for a token budget: ``ceil(tokens / (seq_len * micro_batch * grad_accum * world_size))``.

    Raises ``ValueError`` if any argument is < 1.
    """
    for name, v in (("tokens", tokens), ("seq_len", seq_len), ("micro_batch", micro_batch),
                    ("grad_accum", grad_accum), ("world_size", world_size)):
        if v < 1:
            raise ValueError(f"steps_for_budget: {name} must be >= 1 (got {v})")
    return math.ceil(tokens / (seq_len * micro_batch * grad_accum * world_size))


class PackedSequences:
    """Packed chunks of a flat token array, served per (step, microbatch, rank).

    ``tokens``: 1-D integer array (e.g. the ``uint32`` memory map of ``tokens.npy``). Raises
    :class:`pitlab.api.SpecError` naming ``spec.training.seqLen`` when the array holds fewer than
    ``seq_len + 1`` tokens (not even one sequence), and ``ValueError`` for a bad rank/world size.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, micro_batch: int, grad_accum: int,
                 world_size: int, rank: int, seed: int):
        if tokens.ndim != 1:
            raise ValueError(f"PackedSequences: tokens must be 1-D (got shape {tokens.shape})")
        if not 0 <= rank < world_size:
            raise ValueError(f"PackedSequences: rank {rank} is outside world size {world_size}")
        self.tokens = tokens
        self.seq_len = seq_len
        self.micro_batch = micro_batch
        self.grad_accum = grad_accum
        self.world_size = world_size
        self.rank = rank
        self.seed = seed
        self.n_chunks = len(tokens) // (seq_len + 1)
        if self.n_chunks == 0:
            raise SpecError([("spec.training.seqLen", f"the corpus has {len(tokens)} tokens, fewer than one "
                                                      f"sequence of seqLen + 1 = {seq_len + 1} tokens")])

    @property
    def chunks_per_step(self) -> int:
        """Chunks (sequences) consumed by one optimizer step over all ranks and microbatches."""
        return self.micro_batch * self.grad_accum * self.world_size

    @property
    def tokens_per_step(self) -> int:
        """Input tokens consumed by one optimizer step over all ranks: seq_len * chunks_per_step."""
        return self.seq_len * self.chunks_per_step

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The chunk order of ``epoch``: a permutation of ``range(n_chunks)`` (int64) seeded by seed + epoch."""
        return _permutation(self.seed + epoch, self.n_chunks)

    def chunk_ids(self, step: int, micro: int, rank: int | None = None) -> np.ndarray:
        """Chunk indices (int64, shape ``(micro_batch,)``) of microbatch ``micro`` of ``rank`` at ``step``.

        ``step`` is 0-based, ``micro`` in ``[0, grad_accum)``, ``rank`` defaults to this rank.
        """
        rank = self.rank if rank is None else rank
        if not 0 <= micro < self.grad_accum:
            raise ValueError(f"chunk_ids: micro {micro} is outside [0, {self.grad_accum})")
        start = step * self.chunks_per_step + (micro * self.world_size + rank) * self.micro_batch
        positions = np.arange(start, start + self.micro_batch, dtype=np.int64)
        out = np.empty(self.micro_batch, dtype=np.int64)
        for epoch in np.unique(positions // self.n_chunks):
            sel = positions // self.n_chunks == epoch
            out[sel] = self.epoch_order(int(epoch))[positions[sel] % self.n_chunks]
        return out

    def microbatch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, labels)`` of this rank's microbatch: int64 tensors of shape ``(micro_batch, seq_len)``.

        ``labels[b, t]`` is the token following ``input_ids[b, t]``.
        """
        span = self.seq_len + 1
        rows = [np.asarray(self.tokens[c * span:(c + 1) * span], dtype=np.int64)
                for c in self.chunk_ids(step, micro)]
        batch = torch.from_numpy(np.stack(rows))
        return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()


@lru_cache(maxsize=4)
def _permutation(seed: int, n: int) -> np.ndarray:
    order = np.random.default_rng(seed).permutation(n)
    order.setflags(write=False)
    return order
