"""Pod placement shared by ``PitTraining.spec.resources`` and ``LeakageEval.spec.resources``.

One model, inherited by both resources blocks, so the two kinds accept the same fields with the same schema.
Which Jobs of each kind receive them is written in the field descriptions below.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from pitlab.api.base import SpecModel

_QUANTITY = re.compile(r"\+?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def check_quantity(value: str | None) -> str | None:
    """A Kubernetes resource quantity (``64``, ``500m``, ``900Gi``, ``1e3``), else ValueError: the API server
    would refuse the child that carries it only after the run's first Jobs exist."""
    if value is not None and not _QUANTITY.fullmatch(value):
        raise ValueError("not a Kubernetes quantity (a number with an optional suffix: 500m, 64, "
                         "256Gi, 900G; GB, MB and spaces are not suffixes)")
    return value


def check_label_value(value: str | None) -> str | None:
    """A value the ``kueue.x-k8s.io/queue-name`` label can hold (at most 63 characters, alphanumerics with ``-``,
    ``_`` and ``.`` inside), else ValueError."""
    if value is not None and label_value_problem(value):
        raise ValueError("cannot be a Kubernetes label value (the kueue.x-k8s.io/queue-name label): at "
                         "most 63 characters, letters, digits, '-', '_' and '.', starting and ending with a letter "
                         "or digit; a LocalQueue's name")
    return value


_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_RULES = ("a label key is [prefix/]name: name at most 63 characters, letters, digits, '-', '_' and '.', "
                "starting and ending with a letter or digit; prefix a lowercase DNS subdomain of at most 253")
_VALUE_RULES = "at most 63 characters, letters, digits, '-', '_' and '.', starting and ending with a letter or digit"


def label_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a Kubernetes label key (a qualified name, as the API server checks nodeSelector keys
    and toleration keys), or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"{key!r} is not a label key ({_LABEL_RULES})"
    if len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        return f"{key!r} is not a label key ({_LABEL_RULES})"
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be a Kubernetes label value (empty, or as :data:`_VALUE_RULES` say), or None."""
    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        return f"{value!r} is not a label value ({_VALUE_RULES})"
    return None


def check_node_selector(selector: dict[str, str]) -> dict[str, str]:
    """A nodeSelector the API server accepts (label keys and values), else ValueError naming the entry: a child
    carrying a bad one is refused with 422 when it is created, for an evaluation hours into the run."""
    for key, value in selector.items():
        problem = label_key_problem(key) or label_value_problem(value)
        if problem:
            raise ValueError(f"entry {key}: {problem}")
    return selector


class Toleration(SpecModel):
    """A Kubernetes Toleration (core/v1), checked as the API server checks it when the spec is read."""

    key: str | None = Field(None, description="the taint key to match; empty with operator Exists matches every taint")
    operator: Literal["Exists", "Equal"] | None = Field(None, description="Exists or Equal (the default)")
    value: str | None = Field(None, description="the taint value to match (operator Equal only)")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""] | None = Field(
        None, description="the taint effect to match; empty matches every effect")
    toleration_seconds: int | None = Field(None, description=(
        "NoExecute only: how long the pod stays bound after the taint appears (seconds)"))

    @model_validator(mode="after")
    def _api_rules(self) -> "Toleration":
        if self.key:
            problem = label_key_problem(self.key)
            if problem:
                raise ValueError(f"key {problem}")
        if self.value:
            problem = label_value_problem(self.value)
            if problem:
                raise ValueError(f"value {problem}")
        if self.operator == "Exists" and self.value:
            raise ValueError(f"operator Exists takes no value (got value {self.value!r})")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key needs operator: Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect: NoExecute")
        return self


INHERITED = ("node_selector", "tolerations", "queue_name")
"""The :class:`PodScheduling` fields an evaluation template (``PitTraining.spec.evaluations[].spec.resources``)
inherits from the training when it leaves them unset (an explicit empty value opts out)."""


Quantity = Annotated[str, AfterValidator(check_quantity)]
"""``cpu`` and ``memory`` of a resources block: checked as Kubernetes quantities when the spec is read."""


class PodScheduling(SpecModel):
    """``nodeSelector``, ``tolerations`` and the Kueue ``queueName`` of the GPU Jobs the operator creates."""

    node_selector: Annotated[dict[str, str], AfterValidator(check_node_selector)] = Field(default_factory=dict, description=(
        "pod nodeSelector. PitTraining: the prepare Job, the training pods and the merge Job when it "
        "requests GPUs. LeakageEval: its embedding Jobs; not the analyze Job, which runs on CPU and is sized "
        "and placed by the operator (like a CPU merge Job), so GPU-node selectors do not pin it to GPU "
        "nodes. An evaluation created by a PitTraining (spec.evaluations[]) that requests GPUs "
        "(resources.gpus > 0) inherits the training's value unless it sets the field itself (an explicit "
        "{} opts out)"))
    tolerations: list[Toleration] = Field(default_factory=list, description=(
        "pod tolerations (Kubernetes Toleration objects, e.g. {key: nvidia.com/gpu, operator: Exists, "
        "effect: NoSchedule}); given to the same Jobs as nodeSelector, and inherited by an evaluation the "
        "same way (an explicit [] opts out)"))
    queue_name: Annotated[str, AfterValidator(check_label_value)] | None = Field(None, description=(
        "Kueue LocalQueue: set as the kueue.x-k8s.io/queue-name label on the training child (TrainJob, JobSet or "
        "PyTorchJob), on the merge Job when it requests GPUs, and on a LeakageEval's embedding Jobs (object "
        "metadata only, not the pods; Kueue suspends the Job at creation and admits it against the queue's "
        "quota). The CPU analyze Job "
        "gets none. Inherited by an evaluation like nodeSelector"))
    def placement(self) -> dict:
        """The pod spec fields these settings give a pod: ``nodeSelector`` and ``tolerations``, each only when
        set (the queue is a label on the Job, not a pod field)."""
        out: dict = {}
        if self.node_selector:
            out["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            out["tolerations"] = [t.to_yaml_dict() for t in self.tolerations]
        return out
