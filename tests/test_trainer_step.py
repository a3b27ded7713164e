"""One training step of pitlab's trainer on the CPU: the host reads it makes (one per step: the loss and the
gradient norm together, after the optimizer's launches) and, with the decoder layers compiled as
``training.compile`` does on a GPU, dynamo's graph breaks and graphs over several steps (no recompilation per
step or per layer). Each case runs in its own process (tests/step_worker.py, a gloo world of one rank)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from pitlab.api import PitTraining
from pitlab.trainer.launch import write_spec
from pitlab.trainer.prepare import build_config

from tiny_models import QWEN35_TINY  # noqa: E402  (tests/ is on sys.path under pytest)

WORKER = Path(__file__).with_name("step_worker.py")
STEPS = 3
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]  # Qwen3.5's 3 : 1


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """Eager and compiled (``aot_eager``) runs of the same tiny 4-layer qwen3_5_moe_text, bf16 mixed precision
    under FSDP2 as on a GPU, seq 64, micro-batch 1, 3 steps each."""
    run = tmp_path_factory.mktemp("step")
    config = build_config("qwen3_5_moe_text", dict(QWEN35_TINY, num_hidden_layers=4, layer_types=LAYER_TYPES),
                          vocab_size=256, eos_token_id=0, pad_token_id=1, bos_token_id=0)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(run / "base")
    (run / "data").mkdir()
    np.save(run / "data" / "tokens.npy", np.random.default_rng(0).integers(0, 256, 65 * 8 + 1).astype(np.uint32))
    resource = PitTraining.model_validate({
        "apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "metadata": {"name": "step-test"},
        "spec": {"baseModel": {"uri": str(run / "base")}, "corpus": {"uri": "synthetic.jsonl", "format": "jsonl"},
                 "knowledgeCutoff": "2020-12-31", "tokens": 64 * 2 * STEPS,
                 "training": {"seqLen": 64, "microBatchSize": 1, "learningRate": 1e-3, "warmupSteps": 1,
                              "precision": "bf16"},
                 "resources": {"nodes": 1, "gpusPerNode": 1}}})
    write_spec(resource, run / "spec.json")
    out = run / "out.json"
    proc = subprocess.run([sys.executable, str(WORKER), str(run), str(out), str(STEPS), "eager", "aot_eager"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_a_step_reads_the_device_once(steps):
    eager = steps["eager"]
    assert [s["reads"] for s in eager["steps"]] == [1] * STEPS
    assert eager["reads"] == {"tolist train.py:train_step": STEPS}  # loss and gradient norm in one transfer
    assert all(s["grad_norm_type"] == "float" and s["grad_norm"] > 0 for s in eager["steps"])


def test_compiled_layers_have_no_graph_break_and_no_recompilation(steps):
    compiled = steps["aot_eager"]
    assert compiled["kernels"]["compile"] == "torch.compile per decoder layer (4 layers)"
    assert [s["graph_breaks"] for s in compiled["steps"]] == [0] * STEPS, compiled["graph_break_reasons"]
    # one graph per layer kind (linear attention, full attention), captured in step 1, none added later
    assert [s["unique_graphs"] for s in compiled["steps"]] == [2] * STEPS
    assert [s["reads"] for s in compiled["steps"]] == [1] * STEPS


def test_compiled_steps_equal_the_eager_steps_bit_for_bit(steps):
    eager, compiled = steps["eager"]["steps"], steps["aot_eager"]["steps"]
    assert [(s["loss"], s["grad_norm"]) for s in compiled] == [(s["loss"], s["grad_norm"]) for s in eager]
