"""Layer streaming: LoRA training of a model larger than the GPU, one decoder layer on the GPU at a time.

The frozen base weights of every decoder layer live in host memory (one flat, page-locked store per layer and
dtype); ``buffers`` device slots hold the layers in use. Before layer ``i`` runs, its store is copied into slot
``i % buffers`` (on a side CUDA stream, ordered after the compute that last read the slot) and the layer's
``nn.Parameter`` objects are rebound (``param.data``) to views of the slot; when the slot is reused they are
rebound to their host store. Every parameter therefore always holds its own value, and ``named_parameters()``
and ``state_dict()`` keep the names and values of the unwrapped model: no module is replaced or renamed (the
reference tool's wrapper renamed ``state_dict()`` keys, which emptied peft's adapter save).

Forward runs the layers in order, fetching the next ``buffers - 1`` layers ahead; every decoder layer is
checkpointed (transformers' ``GradientCheckpointingLayer`` with a non-reentrant ``torch.utils.checkpoint``), so
backward recomputes layer ``i`` — fetching it again, and prefetching ``i - 1``, in the recompute context —
before its gradient. A frozen, untied input embedding stays in host memory too (the lookup runs on the CPU,
a copy, so exact; only the looked-up rows travel); the final norm, the head and the LoRA adapter (and so its
AdamW state) stay on the device. On CPU the same code runs with the "device" being the CPU and the copies plain copies.
With ``hostStore: mmap`` (:mod:`pitlab.trainer.host_store`) the host stores are regions of a memory-mapped file
instead (not page-locked; the copies from them are synchronous), filled layer by layer from a meta-device model
(:func:`load_mapped_model`).

The result is bit-identical to the resident model (``torch.equal`` on logits and adapter gradients; see
tests/test_streaming.py): the same kernels run on the same values, the slot views are aligned as the caching
allocator aligns a tensor (512 bytes), and recomputation replays the layer deterministically.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pitlab.trainer.fsdp import decoder_layers

STREAMABLE = ("llama", "qwen3_moe", "qwen3_5_moe_text")
ALIGN_BYTES = 512  # the CUDA caching allocator's block alignment: slot views start where a fresh tensor would
LOGITS_CHUNK_BYTES = 256 * 2 ** 20  # one chunk of the loss head: tokens x vocab x (c + 12) bytes at most


@dataclass(frozen=True)
class LayerLayout:
    """Where each frozen parameter of one decoder layer sits in its flat store: ``entries`` are
    ``(parameter name within the layer, dtype, offset in elements, shape)``; ``numel`` the store's elements
    per dtype (each offset rounded up to :data:`ALIGN_BYTES`)."""

    entries: tuple[tuple[str, torch.dtype, int, torch.Size], ...]
    numel: dict[torch.dtype, int]

    @property
    def nbytes(self) -> int:
        return sum(n * _itemsize(d) for d, n in self.numel.items())


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def layer_layout(layer: nn.Module) -> LayerLayout:
    """The flat-store layout of ``layer``'s frozen parameters (``requires_grad`` false), grouped by dtype in
    ``named_parameters()`` order. Works on the meta device (the planner uses it without memory)."""
    entries, numel = [], {}
    for name, p in layer.named_parameters():
        if p.requires_grad:
            continue
        align = max(1, ALIGN_BYTES // _itemsize(p.dtype))
        off = -(-numel.get(p.dtype, 0) // align) * align
        entries.append((name, p.dtype, off, p.shape))
        numel[p.dtype] = off + p.numel()
    return LayerLayout(tuple(entries), numel)


def check_streamable(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of ``model`` when layer streaming supports its architecture; raises ``TypeError``
    naming the ``model_type`` otherwise (supported: :data:`STREAMABLE`)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    config = getattr(model, "config", None)
    model_type = getattr(getattr(config, "get_text_config", lambda: config)(), "model_type", None)
    if model_type not in STREAMABLE:
        raise TypeError(f"training.layerStreaming: model_type {model_type!r} is not supported "
                        f"(supported: {', '.join(STREAMABLE)})")
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        if not isinstance(layer, GradientCheckpointingLayer):
            raise TypeError(f"training.layerStreaming: decoder layer {i} ({type(layer).__name__}) cannot be "
                            "checkpointed (not a transformers GradientCheckpointingLayer)")
    return layers


def host_embedding(model: nn.Module) -> nn.Embedding | None:
    """The input embedding of ``model`` when it can stay in host memory: a frozen ``nn.Embedding`` (no
    adapter on it) whose weight is not also the output head's (untied). None otherwise."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    emb = inner.get_input_embeddings()
    head = inner.get_output_embeddings()
    head_weight = getattr(getattr(head, "base_layer", head), "weight", None)
    if type(emb) is not nn.Embedding or emb.weight.requires_grad or emb.weight is head_weight:
        return None
    return emb


class LayerStreamer:
    """Stream ``model``'s frozen decoder-layer weights from host memory through ``buffers`` slots on ``device``.

    ``model``: a causal LM (usually a peft ``PeftModel``) whose parameters are on the CPU; the trainable ones
    (the adapter) and everything outside the decoder layers are moved to ``device``; the frozen decoder-layer
    parameters are packed into host stores (page-locked when ``pin_host`` and ``device`` is CUDA) and rebound
    to them. With ``host_embeddings`` a frozen, untied input embedding (:func:`host_embedding`) stays in the
    host store too: the lookup runs on the CPU and only the looked-up rows are copied. Installs the hooks on
    the model in place (names unchanged); use the model as before, in ``train()`` mode for a backward (each
    decoder layer is then recomputed in backward). With ``store`` (a
    :class:`pitlab.trainer.host_store.MappedStore` of this model's layouts) the host stores are its mapped regions,
    which already hold the values: the frozen parameters are rebound to them without a copy (they may be on
    the meta device) and nothing is pinned.
    Raises ``TypeError`` for an unsupported architecture, ``ValueError`` for ``buffers`` outside 2..8.

    ``host_bytes``: bytes of the host stores; ``slot_bytes``: bytes of all device slots; ``bytes_copied``:
    host-to-device bytes copied so far (the transfer volume of a step is its difference).
    """

    def __init__(self, model: nn.Module, device: torch.device | str, buffers: int = 2, pin_host: bool = True,
                 host_embeddings: bool = True, store=None):
        if not 2 <= buffers <= 8:
            raise ValueError(f"training.layerStreaming.buffers: must be 2..8 (got {buffers})")
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.buffers = buffers
        self.layers = check_streamable(model)
        self.store = store  # a pitlab.trainer.host_store.MappedStore: the host stores are its mapped regions
        pin = self.pinned = pin_host and self.cuda and store is None
        self.layouts = [layer_layout(layer) for layer in self.layers]
        if store is not None:
            from pitlab.trainer.host_store import layout_entries

            if [layout_entries(x) for x in self.layouts] != store.header["layers"]:
                raise ValueError(f"{store.path}: the store's layout is not this model's")
        self.params: list[list[nn.Parameter]] = []
        self.host: list[dict[torch.dtype, torch.Tensor]] = []
        streamed: set[int] = set()
        with torch.no_grad():
            for layer, layout in zip(self.layers, self.layouts):
                named = dict(layer.named_parameters())
                if store is not None:  # mapped: the values are in the file already (the parameters may be meta)
                    flat = store.layers[len(self.host)]
                else:
                    flat = {d: torch.empty(n, dtype=d, pin_memory=pin) for d, n in layout.numel.items()}
                params = []
                for name, dtype, off, shape in layout.entries:
                    p = named[name]
                    if store is None:
                        if p.device.type != "cpu":
                            raise ValueError(f"{name}: layer streaming takes a model on the CPU (got {p.device})")
                        flat[dtype][off:off + p.numel()].copy_(p.detach().reshape(-1))
                    params.append(p)
                    streamed.add(id(p))
                self.host.append(flat)
                self.params.append(params)
                self._bind(len(self.params) - 1, flat)
            self.embedding = host_embedding(model) if host_embeddings else None
            if self.embedding is not None:  # the lookup runs on the host; only T x H rows are copied
                w = self.embedding.weight
                if store is not None:
                    if store.embedding is None or store.embedding.shape != w.shape:
                        raise ValueError(f"{store.path}: the store holds no input embedding of shape {tuple(w.shape)}")
                    w.data = store.embedding
                else:
                    host = torch.empty(w.shape, dtype=w.dtype, pin_memory=pin)
                    host.copy_(w.detach())
                    w.data = host
                streamed.add(id(w))
                self.embedding.register_forward_pre_hook(self._embedding_input)
                self.embedding.register_forward_hook(self._embedding_output)
            _move_resident(model, self.device, streamed)
        sizes = {}
        for layout in self.layouts:
            for d, n in layout.numel.items():
                sizes[d] = max(sizes.get(d, 0), n)
        self.slots = [{d: torch.empty(n, dtype=d, device=self.device) for d, n in sizes.items()}
                      for _ in range(buffers)]
        self.holder: list[int | None] = [None] * buffers
        self.host_bytes = sum(layout.nbytes for layout in self.layouts) + (
            0 if self.embedding is None else self.embedding.weight.numel() * self.embedding.weight.element_size())
        self.slot_bytes = buffers * sum(n * _itemsize(d) for d, n in sizes.items())
        self.bytes_copied = 0
        self.copies = 0
        self._recomputing = False
        self.driven = False  # the layers are fetched by the caller (use); the hooks do nothing
        self.plan = None  # the streaming plan it was checked against (load_streamed_model)
        if self.cuda:
            self.copy_stream = torch.cuda.Stream(self.device)
            self.ready = [torch.cuda.Event() for _ in range(buffers)]
        for i, layer in enumerate(self.layers):
            layer.register_forward_pre_hook(functools.partial(self._pre_forward, i))
            layer.gradient_checkpointing = True
            layer._gradient_checkpointing_func = functools.partial(self._checkpoint, i)

    @staticmethod
    def loss(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The training loss of one microbatch (:func:`streamed_loss`)."""
        return streamed_loss(model, input_ids, labels)

    def report(self) -> dict:
        """What was streamed: ``layers``, ``buffers``, ``host_store`` (``"memory"`` or ``"mmap"``),
        ``host_bytes``, ``slot_bytes``, ``pinned`` (never for ``mmap``), ``host_embedding``, ``layer_copies``
        and ``bytes_copied`` (host→device, cumulative); with ``mmap`` also the store file's path, bytes,
        whether it was written by this run and in how many seconds (:meth:`MappedStore.report`)."""
        out = {"layers": len(self.layers), "buffers": self.buffers,
               "host_store": "memory" if self.store is None else "mmap", "host_bytes": self.host_bytes,
               "slot_bytes": self.slot_bytes, "pinned": self.pinned, "host_embedding": self.embedding is not None,
               "layer_copies": self.copies, "bytes_copied": self.bytes_copied}
        if self.store is not None:
            out.update(self.store.report())
        return out

    # ------------------------------------------------------------------ slots
    def _bind(self, i: int, flat: dict[torch.dtype, torch.Tensor]) -> None:
        for p, (_, dtype, off, shape) in zip(self.params[i], self.layouts[i].entries):
            p.data = flat[dtype][off:off + shape.numel()].view(shape)

    def _fetch(self, i: int) -> None:
        """Start copying layer ``i`` into slot ``i % buffers`` unless it is there; rebinds the slot's previous
        layer to its host store. On CUDA the copy waits for the compute enqueued so far (the last reads of
        the slot) and runs on the side stream."""
        s = i % self.buffers
        if self.holder[s] == i:
            return
        old = self.holder[s]
        if old is not None:
            self._bind(old, self.host[old])
        slot = self.slots[s]
        if self.cuda:
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.copy_stream):
                for dtype, src in self.host[i].items():
                    slot[dtype][:src.numel()].copy_(src, non_blocking=True)
                self.ready[s].record(self.copy_stream)
        else:
            for dtype, src in self.host[i].items():
                slot[dtype][:src.numel()].copy_(src)
        self.bytes_copied += self.layouts[i].nbytes
        self.copies += 1
        self._bind(i, slot)
        self.holder[s] = i

    def use(self, i: int, step: int) -> None:
        """Make layer ``i`` resident for compute and prefetch the next ``buffers - 1`` layers in direction
        ``step`` (+1 forward, -1 backward)."""
        self._fetch(i)
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(self.ready[i % self.buffers])
        for k in range(1, self.buffers):
            j = i + step * k
            if 0 <= j < len(self.layers):
                self._fetch(j)

    # ------------------------------------------------------------------ hooks
    @staticmethod
    def _embedding_input(module: nn.Module, args):
        return (args[0].to("cpu"),) + tuple(args[1:])

    def _embedding_output(self, module: nn.Module, args, out: torch.Tensor) -> torch.Tensor:
        return out.to(self.device)

    def _pre_forward(self, i: int, module: nn.Module, args) -> None:
        if self._recomputing or self.driven:  # checkpointed __call__ runs hooks in the recompute; layer-major
            return  # order (pitlab.trainer.layer_major) fetches the layers itself
        if torch.is_grad_enabled() and not module.training:
            raise RuntimeError("layer streaming: a forward with gradients needs model.train() (each decoder "
                               "layer is recomputed in backward); use torch.no_grad() for evaluation")
        self.use(i, +1)

    def _checkpoint(self, i: int, fn, *args):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(fn, *args, use_reentrant=False,
                          context_fn=lambda: (contextlib.nullcontext(), self._recompute(i)))

    @contextlib.contextmanager
    def _recompute(self, i: int):
        self.use(i, -1)
        self._recomputing = True
        try:
            yield
        finally:
            self._recomputing = False


def _read_rows_in_blocks(base: Path, name: str, out: torch.Tensor, block_bytes: int = 64 * 2 ** 20) -> None:
    """Fill ``out`` (CPU, contiguous) with tensor ``name`` of ``base``'s safetensors, ``block_bytes`` of the
    file's dtype at a time. Raises :class:`pitlab.trainer.loading.WeightLoadError` when it is missing or
    misshapen."""
    from pitlab.trainer.loading import WeightLoadError, read_header, read_rows, safetensors_index

    path = safetensors_index(base).get(name)
    if path is None:
        raise WeightLoadError(f"{base}: no tensor {name!r} in the safetensors files")
    data_start, header = read_header(path)
    entry = header.get(name)
    if entry is None or tuple(entry["shape"]) != tuple(out.shape):
        raise WeightLoadError(f"{path}: {name} has shape {None if entry is None else tuple(entry['shape'])}, the "
                              f"model built from {base / 'config.json'} expects {tuple(out.shape)}")
    row_bytes = max(1, out[0].numel() * 4)  # at most 4 bytes per element in the file
    rows = max(1, block_bytes // row_bytes)
    for start in range(0, out.shape[0], rows):
        stop = min(start + rows, out.shape[0])
        read_rows(path, data_start, entry, start, stop, out[start:stop])


def _move_resident(model: nn.Module, device: torch.device, streamed: set[int]) -> None:
    """Move every parameter not in ``streamed`` (ids) and every buffer of ``model`` to ``device`` in place."""
    if device.type == "cpu":
        return
    for mod in model.modules():
        for name, p in mod._parameters.items():
            if p is not None and id(p) not in streamed and p.device != device:
                p.data = p.data.to(device)
        for name, b in mod._buffers.items():
            if b is not None:
                mod._buffers[name] = b.to(device)


# ---------------------------------------------------------------------------------------------------- loss

def logits_chunk_tokens(vocab: int, compute_bytes: int, tokens: int) -> int:
    """Tokens per chunk of :func:`chunked_cross_entropy`: the largest power of two (at least 16, at most
    ``tokens``) whose loss-head working set, ``chunk × vocab × (compute_bytes + 12)`` bytes (compute-dtype
    logits, float32 logits, log-softmax and their gradient), is at most :data:`LOGITS_CHUNK_BYTES`."""
    per_token = vocab * (compute_bytes + 12)
    chunk = 16
    while chunk * 2 * per_token <= LOGITS_CHUNK_BYTES:
        chunk *= 2
    return max(1, min(chunk, tokens))


def _chunk_loss_sum(head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), labels, reduction="sum")


def chunked_cross_entropy(hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor,
                          chunk_tokens: int) -> torch.Tensor:
    """Mean next-token cross-entropy (float32 scalar) of ``head(hidden)`` against ``labels`` without holding
    ``tokens × vocab`` logits: ``hidden`` ``(B, S, H)`` is cut into chunks of ``chunk_tokens`` tokens, each
    chunk's logits are computed, upcast to float32, reduced to a sum and freed, and recomputed in backward
    (``torch.utils.checkpoint``). Equals ``F.cross_entropy(head(hidden).float(), labels)`` up to the order of
    the float32 sum. ``labels`` ``(B, S)`` int64; no ignore index is used (packed sequences)."""
    from torch.utils.checkpoint import checkpoint

    h, y = hidden.flatten(0, 1), labels.flatten()
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, h.shape[0], chunk_tokens):
        part = slice(start, start + chunk_tokens)
        total = total + checkpoint(_chunk_loss_sum, head, h[part], y[part], use_reentrant=False)
    return total / h.shape[0]


def causal_lm_parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """``(backbone, head)`` of a causal LM (also under peft): the module returning the final hidden states
    (``model.model``) and the output projection (``lm_head``, possibly LoRA-wrapped)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.model, inner.lm_head


def streamed_loss(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Training loss of one microbatch under layer streaming: the backbone's final hidden states, then
    :func:`head_loss` (no ``tokens × vocab`` float32 tensor)."""
    return head_loss(model, causal_lm_parts(model)[0](input_ids=input_ids).last_hidden_state, labels)


def head_loss(model: nn.Module, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean loss (0-d float32) of the final hidden states ``hidden`` ``(B, S, H)`` against ``labels``: the head
    in chunks of :func:`logits_chunk_tokens` tokens (:func:`chunked_cross_entropy`)."""
    head = causal_lm_parts(model)[1]
    vocab = head.weight.shape[0] if hasattr(head, "weight") else model.config.get_text_config().vocab_size
    chunk = logits_chunk_tokens(vocab, hidden.element_size(), labels.numel())
    return chunked_cross_entropy(hidden, head, labels, chunk)


# ---------------------------------------------------------------------------------------------------- setup

STORE_DIR = "streaming-store"  # under the run directory: the memory-mapped host store (hostStore: mmap)


def load_streamed_model(base: Path, spec, device: torch.device,
                        store_dir: Path | None = None) -> tuple[nn.Module, LayerStreamer]:
    """The LoRA model of ``base`` (HF directory) for ``spec`` (a ``PitTrainingSpec`` with
    ``training.layerStreaming.enabled``), loaded on the CPU exactly as the FSDP2 path loads it (frozen base in
    bfloat16 with ``precision: bf16``, seeded adapter init; :func:`pitlab.trainer.loading.load_sharded_model`
    without a mesh), checked against the GPU budget (:func:`pitlab.trainer.plan_streaming.check_budget`,
    raising :class:`pitlab.trainer.plan_streaming.StreamingBudgetError` before any weight is read) and
    streamed to ``device``. Returns ``(peft model, streamer)``.

    The host store follows ``training.layerStreaming.hostStore``
    (:func:`pitlab.trainer.plan_streaming.choose_host_store`): ``memory`` (refused when it does not fit the
    host's available memory), ``mmap`` (:func:`load_mapped_model`: the store file in ``store_dir``, required
    then) or ``auto`` (``mmap`` with a warning on stderr when ``memory`` would not fit)."""
    import sys

    from transformers import AutoConfig

    from pitlab.trainer.loading import load_sharded_model
    from pitlab.trainer.lora import lora_record
    from pitlab.trainer.plan_streaming import _gb, check_budget, choose_host_store

    import torch.distributed as dist

    from pitlab.api import SpecError

    tr = spec.training
    ls = tr.layer_streaming
    if dist.is_initialized() and dist.get_world_size() != 1:
        raise SpecError([("spec.training.layerStreaming", f"runs in one process, not {dist.get_world_size()} "
                                                          "(resources.gpusPerNode: 1)")])
    plan = check_budget(spec, config=AutoConfig.from_pretrained(base), device=device)
    pinned = ls.pin_host and device.type == "cuda"  # the layer-major boundaries take host memory too
    mode, warning = choose_host_store(ls.host_store, plan.host_pinned_bytes + plan.boundary_host_pinned_bytes
                                      if pinned else plan.host_bytes + plan.boundary_host_bytes, store_dir=store_dir)
    if warning is not None:
        print(f"pitlab.trainer.streaming: WARNING: {warning}", file=sys.stderr, flush=True)
    if mode == "mmap":
        if store_dir is None:
            raise ValueError("training.layerStreaming.hostStore: mmap needs a directory for the store file")
        model, streamer = load_mapped_model(base, spec, device, Path(store_dir))
        r = streamer.report()
        print(f"pitlab.trainer.streaming: host store memory-mapped from {r['host_store_path']} "
              f"({_gb(r['host_store_file_bytes'])}, "
              f"{'written in %.1f s' % r['host_store_write_seconds'] if r['host_store_written'] else 'reused'}); "
              "not pinned (pinHost does not apply to a memory-mapped store)", file=sys.stderr, flush=True)
    else:
        model = load_sharded_model(base, None, tr.precision, torch.device("cpu"), lora=lora_record(spec.lora),
                                   seed=tr.seed)
        streamer = LayerStreamer(model, device, buffers=ls.buffers, pin_host=ls.pin_host)
    streamer.plan = plan
    return model, streamer


def load_mapped_model(base: Path, spec, device: torch.device, store_dir: Path) -> tuple[nn.Module, LayerStreamer]:
    """:func:`load_streamed_model` with a memory-mapped host store (:mod:`pitlab.trainer.host_store`), without
    the whole model in host memory: the model is built on the meta device; the frozen decoder layers (and a
    frozen untied input embedding) are read from the safetensors straight into a shared mapping of the store
    file (written once, reused while it matches), the other parameters and buffers are allocated and read on
    the CPU (then moved to ``device``). The values are those of :func:`load_sharded_model` bit for bit."""
    from pitlab.trainer.host_store import open_store, store_header
    from pitlab.trainer.loading import _persistent_buffers, _recompute_non_persistent_buffers, build_meta_model, \
        load_tensors
    from pitlab.trainer.lora import base_parameter_name, lora_record

    tr, ls = spec.training, spec.training.layer_streaming
    lora = lora_record(spec.lora)
    model = build_meta_model(base, tr.precision, False, lora)
    layers = check_streamable(model)
    layouts = [layer_layout(layer) for layer in layers]
    emb = host_embedding(model)
    names = {id(m): n for n, m in model.named_modules()}

    def fill(views: dict[str, dict[torch.dtype, torch.Tensor]]) -> None:
        for i, (layer, layout) in enumerate(zip(layers, layouts)):
            flat = views[f"layer.{i}"]
            prefix = names[id(layer)]
            load_tensors(base, [(f"{prefix}.{name}", flat[dtype][off:off + shape.numel()].view(shape))
                                for name, dtype, off, shape in layout.entries], lora, tr.seed)
        if emb is not None:  # in blocks of rows: a dtype conversion never holds the whole (large) embedding
            (w,) = views["embedding"].values()
            _read_rows_in_blocks(base, base_parameter_name(f"{names[id(emb)]}.weight"), w.view(emb.weight.shape))

    store = open_store(store_dir, store_header(base, layouts, None if emb is None else emb.weight), fill)
    # meta parameters cannot take CPU data (``.data``): each is replaced by a new Parameter (one per object, so a
    # tied weight stays tied) on the store's mapped view (streamed) or on fresh CPU memory (resident, read below)
    data: dict[int, torch.Tensor] = {}
    for i, (layer, layout) in enumerate(zip(layers, layouts)):
        named = dict(layer.named_parameters())
        for name, dtype, off, shape in layout.entries:
            data[id(named[name])] = store.layers[i][dtype][off:off + shape.numel()].view(shape)
    if emb is not None:
        data[id(emb.weight)] = store.embedding
    with torch.no_grad():
        resident, new = [], {}
        for mod_name, mod in model.named_modules():
            for name, p in mod._parameters.items():
                if p is None or p.device.type != "meta":
                    continue
                if id(p) not in new:  # (the meta parameter is kept alive with it: ids stay unique)
                    new[id(p)] = (p, nn.Parameter(data[id(p)] if id(p) in data else
                                                  torch.empty(p.shape, dtype=p.dtype), requires_grad=p.requires_grad))
                    if id(p) not in data:
                        resident.append((f"{mod_name}.{name}" if mod_name else name, new[id(p)][1]))
                mod._parameters[name] = new[id(p)][1]
            for name, b in mod._buffers.items():
                if b is not None and b.device.type == "meta":
                    mod._buffers[name] = torch.empty(b.shape, dtype=b.dtype)
        load_tensors(base, resident + list(_persistent_buffers(model)), lora, tr.seed)
        _recompute_non_persistent_buffers(model, torch.device("cpu"))
    streamer = LayerStreamer(model, device, buffers=ls.buffers, pin_host=ls.pin_host, store=store)
    return model, streamer
