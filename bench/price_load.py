"""Reading a price file, side by side in one process: the line of each record counted with numpy
(``pitlab.data.panels._plain_record_lines``) against Python's csv module (``_csv_record_lines``, what every
file was read with before), then the whole ``load_ohlcv_long`` and ``pitlab validate``'s price checks.

    .venv/bin/python bench/price_load.py [--file ../shared/data/sp500_5yr/sp500_5yr_ohlcv_long.csv.gz]
        [--repeat 5] [--out FILE.json]

Prints the median and range of ``--repeat`` runs of each, in alternating order, and whether the two readings give
the same lines (they must: the bench exits 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

from pitlab.data.panels import OHLCV_COLUMNS, _csv_record_lines, _plain_record_lines, load_ohlcv_long

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "shared" / "data" / "sp500_5yr" / "sp500_5yr_ohlcv_long.csv.gz"


def _timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE, help="a long OHLCV CSV (.gz allowed)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, help="write the timings as JSON here")
    args = ap.parse_args()
    n_fields = len(OHLCV_COLUMNS)
    times: dict[str, list[float]] = {"numpy": [], "csv module": [], "load_ohlcv_long": []}
    same = True
    for i in range(args.repeat):
        order = ("numpy", "csv module") if i % 2 == 0 else ("csv module", "numpy")
        got = {}
        for name in order:
            fn = _plain_record_lines if name == "numpy" else _csv_record_lines
            dt, got[name] = _timed(lambda fn=fn: fn(args.file, n_fields))
            times[name].append(dt)
        same &= got["numpy"] is not None and np.array_equal(got["numpy"], got["csv module"])
        dt, prices = _timed(lambda: load_ohlcv_long(args.file))
        times["load_ohlcv_long"].append(dt)
    records = len(got["csv module"])
    summary = {k: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)} for k, v in times.items()}
    for k, v in summary.items():
        print(f"{k:16s} median {v['median_s']:.3f} s  (min {v['min_s']:.3f}, max {v['max_s']:.3f}; {args.repeat} runs)")
    ratio = summary["csv module"]["median_s"] / summary["numpy"]["median_s"]
    print(f"{records:,} records, {prices.close.shape[1]} securities x {prices.close.shape[0]} days; numpy "
          f"{ratio:.2f} x faster than the csv module; same lines: {same}")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        args.out.write_text(json.dumps({"file": str(args.file), "records": records, "repeat": args.repeat,
                                        "same_lines": bool(same), "seconds": summary, "commit": commit,
                                        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                                        "processor": platform.processor()}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
