"""Sharded (DCP) training checkpoints, written atomically, with a ``latest`` pointer and retention.

Layout under ``checkpoint_dir``::

    step-<N>/          a complete checkpoint: DCP shards + ``.metadata`` + ``train_state.json``
                       + ``rng-rank-<R>.pt`` (each rank's RNG states)
    step-<N>.tmp/      a checkpoint being written (never read; removed by the next save)
    latest             text ``step-<N>``: the newest complete checkpoint, replaced atomically

A ``step-<N>`` directory appears only by renaming its ``.tmp`` after every rank finished writing, and
``latest`` is updated only after that rename, so a reader following ``latest`` never sees a partial
checkpoint. The DCP state dict is ``{"model": <model state dict>, "optim": <optimizer state dict>}``
with the model's original parameter names (``model.layers.0.mlp.gate.weight``), so a single process
can load ``"model"`` into an unsharded model of the same architecture.

Resume (:func:`load_checkpoint`) restores the model and optimizer shards (DCP), the LR scheduler
(``train_state.json["scheduler"]``), each rank's RNG states (torch CPU, CUDA, numpy, python ``random``)
and the step; the data position is a pure function of the step (see :mod:`pitlab.trainer.data`), and
``train_state.json["data"]`` records it so a resume with a different data layout is refused.

This module is the local-disk implementation and the pieces both stores share; the same layout and guarantees
in object storage (``s3://bucket/prefix``: each rank uploads its own files, ``_COMPLETE`` then ``latest`` written
last) are :mod:`pitlab.trainer.checkpoint_s3`, which builds on this one. :mod:`pitlab.trainer.checkpointer`
chooses between the two for a location and owns the training run's save schedule.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from pitlab import storage
from pitlab.errors import CheckpointError
from pitlab.trainer.files import fsync_dir, write_text_atomic

LATEST = "latest"
TRAIN_STATE = "train_state.json"
# Frozen parameters (a LoRA run's base) are not checkpointed: they are reloaded from the base model folder, so
# a checkpoint holds the trained tensors only. With full training nothing is frozen and this changes nothing.
STATE_DICT_OPTIONS = StateDictOptions(ignore_frozen_params=True)
# set_state_dict then must not ask for the frozen keys; every trained key was already required by dcp.load
# (its default planner refuses a checkpoint that lacks a requested key)
LOAD_STATE_DICT_OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir_name(step: int) -> str:
    """``step-<N>`` for optimizer step ``N`` (1-based count of completed steps)."""
    return f"step-{step}"


def rng_file_name(rank: int) -> str:
    """``rng-rank-<R>.pt``: rank R's RNG states inside a checkpoint directory."""
    return f"rng-rank-{rank}.pt"


def rng_state() -> dict:
    """This process's RNG states: ``torch`` (CPU ByteTensor), ``cuda`` (list of ByteTensors, one per
    visible device, empty without CUDA), ``numpy`` (legacy global state tuple), ``python`` (``random``)."""
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    """Restore the states returned by :func:`rng_state` (CUDA states only when CUDA is available)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save_checkpoint(checkpoint_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    keep: int, train_state: dict | None = None,
                    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> Path:
    """Collective: every rank of the default process group must call it with the same arguments.

    Writes the sharded model and optimizer state of ``step`` with ``torch.distributed.checkpoint`` to
    ``step-<N>.tmp`` and each rank's RNG states to ``rng-rank-<R>.pt`` (fsynced); rank 0 adds
    ``train_state.json`` (``train_state`` plus ``step``, ``world_size`` and the scheduler's
    ``state_dict()`` under ``scheduler``), then, after a barrier, renames the directory to ``step-<N>``,
    writes ``latest`` atomically and deletes all but the newest ``keep`` complete checkpoints.
    Returns the ``step-<N>`` path. Raises ``ValueError`` if ``keep < 1``.
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
    model_sd, optim_sd = get_state_dict(model, optimizer, options=STATE_DICT_OPTIONS)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
    with open(tmp / rng_file_name(rank), "wb") as f:
        torch.save(rng_state(), f)
        f.flush()
        os.fsync(f.fileno())
    if rank == 0:
        state = dict(train_state or {}, step=step, world_size=dist.get_world_size())
        if scheduler is not None:
            state["scheduler"] = scheduler.state_dict()
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


IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable", "differentiable")
"""Optimizer param-group keys that choose an implementation, not the arithmetic: a resume keeps the live
optimizer's (a checkpoint of the fused step, which runs with ``foreach=False, fused=False``, resumed by torch's
AdamW keeps that AdamW's fused or foreach kernel)."""


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Before a load: an optimizer with no state yet that can make it without stepping (``init_state``, as
    :class:`~pitlab.trainer.fused_step.MasterAdamW`) makes it, so that ``get_state_dict`` does not initialise it by
    a step on zero gradients (float32 gradients of every parameter, 4 bytes each, at the load's peak). Other
    optimizers are left to ``get_state_dict``."""
    init = getattr(optimizer, "init_state", None)
    if callable(init) and not any(optimizer.state.values()):
        init()


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> dict:
    """Collective: restore a checkpoint written by :func:`save_checkpoint` into this rank's live objects.

    Loads the model and optimizer shards in place (DCP, resharded by ``set_state_dict``), the scheduler
    state from ``train_state.json`` and this rank's RNG states; returns the ``train_state.json`` dict
    (``step`` = completed optimizer steps). The optimizer keeps its own :data:`IMPLEMENTATION_FLAGS`. Raises
    :class:`CheckpointError` naming the file when the checkpoint was written with another world size
    (``spec.resources.gpusPerNode``: the RNG states and the data order are per rank) or lacks this rank's RNG
    file.
    """
    path = Path(path)
    state = json.loads((path / TRAIN_STATE).read_text())
    world, rank = dist.get_world_size(), dist.get_rank()
    if state.get("world_size") != world:
        raise CheckpointError(f"{path / TRAIN_STATE}: written with world_size {state.get('world_size')}, this job "
                              f"has {world}; spec.resources.gpusPerNode must match to resume bit-identically")
    rng_path = path / rng_file_name(rank)
    if not rng_path.is_file():
        raise CheckpointError(f"{rng_path}: missing; the checkpoint has no RNG state for rank {rank}")
    init_optimizer_state(optimizer)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=STATE_DICT_OPTIONS)
    sd = {"model": model_sd, "optim": optim_sd}
    dcp.load(sd, checkpoint_id=path)
    own = [{k: g[k] for k in IMPLEMENTATION_FLAGS if k in g} for g in optimizer.param_groups]
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"],
                   options=LOAD_STATE_DICT_OPTIONS)
    for group, flags in zip(optimizer.param_groups, own):  # how to compute is this run's choice, not the saver's
        group.update(flags)
    if scheduler is not None:
        if "scheduler" not in state:
            raise CheckpointError(f"{path / TRAIN_STATE}: no scheduler state to resume from")
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(torch.load(rng_path, weights_only=False))
    return state


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest complete checkpoint named by ``<checkpoint_dir>/latest``, or None when there is none yet.

    Never returns a ``.tmp`` directory. Raises :class:`CheckpointError` naming the file if ``latest``
    holds something other than ``step-<N>`` or names a directory without DCP ``.metadata``. Local folders
    only: :func:`pitlab.trainer.checkpointer.latest_checkpoint` takes ``s3://`` locations too.
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


def checkpoint_steps(start_step: int, total_steps: int, every_steps: int) -> list[int]:
    """Optimizer steps at which a run from ``start_step`` to ``total_steps`` saves: every ``every_steps``
    (0 = never) before the end, and ``total_steps`` itself."""
    steps = [s for s in range(start_step + 1, total_steps) if every_steps > 0 and s % every_steps == 0]
    return steps + [total_steps] if start_step < total_steps else steps


def checkpoint_bytes(trainable: list[torch.Tensor]) -> int:
    """Estimated bytes of one checkpoint of a whole run (all ranks): every trainable parameter plus AdamW's
    ``exp_avg`` and ``exp_avg_sq`` in the parameter's dtype (3 × the trainable bytes; ``numel`` of a DTensor
    shard is the global count). RNG and train state (kilobytes) are left out."""
    return 3 * sum(p.numel() * p.element_size() for p in trainable)


def check_disk_space(checkpoint_dir: Path, one_checkpoint: int, saves: int, keep: int,
                     free_bytes: int | None = None) -> None:
    """Refuse, before the first training step, a run whose checkpoints cannot fit the local disk.

    A save writes ``step-<N>.tmp`` while the ``keep`` newest complete checkpoints are still there (the old
    ones are pruned only after ``latest`` names the new one), so this run needs up to
    ``min(keep + 1, existing + saves) - existing`` more checkpoints of ``one_checkpoint`` bytes. ``free_bytes``
    defaults to the free space of the file system holding ``checkpoint_dir``. Raises :class:`CheckpointError`
    naming the sizes in GB and what to change; S3 checkpoints are not checked (nothing to measure).
    """
    d = Path(checkpoint_dir)
    existing = len(complete_checkpoints(d))  # 0 for a folder not made yet
    more = max(0, min(keep + 1, existing + saves) - existing)
    need = more * one_checkpoint
    if free_bytes is None:
        probe = d
        while not probe.exists():
            probe = probe.parent
        free_bytes = shutil.disk_usage(probe).free
    if need > free_bytes:
        from pitlab.api.runfolders import REPLACED

        aside = d.parent.parent / REPLACED  # where pitlab run --overwrite keeps the runs it replaced
        held = (f" ({aside} holds the runs `pitlab run --overwrite` replaced, kept until this run succeeds: "
                "delete them if they are not needed)") if aside.is_dir() else ""
        raise CheckpointError(
            f"spec.checkpoint: this run saves {saves} checkpoint(s) of about {one_checkpoint / 1e9:.1f} GB "
            f"(parameters + AdamW moments) and keeps {keep}: up to {more} more on {d} "
            f"({need / 1e9:.1f} GB), which has {free_bytes / 1e9:.1f} GB free; lower spec.checkpoint.keep, "
            f"raise spec.checkpoint.everySteps, use an s3:// checkpoint.uri or free space{held}")


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


def read_train_state(path: Path | str) -> dict:
    """``train_state.json`` of a complete checkpoint (a local ``step-<N>`` folder or an ``s3://`` one)."""
    if storage.is_s3(path):
        return json.loads(storage.read_text(storage.join(path, TRAIN_STATE)))
    return json.loads((Path(path) / TRAIN_STATE).read_text())


def checkpoint_location(uri: str | None, run_dir: Path) -> Path | str:
    """Where a run's checkpoints go: ``spec.checkpoint.uri`` (``${VAR}`` expanded; ``s3://`` kept as a
    string, a local path as a Path) or, when unset, ``<run_dir>/checkpoint``. Raises SpecError naming
    ``spec.checkpoint.uri`` for an unset variable or an unsupported scheme."""
    from pitlab.api import SpecError, expand_uri
    from pitlab.api.layout import TrainingLayout

    if not uri:
        return TrainingLayout(Path(run_dir)).checkpoint
    s = expand_uri(uri, "spec.checkpoint.uri").rstrip("/")
    if storage.is_s3(s):
        try:
            storage.parse_s3(s)
        except storage.StorageError as err:
            raise SpecError([("spec.checkpoint.uri", str(err))]) from None
        return s
    if s.startswith("file://"):
        s = s[len("file://"):]
    if "://" in s:
        raise SpecError([("spec.checkpoint.uri", f"{s!r}: give a local path or s3://bucket/prefix")])
    return Path(s).expanduser()
