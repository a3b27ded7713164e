"""One training step of pitlab's trainer on the CPU: the host reads it makes (one per step: the loss and the
gradient norm together, after the optimizer's launches) and, with the decoder layers compiled as
``training.compile`` does on a GPU, dynamo's graph breaks and graphs over several steps (no recompilation per
step or per layer), also with the fla kernels' stand-ins opaque to dynamo as fla is on a GPU. The runs share one
process (tests/step_worker.py, a gloo world of one rank)."""

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
    """Eager, compiled (``aot_eager``) and compiled with the fla stand-ins (``aot_eager:opaque``) runs of the same
    tiny 4-layer qwen3_5_moe_text, bf16 mixed precision on one rank as on one GPU (float32 masters + the bf16
    compute copy whose layers are compiled, pitlab.trainer.single_device), seq 64, micro-batch 1, 3 steps each
    (tests/step_worker.py)."""
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
    proc = subprocess.run([sys.executable, str(WORKER), str(run), str(out), str(STEPS), "eager", "aot_eager",
                           "aot_eager:opaque", "eager:deferred"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_a_step_reads_the_device_once(steps):
    eager = steps["eager"]
    assert [s["reads"] for s in eager["steps"]] == [1] * STEPS
    assert eager["reads"] == {"tolist step.py:finish_step": STEPS}  # loss and gradient norm in one transfer


def test_steps_read_one_step_late_give_the_same_values(steps):
    """run_steps (the trainer's loop) launches step s + 1 before it reads step s: one read per step, none while
    launching, and the losses and gradient norms of one step at a time to the bit."""
    eager, deferred = steps["eager"], steps["eager:deferred"]
    assert [s["reads"] for s in deferred["steps"]] == [1] * STEPS
    assert deferred["reads"] == {"tolist step.py:finish_step": STEPS}
    assert [(s["loss"], s["grad_norm"]) for s in deferred["steps"]] == [(s["loss"], s["grad_norm"])
                                                                       for s in eager["steps"]]
    assert len({s["loss"] for s in eager["steps"]}) == STEPS  # the steps differ: the comparison means something
    assert all(s["grad_norm_type"] == "float" and s["grad_norm"] > 0 for s in eager["steps"])


def test_compiled_layers_have_no_graph_break_and_no_recompilation(steps):
    compiled = steps["aot_eager"]
    assert compiled["kernels"]["compile"] == "torch.compile per decoder layer (4 layers)"
    assert [s["graph_breaks"] for s in compiled["steps"]] == [0] * STEPS, compiled["graph_break_reasons"]
    # one graph per layer kind (linear attention, full attention), captured in step 1, none added later
    assert [s["unique_graphs"] for s in compiled["steps"]] == [2] * STEPS
    assert [s["reads"] for s in compiled["steps"]] == [1] * STEPS


def test_compiled_layers_with_fla_stand_ins_break_only_at_them_and_only_in_step_1(steps):
    """The structure on a GPU: fla's short convolution and gated delta rule are opaque to dynamo; each linear-
    attention layer breaks at both (dynamo counts a break once per frame it unwinds: 6 for the convolution, nested
    deeper, 1 for the delta rule; under FSDP2 the convolution's is 7, one frame more: transformers wraps the forward
    of FSDP2's ``FSDP<Layer>`` subclass a second time), all graphs are captured in step 1 and the same graphs serve
    steps 2 and 3 and every layer of a kind (6 in all for 3 linear-attention layers and 1 full-attention layer)."""
    compiled = steps["aot_eager:opaque"]
    reasons = compiled["graph_break_reasons"]
    assert sorted(("causal_conv1d_fn" in r, "torch_chunk_gated_delta_rule" in r, n) for r, n in reasons.items()) == \
        [(False, True, 1), (True, False, 6)], reasons
    assert all("torch.compiler.disable" in r for r in reasons)
    assert [s["graph_breaks"] for s in compiled["steps"]] == [7] * STEPS
    assert [s["unique_graphs"] for s in compiled["steps"]] == [6] * STEPS


@pytest.mark.parametrize("mode", ["aot_eager", "aot_eager:opaque"])
def test_compiled_steps_equal_the_eager_steps_bit_for_bit(steps, mode):
    eager, compiled = steps["eager"]["steps"], steps[mode]["steps"]
    assert [(s["loss"], s["grad_norm"]) for s in compiled] == [(s["loss"], s["grad_norm"]) for s in eager]
