"""Benchmark: the batched SPD solve of the penalty selection's α grid on a GPU, by leaf factorisation and linear
algebra library, against torch's whole-matrix Cholesky (the reference kernel).

    python3 bench/cholesky_leaf.py --d 2048 --n 185 --out $OUT/cholesky-leaf.json

For ``--n`` SPD float64 matrices of order ``--d`` (the batch one inner-fold Cholesky step of the 2,048-dimension
statistics sees: 37 replicates × 5 inner folds), every variant of
:func:`pitlab.evaluator.linalg.cholesky_solve_batched` (``block``, ``leaf``, and the library torch's
``cholesky_ex`` uses at the leaves: ``torch.backends.cuda.preferred_linalg_library`` ``default`` / ``cusolver`` /
``magma``) is timed as the second of three calls (ms per matrix, wall with a device synchronise), with the host
time until the call returns before synchronising (``enqueue_ms``: near the wall time when the host blocks inside,
a sign of synchronising library calls), and its solution compared with the reference
(``torch.linalg.cholesky_ex`` + ``torch.cholesky_solve`` of the whole batch, cuSOLVER): max relative difference.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's pitlab before an installed one


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=2048, help="matrix order")
    p.add_argument("--n", type=int, default=185, help="matrices per batch")
    p.add_argument("--out", default=None, help="JSON file for the results")
    a = p.parse_args()
    import torch

    from pitlab.evaluator.linalg import cholesky_solve_batched

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    Z = torch.randn(a.n, a.d + 64, a.d, generator=g, device=dev, dtype=torch.float64)
    A = Z.mT @ Z + 0.1 * torch.eye(a.d, device=dev, dtype=torch.float64)
    del Z
    b = torch.randn(a.n, a.d, generator=g, device=dev, dtype=torch.float64)
    out: dict = {"d": a.d, "n": a.n, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "runs": []}

    def timed(fn):
        res = None
        for _ in range(3):
            M = A.clone()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            res = fn(M)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
        return res, 1e3 * (t2 - t0) / a.n, 1e3 * (t1 - t0) / a.n

    torch.backends.cuda.preferred_linalg_library("cusolver")
    (ref, _), ms, enq = timed(lambda M: (torch.cholesky_solve(b[..., None], torch.linalg.cholesky_ex(M)[0])[..., 0],
                                         None))
    out["runs"].append({"variant": "torch whole-matrix cholesky_ex (cusolver)", "ms_per_matrix": ms,
                        "enqueue_ms": enq, "max_rel_diff": 0.0})
    print(json.dumps(out["runs"][-1]), flush=True)
    for lib in ("default", "cusolver", "magma"):
        torch.backends.cuda.preferred_linalg_library(lib)
        for block, leaf in ((256, 64), (256, 32), (256, 128), (256, 256), (512, 64), (512, 128), (128, 64),
                            (128, 128), (0, 0)):
            (x, ok), ms, enq = timed(lambda M: cholesky_solve_batched(M, b, block, leaf))
            row = {"variant": f"blocked {block}/{leaf}, {lib}" if block else f"cholesky_ex whole, {lib}",
                   "library": lib, "block": block, "leaf": leaf, "ms_per_matrix": ms, "enqueue_ms": enq,
                   "all_ok": bool(ok.all()), "max_rel_diff": float((x - ref).abs().max() / ref.abs().max())}
            out["runs"].append(row)
            print(json.dumps(row), flush=True)
    torch.backends.cuda.preferred_linalg_library("default")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
