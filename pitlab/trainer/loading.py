"""Load a Hugging Face causal LM straight into FSDP2 shards: meta-device build, per-rank slices read from
the safetensors files, so host memory holds about one model copy per node (not one per rank).

Each rank builds the model on the ``meta`` device (no memory), applies ``fully_shard`` (parameters become
``DTensor`` shards with ``Shard(0)`` placement over the mesh), allocates only its local shards
(``to_empty``), then reads into each local shard the rows it owns with positioned reads from the
safetensors file (header parsed per the safetensors format: 8-byte little-endian header length, JSON
header with ``dtype``, ``shape``, ``data_offsets``; row-major data). Same-dtype rows are read straight into
the shard's memory; other dtypes (e.g. a bf16 checkpoint into float32 shards) through one tensor's rows.
No memory map is used, so file pages are page cache, not the process's resident memory. Peak host memory
per rank is its shards plus at most one tensor's rows; the ranks of a node together hold about one
model copy.
Non-persistent buffers (rotary ``inv_freq``) are recomputed from the config.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from pitlab.errors import WeightLoadError
from pitlab.trainer.fsdp import shard_model


_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def read_header(path: Path) -> tuple[int, dict]:
    """``(data_start, header)`` of a safetensors file: tensor name -> ``{"dtype", "shape", "data_offsets"}``
    (offsets in bytes from ``data_start``). Raises :class:`WeightLoadError` naming the file if malformed."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise WeightLoadError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        n = int.from_bytes(raw, "little")
        try:
            header = json.loads(f.read(n))
        except ValueError as err:
            raise WeightLoadError(f"{path}: unreadable safetensors header: {err}") from None
    header.pop("__metadata__", None)
    return 8 + n, header


def safetensors_index(base: Path) -> dict[str, Path]:
    """Map each tensor name to its ``.safetensors`` file in ``base`` (``model.safetensors`` or the shards
    named by ``model.safetensors.index.json``). Raises ``FileNotFoundError`` naming ``base``."""
    base = Path(base)
    index = base / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {k: base / v for k, v in weight_map.items()}
    single = base / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{base}: no model.safetensors or model.safetensors.index.json")
    return {k: single for k in read_header(single)[1]}


def read_rows(path: Path, data_start: int, entry: dict, start: int, stop: int, out: torch.Tensor) -> None:
    """Read rows ``[start, stop)`` (dim 0) of one safetensors tensor into ``out`` (contiguous, CPU, shape
    ``(stop - start, *shape[1:])``), converting the dtype if it differs. Bytes read:
    ``(stop - start) * prod(shape[1:]) * itemsize``."""
    dtype = _DTYPES[entry["dtype"]]
    shape = entry["shape"]
    itemsize = torch.empty((), dtype=dtype).element_size()
    row_elems = 1
    for d in shape[1:]:
        row_elems *= d
    offset = data_start + entry["data_offsets"][0] + start * row_elems * itemsize
    # through a host buffer when the dtype differs or ``out`` lives on the GPU (numpy views need CPU memory)
    target = out if out.dtype == dtype and out.device.type == "cpu" else torch.empty(out.shape, dtype=dtype)
    buf = memoryview(target.view(torch.uint8).numpy()).cast("B") if target.numel() else memoryview(b"")
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        got = f.readinto(buf)
    if got != len(buf):
        raise WeightLoadError(f"{path}: short read of {len(buf)} bytes at offset {offset}")
    if target is not out:
        out.copy_(target)


def load_sharded_model(base: Path, mesh: DeviceMesh | None, precision: str, device: torch.device,
                       activation_checkpointing: bool = False, lora: dict | None = None,
                       seed: int = 0) -> nn.Module:
    """Collective (every rank of ``mesh``): the model of ``base`` (HF directory), FSDP2-sharded on ``device``,
    with float32 parameters equal bit for bit to ``from_pretrained(base, dtype=float32)``'s.

    Parameter dim 0 is split as ``torch.chunk`` does (FSDP2's ``Shard(0)``): rank ``r`` of ``W`` reads rows
    ``[r * ceil(n / W), min((r + 1) * ceil(n / W), n))``. Raises :class:`WeightLoadError` naming the tensor
    and file when a parameter is missing from the safetensors or has another shape, and for a
    non-persistent buffer it cannot recompute.

    ``mesh=None``: not sharded (plain tensors on ``device``; the layer-streaming path,
    :mod:`pitlab.trainer.streaming`), every value as with a mesh of one rank.

    ``lora`` (a :func:`pitlab.trainer.lora.lora_record` dict): the meta model is wrapped with peft LoRA
    *before* ``fully_shard`` (so each decoder layer's FSDP2 group holds its frozen base weights and its
    trainable adapter); the base is frozen and, with ``precision="bf16"``, stored in bfloat16 (the dtype it
    is computed in anyway); base tensors are read under their base names
    (:func:`pitlab.trainer.lora.base_parameter_name`); ``lora_A`` is initialised as peft does by default
    (Kaiming-uniform, ``a = √5``) from a generator seeded with ``seed`` over the full tensor (identical on
    every rank, each keeps its rows) and ``lora_B`` with zeros, so the initial model equals the base. Returns
    the ``PeftModel``.
    """
    model = build_meta_model(base, precision, activation_checkpointing, lora)
    if mesh is not None:
        shard_model(model, mesh, precision, lora=lora is not None)
    model.to_empty(device=device)
    load_tensors(base, list(model.named_parameters()) + list(_persistent_buffers(model)), lora, seed)
    _recompute_non_persistent_buffers(model, device)
    return model


def build_meta_model(base: Path, precision: str, activation_checkpointing: bool = False,
                     lora: dict | None = None) -> nn.Module:
    """The model of ``base``'s ``config.json`` on the ``meta`` device (no memory) as
    :func:`load_sharded_model` builds it: float32, ``use_cache`` off, optionally checkpointed, with ``lora``
    the peft LoRA model whose frozen base is bfloat16 with ``precision="bf16"``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pitlab.trainer.lora import apply_lora

    config = AutoConfig.from_pretrained(base)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.config.use_cache = False
        if activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora is not None:
            model = apply_lora(model, r=lora["r"], alpha=lora["alpha"], dropout=lora["dropout"],
                               target_modules=lora["target_modules"])
            if precision == "bf16":
                for p in model.parameters():
                    if not p.requires_grad:
                        p.data = p.data.to(torch.bfloat16)
    return model


def load_tensors(base: Path, tensors, lora: dict | None = None, seed: int = 0) -> None:
    """Fill ``tensors`` (``(full name, tensor)`` pairs of a model from :func:`build_meta_model`, allocated:
    plain tensors or ``DTensor`` shards) from ``base``'s safetensors, as :func:`load_sharded_model` does:
    base tensors under their base names, LoRA adapters with the seeded init, fused experts from per-expert
    tensors. Raises :class:`WeightLoadError` naming the tensor and file when one is missing or misshapen."""
    from pitlab.trainer.lora import base_parameter_name

    files = safetensors_index(base)
    headers = {path: read_header(path) for path in set(files.values())}
    name_of = base_parameter_name if lora is not None else (lambda n: n)
    with torch.no_grad():
        for full_name, tensor in tensors:
            if lora is not None and tensor.requires_grad:
                _init_adapter(full_name, tensor, seed)
                continue
            name = name_of(full_name)
            path = files.get(name)
            if path is None and _is_fused_experts(name):
                _load_fused_experts(base, name, tensor, files, headers)
                continue
            if path is None:
                raise WeightLoadError(f"{base}: no tensor {name!r} in the safetensors files")
            data_start, header = headers[path]
            entry = header.get(name)
            if entry is None:
                raise WeightLoadError(f"{path}: no tensor {name!r} (the index names this file)")
            if tuple(entry["shape"]) != tuple(tensor.shape):
                raise WeightLoadError(f"{path}: {name} has shape {tuple(entry['shape'])}, the model built from "
                                      f"{base / 'config.json'} expects {tuple(tensor.shape)}")
            if isinstance(tensor, DTensor):
                local = tensor.to_local()
                start, stop = _rows(tensor)
                if stop > start:
                    read_rows(path, data_start, entry, start, stop, local)
            elif tensor.dim() == 0:
                tmp = torch.empty(1, dtype=tensor.dtype)
                read_rows(path, data_start, dict(entry, shape=[1]), 0, 1, tmp)
                tensor.copy_(tmp[0])
            else:
                read_rows(path, data_start, entry, 0, tensor.shape[0], tensor)


def _init_adapter(name: str, tensor: torch.Tensor, seed: int) -> None:
    """peft's default LoRA init (``init_lora_weights=True``) with a seeded generator: ``lora_A`` Kaiming-uniform
    (``a = √5``), ``lora_B`` zeros; the full tensor is drawn on every rank and each keeps its ``Shard(0)`` rows."""
    import math
    import zlib

    if "lora_B" in name:
        full = torch.zeros(tensor.shape, dtype=torch.float32)
    elif "lora_A" in name:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))  # per tensor, any order
        full = torch.empty(tensor.shape, dtype=torch.float32)
        torch.nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=gen)
    else:
        raise WeightLoadError(f"{name}: a trainable parameter that is not a LoRA adapter (lora_A/lora_B)")
    if isinstance(tensor, DTensor):
        start, stop = _rows(tensor)
        tensor.to_local().copy_(full[start:stop])
    else:
        tensor.copy_(full)


def _is_fused_experts(name: str) -> bool:
    return name.endswith(".experts.gate_up_proj") or name.endswith(".experts.down_proj")


def _load_fused_experts(base: Path, name: str, tensor: torch.Tensor, files: dict[str, Path],
                        headers: dict[Path, tuple[int, dict]]) -> None:
    """Fill a fused MoE expert parameter from the per-expert tensors transformers saves (and fuses on load):
    ``gate_up_proj[e] = cat(experts.e.gate_proj.weight, experts.e.up_proj.weight)`` (shape ``(E, 2I, H)``),
    ``down_proj[e] = experts.e.down_proj.weight`` (``(E, H, I)``). Only this rank's experts are read."""
    prefix = name.rsplit(".", 1)[0]
    parts = ["gate_proj", "up_proj"] if name.endswith("gate_up_proj") else ["down_proj"]
    if isinstance(tensor, DTensor):
        local, (start, stop) = tensor.to_local(), _rows(tensor)
    else:
        local, (start, stop) = tensor, (0, tensor.shape[0])
    for e in range(start, stop):
        offset = 0
        for part in parts:
            src = f"{prefix}.{e}.{part}.weight"
            path = files.get(src)
            if path is None:
                raise WeightLoadError(f"{base}: no tensor {name!r} and no per-expert {src!r} in the safetensors files")
            data_start, header = headers[path]
            entry = header[src]
            rows = entry["shape"][0]
            if len(entry["shape"]) != 2 or entry["shape"][1] != tensor.shape[2] or offset + rows > tensor.shape[1]:
                raise WeightLoadError(f"{path}: {src} has shape {tuple(entry['shape'])}, which does not fit "
                                      f"{name} of shape {tuple(tensor.shape)}")
            read_rows(path, data_start, entry, 0, rows, local[e - start, offset:offset + rows])
            offset += rows
        if offset != tensor.shape[1]:
            raise WeightLoadError(f"{base}: per-expert tensors of {name} fill {offset} of {tensor.shape[1]} rows")


def _rows(t: DTensor) -> tuple[int, int]:
    """Rows ``[start, stop)`` of dim 0 that this rank's ``Shard(0)`` local tensor holds."""
    (placement,) = t.placements
    if not isinstance(placement, Shard) or placement.dim != 0:
        raise WeightLoadError(f"unexpected placement {placement} (FSDP2 shards dim 0)")
    mesh = t.device_mesh
    n, world, rank = t.shape[0], mesh.size(), mesh.get_local_rank()
    chunk = -(-n // world)
    start = min(rank * chunk, n)
    return start, min(start + chunk, n)


def _persistent_buffers(model: nn.Module):
    for mod_name, mod in model.named_modules():
        for b_name, buf in mod.named_buffers(recurse=False):
            if buf is not None and b_name not in mod._non_persistent_buffers_set:
                yield (f"{mod_name}.{b_name}" if mod_name else b_name), buf


def _recompute_non_persistent_buffers(model: nn.Module, device: torch.device) -> None:
    """Rotary embeddings' ``inv_freq`` / ``original_inv_freq`` from the config (as transformers'
    ``_init_weights`` does); any other non-persistent buffer raises :class:`WeightLoadError`."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for mod_name, mod in model.named_modules():
        names = [b for b in mod._non_persistent_buffers_set if getattr(mod, b, None) is not None]
        if not names:
            continue
        if "RotaryEmbedding" not in type(mod).__name__ or not set(names) <= {"inv_freq", "original_inv_freq"}:
            raise WeightLoadError(f"{mod_name} ({type(mod).__name__}): non-persistent buffers {names} cannot be "
                                  "recomputed by the meta-device loader")
        rope_type = getattr(mod, "rope_type", "default")
        fn = getattr(mod, f"compute_{rope_type}_rope_parameters", None) or ROPE_INIT_FUNCTIONS[rope_type]
        value, _ = fn(mod.config)
        with torch.no_grad():
            for b in names:
                getattr(mod, b).copy_(value)
