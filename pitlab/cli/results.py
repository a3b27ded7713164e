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
    """One row per model (each premium beside its own verdict, the date-only part, the raw premium's bootstrap
    bias, reasons when any model has one), a legend, then one line per reduction."""
    models = results.get("models", {})
    reasons = any(r.get("reasons") for r in models.values())
    table = Table(title=title)
    cols = ["model", "market-neutral [CI]", "verdict", "raw premium [CI]", "raw verdict", "date-only",
            "excess [CI]", "excess verdict", "bias"] + (["reason"] if reasons else [])
    for col in cols:
        table.add_column(col, justify="left" if col == "model" or "verdict" in col or col == "reason" else "right")
    for name, r in models.items():
        row = [name, _est(r.get("marketNeutralPremium"), r.get("marketNeutralCI")), r.get("marketNeutralVerdict") or "",
               _est(r["premium"], r.get("premiumCI")), r.get("verdict") or "",
               "" if r.get("dateOnlyPremium") is None else f"{r['dateOnlyPremium']:+.4f}",
               _est(r.get("excessPremium"), r.get("excessCI")), r.get("excessVerdict") or "",
               "" if r.get("premiumBias") is None else f"{r['premiumBias']:+.4f}"]
        table.add_row(*row, *(["; ".join(r.get("reasons") or [])] if reasons else []))
    output.console.print(table)
    output.say("  premiums: R²(on) − R²(off) on the same rows (the leakage-off test dates). market-neutral (the "
               "headline): target minus its date's cross-sectional mean; date-only: the raw premium of features "
               "that identify the date only; excess: raw − date-only on the same bootstrap draws; bias: the raw "
               "premium's bootstrap bias (mean of the replicates − the point estimate)")
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
