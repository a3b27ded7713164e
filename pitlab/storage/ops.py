"""The storage interface: the same operations on a local path and on an ``s3://`` URI.

Every function takes a location as a ``str`` (``s3://bucket/key`` or a local path) or a ``Path`` and raises
:class:`~pitlab.storage.errors.StorageError` (or a subclass) with a message naming the location; local
``OSError`` s are translated too. Writes are atomic per object: a local file is written to ``<name>.part`` and
renamed, an S3 object appears whole when its single PUT or its multipart upload completes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Union

from pitlab.storage import s3
from pitlab.storage.errors import ChecksumMismatch, ObjectNotFound, StorageError
from pitlab.storage.uri import S3Url, is_s3, join, parse_s3

Location = Union[str, os.PathLike]
HASH_BLOCK = 8 * s3.MiB  # bytes read per step when hashing a file
SHA256_METADATA = "sha256"  # user metadata (x-amz-meta-sha256) set on every object pitlab uploads


@dataclass(frozen=True)
class FileEntry:
    """One stored file: ``size`` in bytes and its hex ``sha256``."""

    size: int
    sha256: str

    def to_dict(self) -> dict:
        return {"size": self.size, "sha256": self.sha256}


def file_sha256(path: str | os.PathLike) -> FileEntry:
    """Size (bytes) and sha256 of a local file, read in 8 MiB blocks (memory stays at one block)."""
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
            n += len(block)
    return FileEntry(n, h.hexdigest())


def _local_error(err: OSError, path: Path, op: str) -> StorageError:
    if isinstance(err, FileNotFoundError):
        return ObjectNotFound(f"{op} {path}: no such file or directory")
    return StorageError(f"{op} {path}: {err.strerror or err}")


def exists(uri: Location, op: str = "check", subject: Location | None = None) -> bool:
    """True when a file (or, locally, a directory) exists at ``uri``. For S3: the object exists (HEAD).
    Raises :class:`StorageError` for a missing bucket, missing credentials or an unreachable endpoint; its
    message reads ``"<op> <subject>: ..."`` (default ``"check <uri>"``; a caller probing a marker object
    names what the user asked for instead)."""
    if not is_s3(uri):
        return Path(uri).exists()
    from botocore.exceptions import ClientError

    url = parse_s3(str(uri))
    shown = url if subject is None else parse_s3(str(subject))
    c, st = s3.client()
    try:
        c.head_object(Bucket=url.bucket, Key=url.key)
        return True
    except ClientError as err:
        if str(err.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
            if s3.bucket_missing(url):
                raise StorageError(f"{op} {shown}: bucket {url.bucket!r} does not exist at {st.endpoint}") from None
            return False
        raise s3.translate(err, shown, op, st) from None
    except Exception as err:  # noqa: BLE001
        raise s3.translate(err, shown, op, st) from None


def read_bytes(uri: Location) -> bytes:
    """The whole content of a (small) file, held in memory. An S3 object that carries
    ``x-amz-meta-sha256`` (everything pitlab writes) is verified against it. Raises :class:`ObjectNotFound`
    when it does not exist, :class:`ChecksumMismatch` when the content does not match."""
    if not is_s3(uri):
        try:
            return Path(uri).read_bytes()
        except OSError as err:
            raise _local_error(err, Path(uri), "read") from None
    url = parse_s3(str(uri))
    c, st = s3.client()
    with _s3_errors(url, "read", st):
        resp = c.get_object(Bucket=url.bucket, Key=url.key)
        data = resp["Body"].read()
    expected = (resp.get("Metadata") or {}).get(SHA256_METADATA)
    if expected is not None:
        got = hashlib.sha256(data).hexdigest()
        if got != expected:
            raise ChecksumMismatch(str(uri), expected, got)
    return data


def read_text(uri: Location) -> str:
    """:func:`read_bytes` decoded as UTF-8."""
    return read_bytes(uri).decode("utf-8")


def open_read(uri: Location) -> BinaryIO:
    """A binary stream of the file's content (S3: the GET response body, read as it arrives; close it)."""
    if not is_s3(uri):
        try:
            return open(uri, "rb")
        except OSError as err:
            raise _local_error(err, Path(uri), "open") from None
    url = parse_s3(str(uri))
    c, st = s3.client()
    with _s3_errors(url, "open", st):
        return c.get_object(Bucket=url.bucket, Key=url.key)["Body"]


@contextlib.contextmanager
def _s3_errors(url: S3Url, op: str, st: s3.S3Settings):
    """Turn a boto3/botocore failure of ``op`` on ``url`` into a :class:`StorageError` (a 404: a missing bucket
    or :class:`ObjectNotFound`, see :func:`s3.not_found`; the rest: :func:`s3.translate`)."""
    from botocore.exceptions import ClientError

    try:
        yield
    except ClientError as err:
        if str(err.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey"):
            raise s3.not_found(url, op, err) from None
        raise s3.translate(err, url, op, st) from None
    except Exception as err:  # noqa: BLE001
        raise s3.translate(err, url, op, st) from err


def _replace_local(dst: Path, op: str, fill) -> None:
    """Atomically replace the local file ``dst``: ``fill(<dst>.part)`` writes the content, which is fsynced
    and renamed over ``dst``. Raises :class:`StorageError` (via ``_local_error``) naming ``dst`` and ``op``."""
    tmp = dst.with_name(dst.name + ".part")
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        fill(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except OSError as err:
        raise _local_error(err, dst, op) from None


def write_bytes(uri: Location, data: bytes) -> FileEntry:
    """Write ``data`` atomically (local: ``.part`` + fsync + rename; S3: one PUT, which S3 applies whole).
    Returns its size and sha256."""
    entry = FileEntry(len(data), hashlib.sha256(data).hexdigest())
    if not is_s3(uri):
        _replace_local(Path(uri), "write", lambda tmp: tmp.write_bytes(data))
        return entry
    url = parse_s3(str(uri))
    c, st = s3.client()
    try:
        c.put_object(Bucket=url.bucket, Key=url.key, Body=data, Metadata={SHA256_METADATA: entry.sha256})
    except Exception as err:  # noqa: BLE001
        raise s3.translate(err, url, "write", st) from None
    return entry


def write_text(uri: Location, text: str) -> FileEntry:
    """:func:`write_bytes` of ``text`` encoded as UTF-8."""
    return write_bytes(uri, text.encode("utf-8"))


def list_files(uri: Location) -> dict[str, int]:
    """Every file below the directory/prefix ``uri``, recursively: relative name (``/``-separated) → size in
    bytes. Empty when there is none. S3 pages through ``ListObjectsV2`` (1000 keys a page)."""
    if not is_s3(uri):
        root = Path(uri)
        if not root.is_dir():
            return {}
        return {p.relative_to(root).as_posix(): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}
    url = parse_s3(str(uri))
    c, st = s3.client()
    out: dict[str, int] = {}
    try:
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=url.bucket, Prefix=url.prefix):
            for obj in page.get("Contents", []):
                out[obj["Key"][len(url.prefix):]] = int(obj["Size"])
    except Exception as err:  # noqa: BLE001 - a missing bucket answers NoSuchBucket here
        raise s3.translate(err, url, "list", st) from None
    return dict(sorted(out.items()))


def delete(uri: Location) -> None:
    """Delete one file if it exists (no error when it does not)."""
    if not is_s3(uri):
        Path(uri).unlink(missing_ok=True)
        return
    url = parse_s3(str(uri))
    c, st = s3.client()
    try:
        c.delete_object(Bucket=url.bucket, Key=url.key)
    except Exception as err:  # noqa: BLE001
        raise s3.translate(err, url, "delete", st) from None


def delete_tree(uri: Location) -> int:
    """Delete a directory/prefix and everything below it; returns the number of files deleted."""
    if not is_s3(uri):
        p = Path(uri)
        n = len(list_files(p))
        shutil.rmtree(p, ignore_errors=True)
        return n
    url = parse_s3(str(uri))
    keys = [url.prefix + k for k in list_files(uri)]
    c, st = s3.client()
    try:
        for i in range(0, len(keys), 1000):
            c.delete_objects(Bucket=url.bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]],
                                                        "Quiet": True})
    except Exception as err:  # noqa: BLE001
        raise s3.translate(err, url, "delete", st) from None
    return len(keys)


def move_tree(src: Location, dst: Location, part_size: int | None = None) -> int:
    """Move every file below the directory/prefix ``src`` to the same name below ``dst``, which must hold no
    file; returns the number of files moved.

    S3: each object is copied server-side (boto3's managed copy: multipart above ``part_size`` bytes, its
    ``x-amz-meta-sha256`` kept), and the sources are deleted only once every copy exists; a failed copy deletes
    the copies already made and leaves ``src`` as it was. Local: one rename. Raises :class:`StorageError`
    naming ``dst`` when it holds files, or the object that failed.
    """
    if is_s3(src) != is_s3(dst):
        raise StorageError(f"{src} → {dst}: a move stays on one kind of storage (both local or both s3://)")
    if list_files(dst):
        raise StorageError(f"{dst}: already holds files; {src} is not moved there")
    if not is_s3(src):
        n = len(list_files(src))
        try:
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
            os.rename(src, dst)
        except OSError as err:
            raise _local_error(err, Path(src), "move") from None
        return n
    s_url, d_url = parse_s3(str(src)), parse_s3(str(dst))
    names = list(list_files(src))
    c, st = s3.client()
    done: list[str] = []
    try:
        for name in names:
            source = {"Bucket": s_url.bucket, "Key": s_url.prefix + name}
            head = c.head_object(**source)
            c.copy(source, d_url.bucket, d_url.prefix + name, ExtraArgs={"Metadata": head.get("Metadata", {}),
                                                                          "MetadataDirective": "REPLACE"},
                   Config=s3.transfer_config(st, part_size))
            done.append(name)
    except Exception as err:  # noqa: BLE001
        for name in done:
            with contextlib.suppress(StorageError):
                delete(join(dst, name))
        raise s3.translate(err, s_url.child(names[len(done)]), "copy", st) from None
    delete_tree(src)
    return len(names)


def upload_file(path: str | os.PathLike, uri: Location, entry: FileEntry | None = None,
                part_size: int | None = None, concurrency: int | None = None) -> FileEntry:
    """Copy the local file ``path`` to ``uri``; returns its size (bytes) and sha256 (``entry`` if given,
    else computed in one streaming pass first).

    S3: above one part, a multipart upload of ``part_size``-byte parts (default ``PITLAB_S3_PART_SIZE_MIB``),
    ``concurrency`` in parallel, retried with backoff on throttling, 5xx and connection errors; the sha256
    goes into the object's metadata (``x-amz-meta-sha256``). The object appears only when the upload
    completes; a failed multipart upload is aborted when the endpoint can still be reached. Local: copied to
    ``<uri>.part`` and renamed. Raises :class:`StorageError` (missing bucket, credentials, unreachable
    endpoint: named).
    """
    entry = entry or file_sha256(path)
    if not is_s3(uri):
        _replace_local(Path(uri), "upload", lambda tmp: shutil.copyfile(path, tmp))
        return entry
    url = parse_s3(str(uri))
    c, st = s3.client()
    try:
        c.upload_file(str(path), url.bucket, url.key, ExtraArgs={"Metadata": {SHA256_METADATA: entry.sha256}},
                      Config=s3.transfer_config(st, part_size, concurrency))
    except Exception as err:  # noqa: BLE001
        if "NoSuchBucket" in str(err):
            raise StorageError(f"upload {url}: bucket {url.bucket!r} does not exist at {st.endpoint}") from None
        raise s3.translate(err, url, "upload", st) from err
    return entry


def download_file(uri: Location, path: str | os.PathLike, expected_sha256: str | None = None,
                  part_size: int | None = None, concurrency: int | None = None) -> FileEntry:
    """Copy ``uri`` to the local file ``path`` (via ``<path>.part``, renamed only after the check) and verify
    its sha256 against ``expected_sha256``, or else against the object's ``x-amz-meta-sha256`` when it has
    one. S3 objects are fetched in ranged parts in parallel (see :func:`upload_file`).

    Returns size (bytes) and sha256. Raises :class:`ChecksumMismatch` naming the URI and both digests (the
    ``.part`` file is removed), :class:`ObjectNotFound`, or :class:`StorageError`.
    """
    dst = Path(path)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}-{threading.get_ident()}.part")  # unique: no clash between
    dst.parent.mkdir(parents=True, exist_ok=True)                                # processes fetching one file
    expected = expected_sha256
    if not is_s3(uri):
        try:
            shutil.copyfile(uri, tmp)
        except OSError as err:
            raise _local_error(err, Path(uri), "download") from None
    else:
        url = parse_s3(str(uri))
        c, st = s3.client()
        try:
            with _s3_errors(url, "download", st):
                if expected is None:
                    head = c.head_object(Bucket=url.bucket, Key=url.key)
                    expected = head.get("Metadata", {}).get(SHA256_METADATA)
                c.download_file(url.bucket, url.key, str(tmp),
                                Config=s3.transfer_config(st, part_size, concurrency))
        except StorageError:
            tmp.unlink(missing_ok=True)
            raise
    got = file_sha256(tmp)
    if expected is not None and got.sha256 != expected:
        tmp.unlink(missing_ok=True)
        raise ChecksumMismatch(str(uri), expected, got.sha256)
    os.replace(tmp, dst)
    return got
