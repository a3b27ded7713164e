"""The premium table of an evaluation's compact results (:func:`pitlab.api.summary.compact_results`)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from pitlab.api.layout import EvaluationLayout
from pitlab.cli import output


def _est(p, ci) -> str:
    """``+0.1234 [+0.0100, +0.2000]`` (blank when not recorded)."""
    if p is None:
        return ""
    lo, hi = ci or [float("nan")] * 2
    return f"{p:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def print_results_table(results: dict, title: str) -> None:
    """One row per model (premiums with their intervals, verdicts, reasons), then one line per reduction."""
    table = Table(title=title)
    for col in ("model", "market-neutral premium [CI]", "verdict", "raw premium [CI]", "bias", "date-only part",
                "excess over date-only [CI]", "raw verdict", "reason"):
        table.add_column(col, justify="left" if col in ("model", "verdict", "raw verdict", "reason") else "right")
    for name, r in results.get("models", {}).items():
        table.add_row(name, _est(r.get("marketNeutralPremium"), r.get("marketNeutralCI")),
                      r.get("marketNeutralVerdict") or "", _est(r["premium"], r.get("premiumCI")),
                      "" if r.get("premiumBias") is None else f"{r['premiumBias']:+.4f}",
                      "" if r.get("dateOnlyPremium") is None else f"{r['dateOnlyPremium']:+.4f}",
                      _est(r.get("excessPremium"), r.get("excessCI")) + (f" {r['excessVerdict']}"
                                                                          if r.get("excessVerdict") else ""),
                      r.get("verdict") or "", "; ".join(r.get("reasons") or []))
    output.console.print(table)
    output.say("  premiums: R²(on) − R²(off) on the same rows (the leakage-off test dates); market-neutral = target "
               "minus its date's cross-sectional mean; date-only part = the premium of features that identify the "
               "date only")
    for x in results.get("reductions", []):
        lo, hi = x.get("ci") or [float("nan")] * 2
        bias = "" if x.get("bias") is None else f" bias {x['bias']:+.4f}"
        why = f" ({'; '.join(x['reasons'])})" if x.get("reasons") else ""
        output.say(f"  premium({x['from']}) − premium({x['to']}): {x['reduction']:+.4f} [{lo:+.4f}, {hi:+.4f}]"
                   f"{bias} {x.get('verdict') or ''}{why}")


def say_results(results: dict, root: Path) -> None:
    """The premium table of every evaluation in ``results`` (name → compact results) and where its report is."""
    for name, r in results.items():
        print_results_table(r, f"Leakage evaluation {name} (R² out of sample, benchmark: training mean)")
        out = EvaluationLayout(root / name).outputs
        output.say(f"  report: {out.report}   plot: {out.plot}")
