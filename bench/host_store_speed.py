"""Memory-mapped host store (training.layerStreaming.hostStore: mmap) on this machine: store write time, reuse
time, peak anonymous host memory of the load (memory store vs mmap store), and the GB/s of the layer copies the
CPU streamer does (store region -> slot) from the mapped file cold (pages evicted with posix_fadvise DONTNEED), warm
(page cache) and from an in-memory store.

    python bench/host_store_speed.py --layers 8 --hidden 2048 --intermediate 5504 --out /tmp/hs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch


def make_base(path: Path, layers: int, hidden: int, intermediate: int, vocab: int) -> None:
    """A llama base in bfloat16 with random weights (written tensor by tensor, no model init)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=hidden // 128, num_key_value_heads=hidden // 128,
                         tie_word_embeddings=False, torch_dtype="bfloat16")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    g = torch.Generator().manual_seed(0)
    tensors = {n: (torch.randn(p.shape, generator=g) * 0.02).to(torch.bfloat16) for n, p in model.named_parameters()}
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def anon_kib() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def load(base: Path, store: Path, mode: str) -> dict:
    """One load in this process: seconds, peak RssAnon above the start (sampled every 5 ms), the report."""
    import threading

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from pitlab.api import PitTraining
    from pitlab.trainer.streaming import load_streamed_model

    doc = {"apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "metadata": {"name": "hs"},
           "spec": {"baseModel": {"uri": str(base)}, "corpus": {"uri": "x.jsonl", "format": "jsonl"},
                    "knowledgeCutoff": "2020-12-31", "tokens": 10 ** 6, "method": "lora",
                    "lora": {"r": 8, "alpha": 16, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
                    "training": {"seqLen": 512, "precision": "bf16",
                                 "layerStreaming": {"enabled": True, "hostStore": mode}},
                    "resources": {"nodes": 1, "gpusPerNode": 1}}}
    spec = PitTraining.model_validate(doc).spec
    start, peak, stop = anon_kib(), [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], anon_kib())
            time.sleep(0.005)

    t = threading.Thread(target=sample)
    t.start()
    t0 = time.perf_counter()
    model, streamer = load_streamed_model(base, spec, torch.device("cpu"), store_dir=store)
    secs = time.perf_counter() - t0
    stop.set()
    t.join()
    return {"seconds": secs, "peak_anon_bytes": (max(peak[0], anon_kib()) - start) * 1024,
            "report": streamer.report()}


def copy_speed(streamer_store) -> float:
    """GB/s of copying every layer region of the store into one preallocated slot (what the CPU streamer does)."""
    regions = [t for layer in streamer_store for t in layer.values()]
    slot = torch.empty(max(t.numel() for t in regions), dtype=regions[0].dtype)
    t0 = time.perf_counter()
    n = 0
    for t in regions:
        slot[:t.numel()].copy_(t)
        n += t.numel() * t.element_size()
    return n / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5504)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    base, store = a.out / "base", a.out / "store"
    if a.child:  # one load per process, so that the peak memory is this load's
        print(json.dumps(load(base, store, a.child)))
        return
    if not (base / "model.safetensors").is_file():
        make_base(base, a.layers, a.hidden, a.intermediate, a.vocab)
    results = {}
    for name, mode in (("memory", "memory"), ("mmap_write", "mmap"), ("mmap_reuse", "mmap")):
        out = subprocess.run([sys.executable, __file__, "--out", str(a.out), "--child", mode], check=True,
                             capture_output=True, text=True).stdout
        results[name] = json.loads(out.strip().splitlines()[-1])
    from pitlab.trainer.host_store import STORE_FILE, MappedStore, _read_header

    path = store / STORE_FILE
    start, header = _read_header(path)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # evict the file's pages: the next read comes from disk
    os.close(fd)
    mapped = MappedStore(path, header, start, written=False, write_seconds=0.0)
    results["copy_gbps_mmap_cold"] = copy_speed(mapped.layers)
    results["copy_gbps_mmap_warm"] = copy_speed(mapped.layers)
    in_ram = [{d: t.clone() for d, t in layer.items()} for layer in mapped.layers]
    results["copy_gbps_memory"] = copy_speed(in_ram)
    results["store_layer_bytes"] = sum(t.numel() * t.element_size() for layer in in_ram for t in layer.values())
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
