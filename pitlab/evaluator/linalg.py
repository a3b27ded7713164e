"""Where the statistics' linear algebra runs: numpy float64 on the CPU, or torch float64 on CUDA (or on the CPU).

One switch, ``regression.device`` (``auto`` | ``cpu`` | ``cuda``), picks a :class:`Backend`:

* ``cpu``: numpy float64 (LAPACK/BLAS of numpy's build; ``np.linalg.eigh`` = LAPACK ``syevd``,
  ``np.linalg.solve`` = LU ``gesv``);
* ``cuda``: torch float64 on the first CUDA device (``torch.linalg.eigh`` = cuSOLVER ``syevd``, solves by
  Cholesky ``potrf``/``potrs``; security-cv's α grid by :func:`cholesky_solve_batched`, see
  ``Backend.penalty_path``);
* ``auto``: ``cuda`` when ``torch.cuda.is_available()``, else ``cpu``.

The ridge and estimator code (:mod:`pitlab.evaluator.ridge`, :mod:`pitlab.evaluator.estimates`) is written
once against the arrays it is given: numpy arrays or torch tensors share the operators and the names used there
(``@``, ``einsum``, ``swapaxes``, ``clip``, ``argmin``, ``linalg.eigh``, ``sum(axis=...)``); :func:`xp` returns the
module (``numpy`` or ``torch``) of an array and :func:`solve_spd` is the one call that differs. Everything is
float64: R² differences of 1e-3 matter, and float32 Gram matrices of 384-2,048 features lose that. The torch
backend on the CPU (``Backend("torch", "cpu")``) runs the very same code as on CUDA; a test checks it equals the
numpy backend to 1e-10 (with ``penalty_path="cholesky"`` too: ``tests/test_evaluator_cholesky_path.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pitlab.evaluator.heap import keep_freed_memory

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
    keep_freed_memory()
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


CHOLESKY_BLOCK = 128
"""Columns per block of :func:`cholesky_solve_batched` (0: the library's whole-matrix factorisation). 128 with
:data:`CHOLESKY_LEAF` 128 was the fastest of 18 block/leaf/library variants on an H200 at d = 2,048, 185 matrices
(0.138 ms per matrix against 0.157 for 256/64 and 0.44-0.52 for the library's whole-matrix Cholesky), and it
launches the fewest kernels, which is what counts for the small batches of a point estimate
(``bench/cholesky_leaf.py``, bench/RESULTS.md)."""
CHOLESKY_LEAF = 128
"""Order at and below which a diagonal block is factorised by the library (:func:`_chol_and_inverse`)."""


def _chol_and_inverse(A, leaf: int):
    """Cholesky factor ``L`` and its inverse ``L⁻¹`` of a torch batch of SPD matrices ``A`` [N, n, n] (lower
    triangle read; float64), and ``ok`` bool [N] (False where a pivot was not positive: those matrices' outputs
    are meaningless). Recursive 2 × 2 block formulas (Golub & Van Loan, *Matrix Computations*, 4th ed., sec. 4.2.8
    and 3.1.4): ``L11 = chol(A11)``, ``L21 = A21 L11⁻ᵀ``, ``L22 = chol(A22 - L21 L21ᵀ)``,
    ``(L⁻¹)21 = -L22⁻¹ L21 L11⁻¹``; at order ≤ ``leaf``, ``torch.linalg.cholesky_ex`` and a triangular solve
    against the identity. All other work is batched matrix products."""
    import torch

    n = int(A.shape[-1])
    if n <= leaf:
        L, info = torch.linalg.cholesky_ex(A)
        eye = torch.eye(n, dtype=A.dtype, device=A.device).expand_as(L)
        return L, torch.linalg.solve_triangular(L, eye, upper=False), info == 0
    h = min(n - 1, -(-(n // 2) // leaf) * leaf)  # a multiple of leaf where possible
    L11, I11, ok1 = _chol_and_inverse(A[:, :h, :h], leaf)
    L21 = A[:, h:, :h] @ I11.mT
    L22, I22, ok2 = _chol_and_inverse(A[:, h:, h:] - L21 @ L21.mT, leaf)
    L, Li = A.new_zeros(A.shape), A.new_zeros(A.shape)
    L[:, :h, :h], L[:, h:, :h], L[:, h:, h:] = L11, L21, L22
    Li[:, :h, :h], Li[:, h:, h:] = I11, I22
    Li[:, h:, :h] = -(I22 @ (L21 @ I11))
    return L, Li, ok1 & ok2


def cholesky_solve_batched(A, b, block: int = CHOLESKY_BLOCK, leaf: int = CHOLESKY_LEAF) -> tuple:
    """Solve ``A x = b`` for a torch batch of symmetric positive definite ``A`` [N, d, d] (lower triangle read,
    **overwritten** by L) and ``b`` [N, d] (or [N, d, T]: T right-hand sides), float64. Returns ``(x`` shaped as
    ``b``, ``ok`` bool [N]``)``; ``ok`` is False
    where the factorisation met a non-positive pivot (x is then meaningless there).

    Left-looking blocked Cholesky ``A = L Lᵀ`` (Golub & Van Loan, *Matrix Computations*, 4th ed., sec. 4.2.9)
    with ``block`` columns per step, then forward and back substitution by blocks. Per block column j:
    ``A[j:, j] -= L[j:, :j] L[j, :j]ᵀ`` (one batched matrix product over the whole batch, where nearly all of the
    d³/3 flops go), the diagonal block factorised with its inverse (:func:`_chol_and_inverse`), and
    ``L[j+1:, j] = A[j+1:, j] L[j, j]⁻ᵀ`` (a product with that inverse instead of a triangular solve). A direct
    method: the same x as any Cholesky solve up to rounding (backward stable for SPD matrices; the explicit
    inverses are of diagonal blocks only, whose condition numbers are at most √cond(A)).

    Why not the library: cuSOLVER's batched ``potrfBatched`` (what ``torch.linalg.cholesky`` runs on a CUDA
    batch) is built for small matrices; here all N factorisations of order d share each block step's product,
    which runs at batched-GEMM speed. ``block`` ≤ 0: ``torch.linalg.cholesky_ex`` + ``torch.cholesky_solve`` of
    the whole batch (for comparison). Deterministic: the same inputs and shapes give the same bits.
    """
    import torch

    vector = b.ndim == 2
    if block <= 0:
        L, info = torch.linalg.cholesky_ex(A)
        x = torch.cholesky_solve(b[..., None] if vector else b, L)
        return (x[..., 0] if vector else x), info == 0
    N, d = int(A.shape[0]), int(A.shape[-1])
    bounds = [(c0, min(c0 + block, d)) for c0 in range(0, d, block)]
    ok = torch.ones(N, dtype=torch.bool, device=A.device)
    inv = []
    for c0, c1 in bounds:
        if c0:
            A[:, c0:, c0:c1].sub_(A[:, c0:, :c0] @ A[:, c0:c1, :c0].mT)
        L, Li, ok_j = _chol_and_inverse(A[:, c0:c1, c0:c1], leaf)
        ok &= ok_j
        if c1 < d:
            A[:, c1:, c0:c1] = A[:, c1:, c0:c1] @ Li.mT
        A[:, c0:c1, c0:c1] = L
        inv.append(Li)
    x = (b[..., None] if vector else b).clone()
    for (c0, c1), Li in zip(bounds, inv):  # L y = b
        r = x[:, c0:c1]
        if c0:
            r = r - A[:, c0:c1, :c0] @ x[:, :c0]
        x[:, c0:c1] = Li @ r
    for (c0, c1), Li in zip(reversed(bounds), reversed(inv)):  # Lᵀ x = y
        r = x[:, c0:c1]
        if c1 < d:
            r = r - A[:, c1:, c0:c1].mT @ x[:, c1:]
        x[:, c0:c1] = Li.mT @ r
    return (x[..., 0] if vector else x), ok


PENALTY_PATHS = ("auto", "eigh", "cholesky")


@dataclass(frozen=True)
class Backend:
    """The array library and device of the statistics: ``library`` ``"numpy"`` or ``"torch"``; ``device``
    ``"cpu"`` or ``"cuda"`` (torch only). ``memory_budget_bytes``: float64 temporaries a batch of fits may
    hold at once (sets the batch size of the estimators). ``penalty_path``: how security-cv scores the α grid
    in every inner fold: ``eigh`` (one eigendecomposition per inner fold for all α,
    :func:`pitlab.evaluator.ridge.ridge_path`), ``cholesky`` (one Cholesky solve per inner fold and α, batched
    over inner folds and weightings, :func:`pitlab.evaluator.ridge.cholesky_path_test_sse`; torch only), or
    ``auto`` (``cholesky`` on CUDA, ``eigh`` elsewhere). ``cholesky_block``: :func:`cholesky_solve_batched`'s
    block (0: the library's whole-matrix Cholesky)."""

    library: str = "numpy"
    device: str = "cpu"
    memory_budget_bytes: int = 1 << 30
    penalty_path: str = "auto"
    cholesky_block: int = CHOLESKY_BLOCK

    def __post_init__(self):
        if self.library not in ("numpy", "torch"):
            raise ValueError(f"backend library must be numpy or torch (got {self.library!r})")
        if self.library == "numpy" and self.device != "cpu":
            raise ValueError("the numpy backend runs on the cpu only")
        if self.penalty_path not in PENALTY_PATHS:
            raise ValueError(f"penalty_path must be one of {PENALTY_PATHS} (got {self.penalty_path!r})")
        if self.library == "numpy" and self.penalty_path == "cholesky":
            raise ValueError("penalty_path: cholesky runs on the torch backend only")

    @property
    def cholesky_path(self) -> bool:
        """True when security-cv scores the α grid by batched Cholesky solves (``penalty_path``)."""
        return self.penalty_path == "cholesky" or (self.penalty_path == "auto" and self.device == "cuda")

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
        d = {"library": self.library, "device": self.device, "dtype": "float64",
             "penalty_path": "cholesky" if self.cholesky_path else "eigh"}
        if self.device == "cuda":
            import torch

            d["gpu"] = torch.cuda.get_device_name(0)
        return d
