"""What every stage module shares: the :class:`StageStep` (the stage's report type, ``to_status``, its local
``run`` and its operator side), the status.json writer and the local run contexts (docs/design.md,
"Architecture")."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from pitlab.api import LeakageEval, PitTraining, ResourceStatus, dump_resource
from pitlab.api.recorder import Recorder
from pitlab.api.stages import Stage
from pitlab.trainer.files import write_json_atomic


class Reporter(Protocol):
    """What the runner tells the user about (the CLI draws it with rich; tests may record it)."""

    def stage(self, name: str, detail: str = "") -> None: ...
    def progress(self, task: str, done: int, total: int, info: str = "") -> None: ...
    def done(self, name: str, detail: str = "") -> None: ...


class SilentReporter:
    """A reporter that says nothing."""

    def stage(self, name: str, detail: str = "") -> None: ...
    def progress(self, task: str, done: int, total: int, info: str = "") -> None: ...
    def done(self, name: str, detail: str = "") -> None: ...


class StatusWriter(Recorder):
    """The recorder of ``pitlab run``: keeps ``status.json`` (the resource with its ``.status``) up to date,
    written atomically after every change."""

    def __init__(self, path: Path, resource: PitTraining | LeakageEval, status: ResourceStatus | None = None):
        super().__init__(status if status is not None else ResourceStatus(), resource.metadata.generation or 1)
        self.path, self.resource = path, resource

    def write(self) -> None:
        """Write status.json."""
        doc = dump_resource(self.resource)
        doc["status"] = self.status.model_dump(by_alias=True, mode="json", exclude_none=True)
        write_json_atomic(self.path, doc)


@dataclass
class EvalRun:
    """One LeakageEval being run by ``pitlab run``: what its stages share."""
    res: LeakageEval
    run_dir: Path
    st: StatusWriter
    reporter: Reporter
    checked: Any  # pitlab.local.CheckedEvaluation: the panel and models the preflight read
    model_dirs: dict[str, Path] | None
    cache: Path
    models: dict[str, tuple[Path, str]] = field(default_factory=dict)
    embedded: dict[str, dict] = field(default_factory=dict)
    results: dict = field(default_factory=dict)


@dataclass
class TrainingRun:
    """One PitTraining being run by ``pitlab run``: what its stages share. ``run_evaluation``: the executor's
    run of one LeakageEval (the evaluate stage runs each evaluation through it)."""
    res: PitTraining
    out_root: Path
    run_dir: Path
    st: StatusWriter
    reporter: Reporter
    checked: Any  # pitlab.local.Preflight
    nproc: int
    run_evaluation: Callable[..., dict]
    base_dir: Path | None = None
    resume: bool = False


@dataclass(frozen=True)
class StageStep:
    """One stage, written once: its row of the stage table, its typed report (the artifact / termination message
    and what the status records), ``to_status(report, status) -> message`` (the one place a report becomes
    status fields and the done message), ``run(run, stage)`` (``pitlab run``'s work) and
    ``reconcile(ctx, stage, resource) -> bool`` (the operator's side: True once the stage is done)."""

    stage: Stage
    report: type[BaseModel]
    to_status: Callable[[Any, ResourceStatus], str]
    run: Callable[[Any, Stage], None]
    reconcile: Callable[[Any, Stage, Any], bool]


class Report(BaseModel):
    """Base of the stage reports: camelCase in JSON (as the termination messages and the status), fields by
    name or alias, unknown keys of a termination message ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def to_json(self) -> str:
        """The termination-message / artifact form."""
        return self.model_dump_json(by_alias=True)
