"""The memory-mapped host store of layer streaming (``training.layerStreaming.hostStore: mmap``).

When the frozen decoder layers (and a host-side input embedding) do not fit the host's memory, their flat
stores (:class:`pitlab.trainer.streaming.LayerLayout`) are written once to one file under the run directory,
``streaming-store/layers.store``, and memory-mapped (``torch.from_file``, a private mapping: the kernel pages
the file in on demand and may drop clean pages again, so the host needs page cache, not RAM for the model).

File format: 8 bytes little-endian ``n``, then ``n`` bytes of JSON (padded with spaces so that the data starts
on a 4096-byte page): ``format``, ``base`` (:func:`base_fingerprint`), ``layers`` (each layer's layout entries
``[name, dtype, offset in elements, shape]``), ``embedding`` (``[dtype, shape]`` or null) and ``regions``
(``[key, dtype, byte offset from the data start, bytes]``, each offset page-aligned; key ``"layer.<i>"`` or
``"embedding"``). The file is written to ``layers.store.tmp`` (a shared mapping filled in place by the
safetensors reader, then ``fsync``) and renamed when complete, so an interrupted write never leaves a file
that looks complete; an existing store is reused only when its header equals the one the run would write
(same layout, same base fingerprint) and its size is the header's. Writing holds no anonymous memory for the
weights beyond one tensor's dtype conversion (the pages are the file's page cache).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import torch

from pitlab.errors import TRAINING_FAILED, StageError

FORMAT = "pitlab-streaming-store/1"
STORE_FILE = "layers.store"
PAGE = 4096
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_NAMED = {v: k for k, v in _DTYPE_NAMES.items()}


class HostStoreError(StageError):
    """The memory-mapped host store cannot be written (no space on the disk, unsupported dtype). Exit code 1,
    ``TrainingFailed``."""

    reason = TRAINING_FAILED


def base_fingerprint(base: Path) -> str:
    """Hex sha256 identifying the base model folder ``base`` without reading its weights: ``config.json``'s
    bytes and, for every ``*.safetensors`` file and the index (sorted by name), its name, size, modification
    time (ns) and safetensors header. A rewritten or replaced weight file changes it."""
    base = Path(base)
    h = hashlib.sha256()
    h.update((base / "config.json").read_bytes())
    for path in sorted(base.glob("*.safetensors")) + sorted(base.glob("*.safetensors.index.json")):
        st = path.stat()
        h.update(f"\0{path.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        if path.suffix == ".safetensors":
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                h.update(f.read(min(n, 100 * 2 ** 20)))
    return h.hexdigest()


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        raise HostStoreError(f"training.layerStreaming.hostStore: mmap: parameters of dtype {dtype} are not "
                             f"supported (supported: {', '.join(_DTYPE_NAMES.values())})")
    return name


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def layout_entries(layout) -> list:
    """A :class:`~pitlab.trainer.streaming.LayerLayout`'s entries as the header stores them:
    ``[name, dtype name, offset in elements, shape as a list]``."""
    return [[name, _dtype_name(d), off, list(shape)] for name, d, off, shape in layout.entries]


def store_header(base: Path, layouts, embedding: torch.Tensor | None) -> dict:
    """The header of the store of ``layouts`` (one :class:`~pitlab.trainer.streaming.LayerLayout` per decoder
    layer) and the input ``embedding`` weight kept on the host (meta tensor, or None); see the module docstring."""
    regions, offset = [], 0

    def region(key: str, dtype: torch.dtype, nbytes: int) -> None:
        nonlocal offset
        regions.append([key, _dtype_name(dtype), offset, nbytes])
        offset += -(-nbytes // PAGE) * PAGE

    for i, layout in enumerate(layouts):
        for dtype, n in layout.numel.items():
            region(f"layer.{i}", dtype, n * _itemsize(dtype))
    if embedding is not None:
        region("embedding", embedding.dtype, embedding.numel() * embedding.element_size())
    return {"format": FORMAT, "base": base_fingerprint(base),
            "layers": [layout_entries(layout) for layout in layouts],
            "embedding": None if embedding is None else [_dtype_name(embedding.dtype), list(embedding.shape)],
            "regions": regions, "data_bytes": offset}


def _encode(header: dict) -> bytes:
    raw = json.dumps(header, sort_keys=True).encode()
    n = -(-(8 + len(raw)) // PAGE) * PAGE - 8
    return n.to_bytes(8, "little") + raw.ljust(n, b" ")


def _read_header(path: Path) -> tuple[int, dict] | None:
    """``(data start, header)`` of a store file, None when it is not one (too short, not JSON)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or n > 256 * 2 ** 20:
                return None
            return 8 + n, json.loads(f.read(n))
    except (OSError, ValueError):
        return None


class MappedStore:
    """A complete store file, memory-mapped (private mapping, pages read on demand).

    ``layers[i]``: ``{dtype: flat tensor}`` views of layer ``i``'s regions; ``embedding``: the input embedding
    weight (its shape) or None; ``path``, ``nbytes`` (file size), ``written`` (False when an existing file was
    reused) and ``write_seconds``."""

    def __init__(self, path: Path, header: dict, data_start: int, written: bool, write_seconds: float):
        self.path, self.header, self.written, self.write_seconds = path, header, written, write_seconds
        self.nbytes = data_start + header["data_bytes"]
        self.raw = torch.from_file(str(path), shared=False, size=self.nbytes, dtype=torch.uint8)
        self.layers: list[dict[torch.dtype, torch.Tensor]] = [{} for _ in header["layers"]]
        self.embedding = None
        for key, dtype, off, nbytes in header["regions"]:
            view = self.raw[data_start + off:data_start + off + nbytes].view(_NAMED[dtype])
            if key == "embedding":
                self.embedding = view.view(header["embedding"][1])
            else:
                self.layers[int(key.split(".")[1])][_NAMED[dtype]] = view

    def report(self) -> dict:
        return {"host_store_path": str(self.path), "host_store_file_bytes": self.nbytes,
                "host_store_written": self.written, "host_store_write_seconds": round(self.write_seconds, 3)}


def open_store(directory: Path, header: dict, fill) -> MappedStore:
    """The store described by ``header`` in ``directory``: the existing ``layers.store`` when its header equals
    ``header`` and its size matches, else written anew through ``fill(views)`` (``views``: the ``{region key:
    {dtype: flat tensor}}`` of a shared mapping of ``layers.store.tmp``; ``fill`` writes every byte) and renamed
    when complete. Raises :class:`HostStoreError` when the disk has no room for it."""
    directory = Path(directory)
    path = directory / STORE_FILE
    head = _encode(header)
    total = len(head) + header["data_bytes"]
    found = _read_header(path) if path.is_file() else None
    if found is not None and found[1] == json.loads(json.dumps(header, sort_keys=True)) and \
            path.stat().st_size == total:
        return MappedStore(path, header, found[0], written=False, write_seconds=0.0)
    t0 = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()  # stale (other model, layout or an old format): never reused
    tmp = directory / (STORE_FILE + ".tmp")
    if tmp.exists():
        tmp.unlink()  # a write that was interrupted
    free = shutil.disk_usage(directory).free
    if free < total:
        raise HostStoreError(f"training.layerStreaming.hostStore: mmap: the store needs {total / 1e9:.2f} GB on "
                             f"{directory} but {free / 1e9:.2f} GB are free; free space there or use a host with "
                             "more memory (hostStore: memory)")
    with open(tmp, "wb") as f:
        f.write(head)
        f.truncate(total)
    raw = torch.from_file(str(tmp), shared=True, size=total, dtype=torch.uint8)
    views: dict[str, dict[torch.dtype, torch.Tensor]] = {}
    for key, dtype, off, nbytes in header["regions"]:
        start = len(head) + off
        views.setdefault(key, {})[_NAMED[dtype]] = raw[start:start + nbytes].view(_NAMED[dtype])
    fill(views)
    del views, raw  # unmaps
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return MappedStore(path, header, len(head), written=True, write_seconds=time.perf_counter() - t0)
