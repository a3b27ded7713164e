"""The implementation of each compute block of a causal LM, chosen at start and reported.

Blocks (:data:`BLOCKS`): ``attention`` (full-attention layers: transformers' ``attn_implementation``),
``gated_delta_rule`` and ``short_convolution`` (the linear-attention layers of ``qwen3_5_moe_text``), ``experts``
(routed MoE experts: transformers' ``experts_implementation``) and ``loss`` (the LM head + cross-entropy).

transformers binds the gated delta rule at import time: flash-linear-attention's (fla) Triton kernel when the
``fla`` package imports, else its reference PyTorch loop, 16× slower on an H200 (docs/design.md, "The test
environment"). The short convolution's fast kernel is the ``causal-conv1d`` package (CUDA source only on PyPI);
without it :func:`select_kernels` puts fla's Triton ``causal_conv1d`` in its place (same function: a depthwise
causal conv1d over ``(B, D, T)`` with SiLU). fla 0.6 refuses the gated delta rule's backward on Hopper with
Triton ≥ 3.4 and < 3.7.1 (its issue #640: wrong gradients); there the reference kernel is put back and the
report says why.
On a GPU the gated delta rule is bound to fla directly (:func:`fla_gated_delta_rule_binding`), not through
transformers' wrapper, which under torch.compile with torch < 2.14 calls the reference loop instead.

A Qwen3.5 model about to train on a GPU with a reference kernel gets :func:`reference_kernel_warning`: the
trainer logs it, writes it into every metrics record (``kernel_warning``) and the status condition shows it.
"""

from __future__ import annotations

import collections
import sys
from importlib.metadata import PackageNotFoundError, version

import torch
from torch import nn

from pitlab.trainer.knobs import COMPILE_MODE_ENV, CUDA_GRAPH_MODES, compile_mode

BLOCKS = ("attention", "gated_delta_rule", "short_convolution", "experts", "loss")
REFERENCE = "reference"
NOT_USED = "not used"
KERNEL_CALLS: collections.Counter = collections.Counter()  # calls of pitlab's fla bindings in this process
GPU_EXTRA = "pip install 'pitlab[gpu]' (flash-linear-attention with Triton >= 3.7.1 on Hopper)"


def _dist_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _bound_implementation(fn):
    """The function transformers' ``use_kernel_func_from_hub_with_fallback`` wrapper calls (its closure's
    ``implementation``), the fla function behind :func:`fla_gated_delta_rule_binding`, or ``fn`` itself."""
    if hasattr(fn, "pitlab_fla"):
        return fn.pitlab_fla
    code = getattr(fn, "__code__", None)
    if code is not None and "implementation" in code.co_freevars and fn.__closure__:
        return fn.__closure__[code.co_freevars.index("implementation")].cell_contents
    return fn


def _is_reference(impl) -> bool:
    return getattr(impl, "__module__", "").startswith("transformers.")


def fla_backward_refused() -> str | None:
    """Why fla's gated-delta-rule backward cannot run here (Hopper GPU with Triton ≥ 3.4, < 3.7.1), else None."""
    try:
        from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1
    except Exception:  # noqa: BLE001 - an fla that does not import is reported as absent elsewhere
        return None
    if IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1:
        import triton
        return f"fla refuses Triton {triton.__version__} on Hopper (needs >= 3.7.1, fla issue #640)"
    return None


def _reference_of(fn):
    """The reference PyTorch function behind a binding of the gated delta rule (transformers' wrapper or
    :func:`fla_gated_delta_rule_binding`)."""
    return getattr(fn, "pitlab_reference", None) or fn.__wrapped__


def fla_gated_delta_rule_binding(fla_fn, reference):
    """transformers' ``torch_chunk_gated_delta_rule`` contract bound straight to fla's ``fla_fn`` (keyword
    arguments fla does not take are dropped, as transformers' wrapper drops them), hidden from torch.compile.

    Under ``torch.compile`` transformers' own wrapper does not reach fla on the device image (torch 2.11,
    transformers 5.17): the compiled layers ran the reference loop's float32 matmuls, 6,192 per step, with the
    report saying fla (bench/RESULTS.md, issue 11). This binding calls fla in eager and compiled layers alike (a
    graph break, as :func:`fla_short_convolution`). Attributes: ``pitlab_fla`` (``fla_fn``), ``pitlab_reference``
    (``reference``); every call counts in ``KERNEL_CALLS["fla_gated_delta_rule"]``."""
    import inspect

    params = tuple(inspect.signature(fla_fn).parameters)

    @torch.compiler.disable
    def fla_gated_delta_rule(*args, **kwargs):
        KERNEL_CALLS["fla_gated_delta_rule"] += 1
        return fla_fn(*args, **{k: v for k, v in kwargs.items() if k in params})

    fla_gated_delta_rule.pitlab_fla = fla_fn
    fla_gated_delta_rule.pitlab_reference = reference
    return fla_gated_delta_rule


@torch.compiler.disable
def fla_short_convolution(hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                          activation: str | None = None, **_: object) -> torch.Tensor:
    """transformers' ``causal_conv1d_fn`` contract on fla's Triton kernel: ``hidden_states`` ``(B, D, T)``,
    ``weight`` ``(D, W)``, optional ``bias`` ``(D,)`` and activation (``silu``/``swish`` or None); returns
    ``(B, D, T)`` in the input dtype. Equal to ``act(conv1d(x, w, padding=W-1, groups=D)[..., :T])``.
    Not traced by torch.compile (one graph break in a compiled layer, run eagerly), as fla marks its own gated
    delta rule: dynamo does not trace fla's autotuned Triton launches."""
    from fla.modules.causal_conv1d import causal_conv1d

    KERNEL_CALLS["fla_short_convolution"] += 1
    y, _state = causal_conv1d(hidden_states.transpose(1, 2), weight=weight, bias=bias, activation=activation)
    return y.transpose(1, 2)


def _modeling_modules(model: nn.Module) -> list:
    """The transformers modeling modules of the model's linear-attention layers (those that define the gated
    delta rule), one per module."""
    found = {}
    for mod in model.modules():
        m = sys.modules.get(type(mod).__module__)
        if m is not None and hasattr(m, "torch_chunk_gated_delta_rule") and hasattr(m, "causal_conv1d_fn"):
            found[m.__name__] = m
    return list(found.values())


def _label(impl, fallback: str) -> str:
    mod = getattr(impl, "__module__", "") or ""
    if mod.startswith("fla"):
        return f"fla {_dist_version('fla-core') or _dist_version('flash-linear-attention') or '?'} " \
               f"{getattr(impl, '__name__', fallback)}"
    if mod.startswith("causal_conv1d"):
        return f"causal-conv1d {_dist_version('causal-conv1d') or '?'}"
    return f"{REFERENCE} (transformers {getattr(impl, '__name__', fallback)})"


def select_kernels(model: nn.Module, device: torch.device, loss: str) -> dict[str, str]:
    """Choose the fast kernel of each block where one is installed and fits ``device``, and report the choice.

    Changes transformers' module-level bindings of the model's modeling module (so every model of that
    architecture in this process is affected): on CUDA, the short convolution becomes fla's Triton kernel when
    fla imports and ``causal-conv1d`` is absent; a gated delta rule bound to fla is bound to it directly
    (:func:`fla_gated_delta_rule_binding`), or set back to the reference where fla refuses the GPU
    (:func:`fla_backward_refused`) and on the CPU. ``loss`` is the loss's label (see
    :func:`pitlab.trainer.loss.chunked_linear_cross_entropy`). Returns block -> implementation (:data:`BLOCKS`
    order); a block the model does not have is ``"not used"``. On CUDA it first copies pitlab's Triton
    autotuning results into Triton's cache, once per process (:mod:`pitlab.trainer.autotune`).
    """
    if device.type == "cuda":
        _seed_once()
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None else None
    report = {b: NOT_USED for b in BLOCKS}
    layer_types = getattr(text, "layer_types", None) or ["full_attention"]
    if "full_attention" in layer_types:
        report["attention"] = str(getattr(text, "_attn_implementation", None) or "eager")
    if any(name.endswith("experts") and any(p.dim() == 3 for p in mod.parameters(recurse=False))
           for name, mod in model.named_modules()):
        report["experts"] = str(getattr(text, "_experts_implementation", None) or "eager")
    for m in _modeling_modules(model):
        gdr = _bound_implementation(m.torch_chunk_gated_delta_rule)
        refused = fla_backward_refused() if device.type == "cuda" else None
        if not _is_reference(gdr) and (refused or device.type != "cuda"):
            m.torch_chunk_gated_delta_rule = _reference_of(m.torch_chunk_gated_delta_rule)
            gdr = m.torch_chunk_gated_delta_rule
            report["gated_delta_rule"] = f"{REFERENCE} ({refused or 'fla needs a CUDA device'})"
        else:
            if getattr(gdr, "__module__", "").startswith("fla") and not hasattr(m.torch_chunk_gated_delta_rule,
                                                                                 "pitlab_fla"):
                m.torch_chunk_gated_delta_rule = fla_gated_delta_rule_binding(
                    gdr, _reference_of(m.torch_chunk_gated_delta_rule))
            report["gated_delta_rule"] = _label(gdr, "torch_chunk_gated_delta_rule")
        conv = _bound_implementation(m.causal_conv1d_fn)
        if _is_reference(conv) and device.type == "cuda" and _fla_conv_available():
            m.causal_conv1d_fn = conv = fla_short_convolution
        if conv is fla_short_convolution:
            report["short_convolution"] = _fla_conv_label()
        else:
            report["short_convolution"] = _label(conv, "causal_conv1d_fn")
    report["loss"] = loss
    return report


_SEEDED: list[int] = []


def _seed_once() -> None:
    """Copy pitlab's Triton autotuning results into Triton's cache, once per process
    (:func:`pitlab.trainer.autotune.seed_autotune_cache`), before the first fla kernel runs."""
    if not _SEEDED:
        from pitlab.trainer.autotune import seed_autotune_cache

        _SEEDED.append(seed_autotune_cache())


def _fla_conv_available() -> bool:
    try:
        import fla.modules.causal_conv1d  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure (no fla, no Triton) means: not available
        return False
    return True


def _fla_conv_label() -> str:
    return f"fla {_dist_version('fla-core') or _dist_version('flash-linear-attention') or '?'} causal_conv1d (Triton)"


def reference_kernel_warning(report: dict[str, str], device: torch.device) -> str | None:
    """The warning for a model that trains on a GPU with a reference linear-attention kernel, else None."""
    if device.type != "cuda":
        return None
    slow = [b for b in ("gated_delta_rule", "short_convolution") if report.get(b, "").startswith(REFERENCE)]
    if not slow:
        return None
    return (f"reference PyTorch kernels on a GPU for {' and '.join(slow)} "
            f"({'; '.join(report[b] for b in slow)}): training runs 3-4x slower; {GPU_EXTRA}")


_CUDAGRAPHS = False  # a compile_blocks call of this process asked for CUDA graphs (reduce-overhead, max-autotune)


CUDA_GRAPH_MEMORY_SHARE = 0.85
"""The largest share of the GPU's memory a plan's predicted peak may take for :func:`auto_compile_mode` to choose
CUDA graphs: their private memory pool added 1.2 GB of reserved memory on the reduced Qwen3.5 shape (54.4 against
53.2 GB, H100, 2026-12-05), and the Qwen3-30B slice, planned at 101 % of an H100 with activation checkpointing, ran
out of memory with them."""


CUDA_GRAPHS_VERIFIED = True
"""Whether :func:`auto_compile_mode` may choose CUDA graphs: with and without them whole steps were bit-identical
under deterministic algorithms (losses, gradient norms and all 72 parameters after 4 steps, at 1 and 2 microbatches
per step; ``bench/cuda_graphs_check.py``, H100, 2026-12-05), and they ran 1.39-1.51 x the plain loop
(bench/RESULTS.md). Set False to make them opt-in again (``PITLAB_COMPILE_MODE=reduce-overhead``)."""


NO_MEMORY_PLAN = "no memory plan"
""":func:`auto_compile_mode`'s reason when it has no plan or no GPU size to measure the plan against."""


def compiles_layers(explicit: bool | None, compiled_by_default: bool, lora: bool) -> bool:
    """Whether a run compiles its decoder layers: ``training.compile`` as written (``explicit``), else the
    strategy's default for full-weight runs (LoRA is not compiled)."""
    return explicit if explicit is not None else (compiled_by_default and not lora)


def not_compiled_label(explicit: bool | None) -> str:
    """The ``compile`` report entry of a run whose layers are not compiled on CUDA: ``training.compile: false``, or
    the default for LoRA and layer streaming."""
    return "off" if explicit is False else "off (auto: LoRA and layer streaming are not compiled)"


CUDA_GRAPHS_OFF_PATH = ("not this path's default: under FSDP2 they ran 0.13 x torch's default mode on an H100, "
                        "bench/RESULTS.md 2026-12-06")
"""What CUDA graphs cost where the strategy does not choose them: FSDP2 at world size 1 on the reduced Qwen3.5
shape ran 4,341 tokens/s with them against 32,653 without (one H100, one process, 2026-12-06)."""


def layer_compile_mode(cuda_graphs_by_default: bool, device: torch.device, activation_checkpointing: bool,
                       planned_peak_bytes: int | None, total_memory_bytes: int | None) -> tuple[str | None, str]:
    """The decoder layers' ``torch.compile`` mode and whether it uses CUDA graphs, and why:
    ``PITLAB_COMPILE_MODE`` when set (CUDA graphs on a path that does not choose them, e.g. FSDP2, say what they
    cost there), else :func:`auto_compile_mode` (the arguments are its own)."""
    mode = compile_mode()
    if mode is not None:
        why = f"{'on' if mode in CUDA_GRAPH_MODES else 'off'}, as {COMPILE_MODE_ENV} says"
        if mode in CUDA_GRAPH_MODES and not cuda_graphs_by_default:
            why += f" ({CUDA_GRAPHS_OFF_PATH})"
        return mode, why
    return auto_compile_mode(cuda_graphs_by_default, device, activation_checkpointing, planned_peak_bytes,
                             total_memory_bytes)


def auto_compile_mode(cuda_graphs_by_default: bool, device: torch.device, activation_checkpointing: bool,
                      planned_peak_bytes: int | None, total_memory_bytes: int | None) -> tuple[str | None, str]:
    """The decoder layers' ``torch.compile`` mode when ``PITLAB_COMPILE_MODE`` is unset, and why:
    ``reduce-overhead`` (CUDA graphs) for a strategy that allows them (``cuda_graphs_by_default``: the single-device
    path) on CUDA without activation checkpointing and with a predicted peak (bytes) at most
    :data:`CUDA_GRAPH_MEMORY_SHARE` of the GPU's memory (bytes), once :data:`CUDA_GRAPHS_VERIFIED`; else None
    (torch's default) and the reason."""
    if not cuda_graphs_by_default:
        return None, "only on the single-device path"
    if not CUDA_GRAPHS_VERIFIED:
        return None, "off until checked bit for bit on a GPU (PITLAB_COMPILE_MODE=reduce-overhead turns them on)"
    if device.type != "cuda":
        return None, "CUDA only"
    if activation_checkpointing:
        return None, "off with activation checkpointing"
    if planned_peak_bytes is None or not total_memory_bytes:
        return None, NO_MEMORY_PLAN
    share = planned_peak_bytes / total_memory_bytes
    if share > CUDA_GRAPH_MEMORY_SHARE:
        return None, f"off: the plan takes {share:.1%} of the GPU's memory (limit {CUDA_GRAPH_MEMORY_SHARE:.0%})"
    return "reduce-overhead", f"auto: the plan takes {share:.1%} of the GPU's memory"


def planned_compile(spec, plan) -> str:
    """What a training run of ``spec`` (a ``PitTrainingSpec``) on CUDA GPUs with ``plan`` (its
    :class:`~pitlab.trainer.plan.MemoryPlan`) will do with its decoder layers, worded as the run report's ``compile``
    entry: compiled or not, and with CUDA graphs or not and why (``PITLAB_COMPILE_MODE`` when set, else
    :func:`auto_compile_mode` with the plan's activation checkpointing, peak and capacity; ``pitlab plan``)."""
    from pitlab.trainer.strategies import choose_strategy

    strategy, explicit = choose_strategy(spec, plan.world_size, plan), spec.training.compile
    if not compiles_layers(explicit, strategy.compiled_by_default, spec.method == "lora"):
        return not_compiled_label(explicit)
    mode, why = layer_compile_mode(strategy.cuda_graphs_by_default, torch.device("cuda"),
                                   plan.activation_checkpointing, plan.peak_bytes, plan.capacity_bytes)
    if why == NO_MEMORY_PLAN:  # no GPU size given: the trainer decides against the GPU it runs on
        why = (f"decided against the GPU's memory when the run starts: on where the plan's "
               f"{plan.peak_bytes / 2**30:.2f} GiB take at most {CUDA_GRAPH_MEMORY_SHARE:.0%} of it (a GPU of "
               f"{plan.peak_bytes / CUDA_GRAPH_MEMORY_SHARE / 2**30:.2f} GiB or more)")
    return f"torch.compile per decoder layer{f' (mode {mode})' if mode else ''}; CUDA graphs: {why}"


def compile_run_layers(model: nn.Module, compile_on: bool, explicit: bool | None, device: torch.device,
                       cuda_graphs_by_default: bool, activation_checkpointing: bool,
                       planned_peak_bytes: int | None, total_memory_bytes: int | None) -> str:
    """A training run's ``compile`` report entry: on CUDA with ``compile_on``, :func:`compile_blocks` of
    ``model``'s decoder layers in ``PITLAB_COMPILE_MODE``'s mode, or :func:`auto_compile_mode`'s when unset (the
    last four arguments are its own), saying whether CUDA graphs are used and why; otherwise why not
    (``explicit``: ``training.compile`` as written, None when unset)."""
    if compile_on and device.type == "cuda":
        mode, why = layer_compile_mode(cuda_graphs_by_default, device, activation_checkpointing, planned_peak_bytes,
                                       total_memory_bytes)
        return compile_blocks(model, mode=mode) + f"; CUDA graphs: {why}"
    if device.type != "cuda":
        return ("off (CPU" + (f"; {COMPILE_MODE_ENV} applies on CUDA only)" if compile_mode() else ")")
                if compile_on else "off")
    return not_compiled_label(explicit)


def deterministic_algorithms(on: bool, device: torch.device) -> str:
    """``training.deterministic``: when ``on``, ``torch.use_deterministic_algorithms(True)`` for this process,
    on CUDA with ``CUBLAS_WORKSPACE_CONFIG`` set to ``:4096:8`` unless already set (cuBLAS reads it when it
    starts, so call this before the first GPU matmul). Returns the report label."""
    if not on:
        return "off"
    label = "torch deterministic algorithms"
    if device.type == "cuda":
        import os

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        label += f" (CUBLAS_WORKSPACE_CONFIG={os.environ['CUBLAS_WORKSPACE_CONFIG']})"
    torch.use_deterministic_algorithms(True)
    return label


def release_cuda_graphs() -> None:
    """Free the CUDA graphs this process recorded over compiled layers, with their private memory pool
    (``torch._inductor.cudagraph_trees.reset_cudagraph_trees``), and drop torch.compile's in-memory code
    (``torch._dynamo.reset``): called when a run drops its model, so that a second run in the same process (a
    benchmark, a notebook, a test) does not start with the first's pool (7.24 GiB after the reduced Qwen3.5 shape,
    which made the Qwen3-30B slice run out of memory on an H100, 2026-12-05) and compiles its layers anew. The
    code torch.compile cached for a layer class is bound to the graph trees it was recorded in: a second run
    reusing it after the reset failed with "Running CUDAGraph after shutdown" (2026-12-06). Nothing when no layer
    asked for CUDA graphs."""
    global _CUDAGRAPHS
    if _CUDAGRAPHS:
        import torch._dynamo
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees

        reset_cudagraph_trees()
        torch._dynamo.reset()
        _CUDAGRAPHS = False


def cuda_graphs_recorded() -> bool:
    """Whether layers of this process were compiled with CUDA graphs: then a gradient a recorded backward
    returned is written over by its next replay (the next microbatch), and must be copied to be kept."""
    return _CUDAGRAPHS


def cudagraph_step_begin() -> None:
    """Start a new CUDA-graph generation (``torch.compiler.cudagraph_mark_step_begin``) when the layers were
    compiled with CUDA graphs: called before each microbatch, so that a replay never overwrites outputs the
    previous microbatch's backward still reads; nothing otherwise."""
    if _CUDAGRAPHS:
        torch.compiler.cudagraph_mark_step_begin()


def compile_blocks(model: nn.Module, backend: str = "inductor", layers: nn.ModuleList | None = None,
                   mode: str | None = None) -> str:
    """Regional compilation: ``torch.compile`` of each decoder layer's ``forward`` (set on the instance, so module
    names, state-dict keys and FSDP2's per-layer hooks, which run around ``forward``, are unchanged). Returns
    the report label. Layers of one class share compiled code (``torch._dynamo`` caches per code object), so
    compile time grows with the number of distinct layer kinds, not with depth. ``backend``: torch.compile's
    (the tests use ``aot_eager`` on the CPU). ``layers``: the decoder layers (default: those of the causal LM
    ``model``, :func:`pitlab.trainer.fsdp.decoder_layers`). ``mode``: torch.compile's mode (the trainer passes
    :func:`compile_mode`; None: torch's default)."""
    from pitlab.trainer.fsdp import decoder_layers

    layers = decoder_layers(model) if layers is None else layers
    import torch._dynamo
    for knob in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), 4 * len(layers)))
    global _CUDAGRAPHS
    _CUDAGRAPHS = _CUDAGRAPHS or mode in CUDA_GRAPH_MODES
    for layer in layers:
        layer.forward = torch.compile(layer.forward, backend=backend, **({"mode": mode} if mode else {}))
    return f"torch.compile per decoder layer ({len(layers)} layers{f', mode {mode}' if mode else ''})"
