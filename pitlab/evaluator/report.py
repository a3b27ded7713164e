"""Outputs of a leakage evaluation: ``results.json``, ``report.md``, ``premium.png``, ``bootstrap_replicates.csv``.

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

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
PLOT_FILE = "premium.png"
REPLICATES_FILE = "bootstrap_replicates.csv"
OUTPUT_FILES = (REPORT_FILE, PLOT_FILE, REPLICATES_FILE, RESULTS_FILE)


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


def _f(x, digits: int = 4) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _ci(ci) -> str:
    return f"[{_f(ci[0])}, {_f(ci[1])}]"


def render_markdown(results: dict) -> str:
    """The report: protocol and benchmark sentence, the per-model table (model | r2_off | r2_on | premium
    [CI] | verdict), the paired reductions table, and the panel summary."""
    boot, proto, panel = results["bootstrap"], results["protocol"], results["panel"]
    off, on = proto["leakage_off"], proto["leakage_on"]
    pct = f"{100 * boot['confidence']:g}%"
    lines = [
        "# Leakage evaluation", "",
        (f"R² is out-of-sample with the **{results['benchmark']}** as benchmark: "
         f"R² = 1 − SSE / Σ(y − ȳ_train)², ȳ_train being the mean target of the fold the ridge was fitted on. "
         f"Ridge regression on the embeddings, intercept unpenalised, penalty chosen inside every training set "
         f"by {results['regression']['alpha_selection_detail']}. "
         f"**leakage-off**: fitted on dates ≤ {off['train_end']} "
         f"less the {off['embargo_days']} trading days before the first test date {off['first_test_date']} "
         f"({off['n_train']} rows, {off['n_embargoed']} embargoed), tested on dates ≥ {off['test_start']} "
         f"({off['n_test']} rows). **leakage-on**: GroupKFold by security ({on['n_splits']} folds) over all "
         f"{on['n_rows']} rows, pooled out-of-fold R². Premium = R²(on) − R²(off). {pct} percentile intervals "
         f"from {boot['resamples']} bootstrap resamples of securities (seed {boot['seed']}), the same draws for every "
         f"model; a result is *significant* only when its interval excludes 0."),
        "",
        f"| model | r2_off | r2_on | premium [{pct} CI] | verdict |",
        "|---|---:|---:|---|---|",
    ]
    for m in results["models"]:
        lines.append(f"| {m['name']} | {_f(m['r2_off'])} | {_f(m['r2_on'])} | {_f(m['premium'])} "
                     f"{_ci(m['premium_ci'])} | {m['verdict']} |")
    if results["reductions"]:
        lines += ["", "## Premium reductions (paired over the same bootstrap draws)", "",
                  f"| reduction | estimate [{pct} CI] | verdict |", "|---|---|---|"]
        for r in results["reductions"]:
            lines.append(f"| premium({r['model_a']}) − premium({r['model_b']}) | {_f(r['reduction'])} "
                         f"{_ci(r['ci'])} | {r['verdict']} |")
    lines += ["", "## Details", "", "| model | kind | dim | α (off) | α (on, per fold) | r2_off CI | r2_on CI |",
              "|---|---|---:|---:|---|---|---|"]
    for m in results["models"]:
        lines.append(f"| {m['name']} | {m['kind']} | {m['embedding_dim']} | {m['alpha_off']:g} | "
                     f"{', '.join(f'{a:g}' for a in m['alpha_on'])} | {_ci(m['r2_off_ci'])} | {_ci(m['r2_on_ci'])} |")
    lines += ["", f"Panel: {panel['n_rows']} rows, {panel['n_securities']} securities, {panel['n_dates']} dates "
              f"({panel['first_date']} .. {panel['last_date']}), source `{panel['source']}`. "
              f"Target: {panel['target']}."]
    for w in results.get("warnings", []):
        lines.append(f"\n**Warning:** {w}")
    return "\n".join(lines) + "\n"


def plot_premium(results: dict, path: Path) -> None:
    """Forest plot: one row per model, point premium and its percentile CI, vertical line at 0 (PNG, Agg)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    models = results["models"]
    pct = f"{100 * results['bootstrap']['confidence']:g}%"
    fig = Figure(figsize=(7.0, 1.9 + 0.55 * len(models)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ys = np.arange(len(models))[::-1]
    for y, m in zip(ys, models):
        lo, hi = (np.nan if v is None else v for v in m["premium_ci"])
        p = np.nan if m["premium"] is None else m["premium"]
        color = "tab:red" if m["verdict"] == "significant" else "tab:blue"
        if np.isfinite(lo) and np.isfinite(hi):
            ax.plot([lo, hi], [y, y], color=color, linewidth=2)
        ax.plot([p], [y], marker="o", color=color, markersize=7)
    ax.axvline(0.0, color="black", linestyle="--", linewidth=1)
    from matplotlib.lines import Line2D

    ax.legend(handles=[Line2D([], [], color="tab:red", marker="o", label="significant (CI excludes 0)"),
                       Line2D([], [], color="tab:blue", marker="o", label="not significant")],
              loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, fontsize="small", frameon=False)
    ax.set_yticks(ys, [m["name"] for m in models])
    ax.set_ylim(-0.7, len(models) - 0.3)
    ax.set_xlabel(f"leakage premium R²(on) − R²(off), {pct} CI")
    ax.set_ylabel("model")
    ax.set_title(f"Leakage premium ({results['bootstrap']['resamples']} security-clustered bootstrap resamples)")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120, bbox_inches="tight")


def _replicates_csv(results: dict, replicates: dict[str, dict[str, np.ndarray]]) -> str:
    rows = ["model,replicate,r2_off,r2_on,premium"]
    for m in results["models"]:
        r = replicates[m["name"]]
        for i, (a, b) in enumerate(zip(r["r2_off"], r["r2_on"])):
            rows.append(f"{m['name']},{i},{float(a)!r},{float(b)!r},{float(b - a)!r}")
    return "\n".join(rows) + "\n"


def write_outputs(results: dict, out_dir: Path, replicates: dict[str, dict[str, np.ndarray]] | None = None) -> dict:
    """Write report.md, premium.png, bootstrap_replicates.csv (if ``replicates`` is given: model name →
    {"r2_off", "r2_on"} float [R]) and finally results.json into ``out_dir`` (created if missing).
    Returns the JSON-ready results. On failure, removes what this call wrote and re-raises."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clean = _json_ready(results)
    text = json.dumps(clean, indent=2, allow_nan=False) + "\n"
    written: list[Path] = []
    try:
        for name, write in (
            (REPORT_FILE, lambda p: p.write_text(render_markdown(clean), encoding="utf-8")),
            (PLOT_FILE, lambda p: plot_premium(clean, p)),
            (REPLICATES_FILE, (lambda p: p.write_text(_replicates_csv(clean, replicates), encoding="utf-8"))
             if replicates is not None else None),
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
