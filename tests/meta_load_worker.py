"""torchrun worker for tests/test_trainer_loading.py: meta-device sharded load, peak RSS, parameter digests."""

import json
import resource
import sys
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from pitlab.trainer.digest import tensor_sha256
from pitlab.trainer.loading import load_sharded_model
from pitlab.trainer.rank_exit import exit_rank


def main(base: str, out: str, extra_bases: list[str]) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    import transformers  # noqa: F401  (imports before the baseline)
    torch.set_num_threads(1)
    before_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    before_rss = psutil.Process().memory_info().rss
    model = load_sharded_model(Path(base), mesh, "fp32", torch.device("cpu"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    local_bytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    digests = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        digests[name] = tensor_sha256(full)
    buffers = {n: b.tolist() for n, b in model.named_buffers()}
    Path(out, f"rank-{rank}.json").write_text(json.dumps({
        "rank": rank, "rss_before": before_rss, "maxrss_before": before_max, "maxrss_after_load": peak,
        "local_param_bytes": local_bytes, "digests": digests, "buffers": buffers}))
    for extra in extra_bases:  # further (small) models: digests only
        model = load_sharded_model(Path(extra), mesh, "fp32", torch.device("cpu"))
        digests = {n: tensor_sha256(p.full_tensor()) for n, p in model.named_parameters()}
        Path(out, f"rank-{rank}-{Path(extra).name}.json").write_text(json.dumps(digests))
    dist.destroy_process_group()


if __name__ == "__main__":  # without interpreter finalization: pitlab.trainer.rank_exit says why
    exit_rank(lambda: main(sys.argv[1], sys.argv[2], sys.argv[3:]))
