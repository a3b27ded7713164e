"""The ridge penalty chosen inside every fitting set (:class:`AlphaSelection`, :func:`select_alpha`): GCV, inner
GroupKFold by security, or date blocks purged and embargoed like the outer split; scored per α on the inner
folds by eigendecompositions or, on a GPU, batched Cholesky solves (:mod:`pitlab.evaluator.ridge`)."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import numpy as np

from pitlab.evaluator.linalg import Backend, to_numpy, xp
from pitlab.evaluator.protocols import date_block_folds, security_folds_batch
from pitlab.evaluator.ridge import (CHOLESKY_BATCH_BYTES, RidgeFit, RowStats, SuffStats, _like, cholesky_path_test_sse,
                                   fit_ridge_at, fit_ridge_gcv, gcv_scores, path_test_sse, ridge_paths)

ALPHA_SELECTIONS = ("gcv", "security-cv", "date-blocked")


@dataclass(frozen=True)
class AlphaSelection:
    """How the ridge penalty is chosen inside every fitting set.

    ``method``: ``"gcv"`` — generalised cross-validation (the spec's ``regression`` block); with
    ``duplicate_aware`` the copies of a security in a bootstrap replicate count as one error (see
    :func:`pitlab.evaluator.ridge.fit_ridge_gcv`). ``"security-cv"`` — ``inner_folds``-fold GroupKFold by
    security inside the fitting set (all copies of a security in one inner fold), α minimising the pooled
    inner out-of-fold SSE, then refitted on the whole fitting set. GCV approximates leave-one-*row*-out and so
    rewards fitting what rows of one security or one date share; security-CV scores α on unseen securities,
    like the leakage-on protocol does. ``"date-blocked"`` — ``inner_folds`` contiguous blocks of the fitting
    set's dates, purged and embargoed by ``embargo_days`` trading days around each block
    (:func:`pitlab.evaluator.protocols.date_block_folds`): the selection of a protocol whose outer split
    respects time (chronological, walk-forward, purged K-fold), which never scores α on a date it was fitted
    on; it needs row units with calendar positions (:meth:`PanelStats.build_rows` with ``positions``).
    """

    method: str = "gcv"
    inner_folds: int = 5
    duplicate_aware: bool = True
    embargo_days: int = 0

    def __post_init__(self):
        if self.method not in ALPHA_SELECTIONS:
            raise ValueError(f"alpha selection must be one of {ALPHA_SELECTIONS} (got {self.method!r})")
        if self.inner_folds < 2:
            raise ValueError(f"inner_folds must be >= 2 (got {self.inner_folds})")
        if self.embargo_days < 0:
            raise ValueError(f"embargo_days must be >= 0 (got {self.embargo_days})")

    @property
    def fits_per_set(self) -> int:
        """Eigendecompositions per fitting set when α is selected."""
        return 1 if self.method == "gcv" else self.inner_folds

    def describe(self) -> str:
        """One phrase for reports: how α is chosen."""
        if self.method == "gcv":
            return ("generalised cross-validation (GCV; Golub, Heath & Wahba 1979)"
                    + ("; in bootstrap replicates the copies of a security share one error in GCV's degrees of "
                       "freedom (Altman 1990)" if self.duplicate_aware else ""))
        if self.method == "date-blocked":
            return (f"{self.inner_folds} contiguous date blocks inside the training set, each purged and embargoed "
                    f"({self.embargo_days} trading days) as the outer split (pooled inner out-of-fold SSE), then "
                    "refitted on the whole training set")
        return (f"{self.inner_folds}-fold GroupKFold by security inside the training set (pooled inner "
                "out-of-fold SSE), then refitted on the whole training set")


def _gcv_copies(units: SuffStats, w_b, selection: AlphaSelection) -> SuffStats | None:
    """Duplicate-aware GCV: the statistics weighted by the squared multiplicities ``w_b`` [B, S] (on the
    backend), or None when not asked for or no unit is drawn twice."""
    if selection.duplicate_aware and np.any(to_numpy(w_b) > 1):
        return units.weighted(w_b * w_b)
    return None


def select_alpha(units: SuffStats, w, alphas, selection: AlphaSelection, fitting: SuffStats | None = None,
                 backend: Backend | None = None, targets: int = 1):
    """Grid position of the chosen α for B weighted unions of ``units`` (per-security statistics, m = S):
    ``w`` [B, S] multiplicities (numpy or the backend's). Returns ``(alpha_index`` int64 numpy [B],
    ``score`` [B, A]``)``: the GCV score on the backend, or the pooled inner-CV SSE as float64 numpy (NaN at
    the α the GPU's two-stage search did not score, :func:`staged_argmin`).

    security-cv: inner folds by :func:`pitlab.evaluator.protocols.security_folds` on each weighting (all copies
    of a security in one fold); per inner fold the training statistics are the fitting set minus the inner
    test set, eigendecomposed once for the whole grid (:func:`pitlab.evaluator.ridge.ridge_path`), and scored
    on the inner test statistics (:func:`pitlab.evaluator.ridge.path_test_sse`). With ``backend.cholesky_path``
    (torch on CUDA by default) the B·k inner training sets are instead solved once per α by batched Cholesky
    (:func:`pitlab.evaluator.ridge.cholesky_path_test_sse`): the same SSE up to rounding.

    ``targets`` T > 1: ``units`` are statistics of ``[X, y_1, .., y_{T-1}]`` with target ``y_0``
    (:meth:`pitlab.evaluator.ridge.SuffStats.target`); every target's α is chosen on the same folds, sharing
    each fold's factorisations, and the two returned values are lists of T.
    """
    w_b = _like(units.n, w)
    fitting = units.weighted(w_b) if fitting is None else fitting
    m = xp(w_b)
    d = units.d - targets + 1
    if selection.method == "gcv":
        views = [fitting.target(t, d) for t in range(targets)] if targets > 1 else [fitting]
        copies = _gcv_copies(units, w_b, selection)
        if copies is not None and targets > 1:
            copies = copies.target(0, d)
        scores = [gcv_scores(p, copies)[0] for p in ridge_paths(views, alphas)]
        ks = [to_numpy(m.argmin(sc, axis=1)).astype(np.int64) for sc in scores]
        return (ks, scores) if targets > 1 else (ks[0], scores[0])
    k = selection.inner_folds
    field_ = "regression.innerFolds"
    if selection.method == "date-blocked":
        pos = getattr(units, "unit_pos", None)
        if pos is None:
            raise ValueError("date-blocked penalty selection needs row units with calendar positions")
        Wn = to_numpy(w_b) * to_numpy(units.n)[None, :]
        tr, te = date_block_folds(pos, Wn, k, selection.embargo_days, field=field_)
        removed = (Wn > 0)[:, None, :] & ~tr & ~te  # purged or embargoed: few rows
        inner_test = _fold_stats(units, w_b, te)
        inner_train = fitting.take(np.repeat(np.arange(w_b.shape[0]), k)) - inner_test
        if removed.any():
            inner_train = inner_train - _fold_stats(units, w_b, removed)
        return _scored(inner_train, inner_test, alphas, backend, w_b.shape[0], k, m, targets)
    rows = np.rint(to_numpy(units.n)).astype(np.int64)
    unit_sec = getattr(units, "unit_security", None)
    wi = np.rint(to_numpy(w_b)).astype(np.int64)
    if unit_sec is None:  # units are securities
        inner = security_folds_batch(rows[None, :] * wi, k, field=field_, min_present=2)  # [B, S]
    else:  # units are rows: inner GroupKFold by their securities (sizes = weighted rows per security)
        n_sec = int(unit_sec.max()) + 1
        sizes = np.stack([np.bincount(unit_sec, weights=r, minlength=n_sec) for r in wi * rows[None, :]])
        sizes = np.rint(sizes).astype(np.int64)
        inner = security_folds_batch(sizes, k, field=field_, min_present=2)[:, unit_sec]  # [B, m]
    inner_test = _fold_stats(units, w_b, inner[:, None, :] == np.arange(k)[None, :, None])
    inner_train = fitting.take(np.repeat(np.arange(w_b.shape[0]), k)) - inner_test
    return _scored(inner_train, inner_test, alphas, backend, w_b.shape[0], k, m, targets)


def _fold_stats(units: SuffStats, w_b, masks: np.ndarray) -> SuffStats:
    """Statistics of the B·k sets ``w_b[b] · masks[b, j]`` (``w_b`` [B, m] on the backend, ``masks`` bool numpy
    [B, k, m]), set b·k + j at that position. Row units (:class:`pitlab.evaluator.ridge.RowStats`) are summed one
    j at a time: the rows of one inner fold that a batch of replicates weights alike then form few classes."""
    B, k, m_ = masks.shape
    if not isinstance(units, RowStats):
        return units.weighted((w_b[:, None, :] * _like(units.n, masks.astype(np.float64))).reshape(-1, m_))
    parts = [units.weighted(w_b * _like(units.n, masks[:, j, :].astype(np.float64))) for j in range(k)]
    m = xp(w_b)

    def inter(name: str):
        a = m.stack([getattr(p, name) for p in parts], axis=1) if m is np else \
            m.stack([getattr(p, name) for p in parts], dim=1)
        return a.reshape((B * k,) + tuple(a.shape[2:]))

    return SuffStats(**{f: inter(f) for f in ("n", "sx", "sy", "syy", "sxx", "sxy")})


def _scored(inner_train: SuffStats, inner_test: SuffStats, alphas, backend: Backend | None, B: int, k: int, m,
            targets: int = 1):
    """Grid position of the α with the smallest pooled inner out-of-fold SSE, and that SSE [B, A], from the
    B·k inner training and test sets (fitting set b's folds at rows b·k .. b·k + k - 1); lists of ``targets``
    when T > 1 (:func:`select_alpha`)."""
    d = inner_train.d - targets + 1
    trains = [inner_train.target(t, d) for t in range(targets)] if targets > 1 else [inner_train]
    tests = [inner_test.target(t, d) for t in range(targets)] if targets > 1 else [inner_test]
    a = np.asarray(alphas, dtype=np.float64)
    anchors = decade_anchors(a)
    if backend is not None and backend.cholesky_path:  # one solve per α scored: the anchors, then each window
        cv = [np.full((B, a.size), np.nan) for _ in range(targets)]
        score = _cholesky_scorer(trains, tests, a, backend, B, k, cv)
        score(anchors, np.ones(B, dtype=bool))
        need = np.logical_or.reduce([_window_mask(c, anchors) for c in cv])  # [B, A]: what each row reads
        need &= np.isnan(cv[0])
        by_rows: dict[bytes, list[int]] = {}  # grid positions grouped by the rows that read them
        for p in np.flatnonzero(need.any(axis=0)):
            by_rows.setdefault(need[:, p].tobytes(), []).append(int(p))
        for rows, pos in by_rows.items():
            score(np.asarray(pos, dtype=np.int64), np.frombuffer(rows, dtype=bool))
    else:  # one eigendecomposition serves every α: the whole grid is scored
        cv = [to_numpy(path_test_sse(p, te).reshape(B, k, -1).sum(axis=1))
              for p, te in zip(ridge_paths(trains, a), tests)]
    ks = [staged_argmin(c, anchors) for c in cv]
    return (ks, cv) if targets > 1 else (ks[0], cv[0])


_REMEMBERED = threading.local()


@contextlib.contextmanager
def remembered_scores():
    """Within the block, this thread's GPU penalty searches reuse an inner set's SSE at an α already solved in
    the block instead of factorising it again (the point estimates score the same folds again after each
    widening of the α grid). A set is recognised by the exact bits of a fingerprint of its training and test
    statistics (counts, sums and two random projections of the Gram and cross products)."""
    prev = getattr(_REMEMBERED, "scores", None)
    _REMEMBERED.scores = {} if prev is None else prev
    try:
        yield
    finally:
        _REMEMBERED.scores = prev


def _fingerprints(trains: list, tests: list) -> list[bytes]:
    """One bytes key per inner set [N]: its training and test statistics (every target) projected on fixed
    random vectors, float64 bits (identical inputs computed the same way give identical keys)."""
    import torch

    d = trains[0].d
    r = torch.randn(d, generator=torch.Generator().manual_seed(20261204), dtype=torch.float64)
    r = r.to(trains[0].sxx.device)
    cols = []
    for st in [trains[0], tests[0]] + trains[1:] + tests[1:]:
        cols += [st.n, st.sy, st.syy, st.sx @ r, st.sxy @ r, (st.sxx @ r) @ r]
    fp = to_numpy(torch.stack([c.reshape(-1).to(torch.float64) for c in cols], dim=1))
    return [row.tobytes() for row in fp]


def _cholesky_scorer(trains: list, tests: list, a: np.ndarray, backend: Backend, B: int, k: int, cv: list):
    """``score(pos, rows)``: fill ``cv[t][rows][:, pos]`` (pooled inner SSE of each target t) by batched Cholesky
    solves of only the inner sets of the fitting sets ``rows`` (bool [B]) whose test set is not empty; an empty
    inner test set scores exactly 0 at every α (as computing it gives), so it is not factorised. Inside
    :func:`remembered_scores` a set's SSE at an α solved before is taken from there. The pooled sum runs over the
    full [B·k] layout as before, so a row's scores do not depend on which other rows were solved."""
    import torch

    nonempty = (to_numpy(tests[0].n) > 0).reshape(B, k)
    device = tests[0].n.device
    memo = getattr(_REMEMBERED, "scores", None)
    keys = _fingerprints(trains, tests) if memo is not None else None

    batch = min(CHOLESKY_BATCH_BYTES, backend.memory_budget_bytes // 4)  # α sharing one solve: within the budget

    def solve(sets: np.ndarray, pos: np.ndarray) -> list:
        if sets.size == B * k:
            return cholesky_path_test_sse(trains, tests, a[pos], backend.cholesky_block, batch)
        return cholesky_path_test_sse([tr.take(sets) for tr in trains], [te.take(sets) for te in tests], a[pos],
                                      backend.cholesky_block, batch)

    def score(pos: np.ndarray, rows: np.ndarray) -> None:
        sets = np.flatnonzero((rows[:, None] & nonempty).reshape(-1))
        if memo is not None:
            full = _remembered(memo, keys, sets, pos, a, solve, len(cv), B * k)
            full = [torch.as_tensor(f, device=device) for f in full]
        else:
            full = [torch.zeros((B * k, pos.size), dtype=torch.float64, device=device) for _ in cv]
            if sets.size:
                sses = solve(sets, pos)
                at = torch.as_tensor(sets, device=device)
                for f, s in zip(full, sses):
                    f[at] = s
        for c, f in zip(cv, full):
            c[np.ix_(rows, pos)] = to_numpy(f.reshape(B, k, -1).sum(axis=1))[rows]

    return score


def _remembered(memo: dict, keys: list[bytes], sets: np.ndarray, pos: np.ndarray, a: np.ndarray, solve, T: int,
                n: int) -> list[np.ndarray]:
    """SSE [n, len(pos)] per target of the inner ``sets`` at the grid positions ``pos`` (0 elsewhere): from
    ``memo`` (``{(key, α): [SSE per target]}``) where there, else solved (``solve(sets, pos)``, one call per
    group of positions missing the same sets) and remembered."""
    missing: dict[tuple, list[int]] = {}
    for j, p in enumerate(pos):
        todo = tuple(int(i) for i in sets if (keys[i], float(a[p])) not in memo)
        if todo:
            missing.setdefault(todo, []).append(j)
    for todo, js in missing.items():
        sses = [to_numpy(s) for s in solve(np.asarray(todo, dtype=np.int64), pos[js])]
        for r, i in enumerate(todo):
            for c, j in enumerate(js):
                memo[(keys[i], float(a[pos[j]]))] = [float(s[r, c]) for s in sses]
    full = [np.zeros((n, pos.size)) for _ in range(T)]
    for i in sets:
        for j, p in enumerate(pos):
            got = memo[(keys[i], float(a[p]))]
            for t in range(T):
                full[t][i, j] = got[t]
    return full


def decade_anchors(alphas: np.ndarray) -> np.ndarray:
    """Grid positions int [C] of the coarse pass of the penalty search: the smallest α, then each next α at least
    a decade (× 10, within 1e-9) above the last anchor, and the largest. The default grid (four values per decade)
    gives its 7 decades; a grid of one value per decade, or one not ascending, is all anchors."""
    a = np.asarray(alphas, dtype=np.float64)
    if a.size < 3 or np.any(np.diff(a) <= 0):
        return np.arange(a.size)
    out = [0]
    for i in range(1, a.size - 1):
        if a[i] >= a[out[-1]] * 10.0 * (1 - 1e-9):
            out.append(i)
    out.append(a.size - 1)
    return np.asarray(out, dtype=np.int64)


def _window_mask(cv: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """bool [B, A]: the grid positions inside each row's refinement window (:func:`_windows`)."""
    lo, hi = _windows(cv, anchors)
    pos = np.arange(cv.shape[1])[None, :]
    return (pos >= lo[:, None]) & (pos <= hi[:, None])


def _windows(cv: np.ndarray, anchors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and last grid positions int [B] of each row's refinement window: from the anchor below the first
    to the anchor above the last of its best anchors (tied within :data:`TIE_RTOL`, as
    :func:`argmin_ties_largest`; a flat stretch such as the large-α plateau, where every fit is shrunk to the
    intercept, keeps the whole stretch and the values just before it in the window)."""
    s = cv[:, anchors]
    lo = np.min(s, axis=1, keepdims=True)
    tied = s <= lo + TIE_RTOL * np.maximum(np.abs(lo), np.finfo(float).tiny)
    first, last = np.argmax(tied, axis=1), anchors.size - 1 - np.argmax(tied[:, ::-1], axis=1)
    return anchors[np.maximum(first - 1, 0)], anchors[np.minimum(last + 1, anchors.size - 1)]


def staged_argmin(cv, anchors: np.ndarray) -> np.ndarray:
    """Grid position int64 [B] of the penalty search: the best decade anchors (:func:`decade_anchors`), then the
    best α between their neighbouring anchors (:func:`_windows`; :func:`argmin_ties_largest`, the largest α
    among ties). Scores ``cv`` [B, A] (NaN where not computed: only anchors and windows are read). Equal to the
    whole grid's argmin whenever the score is unimodal in α; on the GPU it needs 13 solves of the default
    25-value grid when the rows agree on their best decade."""
    s = np.asarray(to_numpy(cv), dtype=np.float64)
    if anchors.size == s.shape[1]:
        return argmin_ties_largest(s)
    return argmin_ties_largest(np.where(_window_mask(s, anchors), s, np.inf))


TIE_RTOL = 1e-9
"""Scores within this relative distance of the minimum count as tied (rounding, not evidence)."""


def argmin_ties_largest(score: np.ndarray) -> np.ndarray:
    """Grid position of the smallest score per row of ``score`` float [B, A] (α ascending), the largest α among
    those tied within :data:`TIE_RTOL` of the minimum: when the grid cannot tell penalties apart (features that
    are constant on every inner test block, e.g. a date indicator under date-blocked folds), the most shrunk
    fit is taken, and rounding differences between backends cannot pick different α. int64 [B]."""
    s = np.asarray(score, dtype=np.float64)
    lo = np.min(s, axis=1, keepdims=True)
    tied = s <= lo + TIE_RTOL * np.maximum(np.abs(lo), np.finfo(float).tiny)
    return (s.shape[1] - 1 - np.argmax(tied[:, ::-1], axis=1)).astype(np.int64)


def fit_selected(units: SuffStats, w: np.ndarray, alphas, selection: AlphaSelection,
                 fitting: SuffStats | None = None) -> RidgeFit:
    """Ridge fits on B weighted unions of ``units`` (per-security statistics), ``w`` [B, n_units]
    multiplicities, with α chosen by ``selection`` (:func:`select_alpha`); the fit carries the whole path's
    diagnostics (score and df per α). ``fitting``: ``units.weighted(w)`` if already computed."""
    w_b = _like(units.n, w)
    fitting = units.weighted(w_b) if fitting is None else fitting
    if selection.method == "gcv":
        return fit_ridge_gcv(fitting, alphas, _gcv_copies(units, w_b, selection))
    idx, cv_sse = select_alpha(units, w, alphas, selection, fitting)
    return fit_ridge_at(fitting, alphas, idx, cv_sse, selection.method)
