"""Offline streaming merge: a DCP training checkpoint → a verified Hugging Face model directory.

A separate single process with no process group (so no collective watchdog can kill it)::

    pitlab merge --checkpoint CKPT --base BASE --out MODEL [--summary SUMMARY]   (python -m pitlab.trainer.merge)
        [--max-shard-size 5GB] [--logits-probe auto|always|never] [--merge-adapter auto|yes|no]

Any of the paths may be an ``s3://`` URI (:func:`merge_uris`): inputs are downloaded and verified, an output is
published with its manifest and ``_COMPLETE`` last.

**Full-weight checkpoints.** The checkpoint's model tensors are read from the DCP files
(``torch.distributed.checkpoint`` ``FileSystemReader`` metadata, then ``dcp.load`` of a *subset* of keys into
preallocated tensors, no process group) one output shard at a time: groups of whole tensors, in natural name
order, of at most ``max_shard_size`` bytes (a tensor larger than that is a shard of its own). Each group is
renamed to the Hugging Face names ``save_pretrained`` would write (tied duplicates dropped with
``transformers``' ``remove_tied_weights_from_state_dict``; fused MoE experts split back per expert with
``revert_weight_conversion``) and written with ``safetensors`` as ``model-0000i-of-0000n.safetensors`` plus
``model.safetensors.index.json`` (``metadata.total_size`` in bytes + ``weight_map``), or as one
``model.safetensors`` when it fits one shard. Peak host memory above the libraries is about one shard plus
one tensor (the verification reopens the written file per tensor, so its memory map holds one tensor's pages),
not the model: 69 MB for a 328 MB checkpoint with 50 MB shards (tests/test_trainer_merge.py).

**LoRA checkpoints** (``train_state.json`` records ``lora``; the checkpoint holds only the adapter tensors):
with ``lora.mergeIntoBase`` (or ``--merge-adapter yes``) the base model's safetensors are streamed shard by
shard and every LoRA-targeted weight becomes ``W + ΔW`` (peft's ``get_delta_weight``: ``B @ A × alpha / r``,
computed in float32 and added in the base weight's dtype, as peft's ``merge(safe_merge=True)`` does);
otherwise the output is the adapter directory (``adapter_model.safetensors`` + ``adapter_config.json``
naming the base in ``base_model_name_or_path``), saved through :func:`pitlab.trainer.lora.save_adapter_verified`.

**Verification**, also bounded: a second pass reloads every group from the checkpoint (and the base) and
compares each written tensor with it bit for bit (dtype, shape, values), and checks that the index names
exactly the expected tensors; with the training summary, every checkpoint tensor's sha256 must equal its
``param_sha256``. The logits probe (a fixed batch through the checkpoint-loaded model and through
``from_pretrained`` of the written folder) needs whole models in memory, so ``--logits-probe auto`` runs it
only when the model's bytes are at most ``max_shard_size`` (the memory the merge is allowed anyway).

The output appears at ``MODEL_DIR`` only after verification passed: it is written to ``MODEL_DIR.tmp`` and
renamed (an older ``MODEL_DIR`` is replaced only then). On any mismatch the ``.tmp`` is deleted and
:class:`MergeError` is raised. The report (``merge_report.json``, also printed) carries bytes/s and the
process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from pitlab.trainer.checkpoint import LATEST, TRAIN_STATE, latest_checkpoint
from pitlab.trainer.digest import tensor_sha256
from pitlab.trainer.files import fsync_dir, make_readable, write_json_atomic

REPORT = "merge_report.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
PROBE_SEED = 0
PROBE_SHAPE = (3, 24)  # (sequences, tokens) of the logits probe
DEFAULT_MAX_SHARD_SIZE = 5 * 10 ** 9  # bytes ("5GB", as Hugging Face counts it)
# LoRA merged into the base vs the peft model computing base + adapter separately: the same maths in another
# order of float32 operations; the probe accepts |diff| <= LORA_PROBE_ATOL + LORA_PROBE_RTOL * |reference|
LORA_PROBE_ATOL, LORA_PROBE_RTOL = 1e-4, 1e-4
_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}


class MergeError(RuntimeError):
    """The merged model could not be written or does not match the checkpoint / training summary."""


class MergeInputError(MergeError):
    """An input of the merge is not what it must be (no checkpoint, no config.json, an unreadable summary):
    bad input, exit code 2."""


def parse_size(text: str | int) -> int:
    """Bytes from ``5GB``, ``500MB``, ``2GiB``, ``123`` (decimal units as Hugging Face uses them; KiB/MiB/GiB
    binary). Raises ``ValueError`` naming ``--max-shard-size`` for anything else or a size < 1 byte."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
        if not m or m.group(2) not in _UNITS:
            raise ValueError(f"--max-shard-size: {text!r} is not a size like 5GB, 500MB or 2GiB")
        value = int(float(m.group(1)) * _UNITS[m.group(2)])
    if value < 1:
        raise ValueError(f"--max-shard-size: must be at least 1 byte (got {text!r})")
    return value


def resolve_checkpoint(path: Path) -> Path:
    """A DCP checkpoint directory: ``path`` itself, or the one ``path/latest`` names when ``path`` is the
    checkpoint root. Raises :class:`MergeError` naming the path if it holds no complete checkpoint."""
    path = Path(path)
    if (path / LATEST).is_file():
        found = latest_checkpoint(path)
        if found is not None:
            return found
    if path.name.endswith(".tmp"):
        raise MergeInputError(f"{path}: is an incomplete checkpoint (.tmp); merge a complete step-<N> directory")
    if not (path / ".metadata").is_file():
        raise MergeInputError(f"{path}: not a complete DCP checkpoint (no .metadata and no 'latest' pointer)")
    return path


def checkpoint_tensors(checkpoint_dir: Path) -> dict[str, tuple[torch.dtype, torch.Size]]:
    """``{model state-dict name: (dtype, shape)}`` of the model tensors in a DCP checkpoint (its ``model.*``
    entries, prefix removed), read from the ``.metadata`` file only (no tensor data)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = dcp.FileSystemReader(str(checkpoint_dir)).read_metadata()
    return {k[len("model."):]: (md.properties.dtype, md.size) for k, md in metadata.state_dict_metadata.items()
            if k.startswith("model.") and isinstance(md, TensorStorageMetadata)}


def load_tensors(checkpoint_dir: Path, names: list[str],
                 meta: dict[str, tuple[torch.dtype, torch.Size]]) -> dict[str, torch.Tensor]:
    """Read only ``names`` (model state-dict names) from a DCP checkpoint into fresh CPU tensors of the saved
    dtype and full shape, in this process (``dcp.load(..., no_dist=True)`` reads just these tensors' byte
    ranges). Memory: the tensors' bytes plus one stored chunk. Raises ``RuntimeError`` from DCP when a name
    is not in the checkpoint."""
    state = {n: torch.empty(meta[n][1], dtype=meta[n][0]) for n in names}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
        dcp.load({"model": state}, storage_reader=dcp.FileSystemReader(str(checkpoint_dir)), no_dist=True)
    return state


def natural_key(name: str) -> list:
    """Sort key that orders ``layers.2`` before ``layers.10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def plan_groups(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Split tensor names (natural order) into consecutive groups of at most ``max_bytes`` bytes each (``sizes``
    in bytes); a tensor larger than ``max_bytes`` forms a group of its own. Returns the groups in order."""
    groups: list[list[str]] = []
    current, used = [], 0
    for name in sorted(sizes, key=natural_key):
        if current and used + sizes[name] > max_bytes:
            groups.append(current)
            current, used = [], 0
        current.append(name)
        used += sizes[name]
    if current:
        groups.append(current)
    return groups


def shard_file_names(n: int) -> list[str]:
    """``model.safetensors`` for one shard, else ``model-0000i-of-0000n.safetensors`` (Hugging Face's names)."""
    return [SINGLE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def read_train_state(checkpoint_dir: Path) -> dict:
    """``train_state.json`` of a checkpoint (``{}`` when absent, e.g. a checkpoint written by hand)."""
    path = Path(checkpoint_dir) / TRAIN_STATE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise MergeInputError(f"{path}: unreadable JSON: {err}") from None


def _meta_model(base_dir: Path):
    config = AutoConfig.from_pretrained(base_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return config, model


def load_checkpoint_model(checkpoint_dir: Path, base_dir: Path) -> torch.nn.Module:
    """The causal LM of ``base_dir``'s config (CPU, float32, eval mode) with the model weights of a full-weight
    DCP checkpoint loaded in this process (no process group); the whole model is in memory. Raises
    :class:`MergeError` when the checkpoint's model keys differ from the architecture's state dict keys."""
    config = AutoConfig.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = model.state_dict()
    saved = set(checkpoint_tensors(checkpoint_dir))
    _check_keys(set(state), saved, checkpoint_dir, base_dir)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
        dcp.load({"model": state}, checkpoint_id=checkpoint_dir, no_dist=True)
    model.load_state_dict(state)  # DCP loads in place; this also covers tied or replaced entries
    model.eval()
    return model


def _check_keys(expected: set[str], saved: set[str], checkpoint_dir: Path, base_dir: Path) -> None:
    missing, extra = sorted(expected - saved), sorted(saved - expected)
    if missing or extra:
        raise MergeError(f"{checkpoint_dir}: model tensors do not match {base_dir}'s architecture "
                         f"(missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''})")


def probe_logits(model: torch.nn.Module) -> torch.Tensor:
    """Logits (float32, shape ``(3, 24, vocab)``) of a fixed pseudo-random batch of token ids."""
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(PROBE_SEED)
    ids = torch.randint(0, vocab, PROBE_SHAPE, generator=gen)
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def merge_checkpoint(checkpoint_dir: Path, base_dir: Path, out_dir: Path,
                     expected_sha256: dict[str, str] | None = None, *,
                     max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE, logits_probe: str = "auto",
                     merge_adapter: bool | None = None) -> dict:
    """Write the checkpoint's model as a Hugging Face directory at ``out_dir``, streaming, and verify it.

    ``checkpoint_dir``: a ``step-<N>`` DCP directory or the checkpoint root holding ``latest`` (local paths).
    ``base_dir``: the HF directory training started from (config and tokenizer; for LoRA also the base weights).
    ``expected_sha256``: ``{parameter name: sha256}`` from the training summary, checked when given.
    ``max_shard_size``: bytes per safetensors shard (``"5GB"`` style accepted), also the memory bound.
    ``logits_probe``: ``auto`` (probe when the model's bytes <= ``max_shard_size``), ``always`` or ``never``.
    ``merge_adapter`` (LoRA checkpoints only): True merges the adapter into the base, False writes the
    adapter directory, None follows ``lora.mergeIntoBase`` recorded in the checkpoint.

    Returns the report (also ``out_dir/merge_report.json``): ``checkpoint``, ``base``, ``out``, ``kind``
    (``full``, ``lora-merged`` or ``lora-adapter``), ``tensors`` and ``bytes`` (in the written safetensors),
    ``shards``, ``parameters``, ``seconds``, ``bytes_per_second`` (written bytes / total seconds),
    ``write_seconds``, ``verify_seconds``, ``rss_start_bytes`` (resident set at the call),
    ``rss_before_tensors_bytes`` (after the libraries and the meta-device model are loaded, before any tensor
    data), ``peak_rss_bytes`` (the process's peak resident set, ``ru_maxrss``; all in bytes),
    ``logits_probe`` (``equal``, ``close`` with its max |diff|, or ``skipped``), ``verified`` (always True: a failed check raises). Raises :class:`MergeError` for any mismatch or missing
    input, ``ValueError`` for a bad ``max_shard_size``/``logits_probe``; no complete-looking ``out_dir`` is
    left by a failure and an existing one is kept.
    """
    t0 = time.perf_counter()
    rss_start = _rss_bytes()
    max_bytes = parse_size(max_shard_size)
    if logits_probe not in ("auto", "always", "never"):
        raise ValueError(f"--logits-probe: must be auto, always or never (got {logits_probe!r})")
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    if not (base_dir / "config.json").is_file():
        raise MergeInputError(f"{base_dir}: base model directory has no config.json")
    ckpt = resolve_checkpoint(checkpoint_dir)
    lora = read_train_state(ckpt).get("lora")
    from pitlab.storage import outdir

    tmp = outdir.aside(out_dir)  # a fresh hidden sibling: no folder of the user's beside out_dir is touched
    tmp.rmdir()  # the writers below create it
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(base_dir)
        except (OSError, ValueError) as err:
            raise MergeInputError(f"{base_dir}: no loadable tokenizer to ship with the model: {err}") from None
        if lora is None:
            report = _merge_full(ckpt, base_dir, tmp, expected_sha256, max_bytes, logits_probe)
        else:
            merge = lora.get("merge_into_base", False) if merge_adapter is None else merge_adapter
            report = _merge_lora(ckpt, base_dir, tmp, expected_sha256, max_bytes, logits_probe, lora, merge)
        tokenizer.save_pretrained(tmp)
        make_readable(tmp)
        seconds = time.perf_counter() - t0
        report = {"checkpoint": str(ckpt), "base": str(base_dir), "out": str(out_dir), **report,
                  "seconds": seconds, "bytes_per_second": report["bytes"] / seconds if seconds > 0 else None,
                  "max_shard_size": max_bytes, "rss_start_bytes": rss_start, "peak_rss_bytes": _peak_rss_bytes(),
                  "probe_shape": list(PROBE_SHAPE), "summary_digests_checked": expected_sha256 is not None,
                  "verified": True}
        report["files"] = sorted({p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()} | {REPORT})
        write_json_atomic(tmp / REPORT, report)
        for f in tmp.iterdir():
            if f.is_file() and f.suffix == ".safetensors":
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        fsync_dir(tmp)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


# ---------------------------------------------------------------------------------------- full-weight merge

def _merge_full(ckpt: Path, base_dir: Path, tmp: Path, expected_sha256: dict[str, str] | None, max_bytes: int,
                logits_probe: str) -> dict:
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    config, meta_model = _meta_model(base_dir)
    meta_sd = meta_model.state_dict()
    saved = checkpoint_tensors(ckpt)
    _check_keys(set(meta_sd), set(saved), ckpt, base_dir)
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

    def convert(group: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        try:
            out = revert_weight_conversion(meta_model, group)
        except Exception as err:  # noqa: BLE001 - transformers raises various errors for incomplete groups
            raise MergeError(f"{ckpt}: cannot convert tensors {sorted(group)[:3]}... to Hugging Face names: "
                             f"{err!r}") from None
        return {k: v.contiguous() for k, v in out.items()}

    sizes = {n: saved[n][0].itemsize * saved[n][1].numel() for n in kept}
    groups = plan_groups(sizes, max_bytes)
    files = shard_file_names(len(groups))
    rss_before = _rss_bytes()  # libraries imported, meta model built: what follows is tensor data
    t_write = time.perf_counter()
    weight_map, digests, total = {}, {}, 0
    tmp.mkdir(parents=True)
    for group, fname in zip(groups, files):
        tensors = load_tensors(ckpt, group, saved)
        for n in group:
            if n in param_set:
                digests[n] = tensor_sha256(tensors[n])
        hf = convert(tensors)
        del tensors
        save_file(hf, str(tmp / fname), metadata={"format": "pt"})
        for k, v in hf.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
        del hf
    # parameters tied to another one (not written) are still in the summary's digests
    for n in param_names:
        if n not in digests:
            digests[n] = tensor_sha256(load_tensors(ckpt, [n], saved)[n])
    if expected_sha256 is not None:
        _compare_digests(digests, expected_sha256, "the training summary's param_sha256", f"checkpoint {ckpt}")
    _write_index(tmp, weight_map, total, len(files), expected_hf)
    write_seconds = time.perf_counter() - t_write

    t_verify = time.perf_counter()
    for group, fname in zip(groups, files):
        _compare_file(tmp / fname, convert(load_tensors(ckpt, group, saved)), f"checkpoint {ckpt}")
    config.dtype = _uniform_dtype(expected_hf, config)
    config.save_pretrained(tmp)
    _copy_generation_config(base_dir, tmp)
    model_bytes = sum(sizes.values())
    probe = "skipped"
    if logits_probe == "always" or (logits_probe == "auto" and model_bytes <= max_bytes):
        expected_logits = probe_logits(load_checkpoint_model(ckpt, base_dir))
        got = probe_logits(_reload(tmp))
        if not torch.equal(got, expected_logits):
            diff = (got - expected_logits).abs().max().item()
            raise MergeError(f"{tmp}: probe logits differ from the checkpoint-loaded model (max |diff| {diff:g})")
        probe = "equal"
    return {"kind": "full", "tensors": len(weight_map), "bytes": total, "shards": len(files),
            "parameters": len(digests), "rss_before_tensors_bytes": rss_before, "write_seconds": write_seconds,
            "verify_seconds": time.perf_counter() - t_verify, "logits_probe": probe}


def _uniform_dtype(expected: dict[str, tuple[torch.dtype, tuple]], config) -> torch.dtype:
    dtypes = {d for d, _ in expected.values() if d.is_floating_point}
    return dtypes.pop() if len(dtypes) == 1 else getattr(config, "dtype", None)


def _write_index(tmp: Path, weight_map: dict[str, str], total: int, n_files: int,
                 expected: dict[str, tuple]) -> None:
    """Check the written names against the expected Hugging Face names, then (for several shards) write
    ``model.safetensors.index.json`` in Hugging Face's layout."""
    missing, extra = sorted(expected.keys() - weight_map.keys()), sorted(weight_map.keys() - expected.keys())
    if missing or extra:
        raise MergeError(f"{tmp}: written tensors differ from the expected Hugging Face names: {len(missing)} "
                         f"missing {missing[:5]}, {len(extra)} unexpected {extra[:5]}")
    if n_files > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {k: weight_map[k] for k in sorted(weight_map, key=natural_key)}}
        write_json_atomic(tmp / INDEX, index)


def _compare_file(path: Path, want: dict[str, torch.Tensor], source: str) -> None:
    """Every tensor of the safetensors file ``path`` equals ``want`` (same names, dtype, shape, bits). The file
    is reopened per tensor, so at most one tensor's pages of its memory map are resident at a time."""
    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
    missing, extra = sorted(want.keys() - names), sorted(names - want.keys())
    if missing or extra:
        raise MergeError(f"{path}: holds other tensors than {source}: {len(missing)} missing {missing[:5]}, "
                         f"{len(extra)} unexpected {extra[:5]}")
    for name in sorted(names, key=natural_key):
        with safe_open(str(path), framework="pt") as f:
            got = f.get_tensor(name)
        w = want[name]
        if got.dtype != w.dtype or got.shape != w.shape or not torch.equal(got, w):
            raise MergeError(f"{path}: tensor {name} differs from {source} (dtype {got.dtype} vs {w.dtype}, "
                             f"shape {tuple(got.shape)} vs {tuple(w.shape)})")
        del got


def _reload(model_dir: Path) -> torch.nn.Module:
    reloaded, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if problems:
        raise MergeError(f"{model_dir}: reloading the written model reported {problems}")
    return reloaded.eval()


def _copy_generation_config(base_dir: Path, tmp: Path) -> None:
    src = base_dir / "generation_config.json"
    if src.is_file():
        shutil.copyfile(src, tmp / src.name)


# --------------------------------------------------------------------------------------------- LoRA merge

def _merge_lora(ckpt: Path, base_dir: Path, tmp: Path, expected_sha256: dict[str, str] | None, max_bytes: int,
                logits_probe: str, lora: dict, merge: bool) -> dict:
    from pitlab.trainer.loading import read_header, safetensors_index
    from pitlab.trainer.lora import lora_meta_model

    config, peft_meta = lora_meta_model(base_dir, lora)
    saved = checkpoint_tensors(ckpt)
    trainable = [n for n, p in peft_meta.named_parameters() if p.requires_grad]
    missing = sorted(set(trainable) - set(saved))
    if missing:
        raise MergeError(f"{ckpt}: LoRA checkpoint lacks adapter tensors {missing[:5]} of the adapter "
                         f"recorded in {ckpt / TRAIN_STATE} ({len(missing)} of {len(trainable)} missing)")
    adapter = load_tensors(ckpt, trainable, saved)  # r × (in + out) per target: small next to the base
    digests = {n: tensor_sha256(t) for n, t in adapter.items()}
    if expected_sha256 is not None:
        want = {n: expected_sha256[n] for n in trainable if n in expected_sha256}
        _compare_digests(digests, want, "the training summary's param_sha256 (adapter tensors)",
                         f"checkpoint {ckpt}")
    model_bytes = 0
    files = safetensors_index(base_dir)
    headers = {p: read_header(p)[1] for p in set(files.values())}
    for name, path in files.items():
        e = headers[path][name]
        model_bytes += (e["data_offsets"][1] - e["data_offsets"][0])
    probe_on = logits_probe == "always" or (logits_probe == "auto" and model_bytes <= max_bytes)
    rss_before = _rss_bytes()
    t_write = time.perf_counter()
    if not merge:
        return _lora_adapter_folder(peft_meta, adapter, base_dir, tmp, lora, probe_on, len(trainable), rss_before,
                                    t_write)
    return _lora_merged(ckpt, base_dir, tmp, peft_meta, adapter, files, headers, max_bytes, lora, probe_on,
                        len(trainable), rss_before, t_write)


def _lora_adapter_folder(peft_meta, adapter: dict[str, torch.Tensor], base_dir: Path, tmp: Path, lora: dict,
                         probe_on: bool, n_trainable: int, rss_before: int, t_write: float) -> dict:
    """The LoRA output as an adapter folder naming its base (saved verified), probed against the checkpoint's
    adapter on the base when ``probe_on``. Returns the report's fields."""
    from pitlab.trainer.lora import save_adapter_verified

    peft_meta.peft_config["default"].base_model_name_or_path = str(base_dir.resolve())
    saved_report = save_adapter_verified(peft_meta, tmp, state_dict=adapter, base_dir=base_dir)
    write_seconds = time.perf_counter() - t_write
    t_verify = time.perf_counter()
    probe = "skipped"
    if probe_on:
        from peft import PeftModel

        reference = _peft_reference(base_dir, lora, adapter)
        reloaded = PeftModel.from_pretrained(_reload(base_dir), tmp).eval()
        got, want = probe_logits(reloaded), probe_logits(reference)
        if not torch.equal(got, want):
            raise MergeError(f"{tmp}: the saved adapter on {base_dir} gives other probe logits than the "
                             f"checkpoint's adapter (max |diff| {(got - want).abs().max().item():g})")
        probe = "equal"
    return {"kind": "lora-adapter", "tensors": saved_report["tensors"], "bytes": saved_report["bytes"],
            "shards": 1, "parameters": n_trainable, "adapter_elements": saved_report["elements"],
            "rss_before_tensors_bytes": rss_before,
            "write_seconds": write_seconds, "verify_seconds": time.perf_counter() - t_verify,
            "logits_probe": probe}


def _lora_merged(ckpt: Path, base_dir: Path, tmp: Path, peft_meta, adapter: dict[str, torch.Tensor],
                 files: dict[str, Path], headers: dict, max_bytes: int, lora: dict, probe_on: bool, n_trainable: int,
                 rss_before: int, t_write: float) -> dict:
    """The LoRA output merged into the base: every base shard streamed, each targeted weight + ΔW (peft's
    ``get_delta_weight``), written in groups of at most ``max_bytes``, compared back and probed. Returns the
    report's fields."""
    from pitlab.trainer.lora import lora_modules

    modules = lora_modules(peft_meta)  # base weight name -> peft LoRA layer (on meta)
    unknown = sorted(set(modules) - set(files))
    if unknown:
        raise MergeError(f"{base_dir}: LoRA targets {unknown[:5]} have no weight of that name in the base "
                         "safetensors; merge with --merge-adapter no")
    for base_name, (module, prefix) in modules.items():
        for part in ("lora_A", "lora_B"):
            getattr(module, part)["default"].weight = torch.nn.Parameter(adapter[f"{prefix}.{part}.default.weight"],
                                                                         requires_grad=False)

    def merged_group(group: list[str]) -> dict[str, torch.Tensor]:
        out = {}
        by_file: dict[Path, list[str]] = {}
        for n in group:
            by_file.setdefault(files[n], []).append(n)
        for path, names in by_file.items():
            with safe_open(str(path), framework="pt") as f:
                for n in names:
                    w = f.get_tensor(n)
                    if n in modules:
                        delta = modules[n][0].get_delta_weight("default")
                        w = w.clone()
                        w += delta.to(w.dtype)  # as peft's LoraLayer.merge(safe_merge=True)
                        if not torch.isfinite(w).all():
                            raise MergeError(f"{n}: merging the adapter gives non-finite values")
                    out[n] = w.contiguous()
        return out

    sizes = {}
    for name, path in files.items():
        e = headers[path][name]
        sizes[name] = e["data_offsets"][1] - e["data_offsets"][0]
    groups = plan_groups(sizes, max_bytes)
    names_out = shard_file_names(len(groups))
    tmp.mkdir(parents=True)
    weight_map, total = {}, 0
    expected = {}
    for group, fname in zip(groups, names_out):
        tensors = merged_group(group)
        save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = fname
            expected[k] = (v.dtype, tuple(v.shape))
            total += v.numel() * v.element_size()
        del tensors
    _write_index(tmp, weight_map, total, len(names_out), expected)
    if set(weight_map) != set(files):
        raise MergeError(f"{tmp}: wrote {len(weight_map)} tensors, the base has {len(files)}")
    write_seconds = time.perf_counter() - t_write
    t_verify = time.perf_counter()
    for group, fname in zip(groups, names_out):
        _compare_file(tmp / fname, merged_group(group), f"base {base_dir} + adapter of {ckpt}")
    AutoConfig.from_pretrained(base_dir).save_pretrained(tmp)
    _copy_generation_config(base_dir, tmp)
    probe, max_diff = "skipped", None
    if probe_on:
        want = probe_logits(_peft_reference(base_dir, lora, adapter))
        got = probe_logits(_reload(tmp))
        max_diff = (got - want).abs().max().item()
        if not torch.allclose(got, want, rtol=LORA_PROBE_RTOL, atol=LORA_PROBE_ATOL):
            raise MergeError(f"{tmp}: the merged model's probe logits differ from the base + adapter (peft) model "
                             f"beyond atol {LORA_PROBE_ATOL:g} + rtol {LORA_PROBE_RTOL:g} (max |diff| {max_diff:g})")
        probe = "equal" if max_diff == 0 else "close"
    return {"kind": "lora-merged", "tensors": len(weight_map), "bytes": total, "shards": len(names_out),
            "parameters": n_trainable, "merged_weights": len(modules), "rss_before_tensors_bytes": rss_before,
            "write_seconds": write_seconds,
            "verify_seconds": time.perf_counter() - t_verify, "logits_probe": probe,
            "logits_probe_max_abs_diff": max_diff}


def _peft_reference(base_dir: Path, lora: dict, adapter: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The base (``from_pretrained``, float32) wrapped with the recorded LoRA and the checkpoint's adapter
    tensors: what the trained model computes, unmerged."""
    from pitlab.trainer.lora import apply_lora

    model = apply_lora(_reload(base_dir), r=lora["r"], alpha=lora["alpha"], dropout=lora["dropout"],
                       target_modules=lora["target_modules"])
    state = model.state_dict()
    for n, t in adapter.items():
        state[n].copy_(t)
    return model.eval()


# ------------------------------------------------------------------------------------------------ helpers

def _compare_digests(got: dict[str, str], want: dict[str, str], want_name: str, got_name: str) -> None:
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    differ = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    if missing or extra or differ:
        raise MergeError(f"{got_name}: parameters do not match {want_name}: {len(differ)} differ {differ[:5]}, "
                         f"{len(missing)} missing {missing[:5]}, {len(extra)} unexpected {extra[:5]}")


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; an existing ``dst`` is moved to a fresh hidden sibling first and deleted
    afterwards (:func:`pitlab.storage.outdir.swap_in`)."""
    from pitlab.storage.outdir import swap_in

    swap_in(src, dst)
    fsync_dir(dst.parent)


# ---------------------------------------------------------------- object storage
def _local_checkpoint(uri: str) -> Path:
    """A verified local copy of a checkpoint step (``uri`` is a root with ``latest`` or a ``step-<N>``)."""
    from pitlab import storage
    from pitlab.trainer.checkpoint import CheckpointError
    from pitlab.trainer.checkpointer import latest_checkpoint as latest_anywhere  # a local root or s3://

    step = uri.rstrip("/")
    if not storage.basename(step).startswith("step-"):
        found = latest_anywhere(step)
        if found is None:
            raise CheckpointError(f"{step}: no 'latest' pointer and not a step-<N> checkpoint")
        step = found
    return storage.localize(step, require_published=True)


def _expected_sha256(summary: Path | None) -> dict[str, str] | None:
    """``param_sha256`` of a training summary.json; raises MergeError when it cannot be read."""
    if summary is None:
        return None
    try:
        return json.loads(Path(summary).read_text())["param_sha256"]
    except (OSError, ValueError, KeyError) as err:
        raise MergeInputError(f"{summary}: cannot read param_sha256: {err!r}") from None


def merged_files(dest, found: list[str]) -> set[str]:
    """The entries of ``dest`` an earlier merge wrote: the ``files`` its ``merge_report.json`` lists, the report,
    and for an ``s3://`` output the manifest and ``_COMPLETE``; empty without a readable report."""
    from pitlab import storage

    if REPORT not in found:
        return set()
    try:
        report = json.loads(storage.read_text(storage.join(dest, REPORT)))
        files = set(report["files"]) if isinstance(report, dict) and isinstance(report.get("files"), list) else set()
    except (storage.StorageError, OSError, ValueError, TypeError):
        return set()
    mine = files | {REPORT} if files else set()  # a report without its file list vouches for nothing
    if files and storage.is_s3(str(dest)):
        mine |= storage.manifest.MARKERS
    return mine & set(found)


def merge_uris(checkpoint: str | Path, base: str | Path, out: str | Path, summary: str | Path | None = None, *,
               max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE, logits_probe: str = "auto",
               merge_adapter: bool | None = None, overwrite: bool = False) -> dict:
    """:func:`merge_checkpoint` where any of the paths may be an ``s3://`` URI (the merge Job's entry point).

    Inputs in object storage are downloaded into the cache (``$PITLAB_CACHE_DIR``), every file verified by
    sha256 against its manifest; a checkpoint URI may be the checkpoint root (its ``latest`` is followed, only
    to a step with ``_COMPLETE``) or one ``step-<N>``. An ``s3://`` output is written to a staging folder
    (``$PITLAB_STAGING_DIR``) by the ordinary, verified merge, then uploaded and published (``MANIFEST.json``,
    then ``_COMPLETE`` last); the staging copy is removed, and ``merge_report.json`` also records the URIs.
    ``out`` holding anything but an earlier merge's output (the files its ``merge_report.json`` lists, and the
    markers of a published one: :func:`merged_files`) is refused before anything is read, with
    :class:`~pitlab.storage.errors.OutputExists`, unless ``overwrite``.
    Returns the report. Raises MergeError, ValueError (a bad option), CheckpointError or StorageError.
    """
    from pitlab import storage
    from pitlab.storage.outdir import check_output, describe

    for name, value in (("--checkpoint", checkpoint), ("--base", base), ("--out", out), ("--summary", summary)):
        if value is not None and storage.is_s3(str(value)):
            try:
                storage.parse_s3(str(value))
            except storage.StorageError as err:
                raise MergeInputError(f"{name}: {err}") from None
    dest = str(out) if storage.is_s3(str(out)) else Path(out)
    found = check_output(dest, overwrite, "pitlab merge", own=merged_files, replace_own=True)
    if found:
        what = "--overwrite: replacing" if overwrite else "replacing the earlier merge output"
        print(f"pitlab merge: {what} {describe(dest, found)} once the new model is verified", file=sys.stderr)
    staging = None
    try:
        ckpt = _local_checkpoint(str(checkpoint)) if storage.is_s3(str(checkpoint)) else Path(checkpoint)
        base_dir = storage.localize(str(base), require_published=True) if storage.is_s3(str(base)) else Path(base)
        if summary is not None and storage.is_s3(str(summary)):
            summary = storage.localize(str(summary), require_published=False)
        out_dir = Path(out) if not storage.is_s3(str(out)) else None
        if out_dir is None:
            from pitlab.trainer.checkpoint_s3 import staging_root, staging_tag

            staging = staging_root() / f"merge-{storage.basename(str(out))}-{staging_tag(str(out))}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            out_dir = staging / "model"
        report = merge_checkpoint(ckpt, base_dir, out_dir, _expected_sha256(None if summary is None else Path(summary)),
                                  max_shard_size=max_shard_size, logits_probe=logits_probe,
                                  merge_adapter=merge_adapter)
        if staging is None:
            return report
        report_path = out_dir / "merge_report.json"
        report = json.loads(report_path.read_text())
        report.update(checkpoint_uri=str(checkpoint), model_uri=str(out))
        write_json_atomic(report_path, report)
        m = storage.upload_dir(out_dir, str(out), extra={"kind": "model", "checkpoint": str(checkpoint)})
        print(f"pitlab merge: published {len(m.files)} files, {m.total_bytes} bytes to {out}", file=sys.stderr)
        return report
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


MERGE_ADAPTER = {"auto": None, "yes": True, "no": False}


def run_merge_command(checkpoint: str, base: str, out: str, summary: str | None = None, max_shard_size: str = "5GB",
                      logits_probe: str = "auto", merge_adapter: str = "auto", print_report: bool = True,
                      overwrite: bool = False) -> int:
    """:func:`merge_uris` with errors as a message on stderr and an exit code: 0 merged (and published),
    1 failed (the merge, its verification or storage), 2 invalid input (an option, a missing or incomplete
    checkpoint, base or summary, an ``out`` holding other files)."""
    from pitlab.storage import StorageError
    from pitlab.storage.errors import NotPublished, ObjectNotFound, OutputExists
    from pitlab.trainer.checkpoint import CheckpointError

    try:
        report = merge_uris(checkpoint, base, out, summary, max_shard_size=max_shard_size, logits_probe=logits_probe,
                            merge_adapter=MERGE_ADAPTER[merge_adapter], overwrite=overwrite)
    except (MergeError, ValueError, CheckpointError, StorageError) as err:
        print(f"pitlab.trainer.merge: error: {err}", file=sys.stderr)
        bad_input = (ValueError, OutputExists, MergeInputError, CheckpointError, NotPublished, ObjectNotFound)
        return 2 if isinstance(err, bad_input) else 1
    if print_report:
        print(json.dumps(report, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pitlab.trainer.merge``: the exit code of :func:`run_merge_command`."""
    parser = argparse.ArgumentParser(prog="python -m pitlab.trainer.merge", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="step-<N> DCP dir or the checkpoint root (or s3://...)")
    parser.add_argument("--base", required=True, help="base HF model directory (config, tokenizer; or s3://...)")
    parser.add_argument("--out", required=True, help="output HF model directory (or s3://..., published)")
    parser.add_argument("--summary", default=None,
                        help="training summary.json whose param_sha256 the merged weights must match")
    parser.add_argument("--max-shard-size", default="5GB",
                        help="bytes per safetensors shard, also the memory bound (e.g. 5GB, 500MB; default 5GB)")
    parser.add_argument("--logits-probe", choices=("auto", "always", "never"), default="auto",
                        help="compare probe logits of checkpoint and written model (auto: model <= shard size)")
    parser.add_argument("--merge-adapter", choices=("auto", "yes", "no"), default="auto",
                        help="LoRA checkpoints: merge the adapter into the base (auto: lora.mergeIntoBase)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an --out holding files that no earlier merge wrote")
    args = parser.parse_args(argv)
    return run_merge_command(args.checkpoint, args.base, args.out, args.summary, args.max_shard_size,
                             args.logits_probe, args.merge_adapter, print_report=True, overwrite=args.overwrite)


if __name__ == "__main__":
    sys.exit(main())
