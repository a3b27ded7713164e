"""Clustered (by security) bootstrap of the leakage premium, percentile CIs, paired reductions, verdicts.

The draws are made once (:func:`draw_cluster_weights`) and the same weight matrix, and the same per-replicate
GroupKFold assignment (:func:`replicate_folds`), are used for every model, so premiums of two models are paired
replicate by replicate and their difference has a meaningful CI.
Percentile interval: the ((1-c)/2, (1+c)/2) quantiles of the replicate values (numpy's default linear
interpolation), Efron & Tibshirani (1993), *An Introduction to the Bootstrap*, ch. 13.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pitlab.evaluator.estimates import AlphaSelection, PanelStats, leakage_off_r2, leakage_on_r2
from pitlab.evaluator.protocols import security_folds

SIGNIFICANT = "significant"
NOT_SIGNIFICANT = "not significant"


def draw_cluster_weights(n_securities: int, resamples: int, seed: int) -> np.ndarray:
    """Multiplicities of ``resamples`` draws of ``n_securities`` securities with replacement.

    Replicate r draws ``n_securities`` indices with ``numpy.random.default_rng(seed).integers`` (row r of an
    [resamples, n_securities] draw). Returns int64 [resamples, n_securities]; each row sums to n_securities.
    """
    if n_securities < 1 or resamples < 1:
        raise ValueError(f"need n_securities >= 1 and resamples >= 1 (got {n_securities}, {resamples})")
    draws = np.random.default_rng(seed).integers(0, n_securities, size=(resamples, n_securities))
    flat = (draws + n_securities * np.arange(resamples)[:, None]).ravel()
    return np.bincount(flat, minlength=resamples * n_securities).reshape(resamples, n_securities).astype(np.int64)


def replicate_folds(rows_per_security: np.ndarray, weights: np.ndarray, n_splits: int) -> np.ndarray:
    """GroupKFold fold of every security in every replicate: int64 [resamples, n_securities] (-1 = not drawn).
    Row r is :func:`security_folds` with multiplicities ``weights[r]``."""
    return np.stack([security_folds(rows_per_security, n_splits, w) for w in np.asarray(weights)])


def percentile_ci(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """Percentile interval of the finite ``values`` at ``confidence`` (e.g. 0.95 → 2.5% and 97.5% quantiles).
    Returns (nan, nan) when no value is finite."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    q = round(50 * (1 - confidence), 12)  # 0.95 → 2.5 exactly, not 2.4999999999999996
    lo, hi = np.percentile(v, [q, 100 - q])
    return float(lo), float(hi)


def bootstrap_p_value(values: np.ndarray) -> float:
    """Two-sided bootstrap p-value of H0: "the statistic is 0", from its replicates (finite ones only).

    ``p = min(1, 2·min(#{v ≤ 0} + 1, #{v ≥ 0} + 1) / (R + 1))``: twice the smaller tail mass of the replicate
    distribution at 0, with the +1 correction that keeps a Monte Carlo p-value valid (Davison & Hinkley 1997,
    *Bootstrap Methods and their Application*, eq. 4.11). It inverts the percentile interval: p < 1 − c
    (up to the ±1 correction) exactly when the c-percentile interval excludes 0. NaN when no replicate is finite.
    """
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan")
    lo, hi = int((v <= 0).sum()), int((v >= 0).sum())
    return float(min(1.0, 2.0 * (min(lo, hi) + 1) / (v.size + 1)))


def verdict(ci: tuple[float, float]) -> str:
    """"significant" only when the interval excludes 0 (both ends finite and of one sign), else "not significant"."""
    lo, hi = ci
    return SIGNIFICANT if np.isfinite(lo) and np.isfinite(hi) and (lo > 0 or hi < 0) else NOT_SIGNIFICANT


@dataclass(frozen=True)
class PremiumReplicates:
    """Bootstrap replicates of one model, float64 [resamples] each (NaN where a replicate is undefined)."""

    r2_off: np.ndarray
    r2_on: np.ndarray

    @property
    def premium(self) -> np.ndarray:
        """r2_on - r2_off per replicate."""
        return self.r2_on - self.r2_off


def bootstrap_model(stats: PanelStats, weights: np.ndarray, folds: np.ndarray, n_splits: int,
                    alphas, selection: AlphaSelection = AlphaSelection(),
                    benchmark: str = "train_mean", fixed_alpha_index: tuple | None = None) -> PremiumReplicates:
    """leakage-off and leakage-on R² of one model in every replicate of the shared draws.

    ``weights`` int [R, S] from :func:`draw_cluster_weights`, ``folds`` int [R, S] from
    :func:`replicate_folds`; both must be the same objects for every model of an evaluation. ``selection``:
    how the ridge penalty is chosen in every replicate's fits (``bootstrap.reselectPenalty: true``, the
    default). ``fixed_alpha_index``: ``(off, on)`` grid positions chosen by the point estimate, int [1] and
    [1, K] (``reselectPenalty: false``): every replicate then refits at the point estimate's penalty of the
    same protocol and fold, and the interval is conditional on those penalties (see the README).
    """
    R = np.asarray(weights).shape[0]
    fix_off = fix_on = None
    if fixed_alpha_index is not None:
        fix_off = np.repeat(np.asarray(fixed_alpha_index[0]).reshape(1), R, axis=0)
        fix_on = np.repeat(np.asarray(fixed_alpha_index[1]).reshape(1, -1), R, axis=0)
    off = leakage_off_r2(stats, weights, alphas, selection, benchmark, fix_off, diagnostics=False)
    on = leakage_on_r2(stats, weights, folds, n_splits, alphas, selection, benchmark, fix_on, diagnostics=False)
    return PremiumReplicates(r2_off=off.r2, r2_on=on.r2)


def paired_reductions(names: list[str], points: dict[str, float], replicates: dict[str, np.ndarray],
                      confidence: float) -> list[dict]:
    """Premium reduction for every ordered pair (i listed before j): premium_i - premium_j.

    ``points``: point-estimate premium per model; ``replicates``: premium per replicate (float [R], same
    draws). Returns one dict per pair: ``model_a``, ``model_b``, ``reduction`` (point estimate of
    premium(model_a) - premium(model_b)), ``ci`` [lo, hi], ``p_value`` (:func:`bootstrap_p_value`), ``verdict``, ``n_valid`` (replicates where both
    premiums are finite).
    """
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            diff = replicates[a] - replicates[b]
            ci = percentile_ci(diff, confidence)
            out.append({"model_a": a, "model_b": b, "reduction": points[a] - points[b], "ci": [ci[0], ci[1]],
                        "p_value": bootstrap_p_value(diff), "verdict": verdict(ci),
                        "n_valid": int(np.isfinite(diff).sum())})
    return out


def cutoff_control(names: list[str], cutoffs: dict, points: dict[str, float], replicates: dict[str, np.ndarray],
                   confidence: float) -> dict | None:
    """Control by knowledge cutoff: the premium of each model against its knowledge cutoff.

    ``cutoffs``: model → ``datetime.date`` or None (models without a cutoff are left out); ``points``:
    point-estimate premium; ``replicates``: premium per replicate (float [R], the shared draws). Fits the OLS
    line premium = a + slope · (cutoff in years since the earliest cutoff) to the point estimates and, with the
    same formula, to every replicate (paired over models), giving a percentile CI and p-value for the slope
    (premium units per year); also the difference premium(earliest cutoff) − premium(latest cutoff) with its
    CI. Returns None with fewer than two models with distinct cutoffs.
    """
    have = [n for n in names if cutoffs.get(n) is not None]
    if len({cutoffs[n] for n in have}) < 2:
        return None
    t0 = min(cutoffs[n] for n in have)
    x = np.array([(cutoffs[n] - t0).days / 365.25 for n in have])
    xc = x - x.mean()

    def slope(p: np.ndarray) -> np.ndarray:  # p [..., n_models]
        return (p - p.mean(axis=-1, keepdims=True)) @ xc / (xc @ xc)

    pts = np.array([points[n] for n in have])
    reps = np.stack([replicates[n] for n in have], axis=1)  # [R, n_models]
    first = have[int(np.argmin(x))]
    last = have[int(np.argmax(x))]
    s_reps = slope(reps)
    diff = replicates[first] - replicates[last]
    s_ci, d_ci = percentile_ci(s_reps, confidence), percentile_ci(diff, confidence)
    return {"models": have, "cutoffs": [cutoffs[n].isoformat() for n in have], "cutoff_years": x.tolist(),
            "premiums": pts.tolist(), "slope_per_year": float(slope(pts)), "slope_ci": list(s_ci),
            "slope_p_value": bootstrap_p_value(s_reps), "slope_verdict": verdict(s_ci),
            "earliest": first, "latest": last, "earliest_minus_latest": float(points[first] - points[last]),
            "earliest_minus_latest_ci": list(d_ci), "earliest_minus_latest_p_value": bootstrap_p_value(diff),
            "earliest_minus_latest_verdict": verdict(d_ci)}
