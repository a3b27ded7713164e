"""pitlab.evaluator.parallel: the models' statistics in several processes give the numbers of one process."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_evaluator import _spec, _synthetic_panel, fake_models  # noqa: F401  (fixture)

from pitlab.data.types import Panel
from pitlab.evaluator.parallel import ENV, StatisticsPool, statistics_processes, timed_statistics
from pitlab.evaluator.run import run_leakage_eval


def test_statistics_processes_default_env_and_bounds(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert statistics_processes("cuda", 3) == 2 and statistics_processes("cuda", 1) == 1
    assert statistics_processes("cpu", 3) == 1
    monkeypatch.setenv(ENV, "4")
    assert statistics_processes("cpu", 3) == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=ENV):
            statistics_processes("cuda", 2)


def _two_models(add, seed=3):
    rows, cal, dates = _synthetic_panel(S=40, T=16)
    S, T, d = 40, 16, 12
    rng = np.random.default_rng(seed)
    date_idx = np.repeat(np.arange(T), S)
    rows["target"] = rng.standard_normal(T)[date_idx] + rng.standard_normal(len(rows))
    prompts = rows["prompt"].tolist()
    models = {"dates": add("dates", prompts, rng.standard_normal((T, d))[date_idx]
                           + 0.5 * rng.standard_normal((len(rows), d))),
              "noise": add("noise", prompts, rng.standard_normal((len(rows), d)))}
    spec = _spec(["dates", "noise"], dates[9].date(), dates[10].date(), resamples=20, selection="protocol-cv")
    return spec, Panel(rows=rows, calendar=cal, source="synthetic"), models


def test_two_processes_give_the_results_of_one_bit_for_bit(tmp_path, fake_models, monkeypatch):  # noqa: F811
    add, _ = fake_models
    spec, panel, models = _two_models(add)
    out = {}
    for n in (1, 2):
        monkeypatch.setenv(ENV, str(n))
        res = run_leakage_eval(spec, panel, models, tmp_path / f"out{n}")
        out[n] = json.loads((tmp_path / f"out{n}" / "results.json").read_text())
        assert [m["name"] for m in res["models"]] == ["dates", "noise"]
    assert out[1]["models"] == out[2]["models"]  # every number, interval, α and verdict of both models
    assert out[1]["reductions"] == out[2]["reductions"]
    assert out[1]["models"][0]["premium"] != out[1]["models"][1]["premium"]  # two different models compared
    for n in (1, 2):
        assert set(out[n]["timings"]["models"]) == {"dates", "noise"}
        assert all(m["statistics_s"] > 0 for m in out[n]["timings"]["models"].values())


def test_a_worker_computes_what_this_process_computes(fake_models):  # noqa: F811
    from pitlab.evaluator.setup import prepare_evaluation
    from pitlab.evaluator.targets import model_statistics

    add, _ = fake_models
    spec, panel, _models = _two_models(add, seed=4)
    setup = prepare_evaluation(spec, panel)
    X = np.random.default_rng(0).standard_normal((len(panel.rows), 5)).astype(np.float32)
    raw, neutral = model_statistics(spec, setup, X, setup.y, setup.y_neutral)
    with StatisticsPool(1) as pool:
        raw2, neutral2, seconds = pool.submit(spec, setup, X).result()
    assert seconds > 0
    for a, b in ((raw, raw2), (neutral, neutral2)):
        for f in ("premium", "r2_off", "r2_on", "r2_on_rows"):
            np.testing.assert_array_equal(getattr(a.reps, f), getattr(b.reps, f))
        assert a.premium == b.premium and a.grid == b.grid
    r3, _n3, _s = timed_statistics(spec, setup, X)
    np.testing.assert_array_equal(r3.reps.premium, raw.reps.premium)
