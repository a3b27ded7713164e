"""bench/calibration_probes.py ``--probe wild``: the wild cluster bootstrap's pieces on one small simulated panel
(weights of +1 give back the point estimate bit for bit; one weight per cluster; the several-target path equals
the one-target path; the record carries the two-way fields calibration.py's summariser reads)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import calibration  # noqa: E402
import calibration_probes as probes  # noqa: E402

S, T, D = 60, 12, 4


def _point(scenario: str, seed: int) -> float:
    from pitlab.evaluator.targets import point_estimates

    st, _, _, on_sel, off_sel, pf = calibration.panel_stats(scenario, seed, S, T, D)
    off, on, _, _, _ = point_estimates(st, pf, calibration.K, calibration.alpha_grid(4), on_sel, "train_mean", None,
                                       off_sel, True)
    return float(on.r2_rows[0] - off.r2[0])


def test_weights_of_one_give_back_y_and_the_point_premium_bit_for_bit() -> None:
    X, y, sec, date, train, test, pf = calibration.panel_arrays("date-leak", 3, S, T, D)
    resid = y - probes.ridge_fitted(X, y, 10.0)
    assert np.abs(resid).max() > 0.1
    ystar = probes.wild_targets(y, resid, sec, np.ones((1, S)))
    assert np.array_equal(ystar[0], y)
    got = probes.premia(X, ystar.T, sec, date, train, test, pf, calibration.alpha_grid(4), chunk=1)
    assert got[0] == _point("date-leak", 3)  # exactly calibration.one_panel's point premium
    flipped = probes.wild_targets(y, resid, sec, -np.ones((1, S)))[0]
    assert np.allclose(flipped, y - 2 * resid) and not np.allclose(flipped, y)


def test_one_rademacher_weight_per_cluster_in_each_half() -> None:
    X, y, sec, date, *_ = calibration.panel_arrays("null", 0, S, T, D)
    ws, wd = probes.wild_weights(S, T, 9, seed=5)
    assert ws.shape == (5, S) and wd.shape == (4, T)
    assert set(np.unique(ws)) == {-1.0, 1.0} and set(np.unique(wd)) == {-1.0, 1.0}
    resid = np.random.default_rng(0).standard_normal(y.size) + 3.0  # never 0: the weight of a row is recoverable
    for w, cl, G in ((ws, sec, S), (wd, date, T)):
        ystar = probes.wild_targets(y, resid, cl, w)
        row_w = 1.0 + (ystar - y[None, :]) / resid[None, :]
        assert np.allclose(np.abs(row_w), 1.0)
        for r in range(w.shape[0]):  # constant within a cluster, and it is that cluster's weight
            per = [np.unique(np.round(row_w[r, cl == g], 9)) for g in range(G)]
            assert all(p.size == 1 for p in per)
            assert np.array_equal(np.array([p[0] for p in per]), w[r])
        assert (w == 1).any(axis=1).all() and (w == -1).any(axis=1).all()
    assert not np.array_equal(probes.wild_weights(S, T, 9, seed=6)[0], ws)


def test_several_targets_equal_one_target_at_a_time() -> None:
    X, y, sec, date, train, test, pf = calibration.panel_arrays("stock-weak", 1, S, T, D)
    resid = y - probes.ridge_fitted(X, y, 1.0)
    ws, wd = probes.wild_weights(S, T, 6, seed=1)
    Y = np.vstack([probes.wild_targets(y, resid, sec, ws), probes.wild_targets(y, resid, date, wd)]).T
    g = calibration.alpha_grid(4)
    one, many = (probes.premia(X, Y, sec, date, train, test, pf, g, chunk=c) for c in (1, 4))
    assert np.all(np.isfinite(one)) and np.ptp(one) > 0
    np.testing.assert_allclose(many, one, rtol=0, atol=1e-10)


def test_record_holds_the_two_way_fields_the_summariser_reads() -> None:
    rec = probes.wild_one_panel("stock-strong", 2, S, T, D, 8, chunk=4)
    iv = rec["two-way"]
    assert rec["wild"] is iv and rec["probe"] == "wild" and iv["n"] == 8
    assert iv["lo"] < rec["premium"] < iv["hi"] and iv["dim"] in ("security", "date")
    sd = max(iv["security"]["sd"], iv["date"]["sd"])
    assert iv["sd"] == sd
    from scipy import stats

    g = S if iv["dim"] == "security" else T
    assert np.isclose(iv["hi"] - rec["premium"], stats.t.ppf(0.975, g - 1) * sd)
    assert calibration.intervals(rec)["two-way"] == (iv["lo"], iv["hi"])
    assert rec["premium"] == _point("stock-strong", 2)


def test_the_fixed_alpha_probe_fits_every_panel_and_replicate_at_its_one_penalty(monkeypatch) -> None:
    """``--probe fixed-alpha``: no selection and no grid widening, in the point estimate and in the replicates."""
    from pitlab.evaluator import targets

    monkeypatch.setattr(calibration, "alpha_grid", calibration.alpha_grid)  # restored after the test
    monkeypatch.setattr(targets, "WIDEN_STEPS", targets.WIDEN_STEPS)
    default = _point("stock-strong", 2)
    probes.fixed_alpha(1000.0)
    assert calibration.alpha_grid(4) == [1000.0] and targets.WIDEN_STEPS == 0
    rec = calibration.one_panel("stock-strong", 2, S, T, D, R=6, schemes=("two-way",))
    assert rec["alpha_off"] == 1000.0 and rec["alpha_on"] == [1000.0] * calibration.K
    assert rec["two-way"]["n"] == 6 and abs(rec["premium"] - default) > 1e-6  # the default chose other penalties
