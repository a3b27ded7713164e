"""bench/throughput.py's helpers that decide and describe a run without a GPU: where the GPU waited for the host
(``idle_gaps`` on hand-made kernel intervals) and whether a run's memory plan can fit the card at all
(``plan_exceeds_gpu``, which skips a run that would only run out of memory)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
throughput = pytest.importorskip("throughput")


def event(start: float, end: float, name: str, annotation: bool = False, host: bool = False, parent=None):
    return types.SimpleNamespace(time_range=types.SimpleNamespace(start=start, end=end), name=name,
                                 device_type=DeviceType.CPU if host else DeviceType.CUDA,
                                 is_user_annotation=annotation, cpu_parent=parent)


def test_idle_gaps_are_the_holes_between_kernels_by_phase():
    """Kernels k1 [0, 10), k2 [50, 60) overlapping k3 [55, 70), k4 [200, 210) µs; forward is [0, 100), the optimizer
    [100, 300): holes of 40 µs (forward) and 130 µs (starting in forward at 70), nothing counted twice."""
    prof = types.SimpleNamespace(events=lambda: [
        event(0, 10, "k1"), event(50, 60, "k2"), event(55, 70, "k3"), event(200, 210, "k4"),
        event(0, 100, "step.forward", True), event(100, 300, "step.optimizer", True)])
    gaps = throughput.idle_gaps(prof, n_steps=1)
    assert gaps["gaps_per_step"] == 2 and gaps["gap_ms_per_step"] == pytest.approx(0.170)
    assert gaps["gap_ms_per_step_by_phase"] == {"step.forward": 0.17}
    assert [(g["us"], g["after"], g["before"]) for g in gaps["longest"]] == [(130, "k3", "k4"), (40, "k1", "k2")]
    assert throughput.idle_gaps(prof, n_steps=1, min_us=50)["gaps_per_step"] == 1


def test_the_longest_gaps_name_what_the_host_ran_meanwhile():
    """The GPU idles in [10, 110) µs; the host runs ``callback`` [0, 105) with ``norm`` [20, 100) inside it, then
    ``hyper`` [105, 109) and a 1 µs ``tiny`` (below a tenth of the window): the rows are the outer range first
    (95 µs of the window), then ``norm`` (80 µs); ``hyper`` (4 µs) and ``tiny`` are under 10 % of the 100 µs."""
    callback = event(0, 105, "FSDP::root_post_backward_callback", True, host=True)
    prof = types.SimpleNamespace(events=lambda: [
        event(0, 10, "sum_and_scatter"), event(110, 120, "Memcpy HtoD"), callback,
        event(20, 100, "aten::_foreach_norm", host=True, parent=callback), event(105, 109, "hyper", host=True),
        event(50, 51, "tiny", host=True)])
    gaps = throughput.idle_gaps(prof, n_steps=1)
    assert gaps["longest"][0]["host"] == [{"name": "FSDP::root_post_backward_callback", "us": 95, "depth": 0},
                                         {"name": "aten::_foreach_norm", "us": 80, "depth": 1}]
    assert "host" not in throughput.idle_gaps(prof, n_steps=1, host_top=0)["longest"][0]


def test_a_run_whose_plan_cannot_fit_the_card_is_skipped_with_the_numbers(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from h200_qwen35 import training_resource
    from pitlab.trainer.launch import write_spec

    shape = throughput.SHAPES["tiny"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(throughput.shape_config(shape)).save_pretrained(tmp_path / "base")
    write_spec(training_resource("tp-tiny", tmp_path / "base", 128, 128 * 4, 1, checkpointing=None),
               tmp_path / "spec.json")
    assert throughput.plan_exceeds_gpu(tmp_path / "spec.json", 80 * 2**30) is None
    why = throughput.plan_exceeds_gpu(tmp_path / "spec.json", 2**20)
    assert why.startswith("predicted peak 2.01 GiB (allocated 0.01 GiB; single-device, activation checkpointing "
                          "True) is more than 1.05 x this GPU's 0.00 GiB")
    monkeypatch.setenv("PITLAB_FORCE_FSDP2", "1")
    assert "; FSDP2," in throughput.plan_exceeds_gpu(tmp_path / "spec.json", 2**20)


def test_fsdp2_on_the_30b_slice_is_skipped_on_an_80_gb_card_and_the_single_device_path_is_not(tmp_path,
                                                                                               monkeypatch):
    """The Qwen3-30B slice on an H100 (81,559 MiB): the single-device path's predicted peak, 80.01 GiB, is within
    1.05 x (it ran, 2026-12-06); FSDP2's, 92.05 GiB (its float32 gradient shards in the reduce-scatter stream's
    pool), is not (it ran out of memory in every call). Only the base model's config.json is needed."""
    from h200_qwen35 import training_resource
    from pitlab.trainer.launch import write_spec

    throughput.shape_config(throughput.QWEN3_30B_SLICE).save_pretrained(tmp_path / "base")
    write_spec(training_resource("tp-slice", tmp_path / "base", 4096, 4096 * 20, 1, checkpointing=None),
               tmp_path / "spec.json")
    h100 = 81559 * 2**20
    assert throughput.plan_exceeds_gpu(tmp_path / "spec.json", h100) is None
    monkeypatch.setenv("PITLAB_FORCE_FSDP2", "1")
    assert throughput.plan_exceeds_gpu(tmp_path / "spec.json", h100) == (
        "predicted peak 92.05 GiB (allocated 81.21 GiB; FSDP2, activation checkpointing True) is more than 1.05 x "
        "this GPU's 79.65 GiB")


def test_the_plain_loop_accumulates_microbatches_into_one_step():
    """``--accumulation 2``: the plain loop's step runs two microbatches of one sequence each (256 tokens of the
    tiny shape per step) and reports the mean of their losses, which equals the mean of the two losses the same
    initial model gives each chunk alone; the second step's loss differs (the update was applied once)."""
    from transformers import AutoModelForCausalLM

    shape = throughput.SHAPES["tiny"]
    seq = shape["seq"]
    res = throughput.hf_training_loop(shape, steps=1, warmup=1, accumulation=2)
    assert res["tokens_per_step"] == 2 * seq and len(res["step_s"]) == 1
    tokens = torch.from_numpy(throughput.synthetic_tokens((seq + 1) * 4 + 1, shape["vocab"]).astype("int64"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(throughput.shape_config(shape), dtype=torch.bfloat16)
    model.train()
    with torch.no_grad():
        losses = [model(input_ids=c[None], labels=c[None]).loss for c in (tokens[:seq + 1], tokens[seq + 1:2 * seq + 2])]
    expected = float(0.0 + losses[0] / 2 + losses[1] / 2)
    assert res["loss_first_last"][0] == expected and res["loss_first_last"][1] != expected


def test_the_plain_loop_clips_the_gradients_of_both_microbatches(monkeypatch):
    """``--accumulation 2``: the gradients the plain loop's first step clips are those of both microbatches (each
    loss halved, back-propagated one after the other into the same bf16 ``.grad``), bit for bit, and not those of
    the first microbatch alone."""
    from transformers import AutoModelForCausalLM

    seen = []
    real_clip = torch.nn.utils.clip_grad_norm_

    def spy(params, *args, **kwargs):
        params = list(params)
        if not seen:
            seen.append([None if p.grad is None else p.grad.clone() for p in params])
        return real_clip(params, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    shape = throughput.SHAPES["tiny"]
    seq = shape["seq"]
    throughput.hf_training_loop(shape, steps=1, warmup=1, accumulation=2)
    tokens = torch.from_numpy(throughput.synthetic_tokens((seq + 1) * 4 + 1, shape["vocab"]).astype("int64"))
    chunks = (tokens[:seq + 1], tokens[seq + 1:2 * seq + 2])

    def grads(n_chunks: int) -> list:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(throughput.shape_config(shape), dtype=torch.bfloat16)
        model.train()
        for c in chunks[:n_chunks]:
            (model(input_ids=c[None], labels=c[None]).loss / 2).backward()
        return [p.grad for p in model.parameters()]

    both, first_only = grads(2), grads(1)
    assert len(seen[0]) == len(both) and all(g is not None for g in seen[0])
    assert all(torch.equal(a, b) for a, b in zip(seen[0], both))
    assert not all(torch.equal(a, b) for a, b in zip(seen[0], first_only))


def test_a_run_given_twice_keeps_both_results_under_numbered_labels():
    labels = ["hf", "pitlab PITLAB_GC=python", "pitlab", "pitlab PITLAB_GC=python", "pitlab", "pitlab"]
    assert throughput.unique_labels(labels) == ["hf", "pitlab PITLAB_GC=python", "pitlab",
                                                "pitlab PITLAB_GC=python #2", "pitlab #2", "pitlab #3"]
