"""One leakage evaluation, end to end: embed → per-security statistics → point estimates → clustered bootstrap
→ results.json / report.md / premium.png (DESIGN section 4.7)."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pitlab.api.leakageeval import LeakageEvalSpec, spec_warnings
from pitlab.data.types import Panel
from pitlab.evaluator.bootstrap import (BIAS_LIMIT, bootstrap_model, cutoff_control, draw_weights, judge,
                                       paired_reductions, percentile_ci, replicate_folds, replicate_row_folds,
                                       row_weights)
from pitlab.evaluator.embed import embed_texts
from pitlab.evaluator.estimates import AlphaSelection, Fold, PanelStats, leakage_off_r2, leakage_on_r2
from pitlab.evaluator.linalg import Backend
from pitlab.evaluator.protocols import (ChronologicalSplit, PurgedKFoldSplit, WalkForwardSplit, security_folds,
                                        trading_calendar)
from pitlab.evaluator.report import RESULTS_FILE, write_outputs

BENCHMARK = "training mean"
BENCHMARK_TEXT = {"train_mean": ("training mean", "R² = 1 − SSE / Σ(y − ȳ_train)², ȳ_train the mean target of the "
                                                  "set the ridge was fitted on"),
                  "zero": ("zero", "R² = 1 − SSE / Σy² (zero forecast as benchmark, Gu, Kelly & Xiu 2020)")}
TARGET = "close[t+2] / close[t+1] - 1 (JPX definition)"
StageProgress = Callable[[str, int, int], None]


class EvaluationError(ValueError):
    """The panel or the model list cannot be evaluated (the message names the field or model)."""


def check_panel(panel: Panel) -> None:
    """Raise :class:`EvaluationError` unless ``panel.rows`` has date/security/prompt/target, no missing
    value, finite targets and unique (date, security) rows."""
    rows = panel.rows
    missing = [c for c in ("date", "security", "prompt", "target") if c not in rows.columns]
    if missing:
        raise EvaluationError(f"panel.rows lacks column(s) {missing}")
    if len(rows) == 0:
        raise EvaluationError("panel.rows is empty")
    for c in ("date", "security", "prompt", "target"):
        if rows[c].isna().any():
            raise EvaluationError(f"panel.rows.{c} has {int(rows[c].isna().sum())} missing value(s)")
    if not np.all(np.isfinite(rows["target"].to_numpy(dtype=np.float64))):
        raise EvaluationError("panel.rows.target has non-finite values")
    if rows.duplicated(["date", "security"]).any():
        raise EvaluationError("panel.rows has duplicate (date, security) rows")


def _ordered_models(spec: LeakageEvalSpec, models: dict[str, tuple[Path, str]]) -> list[str]:
    names = [m.name for m in spec.models]
    extra, absent = sorted(set(models) - set(names)), [n for n in names if n not in models]
    if extra or absent:
        raise EvaluationError(f"models: spec.models names {names} and the given model folders {list(models)} "
                              f"differ (missing folders for {absent}, not in spec: {extra})")
    for n in names:
        path, kind = models[n]
        if kind not in ("auto", "causal", "encoder"):
            raise EvaluationError(f"models[{n}].kind must be auto, causal or encoder (got {kind!r})")
        if not (Path(path) / "config.json").is_file():
            raise EvaluationError(f"models[{n}]: {path} is not a Hugging Face model folder (no config.json)")
    return names


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
    out, lower, upper = [], False, False
    idx, dfs = np.atleast_1d(np.asarray(alpha_index)), np.atleast_1d(np.asarray(df, dtype=np.float64))
    for i, (k, f) in enumerate(zip(idx, dfs)):
        where = label if len(idx) == 1 else f"{label} fold {i + 1}"
        if a[k] <= a.min():
            lower = True
            out.append(f"{where} chose the smallest penalty {a[k]:g} of the grid")
        elif a[k] >= a.max() and np.isfinite(f) and f - 1.0 >= 1.0:
            upper = True
            out.append(f"{where} chose the largest penalty {a[k]:g} of the grid yet fits {f - 1.0:.1f} "
                       "effective parameters")
    return out, lower, upper


def widen_grid(alphas: list[float], lower: bool, upper: bool) -> list[float]:
    """``alphas`` (sorted) with :data:`WIDEN_DECADES` decades added below its minimum (``lower``) and/or above
    its maximum (``upper``), one value per decade."""
    a = sorted(float(x) for x in alphas)
    lo = [a[0] / 10.0 ** k for k in range(WIDEN_DECADES, 0, -1)] if lower else []
    hi = [a[-1] * 10.0 ** k for k in range(1, WIDEN_DECADES + 1)] if upper else []
    return lo + a + hi


def point_estimates(stats: PanelStats, point_folds: np.ndarray, n_splits: int, alphas: list[float],
                    selection: AlphaSelection, benchmark: str = "train_mean",
                    extra_folds: dict[str, list[Fold]] | None = None) -> tuple:
    """Point estimates of leakage-off and leakage-on (and the penalties of ``extra_folds``' protocols), with
    the α grid widened by :func:`widen_grid` while a selection ends at an edge (:func:`fold_edges`), at most
    :data:`WIDEN_STEPS` times.

    ``point_folds`` int [1, units]: GroupKFold fold of every unit. Returns ``(off, on, edges, grid,
    widenings)``: the :class:`pitlab.evaluator.estimates.R2Batch` of both protocols (B = 1) on the final grid,
    ``edges`` protocol key (``off``, ``on``, or an ``extra_folds`` key) → :func:`fold_edges`' triple, the
    final grid and the number of widenings."""
    ones = np.ones((1, stats.n_securities))
    grid, widenings = list(alphas), 0
    while True:
        off = leakage_off_r2(stats, ones, grid, selection, benchmark)
        on = leakage_on_r2(stats, ones, point_folds, n_splits, grid, selection, benchmark)
        edges = {"off": fold_edges("leakage-off", off.alpha_index, off.df, grid),
                 "on": fold_edges("leakage-on", on.alpha_index[0], on.df[0], grid)}
        for pname, pf in (extra_folds or {}).items():
            fr = stats.protocol_errors(pf, ones, grid, selection, benchmark, diagnostics=True)
            edges[pname] = fold_edges(pname, fr.alpha_index[0], fr.df[0], grid)
        lower, upper = any(e[1] for e in edges.values()), any(e[2] for e in edges.values())
        if not (lower or upper) or widenings == WIDEN_STEPS:
            return off, on, edges, grid, widenings
        grid, widenings = widen_grid(grid, lower, upper), widenings + 1


def _device(backend: Backend) -> dict:
    """Where the statistics ran (library, device, dtype, BLAS threads on the CPU), the host, and the
    accelerator torch sees, if any."""
    import torch
    from threadpoolctl import threadpool_info

    d = {"statistics": backend.describe(), "host": f"{platform.machine()} ({platform.processor() or 'cpu'}), "
                                                  f"{os.cpu_count()} cores",
         "blas": [{"library": i.get("internal_api"), "threads": i.get("num_threads"),
                   "version": i.get("version")} for i in threadpool_info() if i.get("user_api") == "blas"],
         "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}
    if d["cuda"]:
        d["gpu"] = torch.cuda.get_device_name(0)
    return d


def _extra_splitters(spec: LeakageEvalSpec, panel: Panel, calendar: pd.DatetimeIndex) -> dict:
    """The date-block protocols the spec asks for, built once for all models (days counted on ``calendar``)."""
    proto, dates = spec.protocol, panel.rows["date"].to_numpy()
    out = {}
    if "walk-forward" in proto.protocols:
        out["walk-forward"] = WalkForwardSplit(dates, calendar, proto.walk_forward_folds, proto.embargo_days)
    if "purged-kfold" in proto.protocols:
        out["purged-kfold"] = PurgedKFoldSplit(dates, calendar, proto.purged_folds, proto.embargo_days)
    return out


CLUSTER_TEXT = {
    "security": "securities with replacement, all dates of a drawn security come along",
    "date": "dates with replacement, all securities of a drawn date come along",
    "security-and-date": "securities and dates, independently, a row weighted by the product of the two "
                         "multiplicities (pigeonhole bootstrap, Owen 2007; Davezies, D'Haultfœuille & Guyonvarch "
                         "2021)"}

PROTOCOL_TEXT = {
    "walk-forward": "walk-forward, expanding window: the distinct panel dates cut into K+1 blocks "
                    "(scikit-learn TimeSeriesSplit); fold k tests on block k, trains on all earlier rows less the "
                    "embargo; headline R² = mean of the per-fold R²",
    "purged-kfold": "purged and embargoed K-fold over date blocks (López de Prado 2018, ch. 7): training rows "
                    "whose span [t, t+2] overlaps the test fold's are purged, plus embargoDays trading days after "
                    "it; headline R² pooled out-of-fold (1 − Σ SSE / Σ SST)",
}


def _versions() -> dict[str, str]:
    """Versions of everything that can move a number: interpreter, array and model libraries, calendars."""
    from importlib.metadata import PackageNotFoundError, version

    import matplotlib
    import sklearn
    import torch
    import transformers

    out = {"python": platform.python_version(), "numpy": np.__version__, "pandas": pd.__version__,
           "scikit-learn": sklearn.__version__, "torch": torch.__version__,
           "transformers": transformers.__version__, "matplotlib": matplotlib.__version__}
    for dist in ("exchange_calendars", "tokenizers", "safetensors", "pitlab"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def _panel_summary(panel: Panel, calendar: pd.DatetimeIndex) -> dict:
    rows = panel.rows
    dates = pd.DatetimeIndex(rows["date"])
    pcal = pd.DatetimeIndex(panel.calendar)
    first, last = pcal[0], pcal[-1]
    sessions = calendar[(calendar >= first) & (calendar <= last)]
    return {"source": panel.source, "n_rows": len(rows), "n_securities": int(rows["security"].nunique()),
            "n_dates": int(dates.nunique()), "first_date": dates.min().date().isoformat(),
            "last_date": dates.max().date().isoformat(),
            "calendar": [first.date().isoformat(), last.date().isoformat()],
            "trading_calendar": {
                "name": calendar.name, "sessions": int(len(sessions)),
                "price_file_days_not_sessions": [d.date().isoformat() for d in pcal.difference(sessions)][:20],
                "sessions_missing_from_price_file": int(len(sessions.difference(pcal)))},
            "dropped": dict(panel.dropped), "target": TARGET}


EMBED_RATES = ("load_seconds", "forward_seconds", "layers_run", "n_tokens", "n_batches", "prompts_per_s",
               "tokens_per_s")
"""Keys of the embedding stage's info copied into ``timings.models.<name>`` as ``embed_<key>`` (None on a cache hit)."""


def embed_panel(spec: LeakageEvalSpec, prompts: list[str], model_dir: Path, kind: str = "auto", *,
                cache_dir: Path | None = None, num_threads: int | None = None, info: dict | None = None,
                progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Embeddings of the panel's prompts (float32 [n_rows, hidden]) with ``spec.embedding``'s settings.

    The one call both the evaluation (``run_leakage_eval``) and the embedding Jobs (``pitlab embed``) make,
    so an embedding computed by one is a cache hit for the other (same model digest, settings, prompts).
    """
    emb = spec.embedding
    return embed_texts(Path(model_dir), prompts, kind=kind, layer=emb.layer, pooling=emb.pooling,
                       batch_size=emb.batch_size, max_length=emb.max_length, dtype=emb.dtype, progress=progress,
                       num_threads=num_threads, cache_dir=cache_dir, info=info)


@dataclass
class EvalSetup:
    """What every model of one evaluation shares: the penalty selection and grid, the splits (leakage-off, the
    extra date-block protocols), the security and date codes of the rows, the bootstrap draws (``weights``
    float [B, units], their GroupKFold ``folds``) and the point estimate's folds (``point_folds`` int [1, units])."""

    selection: AlphaSelection
    alphas: list[float]
    benchmark: str
    backend: Backend
    reselect: bool
    calendar: pd.DatetimeIndex
    extra: dict
    split: ChronologicalSplit
    dates: np.ndarray
    codes: np.ndarray
    n_securities: int
    y: np.ndarray
    prompts: list[str]
    w_sec: np.ndarray
    w_date: np.ndarray
    ones: np.ndarray
    point_folds: np.ndarray
    weights: np.ndarray
    folds: np.ndarray
    draws_s: float


def _selection(spec: LeakageEvalSpec, alpha_selection: AlphaSelection | str | None) -> AlphaSelection:
    if alpha_selection is None:
        return AlphaSelection(spec.regression.selection, inner_folds=spec.regression.inner_folds)
    if isinstance(alpha_selection, str):
        return AlphaSelection(alpha_selection, inner_folds=spec.regression.inner_folds)
    return alpha_selection


def prepare_evaluation(spec: LeakageEvalSpec, panel: Panel,
                       alpha_selection: AlphaSelection | str | None = None) -> EvalSetup:
    """The splits and the bootstrap draws every model of ``spec`` is evaluated on (see :class:`EvalSetup`).
    Raises :class:`EvaluationError` for non-positive ``regression.alphas`` or more folds than securities."""
    selection = _selection(spec, alpha_selection)
    alphas = list(spec.regression.alphas)
    if any(not np.isfinite(a) or a <= 0 for a in alphas):
        raise EvaluationError(f"regression.alphas must be positive (got {alphas})")
    proto, boot, rows = spec.protocol, spec.bootstrap, panel.rows
    backend = Backend.resolve(spec.regression.device)
    calendar = trading_calendar(spec.dataset.calendar, spec.dataset.kind, panel.calendar)
    extra = _extra_splitters(spec, panel, calendar)
    split = ChronologicalSplit(rows["date"].to_numpy(), calendar, proto.train_end, proto.test_start,
                               proto.embargo_days)
    codes, securities = pd.factorize(rows["security"].astype(str), sort=True)
    S, K = len(securities), proto.group_k_folds
    rows_per_sec = np.bincount(codes, minlength=S)
    if S < K:
        raise EvaluationError(f"protocol.groupKFolds={K} exceeds the number of securities in the panel ({S})")
    t0 = time.perf_counter()
    date_codes, udates = pd.factorize(pd.DatetimeIndex(rows["date"]), sort=True)
    w_sec, w_date = draw_weights(boot.cluster, S, len(udates), boot.resamples, boot.seed)
    if boot.cluster == "security":  # units = securities: per-security statistics
        ones = np.ones((1, S))
        point_folds = security_folds(rows_per_sec, K)[None, :]
        weights = w_sec
        folds = replicate_folds(rows_per_sec, weights, K)  # shared by every model, like the weights
    else:  # units = rows, weighted by their date's (and security's) multiplicity; folds still by security
        ones = np.ones((1, len(rows)))
        point_folds = security_folds(rows_per_sec, K)[codes][None, :]
        weights = row_weights(w_sec, w_date, codes, date_codes)
        folds = replicate_row_folds(codes, S, weights, K)
    return EvalSetup(selection, alphas, spec.regression.benchmark, backend, boot.reselect_penalty, calendar,
                     extra, split, rows["date"].to_numpy(), codes, S, rows["target"].to_numpy(dtype=np.float64),
                     rows["prompt"].astype(str).tolist(), w_sec, w_date, ones, point_folds, weights, folds,
                     time.perf_counter() - t0)


@dataclass
class ModelOutcome:
    """One model's part of the results: its ``results.json`` entry, its bootstrap replicates (the premium, R²
    off and on, each extra protocol's premium: float [B]), the grid-edge phrases its verdicts carry, the
    warnings it adds and its timings (seconds)."""

    result: dict
    premium_reps: np.ndarray
    replicates: dict[str, np.ndarray]
    protocol_reps: dict[str, np.ndarray]
    edges: list[str]
    warnings: list[str]
    timings: dict


def _extra_protocols(stats: PanelStats, setup: EvalSetup, pfolds: dict[str, list[Fold]], grid: list[float],
                     on_r2: float, r2_on_reps: np.ndarray, edge_text: dict[str, list[str]],
                     boot) -> tuple[dict, dict[str, np.ndarray]]:
    """Walk-forward / purged K-fold of one model: R² (point and replicates), per-fold values, premium vs
    leakage-on with its verdict. Returns (results by protocol, premium replicates by protocol)."""
    out, reps_out = {}, {}
    for pname, pf in pfolds.items():
        fr = stats.protocol_errors(pf, np.vstack([setup.ones, setup.weights]), grid, setup.selection,
                                   setup.benchmark, diagnostics=True, point_first=True, reselect=setup.reselect)
        head = fr.mean if pname == "walk-forward" else fr.pooled
        prem = on_r2 - head[0]
        prem_reps = r2_on_reps - head[1:]
        pj = judge(float(prem), prem_reps, boot.confidence, edge_text["on"] + edge_text[pname])
        out[pname] = {
            "r2": float(head[0]), "r2_ci": list(percentile_ci(head[1:], boot.confidence)),
            "r2_mean": float(fr.mean[0]), "r2_pooled": float(fr.pooled[0]),
            "r2_per_fold": [float(v) for v in fr.r2[0]],
            "r2_per_fold_ci": [list(percentile_ci(fr.r2[1:, k], boot.confidence)) for k in range(fr.r2.shape[1])],
            "alpha_per_fold": [float(a) for a in fr.alpha[0]],
            "premium": float(prem), "premium_ci": pj["ci"], "premium_p_value": pj["p_value"],
            "premium_bias": pj["bias"], "premium_sd": pj["sd"], "verdict": pj["verdict"],
            "verdict_reasons": pj["reasons"]}
        reps_out[pname] = prem_reps
    return out, reps_out


def _embargo_robustness(stats: PanelStats, spec: LeakageEvalSpec, setup: EvalSetup, grid: list[float],
                        on_r2: float) -> list[dict]:
    """r2_off and the premium re-estimated at each of ``protocol.embargoRobustness``'s embargo lengths."""
    proto = spec.protocol
    out = []
    for e in proto.embargo_robustness:
        with warnings.catch_warnings():  # a short embargo is the point of the robustness check
            warnings.simplefilter("ignore", UserWarning)
            sp_e = ChronologicalSplit(setup.dates, setup.calendar, proto.train_end, proto.test_start, e)
        r_e = stats.protocol_errors([Fold(sp_e.train_mask, sp_e.test_mask)], setup.ones, grid, setup.selection,
                                     setup.benchmark)
        out.append({"embargo_days": int(e), "n_train": sp_e.n_train, "r2_off": float(r_e.r2[0, 0]),
                    "premium": float(on_r2 - r_e.r2[0, 0])})
    return out


def evaluate_model(spec: LeakageEvalSpec, setup: EvalSetup, name: str, path: Path, kind: str,
                   note: StageProgress, cache_dir: Path | None = None, num_threads: int | None = None,
                   embedded: dict | None = None) -> ModelOutcome:
    """Embed the panel with one model, then its point estimates (α grid widened while a selection ends at an
    edge), bootstrap replicates, extra protocols and embargo robustness, on ``setup``'s shared splits and draws.
    ``embedded``: the ``info`` of an earlier :func:`embed_panel` call for this model in the same run."""
    boot, emb, K = spec.bootstrap, spec.embedding, spec.protocol.group_k_folds
    info: dict = {}
    t_emb = time.perf_counter()
    X = embed_panel(spec, setup.prompts, path, kind, cache_dir=cache_dir, num_threads=num_threads, info=info,
                    progress=lambda d, t: note(f"embed:{name}", d, t))
    t_stat = time.perf_counter()
    embed_s = t_stat - t_emb
    if embedded is not None:  # embedded by an earlier stage of this run: report that stage
        info["cache_hit"] = bool(embedded.get("cache_hit", info["cache_hit"]))
        embed_s = float(embedded.get("seconds", embed_s))
    note(f"statistics:{name}", 0, 1)
    split = setup.split
    if boot.cluster == "security":
        stats = PanelStats.build(X, setup.y, setup.codes, setup.n_securities, split.train_mask, split.test_mask,
                                 setup.backend)
    else:
        stats = PanelStats.build_rows(X, setup.y, setup.codes, split.train_mask, split.test_mask, setup.backend)
    pfolds = {p: [Fold(tr, te) for tr, te in zip(sp.fold_train, sp.fold_test)] for p, sp in setup.extra.items()}
    off, on, edges, grid, widenings = point_estimates(stats, setup.point_folds, K, setup.alphas, setup.selection,
                                                      setup.benchmark, pfolds)
    grid_note = (f" (regression.alphas widened {widenings} time(s), {WIDEN_DECADES} decades each, to "
                 f"[{', '.join(f'{a:g}' for a in grid)}])" if widenings else "")
    edge_text = {k: [f"{e}{grid_note}" for e in v[0]] for k, v in edges.items()}
    t_boot = time.perf_counter()
    fixed = None if setup.reselect else (off.alpha_index, on.alpha_index)
    reps = bootstrap_model(stats, setup.weights, setup.folds, K, grid, setup.selection, setup.benchmark, fixed)
    t_extra = time.perf_counter()
    proto_results, proto_reps = _extra_protocols(stats, setup, pfolds, grid, on.r2[0], reps.r2_on, edge_text, boot)
    robustness = _embargo_robustness(stats, spec, setup, grid, on.r2[0])
    del stats
    t_end = time.perf_counter()
    note(f"statistics:{name}", 1, 1)
    r2_off, r2_on = float(off.r2[0]), float(on.r2[0])
    premium = r2_on - r2_off
    model_edges = edge_text["off"] + edge_text["on"]
    pj = judge(premium, reps.premium, boot.confidence, model_edges)
    m = next(m for m in spec.models if m.name == name)
    result = {
        "name": name, "uri": m.uri,
        "training_ref": m.training_ref.model_dump(by_alias=True) if m.training_ref else None,
        "model_dir": str(path), "kind": info["kind"], "digest": info["digest"],
        "embedding_device": info.get("device"),
        "embedding_weights": (embedded or info).get("weights", info.get("weights")),
        "knowledge_cutoff": m.knowledge_cutoff.isoformat() if m.knowledge_cutoff else None,
        "embedding_dim": int(X.shape[1]), "pooling": info["pooling"], "layer": emb.layer,
        "n_truncated_prompts": info["n_truncated"], "embedding_cache_hit": info["cache_hit"],
        "r2_off": r2_off, "r2_on": r2_on, "premium": premium, "premium_ci": pj["ci"],
        "premium_p_value": pj["p_value"], "premium_bias": pj["bias"], "premium_sd": pj["sd"],
        "protocols": proto_results,
        "embargo_robustness": robustness,
        "r2_off_ci": list(percentile_ci(reps.r2_off, boot.confidence)),
        "r2_on_ci": list(percentile_ci(reps.r2_on, boot.confidence)),
        "verdict": pj["verdict"], "verdict_reasons": pj["reasons"],
        "n_train": split.n_train, "n_test": split.n_test,
        "n_embargoed": split.n_embargoed, "alpha_off": float(off.alpha[0]),
        "alpha_on": [float(a) for a in on.alpha[0]], "alphas": [float(a) for a in grid],
        "alpha_grid_widenings": widenings,
        "n_valid_replicates": int(np.isfinite(reps.premium).sum()),
        "df_off": float(off.df[0]), "df_on": [float(x) for x in on.df[0]],
        "alpha_at_grid_edge": "lower" if any(e[1] for e in edges.values()) else
        ("upper" if any(e[2] for e in edges.values()) else None),
    }
    notes = _model_warnings(name, setup.selection.method, edges, widenings, grid_note, pj["reasons"])
    timings = {"embed_s": embed_s, "point_estimate_s": t_boot - t_stat, "bootstrap_s": t_extra - t_boot,
               "extra_protocols_s": t_end - t_extra, "statistics_s": t_end - t_stat,
               **{f"embed_{k}": (embedded or info).get(k) for k in EMBED_RATES}}
    return ModelOutcome(result, reps.premium, {"r2_off": reps.r2_off, "r2_on": reps.r2_on}, proto_reps,
                        model_edges, notes, timings)


def _model_warnings(name: str, method: str, edges: dict, widenings: int, grid_note: str,
                    reasons: list[str]) -> list[str]:
    """The run warnings one model adds: a penalty selection still at a grid edge; an unreliable premium."""
    notes = []
    if any(e[0] for e in edges.values()):
        notes.append(
            f"model {name}: the penalty selection ({method}) still ends at an edge of the α grid "
            f"after {widenings} widening(s): {'; '.join(sum((e[0] for e in edges.values()), []))}{grid_note}. "
            "Its optimum lies outside the grid, and the two protocols, whose training sets differ in size, "
            "then over- or underfit by different amounts, which shifts the premium even for an "
            "uninformative embedding.")
    if reasons:
        notes.append(f"model {name}: the premium is unreliable: {'; '.join(reasons)}.")
    return notes


def _protocol_section(spec: LeakageEvalSpec, setup: EvalSetup, n_rows: int) -> dict:
    """``results.protocol``: how each protocol split the panel."""
    proto = spec.protocol
    return {
        "leakage_off": {"method": "chronological split with embargo (trading days)",
                        "calendar": setup.calendar.name, **setup.split.summary()},
        "leakage_on": {"method": "GroupKFold by security over all dates (scikit-learn, no shuffle), pooled "
                                 "out-of-fold R² = 1 - Σ_k SSE_k / Σ_k SST_k, SST_k about fold k's "
                                 "training mean",
                       "n_splits": proto.group_k_folds, "n_rows": n_rows},
        "premium": "r2_on - r2_off",
        "selected": list(proto.protocols),
        **{p: {"method": PROTOCOL_TEXT[p], "premium": f"r2_on - r2_{p}", **sp.summary()}
           for p, sp in setup.extra.items()},
    }


def _bootstrap_section(spec: LeakageEvalSpec, setup: EvalSetup) -> dict:
    """``results.bootstrap``: the resampling, its seed, the digests of its draws and when a verdict is unreliable."""
    boot, reselect = spec.bootstrap, setup.reselect

    def sha(a: np.ndarray) -> str:
        return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()

    return {"resamples": boot.resamples, "confidence": boot.confidence, "cluster": boot.cluster,
            "bias_limit_sd": BIAS_LIMIT,
            "unreliable_when": [
                "the point estimate lies outside its own interval",
                f"the bootstrap bias (mean of replicates − point estimate) exceeds {BIAS_LIMIT:.2f} × "
                "the bootstrap sd",
                f"a point estimate's penalty selection ends at an edge of the α grid after "
                f"{WIDEN_STEPS} widenings of {WIDEN_DECADES} decades"],
            "seed": boot.seed, "ci_method": "percentile", "shared_draws": True,
            "reselect_penalty": reselect,
            "penalty_in_replicates": ("chosen again by the same selection as the point estimate" if reselect else
                                      "held at the point estimate's choice for each protocol and fold "
                                      "(interval conditional on those penalties)"),
            "weights_sha256": sha(setup.weights), "security_weights_sha256": sha(setup.w_sec),
            "date_weights_sha256": sha(setup.w_date),
            "resampled": CLUSTER_TEXT[boot.cluster],
            "replicate_folds": "GroupKFold on the replicate; all copies of a security share one fold",
            "resampled_dates": "a drawn date keeps its calendar position: its copies sit on one side of "
                               "every date split (one fold of walk-forward and purged K-fold), embargo "
                               "and purge count calendar sessions; a replicate whose training block has "
                               "no drawn date gives no value (NaN) for that protocol"}


def assemble_results(spec: LeakageEvalSpec, panel: Panel, setup: EvalSetup, names: list[str],
                     outcomes: list[ModelOutcome]) -> dict:
    """The results document of the evaluation: every model's entry, the paired premium reductions (overall
    and per extra protocol, on the shared draws), the control by knowledge cutoff, the warnings, and what the
    numbers depend on (spec, versions, device, seed, draws). ``timings`` is left for the caller to fill."""
    premiums = {o.result["name"]: o.result["premium"] for o in outcomes}
    premium_reps = {o.result["name"]: o.premium_reps for o in outcomes}
    model_edges = {o.result["name"]: o.edges for o in outcomes}
    conf = spec.bootstrap.confidence
    run_warnings = list(panel.warnings) + list(setup.split.warnings) + spec_warnings(spec)
    for o in outcomes:
        run_warnings += o.warnings
    reductions = paired_reductions(names, premiums, premium_reps, conf, model_edges)
    for r in reductions:
        if r["reasons"]:
            run_warnings.append(f"reduction premium({r['model_a']}) - premium({r['model_b']}) = {r['reduction']:.4g} "
                                f"is unreliable: {'; '.join(r['reasons'])}.")
    protocol_reductions = {p: paired_reductions(names, {o.result["name"]: o.result["protocols"][p]["premium"]
                                                        for o in outcomes},
                                                {o.result["name"]: o.protocol_reps[p] for o in outcomes}, conf,
                                                model_edges) for p in setup.extra}
    cutoffs = {m.name: m.knowledge_cutoff for m in spec.models}
    benchmark = setup.benchmark
    return {
        "kind": "LeakageEvalResults",
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "benchmark": BENCHMARK_TEXT[benchmark][0],
        "benchmark_key": benchmark,
        "r2_definition": "out-of-sample " + BENCHMARK_TEXT[benchmark][1],
        "protocol": _protocol_section(spec, setup, len(panel.rows)),
        "regression": {"model": "ridge, unpenalised intercept, raw embeddings", "alphas": setup.alphas,
                       "alpha_selection": setup.selection.method,
                       "alpha_selection_detail": setup.selection.describe(), "device": setup.backend.name,
                       "dtype": "float64"},
        "bootstrap": _bootstrap_section(spec, setup),
        "embedding": spec.embedding.model_dump(mode="json"),
        "dataset": dict(panel.dataset),
        "panel": _panel_summary(panel, setup.calendar),
        "models": [o.result for o in outcomes],
        "reductions": reductions,
        "protocol_reductions": protocol_reductions,
        "cutoff_control": cutoff_control(names, cutoffs, premiums, premium_reps, conf),
        "warnings": run_warnings,
        "versions": _versions(),
        "device": _device(setup.backend),
        "seed": spec.bootstrap.seed,
        "spec": spec.model_dump(mode="json", by_alias=True),
    }


def run_leakage_eval(spec: LeakageEvalSpec, panel: Panel, models: dict[str, tuple[Path, str]], out_dir: Path,
                     progress: StageProgress | None = None, cache_dir: Path | None = None, *,
                     num_threads: int | None = None, alpha_selection: AlphaSelection | str | None = None,
                     embedded: dict[str, dict] | None = None) -> dict:
    """Measure the leakage premium of every model of ``spec`` on ``panel`` and write the outputs to ``out_dir``.

    ``models``: spec model name → (local model folder, kind "auto" | "causal" | "encoder"); the names must be
    those of ``spec.models`` (their order is the spec's; reductions are premium(i) − premium(j) for i listed
    before j). ``progress(stage, done, total)`` is called with stages ``embed:<name>`` (prompts done),
    ``statistics:<name>`` (0/1, 1/1) and ``report``. ``cache_dir`` caches embeddings; ``num_threads`` sets
    torch's CPU threads while embedding. ``alpha_selection``: how the ridge penalty is chosen inside every
    training set: None (default) takes ``spec.regression.selection`` and ``innerFolds``; ``"gcv"``,
    ``"security-cv"`` or an :class:`AlphaSelection` override it, see
    :class:`pitlab.evaluator.estimates.AlphaSelection`. ``embedded``: model name → the ``info`` dict of an
    earlier :func:`embed_panel` call in the same run (the local runner embeds as its own stage), so that
    results.json reports that stage's cache hit and seconds rather than this call's cache lookup.
    Trading days (embargo, purge) are sessions of ``spec.dataset.calendar``
    (:func:`pitlab.evaluator.protocols.trading_calendar`); the statistics run on ``spec.regression.device``
    (:class:`pitlab.evaluator.linalg.Backend`, float64); ``spec.bootstrap.reselectPenalty`` decides whether
    replicates choose their penalties again (default) or keep the point estimate's per protocol and fold.
    Returns the results dict (as written to ``results.json``). A stale ``results.json`` in ``out_dir`` is
    removed first, so the folder never looks complete after a failure.
    """
    t_all = time.perf_counter()
    out_dir = Path(out_dir)
    (out_dir / RESULTS_FILE).unlink(missing_ok=True)
    note = progress or (lambda stage, done, total: None)
    check_panel(panel)
    names = _ordered_models(spec, models)
    setup = prepare_evaluation(spec, panel, alpha_selection)
    outcomes = [evaluate_model(spec, setup, name, *models[name], note, cache_dir, num_threads,
                               (embedded or {}).get(name)) for name in names]
    results = assemble_results(spec, panel, setup, names, outcomes)
    timings: dict = {"draws_s": setup.draws_s, "models": {o.result["name"]: o.timings for o in outcomes}}
    timings["statistics_s"] = timings["draws_s"] + sum(m["statistics_s"] for m in timings["models"].values())
    timings["embed_s"] = sum(m["embed_s"] for m in timings["models"].values())
    results["timings"] = timings
    note("report", 0, 1)
    timings["total_s"] = time.perf_counter() - t_all  # before the report is written: results.json cannot time
    clean = write_outputs(results, out_dir, {o.result["name"]: o.replicates for o in outcomes})
    note("report", 1, 1)
    return clean
