"""``pitlab merge``'s work (its options are declared once, in :mod:`pitlab.cli.merge`): the merge with its errors turned
into a message on stderr and an exit code."""

from __future__ import annotations

import json
import sys

from pitlab.trainer.merge.publish import merge_uris

MERGE_ADAPTER = {"auto": None, "yes": True, "no": False}
"""``--merge-adapter`` → ``merge_adapter`` of :func:`merge_uris`."""


def run_merge_command(checkpoint: str, base: str, out: str, summary: str | None = None, max_shard_size: str = "5GB",
                      logits_probe: str = "auto", merge_adapter: str = "auto", print_report: bool = True,
                      overwrite: bool = False) -> int:
    """:func:`merge_uris` with errors as a message on stderr and an exit code: 0 merged (and published),
    1 failed (the merge, its verification or storage), 2 invalid input (an option, a missing or incomplete
    checkpoint, base or summary, an ``out`` holding other files)."""
    from pitlab.errors import CheckpointError, InputError, PitlabError
    from pitlab.storage.errors import NotPublished, ObjectNotFound, OutputExists

    try:
        report = merge_uris(checkpoint, base, out, summary, max_shard_size=max_shard_size, logits_probe=logits_probe,
                            merge_adapter=MERGE_ADAPTER[merge_adapter], overwrite=overwrite)
    except (PitlabError, ValueError) as err:  # ValueError: a bad option value (e.g. --max-shard-size)
        print(f"pitlab.trainer.merge: error: {err}", file=sys.stderr)
        bad_input = (InputError, ValueError, OutputExists, CheckpointError, NotPublished, ObjectNotFound)
        return 2 if isinstance(err, bad_input) else 1
    if print_report:
        print(json.dumps(report, indent=2))
    return 0
