"""Why compiled runs' first-step losses differ between processes and machines (issue 27, item 6).

Builds the 4-layer x 16-expert cut of the reduced Qwen3.5-35B-A3B shape (seed 0, bf16, pitlab's kernels and
chunked loss) and computes the loss of one 4,096-token batch from the initial parameters three ways in one
process: every layer and the loss eager; the loss compiled (as the trainer does on CUDA); the decoder layers
compiled too (``kernels.compile_blocks``, torch's default mode: the trainer's first-step loss without CUDA
graphs). For each, a SHA-256 of every decoder layer's output (bf16 bytes) and of the final hidden states, so
that processes can be compared layer by layer; within the process, how far the compiled layers' outputs are
from the eager ones. Then the launch configurations inductor chose for its Triton kernels in this process
(``*.best_config`` files under ``TORCHINDUCTOR_CACHE_DIR``, as inductor wrote them less the timing and cache hash).

Run it in several processes with cold and warm inductor caches (``bash bench/h200_issue27.sh first-loss``):
equal eager losses and different compiled ones in two cold processes, equal ones with a warm cache, and
different best configurations point at inductor's autotuning.

    TORCHINDUCTOR_CACHE_DIR=/tmp/ind-a python3 bench/first_loss.py --out $OUT/first-loss-a1.json

On the CPU (a rehearsal of the script only) pass ``--shape tiny --backend aot_eager --seq 64``.
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


def best_configs(root: Path) -> dict[str, dict]:
    """Inductor's chosen Triton launch configurations under ``root``: kernel file stem -> the JSON inductor wrote
    (its ``XBLOCK``/``R0_BLOCK``, ``num_warps``, ``num_stages`` and whether coordinate descent found it)."""
    out = {}
    for path in sorted(root.rglob("*.best_config")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            data = {"unreadable": str(err)}
        out[path.stem] = {k: v for k, v in data.items() if k not in ("time_taken_ms", "triton_cache_hash")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="qwen35_reduced", choices=["qwen35_reduced", "tiny"],
                    help="bench/throughput.py's shape, cut to --layers and --experts (tiny: the CPU rehearsal)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend of the layers (aot_eager on a CPU)")
    args = ap.parse_args()
    if args.layers < 1 or args.experts < 2 or args.seq < 2:
        ap.error("--layers >= 1, --experts >= 2 and --seq >= 2")
    cache = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/nonexistent"))
    cold = not any(cache.rglob("*.best_config"))  # nothing under a folder that does not exist
    from throughput import SHAPES, shape_config
    from transformers import AutoModelForCausalLM

    from pitlab.trainer import loss as loss_mod
    from pitlab.trainer.digest import tensor_sha256
    from pitlab.trainer.fsdp import decoder_layers
    from pitlab.trainer.kernels import compile_blocks, select_kernels

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = SHAPES[args.shape]
    shape = dict(base, config=dict(base["config"], num_hidden_layers=args.layers, num_experts=args.experts,
                                   num_experts_per_tok=min(base["config"]["num_experts_per_tok"], args.experts)))
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(shape_config(shape), dtype=torch.bfloat16)
    model.config.use_cache = False
    kernels = select_kernels(model, device, loss_mod.install_loss(model, "chunked"))
    model.train()
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(2, shape["vocab"], (1, args.seq + 1), generator=gen).to(device)
    captured: list[torch.Tensor] = []
    layers = decoder_layers(model)
    for layer in layers:  # around the layer's forward, outside a compiled region
        layer.register_forward_hook(lambda _m, _i, out: captured.append((out[0] if isinstance(out, tuple)
                                                                         else out).detach().clone()))
    model.model.norm.register_forward_hook(lambda _m, _i, out: captured.append(out.detach().clone()))

    def first_loss() -> tuple[float, list[torch.Tensor], float]:
        captured.clear()
        t0 = time.perf_counter()
        loss = model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss
        value = float(loss.detach())  # synchronises
        return value, list(captured), time.perf_counter() - t0

    runs = {}
    outputs = {}
    saved = loss_mod._compiled_rows
    loss_mod._compiled_rows = loss_mod._loss_and_grad_rows  # the eager loss, even on CUDA
    runs["eager"] = first_loss()
    loss_mod._compiled_rows = saved
    runs["loss compiled"] = first_loss()
    compile_blocks(model, backend=args.backend)
    runs["layers and loss compiled"] = first_loss()
    runs["layers and loss compiled, again"] = first_loss()
    eager_outs = runs["eager"][1]
    for name, (value, outs, seconds) in runs.items():
        per_layer = []
        for i, (o, e) in enumerate(zip(outs, eager_outs)):
            d = (o.float() - e.float()).abs()
            per_layer.append({"output": f"layer {i}" if i < len(layers) else "final norm", "sha256_16": tensor_sha256(o)[:16],
                              "elements_differing_from_eager": int((o != e).sum()),
                              "fraction_differing_from_eager": float((o != e).float().mean()),
                              "max_abs_difference_from_eager": float(d.max())})
        outputs[name] = {"loss": value, "loss_repr": repr(value), "seconds": seconds, "outputs": per_layer}
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "kernels": kernels, "layers": args.layers, "experts": args.experts, "seq": args.seq,
           "backend": args.backend, "inductor_cache": str(cache), "inductor_cache_cold_at_start": cold,
           "runs": outputs, "best_configs": best_configs(cache)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    for name, r in outputs.items():
        print(f"{name:<34} loss {r['loss_repr']:<22} {r['seconds']:7.1f} s  final-norm sha {r['outputs'][-1]['sha256_16']}"
              f"  differing from eager per layer: {[x['elements_differing_from_eager'] for x in r['outputs']]}")
    print(f"inductor cache {cache} (cold at start: {cold}): {len(out['best_configs'])} best configurations")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
