"""The merge with ``s3://`` inputs and outputs: inputs localized and verified, the output staged, merged, then
published; and which files of an output folder an earlier merge wrote."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from pitlab.trainer.files import write_json_atomic
from pitlab.trainer.merge.errors import MergeInputError
from pitlab.trainer.merge.folder import merge_checkpoint
from pitlab.trainer.merge.layout import DEFAULT_MAX_SHARD_SIZE, REPORT


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


def _from_summary(summary: Path | None) -> tuple[dict[str, str] | None, dict | None]:
    """``param_sha256`` and ``model_card`` (None when the summary has none) of a training summary.json, or
    ``(None, None)`` without one; raises MergeInputError when it cannot be read."""
    if summary is None:
        return None, None
    try:
        doc = json.loads(Path(summary).read_text())
        return doc["param_sha256"], doc.get("model_card")
    except (OSError, ValueError, KeyError, TypeError) as err:
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
        digests, card = _from_summary(None if summary is None else Path(summary))
        report = merge_checkpoint(ckpt, base_dir, out_dir, digests, max_shard_size=max_shard_size,
                                  logits_probe=logits_probe, merge_adapter=merge_adapter, card=card)
        if staging is None:
            return report
        report_path = out_dir / REPORT
        report = json.loads(report_path.read_text())
        report.update(checkpoint_uri=str(checkpoint), model_uri=str(out))
        write_json_atomic(report_path, report)
        m = storage.upload_dir(out_dir, str(out), extra={"kind": "model", "checkpoint": str(checkpoint)})
        print(f"pitlab merge: published {len(m.files)} files, {m.total_bytes} bytes to {out}", file=sys.stderr)
        return report
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
