"""The training's commands: the prepare Job's and the PyTorchJob's entry points (``prepare``, ``train``) and the
memory plan (``plan``, exit 3 when the run does not fit)."""

from __future__ import annotations

import math
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
    (the prepare Job's entry point; `pitlab run` does the same before training)."""
    from pitlab.trainer.files import write_json_atomic
    from pitlab.trainer.inputs import check_corpus, prepare_run

    res = load(spec, data_root)
    if not isinstance(res, PitTraining):
        fail(f"{spec}: kind {res.kind}: `pitlab prepare` takes a PitTraining", 2)
    try:
        plan = check_corpus(res)
        say_audit_notes(plan.audit)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(TrainingLayout(run_dir).corpus_audit, plan.audit.to_dict())
        base_dir, n_tokens = prepare_run(res, plan, run_dir)
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
                                                  "instead of the spec's nodes × gpusPerNode.")) -> None:
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
    try:
        result = plan_memory(spec, gpu_memory_gib=gpu_memory_gib)
    except SpecError as err:
        fail(err, 2)
    print(result.table())
    if nproc is None and r.nodes > 1:
        say(f"world size {r.nodes * r.gpus_per_node} (spec.resources: {r.nodes} nodes × {r.gpus_per_node} GPUs, as "
            f"on a cluster); `pitlab run` on one machine starts {r.gpus_per_node}: plan that with --nproc "
            f"{r.gpus_per_node}")
    say(f"decoder layers on CUDA: {escape(planned_compile(spec, result))}")
    if not _has_cuda():
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


def _has_cuda() -> bool:
    """Whether torch sees a CUDA device on this machine."""
    import torch

    return torch.cuda.is_available()


def _size(n: int) -> str:
    """Bytes for people: GiB from a tenth of a GiB up, else MiB (one decimal)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"
