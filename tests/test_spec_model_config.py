"""A model config that training would refuse or fail on is refused at spec loading (and by ``pitlab validate``),
naming the field in the YAML and the values: the ``randomInit`` config of each architecture
(pitlab.api.model_config) and ``max_position_embeddings`` against ``spec.training.seqLen`` (also a local
``baseModel.uri``'s config.json, by ``pitlab validate``). Each refused config is shown to fail in transformers,
and each accepted edge case to train a step."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
import yaml
from transformers import CONFIG_MAPPING, AutoModelForCausalLM
from typer.testing import CliRunner

from pitlab.api import PitTraining, SpecError, parse_resource
from pitlab.api.model_config import DEFAULTS, config_max_positions
from pitlab.cli import app
from pitlab.trainer.prepare import build_config
from tiny_models import QWEN35_TINY, TINY_CONFIGS

EXAMPLE = "examples/local-sp500-fomc.yaml"
FIELD = "spec.baseModel.randomInit.config"
TINY = TINY_CONFIGS


@pytest.fixture(scope="module")
def example() -> dict:
    with open(EXAMPLE) as f:
        return yaml.safe_load(f)


def _doc(example: dict, model_type: str, config: dict, seq_len: int = 128) -> dict:
    doc = copy.deepcopy(example)
    doc["spec"]["baseModel"]["randomInit"] = {"modelType": model_type, "config": config, "seed": 0}
    doc["spec"]["training"]["seqLen"] = seq_len
    return doc


def _refusal(doc: dict) -> str:
    with pytest.raises(SpecError) as err:
        parse_resource(doc, "x.yaml")
    return str(err.value)


def _config(model_type: str, change: dict, drop: tuple = ()) -> dict:
    return {**{k: v for k, v in TINY[model_type].items() if k not in drop}, **change}


def _train_one_step(model_type: str, config: dict, seq: int = 16) -> None:
    """Build the config (as pitlab's prepare does), the model, and run a forward and backward pass as the trainer
    does (``use_cache`` off); raises whatever transformers or torch raises."""
    cfg = build_config(model_type, config, vocab_size=300)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    ids = torch.randint(0, 300, (2, seq))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()


# (id, model type, config changes, keys dropped from the tiny config, message after "x.yaml: ")
REFUSED = [
    ("moe-top-k-above-experts", "qwen3_moe", {"num_experts_per_tok": 5}, (),
     f"{FIELD}.num_experts_per_tok: 5 is more than num_experts 4: the router picks num_experts_per_tok of the "
     "num_experts experts for each token"),
    ("moe35-top-k-above-experts", "qwen3_5_moe_text", {"num_experts_per_tok": 5}, (),
     f"{FIELD}.num_experts_per_tok: 5 is more than num_experts 4: the router picks num_experts_per_tok of the "
     "num_experts experts for each token"),
    ("moe35-top-k-default-above-experts", "qwen3_5_moe_text", {}, ("num_experts_per_tok",),
     f"{FIELD}.num_experts_per_tok: not given: the qwen3_5_moe_text default 8 is more than num_experts 4: the "
     "router picks num_experts_per_tok of the num_experts experts for each token"),
    ("moe-top-k-default-above-experts", "qwen3_moe", {"num_experts": 6}, ("num_experts_per_tok",),
     f"{FIELD}.num_experts_per_tok: not given: the qwen3_moe default 8 is more than num_experts 6: the "
     "router picks num_experts_per_tok of the num_experts experts for each token"),
    ("moe35-no-experts", "qwen3_5_moe_text", {"num_experts": 0}, (),
     f"{FIELD}.num_experts: must be a positive integer (got 0)"),
    ("moe-negative-top-k", "qwen3_moe", {"num_experts_per_tok": -1}, (),
     f"{FIELD}.num_experts_per_tok: must be a positive integer (got -1)"),
    ("kv-heads-not-dividing", "llama", {"num_key_value_heads": 3}, (),
     f"{FIELD}.num_key_value_heads: 3 does not divide num_attention_heads 4: each key/value head serves an equal "
     "group of query heads"),
    ("kv-heads-above-heads", "qwen3_moe", {"num_key_value_heads": 8}, (),
     f"{FIELD}.num_key_value_heads: 8 does not divide num_attention_heads 4: each key/value head serves an equal "
     "group of query heads"),
    ("kv-heads-not-dividing-35", "qwen3_5_moe_text", {"num_key_value_heads": 3}, (),
     f"{FIELD}.num_key_value_heads: 3 does not divide num_attention_heads 4: each key/value head serves an equal "
     "group of query heads"),
    ("llama-hidden-not-multiple-of-heads", "llama", {"num_attention_heads": 3, "num_key_value_heads": 1,
                                                     "head_dim": 16}, (),
     f"{FIELD}.hidden_size: 64 is not a multiple of num_attention_heads 3 (the llama config refuses it, head_dim "
     "given or not)"),
    ("qwen3-moe-odd-derived-head-dim", "qwen3_moe", {"hidden_size": 60}, ("head_dim",),
     f"{FIELD}.hidden_size: 60 // num_attention_heads 4 gives head_dim 15 (head_dim not given), which rotary "
     "position embedding (RoPE) cannot use: it rotates pairs of dimensions; give an even head_dim or change "
     "hidden_size"),
    ("llama-odd-head-dim", "llama", {"head_dim": 15}, (),
     f"{FIELD}.head_dim: 15 is odd; rotary position embedding (RoPE) rotates pairs of dimensions: give an even "
     "head_dim"),
    ("hidden-zero", "llama", {"hidden_size": 0}, (), f"{FIELD}.hidden_size: must be a positive integer (got 0)"),
    ("hidden-negative", "llama", {"hidden_size": -64}, (),
     f"{FIELD}.hidden_size: must be a positive integer (got -64)"),
    ("hidden-string", "llama", {"hidden_size": "64"}, (),
     f"{FIELD}.hidden_size: must be a positive integer (got '64')"),
    ("heads-zero", "llama", {"num_attention_heads": 0}, (),
     f"{FIELD}.num_attention_heads: must be a positive integer (got 0)"),
    ("kv-heads-zero", "llama", {"num_key_value_heads": 0}, (),
     f"{FIELD}.num_key_value_heads: must be a positive integer (got 0)"),
    ("intermediate-negative", "llama", {"intermediate_size": -5}, (),
     f"{FIELD}.intermediate_size: must be a positive integer (got -5)"),
    ("head-dim-zero", "llama", {"head_dim": 0}, (), f"{FIELD}.head_dim: must be a positive integer (got 0)"),
    ("moe-intermediate-zero", "qwen3_moe", {"moe_intermediate_size": 0}, (),
     f"{FIELD}.moe_intermediate_size: must be a positive integer (got 0)"),
    ("sparse-step-zero", "qwen3_moe", {"decoder_sparse_step": 0}, (),
     f"{FIELD}.decoder_sparse_step: must be a positive integer (got 0)"),
    ("layer-types-too-few", "qwen3_5_moe_text", {"layer_types": ["full_attention"]}, (),
     f"{FIELD}.layer_types: 1 layer type(s) for num_hidden_layers 2; give one layer type per layer"),
    ("layer-types-default-layers", "qwen3_5_moe_text", {}, ("num_hidden_layers",),
     f"{FIELD}.layer_types: 2 layer type(s) for num_hidden_layers 40 (the qwen3_5_moe_text default); give one "
     "layer type per layer"),
    ("layer-type-unknown", "qwen3_5_moe_text", {"layer_types": ["sliding_attention", "full_attention"]}, (),
     f"{FIELD}.layer_types[0]: 'sliding_attention' is not a qwen3_5_moe_text layer type; expected "
     "linear_attention or full_attention"),
    ("linear-value-heads-not-multiple", "qwen3_5_moe_text", {"linear_num_value_heads": 3}, (),
     f"{FIELD}.linear_num_value_heads: 3 is not a multiple of linear_num_key_heads 2: each linear-attention key "
     "head serves an equal group of value heads"),
    ("linear-key-heads-above-value-heads", "qwen3_5_moe_text",
     {"linear_num_key_heads": 4, "linear_num_value_heads": 2}, (),
     f"{FIELD}.linear_num_value_heads: 2 is not a multiple of linear_num_key_heads 4: each linear-attention key "
     "head serves an equal group of value heads"),
    ("linear-key-head-dim-zero", "qwen3_5_moe_text", {"linear_key_head_dim": 0}, (),
     f"{FIELD}.linear_key_head_dim: must be a positive integer (got 0)"),
    ("conv-kernel-zero", "qwen3_5_moe_text", {"linear_conv_kernel_dim": 0}, (),
     f"{FIELD}.linear_conv_kernel_dim: must be a positive integer (got 0)"),
]
# Refused as nonsense although transformers trains them (use_cache off, as the trainer runs): layers or experts
# of width 0, no layer (-1 too), no expert per token, a context length that is not positive.
NONSENSE = {"layers-zero": ("llama", {"num_hidden_layers": 0}),
            "layers-negative": ("llama", {"num_hidden_layers": -1}),
            "intermediate-zero": ("llama", {"intermediate_size": 0}),
            "shared-expert-zero": ("qwen3_5_moe_text", {"shared_expert_intermediate_size": 0}),
            "top-k-zero": ("qwen3_moe", {"num_experts_per_tok": 0}),
            "positions-zero": ("llama", {"max_position_embeddings": 0})}


@pytest.mark.parametrize("model_type,change,drop,message", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_at_loading_with_field_and_values(example, model_type, change, drop, message):
    assert _refusal(_doc(example, model_type, _config(model_type, change, drop))) == f"x.yaml: {message}"


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("model_type,change,drop", [c[1:4] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_configs_fail_in_transformers(model_type, change, drop):
    """What loading refuses, transformers refuses when the config or the model is built, or the first training
    step fails (the failure the check moves to validation)."""
    try:
        _train_one_step(model_type, _config(model_type, change, drop))
    except SpecError as err:  # build_config: the config class rejected the values, not a key this test misspelt
        assert "config key" not in str(err) and "set from the trained tokenizer" not in str(err), err
    except Exception:  # noqa: BLE001 - StrictDataclass errors, ZeroDivisionError, RuntimeError, ...
        pass
    else:
        pytest.fail("transformers built and trained this config")


@pytest.mark.parametrize("model_type,change", NONSENSE.values(), ids=NONSENSE)
def test_nonsense_sizes_refused(example, model_type, change):
    key, value = next(iter(change.items()))
    assert _refusal(_doc(example, model_type, _config(model_type, change))) == \
        f"x.yaml: {FIELD}.{key}: must be a positive integer (got {value})"


ACCEPTED = {
    "tiny-qwen35": ("qwen3_5_moe_text", {}, ()),
    "tiny-qwen3-moe": ("qwen3_moe", {}, ()),
    "tiny-llama": ("llama", {}, ()),
    "qwen3-moe-dense": ("qwen3_moe", {"num_experts": 0}, ()),  # no router: dense MLP layers
    "qwen3-moe-top-k-equal-experts": ("qwen3_moe", {"num_experts": 2}, ()),
    "qwen3-moe-derived-even-head-dim": ("qwen3_moe", {"num_attention_heads": 6, "num_key_value_heads": 3},
                                        ("head_dim",)),  # 64 // 6 = 10: o_proj maps 60 back to 64
    "qwen35-odd-head-dim": ("qwen3_5_moe_text", {"head_dim": 15}, ()),  # partial rotary embedding
    "qwen35-heads-not-dividing-hidden": ("qwen3_5_moe_text", {"hidden_size": 60, "num_attention_heads": 3,
                                                              "num_key_value_heads": 1}, ()),
    "qwen35-all-linear": ("qwen3_5_moe_text", {"layer_types": ["linear_attention", "linear_attention"]}, ()),
    "qwen35-layer-types-derived": ("qwen3_5_moe_text", {"num_hidden_layers": 4}, ("layer_types",)),
    "llama-kv-heads-null": ("llama", {"num_key_value_heads": None, "head_dim": None}, ()),
    "llama-kv-heads-equal": ("llama", {"num_key_value_heads": 4}, ()),
    "llama-head-dim-not-hidden-over-heads": ("llama", {"head_dim": 8}, ()),
}


@pytest.mark.parametrize("model_type,change,drop", ACCEPTED.values(), ids=ACCEPTED)
def test_valid_configs_load_and_train(example, model_type, change, drop):
    config = _config(model_type, change, drop)
    res = parse_resource(_doc(example, model_type, config), "x.yaml")
    assert res.spec.base_model.random_init.config == config
    _train_one_step(model_type, config)


@pytest.mark.parametrize("model_type", sorted(DEFAULTS))
def test_defaults_are_the_transformers_defaults(model_type):
    """The defaults the checks assume are those of the installed transformers' config classes (None: derived)."""
    cfg = CONFIG_MAPPING[model_type]()
    for key, value in DEFAULTS[model_type].items():
        if value is not None:
            assert getattr(cfg, key) == value, key
    if model_type == "llama":
        assert cfg.head_dim == cfg.hidden_size // cfg.num_attention_heads
        assert cfg.num_key_value_heads == cfg.num_attention_heads
    if model_type == "qwen3_moe":
        assert getattr(cfg, "head_dim", None) is None
    if model_type == "qwen3_5_moe_text":
        assert len(cfg.layer_types) == cfg.num_hidden_layers and cfg.layer_types[3] == "full_attention"


# ------------------------------------------------------------------------ max_position_embeddings vs seqLen
def test_random_init_positions_below_seq_len_refused(example):
    doc = _doc(example, "qwen3_5_moe_text", QWEN35_TINY, seq_len=1024)  # max_position_embeddings: 512
    assert _refusal(doc) == (
        f"x.yaml: {FIELD}.max_position_embeddings: 512 is smaller than spec.training.seqLen 1024: the model is made "
        "for sequences of at most 512 tokens and would be trained on 1024; set max_position_embeddings to 1024 or "
        "more, or spec.training.seqLen to 512 or less")


def test_random_init_default_positions_below_seq_len_refused(example):
    doc = _doc(example, "llama", {k: v for k, v in TINY["llama"].items() if k != "max_position_embeddings"},
               seq_len=4096)
    assert _refusal(doc) == (
        f"x.yaml: {FIELD}.max_position_embeddings: not given: the llama default 2048 is smaller than "
        "spec.training.seqLen 4096: the model is made for sequences of at most 2048 tokens and would be trained on "
        "4096; set max_position_embeddings to 4096 or more, or spec.training.seqLen to 2048 or less")


def test_random_init_positions_equal_to_seq_len_accepted(example):
    res = parse_resource(_doc(example, "qwen3_5_moe_text", QWEN35_TINY, seq_len=512))
    assert res.spec.training.seq_len == 512
    res = parse_resource(_doc(example, "llama", {"hidden_size": 64, "num_attention_heads": 4}, seq_len=2048))
    assert res.spec.training.seq_len == 2048  # the llama default, 2048 positions


def test_model_validate_refuses_too(example):
    """Python callers (PitTraining.model_validate, as the trainer's tests build specs) get the same refusal."""
    doc = _doc(example, "qwen3_moe", _config("qwen3_moe", {"num_experts_per_tok": 5}))
    with pytest.raises(ValueError, match=r"randomInit\n.*num_experts_per_tok: 5 is more than num_experts 4"):
        PitTraining.model_validate(doc)


def test_config_max_positions_reads_text_config():
    assert config_max_positions({"max_position_embeddings": 4096}) == 4096
    assert config_max_positions({"model_type": "qwen3_5_moe", "text_config": {"max_position_embeddings": 262144}}) \
        == 262144
    assert config_max_positions({"model_type": "x"}) is None


# ------------------------------------------------------------------------------------------ the CLI
def _invoke(tmp_path, doc, *args):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["validate", *args, str(path)], env={"COLUMNS": "400"})
    return r, re.sub(r"\s+", " ", r.output)


def test_validate_schema_only_refuses_random_init_config(tmp_path, example):
    doc = _doc(example, "qwen3_5_moe_text", _config("qwen3_5_moe_text", {"num_experts_per_tok": 6}))
    r, out = _invoke(tmp_path, doc, "--schema-only")
    assert r.exit_code == 2, out
    assert f"spec.yaml: {FIELD}.num_experts_per_tok: 6 is more than num_experts 4" in out
    r, out = _invoke(tmp_path, _doc(example, "qwen3_5_moe_text", QWEN35_TINY), "--schema-only")
    assert r.exit_code == 0, out


def _uri_spec(tmp_path, example, positions: int, seq_len: int) -> dict:
    """A PitTraining of a local model folder (a byte-level BPE tokenizer and a config.json of the multimodal
    Qwen3.5 layout, no weights: validate reads none) on a 12-document corpus of 783 tokens."""
    from pitlab.trainer.tokenizer import train_tokenizer

    texts = [f"statement {m} {'the committee decided ' * 20}" for m in range(1, 13)]
    model = tmp_path / "model"
    train_tokenizer(texts, 300, model)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe",
                                                   "text_config": {"max_position_embeddings": positions}}))
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("date,text\n" + "".join(f"2015-{m:02d}-05,{t}\n" for m, t in enumerate(texts, 1)))
    doc = copy.deepcopy(example)
    doc["spec"]["baseModel"] = {"uri": str(model)}
    doc["spec"]["corpus"] = {"uri": str(corpus), "format": "csv"}
    doc["spec"]["training"]["seqLen"] = seq_len
    doc["spec"]["output"]["uri"] = str(tmp_path / "out")
    doc["spec"]["evaluations"] = []
    return doc


def test_validate_warns_of_local_base_model_positions_below_seq_len(tmp_path, example):
    """A pretrained model trained past its context is a choice (context extension): a warning, not a refusal."""
    r, out = _invoke(tmp_path, _uri_spec(tmp_path, example, positions=256, seq_len=512))
    assert r.exit_code == 0, out
    assert ("warning: spec.baseModel.uri: its config.json gives max_position_embeddings 256, which is smaller than "
            "spec.training.seqLen 512: the model is made for sequences of at most 256 tokens and would be trained "
            "on 512; unless you mean to extend its context, set spec.training.seqLen to 256 or less") in " ".join(out.split())
    assert not (tmp_path / "out").exists()


def test_validate_accepts_local_base_model_with_room(tmp_path, example):
    r, out = _invoke(tmp_path, _uri_spec(tmp_path, example, positions=512, seq_len=512))
    assert r.exit_code == 0, out
    assert "valid PitTraining" in out and "max_position_embeddings" not in out


def test_qwen3_moe_dense_zero_experts_but_not_negative(example):
    """qwen3_moe with 0 experts builds dense MLP layers (accepted, trained above); a negative count is refused."""
    assert _refusal(_doc(example, "qwen3_moe", _config("qwen3_moe", {"num_experts": -1}))) == \
        f"x.yaml: {FIELD}.num_experts: must be an integer, 0 (dense MLP layers) or more (got -1)"


@pytest.mark.parametrize("change,message", [
    ({"initializer_range": float("nan")}, "initializer_range: must be a finite number (got nan)"),
    ({"rope_theta": float("inf")}, "rope_theta: must be a finite number (got inf)"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": float("-inf")}},
     "rope_parameters.rope_theta: must be a finite number (NaN or infinity given)"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps: must be a positive number (got -1.0): the epsilon added to the variance "
                             "of a normalisation layer"),
    ({"rms_norm_eps": 0}, "rms_norm_eps: must be a positive number (got 0): the epsilon added to the variance of a "
                          "normalisation layer"),
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps: must be a positive number (got '1e-6'): the epsilon added to the "
                               "variance of a normalisation layer"),
    ({"initializer_range": -0.5}, "initializer_range: must be a number of 0 or more (got -0.5): the standard "
                                  "deviation of the initial weights"),
])
@pytest.mark.parametrize("model_type", sorted(TINY))
def test_non_finite_and_non_positive_numbers_are_refused_at_loading(example, model_type, change, message):
    """Found in a trial: a NaN initializer_range and a negative rms_norm_eps passed validate; the first failed in
    prepare, the second trained to a NaN loss blamed on the learning rate; a quoted "1e-6" gave a traceback."""
    assert _refusal(_doc(example, model_type, _config(model_type, change))) == f"x.yaml: {FIELD}.{message}"


def test_preflight_refuses_what_the_config_class_or_the_modeling_code_refuses(tmp_path, example):
    """What needs transformers is refused by `validate` (exit 2, one line naming the key), not a traceback or a
    failed prepare stage: a value of the wrong type for the config class, an unknown activation."""
    for change, message in [
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings: TypeError: Field 'tie_word_embeddings' expected "
                                         "bool, got str (value: 'yes')"),
        ({"hidden_act": "gelu_foo"}, "hidden_act: 'gelu_foo' is not an activation transformers knows (e.g. silu, "
                                     "gelu, relu)"),
    ]:
        doc = _doc(example, "qwen3_5_moe_text", _config("qwen3_5_moe_text", change))
        doc["spec"]["output"]["uri"] = str(tmp_path / "out")
        r, out = _invoke(tmp_path, doc)
        assert r.exit_code == 2, out
        assert f"spec.yaml: {FIELD}.{message}" in out and "Traceback" not in out
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_a_model_its_modeling_code_cannot_build_is_refused_on_the_meta_device(model_type):
    """check_model_builds builds on the meta device: no weights are drawn, and a valid config passes."""
    from pitlab.trainer.prepare import build_config, check_model_builds

    config = build_config(model_type, TINY[model_type], vocab_size=300)
    check_model_builds(model_type, config)  # no error
    config.hidden_act = "gelu_foo"  # set after the config checks, as a stale config might hold it
    with pytest.raises(SpecError) as err:
        check_model_builds(model_type, config)
    assert str(err.value) == f"{FIELD}: {model_type} model cannot be built from this config: KeyError: 'gelu_foo'"


def test_run_warns_of_local_base_model_positions_below_seq_len_as_validate_does(tmp_path, example, monkeypatch):
    """validate ⇒ run: `pitlab run` prints the warning `validate` prints (before its stages; here the stages stop
    at once)."""
    def tripped(*a, **k):
        raise AssertionError("stopped after the preflight")

    monkeypatch.setattr("pitlab.pipeline.prepare.prepare_run", tripped)
    doc = _uri_spec(tmp_path, example, positions=256, seq_len=512)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["run", str(path)], env={"COLUMNS": "400"})
    out = re.sub(r"\s+", " ", r.output)
    assert "warning: spec.baseModel.uri: its config.json gives max_position_embeddings 256, which is smaller than " \
           "spec.training.seqLen 512" in out, out
    assert "stopped after the preflight" in out
