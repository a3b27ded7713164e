"""The training loop: one rank of a torchrun job (full-weight continued pretraining under FSDP2).

Run under torchrun, each rank calling :func:`run_rank` (:func:`pitlab.trainer.command.torchrun_command` builds the
command, the same for ``pitlab run`` and the PyTorchJob; the options are declared once, by ``pitlab train`` in
:mod:`pitlab.cli`)::

    python -m torch.distributed.run --standalone --nproc_per_node N \\
        -m pitlab.cli train --spec RESOLVED.json --run-dir DIR

Inputs: ``RESOLVED.json`` (a PitTraining dumped with ``model_dump(mode="json", by_alias=True)``),
``DIR/base`` (Hugging Face model directory from :mod:`pitlab.trainer.prepare`; ``--base`` overrides),
``DIR/data/tokens.npy`` (flat uint32 token ids). Outputs: ``DIR/train/metrics.jsonl`` (one line per
optimizer step, rank 0), ``DIR/checkpoint/step-<N>`` + ``latest`` (DCP, every ``checkpoint.everySteps``
and at the end; under ``spec.checkpoint.uri`` instead when set, a local path or ``s3://``), ``DIR/adapter/`` (``method: lora`` only: the verified adapter save), ``DIR/train/summary.json``
(rank 0, written last and atomically: its presence means training finished; it records the implementation of each
block, ``kernels``, the activation-checkpointing choice and the ``parallelism``).

World size 1 with ``method: full`` and ``precision: bf16``: no FSDP2; float32 master weights and a bf16 compute
copy (:mod:`pitlab.trainer.single_device`, bit-identical to FSDP2 at world size 1). Otherwise FSDP2.

Structure: :func:`setup_run` (spec, data, the memory plan, the strategy of :mod:`pitlab.trainer.strategies` that
builds the model and the loss, the kernels, AdamW and the schedule) returns a :class:`TrainRun`;
:mod:`pitlab.trainer.step` runs its optimizer steps through the strategy (forward-backward, optimizer step), each
step's loss read while the next one runs (:func:`~pitlab.trainer.step.run_steps`);
:class:`pitlab.trainer.checkpointer.Checkpointer` owns where and when checkpoints are written and the resume;
:func:`train` ties them together. ``bench/throughput.py`` times ``setup_run`` + ``run_steps`` directly.

``method: lora``: the meta-device model is wrapped with peft LoRA before ``fully_shard``
(:func:`pitlab.trainer.loading.load_sharded_model`), the base is frozen, AdamW gets the adapter parameters
only, checkpoints hold the adapter and its optimizer state (frozen parameters are not saved; see
:data:`pitlab.trainer.checkpoint.STATE_DICT_OPTIONS`) plus ``train_state.json["lora"]`` for the merge, and
the final adapter is gathered and saved through :func:`pitlab.trainer.lora.save_adapter_verified`.

Resume: when ``DIR/checkpoint/latest`` names a complete checkpoint, the run continues from it (model,
optimizer, LR scheduler, per-rank RNG states, data position = step), so a run interrupted at any point
and started again ends with parameters bit-identical to an uninterrupted one. ``metrics.jsonl`` is cut
back to the checkpoint's step. A checkpoint of a different run (seed, sequence length, batch layout,
token budget or world size differ) is refused, naming the field.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record
from transformers import AutoConfig

from pitlab.api import PitTraining, SpecError, layout, load_resource
from pitlab.errors import CorpusError, PitlabError
from pitlab.trainer.checkpointer import Checkpointer
from pitlab.trainer.data import PackedSequences, steps_for_budget
from pitlab.trainer.files import write_json_atomic
from pitlab.trainer.kernels import (compile_run_layers, compiles_layers, deterministic_algorithms,
                                    reference_kernel_warning, release_cuda_graphs, select_kernels)
from pitlab.trainer.knobs import check_knobs
from pitlab.trainer.lora import lora_record, save_adapter_verified
from pitlab.trainer.metrics import LossHistory, MetricsWriter, truncate_metrics
from pitlab.trainer.flops import peak_flops, train_flops_per_token
from pitlab.trainer.plan import GiB, MemoryPlan, ModelShape, adapter_shape, model_shape, plan_memory
from pitlab.trainer.prepare import load_tokens
from pitlab.trainer.report import full_parameter_sha256, metrics_record, model_card
from pitlab.trainer.report import summary as run_summary
from pitlab.trainer.schedule import lr_factor
from pitlab.trainer.single_device import ComputeCopy
from pitlab.trainer.step import StepResult, run_steps, train_step, watched_step  # noqa: F401  (re-exported)
from pitlab.trainer.strategies import Strategy, choose_strategy


@dataclass(frozen=True)
class RunPaths:
    """Files of one training run under ``run_dir``."""

    run_dir: Path
    base: Path

    @property
    def tokens(self) -> Path:
        return self.run_dir / layout.TOKENS

    @property
    def train_dir(self) -> Path:
        return self.run_dir / layout.TRAIN

    @property
    def metrics(self) -> Path:
        return self.run_dir / layout.METRICS

    @property
    def summary(self) -> Path:
        return self.run_dir / layout.SUMMARY

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / layout.CHECKPOINT

    @property
    def adapter(self) -> Path:
        return self.run_dir / layout.ADAPTER


def load_spec(path: Path) -> PitTraining:
    """Read and validate the resolved PitTraining (YAML or JSON, as ``kubectl apply`` takes it).

    Raises :class:`SpecError` naming the file and field, or naming ``kind`` when it is not a PitTraining.
    """
    resource = load_resource(path)
    if not isinstance(resource, PitTraining):
        raise SpecError([("kind", f"the trainer takes a PitTraining, got {resource.kind}")], str(path))
    return resource


@dataclass
class TrainRun:
    """One rank's training state after :func:`setup_run`: the spec, the model (FSDP2-sharded, the float32 master
    of a single-device run, or the LoRA model of layer streaming) with its optimizer and schedule, the data
    order, the chosen kernels, the memory plan and the ``strategy`` (:mod:`pitlab.trainer.strategies`) that
    holds the model and runs its steps. :func:`train_step` advances it."""

    resource: PitTraining
    rank: int
    world: int
    backend: str
    device: torch.device
    data: PackedSequences
    corpus_tokens: int
    total_steps: int
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    trainable: list
    lora: dict | None
    shape: ModelShape
    flops_per_token: float
    peak_flops: float | None
    device_name: str
    kernels: dict
    kernel_warning: str | None
    activation_checkpointing: bool
    plan: MemoryPlan | None
    run_identity: dict
    t_start: float
    strategy: Strategy

    @property
    def spec(self):
        return self.resource.spec

    @property
    def forward_model(self) -> torch.nn.Module:
        """The module forward and backward run on: the compute copy of a single-device run, else ``model``."""
        return self.strategy.forward_model

    @property
    def compute(self) -> ComputeCopy | None:
        """The bf16 compute copy of a single-device run (:mod:`pitlab.trainer.single_device`), else None."""
        return self.strategy.compute

    @property
    def streamer(self):
        """The :class:`pitlab.trainer.streaming.LayerStreamer` of a layer-streaming run, else None."""
        return self.strategy.streamer

    @property
    def parallelism(self) -> str:
        """How the model is held: the strategy's label (``"FSDP2"``, the single-device path's, or
        ``"layer streaming (one device)"``)."""
        return self.strategy.label

    def after_load(self) -> None:
        """After the model was loaded from a checkpoint (the single-device path: the masters into the copy)."""
        self.strategy.after_load()

    def train_state(self, step: int) -> dict:
        """``train_state.json`` content of a checkpoint after ``step`` optimizer steps."""
        return {"tokens_seen": step * self.data.tokens_per_step, "run": self.run_identity,
                "data": {"next_step": step, "chunks_consumed": step * self.data.chunks_per_step},
                "method": self.spec.method, "lora": self.lora}

    def close(self) -> None:
        """Drop the model and optimizer (their memory is freed once nothing else holds them)."""
        self.model = self.optimizer = self.scheduler = None
        self.strategy.close()
        self.trainable = []
        release_cuda_graphs()


def _device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def setup_run(spec_path: Path, paths: RunPaths) -> TrainRun:
    """Collective (the default process group must be initialised): read the spec and the corpus
    (:func:`_read_inputs`), plan the memory (``activationCheckpointing`` unset: the planner decides), choose the
    strategy (:func:`pitlab.trainer.strategies.choose_strategy`: FSDP2, the single-device float32 masters + bf16
    compute copy, or layer streaming) and let it build the model and the loss, choose and report the kernels
    (:func:`_kernels`), and build AdamW (the strategy's: the fused step of :mod:`pitlab.trainer.fused_step` on
    the single-device path and FSDP2 where enabled) and the LR schedule.

    Raises :class:`SpecError` for spec problems (naming the field), ``FileNotFoundError`` naming a missing input
    file, :class:`~pitlab.errors.CorpusError` for token ids outside the vocabulary.
    """
    t_start = time.perf_counter()
    resource = load_spec(spec_path)
    spec = resource.spec
    tr = spec.training
    check_knobs()  # PITLAB_* settings outside the spec, before any work
    rank, world, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
    device = _device()
    deterministic = deterministic_algorithms(tr.deterministic, device)  # before the first GPU matmul
    mesh = init_device_mesh(device.type, (world,))
    tokens, data, total_steps, config = _read_inputs(paths, spec, world, rank)
    lora = lora_record(spec.lora) if spec.method == "lora" else None
    shape = model_shape(config)
    capacity = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    plan_gib, too_much = plan_capacity(spec, capacity)
    plan = _plan(spec, shape, config, plan_gib)  # the chosen strategy's plan (layerStreaming: plan_streaming's)
    for warning in (too_much, fit_warning(plan, plan_gib is not None)):
        if warning and rank == 0:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
    strategy = choose_strategy(spec, world, plan)
    loss_impl = strategy.build(paths.base, paths.run_dir, spec, device, mesh, plan, lora)
    kernels, warning = _kernels(strategy, tr, device, loss_impl, lora, rank, plan, capacity)
    kernels["deterministic"] = deterministic
    kernels.update(strategy.kernel_labels())
    trainable = [p for p in strategy.model.parameters() if p.requires_grad]  # all of them, or the LoRA adapter
    optimizer, kernels["optimizer"] = strategy.build_optimizer(trainable, tr, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total_steps, tr.warmup_steps, tr.schedule, tr.min_learning_rate_ratio))
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    run_identity = {"seed": tr.seed, "seq_len": tr.seq_len, "micro_batch_size": tr.micro_batch_size,
                    "gradient_accumulation_steps": tr.gradient_accumulation_steps, "world_size": world,
                    "tokens": spec.tokens, "total_steps": total_steps, "n_chunks": data.n_chunks,
                    "method": spec.method,
                    "lora": None if lora is None else {k: v for k, v in lora.items() if k != "merge_into_base"}}
    if rank == 0:
        print(f"pitlab.trainer.train: {resource.metadata.name}: world_size={world} backend={backend} "
              f"device={device.type} steps={total_steps} tokens/step={data.tokens_per_step} "
              f"corpus_tokens={len(tokens)} chunks={data.n_chunks} "
              f"activation_checkpointing={strategy.activation_checkpointing} "
              f"parallelism={strategy.label!r} kernels={json.dumps(kernels)}", file=sys.stderr, flush=True)
    return TrainRun(resource=resource, rank=rank, world=world, backend=backend, device=device, data=data,
                    corpus_tokens=int(len(tokens)), total_steps=total_steps, model=strategy.model,
                    optimizer=optimizer, scheduler=scheduler, trainable=trainable, lora=lora, shape=shape,
                    flops_per_token=train_flops_per_token(shape, tr.seq_len, frozen_base=lora is not None),
                    peak_flops=peak_flops(device_name), device_name=device_name, kernels=kernels,
                    kernel_warning=warning, activation_checkpointing=strategy.activation_checkpointing, plan=plan,
                    run_identity=run_identity, t_start=t_start, strategy=strategy)


def _read_inputs(paths: RunPaths, spec, world: int, rank: int) -> tuple[np.ndarray, PackedSequences, int, object]:
    """The corpus tokens (uint32), this rank's data order, the run's optimizer steps and the base model's
    transformers config; seeds torch with ``training.seed`` (before the model is built). Raises
    ``FileNotFoundError`` naming a missing token file or base ``config.json``, :class:`CorpusError` for a token
    id outside the vocabulary."""
    tr = spec.training
    tokens = load_tokens(paths.tokens)
    data = PackedSequences(tokens, tr.seq_len, tr.micro_batch_size, tr.gradient_accumulation_steps,
                           world, rank, tr.seed)
    total_steps = steps_for_budget(spec.tokens, tr.seq_len, tr.micro_batch_size,
                                   tr.gradient_accumulation_steps, world)
    if not (paths.base / "config.json").is_file():
        raise FileNotFoundError(f"{paths.base}: base model directory has no config.json "
                                "(written by pitlab.trainer.prepare.prepare_base_model)")
    torch.manual_seed(tr.seed)
    config = AutoConfig.from_pretrained(paths.base)
    vocab = config.get_text_config().vocab_size
    max_id = int(np.max(tokens))
    if max_id >= vocab:
        raise CorpusError(f"{paths.tokens}: token id {max_id} is outside the base model's vocabulary "
                         f"({paths.base / 'config.json'}: vocab_size={vocab}); tokenize with the base model's tokenizer")
    return tokens, data, total_steps, config


def _kernels(strategy: Strategy, tr, device: torch.device, loss_impl: str, lora: dict | None,
             rank: int, plan: MemoryPlan | None, capacity: int | None) -> tuple[dict, str | None]:
    """The ``kernels`` report of the strategy's forward model (:func:`pitlab.trainer.kernels.select_kernels`)
    with its decoder layers compiled on CUDA when ``tr.compile`` says so (unset: full-weight runs of a strategy
    compiled by default, the configuration measured faster; :func:`~pitlab.trainer.kernels.compile_run_layers`
    for ``plan`` on the memory it was planned against, else ``capacity`` bytes), and the reference-kernel warning."""
    kernels = select_kernels(strategy.forward_model, device, loss_impl)
    compile_on = compiles_layers(tr.compile, strategy.compiled_by_default, lora is not None)
    kernels["compile"] = compile_run_layers(strategy.forward_model, compile_on, tr.compile, device,
                                            strategy.cuda_graphs_by_default, strategy.activation_checkpointing,
                                            None if plan is None else plan.peak_bytes,
                                            (plan.capacity_bytes if plan is not None else None) or capacity)
    warning = reference_kernel_warning(kernels, device)
    if warning is not None and rank == 0:
        print(f"pitlab.trainer.train: WARNING: {warning}", file=sys.stderr, flush=True)
    return kernels, warning


def train(spec_path: Path, paths: RunPaths) -> dict | None:
    """Run the training loop on this rank (the default process group must be initialised): :func:`setup_run`,
    resume through the :class:`~pitlab.trainer.checkpointer.Checkpointer`, the steps
    (:func:`~pitlab.trainer.step.run_steps`: a step is read before the next is launched where a checkpoint follows
    it) until the token budget is spent, the checkpointer's saves, then the summary.

    Returns the summary dict on rank 0 (also written to ``summary.json``), None on other ranks.
    Raises :class:`SpecError` for spec problems (naming the field), ``FileNotFoundError`` naming a missing
    input file.
    """
    run = setup_run(spec_path, paths)
    spec = run.spec
    checkpointer = Checkpointer(spec.checkpoint.uri, paths.run_dir, spec.checkpoint.every_steps, spec.checkpoint.keep)
    start_step = checkpointer.resume(run.run_identity, run.model, run.optimizer, run.scheduler)
    resumed_from = checkpointer.last
    if resumed_from is not None:
        run.after_load()  # the loaded float32 masters into the bf16 compute copy
    first_loss = final_loss = None
    if resumed_from is not None and run.rank == 0:
        first_loss, final_loss = truncate_metrics(paths.metrics, start_step)
        print(f"pitlab.trainer.train: resumed from {resumed_from} at step {start_step}", file=sys.stderr,
              flush=True)
    checkpointer.schedule(start_step, run.total_steps, run.trainable)
    metrics = MetricsWriter(paths.metrics, mode="a" if resumed_from is not None else "w") if run.rank == 0 else None
    mean_tps = None  # tokens per second over this attempt's steps (all ranks); None when none ran
    t_loop = time.perf_counter()
    history = LossHistory()
    try:
        # closed on any exit: the loop gives Python's garbage collection back (pitlab.trainer.gcpolicy)
        with closing(run_steps(run, range(start_step, run.total_steps), history, checkpointer.saves_at)) as steps:
            for step, result in steps:
                first_loss = result.loss if first_loss is None else first_loss
                final_loss = result.loss
                elapsed = time.perf_counter() - t_loop
                mean_tps = (step + 1 - start_step) * run.data.tokens_per_step / max(elapsed, 1e-9)
                if metrics is not None:
                    metrics.write(metrics_record(run, step + 1, result, elapsed, mean_tps, start_step))
                checkpointer.after_step(step + 1, run.model, run.optimizer, run.scheduler, run.train_state(step + 1))
        loop_seconds = time.perf_counter() - t_loop
        last_ckpt = checkpointer.final(run.total_steps, run.model, run.optimizer, run.scheduler,
                                       run.train_state(run.total_steps), ran_steps=start_step < run.total_steps)
        digests = full_parameter_sha256(run.model, run.rank)
        adapter = _save_adapter(run.model, paths.adapter, run.rank, paths.base) if run.lora is not None else None
    finally:
        if metrics is not None:
            metrics.close()
    if run.rank != 0:
        return None
    summary = run_summary(run, start_step, resumed_from is not None, first_loss, final_loss, loop_seconds, mean_tps,
                       last_ckpt, adapter, digests)
    summary["model_card"] = model_card(run.resource, paths.run_dir)
    write_json_atomic(paths.summary, summary)
    return summary


def plan_capacity(spec, capacity_bytes: int | None) -> tuple[float | None, str | None]:
    """The GPU memory (GiB) the plan is made against, when not ``spec.resources.gpuMemoryGiB``, and a warning:
    the GPU's own ``capacity_bytes`` when the spec gives none, or gives more than the GPU has (a spec written for
    141 GiB cards run on 80 GiB ones would plan without activation checkpointing and run out of memory); None
    (the spec's value, or nothing known) otherwise."""
    typed = spec.resources.gpu_memory_gib
    if capacity_bytes is None:
        return None, None
    if typed is None:
        return capacity_bytes / GiB, None
    if typed * GiB > capacity_bytes * 1.001:
        return capacity_bytes / GiB, (f"spec.resources.gpuMemoryGiB={typed:g} is more than this GPU's "
                                      f"{capacity_bytes / GiB:.2f} GiB: the memory plan uses the GPU's")
    return None, None


def fit_warning(plan: MemoryPlan | None, on_card: bool) -> str | None:
    """A warning when ``plan`` (made against this GPU's memory when ``on_card``, else the spec's
    ``gpuMemoryGiB``) predicts more than it: the run goes on (the plan can be a few percent high), but may run out
    of memory after loading the model; None when it fits or nothing was planned."""
    if plan is None or plan.fits is not False:
        return None
    source = "this GPU's memory" if on_card else "spec.resources.gpuMemoryGiB"
    return f"{plan.refusal(source)}; the run may run out of memory (`pitlab plan` shows the plan)"


def _plan(spec, shape, config, gpu_memory_gib: float | None) -> MemoryPlan | None:
    """The memory planner's plan of this run (``activationCheckpointing`` unset: decided against
    ``gpu_memory_gib``, :func:`plan_capacity`'s, else the spec's); None when it cannot plan it (then checkpointing
    follows the spec, off when unset)."""
    try:
        adapter = adapter_shape(config, spec.lora) if spec.method == "lora" else None
        return plan_memory(spec, shape, gpu_memory_gib=gpu_memory_gib, adapter=adapter)
    except (SpecError, ValueError, TypeError):
        return None


def _save_adapter(model: torch.nn.Module, out_dir: Path, rank: int, base_dir: Path | None = None) -> dict | None:
    """Collective: gather the full LoRA adapter tensors to rank 0 (``get_model_state_dict`` with
    ``full_state_dict``, ``cpu_offload``, frozen parameters left out) and save them there with
    :func:`save_adapter_verified` (reopened and compared, then loaded onto the plain base model ``base_dir`` by
    name and probed; :class:`AdapterSaveError` on any mismatch). Returns
    the save report on rank 0, None elsewhere."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                ignore_frozen_params=True))
    if rank != 0:
        return None
    return save_adapter_verified(model, out_dir, state_dict=full, base_dir=base_dir)


ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
DEFAULT_ALLOC_CONF = "expandable_segments:True"


def default_alloc_conf(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` added when neither allocator variable
    is set (a user's setting is kept as it is). Expandable segments keep a tight budget from being lost to
    fragmentation: under layer streaming's 4 GiB cap an 8B model's layer-major backward ran out of memory with
    3.70 GiB allocated without them and peaked at 3.88 GiB reserved with them (bench/RESULTS.md)."""
    if any(v in environ for v in ALLOC_CONF_VARS):
        return dict(environ)
    return {**environ, ALLOC_CONF_VARS[0]: DEFAULT_ALLOC_CONF}


@record
def run_rank(spec_path: Path, run_dir: Path, base: Path | None = None) -> int:
    """One rank of a torchrun job: joins the process group (NCCL with CUDA, else gloo), runs :func:`train`, leaves
    the group. ``base``: the base model folder (default ``run_dir/base``).

    Returns the rank's exit code: 0, or 2 after a known error (a :class:`~pitlab.errors.PitlabError`: bad input,
    checkpoint, weights, storage; a non-finite loss; an OS error), printed as one line ``pitlab.trainer.train: error (rank R): ...`` that
    :mod:`pitlab.trainer.launch` reports. Any other exception propagates (torch elastic's ``record`` writes it to
    the error file). ``pitlab train`` (the pods' entry point, run by torchrun in every rank) calls it.
    """
    paths = RunPaths(run_dir, base if base is not None else run_dir / layout.BASE)
    os.environ.update(default_alloc_conf(os.environ))  # before the first CUDA allocation reads it
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        train(spec_path, paths)
    except (PitlabError, FloatingPointError, OSError) as err:  # a stray ValueError is a bug: it propagates
        if not isinstance(err, SpecError):
            traceback.print_exc()  # where it came from; the one-line message below is what launch reports
        print(f"pitlab.trainer.train: error (rank {dist.get_rank()}): {err}", file=sys.stderr, flush=True)
        return 2
    finally:
        dist.destroy_process_group()
    return 0
