"""Strict document timestamps: ISO 8601 by default, one named format otherwise, and no guessing."""

import datetime as dt
import json
import re
import zoneinfo

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pitlab.data import CorpusError, cutoff_instant, filter_corpus, read_corpus
from pitlab.data.timestamps import TimestampError, check_format, parse_timestamp


@pytest.mark.parametrize("value,tz,expected", [
    ("2017-04-01", "Europe/London", "2017-03-31T23:00:00+00:00"),  # BST midnight
    ("2017-04-01T09:30", "Asia/Tokyo", "2017-04-01T00:30:00+00:00"),
    ("2017-04-01 09:30:15", "UTC", "2017-04-01T09:30:15+00:00"),
    ("2017-04-01T09:30:15.25", "UTC", "2017-04-01T09:30:15.250000+00:00"),
    ("2017-04-01T09:30:15,123456789Z", "Asia/Tokyo", "2017-04-01T09:30:15.123456789+00:00"),
    ("2017-04-01T09:30:00Z", "Asia/Tokyo", "2017-04-01T09:30:00+00:00"),
    ("2017-04-01T09:30:00+09:00", "UTC", "2017-04-01T00:30:00+00:00"),
    ("2017-04-01T09:30:00-0530", "UTC", "2017-04-01T15:00:00+00:00"),
    ("2017-04-01T09:30+01", "UTC", "2017-04-01T08:30:00+00:00"),
    ("2016-12-31", "America/New_York", "2016-12-31T05:00:00+00:00"),  # white space around it is refused (below)
])
def test_iso_forms_accepted(value, tz, expected):
    assert parse_timestamp(value, tz).isoformat() == expected


@pytest.mark.parametrize("value,fragment", [
    ("01/04/2017", "timestamp '01/04/2017' does not match ISO 8601"),  # was read as 2017-01-04
    ("13/04/2017", "timestamp '13/04/2017' does not match ISO 8601"),
    ("Dec 31, 2016", "timestamp 'Dec 31, 2016' does not match ISO 8601"),
    ("20170401", "timestamp '20170401' does not match ISO 8601"),
    ("2017-4-1", "timestamp '2017-4-1' does not match ISO 8601"),
    ("2017-W13-6", "timestamp '2017-W13-6' does not match ISO 8601"),
    ("2017-091", "timestamp '2017-091' does not match ISO 8601"),
    ("2017-02-30", "timestamp '2017-02-30' is not a valid ISO 8601 date or time (day is out of range for month)"),
    ("2017-04-01T24:00", "hour must be in 0..23"),
    ("2017-04-01+09:00", "timestamp '2017-04-01+09:00' does not match ISO 8601"),  # an offset needs a time
    ("2017-04-01T09:30+25:00", "UTC offset +25:00 out of range"),
    ("2017-04-01 09:30 EST", "zone abbreviation 'EST' refused"),
    ("2017-04-01T09:30:00JST", "zone abbreviation 'JST' refused"),
    ("2017-04-01 09:30 UTC", "zone abbreviation 'UTC' refused"),
])
def test_non_iso_values_are_refused_with_the_value(value, fragment):
    with pytest.raises(TimestampError) as err:
        parse_timestamp(value, "Europe/London")
    assert fragment in str(err.value)


def test_only_a_valid_value_followed_by_letters_is_called_a_zone_abbreviation():
    with pytest.raises(TimestampError, match=r"^timestamp '1 Apr' does not match strftime pattern '%d %b %Y' "
                                             r"\(spec.corpus.timestampFormat\)$"):
        parse_timestamp("1 Apr", "UTC", "%d %b %Y")
    with pytest.raises(TimestampError, match=r"^timestamp '1 Apr 2017 JST': zone abbreviation 'JST' refused"):
        parse_timestamp("1 Apr 2017 JST", "UTC", "%d %b %Y")
    with pytest.raises(TimestampError, match=r"^timestamp '1609426799 UTC': zone abbreviation 'UTC' refused"):
        parse_timestamp("1609426799 UTC", "UTC", "epoch_s")


def test_refusal_says_what_is_expected_and_how_to_name_another_format():
    with pytest.raises(TimestampError) as err:
        parse_timestamp("01/04/2017", "UTC")
    assert str(err.value) == ("timestamp '01/04/2017' does not match ISO 8601: YYYY-MM-DD or "
                              "YYYY-MM-DDTHH:MM[:SS[.fff]], optionally ending in Z, ±HH:MM, ±HHMM or ±HH; it reads as "
                              "'%d/%m/%Y' and as '%m/%d/%Y': set spec.corpus.timestampFormat to the one the file uses "
                              "(pitlab does not guess between them)")
    with pytest.raises(TimestampError) as err:  # month-first only: the hint names the one format that reads it
        parse_timestamp("03/15/1995", "UTC")
    assert str(err.value).endswith("; it reads as '%m/%d/%Y': set spec.corpus.timestampFormat: \"%m/%d/%Y\" if the "
                                   "file writes every timestamp that way")
    with pytest.raises(TimestampError) as err:  # none of the common formats: the generic example
        parse_timestamp("Q1 2017", "UTC")
    assert str(err.value).endswith("; set spec.corpus.timestampFormat (e.g. \"%d/%m/%Y\") for another format")


def test_a_json_number_needs_an_epoch_format():
    with pytest.raises(TimestampError, match=r"timestamp 1609426799000 is a number \(int\), expected ISO 8601.*epoch_ms"):
        parse_timestamp(1609426799000, "UTC")
    with pytest.raises(TimestampError, match=r"timestamp True is a bool"):
        parse_timestamp(True, "UTC", "epoch_s")


@pytest.mark.parametrize("value", [None, "", "   ", float("nan")])
def test_missing_values_are_none(value):
    assert parse_timestamp(value, "UTC") is None
    assert parse_timestamp(value, "UTC", "epoch_ms") is None


@pytest.mark.parametrize("value,fmt,expected", [
    (1609426799, "epoch_s", "2020-12-31T14:59:59+00:00"),
    ("1609426799", "epoch_s", "2020-12-31T14:59:59+00:00"),
    ("1609426799.25", "epoch_s", "2020-12-31T14:59:59.250000+00:00"),
    (1609426799.25, "epoch_s", "2020-12-31T14:59:59.250000+00:00"),
    (1609426799000, "epoch_ms", "2020-12-31T14:59:59+00:00"),  # the example
    ("1609426799000", "epoch_ms", "2020-12-31T14:59:59+00:00"),
    (1609426799000123, "epoch_us", "2020-12-31T14:59:59.000123+00:00"),
    (-86400, "epoch_s", "1969-12-31T00:00:00+00:00"),
])
def test_epoch_units(value, fmt, expected):
    # epoch values are instants: the corpus time zone does not move them
    assert parse_timestamp(value, "Asia/Tokyo", fmt).isoformat() == expected


def test_epoch_refusals():
    with pytest.raises(TimestampError, match=r"timestamp 1609426799000 as seconds since 1970 is outside .*"
                                             r"another unit than epoch_s"):
        parse_timestamp(1609426799000, "UTC", "epoch_s")
    with pytest.raises(TimestampError, match=r"timestamp '2020-12-31' does not match epoch_ms: a number of "
                                             r"milliseconds since 1970"):
        parse_timestamp("2020-12-31", "UTC", "epoch_ms")
    with pytest.raises(TimestampError, match=r"'1.6e12' does not match epoch_ms"):
        parse_timestamp("1.6e12", "UTC", "epoch_ms")


@pytest.mark.parametrize("value,fmt,tz,expected", [
    ("15/03/2017", "%d/%m/%Y", "Europe/London", "2017-03-15T00:00:00+00:00"),
    ("01/04/2017", "%d/%m/%Y", "Europe/London", "2017-03-31T23:00:00+00:00"),
    ("04/01/2017 03:04:05 PM", "%m/%d/%Y %I:%M:%S %p", "UTC", "2017-04-01T15:04:05+00:00"),
    ("20170401T150405+0900", "%Y%m%dT%H%M%S%z", "UTC", "2017-04-01T06:04:05+00:00"),
    ("1 Apr 2017", "%d %b %Y", "UTC", "2017-04-01T00:00:00+00:00"),
    ("2017.091", "%Y.%j", "UTC", "2017-04-01T00:00:00+00:00"),
    (20170401, "%Y%m%d", "UTC", "2017-04-01T00:00:00+00:00"),  # a JSON integer read as its digits
])
def test_strftime_patterns(value, fmt, tz, expected):
    assert parse_timestamp(value, tz, fmt).isoformat() == expected


@pytest.mark.parametrize("value", ["04/13/2017", "2017-04-01", "15/03/2017 10:00", "15/3/17"])
def test_strftime_refusals_name_the_value_and_the_pattern(value):
    with pytest.raises(TimestampError) as err:
        parse_timestamp(value, "UTC", "%d/%m/%Y")
    assert str(err.value).startswith(f"timestamp {value!r} does not match strftime pattern '%d/%m/%Y'")


@pytest.mark.parametrize("fmt,fragment", [
    ("%Y-%m-%d %H:%M %Z", "%Z (zone abbreviations such as EST or JST) is refused"),
    ("%d/%m/%y", "%y (two-digit year) needs a century guess"),
    ("%d/%m", "a pattern must give the year (%Y) and the day"),
    ("%Y-%m", "a pattern must give the year (%Y) and the day"),
    ("%Y-%m-%d %I:%M", "%I (12-hour clock) without %p (AM/PM) is ambiguous"),
    ("%c", "directive(s) %c not accepted"),
    ("%Y week %U", "directive(s) %U not accepted"),
    ("dd/mm/yyyy", "is neither iso8601, epoch_s, epoch_ms, epoch_us nor a strftime pattern"),
    ("%Y-%m-%d %", "a % ends the pattern; write %% for a literal %"),
    ("%d/%d/%Y/%m", "%d given more than once; strptime keeps one of the values and ignores the other"),
    ("%Y-%m-%d %H:%M %p", "%p (AM/PM) is only read with %I (12-hour clock); with %H strptime ignores it"),
    ("%Y-%m-%d %I %H:%M %p", "%H and %I both give the hour"),
    ("%Y-%j %m-%d", "%j and %m both give the month"),
    ("%Y %b %m %d", "%m and %b both give the month"),
    ("%a %A %Y-%m-%d", "%a and %A both give the weekday"),
])
def test_refused_patterns(fmt, fragment):
    with pytest.raises(ValueError) as err:
        check_format(fmt)
    assert fragment in str(err.value)


@pytest.mark.parametrize("fmt", [None, "iso8601", "epoch_s", "epoch_ms", "epoch_us", "%d/%m/%Y", "%Y%m%d%%",
                                 "%Y-%m-%dT%H:%M:%S.%f%z"])
def test_accepted_formats(fmt):
    assert check_format(fmt) == (fmt or "iso8601")


# ------------------------------------------------------------------------------------ property tests
TIMEZONES = ["UTC", "America/New_York", "Europe/London", "Asia/Tokyo", "Asia/Kolkata", "Australia/Lord_Howe",
             "Pacific/Kiritimati", "Pacific/Pago_Pago"]
# format → how a document's instant is written in it; "naive" formats are written as wall time in the spec's zone
FORMATS = {
    "iso8601 naive": (None, lambda t, tz: t.astimezone(tz).replace(tzinfo=None).isoformat(), True),
    "iso8601 date": (None, lambda t, tz: t.astimezone(tz).date().isoformat(), True),
    "iso8601 offset": (None, lambda t, tz: t.astimezone(zoneinfo.ZoneInfo("America/Chicago")).isoformat(), False),
    "iso8601 Z": (None, lambda t, tz: t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), False),
    "%d/%m/%Y": ("%d/%m/%Y", lambda t, tz: t.astimezone(tz).strftime("%d/%m/%Y"), True),
    "%m/%d/%Y %I:%M:%S %p": ("%m/%d/%Y %I:%M:%S %p",
                             lambda t, tz: t.astimezone(tz).strftime("%m/%d/%Y %I:%M:%S %p"), True),
    "%d %b %Y %H:%M": ("%d %b %Y %H:%M", lambda t, tz: t.astimezone(tz).strftime("%d %b %Y %H:%M"), True),
    "%Y%m%dT%H%M%S%z": ("%Y%m%dT%H%M%S%z",
                        lambda t, tz: t.astimezone(zoneinfo.ZoneInfo("Asia/Kolkata")).strftime("%Y%m%dT%H%M%S%z"),
                        False),
    "epoch_s": ("epoch_s", lambda t, tz: str(int(t.timestamp())), False),
    "epoch_ms": ("epoch_ms", lambda t, tz: int(t.timestamp()) * 1000 + t.microsecond // 1000, False),
    "epoch_us": ("epoch_us", lambda t, tz: str(int(t.timestamp()) * 10**6 + t.microsecond), False),
}


@settings(max_examples=400, deadline=None)
@given(
    name=st.sampled_from(sorted(FORMATS)),
    tz=st.sampled_from(TIMEZONES),
    cutoff=st.dates(min_value=dt.date(1990, 1, 1), max_value=dt.date(2035, 12, 31)),
    offsets=st.lists(st.integers(min_value=-2 * 86400 * 1000, max_value=2 * 86400 * 1000), min_size=1, max_size=25),
)
def test_no_document_after_the_cutoff_is_kept_in_any_format_or_zone(name, tz, cutoff, offsets):
    """Property: for every supported format and zone, a document is kept iff the local date (in the spec's zone)
    of the instant it was written from is at or before the cutoff; none after the cutoff is ever kept."""
    fmt, write, _ = FORMATS[name]
    zone = zoneinfo.ZoneInfo(tz)
    end = dt.datetime.combine(cutoff + dt.timedelta(days=1), dt.time(0), tzinfo=zone).astimezone(dt.timezone.utc)
    instants = [end + dt.timedelta(milliseconds=off) for off in offsets]
    rows = [{"id": f"d{i}", "text": "text", "ts": write(t, zone)} for i, t in enumerate(instants)]
    docs = _read_jsonl(rows, tz, fmt)
    assert all(d.timestamp is not None for d in docs), [d.timestamp_error for d in docs]
    try:
        kept, audit = filter_corpus(docs, cutoff, tz, timestamp_format=fmt, today=dt.date(2100, 1, 1))
    except CorpusError as err:
        assert "no document at or before the knowledge cutoff" in str(err)
        kept, audit = [], None
    expected = {f"d{i}" for i, t in enumerate(instants) if t.astimezone(zone).date() <= cutoff}
    assert {d.id for d in kept} == expected
    limit = cutoff_instant(cutoff, tz)
    assert all(d.timestamp < limit for d in kept)
    if audit is not None:
        assert audit.timestamp_format == (fmt or "iso8601")
        assert audit.included + audit.excluded_by_date == len(docs)


def _read_jsonl(rows, tz, fmt):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "c.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return read_corpus(f, "jsonl", "text", "ts", tz, "id", fmt)


@settings(max_examples=200, deadline=None)
@given(
    days=st.lists(st.dates(min_value=dt.date(1990, 1, 1), max_value=dt.date(2030, 12, 31)), min_size=1, max_size=20),
    swapped=st.dates(min_value=dt.date(1990, 1, 1), max_value=dt.date(2030, 12, 31)).filter(lambda d: d.day > 12),
    at=st.integers(min_value=0, max_value=20),
)
def test_a_file_mixing_day_first_and_month_first_is_refused(days, swapped, at):
    """Property: dd/mm values with one mm/dd value (day > 12) among them: refused with "%d/%m/%Y" at the mm/dd row,
    naming the value; refused with no format at the first row (no slashed date is ISO 8601)."""
    values = [d.strftime("%d/%m/%Y") for d in days]
    at = min(at, len(values))
    values.insert(at, swapped.strftime("%m/%d/%Y"))
    rows = [{"id": f"d{i}", "text": "text", "ts": v} for i, v in enumerate(values)]
    docs = _read_jsonl(rows, "Europe/London", "%d/%m/%Y")
    with pytest.raises(CorpusError) as err:
        filter_corpus(docs, dt.date(2040, 1, 1), "Europe/London", source="c.jsonl", timestamp_format="%d/%m/%Y")
    bad = values[at]
    first_bad = next(i for i, v in enumerate(values) if int(v[3:5]) > 12)
    assert str(err.value).startswith(f"c.jsonl: row {first_bad + 1} (id 'd{first_bad}'): timestamp "
                                     f"{values[first_bad]!r} does not match strftime pattern '%d/%m/%Y'")
    assert int(bad[3:5]) > 12
    docs = _read_jsonl(rows, "Europe/London", None)
    with pytest.raises(CorpusError, match=r"c.jsonl: row 1 \(id 'd0'\): timestamp '\d\d/\d\d/\d{4}' does not match "
                                          r"ISO 8601"):
        filter_corpus(docs, dt.date(2040, 1, 1), "Europe/London", source="c.jsonl")


@pytest.mark.parametrize("value,fmt,expected", [
    ("Sat 01/04/2017", "%a %d/%m/%Y", "2017-04-01T00:00:00+00:00"),  # the date's own weekday
    ("saturday 2017-04-01", "%A %Y-%m-%d", "2017-04-01T00:00:00+00:00"),  # letter case carries no value
    ("2017-04-01 03:04 pm", "%Y-%m-%d %I:%M %p", "2017-04-01T15:04:00+00:00"),
    ("2017-04-01T15:04:05+09:00", "%Y-%m-%dT%H:%M:%S%z", "2017-04-01T06:04:05+00:00"),  # %z: +HH:MM
    ("2017-04-01T15:04:05Z", "%Y-%m-%dT%H:%M:%S%z", "2017-04-01T15:04:05+00:00"),  # %z: Z
    ("1/4/2017 7:05", "%d/%m/%Y %H:%M", "2017-04-01T07:05:00+00:00"),  # unpadded between separators
    ("2017-04-01 15:04:05.120000", "%Y-%m-%d %H:%M:%S.%f", "2017-04-01T15:04:05.120000+00:00"),
])
def test_strftime_values_written_as_the_pattern_writes_them(value, fmt, expected):
    assert parse_timestamp(value, "UTC", fmt).isoformat() == expected


@pytest.mark.parametrize("value,fmt,reads,writes", [
    ("Mon 01/04/2017", "%a %d/%m/%Y", "2017-04-01T00:00:00", "Sat 01/04/2017"),  # weekday contradicts the date
    ("Sunday 2017-04-01", "%A %Y-%m-%d", "2017-04-01T00:00:00", "Saturday 2017-04-01"),
    ("2017411", "%Y%m%d", "2017-04-11T00:00:00", "20170411"),  # fixed width, no separator: 2017-04-11 or -11-?
    ("201741 930", "%Y%m%d %H%M", "2017-04-01T09:30:00", "20170401 0930"),
    ("2017-04-01 930", "%Y-%m-%d %H%M", "2017-04-01T09:30:00", "2017-04-01 0930"),
    ("2017-04-01 15:04:05.12", "%Y-%m-%d %H:%M:%S.%f", "2017-04-01T15:04:05.120000", "2017-04-01 15:04:05.120000"),
])
def test_strftime_values_read_by_a_guess_are_refused(value, fmt, reads, writes):
    with pytest.raises(TimestampError) as err:
        parse_timestamp(value, "UTC", fmt)
    assert f"timestamp {value!r} is not exactly strftime pattern {fmt!r} (spec.corpus.timestampFormat): strptime " \
           f"reads it as {reads}, which the pattern writes {writes!r}" in str(err.value)


# ------------------------------------------------------------------ read exactly as written, or refused
ISO_EXPECTED = ("ISO 8601: YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS[.fff]], optionally ending in Z, ±HH:MM, ±HHMM or ±HH")


@pytest.mark.parametrize("value,fmt,tz,expected", [
    # iso8601, every documented form
    ("2017-04-01", None, "Asia/Tokyo", "2017-03-31T15:00:00Z"),
    ("2017-04-01T09:30", None, "UTC", "2017-04-01T09:30:00Z"),
    ("2017-04-01 09:30", None, "UTC", "2017-04-01T09:30:00Z"),
    ("2017-04-01T09:30:15", None, "America/New_York", "2017-04-01T13:30:15Z"),
    ("2017-04-01T09:30:15.1", None, "UTC", "2017-04-01T09:30:15.1Z"),
    ("2017-04-01T09:30:15,123456", None, "UTC", "2017-04-01T09:30:15.123456Z"),
    ("2017-04-01T09:30:15.123456789", None, "Asia/Tokyo", "2017-04-01T00:30:15.123456789Z"),
    ("2017-04-01T09:30:15.000000001Z", None, "UTC", "2017-04-01T09:30:15.000000001Z"),
    ("2017-04-01 09:30:15.987654321+09:00", None, "UTC", "2017-04-01T00:30:15.987654321Z"),
    ("2017-04-01T09:30Z", None, "Asia/Tokyo", "2017-04-01T09:30:00Z"),
    ("2017-04-01T09:30-05:30", None, "UTC", "2017-04-01T15:00:00Z"),
    ("2017-04-01T09:30+0530", None, "UTC", "2017-04-01T04:00:00Z"),
    ("2017-04-01T09:30-03", None, "UTC", "2017-04-01T12:30:00Z"),
    # the ends of the range pitlab reads (pandas' nanosecond timestamps)
    ("1677-09-21T00:12:43.145224193Z", None, "UTC", "1677-09-21T00:12:43.145224193Z"),
    ("2262-04-11T23:47:16.854775807Z", None, "UTC", "2262-04-11T23:47:16.854775807Z"),
    ("2262-04-12T08:47:16.854775807+09:00", None, "UTC", "2262-04-11T23:47:16.854775807Z"),
    # strftime patterns (non-ASCII literals are fine: only the digits must be ASCII)
    ("15/03/2017", "%d/%m/%Y", "Europe/London", "2017-03-15T00:00:00Z"),
    ("2017年04月01日 09時30分", "%Y年%m月%d日 %H時%M分", "Asia/Tokyo", "2017-04-01T00:30:00Z"),
    ("2017-04-01T15:04:05.123456+0900", "%Y-%m-%dT%H:%M:%S.%f%z", "UTC", "2017-04-01T06:04:05.123456Z"),
    # epoch numbers, down to the nanosecond
    (1609426799, "epoch_s", "Asia/Tokyo", "2020-12-31T14:59:59Z"),
    ("1609426799.123456789", "epoch_s", "UTC", "2020-12-31T14:59:59.123456789Z"),
    ("1609426799000.000001", "epoch_ms", "UTC", "2020-12-31T14:59:59.000000001Z"),
    ("1609426799000000.001", "epoch_us", "UTC", "2020-12-31T14:59:59.000000001Z"),
    (1609426799000, "epoch_ms", "UTC", "2020-12-31T14:59:59Z"),
])
def test_documented_forms_parse_to_the_exact_timestamp(value, fmt, tz, expected):
    got = parse_timestamp(value, tz, fmt)
    want = pd.Timestamp(expected)
    assert got == want and got.value == want.value  # to the nanosecond
    assert str(got.tz) == "UTC" and got.unit == "ns"  # one unit for every document, whatever the format


@pytest.mark.parametrize("value,fmt,expected", [
    (" 2020-01-02", None, ISO_EXPECTED),
    ("2020-01-02 ", None, ISO_EXPECTED),
    ("\t2020-01-02T09:30Z", None, ISO_EXPECTED),
    ("2020-01-02\n", None, ISO_EXPECTED),
    ("2020-01-02\u3000", None, ISO_EXPECTED),  # ideographic space
    ("\xa02020-01-02", None, ISO_EXPECTED),  # no-break space
    (" 15/03/2017", "%d/%m/%Y", "strftime pattern '%d/%m/%Y' (spec.corpus.timestampFormat)"),
    ("1609426799 ", "epoch_s", "epoch_s: a number of seconds since 1970-01-01T00:00:00Z"),
])
def test_white_space_around_a_value_is_refused_not_trimmed(value, fmt, expected):
    with pytest.raises(TimestampError) as err:
        parse_timestamp(value, "UTC", fmt)
    assert str(err.value) == (f"timestamp {value!r} starts or ends with white space: a value is read exactly as "
                              f"written, not trimmed (expected {expected})")


@pytest.mark.parametrize("value,fmt,at,char,name", [
    ("２０２０-01-02", None, 1, "２", "FULLWIDTH DIGIT TWO, U+FF12"),
    ("2020-01-０２", None, 9, "０", "FULLWIDTH DIGIT ZERO, U+FF10"),
    ("2020-01-02T0９:30Z", None, 13, "９", "FULLWIDTH DIGIT NINE, U+FF19"),
    ("٢٠٢٠-01-02", None, 1, "٢", "ARABIC-INDIC DIGIT TWO, U+0662"),
    ("２０２０/01/02", "%Y/%m/%d", 1, "２", "FULLWIDTH DIGIT TWO, U+FF12"),
    ("2020年０1月02日", "%Y年%m月%d日", 6, "０", "FULLWIDTH DIGIT ZERO, U+FF10"),
    ("１６０９４２６７９９", "epoch_s", 1, "１", "FULLWIDTH DIGIT ONE, U+FF11"),
    ("1609426799.５", "epoch_s", 12, "５", "FULLWIDTH DIGIT FIVE, U+FF15"),
])
def test_digits_other_than_ascii_are_refused(value, fmt, at, char, name):
    with pytest.raises(TimestampError) as err:
        parse_timestamp(value, "UTC", fmt)
    assert str(err.value).startswith(f"timestamp {value!r}: character {at} is {char!r} ({name}), not an ASCII digit: "
                                     "timestamps are written with the digits 0-9 (expected ")


@pytest.mark.parametrize("value,fmt,message", [
    ("2020-01-02T03:04:05.1234567891Z", None,
     "timestamp '2020-01-02T03:04:05.1234567891Z' gives the second to 10 decimal places; pitlab reads time to the "
     "nanosecond (at most 9 digits), and rounding would be a guess"),
    ("2020-01-02 03:04:05,123456789012", None,
     "timestamp '2020-01-02 03:04:05,123456789012' gives the second to 12 decimal places; pitlab reads time to the "
     "nanosecond (at most 9 digits), and rounding would be a guess"),
    ("1609426799.1234567891", "epoch_s",
     "timestamp '1609426799.1234567891' as seconds since 1970 is not a whole number of nanoseconds; pitlab reads "
     "time to the nanosecond, and rounding would be a guess"),
    ("1609426799.12345678900000000001", "epoch_s",  # past Decimal's default 28 digits: still not rounded away
     "timestamp '1609426799.12345678900000000001' as seconds since 1970 is not a whole number of nanoseconds; "
     "pitlab reads time to the nanosecond, and rounding would be a guess"),
    ("1609426799000.0000001", "epoch_ms",
     "timestamp '1609426799000.0000001' as milliseconds since 1970 is not a whole number of nanoseconds; pitlab "
     "reads time to the nanosecond, and rounding would be a guess"),
])
def test_a_fraction_finer_than_a_nanosecond_is_refused(value, fmt, message):
    with pytest.raises(TimestampError) as err:
        parse_timestamp(value, "UTC", fmt)
    assert str(err.value) == message


RANGE = ("is outside the instants pitlab reads, 1677-09-21T00:12:43.145224193Z .. 2262-04-11T23:47:16.854775807Z "
         "(pandas' nanosecond timestamps); a placeholder such as 0001-01-01 or 9999-12-31 is no publication date: "
         "leave the value empty for a missing timestamp")


@pytest.mark.parametrize("value,fmt,tz,where", [
    ("0001-01-01T00:00:00+01:00", None, "UTC", ""),  # was a year-0 Timestamp that crashed later
    ("0001-01-01", None, "UTC", ""),  # was kept as a document from year 1
    ("0000-01-01", None, "UTC", ""),
    ("9999-12-31T23:59:59-01:00", None, "UTC", ""),
    ("9999-12-31", None, "Asia/Tokyo", ""),
    ("1600-06-30T12:00Z", None, "UTC", ""),
    ("1677-09-21T00:12:43.145224192Z", None, "UTC", ""),  # one nanosecond before the first
    ("2262-04-11T23:47:16.854775808Z", None, "UTC", ""),  # one nanosecond after the last
    ("2262-04-11T23:47:16", None, "America/New_York", " read in America/New_York"),  # 2262-04-12 03:47 UTC
    ("0001-01-01", "%Y-%m-%d", "UTC", ""),
    ("0001-01-01T00:00+0100", "%Y-%m-%dT%H:%M%z", "UTC", ""),
    ("31/12/9999", "%d/%m/%Y", "UTC", ""),
])
def test_an_instant_outside_the_pandas_range_is_refused_with_the_value(value, fmt, tz, where):
    with pytest.raises(TimestampError) as err:
        parse_timestamp(value, tz, fmt)
    assert str(err.value) == f"timestamp {value!r}{where} {RANGE}"


# one row per case above, read from a file: the error names the file, row (or line), id and value, never a traceback
CORPUS_CASES = [
    ("0001-01-01T00:00:00+01:00", f"timestamp '0001-01-01T00:00:00+01:00' {RANGE}"),
    (" 2017-01-02", "timestamp ' 2017-01-02' starts or ends with white space: a value is read exactly as written, "
                    f"not trimmed (expected {ISO_EXPECTED})"),
    ("２０１７-01-02", "timestamp '２０１７-01-02': character 1 is '２' (FULLWIDTH DIGIT TWO, U+FF12), not an ASCII "
                       f"digit: timestamps are written with the digits 0-9 (expected {ISO_EXPECTED})"),
    ("2017-01-02T03:04:05.1234567891", "timestamp '2017-01-02T03:04:05.1234567891' gives the second to 10 decimal "
                                       "places; pitlab reads time to the nanosecond (at most 9 digits), and "
                                       "rounding would be a guess"),
]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("value,error", CORPUS_CASES)
def test_a_corpus_row_with_such_a_timestamp_is_refused_with_file_row_id_and_value(tmp_path, fmt, value, error):
    f = tmp_path / f"c.{fmt}"
    rows = [{"id": "a", "ts": "2017-01-01T09:00:00.123456789", "text": "first"},
            {"id": "b", "ts": value, "text": "second"}]
    if fmt == "csv":
        f.write_text("id,ts,text\n" + "".join(f"{r['id']},{r['ts']},{r['text']}\n" for r in rows), encoding="utf-8")
    else:
        f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    docs = read_corpus(f, fmt, "text", "ts", "Asia/Tokyo", "id")
    assert docs[0].timestamp == pd.Timestamp("2017-01-01T00:00:00.123456789Z")
    assert (docs[1].timestamp, docs[1].timestamp_error, docs[1].timestamp_value) == (None, error, value)
    with pytest.raises(CorpusError) as err:
        filter_corpus(docs, dt.date(2017, 12, 31), "Asia/Tokyo", source=str(f))
    where = "row 2 (line 3, id 'b')" if fmt == "csv" else "row 2 (id 'b')"  # a JSONL row is its line
    assert str(err.value) == (f"{f}: {where}: {error}; fix the row, or set spec.corpus.onMissingTimestamp: "
                              "drop to count and skip it")
    kept, audit = filter_corpus(docs, dt.date(2017, 12, 31), "Asia/Tokyo", "drop", source=str(f),
                                today=dt.date(2018, 1, 1))
    assert [d.id for d in kept] == ["a"]
    assert audit.rejected_timestamp_examples == [{"row": 2, "id": "b", "value": value, "error": error}]


@pytest.mark.parametrize("fmt, zone", [("%Y-%m-%dT%H:%M:%SZ", "Z"), ("%Y-%m-%dT%H:%M:%S.%fZ", "Z"),
                                       ("%Y-%m-%d %H:%M UTC", "UTC"), ("%Y-%m-%d %H:%M GMT", "GMT"),
                                       ("%Y-%m-%d %H:%M EST", "EST"), ("%d/%m/%Y %H:%M CEST", "CEST"),
                                       ("%Y-%m-%d %H:%M+09:00", "+09:00"), ("%Y-%m-%d %H:%M -0500", "-0500")])
def test_a_pattern_whose_literal_text_names_a_zone_is_refused(fmt, zone):
    """Found by a trial: ``%Y-%m-%dT%H:%M:%SZ`` matched the Z as text and read 2016-12-31T20:00:00Z as 20:00 in
    the corpus zone (Tokyo: 05:00 UTC on 2017-01-01 became 11:00 UTC on 2016-12-31, before the cutoff)."""
    with pytest.raises(ValueError, match=rf"the literal text '{re.escape(zone)}' names a zone or an offset, which "
                                         r"strptime matches as plain text.*use %z"):
        check_format(fmt)


@pytest.mark.parametrize("fmt", ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z", "%d %b %Y", "%a %d %B %Y",
                                 "%Y%m%d", "%d.%m.%Y %H:%M", "%I:%M %p %d/%m/%Y", "%Y-%m-%d at %H:%M"])
def test_patterns_without_zone_text_are_kept(fmt):
    """The ISO separator T, month and weekday names and lower-case words are no zone."""
    assert check_format(fmt) == fmt


@pytest.mark.parametrize("name, message", [
    ("localtime", "'localtime' is the zone of the machine that reads the corpus"),
    ("posixrules", "'posixrules' is the POSIX default rules"),
    ("Factory", "'Factory' is tzdata's placeholder for an unset zone"),
    ("right/America/New_York", r"counts leap seconds .*name the zone itself \('America/New_York'\)"),
    ("posix/Asia/Tokyo", r"is a copy of the IANA zone that some machines lack; name the zone itself \('Asia/Tokyo'\)"),
    ("Mars/Olympus", "unknown IANA time zone 'Mars/Olympus'"),
])
def test_a_zone_that_reads_differently_from_machine_to_machine_is_refused(name, message):
    """Found by a trial: ``timezone: localtime`` kept 1 of 3 documents on a UTC host and 2 of 3 on one set to New
    York: the knowledge cutoff depended on the machine."""
    from pitlab.api.pittraining import CorpusSpec
    from pitlab.data.timestamps import check_timezone

    with pytest.raises(ValueError, match=message):
        check_timezone(name)
    with pytest.raises(ValueError, match="timezone: "):
        CorpusSpec(uri="c.csv", format="csv", timezone=name)
    assert check_timezone("America/New_York") == "America/New_York" and check_timezone("UTC") == "UTC"
