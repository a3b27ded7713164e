"""Which gradients of a Qwen3.5-MoE training step differ between two identical backward passes on this GPU.

Issue 27, item 6: two fresh FSDP2 runs from one seed on an H200 had equal first-step losses and different
first-step gradient norms (bench/RESULTS.md, "Run-to-run determinism"). This builds the 4-layer x 16-expert cut of
the reduced 35B-A3B shape in bf16 with pitlab's kernels (fla's gated delta rule and short convolution, grouped_mm
experts, the chunked loss), runs forward and backward ``--repeats`` times on one batch from the same parameters, and
reports per parameter whether its gradient is bit-identical across the passes (and the largest relative
difference), then once more under ``torch.use_deterministic_algorithms(True, warn_only=True)`` to list the torch
operators that warn of a non-deterministic implementation (fla's Triton kernels do not warn).

    python3 bench/determinism.py --out $OUT/determinism.json [--deterministic]

``--deterministic`` runs every pass under ``torch.use_deterministic_algorithms(True)`` (``CUBLAS_WORKSPACE_CONFIG``
set first): whether that makes the step repeat itself bit for bit with fla's kernels, and an operator that has no
deterministic implementation is reported with torch's error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--deterministic", action="store_true",
                    help="every pass under torch.use_deterministic_algorithms(True)")
    args = ap.parse_args()
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
        torch.use_deterministic_algorithms(True)
    from throughput import QWEN35_REDUCED, shape_config
    from transformers import AutoModelForCausalLM

    from pitlab.trainer.kernels import select_kernels
    from pitlab.trainer.loss import install_loss

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = dict(QWEN35_REDUCED, config=dict(QWEN35_REDUCED["config"], num_hidden_layers=args.layers,
                                             num_experts=args.experts,
                                             num_experts_per_tok=min(8, args.experts)))
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(shape_config(shape), dtype=torch.bfloat16)
    model.config.use_cache = False
    kernels = select_kernels(model, device, install_loss(model, "chunked"))
    model.train()
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(2, shape["vocab"], (1, args.seq + 1), generator=gen).to(device)

    def grads() -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss
        loss.backward()
        return float(loss.detach()), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    try:
        runs = [grads() for _ in range(args.repeats)]
    except RuntimeError as err:  # an operator without a deterministic implementation under --deterministic
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"deterministic": args.deterministic, "error": str(err)[:2000]}, indent=2))
        print("error:", str(err)[:2000])
        return 1
    ref_loss, ref = runs[0]
    per_param = {}
    for name, g in ref.items():
        diffs = [float((r[1][name].float() - g.float()).abs().max() / g.float().abs().max().clamp_min(1e-30))
                 for r in runs[1:]]
        per_param[name] = {"bit_identical": all(torch.equal(r[1][name], g) for r in runs[1:]),
                           "max_relative_difference": max(diffs, default=0.0)}
    differing = sorted(n for n, v in per_param.items() if not v["bit_identical"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if not args.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            grads()
            torch.use_deterministic_algorithms(False)
    nondet = sorted({str(w.message).split(".")[0][:200] for w in caught if "deterministic" in str(w.message)})
    out = {"deterministic": args.deterministic, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "kernels": kernels, "layers": args.layers, "experts": args.experts, "seq": args.seq,
           "losses": [r[0] for r in runs], "losses_bit_identical": len({r[0] for r in runs}) == 1,
           "parameters": len(per_param), "parameters_with_differing_gradients": len(differing),
           "differing": {n: per_param[n] for n in differing}, "non_deterministic_torch_operators": nondet}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps({k: v for k, v in out.items() if k != "differing"}, indent=1))
    groups: dict[str, int] = {}
    for n in differing:
        key = ".".join(x for x in n.split(".") if not x.isdigit())
        groups[key] = groups.get(key, 0) + 1
    print("differing gradients by parameter kind:", json.dumps(groups, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
