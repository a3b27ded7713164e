"""Checks of a model config at spec loading: the ``randomInit`` config of the three supported architectures and
the context length against ``spec.training.seqLen``, without transformers (the operator's image has none).

They refuse what transformers 5 refuses only when the config or the model is built, or what fails in the first
forward pass (measured with its config classes and models: tests/test_spec_model_config.py), and sizes that are
clearly nonsense (a layer of width 0). Unknown keys, reserved keys and value types beyond the keys checked here are
refused by ``pitlab validate``'s preflight, which builds the config with transformers
(:func:`pitlab.trainer.prepare.build_config`).
"""

from __future__ import annotations

import math
from typing import Any

from pitlab.errors import FieldError

DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=None, head_dim=None, max_position_embeddings=2048),
    "qwen3_moe": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=24, num_attention_heads=32,
                      num_key_value_heads=4, head_dim=None, max_position_embeddings=32768, decoder_sparse_step=1,
                      moe_intermediate_size=768, num_experts_per_tok=8, num_experts=128),
    "qwen3_5_moe_text": dict(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
                             head_dim=256, max_position_embeddings=32768, linear_conv_kernel_dim=4,
                             linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                             linear_num_value_heads=32, moe_intermediate_size=512,
                             shared_expert_intermediate_size=512, num_experts_per_tok=8, num_experts=256,
                             layer_types=None),
}
"""transformers 5's defaults of the checked keys per ``modelType``; None: derived from other keys (``head_dim``:
``hidden_size // num_attention_heads``; llama's ``num_key_value_heads``: ``num_attention_heads``; qwen3_5_moe_text's
``layer_types``: every 4th layer full attention). tests/test_spec_model_config.py compares them with the config
classes."""

_NULLABLE = {"llama": {"num_key_value_heads", "head_dim"}, "qwen3_moe": {"head_dim"}, "qwen3_5_moe_text": set()}
_LAYER_TYPES = ("linear_attention", "full_attention")  # what a qwen3_5_moe_text decoder layer can be
_MAY_BE_ZERO = {"qwen3_moe": {"num_experts"}}  # 0 experts: dense MLP layers (qwen3_5_moe_text needs 1 or more)


class _Config:
    """A ``randomInit.config`` read with its architecture's defaults: ``value(key)``, and ``describe(key)`` and
    ``own(key)`` (the value, and whether it is a default, as a message names it)."""

    def __init__(self, model_type: str, config: dict[str, Any]):
        self.model_type, self.defaults, self.given = model_type, DEFAULTS[model_type], config

    def value(self, key: str) -> Any:
        return self.given.get(key, self.defaults.get(key))

    def path(self, key: str) -> str:
        """The key's path below ``randomInit``."""
        return f"config.{key}"

    def describe(self, key: str) -> str:
        """Another key named in a message: ``num_experts 4``, or ``num_experts 128 (the qwen3_moe default)``."""
        if key in self.given:
            return f"{key} {self.given[key]}"
        return f"{key} {self.defaults[key]} (the {self.model_type} default)"

    def own(self, key: str) -> str:
        """The refused key's own value, its path naming the key: ``5``, or ``not given: the qwen3_moe default 8``."""
        if key in self.given:
            return str(self.given[key])
        return f"not given: the {self.model_type} default {self.defaults[key]}"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_random_init(model_type: str, config: dict[str, Any]) -> None:
    """Refuse a ``randomInit`` config that transformers would refuse or fail on once training starts. Raises
    :class:`FieldError` naming ``config.<key>`` (below ``randomInit``) and the values: a size that is not a
    positive integer, ``num_key_value_heads`` not dividing ``num_attention_heads``, llama's ``hidden_size`` not
    a multiple of ``num_attention_heads``, an odd or zero RoPE ``head_dim`` (llama, qwen3_moe), more
    ``num_experts_per_tok`` than ``num_experts``, qwen3_5_moe_text's ``layer_types`` not one of
    linear_attention/full_attention per layer, ``linear_num_value_heads`` not a multiple of
    ``linear_num_key_heads``."""
    c = _Config(model_type, config)
    _check_numbers(c)
    for key in c.defaults:
        if key not in c.given or key == "layer_types" or (c.given[key] is None and key in _NULLABLE[model_type]):
            continue
        v = c.given[key]
        if key in _MAY_BE_ZERO.get(model_type, ()):
            if not _is_int(v) or v < 0:
                raise FieldError(c.path(key), f"must be an integer, 0 (dense MLP layers) or more (got {v!r})")
        elif not _is_int(v) or v < 1:
            raise FieldError(c.path(key), f"must be a positive integer (got {v!r})")
    _check_attention(c)
    if model_type != "llama":
        _check_experts(c)
    if model_type == "qwen3_5_moe_text":
        _check_linear_attention(c)


def _non_finite(value: Any, where: str) -> str | None:
    """The path below ``where`` of the first NaN or infinite float in ``value`` (nested lists and maps), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _non_finite(v, f"{where}.{k}" if isinstance(value, dict) else f"{where}[{k}]")
        if found:
            return found
    return None


def _check_numbers(c: _Config) -> None:
    """No NaN or infinity anywhere in the config (the model would train on NaN: a NaN ``initializer_range`` fails
    only when the weights are drawn); every ``*_eps`` a positive number (a negative normalisation epsilon gives a
    NaN loss at the first step); ``initializer_range`` a number of 0 or more (the standard deviation of the
    initial weights)."""
    for key, value in c.given.items():
        bad = _non_finite(value, c.path(key))
        if bad:
            raise FieldError(bad, f"must be a finite number (got {value!r})" if bad == c.path(key) else
                             "must be a finite number (NaN or infinity given)")
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key.endswith("_eps") and (not is_number or value <= 0):
            raise FieldError(c.path(key), f"must be a positive number (got {value!r}): the epsilon added to the "
                                          "variance of a normalisation layer")
        if key == "initializer_range" and (not is_number or value < 0):
            raise FieldError(c.path(key), f"must be a number of 0 or more (got {value!r}): the standard deviation "
                                          "of the initial weights")


def _check_attention(c: _Config) -> None:
    heads, hidden = c.value("num_attention_heads"), c.value("hidden_size")
    kv = c.value("num_key_value_heads") or heads  # llama: None means one key/value head per query head
    if heads % kv:
        raise FieldError(c.path("num_key_value_heads"),
                         f"{c.own('num_key_value_heads')} does not divide {c.describe('num_attention_heads')}: "
                         "each key/value head serves an equal group of query heads")
    if c.model_type == "llama" and hidden % heads:
        raise FieldError(c.path("hidden_size"),
                         f"{c.own('hidden_size')} is not a multiple of {c.describe('num_attention_heads')} "
                         "(the llama config refuses it, head_dim given or not)")
    if c.model_type == "qwen3_5_moe_text":
        return  # partial rotary embedding: any head_dim trains
    if "rope_parameters" in c.given or "partial_rotary_factor" in c.given:
        return  # the rotary dimension is head_dim times a factor given here: left to the config
    head_dim = c.value("head_dim")
    if head_dim is not None:
        if head_dim % 2:
            raise FieldError(c.path("head_dim"), f"{head_dim} is odd; rotary position embedding (RoPE) rotates "
                                                 "pairs of dimensions: give an even head_dim")
        return
    derived = hidden // heads
    if derived < 2 or derived % 2:
        raise FieldError(c.path("hidden_size"),
                         f"{c.own('hidden_size')} // {c.describe('num_attention_heads')} gives head_dim "
                         f"{derived} (head_dim not given), which rotary position embedding (RoPE) cannot use: it "
                         "rotates pairs of dimensions; give an even head_dim or change hidden_size")


def _check_experts(c: _Config) -> None:
    experts, k = c.value("num_experts"), c.value("num_experts_per_tok")
    if experts == 0:
        return  # qwen3_moe: dense MLP layers, no router
    if k > experts:
        raise FieldError(c.path("num_experts_per_tok"),
                         f"{c.own('num_experts_per_tok')} is more than {c.describe('num_experts')}: the router "
                         "picks num_experts_per_tok of the num_experts experts for each token")


def _check_linear_attention(c: _Config) -> None:
    layers, types = c.value("num_hidden_layers"), c.given.get("layer_types")
    if types is not None:
        if not isinstance(types, list):
            raise FieldError(c.path("layer_types"), f"expected a list, one of {'/'.join(_LAYER_TYPES)} per layer "
                                                    f"(got {types!r})")
        for i, t in enumerate(types):
            if t not in _LAYER_TYPES:
                raise FieldError(f"{c.path('layer_types')}[{i}]", f"{t!r} is not a qwen3_5_moe_text layer type; "
                                                                  f"expected {' or '.join(_LAYER_TYPES)}")
        if len(types) != layers:
            raise FieldError(c.path("layer_types"), f"{len(types)} layer type(s) for "
                                                    f"{c.describe('num_hidden_layers')}; give one layer type per layer")
    keys, values = c.value("linear_num_key_heads"), c.value("linear_num_value_heads")
    if values % keys:
        raise FieldError(c.path("linear_num_value_heads"),
                         f"{c.own('linear_num_value_heads')} is not a multiple of "
                         f"{c.describe('linear_num_key_heads')}: each linear-attention key head serves an equal group "
                         "of value heads")


def max_positions_problem(max_positions: object, seq_len: int, what: str) -> str | None:
    """Why a model whose ``max_position_embeddings`` is ``max_positions`` (``what``: how the message names the
    value, e.g. ``512`` or ``not given: the llama default 2048``) cannot train on ``spec.training.seqLen`` =
    ``seq_len`` tokens, or None when it can (or the value is not a number, refused elsewhere)."""
    if not _is_int(max_positions) or max_positions >= seq_len:
        return None
    return (f"{what} is smaller than spec.training.seqLen {seq_len}: the model is made for sequences of at most "
            f"{max_positions} tokens and would be trained on {seq_len}")


def check_random_init_positions(model_type: str, config: dict[str, Any], seq_len: int) -> None:
    """Refuse a ``randomInit`` config whose ``max_position_embeddings`` (given or the architecture's default) is
    smaller than ``seq_len``. Raises :class:`FieldError` naming
    ``spec.baseModel.randomInit.config.max_position_embeddings`` and both values."""
    c = _Config(model_type, config)
    problem = max_positions_problem(c.value("max_position_embeddings"), seq_len, c.own("max_position_embeddings"))
    if problem:
        raise FieldError("spec.baseModel.randomInit.config.max_position_embeddings",
                         f"{problem}; set max_position_embeddings to {seq_len} or more, or spec.training.seqLen to "
                         f"{c.value('max_position_embeddings')} or less")


def config_max_positions(config: dict[str, Any]) -> object:
    """``max_position_embeddings`` of a Hugging Face ``config.json`` (its ``text_config``'s for a multimodal
    model such as Qwen3.5-MoE), or None."""
    if "max_position_embeddings" in config:
        return config["max_position_embeddings"]
    text = config.get("text_config")
    return text.get("max_position_embeddings") if isinstance(text, dict) else None
