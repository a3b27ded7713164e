"""Worker for tests/test_fsdp2_fused_step.py: pitlab's trainer on FSDP2 in every rank of a gloo world started by
torchrun (``PITLAB_FORCE_FSDP2=1`` keeps FSDP2 at world size 1).

    python -m torch.distributed.run --standalone --nproc_per_node N tests/fsdp2_fused_worker.py PLAN.json OUT.json

``PLAN.json``: a list of runs, done in order in these processes, each ``{"name", "run_dir", "base", "mode"}``.
``mode: "steps"`` (with ``"steps"`` and ``"params"``, a ``.pt`` file; optional ``"env"``: variables set for that run
only): ``setup_run`` + ``train_step``; records each
step's loss and gradient norm, the optimizer's kernel label, the layout of the optimizer's ``state_dict`` and of
the DCP optimizer state dict a checkpoint saves (class, global and local shape, dtype of each entry), and saves the
final float32 parameters and AdamW moments (full tensors, by name). ``mode: "train"``: the whole ``train``
(checkpoints, summary), first copying the checkpoint ``resume_from`` (a ``step-<N>`` folder) when given, so that
the run resumes from it. Rank 0 writes ``OUT.json``: name -> record.
"""

import json
import os
import shutil
import sys
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist

from pitlab.trainer.rank_exit import exit_rank


def _layout(value) -> list:
    """``[class, global shape, local shape, dtype]`` of a tensor (the local shape is a DTensor's shard), else
    ``[repr]``."""
    from torch.distributed.tensor import DTensor

    if not isinstance(value, torch.Tensor):
        return [repr(value)]
    local = value.to_local() if isinstance(value, DTensor) else value
    return [type(value).__name__, list(value.shape), list(local.shape), str(value.dtype)]


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def steps_run(item: dict) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from pitlab.trainer.checkpoint import STATE_DICT_OPTIONS
    from pitlab.trainer.train import RunPaths, setup_run, train_step

    run = Path(item["run_dir"])
    with mock.patch.dict(os.environ, item.get("env", {})):  # restored afterwards
        ctx = setup_run(run / "spec.json", RunPaths(run, Path(item["base"])))
        steps = [train_step(ctx, s) for s in range(item["steps"])]
    opt = ctx.optimizer
    names = {id(p): n for n, p in ctx.model.named_parameters()}
    tensors = {n: _full(p) for n, p in ctx.model.named_parameters()}  # collective: every rank gathers
    for p in opt.param_groups[0]["params"]:
        for key in ("exp_avg", "exp_avg_sq"):
            tensors[f"{names[id(p)]}:{key}"] = _full(opt.state[p][key])
    sd = opt.state_dict()
    _, dcp_optim = get_state_dict(ctx.model, opt, options=STATE_DICT_OPTIONS)
    record = {"loss": [s.loss for s in steps], "grad_norm": [s.grad_norm for s in steps],
              "parallelism": ctx.parallelism, "optimizer": ctx.kernels["optimizer"],
              "copy_in": ctx.kernels["reduce_scatter_copy_in"], "grads": ctx.kernels["fsdp_grads"],
              "optimizer_class": type(opt).__name__,
              "state": {str(i): {k: _layout(v) for k, v in s.items()} for i, s in sd["state"].items()},
              "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]],
              "dcp_state": {fqn: {k: _layout(v) for k, v in s.items()} for fqn, s in dcp_optim["state"].items()}}
    if dist.get_rank() == 0:
        torch.save(tensors, item["params"])
    ctx.close()
    return record


def train_run(item: dict) -> dict:
    from pitlab.trainer.train import RunPaths, train

    run = Path(item["run_dir"])
    if item.get("resume_from") and dist.get_rank() == 0:
        src = Path(item["resume_from"])
        shutil.copytree(src, run / "checkpoint" / src.name)
        (run / "checkpoint" / "latest").write_text(src.name + "\n")
    dist.barrier()
    summary = train(run / "spec.json", RunPaths(run, Path(item["base"])))
    if dist.get_rank() != 0:
        return {}
    metrics = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    return {"summary": {k: summary[k] for k in ("param_sha256", "parallelism", "resumed_from_step", "final_loss",
                                                "kernels")},
            "metrics": [{k: r[k] for k in ("step", "loss", "grad_norm", "lr")} for r in metrics]}


def main(plan_path: str, out_path: str) -> None:
    os.environ["PITLAB_FORCE_FSDP2"] = "1"  # FSDP2 at world size 1 too
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    results = {}
    for item in json.loads(Path(plan_path).read_text()):
        results[item["name"]] = (steps_run if item["mode"] == "steps" else train_run)(item)
    if dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":  # without interpreter finalization: pitlab.trainer.rank_exit says why
    exit_rank(lambda: main(sys.argv[1], sys.argv[2]))
