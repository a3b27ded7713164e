"""pitlab.trainer.plan: the memory planner on the published Qwen3.5-35B-A3B cases, and `pitlab plan`."""

from __future__ import annotations

import pytest
import yaml
from transformers import AutoConfig
from typer.testing import CliRunner

from pitlab.api import PitTraining, SpecError
from pitlab.cli import app
from pitlab.trainer.flops import train_flops_per_token
from pitlab.trainer.plan import GiB, RESERVE_BYTES, count_text, model_shape, plan_memory

P_35B = 34_660_610_688  # Qwen3.5-35B-A3B (transformers' qwen3_5_moe_text defaults): 40 layers, 256 experts
ACTIVE_35B = 3_454_988_928  # 8 of 256 routed experts per token ("A3B")


@pytest.fixture(scope="module")
def base35(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen35-35b-a3b")
    AutoConfig.for_model("qwen3_5_moe_text").save_pretrained(d)  # config only: the planner needs no weights
    return d


@pytest.fixture(scope="module")
def shape35(base35):
    return model_shape(AutoConfig.from_pretrained(base35))


def published(base, gpus: int, accum: int, sync: bool = True, **training) -> dict:
    """The published recipe: seq 2048, microbatch 1, activation checkpointing, bf16, 80 GB GPUs."""
    t = {"seqLen": 2048, "microBatchSize": 1, "gradientAccumulationSteps": accum,
         "gradientSyncEveryMicrobatch": sync, "activationCheckpointing": True, "precision": "bf16"}
    t.update(training)
    return {"apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "metadata": {"name": "qwen35-a3b"},
            "spec": {"baseModel": {"uri": str(base)}, "corpus": {"uri": "news.jsonl", "format": "jsonl"},
                     "knowledgeCutoff": "2020-12-31", "tokens": 10 ** 9, "training": t,
                     "resources": {"nodes": 1, "gpusPerNode": gpus, "gpuMemoryGiB": 80}}}


def plan(base, shape, *args, **kw):
    return plan_memory(PitTraining.model_validate(published(base, *args, **kw)).spec, shape)


def test_shape_of_the_35b_model(shape35):
    assert shape35.total == P_35B and shape35.active == ACTIVE_35B
    assert shape35.root == 2 * 248_320 * 2048 + 2048  # embeddings + untied lm_head + final norm
    assert shape35.layers == 40 and shape35.full_attention_layers == 10 and shape35.vocab == 248_320


def test_35b_full_weight_on_one_80gb_gpu_refuses(base35, shape35):
    p = plan(base35, shape35, gpus=1, accum=1)
    assert p.components["parameters"] == 4 * P_35B and p.components["optimizer"] == 8 * P_35B
    assert p.fits is False and p.peak_bytes > 16 * P_35B > 6 * 80 * GiB


def test_one_gpu_full_bf16_plans_masters_and_a_compute_copy(base35, shape35, monkeypatch):
    """World size 1 (pitlab.trainer.single_device, no FSDP2): float32 masters 4 B, AdamW 8 B, float32 gradients
    4 B, the bf16 compute copy 2 B and its bf16 gradients 2 B per parameter; for the 35B model the peak is at the
    cast after backward, when all five exist: 20 B per parameter. With the fused optimizer step (the default on a
    GPU) and one microbatch per step no float32 gradient is made: 16 B per parameter in backward."""
    fused = plan(base35, shape35, gpus=1, accum=1, loss="chunked")
    assert fused.components["gradients"] == 0 and fused.components["gradient_buffers"] == 2 * P_35B
    assert fused.peak_bytes == (16 * P_35B + RESERVE_BYTES + (2048 + 248_320) * 2048 * 2
                                + 2 * 2048 * 2048 * 2 + 2048 * shape35.layer_activation_elems * 2)
    assert fused.notes[0].endswith("fused optimizer step (no float32 gradients)")
    # with accumulation the float32 sums exist as before, fused or not; at two microbatches the fused step holds
    # the first one's bf16 gradients instead (ComputeCopy.gather_grads): 2 B per parameter
    accum = plan(base35, shape35, 1, 4, loss="chunked")
    assert accum.components["gradients"] == 4 * P_35B
    two = plan(base35, shape35, 1, 2, loss="chunked")
    assert two.components["gradients"] == 2 * P_35B
    assert two.notes[0].endswith("the first microbatch's bf16 gradients held: no float32 gradients)")
    assert plan(base35, shape35, 1, 2, loss="chunked", fusedOptimizer=False).components["gradients"] == 4 * P_35B
    assert accum.notes[0].endswith("fused optimizer step (float32 gradient sums: accumulation)")
    # FSDP2's fused step reads the float32 gradient shards torch's AdamW reads: the plan does not change
    sharded = plan(base35, shape35, 8, 1, fusedOptimizer=True)
    torch_adamw = plan(base35, shape35, 8, 1, fusedOptimizer=False)
    assert (sharded.components, sharded.peak_bytes, sharded.notes) == (
        torch_adamw.components, torch_adamw.peak_bytes, torch_adamw.notes)
    assert sharded.components["gradients"] == 4 * P_35B // 8
    p = plan(base35, shape35, gpus=1, accum=1, loss="chunked", fusedOptimizer=False)
    c = p.components
    assert (c["parameters"], c["optimizer"], c["gradients"], c["unsharded_parameters"], c["gradient_buffers"],
            c["accumulation"]) == (4 * P_35B, 8 * P_35B, 4 * P_35B, 2 * P_35B, 2 * P_35B, 0)
    assert p.peak_bytes == 20 * P_35B + RESERVE_BYTES
    assert p.notes[0].endswith("single-device (fp32 master + bf16 compute copy), no FSDP2")
    assert not any("reduce-scatter stream" in n for n in p.notes)  # no FSDP2, no second pool
    # gradientSyncEveryMicrobatch has no effect: the float32 gradients are the sum either way
    nosync = plan(base35, shape35, 1, 4, sync=False, loss="chunked")
    sync = plan(base35, shape35, 1, 4, loss="chunked")
    assert nosync.components == sync.components and nosync.peak_bytes == sync.peak_bytes
    # from the second microbatch on the float32 gradients exist in backward too
    assert sync.peak_bytes == (20 * P_35B + RESERVE_BYTES + (2048 + 248_320) * 2048 * 2
                               + 2 * 2048 * 2048 * 2 + 2048 * shape35.layer_activation_elems * 2)
    assert p.single_device is True and p.fits is False  # 80 GiB
    monkeypatch.setenv("PITLAB_FORCE_FSDP2", "1")  # FSDP2 at world size 1: one layer's gradient buffers
    fsdp2 = plan(base35, shape35, gpus=1, accum=1, loss="chunked")
    assert fsdp2.components["gradient_buffers"] == 2 * shape35.root + 6 * shape35.largest_layer
    assert fsdp2.components["unsharded_parameters"] == 2 * P_35B and fsdp2.notes[0].endswith("FSDP2")
    assert fsdp2.single_device is False
    # in backward FSDP2 frees each layer's bf16 copy as its float32 gradients appear: 16 B per parameter + buffers
    # allocated at once (one pool)
    backward = (fsdp2.components["gradient_buffers"] + (2048 + 248_320) * 2048 * 2 + 2 * 2048 * 2048 * 2
                + 2048 * shape35.layer_activation_elems * 2)
    assert fsdp2.activation_checkpointing is True
    assert fsdp2.allocated_bytes == 16 * P_35B + 2 * (shape35.root + 2 * shape35.largest_layer) + backward
    # reserved: the float32 gradients (4 B per parameter) are the reduce-scatter stream's own pool, beside the
    # default stream's peak in backward: masters, AdamW, every layer's bf16 copy, the layers' inputs, buffers
    assert fsdp2.peak_bytes == 18 * P_35B + RESERVE_BYTES + 40 * 2048 * 2048 * 2 + backward
    # one rank: FSDP2 reduce-scatters once per step whatever gradientSyncEveryMicrobatch says, at one peak
    one_rank = [plan(base35, shape35, gpus=1, accum=4, sync=s, loss="chunked") for s in (True, False)]
    assert one_rank[0].peak_bytes == one_rank[1].peak_bytes
    assert all("(sync every microbatch: no effect with one rank: one reduce-scatter per step)" in q.notes[0]
               for q in one_rank)
    monkeypatch.delenv("PITLAB_FORCE_FSDP2")
    # a GPU on which only FSDP2's plan fits gets FSDP2, and the plan says what the faster path would need
    spec = PitTraining.model_validate(published(base35, 1, 1, loss="chunked", fusedOptimizer=False)).spec
    between = plan_memory(spec, shape35, gpu_memory_gib=(fsdp2.peak_bytes + p.peak_bytes) / 2 / GiB)
    assert between.single_device is False and between.fits is True and between.peak_bytes == fsdp2.peak_bytes
    assert (f"single-device path (float32 masters + bf16 compute copy, faster) would need "
            f"{p.peak_bytes / GiB:.2f} GiB") in between.notes[-1]
    assert plan_memory(spec, shape35, gpu_memory_gib=p.peak_bytes / GiB + 1).single_device is True


def test_35b_on_8x80gb_accumulation_4_without_sync_refuses(base35, shape35):
    p = plan(base35, shape35, gpus=8, accum=4, sync=False)
    # every rank holds all gradients unsharded: 69.3 GB in bf16 (the published figure), and FSDP2 accumulates
    # them upcast to the float32 reduce dtype: 138.6 GB
    assert p.components["accumulation"] == 4 * P_35B
    assert any("69.3 GB in bf16, 138.6 GB" in n for n in p.notes)
    # the float32 gradient shards replace each layer's sums in the last backward: counted inside the accumulation
    assert p.components["parameters"] == 4 * P_35B // 8 and p.components["gradients"] == 0
    assert p.fits is False and p.peak_bytes - p.components["accumulation"] < 80 * GiB  # the accumulation is why


def test_35b_on_8x80gb_accumulation_1_fits(base35, shape35):
    p = plan(base35, shape35, gpus=8, accum=1, loss="reference")
    c = p.components
    assert c["accumulation"] == 0 and c["optimizer"] == 8 * P_35B // 8 and c["reserve"] == RESERVE_BYTES
    assert c["unsharded_parameters"] == 2 * (shape35.root + 2 * shape35.largest_layer)
    # the reference loss: bf16 logits, their float32 copy, log-softmax and its gradient
    assert c["logits"] == 2048 * 248_320 * 14
    # the fused loss: the bf16 gradient of the logits + one chunk's bf16 logits (2048 tokens: one chunk)
    assert plan(base35, shape35, gpus=8, accum=1, loss="chunked").components["logits"] == 2048 * 248_320 * 2 * 2
    assert c["activations"] == 40 * 2048 * 2048 * 2 + 2048 * shape35.layer_activation_elems * 2 + 2 * 2048 * 2048 * 2
    assert p.fits is True and 75 * GiB < p.peak_bytes < 80 * GiB
    assert any("FSDP2 keeps the 16.14 GiB of float32 gradient shards in its reduce-scatter stream's own pool" in n
               for n in p.notes)  # 4 B × 34.66 B parameters / 8 GPUs
    # reduce-scatter every microbatch: accumulation 4 allocates no more at once, but from the second microbatch on
    # the root's and a layer's new float32 shards are made in the reduce-scatter stream's pool before being added
    four = plan(base35, shape35, gpus=8, accum=4, loss="reference")
    assert four.allocated_bytes == p.allocated_bytes
    assert four.peak_bytes - p.peak_bytes == 4 * (shape35.root + shape35.largest_layer) // 8 == 929_910_880
    # without activation checkpointing every layer's activations are kept: at seq 2048 they are smaller than the
    # gradients that replace them in backward as one pool (the allocated peak fits 80 GiB), but the gradients are
    # the reduce-scatter stream's own pool and never take the activations' memory: the reserved peak does not
    off = plan(base35, shape35, gpus=8, accum=1, activationCheckpointing=False)
    assert off.allocated_bytes < 80 * GiB < off.peak_bytes and off.fits is False
    o = off.components
    working = 2 * 2048 * 2048 * 2
    saved = o["activations"] - working
    assert saved == 40 * 2048 * shape35.layer_activation_elems * 2
    assert off.peak_bytes == (12 * P_35B // 8 + RESERVE_BYTES + o["unsharded_parameters"] + saved
                              + max(o["logits"], o["gradient_buffers"] + (2048 + 248_320) * 2048 * 2 + working)
                              + 4 * P_35B // 8)  # the chunked loss keeps the gradients of hidden states and head
    assert plan(base35, shape35, gpus=8, accum=1, seqLen=8192, activationCheckpointing=False).fits is False


def test_flops_per_token_counts_active_matmul_parameters(shape35):
    assert train_flops_per_token(shape35, 2048) == 6 * (ACTIVE_35B - 248_320 * 2048) + 6 * 10 * 2048 * 16 * 256
    # LoRA: no weight gradients for the frozen base
    assert train_flops_per_token(shape35, 2048, frozen_base=True) == (
        4 * (ACTIVE_35B - 248_320 * 2048) + 6 * 10 * 2048 * 16 * 256)


def test_plan_cli(base35, tmp_path):
    runner = CliRunner()
    bad = tmp_path / "nosync.yaml"
    bad.write_text(yaml.safe_dump(published(base35, 8, 4, sync=False)))
    res = runner.invoke(app, ["plan", str(bad)])
    assert res.exit_code == 3, res.output
    assert "accumulation" in res.output and "138.64" in res.output
    assert "exceeds spec.resources.gpuMemoryGiB = 80.0 GiB" in res.output
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(published(base35, 8, 1)))
    res = runner.invoke(app, ["plan", str(good)])
    assert res.exit_code == 0 and "fits" in res.output
    assert "decoder layers on CUDA: torch.compile per decoder layer; CUDA graphs: only on the single-device path" in " ".join(
        res.output.split())  # 8 GPUs: FSDP2
    import torch
    cpu_note = "this machine has no CUDA GPU: `pitlab run` here trains on the CPU (gloo)"
    assert (cpu_note in " ".join(res.output.split())) == (not torch.cuda.is_available())
    res = runner.invoke(app, ["plan", str(good), "--gpu-memory-gib", "40"])
    assert res.exit_code == 3 and "exceeds --gpu-memory-gib = 40.0 GiB" in res.output  # the flag, not the spec
    missing = tmp_path / "missing.yaml"
    missing.write_text(yaml.safe_dump(published(tmp_path / "nowhere", 8, 1)))
    res = runner.invoke(app, ["plan", str(missing)])
    assert res.exit_code == 2 and "spec.baseModel.uri" in res.output


def test_parameter_counts_are_printed_with_a_unit(base35, shape35, data_root):
    """Found by a new user: `pitlab plan` printed "0.00 B parameters" for the demo's 420 K-parameter model."""
    assert [count_text(n) for n in (0, 999, 1_000, 45_123, 999_499, 999_500, 1_234_567, 4_500_000_000)] == [
        "0", "999", "1 K", "45.1 K", "999 K", "1 M", "1.23 M", "4.5 B"]
    assert plan(base35, shape35, gpus=8, accum=1).notes[0].startswith(
        "model: qwen3_5_moe_text, 34.7 B parameters (3.45 B active), world size 8")
    res = CliRunner().invoke(app, ["plan", "examples/local-sp500-fomc.yaml", "--data-root", str(data_root)])
    assert res.exit_code == 0 and "model: qwen3_5_moe_text, 420 K parameters (371 K active)" in res.output, res.output


def lora_plan(base, shape, gpus: int, accum: int = 1, sync: bool = True, lora: dict | None = None, **training):
    doc = published(base, gpus, accum, sync, **training)
    doc["spec"]["method"] = "lora"
    if lora is not None:
        doc["spec"]["lora"] = lora
    return plan_memory(PitTraining.model_validate(doc).spec, shape)


def test_lora_plan_is_smaller_than_full_by_the_frozen_base(base35, shape35):
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # count the adapter independently of peft: r × (in + out) per targeted linear
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base35))
    targets = ("q_proj", "k_proj", "v_proj", "o_proj")  # the LoraSpec default, r = 16
    a = sum(16 * (m.in_features + m.out_features) for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and n.split(".")[-1] in targets)
    assert a == 3_440_640  # only the 10 full-attention layers have q/k/v/o projections
    for gpus in (1, 8):
        full, lora = plan(base35, shape35, gpus, 1, fusedOptimizer=False).components, lora_plan(base35, shape35, gpus).components
        assert lora["parameters"] == (2 * P_35B + 4 * a) // gpus  # frozen base in bf16 + float32 adapter
        assert full["parameters"] - lora["parameters"] == 4 * P_35B // gpus - (2 * P_35B + 4 * a) // gpus
        assert lora["gradients"] == 4 * a // gpus and lora["optimizer"] == 8 * a // gpus
        assert full["gradients"] - lora["gradients"] == 4 * P_35B // gpus - 4 * a // gpus
        assert full["optimizer"] - lora["optimizer"] == 8 * P_35B // gpus - 8 * a // gpus
        assert lora["gradient_buffers"] == (2 + 4) * 344_064  # no adapter outside the layers; 1 layer's adapter
        assert lora["unsharded_parameters"] == 2 * (shape35.root + 2 * shape35.largest_layer) + 2 * 2 * 344_064
        # full weights on one GPU keep every layer's bf16 copy between forward and backward (no reshard)
        assert full["unsharded_parameters"] == (2 * P_35B if gpus == 1 else
                                                2 * (shape35.root + 2 * shape35.largest_layer))
        assert lora["activations"] == full["activations"] and lora["logits"] == full["logits"]
    # the published 35B case that refuses full-weight on one 80 GB GPU fits as LoRA (69.3 GB of bf16 base)
    one = lora_plan(base35, shape35, 1, loss="reference")
    assert one.fits is True and plan(base35, shape35, 1, 1).fits is False
    assert 78 * GiB < one.peak_bytes < 79 * GiB
    fused = lora_plan(base35, shape35, 1)  # the chunked loss (the default): 5 GiB less of logits
    assert 73 * GiB < fused.peak_bytes < 74 * GiB
    assert any("3.44 M trainable adapter parameters" in n for n in one.notes)
    # FSDP2's reduce-scatter pool holds the adapter's float32 gradients only: 4 B × 3,440,640
    assert any("the 13.12 MiB of float32 gradient shards" in n for n in one.notes)
    # without per-microbatch sync only the adapter's gradients stay unsharded: 4 bytes x 3.44 M
    assert lora_plan(base35, shape35, 8, accum=4, sync=False).components["accumulation"] == 4 * a
    with pytest.raises(SpecError, match=r"spec\.lora\.targetModules: 'qkv' names no module of Qwen3_5MoeForCausalLM"):
        lora_plan(base35, shape35, 8, lora={"targetModules": ["qkv"]})


@pytest.mark.parametrize("name", ["adamw8bit", "paged_adamw8bit"])
def test_bitsandbytes_8bit_optimizers_are_refused_under_fsdp2(base35, name):
    doc = published(base35, 8, 1, optimizer=name)
    with pytest.raises(ValueError, match=f"optimizer: {name}: bitsandbytes 8-bit optimizers are refused under "
                                         "FSDP2.*DTensor"):
        PitTraining.model_validate(doc)


def test_auto_activation_checkpointing_is_off_when_the_plan_fits(base35, shape35):
    """Unset activationCheckpointing: off if the plan without it fits the GPU, else on (and the plan says why)."""
    auto = dict(activationCheckpointing=None, seqLen=8192)
    off = plan(base35, shape35, 8, 1, activationCheckpointing=False, seqLen=8192)
    on = plan(base35, shape35, 8, 1, activationCheckpointing=True, seqLen=8192)
    assert on.peak_bytes < off.peak_bytes - 20 * GiB  # 40 layers' activations at 8192 tokens
    spec = PitTraining.model_validate(published(base35, 8, 1, **auto)).spec
    p = plan_memory(spec, shape35, gpu_memory_gib=(on.peak_bytes + off.peak_bytes) / 2 / GiB)  # only with it
    assert p.activation_checkpointing is True and p.peak_bytes == on.peak_bytes and p.fits is True
    assert "auto: on (without it the plan needs" in p.notes[0]
    big = plan_memory(PitTraining.model_validate(published(base35, 8, 1, **auto)).spec, shape35,
                      gpu_memory_gib=off.peak_bytes / GiB + 1)
    assert big.activation_checkpointing is False and big.peak_bytes == off.peak_bytes
    doc = published(base35, 8, 1, **auto)
    del doc["spec"]["resources"]["gpuMemoryGiB"]
    unknown = plan_memory(PitTraining.model_validate(doc).spec, shape35)
    assert unknown.activation_checkpointing is False and "no GPU memory known" in unknown.notes[0]


def test_a_typed_gpu_memory_above_the_cards_is_planned_against_the_card(base35, shape35):
    """A spec typed for 141 GiB cards run on an 80 GiB one: the trainer plans against the card (so unset activation
    checkpointing turns on where it must) and says so; at or below the card's memory the spec's value stands."""
    from pitlab.trainer.train import plan_capacity

    doc = published(base35, 8, 1, activationCheckpointing=None, seqLen=8192)
    doc["spec"]["resources"]["gpuMemoryGiB"] = 141
    spec = PitTraining.model_validate(doc).spec
    card = int(79.19 * GiB)  # an H100 80GB as torch reports it
    gib, note = plan_capacity(spec, card)
    assert gib == card / GiB and note == ("spec.resources.gpuMemoryGiB=141 is more than this GPU's 79.19 GiB: the "
                                          "memory plan uses the GPU's")
    on_card = plan_memory(spec, shape35, gpu_memory_gib=gib)
    typed = plan_memory(spec, shape35)
    assert (typed.activation_checkpointing, on_card.activation_checkpointing) == (False, True)
    assert on_card.capacity_bytes == card and typed.capacity_bytes == 141 * GiB
    # 35B on 8 H100s at seq 8192 with checkpointing: over the card; the trainer warns on rank 0 and goes on
    from pitlab.trainer.train import fit_warning

    assert fit_warning(on_card, True) == (
        f"predicted peak {on_card.peak_bytes / GiB:.1f} GiB per GPU exceeds this GPU's memory = 79.2 GiB; to fit, "
        "more GPUs (spec.resources.nodes or gpusPerNode: FSDP2 shards weights, gradients and AdamW states); or a "
        "shorter spec.training.seqLen; or a LoRA adapter instead of full weights (spec.method: lora); the run may "
        "run out of memory (`pitlab plan` shows the plan)") and on_card.fits is False
    assert fit_warning(typed, False) is None and fit_warning(None, True) is None
    doc["spec"]["resources"]["gpuMemoryGiB"] = 70  # less than the card: the user's limit stands
    assert plan_capacity(PitTraining.model_validate(doc).spec, card) == (None, None)
    del doc["spec"]["resources"]["gpuMemoryGiB"]  # none typed: the card's
    assert plan_capacity(PitTraining.model_validate(doc).spec, card) == (card / GiB, None)
    assert plan_capacity(spec, None) == (None, None)  # the CPU: nothing known


def test_the_plan_says_what_the_trainer_will_compile_and_whether_with_cuda_graphs(base35, shape35, monkeypatch):
    """``kernels.planned_compile``: the run report's ``compile`` entry as the trainer will write it on CUDA, from the
    spec and its plan: CUDA graphs on the single-device path when the plan takes at most 85 % of the GPU (50 %
    here), off above it (90 %), with activation checkpointing, under FSDP2 and when PITLAB_COMPILE_MODE says so; not
    compiled for LoRA; ``pitlab plan`` prints it."""
    from pitlab.trainer.kernels import planned_compile

    monkeypatch.delenv("PITLAB_COMPILE_MODE", raising=False)
    spec = PitTraining.model_validate(published(base35, 1, 1, activationCheckpointing=False, loss="chunked")).spec
    peak = plan_memory(spec, shape35).peak_bytes
    half = plan_memory(spec, shape35, gpu_memory_gib=2 * peak / GiB)
    assert half.single_device is True and half.activation_checkpointing is False
    assert planned_compile(spec, half) == ("torch.compile per decoder layer (mode reduce-overhead); CUDA graphs: "
                                           "auto: the plan takes 50.0% of the GPU's memory")
    tight = plan_memory(spec, shape35, gpu_memory_gib=peak / 0.9 / GiB)
    assert planned_compile(spec, tight) == ("torch.compile per decoder layer; CUDA graphs: off: the plan takes 90.0% "
                                            "of the GPU's memory (limit 85%)")
    doc = published(base35, 1, 1, activationCheckpointing=False, loss="chunked")
    del doc["spec"]["resources"]["gpuMemoryGiB"]
    nosize = PitTraining.model_validate(doc).spec
    unknown = plan_memory(nosize, shape35)  # no GPU size: the run decides against its GPU, as the plan says how
    assert unknown.capacity_bytes is None and unknown.peak_bytes == peak and planned_compile(nosize, unknown) == (
        f"torch.compile per decoder layer; CUDA graphs: decided against the GPU's memory when the run starts: on "
        f"where the plan's {peak / GiB:.2f} GiB take at most 85% of it (a GPU of {peak / 0.85 / GiB:.2f} GiB or more)")
    ckpt = PitTraining.model_validate(published(base35, 1, 1, loss="chunked")).spec
    assert planned_compile(ckpt, plan_memory(ckpt, shape35, gpu_memory_gib=2 * peak / GiB)) == (
        "torch.compile per decoder layer; CUDA graphs: off with activation checkpointing")
    two = PitTraining.model_validate(published(base35, 2, 1, activationCheckpointing=False)).spec
    assert planned_compile(two, plan_memory(two, shape35)) == (
        "torch.compile per decoder layer; CUDA graphs: only on the single-device path")
    doc = published(base35, 1, 1)
    doc["spec"]["method"] = "lora"
    lora = PitTraining.model_validate(doc).spec
    assert planned_compile(lora, plan_memory(lora, shape35)) == "off (auto: LoRA and layer streaming are not compiled)"
    monkeypatch.setenv("PITLAB_COMPILE_MODE", "default")
    assert planned_compile(spec, half) == (
        "torch.compile per decoder layer (mode default); CUDA graphs: off, as PITLAB_COMPILE_MODE says")


def test_a_base_model_folder_without_config_names_where_it_looked(tmp_path, monkeypatch):
    """A cluster spec's relative ``baseModel.uri`` (a folder on the cluster's volume) planned on a laptop: the error
    names the field, the folder it read, that a relative URI was read from the current directory, and the fix."""
    from pitlab.trainer.plan import spec_config

    monkeypatch.chdir(tmp_path)
    spec = PitTraining.model_validate(published("models/Qwen3.5-35B-A3B-Base", gpus=8, accum=1)).spec
    with pytest.raises(SpecError) as err:
        spec_config(spec)
    assert str(err.value).count("spec.baseModel.uri") == 1
    assert (f"models/Qwen3.5-35B-A3B-Base: no config.json to plan from (a relative URI, read here from {tmp_path}); "
            "the plan needs only the model's config.json: give a copy with `pitlab plan --model-config PATH`, or "
            "point the URI at a local folder holding one") in str(
        err.value)


def test_a_refusal_shows_as_many_decimals_as_tell_the_peak_from_the_gpu(base35, shape35):
    """Found in a trial: 'predicted peak 2.0 GiB per GPU exceeds ... = 2.0 GiB' for 2.02 against 2.00."""
    import dataclasses

    p = plan(base35, shape35, gpus=1, accum=1)
    # checkpointing is on already: not offered; the 2.6 GiB of activations and logits cannot save the 440 GiB
    # missing, so shorter sequences are not offered either; FSDP2 over more GPUs or LoRA can
    fixes = ("; to fit, more GPUs (spec.resources.nodes or gpusPerNode: FSDP2 shards weights, gradients and AdamW "
             "states); or a LoRA adapter instead of full weights (spec.method: lora)")
    assert p.refusal("spec.resources.gpuMemoryGiB") == (
        f"predicted peak {p.peak_bytes / GiB:.1f} GiB per GPU exceeds spec.resources.gpuMemoryGiB = 80.0 GiB" + fixes)
    close = dataclasses.replace(p, peak_bytes=int(2.02 * GiB), capacity_bytes=2 * GiB, remedies=[])
    assert close.refusal("--gpu-memory-gib") == "predicted peak 2.02 GiB per GPU exceeds --gpu-memory-gib = 2.00 GiB"
    # without checkpointing it is offered first; a LoRA plan does not offer LoRA
    off = plan(base35, shape35, gpus=8, accum=1, seqLen=8192, activationCheckpointing=False)
    assert "; to fit, spec.training.activationCheckpointing: true; or more GPUs (" in off.refusal("x")
    # 0.6 GiB short on 8 H100s: the 64.6 GiB of sharded state first, then shorter sequences (microBatchSize is 1)
    h100 = plan_memory(PitTraining.model_validate(published(base35, 8, 1)).spec, shape35, gpu_memory_gib=79.18)
    assert h100.refusal("x").endswith(
        "exceeds x = 79.2 GiB; to fit, more GPUs (spec.resources.nodes or gpusPerNode: FSDP2 shards weights, "
        "gradients and AdamW states); or a shorter spec.training.seqLen; or a LoRA adapter instead of full weights "
        "(spec.method: lora)"), h100.refusal("x")
    two = published(base35, 8, 1, microBatchSize=2)
    assert "; or a shorter spec.training.seqLen or a smaller microBatchSize; or a LoRA" in plan_memory(
        PitTraining.model_validate(two).spec, shape35, gpu_memory_gib=79.18).refusal("x")
    assert "spec.method: lora" not in lora_plan(base35, shape35, 8, seqLen=65536).refusal("x")


def test_plan_nproc_plans_the_local_run_and_a_multi_node_spec_says_so(base35, tmp_path):
    """Found in a trial: a spec of 2 nodes was planned at world size 16 while `pitlab run` starts 8 processes."""
    runner = CliRunner()
    doc = published(base35, 8, 1)
    doc["spec"]["resources"]["nodes"] = 2
    two = tmp_path / "two-nodes.yaml"
    two.write_text(yaml.safe_dump(doc))
    cluster = runner.invoke(app, ["plan", str(two)])
    flat = " ".join(cluster.output.split())
    assert cluster.exit_code == 0 and ("world size 16 (spec.resources: 2 nodes × 8 GPUs, as on a cluster); `pitlab "
                                       "run` on one machine starts 8: plan that with --nproc 8") in flat
    local = runner.invoke(app, ["plan", str(two), "--nproc", "8"])
    one_node = tmp_path / "one-node.yaml"
    one_node.write_text(yaml.safe_dump(published(base35, 8, 1)))
    same = runner.invoke(app, ["plan", str(one_node)])
    assert local.exit_code == 0 and "as on a cluster" not in local.output and "world size 8," in local.output
    assert local.output == same.output  # --nproc 8 of the 2-node spec is the 1-node spec's plan
    assert "world size 16," in cluster.output and cluster.output.splitlines()[:8] != local.output.splitlines()[:8]
    bad = runner.invoke(app, ["plan", str(two), "--nproc", "0"])
    assert bad.exit_code == 2 and "--nproc" in bad.output


def test_model_config_plans_the_cluster_example_without_its_weights(base35, tmp_path):
    """``pitlab plan --model-config``: the cluster example (its 35B folder exists only on the cluster's volume)
    planned from a copy of config.json alone, as a file of any name or a folder. Found that way: 79.8 GiB per GPU
    on 8 ranks, over an 80 GB H100's 79.18 GiB, which the example's comment offered."""
    runner = CliRunner()
    copy = tmp_path / "qwen35.json"
    copy.write_bytes((base35 / "config.json").read_bytes())
    plain = runner.invoke(app, ["plan", "examples/pittraining.yaml"])
    assert plain.exit_code == 2 and "no config.json to plan from" in plain.output
    for given in (copy, base35):
        res = runner.invoke(app, ["plan", "examples/pittraining.yaml", "--model-config", str(given)])
        assert res.exit_code == 0, res.output
        assert "model: qwen3_5_moe_text, 34.7 B parameters (3.45 B active), world size 8" in res.output
        assert "predicted peak             79.82     85.71" in res.output and "fits: 79.8 GiB of 139.0 GiB" in res.output
        assert "this machine has no CUDA GPU" not in res.output  # the run planned is not one on this machine
    h100 = runner.invoke(app, ["plan", "examples/pittraining.yaml", "--model-config", str(copy),
                               "--gpu-memory-gib", "79.18"])
    assert h100.exit_code == 3 and ("predicted peak 79.8 GiB per GPU exceeds --gpu-memory-gib = 79.2 GiB; to fit, "
                                    "more GPUs (") in h100.output
    # 80, the H100's label, passes the 79.8 GiB plan: said to be the label, not what torch can use
    label = runner.invoke(app, ["plan", "examples/pittraining.yaml", "--model-config", str(copy),
                                "--gpu-memory-gib", "80"])
    assert label.exit_code == 0 and ("warning: 80 is the GB on the card's label; torch can use 79.18 GiB of an H100 "
                                     "80GB, less than the predicted peak: plan with that") in label.output, label.output
    (tmp_path / "bogus.json").write_text('{"model_type": "bogus"}')
    (tmp_path / "list.json").write_text('[1, 2]')
    for path, message in ((tmp_path / "nowhere.json", "nowhere.json: no such file"),
                          (tmp_path, "a folder without config.json"),
                          (tmp_path / "list.json", 'not a transformers config.json (no "model_type")'),
                          (tmp_path / "bogus.json", "has model type `bogus` but Transformers does not recognize")):
        res = runner.invoke(app, ["plan", "examples/pittraining.yaml", "--model-config", str(path)])
        assert res.exit_code == 2 and "--model-config" in res.output and message in res.output, res.output
