"""Worker for tests/test_single_device.py: pitlab's trainer in one gloo process of world size 1, on the single-device
path (float32 masters + bf16 compute copy) or, with ``force_fsdp2``, on FSDP2 (``PITLAB_FORCE_FSDP2=1``).

    python tests/single_device_worker.py PLAN.json OUT.json

``PLAN.json``: a list of runs, done in order in this process, each ``{"name", "run_dir", "base", "mode",
"force_fsdp2"}`` and for ``mode: "steps"`` ``"steps"`` and ``"params"`` (a ``.pt`` file for the final float32
parameters, full tensors by name): ``setup_run`` + ``train_step`` (records each step's loss and gradient norm, the
path, dtypes, and how often the first decoder layer's input norm ran: twice per microbatch with activation
checkpointing); ``mode: "train"``: the whole ``train`` (resume,
checkpoints, summary), first copying the checkpoint ``resume_from`` (a ``step-<N>`` folder) when given, so that the
run resumes from it. ``OUT.json``: name -> record.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from reference import gloo_world_of_one  # tests/ is sys.path[0] when this runs as a script


def steps_run(item: dict) -> dict:
    from torch.distributed.tensor import DTensor

    from pitlab.trainer.fsdp import decoder_layers
    from pitlab.trainer.train import RunPaths, setup_run, train_step

    import torch.distributed.fsdp._fully_shard._fsdp_param_group as fsdp_group

    run = Path(item["run_dir"])
    ctx = setup_run(run / "spec.json", RunPaths(run, Path(item["base"])))
    # FSDP2's gathers: a parameter group made unsharded (torch skips the collective at world size 1, not this)
    gathers = [0]
    to_unsharded = fsdp_group.FSDPParamGroup._to_unsharded

    def counted(self):
        gathers[0] += 1
        return to_unsharded(self)

    fsdp_group.FSDPParamGroup._to_unsharded = counted
    reduces = [0]  # FSDP2's reduce-scatters (one per parameter group each time it reduces)
    foreach_reduce = fsdp_group.foreach_reduce

    def counted_reduce(*args, **kwargs):
        reduces[0] += 1
        return foreach_reduce(*args, **kwargs)

    fsdp_group.foreach_reduce = counted_reduce
    calls = [0]
    # inside the layer: transformers checkpoints the layer's forward, so a hook on the layer itself runs once
    norm = decoder_layers(ctx.forward_model)[0].input_layernorm
    norm.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        steps = [train_step(ctx, s) for s in range(item["steps"])]
    finally:
        fsdp_group.FSDPParamGroup._to_unsharded = to_unsharded
        fsdp_group.foreach_reduce = foreach_reduce
    params = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
              for n, p in ctx.model.named_parameters()}
    torch.save(params, item["params"])
    record = {"loss": [s.loss for s in steps], "grad_norm": [s.grad_norm for s in steps],
              "parallelism": ctx.parallelism, "kernels": ctx.kernels,
              "first_layer_norm_calls": calls[0], "all_gathers": gathers[0], "reduce_scatters": reduces[0],
              "layers": len(decoder_layers(ctx.forward_model)),
              "activation_checkpointing": ctx.activation_checkpointing,
              "master_dtypes": sorted({str(p.dtype) for p in ctx.model.parameters()}),
              "dtensor": any(isinstance(p, DTensor) for p in ctx.model.parameters()),
              "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}
    if ctx.compute is not None:
        record["copy_param_dtypes"] = sorted({str(p.dtype) for p in ctx.compute.model.parameters()})
        record["copy_buffer_dtypes"] = sorted({str(b.dtype) for b in ctx.compute.model.buffers()})
        record["copy_equals_masters"] = all(torch.equal(c, m.to(torch.bfloat16)) for c, m in
                                            zip(ctx.compute.model.parameters(), ctx.model.parameters()))
    ctx.close()
    return record


def train_run(item: dict) -> dict:
    from pitlab.trainer.train import RunPaths, train

    run = Path(item["run_dir"])
    if item.get("resume_from"):
        src = Path(item["resume_from"])
        shutil.copytree(src, run / "checkpoint" / src.name)
        (run / "checkpoint" / "latest").write_text(src.name + "\n")
    summary = train(run / "spec.json", RunPaths(run, Path(item["base"])))
    metrics = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    return {"summary": {k: summary[k] for k in ("param_sha256", "parallelism", "resumed_from_step", "final_loss")},
            "metrics": [{k: r[k] for k in ("step", "loss", "grad_norm", "lr")} for r in metrics]}


def main(plan_path: str, out_path: str) -> None:
    gloo_world_of_one()
    torch.set_num_threads(1)
    from pitlab.trainer.single_device import FORCE_FSDP2_ENV

    results = {}
    for item in json.loads(Path(plan_path).read_text()):
        if item["force_fsdp2"]:
            os.environ[FORCE_FSDP2_ENV] = "1"
        else:
            os.environ.pop(FORCE_FSDP2_ENV, None)
        results[item["name"]] = (steps_run if item["mode"] == "steps" else train_run)(item)
    Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
