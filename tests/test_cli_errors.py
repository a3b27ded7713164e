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
    assert r.exit_code == 2 and "corpus.csv: row 2 (line 3, id 'row-2'): missing timestamp (field 'date' is empty)" in out
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
    # a new user's trial: validate pointed at a results.json it does not write
    assert ("panel of sp500-leakage: 8,994 rows (30 dates × 300 securities); 6 of 9,000 sampled rows dropped: 6 "
            "without features" in out)
    assert "no close or volume on 2013-04-26 (+3 more in the run's results.json; validate writes no file)" in out


def test_a_dotted_name_kubectl_accepts_is_valid(tmp_path, spec, data_root):
    """Found by a new user: ``qwen3.5-pit`` is a valid name for ``kubectl apply`` but pitlab refused it."""
    spec["metadata"]["name"] = "qwen3.5-pit"
    for m in spec["spec"]["evaluations"][0]["spec"]["models"]:
        if "trainingRef" in m:
            m["trainingRef"]["name"] = "qwen3.5-pit"
    r, out = _run(tmp_path, spec, data_root, cmd="validate")
    assert r.exit_code == 0 and "valid PitTraining 'qwen3.5-pit'; corpus keeps 159 of 235 documents" in out, out


RULE = ("a resource name has at most 253 characters, only lowercase letters a-z, digits 0-9, '-' and '.', starts "
        "and ends with a letter or digit, and has a letter or digit on both sides of every '.'")


@pytest.mark.parametrize("name, problem", [
    ("Qwen3.5-pit", "has an uppercase letter 'Q' at position 1"),
    ("qwen_pit", "has a character that is not allowed '_' at position 5"),
    ("qwen..pit", "has '..' at position 5"),
    ("qwen.-pit", "has '.-' at position 5"),
    ("-qwen", "starts with '-'"),
    ("qwen.", "ends with '.'"),
    ("a" * 254, "has 254 characters (at most 253)"),
])
def test_names_the_api_server_refuses_are_refused_in_words(tmp_path, spec, data_root, name, problem):
    spec["metadata"]["name"] = name
    r, out = _run(tmp_path, spec, data_root)
    assert r.exit_code == 2 and f"spec.yaml: metadata.name: {problem}; {RULE}" in out, out
    assert f"(got '{name}')" in out and _no_output(tmp_path)


def test_evaluation_and_model_names_are_refused_in_words(tmp_path, spec, data_root):
    spec["spec"]["evaluations"][0]["name"] = "leak.2016"
    spec["spec"]["evaluations"][0]["spec"]["models"][0]["name"] = "base model"
    r, out = _run(tmp_path, spec, data_root, cmd="validate")
    assert r.exit_code == 2
    assert ("spec.evaluations[0].name: has a character that is not allowed '.' at position 5; an evaluation name "
            "has at most 63 characters, only lowercase letters a-z, digits 0-9 and '-', and starts and ends with a "
            "letter or digit (e.g. 'leakage-2016') (got 'leak.2016')") in out, out
    assert ("spec.evaluations[0].spec.models[0].name: a model name has at most 63 characters, only letters, "
            "digits, '_', '.' and '-', and starts with a letter or digit (e.g. 'Qwen2.5_0.5B') (got 'base model')"
            ) in out, out


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


# ------------------------------------------------------------------------- help, --version, unwrapped log lines
def _help(args, columns=400):
    r = CliRunner().invoke(app, args, env={"COLUMNS": str(columns)}, prog_name="pitlab")
    assert r.exit_code == 0, r.output
    return r.output


def test_run_help_shows_flags_without_a_value_and_the_argument_as_FILE():
    """Found by a new user: typer 0.29's rich help printed `--overwrite <bool>`, `--help <bool>` and `{file}`.
    pitlab uses click's plain formatter (rich_markup_mode=None); `{FILE}` in the usage line is typer's mark
    of a required argument."""
    out = _help(["run", "--help"], columns=120)
    assert "Usage: pitlab run [OPTIONS] {FILE}\n" in out
    assert "<bool>" not in out and "{file}" not in out
    assert re.search(r"\n  --overwrite +Replace the run's existing folders: out/<name>/", out), out
    assert re.search(r"\n  --help +Show this message and exit\.\n", out), out
    assert re.search(r"\n  FILE <path> +PitTraining or LeakageEval YAML\. +\[required\]\n", out), out
    assert re.search(r"\n  --nproc N +torchrun processes", out), out  # options that take a value name it
    plan = _help(["plan", "--help"], columns=120)  # a new user's trial: typer printed `--nproc <int range>`
    assert re.search(r"\n  --nproc N +Plan a `pitlab run --nproc N`", plan) and "int range" not in plan, plan
    assert re.search(r"\n  --overwrite +Replace an existing out/<name>/ folder",
                     _help(["evaluate", "--help"], columns=120))  # found undocumented by a new user
    assert "Usage: pitlab push [OPTIONS] {SRC} {DEST}\n" in _help(["push", "--help"])
    r = CliRunner().invoke(app, ["run"], env={"COLUMNS": "120"})
    assert r.exit_code == 2 and "Missing argument 'FILE'." in r.output


def test_help_texts_flow_as_paragraphs():
    """Found by a new user: hard-wrapped docstrings broke the help mid-sentence ("…or the / evaluation alone").
    click's formatter re-wraps every paragraph to the width it has, so no line ends where the docstring did."""
    out = _help(["run", "--help"], columns=120)
    flat = " ".join(out.split())
    assert ("Run a resource on this machine: corpus filter → train → merge → evaluate (PitTraining), or the "
            "evaluation alone (LeakageEval). Writes out/<name>/ (and out/<evaluation name>/ for each evaluation) with "
            "status.json as the operator would.") in flat
    assert not any(line.rstrip().endswith("or the") for line in out.splitlines()), out  # the docstring's break
    top = _help(["--help"], columns=120)
    commands = top.split("Commands:")[1].split("Exit codes")[0]
    assert "Run a PitTraining (filter → train → merge → evaluate) or a LeakageEval on this machine." in " ".join(
        commands.split())
    assert "..." not in commands, commands  # found by a new user: click cut long first sentences off with "..."
    assert len(re.findall(r"\n  [a-z]+ +\S", commands)) == 13


def test_version_and_exit_codes_in_the_top_level_help():
    from importlib.metadata import version

    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output == f"pitlab {version('pitlab')}\n"
    assert ("Exit codes: 0 success; 2 bad input (a spec, file, column or argument is wrong; found before anything "
            "runs); 1 a stage failed (training, merge, evaluation, an upload or download); 3 `pitlab plan`: the run "
            "does not fit the GPU memory; 130 `pitlab run` was interrupted (SIGINT or SIGTERM; status Interrupted). "
            "(`pitlab train`, the pods' entry point, exits 2 on any pitlab error, a non-finite loss or an OS "
            "error, and 1 with a traceback on anything unexpected.)") in " ".join(
        _help(["--help"]).split())


def test_error_lines_are_not_wrapped_off_a_terminal(tmp_path, spec, data_root):
    """Found by a new user: in a log the error broke at ~155 columns ("235 \\ndocuments read"), defeating grep.
    Timestamps in the message are in the cutoff's time zone."""
    spec["spec"]["knowledgeCutoff"] = "1990-01-01"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = CliRunner().invoke(app, ["run", str(path), "--data-root", str(data_root)])  # no COLUMNS: a log
    src = data_root / "fomc_statements" / "fomc_statements_1994_2026.csv"
    assert r.exit_code == 2
    assert (f"error: {src}: no document at or before the knowledge cutoff 1990-01-01 (America/New_York); 235 "
            "documents read, earliest timestamp 1994-02-04T00:00:00-05:00") in r.output.splitlines()


def test_validate_gives_the_latest_document_in_the_cutoffs_timezone(tmp_path, spec, data_root):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = CliRunner().invoke(app, ["validate", str(path), "--data-root", str(data_root)])
    assert r.exit_code == 0
    assert (f"✓ {path}: valid PitTraining 'sp500-fomc-demo'; corpus keeps 159 of 235 documents "
            "(latest 2016-12-14T00:00:00-05:00; timestamps iso8601)") in r.output.splitlines()


def test_plan_refuses_a_gpu_smaller_than_the_cuda_context():
    result = CliRunner().invoke(app, ["plan", "examples/local-lora-streaming.yaml", "--gpu-memory-gib", "0.4"],
                                env={"COLUMNS": "400"})
    assert result.exit_code == 2
    assert "--gpu-memory-gib: 0.4 GiB: must exceed the 0.5 GiB a CUDA context takes" in result.output


def test_an_input_error_found_after_the_schema_names_the_spec_file(tmp_path, spec, data_root):
    """Found by a new user: a schema error began with the spec's file name, a missing data file's did not."""
    spec["spec"]["evaluations"][0]["spec"]["dataset"]["uri"] = "${PITLAB_DATA_ROOT}/sp500_5yr/sp500_5y_ohlcv.csv.gz"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    r = CliRunner().invoke(app, ["validate", str(path), "--data-root", str(data_root)], env={"COLUMNS": "400"})
    assert r.exit_code == 2
    line = next(x for x in r.output.splitlines() if x.startswith("error:"))
    assert line.startswith(f"error: {path}: spec.evaluations[0].spec.dataset.uri: "), line
    assert line.endswith(f"{data_root / 'sp500_5yr'} holds no 'sp500_5y_ohlcv.csv.gz'; did you mean "
                         "'sp500_5yr_ohlcv_long.csv.gz'?)"), line


@pytest.mark.parametrize("cmd", ["validate", "plan", "run"])
def test_a_trainer_setting_of_the_environment_it_would_refuse_stops_every_command_first(tmp_path, spec, data_root,
                                                                                          cmd):
    """Found by a new user: ``PITLAB_COMPILE_MODE=fast`` passed ``validate`` and ``plan``, was ignored on the CPU
    and failed each GPU rank only after the model loaded. ``validate``, ``plan`` and ``run`` now refuse it with
    exit 2 before any work, naming the variable and the values it takes (both knobs at once), and write nothing."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {"COLUMNS": "400", "PITLAB_COMPILE_MODE": "fast", "PITLAB_FUSED_STEP_SHAPES": "rows8"}
    r = CliRunner().invoke(app, [cmd, str(path), "--data-root", str(data_root)], env=env)
    out = re.sub(r"\s+", " ", r.output)
    assert r.exit_code == 2, out
    assert ("environment variable PITLAB_COMPILE_MODE: 'fast': give one of default, reduce-overhead, max-autotune, "
            "max-autotune-no-cudagraphs") in out
    assert "environment variable PITLAB_FUSED_STEP_SHAPES: 'rows8': give one of dynamic, rows16, static, grouped" in out
    assert _no_output(tmp_path)


def test_validate_of_a_missing_input_points_at_schema_only(tmp_path, spec, data_root):
    """A cluster spec's corpus is not on this machine: validate names the field and offers --schema-only, which
    then passes; a schema error gets no such hint."""
    spec["spec"]["corpus"]["uri"] = "corpora/not-here.csv"
    r, out = _run(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 2 and "spec.corpus.uri: 'corpora/not-here.csv' does not exist" in out
    assert f"hint: a cluster spec's inputs live on the cluster's volume: `pitlab validate --schema-only " \
           f"{tmp_path / 'spec.yaml'}` checks its schema alone" in out
    ok = CliRunner().invoke(app, ["validate", str(tmp_path / "spec.yaml"), "--schema-only"], env={"COLUMNS": "400"})
    assert ok.exit_code == 0 and "valid PitTraining" in ok.output
    spec["spec"]["tokens"] = "lots"
    r, out = _run(tmp_path, spec, data_root, "validate")
    assert r.exit_code == 2 and "spec.tokens" in out and "--schema-only" not in out


def test_missing_input_is_told_by_its_class_not_its_words(tmp_path):
    """The --schema-only hint follows a :class:`MissingInputError` (kept through ``from_file``), not any spec error
    whose message happens to say "does not exist" (a ``--resume`` folder, a bucket)."""
    from pitlab.api.load import resolve_local_path
    from pitlab.cli.errors import from_file
    from pitlab.cli.validate import _missing_input
    from pitlab.errors import MissingInputError, SpecError

    with pytest.raises(MissingInputError) as e:
        resolve_local_path(str(tmp_path / "absent.csv"), "spec.corpus.uri")
    named = from_file(e.value, "spec.yaml")
    assert type(named) is MissingInputError and named.source == "spec.yaml" and _missing_input(named)
    assert str(named) == f"spec.yaml: spec.corpus.uri: {str(tmp_path / 'absent.csv')!r} does not exist"
    worded = SpecError([("--resume", "out/pit does not exist: there is no run of PitTraining")])
    assert not _missing_input(worded) and not _missing_input(from_file(worded, "spec.yaml"))
