"""Walk-forward and purged K-fold estimators, the zero benchmark, bootstrap p-values, control by cutoff, and the
full protocol set end to end (report.html, ``pitlab report``, reproducibility record)."""

from __future__ import annotations

import datetime as dt
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import exchange_calendars as xcals
import pytest
from sklearn.linear_model import Ridge
from sklearn.model_selection import TimeSeriesSplit
from typer.testing import CliRunner

import pitlab.evaluator.run as run_mod
from pitlab.api.artifacts import MODEL_CARD
from pitlab.api.leakageeval import LeakageEvalSpec
from pitlab.cli import app
from pitlab.data.types import Panel
from pitlab.evaluator.bootstrap import bootstrap_p_value, cutoff_control, draw_cluster_weights
from pitlab.evaluator.estimates import AlphaSelection, Fold, FoldsR2, PanelStats, center, leakage_off_r2
from pitlab.evaluator.linalg import Backend
from pitlab.evaluator.protocols import PurgedKFoldSplit, WalkForwardSplit, trading_calendar
from pitlab.evaluator.run import run_leakage_eval

NOPENALTY_DUP = AlphaSelection("gcv", duplicate_aware=False)


def date_folds_r2(X: np.ndarray, y: np.ndarray, security: np.ndarray, n_securities: int, fold_train: np.ndarray,
                  fold_test: np.ndarray, weights: np.ndarray, alphas,
                  selection: AlphaSelection = AlphaSelection(), benchmark: str = "train_mean",
                  y_shift: float = 0.0, alpha_index: np.ndarray | None = None,
                  backend: Backend | None = None) -> FoldsR2:
    """R² of a protocol whose folds are row masks (walk-forward, purged K-fold) for every weighting, from rows
    (the pipeline calls :meth:`PanelStats.protocol_errors` on its statistics; this form is compared with
    scikit-learn here).

    ``X`` float64 [n_rows, d] and ``y`` [n_rows], already centred (:func:`center`; ``y_shift`` = the mean
    removed from y); ``security`` int [n_rows] in 0..n_securities-1; ``fold_train``, ``fold_test`` bool
    [K, n_rows]; ``weights`` [B, n_securities] multiplicities. Per fold, per-security statistics of its
    training rows are built once and every weighting is a weighted sum of them; SSE/SST come from the test rows.
    """
    st = PanelStats.build(X, y, security, n_securities, fold_train[0], fold_test[0], backend, centered=True,
                          y_shift=y_shift)
    return st.protocol_errors([Fold(tr, te) for tr, te in zip(fold_train, fold_test)], weights, alphas,
                              selection, benchmark, alpha_index, diagnostics=np.asarray(weights).shape[0] == 1)


def _panel_arrays(S=12, T=15, d=3, seed=0):
    rng = np.random.default_rng(seed)
    cal = pd.bdate_range("2021-01-04", periods=3 * T + 5)
    dates = cal[:3 * T:3]
    di = np.repeat(np.arange(T), S)
    sec = np.tile(np.arange(S), T)
    X = rng.standard_normal((S * T, d)) + 3.0
    y = X[:, 0] * 0.4 + rng.standard_normal(S * T) + 0.2
    return cal, dates[di], sec, X, y


def test_walk_forward_blocks_are_sklearn_timeseriessplit_of_the_dates():
    cal, dates, sec, X, y = _panel_arrays()
    wf = WalkForwardSplit(4, 0, cal).apply(dates)
    u = np.unique(dates)
    for (tr, te), (tr_ref, te_ref) in zip(wf.split(X), TimeSeriesSplit(4).split(u)):
        assert set(dates[te]) == set(u[te_ref]) and set(dates[tr]) == set(u[tr_ref])
    assert wf.get_n_splits() == 4


def test_splitters_hold_parameters_and_take_the_dates_at_split_time():
    from pitlab.evaluator.protocols import (ChronologicalSplit, ProtocolError, check_group_k_folds,
                                            protocol_splitters)

    cal, dates, sec, X, y = _panel_arrays()
    u = np.unique(dates)
    proto = LeakageEvalSpec.model_validate({
        "models": [{"name": "m", "uri": "/m"}], "dataset": {"kind": "ohlcv", "uri": "x"},
        "protocol": {"trainEnd": str(pd.Timestamp(u[5]).date()), "testStart": str(pd.Timestamp(u[6]).date()),
                     "embargoDays": 3, "walkForwardFolds": 3, "purgedFolds": 4,
                     "protocols": ["chronological", "group-kfold", "walk-forward", "purged-kfold"]}}).protocol
    sp = protocol_splitters(proto, cal)
    assert list(sp) == ["chronological", "walk-forward", "purged-kfold"]
    assert [s.get_n_splits() for s in sp.values()] == [1, 3, 4]
    assert not any(hasattr(s, "train_mask") or hasattr(s, "fold_train") for s in sp.values())  # no data inside
    for s in sp.values():  # split(dates) yields what the applied folds hold, for any panel given at split time
        for half in (dates, dates[: len(dates) // 2 * 1]):
            folds = s.apply(half)
            got = list(s.split(half))
            assert len(got) == folds.get_n_splits()
            for (tr, te), (tr2, te2) in zip(got, folds.split()):
                assert np.array_equal(tr, tr2) and np.array_equal(te, te2)
    ch = sp["chronological"].apply(dates)
    assert ch.n_train == int((dates <= u[5]).sum()) - int(ch.n_embargoed) and ch.embargo_days == 3
    ch0 = sp["chronological"].with_embargo(0)
    assert isinstance(ch0, ChronologicalSplit) and ch0.embargo_days == 0 and sp["chronological"].embargo_days == 3
    with warnings.catch_warnings():  # the panel's dates are sessions apart: no training label reaches the test
        warnings.simplefilter("error")  # period, so embargo 0 changes nothing and says nothing (it warned before)
        assert ch0.apply(dates).n_embargoed == 0
    assert sp["walk-forward"].description.startswith("walk-forward")
    assert "López de Prado" in sp["purged-kfold"].description
    with pytest.raises(ProtocolError, match=r"protocol.groupKFolds: 5 folds exceed the 4 securities"):
        check_group_k_folds(5, 4)
    check_group_k_folds(4, 4)


@pytest.mark.parametrize("protocol", ["walk-forward", "purged-kfold"])
def test_date_folds_r2_equals_sklearn_ridge_per_fold_point_and_replicate(protocol):
    cal, dates, sec, X, y = _panel_arrays()
    S = 12
    sp = (WalkForwardSplit(3, 4, cal) if protocol == "walk-forward" else PurgedKFoldSplit(3, 2, cal)).apply(dates)
    Xc, yc, mu = center(X, y)
    w = draw_cluster_weights(S, 1, seed=3)
    W = np.vstack([np.ones((1, S)), w])
    for bench in ("train_mean", "zero"):
        fr = date_folds_r2(Xc, yc, sec, S, sp.fold_train, sp.fold_test, W, [7.0], NOPENALTY_DUP, bench, mu)
        for b, mult in enumerate(W.astype(int)):
            r2s, sse_t, sst_t = [], 0.0, 0.0
            for tr, te in sp.split(X):
                tr = np.repeat(tr, mult[sec[tr]])
                te = np.repeat(te, mult[sec[te]])
                m = Ridge(alpha=7.0).fit(X[tr], y[tr])
                sse = np.sum((y[te] - m.predict(X[te])) ** 2)
                sst = np.sum((y[te] - (y[tr].mean() if bench == "train_mean" else 0.0)) ** 2)
                r2s.append(1 - sse / sst)
                sse_t, sst_t = sse_t + sse, sst_t + sst
            np.testing.assert_allclose(fr.r2[b], r2s, rtol=0, atol=1e-9)
            assert fr.mean[b] == pytest.approx(np.mean(r2s), abs=1e-9)
            assert fr.pooled[b] == pytest.approx(1 - sse_t / sst_t, abs=1e-9)


def test_zero_benchmark_is_gu_kelly_xiu_r2_on_the_unshifted_target():
    cal, dates, sec, X, y = _panel_arrays()
    train, test = np.arange(len(y)) < 100, np.arange(len(y)) >= 120
    st = PanelStats.build(X, y, sec, 12, train, test)
    r2 = leakage_off_r2(st, np.ones((1, 12)), [2.0], NOPENALTY_DUP, benchmark="zero").r2[0]
    m = Ridge(alpha=2.0).fit(X[train], y[train])
    assert r2 == pytest.approx(1 - np.sum((y[test] - m.predict(X[test])) ** 2) / np.sum(y[test] ** 2), abs=1e-10)
    r2_mean = leakage_off_r2(st, np.ones((1, 12)), [2.0], NOPENALTY_DUP).r2[0]
    assert r2_mean == pytest.approx(
        1 - np.sum((y[test] - m.predict(X[test])) ** 2) / np.sum((y[test] - y[train].mean()) ** 2), abs=1e-10)


def test_bootstrap_p_value_hand_cases():
    assert bootstrap_p_value(np.arange(1.0, 20.0)) == pytest.approx(2 * 1 / 20)  # no replicate <= 0
    assert bootstrap_p_value(np.array([-1.0, 1.0, 2.0, 3.0])) == pytest.approx(2 * 2 / 5)
    assert bootstrap_p_value(np.array([-2.0, -1.0, 1.0, 2.0, np.nan])) == 1.0
    assert np.isnan(bootstrap_p_value(np.array([np.nan])))


def test_cutoff_control_slope_and_difference_hand_computed():
    cut = {"a": dt.date(2020, 1, 1), "b": dt.date(2021, 1, 1), "c": dt.date(2022, 1, 1), "n": None}
    pts = {"a": 0.1, "b": 0.2, "c": 0.4, "n": 9.0}
    reps = {"a": np.array([0.1, 0.0, 0.2]), "b": np.array([0.2, 0.2, 0.2]), "c": np.array([0.3, 0.4, 0.2]),
            "n": np.zeros(3)}
    cc = cutoff_control(["a", "b", "c", "n"], cut, pts, reps, 0.5)
    x = np.array([0.0, 366, 731]) / 365.25
    xc = x - x.mean()
    assert cc["models"] == ["a", "b", "c"]
    assert cc["slope_per_year"] == pytest.approx((np.array([0.1, 0.2, 0.4]) - 0.7 / 3) @ xc / (xc @ xc))
    slopes = [(np.array(r) - np.mean(r)) @ xc / (xc @ xc) for r in ([0.1, 0.2, 0.3], [0.0, 0.2, 0.4], [0.2, 0.2, 0.2])]
    assert cc["slope_ci"] == pytest.approx(list(np.percentile(slopes, [25, 75])))
    assert cc["earliest_minus_latest"] == pytest.approx(-0.3)
    assert cc["earliest_minus_latest_ci"] == pytest.approx(list(np.percentile([-0.2, -0.4, 0.0], [25, 75])))
    assert cutoff_control(["a", "n"], cut, pts, reps, 0.5) is None


@pytest.fixture()
def fake_models(tmp_path, monkeypatch):
    table: dict[str, dict[str, np.ndarray]] = {}

    def fake_embed(model_dir, texts, **kw):
        kw["info"].update(kind="encoder", digest=Path(model_dir).name.ljust(64, "0"), pooling="mean",
                          n_truncated=0, cache_hit=False)
        return np.stack([table[Path(model_dir).name][t] for t in texts]).astype(np.float32)

    monkeypatch.setattr(run_mod, "embed_texts", fake_embed)

    def add(name, prompts, X):
        folder = tmp_path / "models" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        table[name] = dict(zip(prompts, X))
        return folder, "auto"

    return add


def test_full_protocol_set_end_to_end_reproducible_with_html_and_report_command(tmp_path, fake_models):
    S, T, d = 30, 20, 8
    cal = trading_calendar("XNYS", "ohlcv", pd.bdate_range("2019-01-01", "2019-12-31"))  # the ohlcv default
    cal = cal[(cal >= "2019-01-01") & (cal <= "2019-12-31")].rename(None)
    dates = cal[5:5 + 3 * T:3]
    rows = pd.DataFrame({"date": np.repeat(dates.to_numpy(), S), "security": np.tile([f"S{i:02d}" for i in range(S)], T)})
    rows["prompt"] = [f"{a.date()} {b}" for a, b in zip(rows["date"], rows["security"])]
    rng = np.random.default_rng(0)
    di = np.repeat(np.arange(T), S)
    effect = rng.standard_normal(T)
    rows["target"] = effect[di] + rng.standard_normal(len(rows))
    prompts = rows["prompt"].tolist()
    X_mem = rng.standard_normal((T, d))[di] + 0.5 * rng.standard_normal((len(rows), d))
    models = {"early": fake_models("early", prompts, rng.standard_normal((len(rows), d))),
              "late": fake_models("late", prompts, X_mem)}
    # "late" states its cutoff in its model card (a pitlab-trained folder): no knowledgeCutoff typed for it
    (models["late"][0] / MODEL_CARD).write_text(json.dumps({"knowledgeCutoff": "2020-01-01", "method": "full"}))
    spec = LeakageEvalSpec.model_validate({
        "models": [{"name": "early", "uri": "/m/early", "knowledgeCutoff": "2015-01-01"},
                   {"name": "late", "uri": "/m/late"}],
        "dataset": {"kind": "ohlcv", "uri": "synthetic"},
        "protocol": {"trainEnd": str(dates[12].date()), "testStart": str(dates[13].date()), "embargoDays": 3,
                     "groupKFolds": 4, "protocols": ["chronological", "group-kfold", "walk-forward", "purged-kfold"],
                     "walkForwardFolds": 3, "purgedFolds": 4, "embargoRobustness": [0, 10]},
        "bootstrap": {"resamples": 50, "seed": 7, "cluster": "security"},
        "regression": {"alphas": [1.0, 10.0, 100.0, 1000.0], "selection": "gcv", "allowRowLevelSelection": True,
                       "benchmark": "zero"}})
    panel = Panel(rows=rows, calendar=cal, source="synthetic")
    res = run_leakage_eval(spec, panel, models, tmp_path / "a")
    res2 = run_leakage_eval(spec, panel, models, tmp_path / "b")
    strip = lambda r: {k: v for k, v in r.items() if k not in ("created", "timings")}  # noqa: E731
    assert json.dumps(strip(res), sort_keys=True) == json.dumps(strip(res2), sort_keys=True)  # bit-identical
    early, late = res["models"]
    # the date-recognising model leaks under GroupKFold and purged K-fold (both mix dates), not walk-forward
    assert late["premium"] > 0.2 and late["premium_ci"][0] > 0 and late["premium_p_value"] < 0.05
    # under GCV its replicates sit 0.73 bootstrap sd below the point estimate: within the 1 sd limit, significant
    assert late["premium_bias"] == pytest.approx(-0.0913, abs=1e-4) and late["premium_sd"] == pytest.approx(0.1255,
                                                                                                          abs=1e-4)
    # the planted effect is a date effect: market-neutral, nothing is left (its interval contains 0)
    mn = late["market_neutral"]
    assert mn["premium_ci"][0] < 0 < mn["premium_ci"][1] and mn["verdict"] == "not significant"
    # the checks that did nothing here are stated: fold 4 of purged K-fold ends the panel, nothing after it
    checks = {(c["check"], c["protocol"]) for c in res["diagnostics"]}
    assert ("purge-removed-nothing", "purged-kfold") in checks and ("few-time-clusters", "chronological") in checks
    assert late["verdict"] == "significant" and late["verdict_reasons"] == []
    wf, pk = late["protocols"]["walk-forward"], late["protocols"]["purged-kfold"]
    assert len(wf["r2_per_fold"]) == 3 and len(pk["r2_per_fold"]) == 4
    assert wf["r2"] == pytest.approx(np.mean(wf["r2_per_fold"]))
    assert wf["premium"] == pytest.approx(late["r2_on"] - wf["r2"]) and wf["verdict"] == "significant"
    assert pk["premium"] == pytest.approx(late["r2_on"] - pk["r2_pooled"])
    assert [e["embargo_days"] for e in late["embargo_robustness"]] == [0, 10]
    assert late["embargo_robustness"][1]["n_train"] < late["n_train"] < late["embargo_robustness"][0]["n_train"]
    # each length says how many rows it removed; kept + removed is every row up to trainEnd at each length
    e0, e10 = late["embargo_robustness"]
    off = res["protocol"]["leakage_off"]
    assert e0["n_embargoed"] == 0 < off["n_embargoed"] < e10["n_embargoed"]
    assert e0["n_train"] == off["n_train"] + off["n_embargoed"] == e10["n_train"] + e10["n_embargoed"]
    assert res["benchmark"] == "zero" and "Σy²" in res["r2_definition"]
    assert res["regression"]["alpha_selection"] == "gcv"  # one method for every protocol
    cc = res["cutoff_control"]
    assert (early["knowledge_cutoff"], late["knowledge_cutoff"]) == ("2015-01-01", "2020-01-01")
    assert (cc["earliest"], cc["latest"]) == ("early", "late")
    assert cc["earliest_minus_latest"] == pytest.approx(early["premium"] - late["premium"])
    assert cc["earliest_minus_latest_verdict"] == "significant"  # the same bias, in the paired difference
    assert set(res["protocol_reductions"]) == {"walk-forward", "purged-kfold"}
    # what produced the numbers
    assert early["digest"].startswith("early") and res["seed"] == 7
    assert res["spec"]["protocol"]["walkForwardFolds"] == 3 and "cuda" in res["device"]
    assert res["spec"]["bootstrap"]["reselectPenalty"] is True and res["spec"]["dataset"]["calendar"] == "auto"
    assert res["spec"]["regression"]["device"] == "auto"
    import sklearn
    import torch
    import transformers
    assert res["versions"]["torch"] == torch.__version__ and res["versions"]["numpy"] == np.__version__
    assert res["versions"]["transformers"] == transformers.__version__
    assert res["versions"]["scikit-learn"] == sklearn.__version__
    assert res["versions"]["exchange_calendars"] == xcals.__version__
    stat_dev = res["device"]["statistics"]
    assert (stat_dev["library"], stat_dev["dtype"]) == (("torch", "float64") if torch.cuda.is_available()
                                                        else ("numpy", "float64"))
    assert res["device"]["blas"] and res["device"]["blas"][0]["threads"] >= 1
    assert res["bootstrap"]["reselect_penalty"] is True and res["bootstrap"]["seed"] == 7
    assert res["protocol"]["leakage_off"]["calendar"] == "XNYS"
    assert res["panel"]["trading_calendar"]["name"] == "XNYS"
    assert res["panel"]["trading_calendar"]["price_file_days_not_sessions"] == []
    out = tmp_path / "a"
    for f in ("report.md", "report.html", "premium.png", "r2_by_fold.png", "premium_vs_cutoff.png"):
        assert (out / f).stat().st_size > 0
    html = (out / "report.html").read_text()
    assert "Protocols side by side" in html and "Control by knowledge cutoff" in html and "r2_by_fold.png" in html
    import numpy  # the provenance footer is readable text, not an escaped Python dict
    assert f"numpy {numpy.__version__}, " in html and "&#39;" not in html and "statistics library numpy" in html
    md = (out / "report.md").read_text()
    # which rows each protocol's R² is on (a trial read all-row R²(on) beside test-row R² as like with like)
    assert ("| model | R² chronological (its test rows) | R² GroupKFold (all rows) | R² walk-forward (mean of folds) "
            "(its test folds) | R² purged K-fold (pooled) (its test folds) | R²(on, all rows) − R²(walk-forward)") in md
    assert "## walk-forward: R² by fold" in md and "## Embargo robustness" in md
    assert (f"r2_off / premium (embargo 10: {e10['n_train']} rows, {e10['n_embargoed']} removed)" in md
            and f"(embargo {off['embargo_days']}: {off['n_train']} rows, {off['n_embargoed']} removed)" in md)
    # pitlab report rebuilds the report files from results.json alone
    for f in ("report.md", "report.html", "r2_by_fold.png"):
        (out / f).unlink()
    r = CliRunner().invoke(app, ["report", str(out)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert (out / "report.md").read_text() == md and (out / "report.html").read_text() == html
    assert (out / "r2_by_fold.png").stat().st_size > 0
    # ... also when given the run folder out/<name>, whose eval/ holds results.json (found by a new user)
    run = tmp_path / "run"
    run.mkdir()
    out.rename(run / "eval")
    (run / "eval" / "report.md").unlink()
    r = CliRunner().invoke(app, ["report", str(run)], env={"COLUMNS": "400"})
    assert r.exit_code == 0 and (run / "eval" / "report.md").read_text() == md, r.output
    assert not (run / "report.md").exists()
    r = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")], env={"COLUMNS": "400"})
    assert r.exit_code == 2 and "no results.json here nor in" in r.output


def test_the_consoles_title_names_the_benchmark_the_run_used(tmp_path, monkeypatch):
    """Found in a quant's trial: with regression.benchmark zero the console's title said "benchmark: training mean"."""
    from pitlab.api.layout import EvaluationLayout
    from pitlab.cli.results import say_results

    titles = []
    monkeypatch.setattr("pitlab.cli.results.print_results_table", lambda r, title: titles.append(title))
    for name, bench in (("z", "zero"), ("m", "training mean")):
        out = Path(EvaluationLayout(tmp_path / name).outputs.results)
        out.parent.mkdir(parents=True)
        out.write_text(json.dumps({"benchmark": bench, "warnings": []}))
    say_results({"z": {"models": {}}, "m": {"models": {}}, "gone": {"models": {}}}, tmp_path)
    assert titles == ["Leakage evaluation z (R² out of sample, benchmark: zero)",
                      "Leakage evaluation m (R² out of sample, benchmark: training mean)",
                      "Leakage evaluation gone (R² out of sample, benchmark: training mean)"]  # no results.json
