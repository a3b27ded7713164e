"""The training's commands: the prepare Job's and the PyTorchJob's entry points (``prepare``, ``train``) and the
memory plan (``plan``, exit 3 when the run does not fit)."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from pitlab.api import PitTraining, SpecError
from pitlab.api.layout import TrainingLayout
from pitlab.cli.errors import fail
from pitlab.cli.inputs import DataRoot, load, say_audit_notes
from pitlab.cli.output import say
from pitlab.errors import InputError


def prepare(spec: Path = typer.Option(..., "--spec", help="PitTraining as YAML or JSON."),
            run_dir: Path = typer.Option(..., "--run-dir", help="Run folder to write base/, data/, spec.json into."),
            data_root: Optional[Path] = DataRoot) -> None:
    """Filter the corpus to the knowledge cutoff, train the tokenizer, write the base model and packed tokens
    (the prepare Job's entry point; `pitlab run` does the same before training); exit 2 when the memory plan
    exceeds spec.resources.gpuMemoryGiB, before the training's GPUs are asked for."""
    from transformers import AutoConfig

    from pitlab.trainer.files import write_json_atomic
    from pitlab.trainer.inputs import check_corpus, check_memory, prepare_run
    from pitlab.trainer.plan import spec_config

    res = load(spec, data_root)
    if not isinstance(res, PitTraining):
        fail(f"{spec}: kind {res.kind}: `pitlab prepare` takes a PitTraining", 2)
    try:
        try:  # randomInit or a local folder: before the corpus is read; an s3:// model once it is downloaded
            config = spec_config(res.spec)
        except SpecError:
            config = None
        if config is not None:
            check_memory(res.spec, config)
        plan = check_corpus(res)
        say_audit_notes(plan.audit)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(TrainingLayout(run_dir).corpus_audit, plan.audit.to_dict())
        base_dir, n_tokens = prepare_run(res, plan, run_dir)
        if config is None:
            check_memory(res.spec, AutoConfig.from_pretrained(base_dir))
    except InputError as err:
        fail(err, err.exit_code)
    say(f"[green]✓[/] {plan.audit.included} documents, {n_tokens:,} tokens → {run_dir}")


def train(spec: Path = typer.Option(..., "--spec", help="Resolved PitTraining (JSON) written by the runner."),
          run_dir: Path = typer.Option(..., "--run-dir", help="Run folder with base/ and data/."),
          base: Optional[Path] = typer.Option(None, "--base", help="Base model folder (default RUN_DIR/base).")
          ) -> None:
    """Training entry point, run by torchrun in every rank (the PyTorchJob's command)."""
    from pitlab.trainer.lifetime import exit_with_parent
    from pitlab.trainer.rank_exit import exit_rank
    from pitlab.trainer.train import run_rank

    exit_with_parent()  # a rank whose torchrun is gone (killed with its driver) stops instead of training on

    exit_rank(lambda: run_rank(spec, run_dir, base))  # ends without finalization (see pitlab.trainer.rank_exit)


def plan(file: Path = typer.Argument(..., metavar="FILE", help="PitTraining YAML."),
         data_root: Optional[Path] = DataRoot,
         gpu_memory_gib: Optional[float] = typer.Option(None, "--gpu-memory-gib",
                                                        help="GPU memory in GiB (overrides "
                                                             "spec.resources.gpuMemoryGiB)."),
         nproc: Optional[int] = typer.Option(None, "--nproc", min=1, metavar="N",
                                             help="Plan a `pitlab run --nproc N` on this machine (world size N) "
                                                  "instead of the spec's nodes × gpusPerNode."),
         model_config: Optional[Path] = typer.Option(None, "--model-config", metavar="PATH",
                                                     help="The base model's config.json (or a folder holding one) "
                                                          "to plan with instead of spec.baseModel.uri's: plan a "
                                                          "cluster spec without the weights.")) -> None:
    """Predict per-GPU memory by component, and whether the decoder layers will be compiled on CUDA and with CUDA
    graphs (PITLAB_COMPILE_MODE or the plan decides); exit 3 if the run cannot fit the GPU the spec names. The
    world size is the spec's nodes × gpusPerNode (the cluster's); `pitlab run` starts gpusPerNode processes (or
    --nproc) on one machine."""
    from pitlab.trainer.kernels import planned_compile
    from pitlab.trainer.plan import plan_memory

    if gpu_memory_gib is not None and not math.isfinite(gpu_memory_gib):
        fail(SpecError([("--gpu-memory-gib", f"{gpu_memory_gib}: give a finite number of GiB (e.g. 80)")]), 2)
    if gpu_memory_gib is not None and gpu_memory_gib <= 0.5:
        fail(SpecError([("--gpu-memory-gib", f"{gpu_memory_gib:g} GiB: must exceed the 0.5 GiB a CUDA context "
                                             "takes")]), 2)
    res = load(file, data_root)
    if not isinstance(res, PitTraining):
        fail(SpecError([("kind", f"pitlab plan takes a PitTraining, got {res.kind}")], str(file)), 2)
    r = res.spec.resources
    spec = res.spec if nproc is None else \
        res.spec.model_copy(update={"resources": r.model_copy(update={"nodes": 1, "gpus_per_node": nproc})})
    with tempfile.TemporaryDirectory(prefix="pitlab-plan-") as tmp:
        try:
            if model_config is not None:
                spec = with_model_config(spec, model_config, Path(tmp))
            result = plan_memory(spec, gpu_memory_gib=gpu_memory_gib)
            compiled = planned_compile(spec, result)
        except SpecError as err:
            fail(err, 2)
    print(result.table())
    if nproc is None and r.nodes > 1:
        say(f"world size {r.nodes * r.gpus_per_node} (spec.resources: {r.nodes} nodes × {r.gpus_per_node} GPUs, as "
            f"on a cluster); `pitlab run` on one machine starts {r.gpus_per_node}: plan that with --nproc "
            f"{r.gpus_per_node}")
    say(f"decoder layers on CUDA: {escape(compiled)}")
    if model_config is None and not _has_cuda():  # with --model-config the weights, and the run, are elsewhere
        say("this machine has no CUDA GPU: `pitlab run` here trains on the CPU (gloo), where the table's per-GPU "
            "figures and the line above do not apply (the reserve is a CUDA context's and allocator's)")
    if result.fits is None:
        say("[yellow]no GPU memory given[/] (spec.resources.gpuMemoryGiB, --gpu-memory-gib or, with layer "
            "streaming, spec.training.layerStreaming.gpuMemoryBudgetBytes): no fit check")
    elif not result.fits:
        source = "--gpu-memory-gib" if gpu_memory_gib is not None else "spec.resources.gpuMemoryGiB"
        fail(RuntimeError(f"{file}: {result.refusal(source)}"), 3)
    else:
        say(f"[green]✓[/] fits: {_size(result.peak_bytes)} of {_size(result.capacity_bytes)} per GPU")
        usable = LABEL_GIB.get(round(result.capacity_bytes / 2**30, 2))
        if usable is not None and result.peak_bytes > usable[0] * 2**30:
            say(f"[yellow]warning:[/] {result.capacity_bytes / 2**30:g} is the GB on the card's label; torch can use "
                f"{usable[0]:g} GiB of {usable[1]}, less than the predicted peak: plan with that")


LABEL_GIB = {80.0: (79.18, "an H100 80GB"), 141.0: (139.0, "the H200s measured here")}
"""GPU memory typed as the card's label (GB) → (GiB torch reports on that card, which card)."""


def with_model_config(spec, path: Path, scratch: Path):
    """``spec`` with ``baseModel.uri`` pointing at a folder whose ``config.json`` is ``path`` (a config.json file
    of any name, copied into ``scratch``, or a folder holding one) and no ``randomInit``. Raises
    :class:`SpecError` naming ``--model-config`` when ``path`` is missing, has no config.json or is not a JSON
    object with a ``model_type`` transformers knows."""
    from transformers import AutoConfig

    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise SpecError([("--model-config", f"{path}: no such file" if not path.exists() else
                          f"{path}: a folder without config.json")])
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecError([("--model-config", f"{file}: not JSON ({err})")]) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model_type"), str):
        raise SpecError([("--model-config", f"{file}: not a transformers config.json (no \"model_type\")")])
    shutil.copyfile(file, scratch / "config.json")
    try:
        AutoConfig.from_pretrained(scratch)
    except (ValueError, KeyError) as err:  # a model_type this transformers does not know
        raise SpecError([("--model-config", f"{file}: {str(err).splitlines()[0]}")]) from None
    base = spec.base_model.model_copy(update={"uri": str(scratch), "random_init": None})
    return spec.model_copy(update={"base_model": base})


def _has_cuda() -> bool:
    """Whether torch sees a CUDA device on this machine."""
    import torch

    return torch.cuda.is_available()


def _size(n: int) -> str:
    """Bytes for people: GiB from a tenth of a GiB up, else MiB (one decimal)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"
