"""Where the statistics' linear algebra runs: numpy float64 on the CPU, or torch float64 on CUDA (or on the CPU).

One switch, ``regression.device`` (``auto`` | ``cpu`` | ``cuda``), picks a :class:`Backend`:

* ``cpu``: numpy float64 (LAPACK/BLAS of numpy's build; ``np.linalg.eigh`` = LAPACK ``syevd``,
  ``np.linalg.solve`` = LU ``gesv``);
* ``cuda``: torch float64 on the first CUDA device (``torch.linalg.eigh`` = cuSOLVER ``syevd``, solves by
  Cholesky ``potrf``/``potrs``);
* ``auto``: ``cuda`` when ``torch.cuda.is_available()``, else ``cpu``.

The ridge and estimator code (:mod:`pitlab.evaluator.ridge`, :mod:`pitlab.evaluator.estimates`) is written
once against the arrays it is given: numpy arrays or torch tensors share the operators and the names used there
(``@``, ``einsum``, ``swapaxes``, ``clip``, ``argmin``, ``linalg.eigh``, ``sum(axis=...)``); :func:`xp` returns the
module (``numpy`` or ``torch``) of an array and :func:`solve_spd` is the one call that differs. Everything is
float64: R² differences of 1e-3 matter, and float32 Gram matrices of 384-2,048 features lose that. The torch
backend on the CPU (``Backend("torch", "cpu")``) runs the very same code as on CUDA; a test checks it equals the
numpy backend to 1e-10.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEVICES = ("auto", "cpu", "cuda")


def is_torch(a) -> bool:
    """True for a torch tensor (checked without importing torch)."""
    return type(a).__module__.startswith("torch")


def xp(a):
    """The array module of ``a``: ``torch`` for a tensor, else ``numpy``."""
    if is_torch(a):
        import torch

        return torch
    return np


def to_numpy(a) -> np.ndarray:
    """A host numpy copy (or the array itself) of a numpy array or torch tensor."""
    if is_torch(a):
        return a.detach().cpu().numpy()
    return np.asarray(a)


_CONTROLLER: list = []


def _blas_threads() -> int:
    """BLAS threads numpy would use (OpenBLAS/MKL, as threadpoolctl reports them; 1 if none is found)."""
    from threadpoolctl import ThreadpoolController

    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    n = [i["num_threads"] for i in _CONTROLLER[0].info() if i["user_api"] == "blas"]
    return max(n) if n else 1


def across_matrices(fn, *arrays):
    """``fn`` on a batch of matrices, parallel over the matrices instead of inside each: the batch (leading
    axis of every array) is cut into as many contiguous parts as numpy has BLAS threads, each part runs in its
    own Python thread (LAPACK releases the GIL) with BLAS limited to one thread, and the results are joined.

    Why: LAPACK's symmetric eigensolver spends half its time in BLAS-2 (tridiagonal reduction), where threads
    synchronise after every column; with two threads on two shared cores a descheduled thread stalls the other
    (measured here under load: 1.2 s per 384×384 ``eigh`` with 2 BLAS threads, 0.08 s with 1). One thread per
    matrix never waits. A matrix's result does not depend on which thread computes it, so the output is
    bit-identical to a one-thread run and across runs. ``fn`` returns an array or a tuple of arrays.
    """
    B = arrays[0].shape[0]
    workers = min(_blas_threads(), B)
    if workers <= 1:
        return fn(*arrays)
    from concurrent.futures import ThreadPoolExecutor

    bounds = np.linspace(0, B, workers + 1).round().astype(int)
    parts = [tuple(a[lo:hi] for a in arrays) for lo, hi in zip(bounds[:-1], bounds[1:])]
    with _CONTROLLER[0].limit(limits=1, user_api="blas"), ThreadPoolExecutor(workers) as ex:
        outs = list(ex.map(lambda p: fn(*p), parts))
    if isinstance(outs[0], tuple):
        return tuple(np.concatenate(o, axis=0) for o in zip(*outs))
    return np.concatenate(outs, axis=0)


def parallel_batches(backend: "Backend", n_items: int) -> int:
    """Python threads to spread ``n_items`` independent weightings over: numpy's BLAS thread count on the
    numpy backend (each batch then runs with one BLAS thread, see :func:`run_batches`), 1 on torch."""
    if backend.library != "numpy" or n_items < 2:
        return 1
    return max(1, min(_blas_threads(), n_items))


def run_batches(fn, bounds: list[tuple[int, int]], workers: int) -> None:
    """Call ``fn(start, end)`` for every batch of weightings. With ``workers`` > 1 (numpy backend) the batches
    run in that many Python threads with BLAS limited to one thread each: every matrix operation of a batch
    (weighted sums, eigendecompositions, solves, small stacked products) is single-threaded and the cores work
    on different bootstrap replicates, which never wait on each other (:func:`across_matrices` says why that
    matters on shared cores). A batch's numbers do not depend on the thread that computes it."""
    if workers <= 1 or len(bounds) < 2:
        for s, e in bounds:
            fn(s, e)
        return
    from concurrent.futures import ThreadPoolExecutor

    _blas_threads()  # creates the controller
    with _CONTROLLER[0].limit(limits=1, user_api="blas"), ThreadPoolExecutor(workers) as ex:
        for f in [ex.submit(fn, s, e) for s, e in bounds]:
            f.result()


def eigh(A):
    """Eigenvalues (ascending) and eigenvectors of a batch of symmetric matrices [B, d, d] (lower triangle
    read): ``torch.linalg.eigh`` for tensors; ``np.linalg.eigh`` (LAPACK ``syevd``) for numpy arrays, run by
    :func:`across_matrices`."""
    if is_torch(A):
        import torch

        return torch.linalg.eigh(A)
    return across_matrices(np.linalg.eigh, A)


def eigvalsh(A):
    """Eigenvalues of a batch of symmetric matrices [B, d, d] → [B, d] (as :func:`eigh`, without vectors)."""
    if is_torch(A):
        import torch

        return torch.linalg.eigvalsh(A)
    return across_matrices(np.linalg.eigvalsh, A)


def solve_spd(A, b):
    """Solve ``A x = b`` for a batch of symmetric positive definite ``A`` [B, d, d], ``b`` [B, d] → x [B, d].

    numpy: ``np.linalg.solve`` (LU with partial pivoting; on this machine's OpenBLAS as fast as numpy's
    Cholesky, which has no batched triangular solve to go with it), run by :func:`across_matrices`.
    torch: ``torch.linalg.cholesky`` +
    ``torch.cholesky_solve`` (half the flops of LU; cuSOLVER on CUDA). Both are exact solves up to rounding
    (relative error ~ cond(A)·1e-16; A = centred Gram + αI with α > 0 is well conditioned).
    """
    if is_torch(A):
        import torch

        L = torch.linalg.cholesky(A)
        return torch.cholesky_solve(b[..., None], L)[..., 0]
    return across_matrices(lambda A_, b_: np.linalg.solve(A_, b_[..., None])[..., 0], A, b)


@dataclass(frozen=True)
class Backend:
    """The array library and device of the statistics: ``library`` ``"numpy"`` or ``"torch"``; ``device``
    ``"cpu"`` or ``"cuda"`` (torch only). ``memory_budget_bytes``: float64 temporaries a batch of fits may
    hold at once (sets the batch size of the estimators)."""

    library: str = "numpy"
    device: str = "cpu"
    memory_budget_bytes: int = 1 << 30

    def __post_init__(self):
        if self.library not in ("numpy", "torch"):
            raise ValueError(f"backend library must be numpy or torch (got {self.library!r})")
        if self.library == "numpy" and self.device != "cpu":
            raise ValueError("the numpy backend runs on the cpu only")

    @classmethod
    def resolve(cls, device: str = "auto") -> "Backend":
        """The backend for ``regression.device``: ``cpu`` → numpy; ``cuda`` → torch on CUDA (an error when
        torch sees no GPU); ``auto`` → ``cuda`` if torch sees a GPU, else ``cpu``. On CUDA the memory budget is
        a quarter of the device's total memory: a constant of the GPU model, not of the moment (free memory
        shrinks while torch's allocator caches blocks), because the batch sizes follow from it and cuBLAS may
        sum a product's terms in another order for another batch shape, so a budget that moved between two
        runs moved the last bits of the replicates (seen on the H200: two runs in one process differed)."""
        if device not in DEVICES:
            raise ValueError(f"regression.device must be one of {DEVICES} (got {device!r})")
        if device == "cpu":
            return cls()
        import torch

        if not torch.cuda.is_available():
            if device == "cuda":
                raise ValueError("regression.device: cuda, but torch sees no CUDA device")
            return cls()
        total = torch.cuda.get_device_properties(0).total_memory
        return cls("torch", "cuda", memory_budget_bytes=int(total) // 4)

    @property
    def name(self) -> str:
        """``numpy`` or ``torch:cpu`` / ``torch:cuda``."""
        return "numpy" if self.library == "numpy" else f"torch:{self.device}"

    def asarray(self, a):
        """float64 array of this backend (numpy array, or torch tensor on the device)."""
        if self.library == "numpy":
            return np.asarray(to_numpy(a), dtype=np.float64)
        import torch

        if is_torch(a):
            return a.to(device=self.device, dtype=torch.float64)
        return torch.as_tensor(np.asarray(a, dtype=np.float64), device=self.device)

    def as_index(self, a):
        """int64 index array of this backend."""
        if self.library == "numpy":
            return np.asarray(to_numpy(a), dtype=np.int64)
        import torch

        return torch.as_tensor(np.asarray(to_numpy(a), dtype=np.int64), device=self.device)

    def describe(self) -> dict:
        """JSON-ready: library, device (with the GPU's name on CUDA), dtype."""
        d = {"library": self.library, "device": self.device, "dtype": "float64"}
        if self.device == "cuda":
            import torch

            d["gpu"] = torch.cuda.get_device_name(0)
        return d
