"""The fused optimizer update (:class:`pitlab.trainer.fused_step.MasterAdamW`) on CUDA, its parameters passed as
1-D views (as the trainer does since 567c590) or in their own shapes, against torch's path (float32 gradients,
``clip_grad_norm_``, fused AdamW, the bf16 cast): one step over the reduced Qwen3.5-35B-A3B layer shapes (0.73 B
parameters), bf16 gradients with a bf16 copy (the single-device path) and float32 gradients without (FSDP2's),
median of 10 timed steps (CUDA events) after 3 warm-up steps; the parameters after 3 steps compared bit for bit.

    python3 bench/fused_step_views.py --out $OUT/fused_step_views.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch._dynamo

import pitlab.trainer.fused_step as fs
from gpu_checks import timed
from hostload import host_load

SHAPES = [(248320, 2048), (64, 1024, 2048), (64, 2048, 512), (2048,), (8192, 2048), (2048, 4096), (4, 8192)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch._dynamo.config.recompile_limit = 256
    gen = torch.Generator(device="cuda").manual_seed(11)
    ps = [torch.randn(s, device="cuda", generator=gen) * 0.02 for s in SHAPES]
    g16 = [(torch.randn(s, device="cuda", generator=gen) * 0.01).to(torch.bfloat16) for s in SHAPES]
    g32 = [g.float() for g in g16]
    hp = dict(lr=3e-4, weight_decay=0.1)
    res: dict = {"parameters": sum(p.numel() for p in ps), "torch": torch.__version__, "host": host_load()}
    print("host", res["host"], flush=True)
    flat = fs._flat
    finals = {}
    for views in ("1-d", "shaped"):
        fs._flat = flat if views == "1-d" else (lambda t, *_: None if t is None else fs._local(t))
        for grads in ("bf16+copy", "fp32"):
            q = [p.clone() for p in ps]
            opt = fs.MasterAdamW(q, compiled=True, **hp)
            copies = [torch.empty(s, device="cuda", dtype=torch.bfloat16) for s in SHAPES] if grads == "bf16+copy" else None
            g = g16 if grads == "bf16+copy" else g32
            t0 = time.perf_counter()
            opt.clip_step_cast(g, copies, 1.0)
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            ms = timed(lambda: opt.clip_step_cast(g, copies, 1.0), warmup=3)
            finals[(views, grads)] = [p.clone() for p in q]
            res[f"{views} {grads}"] = {"ms": ms, "first_call_s": first}
            print(views, grads, res[f"{views} {grads}"], flush=True)
    fs._flat = flat
    ref = [p.clone() for p in ps]
    o = torch.optim.AdamW(ref, fused=True, **hp)
    copies = [torch.empty(s, device="cuda", dtype=torch.bfloat16) for s in SHAPES]

    def torch_path():
        for p, g in zip(ref, g16):
            p.grad = g.float()
        torch.nn.utils.clip_grad_norm_(ref, 1.0)
        o.step()
        torch._foreach_copy_(copies, ref)

    res["torch fused AdamW + cast"] = {"ms": timed(torch_path, warmup=3)}
    print("torch", res["torch fused AdamW + cast"], flush=True)
    for grads in ("bf16+copy", "fp32"):
        res[f"1-d equals shaped, {grads}"] = all(torch.equal(a, b) for a, b in
                                                 zip(finals[("1-d", grads)], finals[("shaped", grads)]))
    print(json.dumps(res, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
