"""Output folders of commands that write a whole folder (``pitlab push``, ``pitlab merge``): refuse one that
holds content the command did not create unless ``--overwrite``, and replace a local one atomically (the new
content is written aside, renamed into place, and only then is the old one removed).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from pitlab.storage import ops
from pitlab.storage.errors import OutputExists
from pitlab.storage.uri import is_s3


def check_output(dest: ops.Location, overwrite: bool, command: str, own_marker: str | None = None) -> bool:
    """Whether ``dest`` (a local folder or an ``s3://`` prefix) holds anything; raises :class:`OutputExists`
    when it does and ``overwrite`` is False, unless ``own_marker`` (a file name, e.g. ``merge_report.json``)
    is there, which marks an earlier output of ``command`` itself. A local ``dest`` that is a file is always
    refused. Raises :class:`~pitlab.storage.errors.StorageError` when ``dest`` cannot be listed."""
    if not is_s3(dest):
        p = Path(dest)
        if p.exists() and not p.is_dir():
            raise OutputExists(f"{p}: exists and is not a folder; `{command}` writes a folder there (move the file "
                               "away or give another destination)")
        if not p.is_dir() or next(p.iterdir(), None) is None:
            return False
        files = ops.list_files(p)
    else:
        files = ops.list_files(dest)
        if not files:
            return False
    if overwrite or (own_marker is not None and own_marker in files):
        return True
    listed = ", ".join(sorted(files)[:3]) + (", ..." if len(files) > 3 else "")
    raise OutputExists(f"{dest}: already holds {len(files)} file(s) that `{command}` did not write ({listed}); "
                       "pass --overwrite to replace them, or give an empty or new destination")


def aside(dest: Path) -> Path:
    """A fresh sibling folder of ``dest`` to write the new content into (``.<name>.<random>.part``); the parent
    is created."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")
    tmp.mkdir()
    return tmp


def swap_in(tmp: Path, dest: Path) -> None:
    """Put the complete folder ``tmp`` at ``dest``: an existing ``dest`` is renamed aside first, ``tmp`` renamed
    to ``dest``, then the old content removed. On failure ``dest`` keeps its old content."""
    old = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.old")
    had = dest.exists()
    if had:
        os.replace(dest, old)
    try:
        os.replace(tmp, dest)
    except OSError:
        if had:
            os.replace(old, dest)
        raise
    if had:
        shutil.rmtree(old, ignore_errors=True)


__all__ = ["OutputExists", "aside", "check_output", "swap_in"]
