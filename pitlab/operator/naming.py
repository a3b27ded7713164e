"""Deterministic names and labels of the objects the operator creates.

A restarted operator finds its children by name (never by listing and guessing), so every name is a pure
function of the parent's name (and, for per-model Jobs, the model's name). Names that would be too long or
that are not valid DNS labels are shortened or rewritten with a short hash of the original, which keeps
them unique and stable.
"""

from __future__ import annotations

import hashlib
import re

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

DNS_LABEL_MAX = 63
# A PyTorchJob's pods and Services are named <job>-worker-<index>; keep room for that suffix.
PYTORCHJOB_NAME_MAX = DNS_LABEL_MAX - len("-worker-") - 4
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def short_hash(text: str, n: int = 5) -> str:
    """First ``n`` hex digits of sha256(text): a stable disambiguator."""
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def dns_label(text: str, max_len: int = DNS_LABEL_MAX, dns1035: bool = False, key: str | None = None) -> str:
    """``text`` as a DNS-1123 label (DNS-1035 when ``dns1035``: starts with a letter), at most ``max_len`` long.

    Valid, short-enough text is returned unchanged; otherwise it is lowercased, invalid characters become
    ``-``, and a 5-digit hash of ``key`` (default: the original text) is appended so that distinct inputs stay
    distinct.
    """
    ok = re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", text) and len(text) <= max_len
    if ok and not (dns1035 and not text[0].isalpha()):
        return text
    base = _NOT_DNS.sub("-", text.lower()).strip("-") or "x"
    if dns1035 and not base[0].isalpha():
        base = "p" + base
    suffix = "-" + short_hash(text if key is None else key)
    return base[: max_len - len(suffix)].rstrip("-") + suffix


def child_name(parent: str, suffix: str, max_len: int = DNS_LABEL_MAX, dns1035: bool = False) -> str:
    """``<parent>-<suffix>``, shortened with a hash of the parent's name when longer than ``max_len``."""
    full = f"{parent}-{suffix}"
    if len(full) <= max_len and not (dns1035 and not full[0].isalpha()):
        return full
    head = parent if parent[0].isalpha() or not dns1035 else "p" + parent
    tail = f"-{short_hash(parent)}-{suffix}"
    return head[: max_len - len(tail)].rstrip("-") + tail


# PitTraining children
def training_spec_configmap(parent: str) -> str:
    """ConfigMap holding the resolved PitTraining (``spec.yaml``)."""
    return child_name(parent, "pit-spec")


def prepare_job(parent: str) -> str:
    """The prepare Job (corpus filter, tokenizer, base model, packed tokens)."""
    return child_name(parent, "prepare")


def pytorchjob(parent: str) -> str:
    """The PyTorchJob (a DNS-1035 name short enough for ``<job>-worker-<i>`` pods and Services)."""
    return child_name(parent, "train", PYTORCHJOB_NAME_MAX, dns1035=True)


def master_pod(parent: str) -> str:
    """The PyTorchJob's master pod, named ``<job>-master-0`` by the Kubeflow training operator."""
    return f"{pytorchjob(parent)}-master-0"


def merge_job(parent: str) -> str:
    """The single-pod merge Job."""
    return child_name(parent, "merge")


def evaluation(parent: str, evaluation: str) -> str:
    """The LeakageEval child of PitTraining ``parent`` for its ``spec.evaluations[].name`` ``evaluation``:
    ``<parent>-<evaluation>``, or ``evaluation`` itself when it already starts with ``<parent>-`` (so
    ``fomc-2016`` + ``fomc-2016-leakage`` stays ``fomc-2016-leakage``). Two PitTrainings of one namespace with
    the same evaluation name get distinct children. Longer than 63 characters (or not a DNS label): cut,
    with a 5-digit hash of ``parent/evaluation`` appended."""
    full = evaluation if evaluation.startswith(parent + "-") else f"{parent}-{evaluation}"
    return dns_label(full, key=f"{parent}/{evaluation}")


# LeakageEval children
def eval_spec_configmap(parent: str) -> str:
    """ConfigMap holding the resolved LeakageEval (``leakageeval.yaml``)."""
    return child_name(parent, "eval-spec")


def embed_job(parent: str, model: str) -> str:
    """The embedding Job of one model."""
    return child_name(parent, "embed-" + dns_label(model, 30))


def embed_indexed_job(parent: str) -> str:
    """The indexed embedding Job used for large model panels (one completion index per model)."""
    return child_name(parent, "embed")


def analyze_job(parent: str) -> str:
    """The analysis Job (protocols, bootstrap, report)."""
    return child_name(parent, "analyze")


def labels(parent_kind: str, parent: str, component: str, **extra: str) -> dict[str, str]:
    """The ``app.kubernetes.io/*`` labels of a child (plus ``pitlab.io/owner-kind`` and ``extra``)."""
    out = {
        NAME_KEY: "pitlab",
        INSTANCE_KEY: dns_label(parent),
        COMPONENT_KEY: component,
        PART_OF_KEY: PART_OF,
        MANAGED_BY_KEY: MANAGED_BY,
        OWNER_KIND_KEY: parent_kind.lower(),
    }
    out.update(extra)
    return out
