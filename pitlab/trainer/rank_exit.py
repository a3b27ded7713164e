"""How a torchrun rank ends: flush, then leave without interpreter finalization.

Why: a gloo process group that something still references after :func:`torch.distributed.destroy_process_group`
(FSDP2's ``DeviceMesh`` does, through the model's DTensors) keeps its worker threads running. Such a thread may
free a finished collective's work object, and with it the tensors of, e.g., ``all_gather_object``, only after the
main thread has returned. If that happens during ``Py_FinalizeEx``, the thread's GIL acquire calls
``pthread_exit``, the forced unwind crosses a ``noexcept`` destructor (``c10d::ProcessGroupGloo::AsyncWork``) and
the rank dies with ``terminate called without an active exception`` (SIGABRT) after a complete, successful run.
Seen as a CI failure (the S3 checkpoint test, whose last collective is ``all_gather_object``) and read off a core
dump; the same race is the subject of pytorch/pytorch PR 179291. A two-rank script that calls
``all_gather_object`` and returns aborted in 7 of 30 runs here, and in 0 of 30 when it ended through
:func:`exit_rank`.

Skipping finalization is what :mod:`multiprocessing` does for its forked children (``os._exit`` after the target
returns). Every file the trainer writes is closed before ``main`` returns; this flushes the standard streams and
the logging handlers, which finalization would otherwise have flushed.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable


def exit_rank(main: Callable[[], int | None]) -> None:
    """Run ``main()`` and end the process with its return code (``None`` → 0), never returning.

    ``SystemExit`` (``sys.exit``, a usage error) keeps its code (a non-integer code is printed and
    becomes 1, as Python does); any other exception is printed with its traceback and becomes exit code 1.
    Standard streams and logging handlers are flushed, then :func:`os._exit` ends the process without
    interpreter finalization (see the module docstring for the crash this avoids).
    """
    try:
        rc = main()
    except SystemExit as exc:
        rc = exc.code
    except BaseException:  # noqa: BLE001  (reported like an uncaught exception, then the same exit path)
        traceback.print_exc()
        rc = 1
    if rc is None:
        rc = 0
    elif not isinstance(rc, int):
        print(rc, file=sys.stderr)
        rc = 1
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(rc)
