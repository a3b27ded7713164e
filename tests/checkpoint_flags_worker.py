"""Run by tests/test_checkpoint_flags.py in its own process (one gloo rank): a checkpoint of pitlab's fused step
(MasterAdamW: foreach=False, fused=False) resumed by torch AdamW with foreach=True; prints JSON with the resumed
optimizer's flags and whether its state and parameters equal the saved ones."""

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from pitlab.trainer.checkpoint import load_checkpoint, save_checkpoint
from pitlab.trainer.fused_step import MasterAdamW
from pitlab.trainer.rank_exit import exit_rank


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
        "step": float(resumed.state[next(model.parameters())]["step"])}))
    dist.destroy_process_group()


if __name__ == "__main__":  # without interpreter finalization: pitlab.trainer.rank_exit says why
    exit_rank(main)
