"""What a training run reports: its metrics lines (:mod:`pitlab.trainer.metrics`), ``summary.json`` with the
model card, and the digests of the trained parameters (:mod:`pitlab.trainer.train` writes them)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.distributed.tensor import DTensor

from pitlab.api import PitTraining, layout
from pitlab.trainer.digest import tensor_sha256

if TYPE_CHECKING:
    from pitlab.trainer.train import StepResult, TrainRun


def model_card(res: PitTraining, run_dir: Path, method: str | None = None) -> dict:
    """The card the merge writes beside the model (:class:`pitlab.api.artifacts.ModelCard`, JSON-ready): the
    knowledge cutoff, the sha256 of ``run_dir/corpus_audit.json`` (None when absent), the PitTraining's name,
    base model and method (``method``, default ``spec.method``; ``random-init`` for a randomInit base)."""
    import hashlib

    from pitlab.api.artifacts import ModelCard

    audit = Path(run_dir) / layout.CORPUS_AUDIT
    digest = hashlib.sha256(audit.read_bytes()).hexdigest() if audit.is_file() else None
    return ModelCard(knowledge_cutoff=res.spec.knowledge_cutoff, corpus_audit_sha256=digest,
                     training=res.metadata.name, base_model=res.spec.base_model.uri,
                     method=method or res.spec.method).model_dump(by_alias=True, mode="json")


def metrics_record(run: TrainRun, step: int, result: StepResult, elapsed: float, mean_tps: float,
                    start_step: int) -> dict:
    """One metrics line (:mod:`pitlab.trainer.metrics`) after ``step`` optimizer steps of an attempt that
    began at ``start_step``."""
    tps = run.data.tokens_per_step / max(result.seconds, 1e-9)
    record = {"step": step, "total_steps": run.total_steps, "loss": result.loss, "lr": result.lr,
              "grad_norm": result.grad_norm, "tokens": step * run.data.tokens_per_step, "tokens_per_second": tps,
              "mean_tokens_per_second": mean_tps,
              "mfu": None if run.peak_flops is None else tps * run.flops_per_token / (run.peak_flops * run.world),
              "peak_memory_bytes": peak_memory(run.device), "elapsed_s": elapsed,
              "start_step": start_step}
    if run.kernel_warning is not None:
        record["kernel_warning"] = run.kernel_warning
    return record


def summary(run: TrainRun, start_step: int, resumed: bool, first_loss, final_loss, loop_seconds: float,
             mean_tps: float | None, last_ckpt, adapter, digests: dict) -> dict:
    """``summary.json`` of ``run`` (rank 0, without ``model_card``): steps, tokens, losses, speed (tokens per
    second, MFU), peak memory in bytes beside the plan's, the parallelism and kernels, the software, the last
    checkpoint, the adapter save report, the parameters' sha256 and the strategy's entries
    (``layer_streaming``)."""
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
        "peak_memory_bytes": peak_memory(run.device),
        "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved(run.device) if run.device.type == "cuda" else None,
        "planned_peak_bytes": run.plan.peak_bytes if run.plan is not None else None,
        "activation_checkpointing": run.activation_checkpointing,
        "parallelism": run.parallelism,
        "kernels": run.kernels,
        "kernel_warning": run.kernel_warning,
        "software": software(run.device, run.world, run.backend),
        "precision": tr.precision,
        "checkpoint": str(last_ckpt),
        "adapter": adapter,
        "param_sha256": digests,
        **run.strategy.report(),  # layer_streaming
    }


def peak_memory(device: torch.device) -> int:
    """Peak memory of this rank in bytes: ``torch.cuda.max_memory_allocated`` on CUDA (tensors only, not the
    allocator's cache or the CUDA context), else the process's peak resident set size (``ru_maxrss``)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def software(device: torch.device, world: int, backend: str) -> dict:
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


def full_parameter_sha256(model: torch.nn.Module, rank: int) -> dict[str, str]:
    """Collective: sha256 of every full (unsharded) parameter, gathered one at a time; filled on rank 0 only."""
    digests = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        if rank == 0:
            digests[name] = tensor_sha256(full)
        del full
    return digests
