"""The training loop: one rank of a torchrun job (full-weight continued pretraining under FSDP2).

Run under torchrun (``pitlab.trainer.launch`` builds the command)::

    python -m torch.distributed.run --standalone --nproc_per_node N \\
        -m pitlab.trainer.train --spec RESOLVED.json --run-dir DIR

Inputs: ``RESOLVED.json`` (a PitTraining dumped with ``model_dump(mode="json", by_alias=True)``),
``DIR/base`` (Hugging Face model directory from :mod:`pitlab.trainer.prepare`; ``--base`` overrides),
``DIR/data/tokens.npy`` (flat uint32 token ids). Outputs: ``DIR/train/metrics.jsonl`` (one line per
optimizer step, rank 0), ``DIR/checkpoint/step-<N>`` + ``latest`` (DCP, every ``checkpoint.everySteps``
and at the end; under ``spec.checkpoint.uri`` instead when set, a local path or ``s3://``), ``DIR/adapter/`` (``method: lora`` only: the verified adapter save), ``DIR/train/summary.json``
(rank 0, written last and atomically: its presence means training finished).

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

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.tensor import DTensor
from transformers import AutoConfig

from pitlab.api import PitTraining, SpecError, load_resource
from pitlab.storage import StorageError, is_s3
from pitlab.trainer.checkpoint import (CheckpointError, check_disk_space, checkpoint_bytes, checkpoint_location,
                                       checkpoint_steps, latest_checkpoint, load_checkpoint, save_checkpoint)
from pitlab.trainer.data import PackedSequences, steps_for_budget
from pitlab.trainer.digest import tensor_sha256
from pitlab.trainer.files import write_json_atomic
from pitlab.trainer.loading import WeightLoadError, load_sharded_model
from pitlab.trainer.lora import AdapterSaveError, lora_record, save_adapter_verified
from pitlab.trainer.metrics import MetricsWriter, truncate_metrics
from pitlab.trainer.plan import adapter_shape, model_shape, peak_flops, plan_memory, train_flops_per_token
from pitlab.trainer.prepare import load_tokens
from pitlab.trainer.schedule import lr_factor


@dataclass(frozen=True)
class RunPaths:
    """Files of one training run under ``run_dir``."""

    run_dir: Path
    base: Path

    @property
    def tokens(self) -> Path:
        return self.run_dir / "data" / "tokens.npy"

    @property
    def train_dir(self) -> Path:
        return self.run_dir / "train"

    @property
    def metrics(self) -> Path:
        return self.train_dir / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.train_dir / "summary.json"

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoint"

    @property
    def adapter(self) -> Path:
        return self.run_dir / "adapter"


def load_spec(path: Path) -> PitTraining:
    """Read and validate the resolved PitTraining (YAML or JSON, as ``kubectl apply`` takes it).

    Raises :class:`SpecError` naming the file and field, or naming ``kind`` when it is not a PitTraining.
    """
    resource = load_resource(path)
    if not isinstance(resource, PitTraining):
        raise SpecError([("kind", f"the trainer takes a PitTraining, got {resource.kind}")], str(path))
    return resource


def train(spec_path: Path, paths: RunPaths) -> dict | None:
    """Run the training loop on this rank (the default process group must be initialised).

    Returns the summary dict on rank 0 (also written to ``summary.json``), None on other ranks.
    Raises :class:`SpecError` for spec problems (naming the field), ``FileNotFoundError`` naming a missing
    input file.
    """
    resource = load_spec(spec_path)
    spec = resource.spec
    tr = spec.training
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend()
    t_start = time.perf_counter()

    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
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
    vocab = AutoConfig.from_pretrained(paths.base).get_text_config().vocab_size
    max_id = int(np.max(tokens))
    if max_id >= vocab:
        raise ValueError(f"{paths.tokens}: token id {max_id} is outside the base model's vocabulary "
                         f"({paths.base / 'config.json'}: vocab_size={vocab}); tokenize with the base model's tokenizer")
    lora = lora_record(spec.lora) if spec.method == "lora" else None
    streamer = None
    if tr.layer_streaming.enabled:  # one GPU, LoRA: frozen layers streamed from host memory instead of FSDP2
        from pitlab.trainer.streaming import load_streamed_model
        model, streamer = load_streamed_model(paths.base, spec, device)
    else:
        # meta-device build + this rank's rows from the safetensors: about one model copy per node, not per rank
        model = load_sharded_model(paths.base, mesh, tr.precision, device, tr.activation_checkpointing, lora=lora,
                                   seed=tr.seed)
    model.train()
    sync_every_micro = tr.gradient_sync_every_microbatch or tr.gradient_accumulation_steps == 1

    trainable = [p for p in model.parameters() if p.requires_grad]  # all of them, or the LoRA adapter
    optimizer = torch.optim.AdamW(trainable, lr=tr.learning_rate, weight_decay=tr.weight_decay,
                                  fused=device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total_steps, tr.warmup_steps, tr.schedule, tr.min_learning_rate_ratio))

    shape = model_shape(model.config)
    flops_per_token = train_flops_per_token(shape, tr.seq_len, frozen_base=lora is not None)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_flops(device_name)
    if rank == 0:
        print(f"pitlab.trainer.train: {resource.metadata.name}: world_size={world} backend={backend} "
              f"device={device.type} steps={total_steps} tokens/step={data.tokens_per_step} "
              f"corpus_tokens={len(tokens)} chunks={data.n_chunks}", file=sys.stderr, flush=True)
    run_identity = {"seed": tr.seed, "seq_len": tr.seq_len, "micro_batch_size": tr.micro_batch_size,
                    "gradient_accumulation_steps": tr.gradient_accumulation_steps, "world_size": world,
                    "tokens": spec.tokens, "total_steps": total_steps, "n_chunks": data.n_chunks,
                    "method": spec.method,
                    "lora": None if lora is None else {k: v for k, v in lora.items() if k != "merge_into_base"}}
    start_step, first_loss, final_loss = 0, None, None
    ckpt_dir = checkpoint_location(spec.checkpoint.uri, paths.run_dir)  # spec.checkpoint.uri: local or s3://
    resumed_from = latest_checkpoint(ckpt_dir)
    if resumed_from is not None:
        start_step = _resume(resumed_from, model, optimizer, scheduler, run_identity)
        if rank == 0:
            first_loss, final_loss = truncate_metrics(paths.metrics, start_step)
            print(f"pitlab.trainer.train: resumed from {resumed_from} at step {start_step}", file=sys.stderr,
                  flush=True)
    save_at = checkpoint_steps(start_step, total_steps, spec.checkpoint.every_steps)
    periodic_saves = set(save_at) - {total_steps}  # the end's save comes after the loop
    if not is_s3(str(ckpt_dir)):  # before step 1; every rank checks the same numbers, so all fail together
        check_disk_space(ckpt_dir, checkpoint_bytes(trainable), len(save_at), spec.checkpoint.keep)
    metrics = MetricsWriter(paths.metrics, mode="a" if resumed_from is not None else "w") if rank == 0 else None

    def train_state(step: int) -> dict:
        return {"tokens_seen": step * data.tokens_per_step, "run": run_identity,
                "data": {"next_step": step, "chunks_consumed": step * data.chunks_per_step},
                "method": spec.method, "lora": lora}

    last_ckpt = resumed_from
    mean_tps = None  # tokens per second over this attempt's steps (all ranks); None when none ran
    t_loop = time.perf_counter()
    try:
        for step in range(start_step, total_steps):
            t_step = time.perf_counter()
            lr = optimizer.param_groups[0]["lr"]
            loss_sum = torch.zeros((), device=device, dtype=torch.float32)
            for micro in range(tr.gradient_accumulation_steps):
                if not sync_every_micro:  # unsharded grads accumulate until the last microbatch (see planner)
                    model.set_requires_gradient_sync(micro == tr.gradient_accumulation_steps - 1)
                input_ids, labels = data.microbatch(step, micro)
                input_ids, labels = input_ids.to(device), labels.to(device)
                if streamer is not None:  # chunked loss head: no tokens x vocab float32 logits
                    loss = streamer.loss(model, input_ids, labels)
                else:
                    logits = model(input_ids=input_ids).logits
                    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
                (loss / tr.gradient_accumulation_steps).backward()
                loss_sum += loss.detach()
            grad_norm = _clip_grad_norm(model, tr.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
            step_loss = loss_sum.item() / (world * tr.gradient_accumulation_steps)
            if not np.isfinite(step_loss):
                raise FloatingPointError(f"step {step + 1}: loss is {step_loss}; lower spec.training.learningRate")
            first_loss = step_loss if first_loss is None else first_loss
            final_loss = step_loss
            now = time.perf_counter()
            mean_tps = (step + 1 - start_step) * data.tokens_per_step / max(now - t_loop, 1e-9)
            if metrics is not None:
                tps = data.tokens_per_step / max(now - t_step, 1e-9)
                metrics.write({
                    "step": step + 1, "total_steps": total_steps, "loss": step_loss, "lr": lr,
                    "grad_norm": grad_norm, "tokens": (step + 1) * data.tokens_per_step,
                    "tokens_per_second": tps, "mean_tokens_per_second": mean_tps,
                    "mfu": None if peak is None else tps * flops_per_token / (peak * world),
                    "peak_memory_bytes": _peak_memory(device),
                    "elapsed_s": now - t_loop,
                })
            if step + 1 in periodic_saves:
                last_ckpt = save_checkpoint(ckpt_dir, step + 1, model, optimizer, spec.checkpoint.keep,
                                            train_state(step + 1), scheduler)
        loop_seconds = time.perf_counter() - t_loop
        tokens_seen = total_steps * data.tokens_per_step
        if start_step < total_steps or last_ckpt is None:
            last_ckpt = save_checkpoint(ckpt_dir, total_steps, model, optimizer, spec.checkpoint.keep,
                                        train_state(total_steps), scheduler)
        digests = _full_parameter_sha256(model, rank)
        adapter = _save_adapter(model, paths.adapter, rank) if lora is not None else None
    finally:
        if metrics is not None:
            metrics.close()
    if rank != 0:
        return None
    summary = {
        "name": resource.metadata.name,
        "steps": total_steps,
        "tokens_seen": tokens_seen,
        "tokens_per_step": data.tokens_per_step,
        "corpus_tokens": int(len(tokens)),
        "epochs": tokens_seen / (data.n_chunks * tr.seq_len),
        "first_loss": first_loss,
        "final_loss": final_loss,
        "resumed_from_step": start_step if resumed_from is not None else None,
        "mean_tokens_per_second": mean_tps,  # the last record's: the one definition of a run's speed
        "train_seconds": loop_seconds,
        "wall_seconds": time.perf_counter() - t_start,
        "world_size": world,
        "backend": backend,
        "device": device.type,
        "device_name": device_name,
        "method": spec.method,
        "parameters": shape.total,
        "trainable_parameters": sum(p.numel() for p in trainable),
        "active_parameters": shape.active,
        "train_flops_per_token": flops_per_token,
        "mfu": None if peak is None else
        (total_steps - start_step) * data.tokens_per_step / max(loop_seconds, 1e-9) * flops_per_token / (peak * world),
        "peak_memory_bytes": _peak_memory(device),
        "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None,
        "planned_peak_bytes": _planned_peak(spec, shape, model.config),
        "software": _software(device, world, backend),
        "precision": tr.precision,
        "checkpoint": str(last_ckpt),
        "adapter": adapter,
        "param_sha256": digests,
        "layer_streaming": None if streamer is None else streamer.report(),
    }
    write_json_atomic(paths.summary, summary)
    return summary


def _peak_memory(device: torch.device) -> int:
    """Peak memory of this rank in bytes: ``torch.cuda.max_memory_allocated`` on CUDA (tensors only, not the
    allocator's cache or the CUDA context), else the process's peak resident set size (``ru_maxrss``)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def _planned_peak(spec, shape, config) -> int | None:
    """The memory planner's per-GPU peak for this run (bytes), None when it cannot plan it."""
    try:
        adapter = adapter_shape(config, spec.lora) if spec.method == "lora" else None
        return plan_memory(spec, shape, adapter=adapter).peak_bytes
    except (SpecError, ValueError, TypeError):
        return None


def _save_adapter(model: torch.nn.Module, out_dir: Path, rank: int) -> dict | None:
    """Collective: gather the full LoRA adapter tensors to rank 0 (``get_model_state_dict`` with
    ``full_state_dict``, ``cpu_offload``, frozen parameters left out) and save them there with
    :func:`save_adapter_verified` (reopened and compared; :class:`AdapterSaveError` on any mismatch). Returns
    the save report on rank 0, None elsewhere."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                ignore_frozen_params=True))
    if rank != 0:
        return None
    return save_adapter_verified(model, out_dir, state_dict=full)


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


def _resume(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            scheduler: torch.optim.lr_scheduler.LRScheduler, run_identity: dict) -> int:
    """Collective: load ``path`` into the live objects after checking it belongs to this run; returns the
    number of completed optimizer steps. Raises :class:`SpecError` naming the field that differs."""
    from pitlab.trainer.checkpoint import read_train_state
    saved = read_train_state(path).get("run", {})
    fields = {"seed": "spec.training.seed", "seq_len": "spec.training.seqLen",
              "micro_batch_size": "spec.training.microBatchSize",
              "gradient_accumulation_steps": "spec.training.gradientAccumulationSteps",
              "world_size": "spec.resources.gpusPerNode", "tokens": "spec.tokens", "total_steps": "spec.tokens",
              "n_chunks": "data/tokens.npy", "method": "spec.method", "lora": "spec.lora"}
    defaults = {"method": "full", "lora": None}  # checkpoints written before LoRA existed
    for key, field in fields.items():
        if saved.get(key, defaults.get(key)) != run_identity[key]:
            raise SpecError([(field, f"differs from the checkpoint to resume ({path}: {key}={saved.get(key)!r}, "
                                     f"now {run_identity[key]!r}); use a new run directory or the same settings")])
    return int(load_checkpoint(path, model, optimizer, scheduler)["step"])


def _clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Clip gradients to global L2 norm ``max_norm``; return the norm before clipping (a Python float)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_([p for p in model.parameters() if p.grad is not None], max_norm, total)
    return float(total)


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
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pitlab.trainer.train", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path, help="resolved PitTraining JSON")
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory (base/, data/, train/, checkpoint/)")
    parser.add_argument("--base", type=Path, default=None, help="base HF model directory (default RUN_DIR/base)")
    args = parser.parse_args(argv)
    paths = RunPaths(args.run_dir, args.base if args.base is not None else args.run_dir / "base")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    try:
        train(args.spec, paths)
    except (SpecError, ValueError, FloatingPointError, CheckpointError,
            WeightLoadError, StorageError, AdapterSaveError, OSError) as err:
        if not isinstance(err, SpecError):
            traceback.print_exc()  # where it came from; the one-line message below is what launch reports
        print(f"pitlab.trainer.train: error (rank {dist.get_rank()}): {err}", file=sys.stderr, flush=True)
        return 2
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from pitlab.trainer.rank_exit import exit_rank

    exit_rank(main)  # no interpreter finalization: a gloo worker thread may still free tensors (see rank_exit)
