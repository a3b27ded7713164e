"""What every model of one evaluation shares (:class:`EvalSetup`): the penalty selections, the splits, the codes
of the rows and the bootstrap draws, prepared once per evaluation (:func:`prepare_evaluation`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pitlab.api.leakageeval import LeakageEvalSpec
from pitlab.data.types import Panel
from pitlab.errors import InputError
from pitlab.evaluator.bootstrap import (IntervalRule, draw_weights, replicate_folds, replicate_row_folds, row_weights,
                                       two_way_split)
from pitlab.evaluator.decompose import market_neutral
from pitlab.evaluator.estimates import AlphaSelection
from pitlab.evaluator.linalg import Backend
from pitlab.evaluator.protocols import (ChronologicalFolds, _calendar_positions, check_group_k_folds,
                                        protocol_splitters, security_folds, trading_calendar)


class EvaluationError(InputError, ValueError):
    """The panel or the model list cannot be evaluated (the message names the field or model). Exit code 2,
    ``InvalidSpec``."""


@dataclass
class EvalSetup:
    """What every model of one evaluation shares: the penalty selection and grid, the splits (leakage-off, the
    extra date-block protocols), the security and date codes of the rows, the bootstrap draws (``weights``
    float [B, units], their GroupKFold ``folds``) and the point estimate's folds (``point_folds`` int [1, units]);
    ``split`` and ``extra`` are the ``splitters`` (:func:`pitlab.evaluator.protocols.protocol_splitters`) applied
    to the rows' ``dates``.
    ``selection`` chooses leakage-on's penalty, ``time_selection`` that of the date protocols; ``row_units``:
    the units weighted are the rows (date-aware bootstrap or date-blocked selection), else the securities;
    ``positions`` int [n_rows] calendar positions; ``y_neutral`` the market-neutral target; ``rule`` how
    intervals are read from the replicates (:class:`pitlab.evaluator.bootstrap.IntervalRule`)."""

    selection: AlphaSelection
    time_selection: AlphaSelection
    alphas: list[float]
    benchmark: str
    backend: Backend
    reselect: bool
    calendar: pd.DatetimeIndex
    extra: dict
    split: ChronologicalFolds
    dates: np.ndarray
    codes: np.ndarray
    n_securities: int
    y: np.ndarray
    prompts: list[str]
    w_sec: np.ndarray
    w_date: np.ndarray
    ones: np.ndarray
    point_folds: np.ndarray
    weights: np.ndarray
    folds: np.ndarray
    draws_s: float
    row_units: bool
    positions: np.ndarray
    date_codes: np.ndarray
    n_dates: int
    y_neutral: np.ndarray
    rule: IntervalRule = IntervalRule()
    splitters: dict = field(default_factory=dict)


def _selections(spec: LeakageEvalSpec, alpha_selection: AlphaSelection | str | None) -> tuple:
    """(leakage-on's selection, the date protocols' selection). ``protocol-cv``: GroupKFold by security for
    leakage-on, date blocks embargoed by ``protocol.embargoDays`` for the others; an override applies to both."""
    k = spec.regression.inner_folds
    method = spec.regression.selection if alpha_selection is None else alpha_selection
    if isinstance(method, AlphaSelection):
        return method, method
    if method == "protocol-cv":
        return (AlphaSelection("security-cv", inner_folds=k),
                AlphaSelection("date-blocked", inner_folds=k, embargo_days=spec.protocol.embargo_days))
    return AlphaSelection(method, inner_folds=k), AlphaSelection(method, inner_folds=k)


def prepare_evaluation(spec: LeakageEvalSpec, panel: Panel,
                       alpha_selection: AlphaSelection | str | None = None) -> EvalSetup:
    """The splits and the bootstrap draws every model of ``spec`` is evaluated on (see :class:`EvalSetup`).
    Raises :class:`EvaluationError` for non-positive ``regression.alphas``, :class:`ProtocolError` for more
    folds than securities or splits the panel cannot make."""
    selection, time_selection = _selections(spec, alpha_selection)
    alphas = list(spec.regression.alphas)
    if any(not np.isfinite(a) or a <= 0 for a in alphas):
        raise EvaluationError(f"regression.alphas must be positive (got {alphas})")
    proto, boot, rows = spec.protocol, spec.bootstrap, panel.rows
    backend = Backend.resolve(spec.regression.device)
    calendar = trading_calendar(spec.dataset.calendar, spec.dataset.kind, panel.calendar)
    splitters = protocol_splitters(proto, calendar)
    dates = rows["date"].to_numpy()
    split = splitters["chronological"].apply(dates)
    extra = {name: sp.apply(dates) for name, sp in splitters.items() if name != "chronological"}
    codes, securities = pd.factorize(rows["security"].astype(str), sort=True)
    S, K = len(securities), proto.group_k_folds
    rows_per_sec = np.bincount(codes, minlength=S)
    check_group_k_folds(K, S)
    t0 = time.perf_counter()
    date_codes, udates = pd.factorize(pd.DatetimeIndex(rows["date"]), sort=True)
    strata = date_strata(date_codes, len(udates), split.train_mask, split.test_mask)
    w_sec, w_date = draw_weights(boot.cluster, S, len(udates), boot.resamples, boot.seed, strata)
    rule = (IntervalRule(boot.confidence, "two-way", two_way_split(boot.resamples), S, len(udates))
            if boot.cluster == "two-way" else IntervalRule(boot.confidence))
    row_units = boot.cluster != "security" or time_selection.method == "date-blocked"
    if not row_units:  # units = securities: per-security statistics
        ones = np.ones((1, S))
        point_folds = security_folds(rows_per_sec, K)[None, :]
        weights = w_sec
        folds = replicate_folds(rows_per_sec, weights, K)  # shared by every model, like the weights
    else:  # units = rows, weighted by their date's (and security's) multiplicity; folds still by security
        ones = np.ones((1, len(rows)))
        point_folds = security_folds(rows_per_sec, K)[codes][None, :]
        weights = row_weights(w_sec, w_date, codes, date_codes)
        folds = replicate_row_folds(codes, S, weights, K)
    y = rows["target"].to_numpy(dtype=np.float64)
    return EvalSetup(selection, time_selection, alphas, spec.regression.benchmark, backend, boot.reselect_penalty,
                     calendar, extra, split, dates, codes, S, y,
                     rows["prompt"].astype(str).tolist(), w_sec, w_date, ones, point_folds, weights, folds,
                     time.perf_counter() - t0, row_units, _calendar_positions(rows["date"].to_numpy(), calendar),
                     date_codes, len(udates), market_neutral(y, date_codes), rule, splitters)


def rows_frame(panel: Panel, setup: EvalSetup) -> pd.DataFrame:
    """rows.csv: one row per panel row, in the order of the embeddings (row i of every model's matrix): ``row``,
    ``date`` (YYYY-MM-DD), ``security``, ``target`` and ``target_market_neutral`` (float64, as fitted),
    ``leakage_off`` (``train``, ``embargoed``, ``test`` or ``gap``: after trainEnd, before the first test date),
    ``leakage_on_fold`` (the point estimate's GroupKFold fold, 0-based) and ``prompt`` (the text embedded): what
    a premium is recomputed from, with the embeddings."""
    split = setup.split
    role = np.full(len(setup.y), "gap", dtype=object)
    role[split.train_mask], role[split.embargo_mask], role[split.test_mask] = "train", "embargoed", "test"
    folds = setup.point_folds[0] if setup.row_units else setup.point_folds[0][setup.codes]
    rows = panel.rows
    return pd.DataFrame({"row": np.arange(len(rows)), "date": pd.DatetimeIndex(rows["date"]).strftime("%Y-%m-%d"),
                         "security": rows["security"].astype(str).to_numpy(), "target": setup.y,
                         "target_market_neutral": setup.y_neutral, "leakage_off": role,
                         "leakage_on_fold": folds.astype(np.int64), "prompt": setup.prompts})


def date_strata(date_codes: np.ndarray, n_dates: int, train_mask: np.ndarray, test_mask: np.ndarray) -> np.ndarray:
    """Stratum of every panel date for the two-way bootstrap's date draws, int [n_dates]: 0 = a leakage-off
    training date, 2 = a test date, 1 = neither (embargoed or outside both sides)."""
    out = np.ones(n_dates, dtype=np.int64)
    out[np.unique(np.asarray(date_codes)[np.asarray(train_mask, dtype=bool)])] = 0
    out[np.unique(np.asarray(date_codes)[np.asarray(test_mask, dtype=bool)])] = 2
    return out
