"""Benchmark: embedding throughput (prompts/s) of a >= 1B-parameter random-initialised causal LM through
:func:`pitlab.evaluator.embed.embed_texts` (length-sorted batches, GPU when present) at 256-token prompts.

    python3 bench/bench_embed.py --prompts 8192 --batch-size 256 --dtype bfloat16 --out embed.json

The model is a Llama architecture of TinyLlama-1.1B's shape (hidden 2048, 22 layers, MLP 5632, 32 heads,
4 KV heads, vocabulary 32,000), random weights (seed 0); the tokenizer is a word-level one built here over the
prompts' vocabulary, and every prompt is >= 256 words, truncated to exactly ``--max-length`` tokens.
embed.py is loaded by file path so that the device machine needs only torch, transformers and tokenizers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8192)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    spec = importlib.util.spec_from_file_location("pitlab_embed", Path(__file__).parents[1] / "pitlab/evaluator/embed.py")
    embed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(embed)

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(31998)}}
    rng = np.random.default_rng(0)
    texts = [" ".join(f"w{j}" for j in rng.integers(0, 31998, a.max_length + 8)) for _ in range(a.prompts)]
    with tempfile.TemporaryDirectory() as tmp:
        mdir = Path(tmp) / "llama-1b"
        tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
        tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(mdir)
        cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                          num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        n_params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(mdir)
        del model
        info: dict = {}
        warm = embed.embed_texts(mdir, texts[:a.batch_size], kind="causal", batch_size=a.batch_size,
                                 max_length=a.max_length, dtype=a.dtype, info=info)  # load + CUDA warm-up
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        X = embed.embed_texts(mdir, texts, kind="causal", batch_size=a.batch_size, max_length=a.max_length,
                              dtype=a.dtype, info=info)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    out = {"n_params": n_params, "prompts": a.prompts, "tokens_per_prompt": a.max_length,
           "n_truncated": info["n_truncated"], "batch_size": a.batch_size, "dtype": a.dtype, "wall_s": wall,
           "prompts_per_s": a.prompts / wall, "tokens_per_s": a.prompts * a.max_length / wall, "dim": int(X.shape[1]),
           "finite": bool(np.isfinite(X).all()), "device": info["device"],
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "torch": torch.__version__, "transformers": transformers.__version__, "warm_rows": int(warm.shape[0])}
    a.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
