"""H200 benchmark: full-weight FSDP2 training of a >= 1B-parameter qwen3_5_moe_text at seq 4096, bf16.

Builds a random-initialised base model and a synthetic token file (Zipf-distributed ids, seeded) in
``--work``, writes a PitTraining spec, runs pitlab's trainer under torchrun (one rank per GPU), and writes
``bench.json`` (the trainer's summary, the planner's table and the per-step metrics) to ``--out``.

    python bench/h200_qwen35.py --work /tmp/bench --out "$OUT" [--steps 60] [--nproc 1]

Throughput and memory do not depend on the token values, so synthetic tokens stand in for a corpus (the
device machine cannot read the shared data folder). With ``--nproc 1`` the trainer takes its single-device path
(float32 masters + bf16 compute copy, no FSDP2; :mod:`pitlab.trainer.single_device`) where the plan fits;
``PITLAB_FORCE_FSDP2=1`` in the environment keeps FSDP2 (the results recorded before 2026-12-01's change).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# ~1.8 B parameters (~0.6 B active): the Qwen3.5-MoE layer pattern (3 linear-attention : 1 full-attention),
# 32 experts of which 4 per token plus a shared expert, 32k vocabulary.
CONFIG = dict(hidden_size=2048, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
              linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
              linear_value_head_dim=128, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512,
              shared_expert_intermediate_size=512, max_position_embeddings=8192)
VOCAB = 32768
SEQ = 4096
# a CPU smoke-test shape (--tiny), also used by bench/multigpu_qwen35.py
TINY_CONFIG = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=16, linear_num_key_heads=2,
                   linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
                   num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64)
TINY_SEQ, TINY_VOCAB = 128, 1024


def write_synthetic_tokens(path: Path, n: int, vocab: int, seed: int = 0) -> np.ndarray:
    """Write ``n`` seeded Zipf-distributed token ids (2 .. ``vocab`` - 1, uint32) to ``path`` (.npy); returns them.

    Ids 0 and 1 (eos/bos and pad of these benchmarks' configs) are never drawn: the pad row of a random-initialised
    embedding is zero, and exactly-zero hidden states overflow the gradient through the RMSNorms (bench/RESULTS.md,
    "The llama NaN explained"); Zipf(1.2) would make 18 % of the tokens pad."""
    rng = np.random.default_rng(seed)
    tokens = np.minimum(rng.zipf(1.2, size=n) + 1, vocab - 1).astype(np.uint32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, tokens)
    return tokens


def training_resource(name: str, base: Path, seq: int, tokens: int, nproc: int, *, accumulation: int = 1,
                      sync_every_microbatch: bool = True, checkpointing: bool | None = True, checkpoint_every: int = 0,
                      keep: int = 1, deterministic: bool = False):
    """The PitTraining of these benchmarks: full-weight AdamW, bf16, micro-batch 1, lr 3e-4, warmup 10 + cosine;
    ``checkpointing=None`` leaves activation checkpointing to the planner (auto); ``deterministic``:
    ``training.deterministic`` (torch's deterministic algorithms)."""
    from pitlab.api import PitTraining

    return PitTraining.model_validate({
        "apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "metadata": {"name": name},
        "spec": {"baseModel": {"uri": str(base)}, "corpus": {"uri": "synthetic.jsonl", "format": "jsonl"},
                 "knowledgeCutoff": "2020-12-31", "tokens": tokens,
                 "training": {"seqLen": seq, "microBatchSize": 1, "gradientAccumulationSteps": accumulation,
                              "gradientSyncEveryMicrobatch": sync_every_microbatch,
                              "learningRate": 3e-4, "warmupSteps": 10, "schedule": "cosine",
                              "activationCheckpointing": checkpointing, "precision": "bf16",
                              "deterministic": deterministic},
                 "resources": {"nodes": 1, "gpusPerNode": nproc, "gpuMemoryGiB": 139},
                 "checkpoint": {"everySteps": checkpoint_every, "keep": keep}}})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--no-checkpointing", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and seq 128 (a CPU smoke test)")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from pitlab.trainer.launch import run_training, write_spec
    from pitlab.trainer.plan import model_shape, plan_memory
    from pitlab.trainer.prepare import build_config

    cfg, seq, vocab = dict(CONFIG), SEQ, VOCAB
    if args.tiny:
        cfg.update(TINY_CONFIG)
        seq, vocab = TINY_SEQ, TINY_VOCAB
    run = args.work
    run.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    config = build_config("qwen3_5_moe_text", cfg, vocab_size=vocab, eos_token_id=0, pad_token_id=1, bos_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(run / "base")
    n_params = sum(p.numel() for p in model.parameters())
    del model
    tokens = write_synthetic_tokens(run / "data" / "tokens.npy", (seq + 1) * args.steps * args.nproc + 1, vocab)
    print(f"bench: base model {n_params / 1e9:.3f} B parameters, {len(tokens)} tokens "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)

    resource = training_resource("h200-qwen35", run / "base", seq, seq * args.steps * args.nproc, args.nproc,
                                 checkpointing=not args.no_checkpointing)
    spec_path = write_spec(resource, run / "spec.json")
    shape = model_shape(config)
    plan = plan_memory(resource.spec, shape)
    print(plan.table(), flush=True)
    t1 = time.perf_counter()
    summary = run_training(spec_path, run, nproc=args.nproc, base=run / "base",
                           on_step=lambda r: print(json.dumps(r), flush=True))
    wall = time.perf_counter() - t1
    metrics = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    steady = metrics[5:] or metrics  # steps after warm-up (allocator, kernels' first calls)
    result = {
        "command": " ".join(sys.argv),
        "config": cfg, "vocab": vocab, "seq_len": seq, "parameters": n_params,
        "summary": summary, "train_wall_s": wall,
        "steady_tokens_per_second": float(np.median([r["tokens_per_second"] for r in steady])),
        "steady_mfu": None if steady[0]["mfu"] is None else float(np.median([r["mfu"] for r in steady])),
        "plan": {"components": plan.components, "peak_bytes": plan.peak_bytes, "table": plan.table()},
        "measured_peak_bytes": summary["peak_memory_bytes"],
        "plan_error": (plan.peak_bytes - summary["peak_memory_bytes"]) / summary["peak_memory_bytes"],
        "metrics": metrics,
    }
    (args.out / "bench.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("metrics", "plan", "summary")}, indent=2))
    print("summary:", json.dumps({k: v for k, v in summary.items() if k != "param_sha256"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
