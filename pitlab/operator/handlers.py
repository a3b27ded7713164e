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
from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from pitlab.api import API_GROUP, API_VERSION, SpecError, conditions, stages
from pitlab.api.status import TERMINAL_PHASES, ResourceStatus
from pitlab.errors import PitlabError
from pitlab.operator import lifecycle, naming, validation
from pitlab.operator.config import OperatorConfig

log = logging.getLogger(__name__)
FINALIZER = f"{API_GROUP}/finalizer"
REFUSALS = (400, 422)  # a create refused for good: the manifest itself is invalid
BLOCKED = {404: "ChildKindMissing", 403: "Forbidden"}  # refused until the cluster changes: retried
API_RETRY_DELAY_S = 5  # seconds before kopf retries a handler after any other API error (kopf.TemporaryError)
WHAT_TO_DO = {
    "PyTorchJob": "install the Kubeflow training operator (the kubeflow.org/v1 PyTorchJob CRD)",
    "TrainJob": "install Kubeflow Trainer v2 (the trainer.kubeflow.org/v1alpha1 TrainJob CRD) and the chart's "
                "ClusterTrainingRuntime (chart value trainingRuntime.install)",
    "JobSet": "install JobSet (the jobset.x-k8s.io/v1alpha2 JobSet CRD)",
    "LeakageEval": "install the pitlab CRDs (helm upgrade --install of charts/pitlab, or kubectl apply -f crds/)",
}


def needs_reconcile(body: kopf.Body, **_: Any) -> bool:
    """Timer filter: unfinished resources, and finished ones whose spec changed since they were observed."""
    status = body.get("status") or {}
    gen = (body.get("metadata") or {}).get("generation")
    return status.get("phase") not in TERMINAL_PHASES or status.get("observedGeneration") != gen


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf settings: our own finalizer name and annotation prefix; handler progress in annotations (the
    CRD's status schema has no room for kopf's bookkeeping); a deleted resource's timer checked for its end
    every second."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    # A resource deleted while its timer's handler runs (in a thread: it cannot be cancelled) keeps its finalizer
    # until kopf sees the handler has ended; kopf looks every 60 s by default, which held a deleted run (and the
    # garbage collection of its children) for up to a minute. One second costs a check per second per deletion.
    settings.background.cancellation_polling = 1.0


def run_plan(kind: str, body: kopf.Body, memo: Any, patch: kopf.Patch,
             reconcile: Callable[..., lifecycle.Plan]) -> None:
    """Reconcile once: create the planned children (one Normal event each), then patch the status if it
    changed, and post the plan's warnings (once each per object and operator run).

    Errors: a spec (or stored spec) that does not parse fails the resource naming the field (InvalidSpec);
    another :class:`~pitlab.errors.PitlabError` fails it with the error's own reason; any other exception of
    the reconcile logic (a bug) is logged and fails it with reason ReconcileError (never retried blindly, an
    edit of the spec reconciles again). A child the API server refuses as invalid (400/422) fails the
    resource (CreateFailed); one it cannot take yet (404: kind not installed; 403: RBAC or ResourceQuota)
    stalls it (Stalled=True, ChildKindMissing / Forbidden, saying what to do) and is retried every
    ``create_retry_delay`` seconds. Other API errors are retried (kopf.TemporaryError)."""
    doc = {"apiVersion": body.get("apiVersion"), "kind": kind, "metadata": dict(body.metadata),
           "spec": dict(body.spec), "status": dict(body.status)}
    try:
        plan = reconcile(doc, memo.kube, memo.config)
    except ApiException as err:
        raise kopf.TemporaryError(f"API error {err}", delay=API_RETRY_DELAY_S) from err
    except HTTPError as err:
        raise kopf.TemporaryError(f"API unreachable: {err}", delay=API_RETRY_DELAY_S) from err
    except Exception as err:  # noqa: BLE001 - classified by broken_status: a pitlab error's reason, else a bug
        if not isinstance(err, (PitlabError, ValidationError)):  # a bug: ReconcileError, never InvalidSpec
            log.exception("%s %s: reconcile failed", kind, doc["metadata"].get("name"))
        failed = broken_status(err, doc)
        patch.status.update(failed)
        _warn_once(body, memo, failed["conditions"][-1]["reason"], failed["conditions"][-1]["message"])
        return
    for reason, message in plan.warnings:
        _warn_once(body, memo, reason, message)
    manifest = None
    try:
        for manifest in plan.creates:
            if memo.kube.create(manifest):
                kopf.event(body, type="Normal", reason="Created",
                           message=f"created {manifest['kind']} {manifest['metadata']['name']}")
    except (ApiException, ValueError) as err:  # ValueError: the client's own validation of the body
        status_code = err.status if isinstance(err, ApiException) else 422
        if manifest is not None and manifest["kind"] == "ConfigMap":  # the run's spec is not stored: not started
            plan.status.spec_digest = lifecycle.load_status(doc).spec_digest
        if manifest is not None and status_code in BLOCKED:  # the cluster must change first: retry later
            blocked = blocked_status(err, plan.status, doc, manifest, memo.config.create_retry_delay)
            patch.status.update(blocked)
            _warn_once(body, memo, BLOCKED[status_code], blocked["conditions"][-1]["message"])
            raise kopf.TemporaryError(blocked["conditions"][-1]["message"],
                                      delay=memo.config.create_retry_delay) from err
        if manifest is not None and status_code in REFUSALS:  # the API server will not take this child
            refused = refused_status(err, plan.status, doc, manifest)
            patch.status.update(refused)
            kopf.warn(body, reason="CreateFailed", message=refused["conditions"][-1]["message"])
            return
        raise kopf.TemporaryError(f"API error {err}", delay=API_RETRY_DELAY_S) from err
    except HTTPError as err:
        raise kopf.TemporaryError(f"API unreachable: {err}", delay=API_RETRY_DELAY_S) from err
    if plan.status is not None:
        new = plan.status.to_yaml_dict()
        if new != doc["status"]:
            patch.status.update(new)


def _warn_once(body: kopf.Body, memo: Any, reason: str, message: str) -> None:
    """A Warning event, unless this object already got the same one from this operator process (the
    per-object ``memo`` lives as long as the process: a reconcile every few seconds posts it once)."""
    seen = getattr(memo, "warned", None)
    if seen is None:
        seen = memo.warned = set()
    if (reason, message) in seen:
        return
    seen.add((reason, message))
    kopf.warn(body, reason=reason, message=message)


def _stage(status: ResourceStatus, doc: dict[str, Any]) -> str:
    """The stage in progress: the first whose condition is not True."""
    return conditions.current_stage(status, stages.conditions_of(doc["kind"]))


def broken_status(err: Exception, doc: dict[str, Any]) -> dict[str, Any]:
    """The status of a resource whose reconcile logic raised ``err``: the stage in progress failed, with
    reason InvalidSpec naming the fields (a :class:`SpecError` or pydantic ``ValidationError``: something
    in the spec, or in the spec stored when the run started, does not parse), the reason of another
    :class:`~pitlab.errors.PitlabError`, or ReconcileError (anything else: a bug)."""
    status = lifecycle.load_status(doc)
    if isinstance(err, ValidationError):
        err = SpecError.from_validation_error(err)
    if isinstance(err, SpecError):
        reason, message = SpecError.reason, validation.message(err.problems)
    elif isinstance(err, PitlabError):
        reason, message = err.reason, f"{type(err).__name__}: {err}"
    else:
        reason, message = "ReconcileError", f"{type(err).__name__}: {err}"
    conditions.stage_failed(status, _stage(status, doc), reason, message[:1000], doc["metadata"].get("generation"))
    return status.to_yaml_dict()


def blocked_status(err: ApiException, status: ResourceStatus, doc: dict[str, Any],
                   manifest: dict[str, Any], retry_delay: float) -> dict[str, Any]:
    """The status of a resource whose child the API server cannot take yet (404: its kind is not installed;
    403: RBAC or a ResourceQuota): the planned ``status``, with the stage that needed the child stalled (reason
    ChildKindMissing or Forbidden and what to do). The phase stays; the create is retried."""
    what = f"{manifest['kind']} {manifest['metadata']['name']}"
    api = _api_detail(err)
    if err.status == 404:
        todo = WHAT_TO_DO.get(manifest["kind"], f"make the {manifest['kind']} kind available")
        text = (f"{what} cannot be created: the API server has no {manifest['kind']} kind ({api}); {todo}. "
                "Retrying every")
    else:
        resource = naming.RESOURCE_OF_KIND[manifest["kind"]].split("/")[-1]
        text = (f"{what} cannot be created: forbidden ({api}); grant the operator's ServiceAccount `create` on "
                f"{resource} (the chart's RBAC), or raise the namespace's ResourceQuota. Retrying every")
    conditions.stage_blocked(status, _stage(status, doc), BLOCKED[err.status], f"{text} {retry_delay:g} s",
                             doc["metadata"].get("generation"))
    _forget(status, manifest)
    return status.to_yaml_dict()


def _forget(status: ResourceStatus, manifest: dict[str, Any]) -> None:
    """Drop ``status.children`` entries naming ``manifest``'s object, which the API server did not create (a user
    would look for a child that is not there)."""
    name = manifest["metadata"]["name"]
    status.children = {k: v for k, v in status.children.items() if v != name}


def refused_status(err: ApiException | ValueError, status: ResourceStatus, doc: dict[str, Any],
                   manifest: dict[str, Any]) -> dict[str, Any]:
    """The status of a resource whose child the API server refused as invalid: the stage that needed the
    child (the first whose condition is not True in the planned ``status``) failed with reason CreateFailed."""
    conditions.stage_failed(status, _stage(status, doc), "CreateFailed",
                            f"{manifest['kind']} {manifest['metadata']['name']} was refused: {_api_detail(err)}",
                            doc["metadata"].get("generation"))
    _forget(status, manifest)
    return status.to_yaml_dict()


def _api_detail(err: ApiException | ValueError) -> str:
    """``<code> <reason>: <message>`` of an API error; the client's own validation error as its text."""
    if isinstance(err, ApiException):
        return f"{err.status} {err.reason}: {_api_message(err)}"
    return str(err)[:500]


def _api_message(err: ApiException) -> str:
    """The ``message`` of an API error's Status body (or the raw body), at most 500 characters."""
    try:
        text = json.loads(err.body).get("message") or err.body
    except (TypeError, ValueError, AttributeError):
        text = err.body or ""
    return str(text)[:500]


STALE_WRITES_BEFORE_ERROR = 10
"""Status writes in a row refused as stale (409) before the next one is reported as an error."""


def write_status(plural: str, body: kopf.Body, memo: Any, patch: kopf.Patch, version: str | None) -> None:
    """Write the status ``run_plan`` put in ``patch`` through the operator's own client, and take it out of
    kopf's patch: kopf applies its patch after the handler returns, where an API error would end the object's
    timer for good. The write carries ``version``, the ``metadata.resourceVersion`` read before the reconcile
    copied the object (kopf updates ``body`` in place meanwhile): a reconcile of a copy older than the operator's
    previous status write (kopf's body lags the watch) is refused with 409 Conflict instead of writing conditions
    computed from the older status (their ``lastTransitionTime`` moved). That is logged, not
    raised: the next timer tick reconciles afresh (after :data:`STALE_WRITES_BEFORE_ERROR` refusals in a row it
    is a :class:`kopf.TemporaryError`). Any other API error is a TemporaryError, retried after
    :data:`API_RETRY_DELAY_S`."""
    status = patch.pop("status", None)
    if not status:
        return
    name = body.metadata.name
    try:
        memo.kube.patch_status(f"{API_GROUP}/{API_VERSION}/{plural}", body.metadata.namespace, name,
                               dict(status), resource_version=version)
    except ApiException as err:
        if err.status == 409:
            stale = getattr(memo, "stale_status_writes", 0) + 1
            memo.stale_status_writes = stale
            if stale < STALE_WRITES_BEFORE_ERROR:
                log.info("%s %s: status not written (%s): read before a newer write; the next reconcile reads it "
                         "afresh", plural, name, _api_detail(err))
                return
            memo.stale_status_writes = 0
            raise kopf.TemporaryError(f"status not written ({_api_detail(err)}, {stale} times in a row); "
                                      "retrying", delay=memo.config.reconcile_interval) from err
        raise kopf.TemporaryError(f"status not written ({_api_detail(err)}); retrying",
                                  delay=API_RETRY_DELAY_S) from err
    except HTTPError as err:
        raise kopf.TemporaryError(f"status not written (API unreachable: {err}); retrying",
                                  delay=API_RETRY_DELAY_S) from err
    memo.stale_status_writes = 0


def _reconcile_and_write(kind: str, plural: str, body: kopf.Body, memo: Any, patch: kopf.Patch,
                         reconcile: Callable[..., lifecycle.Plan]) -> None:
    """:func:`run_plan`, then :func:`write_status` (also when run_plan asks for a retry: a stalled status) with the
    resourceVersion read before run_plan copies the object: a newer copy can only make the write stale (409),
    never let a status computed from an older one through."""
    version = body.metadata.get("resourceVersion")
    try:
        run_plan(kind, body, memo, patch, reconcile)
    finally:
        write_status(plural, body, memo, patch, version)


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Register the handlers of both kinds on ``registry`` with the reconcile interval of ``config``."""

    @kopf.timer(API_GROUP, API_VERSION, "pittrainings", interval=config.reconcile_interval, when=needs_reconcile,
                registry=registry, id="reconcile")
    def pittraining(body: kopf.Body, memo: Any, patch: kopf.Patch, **_: Any) -> None:
        """Advance a PitTraining by one step of its lifecycle."""
        _reconcile_and_write("PitTraining", "pittrainings", body, memo, patch, lifecycle.reconcile_training)

    @kopf.timer(API_GROUP, API_VERSION, "leakageevals", interval=config.reconcile_interval, when=needs_reconcile,
                registry=registry, id="reconcile")
    def leakageeval(body: kopf.Body, memo: Any, patch: kopf.Patch, **_: Any) -> None:
        """Advance a LeakageEval by one step of its lifecycle."""
        _reconcile_and_write("LeakageEval", "leakageevals", body, memo, patch, lifecycle.reconcile_eval)
