"""Split protocols for the leakage measurement (DESIGN section 4.7), as scikit-learn cross-validators.

* leakage-off: :class:`ChronologicalSplit`, one split; training dates end ``embargo_days`` trading days
  before the first test date.
* leakage-on: scikit-learn's ``GroupKFold`` with groups = security (disjoint securities, all dates mixed);
  :func:`security_folds` gives the fold of each security, also for a bootstrap replicate in which a security
  is drawn several times (every copy keeps one group label, so all copies land in the same fold).

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

LABEL_HORIZON_DAYS = 2
"""The JPX target of a row at t is the close change from t+1 to t+2: its label window ends 2 trading days later."""


class ProtocolError(ValueError):
    """A split cannot be made from the panel and the spec's ``protocol`` (the message names the field)."""


class ChronologicalSplit:
    """leakage-off: one chronological train/test split with an embargo counted in trading days.

    Parameters
    ----------
    dates : array-like of datetime64, shape [n_rows]
        Trading day t of each panel row; every date must be a day of ``calendar``.
    calendar : pd.DatetimeIndex
        Every trading day of the source panel (sorted, unique); embargo days are counted on it.
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
        if embargo_days < 0:
            raise ProtocolError(f"protocol.embargoDays must be >= 0 (got {embargo_days})")
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
            raise ProtocolError(f"panel date {bad.date()} is not a trading day of the panel calendar")
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
