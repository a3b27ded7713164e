"""FSDP2's gradients between backward and the optimizer with fewer passes over memory, the same bits.

- **Microbatches not reduced** (``gradientSyncEveryMicrobatch: false``, and every step at world size 1, where
  :func:`pitlab.trainer.fsdp.reduces_every_microbatch` is false): FSDP2 casts a parameter's first bf16 gradient of
  a step to the float32 reduce dtype (``FSDPParam.to_accumulated_grad_if_needed``: 6 bytes per parameter) and adds
  each later one to it (10 bytes). :func:`gather_group` holds the first bf16 gradient instead and sums it with the
  second in one pass per parameter group (8 bytes; :func:`pitlab.trainer.fused_step.pair_sums`, compiled on
  CUDA): ``g1.float() + g2.float()`` rounds once, as ``acc = g1.float(); acc += g2`` does. Later microbatches
  are FSDP2's own adds, except the last: with pitlab's reduce-scatter copy-in (:mod:`pitlab.trainer.fsdp_copy_in`)
  it is added as the copy-in packs the sum (10 bytes instead of an add's 10 and a copy's 8). A parameter whose
  held gradient met no second one is cast when its group reduces.
- **The reduce at world size 1**: FSDP2 copies its reduce-scatter input into a new output buffer
  (``foreach_reduce``; 8 bytes per parameter). :class:`OneRankReduceScatter` hands the input back as the
  output, and ``Tensor.copy_`` of a tensor onto itself returns at once.

Both replace torch internals (``FSDPParamGroup.post_backward`` is wrapped process-wide and acts only on the groups
:func:`install_grads` marked; the comm is FSDP2's ``set_custom_reduce_scatter``); ``PITLAB_FSDP_GRADS=torch`` keeps
FSDP2's own. tests/test_fsdp2_fused_step.py compares the two bit for bit on 1 and 2 ranks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pitlab.trainer.fsdp_copy_in import add_on_copy_in, pending_adds, reduce_scatter_copy_in
from pitlab.trainer.fused_step import compiled_pair_sums, pair_sums
from pitlab.trainer.knobs import fsdp_grads_mode

LABEL = "pitlab.trainer.fsdp_grads (first two microbatches summed in one pass; no one-rank reduce copy)"
TORCH_LABEL = "FSDP2's own (cast, then one add per microbatch; one-rank reduce copied)"
HELD = "_pitlab_held_grad"  # FSDPParam attribute: the step's first bf16 gradient, not yet summed
PAIR = "_pitlab_pair"  # FSDPParamGroup attribute: the pair-sum function of a group install_grads marked


def param_groups(model: nn.Module) -> list:
    """The ``FSDPParamGroup`` of every ``fully_shard``-ed module of ``model`` (torch 2.11 keeps one per module as
    ``_fsdp_param_group``, later versions a list ``_fsdp_param_groups``)."""
    from torch.distributed.fsdp import FSDPModule

    groups = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            found = getattr(state, "_fsdp_param_groups", None)
            groups += list(found) if found is not None else [g for g in [state._fsdp_param_group] if g is not None]
    return groups


def _copy_in_adds() -> bool:
    """Whether FSDP2's reduce-scatter copy-in is pitlab's (which adds what :func:`add_on_copy_in` gave it)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

    return collectives.foreach_reduce_scatter_copy_in is reduce_scatter_copy_in


@torch.no_grad()
def gather_group(group, pair: Callable[[list, list], list]) -> list:
    """Before FSDP2's ``post_backward`` of ``group``: hold each parameter's first gradient of a step that is not
    reduced (bf16, no float32 sum yet); where a held gradient meets the next one, store ``pair(held, next)`` (float32)
    as FSDP2's accumulated gradient; when the group reduces, cast a held gradient that met none (FSDP2's cast), and
    leave the last gradient of a float32 sum to the copy-in (:func:`pitlab.trainer.fsdp_copy_in.add_on_copy_in`,
    dim-0 shards only). Returns the sums left to the copy-in. Parameters whose gradient is already in the reduce
    dtype or a DTensor are left to FSDP2."""
    from torch.distributed.tensor import DTensor

    reduce = group.reduce_grads
    on_copy = reduce and _copy_in_adds()
    met, firsts, seconds, left = [], [], [], []
    for fp in group.fsdp_params:
        if not hasattr(fp, "_unsharded_param"):
            continue
        param, held = fp._unsharded_param, getattr(fp, HELD, None)
        grad = param.grad
        if held is not None and grad is not None:
            met.append(fp)
            firsts.append(held)
            seconds.append(grad)
        elif held is not None and reduce:
            fp.unsharded_accumulated_grad = held.to(fp.reduce_dtype)
            setattr(fp, HELD, None)
        elif (on_copy and grad is not None and fp.unsharded_accumulated_grad is not None
              and not isinstance(grad, DTensor) and getattr(getattr(fp, "fsdp_placement", None), "dim", 0) == 0):
            add_on_copy_in(fp.unsharded_accumulated_grad, grad)
            left.append(fp.unsharded_accumulated_grad)
            param.grad = None
        elif (held is None and grad is not None and not reduce and fp.unsharded_accumulated_grad is None
              and fp.reduce_dtype is not None and grad.dtype != fp.reduce_dtype and not isinstance(grad, DTensor)):
            setattr(fp, HELD, grad)
            param.grad = None
    if met:
        for fp, total in zip(met, pair(firsts, seconds)):
            fp.unsharded_accumulated_grad = total
            fp._unsharded_param.grad = None
            setattr(fp, HELD, None)
    return left


def _install_wrapper() -> None:
    """Wrap ``FSDPParamGroup.post_backward`` once per process: :func:`gather_group` first on groups that carry a
    pair function (:data:`PAIR`), then FSDP2's own."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    if getattr(FSDPParamGroup.post_backward, "pitlab_wrapped", False):
        return
    original = FSDPParamGroup.post_backward

    def post_backward(self, *unused):
        pair = getattr(self, PAIR, None)
        left = gather_group(self, pair) if pair is not None else []
        out = original(self, *unused)
        if left and pending_adds(left):  # never a sum reduced without its last microbatch
            raise RuntimeError(f"pitlab.trainer.fsdp_grads: {pending_adds(left)} gradient sums of {len(left)} were "
                               "reduced without their last microbatch (FSDP2 did not pack them with pitlab's "
                               "copy-in); set PITLAB_FSDP_GRADS=torch")
        return out

    post_backward.pitlab_wrapped = True
    post_backward.pitlab_original = original
    FSDPParamGroup.post_backward = post_backward


class OneRankReduceScatter:
    """FSDP2's reduce-scatter comm for a world of one rank: its first ``allocate`` (the reduce-scatter input) is a
    new tensor, its second (the output, the same size) is that tensor again, so FSDP2's one-rank copy of input into
    output does nothing. Calling it as a collective raises ``RuntimeError`` (it is installed only on one rank)."""

    def __init__(self) -> None:
        self._input: torch.Tensor | None = None

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A new ``size`` tensor, or the one the previous call returned when it is the same size and dtype
        (FSDP2 asks for the input, then the output, of each reduce in turn)."""
        given, self._input = self._input, None
        if given is not None and tuple(given.shape) == tuple(int(s) for s in size) and given.dtype == dtype:
            return given
        self._input = torch.empty(*size, dtype=dtype, device=device)
        return self._input

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        raise RuntimeError("OneRankReduceScatter: FSDP2 called a reduce-scatter over more than one rank")


def install_grads(model: nn.Module, world_size: int, cuda: bool, env: dict | None = None) -> str:
    """Mark every FSDP2 parameter group of ``model`` for :func:`gather_group` (its pair sums compiled on CUDA)
    and, at ``world_size`` 1, give each ``fully_shard``-ed module a :class:`OneRankReduceScatter`, unless
    ``PITLAB_FSDP_GRADS=torch`` in ``env`` (default ``os.environ``). Returns the label for the run's ``kernels``
    report. Raises ``ValueError`` for another value of the variable."""
    from torch.distributed.fsdp import FSDPModule

    if fsdp_grads_mode(env) == "torch":
        return TORCH_LABEL
    _install_wrapper()
    groups = param_groups(model)
    pair = compiled_pair_sums(len(groups)) if cuda else pair_sums
    for group in groups:
        setattr(group, PAIR, pair)
    if world_size == 1:
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_reduce_scatter(OneRankReduceScatter())
    return LABEL
