"""bench/accept_table.py: the acceptance table of issue 27 read from committed `bench/throughput.py` records, the
rows bench/RESULTS.md gives for them ("Four acceptance calls at a031034" and the H200 calls of 2026-12-06)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
accept_table = pytest.importorskip("accept_table")
RESULTS = ROOT / "bench" / "results"


def cells(name: str) -> list[str]:
    (row,) = accept_table.rows(json.loads((RESULTS / name).read_text()), "r")
    return [c.strip() for c in row.strip("|").split("|")]


def test_reduced_shape_row_is_the_recorded_one():
    """Call 1 on the H100: 30,798 / 19,843 / 48,638 tokens/s, 1.579 and 2.451 ×, MFU 19.2 / 12.4 / 30.3 %, steps
    335.0–338.8 ms (1.011), 57.30 GB allocated and 67.64 reserved against 64.49 planned; FSDP2 46,867 tokens/s at
    0.964 ×, MFU 29.2 %, steps within 1.016, 69.73 GB reserved against 76.59 planned."""
    assert cells("throughput-h100-2026-12-07-accept-call1-reduced.json") == [
        "qwen35_reduced, 16,384, r", "30,798", "19,843", "48,638", "1.579 / 2.451", "19.2, 12.4, 30.3 %",
        "335.0–338.8, 1.011", "57.30 / 67.64 vs 64.49", "46,867, 0.964, 29.2 %, 1.016, 69.73 vs 76.59"]


def test_missing_and_skipped_runs_say_so():
    """Call 2: its Liger run was killed with its process (absent from the record, as is the bench's summary: "–", no
    ratio to it, and the plain loop's MFU 17.7 % from pitlab's FLOPs per token); the slice's FSDP2 run was skipped
    by its plan, and the row says why."""
    reduced = cells("throughput-h100-2026-12-07-accept-call2-reduced.json")
    assert reduced[2] == "–" and reduced[4:6] == ["1.702 / –", "17.7, –, 30.2 %"]
    assert reduced[8] == "39,635, 0.817, 24.7 %, 1.303, 69.50 vs 76.59"
    slice_ = cells("throughput-h100-2026-12-07-accept-call2-slice.json")
    assert slice_[1:7] == ["7,480", "9,265", "11,147", "1.490 / 1.203", "17.4, 21.6, 25.9 %", "359.6–376.2, 1.046"]
    assert slice_[8].startswith("skipped: predicted peak 92.05 GiB")


def test_h200_slice_row():
    """The slice on the H200 of 2026-12-06, call 1: 1.842 / 1.357 ×, MFU 19.4 / 26.3 / 35.6 %, FSDP2 (torch's AdamW
    then) 0.802 ×."""
    c = cells("throughput-h200-2026-12-06-call1-slice.json")
    assert c[4:6] == ["1.842 / 1.357", "19.4, 26.3, 35.6 %"]
    assert c[8] == "12,292, 0.802, 28.6 %, 1.134, 127.18 vs 106.99"


def test_a_missing_record_is_refused_before_any_row(capsys):
    with pytest.raises(SystemExit) as err:
        accept_table.main([str(RESULTS / "throughput-h100-2026-12-07-accept-call1-reduced.json"),
                           str(RESULTS / "no-such-record.json")])
    assert err.value.code == 2
    out = capsys.readouterr()
    assert out.out == "" and "no such record:" in out.err and "no-such-record.json" in out.err
