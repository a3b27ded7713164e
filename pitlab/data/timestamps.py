"""Strict document timestamps: ISO 8601 by default, else the one format the spec names; nothing is guessed.

Formats (``spec.corpus.timestampFormat``):
  - ``iso8601`` (the default): ``YYYY-MM-DD``, or ``YYYY-MM-DDTHH:MM[:SS[.fraction]]`` (``T`` or one space;
    the fraction 1 to 9 digits after ``.`` or ``,``, i.e. down to the nanosecond) with an optional ``Z`` or
    ``±HH:MM`` / ``±HHMM`` / ``±HH`` offset. Nothing else: no ``20170401``, no ``01/04/2017``, no
    ``Dec 31, 2016``, no week or ordinal dates, no zone abbreviations, no fraction finer than a nanosecond.
  - a strftime pattern (``%d/%m/%Y``, ``%Y%m%d %H:%M%z``), matched in full by ``datetime.strptime`` and
    accepted only when the value written back with the pattern is the input again (the date's own weekday,
    six-digit ``%f``; ``%z`` as +HHMM, +HH:MM or Z), up to letter case and, where no two numeric fields touch,
    the zero padding of a number between separators (``1/4/2017`` for ``%d/%m/%Y``; ``2017411`` for ``%Y%m%d``
    is refused);
    patterns that give one field twice or a field strptime ignores (``%p`` without ``%I``) are refused;
  - ``epoch_s`` / ``epoch_ms`` / ``epoch_us``: a number (JSON number or decimal string) of seconds,
    milliseconds or microseconds since 1970-01-01T00:00:00Z, read from its digits (a JSON number is not rounded
    to a binary float first: ``1609426799.123456789`` is that many nanoseconds, not ``...123456716``).
Values without an offset are read in the corpus time zone (an ambiguous local time in a DST fall-back
takes the first, DST, reading; a local time in a spring-forward gap moves to the gap's end).
In every format a value is read exactly as written: white space before or after it and digits other than ASCII
``0``-``9`` (``２０２０-01-02``) are refused, not trimmed or translated, and so is an instant outside pandas'
nanosecond range (``1677-09-21T00:12:43.145224193Z`` .. ``2262-04-11T23:47:16.854775807Z``;
a placeholder such as ``0001-01-01`` or ``9999-12-31`` is no date).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import unicodedata
import zoneinfo
from decimal import Decimal, localcontext
from typing import TYPE_CHECKING

from pitlab.errors import InputError

if TYPE_CHECKING:  # annotations only: pandas is imported where a timestamp is parsed
    import pandas as pd

ISO8601 = "iso8601"
EPOCH_NS = {"epoch_s": 10**9, "epoch_ms": 10**6, "epoch_us": 10**3}  # nanoseconds per unit
EPOCH_UNITS = {"epoch_s": "seconds", "epoch_ms": "milliseconds", "epoch_us": "microseconds"}
ISO_DESCRIPTION = "ISO 8601: YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS[.fff]], optionally ending in Z, ±HH:MM, ±HHMM or ±HH"

# re.ASCII: without it \d is any Unicode decimal digit, and int() reads '２０２０' (full width) as 2020
_ISO_TEMPLATE = (r"(\d{4})-(\d{2})-(\d{2})"
                 r"(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{FRACTION}))?)?(Z|[+-]\d{2}(?::?\d{2})?)?)?")
_ISO = re.compile(_ISO_TEMPLATE.replace("FRACTION", "1,9"), re.ASCII)
_ISO_SUBNANOSECOND = re.compile(_ISO_TEMPLATE.replace("FRACTION", "10,"), re.ASCII)  # only to say why it is refused
_DECIMAL = re.compile(r"[+-]?\d+(?:\.\d+)?", re.ASCII)
# the instants a pandas nanosecond Timestamp holds (pd.Timestamp.min / .max), written in UTC
FIRST, LAST = "1677-09-21T00:12:43.145224193Z", "2262-04-11T23:47:16.854775807Z"
_ZONE_ABBREVIATION = re.compile(r"(?<=[\d\s])([A-Za-z]{2,5})$")
# strptime directives a pattern may use: calendar fields, clock fields, %z offsets, %% (a literal %)
_ALLOWED_DIRECTIVES = set("YmdbBjHIpMSfzaA%")


class JsonNumber(float):
    """A JSON number with a fraction or exponent, as read (``json.loads(..., parse_float=JsonNumber)``): a float
    that keeps its text, so that an epoch timestamp is read from the digits written (``1609426799.123456789``)
    and not from the nearest binary float (``1609426799.1234567``)."""

    text: str

    def __new__(cls, text: str) -> "JsonNumber":
        number = super().__new__(cls, text)
        number.text = text
        return number

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


class TimestampError(InputError, ValueError):
    """A timestamp value is present but does not match the expected format; the message shows the value. Exit
    code 2, ``InvalidSpec``."""


def check_format(fmt: str | None) -> str:
    """The format name to use for ``fmt`` (None → ``iso8601``); raises ``ValueError`` saying why a pattern is refused.

    A strftime pattern must name the year with ``%Y`` and the day with ``%m``/``%b``/``%B`` plus ``%d``, or
    ``%j``; it may not use ``%Z`` (zone abbreviations are ambiguous: CST is US Central, China and Cuba),
    ``%y`` (two-digit years need a century guess), ``%I`` without ``%p``, or locale and week directives.
    """
    if fmt is None or fmt == ISO8601 or fmt in EPOCH_NS:
        return fmt or ISO8601
    if "%" not in fmt:
        raise ValueError(f"{fmt!r} is neither {ISO8601}, epoch_s, epoch_ms, epoch_us nor a strftime pattern "
                         "(%Y, %m, ...)")
    if fmt != fmt.strip():
        raise ValueError(f"{fmt!r}: a pattern may not start or end with white space (a value with white space "
                         "around it is refused)")
    directives = re.findall(r"%(.?)", fmt.replace("%%", ""))
    if "" in directives:
        raise ValueError(f"{fmt!r}: a % ends the pattern; write %% for a literal %")
    if "Z" in directives:
        raise ValueError(f"{fmt!r}: %Z (zone abbreviations such as EST or JST) is refused: abbreviations are "
                         "ambiguous (CST is US Central, China and Cuba); use %z for offsets, or local times and "
                         "spec.corpus.timezone")
    if "y" in directives:
        raise ValueError(f"{fmt!r}: %y (two-digit year) needs a century guess; use %Y")
    zone = _literal_zone(fmt)
    if zone is not None:
        raise ValueError(f"{fmt!r}: the literal text {zone!r} names a zone or an offset, which strptime matches as "
                         "plain text, so the time would be read in spec.corpus.timezone instead; use %z (it reads Z, "
                         "+HH:MM and +HHMM), or drop the zone from the values and set spec.corpus.timezone")
    bad = sorted({d for d in directives if d not in _ALLOWED_DIRECTIVES})
    if bad:
        raise ValueError(f"{fmt!r}: directive(s) {', '.join('%' + d for d in bad)} not accepted; use "
                         f"{' '.join('%' + d for d in sorted(_ALLOWED_DIRECTIVES - {'%'}))} (and %% for a literal %)")
    if "Y" not in directives or not ({"m", "b", "B"} & set(directives) and "d" in directives or "j" in directives):
        raise ValueError(f"{fmt!r}: a pattern must give the year (%Y) and the day (%m or %b/%B with %d, or %j)")
    if "I" in directives and "p" not in directives:
        raise ValueError(f"{fmt!r}: %I (12-hour clock) without %p (AM/PM) is ambiguous; add %p or use %H")
    if "p" in directives and "I" not in directives:
        raise ValueError(f"{fmt!r}: %p (AM/PM) is only read with %I (12-hour clock); with %H strptime ignores it, "
                         "so '01:00 PM' would be read as 01:00: use %I with %p, or %H without %p")
    twice = sorted({d for d in directives if d != "%" and directives.count(d) > 1})
    if twice:
        raise ValueError(f"{fmt!r}: {', '.join('%' + d for d in twice)} given more than once; strptime keeps one "
                         "of the values and ignores the other")
    for group, what in ((("H", "I"), "the hour"), (("j", "m"), "the month"), (("j", "d"), "the day"),
                        (("j", "b"), "the month"), (("j", "B"), "the month"), (("m", "b"), "the month"),
                        (("m", "B"), "the month"), (("b", "B"), "the month"), (("a", "A"), "the weekday")):
        if all(g in directives for g in group):
            raise ValueError(f"{fmt!r}: %{group[0]} and %{group[1]} both give {what}; strptime would read one and "
                             "ignore the other when they disagree: keep one")
    sample = dt.datetime(2017, 4, 1, 15, 4, 5, 123456, tzinfo=dt.timezone(dt.timedelta(hours=9)))
    try:
        dt.datetime.strptime(sample.strftime(fmt), fmt)
    except Exception as err:  # noqa: BLE001 - any failure to read its own output means the pattern is malformed
        raise ValueError(f"{fmt!r}: not a usable strptime pattern ({err})") from None
    return fmt


# zoneinfo files that are no zone of their own: the host's setting, the POSIX default rules, tzdata's "Factory"
_HOST_ZONES = {"localtime": "the zone of the machine that reads the corpus (a laptop and a pod may differ)",
               "posixrules": "the POSIX default rules of the machine's tz database",
               "factory": "tzdata's placeholder for an unset zone (every time reads as UTC, written '-00')"}


def check_timezone(name: str) -> str:
    """``name`` if it is an IANA time zone that reads the same on every machine; raises ``ValueError`` (naming
    ``timezone``) for an unknown name, the host's own setting (``localtime``, ``posixrules``, ``Factory``) and the
    ``right/`` (leap-second clock) and ``posix/`` copies of the database."""
    lowered = name.lower()
    if lowered in _HOST_ZONES:
        raise ValueError(f"timezone: {name!r} is {_HOST_ZONES[lowered]}, not a time zone: a knowledge cutoff would "
                         "then depend on where pitlab runs; name the IANA zone the timestamps are written in "
                         "(e.g. America/New_York)")
    if lowered.startswith(("right/", "posix/")):
        what = ("counts leap seconds (its times differ from every other reading by up to 27 s)"
                if lowered.startswith("right/") else "is a copy of the IANA zone that some machines lack")
        raise ValueError(f"timezone: {name!r} {what}; name the zone itself ({name.split('/', 1)[1]!r})")
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"timezone: unknown IANA time zone {name!r}") from None
    return name


def _literal_zone(fmt: str) -> str | None:
    """The text of ``fmt`` outside its directives that names a zone or an offset (``Z``, ``UTC``, ``GMT``, ``EST``,
    ``+09:00``), else None: strptime matches it as plain text and the time would be read in spec.corpus.timezone."""
    literal = " ".join(t for t in re.findall(r"%.|[^%]+", fmt.replace("%%", "")) if not t.startswith("%"))
    for word in re.findall(r"[A-Za-z]+", literal):
        if word in ("Z", "UTC", "UT", "GMT") or re.fullmatch(r"[A-Z]{1,4}T", word):  # 2-5 letters: not the ISO T
            return word
    offset = re.search(r"[+-]\d{1,2}(?::?\d{2})?", literal)
    return offset.group(0) if offset else None


def describe_format(fmt: str | None) -> str:
    """The expected format in words, for messages."""
    fmt = fmt or ISO8601
    if fmt == ISO8601:
        return ISO_DESCRIPTION
    if fmt in EPOCH_NS:
        return f"{fmt}: a number of {EPOCH_UNITS[fmt]} since 1970-01-01T00:00:00Z"
    return f"strftime pattern {fmt!r} (spec.corpus.timestampFormat)"


def parse_timestamp(value: object, timezone: str, fmt: str | None = None) -> pd.Timestamp | None:
    """Parse one timestamp value into a UTC ``pd.Timestamp``; None when missing (None, NaN, empty string).

    ``fmt``: ``iso8601`` (None), a strftime pattern, or ``epoch_s``/``epoch_ms``/``epoch_us`` (module
    docstring). Values without an offset are read in ``timezone`` (IANA name). Raises
    :class:`TimestampError` naming the value and the expected format when the value does not match.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str) and not value.strip():
        return None
    fmt = fmt or ISO8601
    if fmt in EPOCH_NS:
        return _parse_epoch(value, fmt)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or (fmt == ISO8601 and not isinstance(value, str)):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        hint = " (for epoch numbers set spec.corpus.timestampFormat: epoch_s, epoch_ms or epoch_us)" if number else ""
        kind = (f"a number ({'float' if isinstance(value, float) else type(value).__name__})" if number
                else f"a {type(value).__name__}")
        raise TimestampError(f"timestamp {value!r} is {kind}, expected {describe_format(fmt)}{hint}")
    import pandas as pd  # not at the top: check_format runs in the operator, which has no pandas

    s = str(value)
    _check_characters(s, fmt)
    ts = _parse_iso(s) if fmt == ISO8601 else _parse_pattern(s, fmt)
    if ts.tzinfo is None:
        try:
            ts = ts.tz_localize(zoneinfo.ZoneInfo(timezone), ambiguous=True, nonexistent="shift_forward")
        except (pd.errors.OutOfBoundsDatetime, OverflowError):
            raise _out_of_range(s, f" read in {timezone}") from None
        except ValueError as err:
            raise TimestampError(f"timestamp {s!r} cannot be placed in {timezone} ({err})") from None
    try:  # one unit for every document: nanoseconds (a fraction may give them; ns also bounds the range)
        return ts.tz_convert("UTC").as_unit("ns")
    except (pd.errors.OutOfBoundsDatetime, OverflowError, ValueError):
        raise _out_of_range(s) from None


def _check_characters(s: str, fmt: str) -> None:
    """Refuse what a reader would otherwise trim or translate: white space around the value (``str.strip``) and
    digits other than ASCII 0-9 (``re``'s ``\\d``, ``int``, ``strptime`` and ``Decimal`` all read ``'２'`` as 2)."""
    if s != s.strip():
        raise TimestampError(f"timestamp {s!r} starts or ends with white space: a value is read exactly as written, "
                             f"not trimmed (expected {describe_format(fmt)})")
    for i, ch in enumerate(s):
        if not ch.isascii() and unicodedata.decimal(ch, None) is not None:
            name = unicodedata.name(ch, "a digit")
            raise TimestampError(f"timestamp {s!r}: character {i + 1} is {ch!r} ({name}, U+{ord(ch):04X}), not an "
                                 "ASCII digit: timestamps are written with the digits 0-9 (expected "
                                 f"{describe_format(fmt)})")


def _out_of_range(s: str, where: str = "") -> TimestampError:
    return TimestampError(f"timestamp {s!r}{where} is outside the instants pitlab reads, {FIRST} .. {LAST} (pandas' "
                          "nanosecond timestamps); a placeholder such as 0001-01-01 or 9999-12-31 is no publication "
                          "date: leave the value empty for a missing timestamp")


def _in_year_range(year: int) -> bool:
    """Whether ``year`` can hold an instant of the pandas range (the exact bounds are checked on the result)."""
    return int(FIRST[:4]) <= year <= int(LAST[:4])


def _refusal(s: str, fmt: str, detail: str = "") -> TimestampError:
    zone = _ZONE_ABBREVIATION.search(s)
    if zone and _matches(s[:zone.start()].rstrip(), fmt):  # a valid value followed by EST, JST, UTC, ...
        return TimestampError(f"timestamp {s!r}: zone abbreviation {zone.group(1)!r} refused (abbreviations are "
                              "ambiguous: CST is US Central, China and Cuba); write the UTC offset (e.g. -05:00), or "
                              "local times without a zone and spec.corpus.timezone")
    hint = _format_hint(s) if fmt == ISO8601 else ""
    return TimestampError(f"timestamp {s!r} does not match {describe_format(fmt)}{detail}{hint}")


# Day-first, month-first and other common ways of writing a date, tried only to word the hint of a refusal.
_HINT_FORMATS = ("%d/%m/%Y", "%m/%d/%Y", "%Y/%m/%d", "%d.%m.%Y", "%d-%m-%Y", "%m-%d-%Y", "%Y%m%d",
                 "%d/%m/%Y %H:%M", "%m/%d/%Y %H:%M", "%d/%m/%Y %H:%M:%S", "%m/%d/%Y %H:%M:%S")


def _format_hint(s: str) -> str:
    """The spec.corpus.timestampFormat hint for a value ISO 8601 refused: the common formats ``s`` reads in (one:
    that one; several, e.g. 03/04/1995: all, since which is meant is the file's convention, not pitlab's guess)."""
    fits = [f for f in _HINT_FORMATS if _reads_as(s, f)]
    if not fits:
        return "; set spec.corpus.timestampFormat (e.g. \"%d/%m/%Y\") for another format"
    if len(fits) == 1:
        return (f"; it reads as {fits[0]!r}: set spec.corpus.timestampFormat: \"{fits[0]}\" if the file writes "
                "every timestamp that way")
    both = " and as ".join(repr(f) for f in fits)
    return (f"; it reads as {both}: set spec.corpus.timestampFormat to the one the file uses (pitlab does not "
            "guess between them)")


def _reads_as(s: str, fmt: str) -> bool:
    """Whether ``s`` passes the strict reading spec.corpus.timestampFormat ``fmt`` would give it
    (:func:`_parse_pattern`: full-width fields, the date's own weekday)."""
    try:
        _parse_pattern(s, fmt)
    except (TimestampError, ValueError):
        return False
    return True


def _matches(s: str, fmt: str) -> bool:
    if fmt in EPOCH_NS:
        return _DECIMAL.fullmatch(s) is not None
    try:
        _parse_iso(s) if fmt == ISO8601 else dt.datetime.strptime(s, fmt)
    except (TimestampError, ValueError):
        return False
    return True


def _parse_iso(s: str) -> pd.Timestamp:
    import pandas as pd  # not at the top: check_format runs in the operator, which has no pandas

    m = _ISO.fullmatch(s)
    if m is None:
        long = _ISO_SUBNANOSECOND.fullmatch(s)
        if long is not None:
            raise TimestampError(f"timestamp {s!r} gives the second to {len(long.group(7))} decimal places; pitlab "
                                 "reads time to the nanosecond (at most 9 digits), and rounding would be a guess")
        raise _refusal(s, ISO8601)
    y, mo, d, h, mi, sec, frac, off = m.groups()
    if not _in_year_range(int(y)):
        raise _out_of_range(s)
    frac = (frac or "").ljust(9, "0")
    try:
        stamp = dt.datetime(int(y), int(mo), int(d), int(h or 0), int(mi or 0), int(sec or 0), int(frac[:6]))
        if off is not None:
            stamp = stamp.replace(tzinfo=_offset(off))
    except ValueError as err:
        raise TimestampError(f"timestamp {s!r} is not a valid ISO 8601 date or time ({err})") from None
    if stamp.tzinfo is not None:  # an instant: counted in whole nanoseconds, exact to the last digit of the fraction
        since = stamp - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        ns = (since.days * 86400 + since.seconds) * 10**9 + since.microseconds * 1000 + int(frac[6:])
        if not pd.Timestamp.min.value <= ns <= pd.Timestamp.max.value:
            raise _out_of_range(s)
        return pd.Timestamp(ns, unit="ns", tz="UTC")
    try:  # a wall time, placed in the corpus zone by the caller: a nanosecond Timestamp of the same fields
        return pd.Timestamp(f"{y}-{mo}-{d}T{h or '00'}:{mi or '00'}:{sec or '00'}.{frac}")
    except (pd.errors.OutOfBoundsDatetime, OverflowError):
        raise _out_of_range(s) from None


def _offset(off: str) -> dt.timezone:
    if off == "Z":
        return dt.timezone.utc
    digits = off[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:] or 0)
    if hours > 23 or minutes > 59:
        raise ValueError(f"UTC offset {off} out of range")
    delta = dt.timedelta(hours=hours, minutes=minutes)
    return dt.timezone(-delta if off[0] == "-" else delta)


def _renderings(stamp: dt.datetime, fmt: str) -> set[str]:
    """``stamp`` written with ``fmt``: the spellings strptime reads back into the same value. ``%z`` has three
    (``+0900``, ``+09:00``, and ``Z`` for UTC); every other directive one."""
    tokens = re.findall(r"%.|[^%]+", fmt)
    if "%z" not in tokens:
        return {stamp.strftime(fmt)}
    off = stamp.strftime("%z")
    spellings = {off, f"{off[:3]}:{off[3:5]}{':' + off[5:] if len(off) > 5 else ''}"} | (
        {"Z"} if stamp.utcoffset() == dt.timedelta(0) else set())
    return {stamp.strftime("".join(sp.replace("%", "%%") if t == "%z" else t for t in tokens)) for sp in spellings}


_NUMERIC = {"%Y", "%m", "%d", "%j", "%H", "%I", "%M", "%S", "%f", "%z"}


def _same_writing(s: str, written: str, fmt: str) -> bool:
    """Whether the input ``s`` is the pattern's own writing ``written`` of the value it was read as: equal up to
    letter case (PM/pm, Dec/DEC carry the same value), and, when no two numeric fields of ``fmt`` touch, up to
    the leading zeros of a number between separators (``1 Apr 2017`` for ``%d %b %Y``: nothing else could be
    meant). Where numeric fields touch (``%Y%m%d``, ``%H%M``) the widths are what separates them: exact."""
    if s.casefold() == written.casefold():
        return True
    tokens = re.findall(r"%.|[^%]+", fmt)
    if any(a in _NUMERIC and b in _NUMERIC for a, b in zip(tokens, tokens[1:])):
        return False
    got, want = re.findall(r"\d+|\D+", s), re.findall(r"\d+|\D+", written)
    return len(got) == len(want) and all(
        g.casefold() == w.casefold() if not w[0].isdigit() else
        (g.isdigit() and (g == w or len(g) < len(w) and w.lstrip("0") == g.lstrip("0") and w.startswith("0")))
        for g, w in zip(got, want))


def _parse_pattern(s: str, fmt: str) -> pd.Timestamp:
    """``s`` read with the strftime pattern ``fmt``, accepted only when writing the value back with ``fmt``
    gives ``s`` again: a field shorter than its width (``2017411`` for ``%Y%m%d``), a weekday that is not the
    date's, or any field strptime reads and then ignores or overrides is refused, not guessed."""
    import pandas as pd  # not at the top: check_format runs in the operator, which has no pandas

    try:
        stamp = dt.datetime.strptime(s, fmt)
    except ValueError as err:  # strptime's own "time data ... does not match format ..." says nothing more
        raise _refusal(s, fmt, "" if str(err).startswith("time data") else f" ({err})") from None
    if not _in_year_range(stamp.year):
        raise _out_of_range(s)
    back = _renderings(stamp, fmt)
    if not any(_same_writing(s, b, fmt) for b in back):
        shown = sorted(back)[0]
        micro = " (%f is written with 6 digits: give the fraction in microseconds)" if "%f" in fmt else ""
        raise TimestampError(f"timestamp {s!r} is not exactly strftime pattern {fmt!r} (spec.corpus.timestampFormat): "
                             f"strptime reads it as {stamp.isoformat()}, which the pattern writes {shown!r}{micro}; "
                             "a field shorter than its width (e.g. an unpadded day or hour), a weekday that is not "
                             "the date's, or a field the pattern ignores would be a guess, so it is refused")
    return pd.Timestamp(stamp)


def _parse_epoch(value: object, fmt: str) -> pd.Timestamp:
    import pandas as pd  # not at the top: check_format runs in the operator, which has no pandas

    if isinstance(value, bool):
        raise TimestampError(f"timestamp {value!r} is a bool, expected {describe_format(fmt)}")
    if isinstance(value, int):
        number = Decimal(value)
    elif isinstance(value, JsonNumber):  # the digits of the file, not the float nearest to them
        number = Decimal(value.text)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise TimestampError(f"timestamp {value!r} is not a finite number, expected {describe_format(fmt)}")
        number = Decimal(repr(value))
    elif isinstance(value, str):
        _check_characters(value, fmt)
        if not _DECIMAL.fullmatch(value):
            raise _refusal(value, fmt)
        number = Decimal(value)
    else:
        raise _refusal(str(value), fmt)
    with localcontext() as ctx:  # exact: the default 28 digits would round a 30-digit value to whole nanoseconds
        ctx.prec = len(number.as_tuple().digits) + 10
        exact = number * EPOCH_NS[fmt]
    if exact != exact.to_integral_value():
        raise TimestampError(f"timestamp {value!r} as {EPOCH_UNITS[fmt]} since 1970 is not a whole number of "
                             "nanoseconds; pitlab reads time to the nanosecond, and rounding would be a guess")
    ns = int(exact)
    try:
        return pd.Timestamp(ns, unit="ns", tz="UTC")
    except (OverflowError, ValueError, pd.errors.OutOfBoundsDatetime):
        raise TimestampError(f"timestamp {value!r} as {EPOCH_UNITS[fmt]} since 1970 is outside 1677-09-21 .. "
                             f"2262-04-11 (are the numbers in another unit than {fmt}?)") from None
