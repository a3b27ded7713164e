"""The evaluation's figures (matplotlib, PNG): the premium forest plot, R² by fold of the date-block protocols, and
the premium against the knowledge cutoff."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np


def _f(x, digits: int = 4) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _ci(ci) -> str:
    return f"[{_f(ci[0])}, {_f(ci[1])}]"


def plot_r2_by_fold(results: dict, path: Path) -> bool:
    """R² by fold of the date-block protocols (walk-forward, purged K-fold), one line per model (PNG).
    Returns False (writes nothing) when the results hold no such protocol."""
    fig = r2_by_fold_figure(results)
    if fig is None:
        return False
    fig.savefig(path, format="png", dpi=110)
    return True


def r2_by_fold_figure(results: dict):
    """The matplotlib Figure of :func:`plot_r2_by_fold` (one panel per date-block protocol, whole-number fold
    ticks, R² without an offset), or None when the results hold no such protocol."""
    extra = [p for p in results["protocol"].get("selected", []) if p in ("walk-forward", "purged-kfold")]
    if not extra:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0 * len(extra), 3.8))
    FigureCanvasAgg(fig)
    for i, p in enumerate(extra):
        ax = fig.add_subplot(1, len(extra), i + 1)
        for m in results["models"]:
            v = [np.nan if x is None else x for x in m["protocols"][p]["r2_per_fold"]]
            ax.plot(np.arange(1, len(v) + 1), v, marker="o", label=m["name"])
        ax.axhline(0.0, color="black", linestyle="--", linewidth=1)
        n_folds = max(len(m["protocols"][p]["r2_per_fold"]) for m in results["models"])
        ax.set_xticks(np.arange(1, n_folds + 1))  # folds are whole numbers (the default ticks gave 1.5, 2.5)
        ax.ticklabel_format(axis="y", useOffset=False)  # no "1e-6 + offset": noise must not look like a pattern
        ax.set_xlabel("fold (test block, in date order)")
        ax.set_ylabel(f"out-of-sample R² ({results['benchmark']} benchmark)")
        ax.set_title(f"{p}: R² by fold")
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_premium_vs_cutoff(results: dict, path: Path) -> bool:
    """Premium (with CI) against knowledge cutoff, with the bootstrap slope line (PNG). False when the results
    have no cutoff control (fewer than two distinct cutoffs)."""
    cc = results.get("cutoff_control")
    if not cc:
        return False
    import datetime as dt

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by_name = {m["name"]: m for m in results["models"]}
    fig = Figure(figsize=(6.5, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    x = np.array(cc["cutoff_years"])
    t0 = dt.date.fromisoformat(min(cc["cutoffs"])).year + (dt.date.fromisoformat(min(cc["cutoffs"])).timetuple()
                                                             .tm_yday - 1) / 365.25
    for xi, n, p in zip(x, cc["models"], cc["premiums"]):
        lo, hi = (np.nan if v is None else v for v in by_name[n]["premium_ci"])
        ax.errorbar([t0 + xi], [p], yerr=[[p - lo], [hi - p]], fmt="o", capsize=4)
        ax.annotate(n, (t0 + xi, p), textcoords="offset points", xytext=(6, 4), fontsize="small")
    xs = np.linspace(x.min(), x.max(), 20)
    pts = np.array(cc["premiums"])
    ax.plot(t0 + xs, pts.mean() + cc["slope_per_year"] * (xs - x.mean()), color="gray", linestyle=":",
            label=f"slope {cc['slope_per_year']:.3g}/yr {_ci(cc['slope_ci'])}")
    ax.axhline(0.0, color="black", linestyle="--", linewidth=1)
    ax.set_xlabel("knowledge cutoff (year)")
    ax.set_ylabel("leakage premium R²(on) − R²(off)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    return True


VERDICT_STYLE = {"significant": ("tab:red", "o"), "not significant": ("tab:blue", "o"),
                 "unreliable": ("tab:orange", "X")}
"""Colour and marker of each verdict in premium.png."""


RAW_PANEL = "raw premium R²(on) − R²(off)"
"""The title of premium.png's raw-premium panel (the one that marks the date-only baseline)."""


def premium_panels(results: dict) -> list[tuple[str, list[tuple[float | None, list, str]]]]:
    """The forest plot's panels: (title, one (premium, [lo, hi], verdict) per model). When every model has
    them: the market-neutral premium (the headline) first, then the raw premium, then the excess over the
    date-only baseline; else the raw premium alone."""
    models = results["models"]
    raw = (RAW_PANEL, [(m["premium"], m["premium_ci"], m["verdict"]) for m in models])
    if not models or not all(isinstance(m.get("market_neutral"), dict) for m in models):
        return [raw]
    panels = [("market-neutral premium (the headline)",
               [(m["market_neutral"]["premium"], m["market_neutral"]["premium_ci"], m["market_neutral"]["verdict"])
                for m in models]), raw]
    if all(isinstance(m.get("excess"), dict) for m in models):
        panels.append(("excess over the date-only baseline",
                       [(m["excess"]["premium"], m["excess"]["ci"], m["excess"]["verdict"]) for m in models]))
    return panels


def _forest(ax, ys: np.ndarray, rows: list) -> None:
    for y, (point, ci, verdict) in zip(ys, rows):
        lo, hi = (np.nan if v is None else v for v in (ci or [None, None]))
        p = np.nan if point is None else point
        color, marker = VERDICT_STYLE.get(verdict, VERDICT_STYLE["not significant"])
        if np.isfinite(lo) and np.isfinite(hi):
            ax.plot([lo, hi], [y, y], color=color, linewidth=2, linestyle=":" if verdict == "unreliable" else "-")
        ax.plot([p], [y], marker=marker, color=color, markersize=9 if marker == "X" else 7, linestyle="none")
    ax.axvline(0.0, color="black", linestyle="--", linewidth=1)


def plot_premium(results: dict, path: Path) -> None:
    """Forest plot (PNG, Agg): one row per model, the point premium and its interval coloured by its verdict,
    a vertical line at 0; one panel per figure of :func:`premium_panels` (market-neutral, then raw)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    models = results["models"]
    boot = results["bootstrap"]
    pct = f"{100 * boot['confidence']:g}%"
    panels = premium_panels(results)
    fig = Figure(figsize=(5.2 * len(panels) + 1.8, 1.9 + 0.55 * len(models)))
    FigureCanvasAgg(fig)
    ys = np.arange(len(models))[::-1]
    date_only = ((results.get("date_only_baseline") or {}).get("raw") or {}).get("premium")
    for i, (title, rows) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        _forest(ax, ys, rows)
        if title == RAW_PANEL and date_only is not None and len(panels) > 1:
            ax.axvline(date_only, color="gray", linestyle=":", linewidth=1.5)
            ax.annotate(f"date-only baseline {date_only:+.3f}", (date_only, len(models) - 0.45), fontsize="small",
                        color="gray", ha="right", xytext=(-3, 0), textcoords="offset points")
        ax.set_yticks(ys, [m["name"] for m in models] if i == 0 else [""] * len(models))
        ax.set_ylim(-0.7, len(models) - 0.3)
        ax.set_xlabel(f"{title}, {pct} CI")
        if i == 0:
            ax.set_ylabel("model")
    shown = {verdict for _, rows in panels for _, _, verdict in rows}
    fig.legend(handles=[Line2D([], [], color=VERDICT_STYLE[v][0], marker=VERDICT_STYLE[v][1], label=label)
                        for v, label in (("significant", "significant (CI excludes 0)"),
                                         ("not significant", "not significant"),
                                         ("unreliable", "unreliable (see report)")) if v in shown],
               loc="lower center", ncol=3, fontsize="small", frameon=False)
    fig.suptitle(f"Leakage premium ({boot['resamples']} bootstrap resamples, "
                 f"{boot.get('cluster', 'security')} clusters)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, format="png", dpi=120, bbox_inches="tight")
