"""Pre-flight memory plan of a layer-streaming run (``training.layerStreaming``; :mod:`pitlab.trainer.streaming`).

GPU bytes by component (``T`` tokens per microbatch = ``microBatchSize × seqLen``, ``H`` hidden size, ``V``
vocabulary, ``L`` decoder layers, ``c`` compute bytes: 2 with ``bf16``, 4 with ``fp32``; ``A`` adapter
parameters), all counted on the meta-device model the trainer builds (no memory, no weights read):

- ``resident``: every parameter outside the decoder layers' frozen weights at its stored dtype — final norm,
  the head, the rotary buffers, the input embedding when it is tied to the head or trained (a frozen untied one
  stays in the host store, :func:`pitlab.trainer.streaming.host_embedding`) — and the float32 adapter (``4 A``).
- ``adapter_state``: float32 adapter gradients and AdamW's two states, ``12 A``.
- ``layer_slots``: ``buffers`` slots, each the largest decoder layer's frozen weights (the flat layout of
  :func:`pitlab.trainer.streaming.layer_layout`, offsets aligned to 512 bytes).
- ``checkpoints``: each decoder layer's input kept for its recomputation, ``L T H c``, plus the final norm's
  input, float32 statistics and output, ``T H (2c + 4)``. Layer-major (``layerMajor`` with ``k =
  gradientAccumulationSteps`` > 1, :mod:`pitlab.trainer.layer_major`): ``G k T H c`` for the ``G`` layers whose
  boundary inputs stay on the GPU (``boundaryStore``; ``auto``: the largest ``G`` that fits the budget less
  :data:`~pitlab.trainer.layer_major.AUTO_HEADROOM` of it, else the largest that fits it, all
  ``L`` when no budget is known); the other ``(L - G) k T H c`` bytes are page-locked host memory.
- ``microbatch_carry`` (layer-major only): the other ``k - 1`` microbatches' hidden states (forward) or
  gradients (backward) between layers, ``(k - 1) T H c``, plus two host boundaries being copied back when
  ``G < L``, ``2 T H c``.
- ``layer_recompute``: one decoder layer recomputed in backward: its saved tensors (the planner's
  ``layer_activation_elems × T × c``, :func:`pitlab.trainer.plan.model_shape`), the adapter's float32 inputs,
  ranks and outputs (``(in + r + out) × 4 × T`` per LoRA module; peft casts the input to the adapter's dtype),
  and the gradients entering and leaving the layer, ``2 T H c``.
- ``logits_chunk``: one chunk of :func:`pitlab.trainer.streaming.chunked_cross_entropy`, ``chunk × V × (c +
  12)`` (compute-dtype logits, float32 logits, log-softmax and gradient) plus the hidden-state gradient
  ``T H c``; ``chunk`` from :func:`pitlab.trainer.streaming.logits_chunk_tokens`.
- ``allocator_slack``: 5 % of the rest (the caching allocator's block rounding and splitting).

Peak = resident + adapter_state + layer_slots + checkpoints + microbatch_carry + max(layer_recompute,
logits_chunk) + slack, the bytes the caching allocator holds at the worst moment (compare with
``torch.cuda.max_memory_reserved``). The host store (``host_bytes``) is host memory and is reported beside the
GPU panel; page-locked (``pinHost`` with a CUDA device) it takes ``host_pinned_bytes``, each layer's allocation
rounded up to a power of two by torch's caching host allocator (about 17 % more for an 8B Llama's 436 MB layers).

The budget is the smallest of: ``training.layerStreaming.gpuMemoryBudgetBytes``; ``resources.gpuMemoryGiB``
(or ``pitlab plan --gpu-memory-gib``) less :data:`CUDA_CONTEXT_BYTES` (the CUDA context lives outside the
allocator); and, in the trainer on CUDA, the per-process cap of the caching allocator. The cap set with
``torch.cuda.set_per_process_memory_fraction`` is invisible to ``torch.cuda.mem_get_info`` (which reports the
device's free memory); it is read with ``torch.cuda.get_per_process_memory_fraction`` (torch ≥ 2.9) or,
failing that, from ``per_process_memory_fraction`` in ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF``,
and multiplied by ``torch.cuda.get_device_properties(device).total_memory``; without a cap the device's free
memory (``mem_get_info``) is the bound.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from pitlab.api import SpecError
from pitlab.errors import InputError
from pitlab.trainer.plan import GiB, MemoryPlan, ModelShape, count_text, model_shape, spec_config

SLACK = 0.05
CUDA_CONTEXT_BYTES = 512 * 2 ** 20
COMPONENTS = ("resident", "adapter_state", "layer_slots", "checkpoints", "microbatch_carry", "layer_recompute",
              "logits_chunk", "allocator_slack")


class StreamingBudgetError(InputError, ValueError):
    """A layer-streaming run whose predicted GPU peak exceeds its budget (the message names both and what to
    change). Exit code 2, ``InvalidSpec``."""


@dataclass(frozen=True)
class StreamingShape:
    """What the streaming plan needs of the model, in bytes (from the meta-device LoRA model).

    ``resident``: parameters and buffers that stay on the GPU; ``adapter``: adapter parameters (count);
    ``slot``: one slot (the largest layer's frozen weights, aligned); ``host``: all layers' frozen weights
    (and a host-side input embedding); ``host_pinned``: the page-locked bytes they take (torch's caching host
    allocator rounds each allocation, one per layer and dtype, up to a power of two);
    ``lora_act_per_token``: the largest layer's adapter activation bytes per token."""

    resident: int
    adapter: int
    slot: int
    host: int
    host_pinned: int
    lora_act_per_token: int


def pinned_bytes(nbytes: int) -> int:
    """Page-locked bytes torch's caching host allocator takes for an allocation of ``nbytes`` (the next power of
    two; ``ATen/core/CachingHostAllocator.h`` with the default ``pinned_max_round_threshold``); 0 for 0."""
    return 0 if nbytes <= 0 else 1 << (nbytes - 1).bit_length()


def streaming_shape(config, lora, precision: str) -> StreamingShape:
    """:class:`StreamingShape` of ``config``'s causal LM with ``lora`` (a ``LoraSpec``) as the trainer builds
    it: float32, peft LoRA, frozen parameters in bfloat16 with ``precision == "bf16"`` (meta device)."""
    from peft.tuners.lora.layer import Linear as LoraLinear
    from transformers import AutoModelForCausalLM

    from pitlab.trainer.fsdp import decoder_layers
    from pitlab.trainer.lora import apply_lora
    from pitlab.trainer.streaming import host_embedding, layer_layout

    with torch.device("meta"):
        model = apply_lora(AutoModelForCausalLM.from_config(config, dtype=torch.float32), r=lora.r,
                           alpha=lora.alpha, dropout=lora.dropout, target_modules=list(lora.target_modules))
        if precision == "bf16":
            for p in model.parameters():
                if not p.requires_grad:
                    p.data = p.data.to(torch.bfloat16)
    layers = decoder_layers(model)
    layouts = [layer_layout(layer) for layer in layers]
    streamed = {id(p) for layer in layers for p in layer.parameters() if not p.requires_grad}
    emb = host_embedding(model)
    host_emb = 0 if emb is None else emb.weight.numel() * emb.weight.element_size()
    if emb is not None:
        streamed.add(id(emb.weight))
    resident = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in streamed)
    resident += sum(b.numel() * b.element_size() for b in model.buffers())
    slot_numel: dict[torch.dtype, int] = {}
    for layout in layouts:
        for d, n in layout.numel.items():
            slot_numel[d] = max(slot_numel.get(d, 0), n)
    slot = sum(n * torch.empty((), dtype=d).element_size() for d, n in slot_numel.items())
    lora_act = [sum(4 * (m.in_features + max(m.r.values()) + m.out_features)
                    for m in layer.modules() if isinstance(m, LoraLinear)) for layer in layers]
    return StreamingShape(resident=resident, adapter=sum(p.numel() for p in model.parameters() if p.requires_grad),
                          slot=slot, host=sum(layout.nbytes for layout in layouts) + host_emb,
                          host_pinned=sum(pinned_bytes(n * torch.empty((), dtype=d).element_size())
                                          for layout in layouts for d, n in layout.numel.items())
                          + pinned_bytes(host_emb),
                          lora_act_per_token=max(lora_act))


@dataclass
class StreamingPlan(MemoryPlan):
    """The layer-streaming plan: GPU ``components`` (:data:`COMPONENTS`), ``peak_bytes``, ``capacity_bytes``
    (the budget, None when none is known) and ``budget_source`` (which setting gave it), ``host_bytes`` (the
    frozen layers' host store), ``buffers``, ``chunk_tokens`` (loss chunk) and ``tokens`` (per microbatch).
    Layer-major order (``layer_major``): ``microbatches`` per layer, ``boundary_gpu_layers`` (the last layers
    whose boundary inputs stay on the GPU), ``boundary_host_bytes`` / ``boundary_host_pinned_bytes`` (the
    others' host buffers); ``host_to_gpu_bytes``: host→GPU bytes per optimizer step (layers and boundaries)."""

    host_bytes: int = 0
    host_pinned_bytes: int = 0
    pinned: bool = True
    buffers: int = 2
    chunk_tokens: int = 0
    tokens: int = 0
    budget_source: str | None = None
    advice: str = ""
    layer_major: bool = False
    microbatches: int = 1
    boundary_gpu_layers: int = 0
    boundary_host_bytes: int = 0
    boundary_host_pinned_bytes: int = 0
    host_to_gpu_bytes: int = 0

    def table(self) -> str:
        """The pre-flight panel: host store, GPU components, predicted peak and budget (GiB and GB; MiB and
        MB when the peak is under 1 GiB)."""
        big = self.peak_bytes >= GiB
        (u1, d1), (u2, d2) = ((("GiB", GiB), ("GB", 1e9)) if big else (("MiB", 2 ** 20), ("MB", 1e6)))

        def row(name: str, v: int, extra: str = "") -> str:
            return f"{name:<22}{v / d1:>10.2f}{v / d2:>10.2f}{extra}"

        rows = [f"{'layer streaming':<22}{u1:>10}{u2:>10}",
                row("host store", self.host_bytes, "  (host memory, not GPU)")]
        if self.pinned:
            rows.append(row("host store pinned", self.host_pinned_bytes,
                            "  (page-locked: power-of-two blocks, with a CUDA device)"))
        if self.layer_major:
            rows.append(row("boundaries on host", self.boundary_host_pinned_bytes if self.pinned else
                            self.boundary_host_bytes, f"  ({self.shape.layers - self.boundary_gpu_layers} layers x "
                                                      f"{self.microbatches} microbatches, host memory)"))
        for k in COMPONENTS:
            if k == "microbatch_carry" and not self.layer_major:
                continue
            extra = {"layer_slots": f"  ({self.buffers} slots)",
                     "checkpoints": f"  ({self.boundary_gpu_layers} layers' boundaries on the GPU)"
                     if self.layer_major else "",
                     "logits_chunk": f"  ({self.chunk_tokens} of {self.tokens} tokens per chunk)"}.get(k, "")
            rows.append(row(k, self.components[k], extra))
        rows.append(row("predicted peak", self.peak_bytes))
        if self.capacity_bytes is not None:
            rows.append(row("budget", self.capacity_bytes, f"  ({self.budget_source})"))
        return "\n".join(rows + self.notes)

    def refusal(self, source: str | None = None) -> str:
        """Why the run does not fit: the prediction, the budget and the setting that gave it
        (``budget_source``; ``source`` is ignored), and what to change."""
        return (f"training.layerStreaming: predicted GPU peak {bytes_text(self.peak_bytes)} exceeds the budget "
                f"{bytes_text(self.capacity_bytes)} ({self.budget_source}); {self.advice}")


def _components(s: StreamingShape, shape: ModelShape, tokens: int, c: int, buffers: int, chunk: int,
                k: int = 1, gpu_layers: int | None = None) -> dict[str, int]:
    th = tokens * shape.hidden
    gpu_layers = shape.layers if gpu_layers is None else gpu_layers
    comp = {
        "resident": s.resident,
        "adapter_state": 12 * s.adapter,
        "layer_slots": buffers * s.slot,
        "checkpoints": gpu_layers * k * th * c + th * (2 * c + 4),
        "microbatch_carry": 0 if k == 1 else (k - 1) * th * c + (2 * th * c if gpu_layers < shape.layers else 0),
        "layer_recompute": tokens * (shape.layer_activation_elems * c + s.lora_act_per_token) + 2 * th * c,
        "logits_chunk": chunk * shape.vocab * (c + 12) + th * c,
    }
    rest = sum(v for k, v in comp.items() if k not in ("layer_recompute", "logits_chunk"))
    rest += max(comp["layer_recompute"], comp["logits_chunk"])
    comp["allocator_slack"] = int(SLACK * rest)
    return comp


def _peak(comp: dict[str, int]) -> int:
    return sum(v for k, v in comp.items() if k not in ("layer_recompute", "logits_chunk")) + max(
        comp["layer_recompute"], comp["logits_chunk"])


def plan_streaming(spec, shape: ModelShape | None = None, sshape: StreamingShape | None = None,
                   budget: tuple[int, str] | None = None, gpu_memory_gib: float | None = None) -> StreamingPlan:
    """Plan ``spec`` (a ``PitTrainingSpec`` with ``training.layerStreaming.enabled``); see the module docstring.

    ``shape``/``sshape`` default to those of :func:`pitlab.trainer.plan.spec_config`; ``budget`` ``(bytes,
    source)`` defaults to :func:`spec_budget` (``gpu_memory_gib`` overrides ``resources.gpuMemoryGiB``)."""
    from pitlab.trainer.layer_major import boundary_gpu_layers, layer_major_advice
    from pitlab.trainer.streaming import logits_chunk_tokens

    tr, ls = spec.training, spec.training.layer_streaming
    if shape is None or sshape is None:
        config = spec_config(spec)
        shape = shape or model_shape(config)
        try:
            sshape = sshape or streaming_shape(config, spec.lora, tr.precision)
        except ValueError as err:
            raise SpecError([("spec.lora.targetModules", str(err).split(": ", 1)[-1])]) from None
    c = 2 if tr.precision == "bf16" else 4
    tokens = tr.micro_batch_size * tr.seq_len
    k = tr.gradient_accumulation_steps if ls.layer_major else 1  # microbatches through each fetched layer
    L = shape.layers

    def at(t: int, micro: int = k, gpu_layers: int = L) -> tuple[dict[str, int], int]:
        chunk = logits_chunk_tokens(shape.vocab, c, t)
        comp = _components(sshape, shape, t, c, ls.buffers, chunk, micro, gpu_layers)
        return comp, _peak(comp)

    cap, source = budget if budget is not None else spec_budget(spec, gpu_memory_gib)
    gpu = boundary_gpu_layers(ls.boundary_store, L, cap, lambda n: at(tokens, k, n)[1]) if k > 1 else L
    comp, peak = at(tokens, k, gpu)
    per_layer = k * tokens * shape.hidden * c  # one layer's boundary inputs for the k microbatches
    host_b, pinned_b = ((L - gpu) * per_layer, (L - gpu) * pinned_bytes(per_layer)) if k > 1 else (0, 0)
    h2d = bytes_per_step(sshape, L, ls.buffers, tr, host_b)
    notes = [f"model: {shape.model_type}, {count_text(shape.total)} parameters, {L} decoder layers "
             f"streamed from host memory; LoRA r={spec.lora.r} on {', '.join(spec.lora.target_modules)}: "
             f"{count_text(sshape.adapter)} adapter parameters resident with their AdamW state",
             f"host→GPU per optimizer step: {_gb(h2d)} (each layer once in forward and again in backward"
             + (f" for all {k} microbatches (layer-major), plus {_gb(host_b)} of boundary activations back from "
                f"host memory" if k > 1 else "") + f", less the {ls.buffers} layers still in the slots at each turn)"]
    if k > 1:
        notes.append(f"layer-major: boundary activations ({_gb(per_layer)} per layer): {gpu} of {L} layers on the "
                     f"GPU, {L - gpu} in host memory ({_gb(pinned_b if ls.pin_host else host_b)}; boundaryStore: "
                     f"{ls.boundary_store}{', no budget known' if cap is None and ls.boundary_store == 'auto' else ''}"
                     ")")
    notes.append(_host_store_note(ls.host_store, sshape.host_pinned if ls.pin_host else sshape.host))
    advice = ""
    if cap is not None and peak > cap:
        advice = (layer_major_advice(at, tokens, k, L, ls, cap, per_layer, comp) if k > 1 else None) or _advice(
            lambda t: at(t, k, gpu), tokens, tr, ls, cap, comp)
    return StreamingPlan(world_size=1, components=comp, peak_bytes=peak, capacity_bytes=cap, shape=shape,
                         notes=notes, host_bytes=sshape.host, host_pinned_bytes=sshape.host_pinned,
                         pinned=ls.pin_host, buffers=ls.buffers,
                         chunk_tokens=logits_chunk_tokens(shape.vocab, c, tokens), tokens=tokens,
                         budget_source=source, advice=advice, layer_major=k > 1, microbatches=k,
                         boundary_gpu_layers=gpu if k > 1 else 0, boundary_host_bytes=host_b,
                         boundary_host_pinned_bytes=pinned_b, host_to_gpu_bytes=h2d)


def _host_store_note(mode: str, host_bytes: int) -> str:
    """The panel's host-store line: what ``hostStore`` ``mode`` gives on this machine (its MemAvailable; the
    trainer decides again on its own host), with the warning when ``auto`` falls back to ``mmap``."""
    available = available_host_memory()
    if mode == "mmap":
        return ("host store: memory-mapped file under the run directory (hostStore: mmap; not pinned); "
                + MMAP_SPEED_NOTE.format(cold=MMAP_COLD_GBPS, warm=MMAP_WARM_GBPS))
    have = "MemAvailable unknown" if available is None else f"{available / 1e9:.1f} GB available here (MemAvailable)"
    try:
        store, warning = choose_host_store(mode, host_bytes, available)
    except StreamingBudgetError:
        return (f"host store: REFUSED on this machine: it needs {host_bytes / 1e9:.1f} GB plus 10 % but {have}; "
                "set training.layerStreaming.hostStore: mmap or auto")
    if store == "memory":
        return f"host store: in memory (hostStore: {mode}; {have})"
    return "WARNING: " + warning


def bytes_per_step(sshape: StreamingShape, layers: int, buffers: int, tr, boundary_bytes: int = 0) -> int:
    """Host→GPU bytes of one optimizer step: per pass every layer's frozen weights are copied for the forward
    and again for the backward, except the ``buffers`` layers still in their slots at each turn (the first
    ones after a backward, the last ones after a forward): ``2 (L - buffers) × slot`` per pass (an upper
    bound: the slot size is the largest layer's). A pass is one microbatch, or all of a step's microbatches
    in layer-major order (``layerMajor`` with ``gradientAccumulationSteps`` > 1), which also copies back the
    ``boundary_bytes`` of boundary activations kept in host memory."""
    k = tr.gradient_accumulation_steps
    passes = 1 if k > 1 and tr.layer_streaming.layer_major else k
    return 2 * max(0, layers - buffers) * sshape.slot * passes + boundary_bytes


def _advice(at, tokens: int, tr, ls, cap: int, comp: dict[str, int]) -> str:
    """What to change so that the plan ``at(tokens)`` fits ``cap``: the tokens per microbatch that fit, else
    the fixed part and the slots."""
    lo, hi = 0, tokens  # the largest t with peak(t) <= cap (peak grows with t)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if at(mid)[1] <= cap:
            lo = mid
        else:
            hi = mid - 1
    if lo >= tr.seq_len:
        m = lo // tr.seq_len
        return (f"at most {m} sequence(s) of seqLen {tr.seq_len} per microbatch fit: set training.microBatchSize: "
                f"{m} (now {tr.micro_batch_size}; raise training.gradientAccumulationSteps to keep the tokens per "
                "step), or raise the budget")
    if lo >= 8:
        return (f"not one sequence of seqLen {tr.seq_len} fits (at most {lo} tokens per microbatch): set "
                f"training.seqLen: {lo} or less and training.microBatchSize: 1, or raise the budget")
    fixed = comp["resident"] + comp["adapter_state"] + comp["layer_slots"]
    fix = (f"set training.layerStreaming.buffers: 2 (now {ls.buffers}) or " if ls.buffers > 2 else "")
    return (f"the fixed part alone needs {bytes_text(fixed)} (layer slots {bytes_text(comp['layer_slots'])}, "
            f"resident weights (head, norms, adapter) {bytes_text(comp['resident'])}, adapter state "
            f"{bytes_text(comp['adapter_state'])}): {fix}raise the budget (a GPU with more memory)")


def bytes_text(n: int) -> str:
    """``n`` bytes for people: ``3.22 GiB`` from 1 GiB up, else ``31.32 MiB``."""
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2 ** 20:.2f} MiB"


def spec_budget(spec, gpu_memory_gib: float | None = None) -> tuple[int | None, str | None]:
    """``(bytes, source)``: the smallest GPU budget the spec gives: ``training.layerStreaming.
    gpuMemoryBudgetBytes`` and ``resources.gpuMemoryGiB`` (``gpu_memory_gib``, from ``--gpu-memory-gib``,
    overrides it) less :data:`CUDA_CONTEXT_BYTES`; ``(None, None)`` when neither is set."""
    found = []
    b = spec.training.layer_streaming.gpu_memory_budget_bytes
    if b is not None:
        found.append((b, f"training.layerStreaming.gpuMemoryBudgetBytes = {b}"))
    gib = gpu_memory_gib if gpu_memory_gib is not None else spec.resources.gpu_memory_gib
    if gib is not None:
        name = "--gpu-memory-gib" if gpu_memory_gib is not None else "spec.resources.gpuMemoryGiB"
        found.append((int(gib * GiB) - CUDA_CONTEXT_BYTES, f"{name} = {gib:g} GiB less 0.5 GiB of CUDA context"))
    return min(found) if found else (None, None)


def memory_fraction(device: torch.device) -> float | None:
    """The caching allocator's per-process cap on ``device`` as a fraction of its memory, None when unknown:
    ``torch.cuda.get_per_process_memory_fraction`` where torch has it, else ``per_process_memory_fraction`` in
    ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF`` (``torch.cuda.mem_get_info`` cannot see either)."""
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if getter is not None:
        return float(getter(device))
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        for item in os.environ.get(var, "").split(","):
            key, _, value = item.partition(":")
            if key.strip() == "per_process_memory_fraction":
                return float(value)
    return None


def device_budget(device: torch.device) -> tuple[int | None, str | None]:
    """``(bytes, source)`` the caching allocator may hold on ``device``: ``fraction × total memory`` when a
    per-process fraction below 1 is set (:func:`memory_fraction`), else the free memory
    (``torch.cuda.mem_get_info``); ``(None, None)`` off CUDA."""
    if device.type != "cuda":
        return None, None
    total = torch.cuda.get_device_properties(device).total_memory
    frac = memory_fraction(device)
    if frac is not None and frac < 1.0:
        return int(frac * total), f"torch.cuda.set_per_process_memory_fraction({frac:g}) of {total / GiB:.1f} GiB"
    free, _ = torch.cuda.mem_get_info(device)
    return int(free) + torch.cuda.memory_reserved(device), "free memory of the GPU (torch.cuda.mem_get_info)"


def check_spec_fits(spec) -> StreamingPlan:
    """The plan of ``spec`` against the budget the spec gives (:func:`spec_budget`); raises
    :class:`pitlab.api.SpecError` naming ``spec.training.layerStreaming`` with :meth:`StreamingPlan.refusal`'s
    reasons when it does not fit (a pre-flight check: no GPU needed)."""
    plan = plan_streaming(spec)
    if plan.fits is False:
        raise SpecError([("spec.training.layerStreaming", plan.refusal().split(": ", 1)[1])])
    return plan


def available_host_memory() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (Linux), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_host_memory(host_bytes: int, available: int | None = None) -> None:
    """Raise :class:`StreamingBudgetError` when the host store (``host_bytes``, bytes; the pinned bytes when it
    is page-locked) cannot fit the host's
    available memory (``available``, default :func:`available_host_memory`): the load holds the model once
    plus one layer, so the store plus 10 % must fit."""
    available = available_host_memory() if available is None else available
    if available is not None and host_bytes * 1.1 > available:
        raise StreamingBudgetError(
            f"training.layerStreaming: the host store needs {host_bytes / 1e9:.1f} GB of host memory (frozen decoder "
            f"layers and input embedding, plus 10 % while loading) but {available / 1e9:.1f} GB are available "
            "(MemAvailable); set training.layerStreaming.hostStore: mmap (or auto) for a memory-mapped store "
            "under the run directory (slower), or use a machine with more memory or a smaller model")


# Measured on the development host (2 shared cores, virtio disk; bench/RESULTS.md, "memory-mapped host store"):
# reading the store file cold from disk, warm from the page cache, and a pinned host→GPU copy on PCIe (H200, 4.0 ×16
# class, measured for the 8B run); the warning quotes them as orders of magnitude.
MMAP_SPEED_NOTE = ("copies from a memory-mapped store are synchronous (pageable pages, staged by the CUDA "
                   "driver; pinHost does not apply) and bound by the disk and page cache rather than pinned PCIe "
                   "bandwidth: reading the store ran at about {cold} GB/s cold from disk and {warm} GB/s from the "
                   "page cache on the development host, against 55 GB/s pinned host→GPU measured on an H200 "
                   "(bench/RESULTS.md), so expect steps several times slower once the store is not in the page cache")
MMAP_COLD_GBPS, MMAP_WARM_GBPS = "1.3", "4.5"


def mmap_warning(host_bytes: int, available: int, store_dir=None) -> str:
    """The warning of ``hostStore: auto`` choosing the memory-mapped store: the bytes, MemAvailable and the
    speed cost (:data:`MMAP_SPEED_NOTE`)."""
    where = f" ({store_dir}/layers.store)" if store_dir is not None else ""
    return (f"training.layerStreaming: the host store needs {host_bytes / 1e9:.1f} GB of host memory (plus 10 % "
            f"while loading) but {available / 1e9:.1f} GB are available (MemAvailable); hostStore: auto uses a "
            f"memory-mapped store file{where} instead; "
            + MMAP_SPEED_NOTE.format(cold=MMAP_COLD_GBPS, warm=MMAP_WARM_GBPS)
            + "; set hostStore: mmap to silence this, or use a host with more memory")


def choose_host_store(mode: str, host_bytes: int, available: int | None = None,
                      store_dir=None) -> tuple[str, str | None]:
    """``(store, warning)`` for ``training.layerStreaming.hostStore`` ``mode`` and a host store of
    ``host_bytes`` (the pinned bytes when page-locked): ``"mmap"`` for ``mmap``; for ``memory`` and ``auto``
    ``"memory"`` when the store plus 10 % fits ``available`` (default :func:`available_host_memory`; unknown
    counts as fitting), else ``memory`` raises :class:`StreamingBudgetError` (:func:`check_host_memory`) and
    ``auto`` gives ``"mmap"`` with :func:`mmap_warning`."""
    if mode == "mmap":
        return "mmap", None
    available = available_host_memory() if available is None else available
    if available is None or host_bytes * 1.1 <= available:
        return "memory", None
    if mode == "memory":
        check_host_memory(host_bytes, available)
    return "mmap", mmap_warning(host_bytes, available, store_dir)


def check_budget(spec, config=None, device: torch.device | None = None) -> StreamingPlan:
    """The plan of ``spec`` against the smallest budget of :func:`spec_budget` and (on CUDA) :func:`device_budget`;
    raises :class:`StreamingBudgetError` with :meth:`StreamingPlan.refusal` when it does not fit. ``config``:
    the model's transformers config (default: :func:`pitlab.trainer.plan.spec_config`)."""
    config = config if config is not None else spec_config(spec)
    found = [b for b in (spec_budget(spec), device_budget(device) if device is not None else (None, None))
             if b[0] is not None]
    plan = plan_streaming(spec, model_shape(config), streaming_shape(config, spec.lora, spec.training.precision),
                          budget=min(found) if found else (None, None))
    if plan.fits is False:
        raise StreamingBudgetError(plan.refusal())
    return plan


def _gb(n: int) -> str:
    """``n`` bytes as GB with two decimals, or as MB below 0.1 GB (so a small run does not read 0.00 GB)."""
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
