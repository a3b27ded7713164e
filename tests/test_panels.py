"""Market panels: loaders, the JPX target, PIT sampling and prompts."""

import numpy as np
import pandas as pd
import pytest

from pitlab.data import PanelError, build_panel, compute_target, load_jpx, load_ohlcv_long
from pitlab.data.panels import JPX_PRICE_COLUMNS, jpx_adjusted_close
from pitlab.data.sampling import check_prompt_template


def _ohlcv(tmp_path, n_days=40, names=("AAA", "BBB", "CCC"), drop=()):
    days = pd.bdate_range("2016-01-04", periods=n_days)
    rows = []
    for k, name in enumerate(names):
        for i, d in enumerate(days):
            if (name, i) in drop:
                continue
            c = 100.0 + k * 10 + i  # close rises by 1 per day
            rows.append((d.date().isoformat(), c, c + 1, c - 1, c, 1000 + i, name))
    df = pd.DataFrame(rows, columns=["date", "open", "high", "low", "close", "volume", "Name"])
    path = tmp_path / "ohlcv.csv"
    df.to_csv(path, index=False)
    return path, days


def test_target_equals_hand_computed_value(tmp_path):
    path, days = _ohlcv(tmp_path)
    prices = load_ohlcv_long(path)
    target = compute_target(prices.close)
    # AAA close on day i is 100 + i: target at day 10 = close[12] / close[11] - 1 = 112/111 - 1
    assert target.loc[days[10], "AAA"] == pytest.approx(112 / 111 - 1, abs=1e-15)
    assert np.isnan(target.loc[days[-2], "AAA"]) and np.isnan(target.loc[days[-1], "AAA"])


def test_target_uses_the_calendar_not_the_next_rows(tmp_path):
    # BBB has no row on day 11: its target at day 10 is unknown, not close[12]/close[13]
    path, days = _ohlcv(tmp_path, drop={("BBB", 11)})
    prices = load_ohlcv_long(path)
    target = compute_target(prices.close)
    assert np.isnan(target.loc[days[10], "BBB"])
    assert target.loc[days[11], "BBB"] == pytest.approx(123 / 122 - 1)


def test_panel_prompt_uses_only_information_at_t(tmp_path):
    path, days = _ohlcv(tmp_path, n_days=60)
    prices = load_ohlcv_long(path)
    panel = build_panel(prices, universe_size=3, date_count=5, seed=7,
                        template="{date} {security} {close:.1f} {ret_1d:+.6f}")
    assert len(panel.rows) == 15 and panel.dropped == {"missing_features": 0, "missing_target": 0}
    r = panel.rows.iloc[0]
    i = days.get_loc(r.date)
    k = ["AAA", "BBB", "CCC"].index(r.security)
    close_t = 100.0 + 10 * k + i
    assert r.prompt == f"{r.date.date()} {r.security} {close_t:.1f} {close_t / (close_t - 1) - 1:+.6f}"
    assert r.target == pytest.approx((close_t + 2) / (close_t + 1) - 1)
    # same seed, same panel; other seed, other dates
    again = build_panel(prices, 3, 5, 7, template="{date} {security} {close:.1f} {ret_1d:+.6f}")
    pd.testing.assert_frame_equal(panel.rows, again.rows)
    other = build_panel(prices, 3, 5, 8, template="{date} {security} {close:.1f} {ret_1d:+.6f}")
    assert set(other.rows.date) != set(panel.rows.date)


def test_prompt_template_rejects_unknown_fields():
    with pytest.raises(ValueError, match=r"dataset.promptTemplate: unknown field\(s\) \['target'\]"):
        check_prompt_template("{date} {target}")


def test_sp500_panel(data_root):
    prices = load_ohlcv_long(data_root / "sp500_5yr" / "sp500_5yr_ohlcv_long.csv.gz")
    assert prices.close.shape == (1259, 505)
    assert prices.close.loc["2013-02-08", "AAPL"] == pytest.approx(67.8542)
    panel = build_panel(prices, universe_size=300, date_count=30, seed=0)
    assert panel.rows.date.nunique() == 30 and panel.rows.security.nunique() == 300
    assert len(panel.rows) + sum(panel.dropped.values()) == 9000
    assert panel.rows.target.notna().all()
    assert not panel.rows.duplicated(["date", "security"]).any()


def test_ohlcv_missing_column_is_named(tmp_path):
    path, _ = _ohlcv(tmp_path)
    df = pd.read_csv(path).drop(columns=["close"])
    df.to_csv(path, index=False)
    with pytest.raises(PanelError, match=r"ohlcv.csv: missing column\(s\) \['close'\]"):
        load_ohlcv_long(path)


def _jpx_files(tmp_path):
    """Small files in the exact Kaggle JPX schema: a 1:2 split on 2020-09-29 and the 2020-10-01 halt."""
    days = ["2020-09-25", "2020-09-28", "2020-09-29", "2020-09-30", "2020-10-01", "2020-10-02", "2020-10-05"]
    closes = {"1301": [2000, 2010, 2020, 1015, None, 1020, 1030], "7203": [7000, 7010, 7020, 7030, None, 7040, 7050]}
    factor = {("1301", "2020-09-29"): 0.5}
    rows = []
    for code, cs in closes.items():
        for d, c in zip(days, cs):
            rows.append({"RowId": f"{d.replace('-', '')}_{code}", "Date": d, "SecuritiesCode": int(code),
                         "Open": c, "High": c, "Low": c, "Close": c, "Volume": None if c is None else 1000,
                         "AdjustmentFactor": factor.get((code, d), 1.0), "ExpectedDividend": None,
                         "SupervisionFlag": False, "Target": 0.0})
    pd.DataFrame(rows, columns=list(JPX_PRICE_COLUMNS)).to_csv(tmp_path / "stock_prices.csv", index=False)
    pd.DataFrame({"SecuritiesCode": [1301, 7203], "Name": ["KYOKUYO CO.,LTD.", "TOYOTA MOTOR CORPORATION"],
                  "Universe0": [True, True]}).to_csv(tmp_path / "stock_list.csv", index=False)
    return days


def test_jpx_adjustment_halt_and_target(tmp_path):
    days = _jpx_files(tmp_path)
    prices = load_jpx(tmp_path)
    assert prices.names["7203"] == "TOYOTA MOTOR CORPORATION"
    adj = prices.close["1301"]
    # closes on and before the factor's day are halved: 2000 → 1000, 2020 → 1010
    assert adj.loc["2020-09-25"] == 1000.0 and adj.loc["2020-09-29"] == 1010.0 and adj.loc["2020-09-30"] == 1015.0
    target = compute_target(prices.close)
    # target at 09-28 = adj[09-30] / adj[09-29] - 1: no jump from the split
    assert target.loc["2020-09-28", "1301"] == pytest.approx(1015 / 1010 - 1)
    # any target spanning the halt day is unknown, never invented
    assert np.isnan(target.loc["2020-09-29", "1301"]) and np.isnan(target.loc["2020-09-30", "7203"])
    assert target.loc["2020-10-01", "7203"] == pytest.approx(7050 / 7040 - 1)


def test_jpx_missing_column_is_named(tmp_path):
    _jpx_files(tmp_path)
    df = pd.read_csv(tmp_path / "stock_prices.csv").drop(columns=["AdjustmentFactor"])
    df.to_csv(tmp_path / "stock_prices.csv", index=False)
    with pytest.raises(PanelError, match=r"stock_prices.csv: missing column\(s\) \['AdjustmentFactor'\]"):
        load_jpx(tmp_path)


def test_jpx_adjusted_close_multiple_factors():
    df = pd.DataFrame({"Date": pd.to_datetime(["2021-01-04", "2021-01-05", "2021-01-06", "2021-01-07"]),
                       "SecuritiesCode": ["1"] * 4, "Close": [400.0, 410.0, 205.0, 70.0],
                       "AdjustmentFactor": [1.0, 0.5, 1.0 / 3, 1.0]})
    # 01-04 and 01-05 are scaled by 0.5 × 1/3, 01-06 by 1/3, 01-07 unscaled
    np.testing.assert_allclose(jpx_adjusted_close(df).to_numpy(), [400 / 6, 410 / 6, 205 / 3, 70.0])
