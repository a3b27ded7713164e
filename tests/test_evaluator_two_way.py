"""The two-way interval (bootstrap.cluster: two-way), its stratified date draws, and the exact shortcuts of the
row-unit weighted sums (classes of rows weighted alike, indicator rows, inner folds one at a time)."""

import numpy as np
import pytest
from scipy import stats

from pitlab.evaluator import rowstats
from pitlab.evaluator.bootstrap import (IntervalRule, draw_date_weights_stratified, draw_weights, judge,
                                        percentile_ci, row_weights, two_way_split)
from pitlab.evaluator.decompose import date_features
from pitlab.evaluator.estimates import PanelStats
from pitlab.evaluator.selection import _fold_stats
from pitlab.evaluator.ridge import RowStats


def test_stratified_date_draws_keep_every_stratum_size():
    strata = np.array([0] * 7 + [1] + [2] * 4)
    W = draw_date_weights_stratified(strata, 50, seed=3)
    assert W.shape == (50, 12) and W.dtype == np.int64
    for h, size in ((0, 7), (1, 1), (2, 4)):
        assert (W[:, strata == h].sum(axis=1) == size).all()
    assert (W[:, 7] == 1).all()  # a one-date stratum always draws itself
    assert np.array_equal(W, draw_date_weights_stratified(strata, 50, seed=3))
    assert not np.array_equal(W, draw_date_weights_stratified(strata, 50, seed=4))
    assert len({tuple(r) for r in W}) > 40  # the draws differ between replicates


def test_two_way_draws_are_two_one_way_halves():
    strata = np.array([0] * 20 + [1] + [2] * 9)
    ws, wd = draw_weights("two-way", 40, 30, 9, seed=1, date_strata=strata)
    n = two_way_split(9)
    assert n == 5 and ws.shape == (9, 40) and wd.shape == (9, 30)
    assert (wd[:n] == 1).all() and (ws[:n].sum(axis=1) == 40).all() and not (ws[:n] == 1).all()
    assert (ws[n:] == 1).all() and (wd[n:, strata == 2].sum(axis=1) == 9).all()
    with pytest.raises(ValueError, match="at least 4"):
        draw_weights("two-way", 40, 30, 3, seed=1)
    with pytest.raises(ValueError, match="date_strata"):
        draw_weights("two-way", 40, 30, 10, seed=1, date_strata=strata[:5])


def test_two_way_interval_equals_a_direct_computation():
    rng = np.random.default_rng(0)
    sec, dat = rng.normal(0.1, 0.02, 100), rng.normal(0.1, 0.05, 100)
    rule = IntervalRule(0.9, "two-way", 100, n_securities=300, n_dates=30)
    lo, hi = rule.interval(0.12, np.concatenate([sec, dat]))
    half = stats.t.ppf(0.95, 29) * dat.std(ddof=1)  # the date half dominates: G = 30 dates
    assert lo == pytest.approx(0.12 - half, abs=1e-15) and hi == pytest.approx(0.12 + half, abs=1e-15)
    lo, hi = rule.interval(0.12, np.concatenate([dat, sec]))  # now the security half dominates: G = 300
    assert hi - 0.12 == pytest.approx(stats.t.ppf(0.95, 299) * dat.std(ddof=1), abs=1e-15)
    j = judge(0.12, np.concatenate([sec, dat]), rule)
    assert j["sd"] == pytest.approx(dat.std(ddof=1)) and j["bias"] == pytest.approx(dat.mean() - 0.12)
    assert IntervalRule(0.95).interval(0.1, dat) == percentile_ci(dat, 0.95)
    v = np.concatenate([sec, [np.nan, np.nan]])
    assert np.isnan(IntervalRule(0.95, "two-way", 100, 300, 30).interval(0.1, v)).all()  # date half < 2


@pytest.mark.parametrize("seed", range(20))
def test_two_way_p_value_inverts_the_interval(seed):
    rng = np.random.default_rng(seed)
    reps = rng.normal(0, rng.uniform(0.01, 0.05), 60)
    point = float(rng.normal(0, 0.05))
    rule = IntervalRule(0.95, "two-way", 30, 200, 25)
    lo, hi = rule.interval(point, reps)
    assert (rule.p_value(point, reps) < 0.05) == (lo > 0 or hi < 0)


def _panel(S=60, T=30, d=24, seed=0):
    rng = np.random.default_rng(seed)
    date, sec = np.repeat(np.arange(T), S), np.tile(np.arange(S), T)
    return rng.standard_normal((S * T, d)), rng.standard_normal(S * T), sec, date


def _same(a, b, rtol=1e-12):
    for f in ("n", "sx", "sy", "syy", "sxx", "sxy"):
        x, y = getattr(a, f), getattr(b, f)
        assert np.allclose(x, y, rtol=rtol, atol=rtol * max(1.0, np.abs(y).max())), f


@pytest.mark.parametrize("half", ["security", "date"])
def test_rows_weighted_alike_are_summed_once_per_class(half, monkeypatch):
    monkeypatch.setattr(rowstats, "PACKED_ROW_TERMS_BYTES", 0)  # no packed per-row table: the class path or the loop
    X, y, sec, date = _panel(d=200)
    S, T = 60, 30
    rs = RowStats(X, y, np.arange(len(y)), len(y), sec)
    ws, wd = draw_weights("two-way", S, T, 12, seed=5)
    W = row_weights(ws, wd, sec, date)
    W = (W[:6] if half == "security" else W[6:]) * (date < 20)
    classes = rs._weight_classes(W)
    # at most one class per security (dates); two with the same weight in every replicate share one
    assert classes is not None and len(classes[2]) <= (S if half == "security" else 20) < len(classes[0]) / 4
    fast = rs.weighted(W)
    monkeypatch.setattr(rowstats, "CLASS_GRAM_BYTES", 0)  # the per-weighting loop over rows
    assert rs._weight_classes(W) is None
    _same(fast, rs.weighted(W))


def test_label_grams_serve_mixed_batches_with_the_loops_sums(monkeypatch):
    """Security- and date-resampling replicates in one batch, their outer and inner fold masks (date blocks,
    security folds): cached per-label statistics give the per-row loop's sums, and a second batch reuses them."""
    monkeypatch.setattr(rowstats, "PACKED_ROW_TERMS_BYTES", 0)
    X, y, sec, date = _panel(d=200)
    S, T = 60, 30
    rs = RowStats(X, y, np.arange(len(y)), len(y), sec, unit_pos=3 * date)
    ws, wd = draw_weights("two-way", S, T, 12, seed=7)
    W = row_weights(ws, wd, sec, date)
    fold = np.random.default_rng(1).integers(0, 5, S)
    batches = [W,  # fitting sets: per security (first half) or per date (second half)
               W * (date < 20),  # a date block: per date, and per security on the block's rows
               W * (fold[sec] != 2),  # leakage-on: a security fold (date replicates: neither label)
               W[[0, 7, 1]] * ((date >= 5) & (date < 11))]
    fast = [rs.weighted(b) for b in batches]
    got = {(k[0], None if k[1] is None else len(np.frombuffer(k[1], dtype=np.int64)), k[2])
           for k in rs.__dict__["_grams"]}
    n_short = int((batches[3][[0, 2]] != 0).any(axis=0).sum())  # rows of the securities replicates 0, 1 drew
    # every row per security and per date; the block's rows per security (security replicates there);
    # leakage-on's training rows per date (date replicates there); the short block's rows per security
    assert got == {("security", None, S), ("date", None, T), ("security", 20 * S, S),
                   ("date", int((fold != 2).sum()) * T, T), ("security", n_short, n_short // 6)}
    monkeypatch.setattr(rowstats, "CLASS_GRAM_BYTES", 0)  # the per-weighting loop over rows
    slow = RowStats(X, y, np.arange(len(y)), len(y), sec, unit_pos=3 * date)
    for a, b in zip(fast, batches):
        _same(a, slow.weighted(b))


def test_indicator_rows_take_the_shortcut_with_the_same_sums():
    _, y, sec, date = _panel()
    X = date_features(date, 30)
    a = PanelStats.build_rows(X, y, sec, date < 20, date >= 21, positions=date)
    b = PanelStats.build_rows(X, y, sec, date < 20, date >= 21, positions=date, indicators=date)
    W = np.random.default_rng(2).integers(0, 3, size=(5, len(y))).astype(float)
    rows = date < 25
    _same(a.stats_of(rows).weighted(W), b.stats_of(rows).weighted(W))
    with pytest.raises(ValueError, match="indicator matrix"):
        PanelStats.build_rows(X + 0.5, y, sec, date < 20, date >= 21, indicators=date)


def test_inner_folds_summed_one_at_a_time_equal_one_product():
    X, y, sec, date = _panel(d=6)
    rs = RowStats(X, y, np.arange(len(y)), len(y), sec)
    rng = np.random.default_rng(4)
    w = rng.integers(0, 3, size=(4, len(y))).astype(float)
    masks = rng.integers(0, 3, size=(4, 3, len(y))) == 1
    got = _fold_stats(rs, w, masks)
    want = rs.weighted((w[:, None, :] * masks).reshape(-1, len(y)))
    _same(got, want)


@pytest.mark.parametrize("d", [1, 2, 7, 64])
def test_packed_row_terms_are_the_gathered_products_bit_for_bit(d):
    """The packed per-row table, written in place a triangle row at a time, holds what gathering the columns
    of ``np.tril_indices`` gives: 1, y, y², x, x·y and x_i·x_j (i >= j), bit for bit; a weighted sum through it
    equals the loop over rows within float64 rounding."""
    rng = np.random.default_rng(d)
    X, y = rng.standard_normal((53, d)), rng.standard_normal(53)
    rs = RowStats(X, y, np.arange(53), 53, np.arange(53) % 9)
    lo, hi = np.tril_indices(d)
    want = np.concatenate([np.stack([np.ones(53), y, y * y], axis=1), X, X * y[:, None], X[:, lo] * X[:, hi]], axis=1)
    got = rowstats._packed_row_terms(rs)
    assert got.shape == (53, 3 + 2 * d + d * (d + 1) // 2) and got.dtype == np.float64
    assert np.array_equal(got, want)
    W = rng.integers(0, 3, (4, 53)).astype(float)
    fast = rs.weighted(W)
    assert np.array_equal(fast.sxx, fast.sxx.swapaxes(1, 2))
    assert np.allclose(fast.sxx, np.einsum("br,ri,rj->bij", W, X, X), rtol=1e-12, atol=1e-12)
    assert np.allclose(fast.sxy, W @ (X * y[:, None]), rtol=1e-12, atol=1e-12)
