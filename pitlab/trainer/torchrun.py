"""``python -m pitlab.trainer.torchrun ARGS``: torchrun with the same arguments (and the same ``PET_*`` variables),
whose exit code says whether retrying can help.

torchrun itself exits 1 whenever a rank fails, whatever the rank's own exit code. A training pod's exit code is what a
Job's ``podFailurePolicy`` reads, and pitlab's ranks exit 2 on bad input (:data:`pitlab.errors.EXIT_BAD_INPUT`: a
spec field, a non-finite loss, a refused resume), which no retry fixes. This launcher runs torchrun in process and
ends with 2 when any rank ended with 2, else 1 for any other failure (an NCCL error, a lost node, an OOM kill:
worth a retry from the last checkpoint), 0 on success.
"""

from __future__ import annotations

import sys

from pitlab.errors import EXIT_BAD_INPUT, EXIT_STAGE_FAILED


def exit_code(rank_codes: dict[int, int]) -> int:
    """The launcher's exit code from the failed ranks' exit codes (rank → code; a signal is negative): 2 when a
    rank reported bad input, else 1 (0 when ``rank_codes`` is empty: nothing failed)."""
    if not rank_codes:
        return 0
    return EXIT_BAD_INPUT if EXIT_BAD_INPUT in rank_codes.values() else EXIT_STAGE_FAILED


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with ``argv`` (default ``sys.argv[1:]``); returns :func:`exit_code` of its failed ranks."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(sys.argv[1:] if argv is None else argv)  # prints a failure summary before it raises
    except ChildFailedError as err:
        return exit_code({rank: failure.exitcode for rank, failure in err.failures.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
