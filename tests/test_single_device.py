"""The world-size-1 path without FSDP2 (pitlab.trainer.single_device: float32 masters + a bf16 compute copy) against
FSDP2 at world size 1 (``PITLAB_FORCE_FSDP2=1``), bit for bit: each step's loss and gradient norm and the final
float32 parameters, for a tiny qwen3_5_moe_text (chunked loss, activation checkpointing) and a tiny llama (reference
loss), without and with gradient accumulation (2 microbatches, also with ``gradientSyncEveryMicrobatch: false``,
and 3 for qwen3_5_moe_text), and a run resumed from a checkpoint of either path. The single-device path with the
fused optimizer step (``fusedOptimizer: true``, pitlab.trainer.fused_step, eager on the CPU) gives the same bits
too. All runs share one gloo process (tests/single_device_worker.py)."""

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
from pitlab.trainer.single_device import LABEL, ComputeCopy, uses_compute_copy

from test_trainer import TINY_CONFIGS  # noqa: E402  (tests/ is on sys.path under pytest)

WORKER = Path(__file__).with_name("single_device_worker.py")
STEPS = 3
SEQ, MICRO = 32, 2
VOCAB = 256
# model -> spec.training settings: the fused loss with activation checkpointing, and the reference loss without
MODELS = {"qwen3_5_moe_text": {"loss": "chunked", "activationCheckpointing": True},
          "llama": {"loss": "reference", "activationCheckpointing": False}}
CASES = [(m, accum, sync) for m in MODELS for accum, sync in ((1, True), (2, True), (2, False), (3, True))
         if not (m == "llama" and (not sync or accum == 3))]


def resource(base: Path, accum: int, sync: bool = True, **training) -> PitTraining:
    t = {"seqLen": SEQ, "microBatchSize": MICRO, "gradientAccumulationSteps": accum,
         "gradientSyncEveryMicrobatch": sync, "learningRate": 3e-3, "warmupSteps": 1, "precision": "bf16",
         "seed": 0, **training}
    return PitTraining.model_validate({
        "apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "metadata": {"name": "ws1-test"},
        "spec": {"baseModel": {"uri": str(base)}, "corpus": {"uri": "synthetic.jsonl", "format": "jsonl"},
                 "knowledgeCutoff": "2020-12-31", "tokens": SEQ * MICRO * accum * STEPS, "training": t,
                 "resources": {"nodes": 1, "gpusPerNode": 1}, "checkpoint": {"everySteps": 2, "keep": 3}}})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ws1")
    tokens = np.random.default_rng(0).integers(2, VOCAB, (SEQ + 1) * 16 + 1).astype(np.uint32)  # never the pad id
    plan = []

    def run_dir(name: str, res: PitTraining) -> Path:
        d = root / name
        (d / "data").mkdir(parents=True)
        np.save(d / "data" / "tokens.npy", tokens)
        write_spec(res, d / "spec.json")
        return d

    for model_type, training in MODELS.items():
        config = build_config(model_type, TINY_CONFIGS[model_type], vocab_size=VOCAB, eos_token_id=0,
                              pad_token_id=1, bos_token_id=0)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(root / f"base-{model_type}")
    for model_type, accum, sync in CASES:
        base = root / f"base-{model_type}"
        for path in ("fsdp2", "single", "fused"):
            name = f"{model_type}-{accum}-{sync}-{path}"
            training = dict(MODELS[model_type], fusedOptimizer=path == "fused")
            plan.append({"name": name, "mode": "steps", "steps": STEPS, "force_fsdp2": path == "fsdp2",
                         "run_dir": str(run_dir(name, resource(base, accum, sync, **training))),
                         "base": str(base), "params": str(root / f"{name}.pt")})
    # whole runs with checkpoints at steps 2 and 3, and runs resumed from each path's step-2 checkpoint
    base = root / "base-qwen3_5_moe_text"
    res = resource(base, 2, **MODELS["qwen3_5_moe_text"])
    fused = resource(base, 1, **MODELS["qwen3_5_moe_text"], fusedOptimizer=True)
    unfused = resource(base, 1, **MODELS["qwen3_5_moe_text"], fusedOptimizer=False)
    for name, force, resume, r in (("train-single", False, None, res), ("train-fsdp2", True, None, res),
                                   ("resume-single-from-single", False, "train-single", res),
                                   ("resume-single-from-fsdp2", False, "train-fsdp2", res),
                                   ("resume-fsdp2-from-single", True, "train-single", res),
                                   ("train-fused-1", False, None, fused), ("train-unfused-1", False, None, unfused),
                                   ("resume-fused-from-unfused", False, "train-unfused-1", fused),
                                   ("resume-unfused-from-fused", False, "train-fused-1", unfused)):
        plan.append({"name": name, "mode": "train", "force_fsdp2": force, "run_dir": str(run_dir(name, r)),
                     "base": str(base),
                     "resume_from": str(root / resume / "checkpoint" / "step-2") if resume else None})
    # last (the setting is the process's): the fused case of qwen3_5_moe_text, 1 microbatch, deterministic
    name, training = "deterministic", dict(MODELS["qwen3_5_moe_text"], fusedOptimizer=True, deterministic=True)
    plan.append({"name": name, "mode": "steps", "steps": STEPS, "force_fsdp2": False,
                 "run_dir": str(run_dir(name, resource(base, 1, True, **training))), "base": str(base),
                 "params": str(root / f"{name}.pt")})
    (root / "plan.json").write_text(json.dumps(plan))
    proc = subprocess.run([sys.executable, str(WORKER), str(root / "plan.json"), str(root / "out.json")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads((root / "out.json").read_text())
    return {"root": root, "out": out, "stderr": proc.stderr}


@pytest.mark.parametrize("model_type,accum,sync", CASES)
def test_single_device_path_equals_fsdp2_bit_for_bit(runs, model_type, accum, sync):
    name = f"{model_type}-{accum}-{sync}"
    fsdp2, single, fused = (runs["out"][f"{name}-{path}"] for path in ("fsdp2", "single", "fused"))
    assert fsdp2["parallelism"] == "FSDP2" and fsdp2["dtensor"] is True
    assert single["parallelism"] == LABEL and single["dtensor"] is False
    assert single["master_dtypes"] == ["torch.float32"] and single["copy_param_dtypes"] == ["torch.bfloat16"]
    assert single["copy_buffer_dtypes"] == ["torch.float32"]  # rotary inv_freq: not cast, as under FSDP2
    assert single["copy_equals_masters"] is True  # the copy holds the updated masters, cast
    assert single["loss"] == fsdp2["loss"] and single["grad_norm"] == fsdp2["grad_norm"]
    assert len(set(single["loss"])) == STEPS and all(g > 0 for g in single["grad_norm"])  # the steps did change it
    p_fsdp2 = torch.load(runs["root"] / f"{name}-fsdp2.pt")
    p_single = torch.load(runs["root"] / f"{name}-single.pt")
    assert list(p_single) == list(p_fsdp2) and len(p_single) > 10
    assert all(p.dtype == torch.float32 for p in p_single.values())
    differ = [n for n in p_single if not torch.equal(p_single[n], p_fsdp2[n])]
    assert differ == []
    # the fused optimizer step: torch AdamW's arithmetic on the clipped bf16 gradients, the same bits
    p_fused = torch.load(runs["root"] / f"{name}-fused.pt")
    assert fused["parallelism"] == LABEL and fused["copy_equals_masters"] is True
    assert fused["kernels"]["optimizer"].startswith("fused clip + AdamW")
    assert single["kernels"]["optimizer"].startswith("torch AdamW")
    assert fused["loss"] == fsdp2["loss"] and fused["grad_norm"] == fsdp2["grad_norm"]
    assert [n for n in p_fused if not torch.equal(p_fused[n], p_fsdp2[n])] == []
    # activation checkpointing applies on the compute copy: each layer's forward runs again in backward
    per_micro = 2 if MODELS[model_type]["activationCheckpointing"] else 1
    assert single["first_layer_norm_calls"] == fsdp2["first_layer_norm_calls"] == per_micro * accum * STEPS
    # the same kernels; FSDP2 also names its reduce-scatter copy-in (pitlab.trainer.fsdp_copy_in) and its
    # accumulation and one-rank reduce (pitlab.trainer.fsdp_grads: with 2 and 3 microbatches it holds and pairs)
    assert fsdp2["kernels"].pop("reduce_scatter_copy_in").startswith("pitlab.trainer.fsdp_copy_in")
    assert fsdp2["kernels"].pop("fsdp_grads").startswith("pitlab.trainer.fsdp_grads")
    assert single["kernels"] == fsdp2["kernels"]
    # FSDP2 at world size 1 gathers each parameter group (every decoder layer and the root) once per step, not
    # once per microbatch: the gathered parameters stay between a step's microbatches; the other path never gathers
    assert fsdp2["all_gathers"] == (fsdp2["layers"] + 1) * STEPS and fsdp2["layers"] >= 2
    # and reduce-scatters once per step whatever gradientSyncEveryMicrobatch says: in a world of one rank the
    # unsharded float32 sums are the sharded gradients
    assert fsdp2["reduce_scatters"] == (fsdp2["layers"] + 1) * STEPS
    assert single["all_gathers"] == single["reduce_scatters"] == 0
    assert {k: v for k, v in fused["kernels"].items() if k != "optimizer"} == \
        {k: v for k, v in single["kernels"].items() if k != "optimizer"}


def test_gradient_sync_setting_is_a_no_op_on_one_device(runs):
    """FSDP2 accumulates unsynchronised microbatch gradients upcast to float32 (to_accumulated_grad_if_needed):
    the same sums as reducing each microbatch, so both settings and both paths give the same bits."""
    out = runs["out"]
    ref = out["qwen3_5_moe_text-2-True-fsdp2"]
    for name in ("qwen3_5_moe_text-2-False-fsdp2", "qwen3_5_moe_text-2-False-single"):
        assert (out[name]["loss"], out[name]["grad_norm"]) == (ref["loss"], ref["grad_norm"])


def test_resume_continues_bit_identically_from_either_path(runs):
    out = runs["out"]
    single, fsdp2 = out["train-single"], out["train-fsdp2"]
    assert single["summary"]["parallelism"] == LABEL and fsdp2["summary"]["parallelism"] == "FSDP2"
    assert single["summary"]["param_sha256"] == fsdp2["summary"]["param_sha256"]
    assert single["metrics"] == fsdp2["metrics"] and [r["step"] for r in single["metrics"]] == [1, 2, 3]
    for name in ("resume-single-from-single", "resume-single-from-fsdp2", "resume-fsdp2-from-single"):
        resumed = out[name]
        assert resumed["summary"]["resumed_from_step"] == 2, name
        # step 3 after the resume: its loss is computed on the compute copy refreshed from the loaded masters
        assert resumed["metrics"] == single["metrics"][2:], name
        assert resumed["summary"]["param_sha256"] == single["summary"]["param_sha256"], name
        assert resumed["summary"]["final_loss"] == single["summary"]["final_loss"], name


def test_fused_optimizer_step_checkpoints_resume_across_the_two_steps(runs):
    """One microbatch per step: the fused step reads the bf16 gradients (no float32 ones); its checkpoints hold
    torch AdamW's state, so a run resumes from either optimizer's checkpoint with the same bits."""
    out = runs["out"]
    fused, unfused = out["train-fused-1"], out["train-unfused-1"]
    assert fused["metrics"] == unfused["metrics"] and [r["step"] for r in fused["metrics"]] == [1, 2, 3]
    assert fused["summary"]["param_sha256"] == unfused["summary"]["param_sha256"]
    for name in ("resume-fused-from-unfused", "resume-unfused-from-fused"):
        resumed = out[name]
        assert resumed["summary"]["resumed_from_step"] == 2, name
        assert resumed["metrics"] == fused["metrics"][2:], name
        assert resumed["summary"]["param_sha256"] == fused["summary"]["param_sha256"], name


def test_merge_of_a_single_device_checkpoint_is_verified(runs, tmp_path):
    """The single-device run's checkpoint (plain tensors, not DTensor shards) merges into a Hugging Face model whose
    parameters match the summary's digests."""
    from pitlab.trainer.merge import merge_checkpoint

    summary = runs["out"]["train-single"]["summary"]
    report = merge_checkpoint(runs["root"] / "train-single" / "checkpoint", runs["root"] / "base-qwen3_5_moe_text",
                              tmp_path / "merged", summary["param_sha256"], logits_probe="always")
    assert report["verified"] is True and report["summary_digests_checked"] is True
    assert report["checkpoint"].endswith("step-3") and report["logits_probe"] == "equal"


def test_the_path_is_chosen_for_one_rank_full_bf16_only(monkeypatch, tmp_path):
    spec = resource(tmp_path, 1).spec
    assert uses_compute_copy(spec, 1) is True
    assert uses_compute_copy(spec, 2) is False  # more ranks: FSDP2 shards
    fp32 = resource(tmp_path, 1, precision="fp32").spec
    assert uses_compute_copy(fp32, 1) is False
    lora = spec.model_copy(update={"method": "lora"})
    assert uses_compute_copy(lora, 1) is False
    monkeypatch.setenv("PITLAB_FORCE_FSDP2", "1")
    assert uses_compute_copy(spec, 1) is False


def test_compute_copy_casts_parameters_keeps_buffers_and_accumulates_in_float32():
    config = build_config("llama", dict(TINY_CONFIGS["llama"], tie_word_embeddings=True), vocab_size=64,
                          eos_token_id=0, pad_token_id=1, bos_token_id=0)
    torch.manual_seed(0)
    master = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    cc = ComputeCopy(master)
    names = [n for n, _ in master.named_parameters()]
    assert [n for n, _ in cc.model.named_parameters()] == names
    assert cc.model.lm_head.weight is cc.model.model.embed_tokens.weight  # tied in the copy as in the master
    for (n, m), c in zip(master.named_parameters(), cc.model.parameters()):
        assert c.dtype == torch.bfloat16 and torch.equal(c, m.to(torch.bfloat16)), n
    for (n, b), c in zip(master.named_buffers(), cc.model.buffers()):
        assert c.dtype == b.dtype == torch.float32 and torch.equal(c, b) and c is not b, n
    # two microbatches: float32(g1) + g2 in float32, one rounding, as FSDP2's reduce of one rank and its +=
    gen = torch.Generator().manual_seed(1)
    g = [[torch.randn(p.shape, generator=gen).to(torch.bfloat16) for p in cc.model.parameters()] for _ in range(2)]
    for micro in range(2):
        for c, gc in zip(cc.model.parameters(), g[micro]):
            c.grad = gc.clone()
        cc.accumulate_grads()
        assert all(c.grad is None for c in cc.model.parameters())
    for m, g1, g2 in zip(master.parameters(), *g):
        assert m.grad.dtype == torch.float32 and torch.equal(m.grad, g1.float() + g2.float())
    with torch.no_grad():
        for m in master.parameters():
            m.add_(1e-3)
    cc.refresh()
    assert all(torch.equal(c, m.to(torch.bfloat16)) for c, m in zip(cc.model.parameters(), master.parameters()))
    with pytest.raises(ValueError, match="master parameters must be float32"):
        ComputeCopy(cc.model)


def test_deterministic_training_turns_torchs_deterministic_algorithms_on_and_changes_no_bit_on_the_cpu(runs):
    """``training.deterministic: true``: the rank runs under ``torch.use_deterministic_algorithms(True)`` (named in
    the kernels report); on the CPU, already deterministic, its losses, gradient norms and parameters equal the
    same run's without it bit for bit. Every earlier run of the process had it off."""
    det, plain = runs["out"]["deterministic"], runs["out"]["qwen3_5_moe_text-1-True-fused"]
    assert det["deterministic_algorithms"] is True
    assert det["kernels"]["deterministic"] == "torch deterministic algorithms"  # cuBLAS's setting: CUDA only
    assert plain["deterministic_algorithms"] is False and plain["kernels"]["deterministic"] == "off"
    assert det["loss"] == plain["loss"] and det["grad_norm"] == plain["grad_norm"]
    p_det = torch.load(runs["root"] / "deterministic.pt")
    p_plain = torch.load(runs["root"] / "qwen3_5_moe_text-1-True-fused.pt")
    assert list(p_det) == list(p_plain) and all(torch.equal(p_det[n], p_plain[n]) for n in p_det)


def _gather_run(k: int, hold_in_place: bool | str, pair_fn=None, scribble: bool | str = False, steps: int = 2,
                reference: str = "torch", device: str = "cpu", compiled: bool = False, add_fn=None):
    """``steps`` optimizer steps of ``k`` microbatches each on a tiny llama's compute copy with the fused step's
    gathering (:meth:`ComputeCopy.gather_grads` + :meth:`ComputeCopy.fused_step`), and the same on a reference
    path: ``torch`` (:meth:`ComputeCopy.accumulate_grads`, ``clip_grad_norm_``, ``torch.optim.AdamW``) or
    ``sums`` (:meth:`ComputeCopy.accumulate_grads`, then the fused step on the stored float32 sums: the path before
    the gathering). ``compiled``: both MasterAdamW compiled with inductor (CUDA). The bf16 gradients are random
    (scaled far over the clip norm on odd steps); the embedding has none in microbatch 0 and the final norm none
    in the last. ``scribble``: every gradient tensor is overwritten with 7.0 after its microbatch's gathering, as a
    CUDA graph's next replay writes over its outputs (``"layers"``: only the decoder layers', as when the layers
    are compiled with CUDA graphs). ``hold_in_place="graphs"``: per parameter as
    :meth:`ComputeCopy.in_place_holds` says with CUDA graphs. Returns {path: (norms, masters, copies)}."""
    from pitlab.trainer.fused_step import MasterAdamW

    config = build_config("llama", TINY_CONFIGS["llama"], vocab_size=64, eos_token_id=0, pad_token_id=1,
                          bos_token_id=0)
    out = {}
    for path in ("gather", reference):
        torch.manual_seed(0)
        master = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device)
        cc = ComputeCopy(master)
        params = list(master.parameters())
        opt = (torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1) if path == "torch"
               else MasterAdamW(params, compiled=compiled, lr=1e-2, weight_decay=0.1))
        names = [n for n, _ in master.named_parameters()]
        gen = torch.Generator().manual_seed(1)
        norms = []
        for step in range(steps):
            for micro in range(k):
                grads = []
                for n, c in zip(names, cc.model.parameters()):
                    g = (torch.randn(c.shape, generator=gen) * (30.0 if step % 2 else 1e-3)).to(torch.bfloat16)
                    skip = ("embed_tokens" in n and micro == 0 and k > 1) or ("model.norm" in n and micro == k - 1)
                    c.grad = None if skip else g.to(device)
                    grads.append(c.grad)
                if path == "gather":
                    holds = cc.in_place_holds(True) if hold_in_place == "graphs" else hold_in_place
                    cc.gather_grads(micro == k - 1, holds, pair_fn, add_fn)
                    if scribble and micro < k - 1:
                        for n, g in zip(names, grads):
                            if g is not None and (scribble is True or ".layers." in n):
                                g.fill_(7.0)
                else:
                    cc.accumulate_grads()
            if path == "gather":
                norms.append(cc.fused_step(opt, 1.0))
            elif path == "sums":
                norms.append(opt.clip_step_cast([p.grad for p in params], list(cc.model.parameters()), 1.0))
                opt.zero_grad(set_to_none=True)
            else:
                norms.append(torch.nn.utils.clip_grad_norm_(params, 1.0))
                opt.step()
                opt.zero_grad(set_to_none=True)
                cc.refresh()
            assert all(c.grad is None for c in cc.model.parameters()) and all(p.grad is None for p in params)
        out[path] = ([float(n) for n in norms], [p.detach().cpu().clone() for p in params],
                     [c.detach().cpu().clone() for c in cc.model.parameters()])
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
@pytest.mark.parametrize("k", [2, 4])
def test_gathering_on_cuda_with_inductor_kernels_against_the_stored_sums(k):
    """On CUDA, with the kernels the trainer compiles (inductor: the pair sum, the norms of ``g + e`` and the
    update reading the last gradient), against the fused step on float32 sums stored by
    :meth:`ComputeCopy.accumulate_grads` (the path before): the unclipped step's masters and copies are equal bit
    for bit (the clip factor is 1 either way); the norms agree to 1e-6 relative (each norm is one inductor
    reduction instead of ``torch._foreach_norm``'s), and so the clipped step's masters to 1e-6 of their size."""
    from pitlab.trainer.fused_step import compiled_add_sums, compiled_pair_sums

    out = _gather_run(k, hold_in_place=False, pair_fn=compiled_pair_sums(8), steps=1, reference="sums",
                      device="cuda", compiled=True, add_fn=compiled_add_sums(8))
    (n_g, p_g, c_g), (n_s, p_s, c_s) = out["gather"], out["sums"]
    assert n_s[0] < 1.0 and abs(n_g[0] - n_s[0]) <= 1e-6 * n_s[0]
    assert all(torch.equal(a, b) for a, b in zip(p_g, p_s)) and all(torch.equal(a, b) for a, b in zip(c_g, c_s))
    out = _gather_run(k, hold_in_place=False, pair_fn=compiled_pair_sums(8), steps=2, reference="sums",
                      device="cuda", compiled=True, scribble=True, add_fn=compiled_add_sums(8))
    (n_g, p_g, _), (n_s, p_s, _) = out["gather"], out["sums"]
    assert n_s[1] > 1.0 and abs(n_g[1] - n_s[1]) <= 1e-6 * n_s[1]
    print(f"k={k}: norms {n_g} vs {n_s}; masters equal {sum(torch.equal(a, b) for a, b in zip(p_g, p_s))}"
          f"/{len(p_s)}")
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6 * float(b.abs().max())) for a, b in zip(p_g, p_s))


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("hold_in_place", [True, False])
def test_fused_step_gathering_equals_torch_accumulation_and_adamw_bit_for_bit(k, hold_in_place):
    """The fused step's gathering (first microbatch held, second summed with it in one pass, the last added as the
    update reads it) gives torch's float32 accumulation, clipping and AdamW to the last bit: the gradient norms of
    a clipped and an unclipped step, every master and the bf16 copy, at 1-4 microbatches, the held gradient kept
    in place or copied, and parameters without a gradient in some microbatches."""
    out = _gather_run(k, hold_in_place)
    (n_g, p_g, c_g), (n_t, p_t, c_t) = out["gather"], out["torch"]
    assert n_g == n_t
    assert n_t[0] < 1.0 < n_t[1]  # an unclipped and a clipped step
    assert all(torch.equal(a, b) for a, b in zip(p_g, p_t))
    assert all(torch.equal(a, b) for a, b in zip(c_g, c_t))
    assert all(torch.equal(c, p.to(torch.bfloat16)) for c, p in zip(c_g, p_g))


def test_the_held_gradient_is_a_copy_where_a_cuda_graph_replay_would_overwrite_it():
    """With the gradient tensors written over after each microbatch (what a CUDA graph's next replay does), the
    copied held gradient still gives torch's bits; held in place, the same run does not (negative control: the
    copy is what makes it safe). The compiled pair sum and the per-layer adds of the third microbatch
    (``backend="eager"``: dynamo's graph, torch's kernels) give the same bits as the eager ones."""
    from pitlab.trainer.fused_step import add_sums, pair_sums

    compiled = torch.compile(pair_sums, dynamic=False, fullgraph=True, backend="eager")
    adds = torch.compile(add_sums, dynamic=False, fullgraph=True, backend="eager")
    copied = _gather_run(4, hold_in_place=False, pair_fn=compiled, scribble=True, add_fn=adds)
    assert all(torch.equal(a, b) for a, b in zip(copied["gather"][1], copied["torch"][1]))
    in_place = _gather_run(4, hold_in_place=True, scribble=True)
    assert not all(torch.equal(a, b) for a, b in zip(in_place["gather"][1], in_place["torch"][1]))


def test_with_cuda_graphs_only_the_decoder_layers_gradients_are_copied_to_be_held():
    """With the decoder layers under CUDA graphs only their gradients are written over by a replay: held per
    parameter as :meth:`ComputeCopy.in_place_holds` says (copied inside the layers, in place for the embedding,
    the final norm and the LM head), a run whose layer gradients are overwritten after each microbatch still
    gives torch's bits; holding the layers' in place too does not (the negative control)."""
    config = build_config("llama", TINY_CONFIGS["llama"], vocab_size=64, eos_token_id=0, pad_token_id=1,
                          bos_token_id=0)
    cc = ComputeCopy(AutoModelForCausalLM.from_config(config, dtype=torch.float32))
    names = [n for n, _ in cc.master.named_parameters()]
    holds = dict(zip(names, cc.in_place_holds(True)))
    assert [n for n, h in holds.items() if h] == ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    assert all(cc.in_place_holds(False))
    per_param = _gather_run(4, hold_in_place="graphs", scribble="layers")
    assert all(torch.equal(a, b) for a, b in zip(per_param["gather"][1], per_param["torch"][1]))
    in_place = _gather_run(4, hold_in_place=True, scribble="layers")
    assert not all(torch.equal(a, b) for a, b in zip(in_place["gather"][1], in_place["torch"][1]))
