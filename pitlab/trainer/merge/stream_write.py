"""The streamed shard writer: when every Hugging Face output is a block of rows of one checkpoint tensor (views,
proven), a shard's header is known before any data is read, so the shard is written slice by slice from a few
buffers smaller than the shard, each slice compared back from the file before its buffer is reused."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from pitlab.trainer.loading import read_header
from pitlab.trainer.merge.errors import MergeError
from pitlab.trainer.merge.layout import plan_groups
from pitlab.trainer.merge.verify import _SAFETENSORS_DTYPES, compare_tensors

SLICES_PER_GROUP = 4
"""A shard is read in slices of about a quarter of the largest group (never less than the largest tensor)."""
_DTYPE_NAMES = {v: k for k, v in _SAFETENSORS_DTYPES.items()}
_IOV = 512  # buffers per writev call (Linux allows 1,024)


@dataclass
class Output:
    """One Hugging Face tensor of a shard: ``elements`` elements of input ``src`` from element ``first`` on
    (flattened order), written at bytes ``[start, stop)`` of the shard's data section."""

    name: str
    src: str
    first: int
    elements: int
    shape: tuple
    dtype: torch.dtype
    start: int
    stop: int


@dataclass
class ShardPlan:
    """One output shard: its file name, its inputs read as ``slices`` (lists of checkpoint names, consecutive),
    its outputs in file order, and the header bytes (8-byte length, JSON, spaces to a multiple of 8)."""

    file: str
    slices: list[list[str]]
    outputs: list[Output]
    header: dict = field(default_factory=dict)
    header_bytes: bytes = b""

    @property
    def data_start(self) -> int:
        return len(self.header_bytes)

    @property
    def nbytes(self) -> int:
        return self.outputs[-1].stop if self.outputs else 0


def plan_streamed(spans_of, groups: list[list[str]], saved: dict[str, tuple[torch.dtype, torch.Size]],
                  sizes: dict[str, int], files: list[str]) -> tuple[list[ShardPlan], int] | None:
    """The shards of ``groups`` (checkpoint names, one group per file of ``files``) as :class:`ShardPlan` s and the
    slice size in bytes, or None when a group cannot be streamed: ``spans_of(meta group)`` (see
    :meth:`pitlab.trainer.merge.full.ViewConversion.spans`) returned None for it, a dtype has no safetensors
    name, or in input order a tensor would start at an offset that is not a multiple of its element size. Pure: reads shapes and dtypes only. Outputs are ordered by their input (and position in it), so each
    slice's outputs fill one contiguous range of the file."""
    slice_bytes = max(max(sizes.values()), -(-max(sum(sizes[n] for n in g) for g in groups) // SLICES_PER_GROUP))
    shards = []
    for fname, group in zip(files, groups):
        meta = {n: torch.empty(saved[n][1], dtype=saved[n][0], device="meta") for n in group}
        spans = spans_of(meta)
        if spans is None or any(saved[n][0] not in _DTYPE_NAMES for n in group):
            return None
        rank = {n: i for i, n in enumerate(group)}
        outputs, at = [], 0
        for name, (src, first, n, shape) in sorted(spans.items(), key=lambda kv: (rank[kv[1][0]], kv[1][1])):
            dtype = saved[src][0]
            nbytes = n * dtype.itemsize
            outputs.append(Output(name, src, first, n, tuple(shape), dtype, at, at + nbytes))
            at += nbytes
        if any(o.start % o.dtype.itemsize for o in outputs):  # mixed dtypes that would leave a tensor unaligned:
            return None  # the whole-group writer (safetensors orders tensors by dtype) is used instead
        header = {o.name: {"dtype": _DTYPE_NAMES[o.dtype], "shape": list(o.shape), "data_offsets": [o.start, o.stop]}
                  for o in outputs}
        text = json.dumps({"__metadata__": {"format": "pt"}, **header}, separators=(",", ":")).encode()
        text += b" " * (-(8 + len(text)) % 8)
        slices = plan_groups({n: sizes[n] for n in group}, slice_bytes)
        shards.append(ShardPlan(fname, slices, outputs, header, len(text).to_bytes(8, "little") + text))
    return shards, slice_bytes


def buffers_for(slice_bytes: int, largest_group: int) -> int:
    """Slice buffers to read into: 3 (one read, one written, one compared) when they take at most 1.5 × the
    largest group, else 2 (a tensor almost as large as its group)."""
    return 3 if 3 * slice_bytes <= 1.5 * largest_group else 2


def write_streamed(pipe, shards: list[ShardPlan], tmp: Path, source: str) -> tuple[
        dict[str, str], dict[str, str], int]:
    """Write each shard of ``shards`` into ``tmp`` from the slices ``pipe`` (a
    :class:`~pitlab.trainer.merge.full.GroupPipeline` over every shard's slices, in order) yields: the header
    first, then each slice's outputs, while a checking thread reads the slice before back from the file and
    compares it bit for bit (then frees its buffer), and, after a shard's last slice, opens the file with
    safetensors, checks its names and header against the plan and fsyncs it. Returns ``(weight_map, parameter
    sha256 digests, bytes written)``; re-raises the first failed check (a :class:`MergeError`)."""
    weight_map, total = {}, 0
    slices = iter(pipe)
    with ThreadPoolExecutor(1, thread_name_prefix="merge-check") as checker:
        checks = []
        for shard in shards:
            path = tmp / shard.file
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, [memoryview(shard.header_bytes)])
                for names in shard.slices:
                    for f in checks:  # a failed check of an earlier slice ends the merge now
                        if f.done() and f.exception() is not None:
                            raise f.exception()
                    tensors = next(slices)
                    members = set(names)
                    want = {o.name: tensors[o.src].reshape(-1)[o.first:o.first + o.elements].view(o.shape)
                            for o in shard.outputs if o.src in members}
                    t0 = time.perf_counter()
                    _write_all(fd, [memoryview(w.reshape(-1).view(torch.uint8).numpy()) for w in want.values()])
                    pipe.timings["save"] += time.perf_counter() - t0
                    checks.append(checker.submit(_check_slice, pipe, path, want, shard, source))
                    del tensors, want
            finally:
                os.close(fd)
            checks.append(checker.submit(_finish_file, pipe, path, shard, source))
            for o in shard.outputs:
                weight_map[o.name] = shard.file
            total += shard.nbytes
        t0 = time.perf_counter()
        for f in checks:
            f.result()
        pipe.timings["check_wait"] += time.perf_counter() - t0
    return weight_map, pipe.digests(), total


def _write_all(fd: int, views: list[memoryview]) -> None:
    """Append ``views`` to ``fd`` in order with ``writev`` (which releases the GIL), retrying short writes."""
    for i in range(0, len(views), _IOV):
        batch = [v.cast("B") for v in views[i:i + _IOV] if v.nbytes]
        while batch:
            n = os.writev(fd, batch)
            while batch and n >= batch[0].nbytes:
                n -= batch[0].nbytes
                batch.pop(0)
            if batch and n:
                batch[0] = batch[0][n:]


def _check_slice(pipe, path: Path, want: dict[str, torch.Tensor], shard: ShardPlan, source: str) -> None:
    """The checking thread's part for one slice: its outputs read back from ``path`` and compared with the
    checkpoint's bytes as read (those whose digests are checked), then the slice's buffer released."""
    try:
        t0 = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            compare_tensors(fd, path, want, shard.header, shard.data_start, source, pipe.threads)
        finally:
            os.close(fd)
        pipe.timings["compare"] += time.perf_counter() - t0
    finally:
        want.clear()
        pipe.release()


def _finish_file(pipe, path: Path, shard: ShardPlan, source: str) -> None:
    """A complete shard: safetensors opens it and lists exactly the planned names, the header read back is the
    planned one (every dtype, shape and offset), its size is the header's plus the data's; then it is flushed to
    the disk and dropped from the cache."""
    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
    planned = {o.name for o in shard.outputs}
    if names != planned:
        raise MergeError(f"{path}: holds other tensors than {source}: missing {sorted(planned - names)[:5]}, "
                         f"unexpected {sorted(names - planned)[:5]}")
    if read_header(path) != (shard.data_start, shard.header):
        raise MergeError(f"{path}: its header reads back differently from the one written")
    size = path.stat().st_size
    if size != shard.data_start + shard.nbytes:
        raise MergeError(f"{path}: {size} bytes, expected {shard.data_start + shard.nbytes}")
    t0 = time.perf_counter()
    fsync_file(path, drop=True)
    pipe.timings["fsync"] += time.perf_counter() - t0


def fsync_file(path: Path, drop: bool = False) -> None:
    """Flush ``path``'s written pages to the disk (``fsync``); with ``drop``, then evict them from the page cache
    (``POSIX_FADV_DONTNEED``: a streamed model's bytes need not crowd out the rest of memory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if drop:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
