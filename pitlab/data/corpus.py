"""Point-in-time corpus: read dated documents (CSV or JSONL) and keep those at or before the knowledge cutoff.

A document is kept iff its timestamp is at or before the end of the cutoff day in the configured time zone
(docs/design.md, "PIT corpus"). Timestamps are parsed strictly (ISO 8601, or the one format
``spec.corpus.timestampFormat`` names: :mod:`pitlab.data.timestamps`). A document whose timestamp is missing or
does not match is never silently kept: it is an error naming the file, row, id, value and expected format, or,
with ``onMissingTimestamp: drop``, it is counted in the audit, which lists the first few with their values.
"""

from __future__ import annotations

import codecs
import csv
import datetime as dt
import hashlib
import json
import re
import zoneinfo
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Literal

import pandas as pd

from pitlab.data.encoding import decode_problem, separator_hint
from pitlab.data.timestamps import EPOCH_NS, JsonNumber, TimestampError, check_format, parse_timestamp
from pitlab.data.types import Document
from pitlab.errors import CorpusError

REJECTED_EXAMPLES = 5  # refused timestamps listed in the audit (with onMissingTimestamp: drop)
EPOCH_PLAUSIBLE_FROM = pd.Timestamp("1980-01-01", tz="UTC")  # epoch values before it suggest the wrong unit


@dataclass(frozen=True)
class CorpusAudit:
    """What the cutoff filter did. Counts are documents; timestamps are ISO 8601 in UTC.

    ``included_ids_sha256`` is the sha256 of the included document ids, sorted and joined with ``\\n``
    (UTF-8), so two runs that trained on the same documents show the same digest. ``timestamp_format`` is
    the format the timestamps were read with (``iso8601``, a strftime pattern or ``epoch_*``);
    ``rejected_timestamp_examples`` the first few refused timestamps (``row``, ``id``, ``value``, ``error``);
    ``warnings`` what looks wrong without being an error (a cutoff after every document or after today).
    ``included_sha256`` is the sha256 of the included documents themselves (:func:`documents_sha256`: id,
    timestamp and text, in file order), so a resume notices a kept document whose text changed.
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
    timestamp_format: str = "iso8601"
    rejected_timestamp_examples: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    included_sha256: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def cutoff_instant(cutoff: dt.date, timezone: str) -> pd.Timestamp:
    """First instant *after* the cutoff day: midnight starting ``cutoff + 1 day`` in ``timezone``, as UTC.

    A timestamp ``ts`` is at or before the cutoff iff ``ts < cutoff_instant(cutoff, tz)``.
    """
    tz = zoneinfo.ZoneInfo(timezone)
    nxt = dt.datetime.combine(cutoff + dt.timedelta(days=1), dt.time(0), tzinfo=tz)
    return pd.Timestamp(nxt).tz_convert("UTC")


def local_isoformat(ts: pd.Timestamp | str, timezone: str) -> str:
    """``ts`` (a timestamp or an ISO string with an offset) as ISO 8601 in ``timezone``, offset kept.

    For messages, so that a timestamp reads in the same zone as the knowledge cutoff it is compared with
    (the audit keeps UTC)."""
    return pd.Timestamp(ts).tz_convert(zoneinfo.ZoneInfo(timezone)).isoformat()


def _no_duplicates(path: Path, line: int):
    """A ``json.loads`` ``object_pairs_hook`` refusing a key given twice in one object (``json`` keeps the last)."""
    def hook(pairs: list[tuple[str, object]]) -> dict:
        out: dict = {}
        for k, v in pairs:
            if k in out:
                raise CorpusError(f"{path}: line {line}: key {k!r} given twice in one JSON object; JSON readers "
                                  "would keep one of the values silently: fix the record")
            out[k] = v
        return out
    return hook


def _iter_records(path: Path, fmt: Literal["csv", "jsonl"], encoding: str = "utf-8",
                  timestamp_field: str | None = None,
                  timestamp_format: str | None = None) -> Iterator[tuple[int, dict, int]]:
    """Yield (1-based data row, record, the file line where it starts). CSV rows are numbered after the header;
    JSONL by line (row and line equal). Raises
    :class:`CorpusError` naming the file and line for text that is not ``encoding`` (with the byte offset), a
    header naming a column twice, a CSV row with more or fewer fields than the header, a stray or unclosed quote,
    a quoted CSV field that runs over a line reading as a row of its own (``timestamp_field``'s column holding a
    timestamp in ``timestamp_format``), a JSON key given twice or a JSON ``NaN`` / ``Infinity``."""
    enc = "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding  # a byte-order mark is no name
    try:
        yield from (_iter_csv(path, enc, timestamp_field, timestamp_format) if fmt == "csv"
                    else _iter_jsonl(path, enc))
    except UnicodeDecodeError:
        raise CorpusError(decode_problem(path, encoding, "spec.corpus.encoding")) from None


_RECORD_START = re.compile(r"\d{4}-\d{2}-\d{2}|\d{9,19}", re.ASCII)
"""A field that begins like a corpus timestamp (ISO 8601 date, or an epoch number)."""


def _starts_record(value: str, timestamp_format: str | None) -> bool:
    """Whether ``value`` (white space around it ignored) reads as a timestamp: the start of an ISO 8601 date or an
    epoch number, or, for a strftime pattern, a value the pattern reads."""
    value = value.strip()
    if _RECORD_START.match(value):
        return True
    if timestamp_format is None or "%" not in timestamp_format:
        return False
    try:
        return parse_timestamp(value, "UTC", timestamp_format) is not None
    except TimestampError:
        return False


def _swallowed_line(lines: list[str], header: list[str], stamp_col: int | None,
                    timestamp_format: str | None = None) -> int | None:
    """Index (in ``lines``, the record's raw lines) of a line after the first that parses as a whole record of
    its own: the header's field count and a timestamp (:func:`_starts_record`) in column ``stamp_col``; None if
    there is none. A quoted text spanning such a line is most likely an unclosed quote that swallowed the next row
    (its text, dated later, would be trained on under the earlier row's date)."""
    if stamp_col is None:
        return None
    for k, line in enumerate(lines[1:], start=1):
        try:
            fields = next(csv.reader([line.rstrip("\r\n")]), [])
        except csv.Error:
            continue
        if len(fields) == len(header) and _starts_record(fields[stamp_col], timestamp_format):
            return k
    return None


def _iter_csv(path: Path, encoding: str, timestamp_field: str | None = None,
              timestamp_format: str | None = None) -> Iterator[tuple[int, dict]]:
    csv.field_size_limit(1 << 30)
    with path.open(newline="", encoding=encoding) as f:
        raw: list[str] = []

        def lines():
            for line in f:
                raw.append(line)
                yield line

        reader = csv.reader(lines(), strict=True)  # a stray or unclosed quote is an error, not a guess
        try:
            header = next(reader, None)
            if header is None:
                raise CorpusError(f"{path}: empty CSV file (no header row)")
            twice = sorted({c for c in header if header.count(c) > 1})
            if twice:
                cols = {c: [i + 1 for i, h in enumerate(header) if h == c] for c in twice}
                raise CorpusError(f"{path}: header: column name(s) given twice: "
                                  + "; ".join(f"{c!r} (columns {', '.join(map(str, n))})" for c, n in cols.items())
                                  + "; a reader would keep one of them silently: rename or remove the other")
            stamp_col = header.index(timestamp_field) if timestamp_field in header else None
            raw.clear()
            for i, values in enumerate(reader, start=1):
                record, first = list(raw), reader.line_num - len(raw) + 1
                raw.clear()
                if not values:
                    continue  # csv.DictReader's rule: a blank line is no record
                if len(values) != len(header):
                    raise CorpusError(f"{path}: row {i} (line {reader.line_num}): {len(values)} fields, the header "
                                      f"has {len(header)}; a field with a comma or a line break must be quoted"
                                      f"{separator_hint(header)}")
                k = _swallowed_line(record, header, stamp_col, timestamp_format) if len(record) > 1 else None
                if k is not None:
                    raise CorpusError(f"{path}: row {i} (lines {first}-{reader.line_num}): a quoted field runs over "
                                      f"line {first + k}, which reads as a row of its own "
                                      f"({record[k].strip()[:80]!r}): an unclosed quote would train on that row's "
                                      "text under this row's date; close the quote, or, if the line break belongs "
                                      "to the text, start the continued line otherwise")
                yield i, dict(zip(header, values)), first
        except csv.Error as err:
            raise CorpusError(f"{path}: line {reader.line_num}: not valid CSV ({err})") from None


def _json_type(value: object) -> str:
    """The Python type name of a JSON value, ``float`` for a :class:`JsonNumber`."""
    return "float" if isinstance(value, float) else type(value).__name__


def _not_json(path: Path, line: int):
    """``json.loads``'s ``parse_constant``: Python's reader accepts ``NaN``, ``Infinity`` and ``-Infinity``, which
    JSON does not have; a value written so is refused naming the line, not read as a missing one."""
    def refuse(constant: str):
        raise CorpusError(f"{path}: line {line}: {constant} is not a JSON value (JSON has no NaN or Infinity); "
                          "write null for a missing value")
    return refuse


def _iter_jsonl(path: Path, encoding: str) -> Iterator[tuple[int, dict]]:
    with path.open(encoding=encoding) as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line, object_pairs_hook=_no_duplicates(path, i), parse_float=JsonNumber,
                                 parse_constant=_not_json(path, i))
            except json.JSONDecodeError as err:
                raise CorpusError(f"{path}: line {i}: invalid JSON ({err.msg})") from None
            if not isinstance(rec, dict):
                raise CorpusError(f"{path}: line {i}: expected a JSON object, got {type(rec).__name__}")
            yield i, rec, i


def read_corpus(path: str | Path, fmt: Literal["csv", "jsonl"], text_field: str, timestamp_field: str,
                timezone: str, id_field: str | None = None, timestamp_format: str | None = None,
                encoding: str = "utf-8") -> list[Document]:
    """Read every document of a CSV or JSONL corpus in ``encoding`` (UTF-8 by default, with or without a
    byte-order mark), in file order.

    Returns one :class:`Document` per record; ``timestamp`` is None when missing or not matching
    ``timestamp_format`` (None: ISO 8601), with ``timestamp_error`` saying why (the filter decides what that
    means). ``id`` is ``id_field``'s value, or ``row-<n>`` (1-based data row). Raises :class:`CorpusError`
    naming the file for a missing file, a missing column/key (with the row for JSONL), duplicate ids (with
    both rows) or a refused ``timestamp_format``.
    """
    try:
        check_format(timestamp_format)
    except ValueError as err:
        raise CorpusError(f"spec.corpus.timestampFormat: {err}") from None
    p = Path(path)
    if not p.is_file():
        raise CorpusError(f"{p}: corpus file not found")
    docs: list[Document] = []
    seen: dict[str, int] = {}
    for row, rec, line in _iter_records(p, fmt, encoding, timestamp_field, timestamp_format):
        for field, role in ((text_field, "textField"), (timestamp_field, "timestampField"),
                            (id_field, "idField")):
            if field is not None and field not in rec:
                where = "header" if fmt == "csv" else f"line {row}"
                raise CorpusError(f"{p}: {where}: no field {field!r} (spec.corpus.{role}); "
                                  f"fields present: {sorted(rec)}{separator_hint(list(rec)) if fmt == 'csv' else ''}")
        where = f"row {row}" if fmt == "csv" else f"line {row}"
        if id_field:
            raw_id = rec[id_field]
            if raw_id is None or (isinstance(raw_id, str) and not raw_id.strip()):
                raise CorpusError(f"{p}: {where}: empty id (field {id_field!r}, spec.corpus.idField): every document "
                                  "needs one")
            if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool):
                raise CorpusError(f"{p}: {where}: id {raw_id!r} is a JSON {_json_type(raw_id)}: an id is a string "
                                  "or an integer")
        doc_id = str(rec[id_field]) if id_field else f"row-{row}"
        text = rec[text_field]
        if text is not None and not isinstance(text, str):
            raise CorpusError(f"{p}: {where} (id {doc_id!r}): field {text_field!r} is a JSON {_json_type(text)}, "
                              f"not a string: {str(text)[:60]!r}; a document's text is a string")
        if text is not None:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as err:
                raise CorpusError(f"{p}: {where} (id {doc_id!r}): field {text_field!r} holds "
                                  f"{text[err.start:err.end]!r} at character {err.start}, an unpaired surrogate "
                                  "(not a Unicode character; a JSON escape such as \\ud800 without its pair)") from None
        if doc_id in seen:
            raise CorpusError(f"{p}: row {row}: duplicate id {doc_id!r} (first seen at row {seen[doc_id]})")
        seen[doc_id] = row
        value = rec[timestamp_field]
        try:
            ts, error = parse_timestamp(value, timezone, timestamp_format), None
        except TimestampError as err:
            ts, error = None, str(err)
        if ts is None and error is None:
            error = f"missing timestamp (field {timestamp_field!r} is empty)"
        docs.append(Document(id=doc_id, text="" if text is None else str(text), timestamp=ts, row=row,
                             timestamp_error=error, timestamp_value=None if error is None else
                             ("" if value is None else str(value)), line=line))
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
                  source_sha256: str = "", timestamp_format: str | None = None,
                  today: dt.date | None = None,
                  on_empty_text: Literal["error", "drop"] = "error") -> tuple[list[Document], CorpusAudit]:
    """Keep documents with ``timestamp <= end of cutoff day`` in ``timezone``; return them and the audit.

    ``timestamp_format`` is recorded in the audit (None: ``iso8601``); ``today`` (default: today's date in
    ``timezone``) is only compared with the cutoff for the audit's warnings.
    Raises :class:`CorpusError`:
      - at the first document with a missing or refused timestamp when ``on_missing_timestamp`` is
        ``error`` (the message names the file, row, id, value and expected format);
      - at the first document with an empty (or white-space) text when ``on_empty_text`` is ``error`` (the
        message names the file, row and id); with ``drop`` such documents are skipped and counted
        (``rejected_empty_text``), whatever their date;
      - when no document is at or before the cutoff (training on nothing is never what was meant).
    """
    limit = cutoff_instant(cutoff, timezone)
    kept: list[Document] = []
    by_date = empty = 0
    refused: list[Document] = []
    for d in docs:
        if d.timestamp is None:
            if on_missing_timestamp == "error":
                raise CorpusError(f"{source}: {d.where}: {d.timestamp_error or 'missing timestamp'}; "
                                  "fix the row, or set spec.corpus.onMissingTimestamp: drop to count and skip it")
            refused.append(d)
            continue
        if not d.text.strip():
            if on_empty_text == "error":
                raise CorpusError(f"{source}: {d.where}: empty text (the text field is empty or only "
                                  "white space); fix the row, or set spec.corpus.onEmptyText: drop to count and skip "
                                  "it")
            empty += 1
            continue
        if d.timestamp >= limit:
            by_date += 1
            continue
        kept.append(d)
    if not kept:
        earliest = min((d.timestamp for d in docs if d.timestamp is not None), default=None)
        raise CorpusError(f"{source}: no document at or before the knowledge cutoff {cutoff} ({timezone}); "
                          f"{len(docs)} documents read, earliest timestamp "
                          f"{local_isoformat(earliest, timezone) if earliest is not None else 'none'}"
                          + (f", {len(refused)} refused for their timestamp (first: row {refused[0].row}: "
                             f"{refused[0].timestamp_error})" if refused else ""))
    fmt = check_format(timestamp_format)
    ids = "\n".join(sorted(d.id for d in kept)).encode("utf-8")
    audit = CorpusAudit(
        source=source, source_sha256=source_sha256, knowledge_cutoff=cutoff.isoformat(), timezone=timezone,
        cutoff_instant_utc=limit.isoformat(), total=len(docs), included=len(kept), excluded_by_date=by_date,
        rejected_timestamp=len(refused), rejected_empty_text=empty,
        max_included_timestamp=max(d.timestamp for d in kept).isoformat(),
        min_included_timestamp=min(d.timestamp for d in kept).isoformat(),
        included_ids_sha256=hashlib.sha256(ids).hexdigest(),
        timestamp_format=fmt,
        rejected_timestamp_examples=[{"row": d.row, "id": d.id, "value": d.timestamp_value, "error": d.timestamp_error}
                                     for d in refused[:REJECTED_EXAMPLES]],
        warnings=corpus_warnings(docs, cutoff, timezone, fmt, by_date, today),
        included_sha256=documents_sha256(kept),
    )
    return kept, audit


def documents_sha256(docs: list[Document]) -> str:
    """sha256 hex digest of ``docs`` in order: each document's id, UTC timestamp (ISO 8601) and UTF-8 text,
    length-prefixed (so no two different lists share a byte stream)."""
    h = hashlib.sha256()
    for d in docs:
        for part in (d.id, d.timestamp.isoformat() if d.timestamp is not None else "", d.text):
            b = part.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()


def corpus_warnings(docs: list[Document], cutoff: dt.date, timezone: str, fmt: str, excluded_by_date: int,
                    today: dt.date | None = None) -> list[str]:
    """What looks wrong about a cutoff or the documents without being an error, in words: a cutoff after the
    latest dated document (nothing was excluded, so the corpus, not the cutoff, ends the model's knowledge), a
    cutoff after ``today`` (default: today in ``timezone``), documents dated after today, documents that repeat
    an earlier one's text and timestamp, epoch timestamps that decode to before 1980 (a unit mistake such as
    ``epoch_ms`` for seconds reads every document as January 1970 and keeps it)."""
    tz = zoneinfo.ZoneInfo(timezone)
    stamps = [d.timestamp for d in docs if d.timestamp is not None]
    out = []
    latest = max(stamps, default=None)
    if latest is not None and excluded_by_date == 0 and latest.tz_convert(tz).date() < cutoff:
        out.append(f"knowledge cutoff {cutoff} is after the latest document ({local_isoformat(latest, timezone)}): "
                   "no document was excluded, so the corpus, not the cutoff, ends what the model knows")
    today = today or dt.datetime.now(tz).date()
    if cutoff > today:
        out.append(f"knowledge cutoff {cutoff} is after today ({today}, {timezone}): documents added to the corpus "
                   "later, up to the cutoff, would be kept")
    future = [d for d in docs if d.timestamp is not None and d.timestamp.tz_convert(tz).date() > today]
    if future:
        d = future[0]
        out.append(f"{len(future)} document(s) dated after today ({today}, {timezone}; first: row {d.row}, id "
                   f"{d.id!r}, {local_isoformat(d.timestamp, timezone)}): no document can be published in the "
                   "future, so the dates may be wrong (e.g. a mistyped year); dated after the cutoff, they are "
                   "left out")
    seen: dict[tuple, Document] = {}
    repeats = []
    for d in docs:
        key = (d.timestamp, hashlib.sha256(d.text.encode("utf-8")).digest())
        if key in seen:
            repeats.append((d, seen[key]))
        else:
            seen[key] = d
    if repeats:
        d, first = repeats[0]
        out.append(f"{len(repeats)} document(s) repeat the text and timestamp of an earlier one (first: row {d.row}, "
                   f"id {d.id!r} repeats row {first.row}, id {first.id!r}): each copy is trained on")
    if fmt in EPOCH_NS:
        early = [t for t in stamps if t < EPOCH_PLAUSIBLE_FROM]
        if early:
            out.append(f"{len(early)} timestamps read as {fmt} fall before 1980 (earliest "
                       f"{local_isoformat(min(early), timezone)}); are the numbers in another unit?")
    return out
