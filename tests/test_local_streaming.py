"""`pitlab run` of a layer-streaming PitTraining (examples/local-lora-streaming.yaml, scaled down): corpus → one
torchrun process with the frozen layers streamed through two slots (CPU path) → verified adapter → merge."""

import json

import pytest
import torch
import yaml
from safetensors import safe_open
from typer.testing import CliRunner

from pitlab.cli import app

EXAMPLE = "examples/local-lora-streaming.yaml"


@pytest.fixture(scope="module")
def streaming_run(tmp_path_factory, data_root):
    tmp_path = tmp_path_factory.mktemp("streaming-run")
    with open(EXAMPLE) as f:
        doc = yaml.safe_load(f)
    doc["spec"]["output"]["uri"] = str(tmp_path / "out")
    doc["spec"]["tokens"] = 8 * 512  # 8 steps of 8 × 64 tokens
    doc["spec"]["training"].update(seqLen=64, warmupSteps=2)
    doc["spec"]["checkpoint"]["everySteps"] = 4
    path = tmp_path / "stream.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["run", str(path), "--data-root", str(data_root)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    return tmp_path / "out" / "fomc-lora-streaming"


@pytest.mark.slow
def test_streaming_pittraining_runs_end_to_end(streaming_run):
    run_dir = streaming_run
    status = json.loads((run_dir / "status.json").read_text())["status"]
    assert status["phase"] == "Succeeded" and status["progress"]["step"] == 8
    summary = json.loads((run_dir / "train" / "summary.json").read_text())
    assert summary["method"] == "lora" and summary["world_size"] == 1 and summary["precision"] == "bf16"
    # r × (in + out) per targeted linear layer of each decoder layer: q 64→64, k, v 64→32, o 64→64, down 128→64;
    # and the head, 64→2048 (resident, not streamed)
    assert summary["trainable_parameters"] == 4 * 8 * (128 + 96 + 96 + 128 + 192) + 8 * (64 + 2048) == 37_376
    losses = [json.loads(x)["loss"] for x in (run_dir / "train" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 8 and losses[0] == summary["first_loss"] and losses[-1] == summary["final_loss"]
    assert summary["final_loss"] < summary["first_loss"] - 0.08, losses  # 7.650 -> 7.538 here (ln 2048 = 7.62)
    # the streaming plan of this spec, recorded beside the measured peak (tiny: the logits chunk of 512 tokens x
    # 2048 x 14 bytes dominates)
    from pitlab.trainer.plan import plan_memory
    from pitlab.trainer.train import load_spec

    planned = plan_memory(load_spec(run_dir / "spec.json").spec).peak_bytes
    assert summary["planned_peak_bytes"] == planned and 14 * 2 ** 20 < planned < 20 * 2 ** 20, planned
    s = summary["layer_streaming"]
    assert s["layers"] == 4 and s["buffers"] == 2 and s["host_embedding"] is True and s["pinned"] is False
    # the first step: 4 layers into empty slots, then 1 and 0 again in backward; every later step finds layers
    # 0, 1 in the slots for its forward and 2, 3 for its backward: 2 x (4 - 2) copies
    assert s["layer_copies"] == (4 + 2) + 7 * 4 == 34
    # the frozen base is bit-identical to the base folder, the adapter moved
    from transformers import AutoModelForCausalLM

    from reference import parameter_sha256
    from pitlab.trainer.lora import base_parameter_name

    base = parameter_sha256(AutoModelForCausalLM.from_pretrained(run_dir / "base", dtype=torch.bfloat16))
    frozen = {base_parameter_name(n): d for n, d in summary["param_sha256"].items() if "lora_" not in n}
    assert frozen == base and len(base) == 1 + 4 * 9 + 2  # embeddings, 4 x (7 linear + 2 norms), norm, lm_head
    assert summary["adapter"]["tensors"] == 4 * 5 * 2 + 2
    with safe_open(str(run_dir / "adapter" / "adapter_model.safetensors"), framework="pt") as f:
        assert len(list(f.keys())) == 42
    report = json.loads((run_dir / "model" / "merge_report.json").read_text())
    assert report["kind"] == "lora-merged" and report["merged_weights"] == 21 and report["verified"]
    assert sorted(p.name for p in (run_dir / "checkpoint").iterdir()) == ["latest", "step-4", "step-8"]


@pytest.mark.slow
def test_a_streaming_run_resumes_bit_identically(streaming_run, tmp_path):
    """Checkpoints hold the adapter and its AdamW state; the frozen base is streamed again from base/."""
    import shutil

    from pitlab.trainer.launch import run_training

    run = tmp_path / "resumed"
    shutil.copytree(streaming_run / "data", run / "data")
    shutil.copytree(streaming_run / "checkpoint" / "step-4", run / "checkpoint" / "step-4")
    (run / "checkpoint" / "latest").write_text("step-4\n")
    summary = run_training(streaming_run / "spec.json", run, nproc=1, base=streaming_run / "base")
    full = json.loads((streaming_run / "train" / "summary.json").read_text())
    assert summary["resumed_from_step"] == 4 and summary["steps"] == 8
    assert summary["param_sha256"] == full["param_sha256"] and summary["final_loss"] == full["final_loss"]
    assert summary["layer_streaming"]["layer_copies"] == (4 + 2) + 3 * 4  # 4 steps, the first into empty slots


def test_a_run_over_its_budget_is_refused_before_anything_is_written(tmp_path, data_root):
    with open(EXAMPLE) as f:
        doc = yaml.safe_load(f)
    doc["spec"]["output"]["uri"] = str(tmp_path / "out")
    doc["spec"]["training"]["layerStreaming"]["gpuMemoryBudgetBytes"] = 16 * 2 ** 20  # 16 MiB
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["run", str(path), "--data-root", str(data_root)], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "spec.training.layerStreaming: predicted GPU peak 31.59 MiB exceeds the budget 16.00 MiB" in out, out
    assert "(training.layerStreaming.gpuMemoryBudgetBytes = 16777216); at most 3 sequence(s) of seqLen 128 per " \
           "microbatch fit: set training.microBatchSize: 3 (now 8" in out, out
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_resume_with_a_memory_mapped_store_is_bit_identical(streaming_run, tmp_path):
    """The same run resumed with training.layerStreaming.hostStore: mmap: the store file is written under the run
    directory, summary.json says so, and the result equals the in-memory run bit for bit."""
    import shutil

    from pitlab.trainer.launch import run_training

    run = tmp_path / "resumed-mmap"
    shutil.copytree(streaming_run / "data", run / "data")
    shutil.copytree(streaming_run / "checkpoint" / "step-4", run / "checkpoint" / "step-4")
    (run / "checkpoint" / "latest").write_text("step-4\n")
    spec = json.loads((streaming_run / "spec.json").read_text())
    spec["spec"]["training"]["layerStreaming"]["hostStore"] = "mmap"
    (run / "spec.json").write_text(json.dumps(spec))
    summary = run_training(run / "spec.json", run, nproc=1, base=streaming_run / "base")
    full = json.loads((streaming_run / "train" / "summary.json").read_text())
    assert summary["param_sha256"] == full["param_sha256"] and summary["final_loss"] == full["final_loss"]
    s = summary["layer_streaming"]
    store = run / "streaming-store" / "layers.store"
    assert s["host_store"] == "mmap" and s["pinned"] is False and s["host_store_written"] is True
    assert s["host_store_path"] == str(store) and s["host_store_file_bytes"] == store.stat().st_size
    memory = full["layer_streaming"]
    assert memory["host_store"] == "memory" and s["host_bytes"] == memory["host_bytes"]
    assert not (run / "streaming-store" / "layers.store.tmp").exists()
