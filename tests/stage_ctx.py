"""What the stage modules' own tests (tests/test_pipeline_<stage>.py) share: the examples loaded as real resources,
a small in-memory cluster view and the operator's reconciliation context over it, so one stage's ``reconcile`` runs
without the lifecycle around it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pitlab.api import ResourceStatus, dump_resource, load_resource
from pitlab.operator.config import OperatorConfig
from pitlab.operator.context import Ctx, Plan
from pitlab.operator.naming import RESOURCE_OF_KIND

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CFG = OperatorConfig()
NOW = "2026-01-01T00:00:00Z"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def example(name: str) -> Any:
    """``examples/<name>`` as its PitTraining or LeakageEval."""
    return load_resource(EXAMPLES / name)


class World:
    """One namespace: objects by (resource, name), the pods of Jobs and the logs of pod containers."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.logs: dict[tuple[str, str], str] = {}

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((resource, name)))

    def job_pods(self, namespace: str | None, job: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["metadata"]["labels"].get(JOB_NAME_LABEL) == job]

    def job_events(self, namespace: str | None, job: str) -> list[dict[str, Any]]:
        return []

    def list_pods(self, namespace: str | None, selector: str) -> list[dict[str, Any]]:
        """The pods with every ``key=value`` label of ``selector``."""
        want = dict(term.split("=", 1) for term in selector.split(","))
        return [p for p in self.pods if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())]

    def pod_log(self, namespace: str | None, pod: str, container: str) -> str | None:
        return self.logs.get((pod, container))

    def serves(self, resource: str) -> bool:
        return True

    def add(self, manifest: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
        """``manifest`` as created, with the status its controller gave it."""
        obj = {**copy.deepcopy(manifest), "status": status or {}}
        self.objects[(RESOURCE_OF_KIND[manifest["kind"]], manifest["metadata"]["name"])] = obj
        return obj

    def finish_job(self, manifest: dict[str, Any], message: str | None = None, container: str = "") -> None:
        """The Job of ``manifest`` Complete; ``message``: its pod's termination message (container ``container``)."""
        self.add(manifest, {"conditions": [{"type": "Complete", "status": "True", "reason": "CompletionsReached"}],
                            "succeeded": 1})
        if message is not None:
            self.pods.append({"metadata": {"name": f"{manifest['metadata']['name']}-x",
                                           "labels": {JOB_NAME_LABEL: manifest["metadata"]["name"]}},
                              "status": {"containerStatuses": [
                                  {"name": container, "state": {"terminated": {"message": message}}}]}})


def body(resource: Any) -> dict[str, Any]:
    """The resource as the operator receives it (namespace, uid and generation set)."""
    doc = dump_resource(resource)
    doc["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    return doc


def ctx(resource: Any, world: World | None = None, status: ResourceStatus | None = None) -> Ctx:
    """A reconciliation of ``resource`` over ``world`` recording into ``status`` (a fresh one by default)."""
    plan = Plan(status=status if status is not None else ResourceStatus())
    return Ctx(body(resource), world or World(), CFG, plan, 1, NOW, resource.kind)
