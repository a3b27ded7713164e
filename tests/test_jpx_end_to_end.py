"""examples/leakageeval-jpx.yaml end to end on generated files in the exact Kaggle JPX schema."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from pitlab.cli import app
from pitlab.data.panels import JPX_PRICE_COLUMNS, load_jpx
from pitlab.data.sampling import build_panel
from pitlab.evaluator.protocols import trading_calendar

EXAMPLE = "examples/leakageeval-jpx.yaml"


def write_kaggle_jpx(folder, n_securities=30, seed=0, supplemental_from=None, common_returns=False):
    """stock_prices.csv / stock_list.csv in the Kaggle schema over 2017-01-04..2021-12-30 (the XTKS sessions, as
    the Kaggle files, plus the 2020-10-01 halt: rows present, no prices),
    1:2 and 2:1 splits (AdjustmentFactor), ExpectedDividend mostly
    missing, SupervisionFlag set on some rows; codes 1300+ (the last five listed only from 2019, the first
    three delisted in 2020, not flagged in Universe0). ``supplemental_from`` (a date): the competition's
    download layout instead, train_files/stock_prices.csv before that date, supplemental_files/ from it.
    ``common_returns``: every security follows one return series (no idiosyncratic noise, no split), so a date's
    target is the same for all securities and visible in every prompt's date and past returns: a ridge fitted
    across securities wants no penalty at all."""
    rng = np.random.default_rng(seed)
    common = 0.0003 + 0.015 * rng.standard_normal(3000)
    xtks = trading_calendar("XTKS", "jpx", pd.bdate_range("2017-01-04", "2021-12-30"))
    days = xtks[(xtks >= "2017-01-04") & (xtks <= "2021-12-30")].union(pd.DatetimeIndex(["2020-10-01"]))
    codes = [1301 + 10 * i for i in range(n_securities)]
    frames = []
    for k, code in enumerate(codes):
        d = days[days >= "2019-01-04"] if k >= n_securities - 5 else days
        d = d[d < "2020-06-01"] if k < 3 else d
        ret = 0.0003 + 0.015 * rng.standard_normal(len(d))
        if common_returns:
            ret = common[np.searchsorted(days, d)]
        close = (1000 + 10 * k if common_returns else 1000) * np.exp(np.cumsum(ret))
        factor = np.ones(len(d))
        split_at = rng.integers(50, len(d) - 50)
        if not common_returns:
            factor[split_at] = 0.5 if k % 2 else 2.0
            close[split_at + 1:] *= factor[split_at]  # the raw close jumps on the next day
        df = pd.DataFrame({"RowId": [f"{x:%Y%m%d}_{code}" for x in d], "Date": d.strftime("%Y-%m-%d"),
                           "SecuritiesCode": code, "Open": close.round(1), "High": (close * 1.01).round(1),
                           "Low": (close * 0.99).round(1), "Close": close.round(1),
                           "Volume": rng.integers(1000, 100000, len(d)).astype(float), "AdjustmentFactor": factor,
                           "ExpectedDividend": np.where(rng.random(len(d)) < 0.01, 10.0, np.nan),
                           "SupervisionFlag": rng.random(len(d)) < 0.002, "Target": 0.0})
        halt = df["Date"] == "2020-10-01"
        df.loc[halt, ["Open", "High", "Low", "Close", "Volume"]] = np.nan
        frames.append(df)
    prices = pd.concat(frames).sort_values(["Date", "SecuritiesCode"])
    prices = prices[list(JPX_PRICE_COLUMNS)]
    if supplemental_from is None:
        prices.to_csv(folder / "stock_prices.csv", index=False)
    else:
        for sub, part in (("train_files", prices[prices.Date < supplemental_from]),
                          ("supplemental_files", prices[prices.Date >= supplemental_from])):
            (folder / sub).mkdir()
            part.to_csv(folder / sub / "stock_prices.csv", index=False)
    pd.DataFrame({"SecuritiesCode": codes, "EffectiveDate": 20211230, "Name": [f"CO {c}" for c in codes],
                  "Section/Products": "First Section (Domestic)", "NewMarketSegment": "Prime Market",
                  "33SectorCode": "50", "33SectorName": "Fishery", "17SectorCode": "1",
                  "17SectorName": "FOODS", "NewIndexSeriesSizeCode": "7", "NewIndexSeriesSize": "TOPIX Small 2",
                  "TradeDate": 20211230, "Close": 1000.0, "IssuedShares": 1e7, "MarketCapitalization": 1e10,
                  "Universe0": [k >= 3 for k in range(n_securities)]}).to_csv(folder / "stock_list.csv", index=False)
    return codes


def test_universe0_warns_when_it_picks_a_universe_for_earlier_dates(tmp_path):
    codes = write_kaggle_jpx(tmp_path)
    prices = load_jpx(tmp_path)
    assert prices.universe0 == frozenset(str(c) for c in codes[3:])
    assert pd.Timestamp("2020-10-01") in prices.calendar and prices.close.loc["2020-10-01"].isna().all()
    with pytest.warns(UserWarning, match="Universe0, a snapshot of December 2021, for dates from 2018"):
        panel = build_panel(prices, 10, 6, 0, start=pd.Timestamp("2018-01-01").date(), universe="universe0")
    assert set(panel.rows["security"]) <= prices.universe0 and len(panel.warnings) == 1
    pit = build_panel(prices, 10, 6, 0, start=pd.Timestamp("2018-01-01").date())
    assert pit.warnings == []
    # after the snapshot the flag is not look-ahead: no warning
    late = build_panel(prices, 10, 2, 0, start=pd.Timestamp("2021-12-01").date(), universe="universe0")
    assert late.warnings == []


@pytest.mark.slow
def test_jpx_example_end_to_end_on_generated_kaggle_files(tmp_path):
    (tmp_path / "jpx").mkdir()
    write_kaggle_jpx(tmp_path / "jpx", supplemental_from="2021-12-06")  # as downloaded, train + supplemental
    with open(EXAMPLE) as f:
        doc = yaml.safe_load(f)
    spec = doc["spec"]
    spec["dataset"]["universeSize"] = 20  # the generated market has 30 securities
    spec["dataset"]["dates"]["count"] = 16
    spec["bootstrap"]["resamples"] = 10  # the minimum: statistics at 384 dimensions cost ~0.1 s per fit here
    path = tmp_path / "jpx.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["run", str(path), "--data-root", str(tmp_path), "--out", str(tmp_path / "out")],
                           env={"COLUMNS": "300"})
    text = re.sub(r"\s+", " ", r.output)
    assert r.exit_code == 0, text
    res = json.loads(next((tmp_path / "out").rglob("results.json")).read_text())
    m, = res["models"]
    assert res["panel"]["n_securities"] == 20 and res["panel"]["n_rows"] <= 20 * 16
    assert set(m["protocols"]) == {"walk-forward", "purged-kfold"}
    assert len(m["protocols"]["walk-forward"]["r2_per_fold"]) == 4
    assert [e["embargo_days"] for e in m["embargo_robustness"]] == [2, 20]
    assert all(np.isfinite(x) for x in (m["r2_off"], m["r2_on"], m["premium"]))
    assert m["embedding_dim"] == 384 and len(m["digest"]) == 64
    assert res["spec"]["dataset"]["universe"] == "point-in-time"
    # clean files: no warning about the data or the penalty; the only ones possible on so small a panel are the
    # checks that did nothing (results.diagnostics); the two-way interval has no bias reason for "unreliable"
    empty = {f"{d['protocol']}: {d['message']}" for d in res["diagnostics"]}
    assert {d["check"] for d in res["diagnostics"]} >= {"embargo-removed-nothing", "few-time-clusters",
                                                        "few-rows-per-dimension"}  # ≤ 20 × 16 rows, 384 dims
    few = ("bootstrap.resamples: 10: each half's 5 replicates estimate its sd to about ±35 %, so the interval's "
           "width moves about that much with bootstrap.seed; use 100 or more (the default is 200) for results you "
           "report")  # the test's 10 resamples (a quant's trial ran 10-20 without a word)
    assert set(res["warnings"]) == empty | {few}, res["warnings"]
    assert f"warning: {few}" in text
    assert m["verdict_reasons"] == [] and m["premium_bias"] is not None and m["verdict"] != "unreliable"
    assert m["alpha_grid_widenings"] == 0 and res["bootstrap"]["cluster"] == "two-way"
    assert res["bootstrap"]["replicates_resampling_securities"] == 5
    _coherent(res)
    assert [f.split("/jpx/")[1] for f in res["dataset"]["files"]] == [
        "train_files/stock_prices.csv", "supplemental_files/stock_prices.csv", "stock_list.csv"]
    assert res["dataset"]["price_levels_in_prompts"] == ["close"]
    assert ("Prices: Kaggle JPX: Close and Volume as traded that day (unadjusted); prompts are adjusted as of t with "
            "the AdjustmentFactor rows dated before t only") in next((tmp_path / "out").rglob("report.md")).read_text()
    assert res["panel"]["calendar"] == ["2017-01-04", "2021-12-30"]  # supplemental_files/ extends train_files/
    # embargo and purge days are XTKS sessions; the price file's halt day is not one
    assert res["protocol"]["leakage_off"]["calendar"] == "XTKS"
    assert res["panel"]["trading_calendar"]["price_file_days_not_sessions"] == ["2020-10-01"]
    assert res["panel"]["trading_calendar"]["sessions_missing_from_price_file"] == 0
    # the halt day has no prices: no panel row is dated 2020-10-01 or has a target spanning it
    assert (next((tmp_path / "out").rglob("report.html"))).is_file()


def _coherent(res: dict) -> None:
    """No estimate whose interval excludes it, or whose selection ended at a grid edge, is called significant."""
    items = [(m["premium"], m["premium_ci"], m["verdict"], m["verdict_reasons"]) for m in res["models"]]
    items += [(p["premium"], p["premium_ci"], p["verdict"], p["verdict_reasons"]) for m in res["models"]
              for p in m["protocols"].values()]
    for point, (lo, hi), verdict, reasons in items:
        if not lo <= point <= hi or any("penalty" in r for r in reasons):
            assert verdict == "unreliable", (point, lo, hi, verdict, reasons)
        assert (verdict == "unreliable") == bool(reasons)


@pytest.mark.slow
def test_jpx_example_on_files_whose_penalty_selection_hits_the_grid_edge(tmp_path):
    """One return series for every security: a date's target is in every prompt of that date (its date and past
    returns), and a ridge fitted across securities wants (almost) no penalty. The shipped example (security-cv)
    hits the grid's lower edge and widens the grid; the example as shipped before (gcv, now behind
    allowRowLevelSelection) still ends at the widened grid's edge and reports unreliable, never significant."""
    (tmp_path / "jpx").mkdir()
    write_kaggle_jpx(tmp_path / "jpx", common_returns=True)
    with open(EXAMPLE) as f:
        doc = yaml.safe_load(f)
    spec = doc["spec"]
    spec["dataset"]["universeSize"] = 20
    spec["dataset"]["dates"]["count"] = 16
    spec["bootstrap"]["resamples"] = 10
    runs = {}
    for name, regression in (("shipped", {}), ("gcv", {"selection": "gcv", "allowRowLevelSelection": True})):
        doc["metadata"]["name"] = f"jpx-{name}"
        spec["regression"].update(regression)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        r = CliRunner().invoke(app, ["run", str(path), "--data-root", str(tmp_path), "--out", str(tmp_path / "out")],
                               env={"COLUMNS": "300"})
        assert r.exit_code == 0, re.sub(r"\s+", " ", r.output)
        runs[name] = (json.loads((tmp_path / "out" / f"jpx-{name}" / "eval" / "results.json").read_text()), r.output)
    shipped, _ = runs["shipped"]
    m, = shipped["models"]
    # security-cv chose the smallest penalty 0.1 of the shipped grid: widened once by two decades, then inside
    assert m["alpha_grid_widenings"] >= 1 and min(m["alphas"]) <= 0.001
    assert not any("still ends at an edge" in w for w in shipped["warnings"])
    _coherent(shipped)
    gcv, output = runs["gcv"]
    g, = gcv["models"]
    assert g["alpha_grid_widenings"] == 3 and min(g["alphas"]) == pytest.approx(1e-7)
    assert any(w.startswith("regression.selection: gcv with allowRowLevelSelection: true") for w in gcv["warnings"])
    assert any("still ends at an edge of the α grid after 3 widening(s)" in w for w in gcv["warnings"])
    at_edge = [k for k, p in g["protocols"].items()
               if any("chose the smallest penalty 1e-07 of the grid" in r for r in p["verdict_reasons"])]
    assert at_edge and all(g["protocols"][k]["verdict"] == "unreliable" for k in at_edge)
    _coherent(gcv)
    report = (tmp_path / "out" / "jpx-gcv" / "eval" / "report.md").read_text()
    html = (tmp_path / "out" / "jpx-gcv" / "eval" / "report.html").read_text()
    assert "unreliable" in report and "chose the smallest penalty 1e-07" in html
