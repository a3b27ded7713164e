"""Which interval of the same-row leakage premium is calibrated: a simulation study over scenarios and sizes.

Every panel runs pitlab's own estimator (:func:`pitlab.evaluator.targets.point_estimates` and
:func:`pitlab.evaluator.bootstrap.bootstrap_model`, row units, ``regression.selection: protocol-cv``: date blocks
for leakage-off, GroupKFold by security for leakage-on, the penalty chosen again in every replicate on the spec's
default grid of four values per decade unless ``--alphas-per-decade`` says otherwise) on S
securities × T dates (T/3 test dates, the first 2T/3 train leakage-off; dates 10 sessions apart, 5 days of
embargo). Four sets of bootstrap replicates are drawn per panel with the same seed, and every candidate interval
is built from them:

* ``security``: percentile interval, securities resampled (one-way);
* ``date``: percentile interval, dates resampled (one-way);
* ``pigeonhole``: percentile interval, securities and dates resampled independently (pitlab's former default);
* ``cgm``: normal interval with the two-way variance of Cameron, Gelbach & Miller (2011, JBES 29(2):238-249)
  estimated by bootstrap: V = V_security + V_date − V_rows (rows resampled i.i.d.; the row-level variance is
  counted once instead of twice as in the pigeonhole draw), max(V_security, V_date) when V is not larger;
* ``cgm-t``: the same with t(G − 1) quantiles, G = min(S, T) clusters (MacKinnon & Webb 2017);
* ``max-t``: max(V_security, V_date) with t(G − 1) quantiles.
* ``two-way-pct``, ``two-way-basic``, ``two-way-sum-t`` (from records that keep the quantiles of each half of the
  two-way replicates, ``HALF_QUANTILES``): the percentile interval of the dominating half, its basic (reflected)
  interval 2·point − quantiles (Davison & Hinkley 1997, sec. 5.2), and point ± t(G − 1)·sqrt(V_security + V_date).
* ``two-way-held`` (``--schemes two-way-held``): the two-way draws and rule with every replicate refitted at the
  point estimate's penalties instead of choosing its own (``bootstrap.reselectPenalty: false``).
* ``two-way-adaptive`` (from records holding both ``two-way`` and ``two-way-held`` of a panel): the held interval
  when it contains 0, else the reselected one: the penalty reselection's spread is added only where the
  held-penalty interval already sees a premium. Fixed on the tuning seeds 0-49 (2026-12-04), before any held-out
  record of ``two-way-held`` existed.
* ``two-way-strata`` (from every two-way record): the two-way rule with, when the date half dominates, its variance
  scaled by G/(G − 1) and t(G − 1) quantiles, G the smaller of the leakage-off split's training and test date
  counts (the stratified bootstrap's (G − 1)/G shrinkage of a stratum's variance, Rao & Wu 1988).

Scenarios (``simulate``): ``null`` (X, y independent noise), ``date-known`` (the embedding knows the date, no date
effect), ``market`` (date effects in y, the embedding knows nothing), ``date-leak`` (date effects and an
embedding that knows the date: the mechanical premium), ``stock-strong`` / ``stock-weak`` (the embedding carries
each row's own idiosyncratic return on the test dates only: stock-level look-ahead that leakage-on can learn and
leakage-off cannot), ``stock-weak-neutral`` (the same plus date effects, scored on the market-neutral target),
``concentrated`` (the look-ahead in 10 % of the securities only). The true premium of a cell is the mean point
estimate over its panels. Thresholds, fixed before any result was seen (issue 28): coverage 93-97 %, false
positives ≤ 5 % where the true premium is 0 (null, date-known, market), median width ≤ 1.2 × 3.92 × the sd of
the point estimate across panels, power ≥ 80 % for the stock-level premium of about 0.02 at 300 × 30.
Seeds: panels with seed < --tune-seeds choose among candidates; the rest (held out) are reported as the result.

  python bench/calibration.py --size 300x30x8 --panels 200 --out bench/results/calibration-300x30x8.jsonl.gz
  python bench/calibration.py --summarise bench/results/calibration-*.jsonl* --markdown
  python bench/calibration.py --summarise bench/results/calibration-300x30x8{,-strat,-jack}.jsonl.gz --split tune \
      --pivot security pigeonhole cgm date-strat cgm-strat max-strat-t max-jack-t

Records are JSON lines (one per panel: size, scenario, seed, point premium, each replicate set's mean and sd, each
candidate's interval); a run resumes from what its --out already holds. --workers processes, one BLAS thread each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's pitlab before an installed one

import numpy as np

SCENARIOS = ("null", "date-known", "market", "date-leak", "stock-strong", "stock-weak", "stock-weak-neutral",
             "concentrated", "stock-0.02")
ZERO_PREMIUM = ("null", "date-known", "market")
SCHEMES = ("security", "date", "pigeonhole", "rows", "date-strat", "pigeonhole-strat", "date-jack", "two-way",
           "security-jack")
OPTIONAL_SCHEMES = ("two-way-held", "two-way-half")
"""Drawn only when asked (``--schemes``): ``two-way-held``, the two-way draws with every replicate refitted at the
point estimate's penalties (``bootstrap.reselectPenalty: false``), scored by the same rule as ``two-way``;
``two-way-half``, random half-samples instead of the two-way draws (:func:`half_samples`), scored by that rule."""
CANDIDATES = ("two-way", "security", "date", "pigeonhole", "cgm", "cgm-t", "max-t", "date-strat", "pigeonhole-strat",
              "cgm-strat", "security-normal", "max-strat", "max-strat-t", "max-jack", "max-jack-t", "jack2-t",
              "two-way-pct", "two-way-basic", "two-way-sum-t", "two-way-strata", "two-way-held",
              "two-way-adaptive", "two-way-bca", "two-way-half")
JACK_GROUPS = 20
"""Security groups of the delete-a-group jackknife (``security-jack``; Kott 2001, J. Official Statistics 17(4))."""
ALPHAS = [0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0]
STRENGTH = {"stock-strong": 0.5, "stock-weak": 0.33, "stock-weak-neutral": 0.33, "concentrated": 2.0, "stock-0.02": 0.2}
"""Signal of the row's own return in the embedding (sd units of the noise dimension) per look-ahead scenario."""
DATE_SD = 0.5
"""sd of the date effect where there is one (the idiosyncratic noise has sd 1)."""
GAP, EMBARGO, K, INNER = 10, 5, 5, 5


def alpha_grid(per_decade: int = 4) -> list[float]:
    """The study's penalty grid: ``per_decade`` values per decade from 0.1 to 1e5 (1: :data:`ALPHAS`, the former
    default; 4: the spec's default :data:`pitlab.api.leakageeval.DEFAULT_ALPHAS`, six significant digits)."""
    if per_decade == 4:
        from pitlab.api.leakageeval import DEFAULT_ALPHAS

        return list(DEFAULT_ALPHAS)
    return list(np.logspace(-1, 5, 6 * per_decade + 1)) if per_decade > 1 else list(ALPHAS)


def simulate(scenario: str, S: int, T: int, d: int, seed: int):
    """One balanced panel: X float64 [S·T, d], y [S·T], security and date codes int [S·T] (date-major), and
    whether the premium is scored on the market-neutral target."""
    rng = np.random.default_rng([seed, SCENARIOS.index(scenario), S, T, d])
    sec, date = np.tile(np.arange(S), T), np.repeat(np.arange(T), S)
    X, eps = rng.standard_normal((S * T, d)), rng.standard_normal(S * T)
    y = eps.copy()
    if scenario in ("market", "date-leak", "stock-weak-neutral"):
        y += DATE_SD * rng.standard_normal(T)[date]
    if scenario in ("date-known", "date-leak"):
        X += rng.standard_normal((T, d))[date]
    if scenario in STRENGTH:
        test = date >= (2 * T) // 3
        if scenario == "concentrated":
            test &= np.isin(sec, rng.choice(S, max(1, S // 10), replace=False))
        X[:, 0] += STRENGTH[scenario] * eps * test
    return X, y, sec, date, scenario == "stock-weak-neutral"


def draws(S: int, T: int, R: int, seed: int, sec: np.ndarray, date: np.ndarray) -> dict[str, np.ndarray]:
    """Row weights [R, S·T] of each resampling scheme, one seed (pitlab's own security and date draws)."""
    from pitlab.evaluator.bootstrap import draw_weights, row_weights

    ws, wd = draw_weights("security-and-date", S, T, R, seed)
    n = S * T
    rows = np.random.default_rng([seed, 7]).integers(0, n, size=(R, n))
    wr = np.stack([np.bincount(r, minlength=n) for r in rows]).astype(np.float64)
    ones_s, ones_d = np.ones_like(ws), np.ones_like(wd)
    wdst = stratified_dates(T, R, seed)
    return {"security": row_weights(ws, ones_d, sec, date), "date": row_weights(ones_s, wd, sec, date),
            "pigeonhole": row_weights(ws, wd, sec, date), "rows": wr,
            "date-strat": row_weights(ones_s, wdst, sec, date), "pigeonhole-strat": row_weights(ws, wdst, sec, date),
            "date-jack": (date[None, :] != np.arange(T)[:, None]).astype(np.float64),
            "security-jack": (security_groups(S, seed)[sec][None, :] != np.arange(JACK_GROUPS)[:, None]).astype(
                np.float64),
            "two-way": row_weights(*draw_weights("two-way", S, T, R, seed, strata_of(T)), sec, date)}


def security_groups(S: int, seed: int) -> np.ndarray:
    """The delete-a-group jackknife's group of every security int [S]: a seeded random split into
    :data:`JACK_GROUPS` groups of equal size (±1)."""
    return np.random.default_rng([seed, 11]).permutation(S) % JACK_GROUPS


def strata_of(T: int) -> np.ndarray:
    """The leakage-off split's date strata of a simulated panel (pitlab's :func:`date_strata`): 0 training
    dates, 1 the embargo date, 2 test."""
    from pitlab.evaluator.run import date_strata

    d = np.arange(T)
    return date_strata(d, T, d < (2 * T) // 3 - 1, d >= (2 * T) // 3)


def stratified_dates(T: int, R: int, seed: int) -> np.ndarray:
    """Date multiplicities int [R, T] resampled within the leakage-off training dates, the embargo date and the
    test dates separately (the split's sizes held fixed), pitlab's stratified draw."""
    from pitlab.evaluator.bootstrap import draw_date_weights_stratified

    return draw_date_weights_stratified(strata_of(T), R, seed)


def half_samples(S: int, T: int, R: int, seed: int, sec: np.ndarray, date: np.ndarray) -> np.ndarray:
    """Row weights float [R, S·T] of random half-samples: the first ceil(R/2) replicates keep ⌊S/2⌋ securities
    drawn without replacement at weight S/⌊S/2⌋, the others keep m_k of the n_k dates of each of the split's date
    strata at weight n_k/m_k, m_k = n_k/2, for odd n_k ⌊n_k/2⌋ or ⌈n_k/2⌉ with probability 1/2 each (a stratum of
    one date keeps it). For a mean the variance of such half-sample estimates equals the full sample's (the
    finite-population factor r/(n − r) is 1 at r = n/2: the delete-d jackknife with d = n/2, Shao & Wu 1989, Ann.
    Statist. 17(3):1176-1197; McCarthy 1969's half-sampling), and no cluster is repeated."""
    rng = np.random.default_rng([seed, 13])
    n_sec = (R + 1) // 2
    ws, wd = np.ones((R, S)), np.ones((R, T))
    for r in range(n_sec):
        keep = rng.permutation(S)[:S // 2]
        ws[r] = 0.0
        ws[r, keep] = S / (S // 2)
    strata = strata_of(T)
    groups = [np.flatnonzero(strata == h) for h in np.unique(strata)]
    for r in range(n_sec, R):
        for idx in groups:
            if idx.size < 2:
                continue
            m = idx.size // 2 + (int(rng.integers(0, 2)) if idx.size % 2 else 0)
            keep = rng.permutation(idx)[:m]
            wd[r, idx] = 0.0
            wd[r, keep] = idx.size / m
    return ws[:, sec] * wd[:, date]


def panel_arrays(scenario: str, seed: int, S: int, T: int, d: int) -> tuple:
    """One simulated panel (:func:`simulate`; the market-neutral target where the scenario scores it) as arrays:
    ``(X, y, sec, date, train, test, point_folds)``: the leakage-off split's masks (the first 2T/3 dates less one
    embargo date train, the last T/3 test) and the point estimate's GroupKFold of every row int [1, S·T]."""
    from pitlab.evaluator.decompose import market_neutral
    from pitlab.evaluator.protocols import security_folds

    X, y, sec, date, neutral = simulate(scenario, S, T, d, seed)
    if neutral:
        y = market_neutral(y, date)
    train, test = date < (2 * T) // 3 - 1, date >= (2 * T) // 3  # one date before the test block: the embargo
    return X, y, sec, date, train, test, security_folds(np.full(S, T), K)[sec][None, :]


def selections() -> tuple:
    """The study's penalty selections ``(on_sel, off_sel)``: security-cv for leakage-on, date blocks purged by
    :data:`EMBARGO` for leakage-off, :data:`INNER` inner folds each."""
    from pitlab.evaluator.estimates import AlphaSelection

    return AlphaSelection("security-cv", INNER), AlphaSelection("date-blocked", INNER, embargo_days=EMBARGO)


def panel_stats(scenario: str, seed: int, S: int, T: int, d: int, backend=None) -> tuple:
    """:func:`panel_arrays` ready for pitlab's estimator: ``(stats, sec, date, on_sel, off_sel, point_folds)``, row
    units with calendar positions on ``backend`` (default numpy) and :func:`selections`."""
    from pitlab.evaluator.estimates import PanelStats

    X, y, sec, date, train, test, pf = panel_arrays(scenario, seed, S, T, d)
    st = PanelStats.build_rows(X, y, sec, train, test, backend=backend, positions=date * GAP)
    return (st, sec, date, *selections(), pf)


def two_way_record(point: float, reps: np.ndarray, R: int, S: int, T: int) -> dict:
    """The product's default rule (``two-way``, :class:`pitlab.evaluator.bootstrap.IntervalRule`) on replicates
    ``reps`` float [R] of ``point``: the interval, its sd, dimension, bias and verdict, and each half's sd and
    :data:`HALF_QUANTILES` (for skew-aware candidates offline)."""
    from pitlab.evaluator.bootstrap import IntervalRule, judge, two_way_split

    rule = IntervalRule(0.95, "two-way", two_way_split(R), S, T)
    j = judge(point, reps, rule)
    sd, _, dim = rule.spread(reps)
    rec = {"lo": j["ci"][0], "hi": j["ci"][1], "sd": sd, "dim": dim, "bias": j["bias"],
           "unreliable": j["verdict"] == "unreliable", "n": int(np.isfinite(reps).sum())}
    for half, v in zip(("security", "date"), rule.halves(reps)):
        rec[half] = {"sd": float(v.std(ddof=1)) if v.size > 1 else float("nan"),
                     "q": [float(x) for x in np.quantile(v, HALF_QUANTILES)] if v.size else []}
    return rec


def one_panel(scenario: str, seed: int, S: int, T: int, d: int, R: int, schemes=SCHEMES, device: str = "cpu",
              budget: int = 1 << 30, per_decade: int = 4) -> dict:
    """Point premium and every scheme's replicates of one panel, summarised as the candidates' intervals.
    ``device`` ``cpu`` (the numpy backend) or ``cuda`` (the torch backend, ``budget`` bytes of float64
    temporaries per batch of fits); ``per_decade``: penalty grid values per decade (:func:`alpha_grid`)."""
    from pitlab.evaluator.bootstrap import bootstrap_model, replicate_row_folds
    from pitlab.evaluator.linalg import Backend
    from pitlab.evaluator.targets import point_estimates

    t0 = time.perf_counter()
    backend = Backend() if device == "cpu" else Backend("torch", device, memory_budget_bytes=budget)
    st, sec, date, on_sel, off_sel, pf = panel_stats(scenario, seed, S, T, d, backend)
    off, on, edges, grid, _ = point_estimates(st, pf, K, alpha_grid(per_decade), on_sel, "train_mean", None, off_sel,
                                              True)
    point = float(on.r2_rows[0] - off.r2[0])
    rec = {"scenario": scenario, "seed": seed, "S": S, "T": T, "d": d, "R": R, "premium": point, "device": device,
           "alpha_off": float(off.alpha[0]), "alpha_on": [float(a) for a in np.ravel(on.alpha)],
           "per_decade": per_decade, "search": "staged", "edges": bool(edges["off"][0] or edges["on"][0])}
    sets = draws(S, T, R, seed, sec, date)
    sets["two-way-held"] = sets["two-way"]  # the same draws, refitted at the point estimate's penalties
    if "two-way-half" in schemes:
        sets["two-way-half"] = half_samples(S, T, R, seed, sec, date)
    for name, W in sets.items():
        if name not in schemes:
            continue
        held = (off.alpha_index, on.alpha_index) if name == "two-way-held" else None
        reps = bootstrap_model(st, W, replicate_row_folds(sec, S, W, K), K, grid, on_sel, "train_mean", held,
                               off_sel, same_rows=True).premium
        if name in ("two-way", "two-way-held", "two-way-half"):  # the product's default rule on these draws
            rec[name] = two_way_record(point, reps, R, S, T)
            if KEEP_REPS:  # every replicate, for the BCa candidate (two-way-bca)
                rec[name]["reps"] = [float(x) for x in reps]
            continue
        if name == "date-jack":  # delete-one-date jackknife within the split's strata (Wolter 2007, sec. 4.5)
            strata = strata_of(T)
            vj = 0.0
            for h in np.unique(strata):
                rh = reps[strata == h]
                vj += (rh.size - 1) / rh.size * float(((rh - rh.mean()) ** 2).sum())
            rec[name] = {"var": float(vj), "reps": reps.tolist()}
            continue
        if name == "security-jack":  # delete-a-group jackknife: each replicate leaves one group of securities out
            rec[name] = {"var": (JACK_GROUPS - 1) / JACK_GROUPS * float(((reps - reps.mean()) ** 2).sum()),
                         "groups": JACK_GROUPS, "reps": reps.tolist()}
            continue
        v = reps[np.isfinite(reps)]
        rec[name] = {"mean": float(v.mean()), "sd": float(v.std(ddof=1)), "lo": float(np.percentile(v, 2.5)),
                     "hi": float(np.percentile(v, 97.5)), "n": int(v.size)}
    rec["seconds"] = time.perf_counter() - t0
    return rec


KEEP_REPS = False
"""Store the two-way replicates themselves in each record (``two-way.reps``; calibration_probes.py --probe bca)."""
HALF_QUANTILES = (0.025, 0.05, 0.5, 0.95, 0.975)
"""Quantiles of each half of the two-way replicates kept in a record (``two-way.security.q``, ``two-way.date.q``):
enough for the percentile and basic intervals of the dominating half without storing the replicates."""


def intervals(rec: dict, confidence: float = 0.95) -> dict[str, tuple[float, float]]:
    """Every candidate's interval that one panel record allows (module docstring); a record holding only some
    replicate sets gives only the candidates built from them."""
    from scipy import stats

    p = rec["premium"]
    z = stats.norm.ppf(0.5 + confidence / 2)
    out = {k: (rec[k]["lo"], rec[k]["hi"]) for k in ("security", "date", "pigeonhole", "date-strat", "pigeonhole-strat",
                                                      "two-way", "two-way-held", "two-way-half") if k in rec}
    if "two-way" in out and "two-way-held" in out:
        held = out["two-way-held"]
        out["two-way-adaptive"] = held if held[0] <= 0.0 <= held[1] else out["two-way"]
    tw = rec.get("two-way", {})
    if tw.get("dim") in ("security", "date") and np.isfinite(tw.get("sd", float("nan"))):
        # the date half's variance scaled by G/(G - 1) of the smaller fitted stratum (training or test dates) and
        # t(G - 1) on its G: the stratified bootstrap's variance of a stratum of G clusters is (G - 1)/G times the
        # unbiased one (Rao & Wu 1988, JASA 83(401):231-241); the security half as in "two-way"
        if tw["dim"] == "date":
            st = strata_of(rec["T"])
            g = int(min((st == 0).sum(), (st == 2).sum()))
            sd = tw["sd"] * (g / (g - 1)) ** 0.5
        else:
            g, sd = rec["S"], tw["sd"]
        half = stats.t.ppf(0.5 + confidence / 2, g - 1) * sd
        out["two-way-strata"] = (p - half, p + half)
    if "security" in tw and "date" in tw and confidence == 0.95:  # skew-aware variants of the two-way rule
        dom = tw[tw["dim"]] if tw.get("dim") in ("security", "date") else None
        if dom and len(dom["q"]) == len(HALF_QUANTILES):
            q = dict(zip(HALF_QUANTILES, dom["q"]))
            out["two-way-pct"] = (q[0.025], q[0.975])  # percentile interval of the dominating half
            out["two-way-basic"] = (2 * p - q[0.975], 2 * p - q[0.025])  # basic (reflected) interval
        g = rec["S"] if tw["dim"] == "security" else rec["T"]
        half = stats.t.ppf(0.5 + confidence / 2, g - 1) * (tw["security"]["sd"] ** 2 + tw["date"]["sd"] ** 2) ** 0.5
        out["two-way-sum-t"] = (p - half, p + half)  # both one-way variances added (no row-level term removed)
    if "reps" in tw and "security-jack" in rec and "date-jack" in rec:
        out["two-way-bca"] = bca_two_way(rec, confidence)
    if "security-jack" in rec and "date-jack" in rec:  # two-way jackknife: the larger one-way variance
        vs, vd = rec["security-jack"]["var"], rec["date-jack"]["var"]
        g = rec["security-jack"]["groups"] - 1 if vs >= vd else rec["T"] - len(np.unique(strata_of(rec["T"])))
        tg = stats.t.ppf(0.5 + confidence / 2, g)
        out["jack2-t"] = (p - tg * max(vs, vd) ** 0.5, p + tg * max(vs, vd) ** 0.5)
    if "security" not in rec:
        return out
    vs = rec["security"]["sd"] ** 2
    out["security-normal"] = (p - z * vs ** 0.5, p + z * vs ** 0.5)

    def by_max(name: str, vd: float) -> None:  # the larger one-way variance, z and t(G-1) of its dimension
        g = rec["S"] if vs >= vd else rec["T"]
        tg = stats.t.ppf(0.5 + confidence / 2, g - 1)
        out[name] = (p - z * max(vs, vd) ** 0.5, p + z * max(vs, vd) ** 0.5)
        out[name + "-t"] = (p - tg * max(vs, vd) ** 0.5, p + tg * max(vs, vd) ** 0.5)

    if "date-strat" in rec:
        by_max("max-strat", rec["date-strat"]["sd"] ** 2)
    if "date-jack" in rec:
        by_max("max-jack", rec["date-jack"]["var"])
    if "date" in rec and "rows" in rec:
        t = stats.t.ppf(0.5 + confidence / 2, min(rec["S"], rec["T"]) - 1)
        vd, vr = rec["date"]["sd"] ** 2, rec["rows"]["sd"] ** 2
        v2 = vs + vd - vr
        v2 = v2 if v2 > max(vs, vd) else max(vs, vd)
        out["cgm"] = (p - z * v2 ** 0.5, p + z * v2 ** 0.5)
        out["cgm-t"] = (p - t * v2 ** 0.5, p + t * v2 ** 0.5)
        out["max-t"] = (p - t * max(vs, vd) ** 0.5, p + t * max(vs, vd) ** 0.5)
        if "date-strat" in rec:
            v3 = max(vs + rec["date-strat"]["sd"] ** 2 - vr, vs, rec["date-strat"]["sd"] ** 2)
            out["cgm-strat"] = (p - z * v3 ** 0.5, p + z * v3 ** 0.5)
    return out


def bca(point: float, reps: np.ndarray, jack: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """BCa interval of ``point`` from bootstrap replicates ``reps`` float [B] and jackknife values ``jack`` float
    [n] (Efron 1987, JASA 82(397):171-185; Efron & Tibshirani 1993, ch. 14): bias correction z0 = Φ⁻¹(share of
    replicates below the point, ties counted half), acceleration a = Σ(J̄ − J_i)³ / (6 (Σ(J̄ − J_i)²)^1.5), and the
    replicates' quantiles at Φ(z0 + (z0 + z)/(1 − a (z0 + z))) for z = ±z_{(1+c)/2}. (nan, nan) when the share is
    0 or 1 or a replicate is not finite."""
    from scipy import stats

    reps, jack = np.asarray(reps, dtype=np.float64), np.asarray(jack, dtype=np.float64)
    if not (np.isfinite(reps).all() and np.isfinite(jack).all()):
        return float("nan"), float("nan")
    share = (np.sum(reps < point) + 0.5 * np.sum(reps == point)) / reps.size
    if not 0.0 < share < 1.0:
        return float("nan"), float("nan")
    z0 = stats.norm.ppf(share)
    dev = jack.mean() - jack
    den = 6.0 * float((dev ** 2).sum()) ** 1.5
    a = float((dev ** 3).sum()) / den if den > 0 else 0.0
    ends = []
    for z in (stats.norm.ppf((1 - confidence) / 2), stats.norm.ppf((1 + confidence) / 2)):
        q = stats.norm.cdf(z0 + (z0 + z) / (1.0 - a * (z0 + z)))
        ends.append(float(np.quantile(reps, q)))
    return ends[0], ends[1]


def bca_two_way(rec: dict, confidence: float = 0.95) -> tuple[float, float]:
    """The two-way rule's BCa variant: the dominating half's replicates (the larger one-way variance, as the
    default chooses it) with that dimension's jackknife for the acceleration (``security-jack``, delete-a-group of
    securities; ``date-jack``, delete-one-date)."""
    from pitlab.evaluator.bootstrap import two_way_split

    tw, reps = rec["two-way"], np.asarray(rec["two-way"]["reps"], dtype=np.float64)
    n_sec = two_way_split(reps.size)
    half = reps[:n_sec] if tw.get("dim") == "security" else reps[n_sec:]
    jack = rec["security-jack" if tw.get("dim") == "security" else "date-jack"]["reps"]
    return bca(rec["premium"], half, np.asarray(jack), confidence)


def summarise(records: list[dict], tune_seeds: int) -> list[dict]:
    """One row per (size, scenario, candidate) over the held-out seeds: coverage, rejection rate, width ratio,
    true premium and its sd across panels, minimum detectable premium (2.80 sd: 5 % two-sided, 80 % power)."""
    out = []
    cells: dict = {}
    for r in records:
        cells.setdefault((r["S"], r["T"], r["d"], r.get("per_decade", 1), r["scenario"]), []).append(r)
    for (S, T, d, pd, sc), rs in sorted(cells.items(), key=lambda kv: (kv[0][:4], SCENARIOS.index(kv[0][4]))):
        for split, sub in (("tune", [r for r in rs if r["seed"] < tune_seeds]),
                           ("held-out", [r for r in rs if r["seed"] >= tune_seeds])):
            if len(sub) < 2:
                continue
            pts = np.array([r["premium"] for r in sub])
            truth, spread = float(pts.mean()), float(pts.std(ddof=1))
            ivs = [intervals(r) for r in sub]
            for c in CANDIDATES:
                if not all(c in i for i in ivs):
                    continue
                iv = np.array([i[c] for i in ivs])
                cover = (iv[:, 0] <= truth) & (truth <= iv[:, 1])
                reject = (iv[:, 0] > 0) | (iv[:, 1] < 0)
                width = np.median(iv[:, 1] - iv[:, 0])
                flag = np.array([bool(r[c].get("unreliable", False)) if isinstance(r.get(c), dict) else False
                                 for r in sub])
                size = f"{S}x{T}x{d}" + (f", {pd} α per decade" if pd > 1 else "")
                out.append({"size": size, "scenario": sc, "seeds": split, "candidate": c,
                            "panels": len(sub), "true_premium": truth, "sd_across_panels": spread,
                            "coverage": float(cover.mean()), "rejection": float(reject.mean()),
                            "width_ratio": float(width / (3.92 * spread)) if spread > 0 else float("nan"),
                            "mdp": 2.80 * spread, "seconds_per_panel": float(np.mean([r["seconds"] for r in sub])),
                            "flagged": float(flag.mean()),
                            "flagged_coverage": float(cover[flag].mean()) if flag.any() else float("nan")})
    return out


def passes(row: dict) -> dict[str, bool]:
    """The issue's fixed thresholds, per summary row."""
    ok = {"coverage": 0.93 <= row["coverage"] <= 0.97, "width": row["width_ratio"] <= 1.2}
    if row["scenario"] in ZERO_PREMIUM:
        ok["false_positives"] = row["rejection"] <= 0.05
    if row["scenario"] == "stock-weak" and row["size"].startswith("300x30"):
        ok["power"] = row["rejection"] >= 0.80
    return ok


def markdown(rows: list[dict], split: str = "held-out") -> str:
    """The table of one seed split (``held-out`` or ``tune``), one line per cell and candidate."""
    lines = ["| size | scenario | candidate | panels | true premium | sd across panels | coverage | rejects 0 | "
             "width / (3.92 sd) | min. detectable | unreliable (coverage) | passes |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r["seeds"] != split:
            continue
        ok = passes(r)
        lines.append(f"| {r['size']} | {r['scenario']} | {r['candidate']} | {r['panels']} | {r['true_premium']:+.4f} | "
                     f"{r['sd_across_panels']:.4f} | {100 * r['coverage']:.1f} % | {100 * r['rejection']:.1f} % | "
                     f"{r['width_ratio']:.2f} | {r['mdp']:.4f} | "
                     + (f"{100 * r['flagged']:.1f} % ({100 * r['flagged_coverage']:.0f} %) | " if r['flagged'] > 0 else
                        ("0 % | " if r['candidate'] == "two-way" else "– | "))
                     + f"{'all' if all(ok.values()) else 'fails ' + ', '.join(k for k, v in ok.items() if not v)} |")
    return "\n".join(lines)


def pivot(rows: list[dict], candidates: list[str], split: str) -> str:
    """One line per scenario, one column per candidate: "coverage / width ratio" of one seed split."""
    lines = ["| scenario (panels) | " + " | ".join(candidates) + " |", "|---|" + "---:|" * len(candidates)]
    for sc in SCENARIOS:
        rs = {r["candidate"]: r for r in rows if r["scenario"] == sc and r["seeds"] == split}
        if rs:
            n = next(iter(rs.values()))["panels"]
            cells = [f"{100 * rs[k]['coverage']:.0f} % / {rs[k]['width_ratio']:.2f}" if k in rs else "–"
                     for k in candidates]
            lines.append(f"| {sc} ({n}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def read_records(path: Path) -> list[dict]:
    """The JSON-line records of ``path``, gzip-compressed when its name ends in ``.gz`` (an appended ``.gz`` holds
    several gzip members, which :func:`gzip.open` reads as one stream)."""
    import gzip

    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:
            text = f.read()
    else:
        text = path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def append_record(path: Path | None, rec: dict) -> None:
    """Append one record to ``path`` (stdout when None): a line of its own, and under ``.gz`` a gzip member of its
    own, so that a run stopped at any point leaves a file that reads and resumes."""
    import gzip

    line = json.dumps(rec) + "\n"
    if path is None:
        sys.stdout.write(line)
        sys.stdout.flush()
        return
    with (gzip.open(path, "at") if path.suffix == ".gz" else open(path, "a")) as f:
        f.write(line)


def _work(task):
    from threadpoolctl import threadpool_limits

    # numpy's BLAS started its threads at import, before main() set OPENBLAS_NUM_THREADS: limit them here
    with threadpool_limits(limits=1):
        return one_panel(*task)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] + " Run time: about 1 s per panel and "
                                "scenario at 300x30x8 per worker on a 2-core AMD EPYC VM (280 in 128-144 s with 2 "
                                "workers), 824 s for 30 panels at 100x30x128 with one (bench/RESULTS.md); progress "
                                "goes to stderr about twenty times a run.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--size", default="300x30x8", help="SxTxD: securities, dates, embedding dimension")
    p.add_argument("--panels", type=int, default=200, help="panels per scenario (seeds 0..panels-1)")
    p.add_argument("--first-seed", type=int, default=0, help="seed of the first panel")
    p.add_argument("--resamples", type=int, default=200, help="bootstrap replicates per panel and scheme")
    p.add_argument("--alphas-per-decade", type=int, default=4,
                   help="penalty grid: this many values per decade from 0.1 to 1e5 (4: the spec's default grid; "
                        "1: the former default, one per decade)")
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS, help="scenarios to simulate")
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES + OPTIONAL_SCHEMES,
                   help="replicate sets to draw (a later run may add schemes to the same panels in another file)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (this machine's CPUs)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cpu: the numpy backend, one BLAS thread per worker; cuda: the torch backend, every worker "
                        "on GPU 0 with an equal share of a quarter of its memory for batches of fits")
    p.add_argument("--minutes", type=float, default=None, help="stop submitting new panels after this long")
    p.add_argument("--out", type=Path, default=None, help="JSON lines, appended (resumable; gzip when it ends in .gz)")
    p.add_argument("--summarise", nargs="*", type=Path, default=None, metavar="JSONL",
                   help="summarise these records instead of simulating")
    p.add_argument("--tune-seeds", type=int, default=50, help="seeds below this choose; the rest are held out")
    p.add_argument("--markdown", action="store_true", help="with --summarise: a markdown table")
    p.add_argument("--split", default="held-out", choices=["held-out", "tune"], help="seeds the table shows")
    p.add_argument("--pivot", nargs="+", default=None, metavar="CANDIDATE",
                   help="with --summarise: coverage / width ratio per scenario for these candidates")
    a = p.parse_args(argv)
    if a.summarise is not None:
        merged: dict = {}
        for f in a.summarise:  # files holding other schemes of the same panels are merged by panel
            for r in read_records(f):
                key = (r["S"], r["T"], r["d"], r.get("per_decade", 1), r["scenario"], r["seed"])
                merged.setdefault(key, {}).update(r)
        recs = list(merged.values())
        rows = summarise(recs, a.tune_seeds)
        if a.pivot:
            print(pivot(rows, a.pivot, a.split))
        else:
            print(markdown(rows, a.split) if a.markdown else json.dumps(rows, indent=1))
        return 0
    S, T, d = (int(x) for x in a.size.split("x"))
    done = set()
    if a.out and a.out.exists():
        done = {(r["scenario"], r["seed"]) for r in read_records(a.out) if r["S"] == S
                and r["T"] == T and r["d"] == d and r.get("per_decade", 1) == a.alphas_per_decade}  # none: 1
    budget = 1 << 30
    if a.device == "cuda":
        import torch

        budget = torch.cuda.get_device_properties(0).total_memory // (4 * a.workers)
    tasks = [(sc, s, S, T, d, a.resamples, tuple(a.schemes), a.device, budget,
              a.alphas_per_decade) for s in range(a.first_seed, a.first_seed + a.panels)
             for sc in a.scenarios if (sc, s) not in done]
    t0 = time.perf_counter()
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"
    import multiprocessing

    ctx = multiprocessing.get_context("spawn" if a.device == "cuda" else None)  # CUDA does not survive a fork
    with ProcessPoolExecutor(a.workers, mp_context=ctx) as ex:
        pending, it, n = set(), iter(tasks), 0
        while True:
            while len(pending) < 2 * a.workers and (a.minutes is None or time.perf_counter() - t0 < 60 * a.minutes):
                task = next(it, None)
                if task is None:
                    break
                pending.add(ex.submit(_work, task))
            if not pending:
                break
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                append_record(a.out, f.result())
                n += 1
                if n % max(1, len(tasks) // 20) == 0:  # about twenty progress lines a run
                    print(f"{n}/{len(tasks)} panels, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        print(f"{n} panels in {time.perf_counter() - t0:.0f} s ({len(tasks) - n} not run)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
