"""bench/calibration.py's BCa candidate (``two-way-bca``; calibration_probes.py --probe bca): the interval reduces
to the percentile interval with no bias and no acceleration, follows Efron's formula otherwise, and a one-panel
record with the replicates kept gives the candidate from its dominating half."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import calibration  # noqa: E402


def test_bca_without_bias_or_acceleration_is_the_percentile_interval() -> None:
    reps = np.concatenate([np.linspace(-1, -0.01, 50), np.linspace(0.01, 1, 50)])  # half below 0
    jack = np.array([-1.0, 0.0, 1.0])  # symmetric: a = 0
    lo, hi = calibration.bca(0.0, reps, jack)
    assert (lo, hi) == (float(np.quantile(reps, 0.025)), float(np.quantile(reps, 0.975)))


def test_bca_follows_efrons_formula() -> None:
    rng = np.random.default_rng(1)
    reps, jack, point = rng.normal(0.1, 1.0, 400), rng.gamma(2.0, 1.0, 25), 0.35
    z0 = stats.norm.ppf(np.mean(reps < point))
    d = jack.mean() - jack
    a = (d ** 3).sum() / (6 * ((d ** 2).sum()) ** 1.5)
    assert abs(a) > 0.01 and z0 > 0.05
    want = [np.quantile(reps, stats.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))) for z in (-1.959963984540054,
                                                                                         1.959963984540054)]
    assert calibration.bca(point, reps, jack) == pytest.approx(tuple(want), rel=0, abs=1e-12)
    assert np.isnan(calibration.bca(10.0, reps, jack)).all()  # every replicate below the point: undefined


def test_a_record_with_its_replicates_gives_the_bca_candidate(monkeypatch) -> None:
    monkeypatch.setattr(calibration, "KEEP_REPS", True)
    rec = calibration.one_panel("stock-strong", 3, 60, 12, 4, 20, schemes=("two-way", "security-jack", "date-jack"))
    assert len(rec["two-way"]["reps"]) == 20 and len(rec["date-jack"]["reps"]) == 12
    assert len(rec["security-jack"]["reps"]) == calibration.JACK_GROUPS
    iv = calibration.intervals(rec)["two-way-bca"]
    half = np.asarray(rec["two-way"]["reps"])[:10] if rec["two-way"]["dim"] == "security" else np.asarray(
        rec["two-way"]["reps"])[10:]
    assert half.min() <= iv[0] <= iv[1] <= half.max()
    assert iv == calibration.bca_two_way(rec)


def test_half_samples_keep_half_of_each_dimension_once_and_the_total_weight() -> None:
    S, T, R = 7, 30, 9
    sec, date = np.repeat(np.arange(S), T), np.tile(np.arange(T), S)
    W = calibration.half_samples(S, T, R, 5, sec, date)
    assert W.shape == (R, S * T) and np.allclose(W.sum(axis=1), S * T)  # the panel's total weight kept
    strata = calibration.strata_of(T)
    for r in range(R):
        w = W[r].reshape(S, T)
        if r < 5:  # the security half: 3 of 7 securities at 7/3, every date of a kept security
            per_sec = w[:, 0]
            assert sorted(np.unique(per_sec).round(12)) == [0.0, round(7 / 3, 12)] and (per_sec > 0).sum() == 3
            assert np.all(w == per_sec[:, None])
        else:  # the date half: every stratum keeps half its dates (19 training dates: 9 or 10), the embargo date
            per_date = w[0]
            assert np.all(w == per_date[None, :])
            kept = [(per_date[strata == h] > 0).sum() for h in (0, 1, 2)]
            assert kept[0] in (9, 10) and kept[1] == 1 and kept[2] == 5
            assert np.isclose(per_date[strata == 0].sum(), 19) and np.isclose(per_date[strata == 2].sum(), 10)
