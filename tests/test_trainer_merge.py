"""pitlab.trainer.merge: the streaming DCP → sharded safetensors merge (single process, bounded memory)."""

from __future__ import annotations

import json
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


def test_a_corrupted_shard_fails_verification_and_leaves_no_output(moe_checkpoint, tmp_path, monkeypatch):
    import pitlab.trainer.merge.full as merge  # the full-weight merge writes the shards

    c = moe_checkpoint
    out = tmp_path / "model"
    merge_checkpoint(c["ckpt"], c["base"], out, max_shard_size="100KB", logits_probe="never")
    before = {p.name: p.read_bytes() for p in out.glob("*.safetensors")}
    real = merge.save_file

    def flip_one(tensors, path, metadata=None):
        tensors = dict(tensors)
        name = sorted(tensors)[0]
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[0] += 1.0
        real(tensors, path, metadata=metadata)

    monkeypatch.setattr(merge, "save_file", flip_one)
    with pytest.raises(MergeError, match=r"model-00001-of-000\d\d\.safetensors: tensor .* differs from checkpoint"):
        merge_checkpoint(c["ckpt"], c["base"], out, max_shard_size="100KB", logits_probe="never")
    assert {p.name: p.read_bytes() for p in out.glob("*.safetensors")} == before  # the good output is kept
    assert not (tmp_path / "model.tmp").exists()
    monkeypatch.setattr(merge, "save_file", real)
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
    """A 328 MB checkpoint merged with 50 MB shards: the merge process grows by far less than the model."""
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
                           "--base", str(tmp_path / "base"), "--out", str(out), "--max-shard-size", "50MB"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["bytes"] == ckpt_bytes and report["shards"] == 7 and report["logits_probe"] == "skipped"
    growth = report["peak_rss_bytes"] - report["rss_before_tensors_bytes"]  # libraries + code excluded
    print(f"checkpoint {ckpt_bytes / 1e6:.0f} MB, RSS before tensors {report['rss_before_tensors_bytes'] / 1e6:.0f} MB, "
          f"peak {report['peak_rss_bytes'] / 1e6:.0f} MB (growth {growth / 1e6:.0f} MB), measured by the parent "
          f"{report['child_maxrss_bytes'] / 1e6:.0f} MB, {report['bytes_per_second'] / 1e6:.0f} MB/s")
    assert report["child_maxrss_bytes"] == pytest.approx(report["peak_rss_bytes"], rel=0.05)
    assert growth < 0.5 * ckpt_bytes  # bounded: whole-model loading would grow by >= 1 × the checkpoint
    assert growth < 2 * 50e6  # about one shard: a group read from the checkpoint (+ one tensor, allocator slack)
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
