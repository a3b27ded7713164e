"""Sufficient statistics of row sets for ridge regression: n, Σx, Σy, Σy², XᵀX, Xᵀy (all float64), and their
weighted sums (:class:`SuffStats`). The formulas that use them are in :mod:`pitlab.evaluator.ridge`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pitlab.evaluator.linalg import Backend, across_matrices, is_torch, to_numpy, xp


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


def _like_index(ref, index):
    """``index`` (int numpy) as an index of ``ref``'s kind and device."""
    return _index_like(ref, index) if is_torch(ref) else np.asarray(index, dtype=np.int64)



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
