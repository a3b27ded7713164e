"""Keep the statistics' freed memory in the process (glibc only).

The numpy path allocates and frees Gram stacks of hundreds of MB in every batch of bootstrap replicates, from
several threads. glibc serves each such block with a fresh ``mmap`` (above its 32 MiB ceiling for the heap, and
always from a thread's own arena), so every batch faults its pages in again: on the 2-core VM of
bench/RESULTS.md the kernel time was larger than the user time. One arena, no ``mmap`` for large blocks and no
trimming make freed blocks reusable without page faults; the numbers do not change (bit-identical: the
allocator decides only where arrays live). ``PITLAB_KEEP_FREED_MEMORY=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX, M_ARENA_MAX = -1, -2, -4, -8  # glibc <malloc.h>
TOP_PAD_BYTES = 256 << 20
"""Extra bytes the heap grows by each time it must grow (fewer ``brk`` calls; untouched pages cost nothing)."""
_DONE: list[bool] = []


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory for reuse: one arena, no ``mmap`` for large blocks, no trim.
    Idempotent; returns whether the settings are in force (False off glibc/Linux, when ``mallopt`` refuses, or
    with ``PITLAB_KEEP_FREED_MEMORY=0``). Freed memory is not given back until the process ends, and
    fragmentation can raise the peak RSS (384-dim bench: 11.3 GB against 10.3 GB, bench/history.md)."""
    if _DONE:
        return _DONE[0]
    ok = False
    if sys.platform.startswith("linux") and os.environ.get("PITLAB_KEEP_FREED_MEMORY", "1") != "0":
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = all(mallopt(k, v) == 1 for k, v in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0),
                                                      (M_TRIM_THRESHOLD, 2 ** 31 - 1),
                                                      (M_TOP_PAD, TOP_PAD_BYTES)))
        except (OSError, AttributeError):
            ok = False
    _DONE.append(ok)
    return ok
