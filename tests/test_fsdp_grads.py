"""pitlab.trainer.fsdp_grads: FSDP2's accumulation of microbatches that are not reduced (the first bf16 gradient
held, summed with the second in one pass) and its one-rank reduce without the copy give FSDP2's own float32
gradients bit for bit, with 1-4 microbatches and parameters that miss a microbatch's gradient; a pair summed in
bf16 would not. One gloo rank in a subprocess (the trainer's comparisons on 1 and 2 ranks are in
tests/test_fsdp2_fused_step.py and tests/test_single_device.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from pitlab.trainer.knobs import fsdp_grads_mode

SCRIPT = r"""
import json, sys
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from pitlab.trainer import fsdp_copy_in, fsdp_grads

fsdp_copy_in.install_copy_in({})  # pitlab's copy-in (the trainer's default): it adds the last microbatch

DEV = sys.argv[1]  # cpu (gloo, eager pair sums) or cuda (nccl, the pair sums compiled by inductor)
dist.init_process_group("gloo" if DEV == "cpu" else "nccl", store=dist.HashStore(), rank=0, world_size=1)
mesh = init_device_mesh(DEV, (1,))
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
USES_B = [True, False, True, False]  # the branch runs in microbatches 1 and 3 only
REUSED = [0]  # outputs the one-rank comm gave as its input again
allocate = fsdp_grads.OneRankReduceScatter.allocate


def counted(self, size, *, dtype, device):
    before = self._input
    t = allocate(self, size, dtype=dtype, device=device)
    REUSED[0] += t is before
    return t


fsdp_grads.OneRankReduceScatter.allocate = counted
ON_COPY = [0]  # float32 sums whose last gradient the copy-in added
add_on_copy_in = fsdp_grads.add_on_copy_in
fsdp_grads.add_on_copy_in = lambda total, grad: (ON_COPY.__setitem__(0, ON_COPY[0] + 1), add_on_copy_in(total, grad))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x, use_b):
        h = self.a(x)
        return self.c(h + self.b(h) if use_b else h)


def run(mode, k, pair=None):
    torch.manual_seed(0)
    net = Net().to(DEV)
    for m in (net.a, net.b, net.c):
        fully_shard(m, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    fully_shard(net, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    label = fsdp_grads.install_grads(net, 1, DEV == "cuda", {"PITLAB_FSDP_GRADS": mode})
    if pair is not None:
        for g in fsdp_grads.param_groups(net):
            setattr(g, fsdp_grads.PAIR, pair)
    REUSED[0] = ON_COPY[0] = 0
    torch.manual_seed(1)
    xs = [torch.randn(4, 16, device=DEV) for _ in range(k)]
    states = []
    for i, x in enumerate(xs):
        last = i == k - 1
        net.set_requires_gradient_sync(last)
        net.set_reshard_after_backward(last)
        net(x, USES_B[i]).float().pow(2).sum().backward()
        if not last:  # what each parameter holds between microbatches
            fps = [fp for g in fsdp_grads.param_groups(net) for fp in g.fsdp_params]
            states.append([[str(getattr(fp, fsdp_grads.HELD, None).dtype) if getattr(fp, fsdp_grads.HELD, None)
                            is not None else None,
                            str(fp.unsharded_accumulated_grad.dtype) if fp.unsharded_accumulated_grad is not None
                            else None] for fp in fps])
    grads = {n: p.grad.to_local().cpu() for n, p in net.named_parameters()}
    leftover = [fp for g in fsdp_grads.param_groups(net) for fp in g.fsdp_params
                if getattr(fp, fsdp_grads.HELD, None) is not None or fp.unsharded_accumulated_grad is not None]
    return label, grads, states, [len(leftover), REUSED[0], ON_COPY[0]]


out = {}
for k in (1, 2, 3, 4):
    label, ours, states, left = run("pitlab", k)
    tlabel, theirs, tstates, tleft = run("torch", k)
    _, bf16, _, _ = run("pitlab", k, pair=lambda a, b: [(x + y).float() for x, y in zip(a, b)])
    out[k] = {"label": label, "torch_label": tlabel, "names": sorted(ours),
              "differ": [n for n in ours if not torch.equal(ours[n], theirs[n])],
              "differ_bf16_pair": [n for n in ours if not torch.equal(bf16[n], theirs[n])],
              "states": states, "torch_states": tstates, "leftover": [left, tleft],
              "nonzero": all(bool(g.abs().sum() > 0) for g in ours.values())}
# the one-rank comm: the output it gives is the input it gave, so FSDP2's copy is onto itself
comm = fsdp_grads.OneRankReduceScatter()
i = comm.allocate((6,), dtype=torch.float32, device=torch.device("cpu"))
o = comm.allocate((6,), dtype=torch.float32, device=torch.device("cpu"))
n = comm.allocate((6,), dtype=torch.float32, device=torch.device("cpu"))
m = comm.allocate((5,), dtype=torch.float32, device=torch.device("cpu"))
out["comm"] = [o is i, n is i, m is n]
try:
    comm(o, i, None, None)
    out["comm_call"] = "no error"
except RuntimeError as e:
    out["comm_call"] = str(e)
print(json.dumps(out))
dist.destroy_process_group()
"""


def _run(device: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, device], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def result():
    return _run("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled pair sums need a GPU")
def test_on_cuda_with_the_compiled_pair_sums_the_same_bits(result):
    """One GPU (nccl), the pair sums compiled by inductor: FSDP2's own gradients bit for bit with 1-4
    microbatches; the bf16 pair differs."""
    r = _run("cuda")
    for k in ("1", "2", "3", "4"):
        assert r[k]["differ"] == [] and r[k]["nonzero"], (k, r[k])
        assert r[k]["leftover"] == [[0, 3, 4 if k in ("3", "4") else 0], [0, 0, 0]], (k, r[k])
        assert (len(r[k]["differ_bf16_pair"]) >= 2) == (k != "1"), (k, r[k]["differ_bf16_pair"])
    assert r["4"]["states"] == result["4"]["states"]


@pytest.mark.parametrize("k", ["1", "2", "3", "4"])
def test_accumulation_and_one_rank_reduce_give_fsdp2s_own_bits(result, k):
    r = result[k]
    assert r["label"].startswith("pitlab.trainer.fsdp_grads") and r["torch_label"].startswith("FSDP2's own")
    assert r["names"] == ["a.bias", "a.weight", "b.bias", "b.weight", "c.bias", "c.weight"] and r["nonzero"]
    assert r["differ"] == []
    # nothing held or accumulated after the step's reduce; each of the three groups reduced once into the
    # buffer it packed (FSDP2's own allocates an output and copies); with 3 and 4 microbatches the last gradients
    # of a and c (4 parameters; b's last was its pair, or it had none) were added by the copy-in
    assert r["leftover"] == [[0, 3, 4 if k in ("3", "4") else 0], [0, 0, 0]]


def test_the_first_gradient_is_held_in_bf16_and_the_second_makes_the_float32_sum(result):
    """Between microbatches of 4 (the branch b runs in the first and third): after the first every parameter
    holds its bf16 gradient and no float32 sum (FSDP2's own has cast it); after the second a, c have their float32
    sums and b still holds (no gradient met it); after the third b has its sum too."""
    held, pair = ["torch.bfloat16", None], [None, "torch.float32"]
    a, b, c = slice(0, 2), slice(2, 4), slice(4, 6)
    s = result["4"]["states"]
    assert s[0] == [held] * 6
    assert s[1][a] == s[1][c] == [pair, pair] and s[1][b] == [held, held]
    assert s[2] == [pair] * 6
    assert result["4"]["torch_states"][0] == [pair] * 6


def test_a_pair_summed_in_bf16_would_differ(result):
    """The negative control: the same gathering with the first two gradients added in bf16 before the cast gives
    other bits where two microbatches were summed (not with one microbatch, which has no pair)."""
    assert result["1"]["differ_bf16_pair"] == []
    for k in ("2", "3", "4"):
        assert len(result[k]["differ_bf16_pair"]) >= 2, result[k]["differ_bf16_pair"]


def test_the_one_rank_comm_returns_its_input_as_the_output_and_refuses_a_collective(result):
    assert result["comm"] == [True, False, False]
    assert "more than one rank" in result["comm_call"]


def test_the_knob_is_read_and_checked():
    """``PITLAB_FSDP_GRADS``: pitlab by default; another value is refused by the trainer and, before any work, by
    ``check_knobs`` (``validate``, ``plan``, ``run``: exit 2 naming the variable)."""
    from pitlab.errors import SpecError
    from pitlab.trainer.knobs import check_knobs

    assert fsdp_grads_mode({}) == "pitlab" and fsdp_grads_mode({"PITLAB_FSDP_GRADS": "torch"}) == "torch"
    with pytest.raises(ValueError, match="PITLAB_FSDP_GRADS='fast': give one of pitlab, torch"):
        fsdp_grads_mode({"PITLAB_FSDP_GRADS": "fast"})
    check_knobs({"PITLAB_FSDP_GRADS": "torch"})
    with pytest.raises(SpecError) as err:
        check_knobs({"PITLAB_FSDP_GRADS": "fast"})
    assert err.value.problems == [("environment variable PITLAB_FSDP_GRADS", "'fast': give one of pitlab, torch")]
    assert err.value.exit_code == 2
