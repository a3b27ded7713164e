"""pitlab.trainer.fused_step: the fused clip + AdamW + bf16 cast against torch's AdamW after clip_grad_norm_ (the
CPU, eager: bit for bit), its torch-compatible state, and its errors."""

from __future__ import annotations

import pytest
import torch

from pitlab.trainer.fused_step import MasterAdamW

SHAPES = [(64, 32), (32,), (7, 5, 3), (1000,)]


def _pair(weight_decay: float = 0.1, lr: float = 1e-2, shapes=SHAPES, gen: torch.Generator | None = None,
          **fused_kwargs):
    """Equal float32 parameters of ``shapes`` for torch's AdamW and for :class:`MasterAdamW` (eager unless
    ``fused_kwargs`` say otherwise), drawn from ``gen`` (default: seed 0)."""
    gen = torch.Generator().manual_seed(0) if gen is None else gen
    ps = [torch.randn(s, generator=gen) for s in shapes]
    ref = [p.clone().requires_grad_() for p in ps]
    fused = [p.clone().requires_grad_() for p in ps]
    return (ref, torch.optim.AdamW(ref, lr=lr, weight_decay=weight_decay),
            fused, MasterAdamW(fused, **{"compiled": False, **fused_kwargs}, lr=lr, weight_decay=weight_decay))


def _reference_step(ref, o_ref, shapes, gen: torch.Generator, step: int):
    """bf16 gradients of ``shapes`` (far under the clip norm 1 on even steps, far over on odd ones) set on ``ref``
    as float32, clipped and stepped by torch's ``o_ref``; returns the bf16 gradients and the norm."""
    g16 = [(torch.randn(s, generator=gen) * (3.0 if step % 2 else 0.01)).to(torch.bfloat16) for s in shapes]
    for p, g in zip(ref, g16):
        p.grad = g.float()
    n_ref = torch.nn.utils.clip_grad_norm_(ref, 1.0)
    o_ref.step()
    return g16, n_ref


def test_equals_torch_adamw_after_clipping_bit_for_bit():
    """Five steps on bf16 gradients, alternately far under and far over the clip norm: the gradient norm, every
    parameter, both moments and the bf16 copy are torch's values exactly."""
    ref, o_ref, fused, o_fused = _pair()
    copies = [torch.empty(s, dtype=torch.bfloat16) for s in SHAPES]
    gen = torch.Generator().manual_seed(1)
    norms = []
    for step in range(5):
        g16, n_ref = _reference_step(ref, o_ref, SHAPES, gen, step)
        n_fused = o_fused.clip_step_cast(g16, copies, 1.0)
        norms.append(float(n_fused))
        assert torch.equal(n_fused, n_ref)
        assert all(torch.equal(a, b) for a, b in zip(ref, fused))
        assert all(torch.equal(c, p.detach().to(torch.bfloat16)) for c, p in zip(copies, fused))
    assert norms[1] > 100 and norms[0] < 1  # the clipped and the unclipped case both ran
    for a, b in zip(ref, fused):
        sa, sb = o_ref.state[a], o_fused.state[b]
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
        assert float(sa["step"]) == float(sb["step"]) == 5.0 and sb["step"].device.type == "cpu"
    # the state dict is torch AdamW's (what DCP checkpoints and resume read)
    assert o_fused.state_dict()["state"].keys() == o_ref.state_dict()["state"].keys()
    assert o_fused.state_dict()["param_groups"][0]["lr"] == 1e-2


def test_float32_gradients_and_a_parameter_without_a_gradient():
    """Accumulated float32 gradients (gradient accumulation) give torch's values too; a parameter whose gradient is
    None is skipped (no state, unchanged), as torch's AdamW skips it; the step count stays per parameter."""
    ref, o_ref, fused, o_fused = _pair(weight_decay=0.0)
    gen = torch.Generator().manual_seed(2)
    for step in range(3):
        g = [torch.randn(s, generator=gen) for s in SHAPES]
        skip = 1 if step == 0 else None
        for i, (p, gi) in enumerate(zip(ref, g)):
            p.grad = None if i == skip else gi.clone()
        torch.nn.utils.clip_grad_norm_([p for p in ref if p.grad is not None], 1.0)
        o_ref.step()
        o_fused.clip_step_cast([None if i == skip else gi for i, gi in enumerate(g)], None, 1.0)
        assert all(torch.equal(a, b) for a, b in zip(ref, fused)), step
    assert float(o_fused.state[fused[1]]["step"]) == 2.0 and float(o_fused.state[fused[0]]["step"]) == 3.0


def test_compiled_update_compiles_per_gradient_dtype_not_per_shape_and_updates_in_place(monkeypatch):
    """Compiled (``backend="eager"``: dynamo's graphs with torch's kernels), the update sees every parameter as a
    1-D view: ranks 1-3, a size-1 dimension and a square matrix share two graphs per gradient dtype here (four
    without the views; a tiny Qwen3.5-MoE config needed 12, over torch's recompile limit of 8, a hard failure with
    ``fullgraph=True``, and needs 3), and the in-place writes reach the parameters and copies: torch's AdamW values within 1e-6 (each step moves a parameter
    by about the learning rate, 1e-2; the traced graph's float constants round a few elements 1 ulp apart)."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("PITLAB_FUSED_STEP_SHAPES", "dynamic")
    shapes = SHAPES + [(16, 1, 4), (8, 8)]
    gen = torch.Generator().manual_seed(3)
    torch._dynamo.reset()
    counters.clear()
    ref, o_ref, fused, o_fused = _pair(shapes=shapes, gen=gen, compiled=True, backend="eager")
    ps = [p.detach().clone() for p in fused]
    copies = [torch.empty(s, dtype=torch.bfloat16) for s in shapes]
    for step in range(3):
        g16, n_ref = _reference_step(ref, o_ref, shapes, gen, step)
        assert torch.equal(o_fused.clip_step_cast(g16, copies, 1.0), n_ref)
        assert max(float((a - b).abs().max()) for a, b in zip(ref, fused)) < 1e-6, step
        assert all(torch.equal(c, p.detach().to(torch.bfloat16)) for c, p in zip(copies, fused))
    assert min(float((a - b).abs().max()) for a, b in zip(fused, ps)) > 1e-2  # three steps of about lr each
    bf16_graphs = counters["stats"]["unique_graphs"]
    # float32 gradients (accumulation) and no copies (FSDP2's local shards): one more graph each
    o_fused.clip_step_cast([torch.randn(s, generator=gen) for s in shapes], None, 1.0)
    assert (bf16_graphs, counters["stats"]["unique_graphs"]) == (2, 4)


def test_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="parameter 0 is not float32"):
        MasterAdamW([torch.zeros(3, dtype=torch.bfloat16, requires_grad=True)], compiled=False)
    with pytest.raises(ValueError, match="one parameter group without amsgrad"):
        MasterAdamW([torch.zeros(3, requires_grad=True)], compiled=False, amsgrad=True)
    opt = MasterAdamW([torch.zeros(3, requires_grad=True)], compiled=False)
    with pytest.raises(ValueError, match="1 parameters, 2 gradients"):
        opt.clip_step_cast([torch.zeros(3), torch.zeros(3)], None, 1.0)
    with pytest.raises(ValueError, match="no parameter has a gradient"):
        opt.clip_step_cast([None], None, 1.0)


@pytest.mark.parametrize("mode", ["rows16", "static", "grouped"])
def test_every_shape_mode_gives_the_same_values(mode, monkeypatch):
    """``PITLAB_FUSED_STEP_SHAPES``: the [n/16, 16] views (sizes 2,048 and 32 here; 105 and 1,000 stay 1-D), the
    per-size graphs and the per-group graphs change how the update compiles, not what it computes: eager they equal
    torch's AdamW bit for bit; compiled (``backend="eager"``) they equal the default compiled update bit for bit,
    ``static`` with one graph per parameter size, ``grouped`` with one per group (two here)."""
    from torch._dynamo.utils import counters

    gen = torch.Generator().manual_seed(5)
    grads = [[(torch.randn(s, generator=gen) * (3.0 if k % 2 else 0.01)).to(torch.bfloat16) for s in SHAPES]
             for k in range(3)]
    finals = {}
    for chosen, compiled in (("dynamic", True), (mode, True), (mode, False)):
        monkeypatch.setenv("PITLAB_FUSED_STEP_SHAPES", chosen)
        torch._dynamo.reset()
        counters.clear()
        ref, o_ref, fused, o_fused = _pair(compiled=compiled, groups=["l0", "l0", "l1", "l1"],
                                           **({"backend": "eager"} if compiled else {}))
        assert o_fused.shapes == chosen
        copies = [torch.empty(s, dtype=torch.bfloat16) for s in SHAPES]
        for g16 in grads:
            for p, g in zip(ref, g16):
                p.grad = g.float()
            torch.nn.utils.clip_grad_norm_(ref, 1.0)
            o_ref.step()
            o_fused.clip_step_cast(g16, copies, 1.0)
        finals[(chosen, compiled)] = [p.detach().clone() for p in fused] + copies
        if not compiled:
            assert all(torch.equal(a, b) for a, b in zip(ref, fused))
        elif chosen == "static":
            assert counters["stats"]["unique_graphs"] == len(SHAPES)
        elif chosen == "grouped":
            assert counters["stats"]["unique_graphs"] == 2
    assert all(torch.equal(a, b) for a, b in zip(finals[("dynamic", True)], finals[(mode, True)]))


def test_grouped_mode_compiles_once_per_kind_of_layer_and_splits_runs_by_step(monkeypatch):
    """``grouped``: two layers of the same shapes share one graph and the embedding and the head (their own groups,
    the same shape) another, so 2 graphs for 4 groups; a parameter without a gradient for a step is skipped, and
    its layer (then, and after, when its step counts differ) is updated parameter by parameter at symbolic sizes
    (2 more graphs). Eager every parameter and copy is torch's AdamW's after clipping bit for bit; compiled
    (``backend="eager"``) the ``dynamic`` compiled update's."""
    from torch._dynamo.utils import counters

    from pitlab.trainer.fused_step import layer_groups

    names = ["model.embed_tokens.weight", "model.layers.0.mlp.w", "model.layers.0.mlp.b", "model.layers.1.mlp.w",
             "model.layers.1.mlp.b", "lm_head.weight"]
    groups = layer_groups(names)
    assert groups == ["model.embed_tokens.weight", "model.layers.0", "model.layers.0", "model.layers.1",
                      "model.layers.1", "lm_head.weight"]
    shapes = [(10, 4), (4, 4), (4,), (4, 4), (4,), (10, 4)]
    finals = {}
    for chosen, compiled in (("dynamic", True), ("grouped", True), ("grouped", False)):
        monkeypatch.setenv("PITLAB_FUSED_STEP_SHAPES", chosen)
        torch._dynamo.reset()
        counters.clear()
        gen = torch.Generator().manual_seed(3)
        ref, o_ref, fused, o_fused = _pair(shapes=shapes, gen=gen, compiled=compiled, groups=groups,
                                           **({"backend": "eager"} if compiled else {}))
        copies = [torch.empty(s, dtype=torch.bfloat16) for s in shapes]
        for step in range(3):
            g16 = [(torch.randn(s, generator=gen) * (3.0 if step % 2 else 0.01)).to(torch.bfloat16) for s in shapes]
            if step == 1:  # layer 0's bias has no gradient: torch's AdamW skips it, and so does the fused step
                g16[2] = None
            for p, g in zip(ref, g16):
                p.grad = None if g is None else g.float()
            n_ref = torch.nn.utils.clip_grad_norm_(ref, 1.0)
            o_ref.step()
            assert torch.equal(n_ref, o_fused.clip_step_cast(g16, copies, 1.0))
        assert o_fused.state[fused[2]]["step"].item() == 2 and o_fused.state[fused[1]]["step"].item() == 3
        finals[(chosen, compiled)] = [p.detach().clone() for p in fused] + copies
        if not compiled:
            assert all(torch.equal(a, b) for a, b in zip(ref, fused))
            assert all(torch.equal(p.detach().to(torch.bfloat16), c) for p, c in zip(fused, copies))
        elif chosen == "grouped":
            assert o_fused._signatures() == {((10, 4),), ((4, 4), (4,))}
            # [(10, 4)] and [(4, 4), (4,)] at static sizes; layer 0 at steps 1 and 2 per parameter at symbolic ones
            assert counters["stats"]["unique_graphs"] == 4
    assert all(torch.equal(a, b) for a, b in zip(finals[("dynamic", True)], finals[("grouped", True)]))


def test_grouped_mode_with_gradients_missing_now_and_then_compiles_a_bounded_number_of_graphs(monkeypatch):
    """A group of 8 parameters of 8 sizes with a different one lacking a gradient at each of 30 steps (every
    step count pattern a new one): ``grouped`` stays at 2 graphs under torch's default recompile limit of 8
    (one static graph per pattern would have failed at the limit, ``fullgraph=True``), and its values equal the
    ``dynamic`` compiled update's bit for bit."""
    import random

    from torch import _dynamo
    from torch._dynamo.utils import counters

    import pitlab.trainer.fused_step as fs

    shapes = [(k + 3,) for k in range(8)]
    finals = {}
    for mode in ("dynamic", "grouped"):
        monkeypatch.setenv("PITLAB_FUSED_STEP_SHAPES", mode)
        monkeypatch.setattr(fs, "_GRAPHS_ASKED", 0)
        torch._dynamo.reset()
        counters.clear()
        gen, pick = torch.Generator().manual_seed(7), random.Random(0)
        ps = [torch.randn(s, generator=gen) for s in shapes]
        copies = [torch.empty(s, dtype=torch.bfloat16) for s in shapes]
        with _dynamo.config.patch(recompile_limit=8):
            opt = MasterAdamW(ps, compiled=True, backend="eager", groups=[0] * 8, lr=1e-2, weight_decay=0.1)
            for _ in range(30):
                g16 = [torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes]
                g16[pick.randrange(8)] = None
                opt.clip_step_cast(g16, copies, 1.0)
        assert counters["stats"]["unique_graphs"] == 2, mode
        finals[mode] = ps + copies
    assert all(torch.equal(a, b) for a, b in zip(finals["dynamic"], finals["grouped"]))


def test_the_recompile_limit_counts_every_grouped_optimizer_of_the_process(monkeypatch):
    """Dynamo's recompile limit is per code object, which every MasterAdamW of a process shares: each grouped
    optimizer adds four graphs per signature (bf16 or float32 gradients, with or without the last microbatch's
    bf16 gradient added), so two with 2 signatures each make it 8 + 8 + 8 = 24."""
    import pitlab.trainer.fused_step as fs
    from torch import _dynamo

    monkeypatch.setenv("PITLAB_FUSED_STEP_SHAPES", "grouped")
    monkeypatch.setattr(fs, "_GRAPHS_ASKED", 0)
    with _dynamo.config.patch(recompile_limit=8):  # restored afterwards
        for limit in (16, 24):
            MasterAdamW([torch.zeros(4, 2, requires_grad=True), torch.zeros(3, requires_grad=True)], compiled=True,
                        backend="eager", groups=["a", "b"])
            assert _dynamo.config.recompile_limit == limit


def test_an_unknown_shape_mode_is_refused():
    from pitlab.trainer.fused_step import shape_mode

    assert shape_mode({}) == "grouped"
    with pytest.raises(ValueError,
                       match="PITLAB_FUSED_STEP_SHAPES='rows8': give one of dynamic, rows16, static, grouped"):
        shape_mode({"PITLAB_FUSED_STEP_SHAPES": "rows8"})


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("base_dtype", [torch.bfloat16, torch.float32])
def test_an_added_last_gradient_equals_the_step_on_the_stored_sum(compiled, base_dtype):
    """``extras``: a bf16 gradient per parameter added to ``grads`` as the step reads them (the last microbatch's)
    gives the step on the stored float32 sum ``g.float() + e`` bit for bit: the norm (torch's
    ``clip_grad_norm_`` of the sums; eager: ``torch._foreach_norm`` of them, compiled with ``backend="eager"``:
    each norm of ``g + e`` in one graph), the parameters and the copies (eager: torch's AdamW after clipping;
    compiled: the same compiled update given the sums), over an unclipped and a clipped step, with one parameter
    that has only the added gradient and one that has none."""
    ref, o_ref, fused, o_fused = _pair(compiled=compiled, backend="eager")
    _, _, summed, o_summed = _pair(compiled=compiled, backend="eager")
    copies = [torch.empty(s, dtype=torch.bfloat16) for s in SHAPES]
    copies_summed = [torch.empty(s, dtype=torch.bfloat16) for s in SHAPES]
    gen = torch.Generator().manual_seed(3)
    norms = []
    for step in range(2):
        scale = 3.0 if step % 2 else 0.01
        base = [(torch.randn(s, generator=gen) * scale).to(base_dtype) for s in SHAPES]
        extra = [(torch.randn(s, generator=gen) * scale).to(torch.bfloat16) for s in SHAPES]
        base[1], extra[3] = None, None  # parameter 1: only the added gradient; parameter 3: no added one
        sums = []
        for g, e in zip(base, extra):
            t = g.to(torch.float32, copy=True) if g is not None else None
            sums.append(e.float() if t is None else t if e is None else t.add_(e))
        for p, t in zip(ref, sums):
            p.grad = t.clone()
        n_ref = torch.nn.utils.clip_grad_norm_(ref, 1.0)
        o_ref.step()
        n = o_fused.clip_step_cast(base, copies, 1.0, extra)
        o_summed.clip_step_cast(sums, copies_summed, 1.0)
        norms.append(float(n))
        assert torch.equal(n, n_ref), step
        assert all(torch.equal(a, b) for a, b in zip(summed, fused)), step
        assert all(torch.equal(a, b) for a, b in zip(copies_summed, copies)), step
        if not compiled:
            assert all(torch.equal(a, b) for a, b in zip(ref, fused)), step
    assert norms[0] < 1 < norms[1]
