"""Point-in-time corpus: read dated documents (CSV or JSONL) and keep those at or before the knowledge cutoff.

A document is kept iff its timestamp is at or before the end of the cutoff day in the configured time zone
(DESIGN section 4.2). A document whose timestamp is missing or unparseable is never silently kept: it is an
error naming the file and row, or, with ``onMissingTimestamp: drop``, it is counted in the audit.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import json
import zoneinfo
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Literal

import pandas as pd

from pitlab.data.types import Document


class CorpusError(ValueError):
    """The corpus cannot be used as specified; the message names the file, row or field."""


@dataclass(frozen=True)
class CorpusAudit:
    """What the cutoff filter did. Counts are documents; timestamps are ISO 8601 in UTC.

    ``included_ids_sha256`` is the sha256 of the included document ids, sorted and joined with ``\\n``
    (UTF-8), so two runs that trained on the same documents show the same digest.
    """

    source: str
    source_sha256: str
    knowledge_cutoff: str
    timezone: str
    cutoff_instant_utc: str
    total: int
    included: int
    excluded_by_date: int
    rejected_timestamp: int
    rejected_empty_text: int
    max_included_timestamp: str | None
    min_included_timestamp: str | None
    included_ids_sha256: str

    def to_dict(self) -> dict:
        return asdict(self)


def cutoff_instant(cutoff: dt.date, timezone: str) -> pd.Timestamp:
    """First instant *after* the cutoff day: midnight starting ``cutoff + 1 day`` in ``timezone``, as UTC.

    A timestamp ``ts`` is at or before the cutoff iff ``ts < cutoff_instant(cutoff, tz)``.
    """
    tz = zoneinfo.ZoneInfo(timezone)
    nxt = dt.datetime.combine(cutoff + dt.timedelta(days=1), dt.time(0), tzinfo=tz)
    return pd.Timestamp(nxt).tz_convert("UTC")


def parse_timestamp(value: object, timezone: str) -> pd.Timestamp | None:
    """Parse an ISO date/datetime (string or number of seconds is *not* accepted) into a UTC timestamp.

    Naive values (``2016-12-31`` or ``2016-12-31T15:00``) are read in ``timezone``; values with an offset
    keep it. Returns None for missing (None, empty, NaN) or unparseable values.
    """
    if value is None:
        return None
    if isinstance(value, float) and value != value:  # NaN
        return None
    if not isinstance(value, str):
        return None
    s = value.strip()
    if not s:
        return None
    try:
        ts = pd.Timestamp(s)
    except (ValueError, TypeError, OverflowError):
        return None
    if ts is pd.NaT:
        return None
    if ts.tzinfo is None:
        try:
            ts = ts.tz_localize(zoneinfo.ZoneInfo(timezone), ambiguous=True, nonexistent="shift_forward")
        except Exception:  # noqa: BLE001 - any localisation failure is an unparseable timestamp
            return None
    return ts.tz_convert("UTC")


def local_isoformat(ts: pd.Timestamp | str, timezone: str) -> str:
    """``ts`` (a timestamp or an ISO string with an offset) as ISO 8601 in ``timezone``, offset kept.

    For messages, so that a timestamp reads in the same zone as the knowledge cutoff it is compared with
    (the audit keeps UTC)."""
    return pd.Timestamp(ts).tz_convert(zoneinfo.ZoneInfo(timezone)).isoformat()


def _iter_records(path: Path, fmt: Literal["csv", "jsonl"]) -> Iterator[tuple[int, dict]]:
    """Yield (1-based data row, record). CSV rows are numbered after the header; JSONL by line."""
    if fmt == "csv":
        csv.field_size_limit(1 << 30)
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None:
                raise CorpusError(f"{path}: empty CSV file (no header row)")
            for i, rec in enumerate(reader, start=1):
                yield i, rec
    else:
        with path.open(encoding="utf-8") as f:
            for i, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as err:
                    raise CorpusError(f"{path}: line {i}: invalid JSON ({err.msg})") from None
                if not isinstance(rec, dict):
                    raise CorpusError(f"{path}: line {i}: expected a JSON object, got {type(rec).__name__}")
                yield i, rec


def read_corpus(path: str | Path, fmt: Literal["csv", "jsonl"], text_field: str, timestamp_field: str,
                timezone: str, id_field: str | None = None) -> list[Document]:
    """Read every document of a CSV or JSONL corpus, in file order.

    Returns one :class:`Document` per record; ``timestamp`` is None when missing or unparseable (the
    filter decides what that means). ``id`` is ``id_field``'s value, or ``row-<n>`` (1-based data row).
    Raises :class:`CorpusError` naming the file for a missing file, a missing column/key (with the row for
    JSONL), or duplicate ids (with both rows).
    """
    p = Path(path)
    if not p.is_file():
        raise CorpusError(f"{p}: corpus file not found")
    docs: list[Document] = []
    seen: dict[str, int] = {}
    for row, rec in _iter_records(p, fmt):
        for field, role in ((text_field, "textField"), (timestamp_field, "timestampField"),
                            (id_field, "idField")):
            if field is not None and field not in rec:
                where = "header" if fmt == "csv" else f"line {row}"
                raise CorpusError(f"{p}: {where}: no field {field!r} (spec.corpus.{role}); "
                                  f"fields present: {sorted(rec)}")
        doc_id = str(rec[id_field]) if id_field else f"row-{row}"
        if doc_id in seen:
            raise CorpusError(f"{p}: row {row}: duplicate id {doc_id!r} (first seen at row {seen[doc_id]})")
        seen[doc_id] = row
        text = rec[text_field]
        docs.append(Document(id=doc_id, text="" if text is None else str(text),
                             timestamp=parse_timestamp(rec[timestamp_field], timezone), row=row))
    return docs


def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def filter_corpus(docs: list[Document], cutoff: dt.date, timezone: str,
                  on_missing_timestamp: Literal["error", "drop"] = "error", source: str = "<corpus>",
                  source_sha256: str = "") -> tuple[list[Document], CorpusAudit]:
    """Keep documents with ``timestamp <= end of cutoff day`` in ``timezone``; return them and the audit.

    Raises :class:`CorpusError`:
      - at the first document with a missing or unparseable timestamp when ``on_missing_timestamp`` is
        ``error`` (the message names the file and row);
      - when no document is at or before the cutoff (training on nothing is never what was meant).
    Documents with empty text are excluded and counted (``rejected_empty_text``).
    """
    limit = cutoff_instant(cutoff, timezone)
    kept: list[Document] = []
    by_date = rejected = empty = 0
    for d in docs:
        if d.timestamp is None:
            if on_missing_timestamp == "error":
                raise CorpusError(f"{source}: row {d.row} (id {d.id!r}): missing or unparseable timestamp; "
                                  "fix the row or set spec.corpus.onMissingTimestamp: drop to count and skip it")
            rejected += 1
            continue
        if d.timestamp >= limit:
            by_date += 1
            continue
        if not d.text.strip():
            empty += 1
            continue
        kept.append(d)
    if not kept:
        earliest = min((d.timestamp for d in docs if d.timestamp is not None), default=None)
        raise CorpusError(f"{source}: no document at or before the knowledge cutoff {cutoff} ({timezone}); "
                          f"{len(docs)} documents read, earliest timestamp "
                          f"{local_isoformat(earliest, timezone) if earliest is not None else 'none'}")
    ids = "\n".join(sorted(d.id for d in kept)).encode("utf-8")
    audit = CorpusAudit(
        source=source, source_sha256=source_sha256, knowledge_cutoff=cutoff.isoformat(), timezone=timezone,
        cutoff_instant_utc=limit.isoformat(), total=len(docs), included=len(kept), excluded_by_date=by_date,
        rejected_timestamp=rejected, rejected_empty_text=empty,
        max_included_timestamp=max(d.timestamp for d in kept).isoformat(),
        min_included_timestamp=min(d.timestamp for d in kept).isoformat(),
        included_ids_sha256=hashlib.sha256(ids).hexdigest(),
    )
    return kept, audit
