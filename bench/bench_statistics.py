"""Benchmark: the full protocol set (chronological + GroupKFold + walk-forward + purged K-fold) and a
200-resample clustered bootstrap on a synthetic 30,000-row panel, statistics only (embeddings precomputed),
through ``run_leakage_eval`` (the code path of ``pitlab run``).

    .venv/bin/python bench/bench_statistics.py --dim 384 --device cpu --out bench/results/stats-cpu-384.json
    python3 bench/bench_statistics.py --dim 2048 --device cuda --no-reselect --repeat 2 --out $OUT/stats.json

The panel: ``--securities`` securities on ``--dates`` dates, every third XNYS session from 2019-01-15 (the
ohlcv default calendar); embeddings = a date fingerprint + a security fingerprint + noise (float32, seeded),
target = date effect + noise. Spec: embargo 5 sessions, 5 GroupKFold folds, 5 walk-forward folds, 5 purged
folds, the protocols of ``--protocols`` (default all four; the spec's own default is chronological and
group-kfold), the default α grid and penalty selection (protocol-cv, 5 inner folds), ``bootstrap.reselectPenalty``
from ``--reselect`` / ``--no-reselect``, ``regression.device`` from ``--device``.
``--repeat N`` runs the evaluation N times and records whether results.json (timings and creation time aside)
is byte-identical across the runs. Prints and writes wall times (seconds), the timings run_leakage_eval
records, the load average before and after, and the headline numbers.

The penalty selection's path (issue 13): ``--penalty-path`` ``auto`` (batched Cholesky solves per α on CUDA,
eigendecompositions elsewhere), ``eigh`` or ``cholesky``; ``--cholesky-block`` the block of the blocked Cholesky
(0: torch's whole-matrix ``cholesky_ex``). ``--microbench`` first times, on the device, one batch of d × d SPD
solves by each Cholesky variant and by ``eigh`` (ms per matrix). ``--check REF:DIM:RESAMPLES`` (repeatable; run
before the timed runs, which then find the device warm) runs the same spec at DIM dims with RESAMPLES resamples twice, once as configured and once as the reference REF
(``numpy``: the numpy backend on the CPU, eigendecompositions; ``eigh``: the same device with
``penalty_path: eigh``), and compares every number of results.json and every bootstrap replicate (max absolute
difference; passes at ≤ 1e-10, with the same α and verdicts). The H200 command of issue 13:

    python3 bench/bench_statistics.py --dim 2048 --device cuda --repeat 2 --microbench \
        --check eigh:2048:10 --check numpy:384:20 --out $OUT/stats-h200-2048-reselect.json

Run time and memory at the defaults (30,000 rows, 384 dims, 200 resamples, all four protocols): 305.6 s and
310.5 s alone on a 2-core AMD EPYC VM (about 11 GB resident), 424 s with the machine shared; 48-56 s on one H200
at 2,048 dims (bench/RESULTS.md, "Statistics speed"). Each stage's start and end are printed to stderr with the
seconds since the run began; ``--out`` says ``"complete": false`` until the last repeat is written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's pitlab before an installed one

import numpy as np
import pandas as pd

PROTOCOLS = ("chronological", "group-kfold", "walk-forward", "purged-kfold")


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


def microbench(d: int, device: str, n: int = 48, seed: int = 0) -> dict:
    """ms per matrix of ``cholesky_solve_batched`` (block 0 = torch's whole-matrix Cholesky; blocks 128, 256, 512
    and leaves 32-256) on ``n`` SPD d × d float64 matrices (max relative difference of x against the default
    block 256, leaf 64), and of ``torch.linalg.eigh`` on 8 of them; the second of two timed calls each."""
    import torch

    from pitlab.evaluator.linalg import cholesky_solve_batched

    g = torch.Generator(device=device).manual_seed(seed)
    Z = torch.randn(n, 2 * d, d, generator=g, device=device, dtype=torch.float64)
    A = Z.mT @ Z + torch.eye(d, device=device, dtype=torch.float64)
    b = torch.randn(n, d, generator=g, device=device, dtype=torch.float64)
    del Z
    out = {"d": d, "n": n}

    def timed(fn):
        for _ in range(2):
            torch.cuda.synchronize() if device == "cuda" else None
            t0 = time.perf_counter()
            r = fn()
            torch.cuda.synchronize() if device == "cuda" else None
            dt = time.perf_counter() - t0
        return r, dt

    ref = None
    for block, leaf in ((256, 64), (0, 0), (128, 64), (512, 64), (256, 32), (256, 128), (256, 256)):
        (x, ok), dt = timed(lambda: cholesky_solve_batched(A.clone(), b, block, leaf))
        ref = x if ref is None else ref
        key = f"cholesky_block_{block}" + (f"_leaf_{leaf}" if block else "")
        out[f"{key}_ms_per_matrix"] = 1e3 * dt / n
        out[f"{key}_max_rel_diff"] = float((x - ref).abs().max() / ref.abs().max())
        out[f"{key}_all_ok"] = bool(ok.all())
    _, dt = timed(lambda: torch.linalg.eigh(A[:8]))
    out["eigh_ms_per_matrix"] = 1e3 * dt / 8
    print(json.dumps({"microbench": out}), flush=True)
    return out


def _spec(a, dates, T: int, resamples: int, device: str):
    from pitlab.api.leakageeval import LeakageEvalSpec

    return LeakageEvalSpec.model_validate({
        "models": [{"name": "bench", "uri": "/bench"}], "dataset": {"kind": "ohlcv", "uri": "synthetic"},
        "protocol": {"trainEnd": str(dates[T * 2 // 3].date()), "testStart": str(dates[T * 2 // 3 + 1].date()),
                     "embargoDays": 5, "groupKFolds": 5, "walkForwardFolds": 5, "purgedFolds": 5,
                     "protocols": a.protocols},
        "bootstrap": {"resamples": resamples, "seed": 0, "reselectPenalty": a.reselect},
        "regression": {"selection": a.selection, "device": device}})


def _use_backend(run_mod, penalty_path: str, block: int, torch_cpu: bool = False) -> None:
    """Make run_leakage_eval resolve ``regression.device`` to a backend with this penalty path and block (and,
    with ``torch_cpu``, torch on the CPU where it would pick numpy)."""
    from dataclasses import replace

    from pitlab.evaluator.linalg import Backend

    class Chosen(Backend):
        @classmethod
        def resolve(cls, device: str = "auto") -> Backend:
            be = Backend.resolve(device)
            if be.library == "numpy":
                if not torch_cpu:
                    return be
                be = Backend("torch", "cpu")
            return replace(be, penalty_path=penalty_path, cholesky_block=block)

    _set_backend(run_mod, Chosen)


def _set_backend(run_mod, cls) -> None:
    """Make the evaluation resolve ``regression.device`` through ``cls`` (prepare_evaluation lives in
    pitlab.evaluator.setup; run_mod keeps the name for the micro-benchmark)."""
    import pitlab.evaluator.setup as setup_mod

    setup_mod.Backend = cls
    run_mod.Backend = cls


def _run(run_mod, spec, rows, cal, X, tmp: Path, name: str) -> tuple[dict, float, str]:
    """One evaluation of the synthetic panel; (results, wall s, replicates CSV text)."""
    from pitlab.data.types import Panel

    def fake_embed(model_dir, texts, **kw):
        kw["info"].update(kind="encoder", digest="bench".ljust(64, "0"), pooling="mean", n_truncated=0,
                          cache_hit=True)
        return X

    run_mod.embed_texts = fake_embed
    t0 = time.perf_counter()

    def progress(stage: str, done: int, total: int) -> None:
        print(f"[{time.perf_counter() - t0:7.1f} s] {name} {stage} {done}/{total}", file=sys.stderr, flush=True)

    res = run_mod.run_leakage_eval(spec, Panel(rows=rows, calendar=cal, source="synthetic"),
                                   {"bench": (tmp / "m", "auto")}, tmp / name, progress=progress)
    wall = time.perf_counter() - t0
    return res, wall, (tmp / name / "bootstrap_replicates.csv").read_text()


def _numbers(a, b, path="") -> tuple[float, list[str]]:
    """Max absolute difference of the numbers of two results trees, and the paths of unequal non-numbers."""
    if isinstance(a, dict) and isinstance(b, dict):
        out, bad = 0.0, [f"{path}: keys differ"] if set(a) != set(b) else []
        for k in set(a) & set(b):
            m, bb = _numbers(a[k], b[k], f"{path}.{k}")
            out, bad = max(out, m), bad + bb
        return out, bad
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out, bad = 0.0, []
        for i, (x, z) in enumerate(zip(a, b)):
            m, bb = _numbers(x, z, f"{path}[{i}]")
            out, bad = max(out, m), bad + bb
        return out, bad
    if isinstance(a, float) and isinstance(b, float):
        if np.isnan(a) and np.isnan(b):
            return 0.0, []
        return abs(a - b), []
    return 0.0, [] if a == b else [path]


def check(a, run_mod, ref: str, dim: int, resamples: int, tmp: Path) -> dict:
    """The configured path against ``ref`` (numpy | eigh) at ``dim`` dims and ``resamples`` resamples."""
    import pitlab.evaluator.linalg as linalg

    rows, cal, dates, X = synthetic_panel(a.securities, a.dates, dim)
    out = {"reference": ref, "dim": dim, "resamples": resamples}
    _use_backend(run_mod, a.penalty_path, a.cholesky_block, a.torch_cpu)
    res, out["wall_s"], csv = _run(run_mod, _spec(a, dates, a.dates, resamples, a.device), rows, cal, X, tmp, "c1")
    if ref == "numpy":
        _set_backend(run_mod, linalg.Backend)
        ref_res, out["reference_wall_s"], ref_csv = _run(run_mod, _spec(a, dates, a.dates, resamples, "cpu"),
                                                         rows, cal, X, tmp, "c2")
    else:
        _use_backend(run_mod, "eigh", a.cholesky_block, a.torch_cpu)
        ref_res, out["reference_wall_s"], ref_csv = _run(run_mod, _spec(a, dates, a.dates, resamples, a.device),
                                                         rows, cal, X, tmp, "c2")
    _use_backend(run_mod, a.penalty_path, a.cholesky_block, a.torch_cpu)

    def strip(r):  # what ran where, and when, aside
        r = json.loads(json.dumps({k: v for k, v in r.items() if k not in ("created", "timings", "device")}))
        r["regression"].pop("device", None)
        r["spec"]["regression"].pop("device", None)
        return r

    diff, unequal = _numbers(strip(res), strip(ref_res))
    import io

    reps = pd.read_csv(io.StringIO(csv))[["r2_off", "r2_on", "premium"]].to_numpy()
    ref_reps = pd.read_csv(io.StringIO(ref_csv))[["r2_off", "r2_on", "premium"]].to_numpy()
    out.update(penalty_path=res["device"]["statistics"]["penalty_path"],
               reference_penalty_path=ref_res["device"]["statistics"]["penalty_path"],
               max_abs_diff_results=diff, max_abs_diff_replicates=float(np.nanmax(np.abs(reps - ref_reps))),
               unequal_non_numbers=unequal[:20], timings=res["timings"], reference_timings=ref_res["timings"])
    out["equal_within_1e-10"] = bool(diff <= 1e-10 and out["max_abs_diff_replicates"] <= 1e-10 and not unequal)
    print(json.dumps({"check": {k: v for k, v in out.items() if "timings" not in k}}), flush=True)
    return out


def main() -> None:
    class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=Formatter)
    ap.add_argument("--dim", type=int, default=384, help="embedding dimensions")
    ap.add_argument("--securities", type=int, default=500, help="securities of the panel")
    ap.add_argument("--dates", type=int, default=60, help="dates of the panel (rows: securities × dates)")
    ap.add_argument("--resamples", type=int, default=200, help="bootstrap resamples")
    ap.add_argument("--selection", default="protocol-cv", choices=["gcv", "security-cv", "protocol-cv"],
                    help="regression.selection")
    ap.add_argument("--reselect", action=argparse.BooleanOptionalAction, default=True,
                    help="bootstrap.reselectPenalty (the spec's default is true)")
    ap.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda", "torch-cpu"],
                    help="regression.device; torch-cpu: the torch backend on the CPU (regression.device: cpu)")
    ap.add_argument("--penalty-path", default="auto", choices=["auto", "eigh", "cholesky"],
                    help="security-cv's scoring of the α grid on the torch backend (auto: cholesky on CUDA)")
    ap.add_argument("--cholesky-block", type=int, default=None,
                    help="block of the blocked Cholesky (0: torch's whole-matrix cholesky_ex; None: pitlab's)")
    ap.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS,
                    help="protocol.protocols (the spec's default is chronological group-kfold)")
    ap.add_argument("--repeat", type=int, default=1, help="timed evaluations (byte-identity checked when > 1)")
    ap.add_argument("--microbench", action="store_true", help="time the Cholesky variants and eigh at --dim first")
    ap.add_argument("--check", action="append", default=[], metavar="REF:DIM:RESAMPLES",
                    help="compare with REF (numpy or eigh) at DIM dims, RESAMPLES resamples (repeatable)")
    ap.add_argument("--profile", type=Path, default=None, metavar="FILE",
                    help="profile the last timed run with torch.profiler (CPU, and CUDA kernels on a GPU): FILE gets "
                         "the top operators by self device time and by self CPU time, and the share of the wall "
                         "time the GPU ran kernels (what a second process sharing the GPU could use)")
    ap.add_argument("--out", type=Path, required=True, help="JSON written after every repeat")
    a = ap.parse_args()
    if a.cholesky_block is None:
        from pitlab.evaluator.linalg import CHOLESKY_BLOCK

        a.cholesky_block = CHOLESKY_BLOCK
    a.torch_cpu = a.device == "torch-cpu"
    if a.torch_cpu:
        a.device = "cpu"
    checks = []
    for c in a.check:
        ref, dim, res = c.split(":")
        if ref not in ("numpy", "eigh"):
            ap.error(f"--check {c}: the reference must be numpy or eigh")
        checks.append((ref, int(dim), int(res)))

    import pitlab.evaluator.run as run_mod

    S, T, d = a.securities, a.dates, a.dim
    rows, cal, dates, X = synthetic_panel(S, T, d)
    _use_backend(run_mod, a.penalty_path, a.cholesky_block, a.torch_cpu)
    spec = _spec(a, dates, T, a.resamples, a.device)
    report = {"walls": [], "results": [], "load": [os.getloadavg()], "res": None, "micro": None, "checks": []}
    write(a, rows, report)  # "complete": false from the start
    if a.microbench:
        report["micro"] = microbench(d, run_mod.Backend.resolve(a.device).device)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "m").mkdir()
        (Path(tmp) / "m" / "config.json").write_text("{}")
        for ref, dim, resamples in checks:  # first: cheap, and a time-limited call keeps them
            try:
                report["checks"].append(check(a, run_mod, ref, dim, resamples, Path(tmp)))
            except Exception as e:  # noqa: BLE001 -- recorded, and the timed runs still run
                report["checks"].append({"reference": ref, "dim": dim, "resamples": resamples,
                                         "error": f"{type(e).__name__}: {e}"})
                print(json.dumps({"check": report["checks"][-1]}), flush=True)
            write(a, rows, report)
        _use_backend(run_mod, a.penalty_path, a.cholesky_block, a.torch_cpu)
        for i in range(a.repeat):
            with _profiled(a.profile if i == a.repeat - 1 else None) as prof:
                res, wall, _ = _run(run_mod, spec, rows, cal, X, Path(tmp), f"out{i}")
            if prof is not None:
                prof.write(a.profile, wall)
            report["walls"].append(wall)
            report["load"].append(os.getloadavg())
            report["results"].append(json.dumps({k: v for k, v in res.items() if k not in ("created", "timings")},
                                                sort_keys=True))
            report["res"] = res
            write(a, rows, report)


class _Profile:
    """A torch.profiler session over one run, and what :meth:`write` reports of it."""

    def __init__(self):
        import torch
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.cuda = torch.cuda.is_available()
        self.prof = profile(activities=acts)

    def write(self, path: Path, wall: float) -> None:
        """FILE: the top-25 operators by self device time (on a GPU) and by self CPU time, and the GPU's
        kernel time over the wall time (the union of kernel intervals, so overlapping streams count once)."""
        avgs = self.prof.key_averages()
        parts = []
        if self.cuda:
            spans = sorted((e.time_range.start, e.time_range.end) for e in self.prof.events()
                           if e.device_type.name == "CUDA")
            busy, end = 0.0, float("-inf")
            for lo, hi in spans:  # microseconds
                if hi > end:
                    busy += hi - max(lo, end)
                    end = hi
            parts.append(f"GPU kernel time {busy / 1e6:.2f} s of {wall:.2f} s wall ({100 * busy / 1e6 / wall:.1f} %)")
            parts.append(avgs.table(sort_by="self_device_time_total", row_limit=25))
        parts.append(avgs.table(sort_by="self_cpu_time_total", row_limit=25))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n\n".join(parts) + "\n")
        print(parts[0] if self.cuda else f"profile written to {path}", flush=True)


@contextlib.contextmanager
def _profiled(path: Path | None):
    """A :class:`_Profile` running inside the block when ``path`` is given, else None."""
    if path is None:
        yield None
        return
    prof = _Profile()
    with prof.prof:
        yield prof


def write(a, rows, report: dict) -> None:
    """Write (and print) what the runs so far measured: after every repeat, so a cut-off call keeps them."""
    S, d = a.securities, a.dim
    res, walls, results, load = report["res"], report["walls"], report["results"], report["load"]
    out = {"rows": len(rows), "securities": S, "dim": d, "resamples": a.resamples, "selection": a.selection,
           "reselect_penalty": a.reselect, "protocols": a.protocols, "device_setting": a.device, "cholesky_block": a.cholesky_block,
           "wall_s": walls, "bit_identical_across_repeats": len(set(results)) == 1 if len(results) > 1 else None,
           "load_average_1_5_15": load, "cpu_count": os.cpu_count(), "machine": platform.machine(),
           "microbench": report["micro"], "checks": report["checks"],
           "complete": len(walls) == a.repeat}  # false until the last repeat: a cut-off run does not look done
    if res is not None:
        m = res["models"][0]
        out.update({"penalty_path": res["device"]["statistics"].get("penalty_path"), "timings": res["timings"],
                    "device": res["device"], "versions": res["versions"],
                    "r2_off": m["r2_off"], "r2_on": m["r2_on"], "premium": m["premium"],
                    "premium_ci": m["premium_ci"], "alpha_off": m["alpha_off"], "alpha_on": m["alpha_on"],
                    "alphas": m["alphas"], "protocol_r2": {k: v["r2"] for k, v in m["protocols"].items()},
                    "protocol_premium_ci": {k: v["premium_ci"] for k, v in m["protocols"].items()}})
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    if res is not None and len(walls) == len(results) and walls:
        print(json.dumps({k: out[k] for k in ("dim", "resamples", "reselect_penalty", "penalty_path", "wall_s",
                                              "bit_identical_across_repeats", "r2_off", "r2_on", "premium",
                                              "premium_ci", "protocol_r2")}), flush=True)
        print(json.dumps({"timings_s": res["timings"]}), flush=True)


if __name__ == "__main__":
    main()
