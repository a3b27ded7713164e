"""pitlab.trainer.lora: verified LoRA adapter saves (round trip, and the 0-tensor wrapper bug fails loudly)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig

from pitlab.trainer.lora import ADAPTER_FILE, AdapterSaveError, apply_lora, save_adapter_verified

TARGETS = ["q_proj", "v_proj"]


def lora_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64))
    model = apply_lora(base, r=4, alpha=8, dropout=0.0, target_modules=TARGETS)
    with torch.no_grad():  # lora_B starts at zero: give every adapter tensor distinct values
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(torch.randn_like(p))
    return model


class NameHidingWrapper(nn.Module):
    """A wrapper whose state dict flattens parameter names (as a sharding/streaming wrapper may)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def state_dict(self, *args, **kwargs):
        sd = self.inner.state_dict()
        return {f"inner.flat_{i}": v for i, v in enumerate(sd.values())}


def test_adapter_round_trip(tmp_path):
    from peft import PeftModel

    model = lora_model()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert len(trainable) == 2 * 2 * 2  # 2 layers x (q_proj, v_proj) x (lora_A, lora_B)
    report = save_adapter_verified(model, tmp_path / "adapter")
    assert report["tensors"] == 8 and report["elements"] == sum(p.numel() for p in trainable.values())
    assert not (tmp_path / "adapter.tmp").exists()
    with safe_open(str(tmp_path / "adapter" / ADAPTER_FILE), framework="pt") as f:
        assert len(list(f.keys())) == 8
    # peft reloads it onto a fresh base: every adapter tensor equal to the live one
    torch.manual_seed(0)  # the same base weights as lora_model(seed=0)
    fresh = AutoModelForCausalLM.from_config(model.get_base_model().config)
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter")
    got = {n: p for n, p in reloaded.named_parameters() if "lora_" in n}
    assert got.keys() == trainable.keys()
    assert all(torch.equal(got[n], trainable[n]) for n in got)
    ids = torch.arange(16).unsqueeze(0)
    model.eval()
    reloaded.eval()
    assert torch.equal(model(input_ids=ids).logits, reloaded(input_ids=ids).logits)


def test_a_wrapper_that_hides_names_makes_the_save_fail(tmp_path):
    model = lora_model()
    save_adapter_verified(model, tmp_path / "adapter")
    before = (tmp_path / "adapter" / ADAPTER_FILE).read_bytes()
    with pytest.raises(AdapterSaveError, match=r"has 0 tensors \(0 elements\) but the model has 8 trainable "
                                               r"tensors.*0-tensor"):
        save_adapter_verified(NameHidingWrapper(model), tmp_path / "adapter")
    assert (tmp_path / "adapter" / ADAPTER_FILE).read_bytes() == before  # the good save is untouched
    assert not (tmp_path / "adapter.tmp").exists()


def test_a_save_that_drops_or_changes_a_tensor_fails(tmp_path, monkeypatch):
    import safetensors.torch

    model = lora_model()
    real = safetensors.torch.save_file

    def drop_one(tensors, path, metadata=None):
        tensors = dict(tensors)
        tensors.pop(sorted(tensors)[0])
        real(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", drop_one)
    with pytest.raises(AdapterSaveError, match=r"reopened file has 7 tensors, expected 8; 1 missing"):
        save_adapter_verified(model, tmp_path / "adapter")

    def perturb(tensors, path, metadata=None):
        tensors = {k: v + (1e-3 if k == sorted(tensors)[-1] else 0) for k, v in tensors.items()}
        real(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", perturb)
    with pytest.raises(AdapterSaveError, match=r"1 differ"):
        save_adapter_verified(model, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists() and not (tmp_path / "adapter.tmp").exists()


def test_apply_lora_names_the_field_for_unknown_modules():
    base = AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                        num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(ValueError, match=r"spec\.lora\.targetModules: none of \['qkv'\]"):
        apply_lora(base, r=2, alpha=4, dropout=0.0, target_modules=["qkv"])
