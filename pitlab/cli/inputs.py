"""What the commands read before they work: the spec (a bad one exits 2), ``--data-root``, s3:// arguments, and
the notes printed about a valid spec (its corpus audit, its warnings)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from pitlab.api import DATA_ROOT_ENV, LeakageEval, SpecError, load_resource
from pitlab.cli.errors import fail
from pitlab.cli.output import say
from pitlab.trainer.knobs import check_knobs

DataRoot = typer.Option(None, "--data-root", envvar=DATA_ROOT_ENV,
                        help=f"Folder of the shared data sets, substituted for ${{{DATA_ROOT_ENV}}} in spec URIs.")


def load(path: Path, data_root: Optional[Path]):
    """The PitTraining or LeakageEval in ``path`` (``data_root`` exported for its URIs); exit 2 if invalid, or if
    a PitTraining would meet a trainer setting of the environment it refuses
    (:func:`pitlab.trainer.knobs.check_knobs`)."""
    if data_root is not None:
        os.environ[DATA_ROOT_ENV] = str(data_root)
    try:
        res = load_resource(path)
        if res.kind == "PitTraining":
            check_knobs()
        return res
    except SpecError as err:
        fail(err, 2)


def load_eval(spec: Path, data_root: Optional[Path]) -> LeakageEval:
    """:func:`load`, refusing (exit 2) anything but a LeakageEval."""
    res = load(spec, data_root)
    if not isinstance(res, LeakageEval):
        fail(f"{spec}: kind {res.kind}: this command takes a LeakageEval", 2)
    return res


def check_uri(field: str, value: str) -> None:
    """Refuse (exit 2) an ``s3://`` argument that is not a valid bucket/prefix, naming ``field``."""
    from pitlab import storage

    if storage.is_s3(str(value)):
        try:
            storage.parse_s3(str(value))
        except storage.StorageError as err:
            fail(SpecError([(field, str(err))]), 2)


def say_audit_notes(audit) -> None:
    """Print a corpus audit's warnings and its first refused timestamps (dropped with onMissingTimestamp: drop)."""
    for w in audit.warnings:
        say(f"[yellow]warning:[/] {escape(w)}")
    for x in audit.rejected_timestamp_examples:
        say(f"  dropped row {x['row']} (id {x['id']!r}): {escape(x['error'])}")


def say_spec_warnings(res, nproc: int | None = None) -> None:
    """Print the warnings about a valid spec (a LeakageEval's, or a PitTraining's evaluations', token budget and
    warmup; ``nproc``: the processes ``pitlab run --nproc`` starts instead of ``spec.resources``')."""
    from pitlab.api.leakageeval import LeakageEvalSpec, spec_warnings

    specs = [("spec", res.spec)] if isinstance(res.spec, LeakageEvalSpec) else \
        [(f"spec.evaluations[{i}].spec", e.spec) for i, e in enumerate(getattr(res.spec, "evaluations", []))]
    for where, spec in specs:
        for w in spec_warnings(spec):
            say(f"[yellow]warning:[/] {where}.{escape(w)}")
    if hasattr(res.spec, "tokens"):
        for w in (token_budget_warning(res.spec, nproc), warmup_warning(res.spec, nproc),
                  unused_fused_optimizer_warning(res.spec)):
            if w:
                say(f"[yellow]warning:[/] {escape(w)}")


def _steps(spec, nproc: int | None) -> tuple[int, int, int]:
    """(training processes, tokens per optimizer step, optimizer steps) of a PitTraining spec (``nproc``: as
    ``pitlab run --nproc``); the steps as :func:`pitlab.trainer.data.steps_for_budget` counts them."""
    tr, r = spec.training, spec.resources
    world = nproc or r.nodes * r.gpus_per_node
    return world, tr.seq_len * tr.micro_batch_size * tr.gradient_accumulation_steps * world, spec.optimizer_steps(world)


def warmup_warning(spec, nproc: int | None = None) -> str | None:
    """A PitTraining whose ``training.warmupSteps`` is not below its optimizer steps: the learning rate never
    reaches ``learningRate`` (a trial's 5,000 warmup steps in a 49-step run ended at 1 % of it); None otherwise."""
    tr = spec.training
    world, step, steps = _steps(spec, nproc)
    if tr.warmup_steps < steps:
        return None
    return (f"spec.training.warmupSteps: {tr.warmup_steps:,} is not below the run's {steps:,} optimizer step"
            f"{'s' if steps > 1 else ''} ({spec.tokens:,} tokens, {step:,} per step with {world} process"
            f"{'es' if world > 1 else ''}): the learning rate warms up for the whole run and ends at "
            f"{steps / tr.warmup_steps:.0%} of learningRate {tr.learning_rate:g}; lower warmupSteps below {steps:,}")


def unused_fused_optimizer_warning(spec) -> str | None:
    """A PitTraining that asks for ``fusedOptimizer: true`` with layer streaming, which keeps torch's AdamW (the
    field then has no effect); None otherwise."""
    tr = spec.training
    if tr.fused_optimizer and tr.layer_streaming.enabled:
        return ("spec.training.fusedOptimizer: true has no effect with spec.training.layerStreaming (streamed "
                "training steps with torch's AdamW); remove it, or turn layer streaming off")
    return None


def token_budget_warning(spec, nproc: int | None = None) -> str | None:
    """A PitTraining whose ``tokens`` the whole optimizer steps exceed by 10 % or more (a budget below one
    step: ``tokens: 10`` trains 2,048): what the run will train instead; None otherwise."""
    world, step, steps = _steps(spec, nproc)
    if steps * step < 1.1 * spec.tokens:
        return None
    return (f"spec.tokens: {spec.tokens:,} tokens round up to {steps:,} optimizer step{'s' if steps > 1 else ''} of "
            f"{step:,} tokens (seqLen × microBatchSize × gradientAccumulationSteps × {world} GPU"
            f"{'s' if world > 1 else ''}): the run trains {steps * step:,} tokens")


def base_model_positions_warning(res) -> str | None:
    """A PitTraining's local ``baseModel.uri`` whose config.json gives a ``max_position_embeddings`` (its
    ``text_config``'s for a multimodal model) smaller than ``spec.training.seqLen``: the warning naming both, else
    None. A warning, not a refusal: training a pretrained model past its context (context extension) is a choice;
    a ``randomInit`` config is refused at loading instead. An ``s3://`` model is not read here (that would download
    it), nor is a missing or unreadable config.json (the preflight reports it)."""
    import json

    from pitlab import storage
    from pitlab.api import PitTraining, resolve_local_path
    from pitlab.api.model_config import config_max_positions, max_positions_problem

    if not isinstance(res, PitTraining) or res.spec.base_model.uri is None or storage.is_s3(res.spec.base_model.uri):
        return None
    config_path = resolve_local_path(res.spec.base_model.uri, "spec.baseModel.uri", must_exist=False) / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    positions = config_max_positions(config) if isinstance(config, dict) else None
    problem = max_positions_problem(positions, res.spec.training.seq_len,
                                    f"its config.json gives max_position_embeddings {positions}, which")
    return f"spec.baseModel.uri: {problem}; unless you mean to extend its context, set spec.training.seqLen to " \
           f"{positions} or less" if problem else None


def say_base_model_warning(res) -> None:
    """Print :func:`base_model_positions_warning` of ``res`` when there is one (``validate`` and ``run``)."""
    w = base_model_positions_warning(res)
    if w:
        say(f"[yellow]warning:[/] {escape(w)}")


def say_run_warnings(res, nproc: int | None) -> None:
    """What ``pitlab run`` says before it starts: :func:`say_spec_warnings`, :func:`say_oversubscribed` (a
    PitTraining) and :func:`say_base_model_warning`."""
    from pitlab.api import PitTraining

    say_spec_warnings(res, nproc)
    if isinstance(res, PitTraining):
        say_oversubscribed(nproc or res.spec.resources.gpus_per_node, nproc is not None)
    say_base_model_warning(res)


def say_oversubscribed(n: int, flag: bool) -> None:
    """A note when the ``n`` training processes would share fewer CPU cores on a machine without a GPU (a spec
    written for an 8-GPU node, run here): they run, time-shared, and the token budget spans fewer steps."""
    cores = os.cpu_count() or 1
    if n <= cores or _has_gpu():
        return
    source = "--nproc" if flag else "spec.resources.gpusPerNode"
    say(f"  note: {source} starts {n} training processes on {cores} CPU cores and no GPU: they share the cores; "
        f"--nproc {cores} runs {cores} (the same spec.tokens in more, smaller optimizer steps)")


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
