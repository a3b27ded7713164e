"""Benchmark: the full protocol set (chronological + GroupKFold + walk-forward + purged K-fold) and a
200-resample clustered bootstrap on a synthetic 30,000-row panel, statistics only (embeddings precomputed).

    .venv/bin/python bench/bench_statistics.py --dim 384 --selection gcv --out bench/stats-cpu-384.json

Prints and writes the timings run_leakage_eval records (seconds). The panel: ``--securities`` securities on
``--dates`` dates every third business day of 2019-2021; embeddings = a date fingerprint + a security
fingerprint + noise (float32), target = date effect + noise.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--securities", type=int, default=500)
    ap.add_argument("--dates", type=int, default=60)
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--selection", default="gcv", choices=["gcv", "security-cv"])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    import pitlab.evaluator.run as run_mod
    from pitlab.api.leakageeval import LeakageEvalSpec
    from pitlab.data.types import Panel

    S, T, d = a.securities, a.dates, a.dim
    cal = pd.bdate_range("2019-01-01", "2021-12-31")
    dates = cal[10:10 + 3 * T:3]
    rows = pd.DataFrame({"date": np.repeat(dates.to_numpy(), S), "security": np.tile([f"S{i:04d}" for i in range(S)], T)})
    rows["prompt"] = [f"{i}" for i in range(len(rows))]
    rng = np.random.default_rng(0)
    di, si = np.repeat(np.arange(T), S), np.tile(np.arange(S), T)
    rows["target"] = rng.standard_normal(T)[di] * 0.3 + rng.standard_normal(len(rows))
    X = (rng.standard_normal((T, d))[di] + rng.standard_normal((S, d))[si]
         + rng.standard_normal((len(rows), d))).astype(np.float32)

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
        "bootstrap": {"resamples": a.resamples, "seed": 0}, "regression": {"selection": a.selection}})
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "m").mkdir()
        (Path(tmp) / "m" / "config.json").write_text("{}")
        t0 = time.perf_counter()
        res = run_mod.run_leakage_eval(spec, Panel(rows=rows, calendar=cal, source="synthetic"),
                                       {"bench": (Path(tmp) / "m", "auto")}, Path(tmp) / "out")
        wall = time.perf_counter() - t0
    m = res["models"][0]
    out = {"rows": len(rows), "securities": S, "dim": d, "resamples": a.resamples, "selection": a.selection,
           "wall_s": wall, "timings": res["timings"], "cpu_count": os.cpu_count(), "machine": platform.machine(),
           "r2_off": m["r2_off"], "r2_on": m["r2_on"], "premium": m["premium"],
           "protocol_r2": {k: v["r2"] for k, v in m["protocols"].items()}}
    a.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
