"""The full-weight merge: the checkpoint's model tensors streamed one output shard at a time, renamed to the
Hugging Face names, written, compared back and probed."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from pitlab.trainer.digest import tensor_sha256
from pitlab.trainer.merge.errors import MergeError
from pitlab.trainer.merge.layout import copy_generation_config, plan_groups, shard_file_names, write_index
from pitlab.trainer.merge.reader import (check_keys, checkpoint_tensors, load_checkpoint_model, load_tensors,
                                         meta_model_of)
from pitlab.trainer.merge.verify import compare_digests, compare_file, probe_logits, reload_model, rss_bytes


def merge_full(ckpt: Path, base_dir: Path, tmp: Path, expected_sha256: dict[str, str] | None, max_bytes: int,
               logits_probe: str) -> dict:
    """Write the full-weight checkpoint ``ckpt`` as Hugging Face safetensors shards of at most ``max_bytes`` into
    ``tmp`` (created), compare every tensor back and probe the logits. Returns the report's fields; raises
    :class:`MergeError` for any mismatch."""
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
    rss_before = rss_bytes()  # libraries imported, meta model built: what follows is tensor data
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
        compare_digests(digests, expected_sha256, "the training summary's param_sha256", f"checkpoint {ckpt}")
    write_index(tmp, weight_map, total, len(files), expected_hf)
    write_seconds = time.perf_counter() - t_write

    t_verify = time.perf_counter()
    for group, fname in zip(groups, files):
        compare_file(tmp / fname, convert(load_tensors(ckpt, group, saved)), f"checkpoint {ckpt}")
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
            "parameters": len(digests), "rss_before_tensors_bytes": rss_before, "write_seconds": write_seconds,
            "verify_seconds": time.perf_counter() - t_verify, "logits_probe": probe}


def _uniform_dtype(expected: dict[str, tuple[torch.dtype, tuple]], config) -> torch.dtype:
    dtypes = {d for d, _ in expected.values() if d.is_floating_point}
    return dtypes.pop() if len(dtypes) == 1 else getattr(config, "dtype", None)
