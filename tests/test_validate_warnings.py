"""`pitlab validate` says what the run would warn about once its inputs are read: found in a quant's trial, a
training label overlapping the test period and a knowledge cutoff inside the test window were named only at the
end of `pitlab run`, after the embedding."""

from __future__ import annotations

import json
import re

import yaml
from typer.testing import CliRunner

from pitlab.cli import app
from test_bad_inputs import bases, write_jpx  # noqa: F401 - fixtures


def test_validate_names_label_overlap_and_a_cutoff_in_the_test_window(bases, tmp_path):  # noqa: F811
    write_jpx(tmp_path / "jpx")
    doc = json.loads(json.dumps(bases["le"]))
    spec = doc["spec"]
    spec["dataset"]["dates"] = {"count": 40}
    spec["protocol"]["embargoDays"] = 0
    spec["models"][0]["knowledgeCutoff"] = "2021-11-01"
    path = tmp_path / "le.yaml"
    path.write_text(yaml.safe_dump(doc).replace("${TMP}", str(tmp_path)))
    r = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "400"})
    text = re.sub(r"\s+", " ", r.output)
    assert r.exit_code == 0, text
    overlap = re.search(r"warning: protocol\.embargoDays=0 < 2: the labels \(close t\+1 -> t\+2\) of (\d+) "
                        r"training row\(s\) dated ([0-9, -]+) overlap the test period starting 2021-10-18", text)
    # the sampled ones of the 2 sessions before the test start (40 of the 90 dates: 2021-10-14 only), 3 securities
    assert overlap and overlap.group(2) == "2021-10-14" and int(overlap.group(1)) == 3, text
    assert ("warning: model minilm: knowledge cutoff 2021-11-01 is on or after protocol.testStart 2021-10-18"
            in text)
    spec["protocol"]["embargoDays"] = 2  # the example's embargo and no typed cutoff: neither warning
    del spec["models"][0]["knowledgeCutoff"]
    path.write_text(yaml.safe_dump(doc).replace("${TMP}", str(tmp_path)))
    r = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "400"})
    assert r.exit_code == 0 and "overlap the test period" not in r.output and "knowledge cutoff" not in r.output
