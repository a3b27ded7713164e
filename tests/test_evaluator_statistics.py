"""Statistics engine (issue 6): torch backend = numpy backend, penalty held fixed vs reselected in replicates,
bit-identical reruns, and embargo days counted on real exchange calendars (XNYS, XTKS)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import Ridge

from reference import synthetic_panel as _panel  # tests/ is on sys.path under pytest
from pitlab.evaluator.bootstrap import bootstrap_model, draw_cluster_weights, replicate_folds
from pitlab.evaluator.estimates import (AlphaSelection, Fold, PanelStats, group_kfold_folds, leakage_off_r2,
                                       leakage_on_r2)
from pitlab.evaluator.linalg import Backend
from pitlab.evaluator.protocols import (ChronologicalSplit, ProtocolError, PurgedKFoldSplit, WalkForwardSplit,
                                        security_folds, trading_calendar)

ALPHAS = [0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0]




def _all_protocols(st: PanelStats, W, F, K, date, selection, reselect):
    """r2 of every protocol (rows: point estimate + replicates) through the run's code path."""
    T = date.max() + 1
    wf = [Fold(date < t, (date >= t) & (date < t + 3)) for t in (6, 9)]
    pk = [Fold((date < a - 2) | (date > a + 5), (date >= a) & (date < a + 3)) for a in (0, 4, 8)]
    out = {}
    for name, folds in {"off": [Fold(st.train_mask, st.test_mask)], "on": group_kfold_folds(len(date), F, K),
                        "wf": wf, "pk": pk}.items():
        fr = st.protocol_errors(folds, W, ALPHAS, selection, point_first=True, reselect=reselect,
                                diagnostics=True)
        out[name] = (fr.r2, fr.pooled, fr.alpha, fr.df[0])
    assert T == 12
    return out


@pytest.mark.parametrize("method", ["security-cv", "gcv"])
@pytest.mark.parametrize("reselect", [True, False])
def test_torch_backend_equals_numpy_backend(method, reselect):
    X, y, sec, date = _panel()
    S, K = 24, 4
    W = np.vstack([np.ones((1, S)), draw_cluster_weights(S, 12, seed=3)])
    F = np.vstack([security_folds(np.full(S, 12), K)[None], replicate_folds(np.full(S, 12), W[1:], K)])
    sel = AlphaSelection(method, inner_folds=3)
    res = {}
    for be in (Backend(), Backend("torch", "cpu")):
        st = PanelStats.build(X, y, sec, S, date < 7, date >= 8, be)
        res[be.name] = _all_protocols(st, W, F, K, date, sel, reselect)
    for name in res["numpy"]:
        for a, b in zip(res["numpy"][name], res["torch:cpu"][name]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
    alpha_on = res["numpy"]["on"][2]  # [1 + R, K]
    if reselect:  # replicates choose again: some choose another grid point than the point estimate
        assert (alpha_on[1:] != alpha_on[:1]).any()
    else:  # every replicate keeps the point estimate's penalty of its fold
        assert (alpha_on == alpha_on[:1]).all()


def test_fixed_penalty_refits_replicates_at_the_point_estimates_alpha():
    X, y, sec, date = _panel(seed=1)
    S, K = 24, 4
    w = draw_cluster_weights(S, 40, seed=5)
    W = np.vstack([np.ones((1, S)), w])
    st = PanelStats.build(X, y, sec, S, date < 7, date >= 8)
    sel = AlphaSelection("security-cv", inner_folds=3)
    off = leakage_off_r2(st, np.ones((1, S)), ALPHAS, sel)
    F = replicate_folds(np.full(S, 12), w, K)
    on = leakage_on_r2(st, np.ones((1, S)), security_folds(np.full(S, 12), K)[None], K, ALPHAS, sel)
    fixed = bootstrap_model(st, w, F, K, ALPHAS, sel, "train_mean", (off.alpha_index, on.alpha_index))
    again = bootstrap_model(st, w, F, K, ALPHAS, sel, "train_mean", (off.alpha_index, on.alpha_index))
    np.testing.assert_array_equal(fixed.r2_off, again.r2_off)  # bit-identical rerun
    np.testing.assert_array_equal(fixed.r2_on, again.r2_on)
    # replicate 0, leakage-off, refitted by sklearn on the expanded rows at the point estimate's penalty
    m = w[0]
    tr = np.repeat(np.flatnonzero(date < 7), m[sec[date < 7]])
    te = np.repeat(np.flatnonzero(date >= 8), m[sec[date >= 8]])
    ref = Ridge(alpha=float(off.alpha[0])).fit(X[tr], y[tr])
    r2 = 1 - np.sum((y[te] - ref.predict(X[te])) ** 2) / np.sum((y[te] - y[tr].mean()) ** 2)
    assert fixed.r2_off[0] == pytest.approx(r2, abs=1e-10)
    # the same through the point-first path: every replicate row keeps row 0's grid position
    fr = st.protocol_errors([Fold(date < 7, date >= 8)], W, ALPHAS, sel, point_first=True, reselect=False)
    assert (fr.alpha_index[:, 0] == off.alpha_index[0]).all()
    np.testing.assert_allclose(fr.r2[1:, 0], fixed.r2_off, rtol=0, atol=1e-12)
    # reselecting moves at least one replicate's penalty away from the point estimate's
    re = st.protocol_errors([Fold(date < 7, date >= 8)], W, ALPHAS, sel, point_first=True, reselect=True)
    assert re.r2[0, 0] == fr.r2[0, 0] and (re.alpha_index[1:, 0] != off.alpha_index[0]).any()


def test_batches_in_threads_give_the_numbers_of_one_batch():
    """The numpy backend spreads replicates over threads in batches; the numbers do not depend on it."""
    X, y, sec, date = _panel(S=30, T=10, d=6, seed=2)
    S = 30
    W = draw_cluster_weights(S, 40, seed=0)
    sel = AlphaSelection("security-cv", inner_folds=3)
    small = PanelStats.build(X, y, sec, S, date < 6, date >= 7, Backend(memory_budget_bytes=1))  # 1 per batch
    big = PanelStats.build(X, y, sec, S, date < 6, date >= 7)
    a = leakage_off_r2(small, W, ALPHAS, sel)
    b = leakage_off_r2(big, W, ALPHAS, sel)
    np.testing.assert_array_equal(a.alpha_index, b.alpha_index)
    np.testing.assert_allclose(a.r2, b.r2, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- exchange calendars

def _rows_on(sessions: pd.DatetimeIndex, n_sec=3):
    return np.repeat(sessions.to_numpy(), n_sec)


def test_xnys_embargo_across_thanksgiving_removes_exactly_five_sessions():
    # US Thanksgiving 2019-11-28 (closed); 2019-11-29 is a (half) session. Test from Mon 2019-12-02.
    file_days = pd.bdate_range("2019-10-01", "2019-12-31")  # a price file that (wrongly) has every weekday
    cal = trading_calendar("auto", "ohlcv", file_days)
    assert cal.name == "XNYS" and pd.Timestamp("2019-11-28") not in cal and pd.Timestamp("2019-11-29") in cal
    panel_days = cal[(cal >= "2019-11-01") & (cal <= "2019-12-06")]
    dates = _rows_on(panel_days)
    sp = ChronologicalSplit(pd.Timestamp("2019-11-30").date(), pd.Timestamp("2019-12-01").date(), 5, cal).apply(dates)
    # 5 sessions before 2019-12-02: Nov 29, 27, 26, 25, 22 (Thanksgiving is not one)
    removed = sorted({pd.Timestamp(d).date().isoformat() for d in dates[sp.embargo_mask]})
    assert removed == ["2019-11-22", "2019-11-25", "2019-11-26", "2019-11-27", "2019-11-29"]
    assert sp.n_embargoed == 15 and sp.first_test_date == pd.Timestamp("2019-12-02")
    assert pd.Timestamp(dates[sp.train_mask].max()) == pd.Timestamp("2019-11-21")
    # counting the price file's weekdays instead would embargo Thanksgiving itself and keep Nov 22 in training
    naive = ChronologicalSplit(pd.Timestamp("2019-11-30").date(), pd.Timestamp("2019-12-01").date(), 5,
                               file_days).apply(dates)
    assert pd.Timestamp(dates[naive.train_mask].max()) == pd.Timestamp("2019-11-22")
    # a row dated on the holiday is refused, naming the calendar
    with pytest.raises(ProtocolError, match="2019-11-28 is not a trading day of the XNYS calendar"):
        ChronologicalSplit(pd.Timestamp("2019-11-30").date(), pd.Timestamp("2019-12-01").date(), 5,
                           cal).apply(np.array(["2019-11-28"], dtype="datetime64[ns]"))


def test_xtks_golden_week_and_the_2020_halt_day_in_embargo_and_purge():
    file_days = pd.bdate_range("2020-03-02", "2020-12-30")
    cal = trading_calendar("auto", "jpx", file_days)
    assert cal.name == "XTKS"
    # Golden Week 2020: Apr 29 (Showa Day), May 4-6 closed; sessions Apr 28, Apr 30, May 1, May 7
    gw = cal[(cal >= "2020-04-27") & (cal <= "2020-05-08")]
    assert [d.date().isoformat() for d in gw] == ["2020-04-27", "2020-04-28", "2020-04-30", "2020-05-01",
                                                   "2020-05-07", "2020-05-08"]
    panel_days = cal[(cal >= "2020-04-01") & (cal <= "2020-05-29")]
    dates = _rows_on(panel_days, 2)
    sp = ChronologicalSplit(pd.Timestamp("2020-05-06").date(), pd.Timestamp("2020-05-07").date(), 4, cal).apply(dates)
    removed = sorted({pd.Timestamp(d).date().isoformat() for d in dates[sp.embargo_mask]})
    assert removed == ["2020-04-27", "2020-04-28", "2020-04-30", "2020-05-01"] and sp.n_embargoed == 8
    # the TSE halt of 2020-10-01 is a closure on XTKS: 2 sessions after Sep 30 are Oct 2 and Oct 5
    assert pd.Timestamp("2020-10-01") not in cal
    n_sep = int(((cal >= "2020-09-01") & (cal <= "2020-09-30")).sum())
    assert n_sep == 20  # Sep 21-22 (Respect for the Aged Day, Autumnal Equinox) are closed
    autumn = cal[cal >= "2020-09-01"][:2 * n_sep]  # fold 0 = September, fold 1 = the next 20 sessions
    d2 = _rows_on(autumn, 1)
    pk = PurgedKFoldSplit(2, 2, cal).apply(d2)
    # fold 0 tests Sep 1 .. Sep 30; after it, label span h = 2 sessions, then 2 embargo sessions:
    # removed after it are Oct 2, 5 (purge) and Oct 6, 7 (embargo) — Oct 1 is no session
    rm = [pd.Timestamp(d).date().isoformat() for d in d2[pk.fold_removed[0]]]
    assert pk.fold_dates[0][1] == pd.Timestamp("2020-09-30")
    assert rm == ["2020-10-02", "2020-10-05", "2020-10-06", "2020-10-07"]
    wf = WalkForwardSplit(2, 3, cal).apply(d2)
    assert wf.get_n_splits() == 2


def test_calendar_setting_panel_and_unknown_names():
    days = pd.bdate_range("2021-01-04", periods=30)
    assert trading_calendar("panel", "ohlcv", days).equals(days)
    assert trading_calendar("panel", "jpx", days).name == "panel"
    assert trading_calendar("XLON", "ohlcv", days).name == "XLON"
    with pytest.raises(ProtocolError, match="dataset.calendar: 'NOPE' is not an exchange_calendars calendar"):
        trading_calendar("NOPE", "ohlcv", days)
