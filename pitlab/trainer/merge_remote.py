"""The merge entry point with object storage: ``--checkpoint``, ``--base``, ``--summary`` and ``--out`` may be
``s3://`` URIs; everything else is :func:`pitlab.trainer.merge.main` on local paths.

- inputs are downloaded into the cache (``$PITLAB_CACHE_DIR``), every file verified by sha256 against the
  manifest; a checkpoint URI may be the checkpoint root (its ``latest`` is followed, only to a step with
  ``_COMPLETE``) or one ``step-<N>``;
- an ``s3://`` output is written to a local staging folder (``$PITLAB_STAGING_DIR``) by the ordinary,
  verified merge, then uploaded and published: ``MANIFEST.json`` then ``_COMPLETE`` last, so a reader never
  takes a half-uploaded model; the staging copy is removed. ``merge_report.json`` records the URIs.

Run as ``python -m pitlab.trainer.merge_remote`` (what ``pitlab merge`` and ``pitlab run`` use).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from pitlab import storage
from pitlab.trainer.files import write_json_atomic

_STEP_PREFIX = "step-"


def _local_checkpoint(uri: str) -> Path:
    """A verified local copy of a checkpoint step (``uri`` is a root with ``latest`` or a ``step-<N>``)."""
    from pitlab.trainer.checkpoint import CheckpointError
    from pitlab.trainer.checkpointer import latest_checkpoint

    step = uri.rstrip("/")
    if not storage.basename(step).startswith(_STEP_PREFIX):
        found = latest_checkpoint(step)
        if found is None:
            raise CheckpointError(f"{step}: no 'latest' pointer and not a step-<N> checkpoint")
        step = found
    return storage.localize(step, require_published=True)


def main(argv: list[str] | None = None) -> int:
    """Exit code: 0 merged (and published), 1 failed (merge or storage), 2 invalid input."""
    from pitlab.trainer import merge
    from pitlab.trainer.checkpoint import CheckpointError

    parser = argparse.ArgumentParser(prog="python -m pitlab.trainer.merge_remote", add_help=True,
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--summary", default=None)
    args, rest = parser.parse_known_args(argv)
    remote = [x for x in (args.checkpoint, args.base, args.out, args.summary) if x and storage.is_s3(x)]
    if not remote:
        argv2 = ["--checkpoint", args.checkpoint, "--base", args.base, "--out", args.out]
        return merge.main(argv2 + (["--summary", args.summary] if args.summary else []) + rest)
    staging = None
    try:
        ckpt = str(_local_checkpoint(args.checkpoint)) if storage.is_s3(args.checkpoint) else args.checkpoint
        base = str(storage.localize(args.base, require_published=True)) if storage.is_s3(args.base) else args.base
        summary = args.summary
        if summary and storage.is_s3(summary):
            summary = str(storage.localize(summary, require_published=False))
        out = args.out
        if storage.is_s3(out):
            from pitlab.trainer.checkpoint_s3 import staging_root, staging_tag

            staging = staging_root() / f"merge-{storage.basename(out)}-{staging_tag(out)}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            out = str(staging / "model")
        argv2 = ["--checkpoint", ckpt, "--base", base, "--out", out]
        rc = merge.main(argv2 + (["--summary", summary] if summary else []) + rest)
        if rc != 0 or staging is None:
            return rc
        report_path = Path(out) / "merge_report.json"
        report = json.loads(report_path.read_text())
        report.update(checkpoint_uri=args.checkpoint, model_uri=args.out)
        write_json_atomic(report_path, report)
        m = storage.upload_dir(out, args.out, extra={"kind": "model", "checkpoint": args.checkpoint})
        print(f"pitlab merge: published {len(m.files)} files, {m.total_bytes} bytes to {args.out}",
              file=sys.stderr)
        return 0
    except (storage.StorageError, CheckpointError) as err:
        print(f"pitlab.trainer.merge: error: {err}", file=sys.stderr)
        return 1
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
