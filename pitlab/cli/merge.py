"""``pitlab merge``: the merge Job's entry point; its options are declared here only (the work and its exit
codes are :func:`pitlab.trainer.merge.run_merge_command`'s)."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from pitlab.cli.errors import fail
from pitlab.cli.inputs import check_uri


def merge(checkpoint: str = typer.Option(..., "--checkpoint", help="DCP checkpoint folder (or s3://...)."),
          base: str = typer.Option(..., "--base", help="Base model folder (config + tokenizer; or s3://...)."),
          out: str = typer.Option(..., "--out", help="Output Hugging Face model folder (or s3://..., published "
                                                     "with MANIFEST.json and _COMPLETE)."),
          summary: Optional[str] = typer.Option(None, "--summary",
                                                help="Training summary.json whose param_sha256 must match."),
          max_shard_size: str = typer.Option("5GB", "--max-shard-size",
                                             help="Bytes per safetensors shard, also the memory bound (5GB, 500MB)."),
          logits_probe: str = typer.Option("auto", "--logits-probe",
                                           help="auto (model <= shard size), always or never."),
          merge_adapter: str = typer.Option("auto", "--merge-adapter",
                                            help="LoRA: merge into the base (yes), adapter folder (no), or "
                                                 "auto (lora.mergeIntoBase)."),
          overwrite: bool = typer.Option(False, "--overwrite",
                                         help="Replace an OUT that holds files an earlier merge did not write "
                                              "(they are named, then deleted once the new model is verified).")
          ) -> None:
    """Merge a DCP checkpoint into a Hugging Face model folder in one process (the merge Job's entry point),
    streaming shard by shard. Any of the paths may be an s3:// URI. An OUT holding anything but an earlier
    merge's output (the files its merge_report.json lists) is refused (exit 2), naming those files, unless
    --overwrite is given; OUT is written aside and renamed into place."""
    from pitlab.trainer.merge import MERGE_ADAPTER, run_merge_command

    for field, value in (("--checkpoint", checkpoint), ("--base", base), ("--out", out), ("--summary", summary)):
        if value is not None:
            check_uri(field, value)

    if logits_probe not in ("auto", "always", "never"):
        fail(f"--logits-probe {logits_probe!r}: give auto, always or never", 2)
    if merge_adapter not in MERGE_ADAPTER:
        fail(f"--merge-adapter {merge_adapter!r}: give auto, yes or no", 2)
    sys.exit(run_merge_command(checkpoint, base, out, summary, max_shard_size, logits_probe, merge_adapter,
                               overwrite=overwrite))
