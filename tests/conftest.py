import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = Path(os.environ.get("PITLAB_DATA_ROOT", REPO.parent / "shared" / "data")).resolve()
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/s3server.py


@pytest.fixture(scope="session")
def data_root() -> Path:
    if not DATA_ROOT.is_dir():
        pytest.fail(f"shared data not found at {DATA_ROOT}; set PITLAB_DATA_ROOT")
    return DATA_ROOT


# ------------------------------------------------------------------------------------ S3 (a real moto_server)
@pytest.fixture(scope="session")
def moto_server(tmp_path_factory):
    """A ``moto_server`` process on 127.0.0.1 (free port) for the whole session; killed at the end."""
    from s3server import MotoServer

    server = MotoServer(tmp_path_factory.mktemp("moto"))
    server.start()
    yield server
    server.stop()


class S3Bucket:
    """A fresh bucket on the test server: ``name``, ``uri`` (``s3://name``), the ``server``, a boto3 ``client``."""

    def __init__(self, server, name: str):
        from pitlab.storage import s3

        self.server, self.name, self.uri = server, name, f"s3://{name}"
        self.client = s3.client()[0]
        self.client.create_bucket(Bucket=name)


@pytest.fixture
def s3_bucket(moto_server, monkeypatch, tmp_path):
    """Environment pointed at the test server (endpoint, dummy credentials, no ~/.aws files, a private cache)
    and a new empty bucket. The server is running again afterwards whatever the test did to it."""
    import uuid

    for k, v in moto_server.env().items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "PITLAB_S3_ADDRESSING_STYLE",
              "PITLAB_S3_PART_SIZE_MIB", "PITLAB_S3_CONCURRENCY", "PITLAB_S3_MAX_BANDWIDTH"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("PITLAB_CACHE_DIR", str(tmp_path / "cache"))
    bucket = S3Bucket(moto_server, f"pit-{uuid.uuid4().hex[:12]}")
    yield bucket
    if moto_server.proc.poll() is not None:
        moto_server.start()
    else:
        moto_server.thaw()
