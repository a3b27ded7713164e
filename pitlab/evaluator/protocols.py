"""Split protocols for the leakage measurement (DESIGN section 4.7), as scikit-learn cross-validators.

* leakage-off: :class:`ChronologicalSplit`, one split; training dates end ``embargo_days`` trading days
  before the first test date.
* leakage-on: scikit-learn's ``GroupKFold`` with groups = security (disjoint securities, all dates mixed);
  :func:`security_folds` gives the fold of each security, also for a bootstrap replicate in which a security
  is drawn several times (every copy keeps one group label, so all copies land in the same fold).

Trading days are the sessions of the panel's exchange calendar (:func:`trading_calendar`: ``exchange_calendars``
XNYS for US panels, XTKS for JPX, or the price file's own days with ``dataset.calendar: panel``): embargo and
purge lengths count sessions of that calendar, whether or not the panel (or the price file) has a row that day.

Both follow scikit-learn's splitter protocol (``split(X, y=None, groups=None)`` yields ``(train_idx,
test_idx)``; ``get_n_splits``), so they can be handed to ``cross_val_score`` and compared with sklearn.
"""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Iterator

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold

from pitlab.errors import ProtocolError

LABEL_HORIZON_DAYS = 2
"""The JPX target of a row at t is the close change from t+1 to t+2: its label window ends 2 trading days later."""


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
    with warnings.catch_warnings():  # exchange_calendars 4.13 on pandas 3: Series.values deprecation notices
        warnings.filterwarnings("ignore", message=".*Series.values returning an ndarray")
        try:
            ec = xcals.get_calendar(name, start=lo.date().isoformat(), end=hi.date().isoformat())
        except xcals.errors.InvalidCalendarName as e:
            raise ProtocolError(f"dataset.calendar: {name!r} is not an exchange_calendars calendar (e.g. XNYS, "
                                f"XTKS) nor 'panel'") from e
        sessions = pd.DatetimeIndex(ec.sessions)
    return sessions.tz_localize(None).normalize().rename(name)


class ChronologicalSplit:
    """leakage-off: one chronological train/test split with an embargo counted in trading days.

    Parameters
    ----------
    dates : array-like of datetime64, shape [n_rows]
        Trading day t of each panel row; every date must be a day of ``calendar``.
    calendar : pd.DatetimeIndex
        Every trading session (sorted, unique; :func:`trading_calendar`); embargo days are counted on it.
    train_end : date
        Last date a training row may have (``protocol.trainEnd``, inclusive).
    test_start : date
        Test rows have date >= ``test_start`` (``protocol.testStart``).
    embargo_days : int
        Number of trading days immediately before the first test date T0 (the first calendar day >=
        ``test_start``) whose rows are removed from training. Training rows satisfy
        ``date <= train_end`` and ``calendar_index(date) < calendar_index(T0) - embargo_days``.
        With ``embargo_days < 2`` a training label window (t+1..t+2) reaches T0, and a ``UserWarning`` is
        issued (also kept in :attr:`warnings`).

    Attributes
    ----------
    train_mask, test_mask, embargo_mask : np.ndarray of bool, shape [n_rows]
        Training rows; test rows; rows with date <= train_end removed by the embargo.
    first_test_date : pd.Timestamp
        T0.
    n_train, n_test, n_embargoed, n_gap : int
        Row counts; ``n_gap`` counts rows after ``train_end`` and before ``test_start`` (in neither set).
    """

    def __init__(self, dates, calendar: pd.DatetimeIndex, train_end: dt.date, test_start: dt.date,
                 embargo_days: int):
        cal = pd.DatetimeIndex(calendar)
        if not (cal.is_monotonic_increasing and cal.is_unique):
            raise ProtocolError("panel calendar must be sorted and unique")
        d = pd.DatetimeIndex(dates)
        t_end, t_start = pd.Timestamp(train_end), pd.Timestamp(test_start)
        if t_start <= t_end:
            raise ProtocolError(f"protocol.testStart ({t_start.date()}) must be after protocol.trainEnd "
                                f"({t_end.date()})")
        pos = cal.get_indexer(d)
        if (pos < 0).any():
            bad = d[pos < 0][0]
            raise ProtocolError(f"panel date {bad.date()} is not a trading day of the {cal.name or 'panel'} calendar "
                                "(dataset.calendar: 'panel' counts the price file's own days)")
        t0_pos = int(cal.searchsorted(t_start, side="left"))
        if t0_pos >= len(cal):
            raise ProtocolError(f"protocol.testStart ({t_start.date()}) is after the last trading day of the "
                                f"panel calendar ({cal[-1].date()})")
        self.first_test_date: pd.Timestamp = cal[t0_pos]
        self.embargo_days = int(embargo_days)
        self.train_end, self.test_start = t_end, t_start
        self.test_mask = np.asarray(d >= t_start)
        before_end = np.asarray(d <= t_end)
        self.train_mask = before_end & (pos < t0_pos - self.embargo_days)
        self.embargo_mask = before_end & ~self.train_mask
        self.n_train = int(self.train_mask.sum())
        self.n_test = int(self.test_mask.sum())
        self.n_embargoed = int(self.embargo_mask.sum())
        self.n_gap = int(len(d) - self.n_train - self.n_test - self.n_embargoed)
        self.warnings: list[str] = []
        if self.embargo_days < LABEL_HORIZON_DAYS:
            msg = (f"protocol.embargoDays={self.embargo_days} < {LABEL_HORIZON_DAYS}: training labels "
                   f"(close t+1 -> t+2) overlap the test period starting {self.first_test_date.date()}")
            self.warnings.append(msg)
            warnings.warn(msg, UserWarning, stacklevel=2)
        if self.n_train == 0:
            raise ProtocolError(f"protocol.trainEnd ({t_end.date()}) with embargoDays={self.embargo_days}: no "
                                f"panel row is left for training (first test date {self.first_test_date.date()})")
        if self.n_test == 0:
            raise ProtocolError(f"protocol.testStart ({t_start.date()}): no panel row has a date on or after it")

    def split(self, X=None, y=None, groups=None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield the one ``(train_idx, test_idx)`` pair (int64 row indices). ``X`` only checks the row count."""
        if X is not None and len(X) != len(self.train_mask):
            raise ValueError(f"X has {len(X)} rows but the split was built for {len(self.train_mask)} dates")
        yield np.flatnonzero(self.train_mask), np.flatnonzero(self.test_mask)

    def get_n_splits(self, X=None, y=None, groups=None) -> int:
        """Always 1."""
        return 1

    def summary(self) -> dict:
        """JSON-ready description: counts, first test date, embargo and warnings."""
        return {"train_end": self.train_end.date().isoformat(), "test_start": self.test_start.date().isoformat(),
                "first_test_date": self.first_test_date.date().isoformat(), "embargo_days": self.embargo_days,
                "n_train": self.n_train, "n_test": self.n_test, "n_embargoed": self.n_embargoed,
                "n_gap": self.n_gap, "warnings": list(self.warnings)}


def leakage_on_splitter(n_splits: int) -> GroupKFold:
    """The leakage-on cross-validator: scikit-learn ``GroupKFold(n_splits)`` (no shuffling), to be called
    with ``groups`` = security of each row."""
    return GroupKFold(n_splits=n_splits)


def security_folds(rows_per_security: np.ndarray, n_splits: int, multiplicity: np.ndarray | None = None,
                   field: str = "protocol.groupKFolds") -> np.ndarray:
    """Fold of each security under GroupKFold by security, for the panel or for one bootstrap replicate.

    The replicate data set holds ``multiplicity[i]`` copies of the ``rows_per_security[i]`` rows of security
    i. All copies keep one group label (the security), so sklearn ``GroupKFold`` is called on the expanded
    group array (security i repeated ``multiplicity[i] * rows_per_security[i]`` times): fold sizes are
    weighted by multiplicity and a security never sits on both sides of a fold boundary.

    Parameters
    ----------
    rows_per_security : int array [n_securities]
        Panel rows per security.
    n_splits : int
        ``protocol.groupKFolds``.
    multiplicity : int array [n_securities] or None
        Bootstrap multiplicities (None = each security once, the point estimate).
    field : str
        The setting named in the error raised when there are fewer securities than folds.

    Returns
    -------
    np.ndarray int64 [n_securities]: fold index 0..n_splits-1, or -1 for a security not drawn (or without rows).
    """
    rows = np.asarray(rows_per_security, dtype=np.int64)
    mult = np.ones_like(rows) if multiplicity is None else np.asarray(multiplicity, dtype=np.int64)
    if mult.shape != rows.shape:
        raise ValueError(f"multiplicity has shape {mult.shape}, rows_per_security {rows.shape}")
    sizes = rows * mult
    present = np.flatnonzero(sizes > 0)
    if len(present) < n_splits:
        raise ProtocolError(f"{field}={n_splits} exceeds the number of distinct securities "
                            f"({len(present)}) in the data set")
    groups = np.repeat(present, sizes[present])
    folds = np.full(len(rows), -1, dtype=np.int64)
    for k, (_, test_idx) in enumerate(GroupKFold(n_splits=n_splits).split(groups, groups=groups)):
        folds[np.unique(groups[test_idx])] = k
    return folds


def security_folds_batch(sizes: np.ndarray, n_splits: int, field: str = "protocol.groupKFolds") -> np.ndarray:
    """:func:`security_folds` for B weightings at once: ``sizes`` int [B, S] (rows of each security in each
    weighting, multiplicities included) → int64 [B, S] folds (-1 where the size is 0).

    The same greedy rule as scikit-learn's ``GroupKFold`` (no shuffle; checked against it): groups in
    descending order of size (a stable argsort of the sizes, reversed), each to the fold with the fewest rows so
    far (the first such fold on ties); absent securities (size 0) sort last and change no other assignment.
    Vectorised over the B weightings: one Python step per security instead of one GroupKFold call per weighting.
    Raises :class:`ProtocolError` when a weighting has fewer securities than folds."""
    z = np.asarray(sizes, dtype=np.int64)
    if z.ndim != 2:
        raise ValueError(f"sizes must be [B, S], got shape {z.shape}")
    B, S = z.shape
    present = (z > 0).sum(axis=1)
    if B and present.min() < n_splits:
        raise ProtocolError(f"{field}={n_splits} exceeds the number of distinct securities "
                            f"({int(present.min())}) in the data set")
    order = np.argsort(z, axis=1, kind="stable")[:, ::-1]
    load = np.zeros((B, n_splits))
    folds = np.full((B, S), -1, dtype=np.int64)
    rows = np.arange(B)
    for j in range(S):
        g = order[:, j]
        w = z[rows, g]
        f = np.argmin(load, axis=1)
        load[rows, f] += w
        folds[rows, g] = f
    folds[z == 0] = -1
    return folds


def _calendar_positions(dates, calendar: pd.DatetimeIndex) -> np.ndarray:
    """Position of every row date on ``calendar`` (int64 [n_rows]); raises :class:`ProtocolError` for a date
    that is not a trading day of the calendar."""
    cal = pd.DatetimeIndex(calendar)
    if not (cal.is_monotonic_increasing and cal.is_unique):
        raise ProtocolError("panel calendar must be sorted and unique")
    d = pd.DatetimeIndex(dates)
    pos = cal.get_indexer(d)
    if (pos < 0).any():
        raise ProtocolError(f"panel date {d[pos < 0][0].date()} is not a trading day of the {cal.name or 'panel'} "
                            "calendar (dataset.calendar: 'panel' counts the price file's own days)")
    return pos.astype(np.int64)


class _DateFoldSplit:
    """Common part of the date-block K-fold protocols: ``fold_train`` / ``fold_test`` bool [K, n_rows]."""

    name = ""
    fold_train: np.ndarray
    fold_test: np.ndarray
    fold_dates: list[tuple[pd.Timestamp, pd.Timestamp]]

    def split(self, X=None, y=None, groups=None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield ``(train_idx, test_idx)`` (int64 row indices) per fold, in date order of the test block."""
        if X is not None and len(X) != self.fold_train.shape[1]:
            raise ValueError(f"X has {len(X)} rows but the split was built for {self.fold_train.shape[1]} dates")
        for tr, te in zip(self.fold_train, self.fold_test):
            yield np.flatnonzero(tr), np.flatnonzero(te)

    def get_n_splits(self, X=None, y=None, groups=None) -> int:
        """Number of folds K."""
        return int(self.fold_train.shape[0])

    def summary(self) -> dict:
        """JSON-ready description: per fold the test date range and row counts (train, test, removed)."""
        return {"n_splits": self.get_n_splits(), "embargo_days": self.embargo_days,
                "folds": [{"test_first_date": a.date().isoformat(), "test_last_date": b.date().isoformat(),
                           "n_train": int(tr.sum()), "n_test": int(te.sum()), "n_removed": int(rm.sum())}
                          for (a, b), tr, te, rm in zip(self.fold_dates, self.fold_train, self.fold_test,
                                                        self.fold_removed)]}


class WalkForwardSplit(_DateFoldSplit):
    """Walk-forward (expanding window) protocol: K folds over the panel's distinct dates, in date order.

    The distinct panel dates are cut into K+1 contiguous blocks by scikit-learn ``TimeSeriesSplit(n_splits=K)``
    (the first block takes the remainder); fold k (k = 1..K) tests on block k and trains on every earlier
    row less the embargo: a training row at date t needs ``calendar_index(t) < calendar_index(T0_k) -
    embargo_days``, T0_k the first date of block k (the same rule as :class:`ChronologicalSplit`; the row's
    label window t+1..t+2 must end before the test block starts, so ``embargo_days >= 2`` is advised).

    Parameters
    ----------
    dates : array-like of datetime64 [n_rows]; calendar : pd.DatetimeIndex (all trading days, sorted, unique);
    n_splits : int K (``protocol.walkForwardFolds``); embargo_days : int, trading days on ``calendar``.

    Attributes
    ----------
    fold_train, fold_test, fold_removed : bool [K, n_rows] (removed = earlier rows dropped by the embargo).
    """

    name = "walk-forward"

    def __init__(self, dates, calendar: pd.DatetimeIndex, n_splits: int, embargo_days: int):
        from sklearn.model_selection import TimeSeriesSplit

        pos = _calendar_positions(dates, calendar)
        cal = pd.DatetimeIndex(calendar)
        udates = np.unique(pos)
        if len(udates) < n_splits + 1:
            raise ProtocolError(f"protocol.walkForwardFolds={n_splits} needs at least {n_splits + 1} distinct "
                                f"panel dates (the panel has {len(udates)})")
        self.embargo_days = int(embargo_days)
        tr_l, te_l, rm_l, self.fold_dates = [], [], [], []
        for _, te in TimeSeriesSplit(n_splits=n_splits).split(udates):
            first, last = udates[te[0]], udates[te[-1]]
            test = (pos >= first) & (pos <= last)
            before = pos < first
            train = before & (pos < first - self.embargo_days)
            if not train.any():
                raise ProtocolError(f"protocol.walkForwardFolds={n_splits} with embargoDays={embargo_days}: "
                                    f"the fold testing from {cal[first].date()} has no training row")
            tr_l.append(train)
            te_l.append(test)
            rm_l.append(before & ~train)
            self.fold_dates.append((cal[first], cal[last]))
        self.fold_train, self.fold_test, self.fold_removed = np.stack(tr_l), np.stack(te_l), np.stack(rm_l)


class PurgedKFoldSplit(_DateFoldSplit):
    """Purged and embargoed K-fold (López de Prado 2018, *Advances in Financial Machine Learning*, ch. 7.4).

    The distinct panel dates are cut into K contiguous blocks (scikit-learn ``KFold(n_splits=K)``, no
    shuffling). Fold k tests on the rows of block k, dates [a, b]. A row at date t uses information over
    the trading days [t, t + h] (h = ``horizon`` = 2: the label is close t+1 → t+2). Training rows are all
    other rows except

    * purged: rows whose span [t, t+h] overlaps the test span [a, b+h], i.e. ``pos(a) - h <= pos(t) <=
      pos(b) + h``;
    * embargoed: the ``embargo_days`` trading days after that, ``pos(b) + h < pos(t) <= pos(b) + h +
      embargo_days`` (López de Prado's embargo after the test fold, which guards against serial correlation).

    Positions are counted on the exchange ``calendar``, not on the panel's sampled dates. Training uses rows
    both before and after the test block, so this protocol sits between leakage-off and leakage-on.

    Attributes
    ----------
    fold_train, fold_test, fold_removed : bool [K, n_rows] (removed = purged or embargoed, outside the block).
    """

    name = "purged-kfold"

    def __init__(self, dates, calendar: pd.DatetimeIndex, n_splits: int, embargo_days: int,
                 horizon: int = LABEL_HORIZON_DAYS):
        from sklearn.model_selection import KFold

        pos = _calendar_positions(dates, calendar)
        cal = pd.DatetimeIndex(calendar)
        udates = np.unique(pos)
        if len(udates) < n_splits:
            raise ProtocolError(f"protocol.purgedFolds={n_splits} exceeds the number of distinct panel dates "
                                f"({len(udates)})")
        self.embargo_days, self.horizon = int(embargo_days), int(horizon)
        tr_l, te_l, rm_l, self.fold_dates = [], [], [], []
        for _, te in KFold(n_splits=n_splits).split(udates):
            first, last = udates[te[0]], udates[te[-1]]
            test = (pos >= first) & (pos <= last)
            removed = ~test & (pos >= first - self.horizon) & (pos <= last + self.horizon + self.embargo_days)
            train = ~test & ~removed
            if not train.any():
                raise ProtocolError(f"protocol.purgedFolds={n_splits}: the fold testing {cal[first].date()}.."
                                    f"{cal[last].date()} has no training row after purging and embargo")
            tr_l.append(train)
            te_l.append(test)
            rm_l.append(removed)
            self.fold_dates.append((cal[first], cal[last]))
        self.fold_train, self.fold_test, self.fold_removed = np.stack(tr_l), np.stack(te_l), np.stack(rm_l)


def date_block_folds(positions: np.ndarray, weights: np.ndarray, n_splits: int, embargo_days: int,
                     horizon: int = LABEL_HORIZON_DAYS,
                     field: str = "inner folds of the penalty selection") -> tuple[np.ndarray, np.ndarray]:
    """Inner folds of a time-respecting penalty selection: contiguous blocks of dates, purged and embargoed.

    ``positions`` int [m]: calendar position (trading-session index) of every unit (a panel row);
    ``weights`` float [B, m]: the multiplicity of every unit in each of B fitting sets (0 = not in the set).
    For fitting set b, its distinct dates (positions with positive weight) are cut into ``n_splits``
    contiguous blocks (``numpy.array_split``: the first blocks take the remainder, as scikit-learn's
    ``KFold``). Inner fold j tests on block j, dates [a, b], and trains on the set's other units except

    * before the block: a unit at t needs ``pos(t) < pos(a) - max(horizon, embargo_days)``, the chronological
      split's rule (its label window [t, t + horizon] closes before the block, plus the embargo);
    * after the block: a unit at t needs ``pos(t) > pos(b) + horizon + embargo_days``, purged K-fold's rule
      (López de Prado 2018, ch. 7.4: the block's labels reach pos(b) + horizon, then the embargo).

    No date is ever on both sides of an inner fold. A fitting set with fewer distinct dates than ``n_splits``
    (a bootstrap replicate that drew few training dates) is cut into as many blocks as it has dates; a fold
    that has no block, or whose block leaves no training unit after purging, is left out of the score (its
    ``test`` is empty and its ``train`` the whole set). Returns ``(train, test)`` bool [B, n_splits, m]."""
    pos = np.asarray(positions, dtype=np.int64)
    W = np.asarray(weights, dtype=np.float64)
    if W.ndim != 2 or W.shape[1] != pos.shape[0]:
        raise ValueError(f"weights must be [B, {pos.shape[0]}], got shape {W.shape}")
    if n_splits < 2:
        raise ProtocolError(f"{field}: need at least 2 date blocks (got {n_splits})")
    B, m = W.shape
    before_gap, after_gap = max(int(horizon), int(embargo_days)), int(horizon) + int(embargo_days)
    present = W > 0
    train = np.repeat(present[:, None, :], n_splits, axis=1)
    test = np.zeros((B, n_splits, m), dtype=bool)
    for b in range(B):
        udates = np.unique(pos[present[b]])
        if len(udates) == 0:
            continue
        for j, block in enumerate(np.array_split(udates, min(n_splits, len(udates)))):
            a, z = block[0], block[-1]
            tr = present[b] & ((pos < a - before_gap) | (pos > z + after_gap))
            if tr.any():
                test[b, j] = present[b] & (pos >= a) & (pos <= z)
                train[b, j] = tr
    return train, test
