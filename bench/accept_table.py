"""The acceptance table of issue 27 from `bench/throughput.py` records, one markdown row per shape and record,
in the columns of bench/RESULTS.md's acceptance tables.

    python3 bench/accept_table.py $OUT/accept-*/throughput.json

Columns: the plain loop's, Liger's and pitlab's tokens/s (per GPU); pitlab against the plain loop and Liger; the
three MFUs (the plain loops' from pitlab's model FLOPs per token, as the bench's summary computes them); pitlab's
timed steps (ms) and their max/min; pitlab's peak allocated and reserved against its planned peak (GB, 10^9
bytes); FSDP2 forced at world size 1: tokens/s, against pitlab, MFU, steps max/min, reserved against planned. A
run that was skipped or failed reads "skipped: …" or "failed: …" with the first words of its reason; a run absent
from the record (killed with its process) reads "–".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from throughput import pl_flops  # pitlab's FLOPs per token over the card's peak, as the bench's summary uses

FSDP2_KEY = "PITLAB_FORCE_FSDP2=1"
HEADER = ("| shape, tokens/step, record | plain loop | Liger | pitlab | vs plain / Liger | MFU (plain, Liger, pitlab) "
          "| pitlab steps (ms), max/min | pitlab peak allocated / reserved vs plan (GB) "
          "| FSDP2 ws 1: tokens/s, vs pitlab, MFU, steps max/min, reserved vs plan |\n"
          "|---|---:|---:|---:|---|---|---|---|---|")
DASH = "–"


def _rate(run: dict | None) -> float | None:
    """Tokens/s per GPU of a measured run, else None."""
    if not run or "step_s" not in run:
        return None
    return run.get("tokens_per_second_per_gpu", run["tokens_per_second"])


def _missing(run: dict | None, width: int = 60) -> str:
    """How a run without a measurement reads: "–" (absent), "skipped: …" or "failed: …"."""
    if run and "skipped" in run:
        return "skipped: " + str(run["skipped"])[:width]
    if run and "error" in run:
        return "failed: " + str(run["error"])[:width]
    return DASH


def _rate_cell(run: dict | None, rate: float | None) -> str:
    """A run's tokens/s, or why it has none (:func:`_missing`)."""
    return _n(rate) if rate else _missing(run)


def _n(x: float | None) -> str:
    return DASH if x is None else f"{x:,.0f}"


def _pct(x: float | None) -> str:
    return DASH if x is None else f"{100 * x:.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a and b else DASH


def _gb(x: float | None) -> str:
    return DASH if not x else f"{x / 1e9:.2f}"


def _spread(run: dict) -> float:
    """Max/min of a run's timed step times (seconds)."""
    return max(run["step_s"]) / min(run["step_s"])


def rows(record: dict, label: str) -> list[str]:
    """Markdown rows (one per shape) of one `bench/throughput.py` record (its throughput.json, parsed)."""
    out = []
    for shape, runs in record["shapes"].items():
        hf, liger, pit = runs.get("hf"), runs.get("liger"), runs.get("pitlab")
        fsdp = next((v for k, v in runs.items() if isinstance(v, dict) and FSDP2_KEY in k), None)
        r_hf, r_lg, r_pit, r_fs = _rate(hf), _rate(liger), _rate(pit), _rate(fsdp)
        tokens = (pit if r_pit else hf if r_hf else {}).get("tokens_per_step")
        # the plain loops' MFU from pitlab's FLOP count, as the bench's summary has it (a process killed before
        # its summary left only the runs)
        per_rate = pl_flops(runs) if r_pit else None
        mfu = ", ".join([_pct(r * per_rate if r and per_rate else None) for r in (r_hf, r_lg)]
                        + [_pct(pit.get("mfu") if r_pit else None)]) + " %"
        if r_pit:
            steps = (f"{1e3 * min(pit['step_s']):.1f}–{1e3 * max(pit['step_s']):.1f}, {_spread(pit):.3f}")
            mem = (f"{_gb(pit.get('peak_allocated'))} / {_gb(pit.get('peak_reserved'))} vs "
                   f"{_gb(pit.get('planned_peak'))}")
        else:
            steps, mem = _missing(pit), DASH
        fs = (f"{_n(r_fs)}, {_ratio(r_fs, r_pit)}, {_pct(fsdp.get('mfu'))} %, {_spread(fsdp):.3f}, "
              f"{_gb(fsdp.get('peak_reserved'))} vs {_gb(fsdp.get('planned_peak'))}") if r_fs else _missing(fsdp)
        out.append(" | ".join([f"| {shape}, {_n(tokens)}, {label}", _rate_cell(hf, r_hf), _rate_cell(liger, r_lg),
                               _rate_cell(pit, r_pit), f"{_ratio(r_pit, r_hf)} / {_ratio(r_pit, r_lg)}", mfu, steps,
                               mem, fs]) + " |")
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
