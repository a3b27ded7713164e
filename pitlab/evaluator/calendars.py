"""Trading calendars: the sessions on which embargo and purge lengths are counted (:func:`trading_calendar`)."""

from __future__ import annotations

import functools
import warnings

import pandas as pd

from pitlab.errors import ProtocolError

DEFAULT_CALENDARS = {"ohlcv": "XNYS", "jpx": "XTKS"}
"""``dataset.calendar: auto``: the exchange calendar of each dataset kind (US OHLCV files: New York Stock
Exchange; Kaggle JPX: Tokyo Stock Exchange)."""


def trading_calendar(setting: str, dataset_kind: str, panel_calendar: pd.DatetimeIndex) -> pd.DatetimeIndex:
    """The trading sessions on which embargo and purge days are counted, named (``.name``) after the calendar.

    ``setting`` (``dataset.calendar``): ``"auto"`` → :data:`DEFAULT_CALENDARS` of ``dataset_kind``; ``"panel"``
    → ``panel_calendar`` itself (the trading days of the price file); else an ``exchange_calendars`` name
    (e.g. ``"XNYS"``, ``"XTKS"``), whose sessions from 60 days before the panel calendar's first day to 60 days
    after its last are returned (tz-naive, midnight, sorted, unique).

    The exchange calendar, not the panel, defines trading days: a session the price file lacks still counts,
    and a day the exchange did not trade does not. A market-wide halt counts as the calendar records it:
    ``exchange_calendars`` (4.x) lists 2020-10-01 on XTKS (the TSE system failure: no trade all day) as a
    closure, so that day is no trading day (no price formed, no label window advances over it), while the JPX
    price file keeps it as a row without prices. Raises :class:`ProtocolError` for an unknown calendar name.
    """
    cal = pd.DatetimeIndex(panel_calendar)
    name = DEFAULT_CALENDARS.get(dataset_kind, "panel") if setting == "auto" else setting
    if name == "panel":
        return cal.rename("panel")
    import exchange_calendars as xcals

    lo, hi = cal[0] - pd.Timedelta(days=60), cal[-1] + pd.Timedelta(days=60)
    try:
        return _exchange_sessions(name, lo.date().isoformat(), hi.date().isoformat())
    except xcals.errors.InvalidCalendarName as e:
        raise ProtocolError(f"dataset.calendar: {name!r} is not an exchange_calendars calendar (e.g. XNYS, "
                            f"XTKS) nor 'panel'") from e


@functools.lru_cache(maxsize=8)
def _exchange_sessions(name: str, start: str, end: str) -> pd.DatetimeIndex:
    """Sessions of one exchange calendar between two ISO dates, built once per process (preflight and the
    evaluation of one run ask for the same)."""
    import exchange_calendars as xcals

    with warnings.catch_warnings():  # exchange_calendars 4.13 on pandas 3: Series.values deprecation notices
        warnings.filterwarnings("ignore", message=".*Series.values returning an ndarray")
        sessions = pd.DatetimeIndex(xcals.get_calendar(name, start=start, end=end).sessions)
    return sessions.tz_localize(None).normalize().rename(name)
