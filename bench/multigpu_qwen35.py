"""Multi-GPU benchmark (issue 7): FSDP2 full-weight training of a reduced Qwen3.5-35B-A3B shape on every GPU
of one machine, then gradient accumulation (with and without per-microbatch sync), checkpoint merge and resume.

    python bench/multigpu_qwen35.py --work /tmp/mg --out "$OUT" [--steps 30] [--accum-steps 4] [--budget-s 500]
    python bench/multigpu_qwen35.py --work /tmp/mg --out /tmp/mg-out --tiny --nproc 2   # CPU (gloo) rehearsal

Model: the real Qwen3.5-35B-A3B text configuration (hidden 2048, 16 query / 2 KV heads of 256, linear
attention 16 key / 32 value heads of 128, the 3 linear : 1 full attention pattern, MoE intermediate 512 +
shared expert 512, top-8 routing, vocabulary 248,320) with **8 instead of 40 decoder layers and 64 instead of
256 experts** (see ``REDUCED``), random-initialised (seed 0). World size = ``torch.cuda.device_count()`` (or
``--nproc`` on CPU; at world size 1 the trainer's single-device path, no FSDP2, unless
``PITLAB_FORCE_FSDP2=1``). Stages, each one torchrun job of ``pitlab.trainer.train`` (via ``run_training``):

1. ``base``: accumulation 1, ``--steps`` steps, checkpoints at step ``steps - 5`` and at the end (both kept).
2. ``accum_sync``: accumulation ``--accum-steps``, reduce-scatter every microbatch (the default).
3. ``accum_nosync``: the same with ``gradientSyncEveryMicrobatch: false``.
4. ``merge``: ``python -m pitlab.cli merge`` of the base run's final checkpoint as a separate single
   process (checked against the summary's ``param_sha256``): time, bytes/s, peak RSS (``wait4``).
5. ``resume``: the base run's final checkpoint is removed, ``latest`` pointed at step ``steps - 5``, and the
   run started again on the same world size; its final parameter digests are compared with the
   uninterrupted run's.
6. ``repeat``: the base run again from the start in another folder, its losses and gradient norms compared
   with the base run's step by step (as the resume's are): whether two uninterrupted runs on this machine are
   bit-identical, which tells a resume's drift from the GPU's own run-to-run differences.
7. ``single`` (run right after ``base``): the base run's spec on one GPU (pitlab's single-device path, the
   faster one there), so ``scaling`` in the JSON holds both per-GPU rates and the scaling efficiency
   ``rate(W) / (W rate(1))`` (issue 27 item 4: at least 0.9 from 1 to 2 GPUs). Without ``merge`` and ``resume``
   the base run's checkpoint is deleted first (53 GB at 40 layers × 16 experts: a 128 GB disk does not hold the
   base model and two).

Issue 27 item 4 on a machine of 2 H200s (about 8 minutes; both runs without activation checkpointing, as the planner
chooses there; their final checkpoints are the only ones written)::

    python3 bench/multigpu_qwen35.py --work /tmp/mg --out "$OUT" --layers 40 --experts 16 --steps 20 \
        --stages base,single --final-checkpoint-only --checkpointing auto --budget-s 540

Per stage: the trainer summary (rank 0's ``max_memory_allocated`` / ``max_memory_reserved``), the planner's
prediction for that spec, and each GPU's peak ``memory.used`` sampled with nvidia-smi every 0.5 s (the
driver's view: allocator cache + CUDA/NCCL context). ``multigpu.json`` in ``--out`` is rewritten after every
stage, so a run cut short still leaves what finished. A stage is skipped when less than its estimated time is
left of ``--budget-s``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from h200_qwen35 import CONFIG, SEQ, TINY_CONFIG, TINY_SEQ, TINY_VOCAB, training_resource, write_synthetic_tokens  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Qwen3.5-35B-A3B: 40 layers, 256 experts (top-8), vocabulary 248,320; reduced here to fit one device call.
REAL = dict(CONFIG, num_hidden_layers=40, num_experts=256, num_experts_per_tok=8)
REDUCED = dict(num_hidden_layers=8, num_experts=64)
REAL_VOCAB = 248320
# NVLink multicast stays off (the device machines require it); recorded with the results.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class GpuMemorySampler:
    """Peak ``memory.used`` (MiB) of each GPU, from ``nvidia-smi`` every ``period`` seconds, in a thread."""

    def __init__(self, period: float = 0.5):
        self.period, self.peak, self._stop = period, {}, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                for line in out.strip().splitlines():
                    i, used = (int(x) for x in line.split(","))
                    self.peak[i] = max(self.peak.get(i, 0), used)
            except (OSError, ValueError, subprocess.SubprocessError):
                return
            self._stop.wait(self.period)

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def write_tokenizer(path: Path, eos: int = 0, pad: int = 1) -> None:
    """A minimal word-level tokenizer for the base directory (the merge ships the base's tokenizer)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<|endoftext|>": eos, "<|pad|>": pad, "<unk>": 2}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                            pad_token="<|pad|>", unk_token="<unk>").save_pretrained(path)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def scaling(stages: dict, nproc: int) -> dict | None:
    """Tokens/s per GPU on one GPU (the ``single`` stage) and on ``nproc`` (``base``), and the scaling efficiency
    ``rate(nproc) / (nproc × rate(1))`` (the per-GPU rates' ratio); None unless both stages measured a rate."""
    one = stages.get("single", {}).get("tokens_per_second_per_gpu")
    many = stages.get("base", {}).get("tokens_per_second_per_gpu")
    if not one or not many:
        return None
    return {"tokens_per_second_per_gpu": {"1": one, str(nproc): many}, "efficiency": many / one,
            "parallelism": {"1": stages["single"].get("parallelism"), str(nproc): stages["base"].get("parallelism")}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--accum-steps", type=int, default=4, help="optimizer steps of the accumulation runs")
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--nproc", type=int, default=None, help="ranks (default: every visible GPU)")
    ap.add_argument("--budget-s", type=float, default=500.0, help="skip stages that would not end within this")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and seq 128 (a CPU gloo rehearsal)")
    ap.add_argument("--final-checkpoint-only", action="store_true",
                    help="base saves only its final checkpoint (a 64 GiB disk holds one 35 GB checkpoint, not "
                         "two); the resume stage is then skipped")
    ap.add_argument("--layers", type=int, default=REDUCED["num_hidden_layers"],
                    help="decoder layers (the real model has 40; default %(default)s)")
    ap.add_argument("--experts", type=int, default=REDUCED["num_experts"],
                    help="routed experts per layer (the real model has 256; top-8 routing either way, so the "
                         "active parameters and FLOPs per token do not depend on it; default %(default)s)")
    ap.add_argument("--deterministic", action="store_true",
                    help="every stage with training.deterministic: true (torch's deterministic algorithms): whether "
                         "a resume, or a repeat, is then bit-identical on the GPU")
    ap.add_argument("--checkpointing", choices=("on", "off", "auto"), default="on",
                    help="activation checkpointing of every stage: on (the records before 2026-12-07), off, or auto "
                         "(the planner's choice: off where the run fits the GPU without it, as `pitlab run` does)")
    ap.add_argument("--stages", default="base,accum_sync,accum_nosync,merge,resume",  # and repeat, single
                    help="comma-separated subset to run (resume and merge need base; single: the base run's spec "
                         "on one GPU, pitlab's single-device path, for the scaling efficiency from 1 GPU to all)")
    args = ap.parse_args()
    t_begin = time.perf_counter()
    for k, v in NCCL_ENV.items():
        os.environ[k] = v

    from transformers import AutoModelForCausalLM

    from pitlab.trainer.launch import run_training, write_spec
    from pitlab.trainer.flops import train_flops_per_token
    from pitlab.trainer.plan import model_shape, plan_memory
    from pitlab.trainer.prepare import build_config

    cuda = torch.cuda.is_available()
    nproc = args.nproc or (torch.cuda.device_count() if cuda else 2)
    reduced = {"num_hidden_layers": args.layers, "num_experts": args.experts}
    cfg, seq, vocab = dict(REAL, **reduced), SEQ, REAL_VOCAB
    if args.tiny:
        cfg.update(TINY_CONFIG)
        cfg.update(num_experts=4, num_experts_per_tok=2)
        seq, vocab = TINY_SEQ, TINY_VOCAB
    work, out = args.work, args.out
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"command": " ".join(sys.argv), "world_size": nproc, "deterministic": args.deterministic,
                     "seq_len": seq, "vocab": vocab,
                     "config": cfg, "reduced_from_real": {k: (REAL.get(k), v) for k, v in reduced.items() if REAL.get(k) != v},
                     "nccl_env": {k: os.environ.get(k) for k in sorted(os.environ)
                                  if k.startswith(("NCCL", "TORCH_NCCL", "TORCH_SYMM", "NVSHMEM"))},
                     "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
                     "process_group_timeout": "torch default (NCCL 10 min; pitlab.trainer.train sets none)",
                     "stages": {}, "skipped": {}}

    def save() -> None:
        results["elapsed_s"] = time.perf_counter() - t_begin
        (out / "multigpu.json").write_text(json.dumps(results, indent=2, default=str))

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t_begin)

    # base model: random init on the GPU when there is one (seconds, not minutes, for billions of parameters)
    t0 = time.perf_counter()
    config = build_config("qwen3_5_moe_text", cfg, vocab_size=vocab, eos_token_id=0, pad_token_id=1, bos_token_id=0)
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    base = work / "base"
    model.save_pretrained(base)
    del model
    if cuda:
        torch.cuda.empty_cache()
    write_tokenizer(base)
    shape = model_shape(config)
    real_shape = None if args.tiny else model_shape(build_config("qwen3_5_moe_text", REAL, vocab_size=REAL_VOCAB))
    max_steps = max(args.steps, args.accum_steps * args.accum)
    data = work / "data" / "tokens.npy"
    write_synthetic_tokens(data, (seq + 1) * max_steps * nproc + 1, vocab)
    results["model"] = {"parameters": shape.total, "active_parameters": shape.active,
                        "train_flops_per_token": train_flops_per_token(shape, seq),
                        "real_35b_a3b": None if real_shape is None else
                        {"parameters": real_shape.total, "active_parameters": real_shape.active},
                        "base_bytes": du(base), "build_s": time.perf_counter() - t0}
    print(f"bench: {shape.total / 1e9:.3f} B parameters ({shape.active / 1e9:.3f} B active), world size {nproc}, "
          f"base written in {time.perf_counter() - t0:.1f} s", flush=True)
    save()

    checkpointing = {"on": True, "off": False, "auto": None}[args.checkpointing]

    def train_stage(name: str, run: Path, steps: int, accum: int = 1, sync: bool = True, every: int = 0,
                    keep: int = 1, ranks: int | None = None) -> dict:
        """One torchrun job of ``ranks`` processes (default: every GPU) and its record."""
        ranks = ranks or nproc
        run.mkdir(parents=True, exist_ok=True)
        if not (run / "data").exists():
            (run / "data").symlink_to(data.parent)
        res = training_resource("mg-" + name.replace("_", "-"), base, seq, seq * steps * ranks * accum, ranks,
                                accumulation=accum, sync_every_microbatch=sync, checkpointing=checkpointing,
                                checkpoint_every=every, keep=keep, deterministic=args.deterministic)
        spec_path = write_spec(res, run / "spec.json")
        plan = plan_memory(res.spec, shape)
        t = time.perf_counter()
        with GpuMemorySampler() as sampler:
            summary = run_training(spec_path, run, nproc=ranks, base=base,
                                   on_step=lambda r: print(name, json.dumps(r), flush=True))
        wall = time.perf_counter() - t
        metrics = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
        first = summary["resumed_from_step"] or 0
        new = [m for m in metrics if m["step"] > first]
        steady = [m for m in new if m["step"] > first + min(5, len(new) // 2)] or new
        tps = float(np.median([m["tokens_per_second"] for m in steady]))
        measured = summary["peak_memory_bytes"]
        stage = {
            "world_size": ranks, "steps": steps, "accumulation": accum, "sync_every_microbatch": sync, "wall_s": wall,
            "activation_checkpointing": plan.activation_checkpointing, "parallelism": summary.get("parallelism"),
            "steady_steps": [steady[0]["step"], steady[-1]["step"]],
            "tokens_per_second_total": tps, "tokens_per_second_per_gpu": tps / ranks,
            "mfu": None if steady[0]["mfu"] is None else float(np.median([m["mfu"] for m in steady])),
            "peak_allocated_rank0": measured, "peak_reserved_rank0": summary["peak_memory_reserved_bytes"],
            "nvidia_smi_peak_mib_per_gpu": dict(sorted(sampler.peak.items())),
            "planned_peak": plan.peak_bytes, "planned_allocated": plan.allocated_bytes,
            "plan_components": plan.components, "plan_table": plan.table(),
            # like with like: the planned allocated bytes against torch's allocated peak, the planned peak (with
            # the allocator's reserve) against the reserved peak
            "plan_error_vs_allocated": (plan.allocated_bytes - measured) / measured if measured else None,
            "plan_error_vs_reserved": (None if not summary["peak_memory_reserved_bytes"] else
                                       (plan.peak_bytes - summary["peak_memory_reserved_bytes"])
                                       / summary["peak_memory_reserved_bytes"]),
            "loss": [new[0]["loss"], new[-1]["loss"]],
            "summary": {k: v for k, v in summary.items() if k != "param_sha256"},
        }
        print(plan.table(), flush=True)
        print(name, json.dumps({k: v for k, v in stage.items() if k not in ("summary", "plan_table",
                                                                              "plan_components")}), flush=True)
        return stage, summary

    wanted = set(args.stages.split(","))

    def guarded(name: str, need_s: float, fn) -> None:
        if name not in wanted:
            results["skipped"][name] = "not in --stages"
            save()
            return
        if left() < need_s:
            results["skipped"][name] = f"{left():.0f} s of the budget left, about {need_s:.0f} s needed"
            save()
            return
        try:
            results["stages"][name] = fn()
        except Exception as err:  # keep going: the other stages still measure something
            results["stages"][name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
            print(traceback.format_exc(), flush=True)
        save()

    run_base = work / "run-base"
    mid = max(1, args.steps - 5)
    keep = args.steps // mid + 1  # the step-`mid` checkpoint must survive for the resume stage
    state: dict = {}

    def base_stage():
        stage, summary = train_stage("base", run_base, args.steps, every=0 if args.final_checkpoint_only else mid,
                                     keep=1 if args.final_checkpoint_only else keep)
        state["summary"] = summary
        (run_base / "uninterrupted_summary.json").write_text(json.dumps(summary))
        shutil.copyfile(run_base / "train" / "metrics.jsonl", run_base / "uninterrupted_metrics.jsonl")
        stage["checkpoint_bytes"] = du(run_base / "checkpoint" / f"step-{args.steps}")
        return stage

    guarded("base", 0, base_stage)
    per_step = results["stages"].get("base", {}).get("summary", {}).get("train_seconds", args.steps) / args.steps
    overhead = results["stages"].get("base", {}).get("wall_s", 60) - per_step * args.steps
    if "summary" in state and not {"merge", "resume"} & wanted:  # disk: the 40-layer shape's checkpoint is 53 GB
        shutil.rmtree(run_base / "checkpoint", ignore_errors=True)
        results["stages"]["base"]["checkpoint_removed"] = "neither merge nor resume in --stages"

    def single_stage():
        run = work / "run-single"
        stage, _ = train_stage("single", run, args.steps, every=0, keep=1, ranks=1)
        shutil.rmtree(run / "checkpoint", ignore_errors=True)  # disk
        return stage

    if "summary" in state or "base" not in wanted:
        guarded("single", overhead + per_step * args.steps, single_stage)
    else:
        results["skipped"]["single"] = "the base run did not finish"
    results["scaling"] = scaling(results["stages"], nproc)
    save()

    def accum_stage(sync: bool):
        def fn():
            run = work / ("run-accum-sync" if sync else "run-accum-nosync")
            stage, _ = train_stage("accum_sync" if sync else "accum_nosync", run, args.accum_steps,
                                   accum=args.accum, sync=sync)
            shutil.rmtree(run / "checkpoint", ignore_errors=True)  # disk
            return stage
        return fn

    accum_need = overhead + per_step * args.accum * args.accum_steps * 1.2
    guarded("accum_sync", accum_need, accum_stage(True))
    guarded("accum_nosync", accum_need, accum_stage(False))

    def merge_stage():
        ckpt = run_base / "checkpoint" / f"step-{args.steps}"
        merged = work / "merged"
        cmd = [sys.executable, "-m", "pitlab.cli", "merge", "--checkpoint", str(ckpt), "--base", str(base),
               "--out", str(merged), "--summary", str(run_base / "uninterrupted_summary.json")]
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stdout_r = proc.stdout.read()
        stderr_r = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            raise RuntimeError(f"merge exit {proc.returncode}: {stderr_r.decode()[-2000:]}")
        report = json.loads(stdout_r)
        stage = {"command": " ".join(cmd), "wall_s": wall, "report": report,
                 "peak_rss_bytes": usage.ru_maxrss * 1024, "checkpoint_bytes": du(ckpt)}
        shutil.rmtree(merged, ignore_errors=True)
        print("merge", json.dumps(stage), flush=True)
        return stage

    guarded("merge", 30 if args.tiny else 120, merge_stage)

    def step_records(path: Path) -> dict[int, dict]:
        return {m["step"]: m for m in (json.loads(x) for x in path.read_text().splitlines())}

    def compare_steps(run: Path) -> dict:
        """Each step's loss and gradient norm of ``run`` against the base run's: the first step that differs
        in either, and the largest relative differences."""
        mine = step_records(run / "train" / "metrics.jsonl")
        ref = step_records(run_base / "uninterrupted_metrics.jsonl")
        steps = sorted(set(mine) & set(ref))
        differ = [k for k in steps if (mine[k]["loss"], mine[k].get("grad_norm")) != (ref[k]["loss"], ref[k].get("grad_norm"))]
        rel = {f: max((abs(mine[k][f] - ref[k][f]) / abs(ref[k][f]) for k in steps if ref[k].get(f)), default=0.0)
               for f in ("loss", "grad_norm")}
        return {"steps_compared": steps, "first_step_differing": differ[0] if differ else None,
                "steps_differing": len(differ), "max_relative_difference": rel,
                "per_step": {k: {"loss": [ref[k]["loss"], mine[k]["loss"]],
                                 "grad_norm": [ref[k].get("grad_norm"), mine[k].get("grad_norm")]} for k in steps}}

    def repeat_stage():
        run = work / "run-repeat"
        stage, summary = train_stage("repeat", run, args.steps, every=0, keep=1)
        want = state["summary"]["param_sha256"]
        stage["params_bit_identical_to_base"] = sum(summary["param_sha256"][k] == want.get(k)
                                                    for k in summary["param_sha256"])
        stage["params_total"] = len(summary["param_sha256"])
        stage["against_base"] = compare_steps(run)
        shutil.rmtree(run / "checkpoint", ignore_errors=True)  # disk
        return stage

    if "summary" in state:
        guarded("repeat", overhead + per_step * args.steps + 30, repeat_stage)
    else:
        results["skipped"]["repeat"] = "the base run did not finish"

    def resume_stage():
        ckpt_dir = run_base / "checkpoint"
        shutil.rmtree(ckpt_dir / f"step-{args.steps}")
        (ckpt_dir / "latest").write_text(f"step-{mid}\n")
        stage, summary = train_stage("resume", run_base, args.steps, every=mid, keep=keep)
        want = state["summary"]["param_sha256"]
        got = summary["param_sha256"]
        stage["resumed_from_step"] = summary["resumed_from_step"]
        stage["params_bit_identical_to_uninterrupted"] = sum(got[k] == want.get(k) for k in got)
        stage["params_total"] = len(got)
        stage["final_loss_uninterrupted"] = state["summary"]["final_loss"]
        stage["against_base"] = compare_steps(run_base)
        return stage

    if args.final_checkpoint_only:
        results["skipped"]["resume"] = "--final-checkpoint-only: no mid-run checkpoint"
    elif "summary" in state:
        guarded("resume", overhead + per_step * 5 + 30, resume_stage)
    else:
        results["skipped"]["resume"] = "the base run did not finish"
    save()
    print(json.dumps({k: results[k] for k in ("world_size", "model", "scaling", "skipped", "elapsed_s")}, indent=2,
                     default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
