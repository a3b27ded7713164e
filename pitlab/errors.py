"""The error taxonomy: every exception pitlab raises on purpose is a :class:`PitlabError`, on one of two branches.

- :class:`InputError`: bad input (a spec, a corpus, a market panel, a split protocol), found before or while a
  stage runs; exit code 2, condition reason ``InvalidSpec``.
- :class:`StageError`: a stage failed (training, merge, a checkpoint, the weights, storage); exit code 1 and
  the failed reason of its stage (:mod:`pitlab.api.stages`).

Each class carries ``exit_code`` (the process exit code of a command that ends with it) and ``reason`` (the
CamelCase condition reason of a status it fails) as class attributes. Boundaries (the CLI, the operator's
``run_plan``, a training rank) catch these classes, never ``ValueError``: a stray ``ValueError`` of a library is a
bug, not bad input.

Compatibility: an input error class also inherits ``ValueError`` (``class CorpusError(InputError, ValueError)``),
so callers that catch ``ValueError``, and pydantic validators (which turn only ``ValueError`` into a validation
error), keep working; a stage error class also inherits ``RuntimeError``, as all of them did before.

This module is the bottom layer: it imports nothing of pitlab, and every layer may import it.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
import typing
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

EXIT_STAGE_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_DOES_NOT_FIT = 3  # `pitlab plan`: the run does not fit the GPU memory
EXIT_INTERRUPTED = 130  # `pitlab run`: SIGINT or SIGTERM

INVALID_SPEC = "InvalidSpec"  # stages.VALIDATE.failed
TRAINING_FAILED = "TrainingFailed"  # stages.TRAIN.failed
MERGE_FAILED = "MergeFailed"  # stages.MERGE.failed
EMBEDDING_FAILED = "EmbeddingFailed"  # stages.EMBED.failed


class PitlabError(Exception):
    """Base of every pitlab error; exit code 1, reason ``Failed``. Raise a subclass."""

    exit_code: int = EXIT_STAGE_FAILED
    reason: str = "Failed"


class InputError(PitlabError):
    """Bad input: the user must change a spec, a file or an argument. Exit code 2, reason ``InvalidSpec``."""

    exit_code = EXIT_BAD_INPUT
    reason = INVALID_SPEC


class StageError(PitlabError, RuntimeError):
    """A stage failed on valid input. Exit code 1, reason ``Failed`` (subclasses give their stage's reason)."""

    exit_code = EXIT_STAGE_FAILED


# ---- input errors -------------------------------------------------------------------------------------------

class FieldError(InputError, ValueError):
    """Raised by a model validator about one field below the model: ``field`` is its path relative to the model
    as written in YAML (``promptTemplate``, ``evaluations[1].name``); :meth:`SpecError.from_validation_error`
    appends it to the model's path, so the message names the field itself. Exit code 2, ``InvalidSpec``."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class SpecError(InputError, ValueError):
    """A resource (or file) is invalid. ``problems`` is a list of ``(field_path, message)``. Exit code 2,
    ``InvalidSpec``.

    ``str(err)`` gives one line per problem, each starting with the source (file name) and the field path
    as written in YAML, e.g. ``demo.yaml: spec.training.seqLen: Input should be a valid integer``.
    """

    def __init__(self, problems: list[tuple[str, str]], source: str | None = None):
        self.problems = problems
        self.source = source
        prefix = f"{source}: " if source else ""
        super().__init__("\n".join(f"{prefix}{path}: {msg}" if path else f"{prefix}{msg}" for path, msg in problems))

    @classmethod
    def from_validation_error(cls, err: ValidationError, source: str | None = None, root: str = "",
                              model: type | None = None) -> "SpecError":
        """Convert a pydantic ``ValidationError`` into field-path messages (aliases, dotted, ``[i]`` for lists).
        ``model``: the pydantic class validated, whose field names let an unknown field's message suggest the
        nearest known one (``did you mean 'embargoDays'?``)."""
        return cls([_problem(e, root, model) for e in err.errors()], source)


class MissingInputError(SpecError):
    """A spec's input path (data set, corpus, model) does not exist on this machine: a :class:`SpecError` (exit
    code 2) that ``pitlab validate`` can tell from a schema error (a cluster spec's inputs live on its volume)."""


def _internal(loc) -> bool:
    """Whether a pydantic error location step is pydantic's own (validators, tagged unions), not a field."""
    return loc in ("function-after", "function-before") or "[" in str(loc)


def _fields_at(model: type | None, loc: tuple) -> list[str]:
    """The YAML names of the fields of the pydantic model reached from ``model`` along ``loc`` (list indices and
    pydantic's internal steps skipped); [] when the path leaves the models."""
    cls = model
    for part in loc:
        if isinstance(part, int) or _internal(part):
            continue
        fields = getattr(cls, "model_fields", None)
        if not fields:
            return []
        field = next((f for n, f in fields.items() if part in (n, f.alias)), None)
        if field is None:
            return []
        cls = _model_in(field.annotation)
    fields = getattr(cls, "model_fields", None) or {}
    return [f.alias or n for n, f in fields.items()]


def _model_in(tp) -> type | None:
    """The pydantic model class inside a type annotation (``X``, ``X | None``, ``list[X]``, ``Annotated[X, …]``)."""
    if isinstance(tp, type) and hasattr(tp, "model_fields"):
        return tp
    for arg in typing.get_args(tp):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _suggestion(name: str, known: list[str]) -> str:
    """``; did you mean 'x'?`` for the known field nearest ``name`` (its camelCase spelling, else difflib's
    closest at ratio ≥ 0.6), or ``""``."""
    camel = re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), name)
    close = [camel] if camel != name and camel in known else difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _problem(e: dict, root: str, model: type | None = None) -> tuple[str, str]:
    """One pydantic error entry as ``(field path as written in YAML, message)``."""
    parts: list[str] = [root] if root else []
    for loc in e["loc"]:
        if isinstance(loc, int):
            if parts:
                parts[-1] = f"{parts[-1]}[{loc}]"
            else:
                parts.append(f"[{loc}]")
        elif _internal(loc):
            continue
        else:
            parts.append(str(loc))
    msg = e["msg"].removeprefix("Value error, ")
    cause = (e.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        parts.append(cause.field)
        msg = cause.message
    if e["type"] == "extra_forbidden":
        msg = ("unknown field (check the spelling; fields are camelCase)"
               + _suggestion(str(e["loc"][-1]), _fields_at(model, tuple(e["loc"][:-1]))))
    elif ("input" in e and e["type"] not in ("missing",) and not isinstance(e["input"], (dict, list))
          and not isinstance(e["input"], dt.date)):  # a YAML date or datetime: the message shows it (isoformat)
        msg = f"{msg} (got {e['input']!r})"
    return ".".join(parts), msg


class CorpusError(InputError, ValueError):
    """The corpus cannot be used as specified; the message names the file, row or field. Exit code 2,
    ``InvalidSpec``."""


class PanelError(InputError, ValueError):
    """A market data file cannot be used; the message names the file, the column and, where known, the row.
    Exit code 2, ``InvalidSpec``."""


class ProtocolError(InputError, ValueError):
    """A split cannot be made from the panel and the spec's ``protocol`` (the message names the field). Exit code
    2, ``InvalidSpec``."""


# ---- stage errors -------------------------------------------------------------------------------------------

class TrainingError(StageError):
    """The training job failed; the message holds the exit code and the end of the job's stderr. Exit code 1,
    ``TrainingFailed``."""

    reason = TRAINING_FAILED


class MergeError(StageError):
    """The merged model could not be written or does not match the checkpoint / training summary. Exit code 1,
    ``MergeFailed``."""

    reason = MERGE_FAILED


class CheckpointError(StageError):
    """A checkpoint directory is inconsistent (e.g. ``latest`` names a directory that does not exist). Exit code
    1, ``TrainingFailed``."""

    reason = TRAINING_FAILED


class WeightLoadError(StageError):
    """The base model's safetensors do not match the model built from its config (missing / extra / shape).
    Exit code 1, ``TrainingFailed``."""

    reason = TRAINING_FAILED


class StorageError(StageError):
    """A storage operation failed; ``str()`` is a message for users that names the URI (and, for S3, the
    endpoint) and what to do about it. Exit code 1, ``StorageFailed`` (a stage that fails with it sets its own
    failed reason)."""

    reason = "StorageFailed"
