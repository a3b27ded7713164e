"""The premium table of an evaluation's compact results (:func:`pitlab.api.summary.compact_results`)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from pitlab.api.layout import EvaluationLayout
from pitlab.cli import output


def _est(p, ci) -> str:
    """``+0.1234 [+0.0100, +0.2000]`` (blank when not recorded)."""
    if p is None:
        return ""
    lo, hi = ci or [float("nan")] * 2
    return f"{p:+.4f} [{lo:+.4f}, {hi:+.4f}]"


TABLE_WIDTH = 180
"""Columns the premium table needs without cutting a verdict; a narrower console gets one block per model."""


def _figures(r: dict) -> list[tuple[str, str, str]]:
    """A model's figures as (label, value [CI], verdict), the headline first."""
    return [("market-neutral", _est(r.get("marketNeutralPremium"), r.get("marketNeutralCI")),
             r.get("marketNeutralVerdict") or ""),
            ("raw premium", _est(r["premium"], r.get("premiumCI")), r.get("verdict") or ""),
            ("date-only part", "" if r.get("dateOnlyPremium") is None else f"{r['dateOnlyPremium']:+.4f}", ""),
            ("excess", _est(r.get("excessPremium"), r.get("excessCI")), r.get("excessVerdict") or ""),
            ("bias", "" if r.get("premiumBias") is None else f"{r['premiumBias']:+.4f}", "")]


def _print_blocks(models: dict) -> None:
    """One block per model, a figure per line: what a console narrower than :data:`TABLE_WIDTH` shows."""
    for name, r in models.items():
        output.say(name)
        for label, value, verdict in _figures(r):
            if value:
                output.say(f"  {label:<15} {value:>27}  {verdict}".rstrip())
        if r.get("reasons"):
            output.say(f"  reason: {'; '.join(r['reasons'])}")


def print_results_table(results: dict, title: str) -> None:
    """One row per model (each premium beside its own verdict, the date-only part, the raw premium's bootstrap
    bias, reasons when any model has one), or one block per model on a console narrower than
    :data:`TABLE_WIDTH`; a legend, then one line per reduction: of the market-neutral (headline) premium, then of
    the raw one, when the results hold both."""
    models = results.get("models", {})
    if output.console.width < TABLE_WIDTH:
        output.say(title)
        _print_blocks(models)
    else:
        reasons = any(r.get("reasons") for r in models.values())
        table = Table(title=title)
        cols = ["model", "market-neutral [CI]", "verdict", "raw premium [CI]", "raw verdict", "date-only",
                "excess [CI]", "excess verdict", "bias"] + (["reason"] if reasons else [])
        for col in cols:  # intervals never wrap inside a number
            table.add_column(col, justify="left" if col == "model" or "verdict" in col or col == "reason" else
                             "right", no_wrap=col != "reason")
        for name, r in models.items():
            (mn, mnv), (raw, rawv), (date, _), (ex, exv), (bias, _) = [(v, w) for _, v, w in _figures(r)]
            table.add_row(name, mn, mnv, raw, rawv, date, ex, exv, bias,
                          *(["; ".join(r.get("reasons") or [])] if reasons else []))
        output.console.print(table)
    output.say("  premiums: R²(on) − R²(off) on the same rows (the leakage-off test dates). market-neutral (the "
               "headline): target minus its date's cross-sectional mean; date-only: the raw premium of features "
               "that identify the date only; excess: raw − date-only on the same bootstrap draws; bias: the raw "
               "premium's bootstrap bias, the mean of the replicates its interval is read from (under the two-way "
               "interval: the half, by security or by date, whose spread is larger) − the point estimate")
    neutral = results.get("reductionsMarketNeutral") or []
    for label, reductions in (("market-neutral", neutral), ("raw" if neutral else "", results.get("reductions") or [])):
        for x in reductions:
            lo, hi = x.get("ci") or [float("nan")] * 2
            bias = "" if x.get("bias") is None else f" bias {x['bias']:+.4f}"
            why = f" ({'; '.join(x['reasons'])})" if x.get("reasons") else ""
            output.say(f"  {label + ' ' if label else ''}premium({x['from']}) − premium({x['to']}): "
                       f"{x['reduction']:+.4f} [{lo:+.4f}, {hi:+.4f}]{bias} {x.get('verdict') or ''}{why}")


def diagnostics_line(full: dict) -> str | None:
    """One line naming every check of ``full["diagnostics"]`` (a results.json's list of ``{"check", "protocol",
    "detail"?, "model"?, "message"}``) as ``protocol: check (detail, model)``, or None when there is none: the
    report says more."""
    items = full.get("diagnostics") or []
    if not items:
        return None
    named = []
    for d in items:
        more = [x for x in (d.get("detail"), d.get("model")) if x]
        named.append(f"{d.get('protocol')}: {d.get('check')}" + (f" ({', '.join(more)})" if more else ""))
    return f"  checks ({len(named)}, each explained in the report): " + "; ".join(named)


def protocol_lines(full: dict) -> list[str]:
    """One line per extra protocol of a results.json (walk-forward, purged K-fold): each model's premium
    R²(on, all rows) − R²(protocol, its test folds) with its interval and verdict; none when it has none."""
    labels = {"walk-forward": "walk-forward", "purged-kfold": "purged K-fold"}
    extra = [p for p in (full.get("protocol") or {}).get("selected", []) if p in labels]
    lines = []
    for p in extra:
        parts = []
        for m in full.get("models") or []:
            r = (m.get("protocols") or {}).get(p)
            if r and r.get("premium") is not None:
                lo, hi = r.get("premium_ci") or [float("nan")] * 2
                parts.append(f"{m['name']} {r['premium']:+.4f} [{lo:+.4f}, {hi:+.4f}] {r.get('verdict') or ''}".rstrip())
        if parts:
            lines.append(f"  {labels[p]} (R²(on, all rows) − R² of its test folds): " + "; ".join(parts))
    return lines


def other_warnings(full: dict) -> list[str]:
    """The warnings of a results.json (``full["warnings"]``) that are not its checks' messages (those are named by
    :func:`diagnostics_line`): e.g. a model whose knowledge cutoff lies in the test period, prompt levels not
    known at t, an unreliable reduction."""
    checks = {f"{d.get('protocol')}: {d.get('message')}" for d in full.get("diagnostics") or []}
    return [w for w in full.get("warnings") or [] if w not in checks]


def say_results(results: dict, root: Path) -> None:
    """The premium table of every evaluation in ``results`` (name → compact results), the checks and the other
    warnings its results.json records (:func:`diagnostics_line`, :func:`other_warnings`) and where its report
    is."""
    for name, r in results.items():
        out = EvaluationLayout(root / name).outputs
        try:
            full = json.loads(Path(out.results).read_text())
        except (OSError, ValueError, TypeError):  # a remote or unreadable results.json: the report still has them
            full = {}
        benchmark = full.get("benchmark") or "training mean"  # regression.benchmark: train_mean or zero
        print_results_table(r, f"Leakage evaluation {name} (R² out of sample, benchmark: {benchmark})")
        for line in protocol_lines(full):
            output.say(line)
        line = diagnostics_line(full)
        if line:
            output.say(line)
        for w in other_warnings(full):
            output.say(f"  [yellow]warning:[/yellow] {escape(w)}")
        output.say(f"  report: {out.report}   plot: {out.plot}")
