"""The pipeline, written once: one module per stage of :mod:`pitlab.api.stages`, each with its typed report,
``to_status``, its local ``run`` and its operator side (docs/design.md, "Architecture"). ``pitlab run``
(:mod:`pitlab.local`) and the operator (:mod:`pitlab.operator.lifecycle`) walk the stage table and call
:data:`STEPS`."""

from __future__ import annotations

from pitlab.api.stages import Stage
from pitlab.pipeline import analyze, embed, evaluate, merge, prepare, train
from pitlab.pipeline.base import StageStep

STEPS: dict[str, StageStep] = {m.STEP.stage.name: m.STEP for m in (prepare, train, merge, evaluate, embed, analyze)}


def step(stage: Stage) -> StageStep:
    """The stage module's step of ``stage`` (a row of the stage table)."""
    return STEPS[stage.name]
