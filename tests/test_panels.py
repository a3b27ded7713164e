"""Market panels: loaders, the JPX target, PIT sampling and prompts."""

import re

import numpy as np
import pandas as pd
import pytest

from pitlab.data import PanelError, build_panel, compute_target, load_jpx, load_ohlcv_long
from pitlab.data.panels import JPX_PRICE_COLUMNS, compute_features, jpx_adjusted_close, target_close
from pitlab.data.sampling import (DEFAULT_PROMPT_TEMPLATE, DEFAULT_PROMPT_TEMPLATE_NO_LEVELS, check_prompt_template,
                                  dropped_note)


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
                        template="{date} {security} {close:.1f} {ret_1d:+.6f}", price_levels="include")
    assert len(panel.rows) == 15 and panel.dropped == {"missing_features": 0, "missing_target": 0}
    r = panel.rows.iloc[0]
    i = days.get_loc(r.date)
    k = ["AAA", "BBB", "CCC"].index(r.security)
    close_t = 100.0 + 10 * k + i
    assert r.prompt == f"{r.date.date()} {r.security} {close_t:.1f} {close_t / (close_t - 1) - 1:+.6f}"
    assert r.target == pytest.approx((close_t + 2) / (close_t + 1) - 1)
    # same seed, same panel; other seed, other dates
    again = build_panel(prices, 3, 5, 7, template="{date} {security} {close:.1f} {ret_1d:+.6f}",
                        price_levels="include")
    pd.testing.assert_frame_equal(panel.rows, again.rows)
    other = build_panel(prices, 3, 5, 8, template="{date} {security} {ret_1d:+.6f}")
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
    lost = sum(panel.dropped.values())
    assert lost > 0  # 300 of 505 S&P names over five years: some join late (none leaves: survivorship, below)
    note = dropped_note(panel.dropped, len(panel.rows))
    assert note.startswith(f"; {lost:,} of 9,000 sampled rows dropped: ")
    assert dropped_note({"missing_features": 0, "missing_target": 0}, 9000) == ""
    assert dropped_note({"missing_features": 7, "missing_target": 1}, 232) == (
        "; 8 of 240 sampled rows dropped: 7 without features (price history missing: not yet listed, delisted or "
        "halted), 1 without a target (no close at t+1 or t+2)")
    assert not panel.rows.duplicated(["date", "security"]).any()
    # the file lists early-2018 constituents: none of the names eligible at the first date stops trading
    [surv] = [w for w in panel.warnings if "survivorship" in w]
    first = panel.rows.date.min()
    n = int(prices.close.loc[:first].tail(21).notna().all().sum())  # a close on t and its 20 sessions before
    assert surv.startswith(f"dataset: all {n} securities eligible at the first sampled date {first.date()} still "
                           f"trade on ") and "last day 2018-02-07" in surv and "looks like a survivorship" in surv


def test_a_price_file_in_which_no_security_stops_trading_is_called_a_survivorship_snapshot(tmp_path):
    """A quant would not see that the shared S&P 500 file is a survivorship snapshot (505 names of early 2018,
    none delisted in five years) from any report."""
    from pitlab.data.sampling import survivorship_note

    names = tuple(f"S{k:03d}" for k in range(80))
    path, days = _ohlcv(tmp_path, n_days=600, names=names)  # 80 names over 2.3 years: 184 security-years
    prices = load_ohlcv_long(path)
    eligible = np.array(names)
    first = days[20]
    years = (days[-1] - first).days / 365.25
    assert survivorship_note(prices, eligible, first) == (
        f"dataset: all 80 securities eligible at the first sampled date {first.date()} still trade on {path}'s last "
        f"day {days[-1].date()}, {years:.1f} years later: no delisting, merger or bankruptcy in the file, so it looks "
        "like a survivorship snapshot (the securities that survived to its end). A universe drawn from it knows who "
        "survives, a look-ahead that flatters any model; use a price file that keeps the securities that stopped "
        "trading, or read the premia as conditional on survival")
    early = build_panel(prices, 10, 3, 0, start=days[25].date(), end=days[40].date())
    assert sum(w.startswith("dataset: all 80 securities") for w in early.warnings) == 1
    # too few security-years to tell (60 names × 2.3 years = 138 < 150): nothing said
    assert survivorship_note(prices, eligible[:60], first) is None
    # one name that stops trading 10 days before the end: the file keeps delistings
    df = pd.read_csv(path)
    df = df[~((df.Name == "S007") & (pd.to_datetime(df.date) > days[-11]))]
    df.to_csv(path, index=False)
    assert survivorship_note(load_ohlcv_long(path), eligible, first) is None


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
    # the prices keep the file's own closes; the target's close is the competition's adjusted close
    assert prices.close.loc["2020-09-25", "1301"] == 2000.0 and prices.factor.loc["2020-09-29", "1301"] == 0.5
    adj = target_close(prices)["1301"]
    # closes on and before the factor's day are halved: 2000 → 1000, 2020 → 1010
    assert adj.loc["2020-09-25"] == 1000.0 and adj.loc["2020-09-29"] == 1010.0 and adj.loc["2020-09-30"] == 1015.0
    target = compute_target(target_close(prices))
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


# ---------------------------------------------------------------------------------------------------------
# Prompts as of t: a split after t never reaches the prompt at t
# ---------------------------------------------------------------------------------------------------------
SPLIT_DAYS = pd.bdate_range("2017-01-02", periods=40)
T = 30  # the prompt date is SPLIT_DAYS[T]


def _p(d):
    return 4.0 * (500 + 3 * d + (7 if d % 3 else -7))


def _split_market(folder, split_at=None, layout="flat"):
    """Two securities in the Kaggle schema. Code 1301 follows one economic path P[d] = 4 × (500 + 3d ± 7) yen
    with volume V[d] = 1000 + 10d, in the shares of the first day; a 1:2 split whose AdjustmentFactor (0.5) is
    dated ``SPLIT_DAYS[split_at]`` halves every later raw close and doubles every later raw volume, as an
    exchange prints them. Code 7203 never splits. All values are exact in binary floating point."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for code in (1301, 7203):
        for d, day in enumerate(SPLIT_DAYS):
            p, v, f = _p(d), 1000.0 + 10 * d, 1.0
            if code == 1301 and split_at is not None:
                if d > split_at:
                    p, v = p / 2, v * 2
                if d == split_at:
                    f = 0.5
            rows.append({"RowId": f"{day:%Y%m%d}_{code}", "Date": f"{day:%Y-%m-%d}", "SecuritiesCode": code,
                         "Open": p, "High": p, "Low": p, "Close": p, "Volume": v, "AdjustmentFactor": f,
                         "ExpectedDividend": None, "SupervisionFlag": False, "Target": 0.0})
    prices = pd.DataFrame(rows, columns=list(JPX_PRICE_COLUMNS))
    if layout == "flat":
        prices.to_csv(folder / "stock_prices.csv", index=False)
    else:  # the Kaggle download: train_files/ up to day 25, supplemental_files/ from day 24 (two days overlap)
        (folder / "train_files").mkdir()
        (folder / "supplemental_files").mkdir()
        prices[prices.Date <= f"{SPLIT_DAYS[25]:%Y-%m-%d}"].to_csv(folder / "train_files" / "stock_prices.csv",
                                                                  index=False)
        prices[prices.Date >= f"{SPLIT_DAYS[24]:%Y-%m-%d}"].to_csv(
            folder / "supplemental_files" / "stock_prices.csv", index=False)
    pd.DataFrame({"SecuritiesCode": [1301, 7203], "Name": ["KYOKUYO", "TOYOTA"]}).to_csv(
        folder / "stock_list.csv", index=False)
    return prices


def _prompt_at_t(folder, template=DEFAULT_PROMPT_TEMPLATE + " Vol {volume:.0f}"):
    panel = build_panel(load_jpx(folder), 2, 1, 0, start=SPLIT_DAYS[T].date(), end=SPLIT_DAYS[T].date(),
                        template=template)
    assert list(panel.rows.date) == [SPLIT_DAYS[T]] * 2
    return panel.rows.set_index("security")


def test_a_split_after_t_leaves_the_prompt_at_t_unchanged(tmp_path):
    _split_market(tmp_path / "none")
    none = _prompt_at_t(tmp_path / "none")
    p_t = _p(T)
    assert none.loc["1301", "prompt"].startswith(f"Date: {SPLIT_DAYS[T].date()}. Stock: KYOKUYO (1301). "
                                                 f"Close {p_t:.2f}. Returns: 1-day ")
    # the split's factor dated t (effective t+1), t+1 (effective t+2, inside the target) or t+5: the prompt at
    # t is the one of a market without the split, to the character
    for at in (T, T + 1, T + 5):
        _split_market(tmp_path / f"s{at}", at)
        assert _prompt_at_t(tmp_path / f"s{at}")["prompt"].to_dict() == none["prompt"].to_dict(), at


def test_a_split_before_t_changes_only_the_levels_it_changed(tmp_path):
    _split_market(tmp_path / "none")
    none = _prompt_at_t(tmp_path / "none")
    # factor dated t-1 (effective t), t-3 (inside the 5-day return), t-12 (inside the 20-day windows), t-25
    for at in (T - 1, T - 3, T - 12, T - 25):
        _split_market(tmp_path / f"s{at}", at)
        got = _prompt_at_t(tmp_path / f"s{at}")
        p_t, v_t = _p(T), 1000.0 + 10 * T
        # the close and the volume printed are the ones traded at t: half the close, twice the shares ...
        expected = (none.loc["1301", "prompt"].replace(f"Close {p_t:.2f}", f"Close {p_t / 2:.2f}")
                    .replace(f"Vol {v_t:.0f}", f"Vol {2 * v_t:.0f}"))
        assert got.loc["1301", "prompt"] == expected != none.loc["1301", "prompt"], at
        # ... while the returns and the volume ratio, split-adjusted as of t, are those without the split
        assert got.loc["7203", "prompt"] == none.loc["7203", "prompt"]
        # and the target (t+1 -> t+2) is the same number
        assert got.loc["1301", "target"] == none.loc["1301", "target"]


def test_features_as_of_t_equal_prices_adjusted_with_the_factors_dated_before_t(tmp_path):
    rows = _split_market(tmp_path, split_at=T - 3)
    prices = load_jpx(tmp_path)
    feats = compute_features(prices)
    raw = rows[rows.SecuritiesCode == 1301].set_index(pd.to_datetime(rows.Date[rows.SecuritiesCode == 1301]))
    # as of t, days d < t are scaled by the factors dated in [d, t): 0.5 for d ≤ t-3
    asof_close = raw.Close * np.where(np.arange(40) <= T - 3, 0.5, 1.0)
    asof_vol = raw.Volume / np.where(np.arange(40) <= T - 3, 0.5, 1.0)
    t = SPLIT_DAYS[T]
    assert feats["close"].loc[t, "1301"] == raw.Close.iloc[T] == asof_close.iloc[T]
    assert feats["ret_5d"].loc[t, "1301"] == pytest.approx(asof_close.iloc[T] / asof_close.iloc[T - 5] - 1, rel=1e-14)
    assert feats["ret_20d"].loc[t, "1301"] == pytest.approx(asof_close.iloc[T] / asof_close.iloc[T - 20] - 1,
                                                           rel=1e-14)
    assert feats["volume_ratio"].loc[t, "1301"] == pytest.approx(
        asof_vol.iloc[T] / asof_vol.iloc[T - 19:T + 1].mean(), rel=1e-14)
    # the raw volume ratio would jump at the split: ~2x, not ~1x
    assert raw.Volume.iloc[T] / raw.Volume.iloc[T - 19:T + 1].mean() > 1.5 > feats["volume_ratio"].loc[t, "1301"]


def test_target_is_the_competitions_adjusted_close_change(tmp_path):
    for at in (None, T - 3, T + 1, T + 2):
        rows = _split_market(tmp_path / str(at), at)
        prices = load_jpx(tmp_path / str(at))
        got = compute_target(target_close(prices))["1301"]
        # the Kaggle definition: adjusted close = Close × cumprod of AdjustmentFactor in descending date order;
        # Target(t) = adj[t+2] / adj[t+1] - 1
        df = rows.assign(Date=pd.to_datetime(rows.Date))
        adj = df.assign(A=jpx_adjusted_close(df))[df.SecuritiesCode == 1301].set_index("Date")["A"]
        want = adj.shift(-2) / adj.shift(-1) - 1
        np.testing.assert_allclose(got.to_numpy(), want.to_numpy(), rtol=1e-14, equal_nan=True)
        # the split is no return: the same targets as the market without it
        p = np.array([_p(d) for d in range(40)])
        np.testing.assert_allclose(got.to_numpy()[:-2], p[2:] / p[1:-1] - 1, rtol=1e-14)


# ---------------------------------------------------------------------------------------------------------
# Price levels of source-adjusted files (ohlcv) stay out of prompts unless asked for
# ---------------------------------------------------------------------------------------------------------
def test_ohlcv_prompts_leave_out_source_adjusted_levels(tmp_path):
    path, days = _ohlcv(tmp_path)
    prices = load_ohlcv_long(path)
    panel = build_panel(prices, 3, 2, 0)
    assert panel.dataset["price_levels_in_prompts"] == [] and "Close" not in panel.rows.prompt.iloc[0]
    assert panel.dataset["prompt_template"] == DEFAULT_PROMPT_TEMPLATE_NO_LEVELS and panel.warnings == []
    assert panel.dataset["kind"] == "ohlcv" and "adjusted by its source" in panel.dataset["adjustment"]
    with pytest.raises(PanelError, match=r"dataset.promptTemplate: \['close'\] print price/volume levels; a kind "
                                         r"ohlcv file's prices are adjusted by its source"):
        build_panel(prices, 3, 2, 0, template="{date} {close:.2f}")
    with pytest.raises(PanelError, match=r"\['volume'\] print .* dataset.priceLevels: omit leaves them out"):
        build_panel(prices, 3, 2, 0, template="{date} {volume}", price_levels="omit")
    asked = build_panel(prices, 3, 2, 0, template="{date} {security} {close:.1f}", price_levels="include")
    r = asked.rows.iloc[0]
    close = 100.0 + 10 * "ABC".index(r.security[0]) + days.get_loc(r.date)
    assert r.prompt == f"{r.date.date()} {r.security} {close:.1f}"
    assert asked.dataset["price_levels_in_prompts"] == ["close"] and len(asked.warnings) == 1
    assert "look-ahead" in asked.warnings[0]
    # priceLevels: omit drops Close from the default template (as auto does for ohlcv)
    assert "Close" not in build_panel(prices, 3, 2, 0, price_levels="omit").rows.prompt.iloc[0]


# ---------------------------------------------------------------------------------------------------------
# The Kaggle download layout; BOM; non-numeric values
# ---------------------------------------------------------------------------------------------------------
def test_kaggle_download_layout_with_supplemental_files(tmp_path):
    _split_market(tmp_path / "flat", T - 3)
    _split_market(tmp_path / "kaggle", T - 3, layout="kaggle")
    flat, kaggle = load_jpx(tmp_path / "flat"), load_jpx(tmp_path / "kaggle")
    assert kaggle.source.endswith("train_files/stock_prices.csv + " + str(tmp_path / "kaggle" /
                                  "supplemental_files" / "stock_prices.csv"))
    assert len(kaggle.calendar) == 40 and kaggle.calendar.equals(flat.calendar)
    for a in ("close", "volume", "factor"):
        pd.testing.assert_frame_equal(getattr(kaggle, a), getattr(flat, a))
    assert _prompt_at_t(tmp_path / "kaggle").equals(_prompt_at_t(tmp_path / "flat"))
    # train_files/ alone (no supplemental_files/) ends on day 25
    (tmp_path / "kaggle" / "supplemental_files" / "stock_prices.csv").unlink()
    assert load_jpx(tmp_path / "kaggle").calendar[-1] == SPLIT_DAYS[25]


def test_supplemental_rows_that_contradict_train_files_are_refused(tmp_path):
    _split_market(tmp_path, layout="kaggle")
    sup = tmp_path / "supplemental_files" / "stock_prices.csv"
    df = pd.read_csv(sup)
    df.loc[1, "Close"] = 1.0  # 2017-02-06 (day 25) of 1301 is also in train_files/
    df.to_csv(sup, index=False)
    with pytest.raises(PanelError, match=rf"{sup}: row 2: \(Date, SecuritiesCode\) = \(2017-02-06, 1301\) is also "
                                         rf"{tmp_path / 'train_files' / 'stock_prices.csv'} row 26 with another "
                                         rf"Close: '1.0' vs '{_p(25)}' \(1 such row\)"):
        load_jpx(tmp_path)


def test_jpx_layouts_that_are_missing_or_ambiguous_are_refused(tmp_path):
    with pytest.raises(PanelError, match=r"no stock_prices.csv: expected .*stock_prices.csv or the Kaggle "
                                         r"download's .*train_files/stock_prices.csv"):
        load_jpx(tmp_path)
    _split_market(tmp_path, layout="kaggle")
    pd.read_csv(tmp_path / "train_files" / "stock_prices.csv").to_csv(tmp_path / "stock_prices.csv", index=False)
    with pytest.raises(PanelError, match=r"both .*stock_prices.csv and .*train_files/stock_prices.csv exist"):
        load_jpx(tmp_path)


def test_csv_with_a_utf8_byte_order_mark_loads(tmp_path):
    path, _ = _ohlcv(tmp_path)
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    pd.testing.assert_frame_equal(load_ohlcv_long(bom).close, load_ohlcv_long(path).close)
    _split_market(tmp_path / "jpx")
    for name in ("stock_prices.csv", "stock_list.csv"):
        f = tmp_path / "jpx" / name
        f.write_bytes(b"\xef\xbb\xbf" + f.read_bytes())
    assert load_jpx(tmp_path / "jpx").names == {"1301": "KYOKUYO", "7203": "TOYOTA"}


@pytest.mark.parametrize("value,why", [("n/a", "not a finite number"), ("NA", "not a finite number"),
                                       ("NaN", "not a finite number"), ("-", "not a finite number"),
                                       ("inf", "not a finite number"), ("0", "must be > 0"),
                                       ("-3.5", "must be > 0")])
def test_a_close_that_is_not_a_price_is_refused_with_file_row_and_value(tmp_path, value, why):
    path, _ = _ohlcv(tmp_path)
    df = pd.read_csv(path, dtype=str)
    df.loc[6, "close"] = value
    df.loc[9, "close"] = ""  # empty: no price that day, allowed
    df.to_csv(path, index=False)
    with pytest.raises(PanelError, match=rf"ohlcv.csv: row 7 \(line 8\): column 'close': {why}: {value!r} \(1 such row"):
        load_ohlcv_long(path)


def test_an_empty_close_is_a_missing_price(tmp_path):
    path, days = _ohlcv(tmp_path)
    df = pd.read_csv(path, dtype=str)
    df.loc[5, "close"] = ""  # AAA on day 5
    df.to_csv(path, index=False)
    assert np.isnan(load_ohlcv_long(path).close.loc[days[5], "AAA"])


def test_jpx_nonnumeric_values_are_refused(tmp_path):
    _split_market(tmp_path)
    f = tmp_path / "stock_prices.csv"
    df = pd.read_csv(f, dtype=str, keep_default_na=False)
    df.loc[4, "AdjustmentFactor"] = "0"
    df.to_csv(f, index=False)
    with pytest.raises(PanelError, match=r"stock_prices.csv: row 5 \(line 6\): column 'AdjustmentFactor': must be > 0: '0'"):
        load_jpx(tmp_path)
    df.loc[4, "AdjustmentFactor"], df.loc[11, "Volume"] = "1.0", "n/a"
    df.to_csv(f, index=False)
    with pytest.raises(PanelError, match=r"stock_prices.csv: row 12 \(line 13\): column 'Volume': not a finite number: 'n/a'"):
        load_jpx(tmp_path)


def test_a_knowledge_cutoff_in_the_test_period_is_a_warning_on_the_console_and_in_the_report():
    """Found by a quant's trial: a model whose cutoff lay after protocol.testStart was evaluated without a word."""
    import datetime as dt

    from pitlab.cli.results import other_warnings
    from pitlab.evaluator.run import cutoff_warnings

    start = dt.date(2017, 1, 1)
    got = cutoff_warnings({"pit": dt.date(2016, 12, 31), "late": dt.date(2017, 1, 1), "none": None}, start)
    assert got == ["model late: knowledge cutoff 2017-01-01 is on or after protocol.testStart 2017-01-01: the model "
                   "may have read about the test period, so its leakage-off R² is not free of look-ahead, and a "
                   "premium near 0 does not show that it is point-in-time"]
    full = {"warnings": ["chronological: only 6 training dates", got[0]],
            "diagnostics": [{"protocol": "chronological", "check": "few-time-clusters",
                             "message": "only 6 training dates"}]}
    assert other_warnings(full) == got  # the check's message is named on the checks line, not twice


def test_an_unadjusted_split_in_a_sampled_rows_window_is_named(tmp_path):
    """Found in a quant's trial: a 2:1 split left in an OHLCV file became a −49 % return in the features and a
    −49 % target, with no word, and changed the headline; the shared S&P 500 file holds such moves too (DISCA and
    DISCK on 2014-08-07, LNT for one day on 2016-05-19)."""
    path, days = _ohlcv(tmp_path)
    df = pd.read_csv(path)
    late = (df.Name == "BBB") & (pd.to_datetime(df.date) >= days[30])
    df.loc[late, ["open", "high", "low", "close"]] /= 2  # BBB's 2:1 split, not adjusted
    df.to_csv(path, index=False)
    prices = load_ohlcv_long(path)
    panel = build_panel(prices, 3, 1, 0, start=days[35].date(), end=days[35].date())  # day 30 is in t−19 … t
    assert panel.warnings == [
        f"dataset: 1 one-day close move beyond −40 % / +67 % enters sampled rows' features or targets in {path}: "
        f"BBB {days[30].date()}: 139 → 70 (×0.504, near a 2:1 split). If the file is not adjusted for splits and "
        "spin-offs these are not returns (pitlab cannot tell a split from a crash): use an adjusted file (JPX: "
        "AdjustmentFactor) or leave the securities out"]
    assert compute_features(prices)["ret_20d"].loc[days[35], "BBB"] == pytest.approx(72.5 / 125 - 1)  # −42 %: used
    # a date whose rows neither see the split in their 20 days nor in their target: nothing to say
    assert build_panel(prices, 3, 1, 0, start=days[25].date(), end=days[25].date()).warnings == []
    # the target's move, t+2: the row at day 28 has close(29) → close(30) as its target
    [w] = build_panel(prices, 3, 1, 0, start=days[28].date(), end=days[28].date()).warnings
    assert f"BBB {days[30].date()}: 139 → 70 (×0.504, near a 2:1 split)" in w


def test_a_jpx_split_is_named_only_without_its_adjustment_factor(tmp_path):
    prices = _split_market(tmp_path / "ok", split_at=T - 3)
    assert build_panel(load_jpx(tmp_path / "ok"), 2, 1, 0, start=SPLIT_DAYS[T].date(),
                       end=SPLIT_DAYS[T].date()).warnings == []  # AdjustmentFactor 0.5: the features see no jump
    prices.loc[prices.AdjustmentFactor == 0.5, "AdjustmentFactor"] = 1.0  # the split printed, its factor left out
    (tmp_path / "bad").mkdir()
    prices.to_csv(tmp_path / "bad" / "stock_prices.csv", index=False)
    (tmp_path / "ok" / "stock_list.csv").rename(tmp_path / "bad" / "stock_list.csv")
    [w] = build_panel(load_jpx(tmp_path / "bad"), 2, 1, 0, start=SPLIT_DAYS[T].date(),
                      end=SPLIT_DAYS[T].date()).warnings
    assert w.startswith("dataset: 1 one-day close move beyond −40 % / +67 % enters") and "1301 " in w
    assert "near a 2:1 split" in w


def test_each_dropped_row_is_named_with_the_day_that_is_missing(tmp_path):
    """Found in a quant's trial: one missing AAPL day dropped 4 rows, and the run said only how many."""
    from pitlab.data.sampling import dropped_note

    path, days = _ohlcv(tmp_path, n_days=60, drop={("BBB", 30)})  # BBB has no row on day 30
    prices = load_ohlcv_long(path)
    panel = build_panel(prices, 3, 11, 0, start=days[28].date(), end=days[38].date())  # days 28 … 38
    gone = {(r["date"], r["why"]) for r in panel.dropped_rows if r["security"] == "BBB"}
    d = lambda k: str(days[k].date())  # noqa: E731
    assert panel.dropped == {"missing_features": 9, "missing_target": 2} and len(panel.dropped_rows) == 11
    assert gone == {(d(28), f"no close on {d(30)} (the target's t+1 or t+2)"),
                    (d(29), f"no close on {d(30)} (the target's t+1 or t+2)"),
                    *((d(k), f"no close or volume on {d(30)}") for k in range(30, 39))}
    note = dropped_note(panel.dropped, len(panel.rows), panel.dropped_rows)
    assert note == (f"; 11 of 33 sampled rows dropped: 9 without features (price history missing: not yet listed, "
                    f"delisted or halted), 2 without a target (no close at t+1 or t+2); e.g. BBB {d(28)}: no close "
                    f"on {d(30)} (the target's t+1 or t+2); BBB {d(29)}: no close on {d(30)} (the target's t+1 or "
                    f"t+2); BBB {d(30)}: no close or volume on {d(30)} (+8 more in results.json)")


@pytest.mark.parametrize("text, lines, fast", [
    ("a,b,c\n1,2,3\n\n4,5,6\n", [2, 4], True),  # a blank line is no record
    ("a,b,c\n1,2,3\n4,5,6", [2, 3], True),  # no newline after the last record
    ("a,b,c\n1,2,3\n\n\n", [2], True),
    ("a,b,c\n", [], True),
    ('a,b,c\n1,"x,y",3\n4,5,6\n', [2, 3], False),  # a quoted comma: the csv module's reading
    ('a,b,c\n1,"x\ny",3\n4,5,6\n', [2, 4], False),  # a record over two lines
    ("a,b,c\r\n1,2,3\r\n4,5,6\r\n", [2, 3], False),
    ("a,b,c\n4,5\n", "row 1 (line 2): 2 fields, the header has 3: '4,5'", False),
    ("a,b,c\n1,2,3\n4,5,6,7\n", "row 2 (line 3): 4 fields, the header has 3: '4,5,6,7'", False),
    ("a,b,c\n \n1,2,3\n", "row 1 (line 2): 1 fields, the header has 3: ' '", False),
])
def test_record_lines_count_commas_where_the_csv_module_would_read_the_same(tmp_path, text, lines, fast):
    """The numpy reading of plain files (no quote, CR or NUL) gives the csv module's lines; any other file, or a
    record with another field count, is left to the csv module, whose error names the row and line."""
    from pitlab.data.panels import _plain_record_lines, _record_lines

    f = tmp_path / "f.csv"
    f.write_bytes(text.encode())
    assert (_plain_record_lines(f, 3) is not None) is fast
    if isinstance(lines, str):
        with pytest.raises(PanelError, match=re.escape(lines)):
            _record_lines(f, 3)
    else:
        assert _record_lines(f, 3).tolist() == lines


def test_the_sp500_file_reads_the_same_with_the_csv_module(data_root):
    """sp500_5yr_ohlcv_long.csv.gz (619,040 records, one per line after the header): the numpy reading gives the
    csv module's line of every record."""
    import csv
    import gzip

    from pitlab.data.panels import _record_lines

    path = data_root / "sp500_5yr" / "sp500_5yr_ohlcv_long.csv.gz"
    with gzip.open(path, "rt", encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        next(reader)
        expected, start = [], reader.line_num + 1
        for values in reader:
            if values:
                expected.append(start)  # the line on which the record starts
            start = reader.line_num + 1
    got = _record_lines(path, 7)
    assert len(got) == len(expected) == 619_040 and got.tolist() == expected


def test_ohlcv_open_high_low_are_neither_required_nor_read(tmp_path):
    """Found by a trial: open, high and low were required but never checked, so ``high=abc`` passed as if read.
    pitlab reads date, close, volume and Name only: a file without the three loads, and one with text in them loads
    to the same prices bit for bit (they are never used)."""
    path, _ = _ohlcv(tmp_path)
    want = load_ohlcv_long(path)
    df = pd.read_csv(path, dtype=str)
    df.drop(columns=["open", "high", "low"]).to_csv(tmp_path / "cvn.csv", index=False)
    df.loc[5, "high"], df.loc[5, "open"] = "abc", "-999"
    df.to_csv(tmp_path / "odd.csv", index=False)
    for variant in ("cvn.csv", "odd.csv"):
        got = load_ohlcv_long(tmp_path / variant)
        assert got.close.equals(want.close) and got.volume.equals(want.volume) and got.close.shape == (40, 3)
