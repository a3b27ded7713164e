"""Shared pydantic base for every pitlab resource model.

Fields are snake_case in Python and camelCase in YAML (the Kubernetes convention), unknown fields are
errors, and :class:`SpecError` turns pydantic's errors into messages that name the field path the way a
user wrote it (``spec.training.seqLen``).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

API_GROUP = "pitlab.io"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"


_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _iso_date(value: object) -> object:
    """Accept a ``datetime.date`` or a ``YYYY-MM-DD`` string; refuse numbers (pydantic would read them as
    Unix timestamps) and other date spellings, so ``20161231`` or ``31/12/2016`` is an error, not a guess."""
    if isinstance(value, dt.datetime):
        raise ValueError(f"expected a date as YYYY-MM-DD, got a date and time ({value.isoformat()})")
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str) and _ISO_DATE.match(value.strip()):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError as err:  # 2016-13-01
            raise ValueError(f"expected a date as YYYY-MM-DD ({err})") from None
    if isinstance(value, str) and re.match(r"^\d{4}-\d{2}-\d{2}[T ]", value.strip()):
        raise ValueError(f"expected a date as YYYY-MM-DD, got a date and time ({value.strip()})")
    raise ValueError("expected a date as YYYY-MM-DD")


ISODate = Annotated[dt.date, BeforeValidator(_iso_date)]
"""A calendar date written ``YYYY-MM-DD`` in YAML (quoted or not)."""


class SpecModel(BaseModel):
    """Base for spec/status blocks: camelCase aliases, unknown fields forbidden, assignment validated, and no
    infinite or NaN float (``.inf`` in YAML is an error, not a learning rate)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        use_enum_values=True,
        allow_inf_nan=False,
    )

    def to_yaml_dict(self) -> dict[str, Any]:
        """The block as a user would write it: camelCase keys, JSON-compatible values, no unset Nones."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


class FieldError(ValueError):
    """Raised by a model validator about one field below the model: ``field`` is its path relative to the model
    as written in YAML (``promptTemplate``, ``evaluations[1].name``); :meth:`SpecError.from_validation_error`
    appends it to the model's path, so the message names the field itself."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class SpecError(ValueError):
    """A resource (or file) is invalid. ``problems`` is a list of ``(field_path, message)``.

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
        problems = []
        for e in err.errors():
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
            problems.append((".".join(parts), msg))
        return cls(problems, source)
