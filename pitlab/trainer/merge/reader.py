"""Reading a DCP training checkpoint in one process, no process group: which checkpoint, its tensors' names,
dtypes and shapes (metadata only), a subset of tensors, its ``train_state.json``, the whole model."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from transformers import AutoConfig, AutoModelForCausalLM

from pitlab.trainer.checkpoint import LATEST, TRAIN_STATE, latest_checkpoint
from pitlab.trainer.merge.errors import MergeError, MergeInputError


def resolve_checkpoint(path: Path) -> Path:
    """A DCP checkpoint directory: ``path`` itself, or the one ``path/latest`` names when ``path`` is the
    checkpoint root. Raises :class:`MergeError` naming the path if it holds no complete checkpoint."""
    path = Path(path)
    if (path / LATEST).is_file():
        found = latest_checkpoint(path)
        if found is not None:
            return found
    if path.name.endswith(".tmp"):
        raise MergeInputError(f"{path}: is an incomplete checkpoint (.tmp); merge a complete step-<N> directory")
    if not (path / ".metadata").is_file():
        raise MergeInputError(f"{path}: not a complete DCP checkpoint (no .metadata and no 'latest' pointer)")
    return path


def checkpoint_tensors(checkpoint_dir: Path) -> dict[str, tuple[torch.dtype, torch.Size]]:
    """``{model state-dict name: (dtype, shape)}`` of the model tensors in a DCP checkpoint (its ``model.*``
    entries, prefix removed), read from the ``.metadata`` file only (no tensor data)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = dcp.FileSystemReader(str(checkpoint_dir)).read_metadata()
    return {k[len("model."):]: (md.properties.dtype, md.size) for k, md in metadata.state_dict_metadata.items()
            if k.startswith("model.") and isinstance(md, TensorStorageMetadata)}


def load_tensors(checkpoint_dir: Path, names: list[str],
                 meta: dict[str, tuple[torch.dtype, torch.Size]]) -> dict[str, torch.Tensor]:
    """Read only ``names`` (model state-dict names) from a DCP checkpoint into fresh CPU tensors of the saved
    dtype and full shape, in this process (``dcp.load(..., no_dist=True)`` reads just these tensors' byte
    ranges). Memory: the tensors' bytes plus one stored chunk. Raises ``RuntimeError`` from DCP when a name
    is not in the checkpoint."""
    state = {n: torch.empty(meta[n][1], dtype=meta[n][0]) for n in names}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
        dcp.load({"model": state}, storage_reader=dcp.FileSystemReader(str(checkpoint_dir)), no_dist=True)
    return state


def load_into(checkpoint_dir: Path, tensors: dict[str, torch.Tensor], threads: int = 4) -> None:
    """Read the checkpoint's tensors ``{model state-dict name: tensor}`` into the given CPU tensors, in place
    (each of the saved dtype and full shape; disjoint views of one buffer are fine), with one ``dcp.load(...,
    no_dist=True)`` through :class:`pitlab.trainer.merge.dcp_read.DirectReader`: only these tensors' byte ranges,
    straight into the tensors, ``threads`` ranges at a time. The caller filters DCP's "single process" warning
    when it calls from several threads (``warnings.catch_warnings`` is not thread-safe). Raises ``RuntimeError``
    from DCP when a name is not in the checkpoint, ``OSError`` for a truncated shard file."""
    from pitlab.trainer.merge.dcp_read import DirectReader

    dcp.load({"model": tensors}, storage_reader=DirectReader(checkpoint_dir, threads), no_dist=True)


def read_train_state(checkpoint_dir: Path) -> dict:
    """``train_state.json`` of a checkpoint (``{}`` when absent, e.g. a checkpoint written by hand)."""
    path = Path(checkpoint_dir) / TRAIN_STATE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise MergeInputError(f"{path}: unreadable JSON: {err}") from None


def meta_model_of(base_dir: Path):
    """``(config, causal LM on the meta device, float32)`` of ``base_dir``'s ``config.json``: names and shapes,
    no data."""
    config = AutoConfig.from_pretrained(base_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return config, model


def load_checkpoint_model(checkpoint_dir: Path, base_dir: Path) -> torch.nn.Module:
    """The causal LM of ``base_dir``'s config (CPU, float32, eval mode) with the model weights of a full-weight
    DCP checkpoint loaded in this process (no process group); the whole model is in memory. Raises
    :class:`MergeError` when the checkpoint's model keys differ from the architecture's state dict keys."""
    config = AutoConfig.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = model.state_dict()
    saved = set(checkpoint_tensors(checkpoint_dir))
    check_keys(set(state), saved, checkpoint_dir, base_dir)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
        dcp.load({"model": state}, checkpoint_id=checkpoint_dir, no_dist=True)
    model.load_state_dict(state)  # DCP loads in place; this also covers tied or replaced entries
    model.eval()
    return model


def check_keys(expected: set[str], saved: set[str], checkpoint_dir: Path, base_dir: Path) -> None:
    """Raise :class:`MergeError` naming (up to 5 of) the missing and unexpected keys when ``saved != expected``."""
    missing, extra = sorted(expected - saved), sorted(saved - expected)
    if missing or extra:
        raise MergeError(f"{checkpoint_dir}: model tensors do not match {base_dir}'s architecture "
                         f"(missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''})")
