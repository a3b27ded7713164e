"""pitlab.trainer.lora: verified LoRA adapter saves (round trip, the 0-tensor wrapper bug fails loudly) and LoRA
training under torchrun (gloo, world size 2): frozen base, adapter checkpoints, resume, merge into the base."""

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
    linear = "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"
    with pytest.raises(ValueError, match=rf"spec\.lora\.targetModules: 'qkv' names no module of LlamaForCausalLM "
                                         rf"\(targetModules \['qkv'\]\); its linear layers are named {linear}$"):
        apply_lora(base, r=2, alpha=4, dropout=0.0, target_modules=["qkv"])
    # one misspelt entry among good ones: peft alone would adapt q_proj and say nothing
    with pytest.raises(ValueError, match=r"'qkv_proj' names no module of LlamaForCausalLM \(targetModules \['q_proj', "
                                         r"'qkv_proj'\]\)"):
        apply_lora(base, r=2, alpha=4, dropout=0.0, target_modules=["q_proj", "qkv_proj"])
    with pytest.raises(ValueError, match=r"'mlp' names LlamaMLP, not a linear layer of LlamaForCausalLM"):
        apply_lora(base, r=2, alpha=4, dropout=0.0, target_modules=["mlp"])
    model = apply_lora(base, r=2, alpha=4, dropout=0.0, target_modules=["self_attn.q_proj", "v_proj"])  # peft's suffixes
    assert sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in model.named_parameters()
                   if p.requires_grad}) == ["q_proj", "v_proj"]


def test_a_local_base_models_targets_are_checked_before_anything_runs(tmp_path):
    """The preflight reads a local base model's config.json and checks the targets on the meta device."""
    from pitlab.api import SpecError
    from pitlab.local import _local_base_config
    from pitlab.trainer.prepare import check_lora_targets

    LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(tmp_path / "base")
    config = _local_base_config(str(tmp_path / "base"))
    assert config.model_type == "llama" and config.hidden_size == 32
    check_lora_targets(config, ["q_proj", "v_proj"])  # no error, and nothing allocated: the meta device
    with pytest.raises(SpecError, match=r"'qkv_proj' names no module of LlamaForCausalLM"):
        check_lora_targets(config, ["qkv_proj"])
    assert _local_base_config("s3://bucket/base") is None and _local_base_config(str(tmp_path / "no-such")) is None


# ----------------------------------------------------------------- LoRA under torchrun (gloo, world size 2)

LORA_TARGETS = ["q_proj", "v_proj", "o_proj", "out_proj", "down_proj", "lm_head"]
# r = 8 × (in + out) per target of the tiny qwen3_5_moe_text: layer 0 (linear attention) out_proj 64→64 and
# the shared expert's down_proj 64→64; layer 1 q 64→128, v 64→32, o 64→64, down_proj 64→64; the root's
# lm_head 64→1024 (so both a decoder layer's and the root's FSDP2 group mix frozen and trainable parameters)
ADAPTER_PARAMS = 8 * ((64 + 64) + (64 + 64) + (64 + 128) + (64 + 32) + (64 + 64) + (64 + 64) + (64 + 1024))


def lora_spec(tokens: int = 12 * 1024, merge_into_base: bool = True, **checkpoint):
    from test_trainer import make_spec

    from pitlab.api import PitTraining

    doc = make_spec(learningRate=1e-2, warmupSteps=2).model_dump(mode="json", by_alias=True)
    doc["spec"].update(method="lora", tokens=tokens,
                       lora={"r": 8, "alpha": 32, "targetModules": LORA_TARGETS, "mergeIntoBase": merge_into_base})
    doc["spec"]["checkpoint"] = {"everySteps": 4, "keep": 3, **checkpoint}
    return PitTraining.model_validate(doc)


@pytest.fixture(scope="module")
def lora_trained(tmp_path_factory):
    """A LoRA run of the tiny qwen3_5_moe_text on FOMC statements up to 2005: 12 steps, world size 2, gloo."""
    from test_trainer import fomc_texts
    from transformers import AutoTokenizer

    from pitlab.trainer.launch import run_training, write_spec
    from pitlab.trainer.prepare import prepare_base_model, tokenize_corpus

    run = tmp_path_factory.mktemp("lora-run")
    texts = fomc_texts()
    resource = lora_spec()
    base = prepare_base_model(resource.spec, texts, run / "base")
    tokenize_corpus(texts, AutoTokenizer.from_pretrained(base), run / "data" / "tokens.npy")
    spec_path = write_spec(resource, run / "spec.json")
    summary = run_training(spec_path, run, nproc=2)
    return {"run": run, "base": base, "summary": summary, "spec_path": spec_path}


@pytest.mark.slow
def test_lora_training_learns_only_the_adapter(lora_trained):
    import json
    import math

    from reference import parameter_sha256
    from pitlab.trainer.lora import base_parameter_name
    from pitlab.trainer.merge import checkpoint_tensors

    s, run = lora_trained["summary"], lora_trained["run"]
    assert s["method"] == "lora" and s["steps"] == 12 and s["world_size"] == 2 and s["backend"] == "gloo"
    assert s["trainable_parameters"] == ADAPTER_PARAMS == 15_104
    assert abs(s["first_loss"] - math.log(1024)) < 0.3  # lora_B = 0: the first step is the base model's loss
    assert s["final_loss"] < s["first_loss"] - 1.0, (s["first_loss"], s["final_loss"])  # 6.94 -> 5.61 here
    losses = [json.loads(x)["loss"] for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 12 and losses[-1] == s["final_loss"]
    # the frozen base, gathered from the FSDP2 shards at the end, is bit-identical to the base folder
    base = parameter_sha256(AutoModelForCausalLM.from_pretrained(lora_trained["base"]))
    digests = s["param_sha256"]
    frozen = {base_parameter_name(n): d for n, d in digests.items() if "lora_" not in n}
    assert frozen == base and len(base) == 36
    adapter = {n: d for n, d in digests.items() if "lora_" in n}
    assert len(adapter) == 14  # 7 targeted modules x (lora_A, lora_B)
    # checkpoints hold the adapter only (the base is reloaded from base/), and record the LoRA settings
    ckpt = run / "checkpoint" / "step-12"
    assert sorted(checkpoint_tensors(ckpt)) == sorted(adapter)
    state = json.loads((ckpt / "train_state.json").read_text())
    assert state["lora"] == {"r": 8, "alpha": 32, "dropout": 0.0, "target_modules": LORA_TARGETS,
                             "merge_into_base": True}
    assert sorted(p.name for p in (run / "checkpoint").iterdir()) == ["latest", "step-12", "step-4", "step-8"]
    assert s["planned_peak_bytes"] > 0


@pytest.mark.slow
def test_lora_adapter_save_is_verified_and_matches_the_checkpoint(lora_trained):
    from peft import PeftModel

    from pitlab.trainer.digest import tensor_sha256
    from pitlab.trainer.merge import checkpoint_tensors, load_tensors

    s, run = lora_trained["summary"], lora_trained["run"]
    assert s["adapter"]["tensors"] == 14 and s["adapter"]["elements"] == ADAPTER_PARAMS
    with safe_open(str(run / "adapter" / ADAPTER_FILE), framework="pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys()}
    assert len(saved) == 14 and sum(t.numel() for t in saved.values()) == 15_104
    ckpt = run / "checkpoint" / "step-12"
    meta = checkpoint_tensors(ckpt)
    live = load_tensors(ckpt, sorted(meta), meta)
    for name, t in live.items():  # peft's file names drop the adapter name ("default")
        assert torch.equal(saved[name.replace(".default.", ".")], t), name
        assert tensor_sha256(t) == s["param_sha256"][name]
    assert all(t.abs().sum() > 0 for n, t in live.items() if "lora_B" in n)  # lora_B moved away from 0
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(lora_trained["base"]), run / "adapter")
    got = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert got.keys() == live.keys() and all(torch.equal(got[n], live[n]) for n in got)


@pytest.mark.slow
def test_lora_merge_into_base_matches_the_peft_model(lora_trained, tmp_path):
    from peft import PeftModel

    from pitlab.trainer.merge import merge_checkpoint, probe_logits

    run, base = lora_trained["run"], lora_trained["base"]
    out = tmp_path / "merged"
    report = merge_checkpoint(run / "checkpoint", base, out, lora_trained["summary"]["param_sha256"],
                              max_shard_size="40KB")
    assert report["kind"] == "lora-merged" and report["merged_weights"] == 7 and report["shards"] >= 3
    assert report["tensors"] == 56 and report["verified"] and report["logits_probe"] == "skipped"
    merged = AutoModelForCausalLM.from_pretrained(out)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), run / "adapter").eval()
    want, got = probe_logits(peft_model), probe_logits(merged)
    diff = (got - want).abs().max().item()
    # tolerance: the same float32 maths in another order (x(W + BA s) vs xW + (xA)B s); logits are O(1)
    assert diff < 1e-4, diff
    assert not torch.equal(probe_logits(AutoModelForCausalLM.from_pretrained(base)), got)  # the adapter matters
    with safe_open(str(base / "model.safetensors"), framework="pt") as f:
        base_tensors = {k: f.get_tensor(k) for k in f.keys()}
    merged_sd = merged.state_dict()
    changed = sorted(k for k in base_tensors if k in merged_sd and not torch.equal(merged_sd[k], base_tensors[k]))
    assert changed == sorted([f"model.layers.{n}.weight" for n in [
        "0.linear_attn.out_proj", "0.mlp.shared_expert.down_proj", "1.self_attn.q_proj", "1.self_attn.v_proj",
        "1.self_attn.o_proj", "1.mlp.shared_expert.down_proj"]] + ["lm_head.weight"])
    # with the probe on (small model): the merge itself checks base + adapter against the merged logits
    report = merge_checkpoint(run / "checkpoint", base, tmp_path / "probed", logits_probe="always")
    assert report["logits_probe"] in ("close", "equal") and report["logits_probe_max_abs_diff"] < 1e-4


@pytest.mark.slow
def test_lora_merge_can_write_the_adapter_only(lora_trained, tmp_path):
    import json

    from pitlab.trainer.merge import merge_checkpoint

    run, base = lora_trained["run"], lora_trained["base"]
    out = tmp_path / "adapter-out"
    report = merge_checkpoint(run / "checkpoint", base, out, merge_adapter=False, logits_probe="always")
    assert report["kind"] == "lora-adapter" and report["tensors"] == 14 and report["logits_probe"] == "equal"
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base.resolve()) and config["r"] == 8
    assert (out / ADAPTER_FILE).read_bytes() == (run / "adapter" / ADAPTER_FILE).read_bytes()
    assert (out / "tokenizer.json").is_file() and not (out / "model.safetensors").exists()


@pytest.mark.slow
def test_lora_run_resumes_from_a_checkpoint_bit_identically(lora_trained, tmp_path):
    import shutil

    from pitlab.trainer.launch import run_training

    run = tmp_path / "resumed"
    shutil.copytree(lora_trained["run"] / "data", run / "data")
    shutil.copytree(lora_trained["run"] / "checkpoint" / "step-8", run / "checkpoint" / "step-8")
    (run / "checkpoint" / "latest").write_text("step-8\n")
    summary = run_training(lora_trained["spec_path"], run, nproc=2, base=lora_trained["base"])
    assert summary["resumed_from_step"] == 8 and summary["steps"] == 12
    assert summary["param_sha256"] == lora_trained["summary"]["param_sha256"]
    assert summary["final_loss"] == lora_trained["summary"]["final_loss"]


@pytest.mark.slow
def test_summary_records_the_software_stack(lora_trained):
    from importlib.metadata import version

    sw = lora_trained["summary"]["software"]
    assert sw["torch"] == torch.__version__ == "2.13.0+cpu"
    assert sw["transformers"] == version("transformers") and sw["peft"] == version("peft")
    assert sw["safetensors"] == version("safetensors") and sw["cuda"] is None
    assert sw["device_name"] == lora_trained["summary"]["device_name"] == "cpu"
    assert sw["world_size"] == lora_trained["summary"]["world_size"] == 2 and sw["backend"] == "gloo"


def test_lora_spec_defaults_and_the_adapter_only_merge_needs_no_model_evaluation():
    import copy

    import yaml

    from pitlab.api import SpecError, parse_resource

    with open("examples/local-lora-fomc.yaml") as f:
        doc = yaml.safe_load(f)
    res = parse_resource(copy.deepcopy(doc))
    assert res.spec.method == "lora" and res.spec.lora.merge_into_base is True and res.spec.lora.r == 8
    bare = copy.deepcopy(doc)
    del bare["spec"]["lora"]
    lora = parse_resource(bare).spec.lora  # method: lora alone gets the defaults, written out
    assert (lora.r, lora.alpha, lora.target_modules, lora.merge_into_base) == (
        16, 32, ["q_proj", "k_proj", "v_proj", "o_proj"], True)
    doc["spec"]["lora"]["mergeIntoBase"] = False
    with pytest.raises(SpecError, match=r"lora\.mergeIntoBase: false writes an adapter folder.*"
                                        r"evaluations\[0\]\.spec\.models\[1\] evaluates the trained model"):
        parse_resource(copy.deepcopy(doc))
    doc["spec"]["evaluations"][0]["spec"]["models"].pop(1)  # base and MiniLM only: fine
    assert parse_resource(doc).spec.lora.merge_into_base is False


# ------------------------------------------------------------------------ the save verified against the base
def _base_dir(tmp_path, seed: int = 0):
    """lora_model(seed)'s base weights saved as a Hugging Face folder (what training started from)."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_config(lora_model(seed).get_base_model().config)
    base.save_pretrained(tmp_path / "base")
    return tmp_path / "base"


class Inner(nn.Module):
    """Renames the modules below it with an extra ``.inner`` level (forward unchanged)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def test_the_save_loads_onto_the_plain_base_with_the_trained_logits(tmp_path):
    model = lora_model()
    report = save_adapter_verified(model, tmp_path / "adapter", base_dir=_base_dir(tmp_path))
    assert report["base_check"] == "probe logits equal" and report["tensors"] == 8


def test_a_wrapper_renaming_modules_inside_peft_is_refused(tmp_path):
    """The issue's case: an extra ``.inner`` level under peft. The live names and counts agree with the file (the
    old check passed it), but on the plain base model the tensors load onto nothing."""
    model = lora_model()
    model.base_model.model.model = Inner(model.base_model.model.model)
    assert save_adapter_verified(model, tmp_path / "unchecked")["base_check"] == "skipped"  # names + counts: fine
    with pytest.raises(AdapterSaveError, match=r"8 of the 8 saved adapter tensors load onto nothing of the base "
                                               r"model .*'base_model.model.model.inner.layers.0.self_attn.q_proj.lora_A"
                                               r".weight'.* and 8 of its 8 adapter tensors would keep their initial "
                                               r"values"):
        save_adapter_verified(model, tmp_path / "adapter", base_dir=_base_dir(tmp_path))
    assert not (tmp_path / "adapter").exists() and not (tmp_path / "adapter.tmp").exists()


def test_a_wrapper_renaming_modules_before_peft_is_refused(tmp_path):
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(lora_model().get_base_model().config)
    base.model = Inner(base.model)  # renamed before the adapter was applied
    model = apply_lora(base, r=4, alpha=8, dropout=0.0, target_modules=TARGETS)
    with pytest.raises(AdapterSaveError, match=r"load onto nothing of the base model"):
        save_adapter_verified(model, tmp_path / "adapter", base_dir=_base_dir(tmp_path))


def test_a_wrapper_outside_peft_whose_names_map_is_accepted(tmp_path):
    """``Outer(peft).inner.base_model...``: the prefix above the PeftModel is not part of peft's names, so the
    saved names are the plain base's and the probe logits are the trained model's."""
    model = lora_model()
    report = save_adapter_verified(Inner(model), tmp_path / "adapter", base_dir=_base_dir(tmp_path))
    assert report["base_check"] == "probe logits equal"


class SwappingWrapper(nn.Module):
    """A wrapper whose state dict puts layer 0's adapter values under layer 1's names and back: names and counts
    are right, the values sit on the wrong modules."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def state_dict(self, *args, **kwargs):
        sd = {f"inner.{k}": v for k, v in self.inner.state_dict().items()}
        swap = {k: k.replace("layers.0.", "layers.1.") if "layers.0." in k else k.replace("layers.1.", "layers.0.")
                for k in sd if "lora_" in k}
        return {k: sd[swap.get(k, k)] for k in sd}


def test_adapter_values_on_the_wrong_modules_are_refused_by_the_probe(tmp_path):
    model = lora_model()
    with pytest.raises(AdapterSaveError, match=r"probe logits of the base with the saved adapter differ from the "
                                               r"trained model's"):
        save_adapter_verified(SwappingWrapper(model), tmp_path / "adapter", base_dir=_base_dir(tmp_path))
