"""The local runner with ``method: lora`` (examples/local-lora-fomc.yaml, scaled down): corpus → torchrun LoRA
training (bf16 frozen base, gloo, 2 ranks) → adapter merged into the base by the separate merge process."""

import json

import pytest
import torch
import yaml
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from pitlab.cli import app

EXAMPLE = "examples/local-lora-fomc.yaml"


@pytest.mark.slow
def test_lora_pittraining_runs_end_to_end(tmp_path, data_root):
    with open(EXAMPLE) as f:
        doc = yaml.safe_load(f)
    doc["spec"]["output"]["uri"] = str(tmp_path / "out")
    doc["spec"]["tokens"] = 12 * 1024  # 12 steps of 8 × 64 tokens × 2 ranks
    doc["spec"]["training"].update(seqLen=64, warmupSteps=2)
    doc["spec"]["evaluations"] = []  # the evaluation of a merged model is tested with the full-weight demo
    path = tmp_path / "lora.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["run", str(path), "--data-root", str(data_root)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    run_dir = tmp_path / "out" / "fomc-lora-demo"
    status = json.loads((run_dir / "status.json").read_text())["status"]
    assert status["phase"] == "Succeeded" and status["progress"]["step"] == 12
    conds = {c["type"]: c["reason"] for c in status["conditions"]}
    assert conds["Trained"] == "Succeeded" and conds["Merged"] == "MergeSucceeded"
    summary = json.loads((run_dir / "train" / "summary.json").read_text())
    assert summary["method"] == "lora" and summary["precision"] == "bf16" and summary["world_size"] == 2
    # r × (in + out) on the demo model's 7 targeted linear layers: out_proj 64→64, two down_proj 64→64,
    # q_proj 64→128, v_proj 64→32, o_proj 64→64, lm_head 64→2048
    assert summary["trainable_parameters"] == 8 * (3 * 128 + 192 + 96 + 128 + 2112) == 23_296
    assert summary["final_loss"] < summary["first_loss"] - 0.5, (summary["first_loss"], summary["final_loss"])
    assert summary["adapter"]["tensors"] == 14
    report = json.loads((run_dir / "model" / "merge_report.json").read_text())
    assert report["kind"] == "lora-merged" and report["merged_weights"] == 7 and report["verified"]
    assert report["logits_probe"] in ("equal", "close")  # the model is below the 5 GB shard size: probed
    # the frozen bf16 base: the merge reads the base folder (float32) and adds the trained adapter
    base = AutoModelForCausalLM.from_pretrained(run_dir / "base")
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    base_sd, merged_sd = base.state_dict(), merged.state_dict()
    changed = sorted(k for k in base_sd if not torch.equal(base_sd[k], merged_sd[k]))
    assert len(changed) == 7 and "lm_head.weight" in changed
    with safe_open(str(run_dir / "adapter" / "adapter_model.safetensors"), framework="pt") as f:
        assert len(list(f.keys())) == 14
