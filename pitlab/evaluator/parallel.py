"""Several models' statistics at once, each in its own process, on one GPU.

The statistics of one model on a GPU leave it idle much of the time (the batched Cholesky solves are driven by
Python between small GPU calls), so two processes sharing the GPU finish two models in about 1.2 × the time of
one (bench/RESULTS.md, "Embedding and evaluation at scale"). Threads would not help: they share one interpreter.
Every process runs the same code on the same inputs as the sequential path, so the numbers are bit-identical.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

ENV = "PITLAB_STATS_PROCESSES"
"""Processes for the models' statistics (``1``: one model after the other in this process)."""
CUDA_DEFAULT = 2
"""Processes by default when the statistics run on a CUDA device (two already keep an H200 busy)."""


def statistics_processes(device: str, n_models: int) -> int:
    """How many processes compute the models' statistics: :data:`ENV` when set (an integer ≥ 1, else
    ValueError naming it), else :data:`CUDA_DEFAULT` on a CUDA device and 1 elsewhere (a CPU's cores are
    already shared out by the batches); never more than ``n_models``."""
    raw = os.environ.get(ENV, "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{ENV}={raw!r}: a whole number of processes >= 1 is required")
    else:
        n = CUDA_DEFAULT if device == "cuda" else 1
    return max(1, min(n, n_models))


def timed_statistics(spec, setup, X: np.ndarray) -> tuple:
    """:func:`pitlab.evaluator.targets.model_statistics` of one model on its raw and market-neutral targets,
    and the seconds it took: ``(raw, neutral, seconds)``. What each worker process runs."""
    from pitlab.evaluator.targets import model_statistics

    t = time.perf_counter()
    raw, neutral = model_statistics(spec, setup, X, setup.y, setup.y_neutral)
    seconds = time.perf_counter() - t
    _release_gpu_cache()  # an idle worker holds no cached GPU memory the other worker could use
    return raw, neutral, seconds


ALLOC_CONF = "expandable_segments:True"
"""The CUDA allocator setting of the workers (unless ``PYTORCH_CUDA_ALLOC_CONF`` is set): their batches of up to a
quarter of the GPU's memory, of changing shapes, otherwise leave reserved blocks too small to reuse (an H200
worker once held 31 GiB reserved and unallocated while asking for 31.3 GiB more, beside a 35B model being
embedded). Where tensors live does not change what is computed on them."""


def _worker_setup() -> None:
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)


class StatisticsPool:
    """A pool of ``processes`` spawned workers running :func:`timed_statistics`; a context manager. On entry,
    this process gives its cached GPU memory back (the embedding's), so the workers can have it."""

    def __init__(self, processes: int):
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> "StatisticsPool":
        _release_gpu_cache()
        self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_worker_setup)
        return self

    def __exit__(self, *exc) -> None:
        assert self._pool is not None
        self._pool.shutdown(wait=True, cancel_futures=True)

    def submit(self, spec, setup, X: np.ndarray) -> Future:
        """Start one model's statistics; the Future gives ``(raw, neutral, seconds)``."""
        assert self._pool is not None, "StatisticsPool is used inside a with block"
        return self._pool.submit(timed_statistics, spec, setup, X)


def result_of(future: Future, name: str) -> tuple:
    """``future.result()``; a worker that died (killed for memory, a crash) is reported as a RuntimeError
    naming the model and how to run the models one after the other."""
    try:
        return future.result()
    except BrokenProcessPool as err:
        raise RuntimeError(f"the statistics process of model {name!r} ended without a result (killed, e.g. for "
                           f"memory?); {ENV}=1 computes the models one after the other in one process") from err


def _release_gpu_cache() -> None:
    import sys

    torch = sys.modules.get("torch")
    gc.collect()
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
