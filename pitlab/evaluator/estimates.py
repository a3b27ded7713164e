"""leakage-off and leakage-on out-of-sample R² of one model, for a batch of security weightings.

A weighting is a vector of multiplicities over securities: all ones for the point estimate, a bootstrap
draw for a replicate. Both estimators work on per-security sufficient statistics (:mod:`pitlab.evaluator.ridge`),
so a batch of B weightings costs B weighted sums plus B eigendecompositions per fold, never a refit from rows.

* leakage-off: ridge fitted on the chronological training rows, R² on the test rows (one split).
* leakage-on: GroupKFold by security over all rows; each fold's ridge is fitted on the other folds; pooled
  out-of-fold ``R² = 1 - Σ_k SSE_k / Σ_k SST_k`` with SST_k about fold k's own training mean.
The R² benchmark is the training mean of the target (of the fitting set). The ridge penalty is chosen inside
every fitting set (:class:`AlphaSelection`: GCV, or inner cross-validation by security); when a weighting
repeats securities (a bootstrap replicate), GCV counts the copies' shared errors, and inner folds keep all
copies of a security together, so a replicate selects its penalty the way the point estimate does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pitlab.evaluator.protocols import security_folds
from pitlab.evaluator.ridge import (RidgeFit, SuffStats, fit_ridge_at, fit_ridge_gcv, out_of_sample_errors,
                                   path_test_sse, r2_score_oos, ridge_path)

_MEMORY_BUDGET_BYTES = 384 * 2**20  # float64 d×d temporaries held at once while a batch is fitted
_MATRICES_PER_FIT = 10  # weighted train/test/copies XᵀX, centred copies, eigenvectors, products: d×d per fit


def _fits_per_chunk(d: int) -> int:
    return max(1, _MEMORY_BUDGET_BYTES // (_MATRICES_PER_FIT * 8 * d * d))


@dataclass(frozen=True)
class PanelStats:
    """Per-security sufficient statistics of one model's embeddings (m = n_securities each).

    ``off_train``: rows of the chronological training set; ``off_test``: rows of its test set;
    ``all_rows``: every panel row (the leakage-on data set); ``rows_per_security`` int [n_securities].
    """

    off_train: SuffStats
    off_test: SuffStats
    all_rows: SuffStats
    rows_per_security: np.ndarray
    y_shift: float = 0.0

    @classmethod
    def build(cls, X: np.ndarray, y: np.ndarray, security: np.ndarray, n_securities: int,
              train_mask: np.ndarray, test_mask: np.ndarray) -> "PanelStats":
        """X float [n_rows, d] embeddings, y float [n_rows] targets, security int [n_rows] codes in
        0..n_securities-1, masks bool [n_rows]. X and y are shifted by their panel means first (exact for
        ridge with intercept, see :mod:`pitlab.evaluator.ridge`) for numerical accuracy."""
        X, y, y_shift = center(X, y)
        sec = np.asarray(security, dtype=np.int64)
        return cls(
            off_train=SuffStats.from_rows(X[train_mask], y[train_mask], sec[train_mask], n_securities),
            off_test=SuffStats.from_rows(X[test_mask], y[test_mask], sec[test_mask], n_securities),
            all_rows=SuffStats.from_rows(X, y, sec, n_securities),
            rows_per_security=np.bincount(sec, minlength=n_securities),
            y_shift=y_shift,
        )


def center(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """X float [n_rows, d] and y float [n_rows] minus their panel means, as float64, and the mean of y (the
    ``y_shift`` the zero benchmark needs). Exact for ridge with an unpenalised intercept."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    mu = float(y.mean())
    return X - X.mean(axis=0), y - mu, mu


@dataclass(frozen=True)
class R2Batch:
    """Out-of-sample results for B weightings: ``r2``, ``sse``, ``sst`` float64 [B]; ``alpha`` (chosen penalty) and
    ``df`` (degrees of freedom at it, intercept included) [B] (leakage-off) or [B, K] (leakage-on, per fold)."""

    r2: np.ndarray
    sse: np.ndarray
    sst: np.ndarray
    alpha: np.ndarray
    df: np.ndarray


def _as_weights(weights: np.ndarray, m: int) -> np.ndarray:
    W = np.asarray(weights, dtype=np.float64)
    if W.ndim != 2 or W.shape[1] != m:
        raise ValueError(f"weights must have shape [B, {m}], got {W.shape}")
    return W


@dataclass(frozen=True)
class AlphaSelection:
    """How the ridge penalty is chosen inside every fitting set.

    ``method``: ``"gcv"`` — generalised cross-validation (the spec's ``regression`` block); with
    ``duplicate_aware`` the copies of a security in a bootstrap replicate count as one error (see
    :func:`pitlab.evaluator.ridge.fit_ridge_gcv`). ``"security-cv"`` — ``inner_folds``-fold GroupKFold by
    security inside the fitting set (all copies of a security in one inner fold), α minimising the pooled
    inner out-of-fold SSE, then refitted on the whole fitting set. GCV approximates leave-one-*row*-out and so
    rewards fitting what rows of one security or one date share; security-CV scores α on unseen securities,
    like the leakage-on protocol does.
    """

    method: str = "gcv"
    inner_folds: int = 5
    duplicate_aware: bool = True

    def __post_init__(self):
        if self.method not in ALPHA_SELECTIONS:
            raise ValueError(f"alpha selection must be one of {ALPHA_SELECTIONS} (got {self.method!r})")
        if self.inner_folds < 2:
            raise ValueError(f"inner_folds must be >= 2 (got {self.inner_folds})")

    @property
    def fits_per_set(self) -> int:
        """Eigendecompositions per fitting set."""
        return 1 if self.method == "gcv" else self.inner_folds + 1

    def describe(self) -> str:
        """One phrase for reports: how α is chosen."""
        if self.method == "gcv":
            return ("generalised cross-validation (GCV; Golub, Heath & Wahba 1979)"
                    + ("; in bootstrap replicates the copies of a security share one error in GCV's degrees of "
                       "freedom (Altman 1990)" if self.duplicate_aware else ""))
        return (f"{self.inner_folds}-fold GroupKFold by security inside the training set (pooled inner "
                "out-of-fold SSE), then refitted on the whole training set")


ALPHA_SELECTIONS = ("gcv", "security-cv")


def fit_selected(units: SuffStats, w: np.ndarray, alphas, selection: AlphaSelection,
                 fitting: SuffStats | None = None) -> RidgeFit:
    """Ridge fits on B weighted unions of ``units`` (per-security statistics), ``w`` [B, n_units]
    multiplicities, with α chosen by ``selection``. ``fitting``: ``units.weighted(w)`` if already computed."""
    fitting = units.weighted(w) if fitting is None else fitting
    if selection.method == "gcv":
        copies = units.weighted(w * w) if selection.duplicate_aware and np.any(w > 1) else None
        return fit_ridge_gcv(fitting, alphas, copies)
    k = selection.inner_folds
    rows = np.rint(units.n).astype(np.int64)
    inner = np.stack([security_folds(rows, k, wb, field="inner folds of the penalty selection")
                      for wb in np.rint(w).astype(np.int64)])  # [B, U]
    w_test = (w[:, None, :] * (inner[:, None, :] == np.arange(k)[None, :, None])).reshape(-1, units.m)
    inner_test = units.weighted(w_test)
    inner_train = fitting.take(np.repeat(np.arange(w.shape[0]), k)) - inner_test
    path = ridge_path(inner_train, alphas)
    cv_sse = path_test_sse(path, inner_test).reshape(w.shape[0], k, -1).sum(axis=1)  # [B, A]
    del path, inner_train, inner_test
    return fit_ridge_at(fitting, alphas, np.argmin(cv_sse, axis=1), cv_sse, "security-cv")


def split_r2(train: SuffStats, test: SuffStats, weights: np.ndarray, alphas,
             selection: AlphaSelection = AlphaSelection(), benchmark: str = "train_mean",
             y_shift: float = 0.0) -> R2Batch:
    """Out-of-sample R² of one train/test split for each row of ``weights`` ([B, n_securities]
    multiplicities): ridge (α chosen by ``selection``) on the weighted per-security training statistics,
    SSE/SST on the weighted test statistics (``benchmark`` and ``y_shift`` as in
    :func:`pitlab.evaluator.ridge.out_of_sample_errors`)."""
    W = _as_weights(weights, train.m)
    B = W.shape[0]
    step = max(1, _fits_per_chunk(train.d) // selection.fits_per_set)
    sse, sst, alpha, df = np.empty(B), np.empty(B), np.empty(B), np.empty(B)
    for s in range(0, B, step):
        w = W[s:s + step]
        fit = fit_selected(train, w, alphas, selection)
        sse[s:s + step], sst[s:s + step] = out_of_sample_errors(fit, test.weighted(w), benchmark, y_shift)
        alpha[s:s + step] = fit.alpha
        df[s:s + step] = fit.df[np.arange(len(w)), fit.alpha_index]
    return R2Batch(r2=r2_score_oos(sse, sst), sse=sse, sst=sst, alpha=alpha, df=df)


def leakage_off_r2(stats: PanelStats, weights: np.ndarray, alphas,
                   selection: AlphaSelection = AlphaSelection(), benchmark: str = "train_mean") -> R2Batch:
    """leakage-off R² for each row of ``weights`` ([B, n_securities] multiplicities): ridge (α chosen by
    ``selection``) on the weighted training statistics, SSE/SST on the weighted test statistics."""
    return split_r2(stats.off_train, stats.off_test, weights, alphas, selection, benchmark, stats.y_shift)


@dataclass(frozen=True)
class FoldsR2:
    """Out-of-sample results of a date-block K-fold protocol for B weightings: ``r2`` [B, K] per fold,
    ``mean`` [B] (mean of the per-fold R²), ``pooled`` [B] (1 - Σ_k SSE_k / Σ_k SST_k), ``alpha`` [B, K]."""

    r2: np.ndarray
    mean: np.ndarray
    pooled: np.ndarray
    alpha: np.ndarray


def date_folds_r2(X: np.ndarray, y: np.ndarray, security: np.ndarray, n_securities: int, fold_train: np.ndarray,
                  fold_test: np.ndarray, weights: np.ndarray, alphas,
                  selection: AlphaSelection = AlphaSelection(), benchmark: str = "train_mean",
                  y_shift: float = 0.0) -> FoldsR2:
    """R² of a protocol whose folds are row masks (walk-forward, purged K-fold) for every weighting.

    ``X`` float64 [n_rows, d] and ``y`` [n_rows], already centred (:func:`center`; ``y_shift`` = the mean
    removed from y); ``security`` int [n_rows] in 0..n_securities-1; ``fold_train``, ``fold_test`` bool
    [K, n_rows]; ``weights`` [B, n_securities] multiplicities (the shared bootstrap draws; a row of ones for the
    point estimate). Per fold, per-security statistics of its training and test rows are built once (memory:
    two [n_securities, d, d] float64 arrays at a time) and every weighting is a weighted sum of them.
    """
    W = _as_weights(weights, n_securities)
    K = fold_train.shape[0]
    sec = np.asarray(security, dtype=np.int64)
    r2, sse, sst, alpha = (np.empty((W.shape[0], K)) for _ in range(4))
    for k in range(K):
        tr, te = fold_train[k], fold_test[k]
        train = SuffStats.from_rows(X[tr], y[tr], sec[tr], n_securities)
        test = SuffStats.from_rows(X[te], y[te], sec[te], n_securities)
        res = split_r2(train, test, W, alphas, selection, benchmark, y_shift)
        del train, test
        r2[:, k], sse[:, k], sst[:, k], alpha[:, k] = res.r2, res.sse, res.sst, res.alpha
    return FoldsR2(r2=r2, mean=r2.mean(axis=1), pooled=r2_score_oos(sse.sum(axis=1), sst.sum(axis=1)), alpha=alpha)


def leakage_on_r2(stats: PanelStats, weights: np.ndarray, folds: np.ndarray, n_splits: int, alphas,
                  selection: AlphaSelection = AlphaSelection(), benchmark: str = "train_mean") -> R2Batch:
    """Pooled out-of-fold leakage-on R² for each row of ``weights`` ([B, n_securities] multiplicities).

    ``folds`` int [B, n_securities]: fold of each security in that weighting (-1 = not drawn), from
    :func:`pitlab.evaluator.protocols.security_folds`, so all copies of a security share one fold. Fold k
    trains on the weighted statistics of securities outside fold k (α chosen there by ``selection``) and is
    scored on those inside it.
    """
    W = _as_weights(weights, stats.all_rows.m)
    F = np.asarray(folds, dtype=np.int64)
    if F.shape != W.shape:
        raise ValueError(f"folds has shape {F.shape}, weights {W.shape}")
    if np.any((W > 0) & (F < 0)):
        raise ValueError("a security with positive weight has no fold")
    B, K = W.shape[0], n_splits
    step = max(1, _fits_per_chunk(stats.all_rows.d) // (K * selection.fits_per_set))
    sse, sst, alpha, df = np.zeros(B), np.zeros(B), np.empty((B, K)), np.empty((B, K))
    ks = np.arange(K)
    for s in range(0, B, step):
        w, f = W[s:s + step], F[s:s + step]
        in_fold = f[:, None, :] == ks[None, :, None]  # [b, K, S]
        w_test = (w[:, None, :] * in_fold).reshape(-1, W.shape[1])
        w_train = (w[:, None, :] * (~in_fold & (f[:, None, :] >= 0))).reshape(-1, W.shape[1])
        test = stats.all_rows.weighted(w_test)
        train = stats.all_rows.weighted(w).take(np.repeat(np.arange(w.shape[0]), K)) - test
        fit = fit_selected(stats.all_rows, w_train, alphas, selection, fitting=train)
        e, t = out_of_sample_errors(fit, test, benchmark, stats.y_shift)
        del test, train
        sse[s:s + step] = e.reshape(-1, K).sum(axis=1)
        sst[s:s + step] = t.reshape(-1, K).sum(axis=1)
        alpha[s:s + step] = fit.alpha.reshape(-1, K)
        df[s:s + step] = fit.df[np.arange(fit.alpha.shape[0]), fit.alpha_index].reshape(-1, K)
    return R2Batch(r2=r2_score_oos(sse, sst), sse=sse, sst=sst, alpha=alpha, df=df)
