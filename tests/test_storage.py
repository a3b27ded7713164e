"""pitlab.storage against a real moto_server process (and the same calls on local paths)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from pitlab import storage
from pitlab.storage import s3 as s3mod
from pitlab.storage.errors import ChecksumMismatch, NotPublished, ObjectNotFound, StorageError

MiB = 1 << 20


def _blob(n: int, seed: int = 0) -> bytes:
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_uri_parsing_and_join():
    u = storage.parse_s3("s3://my-bucket/a/b/")
    assert (u.bucket, u.key, u.prefix) == ("my-bucket", "a/b", "a/b/")
    assert storage.join("s3://my-bucket/a", "step-3", "x.pt") == "s3://my-bucket/a/step-3/x.pt"
    assert storage.join("/tmp/a", "b") == Path("/tmp/a/b")
    assert storage.is_s3("s3://abc/x") and not storage.is_s3("/abc") and not storage.is_s3("file:///x")
    with pytest.raises(StorageError, match="'ab' is not a valid bucket name"):
        storage.parse_s3("s3://ab/x")
    with pytest.raises(StorageError, match="'..' is not allowed"):
        storage.join("s3://abc/x", "../y")


def test_settings_from_env_and_bad_values():
    s = s3mod.S3Settings.from_env({"AWS_ENDPOINT_URL": "http://minio:9000", "AWS_DEFAULT_REGION": "eu-west-1",
                                   "PITLAB_S3_PART_SIZE_MIB": "16", "AWS_MAX_ATTEMPTS": "7"})
    assert (s.endpoint_url, s.region, s.addressing_style, s.part_size, s.max_attempts, s.retry_mode) == (
        "http://minio:9000", "eu-west-1", "path", 16 * MiB, 7, "standard")
    assert s3mod.S3Settings.from_env({}).addressing_style is None  # AWS: botocore decides
    assert s3mod.S3Settings.from_env({"AWS_ENDPOINT_URL_S3": "http://a", "AWS_ENDPOINT_URL": "http://b",
                                      "PITLAB_S3_ADDRESSING_STYLE": "virtual"}).endpoint_url == "http://a"
    with pytest.raises(StorageError, match="PITLAB_S3_PART_SIZE_MIB='4': must be between 5 and 5120"):
        s3mod.S3Settings.from_env({"PITLAB_S3_PART_SIZE_MIB": "4"})
    with pytest.raises(StorageError, match="PITLAB_S3_ADDRESSING_STYLE='dns'"):
        s3mod.S3Settings.from_env({"PITLAB_S3_ADDRESSING_STYLE": "dns"})
    cfg = s3mod.transfer_config(s, part_size=5 * MiB, concurrency=3)
    assert (cfg.multipart_chunksize, cfg.max_concurrency, cfg.max_in_memory_upload_chunks) == (5 * MiB, 3, 3)


def test_small_objects_round_trip_list_exists_delete(s3_bucket):
    base = f"{s3_bucket.uri}/run"
    assert not storage.exists(f"{base}/a.txt") and storage.list_files(base) == {}
    e = storage.write_text(f"{base}/a.txt", "hello\n")
    storage.write_bytes(f"{base}/sub/b.bin", b"\x00\x01\x02")
    assert e.size == 6 and e.sha256 == hashlib.sha256(b"hello\n").hexdigest()
    assert storage.exists(f"{base}/a.txt") and storage.read_text(f"{base}/a.txt") == "hello\n"
    assert storage.list_files(base) == {"a.txt": 6, "sub/b.bin": 3}
    with storage.open_read(f"{base}/sub/b.bin") as f:
        assert f.read() == b"\x00\x01\x02"
    with pytest.raises(ObjectNotFound, match=rf"read {base}/nope: no such object \(bucket '{s3_bucket.name}'"):
        storage.read_bytes(f"{base}/nope")
    assert storage.delete_tree(base) == 2 and storage.list_files(base) == {}


def test_local_paths_behave_the_same(tmp_path):
    base = tmp_path / "run"
    storage.write_text(base / "a.txt", "hello\n")
    storage.write_bytes(base / "sub" / "b.bin", b"\x00\x01\x02")
    assert storage.list_files(base) == {"a.txt": 6, "sub/b.bin": 3}
    assert storage.read_text(base / "a.txt") == "hello\n" and storage.exists(base / "a.txt")
    with pytest.raises(ObjectNotFound, match="no such file"):
        storage.read_bytes(base / "nope")
    m = storage.upload_dir(base, tmp_path / "published")
    assert storage.read_manifest(tmp_path / "published").files == m.files
    assert storage.localize(tmp_path / "published") == tmp_path / "published"


def test_multipart_upload_with_small_parts_is_exact(s3_bucket, tmp_path):
    data = _blob(12 * MiB + 123, seed=1)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    uri = f"{s3_bucket.uri}/big/big.bin"
    entry = storage.upload_file(src, uri, part_size=5 * MiB, concurrency=2)
    assert entry == storage.FileEntry(len(data), hashlib.sha256(data).hexdigest())
    head = s3_bucket.client.head_object(Bucket=s3_bucket.name, Key="big/big.bin")
    assert head["ETag"].strip('"').endswith("-3")  # three parts: 5 + 5 + 2 MiB
    assert head["ContentLength"] == len(data) and head["Metadata"]["sha256"] == entry.sha256
    got = storage.download_file(uri, tmp_path / "back.bin", part_size=5 * MiB)
    assert got == entry and (tmp_path / "back.bin").read_bytes() == data
    assert not list(tmp_path.glob("*.part"))


def test_move_tree_copies_server_side_keeps_digests_and_deletes_the_sources_last(s3_bucket, tmp_path):
    """`pitlab run --overwrite` to an s3:// output keeps the replaced run under .replaced/ with move_tree: every
    object arrives byte for byte with its sha256 metadata (a 12 MiB one in three copied parts), and the
    sources go only after every copy exists; a destination holding files is refused before anything moves."""
    data = _blob(12 * MiB + 5, seed=3)
    (tmp_path / "big.bin").write_bytes(data)
    run, kept = f"{s3_bucket.uri}/out/run", f"{s3_bucket.uri}/out/.replaced/run.1"
    entry = storage.upload_file(tmp_path / "big.bin", f"{run}/model/big.bin", part_size=5 * MiB)
    storage.write_text(f"{run}/status.json", "{}")
    assert storage.move_tree(run, kept, part_size=5 * MiB) == 2
    assert storage.list_files(run) == {} and storage.list_files(kept) == {"model/big.bin": len(data), "status.json": 2}
    head = s3_bucket.client.head_object(Bucket=s3_bucket.name, Key="out/.replaced/run.1/model/big.bin")
    assert head["ETag"].strip('"').endswith("-3") and head["Metadata"]["sha256"] == entry.sha256
    assert storage.download_file(f"{kept}/model/big.bin", tmp_path / "back.bin") == entry  # the digest checked
    storage.write_text(f"{run}/status.json", "new")
    with pytest.raises(StorageError, match=rf"{kept}: already holds files; {run} is not moved there"):
        storage.move_tree(run, kept)
    assert storage.read_text(f"{run}/status.json") == "new" and storage.read_text(f"{kept}/status.json") == "{}"
    with pytest.raises(StorageError, match="a move stays on one kind of storage"):
        storage.move_tree(run, tmp_path / "local")


def test_move_tree_on_local_paths_is_one_rename(tmp_path):
    storage.write_text(tmp_path / "run" / "a" / "b.txt", "x")
    assert storage.move_tree(tmp_path / "run", tmp_path / ".replaced" / "run.1") == 1
    assert not (tmp_path / "run").exists() and (tmp_path / ".replaced" / "run.1" / "a" / "b.txt").read_text() == "x"


def test_published_dir_round_trip_and_marker_order(s3_bucket, tmp_path):
    src = tmp_path / "model"
    (src / "sub").mkdir(parents=True)
    files = {"config.json": b'{"a": 1}', "model.safetensors": _blob(300_000), "sub/tok.json": b"[]"}
    for k, v in files.items():
        (src / k).write_bytes(v)
    uri = f"{s3_bucket.uri}/models/m1"
    order = []
    real_write = storage.ops.write_bytes

    def spy(u, data):
        order.append(storage.basename(u))
        return real_write(u, data)

    storage.ops.write_bytes = spy
    try:
        m = storage.upload_dir(src, uri, extra={"kind": "test"})
    finally:
        storage.ops.write_bytes = real_write
    assert order == ["MANIFEST.json", "_COMPLETE"]  # the marker is the very last write
    assert {k: e.sha256 for k, e in m.files.items()} == {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
    assert storage.list_files(uri) == {**{k: len(v) for k, v in files.items()},
                                      "MANIFEST.json": len(m.to_json()), "_COMPLETE": pytest.approx(0, abs=200)}
    marker = json.loads(storage.read_text(f"{uri}/_COMPLETE"))
    assert marker == {"manifest_sha256": m.digest, "files": 3, "bytes": sum(len(v) for v in files.values())}
    local = storage.localize(uri)
    assert {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()
            and p.name not in ("MANIFEST.json", "_COMPLETE")} == files
    assert storage.localize(uri) == local  # cached by the manifest digest: no second download
    assert storage.read_manifest(uri).extra == {"kind": "test"}


def test_unpublished_dir_is_refused(s3_bucket, tmp_path):
    uri = f"{s3_bucket.uri}/half"
    storage.write_bytes(f"{uri}/model.safetensors", b"xx")  # files but no _COMPLETE: a writer died
    with pytest.raises(NotPublished, match=rf"{uri}: not published \(no _COMPLETE marker\)"):
        storage.read_manifest(uri)
    with pytest.raises(NotPublished, match="not published"):
        storage.localize(uri)
    assert (storage.localize(uri, require_published=False) / "model.safetensors").read_bytes() == b"xx"


def test_corrupted_object_is_detected_and_named(s3_bucket, tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "__0_0.distcp").write_bytes(_blob(100_000, seed=2))
    (src / ".metadata").write_bytes(b"meta")
    uri = f"{s3_bucket.uri}/ckpt/step-4"
    m = storage.upload_dir(src, uri)
    # overwrite one published object behind the manifest's back (bit rot, a stray writer)
    bad = bytearray((src / "__0_0.distcp").read_bytes())
    bad[5000] ^= 0xFF
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="ckpt/step-4/__0_0.distcp", Body=bytes(bad))
    with pytest.raises(ChecksumMismatch) as err:
        storage.download_dir(uri, tmp_path / "dl")
    msg = str(err.value)
    assert f"{uri}/__0_0.distcp: sha256 mismatch" in msg
    assert f"expected {m.files['__0_0.distcp'].sha256}, got {hashlib.sha256(bytes(bad)).hexdigest()}" in msg
    assert not (tmp_path / "dl").exists() and not list(tmp_path.glob(".dl*"))  # nothing half-written kept
    # a single object carries its sha256 in its metadata: a replaced body is caught on download too
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="x.bin", Body=b"new", Metadata={"sha256": "0" * 64})
    with pytest.raises(ChecksumMismatch, match=r"x\.bin: sha256 mismatch: expected 0{64}"):
        storage.download_file(f"{s3_bucket.uri}/x.bin", tmp_path / "x.bin")
    assert not (tmp_path / "x.bin").exists()


def test_missing_credentials_message(s3_bucket, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-role lookup on the test machine
    with pytest.raises(StorageError) as err:
        storage.read_bytes(f"{s3_bucket.uri}/a")
    assert str(err.value) == (f"read {s3_bucket.uri}/a: no S3 credentials found: set AWS_ACCESS_KEY_ID/"
                              "AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or on Kubernetes spec.storage.secretName")
    # a data set read through localize names the object asked for, not the _COMPLETE marker it probes first
    with pytest.raises(StorageError) as err:
        storage.localize(f"{s3_bucket.uri}/fomc.csv")
    assert str(err.value).startswith(f"read {s3_bucket.uri}/fomc.csv: no S3 credentials found")


def test_missing_bucket_message(s3_bucket, tmp_path):
    ep = s3_bucket.server.endpoint
    for call in (lambda: storage.read_bytes("s3://no-such-bucket/a/b"),
                 lambda: storage.exists("s3://no-such-bucket/a/b"),
                 lambda: storage.write_text("s3://no-such-bucket/a/b", "x"),
                 lambda: storage.localize("s3://no-such-bucket/a")):
        with pytest.raises(StorageError, match=rf"s3://no-such-bucket/a.*: bucket 'no-such-bucket' does not exist "
                                               rf"at {ep}"):
            call()
    (tmp_path / "f").write_bytes(b"x" * 10)
    with pytest.raises(StorageError, match=f"bucket 'no-such-bucket' does not exist at {ep}"):
        storage.upload_file(tmp_path / "f", "s3://no-such-bucket/f")


def test_server_killed_mid_upload_fails_clearly(s3_bucket, tmp_path, monkeypatch):
    """SIGKILL the server while a multipart upload (bandwidth-capped to take ~3 s) is in flight."""
    import threading

    monkeypatch.setenv("PITLAB_S3_MAX_BANDWIDTH", str(8 * MiB))
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("PITLAB_S3_TIMEOUT_S", "2")
    src = tmp_path / "big.bin"
    src.write_bytes(_blob(24 * MiB, seed=3))
    killer = threading.Timer(1.0, s3_bucket.server.kill)
    killer.start()
    t0 = time.monotonic()
    with pytest.raises(StorageError) as err:
        storage.upload_file(src, f"{s3_bucket.uri}/big.bin", part_size=5 * MiB, concurrency=2)
    killer.join()
    assert time.monotonic() - t0 < 30
    assert f"upload {s3_bucket.uri}/big.bin: cannot reach the S3 endpoint {s3_bucket.server.endpoint}" in str(err.value)
    s3_bucket.server.start()  # a fresh (empty) server on the same port: no object appeared under the key
    with pytest.raises(StorageError, match="does not exist"):
        storage.read_bytes(f"{s3_bucket.uri}/big.bin")


def test_throttling_and_5xx_are_retried(s3_bucket, tmp_path):
    """Answer the first two UploadPart calls with 503 SlowDown and 500: the upload still lands, exactly."""
    from botocore.awsrequest import AWSResponse

    calls = {"n": 0}

    class Raw:
        def __init__(self, body):
            self.body = body

        def stream(self, **kw):
            yield self.body

    def fail_twice(request, **kw):
        if "partNumber=" in request.url and calls["n"] < 2:
            calls["n"] += 1
            code, err = (503, "SlowDown") if calls["n"] == 1 else (500, "InternalError")
            body = f"<Error><Code>{err}</Code><Message>injected</Message></Error>".encode()
            return AWSResponse(request.url, code, {}, Raw(body))
        return None

    data = _blob(11 * MiB, seed=4)
    (tmp_path / "f").write_bytes(data)
    s3_bucket.client.meta.events.register("before-send.s3.UploadPart", fail_twice)
    try:
        e = storage.upload_file(tmp_path / "f", f"{s3_bucket.uri}/f", part_size=5 * MiB, concurrency=1)
    finally:
        s3_bucket.client.meta.events.unregister("before-send.s3.UploadPart", fail_twice)
    assert calls["n"] == 2
    assert e.sha256 == hashlib.sha256(data).hexdigest()
    assert storage.read_bytes(f"{s3_bucket.uri}/f") == data


def test_validate_names_the_checkpoint_field_for_a_missing_bucket(s3_bucket, tmp_path, data_root):
    import yaml
    from typer.testing import CliRunner

    from pitlab.cli import app

    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "local-sp500-fomc.yaml").read_text())
    doc["spec"]["checkpoint"]["uri"] = "s3://no-such-bucket/ckpt"
    doc["spec"]["evaluations"] = []
    path = tmp_path / "pit.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["validate", str(path), "--data-root", str(data_root)], env={"COLUMNS": "300"})
    assert r.exit_code == 2
    assert (f"spec.checkpoint.uri: list s3://no-such-bucket/ckpt: bucket 'no-such-bucket' does not exist at "
            f"{s3_bucket.server.endpoint}") in " ".join(r.output.split()), r.output
    doc["spec"]["checkpoint"]["uri"] = f"{s3_bucket.uri}/ckpt"
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["validate", str(path), "--data-root", str(data_root)])
    assert r.exit_code == 0, r.output
