"""What the penalty reselection adds to the bootstrap's spread (issue 28): for panels of one scenario of
bench/calibration.py at 300 × 30 × 8, the point premium and the sd of R = 100 security-resampled replicates with
the penalty chosen again in every replicate (pitlab's default) and held at the point estimate's choice
(``bootstrap.reselectPenalty: false``), one JSON line per panel on stdout.

    .venv/bin/python bench/calibration_selection.py SCENARIO FIRST_SEED END_SEED > out.jsonl
    .venv/bin/python bench/calibration_selection.py --summarise out-*.jsonl
    .venv/bin/python bench/calibration_selection.py --alphas SCENARIO FIRST_SEED END_SEED
    .venv/bin/python bench/calibration_selection.py --distinct SCENARIO FIRST_SEED END_SEED > out.jsonl

Each record also has the sd with only leakage-on's penalty reselected (``sd_on_reselected``: the reselected run's
leakage-on replicates against the held run's leakage-off ones, the same draws) and only leakage-off's.
``--distinct``: every replicate chooses its penalties on its distinct securities (weights clipped at 1) and refits
with the multiplicities.

``--alphas``: leakage-off's chosen grid position in each panel's point estimate and in its R replicates (the
share at the largest penalty and the medians), whether the replicates choose other penalties than the panels.

Compare each median sd with the sd of the point premium across the panels (the spread an interval should match).
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

from calibration import K, alpha_grid, panel_stats  # noqa: E402

S, T, d, R = 300, 30, 8, 100


def security_weights(seed: int, sec: np.ndarray, date: np.ndarray) -> np.ndarray:
    """Row weights [R, S·T] of R security-resampled replicates (calibration.py's ``security`` scheme, its seed)."""
    from pitlab.evaluator.bootstrap import draw_weights, row_weights

    ws, wd = draw_weights("security-and-date", S, T, R, seed)
    return row_weights(ws, np.ones_like(wd), sec, date)


def panel_record(scen: str, seed: int) -> dict:
    """One panel: the point premium, the replicates' sd reselected, held, and reselected on one side only."""
    from pitlab.evaluator.bootstrap import bootstrap_model, replicate_row_folds
    from pitlab.evaluator.targets import point_estimates

    st, sec, date, on_sel, off_sel, pf = panel_stats(scen, seed, S, T, d)
    off, on, _, grid, _ = point_estimates(st, pf, K, alpha_grid(4), on_sel, "train_mean", None, off_sel, True)
    W = security_weights(seed, sec, date)
    folds = replicate_row_folds(sec, S, W, K)
    re = bootstrap_model(st, W, folds, K, grid, on_sel, "train_mean", None, off_sel, same_rows=True)
    fx = bootstrap_model(st, W, folds, K, grid, on_sel, "train_mean", (off.alpha_index, on.alpha_index), off_sel,
                         same_rows=True)

    def sd(v: np.ndarray) -> float:
        return float(np.nanstd(v, ddof=1))

    return {"scenario": scen, "seed": seed, "point": float(on.r2_rows[0] - off.r2[0]), "sd_reselect": sd(re.premium),
            "sd_fixed": sd(fx.premium), "sd_on_reselected": sd(re.r2_on_rows - fx.r2_off),
            "sd_off_reselected": sd(fx.r2_on_rows - re.r2_off), "alpha_off": float(off.alpha[0])}


def summarise(paths: list[str]) -> None:
    """Per scenario (the records' ``scenario``, else the file): panels, the point premium's sd across them, each
    median bootstrap sd and its ratio to it."""
    groups: dict[str, list[dict]] = {}
    for path in paths:
        for line in open(path):
            x = json.loads(line)
            groups.setdefault(x.get("scenario", path), []).append(x)
    for name, r in groups.items():
        p = np.array([x["point"] for x in r])
        sd = p.std(ddof=1)
        med = {k: float(np.median([x[k] for x in r])) for k in ("sd_reselect", "sd_fixed")}
        print(f"{name}: {len(r)} panels, sd across panels {sd:.5f}; median sd reselected {med['sd_reselect']:.5f} "
              f"({med['sd_reselect'] / sd:.2f} x), held {med['sd_fixed']:.5f} ({med['sd_fixed'] / sd:.2f} x)")


def alpha_choices(scen: str, seeds: range) -> None:
    """Print leakage-off's grid position per panel (point, replicate counts) and the shares at the largest α."""
    from pitlab.evaluator.estimates import leakage_off_r2

    grid = alpha_grid(4)
    pts, reps = [], []
    for seed in seeds:
        st, sec, date, _, off_sel, _ = panel_stats(scen, seed, S, T, d)
        pts.append(int(leakage_off_r2(st, np.ones((1, S * T)), grid, off_sel).alpha_index[0]))
        r = leakage_off_r2(st, security_weights(seed, sec, date), grid, off_sel).alpha_index
        reps += [int(a) for a in r]
        print(seed, pts[-1], np.bincount(r, minlength=len(grid)).tolist(), flush=True)
    top = len(grid) - 1
    print(f"largest alpha: points {np.mean(np.array(pts) == top):.3f}, replicates {np.mean(np.array(reps) == top):.3f}; "
          f"median position: points {np.median(pts)}, replicates {np.median(reps)}")


def choose_on_distinct_units() -> None:
    """From here on, every penalty selection of :mod:`pitlab.evaluator.estimates` sees the weights clipped at 1."""
    import pitlab.evaluator.estimates as est

    real = est.select_alpha

    def distinct(units, w, alphas, selection, fitting=None, backend=None, targets=1):
        return real(units, np.minimum(w, 1.0), alphas, selection, None, backend, targets)

    est.select_alpha = distinct


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    wanted = {"--summarise": None, "--alphas": 4, "--distinct": 4}.get(argv[0], 3)
    if wanted is not None and len(argv) != wanted or wanted is None and len(argv) < 2:
        print(f"calibration_selection.py: wrong arguments {argv}; usage:\n{__doc__}", file=sys.stderr)
        return 2
    if argv[0] == "--summarise":
        summarise(argv[1:])
        return 0
    if argv[0] == "--alphas":
        alpha_choices(argv[1], range(int(argv[2]), int(argv[3])))
        return 0
    if argv[0] == "--distinct":
        choose_on_distinct_units()
        argv = argv[1:]
    for seed in range(int(argv[1]), int(argv[2])):
        print(json.dumps(panel_record(argv[0], seed)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
