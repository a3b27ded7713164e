"""Random-weight model folders, for benchmarks and tests only (issue 13).

A folder holding ``config.json``, a tokenizer and :data:`RANDOM_WEIGHTS_FILE` (no weight files) stands for the
model of that config whose weights are regenerated, deterministically, from a seed: every module's weights are
created on the target device (meta device first, then one module at a time, no host copy) and initialised by the
model class's own ``_init_weights`` with the random generator seeded from ``(seed, module name)``; with
``perturb`` > 0 every weight matrix then gets ``perturb × initializer_range × N(0, 1)`` noise drawn from
``(perturbSeed, parameter name)``. A 35B-parameter model is thus "loaded" in seconds on a machine whose disk could
not hold it twice, and a second, perturbed model stands for a trained twin. Same config, seed, perturbation,
device, dtype and library versions ⇒ bit-identical weights; CPU and CUDA generators give different (equally
deterministic) weights. Because a module's draws depend only on its name, a model cut to its first k decoder
layers has exactly the first k layers of the whole model.

Such weights mean nothing: the embedding stage warns and records ``weights: random(...)`` in its info, and the
model digest is the hash of this file, config and tokenizer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pitlab.errors import InputError

RANDOM_WEIGHTS_FILE = "pitlab-random-weights.json"
PURPOSE = "benchmarks and tests only: random weights regenerated from config.json and the seed"


class RandomWeightsError(InputError, ValueError):
    """A random-weights file is malformed (the message names the file and field). Exit code 2, ``InvalidSpec``."""


@dataclass(frozen=True)
class RandomWeights:
    """``seed`` (int ≥ 0) of the initialisation; ``perturb`` (float ≥ 0): noise scale in units of the config's
    ``initializer_range`` added to every weight matrix; ``perturb_seed`` (int ≥ 0) of that noise."""

    seed: int = 0
    perturb: float = 0.0
    perturb_seed: int = 1

    def describe(self) -> str:
        p = f", perturb {self.perturb:g} (seed {self.perturb_seed})" if self.perturb else ""
        return f"random(seed {self.seed}{p}; benchmark only)"


def write_random_model(folder: Path, config, weights: RandomWeights, tokenizer=None) -> Path:
    """Write a random-weights model folder: ``config.json`` (a transformers config object), the tokenizer
    (an object with ``save_pretrained``, optional) and :data:`RANDOM_WEIGHTS_FILE`. Returns ``folder``.
    Raises FileExistsError when ``folder`` already holds weight files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.glob("*.safetensors")) or any(folder.glob("*.bin")):
        raise FileExistsError(f"{folder}: holds weight files; a random-weights folder must not")
    config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    (folder / RANDOM_WEIGHTS_FILE).write_text(json.dumps(
        {"purpose": PURPOSE, "seed": weights.seed, "perturb": weights.perturb, "perturbSeed": weights.perturb_seed},
        indent=2) + "\n")
    return folder


def read_random_weights(model_dir: Path) -> RandomWeights | None:
    """The folder's :class:`RandomWeights`, or None when it has no :data:`RANDOM_WEIGHTS_FILE`.
    Raises RandomWeightsError naming the file and field for a bad value, or when weight files sit beside it."""
    path = Path(model_dir) / RANDOM_WEIGHTS_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RandomWeightsError(f"{path}: not JSON ({err})") from None
    if not isinstance(raw, dict):
        raise RandomWeightsError(f"{path}: must hold a JSON object")
    unknown = sorted(set(raw) - {"purpose", "seed", "perturb", "perturbSeed"})
    if unknown:
        raise RandomWeightsError(f"{path}: unknown field(s) {unknown}")
    seed, perturb, pseed = raw.get("seed", 0), raw.get("perturb", 0.0), raw.get("perturbSeed", 1)
    for field, value in (("seed", seed), ("perturbSeed", pseed)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RandomWeightsError(f"{path}: {field} must be an integer >= 0 (got {value!r})")
    if isinstance(perturb, bool) or not isinstance(perturb, (int, float)) or not perturb >= 0:
        raise RandomWeightsError(f"{path}: perturb must be a number >= 0 (got {perturb!r})")
    if any(Path(model_dir).glob("*.safetensors")) or any(Path(model_dir).glob("*.bin")):
        raise RandomWeightsError(f"{path}: the folder also holds weight files; remove one or the other")
    return RandomWeights(int(seed), float(perturb), int(pseed))


def _seed(*parts) -> int:
    """A 63-bit generator seed from the parts (sha256 of their repr, so the same on every machine)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & ((1 << 63) - 1)


@contextlib.contextmanager
def _parameters_on_meta():
    """Modules built inside get their parameters on the meta device (no memory, no initialisation) while
    their buffers are computed as usual, on the host (small: e.g. rotary frequencies)."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def build_random_model(config, weights: RandomWeights, device: str = "cpu", dtype: str = "float32"):
    """The base model (``AutoModel``, eval mode) of ``config`` with random weights created on ``device``.

    Modules are built with their parameters on the meta device (buffers as a normal construction computes
    them), then each module's own tensors are allocated on ``device`` and its parameters initialised by
    ``model._init_weights`` under ``torch.manual_seed(seed(weights.seed, module name))`` (random state restored
    afterwards), children before parents. Raises RandomWeightsError when a tensor stays on meta.
    """
    import torch
    from transformers import AutoModel

    torch_dtype = getattr(torch, dtype)
    with _parameters_on_meta():
        model = AutoModel.from_config(config, dtype=torch_dtype)
    dev = torch.device(device)
    std = float(getattr(config, "initializer_range", 0.02) or 0.02)
    fork_devices = [dev.index if dev.index is not None else torch.cuda.current_device()] \
        if dev.type == "cuda" else []
    with torch.no_grad():
        # children before their parent (as ``PreTrainedModel.apply`` initialises): a parent's _init_weights may
        # set a child's parameter (the MoE block its router's weight), and wins, as in a normal construction
        for name, module in reversed(list(model.named_modules())):
            buffers = {n: b for n, b in module._buffers.items() if b is not None and not b.is_meta}
            module.to_empty(device=dev, recurse=False)
            for n, b in buffers.items():  # computed at construction (rotary frequencies): kept
                module._buffers[n].copy_(b)
            for t in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
                if hasattr(t, "_is_hf_initialized"):
                    del t._is_hf_initialized
            if hasattr(module, "_is_hf_initialized"):
                del module._is_hf_initialized
            with torch.random.fork_rng(devices=fork_devices, device_type=dev.type if dev.type != "cpu" else "cuda"):
                torch.manual_seed(_seed(weights.seed, name))
                model._init_weights(module)
        if weights.perturb:  # after every module's init (a parent may re-initialise a child's weight)
            for pname, p in model.named_parameters():
                if p.ndim >= 2 and p.is_floating_point():
                    g = torch.Generator(device=dev).manual_seed(_seed(weights.perturb_seed, pname))
                    p.add_(torch.randn(p.shape, generator=g, device=dev, dtype=p.dtype), alpha=weights.perturb * std)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise RandomWeightsError(f"{config.model_type}: tensors left uninitialised on the meta device: {left[:5]}")
    model.eval()
    return model
