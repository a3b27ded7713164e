"""The default penalty grid (four values per decade) and its staged search: decade anchors first, then the values
between the best anchor's neighbours. The search equals the whole grid's argmin on unimodal scores, the GPU path
scores only the anchors and the windows, and both backends choose the same α in every fold and replicate."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pitlab.evaluator.selection as selection_mod
from pitlab.api.leakageeval import DEFAULT_ALPHAS, Regression
from pitlab.evaluator.bootstrap import draw_cluster_weights, replicate_folds
from pitlab.evaluator.estimates import AlphaSelection, PanelStats, group_kfold_folds
from pitlab.evaluator.linalg import Backend
from pitlab.evaluator.protocols import security_folds
from pitlab.evaluator.selection import argmin_ties_largest, decade_anchors, staged_argmin
from pitlab.evaluator.targets import widen_grid
from reference import synthetic_panel as _panel  # tests/ is on sys.path under pytest


def test_the_default_grid_has_four_values_per_decade_and_its_decades_are_the_anchors():
    a = np.asarray(Regression().alphas)
    assert len(a) == 25 and a[0] == 0.1 and a[-1] == 1e5
    np.testing.assert_allclose(np.diff(np.log10(a)), 0.25, atol=1e-6)
    assert decade_anchors(a).tolist() == [0, 4, 8, 12, 16, 20, 24]
    assert decade_anchors(np.asarray([0.1, 1.0, 10.0, 100.0])).tolist() == [0, 1, 2, 3]
    assert decade_anchors(np.asarray([10.0, 1.0, 100.0, 0.1])).tolist() == [0, 1, 2, 3]  # not ascending: all
    wide = np.asarray(widen_grid(list(DEFAULT_ALPHAS), True, True))  # a decade per added value
    assert decade_anchors(wide).tolist() == [0, 1, 2, 6, 10, 14, 18, 22, 26, 27, 28]


def test_staged_search_equals_the_whole_grid_on_unimodal_scores_and_keeps_its_window_otherwise():
    rng = np.random.default_rng(0)
    a = np.asarray(DEFAULT_ALPHAS)
    x = np.log10(a)
    centre, width = rng.uniform(-1.5, 5.5, 500), rng.uniform(0.1, 3.0, 500)
    cv = 100 + np.abs(x[None, :] - centre[:, None]) ** rng.uniform(0.5, 3, 500)[:, None] * width[:, None]
    cv[:50, -6:] = cv[:50, -7][:, None]  # a flat plateau at large α (every fit shrunk to the intercept)
    anchors = decade_anchors(a)
    np.testing.assert_array_equal(staged_argmin(cv, anchors), argmin_ties_largest(cv))
    # two minima: the anchors point to the decade around 10; the deeper minimum at 3162 is outside that window
    two = np.full((1, 25), 10.0)
    two[0, 8], two[0, 18] = 1.0, 0.5
    assert staged_argmin(two, anchors).tolist() == [8] and argmin_ties_largest(two).tolist() == [18]
    # scores that were not computed (NaN outside anchors and the window) are never read
    lo, hi = selection_mod._windows(cv, anchors)
    pos = np.arange(25)[None, :]
    masked = np.where(np.isin(pos, anchors) | ((pos >= lo[:, None]) & (pos <= hi[:, None])), cv, np.nan)
    assert np.isnan(masked).sum() > 500 * 10
    np.testing.assert_array_equal(staged_argmin(masked, anchors), argmin_ties_largest(cv))


@pytest.fixture()
def one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_cholesky_path_scores_anchors_and_windows_only_and_chooses_what_the_eigendecomposition_chooses(
        one_torch_thread, monkeypatch):
    """Leakage-on folds of the point estimate and 16 replicates, security-cv with 3 inner folds, default grid:
    the torch Cholesky path (which scores 7 anchors, then the union of the windows) against numpy's
    eigendecomposition path (which scores all 25 values and applies the same staged rule)."""
    X, y, sec, date = _panel()
    S, K = 24, 4
    W = np.vstack([np.ones((1, S)), draw_cluster_weights(S, 16, seed=3)])
    F = np.vstack([security_folds(np.full(S, 12), K)[None], replicate_folds(np.full(S, 12), W[1:], K)])
    folds = group_kfold_folds(len(date), F, K)
    sel = AlphaSelection("security-cv", inner_folds=3)
    scored = []
    real = selection_mod.cholesky_path_test_sse
    real_scored = selection_mod._scored
    monkeypatch.setattr(selection_mod, "cholesky_path_test_sse",
                        lambda tr, te, alphas, *args: scored.append(len(alphas)) or real(tr, te, alphas, *args))
    monkeypatch.setattr(selection_mod, "_scored",
                        lambda *a, **kw: scored.append("search") or real_scored(*a, **kw))
    res = {}
    for key, be in (("eigh", Backend()), ("cholesky", Backend("torch", "cpu", penalty_path="cholesky",
                                                               cholesky_block=4))):
        st = PanelStats.build(X, y, sec, S, date < 7, date >= 8, be)
        res[key] = st.protocol_errors(folds, W, list(DEFAULT_ALPHAS), sel, point_first=True, reselect=True)
    np.testing.assert_array_equal(res["cholesky"].alpha_index, res["eigh"].alpha_index)
    np.testing.assert_allclose(res["cholesky"].r2, res["eigh"].r2, rtol=0, atol=1e-10)
    assert len(np.unique(res["eigh"].alpha_index)) >= 3  # the replicates move along the fine grid
    cholesky = [c for c in _split_at(scored, "search")[1:] if c]  # the numpy path's searches solve nothing
    assert cholesky and all(c[0] == 7 for c in cholesky)  # each search: the 7 anchors first, then the windows
    assert max(n for c in cholesky for n in c[1:]) < 18  # (grouped by the replicates that read them)


def _split_at(items: list, marker) -> list[list]:
    """``items`` cut before each ``marker`` (the marker dropped): [[before the first], [after it], ...]."""
    out = [[]]
    for x in items:
        if x == marker:
            out.append([])
        else:
            out[-1].append(x)
    return out
