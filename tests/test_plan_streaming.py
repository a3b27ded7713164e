"""pitlab.trainer.plan_streaming: the layer-streaming pre-flight panel on the Llama-3.1-8B shape (meta device, no
weights), the refusal when the budget is too small (naming the budget, the prediction and what to change), the
budget from torch.cuda.set_per_process_memory_fraction, `pitlab plan`, and the spec's rules."""

from __future__ import annotations

import pytest
import torch
import yaml
from transformers import LlamaConfig
from typer.testing import CliRunner

from pitlab.api import PitTraining, SpecError, parse_resource
from pitlab.cli import app
from pitlab.trainer.plan import GiB, model_shape, plan_memory
from pitlab.trainer.plan_streaming import (CUDA_CONTEXT_BYTES, StreamingBudgetError, check_budget, memory_fraction,
                                           plan_streaming, streaming_shape)

LAYER_8B = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096  # q, o; k, v; gate, up, down; 2 norms
EMBED_8B = 128_256 * 4096
ADAPTER_8B = 32 * 8 * ((4096 + 4096) + (4096 + 1024) + (4096 + 1024) + (4096 + 4096))  # r=8 on q, k, v, o


@pytest.fixture(scope="module")
def base8b(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama-8b")
    LlamaConfig(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, rope_theta=500_000.0,
                tie_word_embeddings=False).save_pretrained(d)  # Llama-3.1-8B dimensions; config only
    return d


def doc8b(base, seq: int = 2048, micro: int = 1, **streaming) -> dict:
    return {"apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "metadata": {"name": "llama8b-stream"},
            "spec": {"baseModel": {"uri": str(base)}, "corpus": {"uri": "news.jsonl", "format": "jsonl"},
                     "knowledgeCutoff": "2020-12-31", "tokens": 10 ** 6, "method": "lora",
                     "lora": {"r": 8, "alpha": 16, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
                     "training": {"seqLen": seq, "microBatchSize": micro, "precision": "bf16",
                                  "layerStreaming": {"enabled": True, **streaming}},
                     "resources": {"nodes": 1, "gpusPerNode": 1}}}


@pytest.fixture(scope="module")
def shapes8b(base8b):
    from transformers import AutoConfig

    spec = PitTraining.model_validate(doc8b(base8b)).spec
    config = AutoConfig.from_pretrained(base8b)
    return model_shape(config), streaming_shape(config, spec.lora, "bf16")


def test_panel_of_the_8b_llama(base8b, shapes8b):
    shape, s = shapes8b
    assert LAYER_8B == 218_112_000 and ADAPTER_8B == 6_815_744
    assert s.slot == 2 * LAYER_8B  # bf16; every tensor already a multiple of 512 bytes
    assert s.host == 32 * 2 * LAYER_8B + 2 * EMBED_8B == 15_009_841_152  # layers + the untied input embedding
    assert s.adapter == ADAPTER_8B
    # page-locked: each layer's 436 MB store takes a 512 MiB block, the 1.05 GB embedding a 1 GiB one
    assert s.host_pinned == 32 * 2 ** 29 + 2 ** 30 == 17 * GiB
    # resident: the untied head and the final norm in bf16, the float32 adapter, the rotary buffers (float32)
    assert s.resident - 512 == 2 * EMBED_8B + 2 * 4096 + 4 * ADAPTER_8B
    spec = PitTraining.model_validate(doc8b(base8b, gpuMemoryBudgetBytes=4 * GiB)).spec
    p = plan_streaming(spec, shape, s)
    c = p.components
    t, h = 2048, 4096
    assert c["layer_slots"] == 2 * s.slot == 872_448_000
    assert c["adapter_state"] == 12 * ADAPTER_8B
    assert c["checkpoints"] == 32 * t * h * 2 + t * h * 8
    assert p.chunk_tokens == 128 and c["logits_chunk"] == 128 * 128_256 * 14 + t * h * 2
    lora_per_token = 4 * ((4096 + 8 + 4096) * 2 + (4096 + 8 + 1024) * 2)
    assert c["layer_recompute"] == t * (shape.layer_activation_elems * 2 + lora_per_token) + 2 * t * h * 2
    assert p.peak_bytes == sum(v for k, v in c.items() if k != "logits_chunk")  # the recompute phase is larger
    assert 3.1 * GiB < p.peak_bytes < 3.4 * GiB and p.fits is True
    table = p.table()
    for row in ("host store", "host store pinned", "17.00", "layer_slots", "(2 slots)", "checkpoints", "logits_chunk",
                "(128 of 2048 tokens per chunk)", "predicted peak", "budget",
                "training.layerStreaming.gpuMemoryBudgetBytes = 4294967296"):
        assert row in table, row
    assert plan_memory(spec, shape).peak_bytes == p.peak_bytes  # plan_memory dispatches to the streaming plan
    # per optimizer step (1 microbatch): 2 x (32 layers less the 2 still in the slots), one slot's bytes each
    assert any(f"host→GPU per optimizer step: {60 * s.slot / 1e9:.2f} GB" in n for n in p.notes)


def test_refusal_names_the_budget_the_prediction_and_what_to_change(base8b, shapes8b):
    shape, s = shapes8b
    spec = PitTraining.model_validate(doc8b(base8b, gpuMemoryBudgetBytes=3 * GiB)).spec
    p = plan_streaming(spec, shape, s)
    assert p.fits is False
    msg = p.refusal()
    assert msg.startswith(f"training.layerStreaming: predicted GPU peak {p.peak_bytes / GiB:.2f} GiB exceeds the "
                          "budget 3.00 GiB (training.layerStreaming.gpuMemoryBudgetBytes = 3221225472); not one "
                          "sequence of seqLen 2048 fits (at most "), msg
    fit = int(msg.split("at most ")[1].split(" ")[0])
    assert f"set training.seqLen: {fit} or less" in msg
    # the advice is exact: that many tokens fit, one more does not
    ok = PitTraining.model_validate(doc8b(base8b, seq=fit, gpuMemoryBudgetBytes=3 * GiB)).spec
    over = PitTraining.model_validate(doc8b(base8b, seq=fit + 1, gpuMemoryBudgetBytes=3 * GiB)).spec
    assert plan_streaming(ok, shape, s).fits is True and plan_streaming(over, shape, s).fits is False
    # several sequences per microbatch: the advice is a microbatch size
    spec = PitTraining.model_validate(doc8b(base8b, seq=512, micro=16, gpuMemoryBudgetBytes=4 * GiB)).spec
    msg = plan_streaming(spec, shape, s).refusal()
    assert "sequence(s) of seqLen 512 per microbatch fit: set training.microBatchSize: " in msg
    assert "(now 16; raise training.gradientAccumulationSteps" in msg
    # the fixed part alone is too big: slots, resident weights, and buffers named
    spec = PitTraining.model_validate(doc8b(base8b, buffers=4, gpuMemoryBudgetBytes=2 * GiB)).spec
    msg = plan_streaming(spec, shape, s).refusal()
    assert "the fixed part alone needs 2.71 GiB (layer slots 1.63 GiB" in msg
    assert "set training.layerStreaming.buffers: 2 (now 4) or raise the budget" in msg


def test_a_memory_fraction_cap_is_the_budget_in_the_trainer(base8b, monkeypatch):
    """torch.cuda.mem_get_info does not see set_per_process_memory_fraction; the trainer reads the fraction."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=16 * GiB))
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda d: 0.25, raising=False)
    spec = PitTraining.model_validate(doc8b(base8b, micro=2)).spec  # no budget in the spec
    with pytest.raises(StreamingBudgetError, match=r"exceeds the budget 4\.00 GiB \(torch\.cuda\."
                                                   r"set_per_process_memory_fraction\(0\.25\) of 16\.0 GiB\); at most "
                                                   r"1 sequence\(s\) of seqLen 2048 per microbatch fit"):
        check_budget(spec, device=torch.device("cuda", 0))
    # the spec's smaller budget wins over the cap
    spec = PitTraining.model_validate(doc8b(base8b, micro=2, gpuMemoryBudgetBytes=3 * GiB)).spec
    with pytest.raises(StreamingBudgetError, match=r"budget 3\.00 GiB \(training\.layerStreaming\.gpuMemoryBudget"):
        check_budget(spec, device=torch.device("cuda", 0))
    plan = check_budget(PitTraining.model_validate(doc8b(base8b)).spec, device=torch.device("cuda", 0))
    assert plan.capacity_bytes == 4 * GiB and plan.fits is True
    # torch without get_per_process_memory_fraction: the allocator setting in the environment
    monkeypatch.delattr(torch.cuda, "get_per_process_memory_fraction")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,per_process_memory_fraction:0.3")
    assert memory_fraction(torch.device("cuda", 0)) == 0.3


def test_plan_cli_prints_the_panel_and_refuses(base8b, tmp_path):
    path = tmp_path / "stream.yaml"
    path.write_text(yaml.safe_dump(doc8b(base8b, gpuMemoryBudgetBytes=3 * GiB)))
    res = CliRunner().invoke(app, ["plan", str(path)], env={"COLUMNS": "300"})
    assert res.exit_code == 3, res.output
    assert "host store" in res.output and "layer_slots" in res.output and "logits_chunk" in res.output
    assert "exceeds the budget 3.00 GiB (training.layerStreaming.gpuMemoryBudgetBytes" in res.output
    assert "set training.seqLen:" in res.output
    doc = doc8b(base8b)
    doc["spec"]["resources"]["gpuMemoryGiB"] = 8
    path.write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(app, ["plan", str(path)], env={"COLUMNS": "300"})
    assert res.exit_code == 0 and "fits" in res.output, res.output
    assert f"{(8 * GiB - CUDA_CONTEXT_BYTES) / GiB:.2f}" in res.output  # the card less the CUDA context
    res = CliRunner().invoke(app, ["plan", str(path), "--gpu-memory-gib", "3"], env={"COLUMNS": "300"})
    assert res.exit_code == 3 and "(--gpu-memory-gib = 3 GiB less 0.5 GiB of CUDA context)" in res.output


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.update(method="full", lora=None), r"training\.layerStreaming: enabled needs method: lora"),
    (lambda s: s["resources"].update(gpusPerNode=2),
     r"training\.layerStreaming: enabled needs one process \(resources\.nodes: 1, resources\.gpusPerNode: 1; got "
     r"1 and 2\)"),
    (lambda s: s["resources"].update(nodes=2), r"got 2 and 1"),
    (lambda s: s["training"]["layerStreaming"].update(buffers=9), r"buffers"),
    (lambda s: s["training"].update(gradientAccumulationSteps=2, gradientSyncEveryMicrobatch=False),
     r"training\.gradientSyncEveryMicrobatch: false is an FSDP2 setting"),
])
def test_spec_rules(base8b, edit, message):
    doc = doc8b(base8b)
    assert parse_resource(doc).spec.training.layer_streaming.buffers == 2
    edit(doc["spec"])
    if doc["spec"].get("lora", 0) is None:
        del doc["spec"]["lora"]
    with pytest.raises(SpecError, match=message):
        parse_resource(doc)


def test_a_host_store_larger_than_the_host_memory_is_refused():
    from pitlab.trainer.plan_streaming import check_host_memory

    check_host_memory(15_009_841_152, available=17 * 10 ** 9)  # 15.0 GB + 10 % fits in 17 GB
    with pytest.raises(StreamingBudgetError, match=r"the host store needs 15\.0 GB of host memory .* but 16\.0 GB "
                                                   r"are available \(MemAvailable\)"):
        check_host_memory(15_009_841_152, available=16 * 10 ** 9)


def lm_spec(base, k: int, **streaming):
    doc = doc8b(base, **streaming)
    doc["spec"]["training"]["gradientAccumulationSteps"] = k
    return PitTraining.model_validate(doc).spec


def test_layer_major_plan_of_the_8b_llama(base8b, shapes8b):
    """gradientAccumulationSteps 8 under 4 GiB: the planner keeps the boundary inputs of as many of the last layers
    on the GPU as fit (8 of 32) and the rest in page-locked host memory; each layer is copied twice per step."""
    shape, s = shapes8b
    t, h = 2048, 4096
    th2 = t * h * 2  # one microbatch's hidden state, bf16
    single = plan_streaming(lm_spec(base8b, 1, gpuMemoryBudgetBytes=4 * GiB), shape, s)
    p = plan_streaming(lm_spec(base8b, 8, gpuMemoryBudgetBytes=4 * GiB), shape, s)
    c = p.components
    assert p.layer_major is True and p.microbatches == 8 and p.fits is True
    assert p.boundary_gpu_layers == 8
    assert c["checkpoints"] == 8 * 8 * th2 + t * h * 8
    assert c["microbatch_carry"] == 7 * th2 + 2 * th2  # the other 7 microbatches, two boundaries coming back
    for k in ("resident", "adapter_state", "layer_slots", "layer_recompute", "logits_chunk"):
        assert c[k] == single.components[k], k
    assert p.peak_bytes == sum(v for k, v in c.items() if k != "logits_chunk") <= 4 * GiB
    # one more layer on the GPU would not fit: 8 x 16.8 MB more (and its slack)
    assert p.peak_bytes + int(1.05 * 8 * th2) > 4 * GiB
    assert p.boundary_host_bytes == 24 * 8 * th2 == 3_221_225_472
    assert p.boundary_host_pinned_bytes == 24 * 2 ** 27  # 8 x 16 MiB per layer: a power of two already
    # host→GPU per step: 60 slot copies for all 8 microbatches (not 8 x 60) and the host boundaries coming back
    assert p.host_to_gpu_bytes == 60 * s.slot + 24 * 8 * th2 == 29_394_665_472
    assert single.host_to_gpu_bytes == 60 * s.slot and single.layer_major is False
    assert any("8 of 32 layers on the GPU, 24 in host memory (3.22 GB; boundaryStore: auto)" in n for n in p.notes)
    table = p.table()
    assert "boundaries on host" in table and "(24 layers x 8 microbatches, host memory)" in table
    assert "microbatch_carry" in table and "microbatch_carry" not in single.table()
    # boundaryStore: host puts all 32 on the host; layerMajor: false plans microbatch order (8 x the bytes)
    host = plan_streaming(lm_spec(base8b, 8, boundaryStore="host"), shape, s)
    assert host.boundary_gpu_layers == 0 and host.components["checkpoints"] == t * h * 8
    assert host.boundary_host_bytes == 32 * 8 * th2 and host.host_to_gpu_bytes == 60 * s.slot + 32 * 8 * th2
    off = plan_streaming(lm_spec(base8b, 8, layerMajor=False), shape, s)
    assert off.layer_major is False and off.components == single.components
    assert off.host_to_gpu_bytes == 8 * 60 * s.slot
    # no budget known: every boundary on the GPU
    assert plan_streaming(lm_spec(base8b, 8), shape, s).boundary_gpu_layers == 32


def test_layer_major_refusals_name_the_field_and_the_bytes(base8b, shapes8b):
    from pitlab.trainer.plan_streaming import check_spec_fits

    shape, s = shapes8b
    # boundaryStore: gpu needs 32 x 8 boundaries (4 GiB) on the GPU
    p = plan_streaming(lm_spec(base8b, 8, boundaryStore="gpu", gpuMemoryBudgetBytes=4 * GiB), shape, s)
    assert p.fits is False and p.boundary_gpu_layers == 32
    assert p.refusal().endswith("training.layerStreaming.boundaryStore: gpu keeps the inputs of all 32 decoder layers "
                                "for the 8 microbatches on the GPU (4.00 GiB); set boundaryStore: auto or host "
                                "(page-locked host memory)")
    # 2.8 GiB: 8 microbatches do not fit even with every boundary on the host, 5 do; microbatch order does not
    spec = lm_spec(base8b, 8, gpuMemoryBudgetBytes=int(2.8 * GiB))
    p = plan_streaming(spec, shape, s)
    assert p.fits is False and p.boundary_gpu_layers == 0
    with pytest.raises(SpecError) as err:
        check_spec_fits(spec)
    assert err.value.problems == [("spec.training.layerStreaming", p.refusal().split(": ", 1)[1])]
    assert (f"predicted GPU peak {p.peak_bytes / GiB:.2f} GiB exceeds the budget 2.80 GiB (training.layerStreaming."
            "gpuMemoryBudgetBytes = 3006477107); layer-major order over training.gradientAccumulationSteps: 8 "
            "microbatches holds the others' hidden states or gradients between layers (microbatch_carry 144.00 MiB) "
            "and 64.00 MiB of checkpoints on the GPU: set training.gradientAccumulationSteps: 5 or less (now 8)"
            ) in str(err.value)
    assert plan_streaming(lm_spec(base8b, 5, gpuMemoryBudgetBytes=int(2.8 * GiB)), shape, s).fits is True
    assert plan_streaming(lm_spec(base8b, 6, gpuMemoryBudgetBytes=int(2.8 * GiB)), shape, s).fits is False
    # 2.9 GiB with 16 microbatches, boundaryStore: host: the advice is exact (11 fit, 12 do not)
    p = plan_streaming(lm_spec(base8b, 16, boundaryStore="host", gpuMemoryBudgetBytes=int(2.9 * GiB)), shape, s)
    assert p.fits is False and "set training.gradientAccumulationSteps: 11 or less (now 16)" in p.refusal()
    for k, fits in ((11, True), (12, False)):
        spec = lm_spec(base8b, k, boundaryStore="host", gpuMemoryBudgetBytes=int(2.9 * GiB))
        assert plan_streaming(spec, shape, s).fits is fits
    # 3.3 GiB and 40 microbatches: both ways out are offered, and microbatch order's predicted peak
    p = plan_streaming(lm_spec(base8b, 40, boundaryStore="host", gpuMemoryBudgetBytes=int(3.3 * GiB)), shape, s)
    assert p.fits is False and "set training.gradientAccumulationSteps: 35 or less (now 40)" in p.refusal()
    assert "or set training.layerStreaming.layerMajor: false (one microbatch at a time, predicted 3.22 GiB)" in \
        p.refusal()
