"""Pieces every pod the operator builds shares: the object-storage settings of ``spec.storage`` (the Secret, its
required keys, endpoint and region) and the Jobs' failure policy on bad input."""

from __future__ import annotations

from typing import Any

from pitlab.api.storage import StorageSpec
from pitlab.errors import EXIT_BAD_INPUT

# The keys a storage Secret (spec.storage.secretName) must hold, in every kind of pod: a pod whose Secret is missing,
# or lacks one of them, does not start (CreateContainerConfigError, naming the Secret or the key) instead of
# running for hours and failing at its first s3:// access. Pods that should use their own AWS identity (IRSA,
# instance roles) name no Secret.
REQUIRED_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def secret_key_env(secret_name: str, keys: tuple[str, ...], optional: bool) -> list[dict[str, Any]]:
    """``keys`` of the Secret ``secret_name`` as ``env`` entries (``secretKeyRef``), each ``optional`` or not."""
    return [{"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": k, "optional": optional}}}
            for k in keys]


def with_storage(pod: dict[str, Any], storage: StorageSpec | None) -> dict[str, Any]:
    """Give every container of ``pod`` the object-storage settings of ``spec.storage``: the Secret as
    ``envFrom`` (its keys, e.g. AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, as variables; the Secret required) plus
    :data:`REQUIRED_SECRET_KEYS` as required ``secretKeyRef`` variables (so that a Secret without them stops the
    pod as it stops a TrainJob's, :func:`pitlab.operator.jobset_builders.storage_env`), and endpoint, region and
    addressing style as AWS_ENDPOINT_URL / AWS_REGION / PITLAB_S3_ADDRESSING_STYLE. Returns ``pod``."""
    if storage is None:
        return pod
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        names = {e["name"] for e in c["env"]}
        c["env"] += [{"name": k, "value": v} for k, v in storage.env().items() if k not in names]
        if storage.secret_name:
            c["envFrom"] = c.get("envFrom", []) + [{"secretRef": {"name": storage.secret_name, "optional": False}}]
            c["env"] += [e for e in secret_key_env(storage.secret_name, REQUIRED_SECRET_KEYS, optional=False)
                         if e["name"] not in names]
    return pod


def pod_failure_policy(container: str) -> dict[str, Any]:
    """A Job's ``podFailurePolicy``: ``container`` exiting with pitlab's bad-input code
    (:data:`pitlab.errors.EXIT_BAD_INPUT`: a spec, file or object the stage cannot read) fails the Job at once,
    as a retry would fail the same way; a disrupted pod (preempted, evicted, its node drained or lost: condition
    DisruptionTarget) is replaced without counting against ``backoffLimit``; any other failure counts."""
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "In",
                                              "values": [EXIT_BAD_INPUT]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]}
