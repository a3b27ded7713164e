"""Ridge regression with an unpenalised intercept, fitted from sufficient statistics, penalty chosen by GCV.

Everything the leakage measurement needs from a set of rows (X, y) is in six float64 sums (per security,
per row subset): n, Σx, Σy, Σy², XᵀX, Xᵀy. A weighted union of securities (bootstrap multiplicities, fold
membership) is the weighted sum of their statistics, so no replicate ever refits from raw rows.

Formulas
--------
Centred statistics of a fitting set (x̄ = Σx/n, ȳ = Σy/n):
``Sxx = XᵀX - n x̄x̄ᵀ``, ``Sxy = Xᵀy - n x̄ ȳ``, ``Syy = Σy² - n ȳ²``.
With ``Sxx = V diag(λ) Vᵀ`` and ``z = Vᵀ Sxy``, the ridge slope (intercept unpenalised) is
``β(α) = V diag(1/(λ+α)) z``, the intercept ``c = ȳ - x̄ᵀβ``, the in-sample residual sum of squares
``RSS(α) = Syy - Σ_j z_j² (λ_j + 2α)/(λ_j + α)²``, and the trace of the hat matrix (effective degrees of
freedom, the intercept counting 1) ``df(α) = 1 + Σ_j λ_j/(λ_j + α)``.
Generalised cross-validation (Golub, Heath & Wahba 1979, Technometrics 21(2):215-223):
``GCV(α) = n · RSS(α) / (n - df(α))²``; the chosen α minimises it over the grid (first on ties).
Alternatively (:func:`fit_ridge_at` after an inner cross-validation computed with :func:`path_test_sse`)
α minimises a pooled out-of-fold SSE.
Out-of-sample, on a test set with raw statistics (n, Σx, Σy, Σy², XᵀX, Xᵀy):
``SSE = Σy² - 2cΣy - 2βᵀXᵀy + n c² + 2c βᵀΣx + βᵀXᵀXβ`` and, against the training-mean benchmark,
``SST = Σ(y - ȳ_train)² = Σy² - 2ȳ_train Σy + n ȳ_train²``; ``R² = 1 - SSE/SST``.

Solving at one α (:func:`solve_ridge`): ``(Sxx + αI) β = Sxy`` by a direct SPD solve
(:func:`pitlab.evaluator.linalg.solve_spd`), a third of the cost of an eigendecomposition; the α-path
(:func:`ridge_path`) uses one eigendecomposition for all α of the grid (penalty selection); on a GPU,
:func:`cholesky_path_test_sse` scores the grid by one batched Cholesky solve per α instead (same numbers up to
rounding, all in batched matrix products).

Numerics: the raw sums lose precision when the columns of X have means far from zero; callers should
subtract one global constant vector from X (and a constant from y) before building statistics. Ridge with
an unpenalised intercept is exactly invariant to such shifts (only the intercept moves).

Every function accepts numpy arrays or torch tensors (float64) and returns the same kind
(:mod:`pitlab.evaluator.linalg`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pitlab.evaluator.linalg import CHOLESKY_BLOCK, cholesky_solve_batched, eigh, is_torch, solve_spd, to_numpy, xp
from pitlab.evaluator.rowstats import RowStats  # noqa: F401  (re-exported: the row-unit statistics)
from pitlab.evaluator.suffstats import SuffStats, _like  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class RidgeFit:
    """B ridge fits, one per fitting set. Shapes: ``alpha`` [B] chosen penalty, ``alpha_index`` [B] its
    position in ``alphas``, ``beta`` [B, d] slopes, ``intercept`` [B], ``y_mean`` [B] training mean of y
    (the R² benchmark), ``n`` [B] rows, ``score`` [B, A] the selection criterion per α (GCV score, or pooled
    inner cross-validation SSE; ``criterion`` says which), ``df`` [B, A] degrees of freedom per α (trace of
    the hat matrix, intercept included; for duplicate-aware GCV the corrected trace)."""

    alphas: np.ndarray
    alpha: np.ndarray
    alpha_index: np.ndarray
    beta: np.ndarray
    intercept: np.ndarray
    y_mean: np.ndarray
    n: np.ndarray
    score: np.ndarray
    df: np.ndarray
    criterion: str

    def predict(self, X) -> np.ndarray:
        """Predictions ``c + Xβ``: X [n_rows, d] → [B, n_rows]."""
        return self.intercept[:, None] + (_like(self.beta, X) @ self.beta.T).T


def _check_alphas(alphas) -> np.ndarray:
    a = np.asarray(alphas, dtype=np.float64).ravel()
    if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"regression.alphas must be positive finite numbers (got {list(a)})")
    return a


def centred(stats: SuffStats) -> tuple:
    """Centred statistics of each fitting set: ``x̄`` [B, d], ``ȳ`` [B], ``Sxx`` [B, d, d], ``Sxy`` [B, d],
    ``Syy`` [B] (module docstring). Raises ValueError for a set with fewer than 2 rows."""
    n = stats.n
    if bool((n < 2).any()):
        raise ValueError(f"a fitting set has fewer than 2 rows (n = {float(n.min()):g})")
    xm = stats.sx / n[:, None]
    ym = stats.sy / n
    sxx_c = stats.sxx - (n[:, None] * xm)[:, :, None] * xm[:, None, :]
    sxy_c = stats.sxy - n[:, None] * xm * ym[:, None]
    return xm, ym, sxx_c, sxy_c, stats.syy - n * ym * ym


@dataclass(frozen=True)
class RidgePath:
    """The ridge solutions of B fitting sets for every α of a grid, from one eigendecomposition each.

    Shapes: ``alphas`` [A]; ``n``, ``y_mean``, ``syy_c`` [B]; ``x_mean`` [B, d]; ``lam`` [B, d] eigenvalues
    and ``V`` [B, d, d] eigenvectors of the centred Gram matrix; ``z`` = Vᵀ Sxy [B, d].
    """

    alphas: np.ndarray
    n: np.ndarray
    x_mean: np.ndarray
    y_mean: np.ndarray
    syy_c: np.ndarray
    lam: np.ndarray
    V: np.ndarray
    z: np.ndarray

    @property
    def den(self):
        """λ_j + α, [B, A, d]."""
        return self.lam[:, None, :] + _like(self.lam, self.alphas)[None, :, None]

    def df(self):
        """Trace of the hat matrix per α (intercept included): 1 + Σ λ/(λ+α), [B, A]."""
        return 1.0 + (self.lam[:, None, :] / self.den).sum(axis=2)

    def rss(self):
        """In-sample residual sum of squares per α: Syy - Σ z²(λ+2α)/(λ+α)², [B, A] (clipped at 0)."""
        den = self.den
        a = _like(self.lam, self.alphas)
        r = self.syy_c[:, None] - (self.z[:, None, :] ** 2 * (self.lam[:, None, :] + 2 * a[None, :, None])
                                   / den**2).sum(axis=2)
        return xp(r).clip(r, 0.0, None)

    def betas(self):
        """Slopes for every α: V diag(1/(λ+α)) z, [B, A, d]."""
        m = xp(self.V)
        return m.swapaxes(self.V @ m.swapaxes(self.z[:, None, :] / self.den, 1, 2), 1, 2)

    def fit_at(self, alpha_index, score, df, criterion: str) -> RidgeFit:
        """The fits at the chosen grid positions ``alpha_index`` [B]."""
        k = np.asarray(to_numpy(alpha_index), dtype=np.int64)
        rows = np.arange(len(k))
        beta = (self.V @ (self.z / self.den[rows, k])[:, :, None])[:, :, 0]
        intercept = self.y_mean - xp(beta).einsum("bi,bi->b", self.x_mean, beta)
        return RidgeFit(alphas=self.alphas, alpha=self.alphas[k], alpha_index=k, beta=beta, intercept=intercept,
                        y_mean=self.y_mean, n=self.n, score=score, df=df, criterion=criterion)


def ridge_path(stats: SuffStats, alphas) -> RidgePath:
    """Centre each fitting set's statistics and eigendecompose its Gram matrix (module docstring formulas)."""
    return ridge_paths([stats], alphas)[0]


def _centred_target(stats: SuffStats, xm) -> tuple:
    """ȳ [B], Sxy [B, d], Syy [B] of one target, given the fitting sets' x̄ [B, d] (module docstring)."""
    n = stats.n
    ym = stats.sy / n
    return ym, stats.sxy - n[:, None] * xm * ym[:, None], stats.syy - n * ym * ym


def ridge_paths(targets: list[SuffStats], alphas) -> list[RidgePath]:
    """:func:`ridge_path` of several targets of the same fitting sets (:meth:`SuffStats.target` views: one
    ``n``, ``sx`` and ``sxx``): one eigendecomposition per set, shared by every target."""
    a = _check_alphas(alphas)
    xm, _, sxx_c, _, _ = centred(targets[0])
    m = xp(sxx_c)
    lam, V = eigh(sxx_c)  # both libraries read the lower triangle
    del sxx_c
    lam = m.clip(lam, 0.0, None)  # a PSD matrix; tiny negative eigenvalues are rounding
    out = []
    for st in targets:
        ym, sxy_c, syy_c = _centred_target(st, xm)
        z = (m.swapaxes(V, 1, 2) @ sxy_c[:, :, None])[:, :, 0]
        out.append(RidgePath(alphas=a, n=st.n, x_mean=xm, y_mean=ym, syy_c=syy_c, lam=lam, V=V, z=z))
    return out


def gcv_scores(path: RidgePath, copies: SuffStats | None = None) -> tuple:
    """GCV score and degrees of freedom per α, both [B, A] (see :func:`fit_ridge_gcv`)."""
    n, xm = path.n, path.x_mean
    if copies is None:
        df = path.df()
    else:
        if copies.m != path.n.shape[0] or copies.d != path.x_mean.shape[1]:
            raise ValueError("copies must describe the same sets as stats")
        q = copies.sx
        C = copies.sxx - q[:, :, None] * xm[:, None, :] - xm[:, :, None] * q[:, None, :] \
            + copies.n[:, None, None] * xm[:, :, None] * xm[:, None, :]
        c_diag = xp(C).einsum("bij,bij->bj", path.V, C @ path.V)  # diag(VᵀCV)
        del C
        df = (copies.n / n)[:, None] + (c_diag[:, None, :] / path.den).sum(axis=2)
    resid_df = n[:, None] - df
    m = xp(df)
    safe = m.where(resid_df > 0, resid_df, m.ones_like(resid_df))
    gcv = m.where(resid_df > 0, n[:, None] * path.rss() / safe**2, m.full_like(resid_df, float("inf")))
    return gcv, df


def fit_ridge_gcv(stats: SuffStats, alphas, copies: SuffStats | None = None) -> RidgeFit:
    """Fit ridge (intercept unpenalised) on each of the ``stats.m`` fitting sets, α chosen by GCV.

    One eigendecomposition of the centred Gram matrix per set gives β(α), RSS(α) and df(α) for every α
    of the grid (formulas in the module docstring). ``alphas``: positive floats (``regression.alphas``).

    ``copies``: for a set in which rows appear several times (a bootstrap replicate; ``stats`` weighted by
    multiplicities m), the same sets weighted by m². The copies of a row share one error, so GCV's degrees of
    freedom become ``tr(H Σ̃)`` with Σ̃ the error correlation of the expanded rows (1 between copies), the
    correlated-errors GCV of Altman (1990, JASA 85:749-759): ``df = Σm²/Σm + Σ_j (VᵀCV)_jj/(λ_j + α)`` with
    ``C = Σ_rows m² (x - x̄)(x - x̄)ᵀ``. Plain GCV on duplicated rows rewards fitting the duplicated noise and
    picks too small an α (E[RSS] ≈ σ²(n - tr(HΣ̃)) instead of σ²(n - tr H) near α = 0). Without duplicates
    (all m = 1) both are the same number. ``None`` = plain GCV.
    """
    path = ridge_path(stats, alphas)
    gcv, df = gcv_scores(path, copies)
    return path.fit_at(xp(gcv).argmin(gcv, axis=1), gcv, df, "gcv")


def fit_ridge_at(stats: SuffStats, alphas, alpha_index, score=None, criterion: str = "given") -> RidgeFit:
    """Fit ridge on each fitting set at a given grid position ``alpha_index`` [B] (chosen elsewhere, e.g. by
    inner cross-validation whose per-α score [B, A] is passed on as ``score``), from one eigendecomposition
    per set (so ``df`` is known for every α)."""
    path = ridge_path(stats, alphas)
    if score is None:
        score = xp(path.lam).full_like(path.df(), float("nan"))
    return path.fit_at(alpha_index, score, path.df(), criterion)


def solve_ridge(stats: SuffStats, alpha) -> tuple:
    """Ridge slopes at one penalty per fitting set by a direct solve: ``alpha`` [B] (float) →
    ``beta`` [B, d], ``intercept`` [B], ``y_mean`` [B] (training mean of y). Solves
    ``(Sxx + αI) β = Sxy`` (centred statistics; SPD since α > 0) with
    :func:`pitlab.evaluator.linalg.solve_spd`; equal to the eigendecomposition formula up to rounding."""
    xm, ym, sxx_c, sxy_c, _ = centred(stats)
    a = _like(ym, alpha)
    d = sxx_c.shape[1]
    idx = np.arange(d)
    if is_torch(sxx_c):
        import torch

        idx = torch.arange(d, device=sxx_c.device)
    sxx_c[:, idx, idx] += a[:, None]
    beta = solve_spd(sxx_c, sxy_c)
    return beta, ym - xp(beta).einsum("bi,bi->b", xm, beta), ym


def path_test_sse(path: RidgePath, test: SuffStats):
    """SSE of every α's fit of set b on test set b: [B, A] (same raw-statistics formula as
    :func:`out_of_sample_errors`)."""
    if test.m != path.n.shape[0]:
        raise ValueError(f"{path.n.shape[0]} fitting sets vs {test.m} test sets")
    B = path.betas()  # [b, A, d]
    return _betas_test_sse(B, path.x_mean, path.y_mean, test)


def _betas_test_sse(B, x_mean, y_mean, test: SuffStats):
    """SSE on test set b of the slopes ``B`` [b, A, d] of fitting set b (intercepts ``ȳ - x̄ᵀβ`` from
    ``x_mean`` [b, d], ``y_mean`` [b]): [b, A], raw-statistics formula of the module docstring, clipped at 0."""
    m = xp(B)
    c = y_mean[:, None] - m.einsum("bi,bai->ba", x_mean, B)
    quad = m.einsum("bai,bia->ba", B, test.sxx @ m.swapaxes(B, 1, 2))
    sse = (test.syy[:, None] - 2 * c * test.sy[:, None] - 2 * m.einsum("bai,bi->ba", B, test.sxy)
           + test.n[:, None] * c * c + 2 * c * m.einsum("bai,bi->ba", B, test.sx) + quad)
    return m.clip(sse, 0.0, None)


CHOLESKY_BATCH_BYTES = 2 << 30
"""Bytes of [d, d] float64 matrices :func:`cholesky_path_test_sse` factorises in one batch: when a call's sets are
few (a point estimate's 5 inner sets), several α share one batched solve, so the search costs one launch
sequence per pass instead of one per α (a small batch is launch-bound on a GPU: about 34 ms per solve of 5
matrices of order 2,048 under blocking launches on an H200, bench/RESULTS.md); a bootstrap batch, already this
large, keeps one α per solve. The penalty search passes at most a quarter of the backend's memory budget."""


def cholesky_path_test_sse(train, test, alphas, block: int = CHOLESKY_BLOCK,
                           batch_bytes: int = CHOLESKY_BATCH_BYTES):
    """The ridge fits of every training set at every α of the grid, scored on its test set: SSE [B, A], the
    numbers of ``path_test_sse(ridge_path(train, alphas), test)`` up to rounding, without eigendecompositions.

    ``train``, ``test``: SuffStats of B sets each (torch float64, any device), or equal-length lists of them: the
    targets of the same sets (:meth:`SuffStats.target` views sharing ``n``, ``sx`` and ``sxx``), solved together
    (one factorisation per set and α for all targets; returns a list of SSE, one per target). The centred systems
    ``(Sxx + αI) β = Sxy`` of all B sets are solved by batched Cholesky
    (:func:`pitlab.evaluator.linalg.cholesky_solve_batched`, ``block`` columns per step), as many α per batch as
    fit in ``batch_bytes`` (at least one); SSE on the test statistics as :func:`path_test_sse`. Cost: A·d³/3
    flops per set, all in batched matrix products (an eigendecomposition costs about 9d³, half of them in BLAS-2
    steps that a GPU runs far below its matrix rate). A set whose factorisation meets a non-positive pivot (α far
    below the rounding of Sxx) is scored through :func:`ridge_path` instead (eigenvalues clipped at 0). Memory:
    the centred Gram matrices, one batch of ``batch_bytes`` (or B matrices) and its block temporaries."""
    import torch

    many = isinstance(train, (list, tuple))
    trains, tests = (list(train), list(test)) if many else ([train], [test])
    if len(trains) != len(tests) or any(te.m != trains[0].m or tr.m != trains[0].m for tr, te in zip(trains, tests)):
        raise ValueError(f"{[t.m for t in trains]} fitting sets vs {[t.m for t in tests]} test sets")
    a = _check_alphas(alphas)
    xm, _, sxx_c, _, _ = centred(trains[0])
    ys = [_centred_target(tr, xm) for tr in trains]
    rhs = torch.stack([y[1] for y in ys], dim=2)  # [B, d, T]
    n_sets, d = int(sxx_c.shape[0]), int(sxx_c.shape[-1])
    per = max(1, int(batch_bytes) // max(1, n_sets * d * d * 8))  # α per batched solve
    ok = torch.ones(n_sets, dtype=torch.bool, device=sxx_c.device)
    betas = []
    for s in range(0, len(a), per):
        chunk = a[s:s + per]
        c = len(chunk)
        if c == 1:  # the last α factorises the centred matrices in place
            M = sxx_c if s + 1 == len(a) else sxx_c.clone()
            M.diagonal(dim1=1, dim2=2).add_(float(chunk[0]))
            R = rhs
        else:  # set-major: matrix i·c + j is set i at α chunk[j]
            M = sxx_c.repeat_interleave(c, dim=0)
            shift = torch.as_tensor(chunk, dtype=M.dtype, device=M.device).repeat(n_sets)
            M.diagonal(dim1=1, dim2=2).add_(shift[:, None])
            R = rhs.repeat_interleave(c, dim=0)
        beta, ok_a = cholesky_solve_batched(M, R, block)
        del M
        betas.append(beta.reshape(n_sets, c, d, -1))
        ok &= ok_a.reshape(n_sets, c).all(dim=1)
    del sxx_c
    B = torch.cat(betas, 1)  # [B, A, d, T]
    sses = [_betas_test_sse(B[..., t], xm, ys[t][0], te) for t, te in enumerate(tests)]
    if not bool(ok.all()):
        bad = torch.nonzero(~ok)[:, 0]
        idx = bad.cpu().numpy()
        paths = ridge_paths([tr.take(idx) for tr in trains], a)
        for sse, path, te in zip(sses, paths, tests):
            sse[bad] = path_test_sse(path, te.take(idx))
    return sses if many else sses[0]


BENCHMARKS = ("train_mean", "zero")


def out_of_sample_errors(fit: RidgeFit, test: SuffStats, benchmark: str = "train_mean",
                         y_shift: float = 0.0) -> tuple:
    """SSE and SST of B fits, fit b scored on test set b: ([B], [B]).

    ``benchmark``: ``"train_mean"``: SST about the training mean, ``Σy² - 2ȳ_train Σy + n ȳ_train²``;
    ``"zero"``: SST of the raw (unshifted) target, ``Σ(y + y_shift)² = Σy² + 2·y_shift·Σy + n·y_shift²``
    (Gu, Kelly & Xiu 2020, "Empirical Asset Pricing via Machine Learning", RFS 33(5), eq. 19: R²_oos against
    zero, since the historical mean return is a noisy, too-easy-to-beat benchmark). ``y_shift``: the constant
    subtracted from the target before the statistics were built (SSE does not depend on it). ``R² = 1 - sse/sst``.
    """
    if benchmark not in BENCHMARKS:
        raise ValueError(f"regression.benchmark must be one of {BENCHMARKS} (got {benchmark!r})")
    if test.m != fit.beta.shape[0] or test.d != fit.beta.shape[1]:
        raise ValueError(f"{fit.beta.shape[0]} fits of dimension {fit.beta.shape[1]} vs {test.m} test sets "
                         f"of dimension {test.d}")
    m = xp(fit.beta)
    b, c = fit.beta, fit.intercept
    quad = m.einsum("bi,bi->b", b, (test.sxx @ b[:, :, None])[:, :, 0])
    sse = (test.syy - 2 * c * test.sy - 2 * m.einsum("bi,bi->b", b, test.sxy) + test.n * c * c
           + 2 * c * m.einsum("bi,bi->b", b, test.sx) + quad)
    ybar = fit.y_mean if benchmark == "train_mean" else m.full_like(fit.y_mean, -float(y_shift))
    sst = test.syy - 2 * ybar * test.sy + test.n * ybar * ybar
    return m.clip(sse, 0.0, None), m.clip(sst, 0.0, None)


def r2_score_oos(sse, sst):
    """Out-of-sample R² = 1 - SSE/SST (NaN where SST = 0)."""
    m = xp(sse)
    if m is np:
        sse, sst = np.asarray(sse, dtype=np.float64), np.asarray(sst, dtype=np.float64)
    safe = m.where(sst > 0, sst, m.ones_like(sst))
    return m.where(sst > 0, 1.0 - sse / safe, m.full_like(sst, float("nan")))
