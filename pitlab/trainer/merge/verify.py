"""Verification of a written model: every tensor compared bit for bit, parameter digests, the logits probe; and the
process's memory, which the report records."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from pitlab.trainer.merge.errors import MergeError
from pitlab.trainer.merge.layout import natural_key

PROBE_SEED = 0
PROBE_SHAPE = (3, 24)  # (sequences, tokens) of the logits probe
# LoRA merged into the base vs the peft model computing base + adapter separately: the same maths in another
# order of float32 operations; the probe accepts |diff| <= LORA_PROBE_ATOL + LORA_PROBE_RTOL * |reference|
LORA_PROBE_ATOL, LORA_PROBE_RTOL = 1e-4, 1e-4


def probe_logits(model: torch.nn.Module) -> torch.Tensor:
    """Logits (float32, shape ``(3, 24, vocab)``) of a fixed pseudo-random batch of token ids."""
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(PROBE_SEED)
    ids = torch.randint(0, vocab, PROBE_SHAPE, generator=gen)
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


COMPARE_CHUNK = 4 << 20  # bytes read back from a written file at a time, per comparing thread


def compare_file(path: Path, want: dict[str, torch.Tensor], source: str, threads: int = 1) -> None:
    """Every tensor of the safetensors file ``path`` equals ``want`` (same names, dtype, shape, bits). Raises
    :class:`MergeError` naming ``path`` and the first differing tensor. The names are read with ``safe_open`` (the
    file must open in safetensors); the data is read back from the file with ``pread`` and compared byte for byte
    by ``threads`` threads, each over a run of tensors of about equal bytes with one reusable buffer of at most
    ``COMPARE_CHUNK`` bytes (``pread`` and the comparison release the GIL), so the memory is those buffers (no
    map of the file, no tensor copies)."""
    from pitlab.trainer.loading import read_header

    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
    missing, extra = sorted(want.keys() - names), sorted(names - want.keys())
    if missing or extra:
        raise MergeError(f"{path}: holds other tensors than {source}: {len(missing)} missing {missing[:5]}, "
                         f"{len(extra)} unexpected {extra[:5]}")
    data_start, header = read_header(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        compare_tensors(fd, path, want, header, data_start, source, threads)
    finally:
        os.close(fd)


def compare_tensors(fd: int, path: Path, want: dict[str, torch.Tensor], header: dict, data_start: int, source: str,
                    threads: int = 1) -> None:
    """The tensors ``want`` equal the bytes the safetensors ``header`` (``{name: {"dtype", "shape",
    "data_offsets"}}``, offsets from ``data_start``) places them at in the open file ``fd`` (``path``, for
    messages), dtype and shape included; ``threads`` threads over runs of about equal bytes, each with one reused
    buffer of at most ``COMPARE_CHUNK`` bytes. Raises :class:`MergeError` naming the first differing tensor."""
    from concurrent.futures import ThreadPoolExecutor

    ordered = sorted(want, key=natural_key)
    nbytes = [want[n].numel() * want[n].element_size() for n in ordered]
    runs, total, at = [[] for _ in range(max(1, threads))], sum(nbytes), 0
    for name, size in zip(ordered, nbytes):  # consecutive runs of about total / threads bytes each
        runs[min(len(runs) - 1, at * len(runs) // max(total, 1))].append(name)
        at += size
    work = [r for r in runs if r]
    if len(work) == 1:
        _compare_run(fd, path, work[0], want, header, data_start, source)
    elif work:
        with ThreadPoolExecutor(len(work), thread_name_prefix="merge-compare") as pool:
            for f in [pool.submit(_compare_run, fd, path, r, want, header, data_start, source) for r in work]:
                f.result()


def _compare_run(fd: int, path: Path, names: list[str], want: dict[str, torch.Tensor], header: dict,
                 data_start: int, source: str) -> None:
    """:func:`compare_file`'s part for ``names``, with its own read buffer."""
    largest = max((want[n].numel() * want[n].element_size() for n in names), default=0)
    buf = torch.empty(min(largest, COMPARE_CHUNK), dtype=torch.uint8)
    for name in names:
        w, entry = want[name], header.get(name)
        if entry is None:
            raise MergeError(f"{path}: tensor {name} of {source} is missing from the file's header")
        dtype, shape = _SAFETENSORS_DTYPES.get(entry["dtype"]), tuple(entry["shape"])
        start, stop = entry["data_offsets"]
        same = dtype == w.dtype and shape == tuple(w.shape) and stop - start == w.numel() * w.element_size()
        if same and stop > start:
            flat = w.detach().contiguous().reshape(-1).view(torch.uint8)
            for at in range(0, stop - start, len(buf)):
                n = min(len(buf), stop - start - at)
                _pread_exact(fd, buf[:n], data_start + start + at)
                if not _bytes_equal(buf[:n], flat[at:at + n]):
                    same = False
                    break
        if not same:
            raise MergeError(f"{path}: tensor {name} differs from {source} (dtype {dtype} vs {w.dtype}, "
                             f"shape {shape} vs {tuple(w.shape)})")


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


def _bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a == b`` for two uint8 tensors of one length, compared 8 bytes at a time where both are 8-byte aligned
    (``torch.equal`` on int64 runs about 5x faster than on bytes)."""
    n8 = len(a) // 8 * 8
    if n8 and a.data_ptr() % 8 == 0 and b.data_ptr() % 8 == 0:
        return torch.equal(a[:n8].view(torch.int64), b[:n8].view(torch.int64)) and torch.equal(a[n8:], b[n8:])
    return torch.equal(a, b)


def _pread_exact(fd: int, out: torch.Tensor, offset: int) -> None:
    mv, done = memoryview(out.numpy()), 0
    while done < len(mv):
        got = os.preadv(fd, [mv[done:]], offset + done)
        if got <= 0:
            raise MergeError(f"unexpected end of file at byte {offset + done}")
        done += got


def compare_digests(got: dict[str, str], want: dict[str, str], want_name: str, got_name: str) -> None:
    """Raise :class:`MergeError` naming the differing, missing and unexpected names when the sha256 digests
    ``got`` (``{name: hex}``) and ``want`` differ."""
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    differ = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    if missing or extra or differ:
        raise MergeError(f"{got_name}: parameters do not match {want_name}: {len(differ)} differ {differ[:5]}, "
                         f"{len(missing)} missing {missing[:5]}, {len(extra)} unexpected {extra[:5]}")


def reload_model(model_dir: Path) -> torch.nn.Module:
    """``from_pretrained`` of ``model_dir`` (CPU, float32, eval mode); raises :class:`MergeError` when loading reports
    missing, unexpected or mismatched keys."""
    reloaded, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if problems:
        raise MergeError(f"{model_dir}: reloading the written model reported {problems}")
    return reloaded.eval()


def rss_bytes() -> int:
    """This process's resident set now, in bytes."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def anon_rss_bytes() -> int:
    """This process's anonymous resident memory now (heap and tensor buffers: the resident set less mapped file
    and shared-memory pages), in bytes."""
    import psutil

    info = psutil.Process().memory_info()
    return int(info.rss - getattr(info, "shared", 0))


def peak_rss_bytes() -> int:
    """This process's peak resident set (``ru_maxrss``), in bytes."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB
