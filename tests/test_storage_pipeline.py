"""The pipeline on object storage, against a real moto_server process: corpus read from S3, a torchrun
world-size-2 training with checkpoints to S3, the server stopped mid-upload (clear error, ``latest`` still on
a complete checkpoint), resume from S3 bit-identical to the uninterrupted run, merge S3 → S3, and an
evaluation reading the merged model and the market data from S3."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pitlab import storage
from pitlab.api import PitTraining, SpecError

REPO = Path(__file__).resolve().parents[1]
STEPS = 12  # 12 × 1024 tokens: seqLen 64 × microBatch 4 × accumulation 2 × 2 ranks
from tiny_models import QWEN35_TINY  # noqa: E402  (tests/ is on sys.path under pytest)


def _spec(corpus_uri: str, checkpoint_uri: str) -> PitTraining:
    return PitTraining.model_validate({
        "apiVersion": "pitlab.io/v1alpha1", "kind": "PitTraining", "metadata": {"name": "s3-test"},
        "spec": {
            "baseModel": {"randomInit": {"modelType": "qwen3_5_moe_text", "config": QWEN35_TINY, "seed": 0},
                          "tokenizer": {"vocabSize": 1024}},
            "corpus": {"uri": corpus_uri, "format": "csv", "timezone": "America/New_York"},
            "knowledgeCutoff": "2005-12-31", "tokens": STEPS * 1024,
            "training": {"seqLen": 64, "microBatchSize": 4, "gradientAccumulationSteps": 2,
                         "learningRate": 3e-3, "warmupSteps": 3, "precision": "fp32", "seed": 0},
            "resources": {"nodes": 1, "gpusPerNode": 2},
            "checkpoint": {"uri": checkpoint_uri, "everySteps": 4, "keep": 2},
        },
    })


@pytest.fixture(scope="module")
def s3env(moto_server, tmp_path_factory):
    """Module-wide: environment pointed at the server, one bucket, the FOMC corpus uploaded to it."""
    from pitlab.storage import s3

    tmp = tmp_path_factory.mktemp("s3pipe")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in moto_server.env().items():
            mp.setenv(k, v)
        for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "PITLAB_S3_MAX_BANDWIDTH", "PITLAB_S3_PART_SIZE_MIB"):
            mp.delenv(k, raising=False)
        mp.setenv("AWS_CONFIG_FILE", str(tmp / "no-aws-config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp / "no-aws-credentials"))
        mp.setenv("PITLAB_CACHE_DIR", str(tmp / "cache"))
        mp.setenv("PITLAB_STAGING_DIR", str(tmp / "staging"))
        bucket = "pit-pipeline"
        s3.client()[0].create_bucket(Bucket=bucket)
        yield {"server": moto_server, "bucket": f"s3://{bucket}", "tmp": tmp, "mp": mp}


@pytest.fixture(scope="module")
def prepared(s3env, data_root):
    """Corpus read from S3 → filtered, tokenizer + base model + tokens (pitlab prepare's work)."""
    from pitlab.trainer.inputs import check_corpus, prepare_run

    fomc = data_root / "fomc_statements" / "fomc_statements_1994_2026.csv"
    corpus_uri = f"{s3env['bucket']}/data/fomc.csv"
    storage.upload_file(fomc, corpus_uri)
    res = _spec(corpus_uri, f"{s3env['bucket']}/ckpt-a")
    plan = check_corpus(res)
    run = s3env["tmp"] / "run-a"
    base, n_tokens = prepare_run(res, plan, run)
    return {"res": res, "plan": plan, "run": run, "base": base, "corpus_uri": corpus_uri, "fomc": fomc}


def _run(s3env, prepared, name: str, ckpt_uri: str, **kw):
    from pitlab.trainer.launch import run_training, write_spec

    run = s3env["tmp"] / name
    (run / "data").mkdir(parents=True, exist_ok=True)
    tokens = prepared["run"] / "data" / "tokens.npy"
    if not (run / "data" / "tokens.npy").exists():
        (run / "data" / "tokens.npy").write_bytes(tokens.read_bytes())
    res = _spec(prepared["corpus_uri"], ckpt_uri)
    spec_path = write_spec(res, run / "spec.json")
    return run, (lambda: run_training(spec_path, run, nproc=2, base=prepared["base"], **kw))


@pytest.fixture(scope="module")
def trained(s3env, prepared):
    """The uninterrupted run: checkpoints every 4 steps to s3://.../ckpt-a."""
    ckpt = f"{s3env['bucket']}/ckpt-a"
    run, go = _run(s3env, prepared, "run-a", ckpt)
    return {"run": run, "ckpt": ckpt, "summary": go()}


@pytest.mark.slow
def test_corpus_read_from_s3_matches_the_local_file(prepared):
    from pitlab.data import filter_corpus, read_corpus

    plan, c = prepared["plan"], prepared["res"].spec.corpus
    docs = read_corpus(prepared["fomc"], c.format, c.text_field, c.timestamp_field, c.timezone, c.id_field)
    kept, local = filter_corpus(docs, prepared["res"].spec.knowledge_cutoff, c.timezone, c.on_missing_timestamp)
    assert plan.audit.included == local.included == len(kept) and plan.audit.included > 50
    assert plan.audit.included_ids_sha256 == local.included_ids_sha256
    assert plan.audit.source == prepared["corpus_uri"]
    assert plan.path.read_bytes() == prepared["fomc"].read_bytes()


@pytest.mark.slow
def test_training_writes_published_checkpoints_to_s3(s3env, trained):
    from pitlab.trainer.checkpoint_s3 import staging_root, step_dirs

    s, ckpt = trained["summary"], trained["ckpt"]
    assert s["steps"] == STEPS and s["world_size"] == 2 and s["checkpoint"] == f"{ckpt}/step-{STEPS}"
    assert storage.read_text(f"{ckpt}/latest") == f"step-{STEPS}\n"
    assert step_dirs(ckpt) == {8: True, 12: True}  # keep: 2 of 4/8/12, every one published
    m = storage.read_manifest(f"{ckpt}/step-{STEPS}")
    assert sorted(m.files) == [".metadata", "__0_0.distcp", "__1_0.distcp", "rng-rank-0.pt", "rng-rank-1.pt",
                               "train_state.json"]
    listed = storage.list_files(f"{ckpt}/step-{STEPS}")
    assert {k: listed[k] for k in m.files} == {k: e.size for k, e in m.files.items()}
    state = json.loads(storage.read_text(f"{ckpt}/step-{STEPS}/train_state.json"))
    assert (state["step"], state["world_size"], state["data"]["next_step"]) == (STEPS, 2, STEPS)
    assert m.extra == {"step": STEPS, "world_size": 2}
    assert not (trained["run"] / "checkpoint").exists()  # nothing on the run's disk
    assert not any(staging_root().iterdir())  # staging folders removed


@pytest.mark.slow
def test_server_stopped_mid_upload_then_resume_is_bit_identical(s3env, prepared, trained):
    """Stop (SIGSTOP) the server while the ranks upload step-8; the run fails naming the endpoint, ``latest``
    stays on step-4 (complete); with the server running again, the resumed run equals the uninterrupted one."""
    from pitlab.trainer.checkpoint_s3 import staging_root, step_dirs
    from pitlab.trainer.launch import TrainingError

    server, mp = s3env["server"], s3env["mp"]
    ckpt = f"{s3env['bucket']}/ckpt-b"
    run, go = _run(s3env, prepared, "run-b", ckpt)
    mp.setenv("PITLAB_S3_MAX_BANDWIDTH", str(1 << 20))  # 1 MiB/s: a rank's ~0.9 MiB upload takes ~1 s, not ms
    mp.setenv("AWS_MAX_ATTEMPTS", "2")
    mp.setenv("PITLAB_S3_TIMEOUT_S", "1")
    frozen = threading.Event()

    def freeze_when_step8_uploads():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if storage.exists(f"{ckpt}/step-8/.metadata"):  # rank 0's first file landed, its shards are next
                server.freeze()
                frozen.set()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=freeze_when_step8_uploads, daemon=True)
    watcher.start()
    try:
        with pytest.raises(TrainingError) as err:
            go()
    finally:
        watcher.join(timeout=5)
        server.thaw()
        mp.delenv("PITLAB_S3_MAX_BANDWIDTH")
        mp.setenv("AWS_MAX_ATTEMPTS", "3")
        mp.setenv("PITLAB_S3_TIMEOUT_S", "5")
    assert frozen.is_set()
    msg = str(err.value)
    assert f"checkpoint {ckpt}/step-8 not published ({ckpt}/latest not moved)" in msg, msg
    assert f"cannot reach the S3 endpoint {server.endpoint}" in msg, msg
    time.sleep(1.0)  # requests the stopped server had queued are answered now; none of them publishes step-8
    assert storage.read_text(f"{ckpt}/latest") == "step-4\n"
    assert step_dirs(ckpt) == {4: True, 8: False}  # step-8 partly uploaded, never published
    assert ".metadata" in storage.list_files(f"{ckpt}/step-8")
    assert not storage.exists(f"{ckpt}/step-8/_COMPLETE")
    assert not any(staging_root().iterdir())  # the ranks removed their staging folders
    assert not (run / "train" / "summary.json").exists()

    summary = go()  # resume
    assert summary["resumed_from_step"] == 4
    assert summary["param_sha256"] == trained["summary"]["param_sha256"]  # bit-identical parameters
    assert summary["final_loss"] == trained["summary"]["final_loss"]
    assert step_dirs(ckpt) == {8: True, 12: True}  # the partial step-8 was rewritten and published
    lines = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_resume_refuses_a_latest_without_complete(s3env, trained):
    from pitlab.trainer.checkpoint import CheckpointError
    from pitlab.trainer.checkpointer import latest_checkpoint

    ckpt = f"{s3env['bucket']}/ckpt-half"
    storage.write_text(f"{ckpt}/step-3/.metadata", "x")
    storage.write_text(f"{ckpt}/latest", "step-3\n")
    with pytest.raises(CheckpointError, match=rf"{ckpt}/latest: names step-3, but {ckpt}/step-3 has no "
                                              r"_COMPLETE marker"):
        latest_checkpoint(ckpt)
    assert latest_checkpoint(f"{s3env['bucket']}/nothing-here") is None


@pytest.mark.slow
def test_merge_s3_to_s3_then_evaluate_the_model_from_s3(s3env, prepared, trained, data_root, tmp_path):
    from pitlab.cli import app
    from pitlab.evaluator.embed import model_digest
    from reference import parameter_sha256
    from transformers import AutoModelForCausalLM

    b = s3env["bucket"]
    r = CliRunner().invoke(app, ["push", str(prepared["base"]), f"{b}/base"])
    assert r.exit_code == 0, r.output
    storage.upload_file(trained["run"] / "train" / "summary.json", f"{b}/summary.json")
    # baseModel.uri from S3: prepare puts the verified copy at RUN/base (read by the ranks and the merge)
    from pitlab.trainer.inputs import check_corpus, prepare_run

    doc = prepared["res"].model_dump(by_alias=True, mode="json", exclude_none=True)
    doc["spec"]["baseModel"] = {"uri": f"{b}/base"}
    res = PitTraining.model_validate(doc)
    base_dir, n_tokens = prepare_run(res, check_corpus(res), tmp_path / "run-s3-base")
    assert base_dir == tmp_path / "run-s3-base" / "base"
    assert sorted(p.name for p in base_dir.iterdir()) == sorted(p.name for p in prepared["base"].iterdir())
    assert all((base_dir / p.name).read_bytes() == p.read_bytes() for p in prepared["base"].iterdir())
    assert (tmp_path / "run-s3-base" / "data" / "tokens.npy").read_bytes() == (
        prepared["run"] / "data" / "tokens.npy").read_bytes()
    r = CliRunner().invoke(app, ["merge", "--checkpoint", trained["ckpt"], "--base", f"{b}/base",
                                 "--out", f"{b}/models/pit", "--summary", f"{b}/summary.json"])
    assert r.exit_code == 0, r.output
    m = storage.read_manifest(f"{b}/models/pit")
    assert {"config.json", "model.safetensors", "merge_report.json", "tokenizer.json"} <= set(m.files)
    report = json.loads(storage.read_text(f"{b}/models/pit/merge_report.json"))
    assert report["verified"] is True and report["checkpoint_uri"] == trained["ckpt"]
    assert report["model_uri"] == f"{b}/models/pit"
    local = storage.localize(f"{b}/models/pit")
    assert parameter_sha256(AutoModelForCausalLM.from_pretrained(local)) == trained["summary"]["param_sha256"]

    # evaluation: the merged model and the market data both read from S3
    prices = data_root / "sp500_5yr" / "sp500_5yr_ohlcv_long.csv.gz"
    storage.upload_file(prices, f"{b}/data/sp500.csv.gz")
    ev = {"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval", "metadata": {"name": "s3-eval"},
          "spec": {"models": [{"name": "pit", "uri": f"{b}/models/pit"}],
                   "dataset": {"kind": "ohlcv", "uri": f"{b}/data/sp500.csv.gz", "universeSize": 20,
                               "dates": {"count": 8}, "seed": 3},
                   "protocol": {"trainEnd": "2016-12-31", "testStart": "2017-01-01", "embargoDays": 5,
                                "groupKFolds": 3},
                   "bootstrap": {"resamples": 10}, "regression": {"innerFolds": 3},
                   "output": {"uri": f"{b}/results"}}}
    path = tmp_path / "ev.yaml"
    path.write_text(yaml.safe_dump(ev))
    r = CliRunner().invoke(app, ["run", str(path)])  # output.uri s3://: worked on in the cache, then published
    assert r.exit_code == 0, r.output
    published = storage.read_manifest(f"{b}/results/s3-eval/eval")
    assert {"results.json", "report.md", "premium.png"} <= set(published.files)
    results = json.loads(storage.read_text(f"{b}/results/s3-eval/eval/results.json"))
    status = json.loads(storage.read_text(f"{b}/results/s3-eval/status.json"))["status"]
    assert status["phase"] == "Succeeded"
    r = CliRunner().invoke(app, ["run", str(path)], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and f"{b}/results/s3-eval already exists" in r.output, r.output
    (model,) = results["models"]
    assert model["uri"] == f"{b}/models/pit" and model["embedding_dim"] == 64
    assert model["digest"] == model_digest(local)  # the evaluated weights are the published ones
    assert results["panel"]["n_rows"] + sum(results["panel"]["dropped"].values()) == 160

    # an unpublished model folder and a missing bucket are refused before anything runs, naming the field
    storage.write_text(f"{b}/models/half/config.json", "{}")
    ev["spec"]["models"][0]["uri"] = f"{b}/models/half"
    path.write_text(yaml.safe_dump(ev))
    r = CliRunner().invoke(app, ["validate", str(path)])
    assert r.exit_code == 2 and "spec.models[0].uri" in r.output and "not published" in r.output, r.output
    ev["spec"]["models"][0]["uri"] = "s3://no-such-bucket/m"
    path.write_text(yaml.safe_dump(ev))
    r = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "bucket 'no-such-bucket' does not exist" in r.output, r.output


def test_spec_checkpoint_uri_is_validated():
    from pitlab.trainer.checkpoint import checkpoint_location

    assert checkpoint_location("s3://bucket-a/runs/x/", Path("/r")) == "s3://bucket-a/runs/x"
    assert checkpoint_location(None, Path("/r")) == Path("/r/checkpoint")
    assert checkpoint_location("/data/ckpt", Path("/r")) == Path("/data/ckpt")
    with pytest.raises(SpecError, match=r"spec\.checkpoint\.uri.*'ab' is not a valid bucket name"):
        checkpoint_location("s3://ab/x", Path("/r"))
    with pytest.raises(SpecError, match=r"spec\.checkpoint\.uri.*give a local path or s3://"):
        checkpoint_location("gs://bucket/x", Path("/r"))
