"""Ridge regression with an unpenalised intercept, fitted from sufficient statistics, penalty chosen by GCV.

Everything the leakage measurement needs from a set of rows (X, y) is in six float64 sums (per security,
per row subset): n, Σx, Σy, Σy², XᵀX, Xᵀy. A weighted union of securities (bootstrap multiplicities, fold
membership) is the weighted sum of their statistics, so no replicate ever refits from raw rows.

Formulas
--------
Centred statistics of a fitting set (x̄ = Σx/n, ȳ = Σy/n):
``Sxx = XᵀX - n x̄x̄ᵀ``, ``Sxy = Xᵀy - n x̄ ȳ``, ``Syy = Σy² - n ȳ²``.
With ``Sxx = V diag(λ) Vᵀ`` and ``z = Vᵀ Sxy``, the ridge slope (intercept unpenalised) is
``β(α) = V diag(1/(λ+α)) z``, the intercept ``c = ȳ - x̄ᵀβ``, the in-sample residual sum of squares
``RSS(α) = Syy - Σ_j z_j² (λ_j + 2α)/(λ_j + α)²``, and the trace of the hat matrix (effective degrees of
freedom, the intercept counting 1) ``df(α) = 1 + Σ_j λ_j/(λ_j + α)``.
Generalised cross-validation (Golub, Heath & Wahba 1979, Technometrics 21(2):215-223):
``GCV(α) = n · RSS(α) / (n - df(α))²``; the chosen α minimises it over the grid (first on ties).
Alternatively (:func:`fit_ridge_at` after an inner cross-validation computed with :func:`path_test_sse`)
α minimises a pooled out-of-fold SSE.
Out-of-sample, on a test set with raw statistics (n, Σx, Σy, Σy², XᵀX, Xᵀy):
``SSE = Σy² - 2cΣy - 2βᵀXᵀy + n c² + 2c βᵀΣx + βᵀXᵀXβ`` and, against the training-mean benchmark,
``SST = Σ(y - ȳ_train)² = Σy² - 2ȳ_train Σy + n ȳ_train²``; ``R² = 1 - SSE/SST``.

Solving at one α (:func:`solve_ridge`): ``(Sxx + αI) β = Sxy`` by a direct SPD solve
(:func:`pitlab.evaluator.linalg.solve_spd`), a third of the cost of an eigendecomposition; the α-path
(:func:`ridge_path`) uses one eigendecomposition for all α of the grid (penalty selection); on a GPU,
:func:`cholesky_path_test_sse` scores the grid by one batched Cholesky solve per α instead (same numbers up to
rounding, all in batched matrix products).

Numerics: the raw sums lose precision when the columns of X have means far from zero; callers should
subtract one global constant vector from X (and a constant from y) before building statistics. Ridge with
an unpenalised intercept is exactly invariant to such shifts (only the intercept moves).

Every function accepts numpy arrays or torch tensors (float64) and returns the same kind
(:mod:`pitlab.evaluator.linalg`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from pitlab.evaluator.linalg import (CHOLESKY_BLOCK, Backend, across_matrices, cholesky_solve_batched, eigh, is_torch,
                                    solve_spd, to_numpy, xp)


@dataclass(frozen=True)
class SuffStats:
    """Sufficient statistics of m row sets (securities, or weighted unions of them), all float64 (numpy
    arrays or torch tensors of one device).

    Shapes: ``n`` [m] row counts, ``sx`` [m, d] Σx, ``sy`` [m] Σy, ``syy`` [m] Σy², ``sxx`` [m, d, d] XᵀX,
    ``sxy`` [m, d] Xᵀy.
    """

    n: np.ndarray
    sx: np.ndarray
    sy: np.ndarray
    syy: np.ndarray
    sxx: np.ndarray
    sxy: np.ndarray

    @property
    def m(self) -> int:
        """Number of row sets."""
        return int(self.n.shape[0])

    @property
    def d(self) -> int:
        """Number of features."""
        return int(self.sx.shape[1])

    @classmethod
    def from_rows(cls, X, y, groups, n_groups: int, backend: Backend | None = None) -> "SuffStats":
        """Statistics per group from raw rows.

        X: float [n_rows, d]; y: float [n_rows]; groups: int [n_rows] in 0..n_groups-1 (rows of a group need
        not be contiguous). Returns statistics with m = n_groups (zeros for a group without rows), on
        ``backend`` (default: numpy, or the backend of a torch ``X``). The rows are sorted by group and padded
        to [n_groups, max rows per group, d], so XᵀX of every group is one batched matrix product.
        """
        if backend is None:
            backend = Backend("torch", str(X.device.type)) if is_torch(X) else Backend()
        g = np.asarray(to_numpy(groups), dtype=np.int64)
        Xb, yb = backend.asarray(X), backend.asarray(y)
        if Xb.ndim != 2 or tuple(yb.shape) != (Xb.shape[0],) or g.shape != (Xb.shape[0],):
            raise ValueError(f"from_rows: X {tuple(Xb.shape)}, y {tuple(yb.shape)}, groups {g.shape} do not match")
        if len(g) and (g.min() < 0 or g.max() >= n_groups):
            raise ValueError(f"from_rows: group ids must lie in 0..{n_groups - 1}")
        d = int(Xb.shape[1])
        order = np.argsort(g, kind="stable")
        counts = np.bincount(g, minlength=n_groups)
        r = int(counts.max()) if len(g) else 0
        slot = np.arange(len(g)) - np.repeat(np.cumsum(counts) - counts, counts)  # position inside its group
        flat = backend.as_index(g[order] * max(r, 1) + slot)
        m = xp(Xb)
        if backend.library == "numpy":
            P = np.zeros((n_groups * max(r, 1), d))
            Py = np.zeros(n_groups * max(r, 1))
        else:
            P = Xb.new_zeros((n_groups * max(r, 1), d))
            Py = yb.new_zeros(n_groups * max(r, 1))
        idx = backend.as_index(order)
        P[flat] = Xb[idx]
        Py[flat] = yb[idx]
        P = P.reshape(n_groups, max(r, 1), d)
        Py = Py.reshape(n_groups, max(r, 1))
        n = backend.asarray(counts.astype(np.float64))
        gram = (lambda P_: m.swapaxes(P_, 1, 2) @ P_) if backend.library == "torch" else \
            (lambda P_: across_matrices(lambda Q: np.swapaxes(Q, 1, 2) @ Q, P_))
        return cls(n=n, sx=P.sum(axis=1), sy=Py.sum(axis=1), syy=(Py * Py).sum(axis=1),
                   sxx=gram(P), sxy=(m.swapaxes(P, 1, 2) @ Py[:, :, None])[:, :, 0])

    def weighted(self, weights) -> "SuffStats":
        """Weighted sums of the m row sets: ``weights`` [B, m] (e.g. bootstrap multiplicities, zero for
        excluded sets) → statistics of B row sets. Equals the statistics of the data set in which every row
        of set i appears ``weights[b, i]`` times. One matrix product [B, m] × [m, d²] for XᵀX (numpy: over
        the d(d+1)/2 entries of the lower triangles, packed once per SuffStats, then mirrored)."""
        W = _like(self.n, weights)
        if W.ndim != 2 or W.shape[1] != self.m:
            raise ValueError(f"weights must have shape [B, {self.m}], got {tuple(W.shape)}")
        d = self.d
        if is_torch(W):
            sxx = (W @ self.sxx.reshape(self.m, d * d)).reshape(W.shape[0], d, d)
        else:  # numpy: sum only the lower triangles (half the flops of the product), then mirror
            lo, hi = np.tril_indices(d)
            packed = self.__dict__.get("_packed")
            if packed is None:
                packed = np.take(self.sxx.reshape(self.m, d * d), lo * d + hi, axis=1)
                object.__setattr__(self, "_packed", packed)  # frozen dataclass: a cache, not a field
            tri = W @ packed
            sxx = np.empty((W.shape[0], d * d))
            sxx[:, lo * d + hi] = tri
            sxx[:, hi * d + lo] = tri
            sxx = sxx.reshape(W.shape[0], d, d)
        return SuffStats(n=W @ self.n, sx=W @ self.sx, sy=W @ self.sy, syy=W @ self.syy, sxx=sxx, sxy=W @ self.sxy)

    def take(self, index) -> "SuffStats":
        """The row sets at ``index`` (int array; repeats allowed), as a new SuffStats."""
        i = np.asarray(index, dtype=np.int64)
        if is_torch(self.n):
            import torch

            i = torch.as_tensor(i, device=self.n.device)
        return SuffStats(n=self.n[i], sx=self.sx[i], sy=self.sy[i], syy=self.syy[i], sxx=self.sxx[i],
                         sxy=self.sxy[i])

    def __sub__(self, other: "SuffStats") -> "SuffStats":
        """Statistics of set difference (``other`` ⊆ ``self`` row-wise, e.g. a fold removed from its union)."""
        return SuffStats(n=self.n - other.n, sx=self.sx - other.sx, sy=self.sy - other.sy,
                         syy=self.syy - other.syy, sxx=self.sxx - other.sxx, sxy=self.sxy - other.sxy)

    def total(self) -> "SuffStats":
        """The union of all m sets (m = 1)."""
        return self.weighted(np.ones((1, self.m)))

    def target(self, t: int, d: int) -> "SuffStats":
        """The statistics of target ``t`` on the first ``d`` features, when these statistics were built from
        ``[X, y_1, .., y_{T-1}]`` (d features, then the further targets as columns) and ``y_0``: t = 0 is ``y_0``
        on X, t ≥ 1 reads column ``d + t - 1`` as the target (Σy, Σy², Xᵀy from the column's Σx and Gram
        entries). Views where the library allows; every target shares ``sxx[:, :d, :d]``."""
        if t == 0:
            return SuffStats(n=self.n, sx=self.sx[:, :d], sy=self.sy, syy=self.syy, sxx=self.sxx[:, :d, :d],
                             sxy=self.sxy[:, :d])
        j = d + t - 1
        if not 0 < t or j >= self.d:
            raise ValueError(f"target {t} of {self.d - d + 1} (statistics of {self.d} columns, {d} features)")
        return SuffStats(n=self.n, sx=self.sx[:, :d], sy=self.sx[:, j], syy=self.sxx[:, j, j],
                         sxx=self.sxx[:, :d, :d], sxy=self.sxx[:, :d, j])


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


def _like_index(ref, index):
    """``index`` (int numpy) as an index of ``ref``'s kind and device."""
    return _index_like(ref, index) if is_torch(ref) else np.asarray(index, dtype=np.int64)


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
    m = xp(rs.X)
    lo, hi = np.tril_indices(d)
    if m is not np:
        import torch

        lo, hi = torch.as_tensor(lo, device=rs.X.device), torch.as_tensor(hi, device=rs.X.device)
    X, y = rs.X, rs.y
    one = m.ones_like(y)
    return m.concatenate([m.stack([one, y, y * y], axis=1) if m is np else m.stack([one, y, y * y], dim=1),
                          X, X * y[:, None], X[:, lo] * X[:, hi]], axis=1)


def _index_like(ref, index):
    """``index`` as an int64 tensor on ``ref``'s device."""
    import torch

    return torch.as_tensor(np.asarray(index, dtype=np.int64), device=ref.device)


def _like(ref, a):
    """``a`` as a float64 array of ``ref``'s kind and device."""
    if is_torch(ref):
        import torch

        if is_torch(a):
            return a.to(device=ref.device, dtype=torch.float64)
        return torch.as_tensor(np.asarray(a, dtype=np.float64), device=ref.device)
    return np.asarray(to_numpy(a), dtype=np.float64)


@dataclass(frozen=True)
class RidgeFit:
    """B ridge fits, one per fitting set. Shapes: ``alpha`` [B] chosen penalty, ``alpha_index`` [B] its
    position in ``alphas``, ``beta`` [B, d] slopes, ``intercept`` [B], ``y_mean`` [B] training mean of y
    (the R² benchmark), ``n`` [B] rows, ``score`` [B, A] the selection criterion per α (GCV score, or pooled
    inner cross-validation SSE; ``criterion`` says which), ``df`` [B, A] degrees of freedom per α (trace of
    the hat matrix, intercept included; for duplicate-aware GCV the corrected trace)."""

    alphas: np.ndarray
    alpha: np.ndarray
    alpha_index: np.ndarray
    beta: np.ndarray
    intercept: np.ndarray
    y_mean: np.ndarray
    n: np.ndarray
    score: np.ndarray
    df: np.ndarray
    criterion: str

    def predict(self, X) -> np.ndarray:
        """Predictions ``c + Xβ``: X [n_rows, d] → [B, n_rows]."""
        return self.intercept[:, None] + (_like(self.beta, X) @ self.beta.T).T


def _check_alphas(alphas) -> np.ndarray:
    a = np.asarray(alphas, dtype=np.float64).ravel()
    if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"regression.alphas must be positive finite numbers (got {list(a)})")
    return a


def centred(stats: SuffStats) -> tuple:
    """Centred statistics of each fitting set: ``x̄`` [B, d], ``ȳ`` [B], ``Sxx`` [B, d, d], ``Sxy`` [B, d],
    ``Syy`` [B] (module docstring). Raises ValueError for a set with fewer than 2 rows."""
    n = stats.n
    if bool((n < 2).any()):
        raise ValueError(f"a fitting set has fewer than 2 rows (n = {float(n.min()):g})")
    xm = stats.sx / n[:, None]
    ym = stats.sy / n
    sxx_c = stats.sxx - (n[:, None] * xm)[:, :, None] * xm[:, None, :]
    sxy_c = stats.sxy - n[:, None] * xm * ym[:, None]
    return xm, ym, sxx_c, sxy_c, stats.syy - n * ym * ym


@dataclass(frozen=True)
class RidgePath:
    """The ridge solutions of B fitting sets for every α of a grid, from one eigendecomposition each.

    Shapes: ``alphas`` [A]; ``n``, ``y_mean``, ``syy_c`` [B]; ``x_mean`` [B, d]; ``lam`` [B, d] eigenvalues
    and ``V`` [B, d, d] eigenvectors of the centred Gram matrix; ``z`` = Vᵀ Sxy [B, d].
    """

    alphas: np.ndarray
    n: np.ndarray
    x_mean: np.ndarray
    y_mean: np.ndarray
    syy_c: np.ndarray
    lam: np.ndarray
    V: np.ndarray
    z: np.ndarray

    @property
    def den(self):
        """λ_j + α, [B, A, d]."""
        return self.lam[:, None, :] + _like(self.lam, self.alphas)[None, :, None]

    def df(self):
        """Trace of the hat matrix per α (intercept included): 1 + Σ λ/(λ+α), [B, A]."""
        return 1.0 + (self.lam[:, None, :] / self.den).sum(axis=2)

    def rss(self):
        """In-sample residual sum of squares per α: Syy - Σ z²(λ+2α)/(λ+α)², [B, A] (clipped at 0)."""
        den = self.den
        a = _like(self.lam, self.alphas)
        r = self.syy_c[:, None] - (self.z[:, None, :] ** 2 * (self.lam[:, None, :] + 2 * a[None, :, None])
                                   / den**2).sum(axis=2)
        return xp(r).clip(r, 0.0, None)

    def betas(self):
        """Slopes for every α: V diag(1/(λ+α)) z, [B, A, d]."""
        m = xp(self.V)
        return m.swapaxes(self.V @ m.swapaxes(self.z[:, None, :] / self.den, 1, 2), 1, 2)

    def fit_at(self, alpha_index, score, df, criterion: str) -> RidgeFit:
        """The fits at the chosen grid positions ``alpha_index`` [B]."""
        k = np.asarray(to_numpy(alpha_index), dtype=np.int64)
        rows = np.arange(len(k))
        beta = (self.V @ (self.z / self.den[rows, k])[:, :, None])[:, :, 0]
        intercept = self.y_mean - xp(beta).einsum("bi,bi->b", self.x_mean, beta)
        return RidgeFit(alphas=self.alphas, alpha=self.alphas[k], alpha_index=k, beta=beta, intercept=intercept,
                        y_mean=self.y_mean, n=self.n, score=score, df=df, criterion=criterion)


def ridge_path(stats: SuffStats, alphas) -> RidgePath:
    """Centre each fitting set's statistics and eigendecompose its Gram matrix (module docstring formulas)."""
    return ridge_paths([stats], alphas)[0]


def _centred_target(stats: SuffStats, xm) -> tuple:
    """ȳ [B], Sxy [B, d], Syy [B] of one target, given the fitting sets' x̄ [B, d] (module docstring)."""
    n = stats.n
    ym = stats.sy / n
    return ym, stats.sxy - n[:, None] * xm * ym[:, None], stats.syy - n * ym * ym


def ridge_paths(targets: list[SuffStats], alphas) -> list[RidgePath]:
    """:func:`ridge_path` of several targets of the same fitting sets (:meth:`SuffStats.target` views: one
    ``n``, ``sx`` and ``sxx``): one eigendecomposition per set, shared by every target."""
    a = _check_alphas(alphas)
    xm, _, sxx_c, _, _ = centred(targets[0])
    m = xp(sxx_c)
    lam, V = eigh(sxx_c)  # both libraries read the lower triangle
    del sxx_c
    lam = m.clip(lam, 0.0, None)  # a PSD matrix; tiny negative eigenvalues are rounding
    out = []
    for st in targets:
        ym, sxy_c, syy_c = _centred_target(st, xm)
        z = (m.swapaxes(V, 1, 2) @ sxy_c[:, :, None])[:, :, 0]
        out.append(RidgePath(alphas=a, n=st.n, x_mean=xm, y_mean=ym, syy_c=syy_c, lam=lam, V=V, z=z))
    return out


def gcv_scores(path: RidgePath, copies: SuffStats | None = None) -> tuple:
    """GCV score and degrees of freedom per α, both [B, A] (see :func:`fit_ridge_gcv`)."""
    n, xm = path.n, path.x_mean
    if copies is None:
        df = path.df()
    else:
        if copies.m != path.n.shape[0] or copies.d != path.x_mean.shape[1]:
            raise ValueError("copies must describe the same sets as stats")
        q = copies.sx
        C = copies.sxx - q[:, :, None] * xm[:, None, :] - xm[:, :, None] * q[:, None, :] \
            + copies.n[:, None, None] * xm[:, :, None] * xm[:, None, :]
        c_diag = xp(C).einsum("bij,bij->bj", path.V, C @ path.V)  # diag(VᵀCV)
        del C
        df = (copies.n / n)[:, None] + (c_diag[:, None, :] / path.den).sum(axis=2)
    resid_df = n[:, None] - df
    m = xp(df)
    safe = m.where(resid_df > 0, resid_df, m.ones_like(resid_df))
    gcv = m.where(resid_df > 0, n[:, None] * path.rss() / safe**2, m.full_like(resid_df, float("inf")))
    return gcv, df


def fit_ridge_gcv(stats: SuffStats, alphas, copies: SuffStats | None = None) -> RidgeFit:
    """Fit ridge (intercept unpenalised) on each of the ``stats.m`` fitting sets, α chosen by GCV.

    One eigendecomposition of the centred Gram matrix per set gives β(α), RSS(α) and df(α) for every α
    of the grid (formulas in the module docstring). ``alphas``: positive floats (``regression.alphas``).

    ``copies``: for a set in which rows appear several times (a bootstrap replicate; ``stats`` weighted by
    multiplicities m), the same sets weighted by m². The copies of a row share one error, so GCV's degrees of
    freedom become ``tr(H Σ̃)`` with Σ̃ the error correlation of the expanded rows (1 between copies), the
    correlated-errors GCV of Altman (1990, JASA 85:749-759): ``df = Σm²/Σm + Σ_j (VᵀCV)_jj/(λ_j + α)`` with
    ``C = Σ_rows m² (x - x̄)(x - x̄)ᵀ``. Plain GCV on duplicated rows rewards fitting the duplicated noise and
    picks too small an α (E[RSS] ≈ σ²(n - tr(HΣ̃)) instead of σ²(n - tr H) near α = 0). Without duplicates
    (all m = 1) both are the same number. ``None`` = plain GCV.
    """
    path = ridge_path(stats, alphas)
    gcv, df = gcv_scores(path, copies)
    return path.fit_at(xp(gcv).argmin(gcv, axis=1), gcv, df, "gcv")


def fit_ridge_at(stats: SuffStats, alphas, alpha_index, score=None, criterion: str = "given") -> RidgeFit:
    """Fit ridge on each fitting set at a given grid position ``alpha_index`` [B] (chosen elsewhere, e.g. by
    inner cross-validation whose per-α score [B, A] is passed on as ``score``), from one eigendecomposition
    per set (so ``df`` is known for every α)."""
    path = ridge_path(stats, alphas)
    if score is None:
        score = xp(path.lam).full_like(path.df(), float("nan"))
    return path.fit_at(alpha_index, score, path.df(), criterion)


def solve_ridge(stats: SuffStats, alpha) -> tuple:
    """Ridge slopes at one penalty per fitting set by a direct solve: ``alpha`` [B] (float) →
    ``beta`` [B, d], ``intercept`` [B], ``y_mean`` [B] (training mean of y). Solves
    ``(Sxx + αI) β = Sxy`` (centred statistics; SPD since α > 0) with
    :func:`pitlab.evaluator.linalg.solve_spd`; equal to the eigendecomposition formula up to rounding."""
    xm, ym, sxx_c, sxy_c, _ = centred(stats)
    a = _like(ym, alpha)
    d = sxx_c.shape[1]
    idx = np.arange(d)
    if is_torch(sxx_c):
        import torch

        idx = torch.arange(d, device=sxx_c.device)
    sxx_c[:, idx, idx] += a[:, None]
    beta = solve_spd(sxx_c, sxy_c)
    return beta, ym - xp(beta).einsum("bi,bi->b", xm, beta), ym


def path_test_sse(path: RidgePath, test: SuffStats):
    """SSE of every α's fit of set b on test set b: [B, A] (same raw-statistics formula as
    :func:`out_of_sample_errors`)."""
    if test.m != path.n.shape[0]:
        raise ValueError(f"{path.n.shape[0]} fitting sets vs {test.m} test sets")
    B = path.betas()  # [b, A, d]
    return _betas_test_sse(B, path.x_mean, path.y_mean, test)


def _betas_test_sse(B, x_mean, y_mean, test: SuffStats):
    """SSE on test set b of the slopes ``B`` [b, A, d] of fitting set b (intercepts ``ȳ - x̄ᵀβ`` from
    ``x_mean`` [b, d], ``y_mean`` [b]): [b, A], raw-statistics formula of the module docstring, clipped at 0."""
    m = xp(B)
    c = y_mean[:, None] - m.einsum("bi,bai->ba", x_mean, B)
    quad = m.einsum("bai,bia->ba", B, test.sxx @ m.swapaxes(B, 1, 2))
    sse = (test.syy[:, None] - 2 * c * test.sy[:, None] - 2 * m.einsum("bai,bi->ba", B, test.sxy)
           + test.n[:, None] * c * c + 2 * c * m.einsum("bai,bi->ba", B, test.sx) + quad)
    return m.clip(sse, 0.0, None)


def cholesky_path_test_sse(train, test, alphas, block: int = CHOLESKY_BLOCK):
    """The ridge fits of every training set at every α of the grid, scored on its test set: SSE [B, A], the
    numbers of ``path_test_sse(ridge_path(train, alphas), test)`` up to rounding, without eigendecompositions.

    ``train``, ``test``: SuffStats of B sets each (torch float64, any device), or equal-length lists of them: the
    targets of the same sets (:meth:`SuffStats.target` views sharing ``n``, ``sx`` and ``sxx``), solved together
    (one factorisation per set and α for all targets; returns a list of SSE, one per target). Per α, one batched
    Cholesky solve ``(Sxx + αI) β = Sxy`` of all B centred training sets
    (:func:`pitlab.evaluator.linalg.cholesky_solve_batched`, ``block`` columns per step); SSE on the test
    statistics as :func:`path_test_sse`. Cost: A·d³/3 flops per set, all in batched matrix products (an
    eigendecomposition costs about 9d³, half of them in BLAS-2 steps that a GPU runs far below its matrix rate).
    A set whose factorisation meets a non-positive pivot (α far below the rounding of Sxx) is scored through
    :func:`ridge_path` instead (eigenvalues clipped at 0). Memory: two [B, d, d] temporaries besides the centred
    Gram matrices."""
    import torch

    many = isinstance(train, (list, tuple))
    trains, tests = (list(train), list(test)) if many else ([train], [test])
    if len(trains) != len(tests) or any(te.m != trains[0].m or tr.m != trains[0].m for tr, te in zip(trains, tests)):
        raise ValueError(f"{[t.m for t in trains]} fitting sets vs {[t.m for t in tests]} test sets")
    a = _check_alphas(alphas)
    xm, _, sxx_c, _, _ = centred(trains[0])
    ys = [_centred_target(tr, xm) for tr in trains]
    rhs = torch.stack([y[1] for y in ys], dim=2)  # [B, d, T]
    ok = torch.ones(sxx_c.shape[0], dtype=torch.bool, device=sxx_c.device)
    betas = []
    for i, alpha in enumerate(a):
        M = sxx_c if i == len(a) - 1 else sxx_c.clone()  # the last α factorises the centred matrices in place
        M.diagonal(dim1=1, dim2=2).add_(float(alpha))
        beta, ok_a = cholesky_solve_batched(M, rhs, block)
        del M
        betas.append(beta)
        ok &= ok_a
    del sxx_c
    B = torch.stack(betas, 1)  # [B, A, d, T]
    sses = [_betas_test_sse(B[..., t], xm, ys[t][0], te) for t, te in enumerate(tests)]
    if not bool(ok.all()):
        bad = torch.nonzero(~ok)[:, 0]
        idx = bad.cpu().numpy()
        paths = ridge_paths([tr.take(idx) for tr in trains], a)
        for sse, path, te in zip(sses, paths, tests):
            sse[bad] = path_test_sse(path, te.take(idx))
    return sses if many else sses[0]


BENCHMARKS = ("train_mean", "zero")


def out_of_sample_errors(fit: RidgeFit, test: SuffStats, benchmark: str = "train_mean",
                         y_shift: float = 0.0) -> tuple:
    """SSE and SST of B fits, fit b scored on test set b: ([B], [B]).

    ``benchmark``: ``"train_mean"``: SST about the training mean, ``Σy² - 2ȳ_train Σy + n ȳ_train²``;
    ``"zero"``: SST of the raw (unshifted) target, ``Σ(y + y_shift)² = Σy² + 2·y_shift·Σy + n·y_shift²``
    (Gu, Kelly & Xiu 2020, "Empirical Asset Pricing via Machine Learning", RFS 33(5), eq. 19: R²_oos against
    zero, since the historical mean return is a noisy, too-easy-to-beat benchmark). ``y_shift``: the constant
    subtracted from the target before the statistics were built (SSE does not depend on it). ``R² = 1 - sse/sst``.
    """
    if benchmark not in BENCHMARKS:
        raise ValueError(f"regression.benchmark must be one of {BENCHMARKS} (got {benchmark!r})")
    if test.m != fit.beta.shape[0] or test.d != fit.beta.shape[1]:
        raise ValueError(f"{fit.beta.shape[0]} fits of dimension {fit.beta.shape[1]} vs {test.m} test sets "
                         f"of dimension {test.d}")
    m = xp(fit.beta)
    b, c = fit.beta, fit.intercept
    quad = m.einsum("bi,bi->b", b, (test.sxx @ b[:, :, None])[:, :, 0])
    sse = (test.syy - 2 * c * test.sy - 2 * m.einsum("bi,bi->b", b, test.sxy) + test.n * c * c
           + 2 * c * m.einsum("bi,bi->b", b, test.sx) + quad)
    ybar = fit.y_mean if benchmark == "train_mean" else m.full_like(fit.y_mean, -float(y_shift))
    sst = test.syy - 2 * ybar * test.sy + test.n * ybar * ybar
    return m.clip(sse, 0.0, None), m.clip(sst, 0.0, None)


def r2_score_oos(sse, sst):
    """Out-of-sample R² = 1 - SSE/SST (NaN where SST = 0)."""
    m = xp(sse)
    if m is np:
        sse, sst = np.asarray(sse, dtype=np.float64), np.asarray(sst, dtype=np.float64)
    safe = m.where(sst > 0, sst, m.ones_like(sst))
    return m.where(sst > 0, 1.0 - sse / safe, m.full_like(sst, float("nan")))
