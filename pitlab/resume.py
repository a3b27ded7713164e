"""``pitlab run --resume``: continue an interrupted (or failed) local run from its first incomplete stage.

The run folder's ``status.json`` holds the resource the run started with and the conditions of its stages. A
resume refuses (:class:`pitlab.api.SpecError`, exit 2) when there is nothing to resume, when the spec differs
from the one the run started with (naming the first differing field), when the corpus the cutoff filter keeps
differs, or when an evaluation's folder belongs to another resource (an empty one is free). Otherwise the stages whose condition is True
are skipped and the others run again: training continues from its last complete checkpoint (bit-identical to an
uninterrupted run, :mod:`pitlab.trainer.checkpoint`), and an evaluation that did not succeed starts over in its
own folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pitlab.api import PitTraining, ResourceStatus, SpecError, dump_resource, layout, resolve_input
from pitlab.api.runfolders import folder_owner, run_folders


def first_difference(old: Any, new: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first field (dotted, ``[i]`` for lists) where two JSON values differ: ``(path, old, new)``, or None."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(old.keys() | new.keys()):
            d = first_difference(old.get(k), new.get(k), f"{path}.{k}")
            if d is not None:
                return d
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            d = first_difference(a, b, f"{path}[{i}]")
            if d is not None:
                return d
        return None
    return None if old == new else (path, old, new)


def resumable_status(res, root: Path, source: str | None = None) -> ResourceStatus:
    """The status of the interrupted run of ``res`` under ``root``, checked for a resume (module docstring).
    Raises :class:`SpecError`."""
    run_dir = Path(root) / res.metadata.name
    path = run_dir / layout.STATUS
    if not path.is_file():
        raise SpecError([("--resume", f"{path} does not exist: there is no run of {res.kind} "
                                      f"{res.metadata.name!r} to resume under {root}; run without --resume")], source)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        status = ResourceStatus.model_validate(doc.get("status") or {})
    except ValueError as err:
        raise SpecError([("--resume", f"{path}: unreadable status ({err}); run with --overwrite to start "
                                      "again")], source) from None
    if doc.get("kind") != res.kind or (doc.get("metadata") or {}).get("name") != res.metadata.name:
        raise SpecError([("--resume", f"{path} is the status of {doc.get('kind')} "
                                      f"{(doc.get('metadata') or {}).get('name')!r}, not of this {res.kind}")], source)
    diff = first_difference(doc.get("spec"), dump_resource(res)["spec"], "spec")
    if diff is not None:
        field, was, now = diff
        raise SpecError([(field, f"changed since the run in {run_dir} started (was {json.dumps(was)}, now "
                                 f"{json.dumps(now)}); a resume continues the same spec: revert the change, or run "
                                 "with --overwrite to start again")], source)
    for f in run_folders(res, root)[1:]:
        if f.path.exists() and not (f.path.is_dir() and next(f.path.iterdir(), None) is None):  # empty: free
            owner, words = folder_owner(f.path)
            if owner != (f.kind, f.name, f.training):
                raise SpecError([(f.field, f"{f.path} was written by {words}, not by this run's evaluation; move "
                                           "it away or run with --overwrite")], source)
    return status


def resume_refusal(res, root: Path) -> str | None:
    """Why ``pitlab run --resume`` would refuse the unfinished run of ``res`` under ``root`` (``field: reason``,
    the first problem of :func:`resumable_status`); None when it would continue it."""
    try:
        resumable_status(res, root)
    except SpecError as err:
        field, message = err.problems[0]
        return f"{field}: {message}"
    return None


def check_same_corpus(res: PitTraining, status: ResourceStatus, audit, source: str | None = None) -> None:
    """Refuse a resume whose corpus filter keeps other documents than the interrupted run's (the sha256 of the
    included ids in the status differs from the preflight's), or the same ids with another text or timestamp
    (the kept documents' sha256 differs; a status written before it was recorded is not compared)."""
    before = status.corpus_audit.included_ids_sha256 if status.corpus_audit else None
    if before is not None and before != audit.included_ids_sha256:
        raise SpecError([("spec.corpus.uri", f"the documents kept at the cutoff changed since the run started "
                                             f"(included ids sha256 {before[:12]}… then, "
                                             f"{audit.included_ids_sha256[:12]}… now); a resume trains on the same "
                                             "corpus: restore it, or run with --overwrite to start again")], source)
    then = status.corpus_audit.included_sha256 if status.corpus_audit else None
    now = getattr(audit, "included_sha256", None)
    if then and now and then != now:
        raise SpecError([("spec.corpus.uri", f"a document kept at the cutoff changed since the run started (the "
                                             f"same ids, but the kept documents' sha256 was {then[:12]}… then and "
                                             f"is {now[:12]}… now: a text or timestamp was edited); a resume "
                                             "trains on the same corpus: restore it, or run with --overwrite to "
                                             "start again")], source)


def base_folder(res: PitTraining, run_dir: Path) -> Path:
    """Where the prepare stage left the base model: ``run_dir/base`` (randomInit, or a copy of an ``s3://``
    model), else the local ``spec.baseModel.uri`` itself."""
    uri = res.spec.base_model.uri
    if uri is None or uri.startswith("s3://"):
        return run_dir / layout.BASE
    return resolve_input(uri, "spec.baseModel.uri")


def check_world_size(res: PitTraining, run_dir: Path, nproc: int, flag_given: bool) -> None:
    """Refuse a resume whose ``nproc`` torchrun processes differ from those that wrote the run's newest complete
    checkpoint (its ``train_state.json``'s ``world_size``: the data order and the RNG states are per rank), before
    anything is launched. Raises :class:`SpecError` naming ``--nproc`` when ``flag_given`` (else
    ``spec.resources.gpusPerNode``) and the count to give; nothing to check before the first checkpoint."""
    from pitlab.trainer.checkpoint import CheckpointError, checkpoint_location, read_train_state
    from pitlab.trainer.checkpointer import latest_checkpoint

    try:
        latest = latest_checkpoint(checkpoint_location(res.spec.checkpoint.uri, run_dir))
        world = read_train_state(latest).get("world_size") if latest is not None else None
    except (CheckpointError, OSError, ValueError):  # the trainer names a damaged checkpoint itself
        return
    if world is not None and world != nproc:
        field = "--nproc" if flag_given else "spec.resources.gpusPerNode"
        raise SpecError([(field, f"{nproc} training processes, but the checkpoint {latest} was written by {world}; "
                                 f"resume with --nproc {world} (the data order and the random states are per "
                                 "process, so another count cannot continue the run bit for bit)")])

