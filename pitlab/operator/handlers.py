"""Thin kopf handlers: one timer per resource kind that runs the state machine of
:mod:`pitlab.operator.lifecycle`, creates the children it asks for and writes the status it returns.

The timer is level-triggered and sequential per object, so a restarted operator simply carries on from
what exists. It runs while a resource is not finished, and once more after each spec edit (when
``metadata.generation`` differs from ``status.observedGeneration``).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable

import kopf
from kubernetes.client import ApiException
from urllib3.exceptions import HTTPError

from pitlab.api import API_GROUP, API_VERSION
from pitlab.api.status import TERMINAL_PHASES, ResourceStatus
from pitlab.operator import conditions, lifecycle
from pitlab.operator.config import OperatorConfig

FINALIZER = f"{API_GROUP}/finalizer"
REFUSALS = (400, 403, 404, 422)  # a create refused for good: invalid, forbidden, kind not installed


def needs_reconcile(body: kopf.Body, **_: Any) -> bool:
    """Timer filter: unfinished resources, and finished ones whose spec changed since they were observed."""
    status = body.get("status") or {}
    gen = (body.get("metadata") or {}).get("generation")
    return status.get("phase") not in TERMINAL_PHASES or status.get("observedGeneration") != gen


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf settings: our own finalizer name and annotation prefix; handler progress in annotations (the
    CRD's status schema has no room for kopf's bookkeeping)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING


def run_plan(kind: str, body: kopf.Body, memo: Any, patch: kopf.Patch,
             reconcile: Callable[..., lifecycle.Plan]) -> None:
    """Reconcile once: create the planned children (one Normal event each), then patch the status if it
    changed. A child the API server refuses fails the resource (CreateFailed, plus a Warning event); other
    API errors are retried (kopf.TemporaryError)."""
    doc = {"apiVersion": body.get("apiVersion"), "kind": kind, "metadata": dict(body.metadata),
           "spec": dict(body.spec), "status": dict(body.status)}
    manifest = None
    plan = None
    try:
        plan = reconcile(doc, memo.kube, memo.config)
        for manifest in plan.creates:
            if memo.kube.create(manifest):
                kopf.event(body, type="Normal", reason="Created",
                           message=f"created {manifest['kind']} {manifest['metadata']['name']}")
    except (ApiException, ValueError) as err:  # ValueError: the client's own validation of the body
        status_code = err.status if isinstance(err, ApiException) else 422
        if manifest is not None and status_code in REFUSALS:  # the API server will not take this child
            refused = refused_status(err, plan.status if plan else None, doc, manifest)
            patch.status.update(refused)
            kopf.warn(body, reason="CreateFailed", message=refused["conditions"][-1]["message"])
            return
        raise kopf.TemporaryError(f"API error {err}", delay=5) from err
    except HTTPError as err:
        raise kopf.TemporaryError(f"API unreachable: {err}", delay=5) from err
    if plan.status is not None:
        new = plan.status.to_yaml_dict()
        if new != doc["status"]:
            patch.status.update(new)


def refused_status(err: ApiException | ValueError, status: ResourceStatus | None, doc: dict[str, Any],
                   manifest: dict[str, Any]) -> dict[str, Any]:
    """The status of a resource whose child the API server refused to create: the stage that needed the child
    (the first whose condition is not True in the planned ``status``) failed with reason CreateFailed."""
    status = status or lifecycle.load_status(doc)
    stages = conditions.TRAINING_STAGES if doc["kind"] == "PitTraining" else conditions.EVAL_STAGES
    stage = next((s for s in stages if not conditions.is_true(status, s)), stages[-1])
    if isinstance(err, ApiException):
        hint = " (is the Kubeflow training operator installed?)" if err.status == 404 and manifest["kind"] == \
            "PyTorchJob" else ""
        detail = f"{err.status} {err.reason}{hint}: {_api_message(err)}"
    else:
        detail = str(err)[:500]
    conditions.stage_failed(status, stage, "CreateFailed",
                            f"{manifest['kind']} {manifest['metadata']['name']} was refused: {detail}",
                            doc["metadata"].get("generation"))
    return status.to_yaml_dict()


def _api_message(err: ApiException) -> str:
    """The ``message`` of an API error's Status body (or the raw body), at most 500 characters."""
    try:
        text = json.loads(err.body).get("message") or err.body
    except (TypeError, ValueError, AttributeError):
        text = err.body or ""
    return str(text)[:500]


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Register the handlers of both kinds on ``registry`` with the reconcile interval of ``config``."""

    @kopf.timer(API_GROUP, API_VERSION, "pittrainings", interval=config.reconcile_interval, when=needs_reconcile,
                registry=registry, id="reconcile")
    def pittraining(body: kopf.Body, memo: Any, patch: kopf.Patch, **_: Any) -> None:
        """Advance a PitTraining by one step of its lifecycle."""
        run_plan("PitTraining", body, memo, patch, lifecycle.reconcile_training)

    @kopf.timer(API_GROUP, API_VERSION, "leakageevals", interval=config.reconcile_interval, when=needs_reconcile,
                registry=registry, id="reconcile")
    def leakageeval(body: kopf.Body, memo: Any, patch: kopf.Patch, **_: Any) -> None:
        """Advance a LeakageEval by one step of its lifecycle."""
        run_plan("LeakageEval", body, memo, patch, lifecycle.reconcile_eval)
