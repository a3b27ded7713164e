"""Bad input: one clear message naming the field, file or column; non-zero exit; no output folder."""

import re

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from pitlab.cli import app

EXAMPLE = "examples/local-sp500-fomc.yaml"


@pytest.fixture()
def spec(tmp_path, data_root):
    with open(EXAMPLE) as f:
        doc = yaml.safe_load(f)
    doc["spec"]["output"]["uri"] = str(tmp_path / "out")
    return doc


def _run(tmp_path, doc, data_root, cmd="run"):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(app, [cmd, str(path), "--data-root", str(data_root)], env={"COLUMNS": "400"})
    return result, re.sub(r"\s+", " ", result.output)


def _no_output(tmp_path):
    return not (tmp_path / "out").exists()


def test_unknown_field(tmp_path, spec, data_root):
    spec["spec"]["training"]["seqLength"] = 64
    r, out = _run(tmp_path, spec, data_root)
    assert r.exit_code == 2 and "spec.training.seqLength: unknown field" in out and _no_output(tmp_path)


def test_wrong_type(tmp_path, spec, data_root):
    spec["spec"]["tokens"] = "lots"
    r, out = _run(tmp_path, spec, data_root)
    assert r.exit_code == 2 and "spec.tokens: Input should be a valid integer" in out and _no_output(tmp_path)


def test_test_start_not_after_train_end(tmp_path, spec, data_root):
    spec["spec"]["evaluations"][0]["spec"]["protocol"]["testStart"] = "2016-06-30"
    r, out = _run(tmp_path, spec, data_root)
    assert r.exit_code == 2 and "testStart (2016-06-30) must be after trainEnd (2016-12-31)" in out
    assert "spec.evaluations[0].spec.protocol" in out and _no_output(tmp_path)


def test_corpus_without_document_before_cutoff(tmp_path, spec, data_root):
    spec["spec"]["knowledgeCutoff"] = "1990-01-01"
    r, out = _run(tmp_path, spec, data_root)
    assert r.exit_code == 2 and "no document at or before the knowledge cutoff 1990-01-01" in out
    assert "fomc_statements_1994_2026.csv" in out and _no_output(tmp_path)


def test_corpus_row_with_missing_timestamp(tmp_path, spec, data_root):
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("date,text\n2015-01-02,a statement\n,undated statement\n")
    spec["spec"]["corpus"]["uri"] = str(corpus)
    r, out = _run(tmp_path, spec, data_root)
    assert r.exit_code == 2 and "corpus.csv: row 2 (id 'row-2'): missing or unparseable timestamp" in out
    assert _no_output(tmp_path)


def test_panel_missing_column(tmp_path, spec, data_root):
    panel = tmp_path / "panel.csv"
    pd.DataFrame({"date": ["2016-01-04"], "open": [1.0], "high": [1.0], "low": [1.0], "volume": [10],
                  "Name": ["A"]}).to_csv(panel, index=False)
    spec["spec"]["evaluations"][0]["spec"]["dataset"]["uri"] = str(panel)
    r, out = _run(tmp_path, spec, data_root)
    assert r.exit_code == 2 and "panel.csv: missing column(s) ['close']" in out and _no_output(tmp_path)


def test_missing_data_root(tmp_path, spec):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "400", "PITLAB_DATA_ROOT": ""})
    out = re.sub(r"\s+", " ", r.output)
    assert r.exit_code == 2 and "spec.corpus.uri" in out and "PITLAB_DATA_ROOT}, which is not set" in out


def test_validate_ok(tmp_path, spec, data_root):
    r, out = _run(tmp_path, spec, data_root, cmd="validate")
    assert r.exit_code == 0, out
    assert "valid PitTraining 'sp500-fomc-demo'; corpus keeps 159 of 235 documents" in out


def test_evaluation_dates_the_prices_cannot_supply_are_refused_before_training(tmp_path, spec, data_root):
    """Found by a new user: dates after the panel's end passed validation and failed only after training."""
    spec["spec"]["evaluations"][0]["spec"]["dataset"]["dates"] = {"count": 30, "start": "2019-01-01",
                                                                   "end": "2020-01-01"}
    r, out = _run(tmp_path, spec, data_root)
    assert r.exit_code == 2 and _no_output(tmp_path)
    assert ("spec.evaluations[0].spec.dataset.dates.count: 30 dates requested but only 0 trading days are "
            "eligible (20 days of history before, 2 days after, inside dates.start..end = 2019-01-01..2020-01-01); "
            "the prices cover 2013-02-08..2018-02-07") in out
    r, out = _run(tmp_path, spec, data_root, cmd="validate")
    assert r.exit_code == 2 and "dataset.dates.count: 30 dates requested" in out
