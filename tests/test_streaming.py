"""pitlab.trainer.streaming: layer streaming is bit-exact (logits, LoRA gradients, adapter save) against the resident
model on the three architectures, and the chunked loss head matches the full cross-entropy. The CPU path is the
same code as on CUDA (the "device" is the CPU, the copies plain copies)."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from pitlab.trainer.lora import apply_lora
from pitlab.trainer.prepare import build_config
from pitlab.trainer.streaming import (LayerStreamer, chunked_cross_entropy, layer_layout, logits_chunk_tokens,
                                      streamed_loss)
from tiny_models import QWEN35_TINY

VOCAB = 256
# four decoder layers each, so that two slots are reused twice per pass
CONFIGS = {
    "llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128),
    "qwen3_moe": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                      num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=128),
    "qwen3_5_moe_text": dict(QWEN35_TINY, num_hidden_layers=4, layer_types=["linear_attention", "full_attention"] * 2),
}
TARGETS = ["q_proj", "v_proj", "o_proj", "out_proj", "down_proj"]  # the linear layers of any of CONFIGS' models


def targets_in(model: torch.nn.Module) -> list[str]:
    """The entries of TARGETS that name a linear layer of ``model`` (llama has no ``out_proj``, qwen3_moe's experts
    no ``down_proj`` layer): pitlab refuses a target that names nothing."""
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    return [t for t in TARGETS if t in names]


def targets_of(base) -> list[str]:
    """:func:`targets_in` of the model saved in the folder ``base``, built on the meta device."""
    from transformers import AutoConfig

    with torch.device("meta"):
        return targets_in(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base)))
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # CUDA: pinned store, side-stream copies
# on CUDA the comparison needs deterministic kernels (atomics in flash-attention's backward and in index_add_ make
# even two resident runs differ): deterministic algorithms, cuBLAS's fixed workspace, eager attention
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture
def deterministic(request):
    if getattr(request, "param", "cpu") != "cuda":
        yield
        return
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def lora_model(model_type: str, bf16: bool = True, eager: bool = False) -> torch.nn.Module:
    """A tiny LoRA model built as the trainer builds it (float32, peft, frozen base in bf16), with every
    adapter tensor non-zero (lora_B starts at zero); ``eager`` attention for deterministic CUDA runs."""
    config = build_config(model_type, CONFIGS[model_type], vocab_size=VOCAB)
    config.use_cache = False
    if eager:
        config._attn_implementation = "eager"
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = apply_lora(base, r=4, alpha=8, dropout=0.0, target_modules=targets_in(base))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.1)
            elif bf16:
                p.data = p.data.to(torch.bfloat16)
    return model


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (2, 24), generator=g), torch.randint(0, VOCAB, (2, 24), generator=g)


@pytest.mark.parametrize("device, deterministic", [pytest.param(d, d, id=d) for d in DEVICES],
                         indirect=["deterministic"])
@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_streamed_logits_and_lora_gradients_equal_the_resident_model(model_type, device, deterministic, tmp_path):
    resident = lora_model(model_type, eager=device == "cuda")
    streamed = copy.deepcopy(resident)
    resident.to(device)
    streamer = LayerStreamer(streamed, device, buffers=2)
    assert streamer.pinned is (device == "cuda")
    resident.train()
    streamed.train()
    ids, labels = (t.to(device) for t in batch())
    # a training forward (each decoder layer checkpointed) gives the resident model's logits bit for bit
    assert torch.equal(streamed(input_ids=ids).logits, resident(input_ids=ids).logits)
    assert streamer.copies == 4  # every layer once
    loss_r = streamed_loss(resident, ids, labels)
    loss_s = streamed_loss(streamed, ids, labels)
    assert torch.equal(loss_s, loss_r)
    loss_r.backward()
    loss_s.backward()
    # forward again: 4 copies; backward: layers 3 and 2 are still in the slots, 1 and 0 are fetched again
    assert streamer.copies == 4 + 4 + 2
    grads_r = {n: p.grad for n, p in resident.named_parameters() if p.requires_grad}
    grads_s = {n: p.grad for n, p in streamed.named_parameters() if p.requires_grad}
    assert grads_s.keys() == grads_r.keys() and len(grads_r) >= 8
    assert all(g is not None and g.abs().sum() > 0 for g in grads_r.values())
    differ = [n for n in grads_r if not torch.equal(grads_s[n], grads_r[n])]
    assert differ == []
    for model in (resident, streamed):  # one AdamW step: the same adapter afterwards
        torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2).step()
    after_r = {n: p for n, p in resident.named_parameters() if p.requires_grad}
    assert all(torch.equal(p, after_r[n]) for n, p in streamed.named_parameters() if p.requires_grad)
    # the verified save sees the same adapter through the streamed model: byte-identical files
    from pitlab.trainer.lora import ADAPTER_FILE, save_adapter_verified

    saved = [save_adapter_verified(m, tmp_path / name) for name, m in (("r", resident), ("s", streamed))]
    assert saved[0]["tensors"] == saved[1]["tensors"] == len(grads_r)
    assert (tmp_path / "r" / ADAPTER_FILE).read_bytes() == (tmp_path / "s" / ADAPTER_FILE).read_bytes()
    # names and values are the unwrapped model's: every frozen parameter still holds its own value
    sd_r, sd_s = resident.state_dict(), streamed.state_dict()
    assert list(sd_s) == list(sd_r) and all(torch.equal(sd_s[k].to(device), sd_r[k]) for k in sd_r)
    assert [n for n, _ in streamed.named_parameters()] == [n for n, _ in resident.named_parameters()]


def test_three_slots_and_an_evaluation_forward():
    resident = lora_model("llama").eval()
    streamed = copy.deepcopy(resident)
    streamer = LayerStreamer(streamed, "cpu", buffers=3)
    ids, _ = batch(2)
    with torch.no_grad():
        want = resident(input_ids=ids).logits
        assert torch.equal(streamed.eval()(input_ids=ids).logits, want)
        assert torch.equal(streamed(input_ids=ids).logits, want)  # slots reused across calls
    # slot = layer % 3: the first pass copies 0, 1, 2, then 3 into slot 0; the second finds 1 and 2 in their
    # slots and copies only 0 and 3 (each evicting the other)
    assert streamer.copies == 4 + 2
    assert streamer.embedding is not None and streamer.report()["host_embedding"] is True
    with pytest.raises(RuntimeError, match=r"needs model\.train\(\)"):
        streamed(input_ids=ids)  # eval mode with gradients: the layers would not be recomputed in backward


def test_a_tied_embedding_stays_on_the_device():
    """With tie_word_embeddings the input embedding is the head's weight: it stays resident, not in the host
    store, and the result is still the resident model's."""
    config = build_config("llama", dict(CONFIGS["llama"], tie_word_embeddings=True), vocab_size=VOCAB)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config)
    resident = apply_lora(base, r=4, alpha=8, dropout=0.0, target_modules=targets_in(base)).train()
    streamed = copy.deepcopy(resident)
    streamer = LayerStreamer(streamed, "cpu")
    assert streamer.embedding is None and streamer.report()["host_embedding"] is False
    ids, _ = batch(5)
    assert torch.equal(streamed(input_ids=ids).logits, resident(input_ids=ids).logits)


def test_layout_aligns_every_parameter_to_512_bytes():
    model = lora_model("qwen3_5_moe_text")
    layout = layer_layout(model.get_base_model().model.layers[0])
    assert all(off * 2 % 512 == 0 for _, dtype, off, _ in layout.entries if dtype == torch.bfloat16)
    frozen = [p for p in model.get_base_model().model.layers[0].parameters() if not p.requires_grad]
    assert len(layout.entries) == len(frozen)
    assert sum(s.numel() for *_, s in layout.entries) == sum(p.numel() for p in frozen)
    with pytest.raises(ValueError, match=r"training\.layerStreaming\.buffers: must be 2\.\.8 \(got 1\)"):
        LayerStreamer(model, "cpu", buffers=1)


def test_chunked_cross_entropy_matches_the_full_cross_entropy():
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 100, bias=False)
    hidden = torch.randn(2, 11, 32, requires_grad=True)
    labels = torch.randint(0, 100, (2, 11))
    full = torch.nn.functional.cross_entropy(head(hidden).flatten(0, 1).float(), labels.flatten())
    full.backward()
    g_full, gw_full = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    chunked = chunked_cross_entropy(hidden, head, labels, chunk_tokens=5)  # 22 tokens: 5 + 5 + 5 + 5 + 2
    chunked.backward()
    assert abs(chunked.item() - full.item()) < 1e-6 * full.item()
    assert torch.allclose(hidden.grad, g_full, rtol=0, atol=1e-7)
    assert torch.allclose(head.weight.grad, gw_full, rtol=0, atol=1e-7)
    # chunk sizes: the largest power of two with chunk x vocab x (c + 12) <= 256 MiB
    assert logits_chunk_tokens(128_256, 2, 2048) == 128  # Llama-3 vocabulary, bf16: 128 x 128256 x 14 = 230 MB
    assert logits_chunk_tokens(248_320, 2, 4096) == 64
    assert logits_chunk_tokens(256, 4, 48) == 48  # never more than the tokens


def test_adapter_round_trip_and_a_plain_peft_model_reproduces_the_streamed_logits(tmp_path):
    """Through the trainer's loader: one AdamW step on the streamed model, the verified adapter save, then an
    ordinary peft model (from_pretrained + PeftModel.from_pretrained) gives the streamed logits bit for bit."""
    from peft import PeftModel
    from safetensors import safe_open

    from pitlab.api import PitTraining
    from pitlab.trainer.lora import ADAPTER_FILE, save_adapter_verified
    from pitlab.trainer.streaming import load_streamed_model

    config = build_config("llama", CONFIGS["llama"], vocab_size=VOCAB)
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "base")
    spec = PitTraining.model_validate(streaming_doc(tmp_path / "base")).spec
    model, streamer = load_streamed_model(tmp_path / "base", spec, torch.device("cpu"))
    assert streamer.report()["layers"] == 4 and streamer.embedding is not None
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids, labels = batch(4)
    streamed_loss(model, ids, labels).backward()
    opt.step()
    report = save_adapter_verified(model, tmp_path / "adapter")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert report["tensors"] == len(trainable) == 4 * 4 * 2  # 4 layers x (q, v, o, down_proj) x (lora_A, lora_B)
    with safe_open(str(tmp_path / "adapter" / ADAPTER_FILE), framework="pt") as f:
        assert len(list(f.keys())) == len(trainable)
    model.eval()
    with torch.no_grad():
        got = model(input_ids=ids).logits
    plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.bfloat16),
                                      tmp_path / "adapter").eval()
    with torch.no_grad():
        want = plain(input_ids=ids).logits
    assert torch.equal(got, want)
    with torch.no_grad():  # the trained adapter matters: the base alone gives other logits
        base = AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.bfloat16)
        base_logits = base(input_ids=ids).logits
    assert not torch.equal(got.to(base_logits.dtype), base_logits)
    assert {n for n, p in plain.named_parameters() if "lora_" in n} == trainable


def streaming_doc(base, **streaming) -> dict:
    return {"apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "metadata": {"name": "stream"},
            "spec": {"baseModel": {"uri": str(base)}, "corpus": {"uri": "news.jsonl", "format": "jsonl"},
                     "knowledgeCutoff": "2020-12-31", "tokens": 10 ** 6, "method": "lora",
                     "lora": {"r": 4, "alpha": 8, "targetModules": targets_of(base)},
                     "training": {"seqLen": 24, "microBatchSize": 2, "precision": "bf16",
                                  "layerStreaming": {"enabled": True, **streaming}},
                     "resources": {"nodes": 1, "gpusPerNode": 1}}}
