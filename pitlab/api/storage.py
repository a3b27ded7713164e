"""``spec.storage``: how the pods reach the object storage of ``s3://`` URIs (PitTraining and LeakageEval)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pitlab.api.base import SpecModel


def check_location(uri: str) -> str:
    """``uri`` if it can name a folder pitlab writes: a local path (``file://`` allowed) or
    ``s3://bucket/prefix`` with a valid bucket name; raises ``ValueError`` saying why not (empty, another scheme,
    a bad bucket, a NUL character). ``${VAR}`` references are expanded later and are not checked here."""
    from pitlab.storage.errors import StorageError
    from pitlab.storage.uri import parse_s3

    if not uri.strip():
        raise ValueError("is empty; give a local folder or s3://bucket/prefix")
    if "\0" in uri:
        raise ValueError(f"{uri!r} holds a NUL character")
    if uri.startswith("s3://"):
        if "${" not in uri.split("/", 3)[2]:
            try:
                parse_s3(uri)
            except StorageError as err:
                raise ValueError(str(err)) from None
        return uri
    scheme = uri.split("://", 1)[0] if "://" in uri else None
    if scheme is not None and scheme != "file" and "${" not in scheme:
        raise ValueError(f"{uri!r}: scheme {scheme}:// is not supported; give a local folder or s3://bucket/prefix")
    return uri


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
