"""Run by tests/test_checkpoint_flags.py in its own process (one gloo rank): a checkpoint of pitlab's fused step
(MasterAdamW: foreach=False, fused=False) resumed by torch AdamW with foreach=True; prints JSON with the resumed
optimizer's flags and whether its state and parameters equal the saved ones; then the same checkpoint resumed by a
fresh MasterAdamW, whether it stepped during the load (torch's own state initialisation steps on zero gradients)."""

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from pitlab.trainer.checkpoint import load_checkpoint, save_checkpoint
from pitlab.trainer.fused_step import MasterAdamW
from pitlab.trainer.rank_exit import exit_rank


def master_resume(ckpt: Path, saved: dict, moments: list) -> dict:
    """The checkpoint loaded into a fresh model and MasterAdamW whose ``step`` is spied on."""
    torch.manual_seed(1)
    model = torch.nn.Linear(8, 4)
    opt = MasterAdamW(model.parameters(), compiled=False, lr=1e-2, weight_decay=0.1)
    calls = []
    real_step = opt.step
    opt.step = lambda *a, **k: (calls.append(1), real_step(*a, **k))[1]
    load_checkpoint(ckpt, model, opt)
    state = [opt.state[p] for p in model.parameters()]
    return {"stepped_during_load": len(calls), "grads": [p.grad is not None for p in model.parameters()],
            "params_equal": all(torch.equal(p, saved[n]) for n, p in model.named_parameters()),
            "moments_equal": all(torch.equal(st["exp_avg"], m) for st, m in zip(state, moments)),
            "steps": [float(st["step"]) for st in state],
            "step_on_cpu": all(st["step"].device.type == "cpu" and st["step"].dtype == torch.float32 for st in state)}


def main() -> None:
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    saver = MasterAdamW(model.parameters(), compiled=False, lr=1e-2, weight_decay=0.1)
    model(torch.randn(3, 8)).square().sum().backward()
    saver.step()
    saver.zero_grad(set_to_none=True)
    ckpt = save_checkpoint(Path(sys.argv[1]), 1, model, saver, keep=1)
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    moments = [saver.state[p]["exp_avg"].clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    resumed = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=True)
    load_checkpoint(ckpt, model, resumed)
    g = resumed.param_groups[0]
    print(json.dumps({
        "foreach": g["foreach"], "fused": g["fused"], "lr": g["lr"], "weight_decay": g["weight_decay"],
        "params_equal": all(torch.equal(p, saved[n]) for n, p in model.named_parameters()),
        "moments_equal": all(torch.equal(resumed.state[p]["exp_avg"], m) for p, m in zip(model.parameters(), moments)),
        "step": float(resumed.state[next(model.parameters())]["step"]),
        "master": master_resume(ckpt, saved, moments)}))
    dist.destroy_process_group()


if __name__ == "__main__":  # without interpreter finalization: pitlab.trainer.rank_exit says why
    exit_rank(main)
