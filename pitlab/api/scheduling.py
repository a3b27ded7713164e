"""Pod placement shared by ``PitTraining.spec.resources`` and ``LeakageEval.spec.resources``.

One model, inherited by both resources blocks, so the two kinds accept the same fields with the same schema.
Which Jobs of each kind receive them is written in the field descriptions below.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pitlab.api.base import SpecModel


class PodScheduling(SpecModel):
    """``nodeSelector``, ``tolerations`` and the Kueue ``queueName`` of the GPU Jobs the operator creates."""

    node_selector: dict[str, str] = Field(default_factory=dict, description=(
        "pod nodeSelector. PitTraining: the prepare Job, the training pods and the merge Job when it "
        "requests GPUs. LeakageEval: its embedding Jobs; not the analyze Job, which runs on CPU and is sized "
        "and placed by the operator (like a CPU merge Job), so GPU-node selectors do not pin it to GPU "
        "nodes. An evaluation created by a PitTraining (spec.evaluations[]) that requests GPUs "
        "(resources.gpus > 0) inherits the training's value unless it sets the field itself (an explicit "
        "{} opts out)"))
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description=(
        "pod tolerations (Kubernetes Toleration objects, e.g. {key: nvidia.com/gpu, operator: Exists, "
        "effect: NoSchedule}); given to the same Jobs as nodeSelector, and inherited by an evaluation the "
        "same way (an explicit [] opts out)"))
    queue_name: str | None = Field(None, description=(
        "Kueue LocalQueue: set as the kueue.x-k8s.io/queue-name label on the training child (TrainJob, JobSet or "
        "PyTorchJob), on the merge Job when it requests GPUs, and on a LeakageEval's embedding Jobs (object "
        "metadata only, not the pods; Kueue suspends the Job at creation and admits it against the queue's "
        "quota). The CPU analyze Job "
        "gets none. Inherited by an evaluation like nodeSelector"))
