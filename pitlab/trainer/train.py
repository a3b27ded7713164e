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

Structure: :func:`setup_run` (spec, data, the planner's activation-checkpointing choice, the sharded model, the
kernels and the loss, AdamW and the schedule) returns a :class:`TrainRun`; :func:`train_step` runs one optimizer
step of it; :class:`pitlab.trainer.checkpointer.Checkpointer` owns where and when checkpoints are written and the
resume; :func:`train` ties them together. ``bench/throughput.py`` times ``setup_run`` + ``train_step`` directly.

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.tensor import DTensor
from torch.profiler import record_function
from transformers import AutoConfig

from pitlab.api import PitTraining, SpecError, layout, load_resource
from pitlab.errors import CorpusError, PitlabError
from pitlab.trainer.checkpointer import Checkpointer
from pitlab.trainer.data import PackedSequences, steps_for_budget
from pitlab.trainer.digest import tensor_sha256
from pitlab.trainer.files import write_json_atomic
from pitlab.trainer.loading import load_sharded_model
from pitlab.trainer.lora import lora_record, save_adapter_verified
from pitlab.trainer.metrics import MetricsWriter, truncate_metrics
from pitlab.trainer.fused_step import LABEL as FUSED_STEP_LABEL
from pitlab.trainer.fused_step import TORCH_LABEL as TORCH_STEP_LABEL
from pitlab.trainer.fused_step import MasterAdamW, fused_step_enabled
from pitlab.trainer.kernels import compile_blocks, reference_kernel_warning, select_kernels
from pitlab.trainer.loss import install_loss
from pitlab.trainer.plan import (GiB, MemoryPlan, ModelShape, adapter_shape, model_shape, peak_flops, plan_memory,
                                 train_flops_per_token)
from pitlab.trainer.prepare import load_tokens
from pitlab.trainer.schedule import lr_factor
from pitlab.trainer.single_device import FSDP2_LABEL, ComputeCopy, load_single_device_model, uses_compute_copy
from pitlab.trainer.single_device import LABEL as SINGLE_DEVICE_LABEL


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
    """One rank's training state after :func:`setup_run`: the spec, the model (FSDP2-sharded, or the float32
    master of a single-device run) with its optimizer and schedule, the data order, the chosen kernels and the
    memory plan. :func:`train_step` advances it. ``compute``: the bf16 compute copy of a single-device run
    (:mod:`pitlab.trainer.single_device`), None under FSDP2 and layer streaming."""

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
    streamer: object | None = None  # pitlab.trainer.streaming.LayerStreamer with training.layerStreaming
    compute: ComputeCopy | None = None

    @property
    def spec(self):
        return self.resource.spec

    @property
    def forward_model(self) -> torch.nn.Module:
        """The module forward and backward run on: the compute copy of a single-device run, else ``model``."""
        return self.compute.model if self.compute is not None else self.model

    @property
    def parallelism(self) -> str:
        """How the model is held (:func:`parallelism_label`)."""
        return parallelism_label(self.streamer, self.compute)

    def after_load(self) -> None:
        """After the master weights were loaded from a checkpoint: cast them into the compute copy."""
        if self.compute is not None:
            self.compute.refresh()

    def train_state(self, step: int) -> dict:
        """``train_state.json`` content of a checkpoint after ``step`` optimizer steps."""
        return {"tokens_seen": step * self.data.tokens_per_step, "run": self.run_identity,
                "data": {"next_step": step, "chunks_consumed": step * self.data.chunks_per_step},
                "method": self.spec.method, "lora": self.lora}

    def close(self) -> None:
        """Drop the model and optimizer (their memory is freed once nothing else holds them)."""
        self.model = self.optimizer = self.scheduler = self.compute = None
        self.trainable = []


def parallelism_label(streamer, compute) -> str:
    """``"layer streaming (one device)"``, the single-device path's label or ``"FSDP2"``."""
    if streamer is not None:
        return "layer streaming (one device)"
    return SINGLE_DEVICE_LABEL if compute is not None else FSDP2_LABEL


@dataclass(frozen=True)
class StepResult:
    """One optimizer step: mean loss over all ranks and microbatches (nats), gradient norm before clipping,
    the learning rate it used, and its wall time in seconds (this rank)."""

    loss: float
    grad_norm: float
    lr: float
    seconds: float


def _device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def setup_run(spec_path: Path, paths: RunPaths) -> TrainRun:
    """Collective (the default process group must be initialised): read the spec and the corpus, decide the
    activation checkpointing (``auto``: the planner), load the FSDP2-sharded model (or, at world size 1, the
    float32 master and its bf16 compute copy: :func:`pitlab.trainer.single_device.uses_compute_copy`), choose and
    report the kernels (:func:`pitlab.trainer.kernels.select_kernels`; a loud warning for reference kernels on a
    GPU), install the loss, compile the decoder layers (CUDA, ``spec.training.compile``; unset: full-weight runs
    without layer streaming; the compute copy's on the single-device path) and build AdamW (the fused step of
    :mod:`pitlab.trainer.fused_step` on the single-device path, ``spec.training.fusedOptimizer``) and the LR
    schedule.

    Raises :class:`SpecError` for spec problems (naming the field), ``FileNotFoundError`` naming a missing input
    file, ``ValueError`` for token ids outside the vocabulary.
    """
    t_start = time.perf_counter()
    resource = load_spec(spec_path)
    spec = resource.spec
    tr = spec.training
    rank, world, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
    device = _device()
    mesh = init_device_mesh(device.type, (world,))

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
    lora = lora_record(spec.lora) if spec.method == "lora" else None
    shape = model_shape(config)
    streamer = compute = None
    capacity = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    plan = _plan(spec, shape, config, capacity)  # with layerStreaming: plan_streaming's plan
    if tr.layer_streaming.enabled:  # one GPU, LoRA: frozen layers streamed from host memory instead of FSDP2
        from pitlab.trainer.streaming import STORE_DIR, load_streamed_model
        act_ckpt = False  # the streamer checks its own budget and recomputes layer by layer
        model, streamer = load_streamed_model(paths.base, spec, device, store_dir=paths.run_dir / STORE_DIR)
        loss_impl = "chunked cross-entropy (pitlab.trainer.streaming)"
    else:
        act_ckpt = plan.activation_checkpointing if plan is not None else bool(tr.activation_checkpointing)
        # one rank, full, bf16: float32 masters + a bf16 copy, no FSDP2 (LoRA keeps FSDP2), unless only FSDP2's
        # plan fits (it frees each layer's bf16 copy and gradients in backward)
        if uses_compute_copy(spec, world) and (plan is None or plan.world_size != world or plan.single_device):
            model, compute = load_single_device_model(paths.base, spec, device, act_ckpt)
            compute.model.train()
        else:  # meta-device build + this rank's rows from the safetensors: about one model copy per node
            model = load_sharded_model(paths.base, mesh, tr.precision, device, act_ckpt, lora=lora, seed=tr.seed)
        loss_impl = install_loss(compute.model if compute is not None else model, tr.loss)
    model.train()
    forward_model = compute.model if compute is not None else model
    kernels = select_kernels(forward_model, device, loss_impl)
    # auto (unset): full-weight training without layer streaming, the configuration measured faster compiled
    compile_on = tr.compile if tr.compile is not None else (streamer is None and lora is None)
    if compile_on and device.type == "cuda":
        kernels["compile"] = compile_blocks(forward_model)
    elif device.type != "cuda":
        kernels["compile"] = "off (CPU)" if compile_on else "off"
    else:
        kernels["compile"] = "off" if tr.compile is False else "off (auto: LoRA and layer streaming are not compiled)"
    warning = reference_kernel_warning(kernels, device)
    if warning is not None and rank == 0:
        print(f"pitlab.trainer.train: WARNING: {warning}", file=sys.stderr, flush=True)

    trainable = [p for p in model.parameters() if p.requires_grad]  # all of them, or the LoRA adapter
    if fused_step_enabled(tr, compute is not None, device.type == "cuda"):  # clipping, AdamW and the cast into the copy: one pass per parameter (pitlab.trainer.fused_step)
        optimizer = MasterAdamW(trainable, compiled=device.type == "cuda", lr=tr.learning_rate,
                                weight_decay=tr.weight_decay)
        kernels["optimizer"] = FUSED_STEP_LABEL + ("" if device.type == "cuda" else ", eager on the CPU")
    else:
        optimizer = torch.optim.AdamW(trainable, lr=tr.learning_rate, weight_decay=tr.weight_decay,
                                      fused=device.type == "cuda")
        kernels["optimizer"] = TORCH_STEP_LABEL + (
            " (fusedOptimizer: the single-device path only)" if tr.fused_optimizer and compute is None else "")
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
              f"corpus_tokens={len(tokens)} chunks={data.n_chunks} activation_checkpointing={act_ckpt} "
              f"parallelism={parallelism_label(streamer, compute)!r} kernels={json.dumps(kernels)}",
              file=sys.stderr, flush=True)
    return TrainRun(resource=resource, rank=rank, world=world, backend=backend, device=device, data=data,
                    corpus_tokens=int(len(tokens)), total_steps=total_steps, model=model, optimizer=optimizer,
                    scheduler=scheduler, trainable=trainable, lora=lora, shape=shape,
                    flops_per_token=train_flops_per_token(shape, tr.seq_len, frozen_base=lora is not None),
                    peak_flops=peak_flops(device_name), device_name=device_name, kernels=kernels,
                    kernel_warning=warning, activation_checkpointing=act_ckpt, plan=plan,
                    run_identity=run_identity, t_start=t_start, streamer=streamer, compute=compute)


def train_step(run: TrainRun, step: int) -> StepResult:
    """Collective: optimizer step ``step`` (0-based): every microbatch's forward + backward (gradients
    reduce-scattered per microbatch unless ``gradientSyncEveryMicrobatch: false``; on the single-device path cast
    into the float32 masters' gradients, inside ``step.backward``), clipping, AdamW, the LR schedule (and the
    masters cast into the compute copy, inside ``step.optimizer``), and the loss averaged over all ranks. The
    host waits for the device once, at the end (the loss and the gradient norm read together); the phases are
    ``record_function`` ranges (``step.forward``, ``step.backward``, ``step.clip``, ``step.optimizer``,
    ``step.loss_read``) for ``bench/profile_step.py``.
    Raises ``FloatingPointError`` for a non-finite loss."""
    tr = run.spec.training
    t = time.perf_counter()
    accum = tr.gradient_accumulation_steps
    sync_every_micro = tr.gradient_sync_every_microbatch or accum == 1
    lr = run.optimizer.param_groups[0]["lr"]
    # every microbatch copied first: a copy from pageable host memory synchronises the stream, which at the
    # start of the step is idle, but between microbatches would wait for the previous backward
    batches = [tuple(t.to(run.device) for t in run.data.microbatch(step, micro)) for micro in range(accum)]
    loss_sum = torch.zeros((), device=run.device, dtype=torch.float32)
    model = run.forward_model
    fused = isinstance(run.optimizer, MasterAdamW)
    from_copy = fused and accum == 1  # the fused step reads the copy's bf16 gradients: no float32 ones made
    for micro, (input_ids, labels) in enumerate(batches):
        if not sync_every_micro and run.compute is None:  # FSDP2: unsharded grads kept until the last microbatch
            run.model.set_requires_gradient_sync(micro == accum - 1)
        with record_function("step.forward"):
            if run.streamer is not None:  # chunked loss head: no tokens x vocab float32 logits
                loss = run.streamer.loss(model, input_ids, labels)
            else:
                loss = model(input_ids=input_ids, labels=labels).loss
        with record_function("step.backward"):
            (loss / accum).backward()
            if run.compute is not None and not from_copy:  # bf16 gradients into the float32 masters'
                run.compute.accumulate_grads()  # (FSDP2's reduce of one rank)
        loss_sum += loss.detach()
    if fused:
        with record_function("step.optimizer"):  # clipping, AdamW and the cast into the copy in one pass
            grad_norm = run.compute.fused_step(run.optimizer, tr.grad_clip, from_copy)
            run.scheduler.step()
    else:
        with record_function("step.clip"):
            grad_norm = _clip_grad_norm(run.model, tr.grad_clip)
        with record_function("step.optimizer"):
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
            run.scheduler.step()
            if run.compute is not None:  # the updated masters into the bf16 copy (FSDP2's copy-in cast)
                run.compute.refresh()
    with record_function("step.loss_read"):  # the step's one host sync, after the optimizer's launches
        dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
        loss_total, grad_norm = torch.stack([loss_sum, grad_norm.to(loss_sum)]).tolist()
        step_loss = loss_total / (run.world * accum)
    if not np.isfinite(step_loss):
        raise FloatingPointError(f"step {step + 1}: loss is {step_loss}; lower spec.training.learningRate")
    if not np.isfinite(grad_norm):
        raise FloatingPointError(nonfinite_gradient_message(run, step, step_loss, grad_norm))
    return StepResult(step_loss, grad_norm, lr, time.perf_counter() - t)


def nonfinite_gradient_message(run: TrainRun, step: int, loss: float, grad_norm: float) -> str:
    """The error for a finite loss whose gradient norm is not finite (step ``step``, 0-based): it names the
    token chunks of every rank's microbatches (:meth:`PackedSequences.chunk_ids`), since the cause is the data
    or the model rather than the learning rate (the gradient is computed before the step's update)."""
    chunks = sorted({int(c) for micro in range(run.spec.training.gradient_accumulation_steps)
                     for r in range(run.world) for c in run.data.chunk_ids(step, micro, r)})
    span = run.spec.training.seq_len + 1
    return (f"step {step + 1}: gradient norm is {grad_norm} with a finite loss ({loss:.6g}); the gradient was "
            f"computed before this step's update, so lowering spec.training.learningRate does not help. The "
            f"step's token chunks (all ranks): {chunks} (chunk c = corpus tokens [c*{span}, (c+1)*{span})). "
            "A known cause: a random-initialised model whose padding token has a zero embedding row fed "
            "that token; exactly-zero hidden states make every RMSNorm's gradient 1/sqrt(eps) times larger and "
            "it overflows after about 10-20 layers (bench/RESULTS.md, layer streaming)")


def train(spec_path: Path, paths: RunPaths) -> dict | None:
    """Run the training loop on this rank (the default process group must be initialised): :func:`setup_run`,
    resume through the :class:`~pitlab.trainer.checkpointer.Checkpointer`, :func:`train_step` until the token
    budget is spent, the checkpointer's saves, then the summary.

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
    try:
        for step in range(start_step, run.total_steps):
            result = train_step(run, step)
            first_loss = result.loss if first_loss is None else first_loss
            final_loss = result.loss
            elapsed = time.perf_counter() - t_loop
            mean_tps = (step + 1 - start_step) * run.data.tokens_per_step / max(elapsed, 1e-9)
            if metrics is not None:
                metrics.write(_metrics_record(run, step + 1, result, elapsed, mean_tps, start_step))
            checkpointer.after_step(step + 1, run.model, run.optimizer, run.scheduler, run.train_state(step + 1))
        loop_seconds = time.perf_counter() - t_loop
        last_ckpt = checkpointer.final(run.total_steps, run.model, run.optimizer, run.scheduler,
                                       run.train_state(run.total_steps), ran_steps=start_step < run.total_steps)
        digests = _full_parameter_sha256(run.model, run.rank)
        adapter = _save_adapter(run.model, paths.adapter, run.rank, paths.base) if run.lora is not None else None
    finally:
        if metrics is not None:
            metrics.close()
    if run.rank != 0:
        return None
    summary = _summary(run, start_step, resumed_from is not None, first_loss, final_loss, loop_seconds, mean_tps,
                       last_ckpt, adapter, digests)
    summary["model_card"] = model_card(run.resource, paths.run_dir)
    write_json_atomic(paths.summary, summary)
    return summary


def model_card(res: PitTraining, run_dir: Path) -> dict:
    """The card the merge writes beside the model (:class:`pitlab.api.artifacts.ModelCard`, JSON-ready): the
    knowledge cutoff, the sha256 of ``run_dir/corpus_audit.json`` (None when absent), the PitTraining's name,
    base model and method."""
    import hashlib

    from pitlab.api.artifacts import ModelCard

    audit = Path(run_dir) / layout.CORPUS_AUDIT
    digest = hashlib.sha256(audit.read_bytes()).hexdigest() if audit.is_file() else None
    return ModelCard(knowledge_cutoff=res.spec.knowledge_cutoff, corpus_audit_sha256=digest,
                     training=res.metadata.name, base_model=res.spec.base_model.uri,
                     method=res.spec.method).model_dump(by_alias=True, mode="json")


def _metrics_record(run: TrainRun, step: int, result: StepResult, elapsed: float, mean_tps: float,
                    start_step: int) -> dict:
    """One metrics line (:mod:`pitlab.trainer.metrics`) after ``step`` optimizer steps of an attempt that
    began at ``start_step``."""
    tps = run.data.tokens_per_step / max(result.seconds, 1e-9)
    record = {"step": step, "total_steps": run.total_steps, "loss": result.loss, "lr": result.lr,
              "grad_norm": result.grad_norm, "tokens": step * run.data.tokens_per_step, "tokens_per_second": tps,
              "mean_tokens_per_second": mean_tps,
              "mfu": None if run.peak_flops is None else tps * run.flops_per_token / (run.peak_flops * run.world),
              "peak_memory_bytes": _peak_memory(run.device), "elapsed_s": elapsed,
              "start_step": start_step}
    if run.kernel_warning is not None:
        record["kernel_warning"] = run.kernel_warning
    return record


def _summary(run: TrainRun, start_step: int, resumed: bool, first_loss, final_loss, loop_seconds: float,
             mean_tps: float | None, last_ckpt, adapter, digests: dict) -> dict:
    tr = run.spec.training
    tokens_seen = run.total_steps * run.data.tokens_per_step
    return {
        "name": run.resource.metadata.name,
        "steps": run.total_steps,
        "tokens_seen": tokens_seen,
        "tokens_per_step": run.data.tokens_per_step,
        "corpus_tokens": run.corpus_tokens,
        "epochs": tokens_seen / (run.data.n_chunks * tr.seq_len),
        "first_loss": first_loss,
        "final_loss": final_loss,
        "resumed_from_step": start_step if resumed else None,
        "mean_tokens_per_second": mean_tps,  # the last record's: the one definition of a run's speed
        "train_seconds": loop_seconds,
        "wall_seconds": time.perf_counter() - run.t_start,
        "world_size": run.world,
        "backend": run.backend,
        "device": run.device.type,
        "device_name": run.device_name,
        "method": run.spec.method,
        "parameters": run.shape.total,
        "trainable_parameters": sum(p.numel() for p in run.trainable),
        "active_parameters": run.shape.active,
        "train_flops_per_token": run.flops_per_token,
        "mfu": None if run.peak_flops is None or mean_tps is None else
        mean_tps * run.flops_per_token / (run.peak_flops * run.world),
        "peak_memory_bytes": _peak_memory(run.device),
        "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved(run.device) if run.device.type == "cuda" else None,
        "planned_peak_bytes": run.plan.peak_bytes if run.plan is not None else None,
        "activation_checkpointing": run.activation_checkpointing,
        "parallelism": run.parallelism,
        "kernels": run.kernels,
        "kernel_warning": run.kernel_warning,
        "software": _software(run.device, run.world, run.backend),
        "precision": tr.precision,
        "checkpoint": str(last_ckpt),
        "adapter": adapter,
        "param_sha256": digests,
        "layer_streaming": None if run.streamer is None else run.streamer.report(),
    }


def _peak_memory(device: torch.device) -> int:
    """Peak memory of this rank in bytes: ``torch.cuda.max_memory_allocated`` on CUDA (tensors only, not the
    allocator's cache or the CUDA context), else the process's peak resident set size (``ru_maxrss``)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _plan(spec, shape, config, capacity_bytes: int | None) -> MemoryPlan | None:
    """The memory planner's plan of this run (``activationCheckpointing`` unset: decided against
    ``capacity_bytes``, the GPU's memory); None when it cannot plan it (then checkpointing follows the spec,
    off when unset)."""
    try:
        adapter = adapter_shape(config, spec.lora) if spec.method == "lora" else None
        gib = None if spec.resources.gpu_memory_gib is not None or capacity_bytes is None else capacity_bytes / GiB
        return plan_memory(spec, shape, gpu_memory_gib=gib, adapter=adapter)
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


def _software(device: torch.device, world: int, backend: str) -> dict:
    """The software stack of this run: python, torch, CUDA, transformers, peft (None if not installed)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": ver("transformers"), "peft": ver("peft"), "safetensors": ver("safetensors"),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
            or "cpu", "world_size": world, "backend": backend}


def _clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip gradients to global L2 norm ``max_norm``; return the norm before clipping (a 0-d tensor on the
    gradients' device, not read here: :func:`train_step` reads it with the loss, so the host does not wait for
    backward before launching the optimizer step)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_([p for p in model.parameters() if p.grad is not None], max_norm, total)
    return total


def _full_parameter_sha256(model: torch.nn.Module, rank: int) -> dict[str, str]:
    """Collective: sha256 of every full (unsharded) parameter, gathered one at a time; filled on rank 0 only."""
    digests = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        if rank == 0:
            digests[name] = tensor_sha256(full)
        del full
    return digests


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
