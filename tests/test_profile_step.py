"""bench/profile_step.py's trace analysis on a hand-made Chrome trace with CUDA events (the CPU has none): GPU busy
time, kernel time attributed to the step phases (backward's kernels are launched from autograd's thread) and to
FSDP2's outermost ranges, host syncs and allocator calls by phase, kernel families, the pitlab-minus-hf diff."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
profile_step = pytest.importorskip("profile_step")


def X(cat: str, name: str, ts: float, dur: float, tid: int = 1, pid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict:
    return X("kernel", name, ts, dur, tid=stream, pid=0, correlation=corr, stream=stream)


def launch(ts: float, corr: int, tid: int = 1) -> dict:
    return X("cuda_runtime", "cudaLaunchKernel", ts, 1, tid=tid, correlation=corr)


def trace() -> dict:
    """One step of 1,000 us: forward (main thread, an FSDP unshard inside with a nested range), backward (kernels
    launched from thread 2, an FSDP reduce there), the optimizer, the loss read (a stream sync)."""
    ev = [X("user_annotation", "step.forward", 0, 300), X("user_annotation", "step.backward", 300, 400),
          X("user_annotation", "step.optimizer", 700, 200), X("user_annotation", "step.loss_read", 900, 100),
          X("user_annotation", "FSDP::pre_forward (model.layers.0)", 10, 50),
          X("user_annotation", "FSDP::all_gather_copy_in", 20, 10),
          X("user_annotation", "FSDP::post_backward_reduce (model.layers.0)", 600, 50, tid=2),
          X("user_annotation", "Optimizer.step#AdamW.step", 710, 150)]
    ev += [launch(25, 1), kernel("void at::native::elementwise_kernel<bf16_copy>", 30, 40, 1),       # FSDP cast
           launch(100, 2), kernel("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNN", 100, 150, 2),        # forward GEMM
           launch(310, 3, tid=2), kernel("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 310, 250, 3),  # backward
           launch(610, 4, tid=2), kernel("void at::native::chunk_cat_cuda_kernel<float>", 610, 30, 4),  # FSDP reduce
           launch(720, 5), kernel("void at::native::fused_adam_kernel<float>", 720, 100, 5),          # AdamW
           launch(750, 6), kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 800, 50, 6, stream=9),  # overlaps
           X("cuda_runtime", "cudaStreamSynchronize", 910, 60, correlation=7),
           X("cpu_op", "aten::_local_scalar_dense", 905, 70),
           X("cuda_runtime", "cudaMalloc", 320, 5, tid=2, correlation=8),
           X("cuda_runtime", "cudaFree", 330, 5, tid=2, correlation=9)]
    return {"traceEvents": ev}


def test_analyze_trace_attributes_kernels_syncs_and_allocations():
    p = profile_step.analyze_trace(trace(), wall_s=1e-3, steps=1)
    assert p["gpu_kernel_ms_per_step"] == pytest.approx(0.62)        # 40+150+250+30+100+50 us
    assert p["gpu_busy_fraction"] == pytest.approx(0.62)
    assert p["gpu_busy_fraction_union"] == pytest.approx(0.60)       # the all-reduce overlaps AdamW by 20 us
    r = p["ranges"]
    assert (r["step.forward"]["gpu_ms"], r["step.backward"]["gpu_ms"]) == pytest.approx((0.19, 0.28))
    assert (r["step.optimizer"]["gpu_ms"], r["step.loss_read"]["gpu_ms"]) == pytest.approx((0.15, 0.0))
    assert r["FSDP::pre_forward"]["gpu_ms"] == pytest.approx(0.04) and r["FSDP::pre_forward"]["calls"] == 1
    assert p["fsdp_gpu_ms_per_step"] == pytest.approx(0.07)          # outermost ranges only: 40 + 30 us
    assert p["optimizer_gpu_ms_per_step"] == pytest.approx(0.15)
    assert p["host_sync_count_per_step"] == 1 and p["host_sync_ms_per_step"] == pytest.approx(0.06)
    assert p["syncs_and_allocs"]["cudaStreamSynchronize @ step.loss_read"]["count_per_step"] == 1
    assert p["syncs_and_allocs"]["cudaMalloc @ step.backward"]["count_per_step"] == 1
    assert (p["cuda_malloc_per_step"], p["cuda_free_per_step"], p["scalar_reads_per_step"]) == (1, 1, 1)
    assert p["launches_per_step"] == 6
    fam = p["families"]
    assert fam["GEMM (cuBLAS/CUTLASS)"]["ms_per_step"] == pytest.approx(0.40)
    assert fam["optimizer (fused AdamW, foreach)"]["ms_per_step"] == pytest.approx(0.10)
    assert fam["fsdp copy-in/out, chunk_cat"]["ms_per_step"] == pytest.approx(0.03)
    assert fam["nccl (FSDP collectives)"]["ms_per_step"] == pytest.approx(0.05)
    assert fam["elementwise"]["ms_per_step"] == pytest.approx(0.04)
    assert p["top_kernels"][0]["name"].startswith("nvjet_tst_256x128")


def test_diff_ranks_what_pitlab_spends_more_on():
    hf = profile_step.analyze_trace({"traceEvents": [e for e in trace()["traceEvents"]
                                                     if "chunk_cat" not in e["name"] and e["name"] != "cudaLaunchKernel"
                                                     or e.get("args", {}).get("correlation") != 4]}, 1e-3, 1)
    pl = profile_step.analyze_trace(trace(), 1e-3, 1)
    d = profile_step.diff(hf, pl)
    assert d["families"][0]["name"] == "fsdp copy-in/out, chunk_cat" and d["families"][0]["diff"] == pytest.approx(0.03)
    assert d["gpu_kernel_ms_per_step"] == pytest.approx(0.03)
    assert {r["name"]: r["diff"] for r in d["phases_gpu"]}["step.backward"] == pytest.approx(0.03)
