"""Time-respecting penalty selection, the same-row premium, the date-only baseline, the market-neutral target and
the checks that say when a protocol did nothing (issue 28)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.linear_model import Ridge

from pitlab.api.leakageeval import LeakageEvalSpec
from pitlab.data.types import Panel
from pitlab.evaluator.decompose import date_features, empty_checks, market_neutral, rows_per_dimension_checks
from pitlab.evaluator.estimates import AlphaSelection, PanelStats, leakage_on_r2, select_alpha
from pitlab.evaluator.protocols import (LABEL_HORIZON_DAYS, ChronologicalSplit, PurgedKFoldSplit, date_block_folds,
                                        security_folds)
from pitlab.evaluator.run import prepare_evaluation
from pitlab.evaluator.targets import target_statistics


# ---------------------------------------------------------------- date-blocked inner folds
@settings(max_examples=150, deadline=None)
@given(positions=st.lists(st.integers(0, 60), min_size=4, max_size=80),
       weights=st.data(), k=st.integers(2, 6), embargo=st.integers(0, 8))
def test_date_blocked_inner_folds_never_put_one_date_on_both_sides(positions, weights, k, embargo):
    pos = np.asarray(positions)
    w = np.asarray(weights.draw(st.lists(st.integers(0, 3), min_size=len(pos), max_size=len(pos))), dtype=float)
    W = np.stack([w, np.ones_like(w)])
    train, test = date_block_folds(pos, W, k, embargo)
    for b in range(2):
        scored = [j for j in range(k) if test[b, j].any()]
        covered = np.zeros(len(pos), dtype=bool)
        for j in range(k):
            tr_dates, te_dates = set(pos[train[b, j]]), set(pos[test[b, j]])
            assert not tr_dates & te_dates  # no date on both sides
            assert not (train[b, j] & (W[b] == 0)).any() and not (test[b, j] & (W[b] == 0)).any()
            if test[b, j].any():
                lo, hi = min(te_dates), max(te_dates)
                assert all(d < lo - max(LABEL_HORIZON_DAYS, embargo) or d > hi + LABEL_HORIZON_DAYS + embargo
                           for d in tr_dates)  # purged before, purged and embargoed after
                # a block is contiguous: every drawn date between its ends is in it
                assert set(pos[(W[b] > 0) & (pos >= lo) & (pos <= hi)]) == te_dates
                assert not (covered & test[b, j]).any()
                covered |= test[b, j]
        if scored:  # the scored blocks are in date order
            firsts = [pos[test[b, j]].min() for j in scored]
            assert firsts == sorted(firsts)


def test_date_blocked_folds_on_a_hand_made_example():
    pos = np.array([0, 0, 10, 10, 20, 20, 30, 30, 40, 40])  # 5 dates, 2 rows each
    train, test = date_block_folds(pos, np.ones((1, 10)), 5, embargo_days=3)
    # fold 3 tests date 20: training keeps dates < 20 - 3 and > 20 + 2 + 3
    np.testing.assert_array_equal(test[0, 2], pos == 20)
    np.testing.assert_array_equal(train[0, 2], pos != 20)
    train, test = date_block_folds(pos, np.ones((1, 10)), 5, embargo_days=8)  # before 20 - 8, after 20 + 2 + 8
    np.testing.assert_array_equal(train[0, 2], (pos < 12) | (pos > 30))
    np.testing.assert_array_equal(train[0, 3], pos < 30 - 8)  # the block at 30: nothing after 30 + 10
    # fewer dates than folds (a replicate that drew 2 dates): two blocks, the rest not scored
    w = np.array([[1, 1, 0, 0, 0, 0, 0, 0, 2, 0]], dtype=float)
    train, test = date_block_folds(pos, w, 5, embargo_days=3)
    assert test[0, 0].sum() == 2 and test[0, 1].sum() == 1 and not test[0, 2:].any()
    assert train[0, 2:].sum() == 3 * 3  # left-out folds train on the whole set (and score nothing)


def _date_panel(S=40, T=24, d=6, seed=0, date_sd=1.0):
    """S × T panel on every 5th session: a date effect in y, an embedding that knows the date."""
    rng = np.random.default_rng(seed)
    cal = pd.bdate_range("2020-01-01", periods=5 * T + 20)
    dates = cal[5:5 + 5 * T:5]
    di = np.repeat(np.arange(T), S)
    rows = pd.DataFrame({"date": np.repeat(dates.to_numpy(), S), "security": np.tile([f"S{i:02d}" for i in range(S)], T)})
    rows["prompt"] = [f"{a.date()} {b}" for a, b in zip(rows["date"], rows["security"])]
    rows["target"] = date_sd * rng.standard_normal(T)[di] + rng.standard_normal(len(rows))
    X = rng.standard_normal((T, d))[di] + 0.3 * rng.standard_normal((len(rows), d))
    return rows, cal, dates, X


def _spec(dates, selection="protocol-cv", cluster="security-and-date", resamples=20, **protocol):
    return LeakageEvalSpec.model_validate({
        "models": [{"name": "m", "uri": "/m"}], "dataset": {"kind": "ohlcv", "uri": "x", "calendar": "panel"},
        "protocol": {"trainEnd": str(dates[15].date()), "testStart": str(dates[16].date()), "embargoDays": 5,
                     "groupKFolds": 4, **protocol},
        "bootstrap": {"resamples": resamples, "seed": 3, "cluster": cluster},
        "regression": {"selection": selection, "innerFolds": 4}})


def test_protocol_cv_scores_leakage_off_penalty_on_date_blocks_and_leakage_on_by_security():
    rows, cal, dates, X = _date_panel()
    setup = prepare_evaluation(_spec(dates), Panel(rows, cal, "x"))
    assert (setup.time_selection.method, setup.time_selection.embargo_days) == ("date-blocked", 5)
    assert setup.selection.method == "security-cv" and setup.row_units
    st_ = PanelStats.build_rows(X, rows["target"].to_numpy(), setup.codes, setup.split.train_mask,
                                setup.split.test_mask, positions=setup.positions)
    units = st_.stats_of(setup.split.train_mask)
    k, sse = select_alpha(units, np.ones((1, len(rows))), setup.alphas, setup.time_selection)
    # the same SSE by brute force: sklearn Ridge on each date block's training rows, scored on the block
    train_rows = np.flatnonzero(setup.split.train_mask)
    tr, te = date_block_folds(setup.positions, setup.split.train_mask[None].astype(float), 4, 5)
    y = rows["target"].to_numpy()
    expect = np.zeros(len(setup.alphas))
    for j in range(4):
        a, b = np.flatnonzero(tr[0, j]), np.flatnonzero(te[0, j])
        assert set(a) | set(b) <= set(train_rows) and not set(rows["date"].iloc[a]) & set(rows["date"].iloc[b])
        for i, alpha in enumerate(setup.alphas):
            pred = Ridge(alpha=alpha).fit(X[a], y[a]).predict(X[b])
            expect[i] += ((y[b] - pred) ** 2).sum()
    np.testing.assert_allclose(sse[0], expect, rtol=1e-9)
    assert k[0] == int(np.argmin(expect))


def test_same_row_r2_on_equals_a_direct_computation():
    rows, cal, dates, X = _date_panel(seed=1)
    y = rows["target"].to_numpy()
    codes = pd.factorize(rows["security"], sort=True)[0]
    split = ChronologicalSplit(dates[15].date(), dates[16].date(), 5, cal).apply(rows["date"].to_numpy())
    st_ = PanelStats.build(X, y, codes, 40, split.train_mask, split.test_mask)
    F = security_folds(np.bincount(codes), 4)[None]
    on = leakage_on_r2(st_, np.ones((1, 40)), F, 4, [10.0], AlphaSelection("security-cv", 4),
                       score_rows=split.test_mask)
    sse = sst = 0.0
    for k in range(4):
        fit, sc = F[0][codes] != k, F[0][codes] == k
        pred = Ridge(alpha=10.0).fit(X[fit], y[fit]).predict(X)
        rows_k = sc & split.test_mask
        sse += ((y[rows_k] - pred[rows_k]) ** 2).sum()
        sst += ((y[rows_k] - y[fit].mean()) ** 2).sum()
    assert on.r2_rows[0] == pytest.approx(1 - sse / sst, abs=1e-12)
    assert on.r2_rows[0] != pytest.approx(on.r2[0], abs=1e-6)  # all rows is another number


def test_date_only_baseline_explains_a_pure_date_effect_and_market_neutral_removes_it():
    rows, cal, dates, X = _date_panel(seed=2, date_sd=0.7)
    spec = _spec(dates, resamples=30)
    setup = prepare_evaluation(spec, Panel(rows, cal, "x"))
    Xd = date_features(setup.date_codes, setup.n_dates)
    assert Xd.shape == (len(rows), 24) and (Xd.sum(axis=1) == 1).all()
    yn = market_neutral(setup.y, setup.date_codes)
    assert np.abs(np.bincount(setup.date_codes, weights=yn)).max() < 1e-9  # every date's mean is removed
    base = target_statistics(spec, setup, Xd, setup.y, full=False)
    base_mn = target_statistics(spec, setup, Xd, setup.y_neutral, full=False)
    rng = np.random.default_rng(9)  # an embedding that encodes the date in a rotated basis, plus 4 noise dimensions
    Xm = np.hstack([Xd @ np.linalg.qr(rng.standard_normal((24, 24)))[0], rng.standard_normal((len(rows), 4))])
    model = target_statistics(spec, setup, Xm, setup.y, full=False)
    # knowing the date is worth a clearly positive premium under mixed time ...
    assert base.premium > 0.1 and np.nanpercentile(base.reps.premium, 2.5) > 0
    # ... and the date-encoding embedding earns about the same, nothing beyond it (paired excess contains 0)
    diff = model.reps.premium - base.reps.premium
    assert abs(model.premium - base.premium) < 0.02
    assert np.nanpercentile(diff, 2.5) < 0 < np.nanpercentile(diff, 97.5) or abs(model.premium - base.premium) < 1e-3
    # on the market-neutral target no date feature predicts anything
    assert abs(base_mn.premium) < 0.01


def test_every_empty_check_is_stated_when_the_case_is_built():
    # dates 10 sessions apart: a 5-day embargo before the first test date removes nothing; purged K-fold's
    # label horizon of 2 with embargo 0 removes nothing either; embargoRobustness 3 repeats the training set of 5
    rows, cal, dates, X = _date_panel(S=10, T=12)
    cal10 = cal
    dates10 = pd.DatetimeIndex(dates)
    split = ChronologicalSplit(dates10[7].date(), dates10[8].date(), 4, cal10).apply(rows["date"].to_numpy())
    pk = PurgedKFoldSplit(3, 0, cal10).apply(rows["date"].to_numpy())
    robustness = [{"embargo_days": 3, "same_as": 4}, {"embargo_days": 40, "same_as": None}]
    checks = empty_checks(split, {"purged-kfold": pk}, robustness, rows["date"].to_numpy(), "panel")
    by = {(c["check"], c["protocol"]): c["message"] for c in checks}
    few = [c["message"] for c in checks if c["check"] == "few-time-clusters" and c["protocol"] == "chronological"]
    assert "removed no panel row" in by[("embargo-removed-nothing", "chronological")]
    assert "fold(s) [1, 2, 3] of 3" in by[("purge-removed-nothing", "purged-kfold")]
    assert "embargoRobustness 3 trading days leaves the same training set as 4 days" in \
        by[("embargo-unchanged", "chronological")]
    assert len(few) == 2 and "training side has 8 distinct dates" in few[0] and "test side has 4" in few[1]
    assert "fold(s) [1, 2, 3] of 3 test fewer than 10" in by[("few-time-clusters", "purged-kfold")]
    assert [c.get("detail") for c in checks if c["check"] == "few-time-clusters"] == [
        "training: 8 dates", "test: 4 dates", "test folds 1, 2, 3"]
    # the console names which embargo lengths repeat (a trial saw "embargo-unchanged" twice, lengths not said)
    assert [c.get("detail") for c in checks if c["check"] == "embargo-unchanged"] == ["3 days = 4 days"]
    # an embargo of 0 days is asked to remove nothing: not a check that did nothing (a quant's trial)
    split0 = ChronologicalSplit(dates10[7].date(), dates10[8].date(), 0, cal10).apply(rows["date"].to_numpy())
    assert split0.n_embargoed == 0 and "embargo-removed-nothing" not in {
        c["check"] for c in empty_checks(split0, {}, [], rows["date"].to_numpy(), "panel")}


def test_embargo_robustness_marks_an_unchanged_training_set_end_to_end():
    rows, cal, dates, X = _date_panel()
    # dates 5 sessions apart: embargo 5 (the spec's), 6 and 7 drop the last training date; 3 and 4 keep it
    spec = _spec(dates, resamples=10, embargoRobustness=[6, 7, 3, 4, 12])
    setup = prepare_evaluation(spec, Panel(rows, cal, "x"))
    ts = target_statistics(spec, setup, X, setup.y, full=True)
    e6, e7, e3, e4, e12 = ts.robustness
    assert (e6["same_as"], e6["r2_off"], e6["premium"]) == (5, None, None) and e7["same_as"] == 5
    assert e3["same_as"] is None and e4["same_as"] == 3 and e3["n_train"] == e6["n_train"] + 40
    assert e12["same_as"] is None and e12["n_train"] == e6["n_train"] - 40
    assert e12["premium"] == pytest.approx(ts.r2_on_rows - e12["r2_off"])


@pytest.mark.parametrize("backend,reselect", [("numpy", True), ("numpy", False), ("torch", True)])
def test_two_targets_fitted_together_equal_two_separate_runs(backend, reselect):
    from dataclasses import replace

    from pitlab.evaluator.linalg import Backend
    from pitlab.evaluator.targets import model_statistics

    rows, cal, dates, X = _date_panel(seed=4, date_sd=0.5)
    X = X + 0.5 * np.random.default_rng(5).standard_normal((len(rows), 1)) * rows["target"].to_numpy()[:, None]
    spec = _spec(dates, resamples=12, protocols=["chronological", "group-kfold", "walk-forward"],
                 walkForwardFolds=3)
    spec = spec.model_copy(update={"bootstrap": spec.bootstrap.model_copy(update={"reselect_penalty": reselect})})
    setup = prepare_evaluation(spec, Panel(rows, cal, "x"))
    if backend == "torch":  # the batched-Cholesky scoring of the α grid, as on a GPU (3-column blocks)
        setup = replace(setup, backend=Backend("torch", "cpu", penalty_path="cholesky", cholesky_block=3))
    raw, neutral = model_statistics(spec, setup, X, setup.y, setup.y_neutral)
    raw1 = target_statistics(spec, setup, X, setup.y, True)
    neutral1 = target_statistics(spec, setup, X, setup.y_neutral, False)
    assert raw.grid == neutral.grid  # the shared path was taken
    for a, b in ((raw, raw1), (neutral, neutral1)):
        for f in ("r2_off", "r2_on", "r2_on_rows"):
            np.testing.assert_allclose(getattr(a.reps, f), getattr(b.reps, f), rtol=0, atol=1e-12)
        assert a.premium == b.premium and a.off.alpha_index == b.off.alpha_index
    assert raw.protocols["walk-forward"]["premium_ci"] == pytest.approx(raw1.protocols["walk-forward"]["premium_ci"],
                                                                        abs=1e-12)
    # the two targets are different numbers: the check compares like with like
    assert np.abs(raw.reps.r2_on - neutral.reps.r2_on).max() > 1e-3


def test_few_rows_per_dimension_is_stated_below_45_only():
    # 300 securities x 19 training dates: 5,700 rows; 384 dims -> 14.8 per dimension, 128 -> 44.5, 8 -> 712.5
    checks = rows_per_dimension_checks(5700, {"big": 384, "mid": 128, "small": 8})
    assert [c["model"] for c in checks] == ["big", "mid"]
    assert checks[0]["check"] == "few-rows-per-dimension" and checks[0]["protocol"] == "chronological"
    assert "5700 training rows for 384 embedding dimensions (14.8 per dimension, < 45)" in checks[0]["message"]
    assert "(44.5 per dimension" in checks[1]["message"]
    assert rows_per_dimension_checks(5760, {"x": 128}) == []  # exactly 45 per dimension
    assert checks[0]["message"].endswith("read this model's intervals as somewhat too narrow")
    # far below anything the study ran (a trial: 0.4 rows per dimension): not "somewhat"
    [tiny] = rows_per_dimension_checks(150, {"minilm": 384})
    assert tiny["message"].endswith("read this model's intervals as too narrow by an unknown amount: 0.4 rows per "
                                    "dimension is below the 14.8 the study reached")


def test_the_mechanical_sentence_gives_each_remainder_its_interval_and_verdict():
    """The sentence per model: the baseline's share of the raw premium (0.03 of 0.12 is 25 %), then the excess and
    the market-neutral premium each with its interval and verdict; the other two wordings when the baseline earns
    at least the raw premium and when the raw premium is not positive."""
    from pitlab.evaluator.decompose import mechanical_sentence

    ex = {"premium": 0.09, "ci": [0.01, 0.17], "verdict": "significant"}
    mn = {"premium": -0.0012, "premium_ci": [-0.0051, 0.0027], "verdict": "not significant"}
    assert mechanical_sentence("pit-2016", 0.12, 0.03, ex, mn) == (
        "pit-2016: raw premium +0.1200, of which 25 % is mechanical (the date-only baseline earns +0.0300); excess "
        "over the baseline +0.0900 [+0.0100, +0.1700] (significant), market-neutral premium -0.0012 "
        "[-0.0051, +0.0027] (not significant).")
    low = {"premium": -0.2, "ci": [-0.33, -0.04], "verdict": "significant"}
    assert mechanical_sentence("base", 0.05, 0.25, low, mn).startswith(
        "base: raw premium +0.0500, all of it mechanical: features that only identify the date earn +0.2500 under "
        "mixed time; excess over the baseline -0.2000 [-0.3300, -0.0400] (significant) (below 0: it recognises")
    assert mechanical_sentence("m", -0.01, 0.25, low, mn).startswith(
        "m: raw premium -0.0100, nothing for date recognition to explain; excess over the baseline -0.2000")
    undefined = {"premium": 0.09, "ci": [float("nan"), None], "verdict": "unreliable"}
    assert "excess over the baseline +0.0900 [n/a, n/a] (unreliable)" in mechanical_sentence("m", 0.12, 0.03,
                                                                                             undefined, mn)


def test_the_sd_monte_carlo_error_is_one_over_sqrt_2n_for_normal_replicates_and_matches_a_simulation():
    from pitlab.evaluator.decompose import sd_monte_carlo_error

    rng = np.random.default_rng(0)
    big = rng.standard_normal(200_000)
    assert sd_monte_carlo_error(big) == pytest.approx(1 / np.sqrt(2 * big.size), rel=0.02)
    # 4,000 sets of 100 heavy-tailed (t with 5 degrees of freedom, kurtosis 9) values: the spread of their sds
    sets = rng.standard_t(5, size=(4000, 100))
    observed = sets.std(axis=1, ddof=1).std() / sets.std(axis=1, ddof=1).mean()
    predicted = np.mean([sd_monte_carlo_error(s) for s in sets])
    assert observed == pytest.approx(0.133, abs=0.005)  # far above normal values' 1/sqrt(200) = 0.071
    # the sample kurtosis of 100 heavy-tailed values is biased low, and so is the estimate: 0.10 (documented)
    assert predicted == pytest.approx(0.100, abs=0.005) and predicted > 1 / np.sqrt(200)


def test_a_verdict_within_two_monte_carlo_errors_of_the_edge_is_named():
    from scipy import stats

    from pitlab.evaluator.bootstrap import IntervalRule
    from pitlab.evaluator.decompose import monte_carlo_checks, sd_monte_carlo_error

    rng = np.random.default_rng(1)
    reps = np.concatenate([0.02 * rng.standard_normal(100), 0.01 * rng.standard_normal(100)])
    rule = IntervalRule(0.95, "two-way", 100, 300, 30)
    sd, g, dim = rule.spread(reps)
    assert (g, dim) == (300, "security")
    half = stats.t.ppf(0.975, 299) * sd
    r = sd_monte_carlo_error(reps[:100])
    assert 0.05 < r < 0.1
    checks = monte_carlo_checks(rule, {("m", "excess premium"): (-1.05 * half, reps),
                                       ("m", "raw premium"): (half * (1 + 3 * r), reps),
                                       ("m", "market-neutral premium"): (0.2 * half, reps)})
    assert [c["check"] for c in checks] == ["monte-carlo-verdict"]
    msg = checks[0]["message"]
    assert msg.startswith("m, excess premium: |") and "1.05 × its interval's half-width" in msg, msg
    assert f"the security half's sd (from 100 replicates) carries a Monte Carlo error of ±{r:.1%}" in msg, msg
    needed = int(np.ceil(200 * (2 * r / 0.05) ** 2 / 100) * 100)
    assert msg.endswith(f"raise bootstrap.resamples (now 200; about {needed:,} would settle it if the sd stays as it "
                        "is)"), msg


def test_unknown_cutoff_is_named_for_each_model_without_one():
    """A model with a cutoff (typed or from its card) gets no check; each one without gets one, in order."""
    import datetime as dt

    from pitlab.evaluator.decompose import unknown_cutoff_checks

    got = unknown_cutoff_checks({"base": None, "pit": dt.date(2016, 12, 31), "minilm": None})
    assert [(c["model"], c["check"], c["protocol"]) for c in got] == [
        ("base", "unknown-cutoff", "chronological"), ("minilm", "unknown-cutoff", "chronological")]
    assert got[1]["message"].startswith("minilm: no knowledge cutoff is known (none in models[].knowledgeCutoff, no "
                                        "pitlab model card in its folder)")
    assert unknown_cutoff_checks({"pit": dt.date(2016, 12, 31)}) == []
