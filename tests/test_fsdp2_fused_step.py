"""FSDP2's fused optimizer step (``fusedOptimizer: true``: pitlab.trainer.fused_step.MasterAdamW over each rank's
local shards, eager on the CPU) against FSDP2's torch AdamW after clip_grad_norm (``fusedOptimizer: false``), bit for
bit, at world sizes 1 and 2 (gloo, torchrun; ``PITLAB_FORCE_FSDP2=1`` keeps FSDP2 at world size 1): each step's loss
and gradient norm, the final float32 parameters and AdamW moments, without and with gradient accumulation, with
every step clipped and with none; pitlab's gradient accumulation and one-rank reduce (pitlab.trainer.fsdp_grads)
against FSDP2's own; the optimizer's state_dict and the DCP state dict of a checkpoint are torch AdamW's (keys,
classes, shapes, dtypes); a run resumed from a fused checkpoint, fused or not, continues with the same bits. One
torchrun per world size runs every case (tests/fsdp2_fused_worker.py)."""

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
from pitlab.trainer.fused_step import SHARDED_LABEL, TORCH_LABEL
from pitlab.trainer.launch import training_env, write_spec
from pitlab.trainer.prepare import build_config

from test_trainer import TINY_CONFIGS  # noqa: E402  (tests/ is on sys.path under pytest)

WORKER = Path(__file__).with_name("fsdp2_fused_worker.py")
STEPS, TRAIN_STEPS = 3, 4
SEQ, MICRO = 32, 2
VOCAB = 256
GRAD_CLIP = 0.5  # under every step's gradient norm here: every step is clipped
NO_CLIP = 100.0  # over every step's gradient norm: none is
OPTIMIZERS = {"fused": True, "torch": False}
CASES = [(1, GRAD_CLIP), (2, GRAD_CLIP), (1, NO_CLIP)]  # (gradient accumulation, gradClip)
LORA_CLIP = 0.01  # LoRA's first gradients are small (B starts at zero): clipped at every step here


def resource(base: Path, world: int, accum: int, steps: int, fused: bool, clip: float = GRAD_CLIP,
             lora: bool = False, sync: bool = True) -> PitTraining:
    t = {"seqLen": SEQ, "microBatchSize": MICRO, "gradientAccumulationSteps": accum, "learningRate": 3e-3,
         "gradientSyncEveryMicrobatch": sync,
         "warmupSteps": 1, "weightDecay": 0.1, "gradClip": clip, "precision": "bf16", "seed": 0,
         "loss": "reference", "activationCheckpointing": False, "fusedOptimizer": fused}
    return PitTraining.model_validate({
        "apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "metadata": {"name": "fsdp2-fused-test"},
        "spec": {"baseModel": {"uri": str(base)}, "corpus": {"uri": "synthetic.jsonl", "format": "jsonl"},
                 **({"method": "lora", "lora": {"r": 4, "alpha": 8}} if lora else {}),
                 "knowledgeCutoff": "2020-12-31", "tokens": SEQ * MICRO * accum * world * steps, "training": t,
                 "resources": {"nodes": 1, "gpusPerNode": world}, "checkpoint": {"everySteps": 2, "keep": 3}}})


@pytest.fixture(scope="module", params=[1, 2], ids=lambda w: f"world{w}")
def runs(request, tmp_path_factory):
    world = request.param
    root = tmp_path_factory.mktemp(f"fsdp2-fused-{world}")
    tokens = np.random.default_rng(0).integers(2, VOCAB, (SEQ + 1) * 64 + 1).astype(np.uint32)  # never the pad id
    config = build_config("llama", TINY_CONFIGS["llama"], vocab_size=VOCAB, eos_token_id=0, pad_token_id=1,
                          bos_token_id=0)
    torch.manual_seed(0)
    base = root / "base"
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(base)

    def run_dir(name: str, res: PitTraining) -> str:
        d = root / name
        (d / "data").mkdir(parents=True)
        np.save(d / "data" / "tokens.npy", tokens)
        write_spec(res, d / "spec.json")
        return str(d)

    plan = [{"name": f"{opt}-{accum}-{clip}", "mode": "steps", "steps": STEPS, "base": str(base),
             "run_dir": run_dir(f"{opt}-{accum}-{clip}", resource(base, world, accum, STEPS, fused, clip)),
             "params": str(root / f"{opt}-{accum}-{clip}.pt")}
            for accum, clip in CASES for opt, fused in OPTIMIZERS.items()]
    # FSDP2's own reduce-scatter copy-in (torch._chunk_cat) instead of pitlab's (pitlab.trainer.fsdp_copy_in)
    plan.append({"name": "fused-torch-copy-in", "mode": "steps", "steps": STEPS, "base": str(base),
                 "env": {"PITLAB_FSDP_COPY_IN": "torch"},
                 "run_dir": run_dir("fused-torch-copy-in", resource(base, world, 2, STEPS, True, GRAD_CLIP)),
                 "params": str(root / "fused-torch-copy-in.pt")})
    # FSDP2's own accumulation and one-rank reduce instead of pitlab's (pitlab.trainer.fsdp_grads), with every
    # microbatch reduced (2) and with 3 microbatches reduced only at the last (gradientSyncEveryMicrobatch: false)
    for name, accum, sync, env in (("fused-torch-grads", 2, True, {"PITLAB_FSDP_GRADS": "torch"}),
                                   ("nosync-3", 3, False, {}),
                                   ("nosync-3-torch-grads", 3, False, {"PITLAB_FSDP_GRADS": "torch"})):
        plan.append({"name": name, "mode": "steps", "steps": STEPS, "base": str(base), "env": env,
                     "run_dir": run_dir(name, resource(base, world, accum, STEPS, True, GRAD_CLIP, sync=sync)),
                     "params": str(root / f"{name}.pt")})
    plan += [{"name": f"lora-{opt}", "mode": "steps", "steps": STEPS, "base": str(base),
              "run_dir": run_dir(f"lora-{opt}", resource(base, world, 2, STEPS, fused, LORA_CLIP, lora=True)),
              "params": str(root / f"lora-{opt}.pt")} for opt, fused in OPTIMIZERS.items()]
    # a whole fused run with checkpoints at steps 2 and 4, and runs resumed from its step-2 checkpoint
    for name, fused, resume in (("train-fused", True, None), ("resume-fused", True, "train-fused"),
                                ("resume-torch", False, "train-fused")):
        plan.append({"name": name, "mode": "train", "base": str(base),
                     "run_dir": run_dir(name, resource(base, world, 2, TRAIN_STEPS, fused)),
                     "resume_from": str(root / resume / "checkpoint" / "step-2") if resume else None})
    (root / "plan.json").write_text(json.dumps(plan))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
           str(WORKER), str(root / "plan.json"), str(root / "out.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=training_env(world, cuda=False))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"root": root, "world": world, "out": json.loads((root / "out.json").read_text())}


@pytest.mark.parametrize("accum,clip", CASES)
def test_fused_step_equals_torch_adamw_after_clipping_bit_for_bit(runs, accum, clip):
    name = f"{accum}-{clip}"
    fused, ref = runs["out"][f"fused-{name}"], runs["out"][f"torch-{name}"]
    assert fused["parallelism"] == ref["parallelism"] == "FSDP2"
    assert fused["optimizer"] == SHARDED_LABEL + ", eager on the CPU" and ref["optimizer"] == TORCH_LABEL
    assert fused["optimizer_class"] == "MasterAdamW" and ref["optimizer_class"] == "AdamW"
    assert fused["loss"] == ref["loss"] and fused["grad_norm"] == ref["grad_norm"]
    assert len(set(fused["loss"])) == STEPS  # the steps did change the model
    # every step clipped (the norm over gradClip), or none
    assert all((n > clip) == (clip == GRAD_CLIP) for n in fused["grad_norm"]), fused["grad_norm"]
    t_fused = torch.load(runs["root"] / f"fused-{name}.pt")
    t_ref = torch.load(runs["root"] / f"torch-{name}.pt")
    assert list(t_fused) == list(t_ref) and len(t_fused) > 3 * 10  # parameters, then both moments of each
    assert all(t.dtype == torch.float32 for t in t_fused.values())
    assert [n for n in t_fused if not torch.equal(t_fused[n], t_ref[n])] == []


def test_pitlab_copy_in_gives_fsdp2s_own_bits(runs):
    """Accumulation 2, every step clipped: FSDP2's reduce-scatter copy-in replaced by pitlab's (the default) and
    FSDP2's own (``PITLAB_FSDP_COPY_IN=torch``) give the same losses, gradient norms, parameters and moments."""
    from pitlab.trainer.fsdp_copy_in import LABEL, TORCH_LABEL

    ours, theirs = runs["out"][f"fused-2-{GRAD_CLIP}"], runs["out"]["fused-torch-copy-in"]
    assert ours["copy_in"] == LABEL and theirs["copy_in"] == TORCH_LABEL
    assert ours["loss"] == theirs["loss"] and ours["grad_norm"] == theirs["grad_norm"]
    t_ours = torch.load(runs["root"] / f"fused-2-{GRAD_CLIP}.pt")
    t_theirs = torch.load(runs["root"] / "fused-torch-copy-in.pt")
    assert list(t_ours) == list(t_theirs) and len(t_ours) > 30
    assert [n for n in t_ours if not torch.equal(t_ours[n], t_theirs[n])] == []


@pytest.mark.parametrize("ours,theirs", [(f"fused-2-{GRAD_CLIP}", "fused-torch-grads"),
                                         ("nosync-3", "nosync-3-torch-grads")])
def test_pitlab_accumulation_and_reduce_give_fsdp2s_own_bits(runs, ours, theirs):
    """pitlab.trainer.fsdp_grads (the default) against FSDP2's own accumulation and reduce
    (``PITLAB_FSDP_GRADS=torch``): every microbatch reduced (2 microbatches), and 3 microbatches summed unsharded
    before one reduce (``gradientSyncEveryMicrobatch: false``, where the first two are held and paired): the same
    losses, gradient norms, parameters and moments on 1 and 2 ranks."""
    from pitlab.trainer.fsdp_grads import LABEL, TORCH_LABEL

    a, b = runs["out"][ours], runs["out"][theirs]
    assert a["grads"] == LABEL and b["grads"] == TORCH_LABEL
    assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"] and len(set(a["loss"])) == STEPS
    t_a, t_b = torch.load(runs["root"] / f"{ours}.pt"), torch.load(runs["root"] / f"{theirs}.pt")
    assert list(t_a) == list(t_b) and len(t_a) > 30
    assert [n for n in t_a if not torch.equal(t_a[n], t_b[n])] == []


def test_lora_fused_step_equals_torch_adamw_bit_for_bit(runs):
    """method: lora under FSDP2 (frozen base, only the adapter in the optimizer), accumulation 2, every step
    clipped: the fused step gives torch AdamW's losses, gradient norms, adapter parameters and moments."""
    fused, ref = runs["out"]["lora-fused"], runs["out"]["lora-torch"]
    assert fused["optimizer_class"] == "MasterAdamW" and ref["optimizer_class"] == "AdamW"
    assert fused["loss"] == ref["loss"] and fused["grad_norm"] == ref["grad_norm"]
    assert len(set(fused["loss"])) == STEPS and all(n > LORA_CLIP for n in fused["grad_norm"]), fused["grad_norm"]
    t_fused, t_ref = torch.load(runs["root"] / "lora-fused.pt"), torch.load(runs["root"] / "lora-torch.pt")
    assert list(t_fused) == list(t_ref)
    trained = [n.removesuffix(":exp_avg") for n in t_fused if n.endswith(":exp_avg")]
    assert len(trained) == 2 * 4 * TINY_CONFIGS["llama"]["num_hidden_layers"]  # A and B of 4 targets per layer
    assert all("lora_A" in n or "lora_B" in n for n in trained)
    assert [n for n in t_fused if not torch.equal(t_fused[n], t_ref[n])] == []
    assert all(t_fused[n].abs().max() > 0 for n in trained if "lora_B" in n)  # B left zero: the steps moved it


def test_optimizer_state_is_torch_adamws(runs):
    """Same state keys, classes (DTensor moments, a plain CPU step count), global and local shapes and dtypes, in
    the optimizer's state_dict and in the DCP state dict a checkpoint saves; the same hyperparameters."""
    fused, ref = runs["out"][f"fused-2-{GRAD_CLIP}"], runs["out"][f"torch-2-{GRAD_CLIP}"]
    assert fused["state"] == ref["state"] and len(fused["state"]) > 10
    assert fused["dcp_state"] == ref["dcp_state"] and len(fused["dcp_state"]) == len(fused["state"])
    moment = next(iter(fused["state"].values()))["exp_avg"]
    assert moment[0] == "DTensor" and moment[3] == "torch.float32"
    assert next(iter(fused["state"].values()))["step"] == ["Tensor", [], [], "torch.float32"]
    if runs["world"] == 2:  # sharded over dim 0: each rank's moments are half of the rows
        assert moment[2][0] * 2 == moment[1][0]
    (g_fused,), (g_ref,) = fused["param_groups"], ref["param_groups"]
    assert g_fused.keys() == g_ref.keys()
    assert {k: v for k, v in g_fused.items() if k not in ("foreach", "fused")} == \
        {k: v for k, v in g_ref.items() if k not in ("foreach", "fused")}


def test_a_fused_checkpoint_resumes_bit_identically(runs):
    out = runs["out"]
    whole = out["train-fused"]
    assert [r["step"] for r in whole["metrics"]] == list(range(1, TRAIN_STEPS + 1))
    assert whole["summary"]["kernels"]["optimizer"].startswith(SHARDED_LABEL)
    assert whole["metrics"][0]["grad_norm"] > GRAD_CLIP
    for name in ("resume-fused", "resume-torch"):
        resumed = out[name]
        assert resumed["summary"]["resumed_from_step"] == 2, name
        assert resumed["metrics"] == whole["metrics"][2:], name  # steps 3 and 4: loss, gradient norm, LR
        assert resumed["summary"]["param_sha256"] == whole["summary"]["param_sha256"], name
        assert resumed["summary"]["final_loss"] == whole["summary"]["final_loss"], name
    assert out["resume-torch"]["summary"]["kernels"]["optimizer"] == TORCH_LABEL


def test_the_fused_step_is_on_by_default_on_cuda_except_lora_under_fsdp2():
    from types import SimpleNamespace

    from pitlab.trainer.fused_step import fused_step_enabled

    unset, on, off = (SimpleNamespace(fused_optimizer=v) for v in (None, True, False))
    assert [fused_step_enabled(unset, cuda) for cuda in (True, False)] == [True, False]
    assert [fused_step_enabled(unset, cuda, fsdp2=True) for cuda in (True, False)] == [True, False]
    assert not fused_step_enabled(unset, True, fsdp2=True, lora=True)  # LoRA under FSDP2: not measured
    assert fused_step_enabled(on, False, fsdp2=True) and not fused_step_enabled(off, True)
