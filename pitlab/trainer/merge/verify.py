"""Verification of a written model: every tensor compared bit for bit, parameter digests, the logits probe; and the
process's memory, which the report records."""

from __future__ import annotations

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


def compare_file(path: Path, want: dict[str, torch.Tensor], source: str) -> None:
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


def peak_rss_bytes() -> int:
    """This process's peak resident set (``ru_maxrss``), in bytes."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB
