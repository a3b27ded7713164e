"""One status recorder for both executors: a stage's condition running, done, failed or interrupted, and the
resource succeeded (docs/design.md, "The stage table"). ``pitlab run`` writes ``status.json`` after each change
(:class:`pitlab.pipeline.base.StatusWriter`); the operator's reconciliation context records into the plan's
status (:class:`pitlab.operator.context.Ctx`)."""

from __future__ import annotations

from pitlab.api import conditions, stages
from pitlab.api.stages import Stage
from pitlab.api.status import ResourceStatus


class Recorder:
    """Records stage transitions into ``status`` with ``generation`` and ``now`` (None: the current time)."""

    def __init__(self, status: ResourceStatus, generation: int | None = None, now: str | None = None):
        self.status, self.generation, self.now = status, generation, now

    def write(self) -> None:
        """Called after every change (``pitlab run`` writes status.json; the operator's plan needs nothing)."""

    def is_done(self, stage: Stage) -> bool:
        """Whether ``stage``'s condition is True."""
        return conditions.is_true(self.status, stage.condition)

    def running(self, stage: Stage, message: str = "", reason: str | None = None) -> None:
        """``stage``'s condition False with ``reason`` (default its phase); phase ``stage.phase``."""
        conditions.stage_running(self.status, stage.condition, stage.phase, reason or stage.phase, message,
                                 self.generation, self.now)
        self.write()

    def done(self, stage: Stage, message: str = "", reason: str | None = None) -> None:
        """``stage``'s condition True with ``reason`` (default ``stage.done``)."""
        conditions.stage_done(self.status, stage.condition, reason or stage.done, message, self.generation,
                              self.now)
        self.write()

    def failed(self, stage: Stage, message: str, reason: str | None = None) -> None:
        """``stage``'s condition False and phase Failed with ``reason`` (default ``stage.failed``)."""
        self.fail(stage.condition, reason or stage.failed, message)

    def fail(self, condition: str, reason: str, message: str) -> None:
        """Condition ``condition`` False and phase Failed (Stalled=True), with ``reason`` and ``message``; the training
        progress keeps its step but no ETA."""
        conditions.stage_failed(self.status, condition, reason, message, self.generation, self.now)
        self._stop_eta()
        self.write()

    def interrupted(self, stage: Stage, message: str) -> None:
        """``stage``'s condition False/Interrupted; phase Interrupted (Stalled=True); the progress loses its ETA."""
        conditions.stage_interrupted(self.status, stage.condition, message, self.generation, self.now)
        self._stop_eta()
        self.write()

    def _stop_eta(self) -> None:
        """A stopped run has no time left: its training progress (if any) keeps the step, not the ETA."""
        if getattr(self.status, "progress", None) is not None:
            self.status.progress = self.status.progress.stopped()

    def succeeded(self, message: str) -> None:
        """Phase Succeeded (Ready=True)."""
        conditions.succeeded(self.status, stages.SUCCEEDED, message, self.generation, self.now)
        self.write()
