"""The one error type of :mod:`pitlab.storage` (:class:`pitlab.errors.StorageError`, a stage error), with
subclasses for the cases callers act on."""

from __future__ import annotations

from pitlab.errors import StorageError


class ObjectNotFound(StorageError):
    """The object, or every object under a prefix, does not exist (the bucket does)."""


class NotPublished(StorageError):
    """A directory has no ``_COMPLETE`` marker: it is being written, or its writer failed. Never read it."""


class ChecksumMismatch(StorageError):
    """A downloaded object's sha256 differs from the one its manifest (or its metadata) records."""

    def __init__(self, uri: str, expected: str, got: str):
        super().__init__(f"{uri}: sha256 mismatch: expected {expected}, got {got} (the object is corrupted or was "
                         "replaced after it was published)")
        self.uri, self.expected, self.got = uri, expected, got


class OutputExists(StorageError):
    """A command's output folder (or prefix) holds content the command did not create, and ``--overwrite`` was
    not given: nothing was written or deleted."""
