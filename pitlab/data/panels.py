"""Market panels: long OHLCV CSV and Kaggle JPX files → daily prices → targets → a sampled evaluation panel.

Target (JPX definition): ``r[t] = close[t+2] / close[t+1] - 1``, where t+1 and t+2 are the next two trading
days of the panel's calendar (not the next rows of the sample). It is computed from the full price history
and attached to row t; nothing about t+1 or t+2 enters the prompt of row t.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

OHLCV_COLUMNS = ("date", "open", "high", "low", "close", "volume", "Name")
JPX_PRICE_COLUMNS = ("RowId", "Date", "SecuritiesCode", "Open", "High", "Low", "Close", "Volume",
                     "AdjustmentFactor", "ExpectedDividend", "SupervisionFlag", "Target")
JPX_LIST_COLUMNS = ("SecuritiesCode", "Name")
HISTORY_DAYS = 20  # trading days of history the prompt features need


class PanelError(ValueError):
    """A market data file cannot be used; the message names the file, the column and, where known, the row."""


@dataclass
class Prices:
    """Daily prices of a market. ``close``/``volume``: DataFrame [trading day × security], float64, NaN where a
    security has no price that day. ``names``: security → display name. ``calendar``: every trading day."""

    close: pd.DataFrame
    volume: pd.DataFrame
    names: dict[str, str]
    calendar: pd.DatetimeIndex
    source: str
    universe0: frozenset[str] | None = None
    """JPX only: codes with ``Universe0`` true in stock_list.csv (a December 2021 snapshot), if the column exists."""


def check_csv_columns(path: Path, required: tuple[str, ...], **kw) -> None:
    """Read only the header of a CSV and raise :class:`PanelError` naming the file if it is missing, unreadable
    or lacks any of ``required`` (the message lists the missing and the present columns)."""
    if not path.is_file():
        raise PanelError(f"{path}: file not found")
    try:
        header = pd.read_csv(path, nrows=0, **kw)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError, OSError) as err:
        raise PanelError(f"{path}: cannot read as CSV ({err})") from None
    missing = [c for c in required if c not in header.columns]
    if missing:
        raise PanelError(f"{path}: missing column(s) {missing}; found {list(header.columns)}")


def _read_csv(path: Path, required: tuple[str, ...], **kw) -> pd.DataFrame:
    check_csv_columns(path, required, **kw)
    return pd.read_csv(path, **kw)


def _parse_dates(df: pd.DataFrame, col: str, path: Path) -> pd.Series:
    parsed = pd.to_datetime(df[col], format="%Y-%m-%d", errors="coerce")
    bad = parsed.isna()
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise PanelError(f"{path}: row {i + 1}: column {col!r}: unparseable date {df[col].iloc[i]!r} "
                         f"({int(bad.sum())} such rows)")
    return parsed


def _numeric(df: pd.DataFrame, col: str, path: Path) -> pd.Series:
    vals = pd.to_numeric(df[col], errors="coerce")
    bad = vals.isna() & df[col].notna()
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise PanelError(f"{path}: row {i + 1}: column {col!r}: not a number: {df[col].iloc[i]!r}")
    return vals.astype("float64")


def _check_unique(df: pd.DataFrame, keys: list[str], path: Path) -> None:
    dup = df.duplicated(keys, keep=False)
    if dup.any():
        rows = (np.flatnonzero(dup.to_numpy())[:2] + 1).tolist()
        raise PanelError(f"{path}: rows {rows}: duplicate ({', '.join(keys)}) = "
                         f"{tuple(df.loc[dup, keys].iloc[0])}")


def load_ohlcv_long(path: str | Path) -> Prices:
    """Read a long OHLCV CSV (optionally .gz) with columns date, open, high, low, close, volume, Name.

    This is the format of ``sp500_5yr/sp500_5yr_ohlcv_long.csv.gz`` (split-adjusted prices). Rows with a
    missing close stay NaN (no price that day). Raises :class:`PanelError` naming the file, column and row
    for a missing column, an unparseable date or number, or a duplicate (date, Name).
    """
    p = Path(path)
    df = _read_csv(p, OHLCV_COLUMNS, dtype={"Name": str})
    df["date"] = _parse_dates(df, "date", p)
    for c in ("close", "volume"):
        df[c] = _numeric(df, c, p)
    if df["Name"].isna().any():
        i = int(np.flatnonzero(df["Name"].isna().to_numpy())[0])
        raise PanelError(f"{p}: row {i + 1}: column 'Name' is empty")
    _check_unique(df, ["date", "Name"], p)
    close = df.pivot(index="date", columns="Name", values="close").sort_index()
    volume = df.pivot(index="date", columns="Name", values="volume").reindex(close.index)
    names = {s: s for s in close.columns}
    return Prices(close=close, volume=volume, names=names, calendar=pd.DatetimeIndex(close.index), source=str(p))


def jpx_adjusted_close(prices: pd.DataFrame) -> pd.Series:
    """Split-adjusted close for Kaggle JPX ``stock_prices.csv`` rows (one security or many).

    ``AdjustmentFactor`` on day d (e.g. 0.5 for a 1:2 split effective the next day) scales the close of d
    and every earlier day of that security: adjusted close = Close × product of the factors of all days ≥ d
    (the competition's cumulative adjustment, computed in descending date order). Missing Close stays NaN.
    Input columns: Date (datetime64), SecuritiesCode, Close, AdjustmentFactor. Returns a float64 Series
    aligned with ``prices``.
    """
    df = prices[["Date", "SecuritiesCode", "Close", "AdjustmentFactor"]].copy()
    df["AdjustmentFactor"] = df["AdjustmentFactor"].fillna(1.0)
    df = df.sort_values(["SecuritiesCode", "Date"], ascending=[True, False])
    cum = df.groupby("SecuritiesCode", sort=False)["AdjustmentFactor"].cumprod()
    return (df["Close"] * cum).reindex(prices.index)


def load_jpx(folder: str | Path) -> Prices:
    """Read Kaggle JPX files ``stock_prices.csv`` and ``stock_list.csv`` from ``folder``.

    Columns: stock_prices.csv RowId, Date, SecuritiesCode, Open, High, Low, Close, Volume, AdjustmentFactor,
    ExpectedDividend, SupervisionFlag, Target (the file's own Target is ignored: pitlab computes it);
    stock_list.csv needs SecuritiesCode and Name. Days where the market was halted (e.g. 2020-10-01, rows
    with no prices) stay in the calendar with NaN closes, so targets spanning them are NaN, never invented.
    Raises :class:`PanelError` naming the file and column.
    """
    d = Path(folder)
    prices_path, list_path = d / "stock_prices.csv", d / "stock_list.csv"
    df = _read_csv(prices_path, JPX_PRICE_COLUMNS, dtype={"SecuritiesCode": str})
    stock_list = _read_csv(list_path, JPX_LIST_COLUMNS, dtype={"SecuritiesCode": str})
    df["Date"] = _parse_dates(df, "Date", prices_path)
    for c in ("Close", "Volume", "AdjustmentFactor"):
        df[c] = _numeric(df, c, prices_path)
    _check_unique(df, ["Date", "SecuritiesCode"], prices_path)
    df["AdjClose"] = jpx_adjusted_close(df)
    # volume in adjusted shares keeps the volume ratio feature continuous across splits
    close = df.pivot(index="Date", columns="SecuritiesCode", values="AdjClose").sort_index()
    volume = df.pivot(index="Date", columns="SecuritiesCode", values="Volume").reindex(close.index)
    names = dict(zip(stock_list["SecuritiesCode"].astype(str), stock_list["Name"].astype(str)))
    names = {s: names.get(s, s) for s in close.columns}
    universe0 = None
    if "Universe0" in stock_list.columns:
        flag = stock_list["Universe0"].astype(str).str.strip().str.lower().isin(["true", "1", "1.0"])
        universe0 = frozenset(stock_list.loc[flag, "SecuritiesCode"].astype(str))
    return Prices(close=close, volume=volume, names=names, calendar=pd.DatetimeIndex(close.index),
                  source=str(prices_path), universe0=universe0)


def compute_target(close: pd.DataFrame) -> pd.DataFrame:
    """Target [trading day × security]: ``close[t+2] / close[t+1] - 1`` on the panel calendar.

    NaN when either close is missing or t+2 lies beyond the last trading day.
    """
    return close.shift(-2) / close.shift(-1) - 1.0


def compute_features(prices: Prices) -> dict[str, pd.DataFrame]:
    """Prompt features [trading day × security] from information available at t only (days ≤ t).

    close; ret_1d, ret_5d, ret_20d: close[t] / close[t-k] - 1; volume; volume_ratio: volume[t] / mean of
    volume over the 20 trading days ending at t. All float64, NaN where history is missing.
    """
    c, v = prices.close, prices.volume
    return {
        "close": c,
        "ret_1d": c / c.shift(1) - 1.0,
        "ret_5d": c / c.shift(5) - 1.0,
        "ret_20d": c / c.shift(20) - 1.0,
        "volume": v,
        "volume_ratio": v / v.rolling(HISTORY_DAYS, min_periods=HISTORY_DAYS).mean(),
    }
