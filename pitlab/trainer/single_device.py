"""Full-weight bf16 training on one device without FSDP2: float32 master weights and a bfloat16 compute copy.

At world size 1 FSDP2 shards nothing, and its per-layer hooks, copy-in and gradient copies are pure overhead
(bench/results/profile_step_h200_2026-12-01.log). When :func:`uses_compute_copy` holds (world size 1,
``method: full``, ``precision: bf16``, no layer streaming) the trainer keeps instead:

- the float32 model (the *master*): what AdamW, clipping, the DCP checkpoints (same parameter names, so a
  checkpoint of either path resumes in the other), the merge and the summary's digests see, and
- :class:`ComputeCopy`: a deep copy of it whose parameters are bfloat16 (buffers, e.g. rotary ``inv_freq``, stay
  float32 as FSDP2 leaves them); forward and backward run on it (the loss, activation checkpointing and compiled
  layers are installed on it).

One optimizer step: every microbatch's forward and backward on the copy, each followed by
:meth:`ComputeCopy.accumulate_grads` (bf16 gradients cast into the masters' float32 ``.grad``, added to the earlier
microbatches'), then clipping and AdamW on the masters, then :meth:`ComputeCopy.refresh` (masters cast into the
copy). With the fused step (:mod:`pitlab.trainer.fused_step`) :meth:`ComputeCopy.gather_grads` makes the same
float32 sums with fewer passes (the first microbatch's gradients held in bf16, the second summed with them in one
pass, the last added as the update reads it): 26 bytes per parameter moved for the gradients of 4 microbatches
instead of 36. Memory per parameter: 4 (master) + 8 (AdamW) + 4 (float32 gradients) + 2 (copy) + 2 bytes (bf16
gradients, freed at the cast), all five live at the cast after backward; FSDP2 at world size 1 peaks near 16
bytes (it frees each layer's bf16 copy and gradients in backward). :mod:`pitlab.trainer.plan` models both, and the
trainer takes FSDP2 when only FSDP2's plan fits the GPU (``MemoryPlan.single_device``).

Bit-identical to FSDP2 with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` at world size 1
(losses, gradient norms and parameters; tests/test_single_device.py, on the CPU with gloo; CUDA runs the same
operations but has not been compared yet), because each operation is the same:

- parameters: FSDP2's copy-in casts each float32 shard to bf16 (``Tensor.to``, round to nearest even);
  :meth:`ComputeCopy.refresh` is the same cast of the same values (``copy_``). FSDP2 also casts the floating-point
  inputs of each wrapped module to bf16 (``cast_forward_inputs``); for the supported decoder layers they already
  are bf16 (hidden states, rotary cos/sin), so nothing is cast.
- gradients: FSDP2 casts the bf16 gradient to the float32 reduce dtype (exact), reduces over one rank
  (``ReduceOp.SUM``, no divide factor at world size 1: torch's ``_get_gradient_divide_factors``) and adds it to
  the sharded gradient of the earlier microbatches (``+=`` in float32); with ``gradientSyncEveryMicrobatch:
  false`` it accumulates the unsharded gradient upcast to float32 (``FSDPParam.to_accumulated_grad_if_needed``),
  the same sums in the same order. :meth:`ComputeCopy.accumulate_grads` computes ``g1.float()`` then
  ``+= g2`` per microbatch, so ``gradientSyncEveryMicrobatch`` makes no difference here.
- clipping, AdamW and the schedule run on float32 tensors of equal values (plain tensors instead of one-rank
  DTensors; DTensor's norm reduction of one rank, ``(n ** 2) ** 0.5``, returns ``n`` exactly).

``PITLAB_FORCE_FSDP2=1`` in the environment keeps FSDP2 at world size 1 (for the side-by-side test and
benchmarks).
"""

from __future__ import annotations

import copy
import os

import torch
from torch import nn

from pitlab.trainer.fused_step import layer_groups, pair_sums, runs

FORCE_FSDP2_ENV = "PITLAB_FORCE_FSDP2"
LABEL = "single-device (fp32 master + bf16 compute copy)"
FSDP2_LABEL = "FSDP2"


def uses_compute_copy(spec, world_size: int) -> bool:
    """Whether a run of ``spec`` (a ``PitTrainingSpec``) at ``world_size`` ranks trains on this path: one rank,
    ``method: full`` (LoRA stays on FSDP2: its frozen base is already stored in bf16, a copy would double it),
    ``precision: bf16``, no layer streaming (its own one-GPU path), and ``PITLAB_FORCE_FSDP2`` unset."""
    tr = spec.training
    return (world_size == 1 and spec.method == "full" and tr.precision == "bf16"
            and not tr.layer_streaming.enabled and os.environ.get(FORCE_FSDP2_ENV, "") in ("", "0"))


class ComputeCopy:
    """The bfloat16 compute copy of a float32 ``master`` model (same module structure and parameter names).

    ``model``: the copy (forward and backward run on it; its parameters are ``dtype``, its buffers are the
    master's values in their own dtype). Raises ``ValueError`` if ``master`` has a parameter that is not float32.
    """

    def __init__(self, master: nn.Module, dtype: torch.dtype = torch.bfloat16):
        names = [n for n, _ in master.named_parameters()]
        bad = [n for n, p in master.named_parameters() if p.dtype != torch.float32]
        if bad:
            raise ValueError(f"compute copy: master parameters must be float32 ({bad[0]} is not)")
        # each master parameter maps to a new bf16 Parameter: no float32 copy of the weights is ever made
        memo = {id(p): nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
                for p in master.parameters()}
        self.model = copy.deepcopy(master, memo)
        if [n for n, _ in self.model.named_parameters()] != names:
            raise ValueError("compute copy: parameter names differ from the master's")
        self.master = master
        self.dtype = dtype
        self._masters = list(master.parameters())
        self._copies = list(self.model.parameters())
        self._held: list | None = None  # per parameter, the step's first bf16 gradient (gather_grads)
        self._groups = layer_groups(names)
        self._in_layers = [g != n for g, n in zip(self._groups, names)]  # in a decoder layer (model.layers.N)

    def in_place_holds(self, graphs: bool) -> list[bool]:
        """Per parameter, whether :meth:`gather_grads` may hold its gradient in place when the decoder layers were
        compiled with CUDA graphs (``graphs``): only outside the decoder layers (the embedding, the final norm and
        the LM head, whose gradients eager or non-graph code makes); every parameter without graphs."""
        return [not (graphs and inside) for inside in self._in_layers]

    def pair_signatures(self) -> int:
        """How many distinct per-layer calls :meth:`gather_grads` makes (shapes of a layer's parameters): the
        graphs a compiled ``pair_sums`` needs."""
        shapes = [tuple(p.shape) for p in self._masters]
        return len({tuple(shapes[a:b]) for a, b in runs(self._groups)})

    @torch.no_grad()
    def accumulate_grads(self) -> None:
        """After a microbatch's backward: add each copy parameter's ``dtype`` gradient, cast to float32, to its
        master's ``.grad`` (set it on the first microbatch after ``zero_grad(set_to_none=True)``), then drop the
        copy's gradients. Parameters without a gradient are left alone."""
        fresh_m, fresh_g, acc_m, acc_g = [], [], [], []
        for m, c in zip(self._masters, self._copies):
            if c.grad is None:
                continue
            if m.grad is None:
                fresh_m.append(m)
                fresh_g.append(c.grad)
            else:
                acc_m.append(m.grad)
                acc_g.append(c.grad)
        if fresh_m:
            grads = [torch.empty_like(m) for m in fresh_m]
            torch._foreach_copy_(grads, fresh_g)  # the exact bf16 -> float32 cast
            for m, g in zip(fresh_m, grads):
                m.grad = g
        if acc_m:
            torch._foreach_add_(acc_m, acc_g)  # float32 += bf16: one float32 rounding, as FSDP2's += of casts
        for c in self._copies:
            c.grad = None

    @torch.no_grad()
    def gather_grads(self, last: bool, hold_in_place: bool | list[bool], pair_fn=None, add_fn=None) -> None:
        """After a microbatch's backward, with the fused step: keep the gradients with fewer passes over memory
        than :meth:`accumulate_grads`, the same float32 sums in the same order. Per parameter: its first bf16
        gradient of the step is held (a bf16 copy, 4 bytes per element moved, or the tensor itself when
        ``hold_in_place``, for all parameters or per parameter as :meth:`in_place_holds` gives it: allowed only
        where no CUDA graph replay will write over it); the second is added to it in float32 into the master's
        ``.grad`` in one pass (``pair_fn``, default :func:`pitlab.trainer.fused_step.pair_sums` eager; 8 bytes
        instead of a cast's 6 and an add's 10); later ones are added to that (``add_fn`` per decoder layer, e.g.
        :func:`pitlab.trainer.fused_step.add_sums` compiled; default one ``torch._foreach_add_``). ``last``: the
        step's last microbatch, whose gradients stay on the copy for :meth:`fused_step` to add as it reads them
        (no float32 pass over them at all)."""
        if last:
            return
        if self._held is None:
            self._held = [None] * len(self._masters)
        pairs, adds, acc_m, acc_g = [], [], [], []
        in_place = hold_in_place if isinstance(hold_in_place, list) else [hold_in_place] * len(self._masters)
        for i, (m, c) in enumerate(zip(self._masters, self._copies)):
            g = c.grad
            if g is None:
                continue
            if m.grad is not None:
                adds.append(i)
                acc_m.append(m.grad)
                acc_g.append(g)
            elif self._held[i] is not None:
                pairs.append(i)
            else:
                self._held[i] = g if in_place[i] else g.clone()
        fn = pair_fn or pair_sums
        # one call per decoder layer (compiled: one graph per kind of layer); each layer's held gradients are
        # dropped after its call, so the float32 sums replace them layer by layer rather than all at once
        for a, b in runs([self._groups[i] for i in pairs]):
            idx = pairs[a:b]
            for i, s in zip(idx, fn([self._held[i] for i in idx], [self._copies[i].grad for i in idx])):
                self._masters[i].grad = s
                self._held[i] = None
        if add_fn is not None:
            for a, b in runs([self._groups[i] for i in adds]):
                add_fn(acc_m[a:b], acc_g[a:b])
        elif acc_m:
            torch._foreach_add_(acc_m, acc_g)  # float32 += bf16: one float32 rounding, as FSDP2's += of casts
        for c in self._copies:
            c.grad = None

    @torch.no_grad()
    def fused_step(self, optimizer, max_norm: float) -> torch.Tensor:
        """Clipping, AdamW on the masters and their cast into the copy in one pass per parameter
        (:meth:`pitlab.trainer.fused_step.MasterAdamW.clip_step_cast`; ``optimizer`` holds the masters in
        order). Each parameter's gradient is its float32 sum (:meth:`accumulate_grads` or :meth:`gather_grads`)
        or its held bf16 one, plus the copy's bf16 gradient of the last microbatch, added as the step reads it;
        with one microbatch per step just the copy's bf16 gradient (no float32 gradient is made). Drops the
        gradients it read; returns the gradient norm before clipping (0-d float32 tensor, not read)."""
        held = self._held or [None] * len(self._masters)
        base = [m.grad if m.grad is not None else h for m, h in zip(self._masters, held)]
        extras = [c.grad for c in self._copies]
        norm = optimizer.clip_step_cast(base, self._copies, max_norm, extras)
        for p in self._masters + self._copies:
            p.grad = None
        self._held = None
        return norm

    @torch.no_grad()
    def refresh(self) -> None:
        """Cast every master parameter into its copy (after each optimizer step and after a checkpoint load)."""
        torch._foreach_copy_(self._copies, self._masters)


def load_single_device_model(base, spec, device: torch.device,
                             activation_checkpointing: bool) -> tuple[nn.Module, ComputeCopy]:
    """The float32 master of ``base`` (HF directory) on ``device``, unsharded
    (:func:`pitlab.trainer.loading.load_sharded_model` without a mesh: values bit-identical to the FSDP2 path's),
    with Hugging Face activation checkpointing per decoder layer when asked (it carries over to the copy), and its
    :class:`ComputeCopy` in bfloat16. Raises as ``load_sharded_model`` does."""
    from pitlab.trainer.loading import load_sharded_model

    master = load_sharded_model(base, None, spec.training.precision, device, activation_checkpointing,
                                seed=spec.training.seed)
    return master, ComputeCopy(master, torch.bfloat16)
