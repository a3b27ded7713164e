"""Layer-major order for layer streaming: every streamed decoder layer runs for all ``k`` microbatches of an
optimizer step before the next layer is fetched (``training.layerStreaming.layerMajor`` with
``training.gradientAccumulationSteps`` k > 1).

Microbatch-major order (:class:`pitlab.trainer.streaming.LayerStreamer` alone) streams every layer twice per
microbatch (forward, and again for its recomputation in backward), so the host→GPU bytes per token are those
of the whole model per microbatch. Here a step streams every layer twice in all: the bytes per token are
divided by ``k``. The price is memory for the microbatches' boundary activations: the input of every decoder
layer for each microbatch (``B × S × H`` in the compute dtype), kept for the layer's recomputation in backward,
in device memory for the last ``gpu_layers`` layers and in host memory (page-locked on CUDA) for the others
(:class:`BoundaryStore`; the planner, :func:`pitlab.trainer.plan_streaming.plan_streaming`, chooses
``gpu_layers``).

A step (:meth:`LayerMajor.step`): the backbone runs once per microbatch up to its first decoder layer, which
records the arguments every layer receives (masks, rotary embeddings: they do not depend on the hidden states)
and stops; then for each layer, fetched once, the forward of every microbatch (grad mode on, saved tensors
dropped: the values are those of a training forward); then per microbatch the final norm, the chunked loss
head and ``(loss / accum).backward()``; then for each layer in reverse, fetched once, per microbatch the
recomputation from its boundary input and ``torch.autograd.backward`` with the gradient from the layer above.
Every operation on every microbatch is the one the resident model runs, and each adapter gradient receives its
microbatches' contributions in the same order (0, 1, ..., k - 1), so logits, loss, LoRA gradients and the adapter
after AdamW are bit-identical to the resident model's with the same accumulation (tests/test_layer_major.py).
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn

from pitlab.errors import TrainingError
from pitlab.trainer.streaming import LayerStreamer, causal_lm_parts, head_loss


class _Captured(TrainingError):
    """Raised by the last decoder layer's recorder: the arguments are captured, the rest is not run."""


def capture_layer_calls(backbone: nn.Module, layers: nn.ModuleList, input_ids: torch.Tensor) -> tuple[
        torch.Tensor, list[tuple[tuple, dict]]]:
    """``(embedding output, [(args, kwargs) of each decoder layer's call])`` of ``backbone(input_ids=...)``
    without running any decoder layer (each layer's ``forward`` is replaced by a recorder while it runs). The
    layer cache is dropped (``cache=None``, ``use_cache=False``) as gradient checkpointing does. Raises
    ``RuntimeError`` when a layer receives anything but the previous layer's output (a backbone that computes
    between its layers cannot be run layer-major)."""
    calls: list[tuple[torch.Tensor, tuple, dict]] = []

    def record(i: int, hidden: torch.Tensor, *args, **kwargs):
        calls.append((hidden, args, kwargs))
        if i == len(layers) - 1:
            raise _Captured
        return hidden

    for i, layer in enumerate(layers):
        layer.forward = functools.partial(record, i)
    try:
        backbone(input_ids=input_ids)
    except _Captured:
        pass
    finally:
        for layer in layers:
            del layer.forward
    if len(calls) != len(layers) or any(h is not calls[0][0] for h, _, _ in calls):
        raise RuntimeError("layer-major streaming: the backbone does not pass each decoder layer's output "
                           "straight to the next layer")
    out = []
    for _, args, kwargs in calls:
        kwargs = dict(kwargs)
        if kwargs.get("use_cache"):
            kwargs["use_cache"] = False
        if kwargs.get("cache") is not None:
            kwargs["cache"] = None
        out.append((args, kwargs))
    return calls[0][0], out


def _drop(t: torch.Tensor) -> None:
    return None


def _never(packed) -> torch.Tensor:
    raise RuntimeError("layer-major streaming: a forward whose saved tensors were dropped cannot be backpropagated")


class BoundaryStore:
    """The boundary activations of one layer-major step: the input of decoder layer ``i`` for microbatch ``m``.

    Layers ``layers - gpu_layers`` and up keep theirs on ``device`` (the tensor itself); the first ``layers -
    gpu_layers`` copy theirs into one host buffer per layer (``microbatches × B × S × H``, the compute dtype;
    page-locked when ``pin``), allocated at the first step and reused. On CUDA the copies run on a side stream:
    device→host after the tensor is computed, host→device one boundary ahead of its use in backward.
    ``d2h_bytes`` / ``h2d_bytes``: bytes copied so far; ``host_bytes``: bytes of the host buffers."""

    def __init__(self, layers: int, microbatches: int, gpu_layers: int, device: torch.device, pin: bool):
        if not 0 <= gpu_layers <= layers:
            raise ValueError(f"gpu_layers must be 0..{layers} (got {gpu_layers})")
        self.first_gpu = layers - gpu_layers
        self.k = microbatches
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.pin = pin and self.cuda and self.first_gpu > 0  # nothing to pin without a host layer
        self.kept: dict[tuple[int, int], torch.Tensor] = {}
        self.host: list[torch.Tensor | None] = [None] * self.first_gpu
        self.staged: dict[tuple[int, int], tuple[torch.Tensor, object]] = {}
        self.d2h_bytes = self.h2d_bytes = 0
        if self.cuda:
            self.stream = torch.cuda.Stream(self.device)

    @property
    def host_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.host if b is not None)

    def put(self, i: int, m: int, x: torch.Tensor) -> None:
        """Keep ``x`` (the detached input of layer ``i`` for microbatch ``m``) until :meth:`take`."""
        if i >= self.first_gpu:
            self.kept[(i, m)] = x
            return
        buf = self.host[i]
        if buf is None or buf.shape[1:] != x.shape or buf.dtype != x.dtype:
            buf = self.host[i] = torch.empty((self.k, *x.shape), dtype=x.dtype, pin_memory=self.pin)
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                buf[m].copy_(x, non_blocking=True)
            x.record_stream(self.stream)
        else:
            buf[m].copy_(x)
        self.d2h_bytes += x.numel() * x.element_size()

    def _stage(self, i: int, m: int) -> None:
        """Start copying host boundary ``(i, m)`` to the device (nothing for a device-kept or staged one)."""
        if not 0 <= i < self.first_gpu or (i, m) in self.staged:
            return
        src = self.host[i][m]
        dst = torch.empty(src.shape, dtype=src.dtype, device=self.device)
        event = None
        if self.cuda:  # after the compute stream's last use of dst's memory
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                dst.copy_(src, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.stream)
        else:
            dst.copy_(src)
        self.staged[(i, m)] = (dst, event)
        self.h2d_bytes += dst.numel() * dst.element_size()

    def take(self, i: int, m: int) -> torch.Tensor:
        """The input of layer ``i`` for microbatch ``m`` on the device (the store lets go of it); starts the
        copy of the next boundary backward needs (``(i, m + 1)``, else ``(i - 1, 0)``)."""
        nxt = (i, m + 1) if m + 1 < self.k else (i - 1, 0)
        if i >= self.first_gpu:
            self._stage(*nxt)  # the first host boundary starts coming back during the last device-kept one
            return self.kept.pop((i, m))
        self._stage(i, m)
        dst, event = self.staged.pop((i, m))
        self._stage(*nxt)
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
        return dst


class LayerMajor:
    """Layer-major forward and backward of ``model`` (a causal LM streamed by ``streamer``) over ``microbatches``
    microbatches, with the boundary activations of the last ``gpu_layers`` decoder layers on the device and the
    others in host memory (:class:`BoundaryStore`, page-locked with ``pin`` on CUDA)."""

    def __init__(self, model: nn.Module, streamer: LayerStreamer, microbatches: int, gpu_layers: int,
                 pin: bool = True):
        self.model, self.streamer, self.k = model, streamer, microbatches
        self.backbone, self.head = causal_lm_parts(model)
        self.layers = streamer.layers
        self.gpu_layers = gpu_layers
        self.store = BoundaryStore(len(self.layers), microbatches, gpu_layers, streamer.device, pin)
        trainable = [any(p.requires_grad for p in layer.parameters()) for layer in self.layers]
        self._after_trainable = [any(trainable[:i]) for i in range(len(self.layers) + 1)]
        self._calls: list[list[tuple[tuple, dict]]] = []
        self._embedded: list[torch.Tensor] = []

    @contextlib.contextmanager
    def _driving(self):
        """The streamer's hooks off (this class fetches the layers) and the layers not checkpointed."""
        flags = [layer.gradient_checkpointing for layer in self.layers]
        self.streamer.driven = True
        for layer in self.layers:
            layer.gradient_checkpointing = False
        try:
            yield
        finally:
            self.streamer.driven = False
            for layer, flag in zip(self.layers, flags):
                layer.gradient_checkpointing = flag

    def _needs_grad(self, i: int) -> bool:
        """Whether the resident model's input of layer ``i`` (``len(layers)``: the final norm's) requires grad."""
        return self._after_trainable[i] or any(e.requires_grad for e in self._embedded)

    def forward(self, input_ids: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run every decoder layer on every microbatch (``input_ids``: int64 ``[batch, seq]`` each, on the
        device), layer by layer, keeping each layer's inputs in the boundary store. Returns the last layer's
        outputs (``[batch, seq, hidden]``, detached), one per microbatch."""
        with self._driving():
            return self._forward(input_ids)

    def _forward(self, input_ids: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(input_ids) != self.k:
            raise ValueError(f"layer-major streaming: {len(input_ids)} microbatches, planned for {self.k}")
        captured = [capture_layer_calls(self.backbone, self.layers, ids) for ids in input_ids]
        self._embedded = [e for e, _ in captured]
        self._calls = [calls for _, calls in captured]
        hidden = [e.detach() for e in self._embedded]
        for i, layer in enumerate(self.layers):
            self.streamer.use(i, +1)
            grad = self._needs_grad(i)
            for m in range(self.k):
                x = hidden[m]
                self.store.put(i, m, x)
                args, kwargs = self._calls[m][i]
                with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_drop, _never):
                    out = layer(x.detach().requires_grad_(grad), *args, **kwargs)
                hidden[m] = out.detach()
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's logits of a last-layer output (final norm, then the head), as the model's forward gives."""
        return self.head(self.backbone.norm(hidden))

    def _loss_backward(self, hidden: list[torch.Tensor], labels: list[torch.Tensor],
                       accum: int) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Per microbatch: final norm, chunked loss, ``(loss / accum).backward()``. Returns the sum of the
        microbatches' losses and the gradients at the last layer's outputs."""
        loss_sum = torch.zeros((), device=self.streamer.device, dtype=torch.float32)
        grads: list[torch.Tensor | None] = []
        grad = self._needs_grad(len(self.layers))
        for m in range(self.k):
            y = hidden[m].requires_grad_(grad)
            hidden[m] = None
            loss = head_loss(self.model, self.backbone.norm(y), labels[m])
            (loss / accum).backward()
            grads.append(y.grad)
            loss_sum += loss.detach()
        return loss_sum, grads

    def _backward(self, grads: list[torch.Tensor | None]) -> None:
        """Each layer in reverse, fetched once: per microbatch its recomputation from the boundary input and
        the backward of the gradient from the layer above; then the embeddings' backward if they need one."""
        for i in reversed(range(len(self.layers))):
            layer = self.layers[i]
            self.streamer.use(i, -1)
            grad = self._needs_grad(i)
            for m in range(self.k):
                x = self.store.take(i, m).requires_grad_(grad)
                args, kwargs = self._calls[m][i]
                out = layer(x, *args, **kwargs)
                if out.requires_grad and grads[m] is not None:
                    torch.autograd.backward(out, grads[m])
                grads[m] = x.grad if grad else None
                del x, out
        for e, g in zip(self._embedded, grads):
            if e.requires_grad and g is not None:
                torch.autograd.backward(e, g)
        self._calls, self._embedded = [], []

    def step(self, batches: list[tuple[torch.Tensor, torch.Tensor]], accum: int) -> torch.Tensor:
        """Forward and backward of the ``k`` microbatches ``(input_ids, labels)`` (int64 ``[batch, seq]`` on the
        device), each loss scaled by ``1 / accum``; adapter gradients accumulate in ``.grad``. Returns the sum of
        the microbatches' mean losses (0-d float32 on the device, not read)."""
        from torch.profiler import record_function

        with self._driving():
            with record_function("step.forward"):
                hidden = self._forward([ids for ids, _ in batches])
            with record_function("step.backward"):
                loss_sum, grads = self._loss_backward(hidden, [y for _, y in batches], accum)
                self._backward(grads)
        return loss_sum

    def report(self) -> dict:
        """``microbatches``, ``boundary_gpu_layers``, ``boundary_host_layers``, ``boundary_host_bytes`` (host
        buffers), ``boundary_d2h_bytes`` and ``boundary_h2d_bytes`` (cumulative copies)."""
        return {"microbatches": self.k, "boundary_gpu_layers": self.gpu_layers,
                "boundary_host_layers": len(self.layers) - self.gpu_layers,
                "boundary_host_bytes": self.store.host_bytes, "boundary_pinned": self.store.pin,
                "boundary_d2h_bytes": self.store.d2h_bytes, "boundary_h2d_bytes": self.store.h2d_bytes}


# ---------------------------------------------------------------------------------------------------- planning

AUTO_HEADROOM = 0.02
"""Share of the budget that ``boundaryStore: auto`` leaves free when it can: the caching allocator's fragmentation
varies from run to run by more than the planner's error (on 2026-12-03 a layer-major 10.5 B ``qwen3_5_moe_text``
run planned 15 MB under its 4 GiB cap ran once and ran out of memory the next time, 134 MB short)."""


def boundary_gpu_layers(mode: str, layers: int, cap: int | None, peak) -> int:
    """How many of the last decoder layers keep their layer-major boundary inputs on the GPU:
    ``boundaryStore`` ``mode`` ``gpu``: all ``layers``; ``host``: none; ``auto``: the most whose predicted peak
    (``peak(n)``, bytes) fits ``cap`` less :data:`AUTO_HEADROOM` of it, or, when none does, the most that fit
    ``cap`` itself (0 when none does; all when ``cap`` is None)."""
    if mode == "host":
        return 0
    if mode == "gpu" or cap is None:
        return layers
    for limit in (cap * (1 - AUTO_HEADROOM), cap):
        fit = next((n for n in range(layers, -1, -1) if peak(n) <= limit), None)
        if fit is not None:
            return fit
    return 0


def layer_major_advice(at, tokens: int, k: int, layers: int, ls, cap: int, per_layer: int,
                        comp: dict[str, int]) -> str | None:
    """What to change when the layer-major plan does not fit ``cap``: ``boundaryStore`` when ``gpu`` is the
    cause, else fewer microbatches per step or ``layerMajor: false``; None when neither fits (the caller
    then advises on the tokens per microbatch). ``at(tokens, microbatches, gpu_layers)`` gives ``(components,
    peak)``; ``per_layer``: one layer's boundary bytes for the ``k`` microbatches."""
    from pitlab.trainer.plan_streaming import bytes_text

    if ls.boundary_store == "gpu" and at(tokens, k, 0)[1] <= cap:
        return (f"training.layerStreaming.boundaryStore: gpu keeps the inputs of all {layers} decoder layers for "
                f"the {k} microbatches on the GPU ({bytes_text(layers * per_layer)}); set boundaryStore: auto or "
                "host (page-locked host memory)")
    fewer = next((m for m in range(k - 1, 1, -1) if at(tokens, m, 0)[1] <= cap), None)
    options = [f"set training.gradientAccumulationSteps: {fewer} or less (now {k})"] if fewer else []
    single = at(tokens, 1, layers)[1]
    if single <= cap:
        options.append(f"set training.layerStreaming.layerMajor: false (one microbatch at a time, predicted "
                       f"{bytes_text(single)})")
    if not options:
        return None
    return (f"layer-major order over training.gradientAccumulationSteps: {k} microbatches holds the others' hidden "
            f"states or gradients between layers (microbatch_carry {bytes_text(comp['microbatch_carry'])}) "
            f"and {bytes_text(comp['checkpoints'])} of checkpoints on the GPU: " + " or ".join(options))
