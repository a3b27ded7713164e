"""What part of a leakage premium is mechanical: the date-only baseline, the market-neutral target, the excess
premium, and the checks that did nothing (docs/statistics.md, "Decomposing the premium").

* **Date-only baseline**: features that identify the row's date and nothing else (one indicator column per
  panel date), evaluated through the same protocols, penalty selection and bootstrap draws as every model.
  Under leakage-on (GroupKFold by security, all dates on both sides) it learns each date's mean return from
  the other securities of that date; under leakage-off its test dates were never seen. Its premium is what
  knowing the date is worth, with no knowledge of the future at all.
* **Excess premium** of a model: its premium minus the baseline's, paired replicate by replicate.
* **Market-neutral premium**: the premium on the target minus its date's cross-sectional mean (as the JPX
  competition scores returns), which no date feature can predict.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pitlab.evaluator.bootstrap import judge

DATE_ONLY = "date-only baseline"
MIN_TIME_CLUSTERS = 10
"""A protocol side with fewer distinct dates than this has too few time clusters for a date-clustered interval
to be read at face value (MacKinnon & Webb 2017: cluster-robust inference degrades below ~10-20 clusters)."""


MIN_ROWS_PER_DIMENSION = 45
STUDIED_ROWS_PER_DIMENSION = 14.8  # the fewest the interval study ran (300 × 30 × 384: 5,700 rows, 384 dimensions)
"""Leakage-off training rows per embedding dimension below which the two-way interval is outside what the interval
study found covering: 44.5 rows per dimension (300 × 30 × 128) covered stock-level look-ahead in 95.9 % of 73
panels, 15 (300 × 30 × 384) only 88.5-93.0 % of 200 per scenario (bench/RESULTS.md, "Interval study")."""


def date_features(date_codes: np.ndarray, n_dates: int) -> np.ndarray:
    """The date-only baseline's features: float64 [n_rows, n_dates], one indicator column per panel date
    (``date_codes`` int [n_rows] in 0..n_dates-1)."""
    codes = np.asarray(date_codes, dtype=np.int64)
    X = np.zeros((len(codes), int(n_dates)))
    X[np.arange(len(codes)), codes] = 1.0
    return X


def market_neutral(y: np.ndarray, date_codes: np.ndarray) -> np.ndarray:
    """``y`` float [n_rows] minus the mean of ``y`` over the panel rows of the same date (float64 [n_rows])."""
    y = np.asarray(y, dtype=np.float64)
    codes = np.asarray(date_codes, dtype=np.int64)
    n = np.bincount(codes)
    return y - (np.bincount(codes, weights=y) / np.maximum(n, 1))[codes]


def excess(point: float, reps: np.ndarray, base_point: float, base_reps: np.ndarray, confidence: float,
           edges: list[str] | tuple = ()) -> dict:
    """Excess premium ``point - base_point`` with its interval from the paired replicates ``reps - base_reps``
    (float [R], the same draws): :func:`pitlab.evaluator.bootstrap.judge`'s fields plus ``premium``."""
    diff = np.asarray(reps, dtype=np.float64) - np.asarray(base_reps, dtype=np.float64)
    return {"premium": float(point - base_point), **judge(float(point - base_point), diff, confidence, edges)}


def _bracket(ci) -> str:
    """``[lo, hi]`` with signs and four decimals (``n/a`` for a bound that is None or not finite)."""
    def one(v) -> str:
        return f"{v:+.4f}" if v is not None and np.isfinite(v) else "n/a"
    return f"[{one(ci[0])}, {one(ci[1])}]"


def mechanical_sentence(name: str, raw: float, base: float, excess_: dict, neutral: dict) -> str:
    """One sentence: how much of ``name``'s raw premium the date-only baseline explains, and what is left
    (excess over the baseline, ``excess_`` with ``premium``, ``ci``, ``verdict``, and the market-neutral premium,
    ``neutral`` with ``premium``, ``premium_ci``, ``verdict``: each with its interval and verdict)."""
    below = " (below 0: it recognises the date less well than the indicators do)" if excess_["premium"] < 0 else ""
    tail = (f"excess over the baseline {excess_['premium']:+.4f} {_bracket(excess_['ci'])} ({excess_['verdict']})"
            f"{below}, market-neutral premium {neutral['premium']:+.4f} {_bracket(neutral['premium_ci'])} "
            f"({neutral['verdict']}).")
    if not np.isfinite(raw) or raw <= 0:
        return f"{name}: raw premium {raw:+.4f}, nothing for date recognition to explain; {tail}"
    if np.isfinite(base) and base >= raw:
        return (f"{name}: raw premium {raw:+.4f}, all of it mechanical: features that only identify the date "
                f"earn {base:+.4f} under mixed time; {tail}")
    share = max(0.0, base) / raw if np.isfinite(base) else float("nan")
    return (f"{name}: raw premium {raw:+.4f}, of which {100 * share:.0f} % is mechanical (the date-only baseline "
            f"earns {base:+.4f}); {tail}")


def empty_checks(split, extra: dict, embargo_rows: list[dict], dates: np.ndarray,
                 calendar_name: str) -> list[dict]:
    """The protocol checks that did nothing on this panel, each ``{"check", "protocol", "message"}``:

    * the chronological split's embargo of one or more days removed no row (no panel date within
      ``embargoDays`` sessions of the first test date);
    * purged K-fold purged and embargoed no row in a fold;
    * an ``embargoRobustness`` length left the training set unchanged (``embargo_rows``' ``same_as`` key);
    * a protocol side with fewer than :data:`MIN_TIME_CLUSTERS` distinct dates."""
    out = []
    if split.n_embargoed == 0 and split.embargo_days > 0:  # an embargo of 0 days was asked to remove nothing
        out.append({"check": "embargo-removed-nothing", "protocol": "chronological",
                    "message": f"the embargo of {split.embargo_days} trading days ({calendar_name}) removed no "
                               "panel row: no sampled date lies that close to the first test date, so "
                               "leakage-off equals the split without embargo"})
    d = pd.DatetimeIndex(dates)
    for side, mask in (("training", split.train_mask), ("test", split.test_mask)):
        n = int(d[mask].nunique())
        if n < MIN_TIME_CLUSTERS:
            out.append({"check": "few-time-clusters", "protocol": "chronological", "detail": f"{side}: {n} dates",
                        "message": f"the leakage-off {side} side has {n} distinct dates (< {MIN_TIME_CLUSTERS} time "
                                   "clusters): its R² rests on few independent market days"})
    for pname, sp in extra.items():
        if pname == "purged-kfold":
            empty = [k + 1 for k, rm in enumerate(sp.fold_removed) if not rm.any()]
            if empty:
                out.append({"check": "purge-removed-nothing", "protocol": pname,
                            "message": f"purging and embargo removed no row in fold(s) {empty} of "
                                       f"{sp.get_n_splits()}: those folds are plain K-fold over date blocks"})
        small = [k + 1 for k, te in enumerate(sp.fold_test) if d[te].nunique() < MIN_TIME_CLUSTERS]
        if small:
            out.append({"check": "few-time-clusters", "protocol": pname,
                        "detail": f"test fold{'s' if len(small) > 1 else ''} {', '.join(map(str, small))}",
                        "message": f"fold(s) {small} of {sp.get_n_splits()} test fewer than {MIN_TIME_CLUSTERS} "
                                   "distinct dates each"})
    for r in embargo_rows:
        if r.get("same_as") is not None:
            out.append({"check": "embargo-unchanged", "protocol": "chronological",
                        "detail": f"{r['embargo_days']} days = {r['same_as']} days",
                        "message": f"embargoRobustness {r['embargo_days']} trading days leaves the same training "
                                   f"set as {r['same_as']} days: its row repeats that number and tests nothing"})
    return out


def unknown_cutoff_checks(cutoffs: dict) -> list[dict]:
    """One ``{"check": "unknown-cutoff", "protocol", "model", "message"}`` per model whose knowledge cutoff pitlab
    does not know (``cutoffs``: model name → ``datetime.date`` or None; none typed in ``models[].knowledgeCutoff``
    and no pitlab model card in its folder)."""
    return [{"check": "unknown-cutoff", "protocol": "chronological", "model": name,
             "message": f"{name}: no knowledge cutoff is known (none in models[].knowledgeCutoff, no pitlab model "
                        "card in its folder), so its premium cannot show point-in-time training: a pretrained "
                        "model may have read about the test period; give the cutoff its makers state, if any"}
            for name, c in cutoffs.items() if c is None]


def rows_per_dimension_checks(n_train_rows: int, dims: dict[str, int]) -> list[dict]:
    """One ``{"check": "few-rows-per-dimension", "protocol", "model", "message"}`` per model whose embedding has
    fewer than :data:`MIN_ROWS_PER_DIMENSION` leakage-off training rows per dimension (``dims``: model name →
    embedding dimension; ``n_train_rows``: rows of the chronological split's training side)."""
    out = []
    for name, d in dims.items():
        ratio = n_train_rows / d if d else float("inf")
        if ratio < MIN_ROWS_PER_DIMENSION:
            out.append({"check": "few-rows-per-dimension", "protocol": "chronological", "model": name,
                        "message": f"{name}: the leakage-off fit has {n_train_rows} training rows for {d} embedding "
                                   f"dimensions ({ratio:.1f} per dimension, < {MIN_ROWS_PER_DIMENSION}); the interval "
                                   "study found the two-way interval covering at 44.5 rows per dimension and too "
                                   "narrow at 15 (look-ahead premia covered in 88.5-93.0 % of panels instead of "
                                   "95 %), so read this model's intervals as "
                                   + ("somewhat too narrow" if ratio >= STUDIED_ROWS_PER_DIMENSION else
                                      f"too narrow by an unknown amount: {ratio:.1f} rows per dimension is below "
                                      f"the {STUDIED_ROWS_PER_DIMENSION} the study reached")})
    return out


MC_ERRORS = 2.0
"""A two-way verdict is called fragile when ``|point| / half-width`` lies within this many Monte Carlo standard
errors of 1 (the interval's edge at 0)."""


def sd_monte_carlo_error(values: np.ndarray) -> float:
    """Relative Monte Carlo standard error of the sample sd of ``values`` float [n] (n ≥ 4, finite): the delta
    method on Var(s²) = (μ4 − σ⁴ (n − 3)/(n − 1)) / n, so se(s)/s = ½ sqrt((κ − (n − 3)/(n − 1)) / n) with κ the
    sample kurtosis μ4/σ⁴ (1/sqrt(2n) for normal values; e.g. Rao 1973, Linear Statistical Inference, 6a.2).
    Low for heavy tails, whose sample kurtosis is biased low: 0.10 on average for 100 values of t(5) whose sds
    vary by 0.13 (tests/test_evaluator_decompose.py). NaN for fewer than 4 values or no spread."""
    v = np.asarray(values, dtype=np.float64)
    n = v.size
    d = v - v.mean()
    m2 = float((d ** 2).mean())
    if n < 4 or m2 == 0.0:
        return float("nan")
    kurt = float((d ** 4).mean()) / m2 ** 2
    return 0.5 * float(np.sqrt(max(kurt - (n - 3) / (n - 1), 0.0) / n))


def monte_carlo_checks(rule, figures: dict[tuple[str, str], tuple[float, np.ndarray]]) -> list[dict]:
    """One ``{"check": "monte-carlo-verdict", "protocol", "model", "message"}`` per figure whose two-way verdict
    rests on the bootstrap's Monte Carlo error. ``rule``: the run's two-way
    :class:`pitlab.evaluator.bootstrap.IntervalRule`; ``figures``: (model, figure name) → (point estimate, its
    replicates float [R]). Fragile: ``|point| / half-width`` within :data:`MC_ERRORS` relative Monte Carlo errors
    of the dominating half's sd (:func:`sd_monte_carlo_error`) of 1, so other draws could put 0 on the other side."""
    out = []
    for (model, figure), (point, reps) in figures.items():
        sd, _, dim = rule.spread(reps)
        if not (np.isfinite(sd) and sd > 0 and np.isfinite(point)):
            continue
        half_sd = rule.halves(reps)[0 if dim == "security" else 1]
        r = sd_monte_carlo_error(half_sd)
        lo, hi = rule.interval(point, reps)
        ratio = abs(point) / ((hi - lo) / 2)
        if np.isfinite(r) and abs(ratio - 1.0) <= MC_ERRORS * r:
            out.append({"check": "monte-carlo-verdict", "protocol": "chronological", "model": model,
                        "message": f"{model}, {figure}: |{point:+.4f}| is {ratio:.2f} × its interval's half-width "
                                   f"and the {dim} half's sd (from {half_sd.size} replicates) carries a Monte Carlo "
                                   f"error of ±{r:.1%}, so other bootstrap draws could give the other verdict: "
                                   f"raise bootstrap.resamples (now {len(np.asarray(reps))}"
                                   + _resamples_needed(ratio, r, len(np.asarray(reps))) + ")"})
    return out


def _resamples_needed(ratio: float, r: float, resamples: int) -> str:
    """``"; about N would …"``: the resamples at which :data:`MC_ERRORS` errors of the sd (shrinking as
    1/sqrt(replicates)) no longer reach from ``ratio`` to 1, if the sd and the ratio stay as they are, rounded up
    to hundreds; empty when the ratio is 1 to two decimals (no count would settle it)."""
    gap = abs(ratio - 1.0)
    if gap < 0.005:
        return ""
    n = resamples * (MC_ERRORS * r / gap) ** 2
    return f"; about {int(np.ceil(n / 100.0) * 100):,} would settle it if the sd stays as it is"
