"""LoRA adapters (peft) and verified adapter saves (docs/design.md, "LoRA and layer streaming").

Every save is checked by reopening what was written: a save that silently drops tensors (the "adapter with
0 tensors" bug class, where a wrapper around the model hides the ``lora_`` parameter names from the filter
that picks adapter weights) is a hard error, and nothing is left at the output path.

The expected adapter is taken from the model's *trainable parameters by identity* (``requires_grad``),
independent of names, so a wrapper that renames or hides parameters cannot make the expectation shrink
along with the saved state.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import torch
from torch import nn

from pitlab.errors import TRAINING_FAILED, SpecError, StageError
from pitlab.storage.outdir import swap_in
from pitlab.trainer.files import make_readable

ADAPTER_FILE = "adapter_model.safetensors"


class AdapterSaveError(StageError):
    """An adapter save did not round-trip: tensor names, count or values differ from the live adapter. Exit
    code 1, ``TrainingFailed``."""

    reason = TRAINING_FAILED


def check_targets(model: nn.Module, target_modules: list[str]) -> None:
    """Refuse ``target_modules`` entries that name no module of ``model`` (peft's rule: a module's dotted name
    equals the entry or ends in ``.<entry>``), which peft would skip without a word (a misspelt ``qkv_proj``
    beside ``q_proj`` trained only ``q_proj``), and entries that name a module other than a linear or embedding
    layer (a whole ``mlp`` block). Raises :class:`SpecError` naming ``spec.lora.targetModules``, the entries and
    the names of the model's linear layers."""
    modules = [(n, m) for n, m in model.named_modules() if n]
    problems = []
    for t in target_modules:
        kinds = {type(m).__name__ for n, m in modules if n == t or n.endswith("." + t)}
        if not kinds:
            problems.append(f"{t!r} names no module")
        elif not kinds <= {"Linear", "Embedding"}:
            problems.append(f"{t!r} names {', '.join(sorted(kinds - {'Linear', 'Embedding'}))}, not a linear layer")
    if problems:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in modules if isinstance(m, nn.Linear)})
        raise SpecError([("spec.lora.targetModules",
                          f"{'; '.join(problems)} of {type(model).__name__} (targetModules {target_modules}); "
                          f"its linear layers are named {', '.join(linear)}")])


def apply_lora(model: nn.Module, r: int, alpha: int, dropout: float, target_modules: list[str]) -> nn.Module:
    """Wrap ``model`` with peft LoRA (``spec.lora``: rank ``r``, scaling ``alpha / r``, ``dropout``, the
    module-name suffixes ``target_modules``); only the adapter parameters stay trainable. Returns the
    ``PeftModel``. Raises :class:`SpecError` naming ``spec.lora.targetModules`` for an entry that names no
    linear layer (:func:`check_targets`)."""
    from peft import LoraConfig, get_peft_model

    check_targets(model, target_modules)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules,
                        task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # peft asks transformers a deprecated question; nothing for the user to do
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*is deprecated", category=FutureWarning)
        return get_peft_model(model, config)


PEFT_PREFIX = "base_model.model."


def lora_record(lora) -> dict:
    """The LoRA settings a checkpoint records (``train_state.json["lora"]``) from ``spec.lora`` (a
    :class:`pitlab.api.pittraining.LoraSpec`): ``r``, ``alpha``, ``dropout``, ``target_modules``,
    ``merge_into_base``. The merge rebuilds the adapter from this alone."""
    return {"r": lora.r, "alpha": lora.alpha, "dropout": lora.dropout, "target_modules": list(lora.target_modules),
            "merge_into_base": lora.merge_into_base}


def base_parameter_name(name: str) -> str:
    """The base model's name of a parameter of the peft-wrapped model:
    ``base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` → ``model.layers.0.self_attn.q_proj.weight``
    (names without peft's parts are returned with only the prefix removed)."""
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX):]
    return name.replace(".base_layer.", ".")


def lora_meta_model(base_dir: Path, lora: dict):
    """``(config, peft model)`` of ``base_dir``'s architecture on the meta device (no memory), wrapped with the
    LoRA of ``lora`` (a :func:`lora_record` dict). Parameter names and shapes are the trainer's. Raises
    ``ValueError`` naming ``spec.lora.targetModules`` when no module matches."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(base_dir)
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model = apply_lora(base, r=lora["r"], alpha=lora["alpha"], dropout=lora["dropout"],
                           target_modules=lora["target_modules"])
    return config, model


def lora_modules(peft_model: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """``{base weight name: (peft LoRA layer, its module name in peft_model)}`` for every LoRA-wrapped module,
    e.g. ``model.layers.0.self_attn.q_proj.weight`` → (``lora.Linear``, ``base_model.model.model.layers.0....``).
    Raises ``TypeError`` for a LoRA layer that is not a linear one (merging is implemented for those)."""
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.layer import Linear as LoraLinear

    found = {}
    for name, mod in peft_model.named_modules():
        if isinstance(mod, LoraLayer):
            if not isinstance(mod, LoraLinear):
                raise TypeError(f"{name}: LoRA on {type(mod).__name__} cannot be merged into the base; "
                                "target linear layers (spec.lora.targetModules)")
            found[base_parameter_name(name + ".weight")] = (mod, name)
    return found


def _peft_model(model: nn.Module):
    from peft import PeftModel

    for name, mod in model.named_modules():
        if isinstance(mod, PeftModel):
            return name, mod
    raise AdapterSaveError(f"{type(model).__name__}: no peft PeftModel inside; nothing to save as an adapter")


def adapter_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The adapter tensors peft would save, read through ``model.state_dict()`` of the outermost module (as a
    sharding or streaming wrapper is saved) or through ``state_dict`` (the same keys, e.g. the full tensors
    gathered from FSDP2 shards), keyed by peft's adapter names (``...lora_A.weight``)."""
    from peft import get_peft_model_state_dict

    prefix, peft_model = _peft_model(model)
    prefix = prefix + "." if prefix else ""
    source = model.state_dict() if state_dict is None else state_dict
    sd = {k[len(prefix):]: v for k, v in source.items() if k.startswith(prefix)}
    return get_peft_model_state_dict(peft_model, state_dict=sd)


PROBE_MAX_BASE_BYTES = 2 * 2**30
"""Probe logits of the reloaded adapter when the base model's weight files hold at most this many bytes (two
float32 copies are loaded on the host); larger bases get the name check only."""


def _weight_bytes(base_dir: Path) -> int:
    return sum(f.stat().st_size for f in Path(base_dir).glob("*.safetensors")) + \
        sum(f.stat().st_size for f in Path(base_dir).glob("*.bin"))


def verify_on_base(adapter_dir: Path, base_dir: Path, live: list[torch.Tensor],
                   probe_max_bytes: int = PROBE_MAX_BASE_BYTES) -> str:
    """Check that the adapter saved in ``adapter_dir`` is the trained adapter *for the plain base model* in
    ``base_dir``, not only for the live (possibly wrapped) model.

    Names: peft's adapter names of a fresh LoRA model of the base (built on the meta device, no memory) must be
    exactly the saved names; a wrapper that renamed modules (an extra ``.inner`` level, before or after peft)
    gives saved names that load onto nothing (peft only warns, and its ``lora_B`` stay zero). Values (when the
    base's weight files hold at most ``probe_max_bytes``): probe logits of the base with the file loaded by
    peft (by name) must equal, bit for bit, those of the base with the live adapter tensors put in place in
    the live model's parameter order (by position, independent of any name): the function the trained model
    computes. ``live``: the trained adapter tensors in the live model's parameter order (the trainable
    parameters themselves where they are plain tensors, else the gathered state in its order). Returns ``names`` or
    ``probe logits equal``; raises :class:`AdapterSaveError` naming the tensors or the logit difference."""
    import warnings

    from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    lora_cfg = LoraConfig.from_pretrained(str(adapter_dir))
    lora_cfg.inference_mode = False
    with safe_open(str(Path(adapter_dir) / ADAPTER_FILE), framework="pt") as f:
        saved = [k for k in f.keys() if ".lora_" in k]
    with torch.device("meta"):
        fresh = get_peft_model(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base_dir)),
                               LoraConfig.from_pretrained(str(adapter_dir)))
    fresh_state = {k: v for k, v in get_peft_model_state_dict(fresh).items() if ".lora_" in k}  # no embeddings
    expected = list(fresh_state)
    unmapped, unfilled = sorted(set(saved) - set(expected)), sorted(set(expected) - set(saved))
    if unmapped or unfilled:
        raise AdapterSaveError(
            f"{adapter_dir}: {len(unmapped)} of the {len(saved)} saved adapter tensors load onto nothing of the base "
            f"model {base_dir} (e.g. {unmapped[:2]}) and {len(unfilled)} of its {len(expected)} adapter tensors would "
            f"keep their initial values (e.g. {unfilled[:2]}); a wrapper renamed the model's modules: save through "
            "the unwrapped PeftModel, or map the names back")
    if _weight_bytes(base_dir) > probe_max_bytes:
        return "names"
    if len(live) != len(expected) or any(t.shape != v.shape for t, v in zip(
            live, fresh_state.values())):
        raise AdapterSaveError(f"{adapter_dir}: the live adapter's tensors do not line up with the base model's "
                               f"adapter ({len(live)} vs {len(expected)} tensors, or shapes differ)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
                                           str(adapter_dir)).eval()
        reference = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), lora_cfg)
        set_peft_model_state_dict(reference, dict(zip(expected, (t.to(torch.float32) for t in live))))
        reference.eval()
    vocab = int(getattr(loaded.get_base_model().config, "vocab_size", 2))
    ids = (torch.arange(16, dtype=torch.long) * 7919 % vocab).unsqueeze(0)
    with torch.no_grad():
        got, want = loaded(input_ids=ids).logits, reference(input_ids=ids).logits
    if not torch.equal(got, want):
        raise AdapterSaveError(f"{adapter_dir}: probe logits of the base with the saved adapter differ from the "
                               f"trained model's (max |diff| {float((got - want).abs().max()):.3g}): the saved tensors sit "
                               "on other modules than the trained ones")
    return "probe logits equal"


def _trained_values(trainable: list[nn.Parameter], live: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The trained adapter values in parameter order: the trainable parameters themselves (by identity, whatever
    a wrapper's state dict says) when they are plain tensors on a real device, else the saved state's values in
    its order (FSDP2 shards gathered, or a meta-device model given its state)."""
    from torch.distributed.tensor import DTensor

    if all(not isinstance(p, DTensor) and p.device.type != "meta" for p in trainable):
        return [p.detach().to("cpu") for p in trainable]
    return list(live.values())


def save_adapter_verified(model: nn.Module, out_dir: Path,
                          state_dict: dict[str, torch.Tensor] | None = None, base_dir: Path | None = None,
                          probe_max_bytes: int = PROBE_MAX_BASE_BYTES) -> dict:
    """Save the LoRA adapter of ``model`` (a ``PeftModel`` or a module wrapping one) to ``out_dir`` and verify it.

    ``state_dict``: the adapter's full tensors keyed as in ``model.state_dict()`` when the model's own are not
    plain tensors (FSDP2 ``DTensor`` shards, gathered with ``get_model_state_dict(full_state_dict=True)``; or
    a meta-device model in the merge); by default ``model.state_dict()``.

    Writes ``adapter_model.safetensors`` + ``adapter_config.json`` to ``<out_dir>.tmp``, reopens the file and
    checks: tensor count == the number of trainable parameter tensors of the peft model (counted by identity,
    not by name), names == the live adapter's names, every tensor ``torch.equal`` (same dtype and shape) to the
    live one; with ``base_dir`` (the base model folder training started from) also that it loads onto the plain
    base model by name and gives the trained model's probe logits (:func:`verify_on_base`). Only then renames it
    to ``out_dir`` (replacing an older save). Returns a report: ``tensors``, ``elements``, ``bytes`` (file
    size), ``base_check`` (``names``, ``probe logits equal`` or ``skipped`` without ``base_dir``).
    Raises :class:`AdapterSaveError` naming the missing, unexpected or
    differing tensors; on error no ``out_dir`` and no ``.tmp`` is left (an older ``out_dir`` stays intact).
    """
    from safetensors import safe_open
    import safetensors.torch

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    _, peft_model = _peft_model(model)
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    expected_elems = sum(p.numel() for p in trainable)
    live = {k: v.detach().to("cpu").contiguous() for k, v in adapter_state_dict(model, state_dict).items()}
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        if len(live) != len(trainable) or sum(v.numel() for v in live.values()) != expected_elems:
            raise AdapterSaveError(
                f"{out_dir}: the adapter state to save has {len(live)} tensors "
                f"({sum(v.numel() for v in live.values())} elements) but the model has {len(trainable)} trainable "
                f"tensors ({expected_elems} elements); a wrapper around the model hides the adapter's parameter "
                f"names from peft (the 0-tensor adapter bug); save through the unwrapped PeftModel")
        safetensors.torch.save_file(live, str(tmp / ADAPTER_FILE), metadata={"format": "pt"})
        peft_model.peft_config[peft_model.active_adapter].save_pretrained(str(tmp))
        with open(tmp / ADAPTER_FILE, "rb") as f:
            os.fsync(f.fileno())
        with safe_open(str(tmp / ADAPTER_FILE), framework="pt") as f:
            saved = {k: f.get_tensor(k) for k in f.keys()}
        missing, unexpected = sorted(live.keys() - saved.keys()), sorted(saved.keys() - live.keys())
        differ = sorted(k for k in live.keys() & saved.keys()
                        if saved[k].dtype != live[k].dtype or not torch.equal(saved[k], live[k]))
        if missing or unexpected or differ or len(saved) != len(trainable):
            raise AdapterSaveError(f"{tmp / ADAPTER_FILE}: reopened file has {len(saved)} tensors, expected "
                                   f"{len(trainable)}; {len(missing)} missing {missing[:5]}, {len(unexpected)} "
                                   f"unexpected {unexpected[:5]}, {len(differ)} differ {differ[:5]}")
        base_check = "skipped" if base_dir is None else verify_on_base(
            tmp, Path(base_dir), _trained_values(trainable, live), probe_max_bytes)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    make_readable(tmp)
    swap_in(tmp, out_dir)  # an older save is removed only once this one is in place
    return {"tensors": len(saved), "elements": expected_elems, "bytes": (out_dir / ADAPTER_FILE).stat().st_size,
            "path": str(out_dir), "base_check": base_check}
