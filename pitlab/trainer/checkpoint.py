"""Sharded (DCP) training checkpoints, written atomically, with a ``latest`` pointer and retention.

Layout under ``checkpoint_dir``::

    step-<N>/          a complete checkpoint: DCP shards + ``.metadata`` + ``train_state.json``
    step-<N>.tmp/      a checkpoint being written (never read; removed by the next save)
    latest             text ``step-<N>``: the newest complete checkpoint, replaced atomically

A ``step-<N>`` directory appears only by renaming its ``.tmp`` after every rank finished writing, and
``latest`` is updated only after that rename, so a reader following ``latest`` never sees a partial
checkpoint. The DCP state dict is ``{"model": <model state dict>, "optim": <optimizer state dict>}``
with the model's original parameter names (``model.layers.0.mlp.gate.weight``), so a single process
can load ``"model"`` into an unsharded model of the same architecture.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from pitlab.trainer.files import fsync_dir, write_text_atomic

LATEST = "latest"
TRAIN_STATE = "train_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint directory is inconsistent (e.g. ``latest`` names a directory that does not exist)."""


def step_dir_name(step: int) -> str:
    """``step-<N>`` for optimizer step ``N`` (1-based count of completed steps)."""
    return f"step-{step}"


def save_checkpoint(checkpoint_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    keep: int, train_state: dict | None = None) -> Path:
    """Collective: every rank of the default process group must call it with the same arguments.

    Writes the sharded model and optimizer state of ``step`` with ``torch.distributed.checkpoint`` to
    ``step-<N>.tmp``; rank 0 adds ``train_state.json`` (``train_state`` plus ``step`` and
    ``world_size``), then, after a barrier, renames it to ``step-<N>``, writes ``latest`` atomically and
    deletes all but the newest ``keep`` complete checkpoints. Returns the ``step-<N>`` path.
    Raises ``ValueError`` if ``keep < 1``.
    """
    if keep < 1:
        raise ValueError(f"spec.checkpoint.keep: must be >= 1 (got {keep})")
    checkpoint_dir = Path(checkpoint_dir)
    final = checkpoint_dir / step_dir_name(step)
    tmp = final.with_name(final.name + ".tmp")
    rank = dist.get_rank()
    if rank == 0:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        for stale in checkpoint_dir.glob("step-*.tmp"):
            shutil.rmtree(stale)  # left by an interrupted save
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
    if rank == 0:
        state = dict(train_state or {}, step=step, world_size=dist.get_world_size())
        write_text_atomic(tmp / TRAIN_STATE, json.dumps(state, indent=2) + "\n")
    dist.barrier()  # every rank's shards are on disk
    if rank == 0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(checkpoint_dir)
        write_text_atomic(checkpoint_dir / LATEST, final.name + "\n")
        prune_checkpoints(checkpoint_dir, keep)
    dist.barrier()
    return final


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest complete checkpoint named by ``<checkpoint_dir>/latest``, or None when there is none yet.

    Never returns a ``.tmp`` directory. Raises :class:`CheckpointError` naming the file if ``latest``
    holds something other than ``step-<N>`` or names a directory without DCP ``.metadata``.
    """
    pointer = Path(checkpoint_dir) / LATEST
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    if not _STEP_DIR.match(name):
        raise CheckpointError(f"{pointer}: expected 'step-<N>', found {name!r}")
    path = Path(checkpoint_dir) / name
    if not (path / ".metadata").is_file():
        raise CheckpointError(f"{pointer}: names {name}, but {path} is not a complete DCP checkpoint "
                              "(no .metadata)")
    return path


def complete_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Complete ``step-<N>`` directories (``.tmp`` excluded), oldest first by N."""
    found = []
    for p in Path(checkpoint_dir).glob("step-*"):
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def prune_checkpoints(checkpoint_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (never the one ``latest`` names); return
    the deleted paths."""
    latest = latest_checkpoint(checkpoint_dir)
    deleted = []
    for p in complete_checkpoints(checkpoint_dir)[:-keep]:
        if latest is not None and p.resolve() == latest.resolve():
            continue
        shutil.rmtree(p)
        deleted.append(p)
    return deleted
