"""Output folders of commands that write a whole folder (``pitlab push``, ``pitlab merge``): refuse one that
holds content the command did not create unless ``--overwrite``, and replace a local one atomically (the new
content is written aside, renamed into place, and only then is the old one removed).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Callable

from pitlab.storage import ops
from pitlab.storage.errors import OutputExists
from pitlab.storage.uri import is_s3

Own = Callable[[ops.Location, list[str]], set[str]]
"""``own(dest, entries)``: the entries of ``dest`` an earlier run of the command wrote (empty when none)."""


def entries(dest: ops.Location) -> list[str]:
    """What ``dest`` holds: every file (relative, ``/``-separated) and, for a local folder, every empty folder
    (``name/``), sorted. Empty when ``dest`` does not exist."""
    if is_s3(dest):
        return sorted(ops.list_files(dest))
    root = Path(dest)
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_dir() and not p.is_symlink():
            if next(p.iterdir(), None) is None:
                out.append(p.relative_to(root).as_posix() + "/")
        else:
            out.append(p.relative_to(root).as_posix())
    return out


def listed(names: list[str] | set[str], n: int = 3) -> str:
    """``a, b, c, ...``: the first ``n`` names, sorted."""
    names = sorted(names)
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


def check_output(dest: ops.Location, overwrite: bool, command: str, own: Own | None = None,
                 replace_own: bool = False) -> list[str]:
    """Check the output folder ``dest`` (a local folder or an ``s3://`` prefix) before ``command`` writes it.

    Returns what ``dest`` holds (:func:`entries`; empty when absent or empty), which the command will replace.
    Raises :class:`OutputExists` when it holds something and ``overwrite`` is False, naming the files the
    command did not write (``own`` tells which entries an earlier run of the command wrote), or, when all of
    them are an earlier output of the command and not ``replace_own``, saying so. A local ``dest`` that is a
    file is always refused. Raises :class:`~pitlab.storage.errors.StorageError` when ``dest`` cannot be listed."""
    if not is_s3(dest) and Path(dest).exists() and not Path(dest).is_dir():
        raise OutputExists(f"{dest}: exists and is not a folder; `{command}` writes a folder there (move the file "
                           "away or give another destination)")
    found = entries(dest)
    if not found or overwrite:
        return found
    mine = own(dest, found) if own is not None else set()
    other = [e for e in found if e not in mine]
    if other:
        raise OutputExists(f"{dest}: already holds {len(other)} file(s) that `{command}` did not write "
                           f"({listed(other)}); pass --overwrite to delete them with the folder, or give an empty or "
                           "new destination")
    if replace_own:
        return found
    raise OutputExists(f"{dest}: holds an earlier `{command}` output ({len(found)} file(s): {listed(found)}); pass "
                       "--overwrite to replace it, or give an empty or new destination")


def published_files(dest: ops.Location, found: list[str]) -> set[str]:
    """The entries of ``dest`` that its manifest lists, with the markers (an :data:`Own` for ``pitlab push``); empty
    when ``dest`` is not a published folder."""
    from pitlab.storage.errors import StorageError
    from pitlab.storage.manifest import MARKERS, read_manifest

    if not MARKERS <= set(found):
        return set()
    try:
        return (set(read_manifest(dest).files) | MARKERS) & set(found)
    except (StorageError, ValueError, KeyError):
        return set()


def describe(dest: ops.Location, found: list[str]) -> str:
    """``DEST (N file(s): a, b, c, ...)`` for the message that names what a command replaces."""
    return f"{dest} ({len(found)} file(s): {listed(found)})"


def aside(dest: Path) -> Path:
    """A fresh sibling folder of ``dest`` to write the new content into (``.<name>.<random>.part``); the parent
    is created."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")
    tmp.mkdir()
    return tmp


def swap_in(tmp: Path, dest: Path) -> None:
    """Put the complete folder ``tmp`` at ``dest``: an existing ``dest`` is renamed aside first (a hidden sibling
    ``.<name>.<random>.old``), ``tmp`` renamed to ``dest``, the parent fsynced (the renames are durable), and only
    then the old content removed. The one directory swap of pitlab (merge, push, the base model, adapter saves).
    Raises ``OSError``; on failure ``dest`` keeps its old content and ``tmp`` is left for the caller."""
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
    fsync_dir(dest.parent)
    if had:
        shutil.rmtree(old, ignore_errors=True)


def fsync_dir(path: Path) -> None:
    """fsync a directory so that renames inside it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["OutputExists", "aside", "check_output", "describe", "entries", "fsync_dir", "listed", "published_files",
           "swap_in"]
