"""pitlab.trainer.update_overlap: which forward waits for which group of the fused update (the CPU: the real
parameter names of the tiny models), the update issued group by group, the knob; and on a GPU, training with the
update on a side stream against the sequential step, bit for bit."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from pitlab.errors import SpecError
from pitlab.trainer.fsdp import decoder_layers
from pitlab.trainer.fused_step import MasterAdamW, model_groups
from pitlab.trainer.knobs import check_knobs, overlap_mode
from pitlab.trainer.single_device import ComputeCopy
from pitlab.trainer.update_overlap import HEAD, TAIL, _prefixes, run_slots

from tiny_models import TINY_CONFIGS  # noqa: E402  (tests/ is on sys.path under pytest)


def tiny(model_type: str, seed: int = 0, **extra) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, **{**TINY_CONFIGS[model_type], "vocab_size": 128, **extra})
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).float()


@pytest.mark.parametrize("model_type", ["qwen3_5_moe_text", "llama"])
def test_each_group_is_waited_for_where_the_forward_first_uses_it(model_type):
    model = tiny(model_type)
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())
    runs = MasterAdamW(params, compiled=False, groups=model_groups(model, params)).runs
    layers = _prefixes(model, list(decoder_layers(model)))
    tail = _prefixes(model, [model.model.norm, model.get_output_embeddings()])
    assert layers == ["model.layers.0.", "model.layers.1."] and tail == ["model.norm.", "lm_head."]
    slots = run_slots(names, runs, layers, tail)
    # the embedding, each decoder layer's parameters in one group, the final norm and the LM head
    assert [names[a] for a, _ in runs] == ["model.embed_tokens.weight", names[1], names[runs[2][0]],
                                           "model.norm.weight", "lm_head.weight"]
    assert slots == [HEAD, 0, 1, TAIL, TAIL]
    per_layer = sum(1 for n in names if n.startswith("model.layers.0."))
    assert runs[1] == (1, 1 + per_layer)


def test_a_group_that_mixes_layers_is_waited_for_before_the_forward():
    names = ["model.embed_tokens.weight", "model.layers.0.a", "model.layers.1.a", "model.norm.weight", "x.bias"]
    assert run_slots(names, [(0, 1), (1, 3), (3, 4), (4, 5)], ["model.layers.0.", "model.layers.1."],
                     ["model.norm."]) == [HEAD, HEAD, TAIL, HEAD]
    # a prefix match is per dotted name: layer 1 is not layer 10's prefix
    assert run_slots(["model.layers.10.w"], [(0, 1)], [f"model.layers.{i}." for i in range(11)], []) == [10]


def test_the_update_is_issued_group_by_group_with_the_same_values():
    """``after_run`` sees every group once, in order, after its parameters were updated; the values equal a step
    without it."""
    model = tiny("llama")
    params = list(model.parameters())
    twin = [p.detach().clone().requires_grad_() for p in params]
    groups = model_groups(model, params)
    a_opt = MasterAdamW(params, compiled=False, groups=groups, lr=1e-2)
    b_opt = MasterAdamW(twin, compiled=False, groups=groups, lr=1e-2)
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(p.shape, generator=gen).to(torch.bfloat16) for p in params]
    seen = []

    def after_run(a, b):
        seen.append((a, b))
        assert all(not torch.equal(params[i], twin[i]) for i in range(a, b))  # this group is done
        assert all(torch.equal(params[i], twin[i]) for i in range(b, len(params)))  # later ones are not

    norm = a_opt.clip_step_cast(list(grads), None, 1.0, after_run=after_run)
    assert seen == a_opt.runs and len(seen) == 5
    assert torch.equal(norm, b_opt.clip_step_cast(list(grads), None, 1.0))
    assert all(torch.equal(p, q) for p, q in zip(params, twin))


def test_the_knob_defaults_to_off_and_refuses_other_values():
    assert overlap_mode({}) == "off" and overlap_mode({"PITLAB_UPDATE_OVERLAP": "forward"}) == "forward"
    with pytest.raises(ValueError, match="PITLAB_UPDATE_OVERLAP='on': give one of off, forward"):
        overlap_mode({"PITLAB_UPDATE_OVERLAP": "on"})
    with pytest.raises(SpecError, match="PITLAB_UPDATE_OVERLAP"):
        check_knobs({"PITLAB_UPDATE_OVERLAP": "on"})


def _train(model_type: str, overlap: bool, steps: int, **extra) -> tuple[list[float], list[torch.Tensor]]:
    """``steps`` single-device steps of a tiny model on the GPU (bf16 compute copy, fused step compiled), the
    update on a side stream or not; the losses (read at the end) and the float32 masters."""
    from pitlab.trainer.update_overlap import UpdateOverlap

    master = tiny(model_type, **extra).cuda()
    copy = ComputeCopy(master)
    params = list(master.parameters())
    opt = MasterAdamW(params, compiled=True, groups=model_groups(master, params), lr=1e-2, weight_decay=0.1)
    names = [n for n, _ in master.named_parameters()]
    ov = UpdateOverlap(master, copy.model, names, opt.runs, torch.device("cuda")) if overlap else None
    gen = torch.Generator(device="cuda").manual_seed(0)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 128, (4, 256), device="cuda", generator=gen)
        with ov.computing() if ov is not None else contextlib.nullcontext():
            loss = copy.model(input_ids=ids, labels=ids).loss
            loss.backward()
        copy.fused_step(opt, 1.0, True, ov)
        losses.append(loss.detach())
    if ov is not None:
        ov.close()
    return [float(v) for v in losses], [p.detach().cpu() for p in params]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA streams need a GPU")
@pytest.mark.parametrize("model_type", ["llama", "qwen3_moe"])
def test_side_stream_update_equals_the_sequential_step_bit_for_bit_on_cuda(model_type):
    """Six steps of a model made wide enough that its update takes as long as its forward: every loss and every
    master parameter equal the sequential step's bits (a forward that read a half-updated layer would differ)."""
    wide = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 4} if model_type == "llama" else {
        "hidden_size": 512, "moe_intermediate_size": 512, "num_experts": 16, "num_hidden_layers": 4}
    ref_losses, ref_params = _train(model_type, False, 6, **wide)
    losses, params = _train(model_type, True, 6, **wide)
    assert losses == ref_losses and losses[0] != losses[-1]
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
