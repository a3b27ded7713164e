"""Training metrics as JSON lines: one object per optimizer step, flushed so another process can tail it.

Record fields (written by the trainer): ``step`` (1-based optimizer steps done), ``total_steps``,
``loss`` (mean token cross-entropy in nats over all ranks and microbatches of the step), ``lr``
(learning rate used by the step), ``grad_norm`` (global L2 norm before clipping), ``tokens``
(cumulative input tokens over all ranks), ``tokens_per_second`` (this step, all ranks),
``mean_tokens_per_second`` (all ranks, mean from the start of this attempt's training loop to the end of this
step: the speed ``status.progress.tokensPerSecond`` and the run summary report),
``mfu`` (model FLOPs utilisation: ``tokens_per_second × train_flops_per_token / (peak bf16 FLOP/s ×
world size)``, FLOPs from active parameters, see :func:`pitlab.trainer.flops.train_flops_per_token`; null
on devices without a known peak, e.g. CPU), ``peak_memory_bytes`` (rank 0: CUDA max allocated bytes, or
peak RSS on CPU), ``elapsed_s`` (seconds since the first step of this attempt started), ``start_step``
(optimizer steps done before this attempt: 0, or the checkpoint's step a resumed run started from; with
``elapsed_s`` it gives the attempt's pace, hence the ETA, :func:`pitlab.api.progress.estimate_record`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pitlab.trainer.files import write_text_atomic


class MetricsWriter:
    """Append-only JSON-lines writer. ``mode="w"`` starts a fresh file, ``"a"`` appends (e.g. on resume)."""

    def __init__(self, path: Path, mode: str = "w"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, mode, encoding="utf-8")

    def write(self, record: dict) -> None:
        """Write ``record`` as one line of JSON and flush it to the OS."""
        self._f.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def truncate_metrics(path: Path, step: int) -> tuple[float | None, float | None]:
    """Keep only the records of steps ``<= step`` in ``path`` (a resumed run redoes the later ones), rewriting
    the file atomically; a half-written last line is dropped. Idempotent: the kept lines are byte-identical,
    so a :class:`MetricsTail` that already read them stays at a valid offset. Returns ``(loss of the first
    kept record, loss of the last kept record)``, ``(None, None)`` when none is kept or the file is missing."""
    path = Path(path)
    kept: list[str] = []
    losses: list[float] = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                break
            if not line.endswith("\n") or rec.get("step", step + 1) > step:
                break
            kept.append(line)
            losses.append(rec.get("loss"))
        write_text_atomic(path, "".join(kept))
    return (losses[0], losses[-1]) if losses else (None, None)


class MetricsTail:
    """Incremental reader of a JSON-lines file being written by another process.

    :meth:`poll` returns the records of the complete lines (ending in a newline) added since the last
    call; a partially written last line is kept for the next call. A missing file yields nothing.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0

    def poll(self) -> list[dict]:
        """New complete records since the last call. Raises ``ValueError`` naming the file and line for
        a complete line that is not JSON."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        records = []
        for line in data[:end].splitlines():
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{self.path}: malformed metrics line {line[:200]!r}: {err}") from None
        self._offset += end
        return records


class LossHistory:
    """This attempt's first step and its highest loss and gradient norm, to tell a diverging run (the learning
    rate) from a non-finite value out of a steady one (the data or the model) when a step fails."""

    LOSS_GROWTH = 10.0  # a loss this many times its first value (ten times ln(vocabulary) at random init) ...
    NORM_GROWTH = 100.0  # ... or a gradient norm this many times its first: the run diverged

    def __init__(self) -> None:
        self.first = None  # a StepResult: loss, grad_norm
        self.first_step = 0
        self.peak_loss: tuple[float, int] = (-math.inf, 0)
        self.peak_norm: tuple[float, int] = (-math.inf, 0)

    def add(self, step: int, result) -> None:
        """Record step ``step`` (0-based): ``result`` has the step's ``loss`` and ``grad_norm``."""
        if self.first is None:
            self.first, self.first_step = result, step
        self.peak_loss = max(self.peak_loss, (result.loss, step))
        self.peak_norm = max(self.peak_norm, (result.grad_norm, step))

    def diverged(self, step: int, lr: float) -> str | None:
        """The error for step ``step`` (0-based), whose loss or gradient norm is not finite, when an earlier step's
        loss reached :attr:`LOSS_GROWTH` or its gradient norm :attr:`NORM_GROWTH` times the first step's; None
        otherwise."""
        f = self.first
        if f is None:
            return None
        grew = [(what, first, peak, k) for what, first, (peak, k), growth in (
                    ("loss", f.loss, self.peak_loss, self.LOSS_GROWTH),
                    ("gradient norm", f.grad_norm, self.peak_norm, self.NORM_GROWTH))
                if first > 0 and peak >= growth * first]
        if not grew:
            return None
        what, first, peak, k = grew[0]
        return (f"step {step + 1}: loss or gradient norm is not finite after the run diverged: the {what} rose from "
                f"{first:.4g} at step {self.first_step + 1} to {peak:.4g} at step {k + 1}; lower "
                f"spec.training.learningRate (now {lr:g})")
