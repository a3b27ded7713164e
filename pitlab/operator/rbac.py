"""The API permissions the operator needs: exactly the calls its code and kopf make (a test compares them
with the requests seen in the kmock end-to-end tests, and with the Helm chart's RBAC).

Each entry is ``(apiGroup, resource, verbs)``. ``CLUSTER_RULES`` concern cluster-scoped resources and are
always granted cluster-wide; ``NAMESPACED_RULES`` are granted cluster-wide or per watched namespace.
"""

from __future__ import annotations

NAMESPACED_RULES: list[tuple[str, str, tuple[str, ...]]] = [
    # kopf watches the two kinds and patches them (finalizer, its annotations); the handlers patch their status.
    ("pitlab.io", "pittrainings", ("get", "list", "watch", "patch")),
    ("pitlab.io", "leakageevals", ("get", "list", "watch", "patch", "create")),  # create: a PitTraining's evaluations
    ("pitlab.io", "pittrainings/status", ("patch",)),
    ("pitlab.io", "leakageevals/status", ("patch",)),
    # Children carry blockOwnerDeletion owner references, which needs update on the owner's finalizers.
    ("pitlab.io", "pittrainings/finalizers", ("update",)),
    ("pitlab.io", "leakageevals/finalizers", ("update",)),
    ("", "configmaps", ("get", "create")),
    ("batch", "jobs", ("get", "create")),
    ("kubeflow.org", "pytorchjobs", ("get", "create")),  # the training backends (pitlab.operator.backends)
    ("trainer.kubeflow.org", "trainjobs", ("get", "create")),
    ("jobset.x-k8s.io", "jobsets", ("get", "create")),
    ("", "pods", ("list",)),  # termination messages of Job pods; pods that cannot start (a PyTorchJob's by label)
    ("", "pods/log", ("get",)),  # the training master's progress sidecar
    # kopf posts warnings and errors as events; a Job without a pod: the Job controller's FailedCreate
    ("", "events", ("create", "list")),
]

CLUSTER_RULES: list[tuple[str, str, tuple[str, ...]]] = [
    ("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch")),  # kopf's resource discovery
    # backend auto: a TrainJob only where its ClusterTrainingRuntime exists (pitlab.operator.backends.choose)
    ("trainer.kubeflow.org", "clustertrainingruntimes", ("get",)),
]

# Checked by the API server when children are created, never requested by the operator itself.
IMPLIED = {("pitlab.io", "pittrainings/finalizers", "update"), ("pitlab.io", "leakageevals/finalizers", "update")}


def triples(rules: list[tuple[str, str, tuple[str, ...]]]) -> set[tuple[str, str, str]]:
    """Rules as a set of ``(apiGroup, resource, verb)``."""
    return {(g, r, v) for g, r, verbs in rules for v in verbs}
