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

Numerics: the raw sums lose precision when the columns of X have means far from zero; callers should
subtract one global constant vector from X (and a constant from y) before building statistics. Ridge with
an unpenalised intercept is exactly invariant to such shifts (only the intercept moves).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SuffStats:
    """Sufficient statistics of m row sets (securities, or weighted unions of them), all float64.

    Shapes: ``n`` [m] row counts, ``sx`` [m, d] Σx, ``sy`` [m] Σy, ``syy`` [m] Σy², ``sxx`` [m, d, d] XᵀX,
    ``sxy`` [m, d] Xᵀy.
    """

    n: np.ndarray
    sx: np.ndarray
    sy: np.ndarray
    syy: np.ndarray
    sxx: np.ndarray
    sxy: np.ndarray

    @property
    def m(self) -> int:
        """Number of row sets."""
        return int(self.n.shape[0])

    @property
    def d(self) -> int:
        """Number of features."""
        return int(self.sx.shape[1])

    @classmethod
    def from_rows(cls, X: np.ndarray, y: np.ndarray, groups: np.ndarray, n_groups: int) -> "SuffStats":
        """Statistics per group from raw rows.

        X: float [n_rows, d]; y: float [n_rows]; groups: int [n_rows] in 0..n_groups-1 (rows of a group need
        not be contiguous). Returns statistics with m = n_groups (zeros for a group without rows).
        """
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        g = np.asarray(groups, dtype=np.int64)
        if X.ndim != 2 or y.shape != (X.shape[0],) or g.shape != (X.shape[0],):
            raise ValueError(f"from_rows: X {X.shape}, y {y.shape}, groups {g.shape} do not match")
        if len(g) and (g.min() < 0 or g.max() >= n_groups):
            raise ValueError(f"from_rows: group ids must lie in 0..{n_groups - 1}")
        d = X.shape[1]
        order = np.argsort(g, kind="stable")
        bounds = np.searchsorted(g[order], np.arange(n_groups + 1))
        n = np.diff(bounds).astype(np.float64)
        sx, sxy, sxx = np.zeros((n_groups, d)), np.zeros((n_groups, d)), np.zeros((n_groups, d, d))
        sy, syy = np.zeros(n_groups), np.zeros(n_groups)
        for k in np.flatnonzero(n):
            idx = order[bounds[k]:bounds[k + 1]]
            rows, ys = X[idx], y[idx]
            sx[k], sy[k], syy[k] = rows.sum(axis=0), ys.sum(), ys @ ys
            sxx[k], sxy[k] = rows.T @ rows, ys @ rows
        return cls(n=n, sx=sx, sy=sy, syy=syy, sxx=sxx, sxy=sxy)

    def weighted(self, weights: np.ndarray) -> "SuffStats":
        """Weighted sums of the m row sets: ``weights`` [B, m] (e.g. bootstrap multiplicities, zero for
        excluded sets) → statistics of B row sets. Equals the statistics of the data set in which every row
        of set i appears ``weights[b, i]`` times."""
        W = np.asarray(weights, dtype=np.float64)
        if W.ndim != 2 or W.shape[1] != self.m:
            raise ValueError(f"weights must have shape [B, {self.m}], got {W.shape}")
        d = self.d
        sxx = W @ self.sxx.reshape(self.m, d * d)
        return SuffStats(n=W @ self.n, sx=W @ self.sx, sy=W @ self.sy, syy=W @ self.syy,
                         sxx=sxx.reshape(W.shape[0], d, d), sxy=W @ self.sxy)

    def take(self, index: np.ndarray) -> "SuffStats":
        """The row sets at ``index`` (int array; repeats allowed), as a new SuffStats."""
        i = np.asarray(index, dtype=np.int64)
        return SuffStats(n=self.n[i], sx=self.sx[i], sy=self.sy[i], syy=self.syy[i], sxx=self.sxx[i],
                         sxy=self.sxy[i])

    def __sub__(self, other: "SuffStats") -> "SuffStats":
        """Statistics of set difference (``other`` ⊆ ``self`` row-wise, e.g. a fold removed from its union)."""
        return SuffStats(n=self.n - other.n, sx=self.sx - other.sx, sy=self.sy - other.sy,
                         syy=self.syy - other.syy, sxx=self.sxx - other.sxx, sxy=self.sxy - other.sxy)

    def total(self) -> "SuffStats":
        """The union of all m sets (m = 1)."""
        return self.weighted(np.ones((1, self.m)))


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

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predictions ``c + Xβ``: X [n_rows, d] → [B, n_rows]."""
        return self.intercept[:, None] + (np.asarray(X, dtype=np.float64) @ self.beta.T).T


def _check_alphas(alphas) -> np.ndarray:
    a = np.asarray(alphas, dtype=np.float64).ravel()
    if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"regression.alphas must be positive finite numbers (got {list(a)})")
    return a


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
    def den(self) -> np.ndarray:
        """λ_j + α, [B, A, d]."""
        return self.lam[:, None, :] + self.alphas[None, :, None]

    def df(self) -> np.ndarray:
        """Trace of the hat matrix per α (intercept included): 1 + Σ λ/(λ+α), [B, A]."""
        return 1.0 + (self.lam[:, None, :] / self.den).sum(axis=2)

    def rss(self) -> np.ndarray:
        """In-sample residual sum of squares per α: Syy - Σ z²(λ+2α)/(λ+α)², [B, A] (clipped at 0)."""
        den = self.den
        r = self.syy_c[:, None] - (self.z[:, None, :] ** 2 * (self.lam[:, None, :] + 2 * self.alphas[None, :, None])
                                   / den**2).sum(axis=2)
        return np.clip(r, 0.0, None)

    def betas(self) -> np.ndarray:
        """Slopes for every α: V diag(1/(λ+α)) z, [B, A, d]."""
        return np.swapaxes(self.V @ np.swapaxes(self.z[:, None, :] / self.den, 1, 2), 1, 2)

    def fit_at(self, alpha_index: np.ndarray, score: np.ndarray, df: np.ndarray, criterion: str) -> RidgeFit:
        """The fits at the chosen grid positions ``alpha_index`` [B]."""
        k = np.asarray(alpha_index, dtype=np.int64)
        rows = np.arange(len(k))
        beta = (self.V @ (self.z / self.den[rows, k])[:, :, None])[:, :, 0]
        intercept = self.y_mean - np.einsum("bi,bi->b", self.x_mean, beta)
        return RidgeFit(alphas=self.alphas, alpha=self.alphas[k], alpha_index=k, beta=beta, intercept=intercept,
                        y_mean=self.y_mean, n=self.n, score=score, df=df, criterion=criterion)


def ridge_path(stats: SuffStats, alphas) -> RidgePath:
    """Centre each fitting set's statistics and eigendecompose its Gram matrix (module docstring formulas)."""
    a = _check_alphas(alphas)
    n = stats.n
    if np.any(n < 2):
        raise ValueError(f"a fitting set has fewer than 2 rows (n = {n.min():g})")
    xm = stats.sx / n[:, None]
    ym = stats.sy / n
    sxx_c = stats.sxx - (n[:, None] * xm)[:, :, None] * xm[:, None, :]  # eigh reads the lower triangle
    sxy_c = stats.sxy - n[:, None] * xm * ym[:, None]
    lam, V = np.linalg.eigh(sxx_c)
    del sxx_c
    lam = np.clip(lam, 0.0, None)  # a PSD matrix; tiny negative eigenvalues are rounding
    z = (np.swapaxes(V, 1, 2) @ sxy_c[:, :, None])[:, :, 0]
    return RidgePath(alphas=a, n=n, x_mean=xm, y_mean=ym, syy_c=stats.syy - n * ym * ym, lam=lam, V=V, z=z)


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
    n, xm = path.n, path.x_mean
    if copies is None:
        df = path.df()
    else:
        if copies.m != stats.m or copies.d != stats.d:
            raise ValueError("copies must describe the same sets as stats")
        q = copies.sx
        C = copies.sxx - q[:, :, None] * xm[:, None, :] - xm[:, :, None] * q[:, None, :] \
            + copies.n[:, None, None] * xm[:, :, None] * xm[:, None, :]
        c_diag = np.einsum("bij,bij->bj", path.V, C @ path.V)  # diag(VᵀCV)
        del C
        df = (copies.n / n)[:, None] + (c_diag[:, None, :] / path.den).sum(axis=2)
    resid_df = n[:, None] - df
    with np.errstate(divide="ignore", invalid="ignore"):
        gcv = np.where(resid_df > 0, n[:, None] * path.rss() / resid_df**2, np.inf)
    return path.fit_at(np.argmin(gcv, axis=1), gcv, df, "gcv")


def fit_ridge_at(stats: SuffStats, alphas, alpha_index: np.ndarray, score: np.ndarray | None = None,
                 criterion: str = "given") -> RidgeFit:
    """Fit ridge on each fitting set at a given grid position ``alpha_index`` [B] (chosen elsewhere, e.g. by
    inner cross-validation whose per-α score [B, A] is passed on as ``score``)."""
    path = ridge_path(stats, alphas)
    score = np.full((stats.m, path.alphas.size), np.nan) if score is None else score
    return path.fit_at(alpha_index, score, path.df(), criterion)


def path_test_sse(path: RidgePath, test: SuffStats) -> np.ndarray:
    """SSE of every α's fit of set b on test set b: [B, A] (same raw-statistics formula as
    :func:`out_of_sample_errors`)."""
    if test.m != path.n.shape[0]:
        raise ValueError(f"{path.n.shape[0]} fitting sets vs {test.m} test sets")
    B = path.betas()  # [b, A, d]
    c = path.y_mean[:, None] - np.einsum("bi,bai->ba", path.x_mean, B)
    quad = np.einsum("bai,bia->ba", B, test.sxx @ np.swapaxes(B, 1, 2))
    sse = (test.syy[:, None] - 2 * c * test.sy[:, None] - 2 * np.einsum("bai,bi->ba", B, test.sxy)
           + test.n[:, None] * c * c + 2 * c * np.einsum("bai,bi->ba", B, test.sx) + quad)
    return np.clip(sse, 0.0, None)


BENCHMARKS = ("train_mean", "zero")


def out_of_sample_errors(fit: RidgeFit, test: SuffStats, benchmark: str = "train_mean",
                         y_shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """SSE and SST of fit b on test set b (B pairs), from the test sets' raw statistics.

    Returns ``(sse, sst)``, float64 [B] each: ``sse = Σ(y - c - xᵀβ)²``. ``benchmark``:
    ``"train_mean"``: ``sst = Σ(y - ȳ_train)²`` with ȳ_train = ``fit.y_mean``; ``"zero"``: the benchmark is a
    zero forecast of the *unshifted* target, ``sst = Σ(y + y_shift)² = Σy² + 2·y_shift·Σy + n·y_shift²``
    (Gu, Kelly & Xiu 2020, "Empirical Asset Pricing via Machine Learning", RFS 33(5), eq. 19: R²_oos against
    zero, since the historical mean return is a noisy, too-easy-to-beat benchmark). ``y_shift``: the constant
    subtracted from the target before the statistics were built (SSE does not depend on it). ``R² = 1 - sse/sst``.
    """
    if benchmark not in BENCHMARKS:
        raise ValueError(f"regression.benchmark must be one of {BENCHMARKS} (got {benchmark!r})")
    if test.m != fit.beta.shape[0] or test.d != fit.beta.shape[1]:
        raise ValueError(f"{fit.beta.shape[0]} fits of dimension {fit.beta.shape[1]} vs {test.m} test sets "
                         f"of dimension {test.d}")
    b, c = fit.beta, fit.intercept
    quad = np.einsum("bi,bi->b", b, (test.sxx @ b[:, :, None])[:, :, 0])
    sse = (test.syy - 2 * c * test.sy - 2 * np.einsum("bi,bi->b", b, test.sxy) + test.n * c * c
           + 2 * c * np.einsum("bi,bi->b", b, test.sx) + quad)
    ybar = fit.y_mean if benchmark == "train_mean" else np.full_like(fit.y_mean, -float(y_shift))
    sst = test.syy - 2 * ybar * test.sy + test.n * ybar * ybar
    return np.clip(sse, 0.0, None), np.clip(sst, 0.0, None)


def r2_score_oos(sse: np.ndarray, sst: np.ndarray) -> np.ndarray:
    """Out-of-sample R² = 1 - SSE/SST (NaN where SST = 0)."""
    sse, sst = np.asarray(sse, dtype=np.float64), np.asarray(sst, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sst > 0, 1.0 - sse / sst, np.nan)
