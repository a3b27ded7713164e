"""Whether pitlab's trainer computes the same steps with CUDA graphs over its compiled decoder layers as without.

    python3 bench/cuda_graphs_check.py --work /tmp/cg --out "$OUT" [--shape qwen35_reduced] [--steps 8]
        [--accumulation 1,2] [--layers 4 --experts 16] [--env PITLAB_FORCE_FSDP2=1]

For each gradient-accumulation count, two runs from one base model and one token stream in this process, under
``torch.use_deterministic_algorithms(True)`` (``bench/determinism.py --deterministic`` showed pitlab's kernels repeat
a step bit for bit that way): ``PITLAB_COMPILE_MODE=default`` (torch.compile without CUDA graphs), then
``PITLAB_COMPILE_MODE=reduce-overhead`` (CUDA graphs over the compiled decoder layers; what
:func:`pitlab.trainer.kernels.auto_compile_mode` chooses once ``CUDA_GRAPHS_VERIFIED``). Compared step by step: the loss and the gradient norm (float bits),
then every float32 master parameter after the last step (bit equality, the largest absolute difference).
``--env KEY=VALUE`` (repeatable) sets more environment for both runs (``PITLAB_FORCE_FSDP2=1``: the same comparison
on FSDP2's path at world size 1). Writes ``cuda_graphs_check.json`` to ``--out``. ``--shape tiny`` rehearses it on the CPU (no CUDA graphs there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one_run(shape: dict, work: Path, steps: int, accumulation: int, env: dict[str, str]) -> dict:
    """``steps`` optimizer steps of pitlab's trainer with ``env`` set; the losses, gradient norms, the kernels'
    compile label and the float32 master parameters on the CPU."""
    from throughput import pitlab_spec, with_env

    from pitlab.trainer.train import RunPaths, setup_run, train_step

    def go() -> dict:
        overrides = {"gradientAccumulationSteps": accumulation} if accumulation > 1 else None
        spec_path = pitlab_spec(shape, work, steps, overrides)
        ctx = setup_run(spec_path, RunPaths(spec_path.parent, spec_path.parent / "base"))
        t0, out = time.perf_counter(), [train_step(ctx, s) for s in range(steps)]
        params = {n: p.detach().float().cpu() for n, p in ctx.model.named_parameters()}
        result = {"loss": [o.loss for o in out], "grad_norm": [o.grad_norm for o in out],
                  "compile": ctx.kernels.get("compile"), "seconds": time.perf_counter() - t0, "params": params}
        ctx.close()
        return result

    return with_env(env, go)


def compare(a: dict, b: dict) -> dict:
    """Step-by-step bit equality of two runs' losses and gradient norms, and of their final parameters."""
    differing = [n for n in a["params"] if not torch.equal(a["params"][n], b["params"][n])]
    worst = max((float((a["params"][n] - b["params"][n]).abs().max()) for n in differing), default=0.0)
    return {"losses_bit_identical": a["loss"] == b["loss"], "grad_norms_bit_identical": a["grad_norm"] == b["grad_norm"],
            "first_step_differing": next((i for i, (x, y) in enumerate(zip(a["loss"], b["loss"])) if x != y), None),
            "parameters": len(a["params"]), "parameters_differing": len(differing),
            "max_abs_parameter_difference": worst}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="qwen35_reduced")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--accumulation", default="1,2", help="comma-separated gradient-accumulation counts")
    ap.add_argument("--layers", type=int, default=0, help="cut the shape to this many decoder layers (0: as is)")
    ap.add_argument("--experts", type=int, default=0, help="and to this many experts (0: as is)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="more environment for both runs (repeatable), e.g. PITLAB_FORCE_FSDP2=1")
    args = ap.parse_args()
    extra = {}
    for item in args.env:
        key, eq, value = item.partition("=")
        if not eq or not key:
            ap.error(f"--env: expected KEY=VALUE (got {item!r})")
        extra[key] = value
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
    torch.use_deterministic_algorithms(True)
    from throughput import SHAPES, init_single_process_group

    init_single_process_group()
    shape = SHAPES[args.shape]
    if args.layers or args.experts:
        cut = {k: v for k, v in (("num_hidden_layers", args.layers), ("num_experts", args.experts)) if v}
        shape = dict(shape, name=f"{shape['name']}_{args.layers}x{args.experts}", config=dict(shape["config"], **cut))
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"shape": shape["name"], "steps": args.steps, "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "env": extra, "runs": {}}
    for k in (int(x) for x in args.accumulation.split(",")):
        plain = one_run(shape, args.work, args.steps, k, dict(extra, PITLAB_COMPILE_MODE="default"))
        graphs = one_run(shape, args.work, args.steps, k, dict(extra, PITLAB_COMPILE_MODE="reduce-overhead"))
        entry = {"default": {x: plain[x] for x in ("loss", "grad_norm", "compile", "seconds")},
                 "cuda_graphs": {x: graphs[x] for x in ("loss", "grad_norm", "compile", "seconds")}, **compare(plain, graphs)}
        report["runs"][f"accumulation_{k}"] = entry
        print(json.dumps({f"accumulation_{k}": {x: v for x, v in entry.items() if x not in ("default", "cuda_graphs")},
                          "compile": [plain["compile"], graphs["compile"]]}), flush=True)
        del plain, graphs
        (args.out / "cuda_graphs_check.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
