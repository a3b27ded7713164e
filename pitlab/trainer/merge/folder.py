"""A local checkpoint → a verified Hugging Face model folder: written aside, reported, then swapped into place."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from transformers import AutoTokenizer

from pitlab.api.artifacts import MODEL_CARD, ModelCard

from pitlab.trainer.files import fsync_dir, make_readable, write_json_atomic
from pitlab.trainer.merge.errors import MergeInputError
from pitlab.trainer.merge.full import merge_full
from pitlab.trainer.merge.layout import DEFAULT_MAX_SHARD_SIZE, REPORT, parse_size
from pitlab.trainer.merge.lora import merge_lora
from pitlab.trainer.merge.reader import read_train_state, resolve_checkpoint
from pitlab.trainer.merge.verify import PROBE_SHAPE, peak_rss_bytes, rss_bytes


def merge_checkpoint(checkpoint_dir: Path, base_dir: Path, out_dir: Path,
                     expected_sha256: dict[str, str] | None = None, *,
                     max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE, logits_probe: str = "auto",
                     merge_adapter: bool | None = None, card: dict | None = None) -> dict:
    """Write the checkpoint's model as a Hugging Face directory at ``out_dir``, streaming, and verify it.

    ``checkpoint_dir``: a ``step-<N>`` DCP directory or the checkpoint root holding ``latest`` (local paths).
    ``base_dir``: the HF directory training started from (config and tokenizer; for LoRA also the base weights).
    ``expected_sha256``: ``{parameter name: sha256}`` from the training summary, checked when given.
    ``max_shard_size``: bytes per safetensors shard (``"5GB"`` style accepted), also the memory bound.
    ``logits_probe``: ``auto`` (probe when the model's bytes <= ``max_shard_size``), ``always`` or ``never``.
    ``merge_adapter`` (LoRA checkpoints only): True merges the adapter into the base, False writes the
    adapter directory, None follows ``lora.mergeIntoBase`` recorded in the checkpoint. ``card``: the model
    card from the training summary (:class:`pitlab.api.artifacts.ModelCard` fields), written as
    ``pitlab_model.json`` beside the weights (listed in ``files``), so that evaluations inherit its cutoff.

    Returns the report (also ``out_dir/merge_report.json``): ``checkpoint``, ``base``, ``out``, ``kind``
    (``full``, ``lora-merged`` or ``lora-adapter``), ``tensors`` and ``bytes`` (in the written safetensors),
    ``shards``, ``parameters``, ``seconds``, ``bytes_per_second`` (written bytes / total seconds),
    ``write_seconds`` (reading, writing and comparing every file, which overlap), ``verify_seconds`` (the logits
    probe and the config), full-weight merges also ``largest_group_bytes``, ``buffers`` and ``buffer_bytes`` (how
    many reused buffers, and the bytes of each), ``writer`` (``streamed`` or ``whole-group``), ``read_threads``, ``conversion`` (``views``, ``copies`` or ``unproven``, see
    :class:`pitlab.trainer.merge.full.ViewConversion`) and ``stage_seconds`` (per stage, summed over its thread:
    ``read``, ``hash`` (summed over the hashing threads), ``wait`` for a group, ``convert``, ``save``, ``compare``,
    ``fsync``, ``check_wait``),
    ``rss_start_bytes`` (resident set at the call),
    ``rss_before_tensors_bytes`` (after the libraries and the meta-device model are loaded, before any tensor
    data; a full merge adds ``anon_rss_before_tensors_bytes``, its anonymous part), ``peak_rss_bytes`` (the
    process's peak resident set, ``ru_maxrss``; all in bytes),
    ``logits_probe`` (``equal``, ``close`` with its max |diff|, or ``skipped``), ``verified`` (always True: a
    failed check raises). Raises :class:`MergeError` for any mismatch or missing
    input, ``ValueError`` for a bad ``max_shard_size``/``logits_probe``; no complete-looking ``out_dir`` is
    left by a failure and an existing one is kept.
    """
    t0 = time.perf_counter()
    rss_start = rss_bytes()
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
            report = merge_full(ckpt, base_dir, tmp, expected_sha256, max_bytes, logits_probe)
        else:
            merge = lora.get("merge_into_base", False) if merge_adapter is None else merge_adapter
            report = merge_lora(ckpt, base_dir, tmp, expected_sha256, max_bytes, logits_probe, lora, merge)
        tokenizer.save_pretrained(tmp)
        if card is not None:
            write_json_atomic(tmp / MODEL_CARD, ModelCard.model_validate(card).model_dump(by_alias=True, mode="json"))
        make_readable(tmp)
        seconds = time.perf_counter() - t0
        report = {"checkpoint": str(ckpt), "base": str(base_dir), "out": str(out_dir), **report,
                  "seconds": seconds, "bytes_per_second": report["bytes"] / seconds if seconds > 0 else None,
                  "max_shard_size": max_bytes, "rss_start_bytes": rss_start, "peak_rss_bytes": peak_rss_bytes(),
                  "probe_shape": list(PROBE_SHAPE), "summary_digests_checked": expected_sha256 is not None,
                  "verified": True}
        report["files"] = sorted({p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()} | {REPORT})
        write_json_atomic(tmp / REPORT, report)
        for f in tmp.iterdir():
            if f.is_file() and f.suffix == ".safetensors":
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        fsync_dir(tmp)
        outdir.swap_in(tmp, out_dir)  # the old out_dir is removed only once the new one is in place
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report
