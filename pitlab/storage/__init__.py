"""One storage interface over local paths and ``s3://bucket/prefix`` (boto3; AWS S3, MinIO, Ceph RGW).

- :mod:`~pitlab.storage.ops`: ``exists``, ``read_bytes``/``read_text``, ``open_read``, ``write_bytes``/
  ``write_text`` (atomic), ``list_files``, ``delete``/``delete_tree``, ``move_tree``, ``upload_file``/``download_file``
  (multipart, parallel parts, retries with backoff, sha256 recorded and verified);
- :mod:`~pitlab.storage.manifest`: published directories (``MANIFEST.json`` with every file's sha256, then
  ``_COMPLETE`` written last; readers refuse a directory without it);
- :mod:`~pitlab.storage.transfer`: ``upload_dir`` (publish), ``download_dir`` (verify), ``localize`` (a
  verified local copy of any input, cached by content);
- :mod:`~pitlab.storage.s3`: the client and its settings (environment variables, see there), and error
  translation into :class:`StorageError` with clear messages.
"""

from pitlab.storage.errors import ChecksumMismatch, NotPublished, ObjectNotFound, StorageError
from pitlab.storage.manifest import COMPLETE, MANIFEST, Manifest, is_published, publish, read_manifest, unpublish
from pitlab.storage.ops import (FileEntry, Location, delete, delete_tree, download_file, exists, file_sha256,
                                list_files, move_tree, open_read, read_bytes, read_text, upload_file, write_bytes, write_text)
from pitlab.storage.transfer import cache_root, download_dir, localize, upload_dir, upload_files
from pitlab.storage.uri import S3Url, basename, is_s3, join, parse_s3

__all__ = [
    "COMPLETE", "MANIFEST", "ChecksumMismatch", "FileEntry", "Location", "Manifest", "NotPublished",
    "ObjectNotFound", "S3Url", "StorageError", "basename", "cache_root", "delete", "delete_tree", "download_dir",
    "download_file", "exists", "file_sha256", "is_published", "is_s3", "join", "list_files", "localize",
    "move_tree", "open_read", "parse_s3", "publish", "read_bytes", "read_manifest", "read_text", "unpublish", "upload_dir",
    "upload_file", "upload_files", "write_bytes", "write_text",
]
