"""The helpers that run inside the pods: results and audit as termination messages, progress lines,
indexed embedding."""

import json
import sys
from pathlib import Path

import pytest

from pitlab.operator import workload
from pitlab.api.summary import PROGRESS_PREFIX, TERMINATION_LIMIT

PY = sys.executable


def test_report_results_writes_the_summary_after_the_command(tmp_path: Path) -> None:
    results, log = tmp_path / "results.json", tmp_path / "termination-log"
    doc = {"models": [{"name": "base", "r2_off": 0.01, "r2_on": 0.22, "premium": 0.21, "premium_ci": [0.14, 0.35],
                       "verdict": "significant"}], "reductions": []}
    cmd = [PY, "-c", f"import json; json.dump({doc!r}, open({str(results)!r}, 'w'))"]
    rc = workload.main(["report-results", "--results", str(results), "--report", "/e/report.md",
                        "--termination-log", str(log), "--", *cmd])
    assert rc == 0
    assert json.loads(log.read_text()) == {"reportUri": "/e/report.md", "results": {"models": {"base": {
        "r2Off": 0.01, "r2On": 0.22, "premium": 0.21, "premiumCI": [0.14, 0.35], "verdict": "significant"}},
        "reductions": []}}


def test_a_failing_command_writes_no_message(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    rc = workload.main(["report-audit", "--audit", str(tmp_path / "a.json"), "--termination-log", str(log), "--",
                        PY, "-c", "import sys; print('error: spec.corpus.uri: no such file', file=sys.stderr); "
                                  "sys.exit(2)"])
    assert rc == 2 and not log.exists()  # the kubelet falls back to the log lines


def test_report_audit(tmp_path: Path) -> None:
    audit, log = tmp_path / "corpus_audit.json", tmp_path / "log"
    audit.write_text(json.dumps({"included": 159, "excluded_by_date": 76, "rejected_timestamp": 0,
                                 "max_included_timestamp": "2016-12-14", "included_ids_sha256": "ab", "total": 235}))
    assert workload.main(["report-audit", "--audit", str(audit), "--termination-log", str(log), "--", PY, "-c", ""]) == 0
    assert json.loads(log.read_text()) == {"corpusAudit": {"included": 159, "excludedByDate": 76,
                                                           "rejectedTimestamp": 0, "maxIncludedTimestamp": "2016-12-14",
                                                           "includedIdsSha256": "ab"}}


def test_termination_message_limit(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exceeds 4096"):
        workload.write_termination_message({"x": "y" * TERMINATION_LIMIT}, str(tmp_path / "log"))
    # a panel too large for the full summary keeps premium, CI and verdict per model
    results, log = tmp_path / "results.json", tmp_path / "termination-log"
    models = [{"name": f"model-{i:02d}", "r2_off": 0.0123456, "r2_on": 0.0234567, "premium": 0.0111111,
               "premium_ci": [-0.0011111, 0.0222222], "verdict": "not significant"} for i in range(40)]
    results.write_text(json.dumps({"models": models, "reductions": []}))
    assert workload.main(["report-results", "--results", str(results), "--report", "/e/r.md",
                          "--termination-log", str(log), "--", PY, "-c", ""]) == 0
    doc = json.loads(log.read_text())
    assert len(log.read_bytes()) <= TERMINATION_LIMIT and doc["results"]["truncated"] is True
    assert doc["results"]["models"]["model-39"] == {"premium": 0.0111111, "premiumCI": [-0.0011111, 0.0222222],
                                                    "verdict": "not significant"}
    # with the decomposition, the headline (market-neutral) premium is what a truncated summary keeps: 18 models
    # keep both premia, 30 the headline only
    for n, kept in ((18, ("marketNeutralPremium", "marketNeutralCI", "marketNeutralVerdict", "premium", "premiumCI",
                          "verdict")), (30, ("marketNeutralPremium", "marketNeutralCI", "marketNeutralVerdict"))):
        mn = {"premium": 0.0022222, "premium_ci": [-0.0033333, 0.0044444], "verdict": "not significant"}
        results.write_text(json.dumps({"models": [{**m, "market_neutral": mn} for m in models[:n]],
                                       "reductions": []}))
        assert workload.main(["report-results", "--results", str(results), "--report", "/e/r.md",
                              "--termination-log", str(log), "--", PY, "-c", ""]) == 0
        doc = json.loads(log.read_text())
        assert len(log.read_bytes()) <= TERMINATION_LIMIT and doc["results"]["truncated"] is True
        assert sorted(doc["results"]["models"][f"model-{n - 1:02d}"]) == sorted(kept)
        assert doc["results"]["models"][f"model-{n - 1:02d}"]["marketNeutralCI"] == [-0.0033333, 0.0044444]


def test_progress_prints_the_newest_record_once(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step":1,"total_steps":9,"loss":3.0,"tokens_per_second":100.0,"mean_tokens_per_second":100.0}\n'
                       '{"step":2,"total_steps":9,"loss":2.5,"tokens_per_second":140.0,"mean_tokens_per_second":120.0}'
                       '\n{"step":3,"tot')
    assert workload.main(["progress", "--metrics", str(metrics), "--interval", "0", "--max-polls", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [PROGRESS_PREFIX + '{"loss":2.5,"step":2,"tokensPerSecond":120.0,"totalSteps":9}']
    assert workload.main(["progress", "--metrics", str(tmp_path / "missing"), "--interval", "0",
                          "--max-polls", "1"]) == 0
    assert capsys.readouterr().out == ""


def test_embed_index_runs_the_model_of_its_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    command = [PY, "-c", f"open({str(out)!r}, 'w').write('{{model}}')"]
    assert workload.embed_index("a,b,c", command, {"JOB_COMPLETION_INDEX": "1"}) == 0 and out.read_text() == "b"
    assert workload.embed_index("a,b,c", command, {"JOB_COMPLETION_INDEX": "3"}) == 2
    # through the command line, as the indexed Job runs it (the command after -- is not parsed)
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "2")
    assert workload.main(["embed-index", "--models", "a,b,c", "--", *command]) == 0 and out.read_text() == "c"
    assert workload.main(["embed-index", "--models", "a,b,c", "--", PY, "-c", "import sys; sys.exit(3)"]) == 3
    assert workload.main(["embed-index", "--", PY]) == 2  # --models missing: a usage error
