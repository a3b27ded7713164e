"""Loading an embedding model for the forward pass: its tokenizer, only the layers up to the one read (a prefix of
the stack, no logits), on the device and in the dtype asked for, and the forward function that returns that
layer's hidden states."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from typing import Literal

from pitlab.errors import EMBEDDING_FAILED, StageError

log = logging.getLogger("pitlab.evaluator.embed")
Kind = Literal["causal", "encoder"]


class EmbeddingError(StageError):
    """A model folder cannot be used for embeddings (the message names the folder or URI). Exit code 1,
    ``EmbeddingFailed``."""

    reason = EMBEDDING_FAILED


def _load_tokenizer(model_dir: Path):
    """The folder's tokenizer with right padding and a pad token (pads are masked out; the id only has to
    exist). Raises EmbeddingError naming the folder."""
    import transformers
    from transformers import AutoTokenizer

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as err:  # noqa: BLE001
        raise EmbeddingError(f"{model_dir}: tokenizer cannot be loaded: {err}") from err
    finally:
        transformers.logging.set_verbosity(verbosity)
    tok.padding_side = "right"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token or tok.bos_token or tok.convert_ids_to_tokens(0)
    return tok


def layers_to_run(n_layers: int, layer: int) -> int:
    """Decoder layers a causal model runs for ``hidden_states[layer]`` of an ``n_layers``-layer model: layer k
    (0 ≤ k < n) is the output of decoder layer k − 1, so k layers (one for k = 0, whose embedding output the
    first layer's forward returns); the last (−1 or n, after the final norm) needs all n."""
    k = layer if layer >= 0 else n_layers + 1 + layer
    return max(k, 1)


def truncated_config(config, n_run: int):
    """A copy of ``config`` with ``num_hidden_layers = n_run`` and every per-layer list (a top-level list of
    ``num_hidden_layers`` entries, e.g. ``layer_types``) cut to its first ``n_run`` entries."""
    import copy

    n = config.num_hidden_layers
    cut = copy.deepcopy(config)
    for key, value in vars(config).items():
        if isinstance(value, (list, tuple)) and len(value) == n and key != "num_hidden_layers":
            setattr(cut, key, type(value)(value[:n_run]))
    cut.num_hidden_layers = n_run
    return cut


def _load_model(model_dir: Path, kind: Kind, dtype: str, device: str, layer: int):
    """(model in eval mode on ``device``, decoder layers it runs, layers of the whole model, weight source)
    for ``hidden_states[layer]``.

    A causal model is built with only the decoder layers ``layer`` needs (:func:`layers_to_run`); the layers
    after it are never read from the shards. Weights go from the safetensors shards straight to ``device``
    (transformers builds the modules on the meta device and copies tensor by tensor: no host copy of the
    whole model). A folder with :data:`~pitlab.evaluator.random_weights.RANDOM_WEIGHTS_FILE` gets regenerated
    random weights instead (benchmarks and tests only, with a warning). Raises EmbeddingError naming the
    folder (unreadable config or weights, ``layer`` out of range)."""
    import warnings

    import torch
    import transformers
    from transformers import AutoConfig, AutoModel

    from pitlab.evaluator.random_weights import RandomWeightsError, build_random_model, read_random_weights

    try:
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except Exception as err:  # noqa: BLE001
        raise EmbeddingError(f"{model_dir}/config.json cannot be read: {err}") from err
    n_layers = getattr(config, "num_hidden_layers", None)
    if n_layers is not None and not -(n_layers + 1) <= layer <= n_layers:
        raise EmbeddingError(f"embedding.layer={layer} is out of range for {model_dir} "
                             f"({n_layers} layers: -{n_layers + 1}..{n_layers})")
    try:
        random = read_random_weights(model_dir)
    except RandomWeightsError as err:
        raise EmbeddingError(str(err)) from None
    n_run = n_layers
    truncated = False
    if kind == "causal" and n_layers:
        n_run = layers_to_run(n_layers, layer)
        if n_run < n_layers:
            config, truncated = truncated_config(config, n_run), True
    verbosity = transformers.logging.get_verbosity()
    bar = transformers.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()  # load reports (unused lm_head / pooler / later layers) expected
    transformers.logging.disable_progress_bar()
    try:
        if random is not None:
            msg = (f"{model_dir}: {random.describe()}: weights regenerated from config.json, not a trained model "
                   f"(for benchmarks and tests only)")
            warnings.warn(msg, stacklevel=3)
            log.warning(msg)
            try:
                model = build_random_model(config, random, device, dtype)
            except Exception as err:  # noqa: BLE001
                raise EmbeddingError(f"{model_dir}: random model cannot be built ({kind}): {err}") from err
            weights = random.describe()
        else:
            kwargs = {"config": config} if truncated else {}
            if device != "cpu":
                kwargs["device_map"] = {"": torch.device(device, torch.cuda.current_device())}
            try:
                model = AutoModel.from_pretrained(str(model_dir), dtype=getattr(torch, dtype),
                                                  local_files_only=True, **kwargs)
            except Exception as err:  # noqa: BLE001
                raise EmbeddingError(f"{model_dir}: model cannot be loaded ({kind}): {err}") from err
            weights = "checkpoint"
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bar:
            transformers.logging.enable_progress_bar()
    if device == "cpu":  # fla's Triton kernels and causal-conv1d are GPU kernels: "install it" would mislead here
        logging.getLogger("transformers.integrations.hub_kernels").setLevel(logging.ERROR)
    model.eval()
    return model, int(n_run or 0), int(n_layers or 0), weights


def decoder_stack(model):
    """The ``ModuleList`` of a causal model's ``config.num_hidden_layers`` decoder layers (the first such list in
    module order), or None when the model has none."""
    import torch

    n_run = getattr(model.config, "num_hidden_layers", None)
    return next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n_run), None)


def compile_decoder_layers(model, backend: str = "inductor") -> str | None:
    """``torch.compile`` of each decoder layer's ``forward`` (:func:`pitlab.trainer.kernels.compile_blocks` on
    :func:`decoder_stack`; dynamic shapes after the first batch shape, so the length-sorted batches of varying
    size compile once per layer kind). Forward hooks still run. Returns the report label, None when the model
    has no decoder stack (nothing compiled)."""
    from pitlab.trainer.kernels import compile_blocks

    stack = decoder_stack(model)
    return None if stack is None else compile_blocks(model, backend, layers=stack)


def uncompile_decoder_layers(model) -> bool:
    """Undo :func:`compile_decoder_layers`: drop the compiled ``forward`` set on each decoder layer instance, so
    the class's eager ``forward`` runs again. Returns whether any layer was compiled."""
    stack = decoder_stack(model)
    undone = False
    for layer in stack if stack is not None else []:
        undone |= layer.__dict__.pop("forward", None) is not None
    return undone


@functools.cache
def compile_failures() -> tuple[type[BaseException], ...]:
    """Exceptions that mean torch.compile could not build the layers' code, not an error of the model or input:
    dynamo's ``BackendCompilerFailed`` and ``InternalTorchDynamoError`` and inductor's ``InductorError`` where
    this torch has them."""
    import torch._dynamo.exc as dynamo_exc

    found = [getattr(dynamo_exc, n, None) for n in ("BackendCompilerFailed", "InternalTorchDynamoError")]
    try:
        from torch._inductor.exc import InductorError
        found.append(InductorError)
    except ImportError:
        pass
    return tuple(c for c in found if isinstance(c, type))


def eager_if_compile_fails(forward, model, model_dir: Path, meta: dict):
    """``forward`` that, when torch.compile cannot build the decoder layers' code
    (:func:`compile_failures`), puts the eager layers back, warns (``UserWarning``
    and a log line naming the folder and the error), records ``kernels["decoder_layers"] = "eager (torch.compile
    failed: ...)"`` and ``meta["compile_failed"]`` (such embeddings are not cached under the compiled key) and
    runs the batch again eagerly. Other errors (out of memory included) pass through."""
    import warnings

    def run(input_ids, attn):
        try:
            return forward(input_ids, attn)
        except compile_failures() as err:
            if not uncompile_decoder_layers(model):
                raise
            root = err
            while (inner := getattr(root, "inner_exception", None) or root.__cause__) is not None:
                root = inner  # dynamo wraps the backend's own error
            first = (str(root).strip().splitlines() or [""])[0][:200]
            why = type(err).__name__ + (f" from {type(root).__name__}" if root is not err else "")
            msg = (f"{model_dir}: torch.compile of the decoder layers failed ({why}: {first}); "
                   f"embedding with the eager layers (embedding.compile: false skips compiling)")
            warnings.warn(msg, stacklevel=2)
            log.warning(msg)
            meta["kernels"]["decoder_layers"] = f"eager (torch.compile failed: {type(err).__name__})"
            meta["compile_failed"] = True
            return forward(input_ids, attn)
    return run


def _forward_fn(model, kind: Kind, layer: int, n_layers: int):
    """``f(input_ids, attention_mask) -> hidden [b, L, d]`` equal to ``hidden_states[layer]`` of the whole
    ``n_layers``-layer model, ``model`` being that model or its first layers (:func:`_load_model`).

    Encoders: ``output_hidden_states`` (small models). Causal: the last hidden state when every layer runs;
    for layer 0 the first entry of ``hidden_states`` of the one-layer model; otherwise the output of the
    truncated model's last decoder layer, taken by a forward hook (no ``output_hidden_states``)."""
    if kind == "encoder":
        return lambda i, a: model(input_ids=i, attention_mask=a, output_hidden_states=True).hidden_states[layer]
    k = layer if layer >= 0 else n_layers + 1 + layer
    if k == n_layers:
        return lambda i, a: model(input_ids=i, attention_mask=a, use_cache=False).last_hidden_state
    if k == 0:
        return lambda i, a: model(input_ids=i, attention_mask=a, use_cache=False,
                                  output_hidden_states=True).hidden_states[0]
    n_run = model.config.num_hidden_layers
    stack = decoder_stack(model)
    if stack is None or n_run != k:
        raise EmbeddingError(f"{model.config.model_type}: no list of {k} decoder layers found to take "
                             f"hidden_states[{layer}] from")
    captured: list = []
    stack[k - 1].register_forward_hook(
        lambda mod, args, output: captured.append(output[0] if isinstance(output, tuple) else output))

    def forward(input_ids, attn):
        captured.clear()
        model(input_ids=input_ids, attention_mask=attn, use_cache=False)
        return captured.pop()
    return forward
