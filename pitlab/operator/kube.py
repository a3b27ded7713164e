"""The operator's own Kubernetes API calls (kopf makes the others: watching, patching its resources'
finalizers and annotations, events).

:class:`Kube` is the :class:`pitlab.operator.lifecycle.World` the state machines read, plus ``create`` and
``patch_status``.
Every call it makes is listed in :data:`pitlab.operator.rbac.OPERATOR_RULES`, which the Helm chart's
RBAC must equal (tested).
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import kubernetes
from kubernetes.client import ApiClient, ApiException

from pitlab.operator import naming


def _split(resource: str) -> tuple[str, str, str]:
    parts = resource.split("/")
    return ("", parts[0], parts[1]) if len(parts) == 2 else (parts[0], parts[1], parts[2])


class Kube:
    """Reads and creates children in one API server (a configured ``kubernetes.client.ApiClient``).

    ``discovery_ttl``: seconds an answer of :meth:`serves` is reused (a CRD installed meanwhile is seen after at
    most that long); ``clock``: the time source of that cache."""

    def __init__(self, api_client: ApiClient, discovery_ttl: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self.client = api_client
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.batch = kubernetes.client.BatchV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.discovery_ttl, self.clock = discovery_ttl, clock
        self._served: dict[str, tuple[float, frozenset[str]]] = {}

    def serves(self, resource: str) -> bool:
        """Whether the API server serves ``resource`` (``group/version/plural``), from its discovery document
        ``/apis/<group>/<version>`` (readable by every authenticated client; 404: the group version is not
        served), cached for ``discovery_ttl`` seconds per group version."""
        group, version, plural = _split(resource)
        key = f"{group}/{version}"
        cached = self._served.get(key)
        if cached is None or self.clock() - cached[0] > self.discovery_ttl:
            cached = (self.clock(), self._discover(group, version))
            self._served[key] = cached
        return plural in cached[1]

    def _discover(self, group: str, version: str) -> frozenset[str]:
        """The resource names of one group version (empty when it is not served)."""
        try:
            found = self.custom.get_api_resources(group, version, _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                return frozenset()
            raise
        return frozenset(r.get("name", "") for r in json.loads(found.data).get("resources") or [])

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object (``namespace`` None: a cluster-scoped one), or None if it does not exist."""
        group, version, plural = _split(resource)
        try:
            if resource == naming.CONFIGMAPS:
                obj = self.core.read_namespaced_config_map(name, namespace, _preload_content=False)
            elif resource == naming.JOBS:
                obj = self.batch.read_namespaced_job(name, namespace, _preload_content=False)
            elif namespace is None:  # a cluster-scoped object (the ClusterTrainingRuntime)
                return self.custom.get_cluster_custom_object(group, version, plural, name)
            else:
                return self.custom.get_namespaced_custom_object(group, version, namespace, plural, name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return json.loads(obj.data)

    def create(self, manifest: dict[str, Any]) -> bool:
        """Create ``manifest``; False if an object of that name already exists (409: adopt it next time)."""
        ns = manifest["metadata"]["namespace"]
        try:
            if manifest["kind"] == "ConfigMap":
                self.core.create_namespaced_config_map(ns, manifest)
            elif manifest["kind"] == "Job":
                self.batch.create_namespaced_job(ns, manifest)
            else:
                group, version, plural = _split(naming.RESOURCE_OF_KIND[manifest["kind"]])
                self.custom.create_namespaced_custom_object(group, version, ns, plural, manifest)
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    def patch_status(self, resource: str, namespace: str, name: str, status: dict[str, Any],
                     resource_version: str | None = None) -> None:
        """Merge-patch ``status`` into the status subresource of a pitlab resource; with ``resource_version`` the
        API server refuses the patch (409 Conflict) unless the object is still at that version (raises
        ApiException)."""
        group, version, plural = _split(resource)
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        self.custom.patch_namespaced_custom_object_status(group, version, namespace, plural, name, body,
                                                          _content_type="application/merge-patch+json")

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The pods of Job ``job`` (selected by the ``batch.kubernetes.io/job-name`` label)."""
        return self.list_pods(namespace, f"batch.kubernetes.io/job-name={job}")

    def job_events(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The events about Job ``job`` (``involvedObject`` kind Job and that name), e.g. the Job controller's
        ``FailedCreate``."""
        resp = self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.kind=Job,"
                                                                         f"involvedObject.name={job}",
                                               _preload_content=False)
        return json.loads(resp.data).get("items") or []

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods matching the label selector ``selector`` (e.g. a PyTorchJob's, which are not a Job's)."""
        resp = self.core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
        return json.loads(resp.data).get("items") or []

    def pod_log(self, namespace: str, pod: str, container: str) -> str | None:
        """The last 5 lines of a container's log, or None if the pod or container is not there (yet)."""
        try:
            resp = self.core.read_namespaced_pod_log(pod, namespace, container=container, tail_lines=5,
                                                     _preload_content=False)
        except ApiException as err:
            if err.status in (400, 404):  # no such pod yet, or container still starting
                return None
            raise
        return resp.data.decode("utf-8", "replace")
