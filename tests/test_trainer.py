"""pitlab.trainer: data order, schedule, tokenizer, base model, checkpoints, torchrun training, merge."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pitlab.api import PitTraining, SpecError
from pitlab.trainer.checkpoint import (CheckpointError, complete_checkpoints, latest_checkpoint,
                                       prune_checkpoints)
from pitlab.trainer.data import PackedSequences, steps_for_budget
from pitlab.trainer.digest import tensor_sha256
from reference import parameter_sha256  # noqa: E402  (tests/ is on sys.path under pytest)
from pitlab.trainer.launch import TrainingError, build_torchrun_command, run_training, write_spec
from pitlab.trainer.merge import MergeError, MergeInputError, load_checkpoint_model, merge_checkpoint, probe_logits
from pitlab.trainer.metrics import MetricsTail, MetricsWriter
from pitlab.trainer.prepare import prepare_base_model, tokenize_corpus
from pitlab.trainer.schedule import lr_factor
from pitlab.trainer.tokenizer import EOS_TOKEN, PAD_TOKEN, train_tokenizer

REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = Path(os.environ.get("PITLAB_DATA_ROOT", REPO.parent / "shared" / "data"))
FOMC_CSV = DATA_ROOT / "fomc_statements" / "fomc_statements_1994_2026.csv"

from tiny_models import QWEN35_TINY, TINY_CONFIGS  # noqa: E402  (tests/ is on sys.path under pytest)

VOCAB = 1024


def fomc_texts(cutoff: str = "2005-12-31") -> list[str]:
    """FOMC statements dated on or before ``cutoff`` (a real dated corpus, already PIT-filtered here)."""
    if not FOMC_CSV.is_file():
        pytest.skip(f"{FOMC_CSV} not found (set PITLAB_DATA_ROOT to the shared data folder)")
    with open(FOMC_CSV, newline="", encoding="utf-8") as f:
        return [r["text"] for r in csv.DictReader(f) if r["date"] <= cutoff]


def make_spec(model_type: str = "qwen3_5_moe_text", tokens: int = 30 * 1024, config: dict | None = None,
              **training) -> PitTraining:
    t = {"seqLen": 64, "microBatchSize": 4, "gradientAccumulationSteps": 2, "learningRate": 3e-3,
         "warmupSteps": 3, "schedule": "cosine", "precision": "fp32", "seed": 0}
    t.update(training)
    return PitTraining.model_validate({
        "apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "metadata": {"name": "trainer-test"},
        "spec": {
            "baseModel": {"randomInit": {"modelType": model_type,
                                         "config": {**TINY_CONFIGS[model_type], **(config or {})}, "seed": 0},
                          "tokenizer": {"vocabSize": VOCAB}},
            "corpus": {"uri": str(FOMC_CSV), "format": "csv", "timezone": "America/New_York"},
            "knowledgeCutoff": "2005-12-31",
            "tokens": tokens,
            "training": t,
            "resources": {"nodes": 1, "gpusPerNode": 2},
            "checkpoint": {"everySteps": 10, "keep": 2},
        },
    })


# ---------------------------------------------------------------------------------------------- data packing

def test_steps_for_budget_known_cases():
    # the demo config: 400k tokens, seqLen 128, micro 8, accum 1, world 2 -> ceil(400000 / 2048)
    assert steps_for_budget(400_000, 128, 8, 1, 2) == 196
    assert steps_for_budget(2048, 128, 8, 1, 2) == 1
    assert steps_for_budget(2049, 128, 8, 1, 2) == 2
    assert steps_for_budget(30 * 1024, 64, 4, 2, 2) == 30
    with pytest.raises(ValueError, match="world_size"):
        steps_for_budget(100, 8, 1, 1, 0)


def test_chunks_never_cross_the_array_end():
    tokens = np.arange(1003, dtype=np.uint32)  # 100 chunks of 10; the 3-token tail is dropped
    data = PackedSequences(tokens, seq_len=9, micro_batch=3, grad_accum=2, world_size=2, rank=1, seed=7)
    assert data.n_chunks == 100
    for step in range(40):  # 40 steps x 12 chunks = 4.8 epochs
        for micro in range(2):
            x, y = data.microbatch(step, micro)
            assert x.shape == y.shape == (3, 9) and x.dtype == torch.int64
            assert torch.equal(y, x + 1)  # labels are the inputs shifted by one (consecutive ids here)
            assert torch.all(x[:, 0] % 10 == 0)  # every chunk starts on a chunk boundary
            assert int(y.max()) <= 999  # never reads the dropped tail or past the end


def test_permutation_depends_only_on_seed():
    tokens = np.arange(5000, dtype=np.uint32)
    a = PackedSequences(tokens, 9, 4, 1, 1, 0, seed=3)
    b = PackedSequences(tokens, 9, 4, 1, 1, 0, seed=3)
    c = PackedSequences(tokens, 9, 4, 1, 1, 0, seed=4)
    seq = lambda d: np.concatenate([d.chunk_ids(s, 0) for s in range(300)])  # noqa: E731  (2.4 epochs)
    assert np.array_equal(seq(a), seq(b))
    assert not np.array_equal(seq(a), seq(c))
    for epoch in range(2):  # each epoch visits every chunk once, in default_rng(seed + epoch) order
        order = seq(a)[epoch * 500:(epoch + 1) * 500]
        assert np.array_equal(order, np.random.default_rng(3 + epoch).permutation(500))
        assert sorted(order) == list(range(500))
    assert not np.array_equal(a.epoch_order(0), a.epoch_order(1))


def test_ranks_get_disjoint_chunks_and_the_global_order_is_rank_independent():
    tokens = np.arange(64 * 11, dtype=np.uint32)  # 64 chunks of seq_len 10
    ranks = [PackedSequences(tokens, 10, 2, 2, 4, r, seed=0) for r in range(4)]
    per_step = ranks[0].chunks_per_step
    assert per_step == 16
    stream = np.concatenate([ranks[0].epoch_order(0), ranks[0].epoch_order(1)])
    for step in range(8):  # two epochs
        taken = [ranks[r].chunk_ids(step, m) for m in range(2) for r in range(4)]
        flat = np.concatenate(taken)
        assert len(set(flat.tolist())) == per_step  # disjoint across ranks and microbatches
        assert np.array_equal(flat, stream[step * per_step:(step + 1) * per_step])
        # a rank's view equals the same rank's slice computed by any other rank's object
        assert np.array_equal(ranks[2].chunk_ids(step, 1), ranks[0].chunk_ids(step, 1, rank=2))


def test_corpus_shorter_than_one_sequence_names_seq_len():
    with pytest.raises(SpecError, match=r"spec\.training\.seqLen.*100 tokens"):
        PackedSequences(np.arange(100, dtype=np.uint32), 128, 1, 1, 1, 0, 0)


# -------------------------------------------------------------------------------------------- lr schedule

def test_lr_schedule_warmup_and_decay():
    assert [lr_factor(s, 100, 4, "cosine", 0.1) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 100, 4, "cosine", 0.1) == 1.0
    assert lr_factor(99, 100, 4, "cosine", 0.1) == pytest.approx(0.1)
    mid = 4 + 95 / 2
    assert lr_factor(int(mid), 100, 4, "cosine", 0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 47 / 95)))
    assert lr_factor(99, 100, 0, "linear", 0.2) == pytest.approx(0.2)
    assert lr_factor(0, 100, 0, "linear", 0.2) == 1.0
    assert lr_factor(50, 100, 0, "constant", 0.2) == 1.0
    with pytest.raises(ValueError, match="spec.training.schedule"):
        lr_factor(0, 10, 0, "step", 0.1)


# ------------------------------------------------------------------------------------ tokenizer and base model

def test_tokenizer_is_deterministic_and_loadable(tmp_path):
    texts = fomc_texts()[:40]
    tok = train_tokenizer(texts, 512, tmp_path / "a")
    train_tokenizer(texts, 512, tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    loaded = AutoTokenizer.from_pretrained(tmp_path / "a")
    assert len(loaded) == len(tok) == 512
    assert loaded.eos_token == EOS_TOKEN and loaded.eos_token_id == 0
    assert loaded.pad_token == PAD_TOKEN and loaded.pad_token_id == 1
    ids = loaded(texts[0], add_special_tokens=False)["input_ids"]
    assert loaded.decode(ids) == texts[0]  # byte-level BPE round-trips exactly
    assert len(ids) < len(texts[0].encode()) / 2  # merges were learned
    with pytest.raises(ValueError, match="vocabSize"):
        train_tokenizer(texts, 100, tmp_path / "c")


@pytest.mark.parametrize("model_type", sorted(TINY_CONFIGS))
def test_prepare_base_model_builds_each_architecture(tmp_path, model_type):
    texts = fomc_texts()[:30]
    spec = make_spec(model_type).spec
    out = prepare_base_model(spec, texts, tmp_path / "base")
    assert out == tmp_path / "base" and not (tmp_path / "base.tmp").exists()
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    cfg = model.config
    assert cfg.model_type == model_type and cfg.vocab_size == len(tok) == VOCAB
    assert cfg.eos_token_id == tok.eos_token_id == 0 and cfg.pad_token_id == tok.pad_token_id == 1
    assert cfg.hidden_size == 64 and len(model.model.layers) == 2
    assert next(model.parameters()).dtype == torch.float32
    again = prepare_base_model(spec, texts, tmp_path / "again")  # same seed -> same weights
    assert parameter_sha256(AutoModelForCausalLM.from_pretrained(again)) == parameter_sha256(model)


def test_prepare_base_model_refuses_unknown_and_reserved_config_keys(tmp_path):
    texts = fomc_texts()[:10]
    doc = make_spec().model_dump(mode="json", by_alias=True)
    doc["spec"]["baseModel"]["randomInit"]["config"] = dict(QWEN35_TINY, num_hiden_layers=1, vocab_size=10)
    spec = PitTraining.model_validate(doc).spec
    with pytest.raises(SpecError) as err:
        prepare_base_model(spec, texts, tmp_path / "base")
    assert "spec.baseModel.randomInit.config.num_hiden_layers: unknown qwen3_5_moe_text config key" in str(err.value)
    assert "spec.baseModel.randomInit.config.vocab_size: is set from the trained tokenizer" in str(err.value)
    assert not (tmp_path / "base").exists()


def test_prepare_base_model_with_uri_returns_it(tmp_path):
    base = prepare_base_model(make_spec("llama").spec, fomc_texts()[:10], tmp_path / "base")
    doc = make_spec("llama").model_dump(mode="json", by_alias=True)
    doc["spec"]["baseModel"] = {"uri": str(base)}
    assert prepare_base_model(PitTraining.model_validate(doc).spec, [], tmp_path / "unused") == base
    doc["spec"]["baseModel"] = {"uri": str(tmp_path)}
    with pytest.raises(SpecError, match=r"spec\.baseModel\.uri.*no config\.json"):
        prepare_base_model(PitTraining.model_validate(doc).spec, [], tmp_path / "unused")


def test_tokenize_corpus_layout(tmp_path):
    texts = ["alpha beta", "gamma", "alpha"]
    tok = train_tokenizer(texts * 5, 300, tmp_path / "tok")
    n = tokenize_corpus(texts, tok, tmp_path / "data" / "tokens.npy")
    arr = np.load(tmp_path / "data" / "tokens.npy")
    assert arr.dtype == np.uint32 and arr.ndim == 1 and len(arr) == n
    docs = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert arr.tolist() == docs[0] + [0] + docs[1] + [0] + docs[2] + [0]
    assert not list((tmp_path / "data").glob("*.tmp"))


# ---------------------------------------------------------------------------------- checkpoints and metrics

def _fake_checkpoint(path: Path) -> None:
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"x")


def test_latest_checkpoint_ignores_an_interrupted_tmp_dir(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    _fake_checkpoint(tmp_path / "step-4.tmp")  # a save interrupted after DCP wrote .metadata, before rename
    assert latest_checkpoint(tmp_path) is None
    _fake_checkpoint(tmp_path / "step-2")
    (tmp_path / "latest").write_text("step-2\n")
    _fake_checkpoint(tmp_path / "step-6.tmp")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-2"
    assert complete_checkpoints(tmp_path) == [tmp_path / "step-2"]
    (tmp_path / "latest").write_text("step-4.tmp\n")
    with pytest.raises(CheckpointError, match="expected 'step-<N>'"):
        latest_checkpoint(tmp_path)
    (tmp_path / "latest").write_text("step-8\n")
    with pytest.raises(CheckpointError, match="not a complete DCP checkpoint"):
        latest_checkpoint(tmp_path)


def test_prune_keeps_the_newest(tmp_path):
    for n in (1, 2, 10, 11):
        _fake_checkpoint(tmp_path / f"step-{n}")
    (tmp_path / "latest").write_text("step-11")
    deleted = prune_checkpoints(tmp_path, keep=2)
    assert deleted == [tmp_path / "step-1", tmp_path / "step-2"]
    assert complete_checkpoints(tmp_path) == [tmp_path / "step-10", tmp_path / "step-11"]


def test_metrics_tail_reads_only_complete_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path)
    assert tail.poll() == []
    with MetricsWriter(path) as w:
        w.write({"step": 1, "loss": 2.5})
        with open(path, "a") as f:
            f.write('{"step": 2, "lo')  # a line being written
        assert tail.poll() == [{"step": 1, "loss": 2.5}]
        with open(path, "a") as f:
            f.write('ss": 2.0}\n')
        assert tail.poll() == [{"step": 2, "loss": 2.0}]
        assert tail.poll() == []


def test_tensor_sha256_is_bytes_of_the_tensor():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    import hashlib
    assert tensor_sha256(t) == hashlib.sha256(t.numpy().tobytes()).hexdigest()
    assert tensor_sha256(t.t()) != tensor_sha256(t)  # row-major order of the logical tensor
    assert len(tensor_sha256(torch.ones((), dtype=torch.bfloat16))) == 64


def test_build_torchrun_command(tmp_path):
    import sys
    cmd = build_torchrun_command(tmp_path / "spec.json", tmp_path / "run", 2)
    assert cmd == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                   "-m", "pitlab.cli", "train", "--spec", str(tmp_path / "spec.json"),
                   "--run-dir", str(tmp_path / "run")]
    assert build_torchrun_command("s", "r", 1, base=Path("b"))[-2:] == ["--base", "b"]
    with pytest.raises(ValueError, match="gpusPerNode"):
        build_torchrun_command("s", "r", 0)


def test_pitlab_train_calls_run_rank_with_its_options(tmp_path, monkeypatch):
    """The pods' ``pitlab train`` hands its typer options to ``run_rank`` (no argv rebuilt for a second parser)
    and ends the rank with run_rank's exit code through ``exit_rank``."""
    from typer.testing import CliRunner

    import pitlab.trainer.rank_exit as rank_exit
    import pitlab.trainer.train as train_mod
    from pitlab.cli import app

    calls, codes = [], []
    monkeypatch.setattr(train_mod, "run_rank", lambda *a: calls.append(a) or 2)
    monkeypatch.setattr(rank_exit, "exit_rank", lambda main: codes.append(main()))
    args = ["train", "--spec", str(tmp_path / "s.json"), "--run-dir", str(tmp_path / "run")]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert CliRunner().invoke(app, args + ["--base", str(tmp_path / "b")]).exit_code == 0
    assert calls == [(tmp_path / "s.json", tmp_path / "run", None),
                     (tmp_path / "s.json", tmp_path / "run", tmp_path / "b")]
    assert codes == [2, 2]


# ------------------------------------------------------------------------------- torchrun training + merge

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A world-size-2 gloo run of the tiny qwen3_5_moe_text on FOMC statements up to 2005 (30 steps)."""
    run = tmp_path_factory.mktemp("run")
    texts = fomc_texts()
    resource = make_spec()
    base = prepare_base_model(resource.spec, texts, run / "base")
    n_tokens = tokenize_corpus(texts, AutoTokenizer.from_pretrained(base), run / "data" / "tokens.npy")
    spec_path = write_spec(resource, run / "spec.json")
    seen: list[dict] = []
    summary = run_training(spec_path, run, nproc=2, on_step=seen.append)
    return {"run": run, "base": base, "summary": summary, "seen": seen, "n_tokens": n_tokens,
            "spec_path": spec_path}


@pytest.mark.slow
def test_training_reduces_loss_and_reports(trained):
    s, seen = trained["summary"], trained["seen"]
    assert s["steps"] == 30 and s["world_size"] == 2 and s["backend"] == "gloo"
    assert s["parallelism"] == "FSDP2"  # more than one rank: sharded
    assert s["tokens_per_step"] == 64 * 4 * 2 * 2 and s["tokens_seen"] == 30 * 1024
    assert s["corpus_tokens"] == trained["n_tokens"]
    assert abs(s["first_loss"] - math.log(VOCAB)) < 0.3  # random init predicts ~uniformly
    assert s["final_loss"] < s["first_loss"] - 1.5, (s["first_loss"], s["final_loss"])
    assert s["mean_tokens_per_second"] > 0
    # metrics: one line per optimizer step, delivered to on_step as they were written
    lines = [json.loads(x) for x in (trained["run"] / "train" / "metrics.jsonl").read_text().splitlines()]
    assert seen == lines
    assert [r["step"] for r in lines] == list(range(1, 31))
    assert all(r["total_steps"] == 30 and r["tokens"] == r["step"] * 1024 and r["start_step"] == 0 for r in lines)
    assert lines[0]["loss"] == s["first_loss"] and lines[-1]["loss"] == s["final_loss"]
    assert [r["lr"] for r in lines[:3]] == pytest.approx([1e-3, 2e-3, 3e-3])  # warmup 3 of peak 3e-3
    assert lines[-1]["lr"] == pytest.approx(3e-4)  # cosine to minLearningRateRatio 0.1
    assert all(r["grad_norm"] > 0 and r["tokens_per_second"] > 0 for r in lines)
    # one speed: the summary's mean is the last record's, the tokens of every step over the loop's time
    assert s["mean_tokens_per_second"] == lines[-1]["mean_tokens_per_second"]
    assert lines[-1]["mean_tokens_per_second"] == pytest.approx(30 * 1024 / lines[-1]["elapsed_s"], rel=1e-9)


@pytest.mark.slow
def test_checkpoints_are_complete_and_retained(trained):
    ckpt_dir = trained["run"] / "checkpoint"
    assert (ckpt_dir / "latest").read_text().strip() == "step-30"
    assert latest_checkpoint(ckpt_dir) == ckpt_dir / "step-30"
    assert trained["summary"]["checkpoint"] == str(ckpt_dir / "step-30")
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["latest", "step-20", "step-30"]  # keep: 2 of 10/20/30
    assert not list(trained["run"].rglob("*.tmp"))
    state = json.loads((ckpt_dir / "step-30" / "train_state.json").read_text())
    assert {k: state[k] for k in ("tokens_seen", "step", "world_size")} == {"tokens_seen": 30 * 1024, "step": 30,
                                                                          "world_size": 2}
    assert state["data"] == {"next_step": 30, "chunks_consumed": 30 * 16} and state["scheduler"]["last_epoch"] == 30


@pytest.mark.slow
def test_checkpoint_reloads_to_the_trained_parameters(trained):
    model = load_checkpoint_model(trained["run"] / "checkpoint" / "step-30", trained["base"])
    digests = parameter_sha256(model)
    assert digests == trained["summary"]["param_sha256"]  # bit-identical to the gathered FSDP parameters
    assert len(digests) == len(list(model.parameters())) == 36
    initial = parameter_sha256(AutoModelForCausalLM.from_pretrained(trained["base"]))
    assert digests.keys() == initial.keys()
    assert all(digests[k] != initial[k] for k in digests)  # training changed every parameter


@pytest.mark.slow
def test_merge_writes_a_verified_hf_model(trained, tmp_path):
    out = tmp_path / "model"
    report = merge_checkpoint(trained["run"] / "checkpoint", trained["base"], out,
                              trained["summary"]["param_sha256"])
    assert report["verified"] is True and report["summary_digests_checked"] is True
    assert report["checkpoint"] == str(trained["run"] / "checkpoint" / "step-30")
    assert report["parameters"] == 36 and report["tensors"] >= 36 and report["bytes"] > 4 * 100_000
    assert json.loads((out / "merge_report.json").read_text()) == report
    assert not (tmp_path / "model.tmp").exists()
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask  # readable by other uids
    merged = AutoModelForCausalLM.from_pretrained(out)
    ckpt_model = load_checkpoint_model(trained["run"] / "checkpoint" / "step-30", trained["base"])
    assert torch.equal(probe_logits(merged), probe_logits(ckpt_model))
    assert parameter_sha256(merged) == trained["summary"]["param_sha256"]
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == VOCAB and tok.eos_token_id == 0


@pytest.mark.slow
def test_merge_streams_an_fsdp_checkpoint_into_several_shards(trained, tmp_path):
    """The world-size-2 checkpoint (each tensor in two ranks' files) read in groups of at most 100 kB."""
    out = tmp_path / "sharded"
    report = merge_checkpoint(trained["run"] / "checkpoint", trained["base"], out,
                              trained["summary"]["param_sha256"], max_shard_size="100KB", logits_probe="always")
    assert report["shards"] >= 3 and report["logits_probe"] == "equal" and report["summary_digests_checked"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(index["weight_map"]) == report["tensors"] == 56 and index["metadata"]["total_size"] == report["bytes"]
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert parameter_sha256(merged) == trained["summary"]["param_sha256"]


@pytest.mark.slow
def test_merge_cli_with_summary(trained, tmp_path):
    """``pitlab merge`` (the merge Job's entry point) prints the verified report."""
    from typer.testing import CliRunner

    from pitlab.cli import app

    out = tmp_path / "cli-model"
    result = CliRunner().invoke(app, ["merge", "--checkpoint", str(trained["run"] / "checkpoint" / "step-30"),
                                      "--base", str(trained["base"]), "--out", str(out),
                                      "--summary", str(trained["run"] / "train" / "summary.json")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["verified"] is True
    assert (out / "model.safetensors").is_file()


@pytest.mark.slow
def test_merge_refuses_a_digest_mismatch(trained, tmp_path):
    tampered = dict(trained["summary"]["param_sha256"])
    tampered["model.norm.weight"] = "0" * 64
    out = tmp_path / "model"
    with pytest.raises(MergeError, match=r"1 differ \['model\.norm\.weight'\]"):
        merge_checkpoint(trained["run"] / "checkpoint", trained["base"], out, tampered)
    assert not out.exists() and not (tmp_path / "model.tmp").exists()
    # a previous good output is left untouched, not replaced by an unverified one
    merge_checkpoint(trained["run"] / "checkpoint", trained["base"], out, trained["summary"]["param_sha256"])
    before = (out / "model.safetensors").read_bytes()
    missing = dict(trained["summary"]["param_sha256"])
    missing.pop("lm_head.weight")
    with pytest.raises(MergeError, match="1 unexpected"):
        merge_checkpoint(trained["run"] / "checkpoint", trained["base"], out, missing)
    assert (out / "model.safetensors").read_bytes() == before and not (tmp_path / "model.tmp").exists()


@pytest.mark.slow
def test_merge_refuses_an_incomplete_checkpoint(trained, tmp_path):
    partial = tmp_path / "step-30.tmp"
    shutil.copytree(trained["run"] / "checkpoint" / "step-30", partial)
    with pytest.raises(MergeInputError, match="incomplete checkpoint"):  # bad input (exit 2), not a failed merge
        merge_checkpoint(partial, trained["base"], tmp_path / "model")
    with pytest.raises(MergeInputError, match="no .metadata"):
        merge_checkpoint(trained["run"] / "base", trained["base"], tmp_path / "model")
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_training_is_deterministic(trained, tmp_path):
    run = tmp_path / "again"
    (run / "data").mkdir(parents=True)
    shutil.copy(trained["run"] / "data" / "tokens.npy", run / "data" / "tokens.npy")
    summary = run_training(trained["spec_path"], run, nproc=2, base=trained["base"])
    assert summary["param_sha256"] == trained["summary"]["param_sha256"]
    assert summary["final_loss"] == trained["summary"]["final_loss"]


@pytest.mark.slow
def test_training_error_names_the_field(trained, tmp_path):
    run = tmp_path / "bad"
    (run / "data").mkdir(parents=True)
    shutil.copy(trained["run"] / "data" / "tokens.npy", run / "data" / "tokens.npy")
    spec_path = write_spec(make_spec(seqLen=trained["n_tokens"] + 10,
                                     config={"max_position_embeddings": trained["n_tokens"] + 10}), run / "spec.json")
    with pytest.raises(TrainingError) as err:
        run_training(spec_path, run, nproc=1, base=trained["base"])
    msg = str(err.value)
    assert "exit code" in msg and "spec.training.seqLen" in msg and "fewer than one sequence" in msg
    assert not (run / "train" / "summary.json").exists() and not (run / "checkpoint").exists()


@pytest.mark.slow
def test_killed_rank_resumes_bit_identically(trained, tmp_path):
    """SIGKILL one rank mid-run; the resumed run (from ``latest``) ends bit-identical to the uninterrupted one."""
    import signal
    import subprocess
    import time

    import psutil

    from pitlab.trainer.launch import training_env
    run = tmp_path / "killed"
    (run / "data").mkdir(parents=True)
    shutil.copy(trained["run"] / "data" / "tokens.npy", run / "data" / "tokens.npy")
    spec = make_spec().model_dump(mode="json", by_alias=True)
    spec["spec"]["checkpoint"] = {"everySteps": 4, "keep": 2}  # checkpoint cadence does not change the maths
    spec_path = write_spec(PitTraining.model_validate(spec), run / "spec.json")
    ckpt_dir, metrics = run / "checkpoint", run / "train" / "metrics.jsonl"
    (run / "train").mkdir()
    with open(run / "train" / "first-attempt.log", "wb") as log:
        proc = subprocess.Popen(build_torchrun_command(spec_path, run, 2, base=trained["base"]), stdout=log,
                                stderr=log, env=training_env(2, cuda=False))
        try:
            deadline = time.monotonic() + 180
            while True:  # wait for a complete checkpoint and two more steps past it
                assert proc.poll() is None, "the run ended before it could be interrupted"
                assert time.monotonic() < deadline, "no checkpoint within 180 s"
                latest = latest_checkpoint(ckpt_dir)
                done = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
                if latest is not None and done >= int(latest.name.split("-")[1]) + 2:
                    break
                time.sleep(0.05)
            ranks = [c for c in psutil.Process(proc.pid).children(recursive=True)
                     if c.environ().get("LOCAL_RANK") == "1"]
            assert len(ranks) == 1, ranks
            os.kill(ranks[0].pid, signal.SIGKILL)  # a real signal to one rank, no cooperation from the trainer
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert rc != 0
    assert not (run / "train" / "summary.json").exists()
    killed_at = int(latest_checkpoint(ckpt_dir).name.split("-")[1])
    assert 4 <= killed_at < 30 and killed_at % 4 == 0
    lines_before = len(metrics.read_text().splitlines())
    assert lines_before >= killed_at + 2  # steps past the checkpoint were done and are redone
    state = json.loads((ckpt_dir / f"step-{killed_at}" / "train_state.json").read_text())
    assert state["step"] == killed_at and state["data"] == {"next_step": killed_at,
                                                            "chunks_consumed": killed_at * 16}
    assert state["scheduler"]["last_epoch"] == killed_at
    assert sorted(p.name for p in (ckpt_dir / f"step-{killed_at}").glob("rng-rank-*.pt")) == [
        "rng-rank-0.pt", "rng-rank-1.pt"]

    seen: list[dict] = []
    summary = run_training(spec_path, run, nproc=2, on_step=seen.append, base=trained["base"])  # resumes from latest
    assert summary["resumed_from_step"] == killed_at
    # the kept steps reach on_step as one record, the checkpoint's, so a progress bar resumes there
    assert [r["step"] for r in seen] == list(range(killed_at, 31))
    assert summary["param_sha256"] == trained["summary"]["param_sha256"]  # bit-identical parameters
    assert summary["final_loss"] == trained["summary"]["final_loss"]
    assert summary["first_loss"] == trained["summary"]["first_loss"]
    resumed = [json.loads(x) for x in metrics.read_text().splitlines()]
    uninterrupted = [json.loads(x) for x in (trained["run"] / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == list(range(1, 31))  # each step once: the redone ones replaced
    assert [(r["loss"], r["lr"], r["grad_norm"]) for r in resumed] == [
        (r["loss"], r["lr"], r["grad_norm"]) for r in uninterrupted]
    # the ETA's clock: the first attempt's records start at 0, the resumed attempt's at the checkpoint
    assert all(r["start_step"] == (0 if r["step"] <= killed_at else killed_at) for r in resumed)
    assert (ckpt_dir / "latest").read_text().strip() == "step-30"


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_of_another_run(trained, tmp_path):
    run = tmp_path / "other"
    shutil.copytree(trained["run"] / "data", run / "data")
    shutil.copytree(trained["run"] / "checkpoint", run / "checkpoint")
    spec_path = write_spec(make_spec(seed=1), run / "spec.json")
    with pytest.raises(TrainingError, match=r"spec\.training\.seed: differs from the checkpoint to resume"):
        run_training(spec_path, run, nproc=2, base=trained["base"])


@pytest.mark.slow
def test_accumulation_without_per_microbatch_sync_matches_the_default(trained, tmp_path):
    """gradientSyncEveryMicrobatch: false (one reduce-scatter per step) gives the same updates up to float
    summation order; the LR of the first 3 (warmup) steps does not depend on the run length."""
    run = tmp_path / "nosync"
    shutil.copytree(trained["run"] / "data", run / "data")
    spec_path = write_spec(make_spec(tokens=4 * 1024, gradientSyncEveryMicrobatch=False), run / "spec.json")
    summary = run_training(spec_path, run, nproc=2, base=trained["base"])
    assert summary["steps"] == 4
    got = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(x) for x in (trained["run"] / "train" / "metrics.jsonl").read_text().splitlines()][:3]
    assert got[0]["loss"] == ref[0]["loss"]  # before any update: identical
    assert [r["lr"] for r in got[:3]] == [r["lr"] for r in ref]
    assert [r["loss"] for r in got[1:3]] == pytest.approx([r["loss"] for r in ref[1:3]], rel=1e-4)
    assert [r["grad_norm"] for r in got[:3]] == pytest.approx([r["grad_norm"] for r in ref], rel=1e-4)


def test_the_trainer_defaults_to_expandable_segments_and_keeps_a_users_allocator_setting():
    from pitlab.trainer.train import default_alloc_conf

    assert default_alloc_conf({"A": "1"}) == {"A": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "per_process_memory_fraction:0.5"}
    assert default_alloc_conf(mine) == mine
    assert default_alloc_conf({"PYTORCH_ALLOC_CONF": "expandable_segments:False"}) == {
        "PYTORCH_ALLOC_CONF": "expandable_segments:False"}
