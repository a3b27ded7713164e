"""Strict document timestamps: ISO 8601 by default, one named format otherwise, and no guessing."""

import datetime as dt
import json
import zoneinfo

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
    ("  2016-12-31  ", "America/New_York", "2016-12-31T05:00:00+00:00"),
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
                              "YYYY-MM-DDTHH:MM[:SS[.fff]], optionally ending in Z, ±HH:MM, ±HHMM or ±HH; set "
                              "spec.corpus.timestampFormat (e.g. \"%d/%m/%Y\") for another format")


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
