"""PIT corpus reader and cutoff filter."""

import datetime as dt
import json
import zoneinfo
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pitlab.data import CorpusError, PanelError, cutoff_instant, filter_corpus, read_corpus
from pitlab.data.corpus import parse_timestamp
from pitlab.data.types import Document

TIMEZONES = ["UTC", "America/New_York", "Asia/Tokyo", "Europe/London", "Pacific/Kiritimati", "Pacific/Pago_Pago"]


def test_fomc_cutoff_counts(data_root):
    src = data_root / "fomc_statements" / "fomc_statements_1994_2026.csv"
    docs = read_corpus(src, "csv", "text", "date", "America/New_York")
    kept, audit = filter_corpus(docs, dt.date(2016, 12, 31), "America/New_York", source=str(src))
    assert audit.total == 235
    # statements dated 1994-02-04 .. 2016-12-14 are kept; 2017-02-01 onwards excluded
    assert audit.included == 159 and audit.excluded_by_date == 76 and audit.rejected_timestamp == 0
    assert audit.max_included_timestamp == "2016-12-14T05:00:00+00:00"
    assert audit.included + audit.excluded_by_date + audit.rejected_timestamp + audit.rejected_empty_text == 235
    assert all(d.timestamp < pd.Timestamp("2017-01-01T05:00:00Z") for d in kept)


def test_day_boundary_in_timezone():
    # 23:59:59 on the cutoff day in Tokyo is kept; 00:00:00 the next day is not, whatever UTC says
    docs = [Document("a", "x", parse_timestamp("2016-12-31T23:59:59", "Asia/Tokyo"), 1),
            Document("b", "y", parse_timestamp("2017-01-01T00:00:00", "Asia/Tokyo"), 2),
            Document("c", "z", parse_timestamp("2016-12-31T15:30:00+00:00", "Asia/Tokyo"), 3)]  # 00:30 JST Jan 1
    kept, audit = filter_corpus(docs, dt.date(2016, 12, 31), "Asia/Tokyo")
    assert [d.id for d in kept] == ["a"]
    assert audit.excluded_by_date == 2


@settings(max_examples=300, deadline=None)
@given(
    tz=st.sampled_from(TIMEZONES),
    cutoff=st.dates(min_value=dt.date(1990, 1, 1), max_value=dt.date(2030, 12, 31)),
    offsets=st.lists(st.integers(min_value=-3 * 86400, max_value=3 * 86400), min_size=1, max_size=30),
    doc_tz=st.sampled_from(TIMEZONES + [None]),
)
def test_filter_never_keeps_a_document_after_the_cutoff(tz, cutoff, offsets, doc_tz):
    """Property: kept ⇔ local date (in the spec's timezone) ≤ cutoff, for timestamps written in any zone."""
    end_local = dt.datetime.combine(cutoff + dt.timedelta(days=1), dt.time(0), tzinfo=zoneinfo.ZoneInfo(tz))
    docs = []
    for i, off in enumerate(offsets):
        instant = end_local + dt.timedelta(seconds=off)
        if doc_tz is None:  # naive string, read in the spec's timezone
            s = instant.astimezone(zoneinfo.ZoneInfo(tz)).replace(tzinfo=None).isoformat()
        else:
            s = instant.astimezone(zoneinfo.ZoneInfo(doc_tz)).isoformat()
        docs.append(Document(f"d{i}", "text", parse_timestamp(s, tz), i + 1))
    try:
        kept, audit = filter_corpus(docs, cutoff, tz)
    except CorpusError:
        kept = []
        audit = None
    limit = cutoff_instant(cutoff, tz)
    for d in kept:
        assert d.timestamp < limit
        assert d.timestamp.tz_convert(tz).date() <= cutoff
    expected = {d.id for d in docs if d.timestamp.tz_convert(tz).date() <= cutoff}
    assert {d.id for d in kept} == expected
    if audit is not None:
        assert audit.included + audit.excluded_by_date == len(docs)


def test_missing_timestamp_is_an_error_naming_the_row(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("date,text\n2016-01-05,first\n,second\n2016-02-01,third\n")
    docs = read_corpus(f, "csv", "text", "date", "UTC")
    with pytest.raises(CorpusError) as err:
        filter_corpus(docs, dt.date(2016, 12, 31), "UTC", source=str(f))
    assert str(err.value) == (f"{f}: row 2 (line 3, id 'row-2'): missing timestamp (field 'date' is empty); fix the row, or "
                              "set spec.corpus.onMissingTimestamp: drop to count and skip it")


def test_unparseable_timestamp_error_names_file_row_id_value_and_format(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("id,date,text\na,2016-01-05,first\nb,1609426799000,second\n")
    docs = read_corpus(f, "csv", "text", "date", "UTC", "id")
    with pytest.raises(CorpusError) as err:
        filter_corpus(docs, dt.date(2016, 12, 31), "UTC", source=str(f))
    assert str(err.value) == (f"{f}: row 2 (line 3, id 'b'): timestamp '1609426799000' does not match ISO 8601: YYYY-MM-DD or "
                              "YYYY-MM-DDTHH:MM[:SS[.fff]], optionally ending in Z, ±HH:MM, ±HHMM or ±HH; set "
                              "spec.corpus.timestampFormat (e.g. \"%d/%m/%Y\") for another format; fix the row, or "
                              "set spec.corpus.onMissingTimestamp: drop to count and skip it")
    docs = read_corpus(f, "csv", "text", "date", "UTC", "id", "epoch_ms")
    with pytest.raises(CorpusError, match=r"row 1 \(line 2, id 'a'\): timestamp '2016-01-05' does not match epoch_ms"):
        filter_corpus(docs, dt.date(2016, 12, 31), "UTC", source=str(f), timestamp_format="epoch_ms")


def test_drop_counts_missing_and_unparseable(tmp_path):
    f = tmp_path / "c.jsonl"
    rows = [{"id": "a", "ts": "2016-01-05", "body": "one"}, {"id": "b", "ts": None, "body": "two"},
            {"id": "c", "ts": "not a date", "body": "three"}, {"id": "d", "ts": "2017-03-01", "body": "four"}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    docs = read_corpus(f, "jsonl", "body", "ts", "UTC", id_field="id")
    kept, audit = filter_corpus(docs, dt.date(2016, 12, 31), "UTC", "drop")
    assert [d.id for d in kept] == ["a"]
    assert (audit.included, audit.excluded_by_date, audit.rejected_timestamp) == (1, 1, 2)
    import hashlib
    assert audit.included_ids_sha256 == hashlib.sha256(b"a").hexdigest()
    # the audit lists the dropped documents with their values
    assert audit.rejected_timestamp_examples == [
        {"row": 2, "id": "b", "value": "", "error": "missing timestamp (field 'ts' is empty)"},
        {"row": 3, "id": "c", "value": "not a date",
         "error": "timestamp 'not a date' does not match ISO 8601: YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS[.fff]], "
                  "optionally ending in Z, ±HH:MM, ±HHMM or ±HH; set spec.corpus.timestampFormat (e.g. \"%d/%m/%Y\") for another "
                  "format"}]
    assert audit.timestamp_format == "iso8601"


def test_drop_lists_only_the_first_few_refused_timestamps(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("date,text\n2016-01-05,a\n" + "".join(f"{d:02d}/01/2016,x\n" for d in range(1, 9)))
    docs = read_corpus(f, "csv", "text", "date", "UTC")
    kept, audit = filter_corpus(docs, dt.date(2016, 12, 31), "UTC", "drop")
    assert audit.rejected_timestamp == 8 and len(kept) == 1
    assert [(x["row"], x["value"]) for x in audit.rejected_timestamp_examples] == [
        (2, "01/01/2016"), (3, "02/01/2016"), (4, "03/01/2016"), (5, "04/01/2016"), (6, "05/01/2016")]


def test_no_document_before_cutoff(tmp_path):
    f = tmp_path / "late.csv"
    f.write_text("date,text\n2020-01-01,a\n2021-01-01,b\n")
    docs = read_corpus(f, "csv", "text", "date", "UTC")
    with pytest.raises(CorpusError, match=r"no document at or before the knowledge cutoff 2016-12-31.*2 documents"):
        filter_corpus(docs, dt.date(2016, 12, 31), "UTC", source=str(f))


def test_missing_column_and_duplicate_id(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("when,text\n2016-01-05,a\n")
    with pytest.raises(CorpusError, match=r"no field 'date' \(spec.corpus.timestampField\)"):
        read_corpus(f, "csv", "text", "date", "UTC")
    g = tmp_path / "d.csv"
    g.write_text("id,date,text\nx,2016-01-05,a\nx,2016-01-06,b\n")
    with pytest.raises(CorpusError, match=r"row 2: duplicate id 'x' \(first seen at row 1\)"):
        read_corpus(g, "csv", "text", "date", "UTC", id_field="id")


def test_messages_give_timestamps_in_the_cutoffs_timezone(tmp_path):
    """Found by a new user: the cutoff was named in America/New_York, the earliest timestamp in UTC."""
    f = tmp_path / "late.csv"
    f.write_text("date,text\n2017-06-14,a\n2018-01-02T09:30:00+00:00,b\n")
    docs = read_corpus(f, "csv", "text", "date", "America/New_York")
    with pytest.raises(CorpusError) as err:
        filter_corpus(docs, dt.date(2016, 12, 31), "America/New_York", source=str(f))
    assert str(err.value) == (f"{f}: no document at or before the knowledge cutoff 2016-12-31 (America/New_York); "
                              "2 documents read, earliest timestamp 2017-06-14T00:00:00-04:00")
    # the audit keeps UTC
    docs = read_corpus(f, "csv", "text", "date", "America/New_York")
    _, audit = filter_corpus(docs, dt.date(2017, 12, 31), "America/New_York")
    assert audit.max_included_timestamp == "2017-06-14T04:00:00+00:00"


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_utf8_byte_order_mark_is_not_part_of_the_first_field(tmp_path, fmt):
    """Found by a new user: a CSV saved by Excel failed with no field 'id' ... '\\ufeffid'."""
    f = tmp_path / f"c.{fmt}"
    body = ("id,date,text\nx,2016-01-05,one\n" if fmt == "csv"
            else json.dumps({"id": "x", "date": "2016-01-05", "text": "one"}) + "\n")
    f.write_bytes(b"\xef\xbb\xbf" + body.encode())
    docs = read_corpus(f, fmt, "text", "date", "UTC", id_field="id")
    assert [(d.id, d.text, d.timestamp.isoformat()) for d in docs] == [("x", "one", "2016-01-05T00:00:00+00:00")]


def test_warnings_for_a_cutoff_after_the_latest_document_or_today(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("date,text\n2016-01-05,a\n2016-03-01T23:30:00,b\n")
    docs = read_corpus(f, "csv", "text", "date", "America/New_York")
    _, audit = filter_corpus(docs, dt.date(2016, 3, 1), "America/New_York", today=dt.date(2026, 12, 1))
    assert audit.warnings == []  # the latest document is on the cutoff day
    _, audit = filter_corpus(docs, dt.date(2016, 3, 2), "America/New_York", today=dt.date(2026, 12, 1))
    assert audit.warnings == ["knowledge cutoff 2016-03-02 is after the latest document (2016-03-01T23:30:00-05:00): "
                              "no document was excluded, so the corpus, not the cutoff, ends what the model knows"]
    _, audit = filter_corpus(docs, dt.date(2027, 1, 1), "America/New_York", today=dt.date(2026, 12, 1))
    assert audit.warnings[1] == ("knowledge cutoff 2027-01-01 is after today (2026-12-01, America/New_York): "
                                 "documents added to the corpus later, up to the cutoff, would be kept")


def test_warnings_for_documents_after_today_and_repeated_documents(tmp_path):
    """Found by a quant's trial: a document dated 2099 and an exact copy of another were accepted without a word."""
    f = tmp_path / "c.csv"
    f.write_text("id,date,text\na,2016-01-05,one\nb,2016-01-06,two\nc,2099-01-05,three\nd,2016-01-05,one\n"
                 "e,2016-01-07,one\n")
    docs = read_corpus(f, "csv", "text", "date", "UTC", id_field="id")
    kept, audit = filter_corpus(docs, dt.date(2016, 12, 31), "UTC", today=dt.date(2026, 12, 5))
    assert [d.id for d in kept] == ["a", "b", "d", "e"]  # the copy is kept (and counted): a warning, not a drop
    assert audit.warnings == [
        "1 document(s) dated after today (2026-12-05, UTC; first: row 3, id 'c', 2099-01-05T00:00:00+00:00): no "
        "document can be published in the future, so the dates may be wrong (e.g. a mistyped year); dated after the "
        "cutoff, they are left out",
        "1 document(s) repeat the text and timestamp of an earlier one (first: row 4, id 'd' repeats row 1, id 'a'): "
        "each copy is trained on"]


def test_fomc_demo_corpus_has_no_warnings(data_root):
    src = data_root / "fomc_statements" / "fomc_statements_1994_2026.csv"
    docs = read_corpus(src, "csv", "text", "date", "America/New_York")
    _, audit = filter_corpus(docs, dt.date(2016, 12, 31), "America/New_York")
    assert audit.warnings == [] and audit.timestamp_format == "iso8601" and audit.rejected_timestamp_examples == []


def test_epoch_values_before_1980_suggest_the_wrong_unit(tmp_path):
    f = tmp_path / "c.jsonl"
    # seconds given as epoch_ms: every document reads as January 1970 and would be kept
    f.write_text("".join(json.dumps({"t": t, "text": "x"}) + "\n" for t in (1609426799, 1700000000)))
    docs = read_corpus(f, "jsonl", "text", "t", "UTC", timestamp_format="epoch_ms")
    kept, audit = filter_corpus(docs, dt.date(2016, 12, 31), "UTC", timestamp_format="epoch_ms",
                                today=dt.date(2026, 12, 1))
    assert len(kept) == 2 and audit.timestamp_format == "epoch_ms"
    assert audit.warnings[-1] == ("2 timestamps read as epoch_ms fall before 1980 (earliest "
                                  "1970-01-19T15:03:46.799000+00:00); are the numbers in another unit?")


def test_a_json_epoch_number_is_read_from_its_digits(tmp_path):
    """A JSON number with a fraction was read as the nearest float: 1609426799.123456789 s became ...123456716 ns
    after the second, a time the file does not state; now the digits are read, and a value finer than a
    nanosecond is refused with the digits written."""
    f = tmp_path / "c.jsonl"
    f.write_text('{"t": 1609426799.123456789, "text": "a"}\n{"t": 1.6094267991e9, "text": "b"}\n'
                 '{"t": 1609426799.1234567891, "text": "c"}\n')
    a, b, c = read_corpus(f, "jsonl", "text", "t", "UTC", timestamp_format="epoch_s")
    assert a.timestamp == pd.Timestamp("2020-12-31T14:59:59.123456789Z") and a.timestamp_error is None
    # the float alone: 1609426799.1234567 s, 89 ns earlier than written
    assert parse_timestamp(1609426799.123456789, "UTC", "epoch_s") == a.timestamp - pd.Timedelta(89, "ns")
    assert b.timestamp == pd.Timestamp("2020-12-31T14:59:59.1Z")
    assert c.timestamp is None and c.timestamp_value == "1609426799.1234567891"
    assert c.timestamp_error == ("timestamp 1609426799.1234567891 as seconds since 1970 is not a whole number of "
                                 "nanoseconds; pitlab reads time to the nanosecond, and rounding would be a guess")


def test_a_refused_timestamp_format_names_the_field(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("date,text\n2016-01-05,a\n")
    with pytest.raises(CorpusError, match=r"spec.corpus.timestampFormat: '%d/%m/%y': %y \(two-digit year\)"):
        read_corpus(f, "csv", "text", "date", "UTC", timestamp_format="%d/%m/%y")


def test_a_semicolon_separated_file_is_named_as_such(tmp_path):
    """Found by a quant's trial: a ';'-separated corpus or panel was refused without a word about the separator."""
    from pitlab.data.panels import load_ohlcv_long

    f = tmp_path / "c.csv"
    f.write_text("id;date;text\na;2016-01-05;one\n")
    with pytest.raises(CorpusError, match=r"fields present: \['id;date;text'\]; the header is one field holding "
                                          r"';': pitlab reads comma-separated files"):
        read_corpus(f, "csv", "text", "date", "UTC")
    p = tmp_path / "p.csv"
    p.write_text("date\topen\thigh\tlow\tclose\tvolume\tName\n2016-01-05\t1\t1\t1\t1\t1\tA\n")
    with pytest.raises(PanelError, match="the header is one field holding tabs: pitlab reads comma-separated files"):
        load_ohlcv_long(p)


@pytest.mark.parametrize("body, message", [
    # an unclosed quote swallowing the next row: its 2020 text would train under the 2010 date
    ('a,2010-01-01,"Doc A about rates\nb,2020-03-15,Doc B dated 2020"\nc,2011-01-01,fine\n',
     r"row 1 \(lines 2-3\): a quoted field runs over line 3, which reads as a row of its own "
     r"\('b,2020-03-15,Doc B dated 2020\"'\): an unclosed quote would train on that row's text under this row's date"),
    ('q1,2010-01-01,"he said "hi" there"\n', r"line 2: not valid CSV \(',' expected after '\"'\)"),
    ('q1,2010-01-01,ok\nq2,2010-01-02,"unclosed\n', r"line 3: not valid CSV \(unexpected end of data\)"),
    (',2010-01-01,a\n', r"row 1: empty id \(field 'id', spec.corpus.idField\): every document needs one"),
])
def test_csv_quotes_and_ids_that_cannot_be_read_unambiguously_are_refused(tmp_path, body, message):
    """Found by a trial: a CSV read leniently (csv's strict=False) let one row swallow the next."""
    f = tmp_path / "c.csv"
    f.write_text("id,date,text\n" + body)
    with pytest.raises(CorpusError, match=message):
        read_corpus(f, "csv", "text", "date", "UTC", id_field="id")


def test_a_quoted_text_over_several_lines_is_read_whole(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text('id,date,text\nm,2010-01-01,"line one\nline two, with a comma\n2015 was a year"\n')
    docs = read_corpus(f, "csv", "text", "date", "UTC", id_field="id")
    assert [d.text for d in docs] == ["line one\nline two, with a comma\n2015 was a year"]


@pytest.mark.parametrize("line, message", [
    ('{"id": "x", "date": "2010-01-01", "text": 12345}', r"line 1 \(id 'x'\): field 'text' is a JSON int, not a "
                                                           r"string: '12345'"),
    ('{"id": "x", "date": "2010-01-01", "text": ["a", "b"]}', "field 'text' is a JSON list, not a string"),
    ('{"id": null, "date": "2010-01-01", "text": "a"}', r"line 1: empty id \(field 'id'"),
    ('{"id": 1.5, "date": "2010-01-01", "text": "a"}', "id 1.5 is a JSON float: an id is a string or an integer"),
    ('{"id": "x", "date": "2010-01-01", "text": "a\\ud800b"}', r"holds '\\ud800' at character 1, an unpaired "
                                                                "surrogate"),
])
def test_jsonl_values_of_another_type_are_refused(tmp_path, line, message):
    """Found by a trial: a number, a list or a dict as the text was trained on as its Python str()."""
    f = tmp_path / "c.jsonl"
    f.write_text(line + "\n")
    with pytest.raises(CorpusError, match=message):
        read_corpus(f, "jsonl", "text", "date", "UTC", id_field="id")


def test_a_csv_error_names_the_file_line_beside_the_row():
    """Found in a trial: 'row 151' is line 152 of the file, further on after a quoted line break; an editor
    shows lines. The row keeps its number (the id of a file without ids is row-N), the line is added."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "c.csv"
        f.write_text('date,text\n2016-01-05,"first\nline two\nline three"\n2016-01-06,second\nbad,third\n')
        docs = read_corpus(f, "csv", "text", "date", "UTC")
        assert [(d.row, d.line) for d in docs] == [(1, 2), (2, 5), (3, 6)]
        with pytest.raises(CorpusError) as err:
            filter_corpus(docs, dt.date(2016, 12, 31), "UTC", source=str(f))
        assert str(err.value).startswith(f"{f}: row 3 (line 6, id 'row-3'): timestamp 'bad' does not match ISO 8601")
        j = Path(tmp) / "c.jsonl"
        j.write_text('{"date": "2016-01-05", "text": "a"}\n\n{"date": "bad", "text": "b"}\n')
        with pytest.raises(CorpusError) as err:
            filter_corpus(read_corpus(j, "jsonl", "text", "date", "UTC"), dt.date(2016, 12, 31), "UTC", source=str(j))
        assert str(err.value).startswith(f"{j}: row 3 (id 'row-3'): timestamp 'bad'")  # JSONL: the row is the line


@pytest.mark.parametrize("fmt, later", [("%m/%d/%Y", "01/05/2017"), ("%d %b %Y", "05 Jan 2017"),
                                        ("%Y/%m/%d %H:%M", "2017/01/05 09:30")])
def test_an_unclosed_quote_swallowing_a_row_is_refused_in_any_timestamp_format(tmp_path, fmt, later):
    """Found by a trial: with a strftime timestampFormat a swallowed row (dated after the cutoff) was read as part
    of the earlier row's text, since only ISO dates and epoch numbers were recognised as a row's start."""
    first = dt.datetime(2016, 12, 30, 9, 30).strftime(fmt)
    f = tmp_path / "c.csv"
    f.write_text(f'date,text\n{first},"Statement A begins\n{later},Secret future text\n'
                 f'{dt.datetime(2016, 12, 31, 9, 30).strftime(fmt)},more text"\n')
    with pytest.raises(CorpusError, match=r"row 1 \(lines 2-4\): a quoted field runs over line 3, which reads as a "
                                          rf"row of its own \('{later},Secret future text'\)"):
        read_corpus(f, "csv", "text", "date", "America/New_York", timestamp_format=fmt)
    f.write_text(f'date,text\n{first},"Statement A begins\nnot a date,continued\nend"\n')  # no row of its own
    docs = read_corpus(f, "csv", "text", "date", "America/New_York", timestamp_format=fmt)
    assert [d.text for d in docs] == ["Statement A begins\nnot a date,continued\nend"]


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_jsonl_nan_is_refused_not_read_as_missing(tmp_path, constant):
    """Found by a trial: ``{"date": NaN}`` (not JSON; Python's reader takes it) read as an empty timestamp."""
    f = tmp_path / "c.jsonl"
    f.write_text('{"id": "a", "date": "2010-01-01", "text": "ok"}\n'
                 f'{{"id": "b", "date": {constant}, "text": "x"}}\n')
    with pytest.raises(CorpusError, match=rf"c.jsonl: line 2: {constant} is not a JSON value \(JSON has no NaN or "
                                          r"Infinity\); write null for a missing value"):
        read_corpus(f, "jsonl", "text", "date", "UTC", id_field="id")


def test_a_compressed_corpus_is_named_as_such(tmp_path):
    """Found by a trial: a gzipped corpus got the hint "Latin-1 or Windows-1252 text ... set spec.corpus.encoding"."""
    import gzip

    f = tmp_path / "c.csv"
    f.write_bytes(gzip.compress(b"date,text\n2010-01-01,hello\n"))
    with pytest.raises(CorpusError, match=r"c.csv: the file is gzip-compressed \(it starts with bytes 1f 8b 08 00\), "
                                          "not text: decompress it and give the uncompressed file"):
        read_corpus(f, "csv", "text", "date", "UTC")
