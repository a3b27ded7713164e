"""Issue 28 probe: bench/calibration.py with the one-standard-error rule in place of the smallest inner-CV error for
every penalty selection (point estimates and bootstrap replicates alike; CPU path only).

The rule (Hastie, Tibshirani & Friedman, The Elements of Statistical Learning, 2nd ed., sec. 7.10; glmnet's
``lambda.1se``): the largest α whose pooled inner-CV SSE is within one standard error of the smallest, the
standard error of the pooled SSE being sqrt(k) × the sd of the k inner folds' SSE at the best α. The question it
answers: does a selection that prefers the shrunk plateau whenever the data cannot tell penalties apart make the
intervals of the zero-premium scenarios narrower, without losing the look-ahead premia. It replaces
:func:`pitlab.evaluator.selection._scored` in this process (and the forked workers) and then runs
:func:`calibration.main` with the same arguments:

    python bench/calibration_onese.py --size 300x30x8 --panels 40 --scenarios null date-known market date-leak \\
        stock-strong stock-weak stock-0.02 --schemes two-way --workers 2 --out $OUT/onese.jsonl
    python bench/calibration.py --summarise $OUT/onese.jsonl --split tune

Results (2026-12-04): bench/RESULTS.md, "Interval study", "A one-standard-error penalty rule".
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pitlab.evaluator.selection as selection  # noqa: E402
from pitlab.evaluator.linalg import to_numpy  # noqa: E402
from pitlab.evaluator.ridge import path_test_sse, ridge_paths  # noqa: E402


def one_se_scored(inner_train, inner_test, alphas, backend, B: int, k: int, m, targets: int = 1):
    """:func:`pitlab.evaluator.selection._scored` (numpy path: the whole grid from one eigendecomposition per
    inner set) with the one-standard-error rule: grid positions int64 [B] (lists of ``targets``) and the pooled
    SSE [B, A]. Raises ``ValueError`` on the GPU's Cholesky path (not probed)."""
    if backend is not None and backend.cholesky_path:
        raise ValueError("calibration_onese: CPU path only (--device cpu)")
    d = inner_train.d - targets + 1
    trains = [inner_train.target(t, d) for t in range(targets)] if targets > 1 else [inner_train]
    tests = [inner_test.target(t, d) for t in range(targets)] if targets > 1 else [inner_test]
    a = np.asarray(alphas, dtype=np.float64)
    ks, cvs = [], []
    for p, te in zip(ridge_paths(trains, a), tests):
        per_fold = to_numpy(path_test_sse(p, te).reshape(B, k, -1))  # [B, k, A]
        cv = per_fold.sum(axis=1)
        best = selection.argmin_ties_largest(cv)
        se = np.sqrt(k) * per_fold[np.arange(B), :, best].std(axis=1, ddof=1)
        within = cv <= (cv[np.arange(B), best] + se)[:, None]
        ks.append((a.size - 1 - np.argmax(within[:, ::-1], axis=1)).astype(np.int64))  # the largest such α
        cvs.append(cv)
    return (ks, cvs) if targets > 1 else (ks[0], cvs[0])


if __name__ == "__main__":
    selection._scored = one_se_scored
    import calibration

    sys.exit(calibration.main(sys.argv[1:]))
