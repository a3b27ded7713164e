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


def m_out_of_n(fraction: float) -> None:
    """Install m-out-of-n two-way draws (``calibration.draws``: securities, or dates within each stratum, drawn
    ``fraction`` as many times as there are) and the sqrt(fraction) rescaling of every replicate's R² deviations
    (``pitlab.evaluator.bootstrap.bootstrap_model``)."""
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

        def scale(v):
            return None if v is None else np.nanmean(v) + (v - np.nanmean(v)) * np.sqrt(fraction)

        return dataclasses.replace(r, r2_off=scale(r.r2_off), r2_on=scale(r.r2_on), r2_on_rows=scale(r.r2_on_rows))

    calibration.draws, bootstrap.bootstrap_model = moon_draws, rescaled


def main(argv: list[str]) -> int:
    """Parse ``--probe`` and ``--tau``, install the probe, run :func:`calibration.main` on the other arguments."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe", required=True, choices=["one-se", "shrunk-weights", "m-out-of-n"])
    ap.add_argument("--tau", type=float, default=0.5, help="shrunk-weights: the weights' scale, 0 < τ < 1")
    ap.add_argument("--fraction", type=float, default=0.5, help="m-out-of-n: m / n, 0 < f < 1")
    args, rest = ap.parse_known_args(argv)
    if args.probe == "one-se":
        selection._scored = one_se_scored
    elif args.probe == "m-out-of-n":
        if not 0 < args.fraction < 1:
            ap.error(f"--fraction must lie in (0, 1) (got {args.fraction})")
        m_out_of_n(args.fraction)
    else:
        if not 0 < args.tau < 1:
            ap.error(f"--tau must lie in (0, 1) (got {args.tau})")
        shrink_weights(args.tau)
    import calibration

    return calibration.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
