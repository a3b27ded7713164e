"""One leakage evaluation, end to end: embed → per-security statistics → point estimates → clustered bootstrap
→ results.json / report.md / premium.png (docs/design.md, "Evaluator")."""

from __future__ import annotations

import datetime as dt
import hashlib
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from pitlab.api.artifacts import MODEL_CARD, cutoff_warnings, read_model_card, resolve_cutoff
from pitlab.api.leakageeval import LeakageEvalSpec, spec_warnings
from pitlab.data.types import Panel
from pitlab.evaluator.bootstrap import BIAS_LIMIT, IntervalRule, cutoff_control, paired_reductions
from pitlab.evaluator.decompose import (DATE_ONLY, date_features, empty_checks, monte_carlo_checks,
                                        rows_per_dimension_checks, unknown_cutoff_checks)
from pitlab.evaluator.embed import embed_texts
from pitlab.evaluator.estimates import AlphaSelection
from pitlab.evaluator.linalg import Backend
from pitlab.evaluator.outcome import (EMBED_RATES, HEADLINE, Baseline, ModelEmbedding,  # noqa: F401 (re-exported)
                                      ModelOutcome, model_outcome, target_summary)
from pitlab.evaluator.parallel import StatisticsPool, result_of, statistics_processes
from pitlab.evaluator.protocols import ChronologicalSplit
from pitlab.evaluator.provenance import TARGET, device_record, panel_summary, versions  # noqa: F401
from pitlab.evaluator.report import RESULTS_FILE, write_outputs
from pitlab.evaluator.setup import (EvalSetup, EvaluationError, date_strata, rows_frame,  # noqa: F401  (re-exported)
                                    prepare_evaluation)
from pitlab.evaluator.targets import (WIDEN_DECADES, WIDEN_STEPS, TargetStats, fold_edges,  # noqa: F401
                                      model_statistics, point_estimates, target_statistics, widen_grid)

BENCHMARK = "training mean"
BENCHMARK_TEXT = {"train_mean": ("training mean", "R² = 1 − SSE / Σ(y − ȳ_train)², ȳ_train the mean target of the "
                                                  "set the ridge was fitted on"),
                  "zero": ("zero", "R² = 1 − SSE / Σy² (zero forecast as benchmark, Gu, Kelly & Xiu 2020)")}
StageProgress = Callable[[str, int, int], None]


def _selection_record(setup) -> dict[str, str]:
    """``alpha_selection`` (the setting: ``protocol-cv`` when leakage-on and the date protocols choose their
    penalties differently, else the one method) and ``alpha_selection_detail`` (each in words)."""
    on, off = setup.selection, setup.time_selection
    if on.method == off.method:
        return {"alpha_selection": on.method, "alpha_selection_detail": on.describe()}
    return {"alpha_selection": "protocol-cv",
            "alpha_selection_detail": f"leakage-off and the other date protocols: {off.describe()}; leakage-on: "
                                      f"{on.describe()}"}


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


CLUSTER_TEXT = {
    "two-way": "two one-way halves: securities with replacement (all dates of a drawn security come along) in "
               "the first half of the replicates, dates with replacement within the leakage-off training and "
               "test dates (every security of a drawn date comes along) in the second; interval = point ± "
               "t(G−1) × the larger one-way sd (G its cluster count)",
    "security": "securities with replacement, all dates of a drawn security come along",
    "date": "dates with replacement, all securities of a drawn date come along",
    "security-and-date": "securities and dates, independently, a row weighted by the product of the two "
                         "multiplicities (pigeonhole bootstrap, Owen 2007; Davezies, D'Haultfœuille & Guyonvarch "
                         "2021)"}

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
                       num_threads=num_threads, cache_dir=cache_dir, info=info, compile=emb.compile)


def baseline_statistics(spec: LeakageEvalSpec, setup: EvalSetup) -> Baseline:
    """The date-only baseline through every protocol of ``spec`` on ``setup``'s draws (market-neutral: leakage-off
    and leakage-on only)."""
    t0 = time.perf_counter()
    X = date_features(setup.date_codes, setup.n_dates)
    cpu = replace(setup, backend=Backend())  # T indicator columns: small matrices, faster in numpy than on a GPU
    codes = setup.date_codes
    return Baseline(target_statistics(spec, cpu, X, setup.y, True, codes),
                    target_statistics(spec, cpu, X, setup.y_neutral, False, codes), time.perf_counter() - t0)


def model_cutoffs(spec: LeakageEvalSpec, models: dict[str, tuple[Path, str]]) -> dict:
    """Knowledge cutoff per model (``datetime.date`` or None): ``models[i].knowledgeCutoff``, or the one the
    model folder's card states (:mod:`pitlab.api.artifacts`) when none was typed. Raises
    :class:`pitlab.api.base.SpecError` at ``spec.models[i].knowledgeCutoff`` when both exist and differ."""
    out = {}
    for i, m in enumerate(spec.models):
        if m.name not in models:
            continue
        path = Path(models[m.name][0])
        card = read_model_card(path)
        out[m.name] = resolve_cutoff(m.knowledge_cutoff, card.knowledge_cutoff if card else None,
                                     f"spec.models[{i}].knowledgeCutoff", f"the model card {path / MODEL_CARD}")
    return out


def embed_model(spec: LeakageEvalSpec, setup: EvalSetup, name: str, path: Path, kind: str, note: StageProgress,
                cache_dir: Path | None = None, num_threads: int | None = None,
                embedded: dict | None = None) -> ModelEmbedding:
    """Embed the panel with one model (a cache hit when an earlier stage of this run embedded it: ``embedded``
    is that stage's ``info``, whose cache hit and seconds are reported)."""
    info: dict = {}
    t = time.perf_counter()
    X = embed_panel(spec, setup.prompts, path, kind, cache_dir=cache_dir, num_threads=num_threads, info=info,
                    progress=lambda d, t: note(f"embed:{name}", d, t))
    seconds = time.perf_counter() - t
    if embedded is not None:  # embedded by an earlier stage of this run: report that stage
        info["cache_hit"] = bool(embedded.get("cache_hit", info["cache_hit"]))
        seconds = float(embedded.get("seconds", seconds))
    return ModelEmbedding(X, info, embedded, seconds)


def evaluate_model(spec: LeakageEvalSpec, setup: EvalSetup, name: str, path: Path, kind: str,
                   note: StageProgress, cache_dir: Path | None = None, num_threads: int | None = None,
                   embedded: dict | None = None, baseline: "Baseline | Future | None" = None,
                   cutoff: dt.date | None = None) -> ModelOutcome:
    """Embed the panel with one model, then its statistics on the raw target (every protocol, embargo
    robustness) and on the market-neutral one (:func:`pitlab.evaluator.targets.model_statistics`), on
    ``setup``'s shared splits and draws, decomposed against the date-only ``baseline`` (computed here if None; a
    Future of one, computed meanwhile on another thread, is awaited only for the decomposition).
    ``embedded``: the ``info`` of an earlier :func:`embed_panel` call for this model in the same run; ``cutoff``:
    its knowledge cutoff (:func:`model_cutoffs`)."""
    baseline = baseline or baseline_statistics(spec, setup)
    emb = embed_model(spec, setup, name, path, kind, note, cache_dir, num_threads, embedded)
    note(f"statistics:{name}", 0, 1)
    t = time.perf_counter()
    raw, neutral = model_statistics(spec, setup, emb.X, setup.y, setup.y_neutral)
    seconds = time.perf_counter() - t
    note(f"statistics:{name}", 1, 1)
    return model_outcome(spec, setup, name, path, emb, (raw, neutral, seconds), baseline, cutoff)


def _protocol_section(spec: LeakageEvalSpec, setup: EvalSetup, n_rows: int) -> dict:
    """``results.protocol``: how each protocol split the panel."""
    proto = spec.protocol
    return {
        "leakage_off": {"method": ChronologicalSplit.description,
                        "calendar": setup.calendar.name, **setup.split.summary()},
        "leakage_on": {"method": "GroupKFold by security over all dates (scikit-learn, no shuffle), pooled "
                                 "out-of-fold R² = 1 - Σ_k SSE_k / Σ_k SST_k, SST_k about fold k's "
                                 "training mean",
                       "n_splits": proto.group_k_folds, "n_rows": n_rows},
        "premium": "r2_on_test_rows - r2_off (both on the leakage-off test rows)",
        "selected": list(proto.protocols),
        **{p: {"method": sp.description, "premium": f"r2_on - r2_{p}", **sp.summary()}
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
                *(["the point estimate lies outside its own interval"] if setup.rule.kind == "percentile" else []),
                (f"the bootstrap bias (mean of replicates − point estimate) exceeds {BIAS_LIMIT:.2f} × "
                 "the bootstrap sd" if setup.rule.kind == "percentile" else
                 "(the bootstrap bias is reported but not a reason under the two-way interval: in the interval "
                 "study flagged panels covered the true premium as often as the others)"),
                f"a point estimate's penalty selection ends at an edge of the α grid after "
                f"{WIDEN_STEPS} widenings of {WIDEN_DECADES} decades"],
            "seed": boot.seed, "shared_draws": True,
            "ci_method": ("t(G−1) × the larger one-way bootstrap sd, centred on the point estimate"
                          if setup.rule.kind == "two-way" else "percentile"),
            "replicates_resampling_securities": setup.rule.n_security if setup.rule.kind == "two-way" else None,
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


def _baseline_section(baseline: Baseline, conf: "IntervalRule | float") -> dict:
    """``results.date_only_baseline``: the baseline's raw and market-neutral numbers and its extra protocols."""
    return {"name": DATE_ONLY, "features": "one indicator column per panel date (identifies the date, nothing else)",
            "raw": target_summary(baseline.raw, conf), "market_neutral": target_summary(baseline.neutral, conf),
            "protocols": baseline.raw.protocols}


def assemble_results(spec: LeakageEvalSpec, panel: Panel, setup: EvalSetup, names: list[str],
                     outcomes: list[ModelOutcome], baseline: Baseline | None = None) -> dict:
    """The results document of the evaluation: every model's entry, the paired premium reductions (overall
    and per extra protocol, on the shared draws), the control by knowledge cutoff, the warnings, and what the
    numbers depend on (spec, versions, device, seed, draws). ``timings`` is left for the caller to fill."""
    premiums = {o.result["name"]: o.result["premium"] for o in outcomes}
    premium_reps = {o.result["name"]: o.replicates["premium"] for o in outcomes}
    model_edges = {o.result["name"]: o.edges for o in outcomes}
    conf = setup.rule
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
    cutoffs = {o.result["name"]: dt.date.fromisoformat(o.result["knowledge_cutoff"])
               if o.result["knowledge_cutoff"] else None for o in outcomes}  # typed or from the model card
    run_warnings += cutoff_warnings(cutoffs, spec.protocol.test_start)
    benchmark = setup.benchmark
    baseline = baseline or baseline_statistics(spec, setup)
    neutral_reductions = paired_reductions(
        names, {o.result["name"]: o.result["market_neutral"]["premium"] for o in outcomes},
        {o.result["name"]: o.replicates["premium_market_neutral"] for o in outcomes}, conf, model_edges)
    robustness = outcomes[0].result["embargo_robustness"] if outcomes else []
    diagnostics = empty_checks(setup.split, setup.extra, robustness, setup.dates, setup.calendar.name)
    diagnostics += unknown_cutoff_checks(cutoffs)
    if setup.rule.kind == "two-way":  # the rule the interval study calibrated
        diagnostics += rows_per_dimension_checks(int(setup.split.n_train),
                                                 {o.result["name"]: o.result["embedding_dim"] for o in outcomes})
        diagnostics += monte_carlo_checks(setup.rule, {
            (o.result["name"], figure): (point, o.replicates[key]) for o in outcomes
            for figure, point, key in (("market-neutral premium", o.result["market_neutral"]["premium"],
                                        "premium_market_neutral"), ("raw premium", o.result["premium"], "premium"),
                                       ("excess premium", o.result["excess"]["premium"], "excess"))})
    run_warnings += [f"{d['protocol']}: {d['message']}" for d in diagnostics]
    return {
        "headline": {"figure": HEADLINE,
                     "why": "the market-neutral premium (target minus its date's cross-sectional mean) is zero "
                            "by construction for features that only recognise the date or the market's "
                            "co-movement, needs no baseline model, and is how the JPX competition scores "
                            "returns; the raw premium is kept beside it for comparability with the published "
                            "recipe's table, with the date-only baseline's part and the excess over it"},
        "date_only_baseline": _baseline_section(baseline, conf),
        "reductions_market_neutral": neutral_reductions,
        "diagnostics": diagnostics,
        "kind": "LeakageEvalResults",
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "benchmark": BENCHMARK_TEXT[benchmark][0],
        "benchmark_key": benchmark,
        "r2_definition": "out-of-sample " + BENCHMARK_TEXT[benchmark][1],
        "protocol": _protocol_section(spec, setup, len(panel.rows)),
        "regression": {"model": "ridge, unpenalised intercept, raw embeddings", "alphas": setup.alphas,
                       **_selection_record(setup), "device": setup.backend.name,
                       "dtype": "float64"},
        "bootstrap": _bootstrap_section(spec, setup),
        "embedding": {**spec.embedding.model_dump(mode="json"),  # the spec's; what each model ran: models[]
                      "pooling_applies_to": "causal models; an encoder pools by mean (each model's pooling: "
                                            "models[].pooling)"},
        "dataset": dict(panel.dataset),
        "panel": panel_summary(panel, setup.calendar),
        "models": [o.result for o in outcomes],
        "reductions": reductions,
        "protocol_reductions": protocol_reductions,
        "cutoff_control": cutoff_control(names, cutoffs, premiums, premium_reps, conf),
        "warnings": run_warnings,
        "versions": versions(),
        "device": device_record(setup.backend),
        "seed": spec.bootstrap.seed,
        "spec": spec.model_dump(mode="json", by_alias=True),
    }


def _evaluate_models(spec: LeakageEvalSpec, setup: EvalSetup, names: list[str], models: dict, note: StageProgress,
                     cache_dir: Path | None, num_threads: int | None, embedded: dict, baseline: "Baseline | Future",
                     cutoffs: dict) -> tuple[list[ModelOutcome], int, float]:
    """Every model's outcome, in ``names`` order: one after the other (:func:`evaluate_model`), or, where
    :func:`pitlab.evaluator.parallel.statistics_processes` says more than one process, every model embedded
    here first and their statistics computed in that many processes at once (the same numbers). Returns the
    outcomes, the number of processes and the wall seconds of the models' statistics."""
    processes = statistics_processes(setup.backend.device, len(names))
    if processes == 1:
        outcomes = [evaluate_model(spec, setup, name, *models[name], note, cache_dir, num_threads,
                                   embedded.get(name), baseline, cutoffs[name]) for name in names]
        return outcomes, 1, sum(o.timings["statistics_s"] for o in outcomes)
    embs = {name: embed_model(spec, setup, name, *models[name], note, cache_dir, num_threads, embedded.get(name))
            for name in names}
    t = time.perf_counter()
    with StatisticsPool(processes) as pool:
        futures = {}
        for name in names:
            note(f"statistics:{name}", 0, 1)
            futures[name] = pool.submit(spec, setup, embs[name].X)
        outcomes = []
        for name in names:
            stats = result_of(futures[name], name)
            note(f"statistics:{name}", 1, 1)
            outcomes.append(model_outcome(spec, setup, name, models[name][0], embs[name], stats, baseline,
                                          cutoffs[name]))
    return outcomes, processes, time.perf_counter() - t


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
    cutoffs = model_cutoffs(spec, models)  # a cutoff contradicting a model card is refused before any work
    with warnings.catch_warnings():  # the splits' warnings are in setup.split.warnings: reported with the results
        warnings.filterwarnings("ignore", message=r"protocol\.embargoDays=", category=UserWarning)
        setup = prepare_evaluation(spec, panel, alpha_selection)
    note(f"statistics:{DATE_ONLY}", 0, 1)
    with ThreadPoolExecutor(1) as pool:
        pending = None
        if setup.backend.library == "torch":  # the models' statistics on the device, the baseline on host CPUs
            pending = pool.submit(baseline_statistics, spec, setup)
            pending.add_done_callback(lambda f: f.exception() or note(f"statistics:{DATE_ONLY}", 1, 1))
        else:
            baseline = baseline_statistics(spec, setup)
            note(f"statistics:{DATE_ONLY}", 1, 1)
        outcomes, processes, models_wall = _evaluate_models(spec, setup, names, models, note, cache_dir,
                                                            num_threads, embedded or {}, pending or baseline,
                                                            cutoffs)
        baseline = pending.result() if pending is not None else baseline
    results = assemble_results(spec, panel, setup, names, outcomes, baseline)
    timings: dict = {"draws_s": setup.draws_s, "date_only_baseline_s": baseline.seconds,
                     "date_only_baseline_overlapped": pending is not None,
                     "models": {o.result["name"]: o.timings for o in outcomes}}
    timings["statistics_s"] = (timings["draws_s"] + (0.0 if pending is not None else baseline.seconds)
                               + sum(m["statistics_s"] for m in timings["models"].values()))
    timings["statistics_processes"] = processes  # the models' statistics, in that many processes at once
    timings["statistics_wall_s"] = (timings["draws_s"] + (0.0 if pending is not None else baseline.seconds)
                                    + models_wall)
    timings["embed_s"] = sum(m["embed_s"] for m in timings["models"].values())
    results["timings"] = timings
    note("report", 0, 1)
    # this call's wall time plus the embedding stage that ran before it in the same run (``embedded``, the local
    # runner's); before the report is written: results.json cannot time itself
    timings["evaluate_s"] = time.perf_counter() - t_all
    timings["total_s"] = timings["evaluate_s"] + sum(t["embed_s"] for n, t in timings["models"].items()
                                                     if n in (embedded or {}))
    clean = write_outputs(results, out_dir, {o.result["name"]: o.replicates for o in outcomes},
                          rows_frame(panel, setup))
    note("report", 1, 1)
    return clean
