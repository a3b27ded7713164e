"""LoRA adapters (peft) and verified adapter saves (DESIGN 4.6).

Every save is checked by reopening what was written: a save that silently drops tensors (the "adapter with
0 tensors" bug class, where a wrapper around the model hides the ``lora_`` parameter names from the filter
that picks adapter weights) is a hard error, and nothing is left at the output path.

The expected adapter is taken from the model's *trainable parameters by identity* (``requires_grad``),
independent of names, so a wrapper that renames or hides parameters cannot make the expectation shrink
along with the saved state.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from torch import nn

from pitlab.trainer.files import fsync_dir, make_readable

ADAPTER_FILE = "adapter_model.safetensors"


class AdapterSaveError(RuntimeError):
    """An adapter save did not round-trip: tensor names, count or values differ from the live adapter."""


def apply_lora(model: nn.Module, r: int, alpha: int, dropout: float, target_modules: list[str]) -> nn.Module:
    """Wrap ``model`` with peft LoRA (``spec.lora``: rank ``r``, scaling ``alpha / r``, ``dropout``, the
    module-name suffixes ``target_modules``); only the adapter parameters stay trainable. Returns the
    ``PeftModel``. Raises ``ValueError`` naming ``spec.lora.targetModules`` when no module matches."""
    from peft import LoraConfig, get_peft_model

    names = [n for n, _ in model.named_modules()]
    if not any(n.split(".")[-1] in target_modules for n in names):
        raise ValueError(f"spec.lora.targetModules: none of {target_modules} names a module of "
                         f"{type(model).__name__}")
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules,
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def _peft_model(model: nn.Module):
    from peft import PeftModel

    for name, mod in model.named_modules():
        if isinstance(mod, PeftModel):
            return name, mod
    raise AdapterSaveError(f"{type(model).__name__}: no peft PeftModel inside; nothing to save as an adapter")


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors peft would save, read through ``model.state_dict()`` of the outermost module (as a
    sharding or streaming wrapper is saved), keyed by peft's adapter names (``...lora_A.weight``)."""
    from peft import get_peft_model_state_dict

    prefix, peft_model = _peft_model(model)
    prefix = prefix + "." if prefix else ""
    sd = {k[len(prefix):]: v for k, v in model.state_dict().items() if k.startswith(prefix)}
    return get_peft_model_state_dict(peft_model, state_dict=sd)


def save_adapter_verified(model: nn.Module, out_dir: Path) -> dict:
    """Save the LoRA adapter of ``model`` (a ``PeftModel`` or a module wrapping one) to ``out_dir`` and verify it.

    Writes ``adapter_model.safetensors`` + ``adapter_config.json`` to ``<out_dir>.tmp``, reopens the file and
    checks: tensor count == the number of trainable parameter tensors of the peft model (counted by identity,
    not by name), names == the live adapter's names, every tensor ``torch.equal`` (same dtype and shape) to the
    live one. Only then renames it to ``out_dir`` (replacing an older save). Returns a report: ``tensors``,
    ``elements``, ``bytes`` (file size). Raises :class:`AdapterSaveError` naming the missing, unexpected or
    differing tensors; on error no ``out_dir`` and no ``.tmp`` is left (an older ``out_dir`` stays intact).
    """
    from safetensors import safe_open
    import safetensors.torch

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    _, peft_model = _peft_model(model)
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    expected_elems = sum(p.numel() for p in trainable)
    live = {k: v.detach().to("cpu").contiguous() for k, v in adapter_state_dict(model).items()}
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        if len(live) != len(trainable) or sum(v.numel() for v in live.values()) != expected_elems:
            raise AdapterSaveError(
                f"{out_dir}: the adapter state to save has {len(live)} tensors "
                f"({sum(v.numel() for v in live.values())} elements) but the model has {len(trainable)} trainable "
                f"tensors ({expected_elems} elements); a wrapper around the model hides the adapter's parameter "
                f"names from peft (the 0-tensor adapter bug); save through the unwrapped PeftModel")
        safetensors.torch.save_file(live, str(tmp / ADAPTER_FILE), metadata={"format": "pt"})
        peft_model.peft_config[peft_model.active_adapter].save_pretrained(str(tmp))
        with open(tmp / ADAPTER_FILE, "rb") as f:
            os.fsync(f.fileno())
        with safe_open(str(tmp / ADAPTER_FILE), framework="pt") as f:
            saved = {k: f.get_tensor(k) for k in f.keys()}
        missing, unexpected = sorted(live.keys() - saved.keys()), sorted(saved.keys() - live.keys())
        differ = sorted(k for k in live.keys() & saved.keys()
                        if saved[k].dtype != live[k].dtype or not torch.equal(saved[k], live[k]))
        if missing or unexpected or differ or len(saved) != len(trainable):
            raise AdapterSaveError(f"{tmp / ADAPTER_FILE}: reopened file has {len(saved)} tensors, expected "
                                   f"{len(trainable)}; {len(missing)} missing {missing[:5]}, {len(unexpected)} "
                                   f"unexpected {unexpected[:5]}, {len(differ)} differ {differ[:5]}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    make_readable(tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    fsync_dir(out_dir.parent)
    return {"tensors": len(saved), "elements": expected_elems, "bytes": (out_dir / ADAPTER_FILE).stat().st_size,
            "path": str(out_dir)}
