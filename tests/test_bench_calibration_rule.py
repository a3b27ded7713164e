"""bench/calibration.py's derived candidate ``two-way-adaptive``: the held-penalty interval when it contains 0,
else the reselected one, built from one panel's merged records."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import calibration  # noqa: E402


def _record(held: tuple[float, float], reselected: tuple[float, float]) -> dict:
    return {"premium": 0.01, "S": 300, "T": 30, "two-way": {"lo": reselected[0], "hi": reselected[1]},
            "two-way-held": {"lo": held[0], "hi": held[1]}}


def test_adaptive_takes_the_held_interval_when_it_contains_zero_else_the_reselected_one() -> None:
    assert calibration.intervals(_record((-0.002, 0.004), (-0.01, 0.03)))["two-way-adaptive"] == (-0.002, 0.004)
    assert calibration.intervals(_record((0.0, 0.004), (-0.01, 0.03)))["two-way-adaptive"] == (0.0, 0.004)
    assert calibration.intervals(_record((0.001, 0.02), (-0.01, 0.03)))["two-way-adaptive"] == (-0.01, 0.03)
    assert calibration.intervals(_record((-0.02, -0.001), (-0.03, 0.01)))["two-way-adaptive"] == (-0.03, 0.01)
    one = _record((-0.002, 0.004), (-0.01, 0.03))
    del one["two-way-held"]
    assert "two-way-adaptive" not in calibration.intervals(one)
    assert "two-way-adaptive" in calibration.CANDIDATES


def test_records_append_and_read_back_plain_and_gzip(tmp_path: Path) -> None:
    recs = [{"scenario": "null", "seed": s, "premium": 0.001 * s} for s in range(3)]
    for name in ("a.jsonl", "a.jsonl.gz"):
        path = tmp_path / name
        for r in recs:
            calibration.append_record(path, r)
        assert calibration.read_records(path) == recs
    raw, members = (tmp_path / "a.jsonl.gz").read_bytes(), 0
    while raw:  # one complete gzip member per record: a run stopped between records leaves a readable file
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        d.decompress(raw)
        assert d.eof
        raw, members = d.unused_data, members + 1
    assert members == 3
    calibration.append_record(tmp_path / "a.jsonl.gz", {"scenario": "market", "seed": 7, "premium": -0.5})
    assert [r["seed"] for r in calibration.read_records(tmp_path / "a.jsonl.gz")] == [0, 1, 2, 7]
