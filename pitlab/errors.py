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
    def from_validation_error(cls, err: ValidationError, source: str | None = None, root: str = "") -> "SpecError":
        """Convert a pydantic ``ValidationError`` into field-path messages (aliases, dotted, ``[i]`` for lists)."""
        return cls([_problem(e, root) for e in err.errors()], source)


def _problem(e: dict, root: str) -> tuple[str, str]:
    """One pydantic error entry as ``(field path as written in YAML, message)``."""
    parts: list[str] = [root] if root else []
    for loc in e["loc"]:
        if isinstance(loc, int):
            if parts:
                parts[-1] = f"{parts[-1]}[{loc}]"
            else:
                parts.append(f"[{loc}]")
        elif loc in ("function-after", "function-before") or "[" in str(loc):
            continue  # pydantic internals for validators and tagged unions
        else:
            parts.append(str(loc))
    msg = e["msg"].removeprefix("Value error, ")
    cause = (e.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        parts.append(cause.field)
        msg = cause.message
    if e["type"] == "extra_forbidden":
        msg = "unknown field (check the spelling; fields are camelCase)"
    elif "input" in e and e["type"] not in ("missing",) and not isinstance(e["input"], (dict, list)):
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
