"""The full-weight merge: the checkpoint's model tensors streamed one output shard at a time, renamed to the
Hugging Face names, written, compared back and probed. Three threads overlap: the reader (the next slice or
group read into a free reused buffer and hashed), the writer (written) and the checker (read back, compared,
fsynced). Shards whose outputs are views of the inputs are streamed in slices (``stream_write``); otherwise a
whole group is converted by transformers and written with safetensors."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from safetensors.torch import save_file

from pitlab.trainer.digest import tensor_sha256
from pitlab.trainer.merge.errors import MergeError
from pitlab.trainer.merge.layout import copy_generation_config, plan_groups, shard_file_names, write_index
from pitlab.trainer.merge.stream_write import buffers_for, fsync_file, plan_streamed, write_streamed
from pitlab.trainer.merge.reader import (check_keys, checkpoint_tensors, load_checkpoint_model, load_into,
                                         load_tensors, meta_model_of)
from pitlab.trainer.merge.verify import (anon_rss_bytes, compare_digests, compare_file, probe_logits, reload_model,
                                         rss_bytes)

READ_THREADS = max(4, min(8, (os.cpu_count() or 1) // 2))
"""Byte ranges of the DCP shard files read at once, digests computed at once and byte ranges of a written shard
compared at once: 4, or half the CPUs up to 8 (reads of a disk gain from several requests even on 2 cores)."""
_ALIGN = 64  # bytes: each tensor's offset in a group buffer
PROBE_WIDTH = 2  # columns of the position tensors ViewConversion maps (each column holds the row's id)


def merge_full(ckpt: Path, base_dir: Path, tmp: Path, expected_sha256: dict[str, str] | None, max_bytes: int,
               logits_probe: str, threads: int = READ_THREADS) -> dict:
    """Write the full-weight checkpoint ``ckpt`` as Hugging Face safetensors shards of at most ``max_bytes`` into
    ``tmp`` (created), compare every tensor back and probe the logits. The next slice (or group) is read
    (``threads`` ranges of the shard files at once) and hashed while one is written and the one before compared;
    host memory for tensor data is three buffers of about a quarter of the largest group's bytes when the shards
    stream, else two buffers of the largest group's bytes. Returns the report's fields; raises
    :class:`MergeError` for any mismatch (naming the file and the tensor)."""
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    config, meta_model = meta_model_of(base_dir)
    meta_sd = meta_model.state_dict()
    saved = checkpoint_tensors(ckpt)
    check_keys(set(meta_sd), set(saved), ckpt, base_dir)
    for name, t in meta_sd.items():
        if tuple(t.shape) != tuple(saved[name][1]):
            raise MergeError(f"{ckpt}: {name} has shape {tuple(saved[name][1])}, {base_dir / 'config.json'} "
                             f"expects {tuple(t.shape)}")
    kept = set(remove_tied_weights_from_state_dict(dict(meta_sd), meta_model))
    param_names = [n for n, _ in meta_model.named_parameters()]
    param_set = set(param_names)
    # the Hugging Face names and shapes of the whole output, from meta tensors (no data)
    expected_hf = {k: (v.dtype, tuple(v.shape)) for k, v in revert_weight_conversion(
        meta_model, {n: torch.empty(saved[n][1], dtype=saved[n][0], device="meta") for n in kept}).items()}

    def transformers_convert(group: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        try:
            out = revert_weight_conversion(meta_model, group)
        except Exception as err:  # noqa: BLE001 - transformers raises various errors for incomplete groups
            raise MergeError(f"{ckpt}: cannot convert tensors {sorted(group)[:3]}... to Hugging Face names: "
                             f"{err!r}") from None
        return {k: v.contiguous() for k, v in out.items()}

    convert = ViewConversion(lambda group: revert_weight_conversion(meta_model, group), transformers_convert,
                             expected_hf)

    sizes = {n: saved[n][0].itemsize * saved[n][1].numel() for n in kept}
    groups = plan_groups(sizes, max_bytes)
    _prove_on_layer0(convert, ckpt, kept, saved)  # before any buffer exists, not on top of them
    files = shard_file_names(len(groups))
    largest = max(sum(sizes[n] for n in g) for g in groups)
    streamed = _streamed_plan(convert, groups, saved, sizes, files)
    rss_before, anon_before = rss_bytes(), anon_rss_bytes()  # libraries and meta model: what follows is tensors
    t_write = time.perf_counter()
    tmp.mkdir(parents=True)
    pipe, (weight_map, digests, total) = _write_shards(ckpt, saved, groups, sizes, param_set, threads, streamed,
                                                        files, convert, tmp, largest)
    # parameters tied to another one (not written) are still in the summary's digests
    for n in param_names:
        if n not in digests:
            digests[n] = tensor_sha256(load_tensors(ckpt, [n], saved)[n])
    if expected_sha256 is not None:
        compare_digests(digests, expected_sha256, "the training summary's param_sha256", f"checkpoint {ckpt}")
    write_index(tmp, weight_map, total, len(files), expected_hf)
    write_seconds = time.perf_counter() - t_write

    t_verify = time.perf_counter()
    config.dtype = _uniform_dtype(expected_hf, config)
    config.save_pretrained(tmp)
    copy_generation_config(base_dir, tmp)
    model_bytes = sum(sizes.values())
    probe = "skipped"
    if logits_probe == "always" or (logits_probe == "auto" and model_bytes <= max_bytes):
        expected_logits = probe_logits(load_checkpoint_model(ckpt, base_dir))
        got = probe_logits(reload_model(tmp))
        if not torch.equal(got, expected_logits):
            diff = (got - expected_logits).abs().max().item()
            raise MergeError(f"{tmp}: probe logits differ from the checkpoint-loaded model (max |diff| {diff:g})")
        probe = "equal"
    return {"kind": "full", "tensors": len(weight_map), "bytes": total, "shards": len(files),
            "parameters": len(digests), "rss_before_tensors_bytes": rss_before,
            "anon_rss_before_tensors_bytes": anon_before, "write_seconds": write_seconds,
            "verify_seconds": time.perf_counter() - t_verify, "logits_probe": probe,
            "largest_group_bytes": largest, "buffer_bytes": pipe.buffer_bytes,
            "buffers": pipe.buffers, "writer": "streamed" if streamed is not None else "whole-group",
            "read_threads": pipe.threads, "conversion": convert.state,
            "stage_seconds": {k: round(v, 3) for k, v in pipe.timings.items()}}


def _write_shards(ckpt: Path, saved: dict, groups: list[list[str]], sizes: dict[str, int], param_set: set[str],
                  threads: int, streamed, files: list[str], convert: "ViewConversion", tmp: Path, largest: int):
    """Write every shard into ``tmp``: streamed in slices when ``streamed`` (:func:`_streamed_plan`'s result) is
    a plan, else whole groups converted by ``convert``; ``largest``: the largest group's bytes. Returns
    ``(pipeline, (weight_map, digests, bytes))``."""
    if streamed is None:
        pipe = GroupPipeline(ckpt, saved, groups, sizes, param_set, threads)
        return pipe, _write_groups(pipe, files, convert, tmp, ckpt)
    shards, slice_bytes = streamed
    slices = [s for shard in shards for s in shard.slices]
    pipe = GroupPipeline(ckpt, saved, slices, sizes, param_set, threads,
                         buffers=buffers_for(slice_bytes, largest))
    with _quiet_single_process(), pipe:
        return pipe, write_streamed(pipe, shards, tmp, f"checkpoint {ckpt}")


def _streamed_plan(convert: "ViewConversion", groups: list[list[str]], saved: dict, sizes: dict[str, int],
                   files: list[str]):
    """:func:`plan_streamed`'s shards when the views apply to every group and are proven (or no output moves),
    else None: the whole-group writer then runs ``convert`` on each group."""
    if convert.proven is False:
        return None
    plan = plan_streamed(convert.spans, groups, saved, sizes, files)
    if plan is None:
        return None
    moved = any(o.first != 0 or o.elements != saved[o.src][1].numel() or o.shape != tuple(saved[o.src][1])
                for shard in plan[0] for o in shard.outputs)
    if moved and not convert.proven:
        return None
    return plan


@contextlib.contextmanager
def _quiet_single_process():
    """DCP's "single process" warning filtered for every reading thread (``catch_warnings`` is not thread-safe,
    so it is set once around the whole pipeline)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
        yield


def _prove_on_layer0(convert: "ViewConversion", ckpt: Path, kept: set[str],
                     saved: dict[str, tuple[torch.dtype, torch.Size]]) -> None:
    """Read layer 0's tensors and prove ``convert``'s views on them (:meth:`ViewConversion.prove_early`: one
    layer's copies, freed before the merge's buffers are allocated). A read error is left to the pipeline, which
    reads the same bytes again and names the file that fails."""
    first_layer = sorted(n for n in kept if re.search(r"\blayers\.0\.", n))
    if not first_layer:
        return
    try:
        layer0 = load_tensors(ckpt, first_layer, saved)
    except (Exception, CheckpointException):  # noqa: BLE001 - DCP wraps what failed
        return
    convert.prove_early(layer0)


def _write_groups(pipe: GroupPipeline, files: list[str], convert, tmp: Path, ckpt: Path) -> tuple[
        dict[str, str], dict[str, str], int]:
    """Write each group ``pipe`` yields as the shard of the same index in ``files`` under ``tmp`` while the
    checker thread compares the file before it back. Returns ``(weight_map, parameter sha256 digests, bytes
    written)``; re-raises the first failed check (a :class:`MergeError`)."""
    weight_map, total = {}, 0
    with _quiet_single_process():
        with pipe, ThreadPoolExecutor(1, thread_name_prefix="merge-check") as checker:
            checks = []
            for fname, tensors in zip(files, pipe):
                for f in checks:  # a failed check of an earlier file ends the merge now
                    if f.done() and f.exception() is not None:
                        raise f.exception()
                t0 = time.perf_counter()
                hf = convert(tensors)
                del tensors
                t1 = time.perf_counter()
                save_file(hf, str(tmp / fname), metadata={"format": "pt"})
                pipe.timings["convert"] += t1 - t0
                pipe.timings["save"] += time.perf_counter() - t1
                for k, v in hf.items():
                    weight_map[k] = fname
                    total += v.numel() * v.element_size()
                checks.append(checker.submit(_check_file, pipe, tmp / fname, hf, f"checkpoint {ckpt}"))
                del hf
            t0 = time.perf_counter()
            for f in checks:
                f.result()
            pipe.timings["check_wait"] += time.perf_counter() - t0
    return weight_map, pipe.digests(), total


def _check_file(pipe: "GroupPipeline", path: Path, hf: dict[str, torch.Tensor], source: str) -> None:
    """The checking thread's part for one written shard: the file read back and compared bit for bit with the
    checkpoint's tensors as read (the bytes whose sha256 the summary's digests are checked against), the group's
    buffer released, then the file flushed to the disk while the next shard is written."""
    try:
        t0 = time.perf_counter()
        compare_file(path, hf, source, pipe.threads)
        pipe.timings["compare"] += time.perf_counter() - t0
    finally:
        del hf
        pipe.release()
    t0 = time.perf_counter()
    fsync_file(path, drop=True)
    pipe.timings["fsync"] += time.perf_counter() - t0


class GroupPipeline:
    """The checkpoint's tensor groups, read ahead: iterating yields each group's ``{name: tensor}`` in order
    (saved dtype and shape, views of one of ``buffers`` reusable buffers of the largest group's bytes). A
    background thread reads the next groups (``threads`` concurrent ``dcp.load`` calls of about equal bytes) into
    free buffers while the caller writes group k; a pool of ``threads`` hashes the tensors in ``param_names``
    meanwhile (sha256 releases the GIL; :meth:`digests`). The caller calls :meth:`release` when it no longer needs
    the oldest held group's tensors, which frees its buffer once its hashes are done. Use as a context manager
    (the thread is stopped and joined on exit); an error in the reading thread is raised by the iteration."""

    def __init__(self, ckpt: Path, saved: dict[str, tuple[torch.dtype, torch.Size]], groups: list[list[str]],
                 sizes: dict[str, int], param_names: set[str], threads: int = READ_THREADS, buffers: int = 2):
        self.ckpt, self.saved, self.groups, self.sizes, self.params = ckpt, saved, groups, sizes, param_names
        self.buffers = max(1, buffers)
        self.threads = max(1, threads)
        self.group_bytes = [sum(sizes[n] for n in g) for g in groups]
        self.buffer_bytes = max(sum(_aligned(sizes[n]) for n in g) for g in groups)
        self.timings = dict.fromkeys(("read", "hash", "wait", "convert", "save", "compare", "fsync", "check_wait"), 0.0)
        self._free: queue.Queue = queue.Queue()
        self._ready: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="merge-read")
        self._thread = threading.Thread(target=self._read_all, name="merge-reader", daemon=True)
        self._held: list[tuple[torch.Tensor, list]] = []
        self._digests: dict = {}  # name -> Future of its sha256
        self._lock = threading.Lock()
        md = dcp.FileSystemReader(str(ckpt)).read_metadata()
        self.files: dict[str, set[str]] = {}  # name -> the shard files holding its chunks, for error messages
        for idx, info in md.storage_data.items():
            if idx.fqn.startswith("model."):
                self.files.setdefault(idx.fqn[len("model."):], set()).add(info.relative_path)

    def __enter__(self) -> "GroupPipeline":
        for _ in range(min(self.buffers, len(self.groups))):
            self._free.put(torch.empty(self.buffer_bytes, dtype=torch.uint8))
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._free.put(None)  # wakes the reader if it waits for a buffer
        self._thread.join()
        self._pool.shutdown(wait=True)
        self._held.clear()
        while not self._free.empty():
            self._free.get()
        while not self._ready.empty():
            self._ready.get()

    def __iter__(self):
        for _ in self.groups:
            t0 = time.perf_counter()
            item = self._ready.get()
            self.timings["wait"] += time.perf_counter() - t0
            if isinstance(item, BaseException):
                raise item
            buf, tensors, futures = item
            with self._lock:
                self._held.append((buf, futures))
            yield tensors

    def release(self) -> None:
        """The oldest yielded group's buffer may be reused (its tensors must no longer be used); any thread."""
        with self._lock:
            buf, futures = self._held.pop(0)
        wait(futures)  # its digests are computed from the buffer: done before it is reused
        self._free.put(buf)

    def digests(self) -> dict[str, str]:
        """The sha256 (hex) of every tensor in ``param_names`` of the groups yielded so far (waits for them);
        raises what hashing raised."""
        return {n: f.result() for n, f in self._digests.items()}

    def _hash(self, t: torch.Tensor) -> str:
        t0 = time.perf_counter()
        digest = tensor_sha256(t)
        with self._lock:
            self.timings["hash"] += time.perf_counter() - t0
        return digest

    def _read_all(self) -> None:
        try:
            for group in self.groups:
                buf = self._free.get()
                if buf is None or self._stop.is_set():
                    return
                tensors, offset = {}, 0
                for n in group:  # views of the buffer, disjoint: safetensors writes them as separate tensors
                    dtype, shape = self.saved[n]
                    tensors[n] = buf[offset:offset + self.sizes[n]].view(dtype).view(shape)
                    offset += _aligned(self.sizes[n])
                t0 = time.perf_counter()
                try:
                    load_into(self.ckpt, tensors, self.threads)
                except (Exception, CheckpointException) as err:  # noqa: BLE001 - DCP wraps what failed
                    files = sorted(set().union(*(self.files.get(n, set()) for n in group)))
                    cause = str(err).strip().splitlines()[-1] if str(err).strip() else repr(err)
                    raise MergeError(f"{self.ckpt}: cannot read {len(group)} tensors ({group[0]}, ...) from "
                                     f"{', '.join(files)}: {cause}") from err
                self.timings["read"] += time.perf_counter() - t0
                # hashed by the pool while the next group is read and this one written (sha256 releases the GIL)
                futures = {n: self._pool.submit(self._hash, tensors[n]) for n in group if n in self.params}
                self._digests.update(futures)
                self._ready.put((buf, tensors, list(futures.values())))
        except BaseException as err:  # noqa: BLE001 - handed to the consuming thread, which raises it
            self._ready.put(err)


class ViewConversion:
    """The checkpoint's tensors → Hugging Face's, as ``convert`` (transformers' ``revert_weight_conversion``, which
    copies e.g. each expert's gate and up projections out of the fused tensor), but with every output that is a
    block of consecutive rows of one input returned as a view of that input: no copy, no memory.

    Which rows: ``revert`` (the same transformation) is run on small position tensors, one int64 id per row of
    each input (the last dimension dropped); an output whose ids are consecutive within one input, with the
    expected shape and dtype (``expected``: ``{name: (dtype, shape)}``), is that input's row block. Proof: for the
    first group with such outputs, ``convert`` runs too and every view must equal its output bit for bit; if one
    does not, or the positions say anything else (a transposition, a concatenation, a position tensor the
    conversion refuses), ``convert``'s outputs are used, for that group (and for all groups once a proof failed).
    ``state``: ``views`` (proven and used), ``copies`` (some group copied: not applicable or refused) or
    ``unproven`` (no group had outputs to map)."""

    def __init__(self, revert, convert, expected: dict[str, tuple[torch.dtype, tuple]]):
        self.revert, self.convert, self.expected = revert, convert, expected
        self.proven: bool | None = None
        self.copied = False

    @property
    def state(self) -> str:
        return "copies" if self.copied else {True: "views", False: "copies", None: "unproven"}[self.proven]

    def prove_early(self, group: dict[str, torch.Tensor]) -> None:
        """Prove the views on ``group`` (one layer's tensors, read for this alone) before any group is merged,
        so that the proof's copies never add to the merge's buffers. Nothing changes when the views do not
        apply to ``group`` or its outputs are its inputs: the first group with moved outputs is proven then."""
        if self.proven is not None:
            return
        views = self._views(group)
        moved = [] if views is None else _moved(views, group)
        if moved:
            self.proven = self._prove(group, views, moved[0])

    def __call__(self, group: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        views = None if self.proven is False else self._views(group)
        if views is None:
            self.copied = True
            return self.convert(group)
        moved = _moved(views, group)
        if self.proven is None and moved:
            self.proven = self._prove(group, views, moved[0])
            if not self.proven:
                return self.convert(group)
        return views

    def _prove(self, group: dict[str, torch.Tensor], views: dict[str, torch.Tensor], moved: str) -> bool:
        """``convert`` of one layer's inputs (those sharing ``moved``'s ``...layers.<i>.`` prefix; the whole group
        when that is not a complete set) equals ``views`` bit for bit. Memory: that layer's copies, once."""
        m = re.match(r"(.*?\blayers\.\d+\.)", moved)
        subset = {k: v for k, v in group.items() if m and k.startswith(m.group(1))}
        try:
            real = self.convert(subset) if subset else None
        except MergeError:
            real = None
        if not real or not real.keys() <= views.keys() or moved not in real:
            real = self.convert(group)
        same = real.keys() <= views.keys() and all(
            real[k].dtype == views[k].dtype and real[k].shape == views[k].shape and torch.equal(real[k], views[k])
            for k in real)
        return same and (real.keys() == views.keys() or bool(subset))

    def _views(self, group: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        spans = self.spans(group)
        if spans is None:
            return None
        return {name: group[src].reshape(-1)[first:first + n].view(shape)
                for name, (src, first, n, shape) in spans.items()}

    def spans(self, group: dict[str, torch.Tensor]) -> dict[str, tuple[str, int, int, tuple]] | None:
        """Where each Hugging Face output of ``group`` lies in its input, if every output is a block of
        consecutive rows of one input: ``{output name: (input name, first element, elements, shape)}`` (elements
        counted in the input's flattened order), else None. Reads only shapes and dtypes, so ``group`` may hold
        meta tensors; whether the outputs equal the conversion's is what the proof checks."""
        probe, ranges, base = {}, [], 0
        for name, t in group.items():
            if t.numel() == 0:
                return None
            rows, width = (t.numel() // t.shape[-1], t.shape[-1]) if t.dim() >= 2 else (t.numel(), 1)
            ids = torch.arange(base, base + rows, dtype=torch.int64)
            # two equal columns, not one: a conversion may squeeze a trailing dimension of size 1
            probe[name] = ids.reshape(tuple(t.shape[:-1]) + (1,)).expand(
                tuple(t.shape[:-1]) + (PROBE_WIDTH,)).contiguous() if t.dim() >= 2 else ids.reshape(t.shape)
            ranges.append((base, base + rows, name, width))
            base += rows
        try:
            out = self.revert(probe)
        except Exception:  # noqa: BLE001 - position tensors refused: the conversion's own outputs are used
            return None
        spans = {}
        for name, p in out.items():
            p = p[0] if isinstance(p, list) else p
            if name not in self.expected or not isinstance(p, torch.Tensor) or p.numel() == 0:
                return None
            dtype, shape = self.expected[name]
            if len(shape) >= 2:  # the output of a tensor of two or more dimensions carries the probe columns
                if p.shape[-1] != PROBE_WIDTH or not torch.equal(p[..., 0], p[..., -1]):
                    return None
                ids = p[..., 0].reshape(-1)
            else:
                ids = p.reshape(-1)
            first, n = int(ids[0]), ids.numel()
            if not torch.equal(ids, torch.arange(first, first + n, dtype=torch.int64)):
                return None
            src = next((r for r in ranges if r[0] <= first and first + n <= r[1]), None)
            if src is None:
                return None
            lo, _, src_name, width = src
            t = group[src_name]
            want = tuple(shape[:-1]) + (PROBE_WIDTH,) if t.dim() >= 2 else tuple(shape)
            if t.dtype != dtype or tuple(p.shape) != want or (t.dim() >= 2 and shape[-1] != width):
                return None
            spans[name] = (src_name, (first - lo) * width, n * width, tuple(shape))
        return spans


def _moved(views: dict[str, torch.Tensor], group: dict[str, torch.Tensor]) -> list[str]:
    """Names of the ``views`` that are not one of ``group``'s own tensors unchanged (same storage and shape)."""
    return [k for k, v in views.items()
            if not any(v.data_ptr() == t.data_ptr() and v.shape == t.shape for t in group.values())]


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _uniform_dtype(expected: dict[str, tuple[torch.dtype, tuple]], config) -> torch.dtype:
    dtypes = {d for d, _ in expected.values() if d.is_floating_point}
    return dtypes.pop() if len(dtypes) == 1 else getattr(config, "dtype", None)
