"""Clipping, AdamW and the bf16 cast of the single-device path in one pass over each parameter.

The single-device path (:mod:`pitlab.trainer.single_device`) keeps float32 master weights and a bf16 compute copy.
Done with torch's operations, the optimizer side of a step moves 52 bytes per parameter through device memory:
the bf16 gradient cast into a float32 one (read 2, write 4), the clipping norm (read 4) and scale (read and write
4 each), fused AdamW (read parameter, gradient and two states, 16; write three, 12), the cast of the masters into
the copy (read 4, write 2). :class:`MasterAdamW` reads the copy's bf16 gradient once for the norm (2) and once
for an update that also writes the bf16 copy (read 2 + 12, write 12 + 2): 30 bytes per parameter, and no float32
gradient is ever stored (4 bytes per parameter less at the peak). The update of one parameter is one kernel;
by default (``PITLAB_FUSED_STEP_SHAPES=grouped``) one ``torch.compile``-d call updates a decoder layer's
parameters at their static sizes, so layers of one kind share one compilation and a step makes one host call per
layer. Kernels compiled for symbolic sizes (``dynamic``) ran the update at 1.5 TB/s in some compilations and 3.4 TB/s
in others (bench/RESULTS.md, 2026-12-05).

The arithmetic is torch's AdamW (``torch.optim.AdamW`` with ``foreach=False``, ``fused=False``: decoupled weight
decay ``p *= 1 - lr·wd``; ``m = lerp(m, g, 1 - β1)``; ``v = β2 v + (1 - β2) g²``; ``p += -(lr / (1 - β1^t)) ·
m / (sqrt(v) / sqrt(1 - β2^t) + eps)``, Loshchilov & Hutter 2019) applied to the clipped gradient of
``torch.nn.utils.clip_grad_norm_`` (``g · min(1, max_norm / (‖g‖ + 1e-6))``). Eager on the CPU it equals torch's
path bit for bit (tests/test_fused_step.py); compiled on an H200 it is as close to torch's fused CUDA AdamW (which
evaluates the update in double precision) as torch's own foreach AdamW is (bench/RESULTS.md).

FSDP2 (:mod:`pitlab.trainer.strategies.fsdp2`) uses the same step without the cast: the parameter group holds
the sharded DTensor parameters, the gradients are their float32 DTensor shards, and the update runs on each rank's
local shards (``to_local()`` of parameter, gradient and both moments, in place). The norm is
``torch.nn.utils.get_total_norm`` over the DTensor gradients made whole with ``full_tensor()``, as
:func:`pitlab.trainer.strategies.base.clip_grad_norm` computes it; so on the CPU the norm, the losses and the
parameters equal FSDP2's torch AdamW after that clipping bit for bit (tests/test_fsdp2_fused_step.py, 1 and 2 gloo
ranks). On CUDA it is FSDP2's default for full-weight training (1.16 x torch's AdamW + clipping at world size 1 on
an H100, bench/RESULTS.md).

The optimizer is a ``torch.optim.AdamW`` (same ``state`` keys: ``step`` on the CPU, ``exp_avg``,
``exp_avg_sq``; DTensors of the parameter's sharding under FSDP2), so DCP checkpoints, their resume and
``state_dict`` are those of torch's AdamW; its ordinary ``step()`` (which DCP's state initialisation calls) is
torch's.
"""

from __future__ import annotations

import math
import re

import torch
from torch.distributed.tensor import DTensor

from pitlab.trainer.knobs import shape_mode

LABEL = "fused clip + AdamW + bf16 cast (pitlab.trainer.fused_step, one pass per parameter)"
SHARDED_LABEL = "fused clip + AdamW on the local shards (pitlab.trainer.fused_step, one pass per parameter)"
TORCH_LABEL = "torch AdamW + clip_grad_norm_ (float32 gradients)"


def fused_step_enabled(training, cuda: bool, fsdp2: bool = False, lora: bool = False) -> bool:
    """Whether a run on FSDP2 (``fsdp2``) or on the single-device path uses :class:`MasterAdamW`:
    ``training.fusedOptimizer`` (a ``TrainingSpec``) if set, else on CUDA devices, except for LoRA under FSDP2
    (not measured). Under FSDP2 at world size 1 on an H100 it ran 1.16 x torch's AdamW + clipping
    (bench/RESULTS.md, 2026-12-06). Layer streaming keeps torch's AdamW."""
    if training.fused_optimizer is not None:
        return training.fused_optimizer
    return cuda and not (fsdp2 and lora)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank's shard of a DTensor (the tensor itself under ``no_grad``: in-place updates reach the DTensor);
    a plain tensor as it is."""
    return t.to_local() if isinstance(t, DTensor) else t


def _flat(t: torch.Tensor | None, rows16: bool = False) -> torch.Tensor | None:
    """A 1-D view of ``t`` (:func:`_local` first): every parameter then reaches the compiled update with the same
    rank, so it compiles once per gradient dtype instead of once per rank, size-1 dimension and pair of equal
    sizes (a tiny Qwen3.5-MoE config: 3 graphs instead of 12; torch's recompile limit is 8). ``rows16``: a
    [numel / 16, 16] view when 16 divides numel, so that a kernel compiled for symbolic sizes can still prove its
    element count a multiple of 16 (Triton then emits vector loads; without that proof it emits scalar ones,
    pytorch/pytorch#176653). ``view`` refuses a non-contiguous tensor (``RuntimeError``) rather than updating a
    copy."""
    if t is None:
        return None
    t = _local(t)
    return t.view(-1, 16) if rows16 and t.numel() % 16 == 0 else t.view(-1)


_GRAPHS_ASKED = 0  # graphs the static and grouped optimizers of this process may compile (the recompile limit)

GROUP_SIZE = 16
"""Parameters per compiled call in ``grouped`` mode when no layer names are given."""

_LAYER = re.compile(r"^(.*?\blayers\.\d+)\.")


def layer_groups(names: list[str]) -> list[str]:
    """The decoder layer of each parameter name (``model.layers.3.mlp.gate.weight`` → ``model.layers.3``; a
    name outside ``layers.N`` is its own group): ``grouped`` mode updates each run of consecutive parameters of
    one group in one compiled call, so layers of one kind share one compilation."""
    return [m.group(1) if (m := _LAYER.match(n)) else n for n in names]


def runs(keys: list) -> list[tuple[int, int]]:
    """``[start, stop)`` of each run of equal consecutive ``keys`` (e.g. :func:`layer_groups`' layers)."""
    starts = [i for i in range(len(keys)) if i == 0 or keys[i] != keys[i - 1]]
    return list(zip(starts, starts[1:] + [len(keys)]))


def model_groups(model: torch.nn.Module, params: list) -> list[str]:
    """:func:`layer_groups` of ``params`` (parameters of ``model``, by identity; one not found is its own
    group), for :class:`MasterAdamW`'s ``groups``."""
    names = {id(p): n for n, p in model.named_parameters()}
    return layer_groups([names.get(id(p), f"#{i}") for i, p in enumerate(params)])


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """``torch.nn.utils.get_total_norm`` (L2) of ``grads``, made whole with ``full_tensor()`` when the gradients are
    DTensors (a collective then: the norm over all shards, a plain 0-d tensor on every rank); what
    :func:`pitlab.trainer.strategies.base.clip_grad_norm` clips with."""
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    return total.full_tensor() if isinstance(total, DTensor) else total


def grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Global L2 norm of ``grads`` (0-d float32 on their device). DTensor gradients (FSDP2): :func:`total_norm`,
    bit-identical to the norm FSDP2's torch path clips with; plain ones (bf16 or float32): the float32 norm of
    each, then the norm of those."""
    if isinstance(grads[0], DTensor):
        return total_norm(grads)
    norms = torch._foreach_norm(grads, 2.0, dtype=torch.float32)
    return torch.linalg.vector_norm(torch.stack(norms), 2.0)


def _gradient(g: torch.Tensor, e: torch.Tensor | None) -> torch.Tensor:
    """The float32 gradient ``g + e``: ``g`` (bf16 or float32) cast exactly to float32, plus the last
    microbatch's bf16 gradient ``e`` cast exactly when given (one float32 rounding: the bits of ``g += e``)."""
    g32 = g.to(torch.float32)
    return g32 if e is None else g32 + e.to(torch.float32)


def _update(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, c: torch.Tensor | None,
            coef: torch.Tensor, hyper: torch.Tensor, beta1: float, beta2: float, eps: float,
            e: torch.Tensor | None = None) -> None:
    """One parameter's AdamW step on the clipped gradient, in place. ``p``, ``m``, ``v``: float32; ``g``: its
    gradient (bf16 or float32, same shape); ``c``: the bf16 copy written with the new ``p`` (or None); ``coef``:
    0-d float32 clip factor; ``hyper``: float32 ``[1 - lr·wd, lr / (1 - β1^t), sqrt(1 - β2^t)]``; ``e``: a bf16
    gradient added to ``g`` first (:func:`_gradient`), or None."""
    g32 = _gradient(g, e) * coef
    p.mul_(hyper[0])
    m.lerp_(g32, 1 - beta1)
    v.mul_(beta2).addcmul_(g32, g32, value=1 - beta2)
    denom = (v.sqrt() / hyper[2]).add_(eps)
    p.add_((m * -hyper[1]) / denom)  # addcdiv_: p + value * t1 / t2, left to right
    if c is not None:
        c.copy_(p)


def _update_group(ps: list, gs: list, ms: list, vs: list, cs: list | None, coef: torch.Tensor, hyper: torch.Tensor,
                  beta1: float, beta2: float, eps: float, es: list | None = None) -> None:
    """:func:`_update` of each parameter of the lists (one compiled graph for them all in ``grouped`` mode: one
    host call per group instead of one per parameter); ``cs`` None: no copies; ``es`` None: no added gradients."""
    for j, p in enumerate(ps):
        _update(p, gs[j], ms[j], vs[j], None if cs is None else cs[j], coef, hyper, beta1, beta2, eps,
                None if es is None else es[j])


def _norms(gs: list, es: list) -> list:
    """The float32 L2 norm of each :func:`_gradient` ``gs[j] + es[j]`` (0-d tensors). Compiled, the sum is not
    stored: each norm reads the two gradients (6 or 4 bytes per element) instead of a float32 sum (4) that
    another pass wrote (10)."""
    return [torch.linalg.vector_norm(_gradient(g, e), 2.0, dtype=torch.float32) for g, e in zip(gs, es)]


def pair_sums(gs: list, es: list) -> list:
    """``gs[j] + es[j]`` in float32 (two bf16 gradients cast exactly, one rounding: the bits of ``g.float()``
    followed by ``+= e``); compiled, one pass that reads 4 bytes per element and writes 4."""
    return [_gradient(g, e) for g, e in zip(gs, es)]


def add_sums(ss: list, gs: list) -> None:
    """``ss[j] += gs[j]`` in place: float32 sums plus bf16 gradients cast exactly, one rounding (the bits of
    ``torch._foreach_add_``). Compiled, one vectorised pass reading 6 bytes per element and writing 4, where the
    eager add of mixed dtypes casts element by element."""
    for s, g in zip(ss, gs):
        s.add_(g)


def compiled_add_sums(signatures: int):
    """:func:`add_sums` compiled with static shapes (CUDA; as :func:`compiled_pair_sums`)."""
    allow_graphs(signatures)
    return torch.compile(add_sums, dynamic=False, fullgraph=True)


def compiled_pair_sums(signatures: int):
    """:func:`pair_sums` compiled with static shapes (CUDA; one graph per distinct list of shapes, ``signatures``
    of them, added to the recompile limit by :func:`allow_graphs`)."""
    allow_graphs(signatures)
    return torch.compile(pair_sums, dynamic=False, fullgraph=True)


def allow_graphs(graphs: int) -> None:
    """Raise torch's recompile limit (per code object, shared by every compiled function of the process) by
    ``graphs`` more for the optimizer's compiled functions (their static shapes: one graph per signature)."""
    from torch import _dynamo

    global _GRAPHS_ASKED
    _GRAPHS_ASKED += graphs
    _dynamo.config.recompile_limit = max(_dynamo.config.recompile_limit, _GRAPHS_ASKED + 8)


class MasterAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` (one parameter group of float32 tensors, or of FSDP2's float32 DTensor parameters)
    with :meth:`clip_step_cast`.

    ``compiled``: compile the per-parameter update with ``torch.compile`` (CUDA; on the CPU the tests run it
    eager, or compiled with ``backend="eager"``: the same graphs, torch's own kernels). ``groups``: a key per
    parameter (:func:`model_groups`); ``grouped`` mode updates each run of consecutive parameters with one key in
    one call (default: runs of :data:`GROUP_SIZE`). Raises ``ValueError`` for more than one parameter group,
    ``amsgrad``, a non-float32 parameter or a ``groups`` of another length.
    """

    def __init__(self, params, *, compiled: bool, backend: str = "inductor", groups: list | None = None, **kwargs):
        super().__init__(params, foreach=False, fused=False, **kwargs)
        if len(self.param_groups) != 1 or self.param_groups[0]["amsgrad"]:
            raise ValueError("MasterAdamW: one parameter group without amsgrad")
        plist = self.param_groups[0]["params"]
        bad = [i for i, p in enumerate(plist) if p.dtype != torch.float32]
        if bad:
            raise ValueError(f"MasterAdamW: parameter {bad[0]} is not float32")
        if groups is not None and len(groups) != len(plist):
            raise ValueError(f"MasterAdamW: {len(groups)} groups for {len(plist)} parameters")
        self.groups = list(groups) if groups is not None else [i // GROUP_SIZE for i in range(len(plist))]
        self._runs = runs(self.groups)  # [start, stop) of each group's parameters
        self.shapes = shape_mode()
        if compiled and self.shapes in ("static", "grouped"):  # one graph per size (or group): above torch's limit
            graphs = len({p.numel() for p in plist}) if self.shapes == "static" else len(self._signatures())
            # per code object, shared by every MasterAdamW of the process, summed: four gradient kinds per graph
            # (bf16 or float32, with or without the last microbatch's bf16 gradient added)
            allow_graphs(4 * graphs)

        def compile_(fn, dynamic: bool):
            return torch.compile(fn, dynamic=dynamic, fullgraph=True, backend=backend) if compiled else fn

        # grouped: a group some of whose parameters lack a gradient, or differ in step count, takes the
        # per-parameter update at symbolic sizes (a few graphs) rather than one more static graph per pattern
        self._update = compile_(_update, self.shapes != "static")
        self._update_group = compile_(_update_group, False)
        self._norms = compile_(_norms, False)
        self.compiled = compiled

    def _signatures(self) -> set:
        """The distinct (shape, ...) tuples of the groups' parameters: ``grouped`` mode's compilations."""
        plist = self.param_groups[0]["params"]
        return {tuple(tuple(p.shape) for p in plist[a:b]) for a, b in self._runs}

    def _hyper(self, step: float, device: torch.device) -> torch.Tensor:
        group = self.param_groups[0]
        lr, wd = float(group["lr"]), group["weight_decay"]
        beta1, beta2 = group["betas"]
        host = torch.tensor([1 - lr * wd, lr / (1 - beta1 ** step), math.sqrt(1 - beta2 ** step)],
                            dtype=torch.float32)
        if device.type != "cuda":
            return host.to(device)
        # a fresh pinned buffer: the copy does not synchronise the host, and torch's caching host allocator keeps
        # the buffer until the copy has run
        return host.pin_memory().to(device, non_blocking=True)

    @torch.no_grad()
    def clip_step_cast(self, grads: list[torch.Tensor | None], copies: list[torch.Tensor | None] | None,
                       max_norm: float, extras: list[torch.Tensor | None] | None = None) -> torch.Tensor:
        """Clip the gradients ``grads`` (one per parameter of the group, in order; bf16 or float32; None: no
        gradient, the parameter is skipped as torch's AdamW skips it) to global L2 norm ``max_norm``, apply AdamW
        to the parameters, and write each updated parameter into ``copies[i]`` (bf16, same shape) when given.
        ``extras``: a bf16 gradient per parameter (or None) added to ``grads[i]`` in float32 first (the last
        microbatch's, read where it lies instead of added into the float32 sum by another pass; the same bits).
        DTensor parameters (FSDP2): ``grads`` are their float32 DTensor gradients (same sharding), ``copies`` and
        ``extras`` are None, and the update runs in place on the local shards (:func:`grad_norm` for the norm).
        Returns the gradient norm before clipping (0-d float32 tensor on the parameters' device, not read)."""
        group = self.param_groups[0]
        params = group["params"]
        if len(grads) != len(params) or (copies is not None and len(copies) != len(params)) or (
                extras is not None and len(extras) != len(params)):
            raise ValueError(f"clip_step_cast: {len(params)} parameters, {len(grads)} gradients")
        if extras is not None:  # a parameter with only the last microbatch's gradient: that one alone
            grads = [e if g is None else g for g, e in zip(grads, extras)]
            extras = [None if g is e else e for g, e in zip(grads, extras)]
            if all(e is None for e in extras):
                extras = None
        live = [i for i, g in enumerate(grads) if g is not None]
        if not live:
            raise ValueError("clip_step_cast: no parameter has a gradient")
        device = params[live[0]].device
        if isinstance(grads[live[0]], DTensor) and (copies is not None or extras is not None):
            raise ValueError("clip_step_cast: no bf16 copies or added gradients of DTensor parameters")
        total = grad_norm([grads[i] for i in live]) if extras is None else self._total_norm(grads, extras, live)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        steps = []
        for i in live:
            state = self.state[params[i]]
            if not state:
                self._new_state(params[i], state)
            steps.append(state["step"])
        torch._foreach_add_(steps, 1.0)
        self._opt_called = True  # what torch's LR schedulers check to see that the optimizer stepped
        step_of = {i: float(t) for i, t in zip(live, steps)}  # on the CPU (torch's non-fused AdamW): no device read
        # by step count (one unless some parameter had no gradient at an earlier step)
        hypers = {step: self._hyper(step, device) for step in dict.fromkeys(step_of.values())}
        if self.shapes == "grouped":
            self._grouped_update(step_of, hypers, grads, copies, coef, extras)
        else:
            for i in live:
                self._update_one(i, grads, copies, coef, hypers[step_of[i]], self.shapes == "rows16", extras)
        return total

    def _total_norm(self, grads: list, extras: list, live: list[int]) -> torch.Tensor:
        """The global L2 norm of ``grads[i] + extras[i]`` over ``live``, as :func:`grad_norm` of the float32 sums
        computes it (each parameter's float32 norm, then the norm of those). Compiled: one call per group run
        (:func:`_norms`, the sums never stored). Eager: each run's sums made, then ``torch._foreach_norm`` of
        them, the bits of :func:`grad_norm` on the stored sums."""
        norms = []
        for a, b in self._runs:
            run = [i for i in range(a, b) if grads[i] is not None]
            if not run:
                continue
            gs, es = [grads[i] for i in run], [extras[i] for i in run]
            if self.compiled:
                norms.extend(self._norms(gs, es))
            else:
                norms.extend(torch._foreach_norm(pair_sums(gs, es), 2.0, dtype=torch.float32))
        return torch.linalg.vector_norm(torch.stack(norms), 2.0)

    @staticmethod
    def _new_state(p: torch.Tensor, state: dict) -> None:
        """A parameter's AdamW state before its first step, as torch's AdamW (foreach and fused off) makes it:
        ``step`` a 0-d float32 CPU tensor at 0, the two moments zeros of ``p``'s shape, dtype and placement."""
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    @torch.no_grad()
    def init_state(self) -> None:
        """Give every parameter without state its state before a first step (:meth:`_new_state`; 8 bytes per
        parameter), without gradients and without stepping: the tensors a checkpoint load fills in place
        (:func:`pitlab.trainer.checkpoint.load_checkpoint`). Torch's initialisation for a load otherwise steps
        once on zero float32 gradients, 4 more bytes per parameter at the load's peak."""
        for p in self.param_groups[0]["params"]:
            state = self.state[p]
            if not state:
                self._new_state(p, state)

    def _update_one(self, i: int, grads: list, copies: list | None, coef: torch.Tensor, hyper: torch.Tensor,
                    rows16: bool = False, extras: list | None = None) -> None:
        """Parameter ``i``'s update, alone (:func:`_update` on :func:`_flat` views)."""
        group = self.param_groups[0]
        p = group["params"][i]
        st = self.state[p]
        self._update(_flat(p, rows16), _flat(grads[i], rows16), _flat(st["exp_avg"], rows16),
                     _flat(st["exp_avg_sq"], rows16), None if copies is None else _flat(copies[i], rows16), coef,
                     hyper, *group["betas"], group["eps"], None if extras is None else _flat(extras[i], rows16))

    def _grouped_update(self, step_of: dict[int, float], hypers: dict[float, torch.Tensor], grads: list,
                        copies: list | None, coef: torch.Tensor, extras: list | None = None) -> None:
        """``grouped`` mode: one :func:`_update_group` call per group whose parameters all have a gradient
        (``step_of``: live parameter → step count) and one step count (the rank's local shards, as they are
        shaped); the live parameters of any other group one by one (:meth:`_update_one`, symbolic sizes)."""
        group = self.param_groups[0]
        params = group["params"]
        for a, b in self._runs:
            run = [i for i in range(a, b) if i in step_of]
            if len(run) < b - a or len({step_of[i] for i in run}) > 1:
                for i in run:
                    self._update_one(i, grads, copies, coef, hypers[step_of[i]], extras=extras)
                continue
            states = [self.state[params[i]] for i in run]
            self._update_group([_local(params[i]) for i in run], [_local(grads[i]) for i in run],
                               [_local(st["exp_avg"]) for st in states], [_local(st["exp_avg_sq"]) for st in states],
                               None if copies is None else [copies[i] for i in run], coef, hypers[step_of[a]],
                               *group["betas"], group["eps"], None if extras is None else [extras[i] for i in run])
