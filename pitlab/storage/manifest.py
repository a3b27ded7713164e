"""Published directories: ``MANIFEST.json`` (size and sha256 of every file) then ``_COMPLETE``, written last.

A directory (a checkpoint step, a merged model) counts as published only when ``_COMPLETE`` exists and
names the sha256 of the ``MANIFEST.json`` next to it. Writers upload every file first, then the manifest,
then the marker (each a single atomic PUT or rename); readers refuse a directory without the marker and
verify each file's sha256 against the manifest. Re-publishing deletes the marker before anything else.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from pitlab.storage import ops
from pitlab.storage.errors import ChecksumMismatch, NotPublished, ObjectNotFound, StorageError
from pitlab.storage.ops import FileEntry
from pitlab.storage.uri import join

MANIFEST = "MANIFEST.json"
COMPLETE = "_COMPLETE"
MARKERS = frozenset({MANIFEST, COMPLETE})


@dataclass(frozen=True)
class Manifest:
    """The files of a published directory (relative ``/`` names → size in bytes, sha256) and ``extra``
    metadata the writer recorded (e.g. the training step)."""

    files: dict[str, FileEntry]
    extra: dict = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {"version": 1, "files": {k: self.files[k].to_dict() for k in sorted(self.files)},
               "extra": self.extra}
        return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()

    @property
    def digest(self) -> str:
        """sha256 of the manifest's JSON (what ``_COMPLETE`` records)."""
        return hashlib.sha256(self.to_json()).hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files.values())

    @classmethod
    def from_json(cls, data: bytes, source: str) -> "Manifest":
        """Parse ``MANIFEST.json``; raises :class:`StorageError` naming ``source`` when it is malformed."""
        try:
            doc = json.loads(data)
            files = {k: FileEntry(int(v["size"]), str(v["sha256"])) for k, v in doc["files"].items()}
            return cls(files, dict(doc.get("extra") or {}))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise StorageError(f"{source}: not a pitlab manifest ({type(err).__name__}: {err})") from None


def publish(uri: ops.Location, files: dict[str, FileEntry], extra: dict | None = None) -> Manifest:
    """Write ``MANIFEST.json`` for ``files`` (already uploaded under ``uri``), then ``_COMPLETE`` holding the
    manifest's sha256. Call only after every file landed. Returns the manifest. Raises
    :class:`StorageError` naming a marker that cannot be written, or ``ValueError`` for a marker's name in
    ``files``."""
    bad = MARKERS & set(files)
    if bad:
        raise ValueError(f"{sorted(bad)}: reserved names cannot be published as files")
    m = Manifest(dict(files), dict(extra or {}))
    ops.write_bytes(join(uri, MANIFEST), m.to_json())
    ops.write_text(join(uri, COMPLETE), json.dumps({"manifest_sha256": m.digest, "files": len(m.files),
                                                    "bytes": m.total_bytes}) + "\n")
    return m


def unpublish(uri: ops.Location) -> None:
    """Remove ``_COMPLETE`` then ``MANIFEST.json`` (before a directory is rewritten, so that no reader takes
    the mix of old and new files for a published directory)."""
    ops.delete(join(uri, COMPLETE))
    ops.delete(join(uri, MANIFEST))


def is_published(uri: ops.Location) -> bool:
    """True when ``uri/_COMPLETE`` exists (S3: one HEAD request)."""
    return ops.exists(join(uri, COMPLETE))


def read_manifest(uri: ops.Location) -> Manifest:
    """The manifest of a published directory.

    Raises :class:`NotPublished` when ``_COMPLETE`` is missing (the writer has not finished or failed),
    :class:`ChecksumMismatch` when ``MANIFEST.json`` is not the one ``_COMPLETE`` names, or
    :class:`StorageError` for access problems.
    """
    try:
        marker = json.loads(ops.read_text(join(uri, COMPLETE)))
    except ObjectNotFound:
        raise NotPublished(f"{uri}: not published (no {COMPLETE} marker): its writer has not finished or "
                           "failed; it is never read") from None
    except ValueError as err:
        raise StorageError(f"{join(uri, COMPLETE)}: unreadable marker ({err})") from None
    data = ops.read_bytes(join(uri, MANIFEST))
    got = hashlib.sha256(data).hexdigest()
    if got != marker.get("manifest_sha256"):
        raise ChecksumMismatch(str(join(uri, MANIFEST)), str(marker.get("manifest_sha256")), got)
    return Manifest.from_json(data, str(join(uri, MANIFEST)))
