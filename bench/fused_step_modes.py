"""The fused optimizer update (:class:`pitlab.trainer.fused_step.MasterAdamW`) over every parameter of the reduced
Qwen3.5-35B-A3B model (141 tensors, 2.91 B parameters, in the model's order), compiled each way
``PITLAB_FUSED_STEP_SHAPES`` allows: ``dynamic`` (symbolic sizes, 1-D views; the default until 723ffa3),
``rows16`` ([n/16, 16] views), ``static`` (one kernel per size) and ``grouped`` (static sizes, one compiled call
per decoder layer). bf16 gradients and a bf16 copy, as the single-device path steps;
median of 10 timed steps (CUDA events) after 3 warm-up steps, and the effective bandwidth at 28 bytes per parameter
(read the float32 master and both moments and the bf16 gradient, write the three and the bf16 copy). Every mode
starts from the same seeded tensors; after one step the masters and copies are compared with the default's bit
for bit (a sample of 2^20 elements of each tensor, and the sum of all in float64).

The time per step is the host's loop as well as the kernels (CUDA events around the whole call): 141 calls of a
compiled function cost host time that ``grouped`` (one call per layer) does not.

Why: profiled inside the model on an H100 (bench/RESULTS.md, 2026-12-05) the update took 55 ms of a 125 ms step,
1.5 TB/s, where ``bench/fused_step_views.py`` had reached 3.4 TB/s on an H200 on 7 of the shapes.

    python3 bench/fused_step_modes.py --out $OUT/fused_step_modes.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_checks import timed  # noqa: E402
from hostload import host_load  # noqa: E402
from throughput import QWEN35_REDUCED  # noqa: E402

BYTES_PER_PARAMETER = 28
SAMPLE = 1 << 20


def model_shapes(shape: dict) -> tuple[list[tuple[int, ...]], list[str]]:
    """The parameter shapes of ``shape`` (a bench/throughput.py shape entry) in the model's order (meta device),
    and their names."""
    from transformers import AutoModelForCausalLM

    from pitlab.trainer.prepare import build_config

    config = build_config(shape["model_type"], shape["config"], vocab_size=shape["vocab"], eos_token_id=0,
                          pad_token_id=1, bos_token_id=0)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    named = list(model.named_parameters())
    return [tuple(p.shape) for _, p in named], [n for n, _ in named]


def tensors(shapes, seed: int):
    """Seeded float32 masters, bf16 gradients and bf16 copies of ``shapes`` on CUDA."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    ps = [torch.randn(s, device="cuda", generator=gen).mul_(0.02) for s in shapes]
    gs = [torch.randn(s, device="cuda", generator=gen, dtype=torch.bfloat16).mul_(0.01) for s in shapes]
    cs = [torch.empty(s, device="cuda", dtype=torch.bfloat16) for s in shapes]
    return ps, gs, cs


def fingerprint(ts: list[torch.Tensor]) -> tuple[list[torch.Tensor], float]:
    """The first 2^20 elements of every tensor (on the CPU) and the float64 sum of all."""
    return [t.reshape(-1)[:SAMPLE].cpu() for t in ts], float(sum(t.double().sum() for t in ts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--modes", default="dynamic,static,rows16,grouped")
    args = ap.parse_args()
    import pitlab.trainer.fused_step as fs

    shapes, names = model_shapes(QWEN35_REDUCED)
    n = sum(int(torch.Size(s).numel()) for s in shapes)
    res: dict = {"tensors": len(shapes), "parameters": n, "distinct_sizes": len({torch.Size(s).numel() for s in shapes}),
                 "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "host": host_load(), "modes": {}}
    print({k: v for k, v in res.items() if k != "modes"}, flush=True)
    ref = None
    for mode in args.modes.split(","):
        os.environ["PITLAB_FUSED_STEP_SHAPES"] = mode
        torch._dynamo.reset()
        ps, gs, cs = tensors(shapes, seed=11)
        opt = fs.MasterAdamW(ps, compiled=True, lr=3e-4, weight_decay=0.1,
                             groups=fs.layer_groups(names))
        t0 = time.perf_counter()
        opt.clip_step_cast(gs, cs, 1.0)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        fp = fingerprint(ps + cs)
        if ref is None:
            ref, same = fp, True
        else:
            same = all(torch.equal(a, b) for a, b in zip(fp[0], ref[0])) and fp[1] == ref[1]
        ms = timed(lambda: opt.clip_step_cast(gs, cs, 1.0), warmup=3)
        res["modes"][mode] = {"ms": ms, "first_call_s": first, "tb_per_s": n * BYTES_PER_PARAMETER / ms / 1e9,
                              "equal_to_dynamic_after_one_step": same}
        print(mode, res["modes"][mode], flush=True)
        del opt, ps, gs, cs
        torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
