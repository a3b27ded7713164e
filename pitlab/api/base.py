"""Shared pydantic base for every pitlab resource model.

Fields are snake_case in Python and camelCase in YAML (the Kubernetes convention), unknown fields are
errors, and :class:`SpecError` turns pydantic's errors into messages that name the field path the way a
user wrote it (``spec.training.seqLen``).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict
from pydantic.alias_generators import to_camel

from pitlab.errors import FieldError, SpecError  # noqa: F401  (defined in the error taxonomy; imported from here)

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
        raise ValueError("expected a date as YYYY-MM-DD, got a date and time")  # the error adds (got '...')
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
