"""Benchmark: the whole LeakageEval of two Qwen3.5-35B-A3B-shape models on a 1,000 × 30 panel, end to end
through `pitlab evaluate` (issue 13).

    python3 bench/eval_scale.py --out eval-scale.json                        # one H200: the published setting
    python3 bench/eval_scale.py --shape tiny --layers 2 --experts 4 --panel-size 60x12 --resamples 20 \\
        --dtype float32 --out /tmp/eval-scale-tiny.json                      # CPU rehearsal, about a minute

What it builds (all in ``--workdir``, a few MB whatever the model size):

* two benchmark-only random-weights model folders (:mod:`pitlab.evaluator.random_weights`): ``config.json`` of
  ``qwen3_5_moe_text`` (``--shape full``: the real Qwen3.5-35B-A3B text configuration, 40 layers, 256 experts,
  8 routed + 1 shared, hidden 2,048, vocabulary 248,320, ≈ 35 B parameters, ≈ 70 GB in bf16), a tokenizer, and
  ``pitlab-random-weights.json``: the base model (seed 0) and its "trained twin" (the same seed, every weight
  matrix perturbed by ``--perturb`` × initializer_range × N(0, 1)). The embedding stage regenerates their
  weights module by module on the GPU (no host copy; the 64 GiB device disk could not hold two 70 GB models);
  only the weight source differs from a checkpoint folder, the code path is the product's. What it changes in
  the timing: the load is a few seconds of random-number generation instead of reading ≈ 70 GB of shards
  (an NVMe at 3-7 GB/s would add ≈ 10-25 s per model; the load time is reported apart).
* a synthetic market in the S&P 500 panel schema (long OHLCV CSV: date, open, high, low, close, volume, Name;
  XNYS sessions, log-normal random walks, seed 0): the real files do not travel to the device.
* a byte-level BPE tokenizer (digits split one by one, as Qwen's) trained on prompt-shaped text, so prompts
  have realistic token counts (≈ 76 tokens).
* a LeakageEval: both models, ``--panel-size`` securities × dates, all four protocols, ``--resamples``
  resamples, every statistics setting at its default (reselected penalties, security-and-date clusters).

Then it runs ``python -m pitlab.cli evaluate`` (the same process a user runs; its output streams through) and
prints the wall time of each stage: writing the inputs, embedding each model (load / forward, prompts/s,
tokens/s), the statistics and the report, and the total. ``--out`` gets all of it as JSON, with the results'
headline numbers. The device machine needs pitlab's dependencies on ``PYTHONPATH`` (build/dev-setup.sh) and,
for the gated-delta-rule kernels, the GPU kit (build/gpu-kit/device-env.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
QWEN35_A3B = dict(  # Qwen3.5-35B-A3B's text configuration (its config.json's text_config)
    vocab_size=248320, hidden_size=2048, num_hidden_layers=40, full_attention_interval=4,
    num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=256,
    num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
    max_position_embeddings=262144, rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
)
TINY = dict(vocab_size=4096, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            moe_intermediate_size=32, shared_expert_intermediate_size=32, max_position_embeddings=4096)


def model_config(shape: str, layers: int | None, experts: int | None, vocab: int):
    """``qwen3_5_moe_text`` config of the 35B-A3B shape (or ``tiny``), with ``layers``/``experts`` overrides;
    layer types repeat 3 linear-attention + 1 full-attention layers, the last layer always full attention."""
    from transformers import AutoConfig

    kw = dict(QWEN35_A3B)
    if shape == "tiny":
        kw.update(TINY, num_hidden_layers=2, num_experts=4, num_experts_per_tok=2)
    kw.pop("full_attention_interval")
    n = layers or kw["num_hidden_layers"]
    kw["num_hidden_layers"] = n
    kw["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 or i == n - 1 else "linear_attention"
                         for i in range(n)]
    if experts:
        kw["num_experts"] = experts
        kw["num_experts_per_tok"] = min(kw["num_experts_per_tok"], experts)
    kw["vocab_size"] = max(kw["vocab_size"], vocab)
    return AutoConfig.for_model("qwen3_5_moe_text", **kw)


def parameter_counts(config) -> tuple[int, int]:
    """(total, active per token) parameters of the base model (no LM head), counted on the meta device."""
    import torch
    from transformers import AutoModel

    with torch.device("meta"):
        m = AutoModel.from_config(config)
    total = sum(p.numel() for p in m.parameters())
    experts = sum(p.numel() for n, p in m.named_parameters() if ".experts." in n)
    active = total - experts + experts * config.num_experts_per_tok // config.num_experts \
        - m.embed_tokens.weight.numel()  # an embedding row is read, not multiplied
    return int(total), int(active)


def sessions(start: str, end: str):
    """XNYS sessions in [start, end] (exchange_calendars, the calendar pitlab counts embargoes on)."""
    import exchange_calendars as xcals

    return xcals.get_calendar("XNYS").sessions_in_range(start, end)


def write_prices(path: Path, n_securities: int, start: str, end: str, seed: int = 0) -> int:
    """Long OHLCV CSV (the sp500_5yr schema) of ``n_securities`` log-normal random walks on XNYS sessions;
    returns the row count. Daily log returns: 0.5 × a market factor + security noise, sd ≈ 1.6 %."""
    import pandas as pd

    days = sessions(start, end)
    rng = np.random.default_rng(seed)
    T = len(days)
    r = 0.5 * rng.normal(0, 0.01, (T, 1)) + rng.normal(0, 0.015, (T, n_securities))
    close = 20 * np.exp(rng.normal(1.5, 0.6, n_securities)) * np.exp(np.cumsum(r, axis=0))
    openp = close * np.exp(rng.normal(0, 0.004, close.shape))
    high = np.maximum(openp, close) * np.exp(np.abs(rng.normal(0, 0.006, close.shape)))
    low = np.minimum(openp, close) * np.exp(-np.abs(rng.normal(0, 0.006, close.shape)))
    volume = np.round(np.exp(rng.normal(14, 1, n_securities)) * np.exp(rng.normal(0, 0.3, close.shape)))
    names = [f"S{i:04d}" for i in range(n_securities)]
    df = pd.DataFrame({"date": np.repeat(days.strftime("%Y-%m-%d"), n_securities),
                       "open": openp.ravel().round(4), "high": high.ravel().round(4), "low": low.ravel().round(4),
                       "close": close.ravel().round(4), "volume": volume.ravel().astype(np.int64),
                       "Name": np.tile(names, T)})
    df.to_csv(path, index=False)
    return len(df)


def train_tokenizer(vocab_size: int):
    """Byte-level BPE (digits one by one, as Qwen's tokenizer) trained on prompt-shaped text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = np.random.default_rng(1)
    corpus = [f"Date: 2017-{rng.integers(1, 13):02d}-{rng.integers(1, 29):02d}. Stock: S{i % 5000:04d} "
              f"(S{i % 5000:04d}). Returns: 1-day {rng.normal(0, 2):+.2f}%, 5-day {rng.normal(0, 4):+.2f}%, "
              f"20-day {rng.normal(0, 8):+.2f}%. Volume {rng.lognormal(0, 0.3):.2f}x its 20-day average."
              for i in range(4000)]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def eval_spec(name: str, prices: Path, models: dict[str, Path], a, start: str, end: str) -> dict:
    n_sec, n_dates = a.panel
    return {
        "apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval", "metadata": {"name": name},
        "spec": {
            "models": [{"name": "base", "uri": str(models["base"])},
                       {"name": "twin", "uri": str(models["twin"]), "knowledgeCutoff": a.train_end}],
            "dataset": {"kind": "ohlcv", "uri": str(prices), "universeSize": n_sec,
                        "dates": {"count": n_dates, "start": start, "end": end}, "seed": 0},
            "protocol": {"trainEnd": a.train_end, "testStart": a.test_start, "embargoDays": 5, "groupKFolds": 5,
                         "protocols": ["chronological", "group-kfold", "walk-forward", "purged-kfold"]},
            "bootstrap": {"resamples": a.resamples, "seed": 0},
            "embedding": {"layer": a.layer, "pooling": "last", "batchSize": a.batch_size,
                          "maxLength": a.max_length, "dtype": a.dtype, "compile": not a.no_compile},
        }}


def _panel_size(text: str) -> tuple[int, int]:
    try:
        s, d = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--panel-size {text!r}: SECURITIESxDATES, e.g. 1000x30") from None
    if s < 10 or d < 10:
        raise argparse.ArgumentTypeError(f"--panel-size {text!r}: at least 10 securities and 10 dates")
    return s, d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="JSON file for the stage times and results.")
    ap.add_argument("--workdir", type=Path, default=None, help="Inputs and the evaluation (default: a temp dir).")
    ap.add_argument("--shape", choices=("full", "tiny"), default="full",
                    help="full: Qwen3.5-35B-A3B's configuration; tiny: hidden 64 (CPU rehearsal).")
    ap.add_argument("--layers", type=int, default=None, help="Decoder layers (default: the shape's, 40 / 2).")
    ap.add_argument("--experts", type=int, default=None, help="Experts per MoE layer (default: 256 / 4).")
    ap.add_argument("--panel-size", dest="panel", type=_panel_size, default=(1000, 30),
                    help="SECURITIESxDATES of the evaluation panel (default 1000x30).")
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--layer", type=int, default=-1, help="embedding.layer (default -1: the last).")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    ap.add_argument("--batch-size", type=int, default=64,
                    help="embedding.batchSize (GPU: the first batch; later ones are sized from free memory).")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--no-compile", action="store_true",
                    help="embedding.compile: false (eager decoder layers, the stage before 2026-12-04).")
    ap.add_argument("--perturb", type=float, default=0.05,
                    help="the twin's weight noise, in units of initializer_range (default 0.05).")
    ap.add_argument("--train-end", default="2016-12-31")
    ap.add_argument("--test-start", default="2017-01-01")
    a = ap.parse_args()

    t_all = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    from pitlab.evaluator.random_weights import RandomWeights, write_random_model

    work = a.workdir or Path(tempfile.mkdtemp(prefix="eval-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "out", ignore_errors=True)  # no embedding cache from an earlier run: every stage is timed
    stages: dict[str, float] = {}

    t = time.perf_counter()
    start, end = "2015-10-01", "2017-12-29"  # 20 sessions of history before the first sampled date
    n_rows = write_prices(work / "prices.csv", int(a.panel[0] * 1.05) + 5, "2015-09-01", "2018-01-10")
    stages["write_prices_s"] = time.perf_counter() - t

    t = time.perf_counter()
    tok = train_tokenizer(4096)
    cfg = model_config(a.shape, a.layers, a.experts, len(tok))
    models = {"base": write_random_model(work / "models" / "base", cfg, RandomWeights(seed=0), tok),
              "twin": write_random_model(work / "models" / "twin", cfg,
                                         RandomWeights(seed=0, perturb=a.perturb, perturb_seed=1), tok)}
    total, active = parameter_counts(cfg)
    stages["write_models_s"] = time.perf_counter() - t
    bytes_per = 2 if a.dtype != "float32" else 4
    def count(n: float) -> str:
        return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"

    print(f"eval_scale: qwen3_5_moe_text, {cfg.num_hidden_layers} layers, {cfg.num_experts} experts "
          f"({cfg.num_experts_per_tok} active), hidden {cfg.hidden_size}: {count(total)} parameters "
          f"({total * bytes_per / 1e9:.3g} GB in {a.dtype}), {count(active)} active per token; "
          f"{n_rows:,} price rows; panel {a.panel[0]} × {a.panel[1]}", flush=True)

    spec = eval_spec("eval-scale", work / "prices.csv", models, a, start, end)
    spec_path = work / "leakageeval.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    cmd = [sys.executable, "-m", "pitlab.cli", "evaluate", str(spec_path), "--out", str(work / "out"), "--overwrite"]
    print("eval_scale:", " ".join(cmd), flush=True)
    t = time.perf_counter()
    rc = subprocess.run(cmd, env=env, cwd=ROOT).returncode
    stages["pitlab_evaluate_s"] = time.perf_counter() - t
    stages["total_s"] = time.perf_counter() - t_all
    record: dict = {"command": " ".join(sys.argv), "evaluate_command": cmd, "returncode": rc,
                    "machine": platform.node(), "python": platform.python_version(), "stages": stages,
                    "model": {"shape": a.shape, "layers": cfg.num_hidden_layers, "experts": cfg.num_experts,
                              "experts_per_token": cfg.num_experts_per_tok, "hidden": cfg.hidden_size,
                              "vocab": cfg.vocab_size, "parameters": total, "active_parameters": active,
                              "dtype": a.dtype, "perturb": a.perturb},
                    "panel": {"securities": a.panel[0], "dates": a.panel[1], "price_rows": n_rows},
                    "embedding": spec["spec"]["embedding"], "resamples": a.resamples}
    try:
        import torch
        import transformers

        record["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
        if torch.cuda.is_available():
            record["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    results_path = work / "out" / "eval-scale" / "eval" / "results.json"
    if rc == 0 and results_path.is_file():
        res = json.loads(results_path.read_text())
        tm = res["timings"]
        record["timings"] = tm
        record["results"] = [{k: m.get(k) for k in ("name", "embedding_weights", "embedding_device", "embedding_kernels",
                                                     "embedding_dim",
                                                     "r2_off", "r2_on", "premium", "premium_ci", "verdict")}
                             for m in res["models"]]
        rows = [("write prices", stages["write_prices_s"]), ("write model folders", stages["write_models_s"])]
        for name, m in tm["models"].items():
            rows.append((f"embed {name}", m["embed_s"]))
            if m.get("embed_forward_seconds"):
                rows.append((f"  load {m['embed_layers_run']} layers / forward {m['embed_n_tokens']:,} tokens in "
                             f"{m['embed_n_batches']} batches: {m['embed_load_seconds']:.1f} s / "
                             f"{m['embed_forward_seconds']:.1f} s, {m['embed_prompts_per_s']:.0f} prompts/s, "
                             f"{m['embed_tokens_per_s']:,.0f} tokens/s", None))
        stats_wall = tm.get("statistics_wall_s", tm["statistics_s"])
        rows.append((f"statistics (protocols + bootstrap, both models; {tm.get('statistics_processes', 1)} "
                     "process(es))", stats_wall))
        for name, m in tm["models"].items():
            rows.append((f"  statistics of {name}: {m['statistics_s']:.1f} s", None))
        rest = stages["pitlab_evaluate_s"] - tm["embed_s"] - stats_wall
        rows.append(("pitlab evaluate: start-up, panel, report", rest))
        rows.append(("pitlab evaluate", stages["pitlab_evaluate_s"]))
        rows.append(("total", stages["total_s"]))
        stages["evaluate_other_s"] = rest
        print("\neval_scale: stage times")
        for label, s in rows:
            print(f"  {label:<52} {s:9.1f} s" if s is not None else f"  {label}")
        for m in record["results"]:
            lo, hi = m["premium_ci"]
            print(f"  {m['name']}: premium {m['premium']:+.4f} [{lo:+.4f}, {hi:+.4f}], {m['embedding_weights']}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"eval_scale: {'done' if rc == 0 else f'pitlab evaluate failed (exit {rc})'} in {stages['total_s']:.1f} s "
          f"→ {a.out}", flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
