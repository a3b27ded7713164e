"""Merge speed on this machine: a >= 5 GB DCP checkpoint saved as the trainer saves one, merged by `pitlab merge`.

    python bench/merge_speed.py --work /work/tmp-merge [--layers 32 --experts 16] [--max-shard-size 5GB]
        [--ranks 2] [--keep] [--json OUT.json]

1. Builds (unless ``WORK/ckpt`` exists) a random-initialised ``qwen3_moe`` model (fused experts, which the merge
   splits back per expert) on the meta device in ``--ranks`` gloo processes, shards it with the trainer's FSDP2
   wrapping (:func:`pitlab.trainer.fsdp.shard_model`, float32 master weights), fills every local shard with
   random values and saves ``{"model": state dict}`` with ``dcp.save`` and the trainer's state-dict options, as
   :func:`pitlab.trainer.checkpoint.save_checkpoint` does (each tensor split on dim 0 across the ranks' files).
   Rank 0 writes ``WORK/summary.json`` with every parameter's sha256 (gathered tensors), as the trainer's summary.
2. Drops the checkpoint's pages from the page cache (``posix_fadvise(DONTNEED)``), so the merge reads the disk.
3. Measures the disk's own write speed: the checkpoint's byte count written to ``WORK`` with plain 64 MiB
   ``write`` calls and one ``fsync`` (right before and right after the merge, each after an ``os.sync()`` and a
   5 s pause; the mean is the baseline: this VM's disk varies by several times from minute to minute).
4. Runs ``python -m pitlab.cli merge --checkpoint ... --summary ...`` in its own process (verification on: every
   tensor compared, digests; the logits probe as ``--logits-probe`` says) and reports the merged safetensors'
   GB/s (bytes / the merge's own seconds), the wall time of the command, the peak RSS (the report's ``ru_maxrss``
   and the parent's ``RUSAGE_CHILDREN``; the peaks of ``/proc/PID/status``'s RssAnon, RssFile and RssShmem,
   sampled every 5 ms, split it into anonymous memory and mapped file or tmpfs pages), and the ratio to the raw
   disk speed. The output is deleted afterwards; the checkpoint too unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TEXTS = [f"The Committee decided to keep the target range at {i} percent; inflation ran at {i % 7}.{i % 10}."
         for i in range(60)]


# runs the merge command as its child and adds that child's own ru_maxrss (the build's processes excluded) and
# the peaks of its /proc status lines, sampled every 5 ms: RssAnon (heap, tensor buffers), RssFile (mapped files:
# libraries, memory-mapped shards), RssShmem (mapped tmpfs pages) and VmRSS (their sum)
_DRIVER = """
import json, resource, subprocess, sys, threading
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
peaks = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0, "RssShmem": 0}
at_peak = {}
def sample():
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                now = {k: int(v.split()[0]) * 1024 for k, v in (l.split(":", 1) for l in f) if k in peaks}
        except (OSError, ValueError):
            break
        for k, v in now.items():
            peaks[k] = max(peaks[k], v)
        if now.get("VmRSS", 0) >= peaks["VmRSS"]:
            at_peak.update(now)
        threading.Event().wait(0.005)
t = threading.Thread(target=sample, daemon=True)
t.start()
out, err = proc.communicate()
t.join()
if proc.returncode:
    sys.exit(err)
report = json.loads(out)
report["child_status_peaks_bytes"] = peaks
report["child_status_at_vmrss_peak_bytes"] = at_peak
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
report["child_maxrss_bytes"] = usage.ru_maxrss * 1024
report["child_cpu_seconds"] = {"user": round(usage.ru_utime, 1), "system": round(usage.ru_stime, 1)}
print(json.dumps(report))
"""


def model_config(layers: int, experts: int, vocab: int):
    from pitlab.trainer.prepare import build_config

    return build_config("qwen3_moe", dict(hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
                                          num_key_value_heads=4, head_dim=64, num_experts=experts,
                                          num_experts_per_tok=2, moe_intermediate_size=768,
                                          intermediate_size=2048, max_position_embeddings=512,
                                          tie_word_embeddings=False), vocab_size=vocab)


def _build_rank(rank: int, world: int, work: str, layers: int, experts: int, vocab: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM

    from pitlab.trainer.checkpoint import STATE_DICT_OPTIONS
    from pitlab.trainer.digest import tensor_sha256
    from pitlab.trainer.fsdp import shard_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29671")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(layers, experts, vocab), dtype=torch.float32)
    shard_model(model, mesh, "bf16")
    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(1234 + rank)
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local()
            local.normal_(0.0, 0.02, generator=gen)
    sd = get_model_state_dict(model, options=STATE_DICT_OPTIONS)
    tmp = Path(work) / "ckpt.tmp"
    dcp.save({"model": sd}, checkpoint_id=tmp)
    digests = {}
    for name, p in model.named_parameters():  # the training summary's param_sha256 (full tensors)
        full = p.full_tensor()
        if rank == 0:
            digests[name] = tensor_sha256(full)
        del full
    dist.barrier()
    if rank == 0:
        (Path(work) / "summary.json").write_text(json.dumps({"param_sha256": digests}))
        os.replace(tmp, Path(work) / "ckpt")
    dist.destroy_process_group()


def build(work: Path, layers: int, experts: int, ranks: int) -> None:
    import torch.multiprocessing as mp

    from pitlab.trainer.tokenizer import train_tokenizer

    tok = train_tokenizer(TEXTS, 300, work / "base")
    model_config(layers, experts, len(tok)).save_pretrained(work / "base")
    mp.start_processes(_build_rank, args=(ranks, str(work), layers, experts, len(tok)), nprocs=ranks,
                       start_method="spawn")


def drop_cache(path: Path) -> None:
    """Evict ``path``'s files from the page cache (clean pages only: they are fsynced first)."""
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def settle() -> None:
    """Let the disk finish what earlier steps left (deleted files' discards, dirty pages) before a timing."""
    os.sync()
    time.sleep(5)


def raw_write_speed(work: Path, nbytes: int) -> float:
    """Bytes/s of writing ``nbytes`` to a new file in ``work`` with 64 MiB ``write`` calls and one ``fsync``."""
    settle()
    buf = os.urandom(64 << 20)
    path = work / "raw-write.bin"
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left > 0:
            left -= f.write(memoryview(buf)[:min(left, len(buf))])
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    drop_cache(path)
    path.unlink()
    settle()
    return nbytes / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--max-shard-size", default="5GB")
    ap.add_argument("--logits-probe", default="auto")
    ap.add_argument("--pythonpath", help="run the merge with this PYTHONPATH first (e.g. an older commit's "
                                         "`git archive` of pitlab/, for a before/after in the same run)")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint for another run")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    ckpt, out = work / "ckpt", work / "model"
    t0 = time.perf_counter()
    if not (ckpt / ".metadata").is_file():
        build(work, args.layers, args.experts, args.ranks)
    build_s = time.perf_counter() - t0
    ckpt_bytes = sum(f.stat().st_size for f in ckpt.glob("*.distcp"))
    drop_cache(ckpt)
    raw_before = raw_write_speed(work, ckpt_bytes)
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pitlab.cli", "merge", "--checkpoint", str(ckpt), "--base", str(work / "base"),
           "--out", str(out), "--summary", str(work / "summary.json"), "--max-shard-size", args.max_shard_size,
           "--logits-probe", args.logits_probe]
    t1 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=args.pythonpath) if args.pythonpath else None
    # `-m` puts the working directory first on sys.path: run from the work folder, or from --pythonpath's
    proc = subprocess.run([sys.executable, "-c", _DRIVER] + cmd, capture_output=True, text=True, env=env,
                          cwd=args.pythonpath or work)
    stdout, stderr = proc.stdout, proc.stderr
    wall = time.perf_counter() - t1
    if proc.returncode:
        sys.exit(stderr[-4000:])
    report = json.loads(stdout)
    child_rss = report.get("child_maxrss_bytes", 0)
    drop_cache(out)
    shutil.rmtree(out)
    raw_after = raw_write_speed(work, ckpt_bytes)
    raw = (raw_before + raw_after) / 2
    code = subprocess.run([sys.executable, "-c", "import pitlab; print(pitlab.__file__)"], capture_output=True,
                          text=True, env=env, cwd=args.pythonpath or work).stdout.strip()
    result = {
        "pitlab": code, "pythonpath": args.pythonpath, "checkpoint_bytes": ckpt_bytes, "build_seconds": round(build_s, 1),
        "merged_bytes": report["bytes"], "shards": report["shards"], "tensors": report["tensors"],
        "max_shard_size": args.max_shard_size, "logits_probe": report["logits_probe"],
        "digests_checked": report["summary_digests_checked"], "verified": report["verified"],
        "merge_seconds": round(report["seconds"], 2), "command_wall_seconds": round(wall, 2),
        "write_seconds": round(report["write_seconds"], 2), "verify_seconds": round(report["verify_seconds"], 2),
        "merge_GBps": round(report["bytes_per_second"] / 1e9, 3),
        "command_GBps": round(report["bytes"] / wall / 1e9, 3),
        "peak_rss_GB": round(report["peak_rss_bytes"] / 1e9, 2), "child_maxrss_GB": round(child_rss / 1e9, 2),
        "rss_before_tensors_GB": round(report["rss_before_tensors_bytes"] / 1e9, 2),
        "anon_rss_before_tensors_GB": round(report.get("anon_rss_before_tensors_bytes", 0) / 1e9, 3),
        "raw_write_GBps_before": round(raw_before / 1e9, 3), "raw_write_GBps_after": round(raw_after / 1e9, 3),
        "raw_write_GBps": round(raw / 1e9, 3), "merge_over_raw": round(report["bytes_per_second"] / raw, 3),
    }
    result["merge_cpu_seconds"] = report["child_cpu_seconds"]
    result["status_peaks_GB"] = {k: round(v / 1e9, 3) for k, v in report["child_status_peaks_bytes"].items()}
    result["status_at_rss_peak_GB"] = {k: round(v / 1e9, 3)
                                       for k, v in report["child_status_at_vmrss_peak_bytes"].items()}
    for k in ("largest_group_bytes", "buffers", "buffer_bytes", "writer", "read_threads", "conversion",
              "stage_seconds"):
        if k in report:
            result[k] = report[k]
    if "largest_group_bytes" in report:  # the measure: the tensor phase's growth over the largest group
        result["peak_over_largest_group"] = round(
            (report["peak_rss_bytes"] - report["rss_before_tensors_bytes"]) / report["largest_group_bytes"], 3)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if not args.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
