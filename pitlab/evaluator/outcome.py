"""One model's part of an evaluation's results (:class:`ModelOutcome`), built from its embedding and its
statistics (:func:`model_outcome`); the summary of one target (:func:`target_summary`)."""

from __future__ import annotations

import datetime as dt
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pitlab.api.leakageeval import LeakageEvalSpec
from pitlab.evaluator.bootstrap import IntervalRule, interval, judge
from pitlab.evaluator.decompose import excess, mechanical_sentence
from pitlab.evaluator.setup import EvalSetup
from pitlab.evaluator.targets import TargetStats, grid_note


EMBED_RATES = ("load_seconds", "forward_seconds", "layers_run", "n_tokens", "n_batches", "prompts_per_s",
               "tokens_per_s")
"""Keys of the embedding stage's info copied into ``timings.models.<name>`` as ``embed_<key>`` (None on a cache hit)."""


@dataclass
class ModelOutcome:
    """One model's part of the results: its ``results.json`` entry, its bootstrap replicates (``replicates``:
    :data:`pitlab.evaluator.report.REPLICATE_COLUMNS` by name, the premium its interval is read from under
    ``premium``; each extra protocol's premium: float [B]), the grid-edge phrases its verdicts carry, the warnings
    it adds and its timings (seconds)."""

    result: dict
    replicates: dict[str, np.ndarray]
    protocol_reps: dict[str, np.ndarray]
    edges: list[str]
    warnings: list[str]
    timings: dict


@dataclass
class Baseline:
    """The date-only baseline (:mod:`pitlab.evaluator.decompose`) on the raw and the market-neutral target."""

    raw: TargetStats
    neutral: TargetStats
    seconds: float


def target_summary(ts: TargetStats, confidence: "IntervalRule | float") -> dict:
    """JSON-ready numbers of one target: R²(off), R²(on) on all rows and on the leakage-off test rows, the
    same-row premium with its interval, p-value, bias, sd and verdict (:func:`judge`), the chosen penalties and
    the α grid they were chosen from (``alphas``, after ``alpha_grid_widenings`` widenings)."""
    edges = ts.edge_text["off"] + ts.edge_text["on"]
    pj = judge(ts.premium, ts.reps.premium, confidence, edges)
    return {"r2_off": float(ts.off.r2[0]), "r2_on": float(ts.on.r2[0]), "r2_on_test_rows": ts.r2_on_rows,
            "premium": ts.premium, "premium_all_rows": float(ts.on.r2[0] - ts.off.r2[0]),
            "premium_ci": pj["ci"], "premium_p_value": pj["p_value"], "premium_bias": pj["bias"],
            "premium_sd": pj["sd"], "verdict": pj["verdict"], "verdict_reasons": pj["reasons"],
            "r2_off_ci": interval(float(ts.off.r2[0]), ts.reps.r2_off, confidence),
            "r2_on_ci": interval(float(ts.on.r2[0]), ts.reps.r2_on, confidence),
            "r2_on_test_rows_ci": interval(ts.r2_on_rows, ts.reps.r2_on_rows, confidence),
            "alpha_off": float(ts.off.alpha[0]), "alpha_on": [float(a) for a in ts.on.alpha[0]],
            "alphas": [float(a) for a in ts.grid], "alpha_grid_widenings": ts.widenings,
            "n_valid_replicates": int(np.isfinite(ts.reps.premium).sum())}


HEADLINE = "market_neutral"
"""The figure that heads the table and gives the verdict: the market-neutral premium (docs/statistics.md says why)."""


def _decomposition(name: str, raw: TargetStats, neutral: TargetStats, baseline: Baseline,
                   conf: "IntervalRule | float") -> dict:
    """The keys of a model's entry that split its premium: market-neutral, date-only, excess, headline, sentence."""
    mn = target_summary(neutral, conf)
    ex = excess(raw.premium, raw.reps.premium, baseline.raw.premium, baseline.raw.reps.premium, conf,
                raw.edge_text["off"] + raw.edge_text["on"])
    return {"market_neutral": mn, "date_only_premium": baseline.raw.premium, "excess": ex,
            "headline": {"figure": HEADLINE, "premium": mn["premium"], "ci": mn["premium_ci"],
                         "p_value": mn["premium_p_value"], "verdict": mn["verdict"]},
            "mechanical": mechanical_sentence(name, raw.premium, baseline.raw.premium, ex, mn)}


def _penalty_selection(setup: EvalSetup, raw: TargetStats) -> dict:
    """Which inner scheme each protocol used and the α it chose per fold (point estimate)."""
    out = {"leakage_off": {"scheme": setup.time_selection.describe(), "alpha_per_fold": [float(raw.off.alpha[0])]},
           "leakage_on": {"scheme": setup.selection.describe(),
                          "alpha_per_fold": [float(a) for a in raw.on.alpha[0]]}}
    for p, r in raw.protocols.items():
        out[p] = {"scheme": setup.time_selection.describe(), "alpha_per_fold": r["alpha_per_fold"]}
    return out


@dataclass
class ModelEmbedding:
    """One model's embeddings for the statistics: ``X`` float32 [n_rows, d], the embedding stage's ``info``
    (:func:`embed_panel`), ``earlier`` (the ``info`` of an earlier stage of this run, or None) and the seconds
    to report."""

    X: np.ndarray
    info: dict
    earlier: dict | None
    seconds: float


def model_outcome(spec: LeakageEvalSpec, setup: EvalSetup, name: str, path: Path, emb: ModelEmbedding,
                  stats: tuple, baseline: "Baseline | Future", cutoff: dt.date | None) -> ModelOutcome:
    """One model's results entry, replicates, warnings and timings from its embedding and its statistics
    ``stats`` = ``(raw, neutral, seconds)`` (:func:`pitlab.evaluator.parallel.timed_statistics`)."""
    raw, neutral, stats_s = stats
    info, earlier = emb.info, emb.earlier
    base = baseline.result() if isinstance(baseline, Future) else baseline
    summary = target_summary(raw, setup.rule)
    edges = raw.edges
    m = next(m for m in spec.models if m.name == name)
    result = {
        "name": name, "uri": m.uri,
        "training_ref": m.training_ref.model_dump(by_alias=True) if m.training_ref else None,
        "model_dir": str(path), "kind": info["kind"], "digest": info["digest"],
        "embedding_device": info.get("device"),
        "embedding_kernels": (earlier or info).get("kernels", info.get("kernels")),
        "embedding_weights": (earlier or info).get("weights", info.get("weights")),
        "knowledge_cutoff": cutoff.isoformat() if cutoff else None,
        "embedding_dim": int(emb.X.shape[1]), "pooling": info["pooling"], "layer": spec.embedding.layer,
        "n_truncated_prompts": info["n_truncated"], "embedding_cache_hit": info["cache_hit"],
        **summary,
        "premium_rows": "leakage-off test rows (R²(on) and R²(off) on the same rows)",
        **_decomposition(name, raw, neutral, base, setup.rule),
        "protocols": raw.protocols,
        "embargo_robustness": raw.robustness,
        "n_train": setup.split.n_train, "n_test": setup.split.n_test,
        "n_embargoed": setup.split.n_embargoed, "alphas": [float(a) for a in raw.grid],
        "alpha_grid_widenings": raw.widenings,
        "penalty_selection": _penalty_selection(setup, raw),
        "df_off": float(raw.off.df[0]), "df_on": [float(x) for x in raw.on.df[0]],
        "alpha_at_grid_edge": "lower" if any(e[1] for e in edges.values()) else
        ("upper" if any(e[2] for e in edges.values()) else None),
    }
    notes = _model_warnings(name, setup.time_selection.method, edges, raw.widenings,
                            grid_note(raw.grid, raw.widenings), summary["verdict_reasons"])
    timings = {"embed_s": emb.seconds, "statistics_s": stats_s,
               **{f"embed_{k}": (earlier or info).get(k) for k in EMBED_RATES}}
    model_edges = raw.edge_text["off"] + raw.edge_text["on"]
    replicates = {"r2_off": raw.reps.r2_off, "r2_on": raw.reps.r2_on, "r2_on_test_rows": raw.reps.r2_on_rows,
                  "premium": raw.reps.premium, "premium_market_neutral": neutral.reps.premium,
                  "excess": raw.reps.premium - base.raw.reps.premium}
    return ModelOutcome(result, replicates, raw.protocol_reps, model_edges, notes, timings)


def _model_warnings(name: str, method: str, edges: dict, widenings: int, note: str,
                    reasons: list[str]) -> list[str]:
    """The run warnings one model adds: a penalty selection still at a grid edge; an unreliable premium."""
    notes = []
    if any(e[0] for e in edges.values()):
        notes.append(
            f"model {name}: the penalty selection ({method}) still ends at an edge of the α grid "
            f"after {widenings} widening(s): {'; '.join(sum((e[0] for e in edges.values()), []))}{note}. "
            "Its optimum lies outside the grid, and the two protocols, whose training sets differ in size, "
            "then over- or underfit by different amounts, which shifts the premium even for an "
            "uninformative embedding.")
    if reasons:
        notes.append(f"model {name}: the premium is unreliable: {'; '.join(reasons)}.")
    return notes
