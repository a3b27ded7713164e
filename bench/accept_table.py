"""The acceptance table of issue 27 from `bench/throughput.py` records, one markdown row per shape and record.

    python3 bench/accept_table.py $OUT/accept-*/throughput.json [--label-from-path]

Columns: the plain loop's, Liger's and pitlab's tokens/s (per GPU), pitlab against the plain loop and Liger, pitlab's
MFU, the spread of its timed steps (max/min), FSDP2 forced at world size 1 (tokens/s, against pitlab, steps
max/min) and pitlab's reserved peak against its planned peak (GB, 10^9 bytes). A run that was skipped or failed
reads "skipped" or "failed" with the first words of its reason; a run not in the record reads "–".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FSDP2_KEY = "PITLAB_FORCE_FSDP2=1"
HEADER = ("| shape, tokens/step, record | plain loop | Liger | pitlab | vs plain / Liger | pitlab MFU "
          "| pitlab steps max/min | FSDP2 ws 1: tokens/s, vs pitlab, steps max/min | pitlab reserved / planned peak |\n"
          "|---|---:|---:|---:|---|---:|---:|---|---|")


def _rate(run: dict | None) -> float | None:
    """Tokens/s per GPU of a measured run, else None."""
    if not run or "step_s" not in run:
        return None
    return run.get("tokens_per_second_per_gpu", run["tokens_per_second"])


def _missing(run: dict | None, width: int = 60) -> str:
    """How a run without a measurement reads: "–" (absent), "skipped: …" or "failed: …"."""
    if not run:
        return "–"
    if "skipped" in run:
        return "skipped: " + str(run["skipped"])[:width]
    if "error" in run:
        return "failed: " + str(run["error"])[:width]
    return "–"


def _spread(run: dict) -> float:
    """Max/min of a run's timed step times (seconds)."""
    return max(run["step_s"]) / min(run["step_s"])


def _n(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def rows(record: dict, label: str) -> list[str]:
    """Markdown rows (one per shape) of one `bench/throughput.py` record (its throughput.json, parsed)."""
    out = []
    for shape, runs in record["shapes"].items():
        hf, liger, pit = runs.get("hf"), runs.get("liger"), runs.get("pitlab")
        fsdp = next((v for k, v in runs.items() if isinstance(v, dict) and FSDP2_KEY in k), None)
        r_hf, r_lg, r_pit, r_fs = _rate(hf), _rate(liger), _rate(pit), _rate(fsdp)
        tokens = (pit or hf or {}).get("tokens_per_step")
        vs = ("–" if r_pit is None else
              f"{r_pit / r_hf:.3f}" if r_hf else "–") + " / " + (f"{r_pit / r_lg:.3f}" if r_pit and r_lg else "–")
        mfu = f"{100 * pit['mfu']:.1f} %" if r_pit is not None and pit.get("mfu") is not None else "–"
        steps = f"{_spread(pit):.3f}" if r_pit is not None else _missing(pit)
        fs = (f"{_n(r_fs)}, {r_fs / r_pit:.3f}, {_spread(fsdp):.3f}" if r_fs is not None and r_pit
              else _n(r_fs) if r_fs is not None else _missing(fsdp))
        mem = (f"{pit['peak_reserved'] / 1e9:.2f} / {pit['planned_peak'] / 1e9:.2f} GB"
               if r_pit is not None and pit.get("peak_reserved") and pit.get("planned_peak") else "–")
        out.append(f"| {shape}, {_n(tokens)}, {label} | {_n(r_hf) if r_hf else _missing(hf)} "
                   f"| {_n(r_lg) if r_lg else _missing(liger)} | {_n(r_pit) if r_pit else _missing(pit)} | {vs} "
                   f"| {mfu} | {steps} | {fs} | {mem} |")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", type=Path, help="throughput.json files of bench/throughput.py")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.records if not p.is_file()]
    if missing:  # before any row is printed: a table without them would look complete
        ap.error("no such record: " + ", ".join(missing))
    print(HEADER)
    for path in args.records:
        label = path.parent.name if path.name == "throughput.json" else path.stem
        for row in rows(json.loads(path.read_text()), label):
            print(row)


if __name__ == "__main__":
    main()
