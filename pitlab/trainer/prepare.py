"""Prepare what training starts from: the base model directory and the tokenized corpus."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from huggingface_hub.errors import StrictDataclassFieldValidationError
from transformers import CONFIG_MAPPING, AutoModelForCausalLM, PreTrainedConfig, PreTrainedTokenizerBase
from transformers.activations import ACT2FN

from pitlab.api import PitTrainingSpec, SpecError, resolve_input
from pitlab.api.artifacts import MODEL_CARD, ModelCard
from pitlab.errors import InputError
from pitlab.storage.outdir import swap_in
from pitlab.trainer.files import make_readable, write_json_atomic
from pitlab.trainer.tokenizer import train_tokenizer

_CONFIG_FIELD = "spec.baseModel.randomInit.config"
# Set from the trained tokenizer; a spec must not give them.
_RESERVED_CONFIG_KEYS = ("vocab_size", "eos_token_id", "pad_token_id", "bos_token_id")
# Keyword arguments every transformers config accepts without declaring them as fields.
_GENERIC_CONFIG_KWARGS = {"attn_implementation", "experts_implementation"}


def prepare_base_model(spec: PitTrainingSpec, texts: list[str], out_dir: Path, card: dict | None = None) -> Path:
    """Return the Hugging Face model directory that training starts from.

    With ``spec.baseModel.randomInit``: trains the tokenizer on ``texts`` (the PIT-filtered corpus),
    builds the ``modelType`` config from ``randomInit.config`` with ``vocab_size`` and eos/pad/bos ids
    from the tokenizer, seeds torch with ``randomInit.seed``, instantiates the causal LM in float32 and
    writes model (safetensors) + config + tokenizer, and ``card`` when given (the model card,
    :data:`pitlab.api.artifacts.MODEL_CARD`), to ``out_dir`` (via ``out_dir.tmp``, renamed when complete; an
    existing ``out_dir`` is replaced). Returns ``out_dir``. Deterministic for the same spec and texts.

    With ``spec.baseModel.uri`` (a Hugging Face directory holding ``config.json`` and a tokenizer, local or
    a published ``s3://`` prefix, then downloaded into the cache): returns that local path; nothing is written and ``texts`` is unused.

    Raises :class:`pitlab.api.SpecError` naming the field for a missing/invalid ``uri``, a config key the
    architecture does not know, a reserved key (``vocab_size``, ``*_token_id``) or a config the
    architecture rejects; ``ValueError`` if ``texts`` has no text.
    """
    base = spec.base_model
    if base.uri is not None:
        path = resolve_input(base.uri, "spec.baseModel.uri", published=True)  # s3://: a verified local copy
        if not (path / "config.json").is_file():
            raise SpecError([("spec.baseModel.uri", f"{str(path)!r} is not a Hugging Face model directory "
                                                    "(no config.json)")])
        return path

    ri = base.random_init
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = train_tokenizer(texts, base.tokenizer.vocab_size, tmp)
    config = build_config(ri.model_type, ri.config, vocab_size=len(tokenizer),
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                          bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(ri.seed)
    try:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except (ValueError, TypeError, AssertionError, RuntimeError) as err:
        raise SpecError([(_CONFIG_FIELD, f"{ri.model_type} model cannot be built from this config: {err}")]) from None
    import transformers

    bar = transformers.logging.is_progress_bar_enabled()
    transformers.logging.disable_progress_bar()  # a tqdm bar among the run's stage lines, for a sub-second write
    try:
        model.save_pretrained(tmp, safe_serialization=True)
    finally:
        if bar:
            transformers.logging.enable_progress_bar()
    if card is not None:
        write_json_atomic(tmp / MODEL_CARD, ModelCard.model_validate(card).model_dump(by_alias=True, mode="json"))
    make_readable(tmp)
    swap_in(tmp, out_dir)  # an existing out_dir is removed only once this one is in place
    return out_dir


def build_config(model_type: str, overrides: dict, **fixed) -> PreTrainedConfig:
    """The transformers config of ``model_type`` with the spec's ``overrides`` and ``fixed`` (tokenizer) values.

    Raises :class:`pitlab.api.SpecError` naming ``spec.baseModel.randomInit.config.<key>`` for a key that
    neither the architecture's config class declares nor its modeling code reads (transformers would
    otherwise store a misspelt key silently and build a default-sized model), for a reserved key, or
    when the config class rejects the values.
    """
    config_class = CONFIG_MAPPING[model_type]
    known = _config_keys(config_class)
    problems = []
    for key in overrides:
        if key in _RESERVED_CONFIG_KEYS:
            problems.append((f"{_CONFIG_FIELD}.{key}", "is set from the trained tokenizer; remove it "
                                                       "(use spec.baseModel.tokenizer.vocabSize)"))
        elif key not in known:
            problems.append((f"{_CONFIG_FIELD}.{key}", f"unknown {model_type} config key"))
    if "hidden_act" in overrides and overrides["hidden_act"] not in ACT2FN:
        problems.append((f"{_CONFIG_FIELD}.hidden_act", f"{overrides['hidden_act']!r} is not an activation "
                                                         f"transformers knows (e.g. silu, gelu, relu)"))
    if problems:
        raise SpecError(problems)
    try:
        return config_class(**overrides, **fixed)
    except StrictDataclassFieldValidationError as err:  # a value of the wrong type or range, e.g. eps: "1e-6"
        field = re.search(r"field '(\w+)'", str(err))
        cause = err.__cause__ or err
        raise SpecError([(f"{_CONFIG_FIELD}.{field.group(1)}" if field else _CONFIG_FIELD,
                          f"{type(cause).__name__}: {cause}".replace("\n", " "))]) from None
    except (ValueError, TypeError) as err:
        raise SpecError([(_CONFIG_FIELD, f"invalid {model_type} config: {err}")]) from None


def check_model_builds(model_type: str, config: PreTrainedConfig) -> torch.nn.Module:
    """Build the model of ``config`` on the meta device (no memory, no weights drawn), as the prepare stage builds
    it for real, so that a config its modeling code cannot build is refused before anything runs; returns that
    meta model. Raises :class:`pitlab.api.SpecError` naming ``spec.baseModel.randomInit.config``."""
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except (ValueError, TypeError, AssertionError, RuntimeError, KeyError, IndexError) as err:
        raise SpecError([(_CONFIG_FIELD, f"{model_type} model cannot be built from this config: "
                                         f"{type(err).__name__}: {err}")]) from None


def check_lora_targets(config: PreTrainedConfig, target_modules: list[str],
                       model: torch.nn.Module | None = None) -> None:
    """Refuse ``spec.lora.targetModules`` entries that name no linear layer of the model of ``config``
    (:func:`pitlab.trainer.lora.check_targets`), before anything runs; ``model``: that model on the meta device
    when already built (:func:`check_model_builds`), else it is built here. Raises :class:`pitlab.api.SpecError`."""
    from pitlab.trainer.lora import check_targets

    if model is None:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    check_targets(model, target_modules)


def _config_keys(config_class: type) -> set[str]:
    """Keys that have an effect on ``config_class``'s architecture: the config's declared fields, init
    parameters and attribute aliases, plus attributes its modeling module reads (``config.x`` or
    ``getattr(config, "x")``; e.g. ``head_dim`` for qwen3_moe is read but not declared)."""
    keys = set(inspect.signature(config_class.__init__).parameters) - {"self", "kwargs"}
    if dataclasses.is_dataclass(config_class):
        keys |= {f.name for f in dataclasses.fields(config_class)}
    keys |= set(getattr(config_class, "attribute_map", {}) or {})
    keys |= _GENERIC_CONFIG_KWARGS
    module_name = config_class.__module__.replace(".configuration_", ".modeling_")
    try:
        source = inspect.getsource(importlib.import_module(module_name))
    except (ImportError, OSError, TypeError):
        return keys
    keys |= set(re.findall(r"\bconfig\.([A-Za-z_]\w*)", source))
    keys |= set(re.findall(r"getattr\(\s*(?:self\.)?config\s*,\s*[\"'](\w+)[\"']", source))
    return keys


class ShortCorpusError(InputError, ValueError):
    """The tokenized corpus holds ``tokens`` tokens, fewer than the ``needed`` minimum (one packed sequence).
    Exit code 2, ``InvalidSpec``."""

    def __init__(self, tokens: int, needed: int):
        super().__init__(f"the corpus has {tokens} tokens, fewer than {needed}")
        self.tokens, self.needed = tokens, needed


def tokenize_corpus(texts: list[str], tokenizer: PreTrainedTokenizerBase, out_path: Path, min_tokens: int = 1) -> int:
    """Tokenize every document and write the ids as one flat ``.npy`` array; return its length in tokens.

    Layout: ``doc_0 tokens, eos, doc_1 tokens, eos, ...`` in the order of ``texts``, dtype ``uint32``,
    shape ``(n_tokens,)``. No bos or other special tokens are added. Written to ``out_path`` via a
    temporary file and an atomic rename, so a reader never sees a partial array.

    Raises ``ValueError`` if the tokenizer has no eos token or ``texts`` yields no tokens, and
    :class:`ShortCorpusError` (nothing written) if it yields fewer than ``min_tokens`` (training needs
    ``seqLen + 1`` for one packed sequence).
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("tokenize_corpus: the tokenizer has no eos token")
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    arr = np.fromiter((t for doc in ids for t in (*doc, eos)), dtype=np.uint32, count=sum(len(d) + 1 for d in ids))
    if arr.size == 0:
        raise ValueError("tokenize_corpus: the corpus is empty (no documents passed the PIT filter?)")
    if arr.size < min_tokens:
        raise ShortCorpusError(int(arr.size), min_tokens)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, arr)
    os.replace(tmp, out_path)
    return int(arr.size)


def load_tokens(path: Path) -> np.ndarray:
    """Memory-map the flat ``uint32`` token array written by :func:`tokenize_corpus`.

    Raises ``FileNotFoundError`` naming the file if it is missing, ``ValueError`` if it is not 1-D uint32.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: token file not found (written by pitlab.trainer.prepare.tokenize_corpus)")
    arr = np.load(path, mmap_mode="r")
    if arr.ndim != 1 or arr.dtype != np.uint32:
        raise ValueError(f"{path}: expected a 1-D uint32 token array, got shape {arr.shape} dtype {arr.dtype}")
    return arr
