"""Where a non-finite gradient of a layer-streamed step comes from (issue 12): one microbatch, first in its process.

    python bench/streaming_diag.py --base /tmp/stream/base --out "$OUT/diag-a.json" [--attn eager] [--no-cap]
        [--anomaly] [--check-slots]

Loads ``--base`` (written by ``bench/streaming.py``) exactly as the trainer does (:func:`load_streamed_model`),
runs one forward + backward of :func:`streamed_loss` on Zipf tokens, and records per decoder layer whether its
forward output and the gradient arriving at it are finite, which LoRA gradients are not, and (``--check-slots``)
whether every slot holds its layer's host store when the layer computes (a device synchronisation per layer).
``--anomaly`` runs the backward under ``torch.autograd.detect_anomaly`` (the forward op whose backward first
gave NaN is printed). Writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

GiB = 2 ** 30


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--cap-gib", type=float, default=4.0)
    ap.add_argument("--no-cap", action="store_true")
    ap.add_argument("--attn", default=None, help="attn_implementation to force (eager, sdpa)")
    ap.add_argument("--anomaly", action="store_true")
    ap.add_argument("--check-slots", action="store_true")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--trainer", action="store_true",
                    help="run pitlab's trainer (bench/streaming.py's run_trainer) for --steps steps instead, with "
                         "the finiteness of every layer's output and incoming gradient and of each LoRA gradient "
                         "recorded before clipping")
    ap.add_argument("--bandwidth-first", action="store_true",
                    help="measure the pinned bandwidth first, as bench/streaming.py does")
    args = ap.parse_args()
    if args.trainer:
        return trainer_mode(args)

    import torch.distributed as dist

    from pitlab.trainer.streaming import load_streamed_model, streamed_loss
    from streaming import resource

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")  # CPU: a smoke test of this script
    budget = int(args.cap_gib * GiB)
    if cuda and not args.no_cap:
        torch.cuda.set_per_process_memory_fraction(budget / torch.cuda.get_device_properties(device).total_memory)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29544")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    res = resource(args.base, args.seq, 1, 8, budget, 2)
    model, streamer = load_streamed_model(args.base, res.spec, device)
    if args.attn:
        model.config._attn_implementation = args.attn
        for m in model.modules():
            if hasattr(m, "config") and hasattr(m.config, "_attn_implementation"):
                m.config._attn_implementation = args.attn
    model.train()
    vocab = model.config.get_text_config().vocab_size
    rng = np.random.default_rng(0)
    out: dict = {"args": vars(args) | {"base": str(args.base), "out": str(args.out)}, "steps": []}
    layers = streamer.layers
    slot_mismatch: list = []
    if args.check_slots:
        orig_use = streamer._use

        def checked_use(i, step):
            orig_use(i, step)
            if cuda:
                torch.cuda.synchronize()
            s = i % streamer.buffers
            for dtype, src in streamer.host[i].items():
                if not torch.equal(streamer.slots[s][dtype][:src.numel()].cpu(), src):
                    slot_mismatch.append({"layer": i, "dtype": str(dtype), "recompute": streamer._recomputing})
            for p, (name, dtype, off, shape) in zip(streamer.params[i], streamer.layouts[i].entries):
                if p.data.data_ptr() != streamer.slots[s][dtype][off:].data_ptr():
                    slot_mismatch.append({"layer": i, "param": name, "bound": "not to its slot"})
        streamer._use = checked_use
    for step in range(args.steps):
        rec: dict = {"forward_nonfinite_layers": [], "grad_nonfinite_layers": []}
        handles = []

        def fwd_hook(i):
            def hook(mod, inp, output):
                h = output[0] if isinstance(output, tuple) else output
                if torch.is_grad_enabled() and h.requires_grad:
                    if not bool(torch.isfinite(h).all()):
                        rec["forward_nonfinite_layers"].append(i)
                    h.register_hook(lambda g, i=i: rec["grad_nonfinite_layers"].append(i)
                                    if not bool(torch.isfinite(g).all()) else None)
            return hook
        for i, layer in enumerate(layers):
            handles.append(layer.register_forward_hook(fwd_hook(i)))
        ids = np.minimum(rng.zipf(1.2, size=args.seq + 1) + 1, vocab - 1).astype(np.int64)
        t = torch.from_numpy(ids).to(device)
        input_ids, labels = t[:-1].unsqueeze(0), t[1:].unsqueeze(0)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            loss = streamed_loss(model, input_ids, labels)
            rec["loss"] = float(loss)
            if args.anomaly:
                with torch.autograd.detect_anomaly(check_nan=True):
                    loss.backward()
            else:
                loss.backward()
        except Exception as e:  # noqa: BLE001 - recorded for the diagnosis
            rec["error"] = "".join(traceback.format_exception(e))[-4000:]
        for h in handles:
            h.remove()
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
        rec["lora_grads"] = sum(1 for p in model.parameters() if p.grad is not None)
        rec["lora_grads_nonfinite"] = bad[:20]
        rec["lora_grads_nonfinite_count"] = len(bad)
        norms = [float(p.grad.float().norm()) for p in model.parameters() if p.grad is not None]
        rec["grad_norm"] = float(np.sqrt(np.sum(np.square(norms)))) if norms else None
        rec["peak_allocated"] = torch.cuda.max_memory_allocated() if cuda else None
        rec["slot_mismatch"] = slot_mismatch[:20]
        rec["slot_mismatch_count"] = len(slot_mismatch)
        model.zero_grad(set_to_none=True)
        out["steps"].append(rec)
        print(json.dumps(rec)[:3000], flush=True)
    dist.destroy_process_group()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


def trainer_mode(args) -> int:
    """The trainer's own steps with :func:`pitlab.trainer.strategies.base.clip_grad_norm` and the streamer's loss wrapped
    to record non-finite values; JSON to ``--out``."""
    import torch.distributed as dist

    import pitlab.trainer.streaming as streaming_mod
    import pitlab.trainer.strategies.base as strategy_mod
    from streaming import pinned_bandwidth, resource, run_trainer

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda and args.bandwidth_first:
        print(f"pinned bandwidth {pinned_bandwidth(device) / 1e9:.1f} GB/s", flush=True)
    budget = int(args.cap_gib * GiB)
    if cuda and not args.no_cap:
        torch.cuda.set_per_process_memory_fraction(budget / torch.cuda.get_device_properties(device).total_memory)
    steps: list[dict] = []
    orig_loss, orig_clip = streaming_mod.LayerStreamer.loss, strategy_mod.clip_grad_norm
    live_handles: list = []
    lazy: dict = {"fwd": [], "grad": []}

    def loss(model, input_ids, labels):
        rec = {"forward_nonfinite_layers": [], "grad_nonfinite_layers": []}
        steps.append(rec)
        layers = streaming_mod.decoder_layers(model)
        handles = []
        for i, layer in enumerate(layers):
            def hook(mod, inp, output, i=i):
                h = output[0] if isinstance(output, tuple) else output
                if torch.is_grad_enabled() and h.requires_grad:  # flags stay on the GPU: no host sync
                    lazy["fwd"].append((i, torch.isfinite(h).all()))
                    h.register_hook(lambda g: lazy["grad"].append((i, torch.isfinite(g).all())))
            handles.append(layer.register_forward_hook(hook))
        out = orig_loss(model, input_ids, labels)
        live_handles[:] = handles  # removed after the backward (the recompute must run the same hooks)
        lazy["loss"] = out.detach()
        return out

    def clip(model, max_norm):
        rec = steps[-1]
        for h in live_handles:
            h.remove()
        rec["loss"] = float(lazy["loss"])
        rec["forward_nonfinite_layers"] = [i for i, f in lazy["fwd"] if not bool(f)]
        rec["grad_nonfinite_layers"] = [i for i, f in lazy["grad"] if not bool(f)]
        lazy.update(fwd=[], grad=[])
        grads = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
        bad = [n for n, g in grads if not bool(torch.isfinite(g).all())]
        rec.update(grads=len(grads), grads_nonfinite_count=len(bad), grads_nonfinite=bad[:12],
                   params_nonfinite=[n for n, p in model.named_parameters()
                                     if p.requires_grad and not bool(torch.isfinite(p).all())][:12])
        norm = orig_clip(model, max_norm)
        rec["grad_norm"] = float(norm)  # clip_grad_norm returns the norm as a tensor (train_step reads it later)
        print(json.dumps(rec)[:2000], flush=True)
        return norm
    streaming_mod.LayerStreamer.loss = staticmethod(loss)
    strategy_mod.clip_grad_norm = clip
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29545")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    res = resource(args.base, args.seq, 1, args.steps, budget, 2)
    vocab = json.loads((args.base / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(0)
    tokens = np.minimum(rng.zipf(1.2, size=(args.seq + 1) * args.steps + 1) + 1, vocab - 1).astype(np.uint32)
    error = None
    try:
        run_trainer(res, Path("/tmp/diag-run"), args.base, tokens, 0)
    except Exception as e:  # noqa: BLE001 - recorded for the diagnosis
        error = "".join(traceback.format_exception_only(e))
    dist.destroy_process_group()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": str(vars(args)), "steps": steps, "error": error}, indent=1))
    print("error:", error, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
