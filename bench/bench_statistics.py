"""Benchmark: the full protocol set (chronological + GroupKFold + walk-forward + purged K-fold) and a
200-resample clustered bootstrap on a synthetic 30,000-row panel, statistics only (embeddings precomputed),
through ``run_leakage_eval`` (the code path of ``pitlab run``).

    .venv/bin/python bench/bench_statistics.py --dim 384 --device cpu --out bench/results/stats-cpu-384.json
    python3 bench/bench_statistics.py --dim 2048 --device cuda --no-reselect --repeat 2 --out $OUT/stats.json

The panel: ``--securities`` securities on ``--dates`` dates, every third XNYS session from 2019-01-15 (the
ohlcv default calendar); embeddings = a date fingerprint + a security fingerprint + noise (float32, seeded),
target = date effect + noise. Spec: embargo 5 sessions, 5 GroupKFold folds, 5 walk-forward folds, 5 purged
folds, the default α grid and penalty selection (security-cv, 5 inner folds), ``bootstrap.reselectPenalty``
from ``--reselect`` / ``--no-reselect``, ``regression.device`` from ``--device``.
``--repeat N`` runs the evaluation N times and records whether results.json (timings and creation time aside)
is byte-identical across the runs. Prints and writes wall times (seconds), the timings run_leakage_eval
records, the load average before and after, and the headline numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd


def synthetic_panel(S: int, T: int, d: int, seed: int = 0):
    """rows (date, security, prompt, target), the price-file calendar, and embeddings float32 [S·T, d]."""
    from pitlab.evaluator.protocols import trading_calendar

    cal = trading_calendar("XNYS", "ohlcv", pd.bdate_range("2019-01-01", "2021-12-31"))
    cal = cal[(cal >= "2019-01-01") & (cal <= "2021-12-31")].rename(None)
    dates = cal[10:10 + 3 * T:3]
    rows = pd.DataFrame({"date": np.repeat(dates.to_numpy(), S),
                         "security": np.tile([f"S{i:04d}" for i in range(S)], T)})
    rows["prompt"] = [f"{i}" for i in range(len(rows))]
    rng = np.random.default_rng(seed)
    di, si = np.repeat(np.arange(T), S), np.tile(np.arange(S), T)
    rows["target"] = rng.standard_normal(T)[di] * 0.3 + rng.standard_normal(len(rows))
    X = (rng.standard_normal((T, d))[di] + rng.standard_normal((S, d))[si]
         + rng.standard_normal((len(rows), d))).astype(np.float32)
    return rows, cal, dates, X


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--securities", type=int, default=500)
    ap.add_argument("--dates", type=int, default=60)
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--selection", default="security-cv", choices=["gcv", "security-cv"])
    ap.add_argument("--reselect", action=argparse.BooleanOptionalAction, default=True,
                    help="bootstrap.reselectPenalty (default: true, the spec default)")
    ap.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    import pitlab.evaluator.run as run_mod
    from pitlab.api.leakageeval import LeakageEvalSpec
    from pitlab.data.types import Panel

    S, T, d = a.securities, a.dates, a.dim
    rows, cal, dates, X = synthetic_panel(S, T, d)

    def fake_embed(model_dir, texts, **kw):
        kw["info"].update(kind="encoder", digest="bench".ljust(64, "0"), pooling="mean", n_truncated=0,
                          cache_hit=True)
        return X

    run_mod.embed_texts = fake_embed
    spec = LeakageEvalSpec.model_validate({
        "models": [{"name": "bench", "uri": "/bench"}], "dataset": {"kind": "ohlcv", "uri": "synthetic"},
        "protocol": {"trainEnd": str(dates[T * 2 // 3].date()), "testStart": str(dates[T * 2 // 3 + 1].date()),
                     "embargoDays": 5, "groupKFolds": 5, "walkForwardFolds": 5, "purgedFolds": 5,
                     "protocols": ["chronological", "group-kfold", "walk-forward", "purged-kfold"]},
        "bootstrap": {"resamples": a.resamples, "seed": 0, "reselectPenalty": a.reselect},
        "regression": {"selection": a.selection, "device": a.device}})
    walls, results, load = [], [], [os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "m").mkdir()
        (Path(tmp) / "m" / "config.json").write_text("{}")
        for i in range(a.repeat):
            t0 = time.perf_counter()
            res = run_mod.run_leakage_eval(spec, Panel(rows=rows, calendar=cal, source="synthetic"),
                                           {"bench": (Path(tmp) / "m", "auto")}, Path(tmp) / f"out{i}")
            walls.append(time.perf_counter() - t0)
            load.append(os.getloadavg())
            results.append(json.dumps({k: v for k, v in res.items() if k not in ("created", "timings")},
                                      sort_keys=True))
            write(a, rows, walls, results, load, res)


def write(a, rows, walls, results, load, res) -> None:
    """Write (and print) what the runs so far measured: after every repeat, so a cut-off call keeps them."""
    S, d = a.securities, a.dim
    m = res["models"][0]
    out = {"rows": len(rows), "securities": S, "dim": d, "resamples": a.resamples, "selection": a.selection,
           "reselect_penalty": a.reselect, "device_setting": a.device, "wall_s": walls,
           "bit_identical_across_repeats": len(set(results)) == 1 if len(results) > 1 else None,
           "timings": res["timings"], "load_average_1_5_15": load, "cpu_count": os.cpu_count(),
           "machine": platform.machine(), "device": res["device"], "versions": res["versions"],
           "r2_off": m["r2_off"], "r2_on": m["r2_on"], "premium": m["premium"], "premium_ci": m["premium_ci"],
           "alpha_off": m["alpha_off"], "alpha_on": m["alpha_on"],
           "protocol_r2": {k: v["r2"] for k, v in m["protocols"].items()},
           "protocol_premium_ci": {k: v["premium_ci"] for k, v in m["protocols"].items()}}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    print(json.dumps({k: out[k] for k in ("dim", "resamples", "reselect_penalty", "wall_s",
                                          "bit_identical_across_repeats", "r2_off", "r2_on", "premium",
                                          "premium_ci", "protocol_r2")}), flush=True)


if __name__ == "__main__":
    main()
