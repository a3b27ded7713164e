"""pitlab.trainer.autotune: Triton autotuning results copied into Triton's cache where it lacks them."""

from __future__ import annotations

import json
import os

from pitlab.trainer import autotune
from pitlab.trainer.autotune import export_autotune_results, seed_autotune_cache, seed_source, triton_cache_dir


def _result(folder, key_dir, kernel, timings):
    path = folder / key_dir / f"{kernel}.autotune.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": [16, 128], "configs_timings": timings}))
    return path


def test_seeds_are_copied_where_the_cache_lacks_them_and_never_over_a_cached_result(tmp_path):
    seeds, cache = tmp_path / "seeds", tmp_path / "cache"
    _result(seeds, "AAAA", "chunk_fwd_kernel_o", [[{"num_warps": 4}, [0.5]]])
    _result(seeds, "BBBB", "solve_tril_16x16_kernel", [[{"num_warps": 2}, [0.1]]])
    (seeds / "BBBB" / "solve_tril_16x16_kernel.cubin").write_bytes(b"\0")  # not a tuning result: not copied
    mine = _result(cache, "BBBB", "solve_tril_16x16_kernel", [[{"num_warps": 8}, [0.2]]])
    before = mine.read_bytes()

    assert seed_autotune_cache(seeds, cache) == 1
    assert (cache / "AAAA" / "chunk_fwd_kernel_o.autotune.json").read_bytes() == \
        (seeds / "AAAA" / "chunk_fwd_kernel_o.autotune.json").read_bytes()
    assert mine.read_bytes() == before
    assert not (cache / "BBBB" / "solve_tril_16x16_kernel.cubin").exists()
    assert sorted(p.name for p in cache.rglob("*")) == ["AAAA", "BBBB", "chunk_fwd_kernel_o.autotune.json",
                                                         "solve_tril_16x16_kernel.autotune.json"]
    assert seed_autotune_cache(seeds, cache) == 0  # a second process finds them all


def test_export_writes_the_layout_seeding_reads(tmp_path):
    cache, out, fresh = tmp_path / "cache", tmp_path / "out", tmp_path / "fresh"
    a = _result(cache, "K1", "chunk_local_cumsum_scalar_kernel", [[{"BS": 32}, [0.01]]])
    _result(cache, "K2", "l2norm_fwd_kernel", [[{"num_warps": 1}, [0.02]]])
    (cache / "K1" / "x.cubin").write_bytes(b"\1")
    assert export_autotune_results(cache, out) == 2
    assert seed_autotune_cache(out, fresh) == 2
    assert (fresh / "K1" / a.name).read_bytes() == a.read_bytes()


def test_seeding_is_turned_off_or_redirected_by_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PITLAB_AUTOTUNE_SEEDS", "off")
    assert seed_source() is None
    assert seed_autotune_cache(cache_dir=tmp_path / "cache") == 0
    assert not (tmp_path / "cache").exists()
    monkeypatch.setenv("PITLAB_AUTOTUNE_SEEDS", str(tmp_path / "mine"))
    assert seed_source() == tmp_path / "mine"
    monkeypatch.delenv("PITLAB_AUTOTUNE_SEEDS")
    assert seed_source() == autotune.SEEDS
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tc"))
    assert triton_cache_dir() == tmp_path / "tc"
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setenv("TRITON_HOME", str(tmp_path))
    assert triton_cache_dir() == tmp_path / ".triton" / "cache"


def test_seeding_pins_the_folder_inductor_would_otherwise_move_every_kernel_to(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir as inductor_triton_dir

    seeds = tmp_path / "seeds"
    _result(seeds, "AAAA", "chunk_fwd_kernel_o", [[{"num_warps": 4}, [0.5]]])
    monkeypatch.setenv("TRITON_CACHE_DIR", "set, so that the teardown removes what seeding sets")
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setenv("TRITON_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    # unpinned, inductor's first kernel would set TRITON_CACHE_DIR to its own folder, where the seeds are not
    assert inductor_triton_dir(0) == str(tmp_path / "inductor" / "triton" / "0")

    assert seed_autotune_cache(seeds) == 1
    folder = tmp_path / "home" / ".triton" / "cache"
    assert (folder / "AAAA" / "chunk_fwd_kernel_o.autotune.json").is_file()
    assert inductor_triton_dir(0) == str(folder)  # inductor now keeps the folder the seeds are in


def test_a_cache_folder_the_user_set_is_kept(tmp_path, monkeypatch):
    seeds = tmp_path / "seeds"
    _result(seeds, "AAAA", "chunk_fwd_kernel_o", [[{"num_warps": 4}, [0.5]]])
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("TRITON_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PITLAB_AUTOTUNE_SEEDS", str(seeds))
    assert seed_autotune_cache() == 1  # into the user's folder, not $TRITON_HOME's
    assert (tmp_path / "mine" / "AAAA" / "chunk_fwd_kernel_o.autotune.json").is_file()
    assert not (tmp_path / "home").exists()
    assert autotune.pin_triton_cache_dir() == tmp_path / "mine"
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")
    monkeypatch.setenv("PITLAB_AUTOTUNE_SEEDS", "off")
    assert seed_autotune_cache() == 0
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")


def test_the_shipped_seeds_cover_the_trainers_backward_kernels_and_each_holds_timed_candidates():
    files = sorted(autotune.SEEDS.glob(f"*/*{autotune.SUFFIX}"))
    kernels = {p.name.removesuffix(autotune.SUFFIX) for p in files}
    assert len(files) == 20
    assert {"chunk_bwd_kernel_dqkwg", "chunk_bwd_kernel_dv_local", "chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64",
            "prepare_wy_repr_bwd_kernel", "l2norm_bwd_kernel", "causal_conv1d_bwd_kernel"} <= kernels
    for p in files:
        d = json.loads(p.read_text())
        timings = d["configs_timings"]
        assert len(timings) >= 1 and all(len(t) == 2 for t in timings), p
        assert all(ms > 0 for _, measured in timings for ms in measured), p  # milliseconds Triton measured
        assert len(p.parent.name) == 52, p  # Triton's base32 key folder
