"""The subset of Kubernetes ``ObjectMeta`` pitlab reads. Server-set fields (uid, resourceVersion, ...) are kept."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pitlab.api.names import RESOURCE_NAME_RULE, resource_name_problem


class ObjectMeta(BaseModel):
    """``metadata``: ``name`` is any name the API server accepts for the resource (a DNS-1123 subdomain, e.g.
    ``qwen3.5-pit``); it names the output folder, and every child object's name is derived from it
    (:mod:`pitlab.operator.naming`)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generation: int | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        problem = resource_name_problem(v)
        if problem:
            raise ValueError(f"{problem}; {RESOURCE_NAME_RULE}")
        return v
