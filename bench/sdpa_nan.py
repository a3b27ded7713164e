"""Which SDPA backend turns exactly-zero rows into a non-finite backward (issue 12's llama NaN), per backend.

    python3 bench/sdpa_nan.py --out "$OUT/sdpa-nan.json"            # one CUDA GPU, about 30 s

Two checks, each once per ``torch.nn.attention.SDPBackend`` (cuDNN, flash, memory-efficient, math) and once with
torch's own choice (``default``):

1. ``sdpa``: ``F.scaled_dot_product_attention`` alone, causal, bf16, Llama-3.1-8B's attention shape (32 query
   heads of 128, GQA expanded as transformers does, seq ``--seq``), with the first ``n`` positions of q, k and v
   exactly zero (``n`` in 0, 1, 3: what a sequence that starts with ``n`` pad tokens whose embedding row is zero
   gives every layer). Records whether the output and dq/dk/dv are finite and their relative error against the
   math backend in float32.
2. ``model``: a 2-layer model of Llama-3.1-8B's dimensions (random init, bf16, pad_token_id 1 with its zero
   ``padding_idx`` row), one forward + backward with labels on a sequence starting ``1, 1, 1`` (the benchmark
   stream's chunk 3): the loss and whether every parameter gradient is finite.

Writes JSON to ``--out`` and prints one line per case.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F


def backends():
    from torch.nn.attention import SDPBackend

    return {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def _ctx(backend):
    import contextlib

    from torch.nn.attention import sdpa_kernel

    return contextlib.nullcontext() if backend is None else sdpa_kernel([backend])


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def sdpa_case(backend, n_zero: int, seq: int, device) -> dict:
    g = torch.Generator(device="cpu").manual_seed(0)
    shape = (1, 32, seq, 128)
    base = [torch.randn(shape, generator=g) for _ in range(3)]
    for t in base:
        t[:, :, :n_zero] = 0
    grad_out = torch.randn(shape, generator=g)

    def run(dtype, be):
        q, k, v = (t.to(device, dtype).requires_grad_() for t in base)
        with _ctx(be):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(grad_out.to(device, dtype))
        torch.cuda.synchronize(device) if device.type == "cuda" else None
        return o.detach(), q.grad, k.grad, v.grad

    try:
        o, dq, dk, dv = run(torch.bfloat16, backend)
    except RuntimeError as e:
        return {"error": str(e).splitlines()[0][:200]}
    ro, rdq, rdk, rdv = run(torch.float32, backends()["math"])
    out = {}
    for name, x, r in (("out", o, ro), ("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        fin = bool(torch.isfinite(x).all())
        out[name] = {"finite": fin, "rel_err_vs_math_fp32": _rel(x, r) if fin else None,
                     "nonfinite_rows": int((~torch.isfinite(x)).any(-1).any(1).sum()) if not fin else 0}
    return out


def model_case(backend, seq: int, device, tiny: bool = False) -> dict:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                      rms_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=0,
                      )
    if tiny:  # CPU smoke test of this script
        cfg.update(dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    zero_row = bool((model.get_input_embeddings().weight[1] == 0).all())
    g = torch.Generator(device="cpu").manual_seed(3)
    ids = torch.randint(2, cfg.vocab_size, (1, seq), generator=g)
    ids[0, :3] = 1
    ids = ids.to(device)
    try:
        with _ctx(backend):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
    except RuntimeError as e:
        return {"error": str(e).splitlines()[0][:200]}
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    res = {"pad_row_zero": zero_row, "loss": float(loss), "nonfinite_grads": bad[:8], "n_nonfinite_grads": len(bad)}
    del model
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--tiny-model", action="store_true", help="hidden 64 (a CPU smoke test of this script)")
    a = ap.parse_args()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    rec: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if device.type == "cuda" else
                 "cpu", "cudnn": torch.backends.cudnn.version(), "seq": a.seq, "sdpa": {}, "model": {}}
    for name, be in backends().items():
        for n in (0, 1, 3):
            r = sdpa_case(be, n, a.seq, device)
            rec["sdpa"][f"{name}/zero{n}"] = r
            print(f"sdpa {name:9} zero rows {n}: " + (r["error"] if "error" in r else ", ".join(
                f"{k} {'ok' if v['finite'] else 'NONFINITE x' + str(v['nonfinite_rows'])}"
                + (f" {v['rel_err_vs_math_fp32']:.1e}" if v["finite"] else "") for k, v in r.items())), flush=True)
    if not a.skip_model:
        for name, be in backends().items():
            r = model_case(be, a.seq, device, a.tiny_model)
            rec["model"][name] = r
            print(f"model {name:9}: {r}", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(rec, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
