"""Deterministic names and labels of the objects the operator creates.

A restarted operator finds its children by name (never by listing and guessing), so every name is a pure
function of the parent's name (and, for per-model Jobs, the model's name). The parent may have any name the
API server accepts (a DNS-1123 subdomain of up to 253 characters: ``qwen3.5-pit``, ``2016-fomc``); every
child name comes from :func:`derive`, which returns ``<parent>-<suffix>`` unchanged when that is valid for the
child's kind, and otherwise a rewritten, shortened name with a hash of the original (see its docstring).
"""

from __future__ import annotations

import hashlib
import re

from pitlab.api.names import LABEL_MAX, is_label

MANAGED_BY = "pitlab-operator"
PART_OF = "pitlab"
# Label keys
NAME_KEY = "app.kubernetes.io/name"
INSTANCE_KEY = "app.kubernetes.io/instance"
COMPONENT_KEY = "app.kubernetes.io/component"
MANAGED_BY_KEY = "app.kubernetes.io/managed-by"
PART_OF_KEY = "app.kubernetes.io/part-of"
OWNER_KIND_KEY = "pitlab.io/owner-kind"
MODEL_KEY = "pitlab.io/model"
KUEUE_QUEUE_KEY = "kueue.x-k8s.io/queue-name"
PYTORCHJOB_NAME_KEY = "training.kubeflow.org/job-name"  # the training operator's label on a PyTorchJob's pods
# Resource keys of the cluster view (group/version/plural), as :class:`pitlab.operator.kube.Kube` takes them
CONFIGMAPS = "v1/configmaps"
JOBS = "batch/v1/jobs"
PYTORCHJOBS = "kubeflow.org/v1/pytorchjobs"
TRAINJOBS = "trainer.kubeflow.org/v1alpha1/trainjobs"
JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"
CLUSTERTRAININGRUNTIMES = "trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"  # cluster-scoped: read only
PITTRAININGS = "pitlab.io/v1alpha1/pittrainings"
LEAKAGEEVALS = "pitlab.io/v1alpha1/leakageevals"
RESOURCE_OF_KIND = {"ConfigMap": CONFIGMAPS, "Job": JOBS, "PyTorchJob": PYTORCHJOBS, "TrainJob": TRAINJOBS,
                    "JobSet": JOBSETS, "LeakageEval": LEAKAGEEVALS}

DNS_LABEL_MAX = LABEL_MAX
HASH_DIGITS = 8  # 32 bits: two rewritten names that share their kept prefix collide with probability 2**-32
# A PyTorchJob's pods and Services are named <job>-worker-<index>; keep room for indices up to 9999.
PYTORCHJOB_ROOM = len("-worker-") + 4
PYTORCHJOB_NAME_MAX = DNS_LABEL_MAX - PYTORCHJOB_ROOM
# A TrainJob's or JobSet's Jobs are named <name>-node-0 and their pods' hostnames <name>-node-0-<index>: the same room.
NODE_JOB = "node"  # the replicated job (and the TrainJob's trainer container) of both
JOBSET_ROOM = len(f"-{NODE_JOB}-0-") + 4
assert JOBSET_ROOM <= PYTORCHJOB_ROOM  # one training name fits all three backends
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def short_hash(text: str, n: int = HASH_DIGITS) -> str:
    """First ``n`` hex digits of sha256(text): a stable disambiguator."""
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def derive(parent: str, suffix: str = "", room: int = 0, dns1035: bool = False, key: str | None = None) -> str:
    """The name of a child of ``parent``: a DNS-1123 label (DNS-1035 when ``dns1035``: starting with a letter)
    of at most ``63 - room`` characters, so that names the child's controller builds from it (``room``
    characters more: a pod hostname ``<job>-<index>``, a Service ``<job>-worker-<index>``) are labels too.

    ``<parent>-<suffix>`` (``parent`` alone when ``suffix`` is empty) when that is already such a label.
    Otherwise the parent is lowercased, every run of characters other than ``a-z0-9-`` (a ``.``) becomes
    ``-``, a name starting with a digit gets a ``p`` in front when ``dns1035``, and it is cut to fit before
    ``-<hash>-<suffix>``, where ``<hash>`` is 8 hex digits of sha256(``key``, default ``parent``). The result
    is deterministic, and two parents that differ give different children unless their hashes collide
    (probability 2**-32). Raises ValueError when ``suffix`` leaves no room for the parent.
    """
    full = f"{parent}-{suffix}" if suffix else parent
    max_len = DNS_LABEL_MAX - room
    if is_label(full, dns1035) and len(full) <= max_len:
        return full
    head = _NOT_DNS.sub("-", parent.lower()).strip("-") or "x"
    if dns1035 and not head[0].isalpha():
        head = "p" + head
    tail = f"-{short_hash(parent if key is None else key)}" + (f"-{suffix}" if suffix else "")
    if max_len - len(tail) < 1:
        raise ValueError(f"no room for a name of {parent!r} with suffix {suffix!r} in {max_len} characters")
    return head[: max_len - len(tail)].rstrip("-") + tail


def dns_label(text: str, max_len: int = DNS_LABEL_MAX) -> str:
    """``text`` as a DNS-1123 label of at most ``max_len`` characters: :func:`derive` without a suffix."""
    return derive(text, "", DNS_LABEL_MAX - max_len)


def label_value(text: str) -> str:
    """``text`` as a label value: unchanged up to 63 characters (every resource name that short is a valid
    label value, dots included), else :func:`dns_label`."""
    return text if len(text) <= DNS_LABEL_MAX else dns_label(text)


# PitTraining children
def training_spec_configmap(parent: str) -> str:
    """ConfigMap holding the resolved PitTraining (``spec.yaml``)."""
    return derive(parent, "pit-spec")


def prepare_job(parent: str) -> str:
    """The prepare Job (corpus filter, tokenizer, base model, packed tokens)."""
    return derive(parent, "prepare")


def pytorchjob(parent: str) -> str:
    """The PyTorchJob: a DNS-1035 label (the training operator's rule) short enough that its replicas' pods
    and Services ``<job>-master-0`` and ``<job>-worker-<i>`` (i ≤ 9999) are DNS-1035 labels too."""
    return derive(parent, "train", PYTORCHJOB_ROOM, dns1035=True)


def training_job(parent: str) -> str:
    """The training child, whatever its backend (PyTorchJob, TrainJob or JobSet): :func:`pytorchjob`'s name, a
    DNS-1035 label (a TrainJob's CEL rule) short enough for the Jobs ``<name>-node-0`` and the hostnames
    ``<name>-node-0-<i>`` (i ≤ 9999) of a TrainJob's or JobSet's pods."""
    return pytorchjob(parent)


def node_job(parent: str) -> str:
    """The Job of a TrainJob's or JobSet's replicated job ``node`` (one pod per node): ``<name>-node-0``."""
    return f"{training_job(parent)}-{NODE_JOB}-0"


def jobset_master(parent: str) -> str:
    """Where a JobSet's ranks meet: the pod of completion index 0, ``<name>-node-0-0.<name>`` (its hostname under
    the JobSet's headless Service, named like the JobSet)."""
    name = training_job(parent)
    return f"{node_job(parent)}-0.{name}"


def pytorchjob_pods(parent: str) -> str:
    """The label selector of the PyTorchJob's pods (master and workers), set by the Kubeflow training operator."""
    return f"{PYTORCHJOB_NAME_KEY}={pytorchjob(parent)}"


def master_pod(parent: str) -> str:
    """The PyTorchJob's master pod, named ``<job>-master-0`` by the Kubeflow training operator."""
    return f"{pytorchjob(parent)}-master-0"


def worker_pod(parent: str, index: int) -> str:
    """The PyTorchJob's worker pod (and Service) ``index``, named ``<job>-worker-<index>``."""
    return f"{pytorchjob(parent)}-worker-{index}"


def merge_job(parent: str) -> str:
    """The single-pod merge Job."""
    return derive(parent, "merge")


def evaluation(parent: str, evaluation: str) -> str:
    """The LeakageEval child of PitTraining ``parent`` for its ``spec.evaluations[].name`` ``evaluation``:
    ``<parent>-<evaluation>``, or ``evaluation`` itself when it already starts with ``<parent>-`` (so
    ``fomc-2016`` + ``fomc-2016-leakage`` stays ``fomc-2016-leakage``). Two PitTrainings of one namespace with
    the same evaluation name get distinct children. Longer than 63 characters or not a DNS label (a dotted
    parent): rewritten by :func:`derive` with the hash of ``parent/evaluation``."""
    full = evaluation if evaluation.startswith(parent + "-") else f"{parent}-{evaluation}"
    return derive(full, key=f"{parent}/{evaluation}")


# LeakageEval children
def eval_spec_configmap(parent: str) -> str:
    """ConfigMap holding the resolved LeakageEval (``leakageeval.yaml``)."""
    return derive(parent, "eval-spec")


def embed_job(parent: str, model: str) -> str:
    """The embedding Job of one model (``spec.models[].name``, itself made a label of at most 30 characters)."""
    return derive(parent, "embed-" + dns_label(model, 30))


def embed_indexed_job(parent: str, completions: int) -> str:
    """The indexed embedding Job used for large model panels (one completion index per model, ``completions``
    models): short enough that the hostname of its last pod, ``<job>-<completions - 1>``, is a label."""
    return derive(parent, "embed", len(f"-{completions - 1}"))


def analyze_job(parent: str) -> str:
    """The analysis Job (protocols, bootstrap, report)."""
    return derive(parent, "analyze")


def labels(parent_kind: str, parent: str, component: str, **extra: str) -> dict[str, str]:
    """The ``app.kubernetes.io/*`` labels of a child (plus ``pitlab.io/owner-kind`` and ``extra``)."""
    out = {
        NAME_KEY: "pitlab",
        INSTANCE_KEY: label_value(parent),
        COMPONENT_KEY: component,
        PART_OF_KEY: PART_OF,
        MANAGED_BY_KEY: MANAGED_BY,
        OWNER_KIND_KEY: parent_kind.lower(),
    }
    out.update(extra)
    return out
