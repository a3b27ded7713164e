"""Sufficient statistics of single-row units (:class:`RowStats`): the rows themselves, summed per weighting of a
two-way or date bootstrap, with the per-label and per-class shortcuts that make those sums cheap."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from pitlab.evaluator.linalg import is_torch, to_numpy, xp
from pitlab.evaluator.suffstats import SuffStats, _index_like, _like, _like_index


@dataclass(frozen=True)
class RowStats:
    """The sufficient statistics of m single-row units (each unit one panel row), kept as the rows themselves.

    Used when a bootstrap weights rows individually (``bootstrap.cluster: date`` or ``security-and-date``: a
    row's multiplicity is its date's, or its security's times its date's), where per-security statistics no
    longer suffice. ``X`` float64 [r, d] and ``y`` [r]: the rows present (numpy or torch); ``index`` int64 numpy
    [r]: the unit of each row in 0..m-1; ``unit_security`` int64 numpy [m]: the security of every unit (inner
    and outer GroupKFold group units by it). Only :meth:`weighted`, ``n``, ``m`` and ``d`` are offered: a
    weighted sum costs (rows with nonzero weight)·d² per weighting (instead of S·d² for per-security
    statistics; the k inner folds of a replicate partition its rows, so together they cost one pass) and no
    per-unit d × d matrix is ever stored. ``unit_pos`` int64 numpy [m] (optional): the calendar position of
    every unit, for date-blocked inner folds. With few features (:data:`PACKED_ROW_TERMS_BYTES`) the rows'
    own products are packed once, [r, 1 + d + 2 + d(d+1)/2], and a weighted sum is one matrix product.
    ``codes`` int64 numpy [r] (optional): the rows are indicator rows, ``X[i] = e_{codes[i]} − code_shift``
    (``code_shift`` float64 [d], the column means removed by centring; the date-only baseline): then a
    weighted sum needs only each code's weighted count and Σy, [r, 3 + 2d] per row, and ``XᵀX`` follows as
    ``diag(c) − c μᵀ − μ cᵀ + N μ μᵀ`` (c the weighted counts, N their total, μ the shift).
    """

    X: object
    y: object
    index: np.ndarray
    m_units: int
    unit_security: np.ndarray
    unit_pos: np.ndarray | None = None
    codes: np.ndarray | None = None
    code_shift: np.ndarray | None = None

    @property
    def m(self) -> int:
        """Number of units."""
        return self.m_units

    @property
    def d(self) -> int:
        """Number of features."""
        return int(self.X.shape[1])

    def _packed_terms(self):
        """The packed per-row products (:func:`_packed_row_terms`), built once, or None."""
        if "_packed" not in self.__dict__:
            object.__setattr__(self, "_packed", _packed_row_terms(self))  # frozen dataclass: a cache
        return self.__dict__["_packed"]

    @property
    def n(self):
        """Rows per unit, float64 [m] (1 for a present row, 0 otherwise) on the rows' backend."""
        n = np.zeros(self.m_units)
        n[self.index] = 1.0
        return _like(self.X, n)

    def weighted(self, weights) -> SuffStats:
        """Statistics of B weighted unions: ``weights`` [B, m] → SuffStats with m = B, equal to
        :meth:`SuffStats.weighted` of the per-row statistics (``XᵀX`` as ``Xᵀ diag(w) X``, one batched product)."""
        W = _like(self.X, weights)
        if W.ndim != 2 or W.shape[1] != self.m_units:
            raise ValueError(f"weights must have shape [B, {self.m_units}], got {tuple(W.shape)}")
        ix = self.index if not is_torch(W) else _index_like(W, self.index)
        Wr = W[:, ix]  # [B, r]
        m = xp(W)
        d = self.d
        if self.codes is not None:
            return self._weighted_indicators(Wr)
        packed = self._packed_terms()
        if packed is not None:
            lo, hi = np.tril_indices(d)
            tot = Wr @ packed  # [B, 3 + d + d(d+1)/2]: n, Σy, Σy², Σx, Σxy, lower triangle of XᵀX
            sxx = m.zeros((W.shape[0], d * d), dtype=W.dtype) if m is np else W.new_zeros((W.shape[0], d * d))
            tri = tot[:, 3 + 2 * d:]
            sxx[:, lo * d + hi] = tri
            sxx[:, hi * d + lo] = tri
            return SuffStats(n=tot[:, 0], sx=tot[:, 3:3 + d], sy=tot[:, 1], syy=tot[:, 2],
                             sxx=sxx.reshape(W.shape[0], d, d), sxy=tot[:, 3 + d:3 + 2 * d])
        return self._weighted_rows(Wr)

    def _weighted_rows(self, Wr) -> SuffStats:
        """:meth:`weighted` of row weights ``Wr`` [B, r] for wide rows: weightings that weight every row of a
        security (or of a date) alike use that label's cached Gram matrices (:meth:`_label_gram`); the others,
        rows of a common support weighted alike per label, per class, else one pass over each one's rows."""
        B = int(Wr.shape[0])
        parts, rest = [], np.arange(B)
        for name in self._label_names():
            if not len(rest):
                break
            first, inverse = self._labels(name)
            Wrest = Wr[_like_index(Wr, rest)]
            Wl = Wrest[:, _like_index(Wr, first)]  # [b, L] each label's weight
            ok = to_numpy((Wrest == Wl[:, _like_index(Wr, inverse)]).all(axis=1))
            if not ok.any():
                continue
            cs = self._label_gram(name, None, first, inverse, build=int(ok.sum()) >= 2)
            if cs is None:
                continue
            parts.append((rest[ok], _combine(Wl[_like_index(Wr, np.flatnonzero(ok))], cs)))
            rest = rest[~ok]
        if len(rest):
            parts.append((rest, self._weighted_other(Wr[_like_index(Wr, rest)] if len(rest) < B else Wr)))
        if len(parts) == 1:
            return parts[0][1]
        order = np.concatenate([i for i, _ in parts])
        back = np.empty(B, dtype=np.int64)
        back[order] = np.arange(B)
        return _concat([p for _, p in parts]).take(back)

    def _label_names(self) -> tuple[str, ...]:
        """The labels rows can be grouped by: ``security``, and ``date`` when calendar positions are known."""
        return ("security",) if self.unit_pos is None else ("security", "date")

    def _labels(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(first row of every label int [L], label of every row int [r]) for ``security`` or ``date``."""
        key = f"_labels_{name}"
        if key not in self.__dict__:
            per_unit = self.unit_security if name == "security" else self.unit_pos
            _, first, inverse = np.unique(np.asarray(per_unit)[self.index], return_index=True, return_inverse=True)
            object.__setattr__(self, key, (first, inverse.reshape(-1)))
        return self.__dict__[key]

    def _label_gram(self, name: str, rows, first, inverse, build: bool = True):
        """Statistics of each label's rows (among ``rows`` int [r'], or all rows when None), ``inverse`` their
        label int [r'] and ``first`` [L]. Kept on this object: every row's, within :data:`CLASS_GRAM_BYTES` each
        (eight times as much on CUDA, at most an eighth of the device's memory; None beyond); a support's, while
        all kept together stay within that budget (computed afresh once it is spent: nothing is evicted, since
        inner folds come back in the same cycle every batch). ``build=False``: None unless kept already (one
        weighting alone costs no more by its own rows)."""
        L, d = len(first), self.d
        budget = CLASS_GRAM_BYTES
        if is_torch(self.X) and self.X.device.type == "cuda":
            import torch

            budget = min(8 * budget, torch.cuda.get_device_properties(self.X.device).total_memory // 8)
        size = L * d * d * 8
        if size > budget:
            return None
        key = (name, None if rows is None else np.asarray(rows, dtype=np.int64).tobytes(), L)
        with _GRAM_LOCK:  # batches run in threads: build each entry once
            if "_grams" not in self.__dict__:
                object.__setattr__(self, "_grams", {})  # frozen dataclass: a cache, not a field
            cache = self.__dict__["_grams"]
            if key in cache:
                return cache[key][1]
            if not build:
                return None
            ri = slice(None) if rows is None else _like_index(self.X, rows)
            cs = SuffStats.from_rows(self.X[ri], self.y[ri], inverse, L)
            if rows is None or sum(v[0] for v in cache.values()) + size <= budget:
                cache[key] = (size, cs)
            return cs

    def _weighted_other(self, Wr) -> SuffStats:
        """Row weightings that no label's cached Gram matrices serve: the rows some weighting draws, when every
        weighting weights them alike per security or per date (an inner date block of security-resampling
        replicates), from that support's cached per-label statistics; else per class or row by row."""
        m = xp(Wr)
        d = self.d
        rows = np.flatnonzero(to_numpy((Wr != 0).any(axis=0)))
        if int(Wr.shape[0]) >= 2 and 0 < len(rows) < int(Wr.shape[1]):
            Wn = Wr[:, _like_index(Wr, rows)]
            for name in self._label_names():
                lab = self._labels(name)[1][rows]
                _, first, inverse = np.unique(lab, return_index=True, return_inverse=True)
                inverse = inverse.reshape(-1)
                if bool((Wn == Wn[:, _like_index(Wr, first[inverse])]).all()):
                    cs = self._label_gram(name, rows, rows[first], inverse)
                    if cs is not None:
                        return _combine(Wn[:, _like_index(Wr, first)], cs)
        classes = self._weight_classes(Wr)
        if classes is not None:  # rows that every weighting weights alike: one Gram matrix per class
            rows, inverse, first = classes
            ri = _like_index(Wr, rows)
            cs = SuffStats.from_rows(self.X[ri], self.y[ri], inverse, len(first))
            return _combine(Wr[:, _like_index(Wr, first)], cs)
        W = Wr
        sxx = m.zeros((W.shape[0], d, d), dtype=W.dtype) if m is np else \
            W.new_zeros((W.shape[0], d, d))
        nz_all = to_numpy(Wr != 0)
        for b in range(W.shape[0]):  # only the rows weighting b draws: a replicate, or one inner fold of it
            nz = np.flatnonzero(nz_all[b])
            if len(nz) == 0:
                continue
            if m is not np:
                nz = _index_like(W, nz)
            Xb = self.X[nz]
            sxx[b] = m.swapaxes(Xb, 0, 1) @ (Xb * Wr[b, nz][:, None])
        return SuffStats(n=Wr.sum(axis=1), sx=Wr @ self.X, sy=Wr @ self.y, syy=Wr @ (self.y * self.y), sxx=sxx,
                         sxy=(Wr * self.y[None, :]) @ self.X)

    def _weight_classes(self, Wr):
        """Classes of rows whose weight is the same in every weighting of ``Wr`` [B, r] (a date-resampling
        replicate weights all rows of a date alike, a security-resampling one all rows of a security), as
        (rows some weighting draws int [r'], class of each of them int [r'], first row of each class int [C]),
        when the per-class Gram matrices (C·d² float64) fit :data:`CLASS_GRAM_BYTES` and cost at most half the
        loop's row passes (r' + B·C ≤ ½ Σ_b rows drawn by b); else None. Exact: the candidate classes come
        from two random projections of each row's weight column and are then checked element by element."""
        B, r = int(Wr.shape[0]), int(Wr.shape[1])
        if B < 2 or r < 8:
            return None
        rows = np.flatnonzero(to_numpy((Wr != 0).any(axis=0)))  # rows some weighting draws
        Wn = Wr[:, _like_index(Wr, rows)]
        g = np.random.default_rng(0).standard_normal((B, 2))
        key = to_numpy(Wn.T @ _like(Wr, g))  # [rows, 2]
        _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
        C = len(first)
        budget = CLASS_GRAM_BYTES * (8 if is_torch(Wr) and Wr.device.type == "cuda" else 1)
        drawn = int(to_numpy((Wn != 0).sum()))  # row passes of the loop, summed over the weightings
        if 2 * (len(rows) + B * C) > drawn or C * self.d * self.d * 8 > budget:
            return None
        inverse = inverse.reshape(-1)
        if not bool((Wn == Wn[:, _like_index(Wr, first[inverse])]).all()):  # a projection collision
            return None
        return rows, inverse, rows[first]

    def _weighted_indicators(self, Wr) -> SuffStats:
        """:meth:`weighted` for indicator rows (``codes``): ``Wr`` [B, r] row weights."""
        m = xp(Wr)
        if "_ind" not in self.__dict__:
            E = np.zeros((len(self.codes), self.d))
            E[np.arange(len(self.codes)), self.codes] = 1.0
            E, mu = _like(self.X, E), _like(self.X, self.code_shift)
            y = self.y
            one = m.ones_like(y)
            cols = [one[:, None], y[:, None], (y * y)[:, None], E, E * y[:, None]]
            object.__setattr__(self, "_ind", (m.concatenate(cols, axis=1) if m is np else m.cat(cols, dim=1), mu))
        P, mu = self.__dict__["_ind"]
        d = self.d
        tot = Wr @ P  # [B, 3 + 2d]: N, Σy, Σy², per-code weighted counts c, per-code Σwy
        N, sy, syy, c, cy = tot[:, 0], tot[:, 1], tot[:, 2], tot[:, 3:3 + d], tot[:, 3 + d:]
        outer = c[:, :, None] * mu[None, None, :]
        sxx = -outer - m.swapaxes(outer, 1, 2) + N[:, None, None] * (mu[:, None] * mu[None, :])[None]
        idx = np.arange(d)
        if m is not np:
            import torch

            idx = torch.arange(d, device=Wr.device)
        sxx[:, idx, idx] += c
        return SuffStats(n=N, sx=c - N[:, None] * mu[None, :], sy=sy, syy=syy, sxx=sxx,
                         sxy=cy - sy[:, None] * mu[None, :])


def _combine(Wc, cs: SuffStats) -> SuffStats:
    """Weighted sums of per-class statistics: ``Wc`` [B, C] the weight of every class → SuffStats of B sets
    (one product per statistic)."""
    C, d = cs.m, cs.d
    return SuffStats(n=Wc @ cs.n, sx=Wc @ cs.sx, sy=Wc @ cs.sy, syy=Wc @ cs.syy,
                     sxx=(Wc @ cs.sxx.reshape(C, d * d)).reshape(-1, d, d), sxy=Wc @ cs.sxy)


def _concat(parts: list[SuffStats]) -> SuffStats:
    """The sets of ``parts`` one after another (all numpy or all torch of one device)."""
    m = xp(parts[0].n)
    cat = np.concatenate if m is np else m.cat
    return SuffStats(**{f: cat([getattr(p, f) for p in parts]) for f in ("n", "sx", "sy", "syy", "sxx", "sxy")})


_GRAM_LOCK = threading.Lock()

CLASS_GRAM_BYTES = 1 << 32
"""Largest float64 stack of per-class Gram matrices (C × d × d × 8 bytes) that :meth:`RowStats.weighted` builds
to replace its per-weighting loop over rows (C classes of rows weighted alike: a batch of date- or
security-resampling replicates); larger ones keep the loop. Eight times as much on a CUDA device."""


PACKED_ROW_TERMS_BYTES = 1 << 29
"""Largest float64 table of packed per-row products (rows × (3 + 2d + d(d+1)/2) × 8 bytes) that
:meth:`RowStats.weighted` builds to replace its per-weighting loop by one matrix product (small d: the
date-only baseline, simulations); wider embeddings keep the loop, which stores no such table."""


def _packed_row_terms(rs: "RowStats"):
    """[r, 3 + 2d + d(d+1)/2]: each row's 1, y, y², x, x·y and lower triangle of x xᵀ, or None when too large."""
    d, r = rs.d, int(rs.X.shape[0])
    q = 3 + 2 * d + d * (d + 1) // 2
    if r * q * 8 > PACKED_ROW_TERMS_BYTES:
        return None
    X, y = rs.X, rs.y
    if xp(X) is np:  # written in place, one row of the triangle at a time: no gathered copies of X
        out = np.empty((r, q))
        out[:, 0], out[:, 1] = 1.0, y
        np.multiply(y, y, out=out[:, 2])
        out[:, 3:3 + d] = X
        np.multiply(X, y[:, None], out=out[:, 3 + d:3 + 2 * d])
        at = 3 + 2 * d
        for i in range(d):  # np.tril_indices order: (i, 0), ..., (i, i)
            np.multiply(X[:, i:i + 1], X[:, :i + 1], out=out[:, at:at + i + 1])
            at += i + 1
        return out
    import torch

    lo, hi = (torch.as_tensor(v, device=X.device) for v in np.tril_indices(d))
    one = torch.ones_like(y)
    return torch.concatenate([torch.stack([one, y, y * y], dim=1), X, X * y[:, None], X[:, lo] * X[:, hi]], dim=1)
