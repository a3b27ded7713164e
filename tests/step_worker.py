"""Worker for tests/test_trainer_step.py (one gloo rank, its own process): pitlab's ``setup_run`` + ``train_step``
on a run directory (``MODE:deferred``: through ``run_steps``), counting the host reads of device values that pitlab's trainer code issues (``item()``,
``float()``, ``int()``, ``bool()``, ``tolist()`` called from ``pitlab/trainer``) and dynamo's graph breaks,
recompilations and graphs.

    python tests/step_worker.py RUN_DIR OUT.json STEPS [eager|BACKEND|BACKEND:opaque]...

One fresh ``setup_run`` per mode, in order: ``eager``, or a torch.compile backend (e.g. ``aot_eager``) with which
the decoder layers are compiled as ``training.compile`` does on a GPU
(:func:`pitlab.trainer.kernels.compile_blocks`), here on the CPU; ``:opaque`` first makes the short convolution
and the gated delta rule opaque to dynamo, as fla's kernels are on a GPU (:func:`stand_in`; it stays for the
modes after it, the modeling module being shared).
"""

import collections
import json
import os
import sys
from pathlib import Path

import torch
import torch._dynamo
import torch.distributed as dist

from reference import gloo_world_of_one  # tests/ is sys.path[0] when this runs as a script

READS = ("item", "tolist", "__float__", "__int__", "__bool__")


def count_reads(counter: collections.Counter) -> None:
    """Wrap the Tensor methods that copy a device value to the host; count calls made from pitlab/trainer."""
    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapped(self, *a, _original=original, _name=name, **k):
            frame = sys._getframe(1)
            if "pitlab/trainer" in frame.f_code.co_filename.replace(os.sep, "/"):
                counter[f"{_name} {Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"] += 1
            return _original(self, *a, **k)

        setattr(torch.Tensor, name, wrapped)


def stand_in(model) -> None:
    """Bind the linear-attention layers' short convolution and gated delta rule to their reference functions
    wrapped in ``torch.compiler.disable``: the structure a compiled layer has on a GPU, where they are fla's
    kernels (fla's gated delta rule is ``torch.compiler.disable``d, and so is
    :func:`pitlab.trainer.kernels.fla_short_convolution`). Same functions, so the same values."""
    from pitlab.trainer.kernels import _bound_implementation, _modeling_modules

    for m in _modeling_modules(model):
        m.causal_conv1d_fn = torch.compiler.disable(_bound_implementation(m.causal_conv1d_fn))
        m.torch_chunk_gated_delta_rule = torch.compiler.disable(m.torch_chunk_gated_delta_rule)


def main(run_dir: str, out: str, steps: int, modes: list[str]) -> None:
    gloo_world_of_one()
    torch.set_num_threads(1)
    from torch._dynamo.utils import counters

    from pitlab.trainer.kernels import compile_blocks
    from pitlab.trainer.metrics import LossHistory
    from pitlab.trainer.step import run_steps
    from pitlab.trainer.train import RunPaths, setup_run, train_step

    run = Path(run_dir)
    reads: collections.Counter = collections.Counter()
    count_reads(reads)
    results = {}
    for mode in modes:
        ctx = setup_run(run / "spec.json", RunPaths(run, run / "base"))
        backend, _, variant = mode.partition(":")
        deferred = variant == "deferred"  # run_steps: each step read after the next one was launched
        if variant == "opaque":  # the short convolution and gated delta rule opaque to dynamo, as fla's are on a GPU
            stand_in(ctx.model)
        if backend != "eager":
            torch._dynamo.reset()  # each mode's graphs and counters its own
            counters.clear()
            ctx.kernels["compile"] = compile_blocks(ctx.forward_model, backend=backend)  # the compute copy
        reads.clear()
        per_step = []
        before = 0
        stepped = (run_steps(ctx, range(steps), LossHistory()) if deferred
                   else ((step, train_step(ctx, step)) for step in range(steps)))
        for _, r in stepped:
            per_step.append({"loss": r.loss, "grad_norm": r.grad_norm, "grad_norm_type": type(r.grad_norm).__name__,
                             "reads": sum(reads.values()) - before,
                             "graph_breaks": sum(counters["graph_break"].values()),
                             "unique_graphs": counters["stats"]["unique_graphs"]})
            before = sum(reads.values())
        results[mode] = {"steps": per_step, "reads": dict(reads), "kernels": ctx.kernels,
                         "graph_break_reasons": dict(counters["graph_break"])}
        ctx.close()
    Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:] or ["eager"])
