"""`pitlab run --resume` refuses what it cannot continue: no earlier run, a changed spec, a changed corpus, an
evaluation folder of another resource, --overwrite with it. (The bit-identical resume itself:
tests/test_interrupt.py.)"""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml
from typer.testing import CliRunner

from pitlab.api import ResourceStatus, SpecError, dump_resource, load_resource
from pitlab.api.status import CorpusAuditStatus
from pitlab.cli import app
from pitlab.resume import check_same_corpus, first_difference, resumable_status
from test_bad_inputs import bases, write_corpus, write_jpx, write_ohlcv  # noqa: F401 - fixtures


@pytest.fixture()
def pt(bases, tmp_path):
    write_ohlcv(tmp_path / "panel.csv")
    write_corpus(tmp_path / "corpus.csv")
    write_jpx(tmp_path / "jpx")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(bases["pt"]).replace("${TMP}", str(tmp_path)))
    return path


def _interrupted_run(res, root, **status):
    run_dir = root / res.metadata.name
    run_dir.mkdir(parents=True)
    doc = dump_resource(res)
    doc["status"] = {"phase": "Interrupted", **status}
    (run_dir / "status.json").write_text(json.dumps(doc))
    return run_dir


def _invoke(*args):
    r = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})
    return r.exit_code, re.sub(r"\s+", " ", r.output)


def test_first_difference_names_the_field():
    assert first_difference({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}, "spec") == ("spec.a.b[1]", 2, 3)
    assert first_difference({"a": 1}, {"a": 1, "c": 2}, "spec") == ("spec.c", None, 2)
    assert first_difference({"a": [1]}, {"a": [1, 2]}, "spec") == ("spec.a", [1], [1, 2])
    assert first_difference({"a": 1.0}, {"a": 1.0}, "spec") is None


def test_nothing_to_resume(pt, tmp_path):
    code, out = _invoke("run", pt, "--resume")
    assert code == 2
    assert f"--resume: {tmp_path}/out/sp500-fomc-demo/status.json does not exist: there is no run of PitTraining " \
           "'sp500-fomc-demo' to resume" in out


def test_a_changed_spec_is_refused_naming_the_field(pt, tmp_path):
    res = load_resource(pt)
    run_dir = _interrupted_run(res, tmp_path / "out")
    doc = yaml.safe_load(pt.read_text())
    doc["spec"]["training"]["seqLen"] = 32
    pt.write_text(yaml.safe_dump(doc))
    before = (run_dir / "status.json").read_bytes()
    code, out = _invoke("run", pt, "--resume")
    assert code == 2
    assert f"spec.training.seqLen: changed since the run in {run_dir} started (was 128, now 32); a resume " \
           "continues the same spec" in out
    assert (run_dir / "status.json").read_bytes() == before


def test_an_evaluation_folder_of_another_resource_is_refused(pt, tmp_path):
    res = load_resource(pt)
    _interrupted_run(res, tmp_path / "out")
    other = tmp_path / "out" / "sp500-leakage"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(SpecError) as err:
        resumable_status(res, tmp_path / "out")
    assert err.value.problems[0][0] == "spec.evaluations[0].name"
    assert "was written by no pitlab run (no status.json; 1 entries), not by this run's evaluation" in str(err.value)


def test_a_changed_corpus_is_refused(pt, tmp_path):
    res = load_resource(pt)
    audit = CorpusAuditStatus(included=1, excluded_by_date=0, rejected_timestamp=0, max_included_timestamp=None,
                              included_ids_sha256="a" * 64)
    status = ResourceStatus(corpus_audit=audit)

    class Now:
        included_ids_sha256 = "b" * 64
    with pytest.raises(SpecError, match=r"spec.corpus.uri: the documents kept at the cutoff changed since the run "
                                        r"started \(included ids sha256 aaaaaaaaaaaa… then, bbbbbbbbbbbb… now\)"):
        check_same_corpus(res, status, Now())


def test_an_edited_kept_document_is_refused(pt, tmp_path):
    """Found by a trial: a kept document's text edited between the interruption and --resume went unnoticed (the
    kept ids were the same). The digest covers id, timestamp and text of every kept document."""
    import datetime as dt

    from pitlab.data import filter_corpus, read_corpus

    f = tmp_path / "c.csv"
    f.write_text("id,date,text\na,2010-01-01,one\nb,2010-01-02,two\n")
    _, before = filter_corpus(read_corpus(f, "csv", "text", "date", "UTC", id_field="id"), dt.date(2016, 12, 31), "UTC")
    f.write_text("id,date,text\na,2010-01-01,one EDITED\nb,2010-01-02,two\n")
    _, after = filter_corpus(read_corpus(f, "csv", "text", "date", "UTC", id_field="id"), dt.date(2016, 12, 31), "UTC")
    assert before.included_ids_sha256 == after.included_ids_sha256 and before.included_sha256 != after.included_sha256
    status = ResourceStatus(corpus_audit=CorpusAuditStatus(
        included=2, excluded_by_date=0, rejected_timestamp=0, max_included_timestamp=None,
        included_ids_sha256=before.included_ids_sha256, included_sha256=before.included_sha256))
    check_same_corpus(load_resource(pt), status, before)  # unchanged: no error
    with pytest.raises(SpecError, match=rf"spec.corpus.uri: a document kept at the cutoff changed since the run "
                                        rf"started \(the same ids, but the kept documents' sha256 was "
                                        rf"{before.included_sha256[:12]}… then and is {after.included_sha256[:12]}… "
                                        rf"now: a text or timestamp was edited\)"):
        check_same_corpus(load_resource(pt), status, after)


def test_resume_and_overwrite_exclude_each_other(pt):
    code, out = _invoke("run", pt, "--resume", "--overwrite")
    assert code == 2 and "error: --resume and --overwrite exclude each other: --resume continues" in out


def test_a_succeeded_run_is_returned_as_it_is(pt, tmp_path):
    import pitlab.local as local

    res = load_resource(pt)
    run_dir = _interrupted_run(res, tmp_path / "out")
    doc = json.loads((run_dir / "status.json").read_text())
    doc["status"]["phase"] = "Succeeded"
    (run_dir / "status.json").write_text(json.dumps(doc))
    assert local.run_pittraining_local(res, tmp_path / "out", resume=True)["status"]["phase"] == "Succeeded"


def test_an_empty_evaluation_folder_is_free_for_a_resume(pt, tmp_path):
    res = load_resource(pt)
    _interrupted_run(res, tmp_path / "out")
    (tmp_path / "out" / "sp500-leakage").mkdir()
    assert resumable_status(res, tmp_path / "out").phase == "Interrupted"


def test_a_plain_run_over_an_interrupted_one_suggests_resume_first(pt, tmp_path):
    res = load_resource(pt)
    run_dir = _interrupted_run(res, tmp_path / "out")
    before = (run_dir / "status.json").read_bytes()
    code, out = _invoke("run", pt)
    assert code == 2, out
    assert f"metadata.name: {run_dir} holds an unfinished run of PitTraining 'sp500-fomc-demo' (status Interrupted " \
           f"in {run_dir / 'status.json'}): continue it with `pitlab run --resume {pt}`, or pass --overwrite to " \
           f"start again (the unfinished run, checkpoints included, is kept in {tmp_path / 'out' / '.replaced'}/ " \
           "until the new run succeeds)" in out
    assert (run_dir / "status.json").read_bytes() == before
    code, out = _invoke("validate", pt)
    assert code == 0 and "(or --resume, to continue its unfinished run: status Interrupted)" in out
    doc = json.loads(before)
    doc["status"]["phase"] = "Succeeded"  # a finished run: nothing to resume, --overwrite only
    (run_dir / "status.json").write_text(json.dumps(doc))
    code, out = _invoke("run", pt)
    assert code == 2 and "--resume" not in out and "pass --overwrite to replace it (the old one is kept in " \
                                                   f"{tmp_path / 'out' / '.replaced'}/ until the new run succeeds)" in out


def test_a_stage_done_without_running_shows_skipped(monkeypatch):
    """A resume reports the stages done before the interruption as skipped, not as a negative duration."""
    import io

    from rich.console import Console

    from pitlab.cli import output

    buf = io.StringIO()
    monkeypatch.setattr(output, "console", Console(file=buf, width=200))
    reporter = output.RichReporter(None)
    reporter.done("prepare", "done before the interruption")
    reporter.stage("train")
    reporter.done("train", "trained")
    lines = buf.getvalue().splitlines()
    assert lines[0].endswith("prepare done before the interruption (skipped)") and "-0.0" not in buf.getvalue()
    assert re.search(r"train trained \(\d+\.\d s\)$", lines[-1])


def test_the_interrupted_message_names_the_durable_checkpoint(tmp_path):
    from pitlab.cli.run import interrupted_detail

    status = tmp_path / "status.json"
    status.write_text(json.dumps({"status": {"phase": "Interrupted", "conditions": [
        {"type": "Prepared", "status": "True", "reason": "Prepared", "message": "ok"},
        {"type": "Trained", "status": "False", "reason": "Interrupted",
         "message": "interrupted by SIGINT during train; last durable checkpoint: out/x/checkpoint/step-4"}]}}))
    assert interrupted_detail(status) == ": interrupted by SIGINT during train; last durable checkpoint: " \
                                          "out/x/checkpoint/step-4"
    assert interrupted_detail(tmp_path / "missing.json") == ""


def test_validate_and_run_do_not_offer_a_resume_the_changed_spec_would_refuse(pt, tmp_path):
    res = load_resource(pt)
    run_dir = _interrupted_run(res, tmp_path / "out")
    doc = yaml.safe_load(pt.read_text())
    was = doc["spec"]["tokens"]
    doc["spec"]["tokens"] = was + 1
    pt.write_text(yaml.safe_dump(doc))
    refused = (f"spec.tokens: changed since the run in {run_dir} started (was {was}, now {was + 1}); a resume "
               "continues the same spec: revert the change, or run with --overwrite to start again")
    code, out = _invoke("validate", pt)
    assert code == 0 and "--resume, to continue" not in out
    assert f"its unfinished run (status Interrupted) cannot be resumed with this spec: {refused}" in out
    code, out = _invoke("run", pt)
    assert code == 2 and "continue it with" not in out
    assert (f"(status Interrupted in {run_dir / 'status.json'}): it cannot be resumed with this spec ({refused}): "
            "pass --overwrite to start again") in out
    code, out = _invoke("run", pt, "--resume")
    assert code == 2 and refused in out  # what both named


def test_an_interruption_before_the_run_folder_offers_no_resume(tmp_path):
    """Ctrl-C while the inputs are checked: no status.json (nothing to resume), or an earlier run's that
    --overwrite had not replaced yet (named as it is); only a run that wrote Interrupted gets the resume command."""
    from pitlab.cli.run import interrupted_message

    run = tmp_path / "t2"
    assert interrupted_message("SIGINT", run, "pitlab run --resume t2.yaml") == (
        f"interrupted by SIGINT before the run wrote {run}: nothing to resume; run the same command again to start it")
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"status": {"phase": "Succeeded", "conditions": []}}))
    assert interrupted_message("SIGTERM", run, "again") == (
        f"interrupted by SIGTERM before the run started: {run} is as before (status Succeeded, {run / 'status.json'})")
    (run / "status.json").write_text(json.dumps({"status": {"phase": "Interrupted", "conditions": [
        {"type": "Trained", "status": "False", "reason": "Interrupted", "message": "no durable checkpoint"}]}}))
    assert interrupted_message("SIGINT", run, "again") == (
        f"interrupted by SIGINT; status Interrupted ({run / 'status.json'}): no durable checkpoint; continue with "
        "`again`")


def test_the_resume_advice_keeps_out_and_a_finished_run_is_not_resumed(pt, tmp_path):
    res = load_resource(pt)
    root = tmp_path / "elsewhere"
    run_dir = _interrupted_run(res, root)
    code, out = _invoke("run", pt, "--out", root)
    assert code == 2 and f"continue it with `pitlab run --resume {pt} --out {root}`" in out
    doc = json.loads((run_dir / "status.json").read_text())
    doc["status"]["phase"] = "Succeeded"
    (run_dir / "status.json").write_text(json.dumps(doc))
    before = (run_dir / "status.json").read_bytes()
    code, out = _invoke("run", pt, "--out", root, "--resume")
    assert code == 0, out
    assert f"--resume: nothing to resume: {run_dir} had already succeeded" in out and "Succeeded in" not in out
    assert (run_dir / "status.json").read_bytes() == before


def test_an_interrupted_run_names_the_command_that_resumes_it(pt, tmp_path, monkeypatch):
    import pitlab.local as local

    def interrupted(res, root, *args, **kwargs):  # as the runner does: status Interrupted, then the signal
        (root / res.metadata.name).mkdir(parents=True, exist_ok=True)
        (root / res.metadata.name / "status.json").write_text(json.dumps({"status": {"phase": "Interrupted"}}))
        raise local.Interrupted("SIGTERM")

    monkeypatch.setattr(local, "run_pittraining_local", interrupted)
    monkeypatch.setenv("PITLAB_DATA_ROOT", str(tmp_path))  # restored after the test (pitlab run exports its own)
    code, out = _invoke("run", pt, "--out", tmp_path / "o", "--nproc", 2)
    assert code == 130
    assert "interrupted by SIGTERM; status Interrupted" in out
    assert f"continue with `pitlab run --resume {pt} --out {tmp_path / 'o'} --nproc 2`" in out  # root from the env
    code, out = _invoke("run", pt, "--data-root", tmp_path / "data", "--nproc", 2)
    assert code == 130 and f"continue with `pitlab run --resume {pt} --data-root {tmp_path / 'data'} --nproc 2`" in out


def test_report_on_a_training_folder_points_at_its_evaluations(pt, tmp_path):
    run_dir = _interrupted_run(load_resource(pt), tmp_path / "out")
    code, out = _invoke("report", run_dir)
    assert code == 2
    assert (f"no results.json here nor in {run_dir}/eval (No such file or directory); it is the run folder of "
            f"PitTraining 'sp500-fomc-demo', whose evaluation is in {tmp_path}/out/sp500-leakage") in out


def test_a_token_budget_below_one_step_is_named_at_validate(pt):
    doc = yaml.safe_load(pt.read_text())
    doc["spec"]["tokens"] = 10
    pt.write_text(yaml.safe_dump(doc))
    code, out = _invoke("validate", pt)
    t = doc["spec"]["training"]
    step = t["seqLen"] * t.get("microBatchSize", 1) * t.get("gradientAccumulationSteps", 1) * \
        doc["spec"]["resources"]["gpusPerNode"] * doc["spec"]["resources"].get("nodes", 1)
    assert code == 0 and (f"warning: spec.tokens: 10 tokens round up to 1 optimizer step of {step:,} tokens "
                          f"(seqLen × microBatchSize × gradientAccumulationSteps × ") in out
    assert f"the run trains {step:,} tokens" in out
    doc["spec"]["tokens"] = 1000 * step + 1  # one step more than asked: under 10 %, no word
    pt.write_text(yaml.safe_dump(doc))
    code, out = _invoke("validate", pt)
    assert code == 0 and "spec.tokens" not in out


def test_a_warmup_as_long_as_the_run_is_named_at_validate_and_run(pt, tmp_path, monkeypatch):
    """Found in a trial: warmupSteps 5,000 in a 49-step run trained at 1 % of the learning rate, without a word."""
    doc = yaml.safe_load(pt.read_text())
    t, r = doc["spec"]["training"], doc["spec"]["resources"]
    step = t["seqLen"] * t.get("microBatchSize", 1) * t.get("gradientAccumulationSteps", 1) * r["gpusPerNode"]
    doc["spec"]["tokens"] = 40 * step
    t["warmupSteps"] = 400
    pt.write_text(yaml.safe_dump(doc))
    code, out = _invoke("validate", pt)
    lr = float(t["learningRate"])
    assert code == 0 and (f"warning: spec.training.warmupSteps: 400 is not below the run's 40 optimizer steps "
                          f"({40 * step:,} tokens, {step:,} per step with {r['gpusPerNode']} process") in out, out
    assert f"ends at 10% of learningRate {lr:g}; lower warmupSteps below 40" in out
    # pitlab run says it too, counting --nproc's processes: 80 steps of half the tokens each
    monkeypatch.setattr("pitlab.local._walk", lambda table, run, st, passthrough=(): None)
    code, out = _invoke("run", pt, "--out", tmp_path / "o", "--nproc", str(r["gpusPerNode"] // 2 or 1))
    assert code == 0 and "warning: spec.training.warmupSteps: 400 is not below the run's 80 optimizer steps" in out
    # more processes than cores, no GPU: a note (a spec written for an 8-GPU node, run here)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("pitlab.cli.inputs._has_gpu", lambda: False)
    code, out = _invoke("run", pt, "--out", tmp_path / "o2", "--nproc", "3")
    assert code == 0 and ("note: --nproc starts 3 training processes on 2 CPU cores and no GPU: they share the "
                          "cores; --nproc 2 runs 2 (the same spec.tokens in more, smaller optimizer steps)") in out
    t["warmupSteps"] = 39
    pt.write_text(yaml.safe_dump(doc))
    code, out = _invoke("validate", pt)
    assert code == 0 and "warmupSteps" not in out


def test_a_resume_with_another_process_count_is_refused_before_launching(pt, tmp_path):
    """Found in a platform engineer's trial: `--resume --nproc 1` of a run checkpointed by 2 processes launched
    the trainer, which then refused naming spec.resources.gpusPerNode, a field the user had not changed."""
    from pitlab.resume import check_world_size

    res = load_resource(pt)
    run_dir = _interrupted_run(res, tmp_path / "out")
    check_world_size(res, run_dir, 1, True)  # no checkpoint yet: any count starts the training afresh
    step = run_dir / "checkpoint" / "step-4"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"")
    (step / "train_state.json").write_text(json.dumps({"step": 4, "world_size": 2}))
    (run_dir / "checkpoint" / "latest").write_text("step-4")
    check_world_size(res, run_dir, 2, True)
    with pytest.raises(SpecError, match=rf"--nproc: 1 training processes, but the checkpoint {step} was written by 2; "
                                         r"resume with --nproc 2 \(the data order and the random states are per "
                                         r"process"):
        check_world_size(res, run_dir, 1, True)
    with pytest.raises(SpecError, match=r"spec\.resources\.gpusPerNode: 4 training processes, but the checkpoint"):
        check_world_size(res, run_dir, 4, False)


def test_nproc_above_one_with_layer_streaming_is_refused_before_anything(bases, tmp_path):
    doc = json.loads(json.dumps(bases["pt"]))
    doc["spec"]["method"] = "lora"
    doc["spec"]["resources"]["gpusPerNode"] = 1
    doc["spec"]["training"]["layerStreaming"] = {"enabled": True}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc).replace("${TMP}", str(tmp_path)))
    code, out = _invoke("run", path, "--nproc", "2", "--out", tmp_path / "out")
    assert code == 2 and "--nproc: 2: spec.training.layerStreaming runs in one process; leave --nproc out or give 1" \
        in out, out
    assert not (tmp_path / "out").exists()


def test_a_fused_optimizer_asked_with_layer_streaming_is_named_at_validate(tmp_path):
    doc = yaml.safe_load(open("examples/local-lora-streaming.yaml"))
    doc["spec"]["training"]["fusedOptimizer"] = True
    spec = tmp_path / "streaming.yaml"
    spec.write_text(yaml.safe_dump(doc))
    code, out = _invoke("validate", spec, "--data-root", "../shared/data")
    assert code == 0, out
    assert ("warning: spec.training.fusedOptimizer: true has no effect with spec.training.layerStreaming (streamed "
            "training steps with torch's AdamW); remove it, or turn layer streaming off") in out
    doc["spec"]["training"]["fusedOptimizer"] = False  # asked off: what streaming does anyway, no word
    spec.write_text(yaml.safe_dump(doc))
    code, out = _invoke("validate", spec, "--data-root", "../shared/data")
    assert code == 0 and "fusedOptimizer" not in out


def test_validate_tells_a_killed_run_from_a_running_one(pt, tmp_path, monkeypatch):
    """Found in a trial: after kill -9 status.json says Training (with an ETA) for ever; validate now says whether
    a pitlab run holds the folder."""
    from pitlab.api.runfolders import folder_holder, lock_run_folders

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    res = load_resource(pt)
    run_dir = _interrupted_run(res, tmp_path / "out")
    doc = json.loads((run_dir / "status.json").read_text())
    doc["status"]["phase"] = "Training"
    (run_dir / "status.json").write_text(json.dumps(doc))
    assert folder_holder(run_dir) is None
    code, out = _invoke("validate", pt)
    assert code == 0 and ("(or --resume, to continue its unfinished run: status Training, but no pitlab run holds "
                          "it: its process ended without a word, e.g. killed)") in out
    held = lock_run_folders(tmp_path / "out", [res.metadata.name])
    try:
        assert folder_holder(run_dir) == str(os.getpid())
        code, out = _invoke("validate", pt)
        assert code == 0 and f"; a pitlab run (pid {os.getpid()}) is running it now (status Training): wait" in out
    finally:
        for f in held:
            f.close()
    assert folder_holder(run_dir) is None
