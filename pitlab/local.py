"""Run a PitTraining or a LeakageEval on this machine, walking the stage table the operator walks
(:mod:`pitlab.api.stages`) and calling each stage module's ``run`` (:mod:`pitlab.pipeline`): the prepare and
analysis code in this process, training under ``torchrun`` and the merge as their own processes, as the pods do.
This module is the executor only (preflight, run folders, the walk, publishing); it defines no stage step.

Everything lands in ``<output.uri>/<metadata.name>/``; ``status.json`` holds the phase and Kubernetes-style
conditions exactly as the operator writes them into ``.status``. Each LeakageEval (standalone or a
PitTraining's child) gets its own folder ``<output>/<eval name>/`` with ``status.json`` and ``eval/``.
Nothing left behind looks complete after a failure: status.json says ``Failed`` with the stage's reason and
the message, and ``eval/results.json`` is written last, only on success.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitlab import pipeline, storage
from pitlab.api import (LeakageEval, LeakageEvalSpec, PitTraining, SpecError, conditions, layout, resolve_local_path,
                        stages)
from pitlab.api.artifacts import cutoff_warnings
from pitlab.api.layout import EvaluationLayout, TrainingLayout
from pitlab.api.runfolders import check_run_folders
from pitlab.api.stages import Stage
from pitlab.data.types import Panel
from pitlab.errors import StageError
from pitlab.evaluator.inputs import ModelInput, check_dataset, check_models, check_panel, check_remote_model
from pitlab.pipeline.base import EvalRun, Reporter, SilentReporter, StatusWriter, TrainingRun  # noqa: F401
from pitlab.pipeline.evaluate import succeeded_results
from pitlab.pipeline.merge import run_merge  # noqa: F401 - `pitlab run`'s merge, where callers import it from
from pitlab.trainer.inputs import CorpusPlan, check_corpus


class RunError(StageError):
    """A stage failed. ``reason`` is the stage's failed reason (CamelCase), set on each instance; ``str()`` is
    the message for users. Exit code 1."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


# ----------------------------------------------------------------------------------------------------------
# Preflight: everything that can be checked before an output folder exists
# ----------------------------------------------------------------------------------------------------------
@dataclass
class CheckedEvaluation:
    """What :func:`preflight` read for one LeakageEval and its run then uses: the sampled panel and the models
    located (local and packaged folders resolved, published ``s3://`` ones checked, none downloaded yet)."""
    panel: Panel
    models: list[ModelInput]
    warnings: list[str] = field(default_factory=list)
    """What the run will warn about, known now: the protocols' (training labels overlapping the test period) and
    a model whose knowledge cutoff (typed or its card's) is on or after ``protocol.testStart``."""


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
            from pitlab.trainer.prepare import build_config, check_model_builds

            config = build_config(ri.model_type, ri.config, vocab_size=res.spec.base_model.tokenizer.vocab_size)
            meta = check_model_builds(ri.model_type, config)
        else:
            config, meta = _local_base_config(res.spec.base_model.uri), None
        if res.spec.lora is not None and config is not None:  # peft skips a target that names nothing
            from pitlab.trainer.prepare import check_lora_targets

            check_lora_targets(config, list(res.spec.lora.target_modules), meta)
        if res.spec.training.layer_streaming.enabled and not storage.is_s3(res.spec.base_model.uri or ""):
            from pitlab.trainer.plan_streaming import check_spec_fits

            check_spec_fits(res.spec)  # the spec's budget, before anything is written; the trainer checks the GPU
        elif config is not None:  # the memory plan against spec.resources.gpuMemoryGiB, likewise
            from pitlab.trainer.inputs import check_memory

            check_memory(res.spec, config)
        plan = check_corpus(res)
        evaluations = [_check_evaluation(ev.spec, f"spec.evaluations[{i}].spec", res.metadata.name)
                       for i, ev in enumerate(res.spec.evaluations)]
        return Preflight(plan, evaluations)
    return Preflight(None, [_check_evaluation(res.spec, "spec", None)])


def _local_base_config(uri: str | None):
    """The config of a local base model folder (``spec.baseModel.uri``), or None for an ``s3://`` or ``package://``
    model or a folder without a readable config.json (the prepare stage reports those)."""
    if not uri or "://" in uri.replace("file://", "", 1):
        return None
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(resolve_local_path(uri, "spec.baseModel.uri")), local_files_only=True)
    except (OSError, ValueError, KeyError):
        return None


def _check_evaluation(spec: LeakageEvalSpec, field_prefix: str, training_name: str | None) -> CheckedEvaluation:
    """Panel files and their columns, the models, then the sampled panel (the dataset resolved and its headers
    read once)."""
    dataset = check_dataset(spec, field_prefix)
    models = check_models(spec, field_prefix, training_name)
    panel, protocol_warnings = check_panel(spec, field_prefix, dataset)
    cutoffs = {m.name: m.knowledge_cutoff for m in models}
    return CheckedEvaluation(panel, models, protocol_warnings + cutoff_warnings(cutoffs, spec.protocol.test_start))


def _claim_run_folders(res: PitTraining | LeakageEval, out_root: Path, overwrite: bool,
                       reporter: Reporter | None = None, keep_replaced: bool = False) -> None:
    """Check every run folder of ``res`` (:func:`pitlab.api.runfolders.check_run_folders`: SpecError naming the
    folder and its owner when one exists without ``overwrite``), then clear the existing ones (``overwrite``), so
    that no folder of an earlier run is left beside the new one looking complete: ``keep_replaced`` moves each to
    ``<out_root>/.replaced/`` (:func:`pitlab.api.runfolders.set_aside`; the reporter's ``set_aside(path, kept)``
    is told), else it is deleted (the reporter's ``deleted(path)``). A folder that cannot be renamed is deleted."""
    from pitlab.api.runfolders import set_aside

    for path in check_run_folders(res, out_root, overwrite):
        if keep_replaced:
            try:
                kept = set_aside(path, out_root)
            except OSError:
                kept = None
            if kept is not None:
                if hasattr(reporter, "set_aside"):
                    reporter.set_aside(path, kept)
                continue
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
class Interrupted(KeyboardInterrupt):
    """``pitlab run`` got SIGINT or SIGTERM (``signal_name``); raised in the main thread, it ends the stage in
    progress (its child processes stopped) with status Interrupted."""

    def __init__(self, signal_name: str = "SIGINT"):
        super().__init__(signal_name)
        self.signal_name = signal_name


def durable_state(run: Any) -> str:
    """What an interrupted run keeps, in words: the last complete training checkpoint (``step-N`` with its path)
    when there is one, else that the stage starts over (and, for a training that saves only at its end,
    ``checkpoint.everySteps: 0``, how to make it resumable)."""
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
        if not res.spec.checkpoint.every_steps:
            return ("no durable checkpoint: the stage starts over (checkpoint.everySteps: 0 saves only at the "
                    "end; set it to N for a checkpoint every N steps that --resume continues from)")
    return "no durable checkpoint: the stage starts over"


def _walk(table: tuple[Stage, ...], run: Any, st: StatusWriter,
          passthrough: tuple[type[BaseException], ...] = ()) -> None:
    """Run the stage module's ``run(run, stage)`` (:mod:`pitlab.pipeline`) for every stage of ``table`` in order.
    A stage that raises is marked failed (``stage.failed`` and the message) and ends the walk with
    :class:`RunError`; the types in ``passthrough`` (bad input found late) are re-raised as they are, after the
    status says Failed. A KeyboardInterrupt (:class:`Interrupted`: SIGINT or SIGTERM) marks the stage and the resource Interrupted,
    naming the last durable checkpoint, and is re-raised."""
    for stage in table:
        try:
            pipeline.step(stage).run(run, stage)
        except KeyboardInterrupt as err:
            name = getattr(err, "signal_name", "SIGINT")
            st.interrupted(stage, f"interrupted by {name} during {stage.name}; {durable_state(run)}")
            raise
        except Exception as err:  # noqa: BLE001 - every failure ends in a Failed status with its message
            st.failed(stage, _short(err))
            if isinstance(err, passthrough):
                raise
            raise RunError(stage.failed, _short(err)) from err


def run_leakage_eval_local(res: LeakageEval, out_root: Path, reporter: Reporter | None = None,
                           overwrite: bool = False, model_dirs: dict[str, Path] | None = None,
                           checked: CheckedEvaluation | None = None, resume: bool = False,
                           keep_replaced: bool = False) -> dict:
    """Run a LeakageEval into ``out_root/<name>/``; returns the results dict (``eval/results.json``).

    Embedding (every model, cached in ``out_root/.cache/embeddings``) then Analyzing (protocols, bootstrap,
    report), as the embedding Jobs and the analyze Job do on a cluster. ``model_dirs`` maps the names of
    ``trainingRef`` models to their local folders (set by a parent PitTraining). ``checked``: the panel and
    models a preflight already read (the preflight is then not run again). ``resume``: an interrupted run of
    the same spec in ``out_root/<name>`` is run again in its folder (its embeddings come from the cache; a
    succeeded one is returned as it is). ``keep_replaced``: a folder ``overwrite`` replaces is moved to
    ``out_root/.replaced/`` instead of deleted (the caller deletes it once the run succeeded). Raises a preflight
    error (nothing written), RunError (status.json then says Failed) or :class:`Interrupted`.
    """
    reporter = reporter or SilentReporter()
    if checked is None:
        checked = preflight(res).evaluations[0]
    if resume:
        from pitlab.resume import resumable_status

        resumable_status(res, out_root)
        done = succeeded_results(out_root / res.metadata.name)
        if done is not None:
            return done
        overwrite, keep_replaced = True, False  # its own folder, checked: the interrupted attempt's files go
    _claim_run_folders(res, out_root, overwrite, reporter, keep_replaced)
    run_dir = _prepare_run_dir(out_root, res.metadata.name)
    st = StatusWriter(EvaluationLayout(run_dir).status, res)
    st.done(stages.VALIDATE, "spec is valid")
    run = EvalRun(res, run_dir, st, reporter, checked, model_dirs, out_root / ".cache" / layout.EMBEDDINGS)
    _walk(stages.LEAKAGEEVAL[1:], run, st)
    st.succeeded(st.status.premium_summary or "evaluation complete")
    return run.results


def run_pittraining_local(res: PitTraining, out_root: Path, reporter: Reporter | None = None,
                          overwrite: bool = False, nproc: int | None = None, resume: bool = False,
                          keep_replaced: bool = False) -> dict:
    """Run a PitTraining and its evaluations into ``out_root``; returns the final status.json document.

    Stages and conditions are the operator's (:data:`pitlab.api.stages.PITTRAINING`). ``resume``: continue the
    run in ``out_root/<name>`` from its first stage not done (:mod:`pitlab.resume`; SpecError when the spec or
    the kept corpus changed). ``keep_replaced``: as for :func:`run_leakage_eval_local`. Raises a preflight error
    (SpecError/CorpusError/PanelError; nothing written), the
    SpecError of bad input found late (status.json says Failed), RunError (status.json says Failed with the
    stage's reason and message) or :class:`Interrupted` (status.json says Interrupted).
    """
    reporter = reporter or SilentReporter()
    reporter.stage("validate", "schema, files, corpus, panel, models")
    checked = preflight(res)
    a = checked.corpus.audit
    reporter.done("validate", f"corpus: {a.included} documents ≤ {res.spec.knowledge_cutoff}, {a.excluded_by_date} "
                              f"after it, {a.rejected_timestamp} dropped for their timestamp"
                              + "".join(f"\n  warning: {w}" for w in a.warnings)
                              + "".join(f"\n  warning: evaluation {e.name}: {w}"
                                        for e, c in zip(res.spec.evaluations, checked.evaluations)
                                        for w in c.warnings))
    table = stages.PITTRAINING[1:]
    if resume:
        from pitlab.resume import base_folder, check_same_corpus, check_world_size, resumable_status

        status = resumable_status(res, out_root)
        check_same_corpus(res, status, a)
        run_dir = out_root / res.metadata.name
        check_world_size(res, run_dir, nproc or res.spec.resources.gpus_per_node, nproc is not None)
        st = StatusWriter(TrainingLayout(run_dir).status, res, status)
        if status.phase == stages.SUCCEEDED:
            return json.loads(st.path.read_text())
        table = tuple(s for s in table if not conditions.is_true(status, s.condition))
    else:
        # the evaluations' folders too: none is replaced unasked
        _claim_run_folders(res, out_root, overwrite, reporter, keep_replaced)
        run_dir = _prepare_run_dir(out_root, res.metadata.name)
        st = StatusWriter(TrainingLayout(run_dir).status, res)
        st.done(stages.VALIDATE, "spec is valid")
    run = TrainingRun(res, out_root, run_dir, st, reporter, checked, nproc or res.spec.resources.gpus_per_node,
                      run_leakage_eval_local, resume=resume)
    if resume and conditions.is_true(st.status, stages.PREPARE.condition):
        run.base_dir = base_folder(res, run_dir)
        reporter.done("prepare", f"done before the interruption ({run.base_dir})")
    _walk(table, run, st, passthrough=(SpecError,))
    st.succeeded(f"model at {st.status.model_uri}")
    return json.loads(st.path.read_text())


# ----------------------------------------------------------------------------------------------------------
# output.uri: s3://
# ----------------------------------------------------------------------------------------------------------
# each published on its own: usable as a model / read as a whole
PUBLISHED_SUBDIRS = (layout.MODEL, layout.BASE, layout.EVAL)
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
