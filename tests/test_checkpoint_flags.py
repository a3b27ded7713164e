"""A resume keeps the live optimizer's implementation flags (foreach / fused), not the saving optimizer's, while
the state (moments, step count, hyperparameters) and the parameters come from the checkpoint; a fresh MasterAdamW
makes its state for the load itself, without the step on zero float32 gradients that torch's initialisation
takes (4 bytes per parameter at the load's peak)."""

import json
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("checkpoint_flags_worker.py")


def test_resume_of_a_fused_step_checkpoint_keeps_torch_adamws_foreach(tmp_path):
    proc = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "ckpt")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["foreach"] is True and got["fused"] is None  # the resumed AdamW's own choice (saved: False, False)
    assert got["lr"] == 1e-2 and got["weight_decay"] == 0.1 and got["step"] == 1.0
    assert got["params_equal"] and got["moments_equal"]
    master = got["master"]  # a fresh MasterAdamW makes its state itself: no step on zero gradients during the load
    assert master["stepped_during_load"] == 0 and master["grads"] == [False, False]
    assert master["params_equal"] and master["moments_equal"] and master["steps"] == [1.0, 1.0]
    assert master["step_on_cpu"]
