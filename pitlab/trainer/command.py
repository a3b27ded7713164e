"""The torchrun command of the train stage, built in one place for both executors (pure; standard library only,
so the operator, which has no torch, builds the PyTorchJob's command with it)."""

from __future__ import annotations

import sys
from pathlib import Path


def torchrun_command(spec_path: Path | str, run_dir: Path | str, nproc: int, base: Path | str | None = None, *,
                     nodes: int | None = None) -> list[str]:
    """The ``torchrun`` command line of a training run with ``nproc`` ranks per node; every rank runs the pods'
    entry point ``python -m pitlab.cli train --spec S --run-dir D [--base B]``
    (:func:`pitlab.trainer.train.run_rank`), on a cluster and under ``pitlab run`` alike.

    ``nodes`` None: one machine (``pitlab run``): ``python -m torch.distributed.run --standalone`` with this
    interpreter. ``nodes`` given: one PyTorchJob replica with a static rendezvous at the master's Service
    (``$(RANK)``, ``$(MASTER_ADDR)`` and ``$(MASTER_PORT)`` are set in the ``pytorch`` container by the Kubeflow
    training operator, RANK being the node rank when ``nprocPerNode`` is set, and expanded by the kubelet).
    ``base``: the base model folder (default ``RUN_DIR/base``). Raises ``ValueError`` if ``nproc < 1``.
    """
    if nproc < 1:
        raise ValueError(f"spec.resources.gpusPerNode: must be >= 1 (got {nproc})")
    rank = _rank(spec_path, run_dir, base)
    if nodes is None:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] + rank
    return ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={nproc}", "--node-rank=$(RANK)",
            "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)"] + rank


LAUNCHER = ("python", "-m", "pitlab.trainer.torchrun")
"""torchrun, ending with a rank's bad-input exit code 2 instead of torchrun's 1 (:mod:`pitlab.trainer.torchrun`), so
that a Job's ``podFailurePolicy`` can fail fast on it."""
JOBSET_MASTER_PORT = 29500


def _rank(spec_path: Path | str, run_dir: Path | str, base: Path | str | None) -> list[str]:
    """What torchrun starts in every rank: ``-m pitlab.cli train --spec S --run-dir D [--base B]``."""
    return ["-m", "pitlab.cli", "train", "--spec", str(spec_path), "--run-dir", str(run_dir)] + (
        ["--base", str(base)] if base not in (None, "") else [])


def trainjob_command(spec_path: Path | str, run_dir: Path | str, base: Path | str | None = None) -> list[str]:
    """The command of a TrainJob's ``node`` container: torchrun without rendezvous flags, so that it reads
    ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT``, which
    Kubeflow Trainer's torch plugin injects (pitlab sets none of them), through :data:`LAUNCHER`."""
    return [*LAUNCHER, *_rank(spec_path, run_dir, base)]


def jobset_command(spec_path: Path | str, run_dir: Path | str, nproc: int, base: Path | str | None = None, *,
                   nodes: int, master_addr: str, master_port: int = JOBSET_MASTER_PORT) -> list[str]:
    """The command of a JobSet's ``node`` container (one pod per node of an Indexed Job): a static rendezvous at
    ``master_addr`` (the pod of completion index 0, through the JobSet's headless Service), the node rank being the
    pod's ``$(JOB_COMPLETION_INDEX)`` (set by the Job controller, expanded by the kubelet), through
    :data:`LAUNCHER`. Raises ``ValueError`` if ``nproc < 1`` or ``nodes < 1``."""
    if nproc < 1:
        raise ValueError(f"spec.resources.gpusPerNode: must be >= 1 (got {nproc})")
    if nodes < 1:
        raise ValueError(f"spec.resources.nodes: must be >= 1 (got {nodes})")
    return [*LAUNCHER, f"--nnodes={nodes}", f"--nproc-per-node={nproc}", "--node-rank=$(JOB_COMPLETION_INDEX)",
            f"--master-addr={master_addr}", f"--master-port={master_port}", *_rank(spec_path, run_dir, base)]
