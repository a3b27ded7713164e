"""Training throughput side by side, in one process: a plain Hugging Face loop (its best configuration) and
pitlab's trainer, on the same shape, sequence length, machine and kernels.

    python3 bench/throughput.py --work /tmp/tp --out "$OUT" [--shapes qwen35_reduced,qwen3_30b_slice]
        [--steps 12] [--warmup 3] [--budget-s 570] [--runs "hf;liger;default;{\"compile\": false}"]

Shapes (random init, seed 0; synthetic Zipf tokens, seq 4096, micro-batch 1):

- ``qwen35_reduced``: Qwen3.5-35B-A3B's text configuration (hidden 2048, 3 linear : 1 full attention, top-8 of
  the experts, shared expert, vocabulary 248,320) with 8 of its 40 layers and 64 of its 256 experts.
- ``qwen3_30b_slice``: Qwen3-30B-A3B (``qwen3_moe``: hidden 2048, 32 query / 4 KV heads of 128, expert width 768,
  top-8, vocabulary 151,936) with all 48 layers and 16 of its 128 experts.
- ``tiny``: a 4-layer ``qwen3_5_moe_text`` of hidden 64 (seq 128, vocabulary 1,024): a CPU rehearsal of the
  script (its rates say nothing about a GPU).

Under ``torchrun --nproc_per_node N`` the pitlab runs use all N ranks (tokens/s of the world and per GPU); the
plain loops run on every rank alone. Overrides of ``gradientAccumulationSteps`` and ``microBatchSize`` multiply a
run's tokens per step.

Plain loop ("what a user writes"): ``AutoModelForCausalLM.from_config(dtype=bfloat16)`` on the GPU, the fast
kernels installed (transformers binds fla's gated delta rule by itself; the short convolution gets the same fla
kernel the trainer uses, :func:`pitlab.trainer.kernels.select_kernels`), ``model(input_ids, labels=...)`` (its own
loss), fused AdamW on the bf16 parameters, clipping 1.0, no activation checkpointing (with it only if that runs
out of memory). pitlab: the trainer's own setup and loop (:func:`pitlab.trainer.train.setup_run`,
:func:`pitlab.trainer.step.run_steps`) with float32 master weights and bf16 compute (on one GPU without FSDP2:
a bf16 compute copy, :mod:`pitlab.trainer.single_device`; ``PITLAB_FORCE_FSDP2=1`` keeps FSDP2), the spec's
defaults (chunked loss, compiled blocks, ``activationCheckpointing: auto``), no checkpoint written. ``liger``:
the plain loop with liger-kernel's patch of the architecture (``apply_liger_kernel_to_qwen3_5_moe`` /
``_qwen3_moe`` on the model: RMSNorm, experts, fused linear cross-entropy; the seed recipe's stack as axolotl
applies it), the modeling module restored afterwards; every ratio is then reported against both loops.

The process keeps torch's allocator defaults; `pitlab run` gives its ranks expandable segments
(``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, :func:`pitlab.trainer.train.default_alloc_conf`): export
that variable to measure the pitlab runs as they run there (every run of the process then has it). Each pitlab run
records the memory reserved when it starts (``reserved_at_start``: pools an earlier run left).

Tokens/s: median of the timed steps after ``--warmup`` steps (pitlab: each step timed as the trainer's loop times it,
from the previous step's read to its own; the plain loops read every step's loss).
MFU from pitlab's FLOP count (:func:`pitlab.trainer.flops.train_flops_per_token`) for both. Peak memory:
``torch.cuda.max_memory_allocated`` of each run (reset in between). Writes ``throughput.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from unittest import mock

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from h200_qwen35 import CONFIG as QWEN35_SMALL  # noqa: E402
from hostload import GpuSampler, host_load  # noqa: E402

SEQ = 4096
QWEN35_REDUCED = {"name": "qwen35_reduced", "model_type": "qwen3_5_moe_text", "vocab": 248320, "seq": SEQ,
                  "config": dict(QWEN35_SMALL, num_hidden_layers=8, num_experts=64, num_experts_per_tok=8)}
QWEN3_30B_SLICE = {"name": "qwen3_30b_slice", "model_type": "qwen3_moe", "vocab": 151936, "seq": SEQ,
                   "config": dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                  num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_hidden_layers=48,
                                  num_experts=16, num_experts_per_tok=8, norm_topk_prob=True,
                                  max_position_embeddings=8192)}
TINY = {"name": "tiny", "model_type": "qwen3_5_moe_text", "vocab": 1024, "seq": 128,
        "config": dict(QWEN35_SMALL, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=16,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                       shared_expert_intermediate_size=64)}  # a CPU (gloo) rehearsal of this script
SHAPES = {s["name"]: s for s in (QWEN35_REDUCED, QWEN3_30B_SLICE, TINY)}
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOKENS_SEED = 0


def shape_config(shape: dict):
    from pitlab.trainer.prepare import build_config
    return build_config(shape["model_type"], shape["config"], vocab_size=shape["vocab"], eos_token_id=0,
                        pad_token_id=1, bos_token_id=0)


def synthetic_tokens(n: int, vocab: int) -> np.ndarray:
    from h200_qwen35 import write_synthetic_tokens
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"tp-tokens-{vocab}-{n}.npy"
    return write_synthetic_tokens(path, n, vocab, TOKENS_SEED)


def _free() -> None:
    gc.collect()
    if CUDA:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.reset_accumulated_memory_stats()  # allocation retries and OOMs counted per run


def _peaks() -> dict:
    if not CUDA:
        return {"peak_allocated": 0, "peak_reserved": 0}
    return {"peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved()}


LIGER_PATCHES = {"qwen3_5_moe_text": "apply_liger_kernel_to_qwen3_5_moe", "qwen3_moe": "apply_liger_kernel_to_qwen3_moe"}


@contextlib.contextmanager
def restored_modeling(model_type: str):
    """Inside: liger-kernel may patch the modeling module of ``model_type`` (its functions and its classes'
    methods, e.g. the RMSNorm class and the causal LM's ``forward``); on exit every module attribute and every
    class attribute of the module's classes is put back, so the runs after the Liger run use plain transformers."""
    import importlib
    import inspect

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    name = model_type_to_module_name(model_type.removesuffix("_text"))
    mod = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    module_dict = dict(vars(mod))
    classes = {c: dict(vars(c)) for c in module_dict.values() if inspect.isclass(c) and c.__module__ == mod.__name__}
    try:
        yield
    finally:
        for key in set(vars(mod)) - set(module_dict):
            delattr(mod, key)
        for key, value in module_dict.items():
            setattr(mod, key, value)
        for cls, attrs in classes.items():
            for key in set(vars(cls)) - set(attrs):
                delattr(cls, key)
            for key, value in attrs.items():
                if key not in ("__dict__", "__weakref__") and vars(cls).get(key) is not value:
                    setattr(cls, key, value)


def apply_liger(model, model_type: str) -> str:
    """The seed recipe's stack as axolotl applies it: liger-kernel's patch of this architecture on ``model``
    (RMSNorm, SwiGLU experts where liger has them, fused linear cross-entropy). Returns the report label."""
    from importlib.metadata import version

    import liger_kernel.transformers as lt

    getattr(lt, LIGER_PATCHES[model_type])(model=model)
    return f"liger-kernel {version('liger-kernel')} {LIGER_PATCHES[model_type]}"


def hf_setup(shape: dict, loss: str | None = None, compiled: bool = False, act_ckpt: bool = False, seed: int = 0,
             lr: float = 3e-4, liger: bool = False):
    """The plain loop's model, optimizer and kernel report on this process's device, and ``step(chunks)``: one
    training step over the microbatches ``chunks`` (each ``seq + 1`` token ids on the device; each loss divided by
    their count before its backward, the gradients summed, then clipping and AdamW), returning the mean loss
    tensor (not read, so not synchronised). ``loss="chunked"`` / ``compiled`` switch in pitlab's loss / compiled blocks (for the
    exploration only; the baseline uses neither)."""
    from transformers import AutoModelForCausalLM

    from pitlab.trainer.kernels import compile_blocks, select_kernels
    from pitlab.trainer.loss import install_loss

    config = shape_config(shape)
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.config.use_cache = False
    if act_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    label = "transformers ForCausalLMLoss (full logits)"
    if loss is not None:
        label = install_loss(model, loss)
    liger_label = apply_liger(model, shape["model_type"]) if liger else None
    if liger_label:
        label = "liger fused linear cross-entropy"
    report = select_kernels(model, torch.device(DEVICE), label)
    if liger_label:
        report["liger"] = liger_label
    if compiled:
        report["compile"] = compile_blocks(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=CUDA)

    def step(chunks: list[torch.Tensor]) -> torch.Tensor:
        total = 0.0
        for chunk in chunks:
            if loss is None:
                out = model(input_ids=chunk[None], labels=chunk[None])  # HF shifts the labels itself
            else:
                out = model(input_ids=chunk[None, :-1], labels=chunk[None, 1:])
            (out.loss / len(chunks)).backward()
            total = total + out.loss.detach() / len(chunks)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    return model, opt, report, step


def hf_training_loop(shape: dict, steps: int = 12, warmup: int = 3, loss: str | None = None, compiled: bool = False,
                     act_ckpt: bool = False, seed: int = 0, lr: float = 3e-4, liger: bool = False,
                     accumulation: int = 1) -> dict:
    """The plain loop on one GPU (:func:`hf_setup`), ``accumulation`` microbatches of one sequence per optimizer
    step; returns tokens/s (median of timed steps), tokens per step, step times, peak allocated bytes, losses
    and the kernel report."""
    _free()
    seq = shape["seq"]
    model, opt, report, step = hf_setup(shape, loss, compiled, act_ckpt, seed, lr, liger)
    n_chunks = (steps + warmup) * accumulation
    tokens = torch.from_numpy(synthetic_tokens((seq + 1) * n_chunks + 1, shape["vocab"]).astype(np.int64))
    times, losses = [], []
    t_first = time.perf_counter()
    sampler = GpuSampler() if CUDA else contextlib.nullcontext()
    for i in range(warmup + steps):
        chunks = [tokens[j * (seq + 1):(j + 1) * (seq + 1)].to(DEVICE)
                  for j in range(i * accumulation, (i + 1) * accumulation)]
        if i == warmup and CUDA:
            sampler.__enter__()
        t = time.perf_counter()
        losses.append(float(step(chunks)))  # synchronises
        times.append(time.perf_counter() - t)
        if i == warmup - 1:
            warm_s = time.perf_counter() - t_first
    if CUDA:
        sampler.__exit__(None, None, None)
    timed = times[warmup:]
    result = {"tokens_per_second": seq * accumulation / float(np.median(timed)), "tokens_per_step": seq * accumulation,
              "step_s": timed, "warmup_s": warm_s, **_peaks(),
              "gpu_state": sampler.summary() if CUDA else None,
              "loss_first_last": [losses[0], losses[-1]], "kernels": report, "activation_checkpointing": act_ckpt,
              "parameters": sum(p.numel() for p in model.parameters())}
    del model, opt, step
    _free()
    return result


def hf_best(shape: dict, steps: int, warmup: int, lr: float = 3e-4, liger: bool = False, accumulation: int = 1) -> dict:
    """The plain loop's best configuration: no activation checkpointing, or with it if that does not fit. With
    ``liger``, the same loop with liger-kernel's patch (:func:`apply_liger`), undone afterwards. ``accumulation``:
    microbatches per optimizer step (:func:`hf_training_loop`)."""
    if not liger:
        return _hf_best(shape, steps, warmup, lr, False, accumulation)
    with restored_modeling(shape["model_type"]):
        return _hf_best(shape, steps, warmup, lr, True, accumulation)


def _hf_best(shape: dict, steps: int, warmup: int, lr: float, liger: bool, accumulation: int) -> dict:
    try:
        return hf_training_loop(shape, steps, warmup, act_ckpt=False, lr=lr, liger=liger, accumulation=accumulation)
    except torch.OutOfMemoryError as err:
        _free()
        res = hf_training_loop(shape, steps, warmup, act_ckpt=True, lr=lr, liger=liger, accumulation=accumulation)
        res["note"] = f"out of memory without activation checkpointing: {str(err)[:200]}"
        return res


def init_single_process_group() -> None:
    """A world of one rank (this process) unless torchrun set one up."""
    import torch.distributed as dist
    if dist.is_initialized():
        return
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if CUDA else "gloo")


def sequences_per_step(overrides: dict | None) -> int:
    """Sequences per optimizer step of one rank in a pitlab run: ``gradientAccumulationSteps`` ×
    ``microBatchSize`` from its overrides (each 1 when not given, the spec's defaults)."""
    o = overrides or {}
    return int(o.get("gradientAccumulationSteps", 1)) * int(o.get("microBatchSize", 1))


def pitlab_spec(shape: dict, work: Path, n_steps: int, overrides: dict | None = None, lr: float = 3e-4) -> Path:
    """Collective: the run directory of pitlab's trainer for ``shape`` under ``work`` (a random-init base model,
    saved once and reused; ``n_steps`` optimizer steps of synthetic tokens for every rank) and its resolved
    spec (``spec.training`` updated with ``overrides``); returns the spec's path (``RunPaths(path.parent,
    path.parent / "base")``)."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from pitlab.api import PitTraining
    from pitlab.trainer.launch import write_spec
    from h200_qwen35 import training_resource

    world = dist.get_world_size()
    run = work / shape["name"]
    base = run / "base"
    rank0 = dist.get_rank() == 0
    missing = [not (base / "config.json").is_file()]
    dist.broadcast_object_list(missing, src=0)  # one decision for every rank: each checking alone could deadlock
    if missing[0] and rank0:
        torch.manual_seed(0)
        with torch.device(DEVICE):
            model = AutoModelForCausalLM.from_config(shape_config(shape), dtype=torch.bfloat16)
        model.save_pretrained(base)
        del model
    seq = shape["seq"]
    sequences = n_steps * sequences_per_step(overrides) * world  # sequences of seq tokens in all
    res = training_resource("tp-" + shape["name"].replace("_", "-"), base, seq, seq * sequences, world,
                            checkpointing=None)
    spec = res.model_dump(mode="json", by_alias=True)
    for key, value in dict({"learningRate": lr}, **(overrides or {})).items():
        spec["spec"]["training"][key] = value
    if rank0:  # one writer; the others read after the barrier
        tokens = synthetic_tokens((seq + 1) * sequences + 1, shape["vocab"])
        (run / "data").mkdir(parents=True, exist_ok=True)
        np.save(run / "data" / "tokens.npy", tokens)
        write_spec(PitTraining.model_validate(spec), run / "spec.json")
    dist.barrier()
    return run / "spec.json"


PLAN_MARGIN = 1.05
"""How far above the GPU's memory a run's predicted peak may be and the run still start: the single-device path on
the Qwen3-30B slice, predicted at 80.01 GiB on a 79.18 GiB H100, reserved 77.7 GiB and ran (2026-12-06); FSDP2's
reserved peaks were 2.5 % above the prediction on the reduced shape."""


def unique_labels(labels: list[str]) -> list[str]:
    """``labels`` with the second, third, ... occurrence of one suffixed `` #2``, `` #3`` (a run given twice in
    ``--runs`` keeps both results)."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


def plan_exceeds_gpu(spec_path: Path, capacity_bytes: int) -> str | None:
    """Why the pitlab run of ``spec_path`` (``pitlab_spec``'s) cannot fit ``capacity_bytes`` of GPU memory: its
    predicted peak (the memory it would reserve: under FSDP2 the reduce-scatter stream's pool of float32
    gradient shards beside the allocated peak), for the strategy the environment chooses, above ``PLAN_MARGIN`` ×
    the GPU's memory; None when it may fit. Such a run would only spend device time on an out-of-memory error
    (FSDP2 on the Qwen3-30B slice on an 80 GB card: a predicted peak of 92.05 GiB, allocated 81.21 GiB; it ran out
    of memory in every call of 2026-12-06)."""
    from transformers import AutoConfig

    from pitlab.api import PitTraining
    from pitlab.trainer.plan import GiB, model_shape, plan_memory

    spec = PitTraining.model_validate(json.loads(spec_path.read_text())).spec
    plan = plan_memory(spec, model_shape(AutoConfig.from_pretrained(spec_path.parent / "base")),
                       gpu_memory_gib=capacity_bytes / GiB)
    if plan.peak_bytes <= PLAN_MARGIN * capacity_bytes:
        return None
    path = "single-device" if plan.single_device else "FSDP2"
    return (f"predicted peak {plan.peak_bytes / GiB:.2f} GiB (allocated {plan.allocated_bytes / GiB:.2f} GiB; "
            f"{path}, activation checkpointing {plan.activation_checkpointing}) is more than {PLAN_MARGIN:g} x "
            f"this GPU's {capacity_bytes / GiB:.2f} GiB")


def memory_by_stream() -> dict:
    """The caching allocator's segments grouped by the CUDA stream that allocated them (``torch.cuda.
    memory_snapshot``): ``{stream: {"reserved": bytes, "allocated": bytes, "segments": count}}``. A block freed on
    one stream is reused only by that stream's allocations, so each stream's reserved bytes are that pool's own
    peak until the cache is emptied. Empty without CUDA."""
    pools: dict = {}
    for seg in torch.cuda.memory_snapshot() if CUDA else []:
        pool = pools.setdefault(str(seg["stream"]), {"reserved": 0, "allocated": 0, "segments": 0})
        pool["reserved"] += seg["total_size"]
        pool["allocated"] += seg["allocated_size"]
        pool["segments"] += 1
    return pools


def cap_memory(fraction_of_plan: float | None, plan) -> float | None:
    """Limit this process's CUDA caching allocator to ``fraction_of_plan`` × the plan's peak (bytes), so that a run
    whose reserved memory outgrows its plan either fits by freeing cached blocks (``num_alloc_retries`` counts
    those) or fails with out-of-memory; returns the cap in bytes, or None (no cap, no CUDA or no plan)."""
    if fraction_of_plan is None or not CUDA or plan is None:
        return None
    cap = fraction_of_plan * plan.peak_bytes
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory))
    return cap


def pitlab_run(shape: dict, work: Path, steps: int, warmup: int, overrides: dict | None = None,
               lr: float = 3e-4, profile_steps: int = 0) -> dict:
    """pitlab's trainer setup + steps in this process (no checkpoint); tokens/s, MFU, peak, planner, kernels,
    the allocator's segments per stream after the timed steps (:func:`memory_by_stream`). ``profile_steps`` > 0:
    that many more steps after the timed ones under ``torch.profiler`` (:func:`profiled_steps`), in
    ``result["profile"]``. ``overrides["memoryCap"]`` (a fraction of the planned peak, not a spec field):
    :func:`cap_memory` for the steps."""
    import torch.distributed as dist

    from pitlab.trainer.metrics import LossHistory
    from pitlab.trainer.step import run_steps
    from pitlab.trainer.train import RunPaths, setup_run

    from pitlab.trainer.kernels import KERNEL_CALLS

    _free()
    overrides = dict(overrides or {})
    cap_fraction = overrides.pop("memoryCap", None)
    world = dist.get_world_size()
    seq = shape["seq"]
    n_steps = steps + warmup
    calls_before = dict(KERNEL_CALLS)
    # + 1: a step after the timed ones, so that each timed step is timed from the previous read to its own (the
    # loop's last step is timed from its launch); + 1: the step of launch_syncs
    total_steps = n_steps + 2 + max(0, profile_steps)
    spec_path = pitlab_spec(shape, work, total_steps, overrides, lr)
    too_big = (plan_exceeds_gpu(spec_path, torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
               if CUDA else None)
    if too_big is not None:
        return {"skipped": too_big}
    _free()
    reserved_at_start = torch.cuda.memory_reserved() if CUDA else 0
    t0 = time.perf_counter()
    ctx = setup_run(spec_path, RunPaths(spec_path.parent, spec_path.parent / "base"))
    setup_s = time.perf_counter() - t0
    times, losses = [], []
    sampler = GpuSampler() if CUDA else None
    cap = cap_memory(cap_fraction, ctx.plan)
    history = LossHistory()
    # The sampler (it spawns nvidia-smi) starts at the read of the step before the last warm-up step, so it also
    # samples that last warm-up step: a step's time leaves out the caller's own time while the device runs on, and
    # started at the last warm-up step's read it probably took the spawn's time out of the first timed step
    # (52-62 ms against 99-101 ms for the others at 4,096 tokens per step on an H100, 2026-12-07).
    sampler_at = warmup - 2
    if sampler_at < 0 and sampler is not None:
        sampler.__enter__()
    try:
        # as the trainer's loop: each step read while the next runs; a step's time is from the previous read
        for step, out in run_steps(ctx, range(n_steps + 1), history):
            if step == sampler_at and sampler is not None:
                sampler.__enter__()
            if step < n_steps:
                times.append(out.seconds)
                losses.append(out.loss)
    finally:
        if cap is not None:
            torch.cuda.set_per_process_memory_fraction(1.0)
    if sampler is not None:
        sampler.__exit__(None, None, None)
    stats = torch.cuda.memory_stats() if CUDA else {}
    timed = times[warmup:]
    tokens_per_step = seq * sequences_per_step(overrides) * world
    tps = tokens_per_step / float(np.median(timed))
    result = {"tokens_per_second": tps, "tokens_per_step": tokens_per_step, "tokens_per_second_per_gpu": tps / world,
              "step_s": timed, "gpu_state": sampler.summary() if sampler is not None else None,
              "warmup_s": sum(times[:warmup]), "setup_s": setup_s, "world_size": world, **_peaks(),
              # memory an earlier run of this process left reserved (CUDA-graph pools): not this run's, not planned
              "reserved_at_start": reserved_at_start,
              "planned_peak": ctx.plan.peak_bytes if ctx.plan is not None else None,
              "planned_allocated": ctx.plan.allocated_bytes if ctx.plan is not None else None,
              "plan_components": ctx.plan.components if ctx.plan is not None else None,
              "plan_table": ctx.plan.table() if ctx.plan is not None else None,
              "activation_checkpointing": ctx.activation_checkpointing, "kernels": ctx.kernels,
              "parallelism": ctx.parallelism,
              "flops_per_token": ctx.flops_per_token, "peak_flops": ctx.peak_flops,
              "mfu": None if ctx.peak_flops is None else tps * ctx.flops_per_token / (ctx.peak_flops * world),
              "loss_first_last": [losses[0], losses[-1]], "parameters": ctx.shape.total,
              "active_parameters": ctx.shape.active, "training_overrides": overrides or {},
              "fla_calls_per_step": {k: (v - calls_before.get(k, 0)) / n_steps for k, v in KERNEL_CALLS.items()},
              "memory_by_stream": memory_by_stream(), "memory_cap": cap,
              "num_alloc_retries": stats.get("num_alloc_retries"), "num_ooms": stats.get("num_ooms")}
    if result["planned_allocated"] and result["peak_allocated"]:
        result["plan_error_vs_allocated"] = ((result["planned_allocated"] - result["peak_allocated"])
                                             / result["peak_allocated"])
    result["launch_syncs"] = launch_syncs(ctx, n_steps + 1)
    if profile_steps > 0:
        def run_all(idx):
            for _ in run_steps(ctx, range(idx[0], idx[-1] + 1), history):
                pass

        result["profile"] = profiled_steps(run_all, range(n_steps + 2, total_steps))
    ctx.close()
    del ctx
    _free()
    return result


def launch_syncs(ctx, step: int) -> dict:
    """Step ``step`` launched under CUDA's sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``), then read:
    the host syncs inside :func:`pitlab.trainer.step.launch_step` (none lets the host launch a step while the
    device still runs the one before), with the warning of the first few. On the CPU the step runs plainly."""
    import warnings

    from pitlab.trainer.step import finish_step, launch_step

    if not CUDA:
        finish_step(ctx, launch_step(ctx, step))
        return {"count": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            pending = launch_step(ctx, step)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    finish_step(ctx, pending)
    # the mode's own notice ("a prototype feature and does not yet detect all synchronizing operations") is no sync
    syncs = [w for w in caught if "synchroniz" in str(w.message) and "prototype" not in str(w.message)]
    return {"count": len(syncs), "first": [f"{w.filename}:{w.lineno}: {str(w.message)[:160]}" for w in syncs[:5]]}


def profiled_steps(steps, indices) -> dict:
    """``steps(indices)`` (the steps of ``indices``, consecutive) under ``torch.profiler`` (CPU, and CUDA on a
    GPU): wall seconds per
    step (synchronised), device-busy seconds per step (the sum of the kernels' device time: below the wall
    time when the GPU waits for the host, or above it when kernels overlap), host operator calls per step
    (``aten::`` operators, launches on CUDA), and the top operators by own device time and by call count."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    idx = list(indices)
    with profile(activities=acts) as prof:
        if CUDA:
            torch.cuda.synchronize()
        t = time.perf_counter()
        steps(idx)
        if CUDA:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
    ev = prof.key_averages()
    dev = lambda e: getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))  # noqa: E731
    n = max(1, len(idx))
    # kernels only: an operator's own device time repeats the kernels it launched, which are listed too, and a
    # record_function range (step.forward, step.optimizer) shows on the device as a span over its kernels
    busy = sum(dev(e) for e in ev if e.device_type == DeviceType.CUDA
               and not getattr(e, "is_user_annotation", False)) / 1e6 / n
    aten = sum(e.count for e in ev if e.key.startswith("aten::")) / n
    union = _kernel_union_s(prof) / n if CUDA else None
    launches = sum(e.count for e in ev if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    top_dev = sorted(ev, key=dev, reverse=True)[:25]
    top_calls = sorted((e for e in ev if e.key.startswith("aten::")), key=lambda e: e.count, reverse=True)[:25]
    gaps = idle_gaps(prof, n) if CUDA else None
    return {"idle_gaps": gaps, "steps": n, "wall_s_per_step": wall / n, "device_busy_s_per_step": busy if CUDA else None,
            "device_busy_fraction": busy / (wall / n) if CUDA and wall else None, "aten_calls_per_step": aten,
            "device_busy_union_s_per_step": union,
            "device_idle_fraction": 1 - union / (wall / n) if CUDA and wall else None,
            "kernel_launches_per_step": launches / n if CUDA else None,
            "top_device_time": [(e.key, round(dev(e) / 1e3 / n, 3), e.count // n) for e in top_dev],
            "top_calls": [(e.key, e.count // n, round(e.self_cpu_time_total / 1e3 / n, 3)) for e in top_calls]}


def _kernel_union_s(prof) -> float:
    """Seconds in which at least one kernel ran on the device, over the profiled steps (the union of the kernels'
    intervals: overlapping kernels count once, so ``1 - union / wall`` is the time the GPU waited for the host)."""
    from torch.autograd import DeviceType

    return interval_union((e.time_range.start, e.time_range.end) for e in prof.events()
                          if e.device_type == DeviceType.CUDA
                          and not getattr(e, "is_user_annotation", False)) / 1e6


def idle_gaps(prof, n_steps: int, min_us: float = 20.0, top: int = 15, host_top: int = 5) -> dict:
    """Where the GPU waited for the host in the profiled steps: the gaps between consecutive kernels (of the union
    of their intervals) longer than ``min_us`` microseconds; their total per step (ms), per ``step.*`` phase
    (``record_function`` ranges as the device saw them), their count per step, and the ``top`` longest with the
    kernel before and after each and its start in ms from the first kernel; the ``host_top`` longest also with
    what the host ran meanwhile (:func:`host_during`)."""
    from torch.autograd import DeviceType

    events = prof.events()
    spans = merged_intervals((e.time_range.start, e.time_range.end, e.name) for e in events
                             if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False))
    if not spans:
        return {}
    marks = [e for e in events if getattr(e, "is_user_annotation", False) and e.name.startswith("step.")]
    on_device = [e for e in marks if e.device_type == DeviceType.CUDA]  # the ranges as the GPU ran them
    phases = sorted((e.time_range.start, e.time_range.end, e.name) for e in (on_device or marks))

    def phase(t: float) -> str:
        inside = [p for p in phases if p[0] <= t <= p[1]]
        return inside[-1][2] if inside else "between phases"

    t0 = spans[0][0]
    found = sorted(((nxt[0] - cur[1], cur[1] - t0, cur[3], nxt[2], phase(cur[1] + 1e-3), cur[1], nxt[0])
                    for cur, nxt in zip(spans, spans[1:]) if nxt[0] - cur[1] > min_us), reverse=True)
    by_phase: dict = {}
    for g in found:
        by_phase[g[4]] = by_phase.get(g[4], 0.0) + g[0] / 1e3 / n_steps
    host = [e for e in events if e.device_type == DeviceType.CPU]
    return {"min_gap_us": min_us, "gaps_per_step": len(found) / n_steps,
            "gap_ms_per_step": sum(g[0] for g in found) / 1e3 / n_steps,
            "gap_ms_per_step_by_phase": {k: round(v, 3) for k, v in by_phase.items()},
            "longest": [{"us": round(g, 1), "at_ms": round(at / 1e3, 3), "phase": ph, "after": b[:120],
                         "before": a[:120], **({"host": host_during(host, start, end)} if i < host_top else {})}
                        for i, (g, at, b, a, ph, start, end) in enumerate(found[:top])]}


def host_during(host_events, start: float, end: float, min_share: float = 0.1, top: int = 12) -> list[dict]:
    """What the host ran while the GPU idled in ``[start, end]`` (µs, the profiler's clock, which host and device
    events share): every host event (``record_function`` range or operator) covering at least ``min_share`` of
    the window, as ``{"name", "us", "depth"}`` (``us``: its overlap with the window; ``depth``: its nesting level,
    0 outermost), outermost first, longest first within a level; the ``top`` first of them."""
    window = end - start
    rows = []
    for e in host_events:
        overlap = min(end, e.time_range.end) - max(start, e.time_range.start)
        if overlap >= min_share * window:
            depth, parent = 0, getattr(e, "cpu_parent", None)
            while parent is not None:
                depth, parent = depth + 1, getattr(parent, "cpu_parent", None)
            rows.append((depth, -overlap, e.name[:100]))
    return [{"name": n, "us": round(-o, 1), "depth": d} for d, o, n in sorted(rows)[:top]]


def merged_intervals(intervals) -> list[tuple]:
    """``(start, end, name)`` intervals merged where they overlap or touch, in order: ``(start, end, first name,
    name of the interval that ends last)`` per merged span."""
    spans: list[list] = []
    for s, e, name in sorted(intervals, key=lambda x: (x[0], x[1])):
        if spans and s <= spans[-1][1]:
            if e > spans[-1][1]:
                spans[-1][1], spans[-1][3] = e, name
        else:
            spans.append([s, e, name, name])
    return [tuple(x) for x in spans]


def interval_union(intervals) -> float:
    """The length covered by ``(start, end)`` intervals (any unit), overlapping ones counted once."""
    return sum(e - s for s, e, _, _ in merged_intervals((s, e, None) for s, e in intervals))


def with_env(env: dict, fn):
    """``fn()`` with the environment variables ``env`` (str -> str) set, restored afterwards."""
    with mock.patch.dict(os.environ, {k: str(v) for k, v in env.items()}):
        return fn()


def pl_flops(entry: dict) -> float | None:
    """pitlab's FLOPs per token over the GPU's peak FLOP/s (MFU per token/s), from the entry's pitlab run."""
    pl = entry.get("pitlab", {})
    if pl.get("flops_per_token") is None or pl.get("peak_flops") is None:
        return None
    return pl["flops_per_token"] / pl["peak_flops"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="qwen35_reduced,qwen3_30b_slice")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=570)
    ap.add_argument("--lr", type=float, default=3e-4, help="peak learning rate of both loops (speed does not "
                    "depend on it; the 48-layer random-init slice diverges at 3e-4)")
    ap.add_argument("--accumulation", type=int, default=1,
                    help="microbatches (of one sequence) per optimizer step in every run: the plain loops accumulate "
                         "that many before each step, pitlab runs get gradientAccumulationSteps unless their "
                         "overrides set it (the update is then shared by accumulation x seq tokens)")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="after each pitlab run's timed steps, this many more under torch.profiler: wall vs "
                         "device-busy time per step, host calls, the top operators (\"profile\" in the run's entry)")
    ap.add_argument("--checks", default="conv,loss", help="gpu_checks.py sections to run first (CUDA only): "
                    "conv, loss, gdr, model, optimizer")
    ap.add_argument("--runs", default="hf;default",
                    help="runs per shape, in order, semicolon-separated: hf, liger (the plain loop with liger-kernel's patch, "
                         "issue 27's standing baseline; needs the liger-kernel wheel), default, or a JSON object of "
                         "spec.training overrides for another pitlab run (e.g. {\"compile\": false}); its key \"env\" "
                         "sets environment variables for that run only (e.g. {\"env\": {\"PITLAB_FORCE_FSDP2\": \"1\"}})")
    args = ap.parse_args()
    if args.accumulation < 1:  # refused before any work
        ap.error(f"--accumulation: must be at least 1 (got {args.accumulation})")
    accum = args.accumulation
    # every pitlab run's overrides start from the plain loops' accumulation (none at 1: the spec's default)
    accum_overrides = {"gradientAccumulationSteps": accum} if accum > 1 else {}
    t_begin = time.perf_counter()
    import torch._dynamo
    # several runs in one process: the fused optimizer's update is compiled once per parameter rank, dtype and
    # run kind, more variants together than one run has (the trainer allows 4 per decoder layer)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    args.out.mkdir(parents=True, exist_ok=True)
    init_single_process_group()
    import torch.distributed as dist
    rank = dist.get_rank()
    import transformers
    try:
        import triton
    except ImportError:
        triton = None
    results: dict = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name() if CUDA else "cpu",
                     "torch": torch.__version__, "triton": getattr(triton, "__version__", None),
                     "transformers": transformers.__version__, "host_at_start": host_load(), "accumulation": args.accumulation,
                     "shapes": {}}
    try:
        import fla
        results["fla"] = fla.__version__
    except Exception as err:  # noqa: BLE001
        results["fla"] = f"not importable: {err}"

    def save() -> None:
        results["elapsed_s"] = time.perf_counter() - t_begin
        if rank == 0:
            (args.out / "throughput.json").write_text(json.dumps(results, indent=2, default=str))

    if args.checks and CUDA:  # the fast paths' correctness first (gpu_checks.py), in this process
        import gpu_checks
        from pitlab.trainer.kernels import _bound_implementation
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as qm
        ref_conv = _bound_implementation(qm.causal_conv1d_fn)
        checks: dict = {}
        for name in args.checks.split(","):
            t = time.perf_counter()
            try:
                {"conv": lambda: gpu_checks.conv_check(checks, ref_conv), "loss": lambda: gpu_checks.loss_check(checks),
                 "gdr": lambda: gpu_checks.gdr_check(checks),
                 "model": lambda: gpu_checks.model_check(checks, ref_conv),
                 "optimizer": lambda: gpu_checks.optimizer_check(checks)}[name]()
            except Exception as err:  # noqa: BLE001
                checks[name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
            print(f"check {name} ({time.perf_counter() - t:.1f} s):", json.dumps(checks.get(name), default=str)[:1500],
                  flush=True)
            _free()
        results["checks"] = checks
        save()
    def runs_of(shape: dict) -> list:
        """(label, function) in --runs order: hf, default (pitlab with the spec defaults), or a JSON object of
        spec.training overrides for another pitlab run."""
        out = []
        for item in (x.strip() for x in args.runs.split(";") if x.strip()):
            if item == "hf":
                out.append(("hf", lambda: hf_best(shape, args.steps, args.warmup, args.lr, accumulation=accum)))
            elif item == "liger":
                out.append(("liger", lambda: hf_best(shape, args.steps, args.warmup, args.lr, liger=True,
                                                     accumulation=accum)))
            elif item == "default":
                out.append(("pitlab", lambda: pitlab_run(shape, args.work, args.steps, args.warmup,
                                                         accum_overrides or None, args.lr, args.profile_steps)))
            else:
                v = json.loads(item)
                env = v.pop("env", {})
                label = "pitlab " + ",".join([f"{k}={v[k]}" for k in sorted(v)] + [f"{k}={env[k]}" for k in sorted(env)])
                out.append((label, lambda v=v, env=env: with_env(env, lambda: pitlab_run(
                    shape, args.work, args.steps, args.warmup, dict(accum_overrides, **v), args.lr, args.profile_steps))))
        return list(zip(unique_labels([label for label, _ in out]), [fn for _, fn in out]))

    for name in args.shapes.split(","):
        shape = SHAPES[name]
        entry = results["shapes"].setdefault(name, {"config": shape["config"], "vocab": shape["vocab"],
                                                    "seq": shape["seq"]})
        for label, fn in runs_of(shape):
            # compiled layers compile first (≈ 150 s on an H200); a run without compile: build + steps ≈ 60 s
            need = (150 if "compile=True" in label else 60) if CUDA else 45
            left = args.budget_s - (time.perf_counter() - t_begin)
            if left < need:
                entry[label] = {"skipped": f"budget: {left:.0f} s left, {need} s needed"}
                print(f"{name} {label}: skipped ({left:.0f} s of --budget-s left, {need} s needed)", flush=True)
                continue
            t = time.perf_counter()
            try:
                entry[label] = fn()
            except Exception as err:  # noqa: BLE001 - keep measuring the rest
                entry[label] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
                print(traceback.format_exc(), flush=True)
            entry[label]["wall_s"] = time.perf_counter() - t
            entry[label]["host_after"] = host_load()
            if rank == 0:
                print(name, label, json.dumps({k: v for k, v in entry[label].items()
                                               if k not in ("step_s", "plan_table", "plan_components", "traceback", "profile")},
                                              default=str), flush=True)
            save()
        pl = entry.get("pitlab", {})
        for loop in ("hf", "liger"):  # the two baselines: ratio and MFU (pitlab's FLOP count) of each
            base = entry.get(loop, {})
            if "tokens_per_second" in base and "tokens_per_second" in pl:
                entry[f"ratio_pitlab_per_gpu_to_{loop}"] = pl["tokens_per_second_per_gpu"] / base["tokens_per_second"]
                per_token = pl_flops(entry)
                entry[f"{loop}_mfu"] = None if per_token is None else base["tokens_per_second"] * per_token
        save()
    if rank == 0:
        print(f"\n{'shape':<18}{'run':<36}{'tokens/s/GPU':>13}{'MFU':>8}{'alloc GB':>9}{'plan GB':>9}{'act-ckpt':>9}")
        for name, entry in results["shapes"].items():
            for label, r in entry.items():
                if isinstance(r, dict) and "tokens_per_second" in r:
                    per = r.get("tokens_per_second_per_gpu", r["tokens_per_second"])
                    mfu = r.get("mfu", entry.get(f"{label}_mfu"))
                    plan = r.get("planned_allocated")
                    mfu_text = "–" if mfu is None else f"{mfu * 100:.1f}%"
                    print(f"{name:<18}{label:<36}{per:>13,.0f}{mfu_text:>8}"
                          f"{r['peak_allocated'] / 1e9:>9.1f}{(plan or 0) / 1e9:>9.1f}"
                          f"{str(r.get('activation_checkpointing')):>9}")
            if "ratio_pitlab_per_gpu_to_hf" in entry:
                print(f"{name:<18}ratio pitlab / plain HF loop = {entry['ratio_pitlab_per_gpu_to_hf']:.3f}")
            if "ratio_pitlab_per_gpu_to_liger" in entry:
                print(f"{name:<18}ratio pitlab / HF + Liger = {entry['ratio_pitlab_per_gpu_to_liger']:.3f}")
            for label, r in entry.items():  # every pitlab run: spread of its timed steps, reserved against the plan
                if isinstance(r, dict) and "step_s" in r and r.get("planned_peak"):
                    own = r["peak_reserved"] - r.get("reserved_at_start", 0)
                    single = entry.get("pitlab", {}).get("tokens_per_second_per_gpu")
                    vs = "" if not single or label == "pitlab" else \
                        f", {r['tokens_per_second_per_gpu'] / single:.3f} x the default run"
                    memory = (f", reserved {r['peak_reserved'] / 1e9:.2f} GB ({own / 1e9:.2f} GB its own) against "
                              f"a planned peak of {r['planned_peak'] / 1e9:.2f} GB") if CUDA else ""
                    print(f"{name:<18}{label[:36]:<36} steps max/min {max(r['step_s']) / min(r['step_s']):.3f}"
                          f"{memory}{vs}")
                    pools = ", ".join(f"stream {k}: {v['reserved'] / 1e9:.2f} GB reserved, {v['allocated'] / 1e9:.2f} "
                                      f"allocated" for k, v in r.get("memory_by_stream", {}).items())
                    if pools:
                        print(f"{'':<18}{'':<36} after the timed steps: {pools}; allocation retries "
                              f"{r.get('num_alloc_retries')}, out-of-memory {r.get('num_ooms')}"
                              + (f", capped at {r['memory_cap'] / 1e9:.2f} GB" if r.get("memory_cap") else ""))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
