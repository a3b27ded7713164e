"""The run folders a local run owns: ``<out>/<metadata.name>/`` and, for a PitTraining, one
``<out>/<evaluation name>/`` per ``spec.evaluations[]`` entry.

``pitlab validate`` and ``pitlab run`` both call :func:`check_run_folders` before anything is written, so a run
never replaces a folder it does not own: the folders must be distinct (the schema already refuses two
evaluations with one name and an evaluation named like its PitTraining), and an existing folder is deleted only
with ``--overwrite``, which names what it deletes. A folder's owner is read from its ``status.json`` (the
resource ``pitlab run`` wrote there: kind, name and, for an evaluation, the ``pitlab.io/training`` label).
No input of the spec may lie inside a run folder (the run would replace it), whatever ``--overwrite``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pitlab.api.base import SpecError
from pitlab.api import layout

TRAINING_LABEL = "pitlab.io/training"
REPLACED = ".replaced"
"""``<out>/.replaced/``: where ``pitlab run --overwrite`` keeps the folders it replaces until the new run succeeds
(a run folder's name is a DNS-1123 name, so it never starts with a dot)."""


@dataclass(frozen=True)
class RunFolder:
    """One folder a run writes: ``path`` (``<out>/<name>``), the spec ``field`` that names it, and the owner it
    will record (``kind``/``name``, ``training`` for a PitTraining's evaluation)."""

    path: Path
    field: str
    kind: str
    name: str
    training: str | None = None

    def describe(self) -> str:
        """``LeakageEval 'jpx' (evaluation of PitTraining 'fomc')``-style words for messages."""
        of = f" (evaluation of PitTraining {self.training!r})" if self.training else ""
        return f"{self.kind} {self.name!r}{of}"


def run_folders(res, root: Path) -> list[RunFolder]:
    """The folders a local run of ``res`` (PitTraining or LeakageEval) writes under the output root ``root``,
    the resource's own first, then each evaluation's in spec order."""
    name = res.metadata.name
    out = [RunFolder(Path(root) / name, "metadata.name", res.kind, name)]
    for i, ev in enumerate(getattr(res.spec, "evaluations", None) or []):
        out.append(RunFolder(Path(root) / ev.name, f"spec.evaluations[{i}].name", "LeakageEval", ev.name, name))
    return out


def folder_owner(path: Path) -> tuple[tuple[str, str, str | None] | None, str]:
    """Who wrote the existing folder ``path``: ``((kind, name, training), words)`` from its ``status.json``
    (``training``: the ``pitlab.io/training`` label, None for a standalone resource), or ``(None, words)`` for
    a folder without a readable status.json."""
    st = Path(path) / layout.STATUS
    if not st.is_file():
        n = sum(1 for _ in Path(path).iterdir()) if Path(path).is_dir() else 0
        return None, f"no pitlab run (no status.json; {n} entries)"
    try:
        doc = json.loads(st.read_text(encoding="utf-8"))
        meta = doc.get("metadata") or {}
        training = (meta.get("labels") or {}).get(TRAINING_LABEL)
        of = f" (evaluation of PitTraining {training!r})" if training else ""
        return (str(doc.get("kind")), str(meta.get("name")), training), f"{doc.get('kind')} {meta.get('name')!r}{of}"
    except (OSError, ValueError, AttributeError):
        return None, "an unknown writer (unreadable status.json)"


def folder_phase(path: Path) -> str | None:
    """``status.phase`` of the run in ``path`` (None without a readable status.json)."""
    try:
        return str(json.loads((Path(path) / layout.STATUS).read_text(encoding="utf-8"))["status"]["phase"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resumable(res, root: Path) -> str | None:
    """The phase of an unfinished run of ``res`` in ``<root>/<name>`` (Interrupted, Failed, a stage's phase) that
    ``pitlab run --resume`` can continue; None when there is none or it Succeeded."""
    own = run_folders(res, root)[0]
    if not (own.path.is_dir() and folder_owner(own.path)[0] == (own.kind, own.name, None)):
        return None
    phase = folder_phase(own.path)
    return None if phase in (None, "Succeeded") else phase


def local_inputs(res, unexpandable: list[tuple[str, str]] | None = None) -> list[tuple[str, Path]]:
    """``(field, path)`` of every local input of ``res``'s spec: each ``uri`` field but the outputs
    (``output.uri``, ``checkpoint.uri``), after variable expansion; ``s3://`` and ``package://`` inputs and
    unexpandable ones are left out, the latter's ``(field, message)`` appended to ``unexpandable`` when given
    (an unset ``${PITLAB_DATA_ROOT}``)."""
    from pitlab.api import dump_resource
    from pitlab.api.load import expand_uri

    found: list[tuple[str, Path]] = []

    def walk(value, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                field = f"{where}.{k}"
                if k == "uri" and isinstance(v, str):
                    if field.endswith(("output.uri", "checkpoint.uri")):
                        continue
                    try:
                        s = expand_uri(v, field)
                    except SpecError as err:
                        if unexpandable is not None:
                            unexpandable.extend(err.problems)
                        continue
                    s = s[len("file://"):] if s.startswith("file://") else s
                    if "://" not in s:
                        found.append((field, Path(s).expanduser()))
                else:
                    walk(v, field)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")

    walk(dump_resource(res)["spec"], "spec")
    return found


def _inside(path: Path, folder: Path) -> bool:
    p, f = path.resolve(), folder.resolve()
    return p == f or p.is_relative_to(f)


def _empty_dir(path: Path) -> bool:
    return path.is_dir() and next(path.iterdir(), None) is None


def enclosing_run(root: Path) -> tuple[Path, str] | None:
    """The nearest of ``root`` and its parents that is the folder of a pitlab run (a ``status.json`` naming a
    kind and a name), with its owner in words (:func:`folder_owner`), or None."""
    p = Path(root).absolute()
    for folder in (p, *p.parents):
        if (folder / layout.STATUS).is_file():
            owner, words = folder_owner(folder)
            if owner is not None:
                return folder, words
    return None


def check_run_folders(res, root: Path, overwrite: bool = False, source: str | None = None,
                      earlier_runs_ok: bool = False, resume_command: str | None = None,
                      resume_refused: str | None = None) -> list[Path]:
    """Check the run folders of ``res`` under ``root`` before anything is written.

    Returns the existing folders (the ones ``--overwrite`` deletes; an empty folder counts as free). Raises
    :class:`SpecError` naming each problem's field, folder and owner: two run folders that coincide or a path
    that is a file or a folder holding an input of the spec (whatever ``overwrite``), and, without ``overwrite``,
    every existing folder (an unfinished run of ``res`` with the advice to ``--resume`` it); with
    ``earlier_runs_ok`` (``pitlab validate``) only the folders another resource (or no pitlab run) wrote.
    ``resume_command``: the command the advice names (default ``pitlab run --resume <source>``);
    ``resume_refused``: why ``--resume`` would refuse the unfinished run (a changed spec field), named instead.
    """
    folders = run_folders(res, root)
    problems: list[tuple[str, str]] = []
    if REPLACED in Path(root).absolute().parts:
        problems.append(("spec.output.uri", f"the output root {root} is in a {REPLACED} folder, where `pitlab run "
                                            "--overwrite` keeps the runs it replaced; give --out (or spec.output.uri) "
                                            "outside it"))
    elif (enclosing := enclosing_run(root)) is not None:
        problems.append(("spec.output.uri", f"the output root {root} is inside {enclosing[0]}, the run folder of "
                                            f"{enclosing[1]}: this run's folders would mix with that "
                                            "run's files, and its --overwrite would replace them; give --out (or "
                                            "spec.output.uri) outside it"))
    seen: dict[Path, RunFolder] = {}
    for f in folders:
        key = f.path.resolve() if f.path.exists() else f.path.absolute()
        if key in seen:
            problems.append((f.field, f"{f.path} is also the run folder of {seen[key].describe()}; every run "
                                      "folder must be distinct"))
        seen[key] = f
    unexpandable: list[tuple[str, str]] = []  # named with the folders' problems: one refusal says both
    inputs = local_inputs(res, unexpandable)
    problems.extend(unexpandable)
    for field, path in inputs:
        for f in folders:
            if _inside(path, f.path):
                problems.append((field, f"{path} is inside {f.path}, the run folder of {f.describe()}, which the run "
                                        "replaces (--overwrite deletes it first); move the input out of the folder, "
                                        "or choose another --out or name"))
    existing = [f for f in folders if f.path.is_symlink() or f.path.exists() and not _empty_dir(f.path)]
    phase = resumable(res, root) if existing and not overwrite else None
    for f in existing:
        if not f.path.is_dir() or f.path.is_symlink():
            problems.append((f.field, f"{f.path} exists and is not a folder; move it away (--overwrite deletes "
                                      "only run folders)"))
            continue
        owner, words = folder_owner(f.path)
        if overwrite or (earlier_runs_ok and owner == (f.kind, f.name, f.training)):
            continue
        if phase and owner == (f.kind, f.name, f.training):
            advice = (f"it cannot be resumed with this spec ({resume_refused}): pass" if resume_refused else
                      f"continue it with `{resume_command or 'pitlab run --resume ' + (source or 'FILE')}`, or pass")
            problems.append((f.field, f"{f.path} holds an unfinished run of {f.describe()} (status {phase} in "
                                      f"{folders[0].path / layout.STATUS}): {advice} "
                                      "--overwrite to start again (the unfinished run, checkpoints included, is "
                                      f"kept in {Path(root) / REPLACED}/ until the new run succeeds)"))
            continue
        problems.append((f.field, f"{f.path} already exists, written by {words}; the run of {f.describe()} "
                                  "would replace it: pass --overwrite to replace it (the old one is kept in "
                                  f"{Path(root) / REPLACED}/ until the new run succeeds), or choose another name "
                                  "or --out"))
    if problems:
        raise SpecError(problems, source)
    return [f.path for f in existing]


def set_aside(path: Path, root: Path) -> Path:
    """Rename the run folder ``path`` to ``<root>/.replaced/<name>.<UTC time, YYYYmmddTHHMMSSZ>`` (``.1``, ``.2``
    ... appended if taken) and return the new path: ``--overwrite`` keeps a replaced run there until its successor
    succeeded. One ``os.rename`` in ``root``'s filesystem, so the folder is either in its old place or in the new
    one. Raises ``OSError`` when the rename fails (a run folder that is a mount point, a read-only ``root``)."""
    import datetime as dt

    aside = Path(root) / REPLACED
    aside.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest, n = aside / f"{Path(path).name}.{stamp}", 0
    while dest.exists():
        n += 1
        dest = aside / f"{Path(path).name}.{stamp}.{n}"
    os.rename(path, dest)
    return dest


def lock_run_folders(root: Path, names: list[str], lock_dir: Path | None = None) -> list:
    """Hold an exclusive advisory lock (``fcntl.flock``) for every run folder ``root/<name>``, for as long as the
    returned open files live (the process, in ``pitlab run``): a second ``pitlab run`` on one of the folders is
    refused instead of writing into it beside the first (a resume took the first run's checkpoints while it
    trained, and the first failed on the metrics file the second rewrote). The lock files live in ``lock_dir``
    (default: ``$XDG_CACHE_HOME/pitlab/locks``, else ``~/.cache/pitlab/locks``), named by the sha256 of the
    folder's absolute path, so nothing is written into the output folder before the inputs pass; each holds
    its owner's pid. Raises :class:`pitlab.api.base.SpecError` at ``spec.output.uri`` naming the folder and the
    pid holding it. Where ``fcntl`` does not exist (Windows) nothing is locked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        return []
    lock_dir = lock_dir or _lock_dir()
    try:
        lock_dir.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable cache (a read-only home): run unlocked, as before
        return []
    held = []
    for name in names:
        folder = (root / name).resolve()
        path = _lock_path(folder, lock_dir)
        f = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            owner = f.read().split()[:1] or ["unknown"]
            f.close()
            for g in held:
                g.close()
            raise SpecError([("spec.output.uri", f"{folder} is in use by another pitlab process (pid {owner[0]}, "
                                                 f"lock {path}): wait for it to end or stop it; two runs in one "
                                                 "folder would overwrite each other's checkpoints and metrics")])
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()} {folder}\n")
        f.flush()
        held.append(f)
    return held


def _lock_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "pitlab" / "locks"


def _lock_path(folder: Path, lock_dir: Path) -> Path:
    import hashlib

    return lock_dir / f"{hashlib.sha256(str(folder).encode()).hexdigest()[:24]}.lock"


def folder_holder(folder: Path, lock_dir: Path | None = None) -> str | None:
    """The pid (as written in its lock file) of the ``pitlab run`` that holds run folder ``folder`` now
    (:func:`lock_run_folders`), or None when none does (or locks do not exist here). Takes the lock for an
    instant when it is free."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        return None
    path = _lock_path(Path(folder).resolve(), lock_dir or _lock_dir())
    try:
        f = open(path, encoding="utf-8")
    except OSError:  # never locked, or no readable cache
        return None
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return (f.read().split()[:1] or ["unknown"])[0]
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return None
