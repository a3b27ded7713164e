"""Verdicts that cannot contradict their interval (unreliable: point outside, bias, grid edge), the guarded
penalty selection (gcv refused, grid widening), report.html's tables, and the date / two-way clustered
bootstrap (row weights, date structure of the protocols, torch = numpy, reproducibility)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from sklearn.linear_model import Ridge
from typer.testing import CliRunner

import pitlab.evaluator.run as run_mod
import pitlab.evaluator.targets as targets_mod
from pitlab.api import SpecError
from pitlab.api.leakageeval import LeakageEvalSpec
from pitlab.api.load import load_resource
from pitlab.cli import app
from pitlab.data.types import Panel
from pitlab.evaluator.bootstrap import (BIAS_LIMIT, PremiumReplicates, draw_cluster_weights, draw_weights, judge,
                                       paired_reductions, replicate_row_folds, row_weights)
from pitlab.evaluator.estimates import AlphaSelection, Fold, PanelStats, group_kfold_folds
from pitlab.evaluator.linalg import Backend
from pitlab.evaluator.protocols import security_folds, trading_calendar
from pitlab.evaluator.report import render_html, render_markdown
from pitlab.evaluator.ridge import RowStats, SuffStats
from pitlab.evaluator.run import fold_edges, run_leakage_eval, widen_grid
from pitlab.evaluator.targets import grid_note
from pitlab.api.summary import compact_results, premium_summary

ALPHAS = [0.1, 1.0, 10.0, 100.0, 1000.0]
REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- verdicts

def test_judge_three_reasons_for_unreliable_and_never_significant():
    reps = np.linspace(0.1, 0.3, 101)  # CI [0.105, 0.295] at 95 %, mean 0.2, sd 0.0586
    clean = judge(0.2, reps, 0.95)
    assert clean["verdict"] == "significant" and clean["reasons"] == []
    assert clean["ci"] == pytest.approx([0.105, 0.295]) and clean["bias"] == pytest.approx(0.0, abs=1e-15)
    sd = float(np.std(reps, ddof=1))
    assert clean["sd"] == pytest.approx(sd)
    # the JPX case of issue 16: a point estimate its own interval excludes is never significant
    out = judge(-0.6467, np.linspace(-3.4638, -1.5984, 101), 0.95)
    assert out["verdict"] == "unreliable" and "lies outside its interval" in out["reasons"][0]
    # bias just above / below BIAS_LIMIT × sd (point inside the interval both times)
    above = judge(0.2 - (BIAS_LIMIT + 0.01) * sd, reps, 0.95)
    below = judge(0.2 - (BIAS_LIMIT - 0.01) * sd, reps, 0.95)
    assert above["verdict"] == "unreliable" and above["reasons"] == [
        f"bootstrap bias {above['bias']:+.4g} exceeds 1.00 × the bootstrap sd {sd:.4g}"]
    assert below["verdict"] == "significant"
    # a grid edge alone
    edge = judge(0.2, reps, 0.95, ["leakage-off chose the smallest penalty 0.1 of the grid"])
    assert edge["verdict"] == "unreliable"
    assert edge["reasons"] == ["leakage-off chose the smallest penalty 0.1 of the grid"]
    # not significant stays so when clean
    assert judge(0.0, np.linspace(-0.1, 0.1, 101), 0.95)["verdict"] == "not significant"


def test_reductions_inherit_the_grid_edges_of_their_models():
    reds = paired_reductions(["a", "b"], {"a": 0.3, "b": 0.1},
                             {"a": np.linspace(0.2, 0.4, 101), "b": np.linspace(0.0, 0.2, 101)}, 0.9,
                             {"b": ["leakage-on fold 2 chose the smallest penalty 0.1 of the grid"]})
    r, = reds
    assert r["verdict"] == "unreliable" and r["reasons"] == ["b: leakage-on fold 2 chose the smallest penalty 0.1 of "
                                                             "the grid"]
    assert r["bias"] == pytest.approx(0.0, abs=1e-12)


def test_fold_edges_and_grid_widening():
    phrases, lower, upper = fold_edges("leakage-on", np.array([0, 2, 4]), np.array([300.0, 20.0, 1.4]), ALPHAS)
    assert (lower, upper) == (True, False)  # the largest penalty with 0.4 effective parameters is "no signal"
    assert phrases == ["leakage-on fold 1 chose the smallest penalty 0.1 of the grid"]
    phrases, lower, upper = fold_edges("leakage-off", np.array([4]), np.array([3.5]), ALPHAS)
    assert (lower, upper) == (False, True)
    assert phrases == ["leakage-off chose the largest penalty 1000 of the grid yet fits 2.5 effective parameters"]
    assert fold_edges("x", np.array([0]), np.array([5.0]), [1.0]) == ([], False, False)
    # folds at one edge are named together, once
    phrases, lower, upper = fold_edges("leakage-on", np.array([0, 0, 0, 0, 4, 2, 4]),
                                       np.array([9.0, 9.0, 9.0, 9.0, 3.5, 2.0, 2.2]), ALPHAS)
    assert (lower, upper) == (True, True)
    assert phrases == ["leakage-on folds 1–4 chose the smallest penalty 0.1 of the grid",
                       "leakage-on folds 5, 7 chose the largest penalty 1000 of the grid yet fit 1.2–2.5 effective "
                       "parameters"]
    assert grid_note([1e-7, 1e-6, 0.1, 1e5], 3) == (" (regression.alphas widened 3 times, 2 decades each, to "
                                                    "1e-07 … 100000: 4 values)") and grid_note(ALPHAS, 0) == ""
    assert widen_grid(ALPHAS, True, False) == pytest.approx([0.001, 0.01] + ALPHAS)
    assert widen_grid(ALPHAS, False, True) == pytest.approx(ALPHAS + [1e4, 1e5])
    assert widen_grid([10.0, 1.0], True, True) == pytest.approx([0.01, 0.1, 1.0, 10.0, 100.0, 1000.0])


# ---------------------------------------------------------------- the shipped examples: never significant when
# the interval excludes the point estimate

def _example_specs() -> list[tuple[str, dict]]:
    out = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] == "LeakageEval":
            out.append((path.name, doc["spec"]))
        for i, ev in enumerate(doc["spec"].get("evaluations", [])):
            out.append((f"{path.name}[{i}]", ev["spec"]))
    return out


@pytest.fixture()
def fake_embed(tmp_path, monkeypatch):
    table: dict[str, dict[str, np.ndarray]] = {}

    def embed(model_dir, texts, **kw):
        emb = table[Path(model_dir).name]
        kw["info"].update(kind="encoder", digest="0" * 64, pooling="mean", n_truncated=0, cache_hit=False)
        return np.stack([emb[t] for t in texts]).astype(np.float32)

    monkeypatch.setattr(run_mod, "embed_texts", embed)

    def add(name: str, prompts: list[str], X: np.ndarray) -> tuple[Path, str]:
        folder = tmp_path / "models" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        table[name] = dict(zip(prompts, X))
        return folder, "auto"

    return add


def _panel_around(spec: LeakageEvalSpec, S=24, T=24, d=6, seed=0):
    """A synthetic panel whose dates straddle the spec's trainEnd/testStart, on the spec's exchange calendar."""
    tr_end = pd.Timestamp(spec.protocol.train_end)
    cal = trading_calendar(spec.dataset.calendar, spec.dataset.kind,
                           pd.bdate_range(tr_end - pd.Timedelta(days=120), tr_end + pd.Timedelta(days=120)))
    cal = cal[(cal >= tr_end - pd.Timedelta(days=110)) & (cal <= tr_end + pd.Timedelta(days=110))]
    before, after = cal[cal <= tr_end], cal[cal > tr_end]
    dates = before[-3 * (T - 8)::3].append(after[:3 * 8:3])
    rows = pd.DataFrame({"date": np.repeat(dates.to_numpy(), S),
                         "security": np.tile([f"S{i:02d}" for i in range(S)], T)})
    rows["prompt"] = [f"{a.date()} {b}" for a, b in zip(rows["date"], rows["security"])]
    rng = np.random.default_rng(seed)
    rows["target"] = rng.standard_normal(len(rows))
    return Panel(rows=rows, calendar=cal.rename(None), source="synthetic"), rng.standard_normal((len(rows), d))


@pytest.mark.parametrize("name,spec_doc", _example_specs(), ids=[n for n, _ in _example_specs()])
def test_shipped_examples_report_an_interval_excluding_its_estimate_as_unreliable(
        name, spec_doc, tmp_path, fake_embed, monkeypatch):
    spec_doc = json.loads(json.dumps(spec_doc))
    spec_doc["bootstrap"]["resamples"] = 10
    spec_doc["dataset"]["uri"] = "synthetic"
    spec_doc.pop("storage", None)
    assert spec_doc["bootstrap"]["cluster"] == "two-way"  # every shipped example uses the default interval ...
    spec_doc["bootstrap"]["cluster"] = "security-and-date"  # ... whose interval is centred on the estimate:
    # a percentile interval is the one that can exclude its own estimate (two-way: the next test)
    spec = LeakageEvalSpec.model_validate(spec_doc)  # the example's own settings (schema-checked)
    assert spec.regression.selection == "protocol-cv"  # every shipped example selects the penalty by its protocol
    panel, X = _panel_around(spec)
    models = {m.name: fake_embed(m.name, panel.rows["prompt"].tolist(), X) for m in spec.models}
    real = targets_mod.bootstrap_model

    def far_away(*args, **kw):  # replicates that all lie far above every point estimate
        r = real(*args, **kw)  # a list when a model's two targets are fitted together
        far = [PremiumReplicates(r2_off=x.r2_off, r2_on=x.r2_on + 5.0, r2_on_rows=x.r2_on_rows + 5.0)
               for x in (r if isinstance(r, list) else [r])]
        return far if isinstance(r, list) else far[0]

    monkeypatch.setattr(targets_mod, "bootstrap_model", far_away)
    res = run_leakage_eval(spec, panel, models, tmp_path / "out")
    for m in res["models"]:
        assert m["premium_ci"][0] > m["premium"]  # the interval excludes the point estimate ...
        assert m["verdict"] == "unreliable"  # ... so it is never called significant
        assert any("lies outside its interval" in r for r in m["verdict_reasons"])
        assert m["premium_bias"] > 4.0
    status = compact_results(res)
    assert {v["verdict"] for v in status["models"].values()} == {"unreliable"}
    assert all("lies outside its interval" in v["reasons"][0] for v in status["models"].values())
    assert premium_summary(status).count(" unreliable") == len(res["models"])
    md = (tmp_path / "out" / "report.md").read_text()
    html = (tmp_path / "out" / "report.html").read_text()
    for m in res["models"]:
        assert f"| {m['name']} |" in md and f"**{m['name']} is unreliable:**" in md
        assert "<td class=\"l\">unreliable</td>" in html
    assert "| significant |" not in md and ">significant<" not in html
    for r in res["reductions"]:  # reductions: replicates shifted alike, their differences stay coherent
        assert r["verdict"] in ("significant", "not significant", "unreliable")



def test_two_way_interval_is_centred_on_the_estimate_whatever_the_replicates(tmp_path, fake_embed, monkeypatch):
    """The same far-away replicates under the default two-way interval: the interval keeps the point estimate at
    its centre (width from the replicates' spread), the bias is reported, and the verdict is not unreliable."""
    name, spec_doc = next((n, d) for n, d in _example_specs() if n == "leakageeval.yaml")
    spec_doc = json.loads(json.dumps(spec_doc))
    spec_doc["bootstrap"]["resamples"] = 10
    spec_doc["dataset"]["uri"] = "synthetic"
    spec = LeakageEvalSpec.model_validate(spec_doc)
    panel, X = _panel_around(spec)
    models = {m.name: fake_embed(m.name, panel.rows["prompt"].tolist(), X) for m in spec.models}
    real = targets_mod.bootstrap_model

    def far_away(*args, **kw):
        r = real(*args, **kw)  # a list when a model's two targets are fitted together
        far = [PremiumReplicates(r2_off=x.r2_off, r2_on=x.r2_on + 5.0, r2_on_rows=x.r2_on_rows + 5.0)
               for x in (r if isinstance(r, list) else [r])]
        return far if isinstance(r, list) else far[0]

    monkeypatch.setattr(targets_mod, "bootstrap_model", far_away)
    res = run_leakage_eval(spec, panel, models, tmp_path / "out")
    assert res["bootstrap"]["cluster"] == "two-way" and res["bootstrap"]["replicates_resampling_securities"] == 5
    for m in res["models"]:
        lo, hi = m["premium_ci"]
        assert (lo + hi) / 2 == pytest.approx(m["premium"], abs=1e-12) and m["premium_bias"] > 4.0
        assert not any("bias" in r or "outside" in r for r in m["verdict_reasons"])

def test_unreliable_has_its_own_marker_in_premium_png(tmp_path):
    import matplotlib.image as mpimg

    from pitlab.evaluator.report import VERDICT_STYLE, plot_premium

    res = {"bootstrap": {"confidence": 0.95, "resamples": 10, "cluster": "security"},
           "models": [{"name": "a", "premium": -0.65, "premium_ci": [-3.46, -1.60], "verdict": "unreliable"}]}
    plot_premium(res, tmp_path / "p.png")
    img = mpimg.imread(tmp_path / "p.png")[:, :, :3]
    orange = np.array([255, 127, 14]) / 255  # tab:orange
    assert VERDICT_STYLE["unreliable"] == ("tab:orange", "X")
    assert (np.abs(img - orange).max(axis=2) < 0.02).sum() > 50


# ---------------------------------------------------------------- report.html: the tables of report.md

def _results_for_tables() -> dict:
    return {
        "benchmark": "training mean", "r2_definition": "out-of-sample R²", "warnings": [],
        "bootstrap": {"resamples": 10, "confidence": 0.95, "seed": 0, "cluster": "security"},
        "regression": {"alphas": [1.0, 10.0], "alpha_selection_detail": "security-cv"},
        "protocol": {"leakage_off": {"train_end": "2020-01-01", "test_start": "2020-02-01", "embargo_days": 5,
                                     "first_test_date": "2020-02-03", "n_train": 10, "n_embargoed": 1, "n_test": 5},
                     "leakage_on": {"n_splits": 5, "n_rows": 20}, "selected": ["chronological", "group-kfold"]},
        "panel": {"n_rows": 20, "n_securities": 4, "n_dates": 5, "first_date": "2020-01-01",
                  "last_date": "2020-03-01", "source": "x", "target": "t"},
        "models": [{"name": n, "kind": "encoder", "embedding_dim": 8, "alpha_off": 10.0, "alpha_on": [1.0, 10.0],
                    "alphas": [0.01, 0.1, 1.0, 10.0], "alpha_grid_widenings": w, "r2_off": 0.1, "r2_on": 0.2,
                    "premium": 0.1, "premium_ci": [0.05, 0.15], "premium_p_value": 0.01, "premium_bias": 0.001,
                    "premium_sd": 0.02, "verdict": "significant", "verdict_reasons": [],
                    "r2_off_ci": [0.0, 0.2], "r2_on_ci": [0.1, 0.3]} for n, w in (("a", 1), ("b", 0))],
        "reductions": [{"model_a": "a", "model_b": "b", "reduction": 0.0, "ci": [-0.01, 0.01], "p_value": 0.9,
                        "bias": 0.0001, "sd": 0.005, "verdict": "not significant", "reasons": []}]}


def test_report_html_aligns_reduction_columns_and_has_the_details_table():
    res = _results_for_tables()
    html = render_html(res, [])
    md = render_markdown(res)
    red = html.split("<h2>Premium reductions")[1].split("</table>")[0]
    cells = red.split("<tr>")[2]
    # reduction | estimate [CI] | bias / sd | p | verdict | reason: numbers right, words left
    assert '<td class="r">0.900</td>' in cells and '<td class="l">not significant</td>' in cells
    assert '<td class="r">0.0000 [-0.0100, 0.0100]</td>' in cells and '<td class="r">0.0001 / 0.0050</td>' in cells
    assert "<h2>Details</h2>" in html and "## Details" in md
    det = html.split("<h2>Details</h2>")[1].split("</table>")[0]
    assert "<th>α (on, per fold)</th>" in det and '<td class="l">1, 10</td>' in det
    assert '<td class="r">0.01 .. 10 (widened 1×)</td>' in det
    assert "| a | encoder | 8 | 10 | 1, 10 | 0.01 .. 10 (widened 1×) | [0.0000, 0.2000] | [0.1000, 0.3000] |" in md
    assert "0.1000 [0.0500, 0.1500] (bias +0.0010, sd 0.0200)" in md
    assert "## Premium reductions (paired over the same bootstrap draws)" in md  # no decomposition: raw only
    # with the market-neutral reductions, both tables, the headline's first, each named
    res["reductions_market_neutral"] = [{**res["reductions"][0], "reduction": 0.0019, "ci": [-0.0043, 0.008]}]
    md, html = render_markdown(res), render_html(res, [])
    titles = [ln for ln in md.splitlines() if ln.startswith("## Premium reductions")]
    assert titles == ["## Premium reductions, market-neutral premium (the headline; paired over the same bootstrap "
                      "draws)", "## Premium reductions, raw premium (paired over the same bootstrap draws)"]
    neutral, raw = md.split("## Premium reductions")[1:3]
    assert "| premium(a) − premium(b) | 0.0019 [-0.0043, 0.0080]" in neutral
    assert "| premium(a) − premium(b) | 0.0000 [-0.0100, 0.0100]" in raw
    assert html.count("<h2>Premium reductions") == 2 and '<td class="r">0.0019 [-0.0043, 0.0080]</td>' in html


# ---------------------------------------------------------------- guarded penalty selection

def test_gcv_refused_unless_row_level_selection_is_allowed_and_then_warned(tmp_path):
    doc = yaml.safe_load((REPO / "examples" / "leakageeval-jpx.yaml").read_text())
    doc["spec"]["regression"]["selection"] = "gcv"  # the example as it was shipped before
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match="spec.regression.*leaves out rows, not securities"):
        load_resource(path)
    r = CliRunner().invoke(app, ["validate", "--schema-only", str(path)], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "allowRowLevelSelection" in r.output
    doc["spec"]["regression"]["allowRowLevelSelection"] = True
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["validate", "--schema-only", str(path)], env={"COLUMNS": "300"})
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "warning: spec.regression.selection: gcv with allowRowLevelSelection: true" in text
    assert "GCV scores the penalty on left-out rows" in text
    r = CliRunner().invoke(app, ["validate", "--schema-only", str(REPO / "examples" / "leakageeval-jpx.yaml")])
    assert r.exit_code == 0 and "warning" not in r.output


def test_crd_refuses_gcv_without_the_flag():
    from pitlab.api.crd import build_crd

    crd = build_crd("LeakageEval")
    reg = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["regression"]
    rule, = reg["x-kubernetes-validations"]
    assert "allowRowLevelSelection" in rule["rule"] and "leaves out rows" in rule["message"]
    assert reg["properties"]["allowRowLevelSelection"]["type"] == "boolean"
    boot = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["bootstrap"]
    assert boot["properties"]["cluster"]["enum"] == ["two-way", "security", "date", "security-and-date"]


# ---------------------------------------------------------------- date and two-way clustering

def test_draws_per_cluster_setting():
    ws, wd = draw_weights("security", 40, 12, 9, seed=5)
    np.testing.assert_array_equal(ws, draw_cluster_weights(40, 9, seed=5))
    assert (wd == 1).all() and wd.shape == (9, 12)
    ws2, wd2 = draw_weights("date", 40, 12, 9, seed=5)
    assert (ws2 == 1).all() and (wd2.sum(axis=1) == 12).all() and not (wd2 == 1).all()
    ws3, wd3 = draw_weights("security-and-date", 40, 12, 9, seed=5)
    np.testing.assert_array_equal(ws3, ws)  # the same securities as "security", the same dates as "date"
    np.testing.assert_array_equal(wd3, wd2)
    np.testing.assert_array_equal(wd3, draw_weights("security-and-date", 40, 12, 9, seed=5)[1])
    assert not np.array_equal(wd3, draw_weights("security-and-date", 40, 12, 9, seed=6)[1])
    with pytest.raises(ValueError, match="bootstrap.cluster"):
        draw_weights("industry", 40, 12, 9, 0)
    sec, date = np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1])
    np.testing.assert_array_equal(row_weights(np.array([[2, 0]]), np.array([[1, 3]]), sec, date), [[2, 0, 6, 0]])


def _panel(S=16, T=12, d=5, seed=0):
    rng = np.random.default_rng(seed)
    sec, date = np.tile(np.arange(S), T), np.repeat(np.arange(T), S)
    X = rng.standard_normal((S * T, d)) + rng.standard_normal((T, d))[date] + 2.0
    y = 0.3 * X[:, 0] + rng.standard_normal(T)[date] + rng.standard_normal(S * T)
    keep = rng.random(S * T) > 0.1  # an unbalanced panel
    return X[keep], y[keep], sec[keep], date[keep]


def test_row_stats_equal_per_row_suffstats():
    X, y, sec, date = _panel()
    n = len(y)
    rs = RowStats(X, y, np.arange(n), n, sec)
    W = np.random.default_rng(1).integers(0, 3, size=(4, n)).astype(float)
    a, b = rs.weighted(W), SuffStats.from_rows(X, y, np.arange(n), n).weighted(W)
    for f in ("n", "sx", "sy", "syy", "sxx", "sxy"):
        np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=1e-12, atol=1e-10)


def _protocols(st: PanelStats, W, F, K, date, sel):
    wf = [Fold(date < t, (date >= t) & (date < t + 3)) for t in (6, 9)]
    pk = [Fold((date < a - 2) | (date > a + 5), (date >= a) & (date < a + 3)) for a in (0, 4, 8)]
    out = {}
    for name, folds in {"off": [Fold(st.train_mask, st.test_mask)], "on": group_kfold_folds(len(date), F, K),
                        "wf": wf, "pk": pk}.items():
        fr = st.protocol_errors(folds, W, ALPHAS, sel, point_first=True, diagnostics=True)
        out[name] = (fr.sse, fr.sst, fr.alpha)
    return out


@pytest.mark.parametrize("method", ["security-cv", "gcv"])
def test_row_units_with_security_weights_equal_the_per_security_path(method):
    """The row path (date / two-way clustering) weighted like a security bootstrap gives the security path's
    numbers: same folds, same penalties, SSE and SST to 1e-10."""
    X, y, sec, date = _panel()
    S, K = 16, 4
    rows = np.bincount(sec, minlength=S)
    ws = np.vstack([np.ones((1, S), dtype=np.int64), draw_cluster_weights(S, 8, seed=2)])
    F = np.stack([security_folds(rows, K, w) for w in ws])
    sel = AlphaSelection(method, inner_folds=3)
    a = _protocols(PanelStats.build(X, y, sec, S, date < 7, date >= 8), ws, F, K, date, sel)
    Wr = row_weights(ws, np.ones((len(ws), 12)), sec, date)
    Fr = np.vstack([F[:1, sec], replicate_row_folds(sec, S, Wr[1:], K)])
    np.testing.assert_array_equal(Fr, F[:, sec])
    b = _protocols(PanelStats.build_rows(X, y, sec, date < 7, date >= 8), Wr, Fr, K, date, sel)
    for name in a:
        np.testing.assert_array_equal(a[name][2], b[name][2])  # the same penalties chosen
        for u, v in zip(a[name][:2], b[name][:2]):
            np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cluster", ["date", "security-and-date"])
def test_resampled_dates_equal_an_explicit_refit_on_the_expanded_rows(cluster):
    """A replicate = the data set in which row r appears w_sec·w_date times; a drawn date keeps its calendar
    position, so its copies sit on one side of the chronological split; sklearn Ridge on the expanded rows."""
    X, y, sec, date = _panel()
    S = 16
    ws, wd = draw_weights(cluster, S, 12, 6, seed=4)
    W = row_weights(ws, wd, sec, date)
    st = PanelStats.build_rows(X, y, sec, date < 7, date >= 8)
    fr = st.protocol_errors([Fold(date < 7, date >= 8)], W, [10.0], None, alpha_index=np.zeros((6, 1), dtype=int))
    for r in range(6):
        rep = np.repeat(np.arange(len(y)), W[r].astype(int))
        tr, te = rep[date[rep] < 7], rep[date[rep] >= 8]
        if len(te) == 0:
            assert np.isnan(fr.r2[r, 0])
            continue
        fit = Ridge(alpha=10.0).fit(X[tr], y[tr])
        sse = ((y[te] - fit.predict(X[te])) ** 2).sum()
        sst = ((y[te] - y[tr].mean()) ** 2).sum()
        assert fr.sse[r, 0] == pytest.approx(sse, rel=1e-10) and fr.sst[r, 0] == pytest.approx(sst, rel=1e-10)


def test_a_date_block_without_drawn_dates_gives_nan_not_an_error():
    X, y, sec, date = _panel()
    st = PanelStats.build_rows(X, y, sec, date < 7, date >= 8)
    W = np.ones((2, len(y)))
    W[1, date < 3] = 0.0  # replicate 1 drew none of the dates of the first training block
    fr = st.protocol_errors([Fold(date < 3, (date >= 3) & (date < 6))], W, ALPHAS, AlphaSelection("security-cv", 3))
    assert np.isfinite(fr.r2[0, 0]) and np.isnan(fr.r2[1, 0]) and np.isnan(fr.sse[1, 0])


@pytest.mark.parametrize("cluster", ["date", "security-and-date"])
def test_torch_backend_equals_numpy_backend_for_row_weights(cluster):
    X, y, sec, date = _panel()
    S, K = 16, 4
    ws, wd = draw_weights(cluster, S, 12, 6, seed=3)
    W = np.vstack([np.ones((1, len(y))), row_weights(ws, wd, sec, date)])
    F = np.vstack([security_folds(np.bincount(sec, minlength=S), K)[sec][None], replicate_row_folds(sec, S, W[1:], K)])
    res = {}
    for be in (Backend(), Backend("torch", "cpu")):
        st = PanelStats.build_rows(X, y, sec, date < 7, date >= 8, be)
        res[be.name] = _protocols(st, W, F, K, date, AlphaSelection("security-cv", inner_folds=3))
    for name in res["numpy"]:
        np.testing.assert_array_equal(res["numpy"][name][2], res["torch:cpu"][name][2])
        for a, b in zip(res["numpy"][name][:2], res["torch:cpu"][name][:2]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)


def _small_panel(fake_embed, S: int = 20, T: int = 16, d: int = 6):
    """A synthetic panel of S securities × T dates (every third session of 2019), date effects in the target and
    in the embedding of model ``m``: ``(dates, panel, models)``."""
    cal = trading_calendar("XNYS", "ohlcv", pd.bdate_range("2019-01-01", "2019-12-31"))
    cal = cal[(cal >= "2019-01-01") & (cal <= "2019-12-31")].rename(None)
    dates = cal[5:5 + 3 * T:3]
    rows = pd.DataFrame({"date": np.repeat(dates.to_numpy(), S),
                         "security": np.tile([f"S{i:02d}" for i in range(S)], T)})
    rows["prompt"] = [f"{a.date()} {b}" for a, b in zip(rows["date"], rows["security"])]
    rng = np.random.default_rng(0)
    di = np.repeat(np.arange(T), S)
    rows["target"] = rng.standard_normal(T)[di] + rng.standard_normal(len(rows))
    X = rng.standard_normal((T, d))[di] + 0.5 * rng.standard_normal((len(rows), d))
    models = {"m": fake_embed("m", rows["prompt"].tolist(), X)}
    return dates, Panel(rows=rows, calendar=cal, source="synthetic"), models


def _small_spec(dates, cluster: str, resamples: int = 12) -> LeakageEvalSpec:
    return LeakageEvalSpec.model_validate({
        "models": [{"name": "m", "uri": "/m/m"}], "dataset": {"kind": "ohlcv", "uri": "synthetic"},
        "protocol": {"trainEnd": str(dates[9].date()), "testStart": str(dates[10].date()), "embargoDays": 3,
                     "groupKFolds": 4, "protocols": ["chronological", "group-kfold", "walk-forward",
                                                     "purged-kfold"], "walkForwardFolds": 3, "purgedFolds": 3},
        "bootstrap": {"resamples": resamples, "seed": 7, "cluster": cluster},
        "regression": {"alphas": ALPHAS, "innerFolds": 3}})


def test_each_cluster_setting_reruns_bit_identically_end_to_end(tmp_path, fake_embed):
    dates, panel, models = _small_panel(fake_embed)
    seen = {}
    for cluster in ("security", "date", "security-and-date"):
        spec = _small_spec(dates, cluster)
        a = run_leakage_eval(spec, panel, models, tmp_path / f"{cluster}-a")
        b = run_leakage_eval(spec, panel, models, tmp_path / f"{cluster}-b")
        assert (tmp_path / f"{cluster}-a" / "bootstrap_replicates.csv").read_bytes() == \
            (tmp_path / f"{cluster}-b" / "bootstrap_replicates.csv").read_bytes()
        strip = lambda r: {k: v for k, v in r.items() if k not in ("created", "timings")}  # noqa: E731
        assert json.dumps(strip(a), sort_keys=True) == json.dumps(strip(b), sort_keys=True)
        assert a["bootstrap"]["cluster"] == cluster
        assert "the point estimate lies outside its own interval" in a["bootstrap"]["unreliable_when"]  # percentile
        seen[cluster] = a["models"][0]
    # one point estimate whatever is resampled (to rounding), different intervals
    assert seen["date"]["premium"] == pytest.approx(seen["security"]["premium"], abs=1e-10)
    assert seen["security-and-date"]["premium"] == pytest.approx(seen["security"]["premium"], abs=1e-10)
    assert seen["date"]["premium_ci"] != seen["security"]["premium_ci"]
    assert "resamples of dates" in (tmp_path / "date-a" / "report.md").read_text()


def test_batched_security_folds_equal_sklearn_groupkfold():
    from pitlab.evaluator.protocols import ProtocolError, security_folds_batch

    rng = np.random.default_rng(0)
    rows = rng.integers(1, 6, size=40)
    W = draw_cluster_weights(40, 50, seed=1)
    W[:5, :] = 1  # ties everywhere
    W[5, :36] = 0  # only 4 securities left ...
    W[5, 36:] = 10
    got = security_folds_batch(rows[None, :] * W, 4)
    for r in range(len(W)):
        np.testing.assert_array_equal(got[r], security_folds(rows, 4, W[r]))
    with pytest.raises(ProtocolError, match="inner=5 exceeds the number of distinct securities \\(4\\)"):
        security_folds_batch(rows[None, :] * W[5:6], 5, field="inner")
    # a replicate's penalty selection (min_present): 4 securities in 5 folds are 4 folds of one security each and
    # an empty fifth, which a pooled score ignores: the same folds as 4-fold GroupKFold
    few = rows[None, :] * W[5:6]
    np.testing.assert_array_equal(security_folds_batch(few, 5, min_present=2), security_folds_batch(few, 4))
    assert sorted(security_folds_batch(few, 5, min_present=2)[0, 36:]) == [0, 1, 2, 3]
    one = np.zeros_like(few)
    one[0, 7] = 3
    with pytest.raises(ProtocolError, match="regression.innerFolds: a fitting set of a resampled replicate has 1 "
                                            "distinct security; 2 are needed"):
        security_folds_batch(one, 5, field="regression.innerFolds", min_present=2)


@pytest.mark.parametrize("cluster", ["security", "date", "security-and-date"])
def test_calibration_benchmarks_batched_replicates_equal_the_product_path(cluster):
    """bench/calibration_clusters.py's replicate_premiums (per-replicate per-security statistics) = bootstrap_model."""
    import importlib.util

    from pitlab.evaluator.bootstrap import bootstrap_model, replicate_folds
    from pitlab.evaluator.estimates import center

    spec = importlib.util.spec_from_file_location("calibration", REPO / "bench" / "calibration_clusters.py")
    cal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cal)
    S, T, d, R, K = 30, 9, 3, 7, 5
    X, y, sec, date = cal.simulate("planted", S, T, d, seed=3, planted_sd=0.5)
    train = date < 6
    ws, wd = draw_weights(cluster, S, T, R, seed=1)
    sel = AlphaSelection("security-cv", inner_folds=5)
    if cluster == "security":
        st = PanelStats.build(X, y, sec, S, train, ~train)
        ref = bootstrap_model(st, ws, replicate_folds(np.full(S, T), ws, K), K, ALPHAS, sel)
    else:
        st = PanelStats.build_rows(X, y, sec, train, ~train)
        W = row_weights(ws, wd, sec, date)
        ref = bootstrap_model(st, W, replicate_row_folds(sec, S, W, K), K, ALPHAS, sel)
    Xc, yc, _ = center(X, y)
    got = cal.replicate_premiums(Xc.reshape(T, S, d).transpose(1, 0, 2).copy(), yc.reshape(T, S).T.copy(), ws, wd,
                                 np.arange(T) < 6, ALPHAS, K, 5, batch=3)
    np.testing.assert_allclose(got["r2_off"], ref.r2_off, rtol=0, atol=1e-10)
    np.testing.assert_allclose(got["r2_on"], ref.r2_on, rtol=0, atol=1e-10)
    assert np.ptp(ref.premium) > 0.01  # the replicates differ: the comparison is not vacuous


def _recording_console(monkeypatch, width: int):
    """pitlab.cli.output's console and ``say`` replaced by one recording console of ``width`` columns."""
    from rich.console import Console

    from pitlab.cli import output

    con = Console(record=True, width=width)
    monkeypatch.setattr(output, "console", con)
    monkeypatch.setattr(output, "say", lambda *o, **k: con.print(*o, **k))
    return con


def _unreliable_minilm(reason: str) -> dict:
    """Compact results of one unreliable model (the GCV case of the JPX files) with its decomposition."""
    return compact_results({"models": [{"name": "minilm", "r2_off": -0.1130, "r2_on": -0.7596, "premium": -0.6467,
                                        "premium_ci": [-3.4638, -1.5984], "premium_bias": -1.89,
                                        "verdict": "unreliable", "verdict_reasons": [reason],
                                        "market_neutral": {"premium": 0.0012, "premium_ci": [-0.002, 0.004],
                                                           "verdict": "not significant"},
                                        "date_only_premium": 0.21,
                                        "excess": {"premium": -0.8567, "ci": [-3.6, -1.7], "verdict": "unreliable"}}],
                            "reductions": []})


def test_cli_results_table_shows_bias_verdict_and_reason(monkeypatch):
    from pitlab.cli.results import print_results_table

    con = _recording_console(monkeypatch, 250)
    status = _unreliable_minilm("point estimate -0.6467 lies outside its interval")
    print_results_table(status, "t")
    text = con.export_text()
    row = next(line for line in text.splitlines() if "minilm" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells == ["minilm", "+0.0012 [-0.0020, +0.0040]", "not significant", "-0.6467 [-3.4638, -1.5984]",
                     "unreliable", "+0.2100", "-0.8567 [-3.6000, -1.7000]", "unreliable", "-1.8900",
                     "point estimate -0.6467 lies outside its interval"]
    header = next(line for line in text.splitlines() if "raw verdict" in line)
    assert [c.strip() for c in header.strip("┃ ").split("┃")] == [
        "model", "market-neutral [CI]", "verdict", "raw premium [CI]", "raw verdict", "date-only", "excess [CI]",
        "excess verdict", "bias", "reason"]
    status["models"]["minilm"]["reasons"] = []  # no reason anywhere: no reason column
    con2 = _recording_console(monkeypatch, 250)
    print_results_table(status, "t")
    assert "reason" not in next(line for line in con2.export_text().splitlines() if "raw verdict" in line)


def test_premium_png_heads_with_the_market_neutral_premium():
    from pitlab.evaluator.plots import premium_panels

    raw_only = {"models": [{"name": "a", "premium": 0.2, "premium_ci": [0.1, 0.3], "verdict": "significant"}]}
    assert [t for t, _ in premium_panels(raw_only)] == ["raw premium R²(on) − R²(off)"]
    both = {"models": [{**raw_only["models"][0], "market_neutral": {"premium": 0.001, "premium_ci": [-0.01, 0.012],
                                                                     "verdict": "not significant"}}]}
    panels = premium_panels(both)
    assert [t for t, _ in panels] == ["market-neutral premium (the headline)", "raw premium R²(on) − R²(off)"]
    assert panels[0][1] == [(0.001, [-0.01, 0.012], "not significant")]
    assert panels[1][1] == [(0.2, [0.1, 0.3], "significant")]
    both["models"][0]["excess"] = {"premium": -0.04, "ci": [-0.07, -0.01], "verdict": "significant"}
    panels = premium_panels(both)
    assert [t for t, _ in panels][2] == "excess over the date-only baseline"
    assert panels[2][1] == [(-0.04, [-0.07, -0.01], "significant")]


def test_cli_results_name_which_premium_each_reduction_is_of(monkeypatch):
    """Found in a quant's trial: the reduction lines were the raw premium's under a table headed by the
    market-neutral one, unlabelled; the headline's reductions were in results.json only."""
    from pitlab.api.summary import compact_results
    from pitlab.cli.results import print_results_table

    pair = {"model_a": "base", "model_b": "pit"}
    full = {"models": [{"name": n, "premium": 0.05, "premium_ci": [0.0, 0.1], "verdict": "significant"}
                       for n in ("base", "pit")],
            "reductions": [{**pair, "reduction": 0.012, "ci": [-0.1661, 0.1901], "verdict": "not significant"}],
            "reductions_market_neutral": [{**pair, "reduction": 0.0019, "ci": [-0.0043, 0.008],
                                           "verdict": "not significant"}]}
    con = _recording_console(monkeypatch, 250)
    print_results_table(compact_results(full), "t")
    lines = [ln for ln in con.export_text().splitlines() if "− premium(" in ln]
    assert lines == ["  market-neutral premium(base) − premium(pit): +0.0019 [-0.0043, +0.0080] not significant",
                     "  raw premium(base) − premium(pit): +0.0120 [-0.1661, +0.1901] not significant"]
    del full["reductions_market_neutral"]  # results without the decomposition: one unlabelled line, as before
    con = _recording_console(monkeypatch, 250)
    print_results_table(compact_results(full), "t")
    assert [ln for ln in con.export_text().splitlines() if "− premium(" in ln] == [
        "  premium(base) − premium(pit): +0.0120 [-0.1661, +0.1901] not significant"]


def test_cli_results_on_a_narrow_console_print_one_block_per_model(monkeypatch):
    from pitlab.cli.results import print_results_table

    con = _recording_console(monkeypatch, 80)
    print_results_table(_unreliable_minilm("point estimate outside"), "t")
    lines = con.export_text().splitlines()
    i = lines.index("minilm")
    assert lines[i + 1:i + 7] == ["  market-neutral   +0.0012 [-0.0020, +0.0040]  not significant",
                                  "  raw premium      -0.6467 [-3.4638, -1.5984]  unreliable",
                                  "  date-only part                      +0.2100",
                                  "  excess           -0.8567 [-3.6000, -1.7000]  unreliable",
                                  "  bias                                -1.8900",
                                  "  reason: point estimate outside"]
    assert max(len(line) for line in lines[i:i + 7]) <= 80


def test_cli_results_name_every_recorded_check_before_the_report_path(monkeypatch, tmp_path):
    """``say_results`` reads the evaluation's results.json and names each diagnostic (protocol: check (model)) on
    one line above the report's path; none recorded: no such line."""
    from pitlab.api.layout import EvaluationLayout
    from pitlab.cli.results import diagnostics_line, say_results

    diags = [{"check": "embargo-removed-nothing", "protocol": "chronological", "message": "m1"},
             {"check": "few-rows-per-dimension", "protocol": "chronological", "model": "minilm", "message": "m2"},
             {"check": "few-time-clusters", "protocol": "chronological", "detail": "test: 7 dates", "message": "m3"}]
    assert diagnostics_line({"diagnostics": diags}) == (
        "  checks (3, each explained in the report): chronological: embargo-removed-nothing; "
        "chronological: few-rows-per-dimension (minilm); chronological: few-time-clusters (test: 7 dates)")
    assert diagnostics_line({"diagnostics": []}) is None and diagnostics_line({}) is None
    out = EvaluationLayout(tmp_path / "ev").outputs
    Path(out.results).parent.mkdir(parents=True)
    Path(out.results).write_text(json.dumps({"diagnostics": diags}))
    con = _recording_console(monkeypatch, 250)
    say_results({"ev": _unreliable_minilm("x")}, tmp_path)
    lines = con.export_text().splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("  report: "))
    assert lines[i - 1] == diagnostics_line({"diagnostics": diags})


def test_cli_results_print_a_line_per_extra_protocol(monkeypatch, tmp_path):
    """Found in a quant's trial: walk-forward and purged K-fold results were in report.md only."""
    from pitlab.api.layout import EvaluationLayout
    from pitlab.cli.results import protocol_lines, say_results

    wf = {"premium": 0.0123, "premium_ci": [-0.004, 0.0286], "verdict": "not significant"}
    pk = {"premium": 0.05, "premium_ci": [0.01, 0.09], "verdict": "significant"}
    full = {"protocol": {"selected": ["chronological", "group-kfold", "walk-forward", "purged-kfold"]},
            "models": [{"name": "base", "protocols": {"walk-forward": wf, "purged-kfold": pk}},
                       {"name": "pit", "protocols": {"walk-forward": {**wf, "premium": -0.001}, "purged-kfold": pk}}]}
    lines = protocol_lines(full)
    assert lines == [
        "  walk-forward (R²(on, all rows) − R² of its test folds): base +0.0123 [-0.0040, +0.0286] not significant; "
        "pit -0.0010 [-0.0040, +0.0286] not significant",
        "  purged K-fold (R²(on, all rows) − R² of its test folds): base +0.0500 [+0.0100, +0.0900] significant; "
        "pit +0.0500 [+0.0100, +0.0900] significant"]
    assert protocol_lines({"protocol": {"selected": ["chronological", "group-kfold"]}, "models": []}) == []
    out = EvaluationLayout(tmp_path / "ev").outputs
    Path(out.results).parent.mkdir(parents=True)
    Path(out.results).write_text(json.dumps(full))
    con = _recording_console(monkeypatch, 300)
    say_results({"ev": _unreliable_minilm("x")}, tmp_path)
    text = con.export_text().splitlines()
    assert [ln for ln in text if "test folds)" in ln] == lines


def test_r2_by_fold_has_whole_fold_ticks_and_no_offset(tmp_path):
    """Found in a quant's trial: r2_by_fold.png ticked folds 1.5, 2.5 and drew R² of 1e-6 on an offset axis, which
    makes noise look like a pattern."""
    from pitlab.evaluator.plots import plot_r2_by_fold, r2_by_fold_figure

    results = {"protocol": {"selected": ["chronological", "walk-forward"]}, "benchmark": "training mean",
               "models": [{"name": "a", "protocols": {"walk-forward": {"r2_per_fold": [1.2e-6, -0.8e-6, None]}}},
                          {"name": "b", "protocols": {"walk-forward": {"r2_per_fold": [0.3e-6, 1.1e-6, 2e-6]}}}]}
    (ax,) = r2_by_fold_figure(results).axes
    assert list(ax.get_xticks()) == [1, 2, 3]
    assert ax.yaxis.get_major_formatter().get_useOffset() is False
    assert plot_r2_by_fold(results, tmp_path / "f.png") and (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    assert r2_by_fold_figure({"protocol": {"selected": ["chronological"]}, "models": []}) is None


def test_few_resamples_are_named_with_what_they_cost_the_interval():
    from pitlab.api.leakageeval import Bootstrap, resamples_warning

    assert resamples_warning(Bootstrap(resamples=100)) is None and resamples_warning(Bootstrap()) is None
    # two-way: sd of a normal sample of n = 10: relative standard error 1/sqrt(2 (n - 1)) = 23.6 %
    assert resamples_warning(Bootstrap(resamples=20)).startswith(
        "bootstrap.resamples: 20: each half's 10 replicates estimate its sd to about ±24 %, so the interval's width")
    # a 95 % percentile interval of 50 replicates: 1.25 beyond each end
    assert "each end of the percentile interval rests on 1.25 replicates" in resamples_warning(
        Bootstrap(resamples=50, cluster="security"))


def test_the_replicates_file_reproduces_every_two_way_interval(tmp_path, fake_embed):
    """bootstrap_replicates.csv holds the replicates each reported interval is read from, and which half drew
    them: the two-way rule recomputed from the file alone (t(G − 1) × the larger half's sd, G its cluster count)
    gives the premium's, the market-neutral premium's and the excess's intervals."""
    from scipy import stats

    S, T = 20, 16
    dates, panel, models = _small_panel(fake_embed, S, T)
    out = run_leakage_eval(_small_spec(dates, "two-way", resamples=14), panel, models, tmp_path / "e")
    reps = pd.read_csv(tmp_path / "e" / "bootstrap_replicates.csv")
    assert list(reps["resampled"]) == ["securities"] * 7 + ["dates"] * 7
    # centred on the point estimate, a two-way interval cannot leave it outside: not listed as a reason
    assert not [r for r in out["bootstrap"]["unreliable_when"] if "outside its own interval" in r]
    m = out["models"][0]
    for column, point, ci in (("premium", m["premium"], m["premium_ci"]),
                              ("premium_market_neutral", m["market_neutral"]["premium"],
                               m["market_neutral"]["premium_ci"]),
                              ("excess", m["excess"]["premium"], m["excess"]["ci"])):
        sd_s, sd_d = (reps.loc[reps["resampled"] == h, column].std(ddof=1) for h in ("securities", "dates"))
        sd, g = (sd_s, S) if sd_s >= sd_d else (sd_d, T)
        half = stats.t.ppf(0.975, g - 1) * sd
        np.testing.assert_allclose(ci, [point - half, point + half], rtol=0, atol=1e-12, err_msg=column)
    np.testing.assert_allclose(reps["premium_all_rows"], reps["r2_on"] - reps["r2_off"], rtol=0, atol=1e-15)
    np.testing.assert_allclose(reps["premium"], reps["r2_on_test_rows"] - reps["r2_off"], rtol=0, atol=1e-15)


def test_the_two_way_bias_is_that_of_the_half_the_interval_is_read_from():
    """Found by a quant's trial: the legend said "mean of the replicates − the point estimate" while the number was
    the dominating half's. The security half [0.9, 1.1, 1.0, 1.2] (sd 0.129) is narrower than the date half
    [0.0, 2.0, 1.0, 3.0] (sd 1.291): bias = mean(date half) − point = 1.5 − 1.0 = +0.5 (all 8: +0.275), sd 1.291;
    the report says so under two-way and plainly under a percentile rule."""
    from pitlab.evaluator.bootstrap import IntervalRule, judge
    from pitlab.evaluator.report import render_markdown

    values = np.array([0.9, 1.1, 1.0, 1.2, 0.0, 2.0, 1.0, 3.0])
    got = judge(1.0, values, IntervalRule(0.95, "two-way", n_security=4, n_securities=50, n_dates=20))
    assert got["bias"] == pytest.approx(0.5, abs=1e-15) and got["sd"] == pytest.approx(np.std([0, 2, 1, 3], ddof=1))
    assert judge(1.0, values, 0.95)["bias"] == pytest.approx(0.275, abs=1e-15)
    base = _results_for_tables()
    base["bootstrap"]["cluster"] = "two-way"
    assert "(the half, by security or by date, whose spread is larger) − the point estimate" in render_markdown(base)
    base["bootstrap"]["cluster"] = "security"
    assert "*bias / sd*: the mean of the replicates − the point estimate, and their sd." in render_markdown(base)
