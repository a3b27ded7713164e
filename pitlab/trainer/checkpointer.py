"""The training run's checkpoints: where they go (a local folder or ``s3://``), when they are written, resume.

:class:`Checkpointer` owns the save schedule (every ``spec.checkpoint.everySteps`` optimizer steps and at the
end, :func:`pitlab.trainer.checkpoint.checkpoint_steps`), the disk-space check before step 1 (local folders),
retention (``keep``) and the resume of an interrupted run (refusing a checkpoint of a different run, naming the
field). The module-level functions choose the store for a location: :mod:`pitlab.trainer.checkpoint` for a
folder, :mod:`pitlab.trainer.checkpoint_s3` for ``s3://bucket/prefix``; both have the same layout and guarantees.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pitlab import storage
from pitlab.api import SpecError
from pitlab.trainer import checkpoint as local
from pitlab.trainer import checkpoint_s3

# run identity key -> the spec field to change (named in the refusal of a checkpoint of another run)
IDENTITY_FIELDS = {"seed": "spec.training.seed", "seq_len": "spec.training.seqLen",
                   "micro_batch_size": "spec.training.microBatchSize",
                   "gradient_accumulation_steps": "spec.training.gradientAccumulationSteps",
                   "world_size": "spec.resources.gpusPerNode", "tokens": "spec.tokens", "total_steps": "spec.tokens",
                   "n_chunks": "data/tokens.npy", "method": "spec.method", "lora": "spec.lora"}
_IDENTITY_DEFAULTS = {"method": "full", "lora": None}  # checkpoints written before LoRA existed


def latest_checkpoint(location: Path | str) -> Path | str | None:
    """The newest complete checkpoint at ``location`` (a folder, or ``s3://`` giving an ``s3://…/step-<N>``
    string), None when there is none. Raises :class:`~pitlab.trainer.checkpoint.CheckpointError` as the store's
    ``latest_checkpoint`` does."""
    if storage.is_s3(location):
        return checkpoint_s3.latest_checkpoint(str(location))
    return local.latest_checkpoint(Path(location))


def save_checkpoint(location: Path | str, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    keep: int, train_state: dict | None = None,
                    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> Path | str:
    """Collective: :func:`pitlab.trainer.checkpoint.save_checkpoint` into a folder or its S3 twin; returns the
    ``step-<N>`` location. Raises ``ValueError`` if ``keep < 1``."""
    if keep < 1:
        raise ValueError(f"spec.checkpoint.keep: must be >= 1 (got {keep})")
    if storage.is_s3(location):
        return checkpoint_s3.save_checkpoint(str(location), step, model, optimizer, keep, train_state, scheduler)
    return local.save_checkpoint(Path(location), step, model, optimizer, keep, train_state, scheduler)


def load_checkpoint(path: Path | str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> dict:
    """Collective: restore a ``step-<N>`` checkpoint (folder or ``s3://``) into the live objects; returns its
    ``train_state.json``."""
    if storage.is_s3(path):
        return checkpoint_s3.load_checkpoint(str(path), model, optimizer, scheduler)
    return local.load_checkpoint(Path(path), model, optimizer, scheduler)


class Checkpointer:
    """The checkpoints of one training run: ``location`` from ``spec.checkpoint.uri`` (or ``run_dir/checkpoint``),
    ``every_steps`` and ``keep`` from ``spec.checkpoint``. Collective methods must be called by every rank."""

    def __init__(self, uri: str | None, run_dir: Path, every_steps: int, keep: int):
        self.location = local.checkpoint_location(uri, run_dir)
        self.every_steps, self.keep = every_steps, keep
        self.last: Path | str | None = None
        self._periodic: set[int] = set()

    def resume(self, run_identity: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler) -> int:
        """Collective: load the newest complete checkpoint when there is one and return its step (0 without one).
        Raises :class:`SpecError` naming the field when the checkpoint belongs to another run
        (:data:`IDENTITY_FIELDS`)."""
        found = latest_checkpoint(self.location)
        if found is None:
            return 0
        saved = local.read_train_state(found).get("run", {})
        for key, field in IDENTITY_FIELDS.items():
            if saved.get(key, _IDENTITY_DEFAULTS.get(key)) != run_identity[key]:
                raise SpecError([(field, f"differs from the checkpoint to resume ({found}: {key}={saved.get(key)!r}, "
                                         f"now {run_identity[key]!r}); use a new run directory or the same settings")])
        self.last = found
        return int(load_checkpoint(found, model, optimizer, scheduler)["step"])

    def schedule(self, start_step: int, total_steps: int, trainable: list[torch.Tensor]) -> list[int]:
        """Fix the steps this run saves at (from ``start_step`` to ``total_steps``) and, for a local folder, refuse
        before step 1 a run whose checkpoints cannot fit the disk (:func:`~pitlab.trainer.checkpoint.
        check_disk_space`; every rank checks the same numbers, so all fail together). Returns the steps."""
        steps = local.checkpoint_steps(start_step, total_steps, self.every_steps)
        self._periodic = set(steps) - {total_steps}  # the end's save is :meth:`final`
        if not storage.is_s3(self.location):
            local.check_disk_space(self.location, local.checkpoint_bytes(trainable), len(steps), self.keep)
        return steps

    def saves_at(self, step: int) -> bool:
        """Whether :meth:`after_step` saves after ``step`` completed optimizer steps (the loop then reads that step
        before it launches the next one, :func:`pitlab.trainer.step.run_steps`)."""
        return step in self._periodic

    def after_step(self, step: int, model, optimizer, scheduler, train_state: dict) -> bool:
        """Collective: save when ``step`` (completed optimizer steps) is a periodic save step; True if it saved."""
        if step not in self._periodic:
            return False
        self.last = save_checkpoint(self.location, step, model, optimizer, self.keep, train_state, scheduler)
        return True

    def final(self, step: int, model, optimizer, scheduler, train_state: dict, ran_steps: bool) -> Path | str:
        """Collective: the end-of-run save (skipped when the run resumed at its last step and ran none, and a
        checkpoint exists); returns the newest checkpoint's location."""
        if ran_steps or self.last is None:
            self.last = save_checkpoint(self.location, step, model, optimizer, self.keep, train_state, scheduler)
        return self.last
