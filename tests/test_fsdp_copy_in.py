"""pitlab.trainer.fsdp_copy_in: FSDP2's reduce-scatter copy-in written with one copy per gradient gives the buffer
torch's own copy-in (``torch.ops.fsdp.chunk_cat``) gives, bit for bit, padding included; the knob that chooses it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

from pitlab.errors import SpecError
from pitlab.trainer.fsdp_copy_in import LABEL, TORCH_LABEL, install_copy_in, reduce_scatter_copy_in
from pitlab.trainer.knobs import check_knobs

SHAPES = [(7, 5), (8,), (3, 2, 4), (1,), (12, 16), (5,)]  # dim 0 of 7, 3, 1 and 5 needs padding at 2, 3 and 4 ranks


def padded_numel(shapes, world: int) -> int:
    return sum(-(-s[0] // world) * world * (torch.Size(s).numel() // s[0]) for s in shapes)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_copy_in_equals_fsdp2s_chunk_cat_bit_for_bit(world, dtype):
    """bf16 gradients into a float32 buffer (FSDP2's mixed precision) and float32 into float32; a buffer filled with
    NaN first, so that every element (the zero padding too) must be written: 265 elements at one rank, 284 at 4."""
    g = torch.Generator().manual_seed(world)
    grads = [torch.randn(s, generator=g).to(dtype) for s in SHAPES]
    n = padded_numel(SHAPES, world)
    assert n == {1: 265, 2: 280, 3: 279, 4: 284}[world]
    theirs = torch.full((n,), float("nan"))
    ours = torch.full((n,), float("nan"))
    torch.ops.fsdp.chunk_cat(grads, dim=0, num_chunks=world, out=theirs.view(world, -1))
    reduce_scatter_copy_in(grads, ours, world)
    assert torch.equal(ours, theirs)
    if world == 4:  # rank 3's share of the 7-row gradient is its last row and one padding row of zeros
        assert torch.equal(ours.view(4, -1)[3, 0:5], grads[0][6].float()) and ours.view(4, -1)[3, 5:10].eq(0).all()


@pytest.mark.parametrize("size", [9, 10, 12])
def test_a_buffer_of_another_size_is_refused_before_anything_is_written(size):
    """Two ranks, a [4, 2] gradient: 8 elements needed; 9 (not a multiple of the ranks), 10 and 12 are refused and
    the buffer is left as it was."""
    buffer = torch.full((size,), -1.0)
    with pytest.raises(ValueError, match=f"a buffer of {size} elements for 2 ranks × 4 padded gradient elements"):
        reduce_scatter_copy_in([torch.ones(4, 2)], buffer, 2)
    assert buffer.eq(-1).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's CUDA _chunk_cat needs a GPU")
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_copy_in_equals_the_cuda_chunk_cat_bit_for_bit(world):
    """On a GPU, against torch's CUDA ``_chunk_cat`` (the kernel with per-block host metadata): bf16 gradients of
    the reduced Qwen3.5 layer's kinds of shapes (3-D experts, odd dim 0) into a float32 buffer."""
    g = torch.Generator(device="cuda").manual_seed(world)
    shapes = [(64, 1024, 2048), (7, 5), (2048,), (33, 256), (1,), (248, 16)]
    grads = [torch.randn(s, generator=g, device="cuda").to(torch.bfloat16) for s in shapes]
    n = padded_numel(shapes, world)
    theirs = torch.full((n,), float("nan"), device="cuda")
    ours = torch.full((n,), float("nan"), device="cuda")
    torch.ops.fsdp.chunk_cat(grads, dim=0, num_chunks=world, out=theirs.view(world, -1))
    reduce_scatter_copy_in(grads, ours, world)
    assert torch.equal(ours, theirs)


def test_a_sum_given_its_last_gradient_is_packed_with_it_added():
    """:func:`add_on_copy_in`: the copy-in writes ``total + grad`` (float32 + bf16 cast exactly: the bits of
    ``total += grad`` then the copy) for that sum only, padding as before, and forgets it once packed."""
    from pitlab.trainer.fsdp_copy_in import add_on_copy_in, pending_adds

    torch.manual_seed(0)
    total, other = torch.randn(5, 3), torch.randn(4, 3)
    grad = torch.randn(5, 3).to(torch.bfloat16)
    add_on_copy_in(total, grad)
    assert pending_adds([total, other]) == 1
    ours, expected = torch.empty(2 * (3 * 3 + 2 * 3)), torch.empty(2 * (3 * 3 + 2 * 3))
    reduce_scatter_copy_in([total, other], ours, 2)
    summed = total.clone()
    summed += grad
    reduce_scatter_copy_in([summed, other], expected, 2)
    assert torch.equal(ours, expected) and not torch.equal(summed, total)
    assert pending_adds([total, other]) == 0
    reduce_scatter_copy_in([total, other], ours, 2)  # a second packing copies the sum alone
    assert not torch.equal(ours, expected) and torch.equal(ours.view(2, -1)[0, :9], total[:3].flatten())


def test_the_knob_chooses_the_copy_in_and_is_checked_before_any_work():
    original = getattr(collectives, "_torch_copy_in", collectives.foreach_reduce_scatter_copy_in)
    try:
        assert install_copy_in({}) == LABEL and collectives.foreach_reduce_scatter_copy_in is reduce_scatter_copy_in
        assert install_copy_in({"PITLAB_FSDP_COPY_IN": "torch"}) == TORCH_LABEL
        assert collectives.foreach_reduce_scatter_copy_in is original
        assert install_copy_in({"PITLAB_FSDP_COPY_IN": "pitlab"}) == LABEL  # installed twice: the same original kept
        assert collectives._torch_copy_in is original
        with pytest.raises(ValueError, match="PITLAB_FSDP_COPY_IN='chunk': give one of pitlab, torch"):
            install_copy_in({"PITLAB_FSDP_COPY_IN": "chunk"})
        with pytest.raises(SpecError, match="PITLAB_FSDP_COPY_IN"):
            check_knobs({"PITLAB_FSDP_COPY_IN": "chunk"})
    finally:
        collectives.foreach_reduce_scatter_copy_in = original


CALLED_BY_FSDP2 = r"""
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives
from pitlab.trainer import fsdp_copy_in

calls = []
real = fsdp_copy_in.reduce_scatter_copy_in
fsdp_copy_in.reduce_scatter_copy_in = lambda grads, out, world: (calls.append(len(grads)), real(grads, out, world))
print(fsdp_copy_in.install_copy_in({}))
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
mesh = init_device_mesh("cpu", (1,))
fully_shard(model[0], mesh=mesh, mp_policy=policy)
fully_shard(model, mesh=mesh, mp_policy=policy)
model(torch.randn(2, 8)).sum().backward()
print(calls, collectives.foreach_reduce_scatter_copy_in.__name__)
dist.destroy_process_group()
"""


def test_fsdp2_calls_the_installed_copy_in_in_its_backward():
    """A two-layer model under FSDP2 (one gloo rank, bf16 parameters, float32 reduction): its backward packs each
    group's gradients with the copy-in :func:`install_copy_in` put in place: twice, two gradients each (the inner
    layer's, then the root's). The equality tests above would pass even if FSDP2 kept calling its own."""
    out = subprocess.run([sys.executable, "-c", CALLED_BY_FSDP2], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == [LABEL, "[2, 2] <lambda>"]
