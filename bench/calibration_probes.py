"""Issue 28 probes: bench/calibration.py run unchanged except for one thing, to test an idea about the intervals of
the zero-premium scenarios (1.6-2.3 x too wide under the default) on the tuning seeds.

``--probe one-se``: every penalty selection (point estimates and bootstrap replicates alike; CPU path only) takes
the largest α whose pooled inner-CV SSE is within one standard error of the smallest (Hastie, Tibshirani &
Friedman, The Elements of Statistical Learning, 2nd ed., sec. 7.10; glmnet's ``lambda.1se``), the standard error
of the pooled SSE being sqrt(k) × the sd of the k inner folds' SSE at the best α: does a selection that prefers
the shrunk plateau whenever the data cannot tell penalties apart narrow the nulls without losing the premia?

``--probe shrunk-weights --tau τ``: the two-way replicates' row weights m become 1 + τ (m − 1) (every weight
positive for τ < 1) and each replicate's R² deviations from their mean are divided by τ, so a statistic linear in
the weights keeps its variance (the generalised bootstrap with weights of variance τ², Chatterjee & Bose 2005,
Ann. Statist. 33(1):414-436). A term quadratic in the weights, the classical reason a bootstrap over-disperses at
a degenerate point, shrinks by τ: does the nulls' excess width come from such a term?

    python bench/calibration_probes.py --probe one-se --size 300x30x8 --panels 40 --scenarios null date-known \
        market date-leak stock-strong stock-weak stock-0.02 --schemes two-way --workers 2 --out $OUT/onese.jsonl
    python bench/calibration_probes.py --probe shrunk-weights --tau 0.5 ... --out $OUT/tau05.jsonl
    python bench/calibration_probes.py --probe m-out-of-n --fraction 0.5 ... --out $OUT/moon05.jsonl
    python bench/calibration.py --summarise $OUT/onese.jsonl --split tune

``--probe m-out-of-n --fraction f``: the two-way replicates draw m = round(f·S) securities (the security half) or
round(f·n_k) dates of each of the split's date strata of n_k dates (the date half) with replacement instead of S
and n_k, and each replicate's R² deviations from their mean are multiplied by sqrt(f), so a statistic whose variance
falls as 1/n keeps its variance. The m-out-of-n bootstrap is consistent where the n-out-of-n one is not, at a
parameter on the boundary of its space (Andrews 2000, Econometrica 68(2):399-405; Bickel, Götze & van Zwet 1997,
Statistica Sinica 7:1-31): do the nulls, where the penalty selection sits at the shrunk edge of its grid, narrow?

Results (2026-12-04): bench/RESULTS.md, "Interval study", "Two probes of the nulls' width".

``--probe fixed-alpha --alpha a``: a different estimator, not a different interval: both fits use the one penalty
``a`` (no selection, no grid widening) in the point estimate and in every replicate, scored by the default rule. If
the nulls' excess width is the selection's (docs/statistics.md §5), a premium at a penalty fixed before the data
should have calibrated intervals: what would changing the estimator buy, and what would it cost in power?

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python bench/calibration_probes.py --probe fixed-alpha --alpha 1000 \
        --size 300x30x8 --panels 40 --scenarios null date-known market date-leak stock-strong stock-weak stock-0.02 \
        --schemes two-way --workers 2 --out bench/results/calibration-300x30x8-fixed1000-tune-local.jsonl.gz

``--probe wild`` (:func:`wild_one_panel`; CPU path only): the wild cluster bootstrap (Cameron, Gelbach & Miller
2008, REStat 90(3):414-427; MacKinnon & Webb 2017, J. Appl. Econometrics 32(2):233-254) instead of the pairs
draws. Per panel, after the point estimate: ŷ = in-sample fitted values of ridge (unpenalised intercept) on all
rows at the leakage-on point estimate's penalty (the median of its K folds' grid positions; ``--wild-fit off``:
leakage-off's; ``--wild-fit strata``: leakage-on's, fitted apart on each date stratum of the split, training dates,
embargo date, test dates, so that a relation present on the test dates only stays in ŷ), on the target the panel
scores (market-neutral where the scenario says so); ê = y − ŷ. Replicate r: y*_r = ŷ + w_r[cluster]·ê (computed
as y + (w − 1)·ê, so a weight of +1 gives y bit for bit), Rademacher w, one per security in the first ceil(R/2)
replicates and one per date in the rest, and its premium computed as the point estimate computes it (same X,
rows, split, folds and grid, penalties chosen again, the grid widened at an edge; :func:`premia`, ``--chunk`` c
wild targets at a time as the targets of one PanelStats, pitlab's several-target path, equal to one point estimate
per target up to rounding, 1e-15 here). Interval: the two-way rule on these replicates, premium ± t(G − 1)·
sqrt(max(v_security, v_date)) (only the replicates' spread is used: they centre on ŷ's premium, not the point),
stored under ``two-way`` (and ``wild``) of records kept in their own file, so calibration.py --summarise reads it
as the two-way candidate; the default's table comes from its own file on the same seeds.

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python bench/calibration_probes.py --probe wild --size 300x30x8 \
        --panels 40 --scenarios null date-known market date-leak stock-strong stock-weak stock-0.02 --workers 2 \
        --out bench/results/calibration-300x30x8-wild-tune-local.jsonl.gz                    # R 200, 577 s
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python bench/calibration_probes.py --probe wild --wild-fit strata \
        --size 300x30x8 --panels 40 --scenarios null date-leak stock-weak stock-0.02 stock-strong date-known market \
        --workers 1 --minutes 14 --out bench/results/calibration-300x30x8-wild-strata-tune-local.jsonl.gz  # 679 s
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python bench/calibration_probes.py --probe wild --chunk 50 \
        --size 100x30x128 --panels 30 --resamples 100 --scenarios null date-leak stock-strong stock-weak \
        --workers 1 --minutes 20 --out bench/results/calibration-100x30x128-wild-r100-tune-local.jsonl.gz
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python bench/calibration.py --size 100x30x128 --panels 30 \
        --scenarios null --schemes two-way --workers 1 --minutes 19 \
        --out bench/results/calibration-100x30x128-two-way-null-tune-local.jsonl.gz         # the default, R 200, 824 s
    python bench/calibration.py --summarise bench/results/calibration-300x30x8-wild-tune-local.jsonl.gz --split tune

(Before 2026-12-06 the workers, forked after numpy is imported, ran several BLAS threads each without
OPENBLAS_NUM_THREADS=1 in the environment, 5-10 x slower on 2 cores; they now limit BLAS to one thread themselves
(threadpoolctl), with records bit-identical either way.) The default's records on the same seeds: calibration-300x30x8-two-way-pd4-
tune40-local.jsonl (seeds 0-39, R 200), calibration-100x30x128-two-way-tune-local.jsonl.gz (seeds 0-49, R 200) and
the null run above. Results (2026-12-05, tuning seeds; coverage of the cell's mean point premium / median width ÷
3.92 sd across panels / share of intervals excluding 0; wild | wild strata | default two-way):

    300x30x8 (40 panels)  wild                  wild, strata          default
    null                  98 % / 1.25 / 2 %     98 % / 1.30 / 2 %     100 % / 2.23 / 0 %
    date-known            95 % / 0.94 / 8 %     92 % / 0.98 / 8 %     100 % / 1.73 / 0 %
    market                98 % / 1.28 / 2 %     98 % / 1.30 / 2 %     100 % / 2.05 / 0 %
    date-leak             98 % / 1.31 / 8 %     100 % / 1.94 / 2 %    100 % / 2.23 / 0 %
    stock-strong          100 % / 1.02 / 100 %  95 % / 0.93 / 100 %   95 % / 1.05 / 100 %
    stock-weak            88 % / 0.71 / 100 %   98 % / 1.00 / 100 %   95 % / 1.06 / 100 %
    stock-0.02            70 % / 0.49 / 100 %   85 % / 0.71 / 100 %   95 % / 0.93 / 98 %

    100x30x128 (30 panels, wild R 100, default R 200; seeds 0-29)
    null                  100 % / 1.78 / 0 %    100 % / 1.82 / 3 %    100 % / 3.28 / 0 %
    date-leak             60 % / 0.50 / 83 %    87 % / 0.83 / 63 %    90 % / 1.12 / 47 %
    stock-strong          83 % / 0.57 / 100 %   73 % / 0.44 / 100 %   93 % / 1.04 / 93 %
    stock-weak            47 % / 0.41 / 70 %    40 % / 0.37 / 70 %    93 % / 0.84 / 30 %

(the 128-dimension strata run: the third command with ``--wild-fit strata --minutes 14 --out
bench/results/calibration-100x30x128-wild-strata-r100-tune-local.jsonl.gz``, 795 s; the pooled one 1016 s.)

Reading: the wild draws narrow the 300 × 30 × 8 nulls from 1.7-2.2 x to 0.94-1.28 x at 95-98 % coverage, but not
to ≤ 1.2 x in null and market, and not at 128 dimensions (1.8 x). They are inference given X with the premium's
signal carried by ŷ, and ŷ carries little of it: at the leakage-on penalty the pooled in-sample fit misses a
relation present on the test dates only, so the stock look-ahead replicates average 0.001-0.007 against a point
of 0.017-0.117 at 300 × 30 × 8 (a null-like spread: stock-0.02 covers 70 %, stock-weak 88 %); fitting ŷ per date
stratum puts it back there (0.101 against 0.117; stock-weak 98 %, stock-strong 95 %, stock-0.02 still 85 %), but
at 128 dimensions the penalty (~5e3-1e4) shrinks ŷ's leak away in either fit (replicates 0.001-0.004 against
0.012-0.042: stock-weak 40-47 %, stock-strong 73-83 %). The 128-dimension under-coverage is not fixed, it is made
worse. Rejected as a replacement of the default. Tables: bench/results/calibration-wild-tune-summary.md.

``--probe bca`` (2026-12-05): every record keeps its two-way replicates (``calibration.KEEP_REPS``), so that
calibration.py's ``two-way-bca`` candidate (:func:`calibration.bca_two_way`: Efron's BCa on the dominating half,
the acceleration from that dimension's jackknife, ``security-jack`` or ``date-jack``) can be read from them:

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python bench/calibration_probes.py --probe bca --size 300x30x8 \\
        --panels 40 --scenarios null date-known market date-leak stock-strong stock-weak stock-0.02 \\
        --schemes two-way security-jack date-jack --workers 2 \\
        --out bench/results/calibration-300x30x8-bca-tune-local.jsonl.gz                     # 142 s
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python bench/calibration_probes.py --probe bca --size 100x30x128 \\
        --panels 30 --scenarios date-leak stock-weak stock-strong null --schemes two-way security-jack date-jack \\
        --workers 2 --out bench/results/calibration-100x30x128-bca-tune-local.jsonl.gz      # 1,319 s
    python bench/calibration.py --summarise bench/results/calibration-300x30x8-bca-tune-local.jsonl.gz \\
        --split tune --pivot two-way two-way-bca

Results: bench/RESULTS.md, "Interval study", "BCa and half-sampling".
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pitlab.evaluator.selection as selection  # noqa: E402
from pitlab.evaluator.linalg import to_numpy  # noqa: E402
from pitlab.evaluator.ridge import path_test_sse, ridge_paths  # noqa: E402


def one_se_scored(inner_train, inner_test, alphas, backend, B: int, k: int, m, targets: int = 1):
    """:func:`pitlab.evaluator.selection._scored` (numpy path: the whole grid from one eigendecomposition per
    inner set) with the one-standard-error rule: grid positions int64 [B] (lists of ``targets``) and the pooled
    SSE [B, A]. Raises ``ValueError`` on the GPU's Cholesky path (not probed)."""
    if backend is not None and backend.cholesky_path:
        raise ValueError("calibration_probes.py --probe one-se: CPU path only (--device cpu)")
    d = inner_train.d - targets + 1
    trains = [inner_train.target(t, d) for t in range(targets)] if targets > 1 else [inner_train]
    tests = [inner_test.target(t, d) for t in range(targets)] if targets > 1 else [inner_test]
    a = np.asarray(alphas, dtype=np.float64)
    ks, cvs = [], []
    for p, te in zip(ridge_paths(trains, a), tests):
        per_fold = to_numpy(path_test_sse(p, te).reshape(B, k, -1))  # [B, k, A]
        cv = per_fold.sum(axis=1)
        best = selection.argmin_ties_largest(cv)
        se = np.sqrt(k) * per_fold[np.arange(B), :, best].std(axis=1, ddof=1)
        within = cv <= (cv[np.arange(B), best] + se)[:, None]
        ks.append((a.size - 1 - np.argmax(within[:, ::-1], axis=1)).astype(np.int64))  # the largest such α
        cvs.append(cv)
    return (ks, cvs) if targets > 1 else (ks[0], cvs[0])


def shrink_weights(tau: float) -> None:
    """Install the shrunk two-way weights (``calibration.draws``) and the 1/τ rescaling of every replicate's R²
    deviations (``pitlab.evaluator.bootstrap.bootstrap_model``, as calibration.py imports it at call time)."""
    import dataclasses

    import calibration
    import pitlab.evaluator.bootstrap as bootstrap

    draws, fit = calibration.draws, bootstrap.bootstrap_model

    def shrunk_draws(*args):
        out = draws(*args)
        out["two-way"] = 1.0 + tau * (out["two-way"] - 1.0)
        return out

    def rescaled(*args, **kwargs):
        r = fit(*args, **kwargs)

        def scale(v):
            return None if v is None else np.nanmean(v) + (v - np.nanmean(v)) / tau

        return dataclasses.replace(r, r2_off=scale(r.r2_off), r2_on=scale(r.r2_on), r2_on_rows=scale(r.r2_on_rows))

    calibration.draws, bootstrap.bootstrap_model = shrunk_draws, rescaled


def m_out_of_n_weights(n: int, m: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Multiplicities int64 [resamples, n] of ``m`` draws with replacement from ``n`` clusters per replicate."""
    picks = rng.integers(0, n, size=(resamples, m)) + n * np.arange(resamples)[:, None]
    return np.bincount(picks.ravel(), minlength=resamples * n).reshape(resamples, n).astype(np.int64)


def m_out_of_n(fraction: float, scale: float) -> None:
    """Install m-out-of-n two-way draws (``calibration.draws``: securities, or dates within each stratum, drawn
    ``fraction`` as many times as there are) and the rescaling of every replicate's R² deviations by ``scale``
    (``pitlab.evaluator.bootstrap.bootstrap_model``): sqrt(fraction) for a statistic converging at rate sqrt(n),
    fraction at rate n."""
    import dataclasses

    import calibration
    import pitlab.evaluator.bootstrap as bootstrap

    draws, fit = calibration.draws, bootstrap.bootstrap_model

    def moon_draws(S, T, R, seed, sec, date):
        out = draws(S, T, R, seed, sec, date)
        n_sec = bootstrap.two_way_split(R)
        rng = np.random.default_rng([seed, 23])
        ws = np.vstack([m_out_of_n_weights(S, max(2, round(fraction * S)), n_sec, rng),
                        np.ones((R - n_sec, S), dtype=np.int64)])
        strata = calibration.strata_of(T)
        wd = np.ones((R, T), dtype=np.int64)
        wd[n_sec:] = 0
        for k in np.unique(strata):
            members = np.flatnonzero(strata == k)
            w = m_out_of_n_weights(members.size, max(1, round(fraction * members.size)), R - n_sec, rng)
            wd[n_sec:, members] = w
        out["two-way"] = bootstrap.row_weights(ws, wd, sec, date)
        return out

    def rescaled(*args, **kwargs):
        r = fit(*args, **kwargs)

        def shrunk(v):
            return None if v is None else np.nanmean(v) + (v - np.nanmean(v)) * scale

        return dataclasses.replace(r, r2_off=shrunk(r.r2_off), r2_on=shrunk(r.r2_on), r2_on_rows=shrunk(r.r2_on_rows))

    calibration.draws, bootstrap.bootstrap_model = moon_draws, rescaled


WILD_STREAM = 29
"""Seed stream of the wild bootstrap's Rademacher weights: ``default_rng([seed, WILD_STREAM])``."""


def rademacher(n_clusters: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Rademacher weights float64 [resamples, n_clusters]: ±1 with probability ½ each, one per cluster."""
    return np.where(rng.random((resamples, n_clusters)) < 0.5, -1.0, 1.0)


def wild_weights(S: int, T: int, R: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The two halves of the wild draws (as ``two-way``'s, :func:`pitlab.evaluator.bootstrap.two_way_split`):
    one Rademacher weight per security float64 [R_s, S] (R_s = ceil(R/2)), then one per date [R − R_s, T]."""
    from pitlab.evaluator.bootstrap import two_way_split

    rng = np.random.default_rng([seed, WILD_STREAM])
    n_sec = two_way_split(R)
    return rademacher(S, n_sec, rng), rademacher(T, R - n_sec, rng)


def wild_targets(y: np.ndarray, resid: np.ndarray, clusters: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Wild targets float64 [B, n]: ``y* = ŷ + w[cluster]·ê`` written ``y + (w[cluster] − 1)·ê`` (ê = y − ŷ), so
    that a weight of +1 gives back y bit for bit. ``clusters`` int [n] each row's cluster, ``w`` [B, G]."""
    y, resid = np.asarray(y, dtype=np.float64), np.asarray(resid, dtype=np.float64)
    return y[None, :] + (np.asarray(w, dtype=np.float64)[:, clusters] - 1.0) * resid[None, :]


def ridge_fitted(X: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    """In-sample fitted values float64 [n] of ridge with an unpenalised intercept on all rows at ``alpha``
    (X and y centred, as the estimator fits: :func:`pitlab.evaluator.estimates.center`)."""
    from pitlab.evaluator.estimates import center

    Xc, yc, mu = center(X, y)
    beta = np.linalg.solve(Xc.T @ Xc + alpha * np.eye(Xc.shape[1]), Xc.T @ yc)
    return mu + Xc @ beta


def premia(X: np.ndarray, Y: np.ndarray, sec, date, train, test, pf, grid, chunk: int = 0) -> np.ndarray:
    """The premium R²(leakage-on, same rows) − R²(leakage-off) of every target column of ``Y`` float [n, B],
    computed as the point estimate does (:func:`pitlab.evaluator.targets.point_estimates`: penalties chosen again,
    the grid widened while a selection ends at an edge), float64 [B].

    ``chunk`` 0 or 1: one :func:`point_estimates` call per column (the point estimate's own numbers, bit for bit).
    ``chunk`` c > 1: c columns at a time as the targets of one :class:`PanelStats` (pitlab's several-target path:
    X's Gram matrices and every factorisation shared), the grid widened per group of targets that hit the same
    edges (:func:`pitlab.evaluator.targets.widen_grid`, at most ``WIDEN_STEPS`` times), equal to the per-column
    numbers up to rounding."""
    import calibration as C
    from pitlab.evaluator.estimates import PanelStats, leakage_off_r2, leakage_on_r2
    from pitlab.evaluator.targets import WIDEN_STEPS, fold_edges, point_estimates, widen_grid

    Y = np.asarray(Y, dtype=np.float64)
    on_sel, off_sel = C.selections()
    out = np.full(Y.shape[1], np.nan)
    if chunk <= 1:
        for b in range(Y.shape[1]):
            st = PanelStats.build_rows(X, Y[:, b], sec, train, test, positions=date * C.GAP)
            off, on, _, _, _ = point_estimates(st, pf, C.K, list(grid), on_sel, "train_mean", None, off_sel, True)
            out[b] = float(on.r2_rows[0] - off.r2[0])
        return out
    ones = np.ones((1, Y.shape[0]))

    def solve(cols: np.ndarray, g: list, widenings: int) -> None:
        if cols.size == 1:  # one target: the point estimate's own path
            st = PanelStats.build_rows(X, Y[:, cols[0]], sec, train, test, positions=date * C.GAP)
            offs, ons = [leakage_off_r2(st, ones, g, off_sel)], [leakage_on_r2(st, ones, pf, C.K, g, on_sel,
                                                                               score_rows=test)]
        else:
            st = PanelStats.build_rows(X, Y[:, cols], sec, train, test, positions=date * C.GAP)
            offs = leakage_off_r2(st, ones, g, off_sel)
            ons = leakage_on_r2(st, ones, pf, C.K, g, on_sel, score_rows=test)
        again: dict[tuple[bool, bool], list[int]] = {}
        for c, off, on in zip(cols, offs, ons):
            e_off = fold_edges("leakage-off", off.alpha_index, off.df, g)
            e_on = fold_edges("leakage-on", on.alpha_index[0], on.df[0], g)
            lower, upper = e_off[1] or e_on[1], e_off[2] or e_on[2]
            if (lower or upper) and widenings < WIDEN_STEPS:
                again.setdefault((lower, upper), []).append(int(c))
            else:
                out[c] = float(on.r2_rows[0] - off.r2[0])
        for (lower, upper), cs in again.items():
            solve(np.asarray(cs), widen_grid(g, lower, upper), widenings + 1)

    for s in range(0, Y.shape[1], chunk):
        solve(np.arange(s, min(s + chunk, Y.shape[1])), list(grid), 0)
    return out


def wild_one_panel(scenario: str, seed: int, S: int, T: int, d: int, R: int, schemes=(), device: str = "cpu",
                   budget: int = 1 << 30, per_decade: int = 4, chunk: int = 16, fit: str = "on") -> dict:
    """:func:`calibration.one_panel` with the wild cluster bootstrap instead of the pairs draws (module docstring,
    ``--probe wild``): the point estimate, ŷ (ridge on all rows at the leakage-on point estimate's median fold
    penalty), ê = y − ŷ, R wild targets (security half, date half), each one's premium as the point estimate
    computes it, and the two-way rule on them (:class:`pitlab.evaluator.bootstrap.IntervalRule`), stored under
    ``two-way`` (what :func:`calibration.intervals` reads: keep these records in a file of their own) and
    ``wild``."""
    import time

    import calibration as C
    from pitlab.evaluator.bootstrap import two_way_split
    from pitlab.evaluator.estimates import PanelStats
    from pitlab.evaluator.targets import point_estimates

    if device != "cpu":
        raise ValueError("calibration_probes.py --probe wild: CPU path only (--device cpu)")
    t0 = time.perf_counter()
    X, y, sec, date, train, test, pf = C.panel_arrays(scenario, seed, S, T, d)
    st = PanelStats.build_rows(X, y, sec, train, test, positions=date * C.GAP)
    on_sel, off_sel = C.selections()
    grid0 = C.alpha_grid(per_decade)
    off, on, edges, grid, _ = point_estimates(st, pf, C.K, grid0, on_sel, "train_mean", None, off_sel, True)
    point = float(on.r2_rows[0] - off.r2[0])
    a_fit = float(np.asarray(grid)[int(np.median(on.alpha_index[0]))] if fit != "off" else off.alpha[0])
    if fit == "strata":  # one fit per side of the leakage-off split (training dates, embargo, test dates)
        strata = C.strata_of(T)[date]
        resid = np.empty_like(y)
        for h in np.unique(strata):
            rows = strata == h
            resid[rows] = y[rows] - ridge_fitted(X[rows], y[rows], a_fit)
    else:
        resid = y - ridge_fitted(X, y, a_fit)
    ws, wd = wild_weights(S, T, R, seed)
    Ystar = np.vstack([wild_targets(y, resid, sec, ws), wild_targets(y, resid, date, wd)]).T  # [n, R]
    reps = premia(X, Ystar, sec, date, train, test, pf, grid0, chunk)
    iv = {**C.two_way_record(point, reps, R, S, T), "alpha_fit": a_fit}
    n_sec = two_way_split(R)
    for half, v in (("security", reps[:n_sec]), ("date", reps[n_sec:])):  # where the wild replicates centre
        v = v[np.isfinite(v)]
        iv[half]["mean"] = float(v.mean()) if v.size else float("nan")
    return {"scenario": scenario, "seed": seed, "S": S, "T": T, "d": d, "R": R, "premium": point, "device": device,
            "alpha_off": float(off.alpha[0]), "alpha_on": [float(a) for a in np.ravel(on.alpha)],
            "per_decade": per_decade, "search": "staged", "edges": bool(edges["off"][0] or edges["on"][0]),
            "probe": "wild", "wild_fit": fit, "two-way": iv, "wild": iv, "seconds": time.perf_counter() - t0}


def fixed_alpha(alpha: float) -> None:
    """Install the fixed-penalty estimator: the grid is ``[alpha]`` alone for the point estimates and every
    replicate, and the grid is never widened (the one value is always at both edges)."""
    import calibration

    from pitlab.evaluator import targets

    calibration.alpha_grid = lambda per_decade=4: [float(alpha)]
    targets.WIDEN_STEPS = 0


def main(argv: list[str]) -> int:
    """Parse ``--probe`` and ``--tau``, install the probe, run :func:`calibration.main` on the other arguments."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Every other option (--size, --panels, --first-seed, --scenarios, --schemes, "
                                        "--workers, --out, ...) is bench/calibration.py's: see `python "
                                        "bench/calibration.py --help`.")
    ap.add_argument("--probe", required=True, nargs="+",
                    choices=["one-se", "shrunk-weights", "m-out-of-n", "wild", "bca", "fixed-alpha"],
                    help="one probe, or several installed together (e.g. fixed-alpha m-out-of-n)")
    ap.add_argument("--rate", default="sqrt", choices=["sqrt", "n"],
                    help="m-out-of-n: deviations scaled by sqrt(f) (a statistic converging at rate sqrt(n)) or by "
                         "f (rate n: a degenerate statistic, such as the premium where no row carries signal)")
    ap.add_argument("--alpha", type=float, default=1000.0, help="fixed-alpha: the one ridge penalty, > 0")
    ap.add_argument("--tau", type=float, default=0.5, help="shrunk-weights: the weights' scale, 0 < τ < 1")
    ap.add_argument("--fraction", type=float, default=0.5, help="m-out-of-n: m / n, 0 < f < 1")
    ap.add_argument("--chunk", type=int, default=16,
                    help="wild: wild targets per PanelStats (several-target path; 1: one point estimate each)")
    ap.add_argument("--wild-fit", default="on", choices=["on", "off", "strata"],
                    help="wild: ŷ on all rows at the leakage-on point estimate's penalty (median fold; on) or "
                         "leakage-off's (off), or at leakage-on's fitted apart on each date stratum of the split "
                         "(strata)")
    args, rest = ap.parse_known_args(argv)
    for probe in args.probe:
        install(ap, args, probe)
    import calibration

    return calibration.main(rest)


def install(ap, args, probe: str) -> None:
    """Install one ``--probe`` with its options (``ap.error`` on a bad one)."""
    if probe == "fixed-alpha":
        if not args.alpha > 0:
            ap.error(f"--alpha must be positive (got {args.alpha})")
        fixed_alpha(args.alpha)
    elif probe == "bca":
        import calibration

        calibration.KEEP_REPS = True
    elif probe == "wild":
        import functools

        import calibration

        calibration.one_panel = functools.partial(wild_one_panel, chunk=args.chunk, fit=args.wild_fit)
    elif probe == "one-se":
        selection._scored = one_se_scored
    elif probe == "m-out-of-n":
        if not 0 < args.fraction < 1:
            ap.error(f"--fraction must lie in (0, 1) (got {args.fraction})")
        m_out_of_n(args.fraction, args.fraction if args.rate == "n" else np.sqrt(args.fraction))
    else:
        if not 0 < args.tau < 1:
            ap.error(f"--tau must lie in (0, 1) (got {args.tau})")
        shrink_weights(args.tau)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
