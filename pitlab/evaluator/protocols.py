"""Split protocols for the leakage measurement (docs/design.md, "Evaluator"), as splitters that hold parameters only.

Each splitter is built once from the spec's ``protocol`` block and the trading calendar
(:func:`protocol_splitters`) and applied to the panel's row dates at :meth:`split` / :meth:`apply` time, the way
scikit-learn's cross-validators take their data at ``split()``; its ``description`` is the prose the report
prints for it.

* leakage-off: :class:`ChronologicalSplit`, one split; training dates end ``embargo_days`` trading days
  before the first test date.
* leakage-on: scikit-learn's ``GroupKFold`` with groups = security (disjoint securities, all dates mixed);
  :func:`security_folds` gives the fold of each security, also for a bootstrap replicate in which a security
  is drawn several times (every copy keeps one group label, so all copies land in the same fold).
* :class:`WalkForwardSplit`, :class:`PurgedKFoldSplit`: date-block K-fold protocols.

Trading days are the sessions of the panel's exchange calendar (:func:`trading_calendar`: ``exchange_calendars``
XNYS for US panels, XTKS for JPX, or the price file's own days with ``dataset.calendar: panel``): embargo and
purge lengths count sessions of that calendar, whether or not the panel (or the price file) has a row that day.
"""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Iterator

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold

from pitlab.evaluator.calendars import DEFAULT_CALENDARS, ProtocolError, trading_calendar  # noqa: F401

LABEL_HORIZON_DAYS = 2
"""The JPX target of a row at t is the close change from t+1 to t+2: its label window ends 2 trading days later."""


def _checked_calendar(calendar: pd.DatetimeIndex) -> pd.DatetimeIndex:
    """``calendar`` as a DatetimeIndex; raises :class:`ProtocolError` unless sorted and unique."""
    cal = pd.DatetimeIndex(calendar)
    if not (cal.is_monotonic_increasing and cal.is_unique):
        raise ProtocolError("panel calendar must be sorted and unique")
    return cal


class ChronologicalSplit:
    """leakage-off: one chronological train/test split with an embargo counted in trading days.

    Parameters
    ----------
    train_end : date
        Last date a training row may have (``protocol.trainEnd``, inclusive).
    test_start : date
        Test rows have date >= ``test_start`` (``protocol.testStart``).
    embargo_days : int
        Number of trading days immediately before the first test date T0 (the first calendar day >=
        ``test_start``) whose rows are removed from training. Training rows satisfy
        ``date <= train_end`` and ``calendar_index(date) < calendar_index(T0) - embargo_days``.
        With ``embargo_days < 2`` a training label window (t+1..t+2) reaches T0, and :meth:`apply` issues a
        ``UserWarning`` (also kept in the folds' ``warnings``).
    calendar : pd.DatetimeIndex
        Every trading session (sorted, unique; :func:`trading_calendar`); embargo days are counted on it.

    Raises :class:`ProtocolError` when ``test_start`` is not after ``train_end`` or the calendar is not sorted
    and unique; :meth:`apply` raises it for dates off the calendar or an empty side.
    """

    name = "chronological"
    description = "chronological split with embargo (trading days)"

    def __init__(self, train_end: dt.date, test_start: dt.date, embargo_days: int, calendar: pd.DatetimeIndex):
        self.calendar = _checked_calendar(calendar)
        self.train_end, self.test_start = pd.Timestamp(train_end), pd.Timestamp(test_start)
        if self.test_start <= self.train_end:
            raise ProtocolError(f"protocol.testStart ({self.test_start.date()}) must be after protocol.trainEnd "
                                f"({self.train_end.date()})")
        self.embargo_days = int(embargo_days)

    def with_embargo(self, embargo_days: int) -> "ChronologicalSplit":
        """The same split with another embargo (the embargo robustness table)."""
        return ChronologicalSplit(self.train_end, self.test_start, embargo_days, self.calendar)

    def apply(self, dates) -> "ChronologicalFolds":
        """The split of the rows whose trading days are ``dates`` (datetime64 [n_rows], each a calendar day)."""
        return ChronologicalFolds(self, dates)

    def split(self, dates) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield the one ``(train_idx, test_idx)`` pair (int64 row indices) of ``dates``."""
        yield from self.apply(dates).split()

    def get_n_splits(self) -> int:
        """Always 1."""
        return 1


class ChronologicalFolds:
    """:class:`ChronologicalSplit` applied to a panel's row dates.

    Attributes
    ----------
    train_mask, test_mask, embargo_mask : np.ndarray of bool, shape [n_rows]
        Training rows; test rows; rows with date <= train_end removed by the embargo.
    first_test_date : pd.Timestamp
        T0: the first calendar session on or after ``test_start`` (the embargo counts sessions before it).
    last_train_row_date, first_test_row_date : pd.Timestamp
        The panel's own last training row's and first test row's dates (a sampled panel's can differ from T0).
    train_end, test_start : pd.Timestamp; embargo_days : int
        The splitter's parameters.
    n_train, n_test, n_embargoed, n_gap : int
        Row counts; ``n_gap`` counts rows after ``train_end`` and before ``test_start`` (in neither set).
    warnings : list[str]
        The short-embargo warning, when training rows' labels reach into the test period (issued also as a
        ``UserWarning``).
    """

    def __init__(self, splitter: ChronologicalSplit, dates):
        cal, d = splitter.calendar, pd.DatetimeIndex(dates)
        t_end, t_start = splitter.train_end, splitter.test_start
        pos = cal.get_indexer(d)
        if (pos < 0).any():
            bad = d[pos < 0][0]
            raise ProtocolError(f"panel date {bad.date()} is not a trading day of the {cal.name or 'panel'} calendar "
                                "(dataset.calendar: 'panel' counts the price file's own days)")
        t0_pos = int(cal.searchsorted(t_start, side="left"))
        if t0_pos >= len(cal):  # the calendar runs past the prices (padded): name the panel's own last date
            raise ProtocolError(f"protocol.testStart ({t_start.date()}): no panel row has a date on or after it "
                                f"(the sampled panel ends {d.max().date()})")
        self.first_test_date: pd.Timestamp = cal[t0_pos]
        self.embargo_days = splitter.embargo_days
        self.train_end, self.test_start = t_end, t_start
        self.test_mask = np.asarray(d >= t_start)
        before_end = np.asarray(d <= t_end)
        self.train_mask = before_end & (pos < t0_pos - self.embargo_days)
        self.embargo_mask = before_end & ~self.train_mask
        self.n_train = int(self.train_mask.sum())
        self.n_test = int(self.test_mask.sum())
        self.n_embargoed = int(self.embargo_mask.sum())
        self.n_gap = int(len(d) - self.n_train - self.n_test - self.n_embargoed)
        # the panel's own dates beside the calendar's: the embargo counts sessions before first_test_date, while a
        # sampled panel's first test row can be later
        self.last_train_row_date = d[self.train_mask].max() if self.train_mask.any() else None
        self.first_test_row_date = d[self.test_mask].min() if self.test_mask.any() else None
        self.warnings: list[str] = []
        # a training row at t has the label close t+1 -> t+2: within LABEL_HORIZON_DAYS of T0 it reaches into the test
        overlap = self.train_mask & (pos >= t0_pos - LABEL_HORIZON_DAYS)
        if self.embargo_days < LABEL_HORIZON_DAYS and overlap.any():
            od = cal[np.unique(pos[overlap])]
            msg = (f"protocol.embargoDays={self.embargo_days} < {LABEL_HORIZON_DAYS}: the labels (close t+1 -> t+2) "
                   f"of {int(overlap.sum())} training row(s) dated {', '.join(str(x.date()) for x in od)} overlap "
                   f"the test period starting {self.first_test_date.date()}")
            self.warnings.append(msg)
            warnings.warn(msg, UserWarning, stacklevel=3)
        if self.n_train == 0:
            raise ProtocolError(f"protocol.trainEnd ({t_end.date()}) with embargoDays={self.embargo_days}: no "
                                f"panel row is left for training (first test date {self.first_test_date.date()})")
        if self.n_test == 0:
            raise ProtocolError(f"protocol.testStart ({t_start.date()}): no panel row has a date on or after it "
                                f"(the sampled panel ends {d.max().date()})")

    def split(self, X=None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield the one ``(train_idx, test_idx)`` pair (int64 row indices). ``X`` only checks the row count."""
        if X is not None and len(X) != len(self.train_mask):
            raise ValueError(f"X has {len(X)} rows but the split was built for {len(self.train_mask)} dates")
        yield np.flatnonzero(self.train_mask), np.flatnonzero(self.test_mask)

    def get_n_splits(self) -> int:
        """Always 1."""
        return 1

    def summary(self) -> dict:
        """JSON-ready description: counts, first test date, embargo and warnings."""
        return {"train_end": self.train_end.date().isoformat(), "test_start": self.test_start.date().isoformat(),
                "first_test_date": self.first_test_date.date().isoformat(), "embargo_days": self.embargo_days,
                "n_train": self.n_train, "n_test": self.n_test, "n_embargoed": self.n_embargoed,
                "n_gap": self.n_gap, "last_train_row_date": self.last_train_row_date.date().isoformat(),
                "first_test_row_date": self.first_test_row_date.date().isoformat(), "warnings": list(self.warnings)}


def check_group_k_folds(n_splits: int, n_securities: int) -> None:
    """Raises :class:`ProtocolError` when leakage-on's ``protocol.groupKFolds`` exceeds the panel's securities
    (every fold needs at least one security); the one check preflight and the evaluation share."""
    if n_securities < n_splits:
        raise ProtocolError(f"protocol.groupKFolds: {n_splits} folds exceed the {n_securities} securities of "
                            "the sampled panel")


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


def security_folds_batch(sizes: np.ndarray, n_splits: int, field: str = "protocol.groupKFolds",
                         min_present: int | None = None) -> np.ndarray:
    """:func:`security_folds` for B weightings at once: ``sizes`` int [B, S] (rows of each security in each
    weighting, multiplicities included) → int64 [B, S] folds (-1 where the size is 0).

    The same greedy rule as scikit-learn's ``GroupKFold`` (no shuffle; checked against it): groups in
    descending order of size (a stable argsort of the sizes, reversed), each to the fold with the fewest rows so
    far (the first such fold on ties); absent securities (size 0) sort last and change no other assignment.
    Vectorised over the B weightings: one Python step per security instead of one GroupKFold call per weighting.
    Raises :class:`ProtocolError` when a weighting has fewer securities than folds, or, with ``min_present``,
    fewer than ``min_present``: a weighting with fewer securities than folds then puts each security in a fold
    of its own (leave-one-security-out) and leaves the other folds empty, which a score pooled over the folds
    ignores (the penalty selection in a security-resampled replicate that drew few distinct securities)."""
    z = np.asarray(sizes, dtype=np.int64)
    if z.ndim != 2:
        raise ValueError(f"sizes must be [B, S], got shape {z.shape}")
    B, S = z.shape
    present = (z > 0).sum(axis=1)
    if B and min_present is not None and present.min() < min_present:
        raise ProtocolError(f"{field}: a fitting set of a resampled replicate has {int(present.min())} distinct "
                            f"securit{'y' if present.min() == 1 else 'ies'}; {min_present} are needed to split it "
                            "by security (raise dataset.universeSize)")
    if B and min_present is None and present.min() < n_splits:
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
    cal = _checked_calendar(calendar)
    d = pd.DatetimeIndex(dates)
    pos = cal.get_indexer(d)
    if (pos < 0).any():
        raise ProtocolError(f"panel date {d[pos < 0][0].date()} is not a trading day of the {cal.name or 'panel'} "
                            "calendar (dataset.calendar: 'panel' counts the price file's own days)")
    return pos.astype(np.int64)


class DateFolds:
    """A date-block protocol (:class:`WalkForwardSplit`, :class:`PurgedKFoldSplit`) applied to a panel's row
    dates: ``fold_train``, ``fold_test``, ``fold_removed`` bool [K, n_rows] (removed: rows outside the test
    block dropped by the embargo or the purge), ``fold_dates`` the test block's first and last date per fold,
    and the splitter's ``name``, ``description`` and ``embargo_days``."""

    def __init__(self, splitter, fold_train: np.ndarray, fold_test: np.ndarray, fold_removed: np.ndarray,
                 fold_dates: list[tuple[pd.Timestamp, pd.Timestamp]]):
        self.name, self.description, self.embargo_days = splitter.name, splitter.description, splitter.embargo_days
        self.fold_train, self.fold_test, self.fold_removed, self.fold_dates = (fold_train, fold_test, fold_removed,
                                                                               fold_dates)

    def split(self, X=None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield ``(train_idx, test_idx)`` (int64 row indices) per fold, in date order of the test block."""
        if X is not None and len(X) != self.fold_train.shape[1]:
            raise ValueError(f"X has {len(X)} rows but the split was built for {self.fold_train.shape[1]} dates")
        for tr, te in zip(self.fold_train, self.fold_test):
            yield np.flatnonzero(tr), np.flatnonzero(te)

    def get_n_splits(self) -> int:
        """Number of folds K."""
        return int(self.fold_train.shape[0])

    def summary(self) -> dict:
        """JSON-ready description: per fold the test date range and row counts (train, test, removed)."""
        return {"n_splits": self.get_n_splits(), "embargo_days": self.embargo_days,
                "folds": [{"test_first_date": a.date().isoformat(), "test_last_date": b.date().isoformat(),
                           "n_train": int(tr.sum()), "n_test": int(te.sum()), "n_removed": int(rm.sum())}
                          for (a, b), tr, te, rm in zip(self.fold_dates, self.fold_train, self.fold_test,
                                                        self.fold_removed)]}


class _DateBlockSplit:
    """Common part of the date-block K-fold splitters: parameters and :meth:`split`; each subclass's ``apply(dates)``
    returns the :class:`DateFolds` of the rows whose trading days are ``dates`` (datetime64 [n_rows])."""

    name = ""
    description = ""

    def __init__(self, n_splits: int, embargo_days: int, calendar: pd.DatetimeIndex):
        self.n_splits, self.embargo_days = int(n_splits), int(embargo_days)
        self.calendar = _checked_calendar(calendar)

    def split(self, dates) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield ``(train_idx, test_idx)`` (int64 row indices of ``dates``) per fold, in date order."""
        yield from self.apply(dates).split()

    def get_n_splits(self) -> int:
        """Number of folds K."""
        return self.n_splits


class WalkForwardSplit(_DateBlockSplit):
    """Walk-forward (expanding window) protocol: K folds over the panel's distinct dates, in date order.

    The distinct panel dates are cut into K+1 contiguous blocks by scikit-learn ``TimeSeriesSplit(n_splits=K)``
    (the first block takes the remainder); fold k (k = 1..K) tests on block k and trains on every earlier
    row less the embargo: a training row at date t needs ``calendar_index(t) < calendar_index(T0_k) -
    embargo_days``, T0_k the first date of block k (the same rule as :class:`ChronologicalSplit`; the row's
    label window t+1..t+2 must end before the test block starts, so ``embargo_days >= 2`` is advised).

    Parameters: ``n_splits`` K (``protocol.walkForwardFolds``); ``embargo_days``, trading days on ``calendar``
    (all trading days, sorted, unique). :meth:`apply` raises :class:`ProtocolError` when the panel has fewer
    than K+1 dates or a fold has no training row.
    """

    name = "walk-forward"
    description = ("walk-forward, expanding window: the distinct panel dates cut into K+1 blocks (scikit-learn "
                   "TimeSeriesSplit); fold k tests on block k, trains on all earlier rows less the embargo; "
                   "headline R² = mean of the per-fold R²")

    def apply(self, dates) -> DateFolds:
        """The K walk-forward folds of ``dates`` (class docstring)."""
        from sklearn.model_selection import TimeSeriesSplit

        pos, cal, n_splits = _calendar_positions(dates, self.calendar), self.calendar, self.n_splits
        udates = np.unique(pos)
        if len(udates) < n_splits + 1:
            raise ProtocolError(f"protocol.walkForwardFolds={n_splits} needs at least {n_splits + 1} distinct "
                                f"panel dates (the panel has {len(udates)})")
        tr_l, te_l, rm_l, fold_dates = [], [], [], []
        for _, te in TimeSeriesSplit(n_splits=n_splits).split(udates):
            first, last = udates[te[0]], udates[te[-1]]
            test = (pos >= first) & (pos <= last)
            before = pos < first
            train = before & (pos < first - self.embargo_days)
            if not train.any():
                raise ProtocolError(f"protocol.walkForwardFolds={n_splits} with embargoDays={self.embargo_days}: "
                                    f"the fold testing from {cal[first].date()} has no training row")
            tr_l.append(train)
            te_l.append(test)
            rm_l.append(before & ~train)
            fold_dates.append((cal[first], cal[last]))
        return DateFolds(self, np.stack(tr_l), np.stack(te_l), np.stack(rm_l), fold_dates)


class PurgedKFoldSplit(_DateBlockSplit):
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
    Parameters: ``n_splits`` K (``protocol.purgedFolds``), ``embargo_days``, ``calendar``, ``horizon``.
    :meth:`apply` raises :class:`ProtocolError` when the panel has fewer than K dates or a fold keeps no
    training row.
    """

    name = "purged-kfold"
    description = ("purged and embargoed K-fold over date blocks (López de Prado 2018, ch. 7): training rows whose "
                   "span [t, t+2] overlaps the test fold's are purged, plus embargoDays trading days after it; "
                   "headline R² pooled out-of-fold (1 − Σ SSE / Σ SST)")

    def __init__(self, n_splits: int, embargo_days: int, calendar: pd.DatetimeIndex,
                 horizon: int = LABEL_HORIZON_DAYS):
        super().__init__(n_splits, embargo_days, calendar)
        self.horizon = int(horizon)

    def apply(self, dates) -> DateFolds:
        """The K purged and embargoed folds of ``dates`` (class docstring)."""
        from sklearn.model_selection import KFold

        pos, cal, n_splits = _calendar_positions(dates, self.calendar), self.calendar, self.n_splits
        udates = np.unique(pos)
        if len(udates) < n_splits:
            raise ProtocolError(f"protocol.purgedFolds={n_splits} exceeds the number of distinct panel dates "
                                f"({len(udates)})")
        tr_l, te_l, rm_l, fold_dates = [], [], [], []
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
            fold_dates.append((cal[first], cal[last]))
        return DateFolds(self, np.stack(tr_l), np.stack(te_l), np.stack(rm_l), fold_dates)


def protocol_splitters(protocol, calendar: pd.DatetimeIndex) -> dict:
    """The splitters of a LeakageEval's ``protocol`` block (:class:`pitlab.api.leakageeval.Protocol`) on the
    trading ``calendar``, built once for preflight and evaluation: ``chronological`` always, then
    ``walk-forward`` and ``purged-kfold`` when ``protocol.protocols`` asks for them (in that order). Raises
    :class:`ProtocolError` for parameters no panel could satisfy."""
    out: dict = {"chronological": ChronologicalSplit(protocol.train_end, protocol.test_start, protocol.embargo_days,
                                                     calendar)}
    if "walk-forward" in protocol.protocols:
        out["walk-forward"] = WalkForwardSplit(protocol.walk_forward_folds, protocol.embargo_days, calendar)
    if "purged-kfold" in protocol.protocols:
        out["purged-kfold"] = PurgedKFoldSplit(protocol.purged_folds, protocol.embargo_days, calendar)
    return out


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
