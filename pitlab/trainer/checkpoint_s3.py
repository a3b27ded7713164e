"""DCP checkpoints in object storage (``spec.checkpoint.uri: s3://bucket/prefix``).

Layout under the prefix, as for a local checkpoint directory::

    step-<N>/   the DCP files of every rank, ``.metadata``, ``train_state.json``, ``rng-rank-<R>.pt``,
                then ``MANIFEST.json`` (size + sha256 of each) and ``_COMPLETE``, written last
    latest      text ``step-<N>``: replaced by a single PUT (atomic on S3) only after ``_COMPLETE``

Save (collective): every rank writes its own DCP files and RNG states into a rank-private, node-local
staging folder (``$PITLAB_STAGING_DIR``, default the system temp folder) and uploads only those, so no disk
ever holds the whole model; the ranks exchange the sha256 of what they uploaded (``all_gather_object``);
rank 0 writes the manifest, then ``_COMPLETE``, then ``latest``, then prunes. A rank that fails to upload
makes every rank raise :class:`~pitlab.trainer.checkpoint.CheckpointError` at the same point (nobody waits
for a collective that never comes), and ``latest`` keeps naming the previous complete checkpoint.

Resume (collective): ``latest`` is followed only to a step with ``_COMPLETE``; the first rank of each node
downloads it into the staging folder (every file verified against the manifest's sha256), then every rank
loads it with the local DCP reader.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from pitlab import storage
from pitlab.trainer.checkpoint import (LATEST, STATE_DICT_OPTIONS, TRAIN_STATE, CheckpointError, rng_file_name,
                                       rng_state, step_dir_name)
from pitlab.trainer.checkpoint import load_checkpoint as load_local

STAGING_ENV = "PITLAB_STAGING_DIR"
_STEP = re.compile(r"^step-(\d+)$")


def staging_root() -> Path:
    """Node-local folder for checkpoint files on their way to or from object storage."""
    return Path(os.environ.get(STAGING_ENV) or tempfile.gettempdir()) / "pitlab-staging"


def staging_tag(uri: str) -> str:
    """A short, stable name part for ``uri``'s staging folder (12 hex digits of its sha256)."""
    return hashlib.sha256(uri.encode()).hexdigest()[:12]


def _collective_check(error: str | None, what: str) -> None:
    """All ranks learn whether any failed; every rank raises the same CheckpointError if one did."""
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        raise CheckpointError(f"{what}: " + "; ".join(f"rank {r}: {e}" for r, e in failed))


def latest_checkpoint(uri: str) -> str | None:
    """``<uri>/step-<N>`` named by ``<uri>/latest``, or None when there is no ``latest`` yet.

    Raises CheckpointError when ``latest`` is malformed or names a step without ``_COMPLETE`` (never
    resumed from), and :class:`~pitlab.storage.StorageError` for access problems (bucket, credentials).
    """
    pointer = storage.join(uri, LATEST)
    try:
        name = storage.read_text(pointer).strip()
    except storage.ObjectNotFound:
        return None
    if not _STEP.match(name):
        raise CheckpointError(f"{pointer}: expected 'step-<N>', found {name!r}")
    step_uri = storage.join(uri, name)
    if not storage.is_published(step_uri):
        raise CheckpointError(f"{pointer}: names {name}, but {step_uri} has no {storage.COMPLETE} marker (not "
                              "completely uploaded); refusing to resume from it")
    return step_uri


def save_checkpoint(uri: str, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, keep: int,
                    train_state: dict | None, scheduler) -> str:
    """Collective: :func:`pitlab.trainer.checkpoint.save_checkpoint` to object storage (see the module
    docstring). Returns ``<uri>/step-<N>``. Raises CheckpointError naming the failed ranks and their
    storage errors (the checkpoint is then not published and ``latest`` is unchanged)."""
    import json

    rank, world = dist.get_rank(), dist.get_world_size()
    name = step_dir_name(step)
    step_uri = storage.join(uri, name)
    stage = staging_root() / f"save-{staging_tag(uri)}-{name}-rank-{rank}"
    shutil.rmtree(stage, ignore_errors=True)
    error = None
    if rank == 0:
        try:
            storage.unpublish(step_uri)  # a step being rewritten is never taken for a complete one
        except storage.StorageError as err:
            error = str(err)
    _collective_check(error, f"checkpoint {step_uri} not written")
    model_sd, optim_sd = get_state_dict(model, optimizer, options=STATE_DICT_OPTIONS)  # as the local save
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=stage)  # this rank's files (+ .metadata on 0)
    torch.save(rng_state(), stage / rng_file_name(rank))
    if rank == 0:
        state = dict(train_state or {}, step=step, world_size=world)
        if scheduler is not None:
            state["scheduler"] = scheduler.state_dict()
        (stage / TRAIN_STATE).write_text(json.dumps(state, indent=2) + "\n")
    entries, error = {}, None
    try:
        files = {p.relative_to(stage).as_posix(): p for p in sorted(stage.rglob("*")) if p.is_file()}
        entries = storage.upload_files(files, step_uri)
    except storage.StorageError as err:
        error = str(err)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (entries, error))
    failed = [(r, e) for r, (_, e) in enumerate(gathered) if e]
    if failed:
        raise CheckpointError(f"checkpoint {step_uri} not published ({uri}/latest not moved): " + "; ".join(
            f"rank {r}: {e}" for r, e in failed))
    error = None
    if rank == 0:
        try:
            files = {}
            for part, _ in gathered:
                dup = set(files) & set(part)
                if dup:
                    raise storage.StorageError(f"two ranks wrote {sorted(dup)}")
                files.update(part)
            storage.publish(step_uri, files, extra={"step": step, "world_size": world})
            storage.write_text(storage.join(uri, LATEST), name + "\n")
            prune_checkpoints(uri, keep, step)
        except storage.StorageError as err:
            error = str(err)
    _collective_check(error, f"checkpoint {step_uri} not published")
    return step_uri


def load_checkpoint(step_uri: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> dict:
    """Collective: download ``step_uri`` (published; verified file by file) once per node into the staging
    folder and load it with :func:`pitlab.trainer.checkpoint.load_checkpoint`. Raises CheckpointError
    naming the failed ranks (e.g. a sha256 mismatch naming the object)."""
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    cache = staging_root() / f"load-{staging_tag(step_uri)}"
    path, error = None, None
    if local_rank == 0:
        try:
            path = storage.localize(step_uri, cache_dir=cache, require_published=True)
        except storage.StorageError as err:
            error = str(err)
    _collective_check(error, f"cannot resume from {step_uri}")
    if path is None:
        path = storage.localize(step_uri, cache_dir=cache)  # already there: found by the manifest digest
    try:
        return load_local(path, model, optimizer, scheduler)
    finally:
        dist.barrier()
        if local_rank == 0:
            shutil.rmtree(cache, ignore_errors=True)


def step_dirs(uri: str) -> dict[int, bool]:
    """Step number → published (has ``_COMPLETE``) for every ``step-<N>/`` under ``uri``."""
    out: dict[int, bool] = {}
    for name in storage.list_files(uri):
        head, _, rest = name.partition("/")
        m = _STEP.match(head)
        if m and rest:
            n = int(m.group(1))
            out[n] = out.get(n, False) or rest == storage.COMPLETE
    return dict(sorted(out.items()))


def prune_checkpoints(uri: str, keep: int, current: int) -> list[int]:
    """Delete all but the newest ``keep`` published steps (never the one ``latest`` names, never
    ``current``) and the debris of unpublished steps older than ``current``; returns the deleted steps."""
    steps = step_dirs(uri)
    latest = latest_checkpoint(uri)
    keep_names = {latest.rsplit("/", 1)[-1]} if latest else set()
    complete = [n for n, ok in steps.items() if ok]
    doomed = [n for n in complete[:-keep]] + [n for n, ok in steps.items() if not ok and n < current]
    deleted = []
    for n in sorted(set(doomed)):
        if f"step-{n}" in keep_names or n == current:
            continue
        storage.unpublish(storage.join(uri, f"step-{n}"))  # unpublish first: never a half-deleted "complete" one
        storage.delete_tree(storage.join(uri, f"step-{n}"))
        deleted.append(n)
    return deleted
