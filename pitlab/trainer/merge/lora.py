"""The LoRA merge: the adapter merged into the base's weights shard by shard (peft's ``get_delta_weight``), or
written as an adapter folder naming its base; both compared back and probed."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig

from pitlab.trainer.checkpoint import TRAIN_STATE
from pitlab.trainer.digest import tensor_sha256
from pitlab.trainer.merge.errors import MergeError
from pitlab.trainer.merge.layout import copy_generation_config, plan_groups, shard_file_names, write_index
from pitlab.trainer.merge.reader import checkpoint_tensors, load_tensors
from pitlab.trainer.merge.verify import (LORA_PROBE_ATOL, LORA_PROBE_RTOL, compare_digests, compare_file,
                                         probe_logits, reload_model, rss_bytes)


def merge_lora(ckpt: Path, base_dir: Path, tmp: Path, expected_sha256: dict[str, str] | None, max_bytes: int,
               logits_probe: str, lora: dict, merge: bool) -> dict:
    """Write the LoRA checkpoint ``ckpt`` into ``tmp``: merged into the base's weights (``merge``) or as an adapter
    folder, after checking the adapter tensors' digests. Returns the report's fields; raises :class:`MergeError`."""
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
        compare_digests(digests, want, "the training summary's param_sha256 (adapter tensors)",
                         f"checkpoint {ckpt}")
    model_bytes = 0
    files = safetensors_index(base_dir)
    headers = {p: read_header(p)[1] for p in set(files.values())}
    for name, path in files.items():
        e = headers[path][name]
        model_bytes += (e["data_offsets"][1] - e["data_offsets"][0])
    probe_on = logits_probe == "always" or (logits_probe == "auto" and model_bytes <= max_bytes)
    rss_before = rss_bytes()
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
        reloaded = PeftModel.from_pretrained(reload_model(base_dir), tmp).eval()
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
    write_index(tmp, weight_map, total, len(names_out), expected)
    if set(weight_map) != set(files):
        raise MergeError(f"{tmp}: wrote {len(weight_map)} tensors, the base has {len(files)}")
    write_seconds = time.perf_counter() - t_write
    t_verify = time.perf_counter()
    for group, fname in zip(groups, names_out):
        compare_file(tmp / fname, merged_group(group), f"base {base_dir} + adapter of {ckpt}")
    AutoConfig.from_pretrained(base_dir).save_pretrained(tmp)
    copy_generation_config(base_dir, tmp)
    probe, max_diff = "skipped", None
    if probe_on:
        want = probe_logits(_peft_reference(base_dir, lora, adapter))
        got = probe_logits(reload_model(tmp))
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

    model = apply_lora(reload_model(base_dir), r=lora["r"], alpha=lora["alpha"], dropout=lora["dropout"],
                       target_modules=lora["target_modules"])
    state = model.state_dict()
    for n, t in adapter.items():
        state[n].copy_(t)
    return model.eval()
