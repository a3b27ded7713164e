"""Data types passed between pitlab.data and its consumers (trainer, evaluator)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd


@dataclass(frozen=True)
class Document:
    """One corpus document. ``timestamp`` is timezone-aware (UTC) or None when missing or refused; then
    ``timestamp_error`` says why (naming the value and the expected format) and ``timestamp_value`` is the
    value as read (``""`` when missing)."""

    id: str
    text: str
    timestamp: pd.Timestamp | None
    row: int  # 1-based data row number in the source file (header excluded)
    timestamp_error: str | None = None
    timestamp_value: str | None = None
    line: int | None = None  # 1-based line of the file where the record starts (a CSV row's, after the header)

    @property
    def where(self) -> str:
        """``row 151 (line 152, id 'x')`` for messages: the data row, the file line an editor shows when it
        differs from the row (CSV: the header, quoted line breaks), and the id."""
        line = f"line {self.line}, " if self.line is not None and self.line != self.row else ""
        return f"row {self.row} ({line}id {self.id!r})"


@dataclass
class Panel:
    """An evaluation panel of (date t, security i) rows.

    ``rows`` columns: ``date`` (datetime64[ns], trading day t), ``security`` (str), ``prompt`` (str, built
    from information available at t only), ``target`` (float64, close change from t+1 to t+2:
    close[t+2] / close[t+1] - 1, JPX definition). Sorted by (date, security), unique on (date, security),
    no NaN target. ``calendar`` is every trading day of the source panel (sorted, unique), used to count
    embargo days in trading days. ``dropped`` counts rows removed while sampling and why, ``dropped_rows`` names
    each (``{"date", "security", "why"}``: the missing close, volume or target day); ``warnings`` are
    look-ahead hazards of the panel's construction (reported with the results). ``dataset``: where the
    prices came from and how they are adjusted (files, adjustment, the price levels the prompts print), for the
    results' dataset section.
    """

    rows: pd.DataFrame
    calendar: pd.DatetimeIndex
    source: str
    dropped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    dataset: dict = field(default_factory=dict)
    dropped_rows: list[dict] = field(default_factory=list)
