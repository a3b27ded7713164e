"""Memory planner: per-GPU bytes of a PitTraining run by component, before any GPU is taken.

Model of what pitlab's trainer does (:mod:`pitlab.trainer.train`, :mod:`pitlab.trainer.fsdp`): the model is
loaded in float32 and sharded with FSDP2 ``fully_shard`` per decoder layer and at the root over
``W = nodes × gpusPerNode`` ranks; with ``precision: bf16`` the ``MixedPrecisionPolicy`` computes in
bfloat16 (2 bytes) and reduces gradients in float32 (4 bytes). Torch AdamW keeps two float32 states.

Components (bytes per GPU; ``P`` parameters, ``P_root`` those outside the decoder layers — embeddings,
final norm, untied ``lm_head`` —, ``P_layer`` the largest decoder layer, ``c`` compute bytes, ``T`` tokens
per microbatch = ``microBatchSize × seqLen``):

- ``parameters``: sharded float32 parameters, ``4 P / W``.
- ``gradients``: sharded float32 gradients, ``4 P / W``.
- ``optimizer``: AdamW ``exp_avg`` + ``exp_avg_sq``, ``8 P / W`` (ZeRO-3 accounting, Rajbhandari et al.
  2020, "ZeRO", §3: 16 bytes per parameter for mixed-precision Adam, here all sharded).
- ``unsharded_parameters``: all-gathered compute-dtype copies in flight: the root's (FSDP2 keeps the root
  unsharded between forward and backward) plus the current and the prefetched layer,
  ``c (P_root + 2 P_layer)``; full-weight training on one GPU keeps every layer's copy from forward to backward
  (:func:`pitlab.trainer.fsdp.reshard_after_forward`): ``c P``.
- ``gradient_buffers``: the root's unsharded compute-dtype gradients (held until the end of backward)
  and one layer's unsharded gradients plus its float32 reduce-scatter input, ``c P_root + (c + 4) P_layer``.
- ``accumulation``: with ``gradientSyncEveryMicrobatch: false`` and accumulation > 1, FSDP2 keeps every
  gradient unsharded between microbatches, upcast to the reduce dtype (``FSDPParam.
  to_accumulated_grad_if_needed``): ``4 P`` (float32 reduce) — the same 35B model with bf16 gradients (the
  published recipe) holds ``2 P`` ≈ 70 GB. Zero otherwise (reduce-scatter every microbatch).
- ``activations``: with activation checkpointing, each decoder layer's input (``L T H c``) plus one layer
  recomputed in backward; without, every layer's saved tensors. One layer's saved tensors are estimated as
  the inputs and outputs of each of its matrix products (linear layers; routed experts counted
  ``num_experts_per_tok`` times) in the compute dtype, plus float32 RMSNorm inputs (``8 T H`` for two
  norms) — an estimate in the spirit of Korthikanti et al. 2022, "Reducing Activation Recomputation in
  Large Transformer Models", §4.1, with flash/SDPA attention (no ``S²`` term).
- ``logits``: the loss head at its peak. ``loss: reference``: compute-dtype logits, their float32 copy,
  log-softmax and its gradient, ``T V (c + 12)``. ``loss: chunked`` (:mod:`pitlab.trainer.loss`): the
  compute-dtype gradient of the logits plus one chunk's logits, ``T V c + min(T, C) V c`` (twice the chunk term
  when ``T > C``, ``C`` = 4,096 tokens); its gradients of the hidden states and of the head, ``(T + V) H c``, are
  kept until backward.
- ``reserve``: CUDA context and allocator fragmentation, a fixed 2 GiB.

``method: lora`` (:mod:`pitlab.trainer.lora`; ``A`` adapter parameters, ``A_root`` / ``A_layer`` those outside
the decoder layers / in the layer with the most): the frozen base is stored in the compute dtype (``c_b = 2``
bytes with ``bf16``, 4 with ``fp32``) and only the adapter has float32 master weights, gradients and AdamW
states: ``parameters = (c_b P + 4 A) / W``, ``gradients = 4 A / W``, ``optimizer = 8 A / W``,
``accumulation = 4 A`` (without per-microbatch sync), ``unsharded_parameters = c (P_root + A_root + 2 (P_layer +
A_layer))``, ``gradient_buffers = c A_root + (c + 4) A_layer``. Activations and logits are planned as for
full training (an upper bound: a frozen linear layer does not save its input for a weight gradient).

World size 1, ``method: full``, ``precision: bf16`` (:mod:`pitlab.trainer.single_device`: no FSDP2; float32
masters and a bf16 compute copy): ``parameters = 4 P`` (masters), ``optimizer = 8 P``, ``gradients = 4 P``
(float32, the masters'), ``unsharded_parameters = 2 P`` (the compute copy, always resident),
``gradient_buffers = 2 P`` (the copy's bf16 gradients, made in backward and freed when cast into the float32 ones
after it), ``accumulation = 0`` (the float32 gradients are the sum; ``gradientSyncEveryMicrobatch`` has no effect).
Peak = parameters + optimizer + unsharded_parameters + reserve + max(at the loss: saved activations + logits (+
gradients from the second microbatch on); in backward: max(saved activations, gradient_buffers) + the loss's kept
gradients + one layer's working set (+ gradients from the second microbatch on); at the cast: gradient_buffers +
gradients) — 20 bytes per parameter at the cast. With the fused optimizer step (``training.fusedOptimizer``, on
by default on a GPU: :mod:`pitlab.trainer.fused_step`) and one microbatch per step no float32 gradient exists
(``gradients = 0``: after backward parameters + optimizer + the copy + its bf16 gradients, 16 bytes per
parameter); with two the first one's bf16 gradients are held instead (``gradients = 2 P``, 18 bytes;
``ComputeCopy.gather_grads``); with more the float32 sums stay as above. Under FSDP2 it plans as torch's AdamW.

FSDP2 (every other run): Peak = parameters + optimizer + accumulation + reserve + max(phase at the loss:
unsharded_parameters + saved activations + logits (+ gradients from the second microbatch on); phase in backward:
max(unsharded_parameters + saved activations, gradients + the root's and two layers' copies) + gradient_buffers +
the loss's kept gradients + one layer's working set). Gradients do not exist at the loss of a step's first
microbatch (``zero_grad(set_to_none=True)``), and in backward they grow as the activations (and kept layer copies)
are freed. That one-pool peak, without the reserve, is ``allocated_bytes`` (``torch.cuda.max_memory_allocated``:
within +0.4 % to +6.5 % of it on every synchronised run of bench/RESULTS.md). The fit check compares the reserved
peak with ``spec.resources.gpuMemoryGiB``: FSDP2 allocates the float32 gradient shards (``4 P / W``) on its
reduce-scatter stream, whose freed blocks the caching allocator gives to that stream alone, so they are a pool
beside the default stream's peak (every phase without them; bench/RESULTS.md, 2026-12-06).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from pitlab.api import PitTrainingSpec, SpecError
from pitlab.trainer.fsdp import reduces_every_microbatch, reshard_after_forward
from pitlab.trainer.fused_step import fused_step_enabled
from pitlab.trainer.loss import DEFAULT_CHUNK_TOKENS
from pitlab.trainer.plan_remedies import remedies
from pitlab.trainer.single_device import LABEL as SINGLE_DEVICE_LABEL

GiB = 1024 ** 3
RESERVE_BYTES = 2 * GiB
REDUCE_BYTES = 4  # float32 reduce (bf16 policy) or float32 gradients (fp32), per element
COMPONENTS = ("parameters", "gradients", "optimizer", "accumulation", "unsharded_parameters", "gradient_buffers",
              "activations", "logits", "reserve")


@dataclass(frozen=True)
class ModelShape:
    """Parameter counts of a causal LM (counts of scalars, not bytes).

    ``total``: all parameters; ``root``: outside the decoder layers; ``largest_layer``: the biggest decoder
    layer; ``active``: parameters used per token (routed experts counted ``k / E``; the input embedding
    included); ``layer_activation_elems``: estimated saved elements per token of the largest-activation layer
    (see the module docstring); ``hidden``, ``vocab``, ``layers``: from the config; ``full_attention_layers``
    and ``attention_dim`` (heads × head_dim) for the attention FLOP term.
    """

    model_type: str
    total: int
    root: int
    largest_layer: int
    active: int
    layer_activation_elems: int
    hidden: int
    vocab: int
    layers: int
    full_attention_layers: int
    attention_dim: int


@dataclass(frozen=True)
class AdapterShape:
    """LoRA adapter parameter counts (scalars): ``total``, ``root`` (outside the decoder layers) and
    ``largest_layer`` (the decoder layer with the most adapter parameters)."""

    total: int
    root: int
    largest_layer: int


def adapter_shape(config, lora) -> AdapterShape:
    """Count the LoRA adapter parameters peft adds to ``config``'s causal LM for ``lora`` (a ``LoraSpec``:
    ``r × (in_features + out_features)`` per targeted linear layer), built on the meta device (no memory).
    Raises ``ValueError`` naming ``spec.lora.targetModules`` when no module matches."""
    from transformers import AutoModelForCausalLM

    from pitlab.trainer.fsdp import decoder_layers
    from pitlab.trainer.lora import apply_lora

    with torch.device("meta"):
        model = apply_lora(AutoModelForCausalLM.from_config(config), r=lora.r, alpha=lora.alpha,
                           dropout=lora.dropout, target_modules=list(lora.target_modules))
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    per_layer = [sum(p.numel() for p in layer.parameters() if p.requires_grad) for layer in decoder_layers(model)]
    return AdapterShape(total=total, root=total - sum(per_layer), largest_layer=max(per_layer))


@dataclass
class MemoryPlan:
    """Per-GPU bytes by component (:data:`COMPONENTS`), the predicted peak, and the verdict. ``single_device``:
    the plan is of the world-size-1 path without FSDP2 (:mod:`pitlab.trainer.single_device`), which the trainer
    then takes."""

    world_size: int
    components: dict[str, int]
    peak_bytes: int
    capacity_bytes: int | None
    shape: ModelShape
    notes: list[str] = field(default_factory=list)
    activation_checkpointing: bool = False
    single_device: bool = False
    allocated_peak: int | None = None
    remedies: list[str] = field(default_factory=list)

    @property
    def allocated_bytes(self) -> int:
        """The predicted peak of ``torch.cuda.max_memory_allocated`` (bytes): ``allocated_peak`` where the plan
        gives it (FSDP2: below the reserved peak by the reduce-scatter stream's pool), else the peak without
        the ``reserve`` (CUDA context, allocator cache)."""
        if self.allocated_peak is not None:
            return self.allocated_peak
        return self.peak_bytes - self.components["reserve"]

    @property
    def fits(self) -> bool | None:
        """True/False against ``capacity_bytes``; None when no GPU memory was given."""
        return None if self.capacity_bytes is None else self.peak_bytes <= self.capacity_bytes

    def table(self) -> str:
        """The plan as a fixed-width text table (GiB and GB per GPU)."""
        rows = [f"{'component':<22}{'GiB':>10}{'GB':>10}"]
        for k in COMPONENTS:
            v = self.components[k]
            rows.append(f"{k:<22}{v / GiB:>10.2f}{v / 1e9:>10.2f}")
        rows.append(f"{'predicted peak':<22}{self.peak_bytes / GiB:>10.2f}{self.peak_bytes / 1e9:>10.2f}")
        rows.append(f"{'  of it allocated':<22}{self.allocated_bytes / GiB:>10.2f}{self.allocated_bytes / 1e9:>10.2f}")
        if self.capacity_bytes is not None:
            rows.append(f"{'GPU memory':<22}{self.capacity_bytes / GiB:>10.2f}{self.capacity_bytes / 1e9:>10.2f}")
        return "\n".join(rows + self.notes)

    def refusal(self, source: str) -> str:
        """Why the run does not fit ``capacity_bytes`` (given by ``source``, a field or flag name)."""
        digits = 1  # as many decimals as show the two apart (2.02 against 2.00, not 2.0 against 2.0)
        while digits < 4 and f"{self.peak_bytes / GiB:.{digits}f}" == f"{self.capacity_bytes / GiB:.{digits}f}":
            digits += 1
        return (f"predicted peak {self.peak_bytes / GiB:.{digits}f} GiB per GPU exceeds {source} = "
                f"{self.capacity_bytes / GiB:.{digits}f} GiB" + (f"; to fit, {'; or '.join(self.remedies)}"
                                                                 if self.remedies else ""))


def model_shape(config) -> ModelShape:
    """Count the parameters of ``config``'s causal LM by building it on the meta device (no memory).

    Raises ``TypeError`` (from :func:`pitlab.trainer.fsdp.decoder_layers`) for an architecture without
    ``model.layers``.
    """
    from transformers import AutoModelForCausalLM

    from pitlab.trainer.fsdp import decoder_layers

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config()
    k = getattr(text, "num_experts_per_tok", None) or 1
    n_exp = getattr(text, "num_experts", None) or 1
    total = sum(p.numel() for p in model.parameters())
    layers = decoder_layers(model)
    per_layer = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    active = total
    act_elems = []
    for layer in layers:
        elems = 4 * text.hidden_size  # two float32 RMSNorm inputs, in units of c=2-byte elements (8 T H bytes)
        for name, mod in layer.named_modules():
            if isinstance(mod, nn.Linear):
                elems += mod.in_features + mod.out_features
            elif name.endswith("experts"):  # fused routed experts: 3-D parameters (E, out, in)
                for p in mod.parameters(recurse=False):
                    if p.dim() == 3:
                        active -= p.numel() - p.numel() * k // n_exp
                        elems += k * (p.shape[1] + p.shape[2])
        act_elems.append(elems)
    layer_types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    heads = getattr(text, "num_attention_heads", 0)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // max(heads, 1)
    return ModelShape(model_type=text.model_type, total=total, root=total - sum(per_layer),
                      largest_layer=max(per_layer), active=active, layer_activation_elems=max(act_elems),
                      hidden=text.hidden_size, vocab=text.vocab_size, layers=len(layers),
                      full_attention_layers=sum(t == "full_attention" for t in layer_types),
                      attention_dim=heads * head_dim)


def spec_config(spec: PitTrainingSpec):
    """The transformers config the spec trains: ``baseModel.uri``'s ``config.json`` or the ``randomInit``
    config (vocabulary = ``tokenizer.vocabSize``). Raises :class:`SpecError` naming ``spec.baseModel.uri``
    when the folder has no config.json."""
    from transformers import AutoConfig

    from pitlab.trainer.prepare import build_config

    base = spec.base_model
    if base.uri is not None:
        path = Path(base.uri)
        if not (path / "config.json").is_file():
            where = "" if path.is_absolute() else f" (a relative URI, read here from {Path.cwd()})"
            raise SpecError([("spec.baseModel.uri", f"{path}: no config.json to plan from{where}; the plan needs "
                              "only the model's config.json: give a copy with `pitlab plan --model-config "
                              "PATH`, or point the URI at a local folder holding one")])
        return AutoConfig.from_pretrained(path)
    ri = base.random_init
    return build_config(ri.model_type, ri.config, vocab_size=base.tokenizer.vocab_size)


def plan_memory(spec: PitTrainingSpec, shape: ModelShape | None = None,
                gpu_memory_gib: float | None = None, adapter: AdapterShape | None = None) -> MemoryPlan:
    """Predict per-GPU memory (bytes) of ``spec`` by component; see the module docstring for each formula.

    ``shape`` defaults to :func:`model_shape` of :func:`spec_config`; ``adapter`` (``method: lora`` only)
    to :func:`adapter_shape` of the same config and ``spec.lora``; ``gpu_memory_gib`` (GiB = 2**30 bytes)
    overrides ``spec.resources.gpuMemoryGiB``. ``training.activationCheckpointing`` unset (auto): off when the
    plan without it fits the GPU memory (or none is known), else on; the plan's ``activation_checkpointing``
    says which. World size 1 with ``method: full`` and ``precision: bf16``: the single-device path
    (:mod:`pitlab.trainer.single_device`), or FSDP2 when only FSDP2's plan fits (``single_device`` says which).
    With ``training.layerStreaming.enabled`` the plan is
    :func:`pitlab.trainer.plan_streaming.plan_streaming`'s (another set of components). The planner asks
    the strategy :func:`pitlab.trainer.strategies.choose_strategy` picks at the spec's world size for its plan
    (``Strategy.plan``). Raises
    :class:`SpecError` naming ``spec.lora.targetModules`` when no module of the model matches.
    """
    from pitlab.trainer.strategies import choose_strategy  # the strategies plan with this module's functions

    world = spec.resources.nodes * spec.resources.gpus_per_node
    return choose_strategy(spec, world).plan(spec, shape, gpu_memory_gib, adapter)


def plan_inputs(spec: PitTrainingSpec, shape: ModelShape | None, gpu_memory_gib: float | None,
                adapter: AdapterShape | None) -> tuple[ModelShape, AdapterShape | None, int | None]:
    """``(shape, adapter, capacity bytes)`` of :func:`plan_memory`'s arguments, the defaults filled in (the
    adapter of ``method: lora`` only; capacity None when no GPU memory is known). Raises :class:`SpecError`
    naming ``spec.lora.targetModules`` when no module of the model matches."""
    if spec.method == "lora" and adapter is None:
        try:
            adapter = adapter_shape(spec_config(spec), spec.lora)
        except ValueError as err:
            raise SpecError([("spec.lora.targetModules", str(err).split(": ", 1)[-1])]) from None
    shape = shape or model_shape(spec_config(spec))
    gib = gpu_memory_gib if gpu_memory_gib is not None else spec.resources.gpu_memory_gib
    return shape, adapter, None if gib is None else int(gib * GiB)


def plan_checkpointing(spec: PitTrainingSpec, shape: ModelShape, adapter: AdapterShape | None,
                       capacity: int | None, single: bool) -> MemoryPlan:
    """The plan (FSDP2, or the single-device path when ``single``) against ``capacity`` bytes (None: unknown)
    with ``training.activationCheckpointing`` as set, or (unset) off if that fits, else on."""
    act = spec.training.activation_checkpointing
    if act is not None:
        return _plan(spec, shape, adapter, act, capacity, "", single)
    off = _plan(spec, shape, adapter, False, capacity, "auto: off (the plan without it fits)" if capacity else
                "auto: off (no GPU memory known to plan against)", single)
    if off.fits is not False:
        return off
    return _plan(spec, shape, adapter, True, capacity,
                 f"auto: on (without it the plan needs {off.peak_bytes / GiB:.2f} GiB)", single)


@dataclass(frozen=True)
class _Regime:
    """How the trainer runs a spec: world size, compute bytes ``c`` (2 with bf16, else 4), the single-device
    path, gradients kept unsharded between microbatches (``nosync``), the fused optimizer step of the
    single-device path (FSDP2's reads the same float32 gradient shards as torch's AdamW: not planned apart),
    whether it leaves no float32 gradients, and whether it holds bf16 ones instead (two microbatches)."""

    world: int
    c: int
    single: bool
    nosync: bool
    fused: bool
    no_fp32_grads: bool
    held_bf16_grads: bool


def _regime(spec: PitTrainingSpec, single: bool) -> _Regime:
    tr = spec.training
    fused = single and fused_step_enabled(tr, cuda=True)  # a plan is of a GPU
    world = spec.resources.nodes * spec.resources.gpus_per_node
    return _Regime(
        world=world, c=2 if tr.precision == "bf16" else 4, single=single,
        nosync=(tr.gradient_accumulation_steps > 1 and not single
                and not reduces_every_microbatch(world, tr.gradient_sync_every_microbatch)),
        # the fused step reads the bf16 gradients of one microbatch (no float32 ones), or holds the first of two
        fused=fused, no_fp32_grads=fused and tr.gradient_accumulation_steps == 1,
        held_bf16_grads=fused and tr.gradient_accumulation_steps == 2)


@dataclass(frozen=True)
class _Weights:
    """Bytes per GPU of the weights (``params``), of the compute-dtype copies in flight (``unsharded``; of them
    ``resident``: the root's and two layers'), of the unsharded gradients (``grad_buffers``), and the count of
    trained parameters (``trained``, scalars)."""

    params: int
    trained: int
    unsharded: int
    resident: int
    grad_buffers: int


def _weights(shape: ModelShape, adapter: AdapterShape | None, lora: bool, g: _Regime) -> _Weights:
    c, r, p, world = g.c, REDUCE_BYTES, shape.total, g.world
    if lora:  # frozen base in the compute dtype; master weights, gradients, AdamW only for the adapter
        a = adapter.total
        unsharded = c * (shape.root + adapter.root + 2 * (shape.largest_layer + adapter.largest_layer))
        return _Weights(params=(c * p + 4 * a) // world, trained=a, unsharded=unsharded, resident=unsharded,
                        grad_buffers=c * adapter.root + (c + r) * adapter.largest_layer)
    if g.single:  # pitlab.trainer.single_device: the bf16 copy stays; its bf16 gradients live until the cast
        return _Weights(params=4 * p, trained=p, unsharded=c * p, resident=c * p, grad_buffers=c * p)
    # one GPU: no reshard after forward (pitlab.trainer.fsdp.reshard_after_forward), every layer's copy stays
    resident = c * (shape.root + 2 * shape.largest_layer)  # the root and two layers in flight
    return _Weights(params=4 * p // world, trained=p,
                    unsharded=resident if reshard_after_forward(world, False) else c * p, resident=resident,
                    grad_buffers=c * shape.root + (c + r) * shape.largest_layer)


def _activations(shape: ModelShape, tokens: int, c: int, act_ckpt: bool) -> tuple[int, int]:
    """Bytes of the saved activations of every layer and of one layer's working set in backward."""
    saved_layer = tokens * shape.layer_activation_elems * c
    if act_ckpt:
        return shape.layers * tokens * shape.hidden * c, saved_layer + 2 * tokens * shape.hidden * c
    return shape.layers * saved_layer, 2 * tokens * shape.hidden * c


def _loss_head(shape: ModelShape, tokens: int, c: int, loss: str) -> tuple[int, int]:
    """Bytes of the loss head at its peak (``logits``) and of its gradients kept until backward."""
    if loss == "chunked":  # pitlab.trainer.loss: the logits' gradient + one chunk's logits (+ its gradient)
        chunk = min(tokens, DEFAULT_CHUNK_TOKENS)
        logits = tokens * shape.vocab * c + chunk * shape.vocab * c * (1 if tokens <= chunk else 2)
        return logits, (tokens + shape.vocab) * shape.hidden * c  # gradients of hidden states and head
    return tokens * shape.vocab * (c + 12), 0


def _peak(comp: dict[str, int], w: _Weights, saved: int, working: int, loss_grads: int, accumulating: bool,
          single: bool, pool: int) -> tuple[int, int]:
    """``(reserved, allocated)`` peak bytes of the phases (module docstring): reserved with the reserve (FSDP2:
    the reduce-scatter stream's pool beside the default stream's peak), allocated as one pool without it."""
    # gradients are None until backward makes them (zero_grad(set_to_none=True)); in backward they grow as the
    # activations (and, on one GPU, the kept layer copies) are freed
    base = sum(comp[k] for k in ("parameters", "optimizer", "accumulation", "reserve"))
    grads_at_loss = comp["gradients"] if accumulating else 0  # from the 2nd microbatch on
    at_loss = base + w.unsharded + saved + comp["logits"] + grads_at_loss
    if single:  # the copy stays; its bf16 gradients replace the activations in backward, then the float32 cast
        in_backward = base + w.unsharded + max(saved, w.grad_buffers) + loss_grads + working + grads_at_loss
        at_cast = base + w.unsharded + w.grad_buffers + comp["gradients"]
        peak = max(at_loss, in_backward, at_cast)
        return peak, peak - comp["reserve"]
    backward = comp["gradient_buffers"] + loss_grads + working
    in_backward = base + max(w.unsharded + saved, comp["gradients"] + w.resident) + backward
    allocated = max(at_loss, in_backward) - comp["reserve"]
    # reserved: the default stream's phases without the float32 gradient shards, and their pool (never less than
    # the one-pool peak: the pool holds at least the gradients)
    default_stream = max(at_loss - grads_at_loss, base + max(w.unsharded + saved, w.resident) + backward)
    return default_stream + pool, allocated


def _gradient_pool(shape: ModelShape, adapter: AdapterShape | None, g: _Regime, accumulating: bool) -> int:
    """Bytes of FSDP2's reduce-scatter stream's pool on each GPU (0 on the single-device path): the float32
    gradient shards, ``4 P / W`` (LoRA: the adapter's), and, when a step's microbatches each reduce-scatter (``W >
    1``), the root's and the largest layer's new shards, made beside the kept ones before they are added in."""
    if g.single:
        return 0
    trained, root, layer = ((adapter.total, adapter.root, adapter.largest_layer) if adapter is not None
                            else (shape.total, shape.root, shape.largest_layer))
    return REDUCE_BYTES * (trained + (root + layer if accumulating and not g.nosync and g.world > 1 else 0)) // g.world


def _plan(spec: PitTrainingSpec, shape: ModelShape, adapter: AdapterShape | None, act_ckpt: bool,
          capacity: int | None, why: str, single: bool) -> MemoryPlan:
    """The plan with activation checkpointing ``act_ckpt`` (``why``: how auto chose it, or empty)."""
    tr = spec.training
    g = _regime(spec, single)
    tokens = tr.micro_batch_size * tr.seq_len
    saved, working = _activations(shape, tokens, g.c, act_ckpt)
    w = _weights(shape, adapter, spec.method == "lora", g)
    logits, loss_grads = _loss_head(shape, tokens, g.c, tr.loss)
    comp = {
        "parameters": w.params,
        # without per-microbatch sync the float32 gradient shards appear in the last backward as each layer's
        # unsharded sums are reduce-scattered and freed: inside "accumulation", not beside it
        "gradients": 0 if g.no_fp32_grads or g.nosync else (2 if g.held_bf16_grads else 4) * w.trained // g.world,
        "optimizer": 8 * w.trained // g.world,
        "accumulation": REDUCE_BYTES * w.trained if g.nosync else 0,
        "unsharded_parameters": w.unsharded,
        "gradient_buffers": w.grad_buffers,
        "activations": saved + working,
        "logits": logits,
        "reserve": RESERVE_BYTES,
    }
    accumulating = tr.gradient_accumulation_steps > 1
    pool = _gradient_pool(shape, adapter if spec.method == "lora" else None, g, accumulating)
    peak, allocated = _peak(comp, w, saved, working, loss_grads, accumulating, single, pool)
    notes = _plan_notes(spec, shape, adapter, g, w.trained, act_ckpt, why, pool)
    return MemoryPlan(g.world, comp, peak, capacity, shape, notes, activation_checkpointing=act_ckpt,
                      single_device=single, allocated_peak=allocated,
                      remedies=remedies(spec, comp, act_ckpt, single, None if capacity is None else peak - capacity))


def _plan_notes(spec: PitTrainingSpec, shape: ModelShape, adapter: AdapterShape | None, g: _Regime, trained: int,
                act_ckpt: bool, why: str, pool: int) -> list[str]:
    """The lines under the plan's table: the model and how it runs, then what the spec should know (``pool``:
    :func:`_gradient_pool`'s bytes)."""
    tr, single = spec.training, g.single
    notes = [f"model: {shape.model_type}, {count_text(shape.total)} parameters ({count_text(shape.active)} active), "
             f"world size {g.world}, {tr.precision}, accumulation {tr.gradient_accumulation_steps} "
             f"(sync every microbatch: {_sync_text(g, tr.gradient_accumulation_steps)}), "
             f"activation checkpointing: {act_ckpt}"
             + (f" ({why})" if why else "") + f", loss: {tr.loss}, "
             + (SINGLE_DEVICE_LABEL + ", no FSDP2" if single else "FSDP2")
             + (", fused optimizer step (no float32 gradients)" if g.no_fp32_grads else ", fused optimizer step "
                "(the first microbatch's bf16 gradients held: no float32 gradients)" if g.held_bf16_grads else
                ", fused optimizer step (float32 gradient sums: accumulation)" if g.fused else "")]
    if spec.method == "lora":
        notes.append(f"method: lora, r={spec.lora.r} on {', '.join(spec.lora.target_modules)}: "
                     f"{count_text(adapter.total)} trainable adapter parameters "
                     f"({100 * adapter.total / shape.total:.3f}% of the base); frozen base stored in "
                     f"{'bf16' if g.c == 2 else 'fp32'}")
    if g.nosync and g.world > 1:
        notes.append(f"gradientSyncEveryMicrobatch: false keeps all {count_text(trained)} gradients unsharded on "
                     f"every GPU: {2 * trained / 1e9:.1f} GB in bf16, {REDUCE_BYTES * trained / 1e9:.1f} GB as "
                     "FSDP2 accumulates them in float32; set it to true (the default)")
    if not single:  # why the peak is above the allocated peak by more than the reserve
        size = f"{pool / GiB:.2f} GiB" if pool >= GiB // 10 else f"{pool / 2 ** 20:.2f} MiB"
        notes.append(f"the predicted peak is the memory reserved: FSDP2 keeps the {size} of float32 gradient "
                     "shards in its reduce-scatter stream's own pool, which cannot reuse what the activations free, "
                     "so it exceeds the allocated peak by more than the reserve where activations are large")
    return notes


def _sync_text(g: _Regime, accum: int) -> str:
    """What ``gradientSyncEveryMicrobatch`` does in regime ``g`` at ``accum`` microbatches per step."""
    if g.single:
        return "no effect without FSDP2"
    if g.world == 1 and accum > 1:
        return "no effect with one rank: one reduce-scatter per step"
    return str(not g.nosync)


def count_text(n: int | float) -> str:
    """A count for people, three significant digits and a unit: ``512``, ``45.1 K``, ``4.5 B`` (999,500: ``1 M``)."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        v = float(f"{n / scale:.3g}")
        if abs(v) >= 1:
            return f"{v:g} {unit}"
    return f"{n:.0f}"
