"""Market panels: long OHLCV CSV and Kaggle JPX files → daily prices → targets → a sampled evaluation panel.

Target (JPX definition): ``r[t] = adj[t+2] / adj[t+1] - 1``, where t+1 and t+2 are the next two trading days
of the panel's calendar (not the next rows of the sample) and ``adj`` is the competition's adjusted close
(:func:`jpx_adjusted_close`). It is computed from the full price history and attached to row t; nothing about
t+1 or t+2 enters the prompt of row t.

Prompt features are computed *as of t* (:func:`compute_features`): the close and volume printed are the day's
own values, and returns and volume ratios over days ≤ t are adjusted only with the splits effective on or
before t. The competition's cumulative factor of day d, ``prod(F[e] for e >= d)``, multiplies every split
up to the end of the file and so is not known at t; what is known at t is its ratio to the cumulative
factor of t, ``prod(F[e] for d <= e < t)``: the splits whose factor rows lie in [d, t). A factor dated t
itself (the split is effective on t+1) converts day t to the next day's share count and is not needed to
express days ≤ t in the shares of t.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pitlab.data.encoding import decode_problem, separator_hint
from pitlab.errors import PanelError

OHLCV_COLUMNS = ("date", "open", "high", "low", "close", "volume", "Name")  # a long OHLCV file (sp500_5yr)
OHLCV_READ = ("date", "close", "volume", "Name")  # what pitlab reads of it, and requires: open/high/low are not read
JPX_PRICE_COLUMNS = ("RowId", "Date", "SecuritiesCode", "Open", "High", "Low", "Close", "Volume",
                     "AdjustmentFactor", "ExpectedDividend", "SupervisionFlag", "Target")
JPX_LIST_COLUMNS = ("SecuritiesCode", "Name")
JPX_COMPARED = ("Close", "Volume", "AdjustmentFactor")
"""The stock_prices.csv values pitlab uses; a (Date, SecuritiesCode) row in both train_files/ and
supplemental_files/ must agree on them."""
HISTORY_DAYS = 20  # trading days of history the prompt features need
CSV_OPTIONS = {"encoding": "utf-8-sig", "keep_default_na": False, "na_values": [""], "dtype": str}
"""How every panel CSV is read: as text (numbers are parsed by pitlab, so an error quotes the file's own value);
a UTF-8 byte-order mark is dropped; only an empty field is a missing value (``n/a``, ``NA``, ``NaN``, ``-`` in
a numeric column are refused with the row, never read as missing)."""

JPX_ADJUSTMENT = ("Kaggle JPX: Close and Volume as traded that day (unadjusted); prompts are adjusted as of t with "
                  "the AdjustmentFactor rows dated before t only; targets use the competition's adjusted close "
                  "(cumulative AdjustmentFactor over the whole file)")
OHLCV_ADJUSTMENT = ("long OHLCV file: prices and volumes as the file gives them, possibly adjusted by its source "
                    "with splits after t, which pitlab cannot undo (sp500_5yr's are: split-adjusted as of "
                    "February 2018); returns and volume ratios are unaffected by such an adjustment, levels are not")


@dataclass
class Prices:
    """Daily prices of a market. ``close``/``volume``: DataFrame [trading day × security], float64, NaN where a
    security has no price that day: the day's own values as the file gives them (JPX: unadjusted).
    ``factor``: JPX ``AdjustmentFactor`` [trading day × security] (1.0 where none; the factor of day d applies
    to d and earlier days), ``None`` for files without factors. ``names``: security → display name.
    ``calendar``: every trading day. ``levels_as_of_t``: the close and volume levels are the ones traded at t
    (JPX) rather than adjusted by the file's source with later events (long OHLCV)."""

    close: pd.DataFrame
    volume: pd.DataFrame
    names: dict[str, str]
    calendar: pd.DatetimeIndex
    source: str
    universe0: frozenset[str] | None = None
    """JPX only: codes with ``Universe0`` true in stock_list.csv (a December 2021 snapshot), if the column exists."""
    factor: pd.DataFrame | None = None
    levels_as_of_t: bool = False
    info: dict = field(default_factory=dict)
    """For the results' dataset section: kind, files, how prices are adjusted."""


Headers = Mapping[Path, tuple[str, ...]]
"""Columns of CSV files whose header was already read (:func:`check_csv_columns`), by file path."""


def _such_rows(n: int) -> str:
    """``"1 such row"`` or ``"n such rows"``: how many rows of a file share the error a message names."""
    return f"{n} such row" + ("" if n == 1 else "s")


def check_csv_columns(path: Path, required: tuple[str, ...], header: tuple[str, ...] | None = None,
                      **kw) -> tuple[str, ...]:
    """Read only the header of a CSV (a UTF-8 byte-order mark is allowed; ``header``: the columns already read,
    not read again) and return its columns. Raises :class:`PanelError` naming the file if it is missing,
    unreadable or lacks any of ``required`` (the message lists the missing and the present columns)."""
    if header is None:
        if not path.is_file():
            raise PanelError(f"{path}: file not found")
        try:  # the header row as written (pandas would rename a second 'close' to 'close.1')
            raw = pd.read_csv(path, nrows=1, header=None, **{**CSV_OPTIONS, **kw})
        except UnicodeDecodeError:
            raise PanelError(_decode_problem(path)) from None
        except pd.errors.EmptyDataError:
            raise PanelError(f"{path}: empty file (no header row)") from None
        except (ValueError, pd.errors.ParserError, OSError, EOFError) as err:
            raise PanelError(f"{path}: cannot read as CSV ({err})") from None
        header = tuple("" if pd.isna(c) else str(c) for c in raw.iloc[0]) if len(raw) else ()
        twice = sorted({c for c in header if header.count(c) > 1})
        if twice:
            where = "; ".join(f"{c!r} (columns {', '.join(str(i + 1) for i, h in enumerate(header) if h == c)})"
                              for c in twice)
            raise PanelError(f"{path}: header: column name(s) given twice: {where}; a reader would keep one of "
                             "them silently: rename or remove the other")
    missing = [c for c in required if c not in header]
    if missing:
        raise PanelError(f"{path}: missing column(s) {missing}; found {list(header)}{separator_hint(header)}")
    return header


def _record_lines(path: Path, n_fields: int) -> np.ndarray:
    """The line (1-based, of the file as text) on which each data record of a CSV starts, in order, blank lines
    skipped as the reader skips them; int64 [records]. Raises :class:`PanelError` naming the record and its line
    when its field count is not the header's ``n_fields`` (a reader keeping only some columns would otherwise
    read such a row shifted: a decimal comma in one field moves the next field's value into the Name column).
    Plain files are counted with numpy (:func:`_plain_record_lines`), others read with the csv module."""
    fast = _plain_record_lines(path, n_fields)
    return fast if fast is not None else _csv_record_lines(path, n_fields)


def _csv_record_lines(path: Path, n_fields: int) -> np.ndarray:
    """:func:`_record_lines` as Python's csv module reads the file (quoted fields, records over several lines)."""
    import csv

    from pandas.io.common import get_handle

    lines: list[int] = []
    with get_handle(path, "r", encoding=CSV_OPTIONS["encoding"], compression="infer") as h:
        reader = csv.reader(h.handle)
        try:
            next(reader, None)  # the header, checked by check_csv_columns
            start = reader.line_num + 1
            for values in reader:
                if values:
                    if len(values) != n_fields:
                        why = ("a field with a comma must be quoted, and a decimal comma is not a number here"
                               if len(values) > n_fields else "give every field (empty where a value is missing)")
                        raise PanelError(f"{path}: row {len(lines) + 1} (line {start}): {len(values)} fields, the "
                                         f"header has {n_fields}: {','.join(values)!r}; {why}")
                    lines.append(start)
                start = reader.line_num + 1
        except csv.Error as err:
            raise PanelError(f"{path}: line {reader.line_num}: not valid CSV ({err})") from None
    return np.asarray(lines, dtype=np.int64)


def _plain_record_lines(path: Path, n_fields: int) -> np.ndarray | None:
    """:func:`_record_lines` of a file with no quote, carriage return or NUL byte, where a record is one line and its
    fields are its commas + 1, counted with numpy over the whole file (bench/price_load.py times it against
    :func:`_csv_record_lines`); ``None`` when the file has such a byte or a record whose field count is not
    ``n_fields`` (the csv module then reads it and names the row). Raises UnicodeDecodeError as a text reader
    would."""
    from pandas.io.common import get_handle

    with get_handle(path, "rb", compression="infer", is_text=False) as h:
        data = h.handle.read()
    if b'"' in data or b"\r" in data or b"\0" in data:
        return None
    data.decode("utf-8")  # raises UnicodeDecodeError as the text reader would
    raw = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(raw == ord("\n"))
    if len(data) and data[-1:] != b"\n":
        ends = np.append(ends, len(data))  # a last line without a newline
    starts = np.concatenate(([0], ends[:-1] + 1))
    commas = np.diff(np.searchsorted(np.flatnonzero(raw == ord(",")), ends), prepend=0)  # commas per line
    records = np.flatnonzero(ends > starts)  # a blank line is no record, as the csv module skips it
    records = records[records > 0]  # line 1: the header
    if (commas[records] != n_fields - 1).any():
        return None
    return (records + 1).astype(np.int64)


def _where(df: pd.DataFrame, i: int) -> str:
    """``"row i+1 (line L)"`` for the ``i``-th data row of a frame read by :func:`_read_csv` (``"row i+1"``
    when its line numbers are not known)."""
    return f"row {i + 1}" + (f" (line {int(df['_line'].iloc[i])})" if "_line" in df.columns else "")


def _read_csv(path: Path, required: tuple[str, ...], used: tuple[str, ...] | None = None,
              headers: Headers | None = None) -> pd.DataFrame:
    """The columns ``used`` (default: ``required``) of a CSV whose header has every ``required`` column (the
    header read here unless ``headers`` has it), with each row's line in the file in column ``_line``.
    Raises :class:`PanelError` for a row whose field count is not the header's (:func:`_record_lines`) and for
    a file with a header but no data row."""
    header = check_csv_columns(path, required, (headers or {}).get(path))
    keep = set(used or required)
    try:
        lines = _record_lines(path, len(header))  # its PanelError (a ValueError) names the row as it is
    except UnicodeDecodeError:
        raise PanelError(_decode_problem(path)) from None
    except (OSError, EOFError) as err:
        raise PanelError(f"{path}: cannot read as CSV ({err})") from None
    try:
        df = pd.read_csv(path, usecols=lambda c: c in keep, **CSV_OPTIONS)
    except UnicodeDecodeError:
        raise PanelError(_decode_problem(path)) from None
    except (ValueError, pd.errors.ParserError, OSError, EOFError) as err:
        raise PanelError(f"{path}: cannot read as CSV ({err})") from None
    if df.empty:
        raise PanelError(f"{path}: a header but no data row")
    if len(lines) != len(df):  # the two readers disagree on where records end: refuse rather than guess
        raise PanelError(f"{path}: {len(df)} rows read by pandas but {len(lines)} CSV records; check its quoting")
    df["_line"] = lines
    return df


def _decode_problem(path: Path) -> str:
    """Where a panel file stops being UTF-8 (line and byte offset; compressed files: pandas' own words)."""
    if path.suffix in (".gz", ".bz2", ".zip", ".xz", ".zst"):
        return f"{path}: not UTF-8 text once decompressed; panel files are UTF-8 CSV"
    return decode_problem(path, "utf-8").replace("convert the file to UTF-8", "panel files are UTF-8 CSV: convert it")


def _first_bad(mask: pd.Series) -> int:
    return int(np.flatnonzero(mask.to_numpy())[0])


def _parse_dates(df: pd.DataFrame, col: str, path: Path) -> pd.Series:
    """Column ``col`` as datetime64: every value exactly YYYY-MM-DD (``2016-10-3`` is refused too, as a date
    written some other way than the file's others), else :class:`PanelError` naming the row, line and value."""
    codes, days = pd.factorize(df[col])  # each distinct text parsed once (1,259 days for 619,040 rows)
    ok = pd.to_datetime(days, format="%Y-%m-%d", errors="coerce")
    ok = ok.where(days.str.fullmatch(r"\d{4}-\d{2}-\d{2}"))
    parsed = pd.Series(ok.take(codes, allow_fill=True), index=df.index, name=col)
    bad = parsed.isna()
    if bad.any():
        i = _first_bad(bad)
        value = df[col].iloc[i]
        what = "empty date" if pd.isna(value) else f"unparseable date {value!r}"
        raise PanelError(f"{path}: {_where(df, i)}: column {col!r}: {what}, expected YYYY-MM-DD "
                         f"({_such_rows(int(bad.sum()))})")
    return parsed


def _numeric(df: pd.DataFrame, col: str, path: Path, minimum: str | None = None) -> pd.Series:
    """Column ``col`` as float64; an empty field is NaN (missing). Anything else that is not a finite number
    (``n/a``, ``NaN``, ``inf``), or a number outside ``minimum`` (``"> 0"`` or ``">= 0"``), is refused naming
    the row and the file's value."""
    vals = pd.to_numeric(df[col], errors="coerce").astype("float64")
    bad = df[col].notna() & ~np.isfinite(vals)
    what = "not a finite number"
    if minimum is not None and not bad.any():
        bad = vals.notna() & ((vals <= 0) if minimum == "> 0" else (vals < 0))
        what = f"must be {minimum}"
    if bad.any():
        i = _first_bad(bad)
        raise PanelError(f"{path}: {_where(df, i)}: column {col!r}: {what}: {df[col].iloc[i]!r} "
                         f"({_such_rows(int(bad.sum()))}; leave the field empty where a value is missing)")
    return vals


def _check_ids(df: pd.DataFrame, col: str, path: Path) -> None:
    """Refuse security ids that a reader could take for one another: one with leading or trailing whitespace,
    or two that differ only in letter case (``GE`` and ``ge``): each would be a security of its own, and the
    rows of one security would split between two; an empty id too. Raises :class:`PanelError` naming the row,
    line and value."""
    ids = df[col]
    if ids.isna().any():
        raise PanelError(f"{path}: {_where(df, _first_bad(ids.isna()))}: column {col!r} is empty "
                         f"({_such_rows(int(ids.isna().sum()))})")
    codes, distinct = pd.factorize(ids)  # each distinct id checked once (an empty one was refused above)
    distinct = pd.Series(distinct)
    padded = pd.Series((distinct.str.strip() != distinct).to_numpy()[codes], index=ids.index)
    if padded.any():
        i = _first_bad(padded)
        raise PanelError(f"{path}: {_where(df, i)}: column {col!r}: {ids.iloc[i]!r} has leading or trailing "
                         f"whitespace ({_such_rows(int(padded.sum()))}); the same security written with and without "
                         "it would be two securities")
    folded = distinct.str.casefold()
    clash = folded.duplicated(keep=False)
    if clash.any():
        same = sorted(distinct[folded == folded[clash].iloc[0]])
        i = _first_bad(ids == same[1])
        raise PanelError(f"{path}: {_where(df, i)}: column {col!r}: {same[1]!r} differs from {same[0]!r} only in "
                         "letter case; write each security one way")


def _check_unique(df: pd.DataFrame, keys: list[str], path: Path) -> None:
    dup = df.duplicated(keys, keep=False)
    if dup.any():
        first = np.flatnonzero(dup.to_numpy())[:2]
        at = f" (lines {', '.join(str(int(df['_line'].iloc[i])) for i in first)})" if "_line" in df.columns else ""
        key = tuple(str(x.date()) if isinstance(x, pd.Timestamp) else x for x in df.loc[dup, keys].iloc[0])
        raise PanelError(f"{path}: rows {(first + 1).tolist()}{at}: duplicate ({', '.join(keys)}) = "
                         f"{key if len(key) > 1 else key[0]!r}")


def load_ohlcv_long(path: str | Path, headers: Headers | None = None) -> Prices:
    """Read a long OHLCV CSV (optionally .gz): its columns date, close, volume and Name (open, high, low and any
    other column are neither required nor read).

    This is the format of ``sp500_5yr/sp500_5yr_ohlcv_long.csv.gz`` (split-adjusted by its source). An empty
    close stays NaN (no price that day). Raises :class:`PanelError` naming the file, column, row and value for
    a missing column, an unparseable date, a close that is not a number > 0 (``n/a`` included), a volume that
    is not a number ≥ 0, an empty Name or a duplicate (date, Name). ``headers``: the file's header, when a
    preflight already read it.
    """
    p = Path(path)
    df = _read_csv(p, OHLCV_READ, OHLCV_READ, headers)
    df["date"] = _parse_dates(df, "date", p)
    df["close"] = _numeric(df, "close", p, "> 0")
    df["volume"] = _numeric(df, "volume", p, ">= 0")
    if df["Name"].isna().any():
        raise PanelError(f"{p}: {_where(df, _first_bad(df['Name'].isna()))}: column 'Name' is empty")
    _check_ids(df, "Name", p)
    _check_unique(df, ["date", "Name"], p)
    close = df.pivot(index="date", columns="Name", values="close").sort_index()
    volume = df.pivot(index="date", columns="Name", values="volume").reindex(close.index)
    names = {s: s for s in close.columns}
    return Prices(close=close, volume=volume, names=names, calendar=pd.DatetimeIndex(close.index), source=str(p),
                  info={"kind": "ohlcv", "files": [str(p)], "adjustment": OHLCV_ADJUSTMENT})


def jpx_adjusted_close(prices: pd.DataFrame) -> pd.Series:
    """The competition's adjusted close for Kaggle JPX ``stock_prices.csv`` rows (one security or many).

    ``AdjustmentFactor`` on day d (e.g. 0.5 for a 1:2 split effective the next day) scales the close of d
    and every earlier day of that security: adjusted close = Close × product of the factors of all days ≥ d
    (the cumulative adjustment of the competition's Target, computed in descending date order; its demo
    notebook also rounds to 0.1 yen, which pitlab does not). It uses splits after d: for targets only, never
    for prompts. Missing Close stays NaN. Input columns: Date (datetime64), SecuritiesCode, Close,
    AdjustmentFactor. Returns a float64 Series aligned with ``prices``.
    """
    df = prices[["Date", "SecuritiesCode", "Close", "AdjustmentFactor"]].copy()
    df["AdjustmentFactor"] = df["AdjustmentFactor"].fillna(1.0)
    df = df.sort_values(["SecuritiesCode", "Date"], ascending=[True, False])
    cum = df.groupby("SecuritiesCode", sort=False)["AdjustmentFactor"].cumprod()
    return (df["Close"] * cum).reindex(prices.index)


def jpx_files(folder: str | Path) -> tuple[list[Path], Path]:
    """Locate Kaggle JPX files under ``folder``: ``(stock_prices.csv files, stock_list.csv)``.

    Two layouts: flat (``folder/stock_prices.csv``), or the competition's download as it unpacks
    (``folder/train_files/stock_prices.csv``, then ``folder/supplemental_files/stock_prices.csv`` when present,
    same schema, later dates). ``stock_list.csv`` sits in ``folder`` in both. Raises :class:`PanelError` when
    neither layout is there, or both are (which prices to use would be a guess), or ``folder`` is the download's
    train_files/ or supplemental_files/ itself.
    """
    d = Path(folder)
    if d.name in ("train_files", "supplemental_files"):
        raise PanelError(f"{d}: give the competition's download folder {d.parent}, not its {d.name}/ (stock_list.csv "
                         f"and the other stock_prices.csv sit beside it)")
    flat, train = d / "stock_prices.csv", d / "train_files" / "stock_prices.csv"
    if flat.is_file() and train.is_file():
        raise PanelError(f"{d}: both {flat} and {train} exist; keep one layout (which prices to read is ambiguous)")
    if flat.is_file():
        files = [flat]
    elif train.is_file():
        files = [train] + [p for p in [d / "supplemental_files" / "stock_prices.csv"] if p.is_file()]
    else:
        raise PanelError(f"{d}: no stock_prices.csv: expected {flat} or the Kaggle download's {train} "
                         f"(give the folder that holds train_files/ and stock_list.csv)")
    return files, d / "stock_list.csv"


def _read_jpx_prices(path: Path, headers: Headers | None = None) -> pd.DataFrame:
    df = _read_csv(path, JPX_PRICE_COLUMNS, ("Date", "SecuritiesCode") + JPX_COMPARED, headers)
    df["Date"] = _parse_dates(df, "Date", path)
    for c in JPX_COMPARED:
        df[f"_{c}"] = df[c]  # the file's text, quoted when train_files/ and supplemental_files/ disagree
    df["Close"] = _numeric(df, "Close", path, "> 0")
    df["Volume"] = _numeric(df, "Volume", path, ">= 0")
    df["AdjustmentFactor"] = _numeric(df, "AdjustmentFactor", path, "> 0")
    if df["SecuritiesCode"].isna().any():
        raise PanelError(f"{path}: {_where(df, _first_bad(df['SecuritiesCode'].isna()))}: column 'SecuritiesCode' "
                         f"is empty")
    _check_ids(df, "SecuritiesCode", path)
    _check_unique(df, ["Date", "SecuritiesCode"], path)
    df["_file"], df["_row"] = str(path), np.arange(1, len(df) + 1)
    return df


def _append_supplemental(base: pd.DataFrame, sup: pd.DataFrame) -> pd.DataFrame:
    """``base`` + the rows of ``sup`` not already in it; a (Date, SecuritiesCode) in both must agree on
    :data:`JPX_COMPARED` (NaN equal to NaN), else :class:`PanelError` names both files and rows."""
    keys = ["Date", "SecuritiesCode"]
    cols = keys + list(JPX_COMPARED) + [f"_{c}" for c in JPX_COMPARED] + ["_file", "_row"]
    both = base[cols].merge(sup[cols], on=keys, suffixes=("", "_sup"))
    for c in JPX_COMPARED:
        a, b = both[c], both[f"{c}_sup"]
        differ = ~((a == b) | (a.isna() & b.isna()))
        if differ.any():
            r = both[differ].iloc[0]
            raise PanelError(f"{r['_file_sup']}: row {r['_row_sup']}: (Date, SecuritiesCode) = "
                             f"({r['Date'].date()}, {r['SecuritiesCode']}) is also {r['_file']} row {r['_row']} "
                             f"with another {c}: {r[f'_{c}_sup']!r} vs {r[f'_{c}']!r} "
                             f"({_such_rows(int(differ.sum()))})")
    seen = pd.MultiIndex.from_frame(base[keys])
    new = ~pd.MultiIndex.from_frame(sup[keys]).isin(seen)
    return pd.concat([base, sup[new]], ignore_index=True)


def load_jpx(folder: str | Path, headers: Headers | None = None) -> Prices:
    """Read Kaggle JPX ``stock_prices.csv`` (see :func:`jpx_files` for the layouts) and ``stock_list.csv``.

    Columns: stock_prices.csv RowId, Date, SecuritiesCode, Open, High, Low, Close, Volume, AdjustmentFactor,
    ExpectedDividend, SupervisionFlag, Target (the file's own Target is ignored: pitlab computes it);
    stock_list.csv needs SecuritiesCode and Name. ``close``/``volume`` are unadjusted (the day's own values),
    ``factor`` carries AdjustmentFactor (an empty factor is 1.0). Days where the market was halted (e.g.
    2020-10-01, rows with no prices) stay in the calendar with NaN closes, so targets spanning them are NaN,
    never invented. Raises :class:`PanelError` naming the file, column, row and value (a close that is not a
    number > 0, a factor ≤ 0, a duplicate row, supplemental rows that contradict train_files/). ``headers``:
    the files' headers, when a preflight already read them.
    """
    files, list_path = jpx_files(folder)
    stock_list = _read_csv(list_path, JPX_LIST_COLUMNS, JPX_LIST_COLUMNS + ("Universe0",), headers)
    _check_ids(stock_list, "SecuritiesCode", list_path)
    _check_unique(stock_list, ["SecuritiesCode"], list_path)
    df = _read_jpx_prices(files[0], headers)
    for extra in files[1:]:
        df = _append_supplemental(df, _read_jpx_prices(extra, headers))
    close = df.pivot(index="Date", columns="SecuritiesCode", values="Close").sort_index()
    volume = df.pivot(index="Date", columns="SecuritiesCode", values="Volume").reindex(close.index)
    factor = (df.pivot(index="Date", columns="SecuritiesCode", values="AdjustmentFactor")
              .reindex(close.index).fillna(1.0))
    names = dict(zip(stock_list["SecuritiesCode"].astype(str), stock_list["Name"].astype(str)))
    unlisted = df["SecuritiesCode"][~df["SecuritiesCode"].isin(set(names))]
    if len(unlisted):
        codes = list(dict.fromkeys(unlisted))
        row = df.loc[unlisted.index[0]]
        raise PanelError(f"{row['_file']}: row {row['_row']}: SecuritiesCode {codes[0]!r} is not in {list_path} "
                         f"({len(codes)} code(s) of the prices are not, e.g. {codes[:5]}); its prompts would show "
                         "the bare code instead of the company name: list every code (a code written '1300.0' "
                         "in one file and '1300' in the other is two codes)")
    universe0 = None
    if "Universe0" in stock_list.columns:
        text = stock_list["Universe0"].str.strip().str.lower()
        odd = text.notna() & ~text.isin(["true", "false", "1", "0", "1.0", "0.0"])
        if odd.any():
            i = _first_bad(odd)
            raise PanelError(f"{list_path}: {_where(stock_list, i)}: column 'Universe0': "
                             f"{stock_list['Universe0'].iloc[i]!r} is not a boolean (True/False, 1/0; "
                             f"{_such_rows(int(odd.sum()))})")
        flag = text.isin(["true", "1", "1.0"])
        universe0 = frozenset(stock_list.loc[flag, "SecuritiesCode"].astype(str))
    source = str(files[0]) if len(files) == 1 else " + ".join(map(str, files))
    return Prices(close=close, volume=volume, names=names, calendar=pd.DatetimeIndex(close.index),
                  source=source, universe0=universe0, factor=factor, levels_as_of_t=True,
                  info={"kind": "jpx", "files": [str(f) for f in files] + [str(list_path)],
                        "adjustment": JPX_ADJUSTMENT})


def split_chain(prices: Prices) -> pd.DataFrame:
    """C[d] = product of the factors dated strictly before d (1.0 on the first day; all ones without factors),
    [trading day × security] float64. ``close / C`` and ``volume × C`` put every day in the share count of the
    file's first day using only splits effective by d, so their ratios over days ≤ t equal the ratios of the
    prices as of t (``close[d] × C[t] / C[d]``): past splits only."""
    if prices.factor is None:
        return pd.DataFrame(1.0, index=prices.close.index, columns=prices.close.columns)
    return prices.factor.cumprod().shift(1).fillna(1.0)


def target_close(prices: Prices) -> pd.DataFrame:
    """The close the target is computed on [trading day × security]: the competition's adjusted close
    (:func:`jpx_adjusted_close`, all factors of the file) for JPX, the file's close otherwise."""
    if prices.factor is None:
        return prices.close
    return prices.close * prices.factor[::-1].cumprod()[::-1]


def compute_target(close: pd.DataFrame) -> pd.DataFrame:
    """Target [trading day × security]: ``close[t+2] / close[t+1] - 1`` on the panel calendar.

    NaN when either close is missing or t+2 lies beyond the last trading day.
    """
    return close.shift(-2) / close.shift(-1) - 1.0


def compute_features(prices: Prices) -> dict[str, pd.DataFrame]:
    """Prompt features [trading day × security] as of t, from rows dated ≤ t only.

    close, volume: the day's own values (``prices.close``/``prices.volume``); ret_1d, ret_5d, ret_20d:
    ``a[t] / a[t-k] - 1`` and volume_ratio: ``v[t] / mean(v[t-19..t])``, where ``a = close / C`` and
    ``v = volume × C`` with ``C`` from :func:`split_chain` (splits effective by each day): equal to the same
    ratios of the prices and volumes adjusted as of t, never using a split after t. All float64, NaN where
    history is missing.
    """
    chain = split_chain(prices)
    a, v = prices.close / chain, prices.volume * chain
    return {
        "close": prices.close,
        "ret_1d": a / a.shift(1) - 1.0,
        "ret_5d": a / a.shift(5) - 1.0,
        "ret_20d": a / a.shift(20) - 1.0,
        "volume": prices.volume,
        "volume_ratio": v / v.rolling(HISTORY_DAYS, min_periods=HISTORY_DAYS).mean(),
    }
