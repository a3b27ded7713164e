"""pitlab.trainer.loading: meta-device build + per-rank shard loading (bit-equal weights, bounded host RSS)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from reference import parameter_sha256
from pitlab.trainer.launch import training_env

WORKER = Path(__file__).with_name("meta_load_worker.py")
FIXED_OVERHEAD = 160 * 2 ** 20  # bytes


@pytest.mark.slow
def test_meta_load_is_bit_equal_and_each_rank_holds_half_the_model(tmp_path):
    # ~87 M float32 parameters (348 MB), in two safetensors shards with an index
    cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
                      num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=512)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    base = tmp_path / "base"
    model.save_pretrained(base, max_shard_size="250MB")
    assert (base / "model.safetensors.index.json").is_file()
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    expected = parameter_sha256(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32))
    expected_buffers = {n: b.tolist() for n, b in model.named_buffers()}
    del model
    from test_trainer import TINY_CONFIGS

    from pitlab.trainer.prepare import build_config
    tiny = {}
    for model_type, overrides in TINY_CONFIGS.items():  # the three architectures, MoE experts split over ranks
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(build_config(model_type, overrides, vocab_size=512, eos_token_id=0,
                                                          pad_token_id=1, bos_token_id=0))
        m.save_pretrained(tmp_path / model_type)
        tiny[model_type] = parameter_sha256(AutoModelForCausalLM.from_pretrained(tmp_path / model_type,
                                                                                 dtype=torch.float32))
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(WORKER),
           str(base), str(out)] + [str(tmp_path / t) for t in tiny]
    proc = subprocess.run(cmd, env=training_env(2, cuda=False), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    for model_type, want in tiny.items():  # qwen3_5_moe_text, qwen3_moe (fused experts from per-expert files), llama
        for r in range(2):
            assert json.loads((out / f"rank-{r}-{model_type}.json").read_text()) == want, (model_type, r)
    for r in ranks:
        assert r["digests"] == expected  # every parameter bit-equal to from_pretrained's
        assert r["buffers"] == expected_buffers  # rotary inv_freq recomputed
        assert abs(r["local_param_bytes"] - model_bytes / 2) < 0.01 * model_bytes
        growth = r["maxrss_after_load"] - r["rss_before"]  # peak RSS while loading, over the pre-load RSS
        print(f"rank {r['rank']}: peak RSS growth {growth / 1e6:.0f} MB for a {model_bytes / 1e6:.0f} MB model "
              f"({r['local_param_bytes'] / 1e6:.0f} MB local shards)")
        # its shards plus a fixed overhead (meta-model objects, FSDP state, one tensor's rows <= 49 MB here),
        # never a whole model copy (from_pretrained on every rank would add >= 348 MB per rank)
        assert growth - r["local_param_bytes"] < FIXED_OVERHEAD, growth
        assert growth < model_bytes, growth
    # the node (both ranks) holds about one model copy
    assert sum(r["maxrss_after_load"] - r["rss_before"] for r in ranks) < model_bytes + 2 * FIXED_OVERHEAD
