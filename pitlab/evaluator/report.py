"""Outputs of a leakage evaluation: ``results.json``, ``report.md``, ``report.html``, ``premium.png`` (forest plot),
``r2_by_fold.png`` (per-fold R² of the date-block protocols), ``premium_vs_cutoff.png`` (control by knowledge
cutoff), ``bootstrap_replicates.csv``. :func:`rebuild_report` (``pitlab report``) rewrites the report files from
``results.json`` alone.

Every file is written under a temporary name and renamed into place; ``results.json`` is written last, so an
output folder holding ``results.json`` is complete. If writing fails, the files this call wrote are removed.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pitlab.api import layout
from pitlab.data.sampling import dropped_note
from pitlab.evaluator.plots import (VERDICT_STYLE, _ci, _f, plot_premium,  # noqa: F401  (re-exported)
                                    plot_premium_vs_cutoff, plot_r2_by_fold)

RESULTS_FILE = layout.RESULTS
REPORT_FILE = layout.REPORT
PLOT_FILE = layout.PLOT
HTML_FILE = layout.HTML
FOLDS_PLOT_FILE = "r2_by_fold.png"
CUTOFF_PLOT_FILE = "premium_vs_cutoff.png"
REPLICATES_FILE = layout.REPLICATES
ROWS_FILE = layout.ROWS
OUTPUT_FILES = (REPORT_FILE, HTML_FILE, PLOT_FILE, REPLICATES_FILE, ROWS_FILE, RESULTS_FILE)
"""Files every evaluation writes (r2_by_fold.png and premium_vs_cutoff.png only when there is something to plot)."""


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _json_ready(obj):
    """NaN/inf → None (JSON has no NaN), numpy scalars/arrays → Python."""
    if isinstance(obj, dict):
        return {str(k): _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _json_ready(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def render_markdown(results: dict) -> str:
    """The report: protocol and benchmark sentence, the per-model table (model | r2_off | r2_on | premium
    [CI] | verdict), the paired reductions table, and the panel summary."""
    boot, proto, panel = results["bootstrap"], results["protocol"], results["panel"]
    off, on = proto["leakage_off"], proto["leakage_on"]
    pct = f"{100 * boot['confidence']:g}%"
    lines = [
        "# Leakage evaluation", "",
        (f"R² is out-of-sample with the **{results['benchmark']}** as benchmark: "
         + (results["r2_definition"].removeprefix("out-of-sample ") + ". " if results.get("r2_definition") else
            "R² = 1 − SSE / Σ(y − ȳ_train)², ȳ_train being the mean target of the fold the ridge was fitted on. ")
         + "Ridge regression on the embeddings, intercept unpenalised, penalty chosen inside every training set "
         + f"by {_selection_text(results)}. "
         + _leakage_off_text(off)
         + f" **leakage-on**: GroupKFold by security ({on['n_splits']} folds) over all "
         f"{on['n_rows']} rows, pooled out-of-fold R². Premium = R²(on) − R²(off)"
         + (", both on the leakage-off test rows (same rows)" if _decomposed(results) else "")
         + f". {pct} {_interval_text(boot)} "
         f"from {boot['resamples']} bootstrap resamples {_resampled(boot)} (seed {boot['seed']}), the same draws for every "
         f"model"
         + (f"; in every replicate the penalty is {boot['penalty_in_replicates']}"
            if boot.get("penalty_in_replicates") else "")
         + "; a result is *significant* only when its interval excludes 0, and *unreliable* (never significant) "
         + ("when its point estimate lies outside its interval, its bootstrap bias (mean of the replicates − point "
            f"estimate) exceeds {boot.get('bias_limit_sd', 0.5):g} × the bootstrap sd, or "
            if boot.get("cluster") != "two-way" else "when ")
         + "a penalty selection of its point estimate ends at an edge of the α grid (the grid is first widened; "
           "the largest penalty counts as an edge only while the fit keeps at least one effective parameter "
           "besides the intercept: a fit shrunk below that says \"no signal\", which more shrinkage would not "
           "change). " + _bias_sentence(boot)),
        "",
    ]
    if _decomposed(results):
        lines += decomposition_lines(results, pct)
    lines += [
        f"| model | r2_off | r2_on{' (test rows)' if _decomposed(results) else ''} | premium [{pct} CI] | verdict | p |",
        "|---|---:|---:|---|---|---:|",
    ]
    for m in results["models"]:
        lines.append(f"| {m['name']} | {_f(m['r2_off'])} | {_f(m.get('r2_on_test_rows', m['r2_on']))} | "
                     f"{_f(m['premium'])} "
                     f"{_ci(m['premium_ci'])}{_bias_note(m)} | {m['verdict']} | {_p(m.get('premium_p_value'))} |")
    lines += _reason_lines([(m["name"], m) for m in results["models"]])
    for title, reds in reduction_sets(results):
        lines += ["", f"## {title}", "",
                  f"| reduction | estimate [{pct} CI] | verdict | p |", "|---|---|---|---:|"]
        for r in reds:
            lines.append(f"| premium({r['model_a']}) − premium({r['model_b']}) | {_f(r['reduction'])} "
                         f"{_ci(r['ci'])}{_bias_note(r, 'bias', 'sd')} | {r['verdict']} | {_p(r.get('p_value'))} |")
        lines += _reason_lines([(f"premium({r['model_a']}) − premium({r['model_b']})", r) for r in reds], "reasons")
    header, rows, align = details_table(results)
    lines += ["", "## Details", "", "| " + " | ".join(header) + " |",
              "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    for title, header, rows, align in extra_tables(results):
        lines += ["", f"## {title}", "", "| " + " | ".join(header) + " |",
                  "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", f"Panel: {panel['n_rows']} rows, {panel['n_securities']} securities, {panel['n_dates']} dates "
              f"({panel['first_date']} .. {panel['last_date']}), source `{panel['source']}`"
              f"{dropped_note(panel.get('dropped', {}), panel['n_rows'], panel.get('dropped_rows'))}. "
              f"Target: {panel['target']}."]
    if results.get("dataset", {}).get("adjustment"):
        ds = results["dataset"]
        levels = ds.get("price_levels_in_prompts") or []
        lines += ["", f"Prices: {ds['adjustment']}. Price levels in the prompts: "
                      f"{', '.join(levels) if levels else 'none (returns and volume ratios only)'}."]
    if results.get("diagnostics"):
        lines += ["", "## Checks that did nothing, and limits of this panel", ""]
        lines += [f"- **{d['protocol']}** ({d['check']}): {d['message']}." for d in results["diagnostics"]]
    shown = {f"{d['protocol']}: {d['message']}" for d in results.get("diagnostics") or []}
    for w in results.get("warnings", []):
        if w not in shown:
            lines.append(f"\n**Warning:** {w}")
    return "\n".join(lines) + "\n"


def _decomposed(results: dict) -> bool:
    """True for results with the date-only baseline and the market-neutral premium."""
    return bool(results.get("models")) and "market_neutral" in results["models"][0]


def _selection_text(results: dict) -> str:
    """How the penalty was chosen, per protocol when it differs (``penalty_selection`` of the first model)."""
    sel = (results.get("models") or [{}])[0].get("penalty_selection")
    if not sel:
        return results["regression"]["alpha_selection_detail"]
    off, on = sel["leakage_off"]["scheme"], sel["leakage_on"]["scheme"]
    if off == on:
        return off
    return f"{off} for leakage-off and the other date protocols, and by {on} for leakage-on"


def decomposition_lines(results: dict, pct: str) -> list[str]:
    """The headline table (market-neutral premium, the raw premium, the date-only baseline's part, the excess
    over it) and one sentence per model saying what part of its premium is mechanical."""
    base = results["date_only_baseline"]
    out = ["## Leakage premium, decomposed", "",
           f"| model | market-neutral premium [{pct} CI] | verdict | raw premium [{pct} CI] | date-only part | "
           f"excess over date-only [{pct} CI] | excess verdict |", "|---|---|---|---|---:|---|---|"]
    for m in results["models"]:
        mn, ex = m["market_neutral"], m["excess"]
        out.append(f"| {m['name']} | {_f(mn['premium'])} {_ci(mn['premium_ci'])} | {mn['verdict']} | "
                   f"{_f(m['premium'])} {_ci(m['premium_ci'])} | {_f(m['date_only_premium'])} | "
                   f"{_f(ex['premium'])} {_ci(ex['ci'])} | {ex['verdict']} |")
    braw, bmn = base["raw"], base["market_neutral"]
    out.append(f"| *{base['name']}* | {_f(bmn['premium'])} {_ci(bmn['premium_ci'])} | {bmn['verdict']} | "
               f"{_f(braw['premium'])} {_ci(braw['premium_ci'])} | {_f(braw['premium'])} | 0 | — |")
    out += ["", "The market-neutral premium heads the table: " + results["headline"]["why"] + ".", ""]
    out += [f"- {m['mechanical']}" for m in results["models"]]
    out += [""]
    return out


def _leakage_off_text(off: dict) -> str:
    """The leakage-off split in words: training dates, the embargo before the first test date (a calendar
    session) and the panel's own last training and first test dates where the results record them."""
    return (f"**leakage-off**: fitted on dates ≤ {off['train_end']} less the {off['embargo_days']} trading days"
            + (f" ({off['calendar']} sessions)" if off.get("calendar") else "")
            + f" before the first test date {off['first_test_date']} "
            + ("(the first session on or after testStart) " if off.get("first_test_row_date") else "")
            + f"({off['n_train']} rows, {off['n_embargoed']} embargoed"
            + (f", the last dated {off['last_train_row_date']}" if off.get("last_train_row_date") else "")
            + f"), tested on dates ≥ {off['test_start']} ({off['n_test']} rows"
            + (f", the first dated {off['first_test_row_date']}" if off.get("first_test_row_date") else "") + ").")


def _bias_sentence(boot: dict) -> str:
    """What *bias / sd* beside an interval are: those of the replicates the interval is read from."""
    if boot.get("cluster") == "two-way":
        return ("Beside each interval, *bias / sd*: the mean of the replicates the interval is read from (the half, "
                "by security or by date, whose spread is larger) − the point estimate, and their sd.")
    return "Beside each interval, *bias / sd*: the mean of the replicates − the point estimate, and their sd."


def _interval_text(boot: dict) -> str:
    """How the intervals were read from the replicates, in words."""
    if boot.get("cluster") == "two-way":
        return ("intervals point ± t(G−1) × the larger of the security and the date bootstrap sd (G: that "
                "dimension's cluster count; chosen by bench/calibration.py)")
    return "percentile intervals"


def _resampled(boot: dict) -> str:
    """What the bootstrap resampled, in words."""
    return {"security": "of securities", "date": "of dates",
            "security-and-date": "of securities and, independently, of dates (pigeonhole)",
            "two-way": "(half of them resample securities, the other half dates within the leakage-off training and "
                       "test dates; every cluster drawn with replacement)"}.get(
        boot.get("cluster", "security"), "of securities")


def _bias(d: dict, bias: str = "premium_bias", sd: str = "premium_sd") -> str:
    """``bias / sd`` of a bootstrap estimate (n/a in results written before they were recorded)."""
    return f"{_f(d.get(bias))} / {_f(d.get(sd))}" if d.get(bias) is not None else "n/a"


def _bias_note(d: dict, bias: str = "premium_bias", sd: str = "premium_sd") -> str:
    """`` (bias ±x, sd y)`` after an interval: the bootstrap bias and sd of the estimate ("" if not recorded)."""
    return f" (bias {d[bias]:+.4f}, sd {_f(d.get(sd))})" if d.get(bias) is not None else ""


def _reason_lines(items: list[tuple[str, dict]], key: str = "verdict_reasons") -> list[str]:
    """One markdown line per unreliable estimate, naming it and its reasons."""
    return [f"\n**{label} is unreliable:** {'; '.join(d.get(key) or [])}." for label, d in items
            if d.get("verdict") == "unreliable"]


def details_table(results: dict) -> tuple[list[str], list[list[str]], str]:
    """Header, rows and alignment of the per-model details: kind, dimension, chosen penalties (and the α grid
    when it was widened), the R² intervals; the date-only baseline's last (results that record its grid)."""
    header = ["model", "kind", "dim", "α (off)", "α (on, per fold)", "α grid", "r2_off CI", "r2_on CI"]
    rows = []
    base = (results.get("date_only_baseline") or {}).get("raw")
    baseline = [] if base is None or "alphas" not in base else [
        dict(base, name=f"*{results['date_only_baseline']['name']}*", kind="date indicators",
             embedding_dim=results["panel"].get("n_dates", ""))]
    for m in results["models"] + baseline:
        grid = m.get("alphas") or results["regression"]["alphas"]
        widened = m.get("alpha_grid_widenings") or 0
        rows.append([m["name"], m["kind"], str(m["embedding_dim"]), f"{m['alpha_off']:g}",
                     ", ".join(f"{a:g}" for a in m["alpha_on"]),
                     f"{min(grid):g} .. {max(grid):g}" + (f" (widened {widened}×)" if widened else ""),
                     _ci(m["r2_off_ci"]), _ci(m["r2_on_ci"])])
    return header, rows, "llrrlrll"


def _p(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else (f"{x:.3f}" if x >= 0.001 else "<0.001")


PROTOCOL_LABELS = {"walk-forward": "walk-forward (mean of folds)", "purged-kfold": "purged K-fold (pooled)"}


def main_table(results: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-model table: model | market-neutral premium [CI] | its verdict | r2_off |
    r2_on | premium [CI] | bias / sd | p | verdict | reason (why a result is unreliable); without the
    decomposition (older results) the first two columns are left out."""
    pct = f"{100 * results['bootstrap']['confidence']:g}%"
    if _decomposed(results):
        rows = [[m["name"], f"{_f(m['market_neutral']['premium'])} {_ci(m['market_neutral']['premium_ci'])}",
                 m["market_neutral"]["verdict"], f"{_f(m['excess']['premium'])} {_ci(m['excess']['ci'])}",
                 _f(m["r2_off"]), _f(m["r2_on_test_rows"]), f"{_f(m['premium'])} {_ci(m['premium_ci'])}", _bias(m),
                 _p(m.get("premium_p_value")), m["verdict"], "; ".join(m.get("verdict_reasons") or [])]
                for m in results["models"]]
        return ["model", f"market-neutral premium [{pct} CI]", "verdict", f"excess over date-only [{pct} CI]",
                "r2_off", "r2_on (test rows)", f"raw premium [{pct} CI]", "bias / sd", "p", "raw verdict",
                "reason"], rows
    rows = [[m["name"], _f(m["r2_off"]), _f(m["r2_on"]), f"{_f(m['premium'])} {_ci(m['premium_ci'])}", _bias(m),
             _p(m.get("premium_p_value")), m["verdict"], "; ".join(m.get("verdict_reasons") or [])]
            for m in results["models"]]
    return ["model", "r2_off", "r2_on", f"premium [{pct} CI]", "bias / sd", "p", "verdict", "reason"], rows


def reduction_sets(results: dict) -> list[tuple[str, list[dict]]]:
    """(title, paired reductions) of the market-neutral (headline) premium, then of the raw one, each when the
    results hold any; results without the decomposition: the raw premium's under the former title."""
    paired = "paired over the same bootstrap draws"
    neutral = results.get("reductions_market_neutral") or []
    if not neutral:
        return [(f"Premium reductions ({paired})", results["reductions"])] if results["reductions"] else []
    return [(f"Premium reductions, market-neutral premium (the headline; {paired})", neutral),
            (f"Premium reductions, raw premium ({paired})", results["reductions"])]


def reductions_table(reds: list[dict], pct: str) -> tuple[list[str], list[list[str]], str]:
    """Header, rows and alignment of a paired-reductions table (numbers right, words left)."""
    rows = [[f"premium({r['model_a']}) − premium({r['model_b']})", f"{_f(r['reduction'])} {_ci(r['ci'])}",
             _bias(r, "bias", "sd"), _p(r.get("p_value")), r["verdict"], "; ".join(r.get("reasons") or [])]
            for r in reds]
    return ["reduction", f"estimate [{pct} CI]", "bias / sd", "p", "verdict", "reason"], rows, "lrrrll"


def extra_tables(results: dict) -> list[tuple[str, list[str], list[list[str]], str]]:
    """The tables beyond the per-model one, each (title, header, rows, alignment string 'l'/'r' per column):
    protocols side by side, per-fold R² of each date-block protocol, reductions under those protocols,
    embargo robustness and the control by knowledge cutoff. Empty when the results hold none of them."""
    pct = f"{100 * results['bootstrap']['confidence']:g}%"
    models = results["models"]
    extra = [p for p in results["protocol"].get("selected", []) if p in ("walk-forward", "purged-kfold")]
    out = []
    if extra:
        # which rows each R² is on (docs/statistics.md §2): the extra protocols' premia pair all-row R²(on) with
        # their own test folds, unlike the headline premium's same-row pair
        header = ["model", "R² chronological (its test rows)", "R² GroupKFold (all rows)"] + \
            [f"R² {PROTOCOL_LABELS[p]} (its test folds)" for p in extra] + \
            [f"R²(on, all rows) − R²({p}) [{pct} CI]" for p in extra]
        rows = []
        for m in models:
            pr = m["protocols"]
            rows.append([m["name"], _f(m["r2_off"]), _f(m["r2_on"])] + [f"{_f(pr[p]['r2'])} {_ci(pr[p]['r2_ci'])}"
                                                                           for p in extra]
                        + [f"{_f(pr[p]['premium'])} {_ci(pr[p]['premium_ci'])} p={_p(pr[p]['premium_p_value'])} "
                           f"{pr[p]['verdict']}" for p in extra])
        out.append(("Protocols side by side (same bootstrap draws; each R² on the rows its column names)", header, rows, "lrr" + "r" * 2 * len(extra)))
        for p in extra:
            info = results["protocol"][p]
            header = ["model"] + [f"fold {i + 1}: {f['test_first_date']}..{f['test_last_date']} (train {f['n_train']})"
                                  for i, f in enumerate(info["folds"])] + ["mean", "pooled"]
            rows = [[m["name"]] + [_f(v) for v in m["protocols"][p]["r2_per_fold"]]
                    + [_f(m["protocols"][p]["r2_mean"]), _f(m["protocols"][p]["r2_pooled"])] for m in models]
            out.append((f"{p}: R² by fold", header, rows, "l" + "r" * (len(header) - 1)))
            reds = results.get("protocol_reductions", {}).get(p, [])
            if reds:
                out.append((f"{p}: premium reductions", *reductions_table(reds, pct)))
    if models and models[0].get("embargo_robustness"):
        base = results["protocol"]["leakage_off"]["embargo_days"]
        off = results["protocol"]["leakage_off"]
        header = ["model", f"r2_off (embargo {base}: {off['n_train']} rows, {off['n_embargoed']} removed)"] + \
            [f"r2_off / premium (embargo {e['embargo_days']}: {e['n_train']} rows"
             + (f", {e['n_embargoed']} removed)" if "n_embargoed" in e else ")")
             for e in models[0]["embargo_robustness"]]
        rows = [[m["name"], _f(m["r2_off"])] + [f"same training set as embargo {e['same_as']}"
                                               if e.get("same_as") is not None else
                                               f"{_f(e['r2_off'])} / {_f(e['premium'])}"
                                               for e in m["embargo_robustness"]] for m in models]
        out.append(("Embargo robustness (point estimates, trading days)", header, rows, "l" + "r" * (len(header) - 1)))
    cc = results.get("cutoff_control")
    if cc:
        rows = [[n, c, _f(p)] for n, c, p in zip(cc["models"], cc["cutoffs"], cc["premiums"])]
        rows.append(["slope (premium per year of cutoff)", "", f"{_f(cc['slope_per_year'])} {_ci(cc['slope_ci'])} "
                     f"p={_p(cc['slope_p_value'])} {cc['slope_verdict']}"])
        rows.append([f"premium({cc['earliest']}) − premium({cc['latest']}) (earliest − latest)", "",
                     f"{_f(cc['earliest_minus_latest'])} {_ci(cc['earliest_minus_latest_ci'])} "
                     f"p={_p(cc['earliest_minus_latest_p_value'])} {cc['earliest_minus_latest_verdict']}"])
        out.append(("Control by knowledge cutoff", ["model", "knowledge cutoff", f"premium / estimate [{pct} CI]"],
                    rows, "llr"))
    return out


_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Leakage evaluation</title>
<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em}
td.r{text-align:right;font-variant-numeric:tabular-nums}.warn{color:#a40}</style></head><body>
<h1>Leakage evaluation</h1>
<p>R² is out-of-sample; benchmark: <b>{{ r.benchmark }}</b> ({{ r.r2_definition }}).
Premium = R²(on) − R²(off); {{ pct }} {{ interval }} and two-sided p-values from
{{ r.bootstrap.resamples }} resamples {{ resampled }} (seed {{ r.bootstrap.seed }}), the same draws for every model
and protocol.</p>
{% for t in tables %}<h2>{{ t[0] }}</h2>
<table><tr>{% for h in t[1] %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in t[2] %}<tr>{% for c in row %}<td class="{{ t[3][loop.index0] }}">{{ c }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% endfor %}
{% for img, alt in plots %}<p><img src="{{ img }}" alt="{{ alt }}" style="max-width:100%"></p>{% endfor %}
{% for w in r.warnings %}<p class="warn"><b>Warning:</b> {{ w }}</p>{% endfor %}
<p>Panel: {{ r.panel.n_rows }} rows, {{ r.panel.n_securities }} securities, {{ r.panel.n_dates }} dates
({{ r.panel.first_date }} .. {{ r.panel.last_date }}){{ dropped }}. Seed {{ r.get('seed') }}.</p>
<p>Versions: {{ versions }}.</p>
<p>Device: {{ device }}.</p>
</body></html>
"""


def render_html(results: dict, plots: list[tuple[str, str]]) -> str:
    """The HTML page: the same tables as report.md (jinja2, autoescaped) and the given ``plots``
    (file name relative to the page, alt text)."""
    import jinja2

    pct = f"{100 * results['bootstrap']['confidence']:g}%"
    header, rows = main_table(results)
    tables = [("Leakage premium per model", header, rows,
               "lrlrrrrrrll" if _decomposed(results) else "lrrrrrll")]
    tables += [(title, *reductions_table(reds, pct)) for title, reds in reduction_sets(results)]
    tables.append(("Details", *details_table(results)))
    tables += extra_tables(results)
    env = jinja2.Environment(autoescape=True)
    return env.from_string(_HTML).render(r=results, pct=pct, tables=tables, plots=plots,
                                         resampled=_resampled(results["bootstrap"]),
                                         interval=_interval_text(results["bootstrap"]),
                                         versions=_plain(results.get("versions", {})),
                                         device=_plain(results.get("device", {})),
                                         dropped=dropped_note(results["panel"].get("dropped", {}),
                                                              results["panel"]["n_rows"],
                                                              results["panel"].get("dropped_rows")))


def _plain(value) -> str:
    """A results.json value as readable text: ``key value`` pairs joined by commas, lists by semicolons."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items() if v not in (None, "", [], {}))
    if isinstance(value, list):
        return "; ".join(_plain(v) for v in value)
    return str(value)


REPLICATE_COLUMNS = ("r2_off", "r2_on", "r2_on_test_rows", "premium", "premium_all_rows", "premium_market_neutral",
                     "excess")
"""Columns of bootstrap_replicates.csv after ``model,replicate,resampled`` (one row per model and replicate):
R² off, on (all rows) and on the leakage-off test rows; the premium its interval is read from (test rows), the
all-row premium, the market-neutral premium and the excess over the date-only baseline (paired replicate)."""


def _replicates_csv(results: dict, replicates: dict[str, dict[str, np.ndarray]]) -> str:
    """bootstrap_replicates.csv: every model's replicates (:data:`REPLICATE_COLUMNS`); ``resampled`` says what a
    replicate drew (``securities`` or ``dates`` under the two-way interval, whose halves give its sd; else the
    spec's ``bootstrap.cluster``). A column the run did not compute is left empty."""
    boot = results["bootstrap"]
    n_sec = boot.get("replicates_resampling_securities")
    rows = ["model,replicate,resampled," + ",".join(REPLICATE_COLUMNS)]
    for m in results["models"]:
        r = dict(replicates[m["name"]])
        r.setdefault("premium_all_rows", np.asarray(r["r2_on"]) - np.asarray(r["r2_off"]))
        for i in range(len(r["r2_off"])):
            what = boot["cluster"] if n_sec is None else ("securities" if i < n_sec else "dates")
            cells = [repr(float(r[c][i])) if r.get(c) is not None else "" for c in REPLICATE_COLUMNS]
            rows.append(f"{m['name']},{i},{what}," + ",".join(cells))
    return "\n".join(rows) + "\n"


def write_outputs(results: dict, out_dir: Path, replicates: dict[str, dict[str, np.ndarray]] | None = None,
                  rows=None) -> dict:
    """Write report.md, premium.png, bootstrap_replicates.csv (if ``replicates`` is given: model name →
    {"r2_off", "r2_on", and any of the other :data:`REPLICATE_COLUMNS`} float [R]), rows.csv (if ``rows``, a
    DataFrame, is given: :func:`pitlab.evaluator.setup.rows_frame`) and finally results.json into ``out_dir``
    (created if missing).
    Returns the JSON-ready results. On failure, removes what this call wrote and re-raises."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clean = _json_ready(results)
    text = json.dumps(clean, indent=2, allow_nan=False) + "\n"
    written: list[Path] = []
    try:
        for name, write in (
            *_report_writers(clean),
            (REPLICATES_FILE, (lambda p: p.write_text(_replicates_csv(clean, replicates), encoding="utf-8"))
             if replicates is not None else None),
            (ROWS_FILE, (lambda p: rows.to_csv(p, index=False, float_format="%.17g", lineterminator="\n"))
             if rows is not None else None),
            (RESULTS_FILE, lambda p: p.write_text(text, encoding="utf-8")),
        ):
            if write is None:
                continue
            _atomic_write(out / name, write)
            written.append(out / name)
    except BaseException:
        for p in written:
            p.unlink(missing_ok=True)
        raise
    return clean


def _report_writers(results: dict) -> list[tuple[str, Callable[[Path], None] | None]]:
    """(file name, writer) of every report file derived from the JSON-ready ``results``."""
    plots = [(PLOT_FILE, "premium forest plot")]
    writers: list = [(REPORT_FILE, lambda p: p.write_text(render_markdown(results), encoding="utf-8")),
                     (PLOT_FILE, lambda p: plot_premium(results, p))]
    if [p for p in results["protocol"].get("selected", []) if p in ("walk-forward", "purged-kfold")]:
        plots.append((FOLDS_PLOT_FILE, "R² by fold"))
        writers.append((FOLDS_PLOT_FILE, lambda p: plot_r2_by_fold(results, p)))
    if results.get("cutoff_control"):
        plots.append((CUTOFF_PLOT_FILE, "premium vs knowledge cutoff"))
        writers.append((CUTOFF_PLOT_FILE, lambda p: plot_premium_vs_cutoff(results, p)))
    writers.append((HTML_FILE, lambda p: p.write_text(render_html(results, plots), encoding="utf-8")))
    return writers


def rebuild_report(out_dir: Path) -> list[Path]:
    """Rewrite report.md, report.html and the plots of ``out_dir`` from its ``results.json`` alone (the
    ``pitlab report`` command). Returns the paths written. Raises FileNotFoundError without results.json."""
    out = Path(out_dir)
    results = json.loads((out / RESULTS_FILE).read_text(encoding="utf-8"))
    written = []
    for name, write in _report_writers(results):
        _atomic_write(out / name, write)
        written.append(out / name)
    return written
