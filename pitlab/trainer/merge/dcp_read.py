"""A DCP ``StorageReader`` for the merge: the ``FileSystemReader`` of ``torch.distributed.checkpoint``, reading each
stored tensor chunk straight into its destination, several byte ranges of the shard files at once.

DCP's ``FileSystemWriter`` (the trainer's ``dcp.save``, ``torch_save`` format) stores every tensor chunk as a
``torch.save`` archive at a recorded ``(file, offset, length)``: an uncompressed zip holding ``data.pkl`` (the
chunk's dtype, shape, strides and storage offset) and one storage record (its raw bytes, little-endian). The
stock reader ``torch.load``-s each archive into a fresh tensor and copies it into the destination (two
allocations and two copies per byte, one file at a time). :class:`DirectReader` reads ``data.pkl`` (a restricted
unpickler: only ``torch._utils._rebuild_tensor_v2``, typed storage names and ``OrderedDict``; nothing else is
loaded) and, when the chunk is a row-major tensor of the destination's dtype and shape starting at storage offset 0,
reads the record's bytes with ``pread`` into the destination's memory: one copy, no temporary. Any other chunk
(an extension transform, a strided or offset chunk, a partial read, another byte order) goes through the stock
reader, so the result is always what ``dcp.load`` gives (the tests compare them bit for bit).

Parallel reads: the direct chunks, sorted by file and offset, are cut into ``threads`` runs of about equal bytes,
each read in offset order by its own thread (``pread`` releases the GIL), so several shard files (or several
parts of one) are read at once.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.futures import Future
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from pitlab.errors import MergeError

_STORAGE_DTYPES = {"FloatStorage": torch.float32, "DoubleStorage": torch.float64, "HalfStorage": torch.float16,
                   "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
                   "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
                   "BoolStorage": torch.bool}
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, (version..sizes), file name length, extra field length


class _Unsupported(MergeError):
    """This chunk is left to the stock reader."""


class _Slice(io.RawIOBase):
    """A read-only, seekable window ``[offset, offset + length)`` of an open file descriptor (``pread``: no shared
    file position, so threads may share the descriptor)."""

    def __init__(self, fd: int, offset: int, length: int):
        super().__init__()
        self.fd, self.offset, self.length, self.pos = fd, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = {0: 0, 1: self.pos, 2: self.length}[whence] + pos
        return self.pos

    def readinto(self, buf) -> int:
        n = min(len(buf), max(0, self.length - self.pos))
        got = os.preadv(self.fd, [memoryview(buf)[:n]], self.offset + self.pos) if n else 0
        self.pos += got
        return got


class _MetaUnpickler(pickle.Unpickler):
    """``data.pkl`` of a one-tensor ``torch.save`` archive → ``(storage dtype, storage key, storage numel,
    storage offset, size, stride)``; any other content raises :class:`_Unsupported`."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise _Unsupported(f"{module}.{name}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], torch.dtype)):
            raise _Unsupported(f"storage {pid!r}")
        return pid  # ("storage", dtype, key, location, numel)


def _rebuild(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None):
    _, dtype, key, _, numel = storage
    return dtype, str(key), int(numel), int(storage_offset), tuple(size), tuple(stride)


def _row_major(size: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for d in reversed(size):
        stride.append(acc)
        acc *= d
    return tuple(reversed(stride))


def record_span(fd: int, offset: int, length: int) -> tuple[torch.dtype, tuple[int, ...], int, int]:
    """``(dtype, shape, absolute file offset, bytes)`` of the raw row-major data of the one-tensor ``torch.save``
    archive stored at ``[offset, offset + length)`` of ``fd``; raises :class:`_Unsupported` for anything else
    (strides, a storage offset, a compressed or big-endian record, several storages)."""
    view = _Slice(fd, offset, length)
    try:
        zf = zipfile.ZipFile(io.BufferedReader(view, 1 << 16))
    except zipfile.BadZipFile as err:
        raise _Unsupported(str(err)) from None
    infos = {i.filename.split("/", 1)[-1]: i for i in zf.infolist()}
    if "data.pkl" not in infos:
        raise _Unsupported("no data.pkl")
    if "byteorder" in infos and zf.read(infos["byteorder"]) != b"little" or sys.byteorder != "little":
        raise _Unsupported("byte order")
    dtype, key, numel, storage_offset, size, stride = _MetaUnpickler(io.BytesIO(zf.read(infos["data.pkl"]))).load()
    records = [n for n in infos if n.startswith("data/")]
    rec = infos.get(f"data/{key}")
    nbytes = numel * dtype.itemsize
    if records != [f"data/{key}"] or rec is None or rec.compress_type != zipfile.ZIP_STORED:
        raise _Unsupported("storage records")
    count = 1
    for d in size:
        count *= d
    if storage_offset != 0 or stride != _row_major(size) or rec.file_size != nbytes or count != numel:
        raise _Unsupported("strided or offset chunk")
    sig, name_len, extra_len = _LOCAL_HEADER.unpack(os.pread(fd, _LOCAL_HEADER.size, offset + rec.header_offset))
    if sig != b"PK\x03\x04":
        raise _Unsupported("zip local header")
    return dtype, size, offset + rec.header_offset + _LOCAL_HEADER.size + name_len + extra_len, nbytes


def _pread_into(fd: int, target: torch.Tensor, file_offset: int) -> None:
    mv = memoryview(target.reshape(-1).view(torch.uint8).numpy())
    done = 0
    while done < len(mv):
        got = os.preadv(fd, [mv[done:]], file_offset + done)
        if got <= 0:
            raise OSError(f"unexpected end of file at byte {file_offset + done}")
        done += got


class DirectReader(dcp.FileSystemReader):
    """``dcp.FileSystemReader`` of ``path`` that reads whole, row-major tensor chunks straight into the destination
    tensors with ``threads`` concurrent readers (see the module's docstring); other items go to the stock reader.
    ``direct_bytes`` / ``fallback_items`` count what the last :meth:`read_data` did each way."""

    def __init__(self, path: str | os.PathLike, threads: int = 4):
        super().__init__(path)
        self.threads = max(1, threads)
        self.direct_bytes, self.fallback_items = 0, 0

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        fds: dict[str, int] = {}
        direct: list[tuple[str, int, ReadItem, torch.Tensor]] = []  # (file, data offset, item, target)
        fallback: list[ReadItem] = []
        try:
            for req in plan.items:
                info = self.storage_data[req.storage_index]
                target = None
                if req.type == LoadItemType.TENSOR and not info.transform_descriptors:
                    if info.relative_path not in fds:
                        fds[info.relative_path] = os.open(Path(self.path) / info.relative_path, os.O_RDONLY)
                    fd = fds[info.relative_path]
                    try:
                        dtype, size, at, _ = record_span(fd, info.offset, info.length)
                        t = planner.resolve_tensor(req).detach()
                        if (t.dtype == dtype and tuple(t.shape) == size and t.is_contiguous()
                                and all(o == 0 for o in req.storage_offsets) and tuple(req.lengths) == size):
                            target = t
                    except _Unsupported:
                        pass
                if target is None:
                    fallback.append(req)
                else:
                    direct.append((info.relative_path, at, req, target))
            direct.sort(key=lambda d: (d[0], d[1]))
            runs = _runs(direct, self.threads)
            if len(runs) > 1:
                with ThreadPoolExecutor(len(runs), thread_name_prefix="dcp-read") as pool:
                    for f in [pool.submit(_read_run, fds, run) for run in runs]:
                        f.result()
            elif runs:
                _read_run(fds, runs[0])
        finally:
            for fd in fds.values():
                os.close(fd)
        for _, _, req, target in direct:
            planner.commit_tensor(req, target)
        self.direct_bytes = sum(t.numel() * t.element_size() for *_, t in direct)
        self.fallback_items = len(fallback)
        if fallback:
            return super().read_data(LoadPlan(fallback, plan.storage_data, plan.planner_data), planner)
        fut: Future = Future()
        fut.set_result(None)
        return fut


def _runs(items: list, parts: int) -> list[list]:
    """``items`` (in order) cut into at most ``parts`` consecutive runs of about equal bytes."""
    total = sum(t.numel() * t.element_size() for *_, t in items)
    runs, current, used = [], [], 0
    for item in items:
        current.append(item)
        used += item[3].numel() * item[3].element_size()
        if used >= total * (len(runs) + 1) / parts and len(runs) < parts - 1:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def _read_run(fds: dict[str, int], run: list) -> None:
    for path, at, _, target in run:
        _pread_into(fds[path], target, at)
