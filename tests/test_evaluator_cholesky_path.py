"""The GPU-shaped penalty selection (issue 13): security-cv scored by one batched Cholesky solve per α
(``Backend.penalty_path = "cholesky"``, the default on CUDA) instead of one eigendecomposition per inner fold.
Run here with torch on the CPU in float64, against the numpy backend's eigendecomposition path: the same grid
position chosen in every fold of every replicate, the same R², premiums and intervals to 1e-10, and bit-identical
reruns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import pitlab.evaluator.run as run_mod
from reference import synthetic_panel as _panel  # tests/ is on sys.path under pytest
from pitlab.api.leakageeval import LeakageEvalSpec
from pitlab.data.types import Panel
from pitlab.evaluator.bootstrap import draw_cluster_weights, replicate_folds
from pitlab.evaluator.estimates import AlphaSelection, Fold, PanelStats, group_kfold_folds
import pitlab.evaluator.setup as setup_mod
from pitlab.evaluator.linalg import Backend, cholesky_solve_batched
from pitlab.evaluator.protocols import security_folds, trading_calendar
from pitlab.evaluator.ridge import SuffStats, cholesky_path_test_sse, path_test_sse, ridge_path

ALPHAS = [0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0]
CHOL = Backend("torch", "cpu", penalty_path="cholesky", cholesky_block=4)  # d = 10: blocks 4, 4, 2


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny matrices: torch's intra-op threads only wait for each other on shared cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("d,block,leaf", [(10, 4, 2), (37, 8, 3), (70, 32, 16), (70, 0, 64)])
def test_blocked_cholesky_solve_equals_lapack_and_flags_indefinite_matrices(d, block, leaf):
    rng = np.random.default_rng(d)
    X = rng.standard_normal((6, 3 * d, d))
    A = np.swapaxes(X, 1, 2) @ X + 0.1 * np.eye(d)
    b = rng.standard_normal((6, d))
    ref = np.linalg.solve(A, b[..., None])[..., 0]
    x, ok = cholesky_solve_batched(torch.tensor(A), torch.tensor(b), block, leaf)
    x2, _ = cholesky_solve_batched(torch.tensor(A), torch.tensor(b), block, leaf)
    assert bool(ok.all()) and torch.equal(x, x2)
    np.testing.assert_allclose(x.numpy(), ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    A[2, d - 1, d - 1] = -1.0  # indefinite in the last block: only that matrix is flagged
    _, ok = cholesky_solve_batched(torch.tensor(A), torch.tensor(b), block, leaf)
    assert ok.tolist() == [True, True, False, True, True, True]


def test_cholesky_sse_path_equals_eigendecomposition_path_and_falls_back_on_indefinite_sets():
    rng = np.random.default_rng(1)
    X, y, g = rng.standard_normal((120, 9)) + 2.0, rng.standard_normal(120), np.repeat(np.arange(12), 10)
    units = SuffStats.from_rows(torch.tensor(X), torch.tensor(y), g, 12)
    w = torch.tensor(draw_cluster_weights(12, 8, seed=2), dtype=torch.float64)
    test = units.weighted(w * (torch.arange(12) % 3 == 0))
    train = units.weighted(w) - test
    ref = path_test_sse(ridge_path(train, ALPHAS), test)
    sse = cholesky_path_test_sse(train, test, ALPHAS, block=4)
    np.testing.assert_allclose(sse.numpy(), ref.numpy(), rtol=1e-12, atol=0)
    # a training set made indefinite beyond the smallest α is scored by the eigendecomposition instead
    bad = SuffStats(train.n, train.sx, train.sy, train.syy, train.sxx.clone(), train.sxy)
    bad.sxx[3, 0, 0] -= 1e6
    np.testing.assert_array_equal(cholesky_path_test_sse(bad, test, ALPHAS, block=4)[3].numpy(),
                                  path_test_sse(ridge_path(bad.take([3]), ALPHAS), test.take([3]))[0].numpy())




@pytest.mark.parametrize("per", [1, 2, 4, 6])
def test_several_alphas_per_batched_solve_give_the_per_alpha_numbers(monkeypatch, per):
    """``batch_bytes`` sized for ``per`` α per solve (set-major batches): the number of solves is ⌈A / per⌉, each
    of B·per matrices but the last, and the SSE of every set and α equals the one-α-per-solve path to 1e-13
    relative (the same arithmetic per matrix; the batch size may change BLAS's summation order), both targets
    of a two-target call included."""
    import pitlab.evaluator.ridge as ridge_mod

    rng = np.random.default_rng(11)
    X, g = rng.standard_normal((150, 9)) + 1.0, np.repeat(np.arange(15), 10)
    Y = np.column_stack([X[:, 2] + rng.standard_normal(150), rng.standard_normal(150)])
    units = SuffStats.from_rows(torch.tensor(np.column_stack([X, Y[:, 1]])), torch.tensor(Y[:, 0]), g, 15)
    w = torch.tensor(draw_cluster_weights(15, 5, seed=1), dtype=torch.float64)
    test = units.weighted(w * (torch.arange(15) % 3 == 0))
    train = units.weighted(w) - test
    trains, tests = [train.target(t, 9) for t in range(2)], [test.target(t, 9) for t in range(2)]
    one = cholesky_path_test_sse(trains, tests, ALPHAS, block=4, batch_bytes=1)
    solved = []
    real = ridge_mod.cholesky_solve_batched
    monkeypatch.setattr(ridge_mod, "cholesky_solve_batched",
                        lambda A, b, block=128, leaf=128: solved.append(int(A.shape[0])) or real(A, b, block, leaf))
    got = cholesky_path_test_sse(trains, tests, ALPHAS, block=4, batch_bytes=per * 5 * 9 * 9 * 8)
    n_solves = -(-len(ALPHAS) // per)
    assert len(solved) == n_solves and solved[:-1] == [5 * per] * (n_solves - 1)
    assert sum(solved) == 5 * len(ALPHAS)
    for a, b in zip(one, got):
        assert a.shape == (5, len(ALPHAS))
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-13, atol=0)


def test_the_window_pass_solves_only_the_sets_that_read_each_alpha_with_the_same_choice(monkeypatch):
    """``_scored`` on the Cholesky path against the whole grid solved for every inner set: the same grid position
    for every fitting set and, at every position a set's window reads, the same pooled SSE up to rounding (the
    batches hold other sets, so BLAS may order sums differently: 2e-16 relative here); an inner set with
    an empty test set is never factorised (it scores exactly 0), and each window α is solved only for the sets
    whose window holds it."""
    import pitlab.evaluator.ridge as ridge_mod
    from pitlab.evaluator.selection import _scored, _window_mask, decade_anchors, staged_argmin

    rng = np.random.default_rng(7)
    n_units, B, k, d = 24, 6, 3, 9
    g = np.repeat(np.arange(n_units), 10)
    X = rng.standard_normal((len(g), d)) + 1.0
    y = X[:, 0] * np.linspace(0.0, 1.5, len(g)) + rng.standard_normal(len(g))  # signal strength varies by unit
    units = SuffStats.from_rows(torch.tensor(X), torch.tensor(y), g, n_units)
    w = torch.tensor(draw_cluster_weights(n_units, B, seed=4), dtype=torch.float64)
    w[0, torch.arange(n_units) % k == 0] = 0.0  # set 0's first inner test set is empty
    w[1] = torch.where(torch.arange(n_units) < 6, 0.0, 3.0)  # a set that sees mostly strong-signal units
    masks = torch.stack([(torch.arange(n_units) % k == j).double() for j in range(k)])
    inner_test = units.weighted((w[:, None, :] * masks[None]).reshape(B * k, n_units))
    inner_train = units.weighted(w).take(np.repeat(np.arange(B), k)) - inner_test
    alphas = np.geomspace(1e-2, 1e4, 4 * 6 + 1)  # four per decade, like the default grid
    anchors = decade_anchors(alphas)
    full = cholesky_path_test_sse(inner_train, inner_test, alphas, block=4).reshape(B, k, -1).sum(axis=1).numpy()
    solved = []
    real = ridge_mod.cholesky_solve_batched

    def counting(A, b, block=128, leaf=128):
        solved.append(int(A.shape[0]))
        return real(A, b, block, leaf)

    monkeypatch.setattr(ridge_mod, "cholesky_solve_batched", counting)
    ks, cv = _scored(inner_train, inner_test, alphas, CHOL, B, k, torch)
    np.testing.assert_array_equal(ks, staged_argmin(full, anchors))
    reads = _window_mask(full, anchors)
    reads[:, anchors] = True
    np.testing.assert_allclose(cv[reads], full[reads], rtol=1e-13, atol=0)  # where the search reads
    assert np.isnan(cv[~reads]).all()  # and nothing else was solved
    assert float(inner_test.n[0]) == 0.0 and len(np.unique(ks)) >= 2
    n_anchor = len(anchors) * (B * k - 1)  # every anchor, every set with a test set
    assert solved[0] == n_anchor  # the coarse pass: every anchor in one batched solve
    assert sum(solved) == n_anchor + sum(int(reads[b, p]) * (k - (b == 0)) for b in range(B)
                                         for p in range(len(alphas)) if p not in anchors)


def test_remembered_scores_solve_each_set_and_alpha_once_across_a_widened_grid(monkeypatch):
    """Inside ``remembered_scores`` a second search of the same inner sets on a grid widened by two decades (as
    the point estimates do) solves only the new α; the choices equal a search without the memo and the scores
    agree up to rounding (an α solved beside other α may differ in the last bit); another set is not taken for a
    known one."""
    import pitlab.evaluator.ridge as ridge_mod
    from pitlab.evaluator.selection import _scored, remembered_scores

    rng = np.random.default_rng(3)
    n_units, B, k, d = 18, 1, 3, 8
    g = np.repeat(np.arange(n_units), 8)
    X = rng.standard_normal((len(g), d))
    units = SuffStats.from_rows(torch.tensor(X), torch.tensor(X[:, 1] + rng.standard_normal(len(g))), g, n_units)
    masks = torch.stack([(torch.arange(n_units) % k == j).double() for j in range(k)])
    inner_test = units.weighted(masks)
    inner_train = units.weighted(torch.ones(1, n_units)).take(np.zeros(k, dtype=np.int64)) - inner_test
    grid = list(np.geomspace(1e-1, 1e3, 17))
    wider = grid + [grid[-1] * 10.0, grid[-1] * 100.0]
    solved = []
    real = ridge_mod.cholesky_solve_batched
    monkeypatch.setattr(ridge_mod, "cholesky_solve_batched",
                        lambda A, b, block=128, leaf=128: solved.append(int(A.shape[0])) or real(A, b, block, leaf))
    plain = [_scored(inner_train, inner_test, grid, CHOL, B, k, torch)]  # matrices factorised: sum(solved)
    n_grid = sum(solved)
    plain.append(_scored(inner_train, inner_test, wider, CHOL, B, k, torch))
    n_plain = sum(solved)
    solved.clear()
    with remembered_scores():
        kept = [_scored(inner_train, inner_test, a, CHOL, B, k, torch) for a in (grid, wider)]
        n_kept = sum(solved)
        other = units.weighted(2 * masks)  # other test sets: not taken for the known ones
        _scored(units.weighted(2 * torch.ones(1, n_units)).take(np.zeros(k, dtype=np.int64)) - other, other, wider,
                CHOL, B, k, torch)
    for (k1, c1), (k2, c2) in zip(plain, kept):
        np.testing.assert_array_equal(k1, k2)
        np.testing.assert_array_equal(np.isnan(c1), np.isnan(c2))
        np.testing.assert_allclose(c1[~np.isnan(c1)], c2[~np.isnan(c2)], rtol=1e-13, atol=0)
    assert n_kept == n_grid + 2 * k  # the wider search's two new α for the k inner sets, nothing else
    assert n_plain == 2 * n_grid + 2 * k  # without the memo the wider search solves everything again
    assert sum(solved) - n_kept == n_plain - n_grid  # the other sets solved in full


def test_cholesky_path_chooses_the_same_penalty_in_every_fold_and_replicate():
    """All four protocols' folds, point estimate + 16 replicates, security-cv with 3 inner folds, reselected."""
    X, y, sec, date = _panel()
    S, K = 24, 4
    W = np.vstack([np.ones((1, S)), draw_cluster_weights(S, 16, seed=3)])
    F = np.vstack([security_folds(np.full(S, 12), K)[None], replicate_folds(np.full(S, 12), W[1:], K)])
    folds = {"off": None, "on": group_kfold_folds(len(date), F, K),
             "wf": [Fold(date < t, (date >= t) & (date < t + 3)) for t in (6, 9)],
             "pk": [Fold((date < a - 2) | (date > a + 5), (date >= a) & (date < a + 3)) for a in (0, 4, 8)]}
    sel = AlphaSelection("security-cv", inner_folds=3)
    res = {}
    for key, be in (("eigh", Backend()), ("cholesky", CHOL), ("cholesky again", CHOL)):
        st = PanelStats.build(X, y, sec, S, date < 7, date >= 8, be)
        res[key] = {name: st.protocol_errors(fl or [Fold(st.train_mask, st.test_mask)], W, ALPHAS, sel,
                                             point_first=True, reselect=True)
                    for name, fl in folds.items()}
    n_choices = 0
    for name in folds:
        e, c, c2 = res["eigh"][name], res["cholesky"][name], res["cholesky again"][name]
        np.testing.assert_array_equal(c.alpha_index, e.alpha_index)  # every fold, every replicate
        for f in ("r2", "pooled", "sse", "sst"):
            np.testing.assert_allclose(getattr(c, f), getattr(e, f), rtol=0, atol=1e-10)
            np.testing.assert_array_equal(getattr(c2, f), getattr(c, f))  # bit-identical rerun
        n_choices += len(np.unique(e.alpha_index))
    assert res["eigh"]["on"].alpha_index.shape == (17, 4)
    assert n_choices >= 6  # the replicates do not all sit on one grid point: the comparison has teeth


def _run_panel(S=30, T=24, d=12, seed=0):
    """rows (date, security, prompt, target) on every XNYS session from 2019-01-15, and embeddings [S·T, d]:
    a date fingerprint + a security fingerprint + noise, target = date effect + a weak linear signal + noise."""
    cal = trading_calendar("XNYS", "ohlcv", pd.bdate_range("2019-01-01", "2019-03-29"))
    dates = cal[(cal >= "2019-01-15")][:T]
    rng = np.random.default_rng(seed)
    di, si = np.repeat(np.arange(T), S), np.tile(np.arange(S), T)
    X = rng.standard_normal((T, d))[di] + rng.standard_normal((S, d))[si] + rng.standard_normal((S * T, d))
    rows = pd.DataFrame({"date": np.repeat(dates.to_numpy(), S), "security": [f"S{i:02d}" for i in si]})
    rows["prompt"] = [str(i) for i in range(len(rows))]
    rows["target"] = 0.5 * rng.standard_normal(T)[di] + 0.15 * X[:, 0] + rng.standard_normal(S * T)
    return rows, cal, dates, X.astype(np.float32)


def _close(a, b, path="results"):
    """Every number of two results trees within 1e-10, every other leaf equal."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, z) in enumerate(zip(a, b)):
            _close(x, z, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-10, nan_ok=True), path
    else:
        assert a == b, path


def test_leakage_eval_with_the_cholesky_path_equals_the_numpy_run(tmp_path, monkeypatch):
    """The run's code path with default statistics settings (all four protocols, security-cv with 5 inner folds,
    reselected penalties): premiums, intervals, p-values, verdicts and every replicate equal the numpy run's.
    (Bit-identical reruns: the protocol-level test above.)"""
    rows, cal, dates, X = _run_panel()
    monkeypatch.setattr(run_mod, "embed_texts", lambda model_dir, texts, **kw: (
        kw["info"].update(kind="encoder", digest="m".ljust(64, "0"), pooling="mean", n_truncated=0,
                          cache_hit=True), X)[1])
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    spec = LeakageEvalSpec.model_validate({
        "models": [{"name": "m", "uri": "/m"}], "dataset": {"kind": "ohlcv", "uri": "synthetic"},
        "protocol": {"trainEnd": str(dates[15].date()), "testStart": str(dates[16].date()), "embargoDays": 2,
                     "groupKFolds": 4, "walkForwardFolds": 3, "purgedFolds": 3,
                     "protocols": ["chronological", "group-kfold", "walk-forward", "purged-kfold"]},
        "bootstrap": {"resamples": 10, "seed": 0}})
    panel = Panel(rows=rows, calendar=cal, source="synthetic")
    models = {"m": (tmp_path / "m", "auto")}

    class CholeskyOnCPU(Backend):
        @classmethod
        def resolve(cls, device="auto"):
            return Backend("torch", "cpu", penalty_path="cholesky", cholesky_block=8)

    out = {"numpy": run_mod.run_leakage_eval(spec, panel, models, tmp_path / "numpy")}
    monkeypatch.setattr(setup_mod, "Backend", CholeskyOnCPU)  # prepare_evaluation resolves the device there
    out["cholesky"] = run_mod.run_leakage_eval(spec, panel, models, tmp_path / "cholesky")
    def strip(r):  # what ran where, and when, aside
        r = {k: v for k, v in r.items() if k not in ("created", "timings", "device")}
        return {**r, "regression": {k: v for k, v in r["regression"].items() if k != "device"}}

    assert out["cholesky"]["device"]["statistics"]["penalty_path"] == "cholesky"
    # on a torch backend the date-only baseline ran on another thread, with the same numbers (compared below)
    assert out["cholesky"]["timings"]["date_only_baseline_overlapped"] is True
    assert out["numpy"]["timings"]["date_only_baseline_overlapped"] is False
    assert out["numpy"]["device"]["statistics"]["penalty_path"] == "eigh"
    _close(strip(out["cholesky"]), strip(out["numpy"]))
    reps = {k: pd.read_csv(Path(tmp_path / k / "bootstrap_replicates.csv"))
            for k in ("numpy", "cholesky")}
    assert len(reps["numpy"]) == 10
    np.testing.assert_allclose(reps["cholesky"][["r2_off", "r2_on", "premium"]].to_numpy(),
                               reps["numpy"][["r2_off", "r2_on", "premium"]].to_numpy(), rtol=0, atol=1e-10)
    m = out["numpy"]["models"][0]
    assert m["premium_ci"][0] < m["premium_ci"][1] and set(m["protocols"]) >= {"walk-forward", "purged-kfold"}
