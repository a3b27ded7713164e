"""GPU benchmark of layer streaming (issue 12): LoRA continued pretraining of an 8B model under a 4 GiB cap.

Builds a random-initialised base in ``--work`` (Llama-3.1-8B dimensions by default, bf16 safetensors written
module by module, seeded; or ``--model qwen35-moe``, a 10.5B qwen3_5_moe_text), a synthetic token file, and a
PitTraining with ``method: lora`` (r=8 on q/k/v/o) and ``training.layerStreaming``; caps this process's CUDA
caching allocator with ``torch.cuda.set_per_process_memory_fraction`` (``--cap-gib``, 4 by default), measures
the pinned host→GPU bandwidth, picks the largest tokens per microbatch the planner fits under the cap, and runs
pitlab's trainer in this process (world size 1; the same ``pitlab.trainer.train.train`` the pods run). Writes
``bench-streaming.json`` to ``--out``: tokens/s (median of the steps after ``--warmup``), measured peak
(``max_memory_allocated`` and ``max_memory_reserved``) against the planner's prediction, bytes moved per step,
the pinned bandwidth and the transfer bound (bytes per step ÷ bandwidth) with the fraction of it reached.

    python bench/streaming.py --work /tmp/stream --out "$OUT" [--model llama8b|qwen35-moe] [--steps 12] [--baseline]
        [--accum K [--boundary-store auto|gpu|host] [--no-layer-major]]
    python bench/streaming.py --work /tmp/stream --out /tmp/out --tiny [--accum 2]   # CPU smoke test of this script

``--baseline`` first runs the same steps on the resident model (FSDP2 on the one GPU, no cap) for the speed
ratio, with the same ``--accum`` (the same tokens per optimizer step). ``--accum K`` (``gradientAccumulationSteps``)
> 1 runs the streamed model layer-major (``training.layerStreaming.layerMajor``: every streamed layer for all K
microbatches before the next is fetched; the planner places the boundary activations, ``--boundary-store``);
``--no-layer-major`` runs the K microbatches one at a time instead. Check correctness on the GPU before speed:
``pytest tests/test_streaming.py tests/test_layer_major.py -k cuda`` (streamed and layer-major vs resident logits
and gradients, ``torch.equal``). For ``qwen35-moe`` source the kit first (``../shared/gpu``:
flash-linear-attention on Hopper).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GiB = 2 ** 30
MODELS = {
    # Llama-3.1-8B dimensions (8.03 B parameters, untied head, vocabulary 128,256)
    "llama8b": ("llama", dict(hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                              num_attention_heads=32, num_key_value_heads=8,
                              rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
                              max_position_embeddings=8192, tie_word_embeddings=False, rms_norm_eps=1e-5),
                128_256),
    # the Qwen3.5-35B-A3B layer (3 linear-attention : 1 full-attention, hidden 2048) with 64 of its 256 experts:
    # 10.5 B parameters (vocabulary 248,320), all experts of a layer streamed with it
    "qwen35-moe": ("qwen3_5_moe_text", dict(hidden_size=2048, num_hidden_layers=40, num_experts=64,
                                            num_experts_per_tok=8, moe_intermediate_size=512,
                                            shared_expert_intermediate_size=512, max_position_embeddings=8192),
                   248_320),
    # CPU smoke test
    "tiny": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=512), 1024),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def write_random_base(config, out: Path, seed: int = 0, shard_bytes: int = 4 * GiB) -> int:
    """Write a random-initialised bf16 model of ``config`` to ``out`` (config.json, safetensors shards, index)
    one module at a time — each decoder layer, then the modules outside them, copied from the meta-device
    model to the CPU and initialised by the model's own ``_init_weights`` (so norms, ``A_log`` and the like
    get their real initial values) — without ever holding the model; returns the parameter count."""
    import copy

    import safetensors.torch
    from transformers import AutoModelForCausalLM

    from pitlab.trainer.fsdp import decoder_layers

    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    torch.manual_seed(seed)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    wanted = set(dict(meta.named_parameters()))  # tied weights once
    wanted |= {f"{m}.{b}" if m else b for m, mod in meta.named_modules() for b, _ in mod.named_buffers(recurse=False)
               if b not in mod._non_persistent_buffers_set}
    layers = decoder_layers(meta)
    in_layers = {id(m) for layer in layers for m in layer.modules()}
    parts = [(f"model.layers.{i}.", layer, True) for i, layer in enumerate(layers)]
    parts += [(f"{n}." if n else "", m, False) for n, m in meta.named_modules()
              if id(m) not in in_layers and any(True for _ in m.parameters(recurse=False))]

    def tensors(prefix: str, module, recurse: bool):
        cpu = copy.deepcopy(module).to_empty(device="cpu")
        with torch.no_grad():
            for m in cpu.modules():
                meta._init_weights(m)
        items = cpu.state_dict() if recurse else {
            **dict(cpu.named_parameters(recurse=False)), **dict(cpu.named_buffers(recurse=False))}
        return {prefix + k: v.detach().to(torch.bfloat16).contiguous() for k, v in items.items()
                if prefix + k in wanted}

    shard, size, index, n, total = {}, 0, {}, 0, 0

    def flush() -> None:
        nonlocal shard, size, n
        fname = f"model-{n:05d}.safetensors"
        safetensors.torch.save_file(shard, str(out / fname), metadata={"format": "pt"})
        index.update({k: fname for k in shard})
        shard, size, n = {}, 0, n + 1

    for prefix, module, recurse in parts:
        for name, t in tensors(prefix, module, recurse).items():
            shard[name] = t
            size += t.numel() * t.element_size()
            total += t.numel() if name in dict(meta.named_parameters()) else 0
        if size >= shard_bytes:
            flush()
    if shard:
        flush()
    missing = wanted - set(index)
    if missing:
        raise RuntimeError(f"write_random_base: no tensor written for {sorted(missing)[:5]}")
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    return total


def pinned_bandwidth(device: torch.device, nbytes: int = 256 * 2 ** 20, repeats: int = 20) -> float:
    """Host→GPU bytes/s of ``non_blocking`` copies from a page-locked buffer (CUDA events; median of
    ``repeats`` copies of ``nbytes``)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    times = []
    for _ in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del dst
    torch.cuda.empty_cache()
    return nbytes / float(np.median(times[2:]))


def resource(base: Path, seq: int, micro: int, steps: int, budget: int | None, buffers: int, accum: int = 1,
             layer_major: bool = True, boundary_store: str = "auto"):
    from pitlab.api import PitTraining

    return PitTraining.model_validate({
        "apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "metadata": {"name": "bench-streaming"},
        "spec": {"baseModel": {"uri": str(base)}, "corpus": {"uri": "synthetic.jsonl", "format": "jsonl"},
                 "knowledgeCutoff": "2020-12-31", "tokens": seq * micro * accum * steps, "method": "lora",
                 "lora": {"r": 8, "alpha": 16, "targetModules": TARGETS},
                 "training": {"seqLen": seq, "microBatchSize": micro, "gradientAccumulationSteps": accum,
                              "learningRate": 1e-4, "warmupSteps": 2, "precision": "bf16",
                              "layerStreaming": {"enabled": True, "buffers": buffers, "gpuMemoryBudgetBytes": budget,
                                                 "layerMajor": layer_major, "boundaryStore": boundary_store}},
                 "resources": {"nodes": 1, "gpusPerNode": 1},
                 "checkpoint": {"everySteps": 0, "keep": 1}}})


def largest_fit(base: Path, seq: int, steps: int, budget: int, buffers: int, max_micro: int = 64,
                **order) -> tuple[int, int]:
    """``(seq, microBatchSize)`` with the most tokens per microbatch that the planner fits under ``budget``:
    the largest microbatch of ``seq``-token sequences, or, if not one fits, the longest sequence (multiple of
    128). ``order``: :func:`resource`'s ``accum``, ``layer_major`` and ``boundary_store``."""
    from pitlab.trainer.plan import model_shape, spec_config
    from pitlab.trainer.plan_streaming import plan_streaming

    spec = resource(base, seq, 1, steps, budget, buffers, **order).spec
    shape, sshape = model_shape(spec_config(spec)), _sshape(spec)  # built once (meta device)

    def fits(s: int, m: int) -> bool:
        return plan_streaming(resource(base, s, m, steps, budget, buffers, **order).spec, shape, sshape).fits
    micro = 0
    while micro < max_micro and fits(seq, micro + 1):
        micro += 1
    if micro:
        return seq, micro
    while seq > 128 and not fits(seq, 1):
        seq -= 128
    return seq, 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", choices=sorted(MODELS), default="llama8b")
    ap.add_argument("--tiny", action="store_true", help="the tiny model on the CPU (a smoke test of this script)")
    ap.add_argument("--cap-gib", type=float, default=4.0, help="set_per_process_memory_fraction cap (GiB)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro", type=int, default=None, help="microbatch size (default: the largest that fits)")
    ap.add_argument("--buffers", type=int, default=2)
    ap.add_argument("--accum", type=int, default=1,
                    help="gradientAccumulationSteps K (microbatches per optimizer step, baseline too); K > 1 streams "
                         "layer-major unless --no-layer-major")
    ap.add_argument("--no-layer-major", action="store_true",
                    help="with --accum K > 1: one microbatch at a time (training.layerStreaming.layerMajor: false)")
    ap.add_argument("--boundary-store", choices=["auto", "gpu", "host"], default="auto",
                    help="layer-major: where the boundary activations live (training.layerStreaming.boundaryStore)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the steady tokens/s")
    ap.add_argument("--baseline", action="store_true",
                    help="first run the same steps on the resident model (FSDP2, one GPU, no cap) for the ratio")
    ap.add_argument("--no-cudnn-sdp", action="store_true",
                    help="torch.backends.cuda.enable_cudnn_sdp(False) before training (bench/sdpa_nan.py)")
    args = ap.parse_args()
    from pitlab.trainer.train import ALLOC_CONF_VARS, default_alloc_conf

    os.environ.update(default_alloc_conf(os.environ))  # as the trainer runs: before the first CUDA allocation
    if args.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    if args.tiny:
        args.model, args.seq, args.micro = "tiny", 128, args.micro or 4

    import torch.distributed as dist
    from transformers import AutoConfig

    from pitlab.trainer.prepare import build_config

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    run, out = args.work, args.out
    out.mkdir(parents=True, exist_ok=True)
    model_type, overrides, vocab = MODELS[args.model]
    base = run / "base"
    t0 = time.perf_counter()
    if not (base / "model.safetensors.index.json").is_file():
        n_params = write_random_base(build_config(model_type, overrides, vocab_size=vocab, eos_token_id=0,
                                                  pad_token_id=1, bos_token_id=0), base)
    else:
        n_params = None
    print(f"bench: base {args.model} in {base} ({time.perf_counter() - t0:.0f} s)", flush=True)

    result = {"command": " ".join(sys.argv), "model": args.model, "model_type": model_type, "config": overrides,
              "vocab": vocab, "parameters": n_params, "buffers": args.buffers, "device": str(device),
              "alloc_conf": {v: os.environ[v] for v in ALLOC_CONF_VARS if v in os.environ}}
    budget = None
    if cuda:
        props = torch.cuda.get_device_properties(device)
        result["pinned_h2d_bytes_per_s"] = pinned_bandwidth(device)
        budget = int(args.cap_gib * GiB)
        fraction = budget / props.total_memory
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        result.update(device_name=props.name, total_memory=props.total_memory, cap_bytes=budget,
                      memory_fraction=fraction, torch=torch.__version__)
        print(f"bench: {props.name}, pinned host→GPU {result['pinned_h2d_bytes_per_s'] / 1e9:.1f} GB/s, "
              f"cap {args.cap_gib} GiB (fraction {fraction:.4f})", flush=True)
    order = dict(accum=args.accum, layer_major=not args.no_layer_major, boundary_store=args.boundary_store)
    seq, micro = (args.seq, args.micro) if args.micro else largest_fit(base, args.seq, args.steps,
                                                                       budget or 4 * GiB, args.buffers, **order)
    res = resource(base, seq, micro, args.steps, budget, args.buffers, **order)
    from pitlab.trainer.plan_streaming import check_budget, plan_streaming

    plan = plan_streaming(res.spec)
    print(plan.table(), flush=True)
    vocab_ids = AutoConfig.from_pretrained(base).vocab_size
    rng = np.random.default_rng(0)
    # Zipf ids from 2 up: 0 (bos/eos) and 1 (pad, a zero embedding row in a random-initialised model) never
    # occur; a sequence starting with pad tokens overflows the gradient (bench/RESULTS.md, layer streaming)
    tokens = np.minimum(rng.zipf(1.2, size=(seq + 1) * micro * args.accum * args.steps + 1) + 1,
                        vocab_ids - 1).astype(np.uint32)

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    try:
        if args.baseline:  # the resident model (FSDP2 on one GPU, checkpointing), no cap: the side-by-side rate
            base_res = res.model_copy(deep=True)
            base_res.spec.training.layer_streaming.enabled = False
            base_res.spec.training.activation_checkpointing = True
            if cuda:
                torch.cuda.set_per_process_memory_fraction(1.0, device)
            b_summary, b_metrics, b_tps, _ = run_trainer(base_res, run / "baseline", base, tokens, args.warmup)
            result["baseline"] = {"steady_tokens_per_second": b_tps, "peak_allocated_bytes":
                                  b_summary["peak_memory_bytes"], "final_loss": b_summary["final_loss"],
                                  "metrics": b_metrics}
        if cuda:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            torch.cuda.set_per_process_memory_fraction(budget / torch.cuda.get_device_properties(device).total_memory,
                                                       device)
            # what the trainer will see: the fraction read back (or the spec's budget where torch cannot say);
            # its plan (the device's budget) decides the boundary placement
            plan = check_budget(res.spec, device=device)
            result["budget_source"] = plan.budget_source
        summary, metrics, tps, wall = run_trainer(res, run / "streamed", base, tokens, args.warmup)
    finally:
        dist.destroy_process_group()
    moved = plan.host_to_gpu_bytes  # layers and (layer-major) boundaries coming back from host memory
    streamed = summary["layer_streaming"]
    boundaries = streamed.get("layer_major") or {}
    tokens_per_step = seq * micro * args.accum
    result.update({
        "seq_len": seq, "micro_batch_size": micro, "gradient_accumulation_steps": args.accum,
        "order": streamed.get("order"), "boundary_gpu_layers": boundaries.get("boundary_gpu_layers"),
        "boundary_host_bytes": boundaries.get("boundary_host_bytes"),
        "tokens_per_step": tokens_per_step, "steps": summary["steps"],
        "steady_tokens_per_second": tps, "train_wall_s": wall,
        "predicted_peak_bytes": plan.peak_bytes, "plan": plan.components, "plan_table": plan.table(),
        "host_store_bytes": plan.host_bytes,
        "measured_peak_allocated_bytes": summary["peak_memory_bytes"],
        "measured_peak_reserved_bytes": summary.get("peak_memory_reserved_bytes"),
        # planned: the steady state; measured: the run's mean (its first step finds the slots empty)
        "bytes_per_step_planned": moved,
        "bytes_per_step_measured": (streamed["bytes_copied"] + boundaries.get("boundary_h2d_bytes", 0))
        / summary["steps"],
        "layer_streaming": summary["layer_streaming"], "first_loss": summary["first_loss"],
        "final_loss": summary["final_loss"], "software": summary["software"], "metrics": metrics,
    })
    if "baseline" in result:
        result["speed_ratio_vs_resident"] = tps / result["baseline"]["steady_tokens_per_second"]
    if cuda:
        reserved = summary.get("peak_memory_reserved_bytes") or summary["peak_memory_bytes"]
        bound_s = moved / result["pinned_h2d_bytes_per_s"]
        result.update({
            "plan_error_vs_reserved": (plan.peak_bytes - reserved) / reserved,
            "plan_error_vs_allocated": (plan.peak_bytes - summary["peak_memory_bytes"]) / summary["peak_memory_bytes"],
            "transfer_bound_s_per_step": bound_s,
            "transfer_bound_tokens_per_second": tokens_per_step / bound_s,
            "fraction_of_transfer_bound": tps / (tokens_per_step / bound_s),
        })
    (out / "bench-streaming.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: v for k, v in result.items() if k not in ("metrics", "plan", "plan_table", "software")},
                     indent=2, default=str))
    print(headline(result), flush=True)
    return 0


def headline(r: dict) -> str:
    """One line: streamed and resident tokens/s at the same tokens per step, their ratio, the measured peak
    (allocated, reserved) against the planner's and the cap."""
    g = 2 ** 30
    reserved = r.get("measured_peak_reserved_bytes")
    line = (f"bench: {r['order']} x{r['gradient_accumulation_steps']} microbatches of {r['seq_len']} x "
            f"{r['micro_batch_size']} tokens ({r['tokens_per_step']} per step): streamed "
            f"{r['steady_tokens_per_second']:.0f} tokens/s")
    if "baseline" in r:
        line += (f", resident {r['baseline']['steady_tokens_per_second']:.0f} tokens/s, ratio "
                 f"{r['speed_ratio_vs_resident']:.3f}")
    line += (f"; peak {r['measured_peak_allocated_bytes'] / g:.2f} GiB allocated"
             + (f", {reserved / g:.2f} GiB reserved" if reserved else "")
             + f", planned {r['predicted_peak_bytes'] / g:.2f} GiB")
    if r.get("cap_bytes"):
        line += f", cap {r['cap_bytes'] / g:.2f} GiB"
    return line


def run_trainer(res, run: Path, base: Path, tokens: np.ndarray, warmup: int) -> tuple[dict, list, float, float]:
    """Run pitlab's trainer in this process (the default process group must exist) on ``res`` in a fresh
    ``run`` folder; returns ``(summary, metrics, steady tokens/s (median after warmup), wall seconds)``."""
    from pitlab.trainer.launch import write_spec
    from pitlab.trainer.train import RunPaths, train

    if run.exists():
        shutil.rmtree(run)
    (run / "data").mkdir(parents=True)
    np.save(run / "data" / "tokens.npy", tokens)
    spec_path = write_spec(res, run / "spec.json")
    t = time.perf_counter()
    summary = train(spec_path, RunPaths(run, base))
    wall = time.perf_counter() - t
    metrics = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    steady = metrics[warmup:] or metrics
    return summary, metrics, float(np.median([m["tokens_per_second"] for m in steady])), wall


def _sshape(spec):
    from pitlab.trainer.plan import spec_config
    from pitlab.trainer.plan_streaming import streaming_shape

    return streaming_shape(spec_config(spec), spec.lora, spec.training.precision)


if __name__ == "__main__":
    sys.exit(main())
