"""Out-of-sample R² of one model under every protocol, for a batch of security weightings.

A weighting is a vector of multiplicities over securities: all ones for the point estimate, a bootstrap draw
for a replicate. Every protocol is a list of :class:`Fold` (a training row set, a test row set and, for
GroupKFold, which securities each weighting puts on either side), and every fold is evaluated the same way
(:meth:`PanelStats.fold_errors`):

1. per-security sufficient statistics of the fold's training rows are built once, from the rows
   (:class:`pitlab.evaluator.ridge.SuffStats`); the training set of a weighting is their weighted sum
   (weights = multiplicity of each security in the draw): one matrix product per batch of weightings;
2. the penalty: chosen inside that training set (:class:`AlphaSelection`; inner GroupKFold by security with
   one eigendecomposition per inner fold for the whole α grid, or GCV), or held at a given grid position
   (``alpha_index``, e.g. the one the point estimate chose: ``bootstrap.reselectPenalty: false``);
3. the ridge refit at that α by a direct SPD solve (exact; :func:`pitlab.evaluator.ridge.solve_ridge`);
4. SSE and SST from the fold's test *rows*, ``SSE = Σ_r w_s(r) (y_r - c - x_rᵀβ)²`` (w the multiplicity of
   the row's security): a test set has far fewer rows per security than features, so this costs less than
   weighted test Gram matrices and needs none.

* leakage-off: one fold, the chronological split.
* leakage-on: GroupKFold by security over all rows; pooled out-of-fold ``R² = 1 - Σ_k SSE_k / Σ_k SST_k``
  with SST_k about fold k's own training mean.
* walk-forward, purged K-fold: date-block folds (:mod:`pitlab.evaluator.protocols`).
The R² benchmark is the training mean of the target (of the fitting set) or zero. When a weighting repeats
securities (a bootstrap replicate), GCV counts the copies' shared errors and inner folds keep all copies of a
security together, so a replicate selects its penalty the way the point estimate does.

The arrays live on a :class:`pitlab.evaluator.linalg.Backend` (numpy on the CPU, or torch float64 on CUDA);
results come back as numpy float64. On the numpy backend the weightings are processed in batches spread over one
Python thread per core, each with one BLAS thread (:func:`pitlab.evaluator.linalg.run_batches`); a batch's
numbers do not depend on the thread, so reruns are bit-identical. Cost per fold and weighting: one weighted
sum of S per-security Gram matrices (S·d(d+1) flops), with security-cv ``inner_folds`` more plus as many
eigendecompositions of d × d, then one d × d solve and 2·d flops per test row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pitlab.evaluator.linalg import Backend, eigvalsh, parallel_batches, run_batches, to_numpy, xp
from pitlab.evaluator.ridge import BENCHMARKS, RowStats, SuffStats, centred, r2_score_oos, solve_ridge  # noqa: F401
from pitlab.evaluator.selection import (ALPHA_SELECTIONS, TIE_RTOL, AlphaSelection,  # noqa: F401  (re-exported)
                                       argmin_ties_largest, fit_selected, select_alpha)

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
    ``df`` (degrees of freedom at it, intercept included; NaN where not computed) [B] (leakage-off) or [B, K]
    (leakage-on, per fold); ``alpha_index`` int [B] or [B, K], the position of ``alpha`` in the grid."""

    r2: np.ndarray
    sse: np.ndarray
    sst: np.ndarray
    alpha: np.ndarray
    df: np.ndarray
    alpha_index: np.ndarray | None = None
    r2_rows: np.ndarray | None = None


@dataclass(frozen=True)
class FoldsR2:
    """Out-of-sample results of a K-fold protocol for B weightings: ``r2`` [B, K] per fold,
    ``mean`` [B] (mean of the per-fold R²), ``pooled`` [B] (1 - Σ_k SSE_k / Σ_k SST_k), ``alpha`` [B, K],
    ``alpha_index`` int [B, K], ``sse``/``sst`` [B, K], ``df`` [B, K] (NaN where not computed)."""

    r2: np.ndarray
    mean: np.ndarray
    pooled: np.ndarray
    alpha: np.ndarray
    alpha_index: np.ndarray | None = None
    sse: np.ndarray | None = None
    sst: np.ndarray | None = None
    df: np.ndarray | None = None
    sse_rows: np.ndarray | None = None
    sst_rows: np.ndarray | None = None


@dataclass(frozen=True)
class Fold:
    """One fit of a protocol. ``train``, ``test``: bool [n_rows] row masks. ``train_securities``,
    ``test_securities``: bool [B, n_securities] per weighting (GroupKFold: which securities of weighting b sit
    in the training / test side of this fold), or None = every security. ``score_rows`` bool [n_rows]
    (optional): a subset of the test rows on which SSE and SST are also summed (leakage-on scored on the
    leakage-off test rows: the same-row premium)."""

    train: np.ndarray
    test: np.ndarray
    train_securities: np.ndarray | None = None
    test_securities: np.ndarray | None = None
    score_rows: np.ndarray | None = None


def group_kfold_folds(n_rows: int, folds: np.ndarray, n_splits: int,
                      score_rows: np.ndarray | None = None) -> list[Fold]:
    """The K folds of leakage-on: every row on both sides, securities split by ``folds`` int [B, S] (fold of
    each security in each weighting, -1 = not drawn; :func:`pitlab.evaluator.protocols.security_folds`).
    ``score_rows`` bool [n_rows]: also score each fold on these rows (:class:`Fold`)."""
    F = np.asarray(folds, dtype=np.int64)
    every = np.ones(n_rows, dtype=bool)
    return [Fold(every, every, (F != k) & (F >= 0), F == k, score_rows) for k in range(n_splits)]


@dataclass(frozen=True)
class _FoldContext:
    """The shared part of one :meth:`PanelStats.fold_errors` call: training ``units`` (and their row counts
    ``units_n``), test rows ``Xte`` [n_test, d] with each target's ``ytes`` [n_test] and security indices
    ``sec_te``, the zero benchmark's ``shifts`` per target, the ``outs`` dicts per target, the positions ``sub``
    of separately scored test rows (or None)."""

    units: object
    units_n: np.ndarray
    Xte: object
    ytes: list
    sec_te: object
    shifts: tuple
    outs: list
    sub: object


@dataclass(frozen=True)
class PanelStats:
    """One model's panel, ready for the statistics: centred rows on a backend, the chronological split and
    per-security row counts.

    ``X`` float64 [n_rows, d] and ``y`` [n_rows] minus their panel means (exact for ridge with intercept,
    :mod:`pitlab.evaluator.ridge`), on ``backend``; ``security`` int [n_rows] codes in 0..n_securities-1;
    ``train_mask``, ``test_mask`` bool [n_rows] (leakage-off); ``rows_per_security`` int [n_securities];
    ``y_shift`` the mean removed from y. Per-security statistics of a row set: :meth:`stats_of`.

    ``unit_security`` int [n_rows] (:meth:`build_rows`): the units weighted by the bootstrap are the rows
    (``security`` is then the row index and ``n_securities`` the row count), and this array gives each row's
    security, by which GroupKFold folds are formed; None: the units are the securities.
    """

    X: object
    y: object
    security: np.ndarray
    n_securities: int
    train_mask: np.ndarray
    test_mask: np.ndarray
    rows_per_security: np.ndarray
    y_shift: float = 0.0
    backend: Backend = Backend()
    unit_security: np.ndarray | None = None
    unit_pos: np.ndarray | None = None
    unit_codes: np.ndarray | None = None
    code_shift: np.ndarray | None = None
    y_shifts: tuple = ()
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_targets(self) -> int:
        """Targets T: ``y`` and the ``T - 1`` columns after the features in ``X`` (:meth:`build` with a 2-D y)."""
        return 1 + len(self.y_shifts)

    @property
    def n_features(self) -> int:
        """Embedding dimensions d (the columns of ``X`` that are not further targets)."""
        return int(self.X.shape[1]) - len(self.y_shifts)

    @classmethod
    def build(cls, X: np.ndarray, y: np.ndarray, security: np.ndarray, n_securities: int,
              train_mask: np.ndarray, test_mask: np.ndarray, backend: Backend | None = None,
              centered: bool = False, y_shift: float = 0.0) -> "PanelStats":
        """X float [n_rows, d] embeddings, y float [n_rows] targets, security int [n_rows] codes in
        0..n_securities-1, masks bool [n_rows]. X and y are shifted by their panel means first (unless
        ``centered``, then ``y_shift`` is the mean already removed from y) for numerical accuracy.

        y float [n_rows, T] (T > 1, not with ``centered``): T targets of the same rows, evaluated together (every
        fit's factorisation shared; :meth:`fold_errors` and the protocol functions then return a list of T
        results): ``y[:, 1:]`` is kept as further columns of X (``y_shifts`` their means), ``y[:, 0]`` as y."""
        y = np.asarray(y)
        extra = ()
        if y.ndim == 2:
            if centered:
                raise ValueError("PanelStats.build: several targets need centered=False")
            X = np.concatenate([np.asarray(X, dtype=np.float64), np.asarray(y[:, 1:], dtype=np.float64)], axis=1)
            extra = tuple(float(v) for v in np.asarray(y[:, 1:], dtype=np.float64).mean(axis=0))
            y = y[:, 0]
        if not centered:
            X, y, y_shift = center(X, y)
        backend = backend or Backend()
        sec = np.asarray(security, dtype=np.int64)
        return cls(X=backend.asarray(X), y=backend.asarray(y), security=sec, n_securities=int(n_securities),
                   train_mask=np.asarray(train_mask, dtype=bool), test_mask=np.asarray(test_mask, dtype=bool),
                   rows_per_security=np.bincount(sec, minlength=n_securities), y_shift=float(y_shift),
                   backend=backend, y_shifts=extra)

    @classmethod
    def build_rows(cls, X: np.ndarray, y: np.ndarray, security: np.ndarray, train_mask: np.ndarray,
                   test_mask: np.ndarray, backend: Backend | None = None, centered: bool = False,
                   y_shift: float = 0.0, positions: np.ndarray | None = None,
                   indicators: np.ndarray | None = None) -> "PanelStats":
        """As :meth:`build` with every row its own unit (weights [B, n_rows]: ``bootstrap.cluster`` ``date`` or
        ``security-and-date``, or any date-blocked selection); ``security`` int [n_rows] codes keep GroupKFold
        by security; ``positions`` int [n_rows] calendar positions of the rows' dates (date-blocked inner folds).
        ``indicators`` int [n_rows] (optional): X is the indicator matrix of these codes (row i has a single 1,
        in column ``indicators[i]``; the date-only baseline), so weighted sums take the indicator shortcut of
        :class:`pitlab.evaluator.ridge.RowStats`. Raises ValueError when X is not that matrix."""
        n = len(np.asarray(security))
        shift = None
        if indicators is not None and np.ndim(y) != 1:
            raise ValueError("indicators: one target only")
        if indicators is not None:
            codes = np.asarray(indicators, dtype=np.int64)
            Xn = np.asarray(X, dtype=np.float64)
            if centered or Xn.shape != (n, Xn.shape[1]) or codes.shape != (n,) or not np.array_equal(
                    Xn, np.eye(Xn.shape[1])[codes]):
                raise ValueError("indicators: X must be the uncentred indicator matrix of the codes")
            shift = Xn.mean(axis=0)
        st = cls.build(X, y, np.arange(n), n, train_mask, test_mask, backend, centered, y_shift)
        return cls(X=st.X, y=st.y, security=st.security, n_securities=n, train_mask=st.train_mask,
                   test_mask=st.test_mask, rows_per_security=st.rows_per_security, y_shift=st.y_shift,
                   backend=st.backend, unit_security=np.asarray(security, dtype=np.int64),
                   unit_pos=None if positions is None else np.asarray(positions, dtype=np.int64),
                   unit_codes=None if indicators is None else np.asarray(indicators, dtype=np.int64),
                   code_shift=shift, y_shifts=st.y_shifts)

    def stats_of(self, rows: np.ndarray) -> SuffStats:
        """Per-security statistics of the rows selected by the bool mask ``rows`` [n_rows] (m = n_securities).
        The two last built are kept (GroupKFold's folds share one; the point estimate and the bootstrap of
        leakage-off and leakage-on reuse theirs): memory 2 × n_securities × d² float64."""
        key = np.asarray(rows, dtype=bool).tobytes()
        cache = self._cache.setdefault("lru", [])
        for i, (k, st) in enumerate(cache):
            if k == key:
                cache.append(cache.pop(i))
                return st
        if len(cache) >= 2:
            cache.pop(0)
        idx = np.flatnonzero(rows)
        ix = self.backend.as_index(idx)
        if self.unit_security is not None:
            st = RowStats(self.X[ix], self.y[ix], self.security[idx], self.n_securities, self.unit_security,
                          self.unit_pos, None if self.unit_codes is None else self.unit_codes[idx], self.code_shift)
        else:
            st = SuffStats.from_rows(self.X[ix], self.y[ix], self.security[idx], self.n_securities, self.backend)
        cache.append((key, st))
        return st

    def _batch(self, selection: AlphaSelection | None) -> int:
        """Weightings per batch: the float64 d×d temporaries of one weighting (fitting set, inner folds,
        centred copies, eigenvectors, products: ~4 per fit) and, for row units, its row weights and fold masks,
        within the backend's memory budget (less the row units' one [n_rows, d] product temporary)."""
        d = int(self.X.shape[1])
        fits = 1 if selection is None else selection.fits_per_set + 1
        per = (fits + 1) * 4 * 8 * d * d
        budget = self.backend.memory_budget_bytes
        if self.unit_security is not None:  # row weights and fold masks per weighting; one [n_rows, d] temporary
            n = int(self.X.shape[0])
            per += 8 * n * (fits + 2)
            budget = max(budget - 2 * 8 * d * n, budget // 2)
        return max(1, budget // per)

    def fold_errors(self, fold: Fold, weights, alphas, selection: AlphaSelection | None = AlphaSelection(),
                    benchmark: str = "train_mean", alpha_index: np.ndarray | None = None,
                    diagnostics: bool = False, point_first: bool = False,
                    reselect: bool = True) -> dict[str, np.ndarray] | list[dict[str, np.ndarray]]:
        """SSE and SST of one fold for every weighting (module docstring, steps 1-4).

        ``weights`` [B, n_securities] multiplicities; ``alpha_index`` int [B] (with T > 1 targets: [T, B]): hold
        α at these grid positions (then ``selection`` is not used), or None to choose α by ``selection`` in every
        weighting's training set.
        ``point_first``: row 0 of ``weights`` is the point estimate (all ones); it is computed first (α chosen
        by ``selection``) and, with ``reselect=False``, every other row is refitted at row 0's α
        (``bootstrap.reselectPenalty: false``). ``diagnostics``: also the degrees of freedom at the chosen α
        (one symmetric eigenvalue decomposition per weighting; only row 0 with ``point_first``). Returns numpy
        arrays [B]: ``sse``, ``sst``, ``alpha``, ``df`` (NaN where not computed) float64, ``alpha_index`` int64;
        with T > 1 targets (:attr:`n_targets`) a list of T such dicts, every fit's factorisations shared.
        """
        if benchmark not in BENCHMARKS:
            raise ValueError(f"regression.benchmark must be one of {BENCHMARKS} (got {benchmark!r})")
        a_grid = np.asarray(alphas, dtype=np.float64)
        W = np.asarray(weights, dtype=np.float64)
        if W.ndim != 2 or W.shape[1] != self.n_securities:
            raise ValueError(f"weights must have shape [B, {self.n_securities}], got {W.shape}")
        B, T = W.shape[0], self.n_targets
        ctx = self._fold_context(fold, B)

        def batch(s: int, e: int, fixed: np.ndarray | None, diag: bool) -> None:
            self._fold_batch(ctx, fold, W[s:e], s, e, a_grid, selection, benchmark, fixed, diag)

        first = 0
        fixed = alpha_index
        if point_first and B:
            batch(0, 1, None if alpha_index is None else np.asarray(alpha_index).reshape(T, -1), diagnostics)
            first = 1
            if not reselect:
                fixed = np.stack([np.full(B, out["alpha_index"][0], dtype=np.int64) for out in ctx.outs])
        n = B - first
        workers = parallel_batches(self.backend, n)
        step = max(1, self._batch(None if fixed is not None else selection) // workers)
        step = min(step, -(-n // workers)) if n else 1  # at least one batch per worker
        run_batches(lambda s, e: batch(s, e, fixed, diagnostics and not point_first),
                    [(s, min(s + step, B)) for s in range(first, B, step)], workers)
        return ctx.outs if T > 1 else ctx.outs[0]

    def _fold_context(self, fold: Fold, B: int) -> "_FoldContext":
        """What every batch of :meth:`fold_errors` shares: the training units, the test rows (features and each
        target's column), the zero-benchmark shifts, the output arrays of B weightings per target."""
        T, d = self.n_targets, self.n_features
        units = self.stats_of(fold.train)
        if fold.test.all():  # GroupKFold (leakage-on) tests every row: no n × d copy per fold
            Xte, yte, sec_te = self.X, self.y, self.backend.as_index(self.security)
        else:
            te = np.flatnonzero(fold.test)
            te_ix = self.backend.as_index(te)
            Xte, yte, sec_te = self.X[te_ix], self.y[te_ix], self.backend.as_index(self.security[te])
        ytes = [yte] + [Xte[:, d + t - 1] for t in range(1, T)]
        outs = [{"sse": np.empty(B), "sst": np.empty(B), "alpha": np.empty(B), "df": np.full(B, np.nan),
                 "alpha_index": np.empty(B, dtype=np.int64)} for _ in range(T)]
        sub = None
        if fold.score_rows is not None:  # positions, among the test rows, of the rows also scored apart
            in_test = np.asarray(fold.score_rows, dtype=bool)[np.asarray(fold.test, dtype=bool)]
            sub = self.backend.as_index(np.flatnonzero(in_test))
            for out in outs:
                out["sse_rows"], out["sst_rows"] = np.empty(B), np.empty(B)
        return _FoldContext(units, to_numpy(units.n), Xte[:, :d] if T > 1 else Xte, ytes, sec_te,
                            (self.y_shift,) + tuple(self.y_shifts), outs, sub)

    def _fold_batch(self, ctx: "_FoldContext", fold: Fold, w: np.ndarray, s: int, e: int, a_grid: np.ndarray,
                    selection: AlphaSelection | None, benchmark: str, fixed: np.ndarray | None, diag: bool) -> None:
        """Weightings ``w`` = rows s..e of :meth:`fold_errors`' weights: fit (α chosen or ``fixed`` [T, B]), score
        on the test rows, fill ``ctx.outs`` at s..e for every target."""
        T, d = self.n_targets, self.n_features
        w_tr = w if fold.train_securities is None else w * fold.train_securities[s:e]
        w_te = w if fold.test_securities is None else w * fold.test_securities[s:e]
        empty = None
        if self.unit_security is not None:  # resampled dates can leave a date block without a row
            empty = w_tr @ ctx.units_n < 2
            if empty.any():  # fit on every unit there instead; those numbers are discarded below
                w_tr = np.where(empty[:, None], 1.0, w_tr)
        wb_tr = self.backend.asarray(w_tr)
        fitting = ctx.units.weighted(wb_tr)
        if fixed is None:
            ks, _ = select_alpha(ctx.units, wb_tr, a_grid, selection, fitting, self.backend, T)
            ks = ks if T > 1 else [ks]
        else:
            ks = list(np.asarray(fixed, dtype=np.int64).reshape(T, -1)[:, s:e])
        rw = self.backend.asarray(w_te)[:, ctx.sec_te]  # [b, n_test] multiplicity of each test row
        lam = None
        if diag:
            _, _, sxx_c, _, _ = centred(fitting.target(0, d) if T > 1 else fitting)
            lam = xp(sxx_c).clip(eigvalsh(sxx_c), 0.0, None)
            del sxx_c
        for t, (out, k) in enumerate(zip(ctx.outs, ks)):
            beta, c, ybar = solve_ridge(fitting.target(t, d) if T > 1 else fitting, a_grid[k])
            resid = ctx.ytes[t][None, :] - c[:, None] - beta @ ctx.Xte.T
            bench = ybar if benchmark == "train_mean" else xp(ybar).full_like(ybar, -ctx.shifts[t])
            dev = ctx.ytes[t][None, :] - bench[:, None]
            out["sse"][s:e] = to_numpy((rw * resid * resid).sum(axis=1))
            out["sst"][s:e] = to_numpy((rw * dev * dev).sum(axis=1))
            keys = ("sse", "sst")
            if ctx.sub is not None:
                out["sse_rows"][s:e] = to_numpy((rw * resid * resid)[:, ctx.sub].sum(axis=1))
                out["sst_rows"][s:e] = to_numpy((rw * dev * dev)[:, ctx.sub].sum(axis=1))
                keys += ("sse_rows", "sst_rows")
            if empty is not None and empty.any():
                for key in keys:
                    out[key][s:e][empty] = np.nan
            out["alpha"][s:e] = a_grid[k]
            out["alpha_index"][s:e] = k
            if lam is not None:
                a = self.backend.asarray(a_grid[k])
                out["df"][s:e] = to_numpy(1.0 + (lam / (lam + a[:, None])).sum(axis=1))

    def protocol_errors(self, folds: list[Fold], weights, alphas, selection: AlphaSelection | None = AlphaSelection(),
                        benchmark: str = "train_mean", alpha_index: np.ndarray | None = None,
                        diagnostics: bool = False, point_first: bool = False, reselect: bool = True) -> FoldsR2:
        """:meth:`fold_errors` for every fold (``alpha_index`` int [B, K], with T > 1 targets [T, B, K], or None;
        ``point_first``, ``reselect`` per fold as there). Returns :class:`FoldsR2` (a list of T with T > 1)."""
        res = [self.fold_errors(f, weights, alphas, selection, benchmark,
                                None if alpha_index is None else np.asarray(alpha_index)[..., k], diagnostics,
                                point_first, reselect)
               for k, f in enumerate(folds)]
        if self.n_targets > 1:
            return [_folds_r2([r[t] for r in res]) for t in range(self.n_targets)]
        return _folds_r2(res)


def _folds_r2(res: list[dict]) -> FoldsR2:
    """:class:`FoldsR2` from the K folds' :meth:`PanelStats.fold_errors` dicts of one target."""
    sse, sst = np.stack([r["sse"] for r in res], 1), np.stack([r["sst"] for r in res], 1)
    r2 = r2_score_oos(sse, sst)
    rows = "sse_rows" in res[0]
    return FoldsR2(r2=r2, mean=r2.mean(axis=1), pooled=r2_score_oos(sse.sum(axis=1), sst.sum(axis=1)),
                   alpha=np.stack([r["alpha"] for r in res], 1),
                   alpha_index=np.stack([r["alpha_index"] for r in res], 1), sse=sse, sst=sst,
                   df=np.stack([r["df"] for r in res], 1),
                   sse_rows=np.stack([r["sse_rows"] for r in res], 1) if rows else None,
                   sst_rows=np.stack([r["sst_rows"] for r in res], 1) if rows else None)


def leakage_off_r2(stats: PanelStats, weights: np.ndarray, alphas,
                   selection: AlphaSelection = AlphaSelection(), benchmark: str = "train_mean",
                   alpha_index: np.ndarray | None = None, diagnostics: bool | None = None) -> R2Batch:
    """leakage-off R² for each row of ``weights`` ([B, n_securities] multiplicities): ridge (α chosen by
    ``selection``, or held at ``alpha_index`` int [B]) on the weighted training rows, SSE/SST on the weighted
    test rows. ``diagnostics`` (default: when B = 1): degrees of freedom at the chosen α. With T > 1 targets
    (:attr:`PanelStats.n_targets`): ``alpha_index`` [T, B] and a list of T results."""
    W = np.asarray(weights, dtype=np.float64)
    diag = W.shape[0] == 1 if diagnostics is None else diagnostics
    T = stats.n_targets
    fixed = None if alpha_index is None else np.asarray(alpha_index).reshape((T, -1, 1) if T > 1 else (-1, 1))
    frs = stats.protocol_errors([Fold(stats.train_mask, stats.test_mask)], W, alphas, selection, benchmark,
                                fixed, diag)
    out = [R2Batch(r2=fr.r2[:, 0], sse=fr.sse[:, 0], sst=fr.sst[:, 0], alpha=fr.alpha[:, 0], df=fr.df[:, 0],
                   alpha_index=fr.alpha_index[:, 0]) for fr in (frs if T > 1 else [frs])]
    return out if T > 1 else out[0]


def leakage_on_r2(stats: PanelStats, weights: np.ndarray, folds: np.ndarray, n_splits: int, alphas,
                  selection: AlphaSelection = AlphaSelection(), benchmark: str = "train_mean",
                  alpha_index: np.ndarray | None = None, diagnostics: bool | None = None,
                  score_rows: np.ndarray | None = None) -> R2Batch:
    """Pooled out-of-fold leakage-on R² for each row of ``weights`` ([B, n_securities] multiplicities).

    ``folds`` int [B, n_securities]: fold of each security in that weighting (-1 = not drawn), from
    :func:`pitlab.evaluator.protocols.security_folds`, so all copies of a security share one fold. Fold k
    trains on the weighted rows of securities outside fold k (α chosen there by ``selection``, or held at
    ``alpha_index`` int [B, K]) and is scored on those inside it. ``score_rows`` bool [n_rows]: also the
    pooled R² over these rows only (``r2_rows``; the leakage-off test rows for the same-row premium).
    With T > 1 targets (:attr:`PanelStats.n_targets`): ``alpha_index`` [T, B, K] and a list of T results.
    """
    W = np.asarray(weights, dtype=np.float64)
    F = np.asarray(folds, dtype=np.int64)
    if F.shape != W.shape:
        raise ValueError(f"folds has shape {F.shape}, weights {W.shape}")
    if np.any((W > 0) & (F < 0)):
        raise ValueError("a security with positive weight has no fold")
    diag = W.shape[0] == 1 if diagnostics is None else diagnostics
    frs = stats.protocol_errors(group_kfold_folds(len(stats.security), F, n_splits, score_rows), W, alphas,
                                selection, benchmark, alpha_index, diag)
    out = []
    for fr in (frs if stats.n_targets > 1 else [frs]):
        rows = None if fr.sse_rows is None else r2_score_oos(fr.sse_rows.sum(axis=1), fr.sst_rows.sum(axis=1))
        out.append(R2Batch(r2=r2_score_oos(fr.sse.sum(axis=1), fr.sst.sum(axis=1)), sse=fr.sse.sum(axis=1),
                           sst=fr.sst.sum(axis=1), alpha=fr.alpha, df=fr.df, alpha_index=fr.alpha_index,
                           r2_rows=rows))
    return out if stats.n_targets > 1 else out[0]
