"""Run a PitTraining or a LeakageEval on this machine, walking the stage table the operator walks
(:mod:`pitlab.api.stages`) and running each stage's entry point: the prepare and analysis code in this
process, training under ``torchrun`` and the merge as their own processes, as the pods do.

Everything lands in ``<output.uri>/<metadata.name>/``; ``status.json`` holds the phase and Kubernetes-style
conditions exactly as the operator writes them into ``.status``. Each LeakageEval (standalone or a
PitTraining's child) gets its own folder ``<output>/<eval name>/`` with ``status.json`` and ``eval/``.
Nothing left behind looks complete after a failure: status.json says ``Failed`` with the stage's reason and
the message, and ``eval/results.json`` is written last, only on success.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from pitlab import storage
from pitlab.api import (LeakageEval, LeakageEvalSpec, PitTraining, ResourceStatus, SpecError, conditions,
                        dump_resource, layout, resolve_local_path, stages)
from pitlab.api.layout import EvaluationLayout, TrainingLayout
from pitlab.api.runfolders import TRAINING_LABEL, check_run_folders
from pitlab.api.stages import Stage
from pitlab.api.status import CorpusAuditStatus, Progress
from pitlab.api.summary import compact_results, premium_summary
from pitlab.data.types import Panel
from pitlab.errors import StageError
from pitlab.evaluator.inputs import (ModelInput, check_dataset, check_models, check_panel, check_remote_model,
                                     fetch_models)
from pitlab.trainer.files import write_json_atomic
from pitlab.trainer.inputs import CorpusPlan, check_corpus, prepare_run


class RunError(StageError):
    """A stage failed. ``reason`` is the stage's failed reason (CamelCase), set on each instance; ``str()`` is
    the message for users. Exit code 1."""

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

    def running(self, stage: Stage, message: str = "") -> None:
        """``stage``'s condition False with its phase as reason; phase ``stage.phase`` (Reconciling=True)."""
        conditions.stage_running(self.status, stage.condition, stage.phase, stage.phase, message, self.generation)
        self.write()

    def done(self, stage: Stage, message: str = "", reason: str | None = None) -> None:
        """``stage``'s condition True with ``reason`` (default ``stage.done``)."""
        conditions.stage_done(self.status, stage.condition, reason or stage.done, message, self.generation)
        self.write()

    def failed(self, stage: Stage, message: str) -> None:
        """``stage``'s condition False with ``stage.failed``; phase Failed (Stalled=True)."""
        conditions.stage_failed(self.status, stage.condition, stage.failed, message, self.generation)
        self.write()

    def interrupted(self, stage: Stage, message: str) -> None:
        """``stage``'s condition False/Interrupted; phase Interrupted (Stalled=True)."""
        conditions.stage_interrupted(self.status, stage.condition, message, self.generation)
        self.write()

    def succeeded(self, message: str) -> None:
        conditions.succeeded(self.status, stages.SUCCEEDED, message, self.generation)
        self.write()

    def write(self) -> None:
        doc = dump_resource(self.resource)
        doc["status"] = self.status.model_dump(by_alias=True, mode="json", exclude_none=True)
        write_json_atomic(self.path, doc)


# ----------------------------------------------------------------------------------------------------------
# Preflight: everything that can be checked before an output folder exists
# ----------------------------------------------------------------------------------------------------------
@dataclass
class CheckedEvaluation:
    """What :func:`preflight` read for one LeakageEval and its run then uses: the sampled panel and the models
    located (local and packaged folders resolved, published ``s3://`` ones checked, none downloaded yet)."""
    panel: Panel
    models: list[ModelInput]


@dataclass
class Preflight:
    """What :func:`preflight` checked and keeps for the run: the filtered corpus (PitTraining only) and each
    LeakageEval's panel and models (in spec order), so the run does not read them again."""
    corpus: CorpusPlan | None
    evaluations: list[CheckedEvaluation]


def preflight(res: PitTraining | LeakageEval) -> Preflight:
    """Check a resource beyond its schema (files, columns, corpus, models, panel). Returns the filtered corpus
    (a PitTraining's), the sampled panels and the located models. Raises SpecError, CorpusError or PanelError
    with the field, file, row or column."""
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
                check_remote_model(res.spec.base_model.uri, "spec.baseModel.uri")
            else:
                resolve_local_path(res.spec.base_model.uri, "spec.baseModel.uri")
        ri = res.spec.base_model.random_init
        if ri is not None:  # unknown or reserved config keys, values the architecture refuses: before anything runs
            from pitlab.trainer.prepare import build_config

            build_config(ri.model_type, ri.config, vocab_size=res.spec.base_model.tokenizer.vocab_size)
        if res.spec.training.layer_streaming.enabled and not storage.is_s3(res.spec.base_model.uri or ""):
            from pitlab.trainer.plan_streaming import check_spec_fits

            check_spec_fits(res.spec)  # the spec's budget, before anything is written; the trainer checks the GPU
        plan = check_corpus(res)
        evaluations = [_check_evaluation(ev.spec, f"spec.evaluations[{i}].spec", res.metadata.name)
                       for i, ev in enumerate(res.spec.evaluations)]
        return Preflight(plan, evaluations)
    return Preflight(None, [_check_evaluation(res.spec, "spec", None)])


def _check_evaluation(spec: LeakageEvalSpec, field_prefix: str, training_name: str | None) -> CheckedEvaluation:
    """Panel files and their columns, the models, then the sampled panel (the dataset resolved and its headers
    read once)."""
    dataset = check_dataset(spec, field_prefix)
    models = check_models(spec, field_prefix, training_name)
    return CheckedEvaluation(check_panel(spec, field_prefix, dataset), models)


def _claim_run_folders(res: PitTraining | LeakageEval, out_root: Path, overwrite: bool,
                       reporter: Reporter | None = None) -> None:
    """Check every run folder of ``res`` (:func:`pitlab.api.runfolders.check_run_folders`: SpecError naming the
    folder and its owner when one exists without ``overwrite``), then delete the existing ones (``overwrite``),
    so that no folder of an earlier run is left beside the new one looking complete; a reporter with a
    ``deleted(path)`` method is told of each."""
    for path in check_run_folders(res, out_root, overwrite):
        shutil.rmtree(path)
        if hasattr(reporter, "deleted"):
            reporter.deleted(path)


def _prepare_run_dir(out_root: Path, name: str) -> Path:
    run_dir = out_root / name
    run_dir.mkdir(parents=True, exist_ok=True)  # claimed by _claim_run_folders: absent or empty
    return run_dir


def _short(err: BaseException, limit: int = 2000) -> str:
    s = str(err) or type(err).__name__
    return s if len(s) <= limit else s[: limit - 3] + "..."


# ----------------------------------------------------------------------------------------------------------
# Runs: the stage tables, walked
# ----------------------------------------------------------------------------------------------------------
StageStep = Callable[[Any, Stage], None]


class Interrupted(KeyboardInterrupt):
    """``pitlab run`` got SIGINT or SIGTERM (``signal_name``); raised in the main thread, it ends the stage in
    progress (its child processes stopped) with status Interrupted."""

    def __init__(self, signal_name: str = "SIGINT"):
        super().__init__(signal_name)
        self.signal_name = signal_name


def durable_state(run: Any) -> str:
    """What an interrupted run keeps, in words: the last complete training checkpoint (``step-N`` with its path)
    when there is one, else that the stage starts over."""
    res = getattr(run, "res", None)
    if isinstance(res, PitTraining):
        from pitlab.trainer.checkpoint import checkpoint_location
        from pitlab.trainer.checkpointer import latest_checkpoint

        try:
            latest = latest_checkpoint(checkpoint_location(res.spec.checkpoint.uri, run.run_dir))
        except Exception:  # noqa: BLE001 - a message; an unreadable location reads as no checkpoint
            latest = None
        if latest is not None:
            return f"last durable checkpoint: {latest}"
    return "no durable checkpoint: the stage starts over"


def _walk(table: tuple[Stage, ...], steps: dict[str, StageStep], run: Any, st: StatusWriter,
          passthrough: tuple[type[BaseException], ...] = ()) -> None:
    """Run ``steps[stage.name](run, stage)`` for every stage of ``table`` in order. A stage that raises is
    marked failed (``stage.failed`` and the message) and ends the walk with :class:`RunError`; the types in
    ``passthrough`` (bad input found late) are re-raised as they are, after the status says Failed. A
    KeyboardInterrupt (:class:`Interrupted`: SIGINT or SIGTERM) marks the stage and the resource Interrupted,
    naming the last durable checkpoint, and is re-raised."""
    for stage in table:
        try:
            steps[stage.name](run, stage)
        except KeyboardInterrupt as err:
            name = getattr(err, "signal_name", "SIGINT")
            st.interrupted(stage, f"interrupted by {name} during {stage.name}; {durable_state(run)}")
            raise
        except Exception as err:  # noqa: BLE001 - every failure ends in a Failed status with its message
            st.failed(stage, _short(err))
            if isinstance(err, passthrough):
                raise
            raise RunError(stage.failed, _short(err)) from err


@dataclass
class _EvalRun:
    """One LeakageEval being run: what its stages share."""
    res: LeakageEval
    run_dir: Path
    st: StatusWriter
    reporter: Reporter
    checked: CheckedEvaluation
    model_dirs: dict[str, Path] | None
    cache: Path
    models: dict[str, tuple[Path, str]] = field(default_factory=dict)
    embedded: dict[str, dict] = field(default_factory=dict)
    results: dict = field(default_factory=dict)


def _embed(run: _EvalRun, stage: Stage) -> None:
    """Embed the panel's prompts with every model (cached by model digest, settings and prompts)."""
    from pitlab.evaluator.run import embed_panel

    run.models = fetch_models(run.checked.models, run.model_dirs)  # located by the preflight; s3:// downloaded now
    run.st.running(stage, f"embedding the panel's prompts with {len(run.models)} models")
    rows = run.checked.panel.rows
    run.reporter.stage("panel", f"{run.res.spec.dataset.kind} panel")
    run.reporter.done("panel", f"{len(rows):,} rows ({rows.security.nunique()} securities × {rows.date.nunique()} "
                               f"dates), dropped {run.checked.panel.dropped}")
    prompts = rows["prompt"].astype(str).tolist()
    for name, (path, kind) in run.models.items():
        run.reporter.stage(f"embed {name}", str(path))
        info: dict = {}
        run.embedded[name] = info
        X = embed_panel(run.res.spec, prompts, path, kind, cache_dir=run.cache, info=info,
                        progress=lambda d, t, n=name: run.reporter.progress(f"embed {n}", d, t))
        run.reporter.done(f"embed {name}", f"{X.shape[1]}-dim {info.get('kind', kind)} embeddings"
                                           f"{' (cached)' if info.get('cache_hit') else ''}")
    run.st.done(stage, f"{len(run.models)} model(s) embedded")


def _analyze(run: _EvalRun, stage: Stage) -> None:
    """Protocols, clustered bootstrap and report into ``eval/``; the results summary goes to the status."""
    from pitlab.evaluator.decompose import DATE_ONLY
    from pitlab.evaluator.run import run_leakage_eval

    spec, st, models = run.res.spec, run.st, run.models
    st.running(stage, "protocols, clustered bootstrap and report")
    run.reporter.stage("analyze", f"{spec.bootstrap.resamples} bootstrap resamples, {spec.regression.selection} "
                                  "penalty selection")

    names = [DATE_ONLY, *models]  # the baseline's statistics run first

    def progress(task: str, done: int, total: int) -> None:
        if task.startswith("statistics:") and task.split(":", 1)[1] in names:
            run.reporter.progress("analyze", names.index(task.split(":", 1)[1]) + done, len(names))

    out = EvaluationLayout(run.run_dir)
    run.results = run_leakage_eval(spec, run.checked.panel, models, out.eval_dir, progress=progress,
                                   cache_dir=run.cache, embedded=run.embedded)
    run.reporter.done("analyze", str(out.eval_dir))
    st.status.report_uri = str(out.outputs.report)
    st.status.results = compact_results(run.results)
    st.status.premium_summary = premium_summary(st.status.results) or None
    st.done(stage, f"report at {st.status.report_uri}")


EVAL_STEPS: dict[str, StageStep] = {"embed": _embed, "analyze": _analyze}


def run_leakage_eval_local(res: LeakageEval, out_root: Path, reporter: Reporter | None = None,
                           overwrite: bool = False, model_dirs: dict[str, Path] | None = None,
                           checked: CheckedEvaluation | None = None, resume: bool = False) -> dict:
    """Run a LeakageEval into ``out_root/<name>/``; returns the results dict (``eval/results.json``).

    Embedding (every model, cached in ``out_root/.cache/embeddings``) then Analyzing (protocols, bootstrap,
    report), as the embedding Jobs and the analyze Job do on a cluster. ``model_dirs`` maps the names of
    ``trainingRef`` models to their local folders (set by a parent PitTraining). ``checked``: the panel and
    models a preflight already read (the preflight is then not run again). ``resume``: an interrupted run of
    the same spec in ``out_root/<name>`` is run again in its folder (its embeddings come from the cache; a
    succeeded one is returned as it is). Raises a preflight error (nothing written), RunError (status.json then
    says Failed) or :class:`Interrupted`.
    """
    reporter = reporter or SilentReporter()
    if checked is None:
        checked = preflight(res).evaluations[0]
    if resume:
        from pitlab.resume import resumable_status

        resumable_status(res, out_root)
        done = _succeeded_results(out_root / res.metadata.name)
        if done is not None:
            return done
        overwrite = True  # its own folder, checked: the interrupted attempt's files go
    _claim_run_folders(res, out_root, overwrite, reporter)
    run_dir = _prepare_run_dir(out_root, res.metadata.name)
    st = StatusWriter(EvaluationLayout(run_dir).status, res)
    st.done(stages.VALIDATE, "spec is valid")
    run = _EvalRun(res, run_dir, st, reporter, checked, model_dirs, out_root / ".cache" / layout.EMBEDDINGS)
    _walk(stages.LEAKAGEEVAL[1:], EVAL_STEPS, run, st)
    st.succeeded(st.status.premium_summary or "evaluation complete")
    return run.results


@dataclass
class _TrainingRun:
    """One PitTraining being run: what its stages share."""
    res: PitTraining
    out_root: Path
    run_dir: Path
    st: StatusWriter
    reporter: Reporter
    checked: Preflight
    nproc: int
    base_dir: Path | None = None
    resume: bool = False


def _prepare(run: _TrainingRun, stage: Stage) -> None:
    """The tokenizer, the base model and the packed tokens from the corpus the preflight filtered."""
    st = run.st
    st.running(stage, "filtering the corpus, training the tokenizer")
    run.reporter.stage("prepare", "tokenizer + base model + packed tokens")
    run.base_dir, n_tokens = prepare_run(run.res, run.checked.corpus, run.run_dir)
    a = run.checked.corpus.audit
    st.status.corpus_audit = CorpusAuditStatus(included=a.included, excluded_by_date=a.excluded_by_date,
                                               rejected_timestamp=a.rejected_timestamp,
                                               rejected_empty_text=a.rejected_empty_text,
                                               max_included_timestamp=a.max_included_timestamp,
                                               included_ids_sha256=a.included_ids_sha256,
                                               timestamp_format=a.timestamp_format, warnings=a.warnings or None)
    st.done(stage, f"{a.included} documents kept, {a.excluded_by_date} after the cutoff, {a.rejected_empty_text} "
                   f"dropped for an empty text, {a.rejected_timestamp} "
                   f"rejected for their timestamp; {n_tokens} tokens")
    run.reporter.done("prepare", f"{n_tokens:,} corpus tokens")


def _train(run: _TrainingRun, stage: Stage) -> None:
    """``torchrun`` with ``nproc`` ranks (:func:`pitlab.trainer.launch.run_training`), its metrics followed."""
    from pitlab.trainer.launch import run_training

    st, n = run.st, run.nproc
    st.running(stage, f"torchrun, {n} processes")
    run.reporter.stage("train", f"torchrun, {n} process{'es' if n != 1 else ''}, "
                       f"{'layer streaming' if run.res.spec.training.layer_streaming.enabled else 'FSDP2'}")
    last_write = [0.0]
    warned = [False]

    def on_step(m: dict) -> None:
        if m.get("kernel_warning") and not warned[0]:  # a GPU run on reference kernels: say so in the status
            warned[0] = True
            st.running(stage, f"torchrun, {n} processes; WARNING: {m['kernel_warning']}")
        st.status.progress = Progress(step=m["step"], total_steps=m.get("total_steps"), loss=m.get("loss"),
                                      tokens_per_second=m.get("mean_tokens_per_second"))
        run.reporter.progress("train", m["step"], m.get("total_steps") or m["step"],
                              f"loss {m.get('loss', float('nan')):.3f}")
        if time.monotonic() - last_write[0] > 2 or m["step"] == m.get("total_steps"):
            last_write[0] = time.monotonic()
            st.write()

    paths = TrainingLayout(run.run_dir)
    summary = run_training(paths.spec, run.run_dir, n, on_step=on_step, base=run.base_dir)
    st.status.checkpoint_uri = str(summary.get("checkpoint", paths.checkpoint))
    tps = summary.get("mean_tokens_per_second")
    trained = (f"{summary['steps']} steps, loss {summary['first_loss']:.3f} → {summary['final_loss']:.3f}"
               + (f", {tps:,.0f} tokens/s (mean over the run)" if tps is not None else "")
               + (f"; WARNING: {summary['kernel_warning']}" if summary.get("kernel_warning") else ""))
    st.done(stage, trained)
    run.reporter.done("train", trained)


def _merge(run: _TrainingRun, stage: Stage) -> None:
    """The merge as its own process, verified against the trainer's summary."""
    st = run.st
    st.running(stage, "single-process merge of the DCP checkpoint")
    run.reporter.stage("merge", "DCP → Hugging Face safetensors (separate process)")
    ckpt = st.status.checkpoint_uri
    paths = TrainingLayout(run.run_dir)
    merge = run_merge(ckpt if storage.is_s3(ckpt) else Path(ckpt), run.base_dir, paths.model, summary=paths.summary)
    st.status.model_uri = str(paths.model)
    st.done(stage, f"model written to {st.status.model_uri}")
    probe = {"equal": "probe logits equal", "close": "probe logits within tolerance"}.get(
        merge.get("logits_probe"), "every tensor compared")
    run.reporter.done("merge", f"{merge.get('kind', 'full')}: {merge.get('tensors')} tensors in "
                               f"{merge.get('shards', 1)} shard(s), {merge.get('bytes', 0) / 1e6:.1f} MB, verified "
                               f"({probe})")


def _evaluate(run: _TrainingRun, stage: Stage) -> None:
    """One LeakageEval per ``spec.evaluations`` entry, on the panels and models the preflight read."""
    res, st = run.res, run.st
    if not res.spec.evaluations:
        st.done(stage, "spec.evaluations is empty", reason=stage.empty)
        return
    st.running(stage, f"{len(res.spec.evaluations)} LeakageEval(s)")
    dirs = {"base": run.base_dir, "model": TrainingLayout(run.run_dir).model}
    results = {}
    for tmpl, checked in zip(res.spec.evaluations, run.checked.evaluations):
        child = LeakageEval(metadata={"name": tmpl.name, "labels": {TRAINING_LABEL: res.metadata.name}},
                            spec=tmpl.spec)
        st.status.children[f"leakageeval/{tmpl.name}"] = str(run.out_root / tmpl.name)
        model_dirs = {m.name: dirs[m.training_ref.artifact] for m in tmpl.spec.models if m.training_ref}
        done = _succeeded_results(run.out_root / tmpl.name) if run.resume else None
        # its folder was claimed (checked, and emptied with --overwrite) before the training started; a resume
        # keeps a succeeded evaluation and runs an unfinished one again in its own folder
        out = done if done is not None else run_leakage_eval_local(
            child, run.out_root, run.reporter, overwrite=run.resume, model_dirs=model_dirs, checked=checked)
        results[tmpl.name] = compact_results(out)
    st.status.results = results
    st.done(stage, f"{len(results)} LeakageEval(s) succeeded")


def _succeeded_results(run_dir: Path) -> dict | None:
    """``eval/results.json`` of an evaluation folder whose status says Succeeded, else None."""
    try:
        paths = EvaluationLayout(run_dir)
        phase = json.loads(paths.status.read_text())["status"]["phase"]
        return json.loads(paths.outputs.results.read_text()) if phase == stages.SUCCEEDED else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


TRAINING_STEPS: dict[str, StageStep] = {"prepare": _prepare, "train": _train, "merge": _merge,
                                        "evaluate": _evaluate}


def run_pittraining_local(res: PitTraining, out_root: Path, reporter: Reporter | None = None,
                          overwrite: bool = False, nproc: int | None = None, resume: bool = False) -> dict:
    """Run a PitTraining and its evaluations into ``out_root``; returns the final status.json document.

    Stages and conditions are the operator's (:data:`pitlab.api.stages.PITTRAINING`). ``resume``: continue the
    run in ``out_root/<name>`` from its first stage not done (:mod:`pitlab.resume`; SpecError when the spec or
    the kept corpus changed). Raises a preflight error (SpecError/CorpusError/PanelError; nothing written), the
    SpecError of bad input found late (status.json says Failed), RunError (status.json says Failed with the
    stage's reason and message) or :class:`Interrupted` (status.json says Interrupted).
    """
    reporter = reporter or SilentReporter()
    reporter.stage("validate", "schema, files, corpus, panel, models")
    checked = preflight(res)
    a = checked.corpus.audit
    reporter.done("validate", f"corpus: {a.included} documents ≤ {res.spec.knowledge_cutoff}, {a.excluded_by_date} "
                              f"after it, {a.rejected_timestamp} dropped for their timestamp"
                              + "".join(f"\n  warning: {w}" for w in a.warnings))
    table = stages.PITTRAINING[1:]
    if resume:
        from pitlab.resume import base_folder, check_same_corpus, resumable_status

        status = resumable_status(res, out_root)
        check_same_corpus(res, status, a)
        run_dir = out_root / res.metadata.name
        st = StatusWriter(TrainingLayout(run_dir).status, res, status)
        if status.phase == stages.SUCCEEDED:
            return json.loads(st.path.read_text())
        table = tuple(s for s in table if not conditions.is_true(status, s.condition))
    else:
        _claim_run_folders(res, out_root, overwrite, reporter)  # the evaluations' folders too: none is replaced unasked
        run_dir = _prepare_run_dir(out_root, res.metadata.name)
        st = StatusWriter(TrainingLayout(run_dir).status, res)
        st.done(stages.VALIDATE, "spec is valid")
    run = _TrainingRun(res, out_root, run_dir, st, reporter, checked, nproc or res.spec.resources.gpus_per_node,
                       resume=resume)
    if resume and conditions.is_true(st.status, stages.PREPARE.condition):
        run.base_dir = base_folder(res, run_dir)
        reporter.done("prepare", f"done before the interruption ({run.base_dir})")
    _walk(table, TRAINING_STEPS, run, st, passthrough=(SpecError,))
    st.succeeded(f"model at {st.status.model_uri}")
    return json.loads(st.path.read_text())


def run_merge(checkpoint: Path | str, base_dir: Path | str, out_dir: Path | str, summary: Path | None = None) -> dict:
    """Run the merge as its own process (``pitlab merge``: :func:`pitlab.trainer.merge.merge_uris`), as the merge
    Job does.

    With ``summary`` (the trainer's summary.json) the merged weights must also match its ``param_sha256``.
    ``checkpoint``, ``base_dir`` and ``out_dir`` may be ``s3://`` URIs (an S3 output is published with
    its manifest and ``_COMPLETE``). Returns ``merge_report.json``.
    """
    cmd = [sys.executable, "-m", "pitlab.cli", "merge", "--checkpoint", str(checkpoint), "--base", str(base_dir),
           "--out", str(out_dir)] + (["--summary", str(summary)] if summary else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"merge exited with code {proc.returncode}:\n{tail}")
    return json.loads(storage.read_text(storage.join(out_dir, layout.MERGE_REPORT)))


# ----------------------------------------------------------------------------------------------------------
# output.uri: s3://
# ----------------------------------------------------------------------------------------------------------
PUBLISHED_SUBDIRS = (layout.MODEL, layout.BASE, layout.EVAL)  # each published on its own: usable as a model / read as a whole
UNPUBLISHED_SKIP = (layout.CHECKPOINT, layout.DATA)  # checkpoints follow spec.checkpoint.uri; packed tokens stay local


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
    status = files.pop(layout.STATUS, None)
    storage.upload_files(files, uri)
    if status is not None:
        storage.upload_file(status, storage.join(uri, layout.STATUS))
    return written + [str(storage.join(uri, k)) for k in files] + ([str(storage.join(uri, layout.STATUS))]
                                                                    if status is not None else [])
