"""Reading a price file, side by side in one process: the line of each record counted with numpy
(``pitlab.data.panels._plain_record_lines``) against Python's csv module (``_csv_record_lines``, what every
file was read with before), then the whole ``load_ohlcv_long`` (which ``pitlab validate`` and every run's
preflight call).

    .venv/bin/python bench/price_load.py [--file $PITLAB_DATA_ROOT/sp500_5yr/sp500_5yr_ohlcv_long.csv.gz]
        [--repeat 5] [--against 79fdb31] [--out FILE.json]

Prints the median and range of ``--repeat`` runs of each, in alternating order, and whether the two readings give
the same lines (they must: the bench exits 1 otherwise). ``--against REV``: also ``load_ohlcv_long`` of
``pitlab/data/panels.py`` as it was at git revision REV, loaded into this process, in turn with this tree's, and
whether the two give equal close, volume and calendar (exit 1 otherwise).
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

DATA_ROOT = Path(os.environ.get("PITLAB_DATA_ROOT", Path(__file__).resolve().parents[2] / "shared" / "data"))
DEFAULT_FILE = DATA_ROOT / "sp500_5yr" / "sp500_5yr_ohlcv_long.csv.gz"


def _timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _panels_at(rev: str):
    """``pitlab/data/panels.py`` of git revision ``rev`` as a module of its own (the rest of pitlab as installed)."""
    import importlib.util
    import sys
    import tempfile

    text = subprocess.run(["git", "show", f"{rev}:pitlab/data/panels.py"], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[1]).stdout
    path = Path(tempfile.mkdtemp()) / f"panels_{rev}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _against(rev: str, file: Path, repeat: int) -> dict:
    """``load_ohlcv_long`` of revision ``rev`` and of this tree, ``repeat`` times each in alternating order."""
    from pitlab.data import panels

    old = _panels_at(rev)
    times: dict[str, list[float]] = {rev: [], "this tree": []}
    for i in range(repeat):
        pair = ((rev, old), ("this tree", panels))
        for name, module in (pair if i % 2 == 0 else pair[::-1]):
            times[name].append(_timed(lambda m=module: m.load_ohlcv_long(file))[0])
    a, b = old.load_ohlcv_long(file), panels.load_ohlcv_long(file)
    equal = a.close.equals(b.close) and a.volume.equals(b.volume) and a.calendar.equals(b.calendar)
    out = {k: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)} for k, v in times.items()}
    for k, v in out.items():
        print(f"load_ohlcv_long {k:10s} median {v['median_s']:.3f} s  (min {v['min_s']:.3f}, max {v['max_s']:.3f})")
    print(f"{rev} / this tree: {out[rev]['median_s'] / out['this tree']['median_s']:.2f} x; equal close, volume and "
          f"calendar: {equal}")
    return {**out, "prices_equal": bool(equal)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, default=DEFAULT_FILE, help="a long OHLCV CSV (.gz allowed)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--against", metavar="REV", help="also time load_ohlcv_long of pitlab/data/panels.py at REV")
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
    against = _against(args.against, args.file, args.repeat) if args.against else None
    same &= against is None or against["prices_equal"]
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        args.out.write_text(json.dumps({"file": str(args.file), "records": records, "repeat": args.repeat,
                                        "same_lines": bool(same), "seconds": summary, "commit": commit,
                                        "against": None if against is None else {args.against: against},
                                        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                                        "processor": platform.processor()}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
