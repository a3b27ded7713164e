"""Where the embedding forward's time goes on a MoE model, and what each change buys (issue 26, item 2).

    python3 bench/profile_embed.py --out "$OUT" [--layers 8] [--experts 256] [--prompts 4096]
        [--batch 512] [--variants pad64,pad16,pad16+kernels,pad16+kernels+compile]

Builds a benchmark-only random-weights ``qwen3_5_moe_text`` model of Qwen3.5-35B-A3B's layer shape
(``bench/eval_scale.py``'s config, ``--layers`` of its 40 layers, ``--experts`` of 256) on the GPU through the
embedding stage's own loader (:func:`pitlab.evaluator.embed_model._load_model`), and prompts of 60-92 tokens
(the eval benchmark's ≈ 76), length-sorted into batches of ``--batch`` prompts as the stage does. Each variant
runs every batch once untimed (autotuning and compilation of every shape), then every batch once, timed
(CUDA-synchronised): tokens/s counts real (unpadded)
tokens. Variants (joined by ``+``): ``padN`` right-pads each batch to a multiple of N tokens; ``kernels`` binds
fla's short convolution and gated delta rule as the trainer does (``pitlab.trainer.kernels.select_kernels``);
``compile`` compiles each decoder layer (``compile_blocks``, dynamic shapes); ``eager-experts`` /
``grouped-experts`` set transformers' experts implementation. Every variant's last-token embeddings are compared
with the first variant's (max |Δ| relative to max |x|, bf16). One batch of the first and of the last variant
runs under ``torch.profiler``: the 15 kernels with the most GPU time and the GPU busy fraction. Writes
``profile_embed.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def batches(n: int, size: int, vocab: int, seed: int = 0):
    """Length-sorted (longest first) batches of random token ids, lengths 60-92: list of lists of int64 rows."""
    rng = np.random.default_rng(seed)
    lengths = np.sort(rng.integers(60, 93, n))[::-1]
    rows = [rng.integers(100, vocab, int(L)) for L in lengths]
    return [rows[i:i + size] for i in range(0, n, size)]


def pad(rows, multiple: int, device):
    L = -(-max(len(r) for r in rows) // multiple) * multiple
    ids = torch.zeros((len(rows), L), dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.from_numpy(r)
        mask[i, :len(r)] = 1
    return ids.to(device), mask.to(device)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def last_token(hidden, mask):
    idx = mask.sum(1) - 1
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]


def pad_multiple(name: str) -> int:
    """The ``padN`` part of a variant name (64 without one)."""
    return next((int(p[3:]) for p in name.split("+") if p.startswith("pad")), 64)


def run_variant(forward, model, name: str, data, device) -> dict:
    multiple = pad_multiple(name)
    out = []
    with torch.inference_mode():
        for rows in data:  # warm-up over every batch shape: Triton autotuning and compilation are not timed,
            forward(*pad(rows, multiple, device))  # and an earlier variant's warm-up does not favour a later one
        sync(device)
        t0 = time.perf_counter()
        real = padded = 0
        for rows in data:
            ids, mask = pad(rows, multiple, device)
            out.append(last_token(forward(ids, mask), mask).float().cpu())
            real += int(mask.sum())
            padded += ids.numel()
        sync(device)
        wall = time.perf_counter() - t0
    return {"variant": name, "wall_s": wall, "tokens": real, "padded_tokens": padded,
            "tokens_per_s": real / wall, "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
            "_out": torch.cat(out)}


def profile_one(forward, rows, multiple: int, device) -> dict:
    from torch.profiler import ProfilerActivity, profile

    ids, mask = pad(rows, multiple, device)
    with torch.inference_mode():
        forward(ids, mask)
        sync(device)
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            forward(ids, mask)
            sync(device)
        wall = time.perf_counter() - t0
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.device_time for e in kernels) / 1e6
    by_name: dict[str, list] = {}
    for e in kernels:
        s = by_name.setdefault(e.name[:120], [0.0, 0])
        s[0] += e.device_time / 1e6
        s[1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:15]
    return {"wall_s": wall, "kernel_s": total, "busy": total / wall, "n_kernels": len(kernels),
            "top": [{"kernel": k, "s": v[0], "share": v[0] / total, "calls": v[1]} for k, v in top]}


def fast_kernels(model, device: str) -> dict:
    """The trainer's kernel choice (:func:`pitlab.trainer.kernels.select_kernels`: fla's gated delta rule bound
    directly, fla's Triton short convolution) applied to ``model``; the embedding stage does not do this (its
    outputs differed from transformers' default bindings, bench/RESULTS.md). Returns the report."""
    from pitlab.trainer.kernels import select_kernels

    return select_kernels(model, torch.device(device), "n/a")


def bound(model) -> str:
    """Module and name of the function the model's linear-attention layers call for the gated delta rule."""
    from pitlab.trainer.kernels import _bound_implementation, _modeling_modules

    mods = _modeling_modules(model)
    if not mods:
        return "none"
    f = _bound_implementation(mods[0].torch_chunk_gated_delta_rule)
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__name__', '?')}"


def pad_check(layers: int, experts: int, prompts: int, device: str) -> dict:
    """Which path is right: one random float32 model's last-token embeddings of ``prompts`` prompts, each
    alone (no padding) and inside one right-padded batch, by (1) transformers' reference PyTorch kernels in
    float64 (a float64 copy of the model, eager experts: the truth), (2) the reference kernels in float32,
    (3) transformers' default bindings in float32, (4) fast_kernels (fla) in float32, (5) the same with the decoder
    layers compiled (the stage's GPU default). Returns max |Δ| / max |x|
    of each against the truth. The modeling module's bindings are restored in between."""
    import copy

    import eval_scale
    from pitlab.evaluator.embed_model import _forward_fn, _load_model, compile_decoder_layers
    from pitlab.evaluator.random_weights import RandomWeights, write_random_model
    from pitlab.trainer.kernels import _modeling_modules, _reference_of

    config = eval_scale.model_config("full", layers, experts, 0)
    folder = write_random_model(Path(tempfile.mkdtemp()) / "p", config, RandomWeights(seed=0))
    model, _, n_layers, _ = _load_model(folder, "causal", "float32", device, -1)
    rows = batches(prompts, prompts, config.vocab_size, seed=2)[0]
    dev = torch.device(device)
    mods = _modeling_modules(model)
    saved = [(m, m.torch_chunk_gated_delta_rule, m.causal_conv1d_fn) for m in mods]

    def restore():
        for m, gdr, conv in saved:
            m.torch_chunk_gated_delta_rule, m.causal_conv1d_fn = gdr, conv

    def reference():
        for m, gdr, conv in saved:
            m.torch_chunk_gated_delta_rule, m.causal_conv1d_fn = _reference_of(gdr), _reference_of(conv)

    def run(net):
        forward = _forward_fn(net, "causal", -1, n_layers)
        with torch.inference_mode():
            ids, mask = pad(rows, 16, dev)
            batch = last_token(forward(ids, mask), mask).double().cpu()
            alone = torch.cat([last_token(forward(i, m), m).double().cpu()
                               for i, m in (pad([r], 1, dev) for r in rows)])
        return batch, alone

    reference()
    m64 = copy.deepcopy(model).double()
    m64.set_experts_implementation("eager")
    truth, truth_alone = run(m64)
    del m64
    torch.cuda.empty_cache()
    ref32 = run(model)
    restore()
    default_binding = bound(model)
    def32 = run(model)
    fast_kernels(model, device)
    fast32 = run(model)
    compile_decoder_layers(model)  # the stage's default on a GPU: fla bindings + compiled decoder layers
    compiled32 = run(model)
    restore()

    def rel(x):
        return float((x - truth_alone).abs().max() / truth_alone.abs().max())

    out = {"layers": layers, "experts": experts, "prompts": prompts, "default_binding": default_binding,
           "truth_batch_vs_alone": rel(truth)}
    for name, (b, al) in (("reference_fp32", ref32), ("default_fp32", def32), ("fla_fp32", fast32),
                          ("fla_compiled_fp32", compiled32)):
        out[f"{name}_alone"], out[f"{name}_batch"] = rel(al), rel(b)
    return out


def routing_check(layers: int, experts: int, prompts: int, device: str, dtype: str = "bfloat16") -> dict:
    """Where transformers' default bindings and fast_kernels part: one random model's ``prompts`` prompts
    (right-padded to 16) through both, with hooks on every decoder layer's token mixer (linear or full
    attention), router and output. Per layer: the token mixer's and the layer's max |Δ| / max |x| over real
    tokens, and the share of real tokens whose top-k expert set differs between the two runs (a routing flip:
    top-k is discontinuous, so a rounding-level difference upstream can change which experts run). Also the
    last-token embeddings' difference over prompts that had no flip in any layer and over the rest."""
    import eval_scale
    from pitlab.evaluator.embed_model import _forward_fn, _load_model
    from pitlab.evaluator.random_weights import RandomWeights, write_random_model
    from pitlab.trainer.kernels import _modeling_modules

    config = eval_scale.model_config("full", layers, experts, 0)
    folder = write_random_model(Path(tempfile.mkdtemp()) / "r", config, RandomWeights(seed=0))
    model, _, n_layers, _ = _load_model(folder, "causal", dtype, device, -1)
    forward = _forward_fn(model, "causal", -1, n_layers)
    rows = batches(prompts, prompts, config.vocab_size, seed=3)[0]
    dev = torch.device(device)
    ids, mask = pad(rows, 16, dev)
    real = mask.bool()
    captured: dict = {}
    for i, layer in enumerate(model.layers):
        mixer = getattr(layer, "linear_attn", None) or layer.self_attn
        mixer.register_forward_hook(lambda m, a, o, i=i: captured.__setitem__(
            ("mixer", i), (o[0] if isinstance(o, tuple) else o).float()))
        layer.mlp.gate.register_forward_hook(lambda m, a, o, i=i: captured.__setitem__(
            ("topk", i), o[2].sort(dim=-1).values))
        layer.register_forward_hook(lambda m, a, o, i=i: captured.__setitem__(
            ("layer", i), (o[0] if isinstance(o, tuple) else o).float()))

    def run():
        captured.clear()
        with torch.inference_mode():
            emb = last_token(forward(ids, mask), mask).float()
        sync(dev)
        return emb, dict(captured)

    mods = _modeling_modules(model)
    saved = [(m, m.torch_chunk_gated_delta_rule, m.causal_conv1d_fn) for m in mods]
    run()  # Triton autotuning of both bindings' kernels is not part of the comparison
    default_binding = bound(model)
    emb_a, a = run()
    kernels = fast_kernels(model, device)
    run()
    emb_b, b = run()
    for m, gdr, conv in saved:
        m.torch_chunk_gated_delta_rule, m.causal_conv1d_fn = gdr, conv

    def rel(x, y):
        x, y = x[real], y[real]
        return float((x - y).abs().max() / x.abs().max())

    flipped_token = torch.zeros_like(real)
    per_layer = []
    for i in range(n_layers):
        flips = (a[("topk", i)] != b[("topk", i)]).any(-1).reshape(real.shape) & real
        flipped_token |= flips
        per_layer.append({"layer": i, "type": model.config.layer_types[i],
                          "mixer_rel_diff": rel(a[("mixer", i)], b[("mixer", i)]),
                          "topk_flipped_share": float(flips.sum() / real.sum()),
                          "layer_rel_diff": rel(a[("layer", i)], b[("layer", i)])})
    any_flip = flipped_token.any(-1)
    scale = emb_a.abs().max()

    def emb_rel(sel):
        return float((emb_a[sel] - emb_b[sel]).abs().max() / scale) if sel.any() else None

    return {"layers": layers, "experts": experts, "prompts": prompts, "dtype": dtype,
            "default_binding": default_binding, "fast_kernels": kernels, "per_layer": per_layer,
            "prompts_without_flip": int((~any_flip).sum()), "embedding_rel_diff_all": emb_rel(any_flip | ~any_flip),
            "embedding_rel_diff_no_flip": emb_rel(~any_flip), "embedding_rel_diff_flipped": emb_rel(any_flip)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--variants", default="pad64,pad16,pad16+kernels,pad16+kernels+compile")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--shape", choices=("full", "tiny"), default="full", help="tiny: CPU rehearsal")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--pad-check", type=int, default=0, metavar="PROMPTS",
                    help="only the padding-invariance check (float32) on this many prompts")
    ap.add_argument("--routing-check", type=int, default=0, metavar="PROMPTS",
                    help="only the per-layer comparison of the default and the fast bindings (routing flips)")
    ap.add_argument("--dtype", default=None, help="routing check's dtype (default bfloat16 on a GPU)")
    a = ap.parse_args()

    import eval_scale
    from pitlab.evaluator.embed_model import _forward_fn, _load_model, compile_decoder_layers
    from pitlab.evaluator.random_weights import RandomWeights, write_random_model

    if a.pad_check:
        r = pad_check(a.layers, a.experts, a.pad_check, a.device)
        print("pad-check:", json.dumps(r), flush=True)
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "pad_check.json").write_text(json.dumps(r, indent=2))
        return
    if a.routing_check:
        dt = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
        r = routing_check(a.layers, a.experts, a.routing_check, a.device, dt)
        for row in r["per_layer"]:
            print(json.dumps(row), flush=True)
        print("routing-check:", json.dumps({k: v for k, v in r.items() if k != "per_layer"}), flush=True)
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"routing_check_{dt}.json").write_text(json.dumps(r, indent=2))
        return
    device = torch.device(a.device)
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    config = eval_scale.model_config(a.shape, a.layers, a.experts, 0)
    folder = write_random_model(Path(tempfile.mkdtemp()) / "m", config, RandomWeights(seed=0))
    model, n_run, n_layers, _ = _load_model(folder, "causal", dtype, a.device, -1)
    forward = _forward_fn(model, "causal", -1, n_layers)
    data = batches(a.prompts, a.batch, config.vocab_size)
    results, profiles, ref = [], {}, None
    names = a.variants.split(",")
    for name in names:
        parts = name.split("+")
        if "kernels" in parts:
            print("kernels:", fast_kernels(model, a.device))
        if "eager-experts" in parts:
            model.set_experts_implementation("eager")
        if "grouped-experts" in parts:
            model.set_experts_implementation("grouped_mm")
        if "compile" in parts:  # as the stage does on a GPU (embedding.compile)
            print("compiled:", compile_decoder_layers(model))
        t0 = time.perf_counter()
        r = run_variant(forward, model, name, data, device)
        r["variant_total_s"] = time.perf_counter() - t0
        out = r.pop("_out")
        if ref is None:
            ref = out
        r["max_rel_diff_vs_first"] = float((out - ref).abs().max() / ref.abs().max())
        r["gated_delta_rule"] = bound(model)
        r["experts_implementation"] = str(getattr(model.config, "_experts_implementation", None))
        results.append(r)
        print(json.dumps(r), flush=True)
        if device.type == "cuda" and not a.no_profile and name in (names[0], names[-1]):
            profiles[name] = profile_one(forward, data[len(data) // 2], pad_multiple(name), device)
            print(json.dumps({"profile": name, **{k: v for k, v in profiles[name].items() if k != "top"}}))
            for t in profiles[name]["top"]:
                print(f"  {t['share']:6.1%} {t['s']*1e3:8.2f} ms {t['calls']:6d}  {t['kernel']}")
    a.out.mkdir(parents=True, exist_ok=True)
    info = {"command": " ".join(sys.argv), "layers": a.layers, "experts": a.experts, "prompts": a.prompts,
            "batch": a.batch, "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
            "results": results, "profiles": profiles}
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except Exception:  # noqa: BLE001
        pass
    (a.out / "profile_embed.json").write_text(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
