"""One model's statistics on one target: point estimates (with α-grid widening), bootstrap replicates, the
extra date protocols and the embargo robustness, on an evaluation's shared splits and draws."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields, replace

import numpy as np

from pitlab.evaluator.bootstrap import PremiumReplicates, bootstrap_model, interval, judge
from pitlab.evaluator.estimates import AlphaSelection, Fold, FoldsR2, PanelStats, leakage_off_r2, leakage_on_r2
from pitlab.evaluator.selection import remembered_scores


WIDEN_STEPS = 3
"""Times the α grid is widened when a point estimate's selection ends at one of its edges."""
WIDEN_DECADES = 2
"""Decades added per widening on the side that was hit: penalties grid_min/100, grid_min/10 (lower edge) or
grid_max·10, grid_max·100 (upper edge)."""


def fold_edges(label: str, alpha_index, df, alphas: list[float]) -> tuple[list[str], bool, bool]:
    """Penalty selections of one protocol's point estimate that ended at an edge of the grid ``alphas``.

    ``alpha_index`` int [K] and ``df`` float [K] (degrees of freedom at the choice, intercept included) per fold.
    A fold is at the lower edge when it chose the smallest penalty, at the upper edge when it chose the largest
    and still fits at least one effective parameter besides the intercept (df − 1 ≥ 1: the selection wanted more
    shrinkage than the grid offers; a fit shrunk to less than one parameter says "no signal", which a larger
    penalty would not change). Returns (phrases, lower hit, upper hit); nothing for a one-value grid."""
    a = np.asarray(alphas, dtype=np.float64)
    if len(np.unique(a)) < 2:
        return [], False, False
    idx, dfs = np.atleast_1d(np.asarray(alpha_index)), np.atleast_1d(np.asarray(df, dtype=np.float64))
    low, high = {}, {}  # penalty → [(fold number, effective parameters)]: folds at one edge are named together
    for i, (k, f) in enumerate(zip(idx, dfs)):
        if a[k] <= a.min():
            low.setdefault(float(a[k]), []).append((i + 1, f))
        elif a[k] >= a.max() and np.isfinite(f) and f - 1.0 >= 1.0:
            high.setdefault(float(a[k]), []).append((i + 1, f))

    def where(folds) -> str:
        return label if len(idx) == 1 else f"{label} fold{'s' if len(folds) > 1 else ''} {fold_list(folds)}"

    out = [f"{where(v)} chose the smallest penalty {k:g} of the grid" for k, v in low.items()]
    for k, v in high.items():
        fits = sorted(f - 1.0 for _, f in v)
        fit = f"{fits[0]:.1f}" if len(v) == 1 else f"{fits[0]:.1f}–{fits[-1]:.1f}"
        out.append(f"{where(v)} chose the largest penalty {k:g} of the grid yet fit{'s' if len(v) == 1 else ''} "
                   f"{fit} effective parameters")
    return out, bool(low), bool(high)


def fold_list(folds: list[tuple[int, float]]) -> str:
    """Fold numbers as people write them: ``1``, ``1, 3``, ``1–4``."""
    n = [i for i, _ in folds]
    return f"{n[0]}–{n[-1]}" if len(n) > 2 and n == list(range(n[0], n[-1] + 1)) else ", ".join(map(str, n))


def grid_note(grid, widenings: int) -> str:
    """`` (regression.alphas widened N time(s), 2 decades each, to 1e-07 … 100000: 31 values)``, empty when the
    grid was not widened."""
    if not widenings:
        return ""
    return (f" (regression.alphas widened {widenings} time{'s' if widenings > 1 else ''}, {WIDEN_DECADES} decades "
            f"each, to {min(grid):g} … {max(grid):g}: {len(grid)} values)")


def widen_grid(alphas: list[float], lower: bool, upper: bool) -> list[float]:
    """``alphas`` (sorted) with :data:`WIDEN_DECADES` decades added below its minimum (``lower``) and/or above
    its maximum (``upper``), one value per decade."""
    a = sorted(float(x) for x in alphas)
    lo = [a[0] / 10.0 ** k for k in range(WIDEN_DECADES, 0, -1)] if lower else []
    hi = [a[-1] * 10.0 ** k for k in range(1, WIDEN_DECADES + 1)] if upper else []
    return lo + a + hi


def point_estimates(stats: PanelStats, point_folds: np.ndarray, n_splits: int, alphas: list[float],
                    selection: AlphaSelection, benchmark: str = "train_mean",
                    extra_folds: dict[str, list[Fold]] | None = None,
                    time_selection: AlphaSelection | None = None, same_rows: bool = False,
                    extra_points: dict | None = None) -> tuple:
    """Point estimates of leakage-off and leakage-on (and the penalties of ``extra_folds``' protocols), with
    the α grid widened by :func:`widen_grid` while a selection ends at an edge (:func:`fold_edges`), at most
    :data:`WIDEN_STEPS` times.

    ``point_folds`` int [1, units]: GroupKFold fold of every unit. Returns ``(off, on, edges, grid,
    widenings)``: the :class:`pitlab.evaluator.estimates.R2Batch` of both protocols (B = 1) on the final grid
    (leakage-on also on the leakage-off test rows with ``same_rows``; the date protocols' penalty chosen by
    ``time_selection``, default ``selection``),
    ``edges`` protocol key (``off``, ``on``, or an ``extra_folds`` key) → :func:`fold_edges`' triple, the
    final grid and the number of widenings. ``extra_points`` (a dict, filled in): each ``extra_folds`` protocol's
    :class:`pitlab.evaluator.estimates.FoldsR2` on the final grid (B = 1, with degrees of freedom), so that its
    bootstrap need not fit the point estimate again."""
    with remembered_scores():  # a widened grid scores the same folds again: each (set, α) is solved once
        return _widening_points(stats, point_folds, n_splits, alphas, selection, benchmark, extra_folds,
                                time_selection, same_rows, extra_points)


def _widening_points(stats, point_folds, n_splits, alphas, selection, benchmark, extra_folds, time_selection,
                     same_rows, extra_points) -> tuple:
    """:func:`point_estimates`' loop."""
    ones = np.ones((1, stats.n_securities))
    grid, widenings = list(alphas), 0
    while True:
        off = leakage_off_r2(stats, ones, grid, time_selection or selection, benchmark)
        on = leakage_on_r2(stats, ones, point_folds, n_splits, grid, selection, benchmark,
                           score_rows=stats.test_mask if same_rows else None)
        edges = {"off": fold_edges("leakage-off", off.alpha_index, off.df, grid),
                 "on": fold_edges("leakage-on", on.alpha_index[0], on.df[0], grid)}
        points = {}
        for pname, pf in (extra_folds or {}).items():
            fr = points[pname] = stats.protocol_errors(pf, ones, grid, time_selection or selection, benchmark,
                                                       diagnostics=True)
            edges[pname] = fold_edges(pname, fr.alpha_index[0], fr.df[0], grid)
        lower, upper = any(e[1] for e in edges.values()), any(e[2] for e in edges.values())
        if not (lower or upper) or widenings == WIDEN_STEPS:
            if extra_points is not None:
                extra_points.update(points)
            return off, on, edges, grid, widenings
        grid, widenings = widen_grid(grid, lower, upper), widenings + 1



def _with_point(point: FoldsR2, reps: FoldsR2) -> FoldsR2:
    """The point estimate's row (B = 1) above the replicates' rows: a :class:`FoldsR2` of B = 1 + R."""
    def cat(name: str):
        a, b = getattr(point, name), getattr(reps, name)
        return None if a is None or b is None else np.concatenate([a, b], axis=0)

    return FoldsR2(**{f.name: cat(f.name) for f in fields(FoldsR2)})


def _extra_protocols(stats: PanelStats, setup, pfolds: dict[str, list[Fold]], grid: list[float],
                     on_r2: float, r2_on_reps: np.ndarray, edge_text: dict[str, list[str]],
                     points: dict[str, FoldsR2]) -> tuple[dict, dict[str, np.ndarray]]:
    """Walk-forward / purged K-fold of one model: R² (point and replicates), per-fold values, premium vs
    leakage-on with its verdict. ``points``: each protocol's point estimate on ``grid`` (:func:`point_estimates`'
    ``extra_points``); the replicates reselect α, or refit at the point estimate's α per fold
    (``bootstrap.reselectPenalty: false``). Returns (results by protocol, premium replicates by protocol)."""
    out, reps_out = {}, {}
    for pname, pf in pfolds.items():
        pt = points[pname]
        fixed = None if setup.reselect else np.repeat(pt.alpha_index, setup.weights.shape[0], axis=0)
        fr = _with_point(pt, stats.protocol_errors(pf, setup.weights, grid, setup.time_selection, setup.benchmark,
                                                   fixed))
        head = fr.mean if pname == "walk-forward" else fr.pooled
        prem = on_r2 - head[0]
        prem_reps = r2_on_reps - head[1:]
        pj = judge(float(prem), prem_reps, setup.rule, edge_text["on"] + edge_text[pname])
        out[pname] = {
            "r2": float(head[0]), "r2_ci": interval(float(head[0]), head[1:], setup.rule),
            "r2_mean": float(fr.mean[0]), "r2_pooled": float(fr.pooled[0]),
            "r2_per_fold": [float(v) for v in fr.r2[0]],
            "r2_per_fold_ci": [interval(float(fr.r2[0, k]), fr.r2[1:, k], setup.rule) for k in range(fr.r2.shape[1])],
            "alpha_per_fold": [float(a) for a in fr.alpha[0]],
            "premium": float(prem), "premium_ci": pj["ci"], "premium_p_value": pj["p_value"],
            "premium_bias": pj["bias"], "premium_sd": pj["sd"], "verdict": pj["verdict"],
            "verdict_reasons": pj["reasons"]}
        reps_out[pname] = prem_reps
    return out, reps_out


def _embargo_robustness(stats: PanelStats, spec, setup, grid: list[float], on_r2: float) -> list[dict]:
    """r2_off and the premium re-estimated at each of ``protocol.embargoRobustness``'s embargo lengths (the
    date-blocked selection embargoed by the same length). ``same_as``: the embargo length (the spec's, or an
    earlier one of the list) whose training set this one repeats, else None; its numbers are then None.
    ``n_train`` / ``n_embargoed``: the training rows kept and the rows the embargo removed at that length."""
    proto = spec.protocol
    seen = [(proto.embargo_days, setup.split.train_mask)]
    out = []
    for e in proto.embargo_robustness:
        with warnings.catch_warnings():  # a short embargo is the point of the robustness check
            warnings.simplefilter("ignore", UserWarning)
            sp_e = setup.splitters["chronological"].with_embargo(e).apply(setup.dates)
        same = next((d for d, mask in seen if np.array_equal(mask, sp_e.train_mask)), None)
        seen.append((e, sp_e.train_mask))
        row = {"embargo_days": int(e), "n_train": sp_e.n_train, "n_embargoed": sp_e.n_embargoed, "same_as": same,
               "r2_off": None, "premium": None}
        if same is None:
            sel = setup.time_selection
            if sel.method == "date-blocked":
                sel = replace(sel, embargo_days=int(e))
            r_e = stats.protocol_errors([Fold(sp_e.train_mask, sp_e.test_mask)], setup.ones, grid, sel,
                                         setup.benchmark)
            row.update(r2_off=float(r_e.r2[0, 0]), premium=float(on_r2 - r_e.r2[0, 0]))
        out.append(row)
    return out


@dataclass
class TargetStats:
    """One model (or the date-only baseline) on one target: ``off``, ``on`` the point estimates
    (:class:`pitlab.evaluator.estimates.R2Batch`, B = 1; ``on.r2_rows`` on the leakage-off test rows), ``reps``
    the bootstrap replicates, the final α ``grid`` and its ``widenings``, ``edges`` (:func:`point_estimates`),
    ``edge_text`` (phrases per protocol key), and, when computed (``full``), the extra protocols'
    results and premium replicates and the embargo robustness rows."""

    off: object
    on: object
    reps: PremiumReplicates
    grid: list[float]
    widenings: int
    edges: dict
    edge_text: dict
    protocols: dict
    protocol_reps: dict
    robustness: list[dict]

    @property
    def r2_on_rows(self) -> float:
        """R²(on) on the leakage-off test rows (the same rows as R²(off))."""
        return float(self.on.r2_rows[0])

    @property
    def premium(self) -> float:
        """R²(on) − R²(off) on the same rows (the leakage-off test rows)."""
        return self.r2_on_rows - float(self.off.r2[0])


def build_stats(setup, X: np.ndarray, y: np.ndarray, indicators: np.ndarray | None = None) -> PanelStats:
    """The :class:`PanelStats` of embeddings ``X`` [n_rows, d] and target ``y`` [n_rows] (or [n_rows, T]: T targets,
    :meth:`PanelStats.build`) on ``setup``'s split:
    per-security units, or row units (with calendar positions) when ``setup.row_units``. ``indicators`` int
    [n_rows]: X is the indicator matrix of these codes (the date-only baseline; row units take a shortcut)."""
    split = setup.split
    if not setup.row_units:
        return PanelStats.build(X, y, setup.codes, setup.n_securities, split.train_mask, split.test_mask,
                                setup.backend)
    return PanelStats.build_rows(X, y, setup.codes, split.train_mask, split.test_mask, setup.backend,
                                 positions=setup.positions, indicators=indicators)


@dataclass
class _Points:
    """One target's point estimates on the final grid (:func:`point_estimates`), its protocols' folds, and the
    penalty positions the bootstrap refits at when ``bootstrap.reselectPenalty`` is false (else None)."""

    off: object
    on: object
    edges: dict
    grid: list[float]
    widenings: int
    edge_text: dict
    pfolds: dict
    points: dict
    fixed: tuple | None


def _points(spec, setup, stats: PanelStats, full: bool) -> _Points:
    """:func:`point_estimates` of one target on ``setup``'s splits (with the extra protocols when ``full``)."""
    K = spec.protocol.group_k_folds
    pfolds = ({p: [Fold(tr, te) for tr, te in zip(sp.fold_train, sp.fold_test)] for p, sp in setup.extra.items()}
              if full else {})
    points: dict = {}
    off, on, edges, grid, widenings = point_estimates(stats, setup.point_folds, K, setup.alphas, setup.selection,
                                                      setup.benchmark, pfolds, setup.time_selection, True, points)
    note = grid_note(grid, widenings)  # once per protocol's phrases, after the last
    edge_text = {k: [e + (note if i == len(v[0]) - 1 else "") for i, e in enumerate(v[0])] for k, v in edges.items()}
    fixed = None if setup.reselect else (off.alpha_index, on.alpha_index)
    return _Points(off, on, edges, grid, widenings, edge_text, pfolds, points, fixed)


def _bootstrap(spec, setup, stats: PanelStats, pt: _Points):
    """One target's bootstrap replicates (:func:`pitlab.evaluator.bootstrap.bootstrap_model`) on its grid."""
    return bootstrap_model(stats, setup.weights, setup.folds, spec.protocol.group_k_folds, pt.grid, setup.selection,
                           setup.benchmark, pt.fixed, setup.time_selection, same_rows=True)


def _target_stats(spec, setup, stats: PanelStats, pt: _Points, reps, full: bool) -> TargetStats:
    """:class:`TargetStats` from one target's point estimates and replicates (and, when ``full``, its extra
    protocols and embargo robustness)."""
    protocols, protocol_reps, robustness = {}, {}, []
    if full:
        protocols, protocol_reps = _extra_protocols(stats, setup, pt.pfolds, pt.grid, float(pt.on.r2[0]), reps.r2_on,
                                                    pt.edge_text, pt.points)
        robustness = _embargo_robustness(stats, spec, setup, pt.grid, float(pt.on.r2_rows[0]))
    return TargetStats(pt.off, pt.on, reps, pt.grid, pt.widenings, pt.edges, pt.edge_text, protocols,
                       protocol_reps, robustness)


def target_statistics(spec, setup, X: np.ndarray, y: np.ndarray, full: bool = True,
                      indicators: np.ndarray | None = None) -> TargetStats:
    """Everything one target gives for one model on ``setup``'s shared splits and draws. ``full``: also the
    extra protocols (``protocol.protocols``) and ``protocol.embargoRobustness``; otherwise leakage-off and
    leakage-on only (the market-neutral target). ``indicators``: see :func:`build_stats`."""
    stats = build_stats(setup, X, y, indicators)
    pt = _points(spec, setup, stats, full)
    return _target_stats(spec, setup, stats, pt, _bootstrap(spec, setup, stats, pt), full)


def model_statistics(spec, setup, X: np.ndarray, y: np.ndarray, y_neutral: np.ndarray) -> tuple:
    """One model's :func:`target_statistics` on the raw target ``y`` (``full``) and on the market-neutral one
    ``y_neutral`` (leakage-off and leakage-on), both float [n_rows]: ``(raw, neutral)``. The same numbers up to
    rounding as two separate calls, but when both targets end on the same α grid their bootstrap replicates are
    fitted together (:meth:`pitlab.evaluator.estimates.PanelStats.build` with two targets): every inner-fold
    factorisation of the penalty selection serves both."""
    stats, stats_n = build_stats(setup, X, y), build_stats(setup, X, y_neutral)
    pt, pt_n = _points(spec, setup, stats, True), _points(spec, setup, stats_n, False)
    if pt.grid == pt_n.grid:
        pair = build_stats(setup, X, np.column_stack([y, y_neutral]))
        reps, reps_n = bootstrap_model(pair, setup.weights, setup.folds, spec.protocol.group_k_folds, pt.grid,
                                       setup.selection, setup.benchmark,
                                       None if setup.reselect else [pt.fixed, pt_n.fixed], setup.time_selection,
                                       same_rows=True)
        del pair
    else:
        reps, reps_n = _bootstrap(spec, setup, stats, pt), _bootstrap(spec, setup, stats_n, pt_n)
    return (_target_stats(spec, setup, stats, pt, reps, True), _target_stats(spec, setup, stats_n, pt_n, reps_n, False))
