"""Where a training step's time goes: torch.profiler windows of the plain Hugging Face loop and of pitlab's
trainer step, side by side in one process, on the shapes of ``bench/throughput.py``.

    python3 bench/profile_step.py --work /tmp/prof --out "$OUT" [--shape qwen35_reduced] [--warmup 3]
        [--steps 3] [--active 3] [--budget-s 330] [--traces]
        [--runs 'hf;default;{"loss": "chunked"};{"loss": "chunked", "compile": true}']

Each run (``hf``: :func:`throughput.hf_setup`, the plain loop; ``default`` or a JSON object of
``spec.training`` overrides: pitlab's :func:`~pitlab.trainer.train.setup_run` + :func:`~pitlab.trainer.train.train_step`):

1. ``--warmup`` steps (Triton autotuning, compilation, allocator), then ``--steps`` timed steps without the
   profiler (each synchronised by its loss read, as in ``throughput.py``): the step time, and the caching
   allocator's counters over them (``cudaMalloc``/``cudaFree`` calls, allocation retries).
2. One step under ``torch.cuda.set_sync_debug_mode("warn")`` (CUDA): every synchronising operation with the
   Python lines that called it (the host syncs of a step, found by the runtime itself).
3. ``--active`` steps under ``torch.profiler`` (CPU + CUDA activities; CPU only without a GPU). From its trace:
   GPU busy fraction (kernel time / wall, summed and as the union of kernel intervals), the top 20 kernels,
   GPU time of the kernels launched inside each step phase (``step.forward``, ``step.backward``, ``step.clip``,
   ``step.optimizer``, ``step.loss_read``; the trainer's and the plain loop's own ``record_function`` ranges),
   inside the optimizer's own range and inside FSDP2's ranges (``FSDP::*``: copy-in/cast, all-gather,
   reduce-scatter), the host syncs (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
   ``cudaEventSynchronize``; ``aten::_local_scalar_dense`` = ``item()``/``float()``; ``aten::nonzero``) by phase,
   and the ``cudaMalloc``/``cudaFree`` calls. dynamo's counters (graph breaks, recompilations) are recorded
   over the warm-up and over the later steps.

Then a diff table: kernel families, phases and kernels where pitlab spends more GPU time per step than the plain
loop. Writes ``profile.json`` (and with ``--traces`` each run's Chrome trace, gzipped, when under 10 MiB) to
``--out``; prints a short summary. Runs that would not finish within ``--budget-s`` are skipped, not cut.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import re
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import throughput as tp  # noqa: E402

CUDA = tp.CUDA
PHASES = ("step.forward", "step.backward", "step.clip", "step.optimizer", "step.loss_read")
SYNC_RUNTIME = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::item")
ALLOC_RUNTIME = ("cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaHostAlloc", "cudaFreeHost")
# kernel families, first match wins (names of kernels in torch 2.11 / Triton / NCCL / cuBLAS / fla)
FAMILIES = (
    ("nccl (FSDP collectives)", r"nccl"),
    ("fsdp copy-in/out, chunk_cat", r"chunk_cat|split_with_sizes|all_gather_copy|CatArrayBatchedCopy"),
    ("optimizer (fused AdamW, foreach)", r"fused_adam|FusedAdam|multi_tensor_apply|foreach"),
    ("grouped GEMM (experts)", r"grouped|GroupedGemm|group_gemm|_grouped_mm"),
    ("attention (SDPA/flash)", r"flash|fmha|attention|sdpa|efficient_attention"),
    ("fla gated delta rule", r"chunk_gated_delta|chunk_fwd|chunk_bwd|gated_delta|chunk_scaled_dot|"
                             r"chunk_local_cumsum|solve_tril|recompute_w_u|prepare_wy|fwd_kernel_o|bwd_kernel|"
                             r"l2norm|merge_16x16|chunk_dplr|kkt"),
    ("fla short convolution", r"causal_conv1d|conv1d"),
    ("inductor (torch.compile)", r"^triton_|triton_poi|triton_red|triton_per|triton_tem"),
    ("GEMM (cuBLAS/CUTLASS)", r"gemm|sm90_xmma|nvjet|cutlass|ampere_|sm80_|cublas|Kernel2|splitK"),
    ("softmax / cross-entropy", r"softmax|log_softmax|cross_entropy|nll_loss|logsumexp"),
    ("reduction (norms, sums)", r"reduce_kernel|Reduce|norm|Norm"),
    ("sort / routing / index", r"sort|Sort|radix|topk|TopK|histc|histogram|index|Index|scatter|gather|"
                               r"cumsum|scan|nonzero|where|embedding"),
    ("memcpy / memset", r"^Memcpy|^Memset|memcpy|memset"),
    ("copy / cast (elementwise)", r"copy_kernel|direct_copy|CopyKernel|bfloat16_copy|to_copy"),
    ("elementwise", r"elementwise|vectorized|unrolled|Functor|pointwise"),
)
_FAMILY_RE = [(name, re.compile(pattern)) for name, pattern in FAMILIES]


def family(kernel: str) -> str:
    """The kernel family of a CUDA kernel (or memcpy/memset) name, by :data:`FAMILIES` (first match)."""
    for name, rx in _FAMILY_RE:
        if rx.search(kernel):
            return name
    return "other"


def _short(name: str, n: int = 110) -> str:
    return name if len(name) <= n else name[:n - 1] + "…"


# ---------------------------------------------------------------------------------------------- trace analysis
def analyze_trace(trace: dict, wall_s: float, steps: int) -> dict:
    """Summarise a Chrome trace of ``steps`` profiled steps lasting ``wall_s`` seconds in all (synchronised).

    All times in the result are milliseconds per step unless the key says otherwise. Kernel time is attributed to
    a CPU range (``user_annotation`` or ``cpu_op`` event) when the runtime call that launched it (same
    ``correlation``) started inside that range on the same thread (backward's ranges live on autograd's thread)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    cpu_ranges = [e for e in events if e.get("cat") in ("user_annotation", "cpu_op")]
    per = 1.0 / max(steps, 1)
    out: dict = {"steps": steps, "wall_ms_per_step": wall_s * 1e3 * per, "kernels_per_step": len(gpu) * per}

    # GPU busy: summed kernel time and the union of kernel intervals over the wall time
    busy_sum = sum(e["dur"] for e in gpu)
    union = tp.interval_union((e["ts"], e["ts"] + e["dur"]) for e in gpu)
    out["gpu_kernel_ms_per_step"] = busy_sum / 1e3 * per
    out["gpu_busy_union_ms_per_step"] = union / 1e3 * per
    out["gpu_busy_fraction"] = None if not gpu or wall_s <= 0 else busy_sum / 1e6 / wall_s
    out["gpu_busy_fraction_union"] = None if not gpu or wall_s <= 0 else union / 1e6 / wall_s
    out["streams"] = dict(collections.Counter(str(e.get("args", {}).get("stream")) for e in gpu))

    # top kernels and families
    by_name: dict = collections.defaultdict(lambda: [0, 0.0])
    for e in gpu:
        rec = by_name[e["name"]]
        rec[0] += 1
        rec[1] += e["dur"]
    kernels = {name: {"count_per_step": c * per, "ms_per_step": d / 1e3 * per, "avg_us": d / max(c, 1),
                      "family": family(name)} for name, (c, d) in by_name.items()}
    out["kernels"] = kernels
    out["top_kernels"] = [dict(name=_short(n), **kernels[n]) for n in
                          sorted(kernels, key=lambda n: -kernels[n]["ms_per_step"])[:20]]
    fam: dict = collections.defaultdict(lambda: {"ms_per_step": 0.0, "count_per_step": 0.0})
    for k in kernels.values():
        fam[k["family"]]["ms_per_step"] += k["ms_per_step"]
        fam[k["family"]]["count_per_step"] += k["count_per_step"]
    out["families"] = dict(sorted(fam.items(), key=lambda kv: -kv[1]["ms_per_step"]))

    # kernel time launched inside CPU ranges (by correlation -> launch time -> enclosing range, same thread)
    launch = {e.get("args", {}).get("correlation"): e for e in runtime}
    per_tid: dict = collections.defaultdict(list)  # tid -> [(launch ts, kernel dur)]
    unattributed = 0.0
    for k in gpu:
        r = launch.get(k.get("args", {}).get("correlation"))
        if r is None:
            unattributed += k["dur"]
            continue
        per_tid[(r.get("pid"), r.get("tid"))].append((r["ts"], k["dur"]))
    prefix: dict = {}
    for key, rows in per_tid.items():
        rows.sort()
        prefix[key] = ([t for t, _ in rows], np.concatenate([[0.0], np.cumsum([d for _, d in rows])]))

    all_rows = sorted(row for rows in per_tid.values() for row in rows)
    prefix["any"] = ([t for t, _ in all_rows], np.concatenate([[0.0], np.cumsum([d for _, d in all_rows])]))

    def gpu_in(e: dict, any_thread: bool = False) -> tuple[float, int]:
        """Kernel time (us) and count launched during ``e``, on its thread or (phases: backward launches from
        autograd's thread while the main thread waits in ``backward()``) on any thread."""
        ts, cum = prefix.get("any" if any_thread else (e.get("pid"), e.get("tid")), ([], np.zeros(1)))
        lo, hi = bisect.bisect_left(ts, e["ts"]), bisect.bisect_right(ts, e["ts"] + e["dur"])
        return float(cum[hi] - cum[lo]), hi - lo

    ranges: dict = collections.defaultdict(lambda: {"calls": 0, "cpu_ms": 0.0, "gpu_ms": 0.0, "kernels": 0})
    for e in cpu_ranges:
        name = e["name"]
        key = None
        if name in PHASES:
            key = name
        elif name.startswith("Optimizer.step#") or name.startswith("Optimizer.zero_grad#"):
            key = name
        elif name.startswith("FSDP::"):
            key = re.sub(r"\s*\(.*\)$| for .*$", "", name)  # one row per range kind, not per layer
        if key is None:
            continue
        g, n = gpu_in(e, any_thread=key in PHASES)
        rec = ranges[key]
        rec["calls"] += 1
        rec["cpu_ms"] += e["dur"] / 1e3
        rec["gpu_ms"] += g / 1e3
        rec["kernels"] += n
    out["ranges"] = {k: {kk: (vv * per if kk != "calls" else vv * per) for kk, vv in v.items()}
                     for k, v in sorted(ranges.items())}
    out["unattributed_kernel_ms_per_step"] = unattributed / 1e3 * per
    out["optimizer_gpu_ms_per_step"] = sum(v["gpu_ms"] for k, v in out["ranges"].items()
                                           if k.startswith("Optimizer.step#"))
    out["optimizer_cpu_ms_per_step"] = sum(v["cpu_ms"] for k, v in out["ranges"].items()
                                           if k.startswith("Optimizer.step#"))
    # FSDP2's own work (unshard = copy-in/cast + all-gather + copy-out; reduce-scatter + float32 cast of the
    # gradients; reshard): kernels launched inside the outermost FSDP:: ranges (nested ones not counted twice)
    fsdp_gpu, fsdp_cpu, outer_end = 0.0, 0.0, {}
    for e in sorted((e for e in cpu_ranges if e["name"].startswith("FSDP::")), key=lambda e: e["ts"]):
        tid = (e.get("pid"), e.get("tid"))
        if e["ts"] < outer_end.get(tid, -1.0):
            continue
        outer_end[tid] = e["ts"] + e["dur"]
        fsdp_gpu += gpu_in(e)[0]
        fsdp_cpu += e["dur"]
    out["fsdp_gpu_ms_per_step"] = fsdp_gpu / 1e3 * per
    out["fsdp_cpu_ms_per_step"] = fsdp_cpu / 1e3 * per

    # host syncs and allocator calls, each placed in the step phase it happened in
    phase_rows = sorted(((e["ts"], e["ts"] + e["dur"], e["name"]) for e in cpu_ranges if e["name"] in PHASES))

    def phase_of(ts: float) -> str:
        i = bisect.bisect_right(phase_rows, (ts, float("inf"), "")) - 1
        while i >= 0:
            s, e, name = phase_rows[i]
            if s <= ts <= e:
                return name
            i -= 1
            if i >= 0 and phase_rows[i][1] < ts - 1e7:  # ranges end long before: stop looking back
                break
        return "other"

    syncs: dict = collections.defaultdict(lambda: {"count": 0, "ms": 0.0})
    for e in runtime:
        if e["name"] in SYNC_RUNTIME or e["name"] in ALLOC_RUNTIME:
            rec = syncs[f"{e['name']} @ {phase_of(e['ts'])}"]
            rec["count"] += 1
            rec["ms"] += e["dur"] / 1e3
    for e in cpu_ranges:
        if e["name"] in SYNC_OPS:
            rec = syncs[f"{e['name']} @ {phase_of(e['ts'])}"]
            rec["count"] += 1
            rec["ms"] += e["dur"] / 1e3
    out["syncs_and_allocs"] = {k: {"count_per_step": v["count"] * per, "ms_per_step": v["ms"] * per}
                               for k, v in sorted(syncs.items())}

    def total(names) -> tuple[float, float]:
        c = sum(v["count_per_step"] for k, v in out["syncs_and_allocs"].items() if k.split(" @ ")[0] in names)
        t = sum(v["ms_per_step"] for k, v in out["syncs_and_allocs"].items() if k.split(" @ ")[0] in names)
        return c, t

    out["host_sync_count_per_step"], out["host_sync_ms_per_step"] = total(SYNC_RUNTIME)
    out["scalar_reads_per_step"] = total(("aten::_local_scalar_dense",))[0]
    out["cuda_malloc_per_step"] = total(("cudaMalloc", "cudaMallocAsync"))[0]
    out["cuda_free_per_step"] = total(("cudaFree", "cudaFreeAsync"))[0]
    launches = [e for e in runtime if "Launch" in e["name"]]
    out["launches_per_step"] = len(launches) * per
    out["launch_cpu_ms_per_step"] = sum(e["dur"] for e in launches) / 1e3 * per
    return out


def diff(hf: dict, pl: dict) -> dict:
    """Where ``pl`` (pitlab) spends more GPU time per step than ``hf`` (the plain loop): families, phases, kernels
    (ms per step, positive = pitlab more), sorted by the difference."""
    def table(a: dict, b: dict, key: str = "ms_per_step") -> list:
        names = set(a) | set(b)
        rows = [{"name": _short(n), "pitlab": b.get(n, {}).get(key, 0.0), "hf": a.get(n, {}).get(key, 0.0)}
                for n in names]
        for r in rows:
            r["diff"] = r["pitlab"] - r["hf"]
        return sorted(rows, key=lambda r: -r["diff"])

    phases_hf = {k: v for k, v in hf["ranges"].items() if k in PHASES}
    phases_pl = {k: v for k, v in pl["ranges"].items() if k in PHASES}
    return {"wall_ms_per_step": pl["wall_ms_per_step"] - hf["wall_ms_per_step"],
            "gpu_kernel_ms_per_step": pl["gpu_kernel_ms_per_step"] - hf["gpu_kernel_ms_per_step"],
            "families": table(hf["families"], pl["families"]),
            "phases_gpu": table(phases_hf, phases_pl, "gpu_ms"),
            "phases_cpu": table(phases_hf, phases_pl, "cpu_ms"),
            "kernels": table(hf["kernels"], pl["kernels"])[:25]}


def bytes_model(params: int, fp32_master: bool, fsdp2: bool = True) -> dict:
    """HBM bytes per step of the parameter-sized work outside forward/backward compute, for ``params``
    parameters: AdamW (read p, g, m, v; write p, m, v), gradient clipping (norm read + scale read/write) and, with
    float32 master weights under FSDP2 at world size 1, the unshard (cast to bf16 + copy into the unsharded
    parameter) and the gradient reduction (cast to the float32 flat buffer + copy to the reduce output); the
    copies are the part a world-size-1 path could skip without changing a value. Without FSDP2
    (``fsdp2=False``, :mod:`pitlab.trainer.single_device`): the two casts only, bf16 gradients into the float32
    ones (read 2, write 4) and the masters into the bf16 copy (read 4, write 2)."""
    b = 4 if fp32_master else 2
    out = {"parameters": params, "optimizer": params * 7 * b, "clip": params * 3 * b}
    if fp32_master and fsdp2:
        out.update(fsdp_unshard=params * (4 + 2 + 2 + 2), fsdp_reduce=params * (2 + 4 + 4 + 4),
                   fsdp_redundant_copies=params * (2 + 2 + 4 + 4))
    elif fp32_master:
        out.update(compute_copy_casts=params * (2 + 4 + 4 + 2))
    return out


def achieved(r: dict) -> dict:
    """GB/s the optimizer and the FSDP ranges reached if they moved :func:`bytes_model`'s bytes in the GPU time
    the profile gave them."""
    p, m = r.get("profile"), r.get("bytes_model")
    if not p or not m:
        return {}
    out = {}
    if p["optimizer_gpu_ms_per_step"] > 0:
        out["optimizer_GBps"] = m["optimizer"] / (p["optimizer_gpu_ms_per_step"] * 1e-3) / 1e9
    if p.get("fsdp_gpu_ms_per_step", 0) > 0 and "fsdp_unshard" in m:
        out["fsdp_GBps"] = (m["fsdp_unshard"] + m["fsdp_reduce"]) / (p["fsdp_gpu_ms_per_step"] * 1e-3) / 1e9
    return out


# ----------------------------------------------------------------------------------------------------- runs
def _allocator_counters() -> dict:
    if not CUDA:
        return {}
    s = torch.cuda.memory_stats()
    return {k: s.get(k, 0) for k in ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms",
                                      "num_sync_all_streams")}


def _dynamo_counters() -> dict:
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001
        return {}
    return {"graph_break": dict(counters.get("graph_break", {})), "recompiles": dict(counters.get("recompiles", {})),
            "unique_graphs": counters.get("stats", {}).get("unique_graphs", 0),
            "calls_captured": counters.get("stats", {}).get("calls_captured", 0)}


def _delta(after: dict, before: dict) -> dict:
    out = {}
    for k, v in after.items():
        if isinstance(v, dict):
            out[k] = {kk: vv - before.get(k, {}).get(kk, 0) for kk, vv in v.items()
                      if vv - before.get(k, {}).get(kk, 0)}
        else:
            out[k] = v - before.get(k, 0)
    return out


def sync_debug_step(step) -> dict:
    """Run ``step()`` once with CUDA's sync debug mode on; each synchronising operation, keyed by the innermost
    project/transformers/fla Python frames that issued it, with its count and warning text."""
    if not CUDA:
        return {"skipped": "no CUDA"}
    found: dict = collections.defaultdict(lambda: {"count": 0, "message": ""})

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):  # another warning, not the sync debug mode's
            return
        frames = [f for f in traceback.extract_stack()[:-2]
                  if not f.filename.endswith(("warnings.py", "profile_step.py"))]
        keep = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames
                if any(s in f.filename for s in ("pitlab", "transformers", "fla", "bench", "torch/distributed",
                                                 "torch/nn", "torch/optim"))][-4:]
        key = " < ".join(reversed(keep)) or f"{Path(filename).name}:{lineno}"
        found[key]["count"] += 1
        found[key]["message"] = str(message)[:160]

    old = warnings.showwarning
    warnings.showwarning = show
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step()
                torch.cuda.synchronize()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        warnings.showwarning = old
    return dict(sorted(found.items(), key=lambda kv: -kv[1]["count"]))


def profile_run(label: str, step, n_warmup: int, n_steps: int, n_active: int, out_dir: Path, traces: bool,
                deadline: float) -> dict:
    """Warm-up, timed steps, a sync-debug step and a profiled window of ``step()`` (one synchronised training
    step returning its loss as a float); see the module docstring."""
    from torch.profiler import ProfilerActivity, profile

    res: dict = {}
    dyn0 = _dynamo_counters()
    times = []
    t0 = time.perf_counter()
    for _ in range(n_warmup):
        t = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t)
    res["warmup_s"] = times
    res["loss_after_warmup"] = loss if n_warmup else None
    res["dynamo_warmup"] = _delta(_dynamo_counters(), dyn0)
    if time.perf_counter() > deadline:
        res["stopped"] = "budget after warm-up"
        return res
    dyn1, alloc0 = _dynamo_counters(), _allocator_counters()
    times = []
    for _ in range(n_steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    res["step_s"] = times
    res["step_ms_median"] = float(np.median(times)) * 1e3 if times else None
    res["allocator_over_timed_steps"] = _delta(_allocator_counters(), alloc0)
    res["sync_debug"] = sync_debug_step(step)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    times = []
    with profile(activities=activities, record_shapes=False, with_stack=False) as prof:
        for _ in range(n_active):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
    res["profiled_step_s"] = times
    res["dynamo_after_warmup"] = _delta(_dynamo_counters(), dyn1)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        raw = path.read_bytes()
    trace = json.loads(raw)
    res["profile"] = analyze_trace(trace, sum(times), len(times))
    if traces:
        gz = gzip.compress(raw, compresslevel=6)
        name = "trace_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") + ".json.gz"
        if len(gz) < 10 * 2 ** 20:  # $OUT returns at most 8 files, 16 MiB each, 64 MiB in all
            (out_dir / name).write_bytes(gz)
            res["trace_file"] = name
        else:
            res["trace_file"] = f"not written: {len(gz) / 2 ** 20:.1f} MiB gzipped"
    res["analysis_s"] = time.perf_counter() - t
    res["total_s"] = time.perf_counter() - t0
    return res


def hf_profile(shape: dict, args, deadline: float) -> dict:
    """The plain loop (``throughput.hf_setup``: bf16 parameters, fused AdamW, clipping, its own loss, no
    activation checkpointing) through :func:`profile_run`."""
    from torch.profiler import record_function

    tp._free()
    model, opt, report, _ = tp.hf_setup(shape, lr=args.lr)
    seq = shape["seq"]
    n = args.warmup + args.steps + args.active + 1
    tokens = torch.from_numpy(tp.synthetic_tokens((seq + 1) * n + 1, shape["vocab"]).astype(np.int64))
    params = list(model.parameters())
    i = [0]

    def step() -> float:  # the steps of hf_setup, with the phase ranges
        chunk = tokens[i[0] * (seq + 1):(i[0] + 1) * (seq + 1)].to(tp.DEVICE)
        i[0] = (i[0] + 1) % n
        with record_function("step.forward"):
            out = model(input_ids=chunk[None], labels=chunk[None])
        with record_function("step.backward"):
            out.loss.backward()
        with record_function("step.clip"):
            torch.nn.utils.clip_grad_norm_(params, 1.0)
        with record_function("step.optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        with record_function("step.loss_read"):
            return float(out.loss.detach())

    try:
        res = profile_run("hf", step, args.warmup, args.steps, args.active, args.out, args.traces, deadline)
        res.update(kernels_report=report, bytes_model=bytes_model(sum(q.numel() for q in params), False),
                   **tp._peaks())
        res["achieved"] = achieved(res)
        return res
    finally:
        del model, opt, step, params
        tp._free()


def pitlab_profile(shape: dict, args, overrides: dict | None, label: str, deadline: float) -> dict:
    """pitlab's trainer (``setup_run`` + ``train_step``, ``overrides`` on ``spec.training``) through
    :func:`profile_run`."""
    from pitlab.trainer.train import RunPaths, setup_run, train_step

    tp._free()
    n = args.warmup + args.steps + args.active + 1
    t = time.perf_counter()
    spec_path = tp.pitlab_spec(shape, args.work, n, overrides, args.lr)
    base_s = time.perf_counter() - t
    tp._free()
    t = time.perf_counter()
    ctx = setup_run(spec_path, RunPaths(spec_path.parent, spec_path.parent / "base"))
    setup_s = time.perf_counter() - t
    i = [0]

    def step() -> float:
        r = train_step(ctx, i[0])
        i[0] = (i[0] + 1) % n
        return r.loss

    try:
        res = profile_run(label, step, args.warmup, args.steps, args.active, args.out, args.traces, deadline)
        res.update(base_and_spec_s=base_s, setup_s=setup_s, kernels_report=ctx.kernels,
                   activation_checkpointing=ctx.activation_checkpointing, training_overrides=overrides or {},
                   bytes_model=bytes_model(ctx.shape.total, ctx.spec.training.precision == "bf16"
                                           and ctx.world == 1, fsdp2=ctx.compute is None),
                   parallelism=ctx.parallelism,
                   **tp._peaks())
        res["achieved"] = achieved(res)
        return res
    finally:
        ctx.close()
        del ctx, step
        tp._free()


# --------------------------------------------------------------------------------------------------- report
def summary_lines(label: str, r: dict) -> list[str]:
    if "profile" not in r:
        return [f"== {label}: {json.dumps({k: v for k, v in r.items() if k != 'traceback'}, default=str)[:400]}"]
    p = r["profile"]
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    lines = [f"== {label}: step {r['step_ms_median']:.1f} ms (median of {len(r['step_s'])} unprofiled), "
             f"profiled {p['wall_ms_per_step']:.1f} ms; GPU busy {fmt(p['gpu_busy_fraction'])} "
             f"(union {fmt(p['gpu_busy_fraction_union'])}); kernels {p['kernels_per_step']:.0f}/step, launches "
             f"{p['launches_per_step']:.0f}/step ({p['launch_cpu_ms_per_step']:.1f} ms CPU)"
             + (f"; {r['parallelism']}" if r.get("parallelism") else ""),
             f"   optimizer GPU {p['optimizer_gpu_ms_per_step']:.1f} ms CPU {p['optimizer_cpu_ms_per_step']:.1f} ms; "
             f"FSDP ranges GPU {p['fsdp_gpu_ms_per_step']:.1f} ms CPU {p['fsdp_cpu_ms_per_step']:.1f} ms; host syncs "
             f"{p['host_sync_count_per_step']:.1f}/step ({p['host_sync_ms_per_step']:.1f} ms); item() "
             f"{p['scalar_reads_per_step']:.1f}/step; cudaMalloc {p['cuda_malloc_per_step']:.1f} cudaFree "
             f"{p['cuda_free_per_step']:.1f}/step; allocator over timed steps {r.get('allocator_over_timed_steps')}",
             f"   bytes model (GB/step) {({k: round(v / 1e9, 1) for k, v in r.get('bytes_model', {}).items() if k != 'parameters'})}; "
             f"achieved {({k: round(v) for k, v in r.get('achieved', {}).items()})}",
             f"   peak allocated {r.get('peak_allocated', 0) / 1e9:.2f} GB; dynamo after warm-up "
             f"{r.get('dynamo_after_warmup')}; warm-up {r.get('dynamo_warmup')}"]
    lines.append("   phases (ms/step cpu / gpu): " + ", ".join(
        f"{k.split('.')[-1]} {v['cpu_ms']:.1f}/{v['gpu_ms']:.1f}" for k, v in p["ranges"].items() if k in PHASES))
    if r.get("sync_debug") and "skipped" not in r["sync_debug"]:
        lines.append("   sync debug: " + "; ".join(f"{v['count'] if isinstance(v, dict) else v}× {k}"
                                                   for k, v in list(r["sync_debug"].items())[:6]))
    lines.append("   top kernels (ms/step, calls/step):")
    for k in p["top_kernels"][:10]:
        lines.append(f"     {k['ms_per_step']:8.2f} {k['count_per_step']:7.0f}  [{k['family']}] {_short(k['name'], 90)}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="folder for the base model and token files")
    ap.add_argument("--out", type=Path, required=True, help="folder for profile.json (and traces)")
    ap.add_argument("--shape", default="qwen35_reduced", choices=sorted(tp.SHAPES))
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed steps without the profiler")
    ap.add_argument("--active", type=int, default=3, help="profiled steps")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--budget-s", type=float, default=330, help="skip runs that would end after this")
    ap.add_argument("--traces", action="store_true", help="write each run's Chrome trace (gzipped) to --out")
    ap.add_argument("--runs", default='hf;default;{"loss": "chunked"};{"loss": "chunked", "compile": true}',
                    help="semicolon-separated: hf, default, or a JSON object of spec.training overrides")
    ap.add_argument("--need-s", default="hf=170,default=90,loss=75,compile=170",
                    help="seconds each kind of run is expected to take (a run starts only if that is left); "
                         "'compile' for runs with compile: true, 'loss' for any other override")
    args = ap.parse_args()
    t_begin = time.perf_counter()
    deadline = t_begin + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    need = {k: float(v) for k, v in (x.split("=") for x in args.need_s.split(","))}
    tp.init_single_process_group()
    import torch.distributed as dist
    import transformers
    shape = tp.SHAPES[args.shape]
    results: dict = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name() if CUDA else "cpu",
                     "torch": torch.__version__, "transformers": transformers.__version__, "shape": args.shape,
                     "runs": {}}
    try:
        import fla
        results["fla"] = fla.__version__
    except Exception as err:  # noqa: BLE001 - the kit may be absent
        results["fla"] = f"not importable: {err}"

    def save() -> None:
        results["elapsed_s"] = time.perf_counter() - t_begin
        hf = results["runs"].get("hf", {}).get("profile")
        results["diff"] = {label: diff(hf, r["profile"]) for label, r in results["runs"].items()
                           if hf is not None and label != "hf" and "profile" in r}
        (args.out / "profile.json").write_text(json.dumps(results, indent=1, default=str))

    for item in (x.strip() for x in args.runs.split(";") if x.strip()):
        if item == "hf":
            label, kind, overrides = "hf", "hf", None
        elif item == "default":
            label, kind, overrides = "pitlab", "default", None
        else:
            overrides = json.loads(item)
            label = "pitlab " + ",".join(f"{k}={overrides[k]}" for k in sorted(overrides))
            kind = "compile" if overrides.get("compile") else "loss"
        left = deadline - time.perf_counter()
        if CUDA and left < need.get(kind, 90):
            results["runs"][label] = {"skipped": f"budget: {left:.0f} s left, {need.get(kind, 90):.0f} s needed"}
            print(f"== {label}: skipped ({left:.0f} s left)", flush=True)
            save()
            continue
        t = time.perf_counter()
        try:
            if kind == "hf":
                r = hf_profile(shape, args, deadline)
            else:
                r = pitlab_profile(shape, args, overrides, label, deadline)
        except Exception as err:  # noqa: BLE001 - keep profiling the rest
            r = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
            print(traceback.format_exc(), flush=True)
            tp._free()
        r["wall_s"] = time.perf_counter() - t
        results["runs"][label] = r
        save()
        print("\n".join(summary_lines(label, r)), flush=True)

    if results.get("diff"):
        for label, d in results["diff"].items():
            print(f"\n== {label} minus hf: wall {d['wall_ms_per_step']:+.1f} ms/step, GPU kernel time "
                  f"{d['gpu_kernel_ms_per_step']:+.1f} ms/step")
            print("   phases, GPU ms/step (pitlab / hf / diff): " + ", ".join(
                f"{r['name'].split('.')[-1]} {r['pitlab']:.1f}/{r['hf']:.1f}/{r['diff']:+.1f}" for r in d["phases_gpu"]))
            print("   phases, CPU ms/step (pitlab / hf / diff): " + ", ".join(
                f"{r['name'].split('.')[-1]} {r['pitlab']:.1f}/{r['hf']:.1f}/{r['diff']:+.1f}" for r in d["phases_cpu"]))
            print(f"   {'family':<36}{'pitlab':>9}{'hf':>9}{'diff':>9}  (GPU ms/step)")
            for r in d["families"]:
                if abs(r["diff"]) >= 0.05:
                    print(f"   {r['name']:<36}{r['pitlab']:>9.2f}{r['hf']:>9.2f}{r['diff']:>+9.2f}")
            print("   kernels where pitlab spends most more (ms/step):")
            for r in d["kernels"][:8]:
                print(f"     {r['diff']:+8.2f} ({r['pitlab']:.2f} vs {r['hf']:.2f}) {_short(r['name'], 90)}")
    save()
    print(f"\nprofile.json written to {args.out} ({time.perf_counter() - t_begin:.0f} s)", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
