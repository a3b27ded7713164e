"""The subset of Kubernetes ``ObjectMeta`` pitlab reads. Server-set fields (uid, resourceVersion, ...) are kept."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ObjectMeta(BaseModel):
    """``metadata``: ``name`` is a DNS-1123 label (it names the output folder and every child object)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generation: int | None = None
