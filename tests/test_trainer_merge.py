"""pitlab.trainer.merge: the streaming DCP → sharded safetensors merge (single process, bounded memory)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from transformers import AutoModelForCausalLM, LlamaConfig

from reference import parameter_sha256
from pitlab.trainer.merge import (INDEX, MergeError, merge_checkpoint, parse_size, plan_groups, probe_logits,
                                  shard_file_names)
from pitlab.trainer.prepare import build_config
from pitlab.trainer.tokenizer import train_tokenizer

from tiny_models import QWEN35_TINY  # noqa: E402  (tests/ is on sys.path under pytest)
TEXTS = [f"The Committee decided to keep the target range at {i} percent; inflation ran at {i % 7}.{i % 10}."
         for i in range(60)]


def save_dcp(model: torch.nn.Module, ckpt: Path) -> None:
    """A single-process DCP checkpoint laid out as the trainer writes it ({"model": state dict})."""
    dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt, no_dist=True)


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    """A tiny qwen3_5_moe_text base folder and a DCP checkpoint of the same model with changed weights."""
    root = tmp_path_factory.mktemp("merge")
    tok = train_tokenizer(TEXTS, 300, root / "base")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(build_config("qwen3_5_moe_text", QWEN35_TINY, vocab_size=len(tok)),
                                             dtype=torch.float32)
    model.save_pretrained(root / "base")
    with torch.no_grad():  # "training": every parameter moves away from the base
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model.eval()
    save_dcp(model, root / "checkpoint" / "step-7")
    (root / "checkpoint" / "latest").write_text("step-7")
    model.save_pretrained(root / "hf-reference")  # what transformers itself writes for this model
    return {"root": root, "base": root / "base", "ckpt": root / "checkpoint", "model": model}


def test_parse_size_and_plan_groups():
    assert parse_size("5GB") == 5_000_000_000 and parse_size("50MB") == 50_000_000
    assert parse_size("2GiB") == 2 ** 31 and parse_size("123") == 123 and parse_size(7) == 7
    with pytest.raises(ValueError, match="--max-shard-size: 'five' is not a size"):
        parse_size("five")
    # natural order (layers.2 before layers.10); a tensor above the limit gets a group of its own
    sizes = {"layers.10.w": 40, "layers.2.w": 40, "layers.1.w": 30, "big": 500, "z": 10}
    assert plan_groups(sizes, 100) == [["big"], ["layers.1.w", "layers.2.w"], ["layers.10.w", "z"]]
    assert shard_file_names(1) == ["model.safetensors"]
    assert shard_file_names(3)[2] == "model-00003-of-00003.safetensors"


def test_streaming_merge_writes_hf_shards_with_an_index(moe_checkpoint, tmp_path):
    c = moe_checkpoint
    hf_ref = c["root"] / "hf-reference" / "model.safetensors"
    with safe_open(str(hf_ref), framework="pt") as f:
        ref = {k: f.get_tensor(k) for k in f.keys()}
    total = sum(t.numel() * t.element_size() for t in ref.values())
    out = tmp_path / "model"
    report = merge_checkpoint(c["ckpt"], c["base"], out, parameter_sha256(c["model"]),
                              max_shard_size=total // 4, logits_probe="always")
    assert report["kind"] == "full" and report["verified"] and report["summary_digests_checked"]
    assert report["checkpoint"] == str(c["ckpt"] / "step-7") and report["logits_probe"] == "equal"
    assert report["shards"] >= 3 and report["tensors"] == len(ref) == 56  # per-expert names, as HF saves them
    assert report["conversion"] == "views"  # the per-expert tensors were written from the fused ones, uncopied
    assert report["writer"] == "streamed"  # slices of a shard, from two or three buffers of at most one group
    assert report["buffers"] * report["buffer_bytes"] <= 2 * report["largest_group_bytes"] + 64 * 100
    assert report["bytes"] == total and report["bytes_per_second"] > 0
    assert report["parameters"] == 36 and report["peak_rss_bytes"] >= report["rss_start_bytes"] > 0
    index = json.loads((out / INDEX).read_text())
    assert index["metadata"]["total_size"] == total
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    assert sorted(set(index["weight_map"].values())) == shards
    assert index["weight_map"].keys() == ref.keys()  # the index covers every tensor, by HF's own names
    for shard in shards:
        with safe_open(str(out / shard), framework="pt") as f:
            assert (out / shard).stat().st_size <= total // 4 + 4096  # data + header within the limit
            for k in f.keys():
                assert index["weight_map"][k] == shard
                assert torch.equal(f.get_tensor(k), ref[k]), k  # bit-equal to save_pretrained's tensors
    assert not (tmp_path / "model.tmp").exists()
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert next(merged.parameters()).dtype == torch.float32
    assert torch.equal(probe_logits(merged), probe_logits(c["model"]))
    assert parameter_sha256(merged) == parameter_sha256(c["model"])
    assert (out / "tokenizer.json").is_file() and json.loads((out / "merge_report.json").read_text()) == report


@pytest.mark.parametrize("writer", ["streamed", "whole-group"])
def test_a_corrupted_shard_fails_verification_and_leaves_no_output(moe_checkpoint, tmp_path, monkeypatch, writer):
    import numpy as np

    import pitlab.trainer.merge.full as merge
    import pitlab.trainer.merge.stream_write as stream

    c = moe_checkpoint
    out = tmp_path / "model"
    if writer == "whole-group":
        monkeypatch.setattr(merge, "_streamed_plan", lambda *a: None)
    report = merge_checkpoint(c["ckpt"], c["base"], out, max_shard_size="100KB", logits_probe="never")
    assert report["writer"] == writer
    before = {p.name: p.read_bytes() for p in out.glob("*.safetensors")}
    real_save, real_write, calls = merge.save_file, stream._write_all, []

    def flip_one(tensors, path, metadata=None):
        tensors = dict(tensors)
        name = sorted(tensors)[0]
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[0] += 1.0
        real_save(tensors, path, metadata=metadata)

    def flip_in_first_slice(fd, views):
        calls.append(len(views))
        if len(calls) == 2:  # the first slice's data (call 1 is the header)
            first = np.frombuffer(views[0], dtype=np.uint8).copy()
            first[0] ^= 1
            views = [memoryview(first)] + views[1:]
        real_write(fd, views)

    monkeypatch.setattr(merge, "save_file", flip_one)
    monkeypatch.setattr(stream, "_write_all", flip_in_first_slice)
    with pytest.raises(MergeError, match=r"model-00001-of-000\d\d\.safetensors: tensor .* differs from checkpoint"):
        merge_checkpoint(c["ckpt"], c["base"], out, max_shard_size="100KB", logits_probe="never")
    assert {p.name: p.read_bytes() for p in out.glob("*.safetensors")} == before  # the good output is kept
    assert not (tmp_path / "model.tmp").exists()
    monkeypatch.setattr(merge, "save_file", real_save)
    monkeypatch.setattr(stream, "_write_all", real_write)
    tampered = parameter_sha256(c["model"])
    tampered["model.norm.weight"] = "0" * 64
    with pytest.raises(MergeError, match=r"1 differ \['model\.norm\.weight'\]"):
        merge_checkpoint(c["ckpt"], c["base"], tmp_path / "other", tampered)
    assert not (tmp_path / "other").exists() and not (tmp_path / "other.tmp").exists()


_RSS_DRIVER = """
import json, resource, subprocess, sys
proc = subprocess.run([sys.executable, "-m", "pitlab.cli", "merge"] + sys.argv[1:], capture_output=True, text=True)
if proc.returncode:
    sys.exit(proc.stderr)
report = json.loads(proc.stdout)
report["child_maxrss_bytes"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps(report))
"""


@pytest.mark.slow
def test_merge_memory_stays_bounded_by_the_shard_size(tmp_path):
    """A 328 MB checkpoint merged with 100 MB shards: the merge process grows by its three slice buffers (a
    quarter of a shard each: one read ahead, one written, one compared back) and the comparing threads' buffers,
    under 2 x the largest group and far less than the model."""
    tok = train_tokenizer(TEXTS, 300, tmp_path / "base")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=512, intermediate_size=1536, num_hidden_layers=24,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256)
    torch.manual_seed(0)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    state = {k: torch.randn(v.shape) * 0.02 for k, v in meta.state_dict().items()}  # no model object needed
    ckpt_bytes = sum(t.numel() * 4 for t in state.values())
    assert ckpt_bytes == 328_484_864  # 82.1 M float32 parameters
    dcp.save({"model": state}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    config.save_pretrained(tmp_path / "base")
    first = {k: state[k].clone() for k in ("model.layers.0.self_attn.q_proj.weight", "lm_head.weight")}
    del state, meta
    out = tmp_path / "model"
    proc = subprocess.run([sys.executable, "-c", _RSS_DRIVER, "--checkpoint", str(tmp_path / "ckpt"),
                           "--base", str(tmp_path / "base"), "--out", str(out), "--max-shard-size", "100MB"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["bytes"] == ckpt_bytes and report["shards"] == 4 and report["logits_probe"] == "skipped"
    growth = report["peak_rss_bytes"] - report["rss_before_tensors_bytes"]  # libraries + code excluded
    print(f"checkpoint {ckpt_bytes / 1e6:.0f} MB, RSS before tensors {report['rss_before_tensors_bytes'] / 1e6:.0f} MB, "
          f"peak {report['peak_rss_bytes'] / 1e6:.0f} MB (growth {growth / 1e6:.0f} MB), measured by the parent "
          f"{report['child_maxrss_bytes'] / 1e6:.0f} MB, {report['bytes_per_second'] / 1e6:.0f} MB/s; "
          f"{report.get('buffers', 2)} buffers of {report['buffer_bytes'] / 1e6:.1f} MB")
    assert report["child_maxrss_bytes"] == pytest.approx(report["peak_rss_bytes"], rel=0.05)
    assert growth < 0.5 * ckpt_bytes  # bounded: whole-model loading would grow by >= 1 × the checkpoint
    # streamed: three slice buffers of a quarter group each (one read ahead, one written, one compared back) and
    # nothing else of the groups' size: no temporary per chunk read, no copy per converted tensor; one compare
    # buffer per reading thread and 48 MB for the fixed rest (the threads' allocator arenas: 23-34 MB measured on
    # a quiet 2-core machine, 26-43 MB with two other busy processes beside the test, 2026-12-04)
    from pitlab.trainer.merge.verify import COMPARE_CHUNK

    assert report["writer"] == "streamed" and report["buffers"] == 3 and report["largest_group_bytes"] <= 100e6
    assert report["buffer_bytes"] <= report["largest_group_bytes"] / 4 + 64 * 100
    assert growth <= 3 * report["buffer_bytes"] + report["read_threads"] * COMPARE_CHUNK + 48e6
    assert growth <= 2 * report["largest_group_bytes"]
    assert report["peak_rss_bytes"] - report["rss_start_bytes"] < 0.8 * ckpt_bytes  # even with the imports
    index = json.loads((out / INDEX).read_text())
    assert len(index["weight_map"]) == 24 * 9 + 3 and index["metadata"]["total_size"] == ckpt_bytes
    for name, want in first.items():
        with safe_open(str(out / index["weight_map"][name]), framework="pt") as f:
            assert torch.equal(f.get_tensor(name), want)


def test_a_retried_merge_replaces_its_own_output_and_refuses_other_files(moe_checkpoint, tmp_path):
    """The report lists the files the merge wrote: a merge run again into that folder needs no --overwrite,
    a file of the user's beside them is refused (and kept)."""
    from pitlab.storage.errors import OutputExists
    from pitlab.storage.outdir import entries
    from pitlab.trainer.merge import merge_uris

    c, out = moe_checkpoint, tmp_path / "model"
    for sibling in ("model.tmp", "model.old"):  # folders of the user's beside the output are not the merge's
        (tmp_path / sibling).mkdir()
        (tmp_path / sibling / "mine.txt").write_text("mine")
    first = merge_uris(c["ckpt"], c["base"], out, logits_probe="never")
    assert first["files"] == entries(out) and "merge_report.json" in first["files"]
    again = merge_uris(c["ckpt"], c["base"], out, logits_probe="never")
    assert again["files"] == first["files"] == entries(out)
    (out / "keep.txt").write_text("notes")
    with pytest.raises(OutputExists, match=r"1 file\(s\) that `pitlab merge` did not write \(keep.txt\)"):
        merge_uris(c["ckpt"], c["base"], out, logits_probe="never")
    assert (out / "keep.txt").read_text() == "notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.old", "model.tmp"]
    assert (tmp_path / "model.tmp" / "mine.txt").read_text() == (tmp_path / "model.old" / "mine.txt").read_text()


def test_the_merge_writes_the_model_card_of_the_training_summary(moe_checkpoint, tmp_path):
    from pitlab.api.artifacts import MODEL_CARD, read_model_card
    from pitlab.trainer.merge import merge_uris

    c = moe_checkpoint
    summary = tmp_path / "summary.json"
    card = {"knowledgeCutoff": "2016-12-31", "corpusAuditSha256": "ab" * 32, "training": "demo",
            "baseModel": None, "method": "full"}
    summary.write_text(json.dumps({"param_sha256": parameter_sha256(c["model"]), "model_card": card}))
    out = tmp_path / "model"
    report = merge_uris(c["ckpt"], c["base"], out, summary, logits_probe="never")
    assert MODEL_CARD in report["files"] and report["summary_digests_checked"]
    got = read_model_card(out)
    assert (got.knowledge_cutoff.isoformat(), got.training, got.corpus_audit_sha256) == ("2016-12-31", "demo",
                                                                                         "ab" * 32)
    # a summary without a card (an older run) merges as before, with no card
    summary.write_text(json.dumps({"param_sha256": parameter_sha256(c["model"])}))
    report = merge_uris(c["ckpt"], c["base"], tmp_path / "model2", summary, logits_probe="never")
    assert MODEL_CARD not in report["files"] and read_model_card(tmp_path / "model2") is None


# --- the merge's reading pipeline: direct DCP reads, read-ahead, expert views ---------------------------------------

def _save_ranks(rank: int, world: int, ckpt: str, port: int) -> None:
    """Rank ``rank`` of ``world`` gloo processes (:func:`_save_rank`), ended without interpreter finalization as the
    trainer's ranks are (:func:`pitlab.trainer.rank_exit.exit_rank`: a gloo thread freeing tensors during
    finalization aborted rank 1 with "terminate called without an active exception" in CI)."""
    from pitlab.trainer.rank_exit import exit_rank

    exit_rank(lambda: _save_rank(rank, world, ckpt, port))


def _save_rank(rank: int, world: int, ckpt: str, port: int) -> None:
    """A small qwen3_moe model sharded with the trainer's FSDP2 wrapping, saved as the trainer saves it (each
    tensor split on dim 0 across the ranks' files)."""
    import os
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from pitlab.trainer.checkpoint import STATE_DICT_OPTIONS
    from pitlab.trainer.fsdp import shard_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)  # every rank builds the same full model, then keeps its shards
    model = AutoModelForCausalLM.from_config(build_config("qwen3_moe", _QWEN3_MOE_TINY, vocab_size=64))
    shard_model(model, init_device_mesh("cpu", (world,)), "bf16")
    dcp.save({"model": get_model_state_dict(model, options=STATE_DICT_OPTIONS)}, checkpoint_id=ckpt)
    dist.barrier()  # no rank tears gloo down while the other is still in dcp.save's last exchange (seen: SIGABRT)
    dist.destroy_process_group()


_QWEN3_MOE_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                       num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, intermediate_size=48,
                       max_position_embeddings=64)


def test_the_direct_reader_reads_a_two_rank_checkpoint_bit_for_bit_like_dcp(tmp_path):
    """Chunks of FSDP2 shards in two rank files, read straight into one buffer's views, equal DCP's own reader's
    tensors; nothing goes through the stock path."""
    import socket
    import warnings

    import torch.multiprocessing as mp

    from pitlab.trainer.merge.dcp_read import DirectReader

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_save_ranks, args=(2, str(tmp_path / "ckpt"), port), nprocs=2, start_method="spawn")
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    torch.manual_seed(0)
    want = AutoModelForCausalLM.from_config(build_config("qwen3_moe", _QWEN3_MOE_TINY, vocab_size=64)).state_dict()
    buf = torch.zeros(sum(t.numel() * 4 for t in want.values()), dtype=torch.uint8)
    got, at = {}, 0
    for name, t in want.items():
        got[name] = buf[at:at + t.numel() * 4].view(torch.float32).view(t.shape)
        at += t.numel() * 4
    reader = DirectReader(tmp_path / "ckpt", threads=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"model": got}, storage_reader=reader, no_dist=True)
    assert reader.fallback_items == 0 and reader.direct_bytes == buf.numel()
    for name, t in want.items():
        assert torch.equal(got[name], t), name


def test_the_direct_reader_leaves_strided_chunks_to_dcp_and_matches_it(tmp_path):
    import warnings

    from pitlab.trainer.merge.dcp_read import DirectReader

    torch.manual_seed(0)
    sd = {"w": torch.randn(5, 7), "transposed": torch.randn(4, 6).t().clone(), "bf16": torch.randn(9).bfloat16(),
          "scalar": torch.tensor(3.5), "steps": torch.arange(10), "empty": torch.zeros(0, 3)}
    dcp.save({"model": sd}, storage_writer=dcp.FileSystemWriter(tmp_path / "ckpt", thread_count=3), no_dist=True)
    assert len(list((tmp_path / "ckpt").glob("*.distcp"))) == 3
    got = {k: torch.full_like(v, 7, memory_format=torch.contiguous_format) for k, v in sd.items()}
    reader = DirectReader(tmp_path / "ckpt", threads=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"model": got}, storage_reader=reader, no_dist=True)
    for k, v in sd.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    assert reader.fallback_items == 1  # the transposed chunk (its strides are not row-major): torch.load's path
    assert reader.direct_bytes == 35 * 4 + 9 * 2 + 4 + 10 * 8


def test_a_truncated_shard_file_fails_naming_it_and_leaves_no_output(moe_checkpoint, tmp_path):
    import shutil

    c = moe_checkpoint
    ckpt = tmp_path / "ckpt"
    shutil.copytree(c["ckpt"] / "step-7", ckpt)
    (shard,) = ckpt.glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
    with pytest.raises(MergeError, match=rf"{ckpt}: cannot read \d+ tensors .* from {shard.name}: "):
        merge_checkpoint(ckpt, c["base"], tmp_path / "model", max_shard_size="100KB", logits_probe="never")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_the_pipeline_reads_the_next_group_while_one_is_held_and_never_a_third(moe_checkpoint):
    import time

    from pitlab.trainer.merge.full import GroupPipeline
    from pitlab.trainer.merge.reader import checkpoint_tensors

    c = moe_checkpoint
    ckpt = c["ckpt"] / "step-7"
    saved = checkpoint_tensors(ckpt)
    sizes = {n: d.itemsize * s.numel() for n, (d, s) in saved.items()}
    groups = plan_groups(sizes, 60_000)
    assert len(groups) >= 4
    want = c["model"].state_dict()
    bases, seen = set(), []
    with GroupPipeline(ckpt, saved, groups, sizes, set(sizes), threads=2) as pipe:
        for i, tensors in enumerate(pipe):
            deadline = time.monotonic() + 10
            while i + 1 < len(groups) and pipe._ready.qsize() < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            if i + 1 < len(groups):
                assert pipe._ready.qsize() == 1  # group i+1 was read while group i is held
                time.sleep(0.2)
                assert pipe._ready.qsize() == 1  # group i+2 waits for a free buffer: two groups in memory at most
            for name in groups[i]:
                assert torch.equal(tensors[name], want[name]), name
                assert pipe.digests()[name] == parameter_sha256(c["model"])[name]
            bases |= {t.untyped_storage().data_ptr() for t in tensors.values()}
            seen += list(tensors)
            pipe.release()
    assert len(bases) == 2 and sorted(seen) == sorted(sizes)  # two reused buffers, every tensor once
    assert pipe.buffer_bytes <= max(pipe.group_bytes) + 64 * max(len(g) for g in groups)


@pytest.mark.parametrize("model_type,overrides", [("qwen3_moe", _QWEN3_MOE_TINY), ("qwen3_5_moe_text", QWEN35_TINY)])
def test_expert_tensors_are_written_as_views_equal_to_transformers_conversion(model_type, overrides):
    from transformers.core_model_loading import revert_weight_conversion

    from pitlab.trainer.merge.full import ViewConversion

    config = build_config(model_type, overrides, vocab_size=64)
    torch.manual_seed(0)
    sd = dict(AutoModelForCausalLM.from_config(config).state_dict())
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    want = revert_weight_conversion(meta, dict(sd))
    expected = {k: (v.dtype, tuple(v.shape)) for k, v in want.items()}
    calls = []

    def convert(group):
        calls.append(sorted(group))
        return {k: v.contiguous() for k, v in revert_weight_conversion(meta, group).items()}

    conv = ViewConversion(lambda g: revert_weight_conversion(meta, g), convert, expected)
    got = conv(sd)
    assert conv.state == "views" and got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
    storages = {t.untyped_storage().data_ptr() for t in sd.values()}
    assert all(t.untyped_storage().data_ptr() in storages for t in got.values())  # no copy
    assert len(calls) == 1 and all(".layers.0." in n for n in calls[0])  # proven once, on one layer
    assert conv(sd).keys() == want.keys() and len(calls) == 1  # later groups: views only

    # a conversion the views do not reproduce (here: one that changes values) is used as it is, from then on
    def scaled(group):
        return {k: v * 2 for k, v in revert_weight_conversion(meta, group).items()}

    conv = ViewConversion(lambda g: revert_weight_conversion(meta, g), scaled, expected)
    got = conv(sd)
    assert conv.state == "copies" and all(torch.equal(got[k], want[k] * 2) for k in want)


def test_view_conversion_survives_a_conversion_that_squeezes_trailing_size_one_dimensions():
    """transformers 5.17 (the GPU image's) squeezes a trailing dimension of size 1 when it splits fused experts:
    position tensors of one column came back 1-D there, so every group was copied (the merge's peak RSS 4.05 GB
    against 0.89 + 2 x 0.97 GB, bench/RESULTS.md). Two columns keep the views."""
    from pitlab.trainer.merge.full import ViewConversion

    torch.manual_seed(0)
    fused = torch.randn(4, 6, 5)  # [experts, rows, columns]
    norm = torch.randn(5)

    def revert(group):  # per-expert tensors, each squeezed as transformers 5.17 squeezes them
        out = {f"experts.{e}.w": group["fused"][e].squeeze(-1) for e in range(group["fused"].shape[0])}
        return {**out, "norm": group["norm"]}

    expected = {**{f"experts.{e}.w": (torch.float32, (6, 5)) for e in range(4)}, "norm": (torch.float32, (5,))}
    conv = ViewConversion(revert, lambda g: {k: v.contiguous() for k, v in revert(g).items()}, expected)
    got = conv({"fused": fused, "norm": norm})
    assert conv.state == "views"
    assert all(torch.equal(got[f"experts.{e}.w"], fused[e]) for e in range(4)) and torch.equal(got["norm"], norm)
    assert all(got[f"experts.{e}.w"].untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
               for e in range(4))


@pytest.mark.parametrize("threads", [1, 3])
def test_compare_file_finds_one_changed_byte_in_any_run_of_tensors(tmp_path, monkeypatch, threads):
    from safetensors.torch import save_file

    from pitlab.trainer.merge import verify

    monkeypatch.setattr(verify, "COMPARE_CHUNK", 1000)  # several chunks per tensor
    torch.manual_seed(1)
    want = {f"layers.{i}.w": torch.randn(40 + i, 33) for i in range(7)}
    want["layers.3.b"] = torch.randn(5).to(torch.bfloat16)
    save_file(want, str(tmp_path / "m.safetensors"))
    verify.compare_file(tmp_path / "m.safetensors", want, "the test", threads)
    for name, pos in (("layers.0.w", 0), ("layers.6.w", -1), ("layers.3.b", 2)):
        bad = {k: v.clone() for k, v in want.items()}
        bad[name].view(-1).view(torch.uint8)[pos] ^= 1  # one bit of one byte
        with pytest.raises(MergeError, match=rf"m.safetensors: tensor {re.escape(name)} differs from the test"):
            verify.compare_file(tmp_path / "m.safetensors", bad, "the test", threads)


def test_the_views_are_proven_on_the_first_layer_before_the_group_buffers_exist(moe_checkpoint, tmp_path, monkeypatch):
    from pitlab.trainer.merge import full

    c = moe_checkpoint
    events = []
    enter, prove = full.GroupPipeline.__enter__, full.ViewConversion._prove

    def entering(self):
        events.append("buffers")
        return enter(self)

    def proving(self, group, views, moved):
        events.append(("prove", sorted({n.split(".layers.")[1].split(".")[0] for n in group if ".layers." in n})))
        return prove(self, group, views, moved)

    monkeypatch.setattr(full.GroupPipeline, "__enter__", entering)
    monkeypatch.setattr(full.ViewConversion, "_prove", proving)
    report = merge_checkpoint(c["ckpt"], c["base"], tmp_path / "model", parameter_sha256(c["model"]),
                              max_shard_size=100_000, logits_probe="never")
    assert report["conversion"] == "views" and report["shards"] >= 3
    assert events == [("prove", ["0"]), "buffers"]  # once, on layer 0 alone, before the pipeline's buffers


def test_the_streamed_plan_lays_out_each_shard_contiguously_in_slices(moe_checkpoint):
    """The pure plan of the qwen3_5_moe_text checkpoint at 300 kB shards: every Hugging Face name once, each
    shard's outputs back to back from byte 0 in the order of their inputs, slices of consecutive inputs of at
    most a quarter of the largest group (or the largest tensor), and a header padded to 8 bytes that safetensors reads."""
    from transformers.core_model_loading import revert_weight_conversion

    from pitlab.trainer.merge.full import ViewConversion
    from pitlab.trainer.merge.reader import checkpoint_tensors, meta_model_of
    from pitlab.trainer.merge.stream_write import buffers_for, plan_streamed

    c = moe_checkpoint
    saved = checkpoint_tensors(c["ckpt"] / "step-7")
    _, meta_model = meta_model_of(c["base"])
    sizes = {n: d.itemsize * s.numel() for n, (d, s) in saved.items()}  # no tied weights in this model
    expected = {k: (v.dtype, tuple(v.shape)) for k, v in revert_weight_conversion(
        meta_model, {n: torch.empty(saved[n][1], dtype=saved[n][0], device="meta") for n in sizes}).items()}
    conv = ViewConversion(lambda g: revert_weight_conversion(meta_model, g), None, expected)
    groups = plan_groups(sizes, 300_000)
    shards, slice_bytes = plan_streamed(conv.spans, groups, saved, sizes, shard_file_names(len(groups)))
    largest = max(sum(sizes[n] for n in g) for g in groups)
    assert slice_bytes == max(max(sizes.values()), -(-largest // 4))
    assert (buffers_for(25, 100), buffers_for(50, 100), buffers_for(51, 100), buffers_for(100, 100)) == (3, 3, 2, 2)
    names = [o.name for s in shards for o in s.outputs]
    assert sorted(names) == sorted(expected) and len(names) == 56
    for shard, group in zip(shards, groups):
        assert [n for sl in shard.slices for n in sl] == group
        assert all(sum(sizes[n] for n in sl) <= slice_bytes or len(sl) == 1 for sl in shard.slices)
        assert [o.start for o in shard.outputs] == [0] + [o.stop for o in shard.outputs[:-1]]
        assert shard.nbytes == sum(sizes[n] for n in group)  # every input byte written once
        rank = [group.index(o.src) for o in shard.outputs]
        assert rank == sorted(rank) and len(shard.header_bytes) % 8 == 0
        header = json.loads(shard.header_bytes[8:])
        assert header.pop("__metadata__") == {"format": "pt"} and header == shard.header
    experts = [o for s in shards for o in s.outputs if ".experts.0." in o.name and "layers.0." in o.name]
    assert {o.src for o in experts} == {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"}


def test_an_unproven_conversion_writes_whole_groups_with_transformers_copies(moe_checkpoint, tmp_path, monkeypatch):
    """Views whose proof fails: the merge falls back to the whole-group writer and transformers' own outputs,
    and the files hold the same tensors as the streamed merge's."""
    from pitlab.trainer.merge import full

    c = moe_checkpoint
    streamed = merge_checkpoint(c["ckpt"], c["base"], tmp_path / "a", max_shard_size=100_000, logits_probe="never")
    monkeypatch.setattr(full.ViewConversion, "_prove", lambda self, group, views, moved: False)
    copied = merge_checkpoint(c["ckpt"], c["base"], tmp_path / "b", max_shard_size=100_000, logits_probe="always")
    assert (streamed["writer"], streamed["conversion"]) == ("streamed", "views")
    assert (copied["writer"], copied["conversion"], copied["logits_probe"]) == ("whole-group", "copies", "equal")

    def tensors(folder):
        out = {}
        for p in folder.glob("*.safetensors"):
            with safe_open(str(p), framework="pt") as f:
                out.update({k: f.get_tensor(k) for k in f.keys()})
        return out

    a, b = tensors(tmp_path / "a"), tensors(tmp_path / "b")
    assert a.keys() == b.keys() and len(a) == 56 and all(torch.equal(a[k], b[k]) for k in a)


def test_the_streamed_plan_refuses_a_layout_that_would_leave_a_tensor_unaligned():
    """bfloat16 of an odd element count before a float32 tensor (input order): the float32 data would start at a
    2-byte offset, so the plan returns None and the merge writes that model with whole groups; one dtype or an
    even count plans."""
    from pitlab.trainer.merge.stream_write import plan_streamed

    def identity(group):
        return {n: (n, 0, t.numel(), tuple(t.shape)) for n, t in group.items()}

    def plan(first_elems):
        saved = {"a": (torch.bfloat16, torch.Size([first_elems])), "b": (torch.float32, torch.Size([4]))}
        sizes = {n: d.itemsize * s.numel() for n, (d, s) in saved.items()}
        return plan_streamed(identity, [["a", "b"]], saved, sizes, ["model.safetensors"])

    assert plan(3) is None
    shards, _ = plan(4)
    assert [(o.name, o.start, o.stop) for o in shards[0].outputs] == [("a", 0, 8), ("b", 8, 24)]
