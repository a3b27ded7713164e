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
    rank = ["-m", "pitlab.cli", "train", "--spec", str(spec_path), "--run-dir", str(run_dir)] + (
        ["--base", str(base)] if base not in (None, "") else [])
    if nodes is None:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] + rank
    return ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={nproc}", "--node-rank=$(RANK)",
            "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)"] + rank
