"""A finite loss with a non-finite gradient stops the run at its own step, naming the step's token chunks and
saying the learning rate is not the cause (the gradient exists before the step's update). The model is the case
found on an H200 (bench/RESULTS.md, layer streaming): a random-initialised llama whose padding token has a zero
embedding row, fed a sequence that starts with that token. Exactly-zero hidden states make each RMSNorm's input
gradient 1/sqrt(eps) times larger per layer; with eps 1e-12 it passes float32's range within 10 layers (inf, then 0 × inf = NaN in the weight gradients)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from pitlab.api import PitTraining
from pitlab.trainer.data import PackedSequences
from pitlab.trainer.launch import TrainingError, run_training, write_spec
from pitlab.trainer.prepare import build_config

SEQ, VOCAB, PAD = 32, 128, 1


def _spec(base, steps: int) -> PitTraining:
    return PitTraining.model_validate({
        "apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "metadata": {"name": "nonfinite"},
        "spec": {"baseModel": {"uri": str(base)}, "corpus": {"uri": "synthetic.jsonl", "format": "jsonl"},
                 "knowledgeCutoff": "2020-12-31", "tokens": SEQ * 2 * steps,
                 "training": {"seqLen": SEQ, "microBatchSize": 2, "learningRate": 1e-3, "warmupSteps": 1,
                              "precision": "fp32", "seed": 0},
                 "resources": {"nodes": 1, "gpusPerNode": 1}}})


@pytest.mark.slow
def test_a_nonfinite_gradient_with_a_finite_loss_stops_at_its_step_and_names_the_chunks(tmp_path):
    config = build_config("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=12,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        rms_norm_eps=1e-12),
                          vocab_size=VOCAB, eos_token_id=0, pad_token_id=PAD, bos_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    assert torch.count_nonzero(model.get_input_embeddings().weight[PAD]) == 0  # padding_idx: the zero row
    model.save_pretrained(tmp_path / "base")
    steps, span = 3, SEQ + 1
    n_chunks = 2 * steps
    tokens = np.random.default_rng(0).integers(2, VOCAB, n_chunks * span + 1).astype(np.uint32)
    data = PackedSequences(tokens, SEQ, 2, 1, 1, 0, seed=0)
    bad_step = 1  # 0-based: the second step's first chunk starts with three padding tokens
    bad = int(data.chunk_ids(bad_step, 0)[0])
    tokens[bad * span:bad * span + 3] = PAD
    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    np.save(run / "data" / "tokens.npy", tokens)
    spec_path = write_spec(_spec(tmp_path / "base", steps), run / "spec.json")
    with pytest.raises(TrainingError) as err:
        run_training(spec_path, run, nproc=1, base=tmp_path / "base")
    msg = str(err.value)
    expected = sorted(int(c) for c in data.chunk_ids(bad_step, 0))
    assert f"step {bad_step + 1}: gradient norm is" in msg, msg[-3000:]
    assert f"token chunks (all ranks): {expected}" in msg
    assert "lowering spec.training.learningRate does not help" in msg
    lines = (run / "train" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == bad_step  # the steps before it were recorded, the bad one was not
    assert not (run / "train" / "summary.json").exists()


def test_loss_history_tells_a_diverging_run_from_a_steady_one():
    from pitlab.trainer.metrics import LossHistory
    from pitlab.trainer.train import StepResult

    steady = LossHistory()
    for k, (loss, norm) in enumerate([(7.6, 2.0), (7.5, 3.0), (7.4, 150.0)]):
        steady.add(k, StepResult(loss, norm, 1e-3, 0.1))
    assert steady.diverged(3, 1e-3) is None  # a gradient spike of 75 x: not yet a divergence
    assert LossHistory().diverged(0, 1e-3) is None  # the first step: nothing to compare with
    rising = LossHistory()
    for k, (loss, norm) in enumerate([(7.64, 2.5), (1_294_044.0, 3.3e8), (90_000.0, 1e6)], start=4):
        rising.add(k, StepResult(loss, norm, 1e6, 0.1))
    assert rising.diverged(7, 1e6) == ("step 8: loss or gradient norm is not finite after the run diverged: the loss "
                                       "rose from 7.64 at step 5 to 1.294e+06 at step 6; lower "
                                       "spec.training.learningRate (now 1e+06)")


def test_a_failing_step_after_a_divergence_is_reported_as_one(monkeypatch):
    """The training loop's step: its history turns a non-finite step after a divergence into the learning-rate
    error, and leaves the step's own error when the run was steady."""
    from types import SimpleNamespace

    from pitlab.trainer import step as step_mod
    from pitlab.trainer.metrics import LossHistory
    from pitlab.trainer.train import StepResult, watched_step

    run = SimpleNamespace(spec=SimpleNamespace(training=SimpleNamespace(learning_rate=1e6)))
    losses = iter([7.64, 1_294_044.0])

    def step(run, k):
        loss = next(losses, None)
        if loss is None:
            raise FloatingPointError(f"step {k + 1}: gradient norm is nan with a finite loss")
        return StepResult(loss, 2.0, 1e6, 0.1)

    monkeypatch.setattr(step_mod, "train_step", step)
    history = LossHistory()
    assert [watched_step(run, k, history).loss for k in (0, 1)] == [7.64, 1_294_044.0]
    with pytest.raises(FloatingPointError, match=r"^step 3: loss or gradient norm is not finite after the run "
                                                 r"diverged: the loss rose from 7.64 at step 1 to 1.294e\+06 at step 2"):
        watched_step(run, 2, history)
    losses = iter([7.64])
    with pytest.raises(FloatingPointError, match=r"^step 2: gradient norm is nan with a finite loss$"):
        steady = LossHistory()
        watched_step(run, 0, steady)
        watched_step(run, 1, steady)
