"""Storage locations: local paths and ``s3://bucket/key`` URIs (parse, join, tell apart)."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from pitlab.storage.errors import StorageError

S3_PREFIX = "s3://"
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


def is_s3(uri: str | os.PathLike) -> bool:
    """True for an ``s3://`` URI (a ``Path`` is always local)."""
    return isinstance(uri, str) and uri.startswith(S3_PREFIX)


@dataclass(frozen=True)
class S3Url:
    """``s3://<bucket>/<key>``; ``key`` has no leading slash and may be empty (the bucket's root)."""

    bucket: str
    key: str

    def __str__(self) -> str:
        return f"{S3_PREFIX}{self.bucket}/{self.key}"

    def child(self, *parts: str) -> "S3Url":
        """The URL of ``parts`` below this one (joined with ``/``)."""
        return S3Url(self.bucket, join_key(self.key, *parts))

    @property
    def prefix(self) -> str:
        """The key as a directory prefix: ``key/`` (empty for the bucket's root)."""
        return self.key.rstrip("/") + "/" if self.key.strip("/") else ""


def join_key(*parts: str) -> str:
    """Join key parts with single ``/`` (no leading slash); ``..`` is refused to keep keys predictable."""
    out = [p.strip("/") for p in parts if p and p.strip("/")]
    key = "/".join(out)
    if any(seg == ".." for seg in key.split("/")):
        raise StorageError(f"{key!r}: '..' is not allowed in an S3 key")
    return key


def parse_s3(uri: str) -> S3Url:
    """Parse ``s3://bucket/key``. Raises :class:`StorageError` naming the URI when it is not an S3 URI or the
    bucket name is not a valid S3 bucket name (3-63 characters: lower-case letters, digits, ``.`` and ``-``)."""
    if not is_s3(uri):
        raise StorageError(f"{uri!r}: not an s3:// URI")
    bucket, _, key = uri[len(S3_PREFIX):].partition("/")
    if not _BUCKET.match(bucket):
        raise StorageError(f"{uri!r}: {bucket!r} is not a valid bucket name (3-63 characters: a-z, 0-9, '.', '-')")
    return S3Url(bucket, join_key(key) if key else "")


def join(base: str | os.PathLike, *parts: str) -> str | Path:
    """``base`` joined with ``parts``: an ``s3://`` URI string for S3, else a :class:`Path`."""
    if is_s3(base):
        return str(parse_s3(str(base)).child(*parts))
    return Path(base).joinpath(*parts)


def basename(uri: str | os.PathLike) -> str:
    """The last path component of a local path or an S3 URI (``s3://b/a/x.csv`` → ``x.csv``)."""
    return posixpath.basename(str(uri).rstrip("/"))
