"""The benchmarks behind issue 27's item 6 without a GPU: bench/first_loss.py (the first-step loss eager and
compiled, per-layer digests, inductor's chosen configurations) on the tiny shape, and the ``deterministic`` switch
of the benchmarks' PitTraining (bench/h200_qwen35.py, used by bench/multigpu_qwen35.py --deterministic)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
first_loss = pytest.importorskip("first_loss")


def test_best_configs_reads_inductors_choices_without_timings(tmp_path):
    """Two ``*.best_config`` files in nested folders come back keyed by file stem, without the timing and cache
    hash; an unreadable one is reported, not skipped."""
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "k1.best_config").write_text(json.dumps(
        {"XBLOCK": 128, "num_warps": 4, "num_stages": 1, "time_taken_ms": 3, "triton_cache_hash": "x"}))
    (tmp_path / "k2.best_config").write_text(json.dumps({"XBLOCK": 16, "YBLOCK": 256, "num_warps": 8}))
    (tmp_path / "k3.best_config").write_text("{not json")
    got = first_loss.best_configs(tmp_path)
    assert list(got) == ["k1", "k2", "k3"]  # sorted by path: "ab/k1" before "k2"
    assert got["k1"] == {"XBLOCK": 128, "num_warps": 4, "num_stages": 1}
    assert got["k2"] == {"XBLOCK": 16, "YBLOCK": 256, "num_warps": 8}
    assert "unreadable" in got["k3"]


def test_the_tiny_first_loss_is_the_same_eager_and_compiled_on_the_cpu(tmp_path, monkeypatch):
    """On the CPU with ``aot_eager`` (no kernel generated) the compiled layers give the eager path's bits: the same
    loss and the same SHA-256 for each of the 4 layers' outputs and the final norm's (five different digests), 0
    elements differing; the random-initialised model's loss is near ln(1,024) = 6.931; a cache folder with no
    configurations is cold."""
    out = tmp_path / "fl.json"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", ["first_loss.py", "--out", str(out), "--shape", "tiny", "--backend",
                                      "aot_eager", "--seq", "32"])
    assert first_loss.main() == 0
    rec = json.loads(out.read_text())
    runs = rec["runs"]
    assert list(runs) == ["eager", "loss compiled", "layers and loss compiled", "layers and loss compiled, again"]
    eager = runs["eager"]
    assert abs(eager["loss"] - math.log(1024)) < 0.05
    for r in runs.values():
        assert r["loss_repr"] == eager["loss_repr"]
        assert [o["output"] for o in r["outputs"]] == ["layer 0", "layer 1", "layer 2", "layer 3", "final norm"]
        assert [o["sha256_16"] for o in r["outputs"]] == [o["sha256_16"] for o in eager["outputs"]]
        assert all(o["elements_differing_from_eager"] == 0 for o in r["outputs"])
    # the digests are of the outputs: five different tensors, five different 16-hex-digit digests
    digests = [o["sha256_16"] for o in eager["outputs"]]
    assert len(set(digests)) == 5 and all(len(d) == 16 and int(d, 16) >= 0 for d in digests)
    assert rec["inductor_cache_cold_at_start"] is True and rec["best_configs"] == {}


def test_first_loss_refuses_a_cut_without_layers(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["first_loss.py", "--out", str(tmp_path / "x.json"), "--layers", "0"])
    with pytest.raises(SystemExit) as err:
        first_loss.main()
    assert err.value.code == 2 and "--layers >= 1" in capsys.readouterr().err


def test_the_benchmarks_pittraining_carries_deterministic(tmp_path):
    """``training_resource(deterministic=True)`` sets ``spec.training.deterministic``; the default leaves it off."""
    from h200_qwen35 import training_resource

    on = training_resource("d", tmp_path, 128, 1024, 1, deterministic=True)
    off = training_resource("d", tmp_path, 128, 1024, 1)
    assert on.spec.training.deterministic is True and off.spec.training.deterministic is False
