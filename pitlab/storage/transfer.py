"""Directories between local disk and storage: upload and publish, download and verify, and
:func:`localize` (a local, verified copy of any input, cached by content)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from pitlab.storage import ops, outdir, s3
from pitlab.storage.errors import NotPublished, ObjectNotFound, StorageError
from pitlab.storage.manifest import COMPLETE, MANIFEST, MARKERS, Manifest, publish, read_manifest, unpublish
from pitlab.storage.ops import FileEntry
from pitlab.storage.uri import basename, is_s3, join, parse_s3

CACHE_ENV = "PITLAB_CACHE_DIR"


def cache_root() -> Path:
    """Where :func:`localize` keeps downloads: ``$PITLAB_CACHE_DIR/storage``, default
    ``~/.cache/pitlab/storage``."""
    base = os.environ.get(CACHE_ENV)
    return (Path(base) if base else Path.home() / ".cache" / "pitlab") / "storage"


def upload_files(files: dict[str, Path], uri: ops.Location, part_size: int | None = None,
                 concurrency: int | None = None) -> dict[str, FileEntry]:
    """Upload local files to ``uri/<name>`` (one after the other, each multipart in parallel parts);
    returns name → size and sha256. Nothing is published. Raises :class:`StorageError`."""
    return {name: ops.upload_file(path, join(uri, name), part_size=part_size, concurrency=concurrency)
            for name, path in sorted(files.items())}


def upload_dir(local_dir: str | os.PathLike, uri: ops.Location, extra: dict | None = None,
               part_size: int | None = None, concurrency: int | None = None) -> Manifest:
    """Publish the local directory ``local_dir`` at ``uri``: unpublish what is there, upload every file
    (recursively; ``MANIFEST.json``/``_COMPLETE`` of the source are skipped), then write the manifest and
    ``_COMPLETE`` last. Files already at ``uri`` that ``local_dir`` lacks are deleted before publishing.

    A local ``uri`` gets the same layout, written aside and renamed into place whole (an existing folder is
    replaced only then: :func:`pitlab.storage.outdir.swap_in`). Callers that must not replace content they did
    not write check first (:func:`pitlab.storage.outdir.check_output`). Returns the manifest. Raises
    :class:`StorageError`; after a failure an S3 ``uri`` has no ``_COMPLETE`` and is never read, a local one is
    as it was.
    """
    root = Path(local_dir)
    if not root.is_dir():
        raise StorageError(f"{root}: not a directory")
    files = {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}
    files = {k: v for k, v in files.items() if k not in MARKERS}
    if not is_s3(uri):
        dest = Path(uri)
        d, r = dest.resolve(), root.resolve()
        if d.is_relative_to(r) or r.is_relative_to(d):
            raise StorageError(f"{dest}: the destination and the source folder {root} contain one another")
        try:
            tmp = outdir.aside(dest)
        except OSError as err:
            raise StorageError(f"{dest}: cannot create a folder beside it ({err.strerror})") from None
        try:
            m = publish(tmp, upload_files(files, tmp, part_size, concurrency), extra)
            outdir.swap_in(tmp, dest)
        except OSError as err:
            raise StorageError(f"{dest}: cannot put the published folder in place ({err.strerror})") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return m
    unpublish(uri)
    for stale in set(ops.list_files(uri)) - set(files) - MARKERS:
        ops.delete(join(uri, stale))
    entries = upload_files(files, uri, part_size, concurrency)
    return publish(uri, entries, extra)


def download_dir(uri: ops.Location, local_dir: str | os.PathLike) -> Manifest:
    """Download the published directory ``uri`` into ``local_dir`` (created; must not exist), verifying every
    file's sha256 against the manifest, and copy the markers last. Files land in a temporary sibling
    directory that is renamed to ``local_dir`` only when all of them verified.

    Raises :class:`NotPublished` (no ``_COMPLETE``), :class:`ChecksumMismatch` naming the object and both
    digests, or :class:`StorageError`.
    """
    dst = Path(local_dir)
    manifest = read_manifest(uri)
    tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        for name, entry in sorted(manifest.files.items()):
            ops.download_file(join(uri, name), tmp / name, expected_sha256=entry.sha256)
        (tmp / MANIFEST).write_bytes(manifest.to_json())
        (tmp / COMPLETE).write_text(json.dumps({"source": str(uri), "manifest_sha256": manifest.digest}) + "\n")
        os.rename(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _s3_listing(uri: str) -> dict[str, tuple[int, str]]:
    url = parse_s3(uri)
    c, st = s3.client()
    out = {}
    try:
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=url.bucket, Prefix=url.prefix):
            for obj in page.get("Contents", []):
                out[obj["Key"][len(url.prefix):]] = (int(obj["Size"]), str(obj.get("ETag", "")))
    except Exception as err:  # noqa: BLE001
        raise s3.translate(err, url, "list", st) from None
    return dict(sorted(out.items()))


def _install(tmp: Path, dst: Path) -> Path:
    """Rename ``tmp`` to ``dst``; when another process got there first, keep its copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, dst)
    except OSError:
        if not dst.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def localize(uri: ops.Location, cache_dir: str | os.PathLike | None = None, require_published: bool = True) -> Path:
    """A local path holding the content of ``uri``: the path itself when it is local; for ``s3://`` a
    verified copy in the cache (``cache_dir``, default :func:`cache_root`), reused while the source is
    unchanged:

    - a published directory (``uri/_COMPLETE``): downloaded and verified against its manifest; cached by the
      manifest's sha256;
    - a single object at ``uri``: downloaded, verified against its ``x-amz-meta-sha256`` when present;
      cached by URI, size and ETag;
    - an unpublished prefix (e.g. a data set copied with ``aws s3 sync``): only when
      ``require_published=False``; every object downloaded; cached by the listing (names, sizes, ETags).

    Raises :class:`NotPublished` for an unpublished prefix when ``require_published``,
    :class:`ObjectNotFound` when nothing exists at ``uri``, :class:`ChecksumMismatch`, or
    :class:`StorageError` (bucket, credentials, endpoint).
    """
    if not is_s3(uri):
        return Path(uri)
    uri = str(uri).rstrip("/")
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    root.mkdir(parents=True, exist_ok=True)
    url = parse_s3(uri)
    # credentials, endpoint, bucket errors name what the user asked for, not the marker
    published = bool(url.key) and ops.exists(join(uri, COMPLETE), op="read", subject=uri)
    if published:
        digest = json.loads(ops.read_text(join(uri, COMPLETE))).get("manifest_sha256", "")
        dst = root / "dirs" / digest[:40]
        if (dst / COMPLETE).is_file():
            return dst
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=".dl-")) / "d"
        try:
            download_dir(uri, tmp)
            return _install(tmp, dst)
        finally:
            shutil.rmtree(tmp.parent, ignore_errors=True)
    c, st = s3.client()
    head = None
    if url.key:
        from botocore.exceptions import ClientError

        try:
            head = c.head_object(Bucket=url.bucket, Key=url.key)
        except ClientError as err:
            if str(err.response.get("Error", {}).get("Code")) not in ("404", "NoSuchKey", "NotFound"):
                raise s3.translate(err, url, "read", st) from None
        except Exception as err:  # noqa: BLE001
            raise s3.translate(err, url, "read", st) from None
    if head is not None:
        key = hashlib.sha256(f"{uri}\n{head.get('ContentLength')}\n{head.get('ETag')}".encode()).hexdigest()[:40]
        dst = root / "files" / key / basename(uri)
        if dst.is_file():
            return dst
        ops.download_file(uri, dst)
        return dst
    listing = _s3_listing(uri)
    if not listing:
        if s3.bucket_missing(url):
            raise StorageError(f"read {uri}: bucket {url.bucket!r} does not exist at {st.endpoint}")
        raise ObjectNotFound(f"read {uri}: no such object or prefix (bucket {url.bucket!r} at {st.endpoint})")
    if require_published:
        raise NotPublished(f"{uri}: not published (no {COMPLETE} marker): its writer has not finished or failed; "
                           f"publish a folder with `pitlab push DIR {uri}`")
    key = hashlib.sha256(json.dumps([uri, listing]).encode()).hexdigest()[:40]
    dst = root / "prefixes" / key
    if dst.is_dir():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=".dl-"))
    try:
        for name in listing:
            ops.download_file(join(uri, name), tmp / name)
        return _install(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["CACHE_ENV", "cache_root", "download_dir", "localize", "upload_dir", "upload_files"]
