"""Host time of the fused optimizer step per mode (``PITLAB_FUSED_STEP_SHAPES``), on the CPU: the reduced
Qwen3.5-35B-A3B's 141 parameters in the model's order and layer groups, each of its 13 sizes mapped to a distinct
small one (16, 32, ... elements, in order), so that the graphs are as many as the model's but the kernels cost next
to nothing and the time per step is the host's (dynamo's guards, the compiled wrapper, the
Python loop). Inductor's CPU backend; median of 20 steps after 3 warm-up steps, and the first call (compilation).

    .venv/bin/python bench/fused_step_host.py --out bench/results/fused-step-host-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fused_step_modes import model_shapes  # noqa: E402
from throughput import QWEN35_REDUCED  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--modes", default="dynamic,rows16,static,grouped")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    import pitlab.trainer.fused_step as fs

    shapes, names = model_shapes(QWEN35_REDUCED)
    sizes = sorted({int(torch.Size(s).numel()) for s in shapes})  # each distinct size a distinct small one
    small = [(16 * (1 + sizes.index(int(torch.Size(s).numel()))),) for s in shapes]
    res: dict = {"tensors": len(small), "elements": sum(s[0] for s in small), "torch": torch.__version__,
                 "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(), "modes": {}}
    for mode in args.modes.split(","):
        os.environ["PITLAB_FUSED_STEP_SHAPES"] = mode
        torch._dynamo.reset()
        gen = torch.Generator().manual_seed(0)
        ps = [torch.randn(s, generator=gen) for s in small]
        gs = [torch.randn(s, generator=gen).to(torch.bfloat16) for s in small]
        cs = [torch.empty(s, dtype=torch.bfloat16) for s in small]
        opt = fs.MasterAdamW(ps, compiled=True, lr=3e-4, weight_decay=0.1, groups=fs.layer_groups(names))
        t0 = time.perf_counter()
        opt.clip_step_cast(gs, cs, 1.0)
        first = time.perf_counter() - t0
        times = []
        for k in range(3 + args.steps):
            t0 = time.perf_counter()
            opt.clip_step_cast(gs, cs, 1.0)
            if k >= 3:
                times.append(time.perf_counter() - t0)
        ms = 1e3 * statistics.median(times)
        res["modes"][mode] = {"ms_per_step": ms, "us_per_parameter": 1e3 * ms / len(small), "first_call_s": first,
                              "min_ms": 1e3 * min(times), "max_ms": 1e3 * max(times)}
        print(mode, {k: round(v, 3) for k, v in res["modes"][mode].items()}, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
