"""The packed per-row table of the row-unit statistics (``pitlab.evaluator.rowstats._packed_row_terms``: each row's
1, y, y², x, x·y and lower triangle of x xᵀ, float64), side by side in one process: written in place one
triangle row at a time (pitlab) against gathering the columns of ``np.tril_indices`` and concatenating (what it
did before, the obvious numpy), on random rows of each shape, in alternating order.

    .venv/bin/python bench/packed_terms.py [--shapes 320x384,1000x64,4000x16] [--repeat 7] [--out FILE.json]

Prints the median and range of each and exits 1 unless the two tables are equal bit for bit.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

from pitlab.evaluator.rowstats import RowStats, _packed_row_terms


def gathered(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The reference: the triangle's column pairs gathered, then everything concatenated."""
    lo, hi = np.tril_indices(X.shape[1])
    one = np.ones_like(y)
    return np.concatenate([np.stack([one, y, y * y], axis=1), X, X * y[:, None], X[:, lo] * X[:, hi]], axis=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="320x384,1000x64,4000x16", help="rows x features, comma-separated")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows, ok = [], True
    for shape in a.shapes.split(","):
        r, d = (int(v) for v in shape.split("x"))
        rng = np.random.default_rng(0)
        X, y = rng.standard_normal((r, d)), rng.standard_normal(r)
        times: dict[str, list[float]] = {"gathered": [], "pitlab": []}
        for i in range(a.repeat):
            for name in (("gathered", "pitlab") if i % 2 == 0 else ("pitlab", "gathered")):
                rs = RowStats(X, y, np.arange(r), r, np.zeros(r, dtype=np.int64))
                t = time.perf_counter()
                out = gathered(X, y) if name == "gathered" else _packed_row_terms(rs)
                times[name].append(time.perf_counter() - t)
                if name == "pitlab":
                    mine = out
                else:
                    ref = out
        same = bool(np.array_equal(mine, ref))
        ok &= same
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"rows": r, "features": d, "table_bytes": int(mine.nbytes), "bit_identical": same,
                     **{f"{k}_s": {"median": med[k], "min": min(v), "max": max(v)} for k, v in times.items()},
                     "speedup": med["gathered"] / med["pitlab"]})
        print(f"{r} x {d} ({mine.nbytes / 2**20:.0f} MiB): gathered {med['gathered'] * 1e3:.1f} ms "
              f"[{min(times['gathered']) * 1e3:.1f}-{max(times['gathered']) * 1e3:.1f}], pitlab "
              f"{med['pitlab'] * 1e3:.1f} ms [{min(times['pitlab']) * 1e3:.1f}-{max(times['pitlab']) * 1e3:.1f}], "
              f"{med['gathered'] / med['pitlab']:.2f} x, bit-identical {same}")
    if a.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        a.out.write_text(json.dumps({"command": "bench/packed_terms.py --shapes " + a.shapes, "commit": commit,
                                     "machine": platform.processor() or platform.machine(), "shapes": rows}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
