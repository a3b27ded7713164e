"""GPU correctness checks of every fast path against the reference path, and quick timings (one device call).

    python3 bench/gpu_checks.py --out "$OUT" [--budget-s 540]

1. gated delta rule: fla's ``chunk_gated_delta_rule`` (bf16) vs transformers' reference (float32 on the same
   inputs), output and the gradients of q, k, v, g, beta; the reference in bf16 beside it as the bf16 baseline.
2. short convolution: :func:`pitlab.trainer.kernels.fla_short_convolution` vs transformers' reference, likewise.
3. loss: :func:`pitlab.trainer.loss.chunked_linear_cross_entropy` (and liger's fused linear cross-entropy when it
   imports) vs ``F.cross_entropy(logits.float())`` at 4096 tokens × the real 248,320 vocabulary: loss, gradients,
   time, peak memory.
4. a small qwen3_5_moe_text model, forward + backward: fast path (fla + fused loss), fast path with compiled
   blocks, and the bf16 reference path, each against a float32 reference-path run (loss, global gradient error).
5. timings of a plain bf16 training loop (fused AdamW, no activation checkpointing) on the reduced
   Qwen3.5-35B-A3B shape: HF loss, chunked loss, chunked loss + compiled blocks.

Relative error = ‖x − ref‖ / ‖ref‖ (float32 norms). Writes ``gpu_checks.json`` to ``--out`` after each
section.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def timed(fn, warmup: int = 2, iters: int = 10) -> float:
    """Median milliseconds of ``fn()`` over ``iters`` runs (CUDA events), after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def modeling():
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m
    return m


def gdr_check(res: dict) -> None:
    from pitlab.trainer.kernels import _bound_implementation
    m = modeling()
    ref = m.torch_chunk_gated_delta_rule.__wrapped__
    fast = _bound_implementation(m.torch_chunk_gated_delta_rule)
    res["gdr_fast_impl"] = f"{fast.__module__}.{fast.__name__}"
    torch.manual_seed(1)
    B, T, H, D = 1, 2048, 32, 128
    dev = "cuda"
    q = torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16)
    g = F.logsigmoid(torch.randn(B, T, H, device=dev, dtype=torch.float32) + 2)
    beta = torch.sigmoid(torch.randn(B, T, H, device=dev)).to(torch.bfloat16)
    do = torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16)

    def run(fn, dtype):
        xs = [t.detach().to(torch.float32 if t is g else dtype).requires_grad_() for t in (q, k, v, g, beta)]
        o, _ = fn(xs[0], xs[1], xs[2], g=xs[3], beta=xs[4], initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=True)
        (o.float() * do.float()).sum().backward()
        return [o] + [x.grad for x in xs]

    want = run(ref, torch.float32)
    got = run(fast, torch.bfloat16)
    base = run(ref, torch.bfloat16)
    names = ["out", "dq", "dk", "dv", "dg", "dbeta"]
    res["gdr"] = {n: {"fla_bf16_vs_ref_fp32": rel(a, w), "ref_bf16_vs_ref_fp32": rel(b, w)}
                  for n, a, b, w in zip(names, got, base, want)}
    res["gdr"]["ms_fwd_bwd"] = {"fla": timed(lambda: run(fast, torch.bfloat16), 2, 5),
                                "reference_bf16": timed(lambda: run(ref, torch.bfloat16), 1, 3)}


def conv_check(res: dict, ref_conv) -> None:
    from pitlab.trainer.kernels import fla_short_convolution
    torch.manual_seed(2)
    B, D, T, W = 1, 8192, 4096, 4
    x = torch.randn(B, D, T, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(D, W, device="cuda", dtype=torch.bfloat16) * 0.5
    dy = torch.randn(B, D, T, device="cuda", dtype=torch.bfloat16)

    def run(fn, dtype):
        xx, ww = x.detach().to(dtype).clone().requires_grad_(), w.detach().to(dtype).clone().requires_grad_()
        y = fn(xx, ww, None, activation="silu")
        (y.float() * dy.float()).sum().backward()
        return y, xx.grad, ww.grad

    want = run(ref_conv, torch.float32)
    got = run(fla_short_convolution, torch.bfloat16)
    base = run(ref_conv, torch.bfloat16)
    res["conv"] = {n: {"fla_bf16_vs_ref_fp32": rel(a, c), "ref_bf16_vs_ref_fp32": rel(b, c)}
                   for n, a, b, c in zip(["out", "dx", "dw"], got, base, want)}
    res["conv"]["ms_fwd_bwd"] = {"fla": timed(lambda: run(fla_short_convolution, torch.bfloat16)),
                                 "reference_bf16": timed(lambda: run(ref_conv, torch.bfloat16))}


def loss_check(res: dict) -> None:
    from pitlab.trainer.loss import chunked_linear_cross_entropy
    torch.manual_seed(3)
    T, H, V = 4096, 2048, 248320
    h0 = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    w0 = (torch.randn(V, H, device="cuda") * 0.02).to(torch.bfloat16)
    y = torch.randint(0, V, (T,), device="cuda")

    def reference(h, w):
        return F.cross_entropy((h @ w.t()).float(), y)

    def run(fn, dtype=torch.bfloat16):
        h, w = h0.detach().to(dtype).clone().requires_grad_(), w0.detach().to(dtype).clone().requires_grad_()
        loss = fn(h, w)
        loss.backward()
        return loss, h.grad, w.grad

    variants = {"reference_bf16": reference,
                "chunked_1024": lambda h, w: chunked_linear_cross_entropy(h, w, y, 1024),
                "chunked_4096": lambda h, w: chunked_linear_cross_entropy(h, w, y, 4096)}
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
        liger = LigerFusedLinearCrossEntropyLoss()
        variants["liger"] = lambda h, w: liger(w, h, y)
    except Exception as err:  # noqa: BLE001
        res["liger_import_error"] = f"{type(err).__name__}: {err}"
    want = run(reference, torch.float32)
    out = {}
    for name, fn in variants.items():
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            got = run(fn)
            peak = torch.cuda.max_memory_allocated() - base
            del got
            got = run(fn)
            out[name] = {"loss": float(got[0]), "loss_ref_fp32": float(want[0]),
                         "loss_abs_err": abs(float(got[0]) - float(want[0])),
                         "rel_dh": rel(got[1], want[1]), "rel_dw": rel(got[2], want[2]),
                         "extra_peak_gb": peak / 1e9, "ms_fwd_bwd": timed(lambda: run(fn), 1, 5)}
            del got
        except Exception as err:  # noqa: BLE001
            out[name] = {"error": f"{type(err).__name__}: {err}"}
    res["loss"] = out


SMALL = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
             linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
             num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=256)


def model_check(res: dict, ref_conv) -> None:
    """Small qwen3_5_moe_text, one forward + backward on the same tokens per path; float32 reference as truth."""
    from transformers import AutoModelForCausalLM

    from pitlab.trainer.kernels import (KERNEL_CALLS, _bound_implementation, _reference_of, compile_blocks,
                                        fla_gated_delta_rule_binding, fla_short_convolution)
    from pitlab.trainer.loss import install_loss
    from pitlab.trainer.prepare import build_config

    m = modeling()
    wrapper = m.torch_chunk_gated_delta_rule
    ref_gdr = _reference_of(wrapper)
    # pitlab's binding (as select_kernels installs it): fla in eager and compiled layers alike
    fla_gdr = fla_gated_delta_rule_binding(_bound_implementation(wrapper), ref_gdr)
    cfg = build_config("qwen3_5_moe_text", SMALL, vocab_size=8192)
    torch.manual_seed(4)
    base = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    ids = torch.randint(0, 8192, (1, 2049), device="cuda")
    x, y = ids[:, :-1], ids[:, 1:]

    def run(dtype, fast: bool, compiled: bool = False, loss: str = "chunked"):
        m.torch_chunk_gated_delta_rule = fla_gdr if fast else ref_gdr
        m.causal_conv1d_fn = fla_short_convolution if fast else ref_conv
        model = copy.deepcopy(base).to("cuda", dtype)
        model.config.use_cache = False
        install_loss(model, loss if fast else "reference")
        if compiled:
            compile_blocks(model)
        t = time.perf_counter()
        calls = KERNEL_CALLS["fla_gated_delta_rule"]
        out = model(input_ids=x, labels=y)
        out.loss.backward()
        torch.cuda.synchronize()
        grads = torch.cat([p.grad.float().flatten() for p in model.parameters()])
        return float(out.loss), grads, time.perf_counter() - t, KERNEL_CALLS["fla_gated_delta_rule"] - calls

    l_ref32, g_ref32, _, _ = run(torch.float32, False)
    out = {"loss_ref_fp32": l_ref32, "linear_attention_layers": sum(t == "linear_attention" for t in cfg.layer_types)}
    for name, kw in {"reference_bf16": dict(fast=False), "fast_bf16": dict(fast=True),
                     "fast_bf16_reference_loss": dict(fast=True, loss="reference"),
                     "fast_bf16_compiled": dict(fast=True, compiled=True),
                     "fast_bf16_compiled_reference_loss": dict(fast=True, compiled=True, loss="reference")}.items():
        try:
            loss, g, sec, fla_calls = run(torch.bfloat16, **kw)
            out[name] = {"loss": loss, "loss_abs_err": abs(loss - l_ref32), "grad_rel_err": rel(g, g_ref32),
                         "grad_rel_err_vs_reference_bf16": rel(g, out["_g_ref16"]) if "_g_ref16" in out else None,
                         "first_call_s": sec, "fla_gated_delta_rule_calls": fla_calls}
            if name == "reference_bf16":
                out["_g_ref16"] = g
        except Exception as err:  # noqa: BLE001
            out[name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
    m.torch_chunk_gated_delta_rule = wrapper
    out.pop("_g_ref16", None)
    res["model"] = out


def optimizer_check(res: dict, timing: bool = True) -> None:
    """The fused optimizer step (:class:`pitlab.trainer.fused_step.MasterAdamW`, compiled, and eager) against
    torch's path on the same bf16 gradients (float32 gradients, ``clip_grad_norm_``, then fused AdamW, and the
    foreach AdamW beside it): 3 steps with weight decay on parameters of the reduced 35B-A3B layer shapes (step 2
    with gradients 1,000 x larger); per variant against torch's fused AdamW: max |dp| over the largest single
    update of the reference, the relative errors of the moments, and the copy against the masters cast; then the
    median time of one step (0.73 B parameters; the torch path with its float32 gradient cast)."""
    from pitlab.trainer.fused_step import MasterAdamW

    gen = torch.Generator(device="cuda").manual_seed(11)
    shapes = [(248320, 2048), (64, 1024, 2048), (64, 2048, 512), (2048,), (8192, 2048), (2048, 4096), (4, 8192)]
    ps = [torch.randn(s, device="cuda", generator=gen) * 0.02 for s in shapes]
    hp = dict(lr=3e-4, weight_decay=0.1)
    ref = [p.clone() for p in ps]
    o_ref = torch.optim.AdamW(ref, fused=True, **hp)
    variants = {}  # name -> (params, optimizer, copies or None)
    for name in ("pitlab_compiled", "pitlab_eager", "torch_foreach"):
        q = [p.clone() for p in ps]
        if name == "torch_foreach":
            variants[name] = (q, torch.optim.AdamW(q, foreach=True, **hp), None)
        else:
            variants[name] = (q, MasterAdamW(q, compiled=name == "pitlab_compiled", **hp),
                              [torch.empty(s, device="cuda", dtype=torch.bfloat16) for s in shapes])
    out: dict = {"shapes": shapes, "steps": []}
    for step in range(3):
        scale = 0.01 if step != 1 else 10.0
        g16 = [(torch.randn(s, device="cuda", generator=gen) * scale).to(torch.bfloat16) for s in shapes]
        before = [p.clone() for p in ref]
        for p, g in zip(ref, g16):
            p.grad = g.float()
        n_ref = torch.nn.utils.clip_grad_norm_(ref, 1.0)
        o_ref.step()
        upd = max(float((p - b).abs().max()) for p, b in zip(ref, before))
        del before
        row = {"grad_norm_ref": float(n_ref), "max_abs_update_ref": upd}
        for name, (q, opt, copies) in variants.items():
            if copies is None:
                for p, g in zip(q, g16):
                    p.grad = g.float()
                n = torch.nn.utils.clip_grad_norm_(q, 1.0)
                opt.step()
            else:
                n = opt.clip_step_cast(g16, copies, 1.0)
            dp = max(float((a - b).abs().max()) for a, b in zip(ref, q))
            row[name] = {
                "grad_norm": float(n), "max_abs_param_diff": dp, "diff_over_update": dp / upd,
                "exp_avg_rel_err": max(rel(opt.state[b]["exp_avg"], o_ref.state[a]["exp_avg"]) for a, b in zip(ref, q)),
                "exp_avg_sq_rel_err": max(rel(opt.state[b]["exp_avg_sq"], o_ref.state[a]["exp_avg_sq"])
                                          for a, b in zip(ref, q)),
                "copy_equals_masters_cast": None if copies is None else
                all(torch.equal(c, p.to(torch.bfloat16)) for c, p in zip(copies, q))}
        out["steps"].append(row)
        print("optimizer step", step + 1, json.dumps(row), flush=True)
    out["parameters"] = sum(p.numel() for p in ps)
    if timing:
        q, opt, copies = variants["pitlab_compiled"]

        def torch_path():
            for p, g in zip(ref, g16):
                p.grad = g.float()
            torch.nn.utils.clip_grad_norm_(ref, 1.0)
            o_ref.step()
            torch._foreach_copy_(copies, ref)

        out["ms_torch_path_incl_cast"] = timed(torch_path)
        out["ms_fused"] = timed(lambda: opt.clip_step_cast(g16, copies, 1.0))
    res["optimizer"] = out


def loop_timings(res: dict, budget_end: float, steps: int = 6) -> None:
    """Plain bf16 loop on the reduced 35B-A3B shape: HF loss / chunked / chunked + compiled blocks."""
    from throughput import QWEN35_REDUCED, hf_training_loop

    out = {}
    for name, kw in {"hf_loss": dict(loss=None), "chunked": dict(loss="chunked"),
                     "chunked_compiled": dict(loss="chunked", compiled=True)}.items():
        if time.perf_counter() > budget_end - 60:
            out[name] = {"skipped": "budget"}
            continue
        try:
            out[name] = hf_training_loop(QWEN35_REDUCED, steps=steps, warmup=2, **kw)
        except Exception as err:  # noqa: BLE001
            out[name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
        print(name, json.dumps(out[name]), flush=True)
        torch.cuda.empty_cache()
    res["loop_35b_reduced"] = out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--sections", default="gdr,conv,loss,model,loop")
    args = ap.parse_args()
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    import transformers
    import triton

    from pitlab.trainer.kernels import _bound_implementation
    m = modeling()
    ref_conv = _bound_implementation(m.causal_conv1d_fn)
    res: dict = {"torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
                 "device": torch.cuda.get_device_name(), "sections": {}}
    try:
        import fla
        res["fla"] = fla.__version__
    except Exception as err:  # noqa: BLE001
        res["fla"] = f"import failed: {err}"
    sections = {"gdr": lambda: gdr_check(res), "conv": lambda: conv_check(res, ref_conv),
                "loss": lambda: loss_check(res), "model": lambda: model_check(res, ref_conv),
                "loop": lambda: loop_timings(res, t0 + args.budget_s), "optimizer": lambda: optimizer_check(res)}
    for name in args.sections.split(","):
        t = time.perf_counter()
        try:
            sections[name]()
            res["sections"][name] = {"s": time.perf_counter() - t}
        except Exception as err:  # noqa: BLE001
            res["sections"][name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
            print(traceback.format_exc(), flush=True)
        print(f"== {name} ({time.perf_counter() - t:.1f} s)", flush=True)
        (args.out / "gpu_checks.json").write_text(json.dumps(res, indent=2, default=str))
        torch.cuda.empty_cache()
    print(json.dumps({k: v for k, v in res.items() if k != "sections"}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
