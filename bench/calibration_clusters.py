"""Calibration and power of the leakage premium's bootstrap per ``bootstrap.cluster`` setting (issue 16; the
study that chooses the default interval is now bench/calibration.py).

Simulated panels of S securities × T dates (default 1,000 × 30, the published size) with d-dimensional
"embeddings" under three scenarios:

* ``null``: no leakage. y = ε, X = z (independent standard normals).
* ``planted``: a premium planted through temporal mixing. The embedding recognises the date (X = f_t + z, a
  fingerprint f_t ~ N(0, I_d) shared by every security of date t) and the target has a date effect δ_t
  ~ N(0, σ²) independent of f_t (y = δ_t + ε). Leakage-on (GroupKFold by security, every date on both sides)
  learns δ_t through f_t in-sample; leakage-off (train on early dates, test on later ones) cannot. σ is set so
  that the expected premium is about 0.05 (``--planted-sd``).
* ``date-noise``: the same date noise (y = δ_t + ε) with a weak fingerprint (X = 0.3·f_t + z): a small
  expected premium (about 0.015) whose panel-to-panel spread comes from the 30 dates, the noise that a
  bootstrap holding the dates fixed cannot see.

Every panel runs pitlab's estimator: the point estimate through the product path
(:func:`pitlab.evaluator.run.point_estimates`, with grid widening), the replicates through
:func:`replicate_premiums`, a batched formulation for balanced panels built from pitlab's own ridge functions
(per-replicate per-security statistics instead of per-row ones; equal to
:func:`pitlab.evaluator.bootstrap.bootstrap_model` to 1e-10, checked by a test), with the draws of
:func:`pitlab.evaluator.bootstrap.draw_weights` and the verdict of :func:`pitlab.evaluator.bootstrap.judge`:
ridge, α chosen by security-cv (the default) in the point estimate and again in every replicate, R resamples,
95 % percentile intervals. The "true premium" of a scenario is the mean point estimate over its panels (the estimand the
protocol defines: what this model gains from mixing time on panels like these), reported with its standard
error. Per scenario and cluster setting: coverage of the true premium (goal 93-97 %), the rate of
``significant`` (the power where the true premium is 0.05, the false-positive rate where it is ~0), the rate of
``unreliable``, the mean interval width and bias.

  nice -n 10 .venv/bin/python bench/calibration.py --panels 1000 --out bench/results/calibration.json

writes JSON (one record per panel, scenario and setting, plus the summary) and ``--plot`` a PNG of coverage
by setting. ``--panels`` is per scenario; ``--securities``, ``--dates``, ``--dim``, ``--resamples`` size each
panel. The run is resumable: records already in ``--out`` are kept and the missing panels added.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's pitlab before an installed one

import numpy as np

from pitlab.evaluator.bootstrap import BIAS_LIMIT, UNRELIABLE, draw_weights, judge, unreliable_reasons, verdict
from pitlab.evaluator.estimates import AlphaSelection, PanelStats, center
from pitlab.evaluator.protocols import security_folds, security_folds_batch
from pitlab.evaluator.ridge import (RidgeFit, SuffStats, out_of_sample_errors, path_test_sse, r2_score_oos,
                                   ridge_path, solve_ridge)
from pitlab.evaluator.run import point_estimates

SCENARIOS = ("null", "planted", "date-noise")
CLUSTERS = ("security", "date", "security-and-date")
ALPHAS = [0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0]  # the spec's default grid before 2026-12-03


def simulate(scenario: str, S: int, T: int, d: int, seed: int, planted_sd: float):
    """One panel: X float64 [S·T, d], y [S·T], security and date codes int [S·T] (date-major order)."""
    rng = np.random.default_rng([seed, SCENARIOS.index(scenario)])
    sec, date = np.tile(np.arange(S), T), np.repeat(np.arange(T), S)
    z, eps = rng.standard_normal((S * T, d)), rng.standard_normal(S * T)
    if scenario == "null":
        return z, eps, sec, date
    f = rng.standard_normal((T, d))
    if scenario == "planted":
        return f[date] + z, planted_sd * rng.standard_normal(T)[date] + eps, sec, date
    return 0.3 * f[date] + z, planted_sd * rng.standard_normal(T)[date] + eps, sec, date


# ---------------------------------------------------------------- the replicates, batched for balanced panels
def _pack(d: int):
    lo, hi = np.tril_indices(d)
    return lo, hi


def row_terms(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Every row's own sufficient statistics, float64 [S, T, Q]: 1, x (d), y, y², the lower triangle of xxᵀ
    (d(d+1)/2), x·y (d). ``X`` [S, T, d], ``y`` [S, T] (a balanced panel)."""
    lo, hi = _pack(X.shape[2])
    return np.concatenate([np.ones(X.shape[:2] + (1,)), X, y[:, :, None], (y * y)[:, :, None],
                           X[:, :, lo] * X[:, :, hi], X * y[:, :, None]], axis=2)


def unit_stats(terms: np.ndarray, v: np.ndarray, dates: np.ndarray) -> np.ndarray:
    """Per replicate and security, the sufficient statistics of the security's rows on ``dates`` (bool [T]),
    each row weighted by its date's multiplicity ``v`` float [B, T]: float64 [B, S, Q] (the columns of
    :func:`row_terms`, whose output ``terms`` [S, T, Q] is). One matrix product [B, T'] × [T', S·Q]."""
    S, _, Q = terms.shape
    sel = np.flatnonzero(dates)
    flat = terms[:, sel, :].transpose(1, 0, 2).reshape(len(sel), S * Q)
    return (v[:, sel] @ flat).reshape(v.shape[0], S, Q)


def _suff(a: np.ndarray, d: int) -> SuffStats:
    """SuffStats of [m, Q] packed statistics (the columns of :func:`unit_stats`)."""
    lo, hi = _pack(d)
    q = len(lo)
    m = a.shape[0]
    sxx = np.empty((m, d, d))
    sxx[:, lo, hi] = a[:, 3 + d:3 + d + q]
    sxx[:, hi, lo] = a[:, 3 + d:3 + d + q]
    return SuffStats(n=a[:, 0], sx=a[:, 1:1 + d], sy=a[:, 1 + d], syy=a[:, 2 + d], sxx=sxx, sxy=a[:, 3 + d + q:])


def fold_sse(fit_units: np.ndarray, P_fit: np.ndarray, test_units: np.ndarray, P_test: np.ndarray, alphas,
             inner_folds: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One fold for B replicates: α by security-cv (inner GroupKFold by security on the replicate's fitting
    set, pooled inner SSE), ridge refit, SSE and SST (training-mean benchmark) on the test set.

    ``fit_units``, ``test_units`` float [B, S]: each security's multiplicity in the fitting / test set (0 =
    out); ``P_fit``, ``P_test`` [B or 1, S, Q]: :func:`unit_stats` of the fitting / test dates. Returns sse,
    sst float [B] and the chosen grid position int [B]: the numbers
    :meth:`pitlab.evaluator.estimates.PanelStats.fold_errors` gives for the same rows and weights."""
    B, S = fit_units.shape
    k = inner_folds
    sizes = np.rint(fit_units * P_fit[..., 0]).astype(np.int64)
    inner = security_folds_batch(sizes, k, field="inner folds of the penalty selection")  # [B, S]
    masks = np.concatenate([fit_units[:, None, :],
                            fit_units[:, None, :] * (inner[:, None, :] == np.arange(k)[None, :, None])], axis=1)
    sets = masks @ P_fit  # [B, 1 + k, Q]
    fit = _suff(sets[:, 0], d)
    inner_test = _suff(sets[:, 1:].reshape(B * k, -1), d)
    inner_train = _suff((sets[:, :1] - sets[:, 1:]).reshape(B * k, -1), d)
    cv = path_test_sse(ridge_path(inner_train, alphas), inner_test).reshape(B, k, -1).sum(axis=1)
    idx = np.argmin(cv, axis=1)
    a = np.asarray(alphas, dtype=np.float64)
    beta, c, ybar = solve_ridge(fit, a[idx])
    test = _suff((test_units[:, None, :] @ P_test)[:, 0], d)
    rf = RidgeFit(alphas=a, alpha=a[idx], alpha_index=idx, beta=beta, intercept=c, y_mean=ybar, n=fit.n,
                  score=cv, df=cv * np.nan, criterion="security-cv")
    sse, sst = out_of_sample_errors(rf, test)
    return sse, sst, idx


def replicate_premiums(X: np.ndarray, y: np.ndarray, ws: np.ndarray, wd: np.ndarray, train_dates: np.ndarray,
                       alphas, n_splits: int = 5, inner_folds: int = 5, batch: int = 50) -> dict[str, np.ndarray]:
    """R² off, R² on and the premium of every replicate of a balanced panel (X [S, T, d] and y [S, T],
    already centred), for security multiplicities ``ws`` int [R, S] and date multiplicities ``wd`` [R, T]
    (:func:`pitlab.evaluator.bootstrap.draw_weights`): the values of
    :func:`pitlab.evaluator.bootstrap.bootstrap_model` (security-cv, α chosen again in every replicate),
    computed with per-replicate per-security statistics instead of per-row ones (B·S·T·d² once, then
    S-sized sums). tests/test_evaluator_verdicts.py checks it equals the product path to 1e-10."""
    S, T, d = X.shape
    R = ws.shape[0]
    same_dates = bool((wd == wd[:1]).all())
    out = {"r2_off": np.empty(R), "r2_on": np.empty(R)}
    terms = row_terms(X, y)
    for s in range(0, R, batch):
        w = ws[s:s + batch].astype(np.float64)
        v = (wd[:1] if same_dates else wd[s:s + batch]).astype(np.float64)  # security clustering: one set
        P_tr, P_te = unit_stats(terms, v, train_dates), unit_stats(terms, v, ~train_dates)
        P_all = P_tr + P_te
        sse, sst, _ = fold_sse(w, P_tr, w, P_te, alphas, inner_folds, d)
        out["r2_off"][s:s + batch] = r2_score_oos(sse, sst)
        F = security_folds_batch(np.rint(w * P_all[..., 0]).astype(np.int64), n_splits)
        tot_sse, tot_sst = 0.0, 0.0
        for f in range(n_splits):
            e, t, _ = fold_sse(w * ((F != f) & (F >= 0)), P_all, w * (F == f), P_all, alphas, inner_folds, d)
            tot_sse, tot_sst = tot_sse + e, tot_sst + t
        out["r2_on"][s:s + batch] = r2_score_oos(tot_sse, tot_sst)
    out["premium"] = out["r2_on"] - out["r2_off"]
    return out


def one_panel(scenario: str, seed: int, args) -> list[dict]:
    """Point estimate and, per cluster setting, interval and verdict of one simulated panel."""
    S, T, d, R, K = args.securities, args.dates, args.dim, args.resamples, 5
    X, y, sec, date = simulate(scenario, S, T, d, seed, args.planted_sd)
    train, test = date < args.train_dates, date >= args.train_dates
    sel = AlphaSelection("security-cv", inner_folds=5)
    t0 = time.perf_counter()
    st = PanelStats.build(X, y, sec, S, train, test)
    rows = np.bincount(sec, minlength=S)
    f0 = security_folds(rows, K)
    off, on, edges, grid, widen = point_estimates(st, f0[None, :], K, ALPHAS, sel)
    premium = float(on.r2[0] - off.r2[0])
    edge_text = edges["off"][0] + edges["on"][0]
    t_point = time.perf_counter() - t0
    out = []
    Xc, yc, _ = center(X, y)
    Xb, yb = Xc.reshape(T, S, d).transpose(1, 0, 2).copy(), yc.reshape(T, S).T.copy()  # [S, T, d], [S, T]
    for cluster in args.clusters:
        t1 = time.perf_counter()
        ws, wd = draw_weights(cluster, S, T, R, seed)
        reps = replicate_premiums(Xb, yb, ws, wd, np.arange(T) < args.train_dates, grid, K, 5, batch=args.batch)
        j = judge(premium, reps["premium"], 0.95, edge_text)
        out.append({"scenario": scenario, "seed": seed, "cluster": cluster, "premium": premium,
                    "r2_off": float(off.r2[0]), "r2_on": float(on.r2[0]), "ci": j["ci"], "bias": j["bias"],
                    "sd": j["sd"], "verdict": j["verdict"], "reasons": j["reasons"], "widenings": widen,
                    "alpha_off": float(off.alpha[0]), "n_valid": int(np.isfinite(reps["premium"]).sum()),
                    "seconds": time.perf_counter() - t1 + (t_point if cluster == args.clusters[0] else 0.0)})
    return out


def rejudge(record: dict) -> dict:
    """The record's verdict under the current rule (:func:`pitlab.evaluator.bootstrap.unreliable_reasons` with
    :data:`BIAS_LIMIT`), from its stored point estimate, interval, bias, sd and grid-edge reasons: records
    written under an earlier bias limit are read as the estimator judges today."""
    edges = [r for r in record["reasons"] if not r.startswith(("bootstrap bias", "point estimate"))]
    reasons = unreliable_reasons(record["premium"], tuple(record["ci"]), record["bias"], record["sd"], edges,
                                 record["n_valid"])
    return {**record, "reasons": reasons, "verdict": UNRELIABLE if reasons else verdict(tuple(record["ci"]))}


def summarise(records: list[dict]) -> dict:
    """Per scenario: the true premium (mean point estimate, its standard error); per setting: coverage,
    significant rate, unreliable rate, mean width and bias, with binomial standard errors."""
    out = {}
    for sc in SCENARIOS:
        rs = [r for r in records if r["scenario"] == sc]
        if not rs:
            continue
        pts = np.array(sorted({(r["seed"], r["premium"]) for r in rs}))[:, 1]
        truth = float(pts.mean())
        sd = float(pts.std(ddof=1)) if len(pts) > 1 else None
        entry = {"panels": len(pts), "true_premium": truth, "true_premium_se": sd / np.sqrt(len(pts)) if sd else None,
                 "premium_sd_across_panels": sd, "settings": {}}
        for cl in CLUSTERS:
            c = [r for r in rs if r["cluster"] == cl]
            if not c:
                continue
            n = len(c)
            cover = np.mean([r["ci"][0] <= truth <= r["ci"][1] for r in c])
            sig = np.mean([r["verdict"] == "significant" for r in c])
            unrel = np.mean([r["verdict"] == "unreliable" for r in c])
            entry["settings"][cl] = {
                "n": n, "coverage": float(cover), "coverage_se": float(np.sqrt(cover * (1 - cover) / n)),
                "significant_rate": float(sig), "unreliable_rate": float(unrel),
                "mean_ci_width": float(np.mean([r["ci"][1] - r["ci"][0] for r in c])),
                "mean_bias_over_sd": float(np.mean([r["bias"] / r["sd"] for r in c])),
                "seconds_per_panel": float(np.mean([r["seconds"] for r in c]))}
        out[sc] = entry
    return out


def plot(summary: dict, path: Path) -> None:
    """Coverage (with ±2 SE) by cluster setting, one group per scenario; the 93-97 % band shaded."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.axhspan(0.93, 0.97, color="tab:green", alpha=0.15, label="goal 93-97 %")
    ax.axhline(0.95, color="tab:green", linewidth=1)
    for k, cl in enumerate(CLUSTERS):
        xs, ys, es = [], [], []
        for i, sc in enumerate(SCENARIOS):
            s = summary.get(sc, {}).get("settings", {}).get(cl)
            if s:
                xs.append(i + (k - 1) * 0.22)
                ys.append(s["coverage"])
                es.append(2 * s["coverage_se"])
        ax.errorbar(xs, ys, yerr=es, fmt="o", capsize=4, label=f"cluster: {cl}")
    ax.set_xticks(range(len(SCENARIOS)), [f"{sc}\n(true premium {summary[sc]['true_premium']:+.3f}, "
                                          f"{summary[sc]['panels']} panels)" if sc in summary else sc
                                          for sc in SCENARIOS], fontsize="small")
    ax.set_ylabel("coverage of the true premium (95 % CI)")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize="small", loc="lower left")
    ax.set_title("Bootstrap coverage by cluster setting")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--panels", type=int, default=1000, help="panels per scenario")
    p.add_argument("--securities", type=int, default=1000)
    p.add_argument("--dates", type=int, default=30)
    p.add_argument("--train-dates", type=int, default=20, help="leakage-off trains on the first dates")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--resamples", type=int, default=200)
    p.add_argument("--batch", type=int, default=200, help="replicates computed together (memory ~ batch·S·d²)")
    p.add_argument("--planted-sd", type=float, default=0.5, help="sd of the planted date effect")
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    p.add_argument("--clusters", nargs="+", default=list(CLUSTERS), choices=CLUSTERS)
    p.add_argument("--minutes", type=float, default=None, help="stop starting new panels after this long")
    p.add_argument("--out", type=Path, default=Path("bench/results/calibration.json"))
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--seeds", default=None, metavar="FIRST:STOP",
                   help="run only panels FIRST..STOP-1 (one shard of a parallel run; join shards with --merge)")
    p.add_argument("--merge", nargs="*", type=Path, default=[], metavar="JSON",
                   help="records of other shards to join into --out before running (duplicates skipped)")
    args = p.parse_args(argv)
    records: list[dict] = []
    if args.out.exists():
        records = json.loads(args.out.read_text())["records"]
    for extra in args.merge:  # shards of one command run elsewhere (--seeds), joined without duplicates
        have = {(r["scenario"], r["seed"], r["cluster"]) for r in records}
        records += [r for r in json.loads(extra.read_text())["records"]
                    if (r["scenario"], r["seed"], r["cluster"]) not in have]
    records = [rejudge(r) for r in records]
    done = {(r["scenario"], r["seed"]) for r in records}
    t0 = time.monotonic()
    meta = {"command": "python bench/calibration.py " + " ".join(argv if argv is not None else os.sys.argv[1:]),
            "securities": args.securities, "dates": args.dates, "train_dates": args.train_dates, "dim": args.dim,
            "resamples": args.resamples, "planted_sd": args.planted_sd, "alphas": ALPHAS,
            "selection": "security-cv (5 inner folds), reselected in every replicate", "group_k_folds": 5,
            "bias_limit_sd": BIAS_LIMIT, "verdicts": "recomputed from each record's interval, bias and sd with the bias limit above",
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True).stdout.strip()}

    def save() -> dict:
        summary = summarise(records)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps({"meta": meta, "summary": summary, "records": records}, indent=1))
        os.replace(tmp, args.out)
        return summary

    first, stop = 0, args.panels
    if args.seeds:
        first, stop = (int(x) for x in args.seeds.split(":"))
    for seed in range(first, stop):  # panel by panel, every scenario: a stopped run is balanced
        if args.minutes is not None and time.monotonic() - t0 > 60 * args.minutes:
            break
        for sc in args.scenarios:
            if (sc, seed) in done:
                continue
            records += one_panel(sc, seed, args)
        save()
        print(f"panel {seed + 1}/{args.panels} after {time.monotonic() - t0:.0f} s", flush=True)
    summary = save()
    print(json.dumps(summary, indent=1))
    if args.plot:
        plot(summary, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
