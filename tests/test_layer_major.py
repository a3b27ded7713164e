"""pitlab.trainer.layer_major: layer-major streaming (each streamed layer runs for all k microbatches of a step
before the next is fetched) is bit-identical to the resident model with the same gradient accumulation —
logits, loss, LoRA gradients and the adapter after AdamW steps (``torch.equal``) — on llama, qwen3_moe and
qwen3_5_moe_text, with the boundary activations on the device, in host memory, or split; the strategy runs it
for gradientAccumulationSteps > 1 and reports the placement and the bytes moved, which equal the planner's."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from pitlab.trainer.layer_major import BoundaryStore, LayerMajor, capture_layer_calls
from pitlab.trainer.prepare import build_config
from pitlab.trainer.streaming import LayerStreamer, streamed_loss
from test_streaming import CONFIGS, DEVICES, VOCAB, deterministic, lora_model, streaming_doc  # noqa: F401

K = 3  # microbatches per optimizer step
B, S, H = 2, 24, 64  # microbatch shape and hidden size of the tiny configs
BOUNDARY = B * S * H * 2  # one layer's input for one microbatch, bf16 bytes


def microbatches(seed: int, device: str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, VOCAB, (B, S), generator=g).to(device) for _ in range(2)) for _ in range(K)]


def resident_step(model, batches) -> torch.Tensor:
    """The reference: the resident model, one microbatch at a time, each loss scaled by 1 / K (as the trainer's
    microbatch-major strategy does)."""
    loss_sum = torch.zeros((), dtype=torch.float32, device=batches[0][0].device)
    for ids, labels in batches:
        loss = streamed_loss(model, ids, labels)
        (loss / K).backward()
        loss_sum += loss.detach()
    return loss_sum


def adapter(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("device, deterministic", [pytest.param(d, d, id=d) for d in DEVICES],
                         indirect=["deterministic"])
@pytest.mark.parametrize("model_type, gpu_layers", [(m, g) for m in CONFIGS for g in (4, 0)] + [("llama", 2)])
def test_layer_major_equals_the_resident_model_with_the_same_accumulation(model_type, gpu_layers, device,
                                                                          deterministic):
    resident = lora_model(model_type, eager=device == "cuda").train()
    streamed = copy.deepcopy(resident).train()
    resident.to(device)
    streamer = LayerStreamer(streamed, device, buffers=2)
    lm = LayerMajor(streamed, streamer, K, gpu_layers)
    batches = microbatches(1, device)
    # the layer-major forward gives every microbatch's logits bit for bit, each layer fetched once for all three
    with torch.no_grad():
        hidden = lm.forward([ids for ids, _ in batches])
        for (ids, _), h in zip(batches, hidden):
            assert torch.equal(lm.logits(h), resident(input_ids=ids).logits)
    assert streamer.copies == 4
    lm.store.kept.clear()  # (a forward without its backward: drop its boundaries)
    opt_r = torch.optim.AdamW(list(adapter(resident).values()), lr=1e-2)
    opt_s = torch.optim.AdamW(list(adapter(streamed).values()), lr=1e-2)
    for step in range(2):
        batches = microbatches(10 + step, device)
        loss_r, loss_s = resident_step(resident, batches), lm.step(batches, K)
        assert torch.equal(loss_s, loss_r)
        grads_r = {n: p.grad for n, p in adapter(resident).items()}
        grads_s = {n: p.grad for n, p in adapter(streamed).items()}
        assert grads_s.keys() == grads_r.keys() and len(grads_r) >= 8
        assert all(g is not None and g.abs().sum() > 0 for g in grads_r.values())
        assert [n for n in grads_r if not torch.equal(grads_s[n], grads_r[n])] == []
        for opt in (opt_r, opt_s):
            opt.step()
            opt.zero_grad(set_to_none=True)
        after_r = adapter(resident)
        assert all(torch.equal(p, after_r[n]) for n, p in adapter(streamed).items())
    # slots: the logits forward copied 0-3 (2, 3 stay), step 1 all four forward (the slots hold the last layers),
    # then 1, 0 backward; step 2 finds 0, 1 in the slots and copies 2, 3 forward and 1, 0 backward: 2 (4 - 2) per
    # step in the steady state, not per microbatch
    assert streamer.copies == 4 + (4 + 2) + (2 + 2)
    r = lm.report()
    host_layers = 4 - gpu_layers
    assert r["boundary_gpu_layers"] == gpu_layers and r["boundary_host_layers"] == host_layers
    assert r["boundary_host_bytes"] == host_layers * K * BOUNDARY  # one buffer per host layer, reused
    assert r["boundary_pinned"] is (device == "cuda" and host_layers > 0)
    # to the host in the logits forward and both steps; back only in the steps' backward
    assert r["boundary_d2h_bytes"] == 3 * host_layers * K * BOUNDARY
    assert r["boundary_h2d_bytes"] == 2 * host_layers * K * BOUNDARY
    assert lm.store.kept == {} and lm.store.staged == {}
    # the model is usable as before afterwards (the streamer's hooks and checkpointing are back)
    ids = batches[0][0]
    assert torch.equal(streamed(input_ids=ids).logits, resident(input_ids=ids).logits)


def test_capture_records_each_layers_arguments_and_runs_none():
    model = lora_model("qwen3_5_moe_text").train()
    backbone = model.get_base_model().model
    ran = []
    hooks = [layer.register_forward_hook(lambda *a: ran.append(1)) for layer in backbone.layers]
    ids, _ = microbatches(2)[0]
    embedded, calls = capture_layer_calls(backbone, backbone.layers, ids)
    assert ran == [1, 1, 1]  # every forward was the recorder; the last one raised before its hook
    assert embedded.shape == (B, S, H) and torch.equal(embedded, backbone.embed_tokens(ids))
    # one set of rotary embeddings for every layer; no cache
    assert [c[1]["position_embeddings"][0] is calls[0][1]["position_embeddings"][0] for c in calls] == [True] * 4
    assert all(c[1].get("cache") is None and not c[1].get("use_cache") for c in calls)
    assert "forward" not in backbone.layers[0].__dict__  # the class forward is back
    for h in hooks:
        h.remove()


def test_boundary_store_keeps_device_layers_and_round_trips_host_layers():
    store = BoundaryStore(layers=3, microbatches=2, gpu_layers=1, device=torch.device("cpu"), pin=True)
    xs = {(i, m): torch.randn(2, 3, 4, dtype=torch.bfloat16) for i in range(3) for m in range(2)}
    for (i, m), x in xs.items():
        store.put(i, m, x)
    assert store.pin is False and store.host_bytes == 2 * 2 * 24 * 2  # layers 0, 1 on the host (not pinned: CPU)
    assert store.take(2, 0) is xs[(2, 0)] and store.staged == {}  # layer 2: the tensors themselves
    assert store.take(2, 1) is xs[(2, 1)] and set(store.staged) == {(1, 0)}  # the first host one is on its way
    got = store.take(1, 0)
    assert torch.equal(got, xs[(1, 0)]) and got is not xs[(1, 0)]
    assert set(store.staged) == {(1, 1)}  # the next one backward needs is already copied back
    assert torch.equal(store.take(1, 1), xs[(1, 1)]) and set(store.staged) == {(0, 0)}
    assert store.d2h_bytes == 4 * 48 and store.h2d_bytes == 3 * 48
    with pytest.raises(ValueError, match=r"gpu_layers must be 0\.\.3 \(got 4\)"):
        BoundaryStore(3, 2, 4, torch.device("cpu"), False)


def test_the_strategy_runs_layer_major_for_several_microbatches_and_reports_it(tmp_path):
    """Two trainer strategies on the same saved base, gradientAccumulationSteps 3, boundaries in host memory:
    layer-major gives the microbatch-major strategy's loss and gradients bit for bit, copies each layer once
    per step instead of once per microbatch, and its bytes per step are the planner's."""
    from pitlab.api import PitTraining
    from pitlab.trainer.strategies.streaming import StreamingStrategy

    config = build_config("llama", CONFIGS["llama"], vocab_size=VOCAB)
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "base")
    runs = {}
    for major in (True, False):
        doc = streaming_doc(tmp_path / "base", layerMajor=major, boundaryStore="host")
        doc["spec"]["training"]["gradientAccumulationSteps"] = K
        strategy = StreamingStrategy()
        strategy.build(tmp_path / "base", tmp_path / f"run-{major}", PitTraining.model_validate(doc).spec,
                       torch.device("cpu"), None, None, None)
        assert (strategy.layer_major is not None) is major
        losses, copied = [], []
        for step in range(2):
            before = strategy.report()["layer_streaming"]
            losses.append(strategy.forward_backward(microbatches(20 + step), K, True))
            after = strategy.report()["layer_streaming"]
            copied.append(after["bytes_copied"] - before["bytes_copied"] + (
                after["layer_major"]["boundary_h2d_bytes"] - before["layer_major"]["boundary_h2d_bytes"]
                if major else 0))
        runs[major] = (strategy, losses, copied)
    (lm, lm_losses, lm_copied), (mm, mm_losses, mm_copied) = runs[True], runs[False]
    assert all(torch.equal(a, b) for a, b in zip(lm_losses, mm_losses))
    grads = {n: p.grad for n, p in adapter(mm.model).items()}
    assert all(torch.equal(p.grad, grads[n]) for n, p in adapter(lm.model).items())
    report, mm_report = lm.report()["layer_streaming"], mm.report()["layer_streaming"]
    assert report["order"] == "layer-major" and mm_report["order"] == "microbatch-major"
    assert mm_report["layer_major"] is None
    assert report["layer_major"]["boundary_gpu_layers"] == 0 and report["layer_major"]["boundary_host_layers"] == 4
    slot = lm.streamer.slot_bytes // 2
    # the steady step: 2 (4 layers - 2 slots) layer copies, plus every layer's input for 3 microbatches back
    assert lm_copied[1] == 2 * 2 * slot + 4 * K * BOUNDARY == report["planned_host_to_gpu_bytes_per_step"]
    assert mm_copied[1] == K * 2 * 2 * slot == mm_report["planned_host_to_gpu_bytes_per_step"]


def test_auto_boundary_placement_leaves_headroom_when_it_can():
    from pitlab.trainer.layer_major import AUTO_HEADROOM, boundary_gpu_layers

    cap, per = 4 * 2 ** 30, 67_108_864  # 4 GiB; one layer's boundaries for 4 microbatches of 2 x 2,048 tokens
    base = cap - 12 * per - 15_000_000  # 12 layers fit 15 MB under the cap (the run that later ran out of memory)

    def peak(n):
        return base + n * per

    assert peak(12) <= cap < peak(13)
    # 2 % of 4 GiB is 86 MB: two layers fewer (134 MB + 15 MB of headroom), the same as boundaryStore: host for them
    assert boundary_gpu_layers("auto", 40, cap, peak) == 10 and cap - peak(10) >= AUTO_HEADROOM * cap
    # when nothing fits with the headroom, the most that fit the cap itself
    tight = peak(1) + 1_000_000
    assert tight * (1 - AUTO_HEADROOM) < peak(0) and boundary_gpu_layers("auto", 40, tight, peak) == 1
    assert boundary_gpu_layers("auto", 40, peak(0) - 1, peak) == 0
    assert boundary_gpu_layers("host", 40, cap, peak) == 0 and boundary_gpu_layers("gpu", 40, 1, peak) == 40
    assert boundary_gpu_layers("auto", 40, None, peak) == 40
