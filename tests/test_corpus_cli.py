"""The corpus through the CLI: strict timestamps, warnings and a corpus too short to train on (exit 2, no traceback)."""

import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from pitlab.cli import app

EXAMPLE = "examples/local-sp500-fomc.yaml"
DAY_FIRST = ["15/03/2017", "01/04/2017", "02/04/2017", "20/04/2017"]


@pytest.fixture()
def spec(tmp_path):
    with open(EXAMPLE) as f:
        doc = yaml.safe_load(f)
    doc["spec"]["output"]["uri"] = str(tmp_path / "out")
    doc["spec"]["evaluations"] = []  # the corpus is what these tests are about
    return doc


def _invoke(tmp_path, doc, data_root, *args):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, [*args, str(path), "--data-root", str(data_root)], env={"COLUMNS": "400"})
    return r, re.sub(r"\s+", " ", r.output)


def _day_first_corpus(tmp_path, spec):
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("id,date,text\n" + "".join(f"s{i},{d},statement {i} {'text ' * 30}\n"
                                                  for i, d in enumerate(DAY_FIRST)))
    spec["spec"]["corpus"].update(uri=str(corpus), idField="id", timezone="Europe/London")
    spec["spec"]["knowledgeCutoff"] = "2017-03-31"
    return corpus


def test_day_first_corpus_is_refused_without_a_format(tmp_path, spec, data_root):
    """The issue's leak: 01/04/2017 and 02/04/2017 were read as January 4 and February 4 and kept."""
    corpus = _day_first_corpus(tmp_path, spec)
    r, out = _invoke(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 2
    assert (f"error: {corpus}: row 1 (line 2, id 's0'): timestamp '15/03/2017' does not match ISO 8601: YYYY-MM-DD or "
            "YYYY-MM-DDTHH:MM[:SS[.fff]], optionally ending in Z, ±HH:MM, ±HHMM or ±HH; it reads as '%d/%m/%Y': set "
            "spec.corpus.timestampFormat: \"%d/%m/%Y\" if the file writes every timestamp that way; fix the row, or "
            "set spec.corpus.onMissingTimestamp: drop to count and skip it") in out


def test_day_first_corpus_with_its_format_keeps_exactly_the_march_document(tmp_path, spec, data_root):
    from pitlab.api import load_resource
    from pitlab.trainer.inputs import check_corpus

    _day_first_corpus(tmp_path, spec)
    spec["spec"]["corpus"]["timestampFormat"] = "%d/%m/%Y"
    r, out = _invoke(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 0, out
    assert "corpus keeps 1 of 4 documents (latest 2017-03-15T00:00:00+00:00; timestamps %d/%m/%Y)" in out
    plan = check_corpus(load_resource(tmp_path / "spec.yaml"))
    assert [d.id for d in plan.documents] == ["s0"]
    assert (plan.audit.included, plan.audit.excluded_by_date, plan.audit.timestamp_format) == (1, 3, "%d/%m/%Y")


def test_a_mm_dd_value_in_a_day_first_file_is_refused(tmp_path, spec, data_root):
    corpus = _day_first_corpus(tmp_path, spec)
    corpus.write_text(corpus.read_text().replace("02/04/2017", "04/13/2017"))
    spec["spec"]["corpus"]["timestampFormat"] = "%d/%m/%Y"
    r, out = _invoke(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 2
    assert f"error: {corpus}: row 3 (line 4, id 's2'): timestamp '04/13/2017' does not match strftime pattern '%d/%m/%Y'" in out


def test_dropped_timestamps_are_listed_with_their_values(tmp_path, spec, data_root):
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("date,text\n2016-01-05," + "words " * 40 + "\n2016-01-06 10:00 EST,b\n")
    spec["spec"]["corpus"].update(uri=str(corpus), onMissingTimestamp="drop")
    r, out = _invoke(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 0, out
    assert "; 1 dropped for their timestamp (onMissingTimestamp: drop)" in out
    assert ("dropped row 2 (id 'row-2'): timestamp '2016-01-06 10:00 EST': zone abbreviation 'EST' refused "
            "(abbreviations are ambiguous: CST is US Central, China and Cuba); write the UTC offset (e.g. -05:00), "
            "or local times without a zone and spec.corpus.timezone") in out


def test_a_refused_pattern_names_the_field(tmp_path, spec, data_root):
    spec["spec"]["corpus"]["timestampFormat"] = "%Y-%m-%d %Z"
    r, out = _invoke(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 2
    assert "spec.corpus.timestampFormat: '%Y-%m-%d %Z': %Z (zone abbreviations such as EST or JST) is refused" in out


def test_validate_warns_when_the_cutoff_is_after_every_document(tmp_path, spec, data_root):
    spec["spec"]["knowledgeCutoff"] = "2026-06-30"
    r, out = _invoke(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 0, out
    assert "corpus keeps 235 of 235 documents" in out
    assert ("warning: knowledge cutoff 2026-06-30 is after the latest document (2026-03-18T00:00:00-04:00): no "
            "document was excluded, so the corpus, not the cutoff, ends what the model knows") in out


def test_bom_csv_corpus_validates(tmp_path, spec, data_root):
    src = data_root / "fomc_statements" / "fomc_statements_1994_2026.csv"
    corpus = tmp_path / "bom.csv"
    corpus.write_bytes(b"\xef\xbb\xbf" + src.read_bytes())
    spec["spec"]["corpus"]["uri"] = str(corpus)
    r, out = _invoke(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 0 and "corpus keeps 159 of 235 documents" in out


def test_a_corpus_shorter_than_one_sequence_is_refused_by_validate(tmp_path, spec, data_root):
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("date,text\n2016-01-05,a short statement\n2016-02-05,another\n")
    spec["spec"]["corpus"]["uri"] = str(corpus)
    r, out = _invoke(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 2
    assert ("spec.training.seqLen: the filtered corpus has at most 26 tokens (its 2 documents hold 24 UTF-8 bytes, one "
            "eos each), fewer than one packed sequence of seqLen + 1 = 129 tokens") in out


def test_a_corpus_shorter_than_one_sequence_is_refused_by_prepare(tmp_path, spec, data_root):
    """More bytes than seqLen + 1, fewer tokens: validate cannot know, prepare refuses before torchrun (exit 2)."""
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("date,text\n" + "".join(f"2016-01-0{i},{'a' * 200}\n" for i in range(1, 4)))
    spec["spec"]["corpus"]["uri"] = str(corpus)
    spec["spec"]["training"]["seqLen"] = 512
    spec["spec"]["baseModel"]["tokenizer"]["vocabSize"] = 300
    r, out = _invoke(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 0, out
    path = tmp_path / "spec.yaml"
    run_dir = tmp_path / "run"
    r = CliRunner().invoke(app, ["prepare", "--spec", str(path), "--run-dir", str(run_dir), "--data-root",
                                 str(data_root)], env={"COLUMNS": "400"})
    out = re.sub(r"\s+", " ", r.output)
    assert r.exit_code == 2, out
    m = re.search(r"spec.training.seqLen: the filtered corpus has (\d+) tokens, fewer than one packed sequence of "
                  r"seqLen \+ 1 = 513 tokens", out)
    assert m and int(m.group(1)) < 513
    assert not (run_dir / "data" / "tokens.npy").exists()
    assert json.loads((run_dir / "corpus_audit.json").read_text())["included"] == 3
    # a base model folder with its tokenizer (the one prepare just wrote): validate counts exactly as prepare does
    spec["spec"]["baseModel"] = {"uri": str(run_dir / "base")}
    r, out = _invoke(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 2
    assert (f"spec.training.seqLen: the filtered corpus has {m.group(1)} tokens, fewer than one packed sequence of "
            "seqLen + 1 = 513 tokens") in out
    spec["spec"]["corpus"]["uri"] = str(data_root / "fomc_statements" / "fomc_statements_1994_2026.csv")
    r, out = _invoke(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 0, out


def test_run_refuses_a_corpus_shorter_than_one_sequence_with_exit_2_and_a_failed_status(tmp_path, spec, data_root):
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("date,text\n" + "".join(f"2016-01-0{i},{'a' * 200}\n" for i in range(1, 4)))
    spec["spec"]["corpus"]["uri"] = str(corpus)
    spec["spec"]["training"]["seqLen"] = 512
    spec["spec"]["baseModel"]["tokenizer"]["vocabSize"] = 300
    r, out = _invoke(tmp_path, spec, data_root, "run")
    assert r.exit_code == 2, out
    assert "Traceback" not in out and "torchrun" not in out
    status = json.loads((tmp_path / "out" / "sp500-fomc-demo" / "status.json").read_text())["status"]
    prepared = next(c for c in status["conditions"] if c["type"] == "Prepared")
    assert status["phase"] == "Failed" and prepared["reason"] == "PrepareFailed"
    assert re.fullmatch(r"spec.training.seqLen: the filtered corpus has \d+ tokens, fewer than one packed sequence of "
                        r"seqLen \+ 1 = 513 tokens; lower spec.training.seqLen or give a corpus with more text up to "
                        r"the knowledge cutoff", prepared["message"])
    assert not (tmp_path / "out" / "sp500-fomc-demo" / "data" / "tokens.npy").exists()


def test_prepare_refuses_a_run_that_cannot_fit_its_gpus_before_reading_the_corpus(tmp_path, spec, data_root):
    """The prepare Job (the cluster's first stage) plans memory against spec.resources.gpuMemoryGiB, so a spec that
    cannot fit fails there (exit 2, the field named) before a TrainJob asks for its GPUs; the corpus is not read."""
    spec["spec"]["resources"]["gpuMemoryGiB"] = 1.5  # the demo model needs its 2 GiB reserve and a little more
    spec["spec"]["corpus"]["uri"] = str(tmp_path / "never-read.csv")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    run_dir = tmp_path / "run"
    r = CliRunner().invoke(app, ["prepare", "--spec", str(path), "--run-dir", str(run_dir), "--data-root",
                                 str(data_root)], env={"COLUMNS": "400"})
    out = re.sub(r"\s+", " ", r.output)
    assert r.exit_code == 2, out
    assert ("spec.resources.gpuMemoryGiB: predicted peak 2.0 GiB per GPU exceeds spec.resources.gpuMemoryGiB = 1.5 "
            "GiB; to fit, a GPU with more memory: no one change to the spec saves the 0.52 GiB missing") in out, out
    assert not run_dir.exists()
