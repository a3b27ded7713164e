"""Learning-rate schedule: linear warmup, then cosine / linear / constant decay to a floor."""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "linear", "constant")


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak learning rate for optimizer step ``step`` (0-based), in ``[0, 1]``.

    Warmup: ``(step + 1) / warmup_steps`` for ``step < warmup_steps``. Afterwards, with
    ``progress = (step - warmup_steps) / max(1, total_steps - warmup_steps - 1)`` going from 0 at the
    first post-warmup step to 1 at the last step: ``cosine`` gives
    ``min_ratio + (1 - min_ratio) * (1 + cos(pi * progress)) / 2``, ``linear`` gives
    ``1 - (1 - min_ratio) * progress``, ``constant`` gives 1. So the last step runs at
    ``min_ratio`` × peak for cosine and linear.

    Raises ``ValueError`` for an unknown schedule or a ``min_ratio`` outside ``[0, 1]``.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"spec.training.schedule: must be one of {SCHEDULES} (got {schedule!r})")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"spec.training.minLearningRateRatio: must be in [0, 1] (got {min_ratio})")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps - 1))
    if schedule == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - (1.0 - min_ratio) * progress
