"""Clustered bootstrap (two-way, by security, by date, or both) of the leakage premium, intervals, bias, paired
reductions, verdicts.

The draws are made once (:func:`draw_weights`) and the same weight matrix, and the same per-replicate
GroupKFold assignment (:func:`replicate_folds`), are used for every model, so premiums of two models are paired
replicate by replicate and their difference has a meaningful CI.
Two-way interval (the default, :class:`IntervalRule`): half the replicates resample securities, half dates
within the leakage-off split's strata; point ± t(G−1) × the larger one-way sd. Percentile interval (the other
``bootstrap.cluster`` settings): the ((1-c)/2, (1+c)/2) quantiles of the replicate values (numpy's default linear
interpolation), Efron & Tibshirani (1993), *An Introduction to the Bootstrap*, ch. 13.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pitlab.evaluator.estimates import AlphaSelection, PanelStats, leakage_off_r2, leakage_on_r2
from pitlab.evaluator.protocols import security_folds_batch

SIGNIFICANT = "significant"
NOT_SIGNIFICANT = "not significant"
UNRELIABLE = "unreliable"
VERDICTS = (SIGNIFICANT, NOT_SIGNIFICANT, UNRELIABLE)
BIAS_LIMIT = 1.0
"""A bootstrap bias (mean of the replicates − point estimate) larger than this many bootstrap sds makes a result
read by a percentile interval unreliable (the two-way rule reports the bias but does not use it). Chosen from
``bench/calibration.py`` (bench/RESULTS.md, issue 16): under date-aware resampling the
percentile intervals of date-driven premia are wide enough that panels with a bias of 0.5–1 sd still covered
the true premium, while a limit of 0.5 sd marked about half of all panels with a real premium unreliable;
beyond 1 sd coverage fell. For a normal statistic whose interval has the right width, a shift of b sd covers
with probability P(|Z + b| < 1.96) (Efron & Tibshirani 1993, sec. 10.6): 83 % at b = 1. docs/statistics.md,
"The estimator in detail", explains the three reasons for ``unreliable``."""


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


DATE_STREAM = 1
"""Date draws come from ``numpy.random.default_rng([seed, DATE_STREAM])``, security draws from
``default_rng(seed)``: ``security-and-date`` draws the same securities as ``security`` and the same dates as
``date`` for one seed, and its two draws are independent."""


def draw_weights(cluster: str, n_securities: int, n_dates: int, resamples: int, seed: int,
                 date_strata: np.ndarray | None = None) -> tuple:
    """Multiplicities of securities and of dates for ``bootstrap.cluster``: (int64 [R, S], int64 [R, T]).

    ``security``: securities drawn by :func:`draw_cluster_weights` (seed), every date once; ``date``: dates drawn
    the same way from the stream ``[seed, DATE_STREAM]``, every security once; ``security-and-date``: both
    (Owen 2007, "The pigeonhole bootstrap", Ann. Appl. Stat. 1(2):386-411; consistency for separately
    exchangeable arrays: Davezies, D'Haultfœuille & Guyonvarch 2021, Ann. Statist. 49(2):845-862). A row's
    weight is the product of its security's and its date's multiplicity (:func:`row_weights`).
    ``two-way``: the first :func:`two_way_split` (resamples) replicates draw securities (every date once), the
    others draw dates within ``date_strata`` (int [T], :func:`draw_date_weights_stratified`; default one
    stratum), every security once. Raises ValueError for another ``cluster`` or fewer than 2 replicates per
    half."""
    if cluster == "two-way":
        n_sec = two_way_split(resamples)
        strata = np.zeros(n_dates, dtype=np.int64) if date_strata is None else np.asarray(date_strata)
        if len(strata) != n_dates:
            raise ValueError(f"date_strata has {len(strata)} entries for {n_dates} dates")
        ws = np.vstack([draw_cluster_weights(n_securities, n_sec, seed),
                        np.ones((resamples - n_sec, n_securities), dtype=np.int64)])
        wd = np.vstack([np.ones((n_sec, n_dates), dtype=np.int64),
                        draw_date_weights_stratified(strata, resamples - n_sec, seed)])
        return ws, wd
    if cluster not in ("security", "date", "security-and-date"):
        raise ValueError(f"bootstrap.cluster must be two-way, security, date or security-and-date (got {cluster!r})")
    ws = draw_cluster_weights(n_securities, resamples, seed) if cluster != "date" else \
        np.ones((resamples, n_securities), dtype=np.int64)
    if cluster == "security":
        return ws, np.ones((resamples, n_dates), dtype=np.int64)
    draws = np.random.default_rng([seed, DATE_STREAM]).integers(0, n_dates, size=(resamples, n_dates))
    flat = (draws + n_dates * np.arange(resamples)[:, None]).ravel()
    wd = np.bincount(flat, minlength=resamples * n_dates).reshape(resamples, n_dates).astype(np.int64)
    return ws, wd


def two_way_split(resamples: int) -> int:
    """Replicates of a ``two-way`` bootstrap that resample securities (the first ones): ceil(resamples / 2); the
    rest resample dates. Raises ValueError when a half would have fewer than 2 replicates."""
    if resamples < 4:
        raise ValueError(f"a two-way bootstrap needs at least 4 resamples (got {resamples})")
    return (resamples + 1) // 2


def draw_date_weights_stratified(strata: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Date multiplicities int64 [resamples, T], dates resampled with replacement *within* each stratum
    (``strata`` int [T], e.g. 0 = leakage-off training dates, 1 = embargo gap, 2 = test dates), so every
    replicate keeps the split's number of dates on each side (a stratified bootstrap, Davison & Hinkley 1997,
    sec. 3.7). Draws come from ``default_rng([seed, DATE_STREAM])`` one stratum after another in code order.
    Raises ValueError for a negative stratum code or ``resamples`` < 1."""
    strata = np.asarray(strata, dtype=np.int64)
    if resamples < 1 or strata.ndim != 1 or (strata.size and strata.min() < 0):
        raise ValueError(f"need resamples >= 1 and non-negative stratum codes (got {resamples}, {strata.min()})")
    T = strata.size
    rng = np.random.default_rng([seed, DATE_STREAM])
    out = np.zeros((resamples, T), dtype=np.int64)
    for k in np.unique(strata):
        members = np.flatnonzero(strata == k)
        picks = members[rng.integers(0, members.size, size=(resamples, members.size))]
        flat = (picks + T * np.arange(resamples)[:, None]).ravel()
        out += np.bincount(flat, minlength=resamples * T).reshape(resamples, T)
    return out


def row_weights(w_security: np.ndarray, w_date: np.ndarray, security: np.ndarray, date: np.ndarray) -> np.ndarray:
    """Weight of every panel row in every replicate, float64 [R, n_rows]: ``w_security[:, security] ·
    w_date[:, date]`` (``security``, ``date`` int codes [n_rows])."""
    return (np.asarray(w_security, dtype=np.float64)[:, security] * np.asarray(w_date, dtype=np.float64)[:, date])


def replicate_row_folds(security: np.ndarray, n_securities: int, weights: np.ndarray, n_splits: int) -> np.ndarray:
    """GroupKFold fold of every row in every replicate when rows are weighted individually: int64 [R, n_rows].

    Securities are the groups (:func:`pitlab.evaluator.protocols.security_folds` on each security's weighted
    row count), so all copies of a security share one fold whatever dates were drawn; a row takes its
    security's fold (-1 for a security without weight)."""
    sec = np.asarray(security, dtype=np.int64)
    W = np.asarray(weights, dtype=np.float64)
    sizes = np.rint(np.stack([np.bincount(sec, weights=w, minlength=n_securities) for w in W])).astype(np.int64)
    return security_folds_batch(sizes, n_splits)[:, sec]


def replicate_folds(rows_per_security: np.ndarray, weights: np.ndarray, n_splits: int) -> np.ndarray:
    """GroupKFold fold of every security in every replicate: int64 [resamples, n_securities] (-1 = not drawn).
    Row r is :func:`security_folds` with multiplicities ``weights[r]`` (computed for all rows at once by
    :func:`pitlab.evaluator.protocols.security_folds_batch`)."""
    return security_folds_batch(np.asarray(rows_per_security, dtype=np.int64)[None, :] * np.asarray(weights),
                                n_splits)


@dataclass(frozen=True)
class IntervalRule:
    """How an interval is read from a bootstrap's replicates.

    ``kind`` ``percentile``: the percentile interval of all replicates (:func:`percentile_ci`). ``two-way``
    (``bootstrap.cluster: two-way``): replicates ``[0, n_security)`` resampled securities and the rest dates
    (stratified by the leakage-off split); with ``v_s``, ``v_d`` their variances (ddof 1) the interval is
    ``point ± t_{G−1} · sqrt(max(v_s, v_d))``, G the cluster count of the dimension with the larger variance
    (``n_securities`` or ``n_dates``): the one-way variance of the dominating dimension, with MacKinnon &
    Webb's (2017, J. Appl. Econometrics 32(2):233-254) t(G − 1) reference for few clusters. Chosen by the
    simulation study bench/calibration.py (bench/RESULTS.md, docs/statistics.md). ``confidence`` as
    ``bootstrap.confidence``."""

    confidence: float = 0.95
    kind: str = "percentile"
    n_security: int = 0
    n_securities: int = 0
    n_dates: int = 0

    def __post_init__(self):
        if self.kind not in ("percentile", "two-way"):
            raise ValueError(f"interval kind must be percentile or two-way (got {self.kind!r})")

    def halves(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The finite security-resampled and date-resampled replicates of ``values`` float [R]."""
        v = np.asarray(values, dtype=np.float64)
        a, b = v[:self.n_security], v[self.n_security:]
        return a[np.isfinite(a)], b[np.isfinite(b)]

    def spread(self, values: np.ndarray) -> tuple[float, int, str]:
        """(sd, G, dimension) of the two-way rule: the larger one-way sd, its cluster count and its name
        (``security`` or ``date``); (nan, 0, "") with fewer than two finite replicates in a half."""
        a, b = self.halves(values)
        if a.size < 2 or b.size < 2:
            return float("nan"), 0, ""
        va, vb = float(a.var(ddof=1)), float(b.var(ddof=1))
        return (va ** 0.5, self.n_securities, "security") if va >= vb else (vb ** 0.5, self.n_dates, "date")

    def interval(self, point: float, values: np.ndarray) -> tuple[float, float]:
        """The interval of ``point`` from its replicates ``values`` float [R] ((nan, nan) when undefined)."""
        if self.kind == "percentile":
            return percentile_ci(values, self.confidence)
        sd, g, _ = self.spread(values)
        if not (np.isfinite(sd) and point is not None and np.isfinite(point)):
            return float("nan"), float("nan")
        from scipy import stats

        half = float(stats.t.ppf(0.5 + self.confidence / 2, max(g - 1, 1))) * sd
        return float(point - half), float(point + half)

    def p_value(self, point: float, values: np.ndarray) -> float:
        """Two-sided p-value of H0 "the statistic is 0": :func:`bootstrap_p_value` (percentile) or
        ``2 · P(t_{G−1} > |point| / sd)`` (two-way; it inverts the interval)."""
        if self.kind == "percentile":
            return bootstrap_p_value(values)
        sd, g, _ = self.spread(values)
        if not (np.isfinite(sd) and point is not None and np.isfinite(point)):
            return float("nan")
        if sd == 0:
            return 1.0 if point == 0 else 0.0
        from scipy import stats

        return float(2 * stats.t.sf(abs(point) / sd, max(g - 1, 1)))

    def bias_sd(self, point: float, values: np.ndarray) -> tuple[float, float]:
        """:func:`bootstrap_bias` of all replicates (percentile), or of the dominating half (two-way)."""
        if self.kind == "percentile":
            return bootstrap_bias(values, point)
        sd, _, dim = self.spread(values)
        if not np.isfinite(sd):
            return float("nan"), float("nan")
        a, b = self.halves(values)
        return bootstrap_bias(a if dim == "security" else b, point)


def as_rule(rule: "IntervalRule | float") -> IntervalRule:
    """``rule`` itself, or the percentile rule at confidence ``rule`` (a float)."""
    return rule if isinstance(rule, IntervalRule) else IntervalRule(confidence=float(rule))


def interval(point: float, values: np.ndarray, rule: "IntervalRule | float") -> list[float]:
    """[lo, hi] of ``point`` from its replicates ``values`` by ``rule`` (a float: percentile at that level)."""
    return list(as_rule(rule).interval(point, values))


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


def bootstrap_bias(values: np.ndarray, point: float) -> tuple[float, float]:
    """Bootstrap bias ``mean(replicates) − point`` and the replicates' sd (ddof=1), over the finite replicates
    (Efron & Tibshirani 1993, eq. 10.2). (nan, nan) with fewer than two finite replicates."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size < 2 or point is None or not np.isfinite(point):
        return float("nan"), float("nan")
    return float(v.mean() - point), float(v.std(ddof=1))


def unreliable_reasons(point: float, ci: tuple[float, float], bias: float, sd: float,
                       edges: list[str] | tuple = (), n_valid: int = 0) -> list[str]:
    """Why an estimate cannot be read as significant or not (empty list: it can): its point estimate lies
    outside its own interval; its bootstrap bias exceeds :data:`BIAS_LIMIT` of the bootstrap sd (or, with
    ``n_valid`` replicates, 2/√n_valid of it when that is larger: the bias estimate's own Monte Carlo error is
    sd/√n_valid, so fewer than 16 replicates cannot flag a bias that noise explains); ``edges``,
    one phrase per penalty selection that ended at an edge of the α grid (e.g. ``"leakage-on fold 3 chose the
    smallest penalty 0.001 of the widened grid"``)."""
    reasons = []
    lo, hi = ci
    if np.isfinite(lo) and np.isfinite(hi) and np.isfinite(point) and not lo <= point <= hi:
        reasons.append(f"point estimate {point:.4g} lies outside its interval [{lo:.4g}, {hi:.4g}]")
    limit = max(BIAS_LIMIT, 2.0 / np.sqrt(n_valid)) if n_valid else BIAS_LIMIT
    if np.isfinite(bias) and np.isfinite(sd) and abs(bias) > limit * sd:
        reasons.append(f"bootstrap bias {bias:+.4g} exceeds {limit:.2f} × the bootstrap sd {sd:.4g}")
    reasons += list(edges)
    return reasons


def judge(point: float, values: np.ndarray, confidence: "IntervalRule | float",
          edges: list[str] | tuple = ()) -> dict:
    """Interval, p-value, bias and verdict of one estimate from its bootstrap replicates ``values`` (float [R]).

    ``confidence``: an :class:`IntervalRule`, or a float = the percentile rule at that level. Returns ``ci``
    [lo, hi], ``p_value``, ``bias`` and ``sd`` (the rule's), ``verdict`` (``unreliable`` when
    :func:`unreliable_reasons` gives a reason, else :func:`verdict` of the interval; the two-way rule does not
    use the bias reason) and ``reasons``."""
    rule = as_rule(confidence)
    ci = rule.interval(point, values)
    bias, sd = rule.bias_sd(point, values)
    n_valid = int(np.isfinite(np.asarray(values, dtype=np.float64)).sum())
    # the bias rule stays with the percentile interval only: under the two-way interval the study
    # (bench/calibration.py, held-out seeds) found flagged panels covering as often as the others
    reasons = unreliable_reasons(point, ci, bias if rule.kind == "percentile" else float("nan"), sd, edges, n_valid)
    return {"ci": [ci[0], ci[1]], "p_value": rule.p_value(point, values), "bias": bias, "sd": sd,
            "verdict": UNRELIABLE if reasons else verdict(ci), "reasons": reasons}


@dataclass(frozen=True)
class PremiumReplicates:
    """Bootstrap replicates of one model, float64 [resamples] each (NaN where a replicate is undefined)."""

    r2_off: np.ndarray
    r2_on: np.ndarray
    r2_on_rows: np.ndarray | None = None

    @property
    def premium(self) -> np.ndarray:
        """r2_on - r2_off per replicate, with r2_on on the leakage-off test rows when computed (same rows)."""
        return (self.r2_on if self.r2_on_rows is None else self.r2_on_rows) - self.r2_off


def bootstrap_model(stats: PanelStats, weights: np.ndarray, folds: np.ndarray, n_splits: int,
                    alphas, selection: AlphaSelection = AlphaSelection(),
                    benchmark: str = "train_mean", fixed_alpha_index: tuple | None = None,
                    time_selection: AlphaSelection | None = None, same_rows: bool = False) -> PremiumReplicates:
    """leakage-off and leakage-on R² of one model in every replicate of the shared draws.

    ``weights`` int [R, S] from :func:`draw_cluster_weights`, ``folds`` int [R, S] from
    :func:`replicate_folds`; both must be the same objects for every model of an evaluation. ``selection``:
    how the ridge penalty is chosen in every replicate's fits (``bootstrap.reselectPenalty: true``, the
    default). ``fixed_alpha_index``: ``(off, on)`` grid positions chosen by the point estimate, int [1] and
    [1, K] (``reselectPenalty: false``): every replicate then refits at the point estimate's penalty of the
    same protocol and fold, and the interval is conditional on those penalties (see docs/statistics.md, "Penalty
    in bootstrap replicates").
    ``time_selection``: the leakage-off selection (default ``selection``; the date-blocked one under
    ``regression.selection: protocol-cv``); ``same_rows``: also leakage-on on the leakage-off test rows.
    With T > 1 targets (:attr:`pitlab.evaluator.estimates.PanelStats.n_targets`, every fit's factorisations
    shared): ``fixed_alpha_index`` a list of T pairs, and a list of T results.
    """
    R = np.asarray(weights).shape[0]
    T = stats.n_targets
    fix_off = fix_on = None
    if fixed_alpha_index is not None:
        pairs = list(fixed_alpha_index) if T > 1 else [fixed_alpha_index]
        fix_off = np.stack([np.repeat(np.asarray(p[0]).reshape(1), R, axis=0) for p in pairs])
        fix_on = np.stack([np.repeat(np.asarray(p[1]).reshape(1, -1), R, axis=0) for p in pairs])
        fix_off, fix_on = (fix_off, fix_on) if T > 1 else (fix_off[0], fix_on[0])
    off = leakage_off_r2(stats, weights, alphas, time_selection or selection, benchmark, fix_off,
                         diagnostics=False)
    on = leakage_on_r2(stats, weights, folds, n_splits, alphas, selection, benchmark, fix_on, diagnostics=False,
                       score_rows=stats.test_mask if same_rows else None)
    out = [PremiumReplicates(r2_off=o.r2, r2_on=n.r2, r2_on_rows=n.r2_rows)
           for o, n in (zip(off, on) if T > 1 else [(off, on)])]
    return out if T > 1 else out[0]


def paired_reductions(names: list[str], points: dict[str, float], replicates: dict[str, np.ndarray],
                      confidence: float, edges: dict[str, list[str]] | None = None) -> list[dict]:
    """Premium reduction for every ordered pair (i listed before j): premium_i - premium_j.

    ``points``: point-estimate premium per model; ``replicates``: premium per replicate (float [R], same
    draws); ``edges``: model → its penalty selections at a grid edge (phrases), inherited by every reduction
    the model enters. Returns one dict per pair: ``model_a``, ``model_b``, ``reduction`` (point estimate of
    premium(model_a) - premium(model_b)), ``ci`` [lo, hi], ``p_value`` (the rule's: t(G−1) under two-way,
    :func:`bootstrap_p_value` for percentile), ``bias``, ``sd``, ``verdict``, ``reasons`` (:func:`judge`),
    ``n_valid`` (replicates where both premiums are finite). ``confidence``: an IntervalRule or a level.
    """
    edges = edges or {}
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            diff = replicates[a] - replicates[b]
            e = [f"{n}: {x}" for n in (a, b) for x in edges.get(n, [])]
            out.append({"model_a": a, "model_b": b, "reduction": points[a] - points[b],
                        **judge(points[a] - points[b], diff, confidence, e), "n_valid": int(np.isfinite(diff).sum())})
    return out


def cutoff_control(names: list[str], cutoffs: dict, points: dict[str, float], replicates: dict[str, np.ndarray],
                   confidence: float) -> dict | None:
    """Control by knowledge cutoff: the premium of each model against its knowledge cutoff.

    ``cutoffs``: model → ``datetime.date`` or None (models without a cutoff are left out); ``points``:
    point-estimate premium; ``replicates``: premium per replicate (float [R], the shared draws). Fits the OLS
    line premium = a + slope · (cutoff in years since the earliest cutoff) to the point estimates and, with the
    same formula, to every replicate (paired over models), giving a CI and p-value for the slope read by
    ``confidence`` (an IntervalRule or a level) (premium units per year); also the difference
    premium(earliest cutoff) − premium(latest cutoff) with its CI. Returns None with fewer than two models with
    distinct cutoffs.
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
    s_pt, d_pt = float(slope(pts)), float(points[first] - points[last])
    s_j, d_j = judge(s_pt, s_reps, confidence), judge(d_pt, diff, confidence)  # confidence: a rule or a level
    return {"models": have, "cutoffs": [cutoffs[n].isoformat() for n in have], "cutoff_years": x.tolist(),
            "premiums": pts.tolist(), "slope_per_year": s_pt, "slope_ci": s_j["ci"],
            "slope_p_value": s_j["p_value"], "slope_bias": s_j["bias"], "slope_verdict": s_j["verdict"],
            "slope_reasons": s_j["reasons"],
            "earliest": first, "latest": last, "earliest_minus_latest": d_pt,
            "earliest_minus_latest_ci": d_j["ci"], "earliest_minus_latest_p_value": d_j["p_value"],
            "earliest_minus_latest_bias": d_j["bias"], "earliest_minus_latest_verdict": d_j["verdict"],
            "earliest_minus_latest_reasons": d_j["reasons"]}
