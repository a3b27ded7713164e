"""``spec.storage``: how the pods reach the object storage of ``s3://`` URIs (PitTraining and LeakageEval)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pitlab.api.base import SpecModel


class StorageSpec(SpecModel):
    """Object storage for the ``s3://`` URIs of this resource (AWS S3, MinIO, Ceph RGW).

    ``secretName``: a Secret in the resource's namespace whose keys become environment variables of every
    pod the operator starts (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, optionally
    ``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL``, ...); without it the pods use their own AWS environment
    (e.g. IRSA). ``endpointUrl`` (``AWS_ENDPOINT_URL``; e.g. ``http://minio.storage:9000``), ``region``
    (``AWS_REGION``) and ``addressingStyle`` (``PITLAB_S3_ADDRESSING_STYLE``; ``path`` is the default when an
    endpoint is given) become environment variables too. ``pitlab run`` ignores ``secretName`` and reads the
    standard AWS variables and files of this machine.
    """

    secret_name: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)
    endpoint_url: str | None = Field(None, pattern=r"^https?://[^\s]+$", max_length=2048)
    region: str | None = Field(None, pattern=r"^[a-z0-9-]{2,32}$")
    addressing_style: Literal["path", "virtual", "auto"] | None = None

    def env(self) -> dict[str, str]:
        """The environment variables these settings stand for (``secretName`` excluded)."""
        out = {}
        if self.endpoint_url:
            out["AWS_ENDPOINT_URL"] = self.endpoint_url
        if self.region:
            out["AWS_REGION"] = self.region
        if self.addressing_style:
            out["PITLAB_S3_ADDRESSING_STYLE"] = self.addressing_style
        return out
