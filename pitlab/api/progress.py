"""How far a training run is and when it should end: percent done and an ETA from the step counts and the
time the current attempt has taken (``status.progress.percent``, ``etaSeconds`` and ``eta``, the ``Done%`` and
``ETA`` columns of ``kubectl get pittrainings``). Pure functions, standard library only, and
:func:`newest_record`, which reads the newest step of the trainer's metrics file for them.

The ETA is the mean pace of the current attempt so far (its elapsed seconds over the steps it ran: a run
resumed from a checkpoint at step ``start_step`` is timed from there, not from step 0) times the steps left.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Estimate:
    """``percent`` done (0-100, floored to 0.1 so that 100 means finished; None without a total) and
    ``eta_seconds`` left (None until the attempt has timed a step; 0 once every step is done)."""

    percent: float | None
    eta_seconds: int | None


def percent_done(step: int, total_steps: int | None) -> float | None:
    """``step`` of ``total_steps`` in percent, floored to one decimal and kept within 0-100; None when the total
    is unknown (or 0)."""
    if not total_steps or total_steps <= 0:
        return None
    return min(100.0, max(0.0, math.floor(1000 * step / total_steps) / 10))


def estimate(step: int, total_steps: int | None, elapsed_s: float | None, start_step: int = 0) -> Estimate:
    """Percent done and seconds left after ``step`` of ``total_steps`` optimizer steps, when the current
    attempt started at step ``start_step`` and has run ``elapsed_s`` seconds: the attempt's mean seconds per step
    (``elapsed_s / (step - start_step)``) times the ``total_steps - step`` steps left, rounded to a second."""
    percent = percent_done(step, total_steps)
    if total_steps is None or total_steps <= 0:
        return Estimate(percent, None)
    if step >= total_steps:
        return Estimate(percent, 0)
    timed = step - start_step
    if elapsed_s is None or not math.isfinite(elapsed_s) or elapsed_s <= 0 or timed <= 0:
        return Estimate(percent, None)
    return Estimate(percent, round(elapsed_s / timed * (total_steps - step)))


def estimate_record(record: dict[str, Any]) -> Estimate:
    """:func:`estimate` of one trainer metrics record (:mod:`pitlab.trainer.metrics`: ``step``, ``total_steps``,
    ``elapsed_s``, ``start_step``; a record without ``start_step`` is taken as from an attempt that began at 0)."""
    return estimate(record.get("step") or 0, record.get("total_steps"), record.get("elapsed_s"),
                    record.get("start_step") or 0)


def format_eta(seconds: int | None) -> str | None:
    """``seconds`` as a short duration for ``kubectl get``: ``45s``, ``12m05s``, ``3h07m``, ``2d04h`` (None stays
    None)."""
    if seconds is None:
        return None
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def newest_record(path: Path, window: int = 65536) -> dict | None:
    """The newest step record of the trainer's metrics file ``path`` (JSON lines, :mod:`pitlab.trainer.metrics`):
    the last whole line that is a JSON object with an integer ``step``, read from at most the file's last ``window``
    bytes (a line still being written is skipped). None when the file is missing, unreadable or has none: following
    progress never stops a run."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - window))
            data = f.read()
    except OSError:
        return None
    for line in reversed(data[: data.rfind(b"\n") + 1].splitlines()):
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            return rec
    return None
