"""Atomic small-file writes: a reader sees the old content or the new, never a partial file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pitlab.storage.outdir import fsync_dir  # noqa: F401  (re-exported: the one directory fsync)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via ``<path>.tmp`` + fsync + ``os.replace``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj: object) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically (see :func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_spec(resource, path: Path) -> Path:
    """Write a PitTraining or LeakageEval as the resolved-spec JSON every stage reads
    (:func:`pitlab.api.dump_resource`), atomically, creating the folder; returns ``path``."""
    from pitlab.api import dump_resource

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, dump_resource(resource))
    return path



def make_readable(directory: Path) -> None:
    """Give every file directly in ``directory`` the umask's default mode (usually 0644).

    ``save_pretrained`` writes ``*.safetensors`` as 0600 (private temp file renamed into place); a model
    directory read by another user (e.g. an evaluation pod with a different uid) needs ordinary modes.
    """
    umask = os.umask(0)
    os.umask(umask)
    for p in Path(directory).iterdir():
        if p.is_file():
            os.chmod(p, 0o666 & ~umask)
