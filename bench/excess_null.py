"""The excess premium over the date-only baseline under a pure date effect (issue 28's acceptance check).

Each panel: S securities × T dates, y = date effect (sd 0.5) + noise, no other signal. The "model" embedding
encodes the date exactly (the date indicators in a random rotation) plus ``--noise-dims`` noise dimensions; the
date-only baseline is the date indicators. Both run through pitlab's estimator (protocol-cv penalty selection,
same-row premium, the same security-and-date draws, penalties reselected in every replicate). Counted: panels
whose raw premium interval excludes 0 (the mechanical premium is there) and panels whose paired excess interval
contains 0 (goal ≥ 93 %).

  python bench/excess_null.py --panels 200 --workers 16 --out bench/results/excess-null.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's pitlab before an installed one

import numpy as np

ALPHAS = [0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0]


def one_panel(seed: int, S: int, T: int, noise_dims: int, R: int, cluster: str = "two-way") -> dict:
    """Raw premium, baseline premium and the paired excess of one panel, with 95 % intervals (``cluster``'s)."""
    from pitlab.evaluator.bootstrap import (IntervalRule, bootstrap_model, draw_weights, replicate_row_folds,
                                           row_weights, two_way_split)
    from pitlab.evaluator.decompose import date_features
    from pitlab.evaluator.estimates import AlphaSelection, PanelStats
    from pitlab.evaluator.protocols import security_folds
    from pitlab.evaluator.run import date_strata
    from pitlab.evaluator.targets import point_estimates

    t0 = time.perf_counter()
    rng = np.random.default_rng([seed, 28])
    sec, date = np.tile(np.arange(S), T), np.repeat(np.arange(T), S)
    y = 0.5 * rng.standard_normal(T)[date] + rng.standard_normal(S * T)
    D = date_features(date, T)
    Xm = np.hstack([D @ np.linalg.qr(rng.standard_normal((T, T)))[0], rng.standard_normal((S * T, noise_dims))])
    train, test = date < (2 * T) // 3 - 1, date >= (2 * T) // 3
    on_sel, off_sel = AlphaSelection("security-cv", 5), AlphaSelection("date-blocked", 5, embargo_days=5)
    ws, wd = draw_weights(cluster, S, T, R, seed, date_strata(np.arange(T), T, np.arange(T) < (2 * T) // 3 - 1,
                                                              np.arange(T) >= (2 * T) // 3))
    rule = IntervalRule(0.95, "two-way", two_way_split(R), S, T) if cluster == "two-way" else IntervalRule(0.95)
    W = row_weights(ws, wd, sec, date)
    F = replicate_row_folds(sec, S, W, 5)
    pf = security_folds(np.full(S, T), 5)[sec][None, :]
    out, reps = {"seed": seed, "S": S, "T": T, "noise_dims": noise_dims, "R": R, "cluster": cluster}, {}
    for name, X in (("model", Xm), ("baseline", D)):
        st = PanelStats.build_rows(X, y, sec, train, test, positions=date * 10)
        off, on, _, grid, _ = point_estimates(st, pf, 5, ALPHAS, on_sel, "train_mean", None, off_sel, True)
        out[name] = float(on.r2_rows[0] - off.r2[0])
        reps[name] = bootstrap_model(st, W, F, 5, grid, on_sel, "train_mean", None, off_sel, same_rows=True).premium
    out["excess"] = out["model"] - out["baseline"]
    for key, pt, v in (("model_ci", out["model"], reps["model"]),
                       ("excess_ci", out["excess"], reps["model"] - reps["baseline"])):
        out[key] = list(rule.interval(pt, v))
    out["seconds"] = time.perf_counter() - t0
    return out


def summary(recs: list[dict]) -> dict:
    """Share of panels whose raw interval excludes 0 and whose excess interval contains 0."""
    raw = np.array([r["model_ci"][0] > 0 for r in recs])
    exc = np.array([r["excess_ci"][0] <= 0 <= r["excess_ci"][1] for r in recs])
    return {"panels": len(recs), "raw_significant": float(raw.mean()), "excess_contains_0": float(exc.mean()),
            "mean_raw_premium": float(np.mean([r["model"] for r in recs])),
            "mean_baseline_premium": float(np.mean([r["baseline"] for r in recs])),
            "mean_excess": float(np.mean([r["excess"] for r in recs]))}


def _work(task):
    return one_panel(*task)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--panels", type=int, default=200)
    p.add_argument("--securities", type=int, default=100)
    p.add_argument("--dates", type=int, default=30)
    p.add_argument("--noise-dims", type=int, default=8)
    p.add_argument("--resamples", type=int, default=200)
    p.add_argument("--cluster", default="two-way", choices=["two-way", "security", "date", "security-and-date"])
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--summarise", type=Path, default=None, metavar="JSONL")
    a = p.parse_args(argv)
    if a.summarise:
        print(json.dumps(summary([json.loads(x) for x in a.summarise.read_text().splitlines() if x.strip()]), indent=1))
        return 0
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.perf_counter()
    tasks = [(s, a.securities, a.dates, a.noise_dims, a.resamples, a.cluster) for s in range(a.panels)]
    recs = []
    sink = open(a.out, "w") if a.out else None
    with ProcessPoolExecutor(a.workers) as ex:
        for r in ex.map(_work, tasks):
            recs.append(r)
            if sink:
                sink.write(json.dumps(r) + "\n")
                sink.flush()
    print(json.dumps({**summary(recs), "seconds": time.perf_counter() - t0}, indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
