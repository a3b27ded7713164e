"""The trainer's environment settings outside the spec (measurement knobs for local runs and the benchmarks; the
operator does not pass them to its pods): the values each accepts, read and checked without importing torch."""

from __future__ import annotations

import os

from pitlab.errors import SpecError

COMPILE_MODE_ENV = "PITLAB_COMPILE_MODE"
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""``torch.compile`` modes ``PITLAB_COMPILE_MODE`` accepts for the decoder layers (unset:
:func:`pitlab.trainer.kernels.auto_compile_mode`; ``default`` is torch's default)."""
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
"""The modes of :data:`COMPILE_MODES` that capture CUDA graphs."""

SHAPES_ENV = "PITLAB_FUSED_STEP_SHAPES"
SHAPE_MODES = ("dynamic", "rows16", "static", "grouped")
"""How :class:`pitlab.trainer.fused_step.MasterAdamW` compiles its update (``PITLAB_FUSED_STEP_SHAPES``):
``dynamic`` (symbolic sizes, 1-D views: one kernel for all parameters), ``rows16`` (symbolic sizes, [n/16, 16]
views), ``static`` (one kernel per parameter size), ``grouped`` (static sizes, one compiled call per decoder layer:
:func:`pitlab.trainer.fused_step.layer_groups`)."""


COPY_IN_ENV = "PITLAB_FSDP_COPY_IN"
COPY_IN_MODES = ("pitlab", "torch")
"""FSDP2's reduce-scatter copy-in (``PITLAB_FSDP_COPY_IN``): ``pitlab`` (the default,
:func:`pitlab.trainer.fsdp_copy_in.reduce_scatter_copy_in`) or ``torch`` (FSDP2's own, through ``torch._chunk_cat``)."""

FSDP_GRADS_ENV = "PITLAB_FSDP_GRADS"
FSDP_GRADS_MODES = ("pitlab", "torch")
"""FSDP2's gradient accumulation and one-rank reduce (``PITLAB_FSDP_GRADS``): ``pitlab`` (the default,
:mod:`pitlab.trainer.fsdp_grads`) or ``torch`` (FSDP2's own)."""

GC_ENV = "PITLAB_GC"
GC_MODES = ("pitlab", "python")
"""Python's garbage collection during the step loop (``PITLAB_GC``): ``pitlab`` (the default,
:class:`pitlab.trainer.gcpolicy.SteadyGC`: frozen after setup, collected after each step's launch) or ``python``
(automatic collection, as Python does it)."""


_ALLOWED = {COMPILE_MODE_ENV: COMPILE_MODES, SHAPES_ENV: SHAPE_MODES, COPY_IN_ENV: COPY_IN_MODES,
            FSDP_GRADS_ENV: FSDP_GRADS_MODES, GC_ENV: GC_MODES}


def _refusal(name: str, env) -> str | None:
    """Why knob ``name``'s value in ``env`` is refused (``'x': give one of ...``), None when unset, empty or
    accepted."""
    value = env.get(name)
    return f"{value!r}: give one of {', '.join(_ALLOWED[name])}" if value and value not in _ALLOWED[name] else None


def _read(name: str, default: str | None, env: dict | None) -> str | None:
    env = env if env is not None else os.environ
    if (why := _refusal(name, env)) is not None:
        raise ValueError(f"{name}={why}")
    return env.get(name) or default


def compile_mode(env: dict | None = None) -> str | None:
    """``PITLAB_COMPILE_MODE`` of ``env`` (default ``os.environ``), None when unset or empty; raises ValueError
    naming the variable for a mode torch does not have (:data:`COMPILE_MODES`)."""
    return _read(COMPILE_MODE_ENV, None, env)


def shape_mode(env: dict | None = None) -> str:
    """``PITLAB_FUSED_STEP_SHAPES`` (default ``grouped``); raises ValueError naming the variable for another
    value (:data:`SHAPE_MODES`)."""
    return _read(SHAPES_ENV, "grouped", env)


def copy_in_mode(env: dict | None = None) -> str:
    """``PITLAB_FSDP_COPY_IN`` (default ``pitlab``); raises ValueError naming the variable for another value
    (:data:`COPY_IN_MODES`)."""
    return _read(COPY_IN_ENV, "pitlab", env)


def fsdp_grads_mode(env: dict | None = None) -> str:
    """``PITLAB_FSDP_GRADS`` (default ``pitlab``); raises ValueError naming the variable for another value
    (:data:`FSDP_GRADS_MODES`)."""
    return _read(FSDP_GRADS_ENV, "pitlab", env)


def gc_mode(env: dict | None = None) -> str:
    """``PITLAB_GC`` (default ``pitlab``); raises ValueError naming the variable for another value
    (:data:`GC_MODES`)."""
    return _read(GC_ENV, "pitlab", env)


def check_knobs(env: dict | None = None) -> None:
    """Raise :class:`~pitlab.errors.SpecError` naming every knob of ``env`` (default ``os.environ``) set to a
    value the trainer would refuse, so that ``validate``, ``plan``, ``run`` and each rank stop before any work."""
    env = env if env is not None else os.environ
    errors = [(f"environment variable {name}", why) for name in _ALLOWED if (why := _refusal(name, env)) is not None]
    if errors:
        raise SpecError(errors)
