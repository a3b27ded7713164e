"""S3 access through boto3: the client built from the environment, multipart transfers with bounded memory,
and botocore errors translated into :class:`~pitlab.storage.errors.StorageError` with clear messages.

Configuration (all optional; the standard AWS variables and ``~/.aws/config``/``credentials`` work as with
the AWS CLI, so do ``AWS_PROFILE``, instance roles and IRSA):

==============================  ===========================================================================
``AWS_ENDPOINT_URL_S3``,        the S3 endpoint (MinIO, Ceph RGW, a local ``moto_server``); default AWS
``AWS_ENDPOINT_URL``
``AWS_REGION``,                 the region
``AWS_DEFAULT_REGION``         (else the profile's region, else us-east-1)
``AWS_ACCESS_KEY_ID``, ...      credentials (or ``AWS_PROFILE``; on Kubernetes a Secret named in
                                ``spec.storage.secretName``, mounted as environment variables)
``PITLAB_S3_ADDRESSING_STYLE``  ``path`` | ``virtual`` | ``auto``; default ``path`` when an endpoint is set
                                (MinIO and Ceph RGW need it), else botocore's choice
``AWS_MAX_ATTEMPTS``,           retries of throttling (SlowDown, 429), 5xx and connection errors with
``AWS_RETRY_MODE``              exponential backoff; default 5 attempts, ``standard`` mode
``PITLAB_S3_TIMEOUT_S``         connect and read timeout per request in seconds (default 60)
``PITLAB_S3_PART_SIZE_MIB``     multipart part size in MiB (default 64; S3 allows 5 .. 5120)
``PITLAB_S3_CONCURRENCY``       parallel parts per transfer (default 8)
``PITLAB_S3_MAX_BANDWIDTH``     cap of one transfer in bytes/s (default none)
==============================  ===========================================================================

Memory of one transfer is bounded by about part size × (2 × concurrency) bytes: s3transfer reads at most
``max_concurrency`` parts in flight plus ``max_in_memory_upload_chunks`` (set to the concurrency) queued,
and downloads are written through a queue of 256 KiB chunks (see ``bench/bench_s3.py``).
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass

from pitlab.storage.errors import ObjectNotFound, StorageError
from pitlab.storage.uri import S3Url

MiB = 1 << 20
MIN_PART_MIB, MAX_PART_MIB = 5, 5120
CREDENTIALS_HINT = ("set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or on Kubernetes "
                    "spec.storage.secretName")
_ENV_KEYS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
             "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_CONFIG_FILE",
             "AWS_SHARED_CREDENTIALS_FILE", "PITLAB_S3_ADDRESSING_STYLE", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE",
             "PITLAB_S3_TIMEOUT_S", "PITLAB_S3_PART_SIZE_MIB", "PITLAB_S3_CONCURRENCY",
             "PITLAB_S3_MAX_BANDWIDTH")


@dataclass(frozen=True)
class S3Settings:
    """What :func:`client` is built from (read from the environment by :meth:`from_env`)."""

    endpoint_url: str | None
    region: str | None  # None: botocore's choice (profile, else us-east-1)
    addressing_style: str | None
    max_attempts: int
    retry_mode: str
    timeout_s: float
    part_size: int  # bytes
    concurrency: int
    max_bandwidth: int | None = None  # bytes/s

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "S3Settings":
        """Settings from the environment. Raises :class:`StorageError` naming the variable for a bad value."""
        env = os.environ if env is None else env
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        style = env.get("PITLAB_S3_ADDRESSING_STYLE") or ("path" if endpoint else None)
        if style not in (None, "path", "virtual", "auto"):
            raise StorageError(f"PITLAB_S3_ADDRESSING_STYLE={style!r}: must be path, virtual or auto")

        def number(name: str, default: float, lo: float, hi: float, kind=int):
            raw = env.get(name)
            if not raw:
                return kind(default)
            try:
                v = kind(raw)
            except ValueError:
                raise StorageError(f"{name}={raw!r}: not a number") from None
            if not lo <= v <= hi:
                raise StorageError(f"{name}={raw!r}: must be between {lo} and {hi}")
            return v

        mode = env.get("AWS_RETRY_MODE") or "standard"
        if mode not in ("legacy", "standard", "adaptive"):
            raise StorageError(f"AWS_RETRY_MODE={mode!r}: must be standard, adaptive or legacy")
        return cls(endpoint_url=endpoint, region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
                   addressing_style=style, max_attempts=number("AWS_MAX_ATTEMPTS", 5, 1, 50),
                   retry_mode=mode, timeout_s=number("PITLAB_S3_TIMEOUT_S", 60, 0.1, 3600, float),
                   part_size=number("PITLAB_S3_PART_SIZE_MIB", 64, MIN_PART_MIB, MAX_PART_MIB) * MiB,
                   concurrency=number("PITLAB_S3_CONCURRENCY", 8, 1, 64),
                   max_bandwidth=number("PITLAB_S3_MAX_BANDWIDTH", 0, 0, 1 << 40) or None)

    @property
    def endpoint(self) -> str:
        """The endpoint as users know it (for messages)."""
        return self.endpoint_url or f"AWS S3 ({self.region or 'default region'})"


def _env_key() -> tuple:
    return (os.getpid(),) + tuple(os.environ.get(k) for k in _ENV_KEYS)


_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _client_for(key: tuple):
    import boto3
    from botocore.config import Config

    s = S3Settings.from_env()
    cfg = Config(region_name=s.region, retries={"max_attempts": s.max_attempts, "mode": s.retry_mode},
                 connect_timeout=s.timeout_s, read_timeout=s.timeout_s,
                 max_pool_connections=max(10, 2 * s.concurrency),
                 s3={"addressing_style": s.addressing_style} if s.addressing_style else None,
                 # CRC trailers by default (botocore >= 1.36) break older MinIO and Ceph RGW: only when required
                 request_checksum_calculation=os.environ.get("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required"),
                 response_checksum_validation=os.environ.get("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required"))
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=s.endpoint_url, config=cfg), s


def client():
    """``(boto3 S3 client, S3Settings)`` for the current environment (cached per process and environment;
    boto3 clients are thread-safe). Raises :class:`StorageError` for a bad setting or profile."""
    from botocore.exceptions import BotoCoreError

    with _lock:
        try:
            return _client_for(_env_key())
        except BotoCoreError as err:
            raise StorageError(f"cannot configure the S3 client: {err}") from err


def transfer_config(settings: S3Settings, part_size: int | None = None, concurrency: int | None = None):
    """boto3 ``TransferConfig``: multipart above one part, ``part_size`` bytes per part (default from the
    settings; at least 5 MiB), ``concurrency`` parts in parallel and as many queued in memory."""
    from boto3.s3.transfer import TransferConfig

    part = part_size or settings.part_size
    if part < MIN_PART_MIB * MiB:
        raise StorageError(f"part size {part} bytes: S3 needs at least {MIN_PART_MIB} MiB per part")
    n = concurrency or settings.concurrency
    cfg = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=n,
                         max_io_queue=64, io_chunksize=256 * 1024, use_threads=True,
                         preferred_transfer_client="classic", max_bandwidth=settings.max_bandwidth)
    # s3transfer's own bounds (boto3's constructor does not take them): parts read ahead of the workers
    cfg.max_in_memory_upload_chunks = n
    cfg.max_in_memory_download_chunks = n
    return cfg


def _walk(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def translate(err: BaseException, url: S3Url, op: str, settings: S3Settings | None = None) -> StorageError:
    """A :class:`StorageError` for a boto3/botocore failure of ``op`` (a verb: "upload", "read", ...) on ``url``.

    Recognised: missing credentials, a missing bucket (named with the endpoint), a missing object
    (:class:`ObjectNotFound`), access denied / bad keys, an unreachable endpoint or timeouts (named), and
    other S3 error codes (code and message kept).
    """
    from botocore.exceptions import (ClientError, ConnectionClosedError, ConnectTimeoutError,
                                     EndpointConnectionError, NoCredentialsError, PartialCredentialsError,
                                     ProfileNotFound, ReadTimeoutError)
    from urllib3.exceptions import ProtocolError

    settings = settings or S3Settings.from_env()
    where = f"{op} {url}"
    for e in _walk(err):
        if isinstance(e, StorageError):
            return e
        if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
            return StorageError(f"{where}: no S3 credentials found: {CREDENTIALS_HINT}")
        if isinstance(e, ProfileNotFound):
            return StorageError(f"{where}: {e} (AWS_PROFILE)")
        if isinstance(e, (EndpointConnectionError, ConnectTimeoutError, ConnectionClosedError, ReadTimeoutError,
                          ProtocolError, ConnectionError)):
            return StorageError(f"{where}: cannot reach the S3 endpoint {settings.endpoint} after "
                                f"{settings.max_attempts} attempts ({type(e).__name__}: {e})")
        if isinstance(e, ClientError):
            code = str(e.response.get("Error", {}).get("Code", ""))
            msg = e.response.get("Error", {}).get("Message", "") or str(e)
            if code == "NoSuchBucket":
                return StorageError(f"{where}: bucket {url.bucket!r} does not exist at {settings.endpoint}")
            if code in ("NoSuchKey", "404", "NotFound"):
                return ObjectNotFound(f"{where}: no such object (bucket {url.bucket!r} at {settings.endpoint})")
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "ExpiredToken"):
                return StorageError(f"{where}: access denied by {settings.endpoint} ({code}: {msg}); check the "
                                    f"credentials: {CREDENTIALS_HINT}")
            return StorageError(f"{where}: S3 error {code} from {settings.endpoint}: {msg}")
    return StorageError(f"{where}: {type(err).__name__}: {err}")


def bucket_missing(url: S3Url) -> bool:
    """True when ``url.bucket`` does not exist (HEAD bucket answers 404); errors other than 404 count as no."""
    from botocore.exceptions import ClientError

    c, _ = client()
    try:
        c.head_bucket(Bucket=url.bucket)
        return False
    except ClientError as e:
        return str(e.response.get("Error", {}).get("Code")) in ("404", "NoSuchBucket", "NotFound")
    except Exception:  # noqa: BLE001 - the caller reports its own error
        return False


def not_found(url: S3Url, op: str, err: BaseException) -> StorageError:
    """The error for a 404: a missing bucket when it is the bucket, else :class:`ObjectNotFound`."""
    _, s = client()
    if bucket_missing(url):
        return StorageError(f"{op} {url}: bucket {url.bucket!r} does not exist at {s.endpoint}")
    return translate(err, url, op, s)
