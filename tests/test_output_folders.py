"""Nothing is lost: run folders are owned and checked at validate, and commands that write a whole folder
(`pitlab push`, `pitlab merge`) refuse one holding content they did not write unless --overwrite, replacing it
atomically. After every refused command the folder and its files are still there, byte for byte."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pitlab import storage
from pitlab.cli import app
from test_bad_inputs import bases, tripwire, write_corpus, write_jpx, write_ohlcv  # noqa: F401 - fixtures

ENV = {"COLUMNS": "400"}


def _invoke(*args: str):
    r = CliRunner().invoke(app, [str(a) for a in args], env=ENV)
    return r.exit_code, re.sub(r"\s+", " ", r.output)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture()
def pt_spec(bases, tmp_path):
    """Writes the inputs and returns ``write(doc) -> spec path`` plus the base PitTraining document."""
    write_ohlcv(tmp_path / "panel.csv")
    write_corpus(tmp_path / "corpus.csv")
    write_jpx(tmp_path / "jpx")

    def write(doc: dict, name: str = "spec.yaml") -> Path:
        p = tmp_path / name
        p.write_text(yaml.safe_dump(doc).replace("${TMP}", str(tmp_path)))
        return p

    return write, json.loads(json.dumps(bases["pt"])), json.loads(json.dumps(bases["le"]))


def _other_run(folder: Path, kind: str = "LeakageEval", name: str = "other", training: str | None = None) -> None:
    """A run folder as `pitlab run` leaves it for another resource: status.json and a results file."""
    (folder / "eval").mkdir(parents=True)
    meta = {"name": name, **({"labels": {"pitlab.io/training": training}} if training else {})}
    (folder / "status.json").write_text(json.dumps({"kind": kind, "metadata": meta,
                                                    "status": {"phase": "Succeeded"}}))
    (folder / "eval" / "results.json").write_text('{"models": {}}')


# ------------------------------------------------------------------------------------- run folders (item 1)
def test_evaluation_named_like_its_pittraining_is_refused_at_validate(pt_spec, tmp_path):
    write, pt, _ = pt_spec
    pt["spec"]["evaluations"][0]["name"] = pt["metadata"]["name"]
    for cmd in ("validate", "run"):
        code, out = _invoke(cmd, write(pt))
        assert code == 2, out
        assert (f"spec.evaluations[0].name: {pt['metadata']['name']!r} is also metadata.name; the evaluation's run "
                f"folder <out>/{pt['metadata']['name']} would be the PitTraining's own") in out
    assert not (tmp_path / "out").exists()


def test_two_evaluations_with_one_name_are_refused_at_validate(pt_spec, tmp_path):
    write, pt, _ = pt_spec
    pt["spec"]["evaluations"].append(json.loads(json.dumps(pt["spec"]["evaluations"][0])))
    name = pt["spec"]["evaluations"][0]["name"]
    code, out = _invoke("validate", write(pt))
    assert code == 2
    assert f"spec.evaluations[1].name: duplicate evaluation name {name!r} (also spec.evaluations[0].name)" in out


def test_evaluation_named_like_another_resources_folder_is_refused_and_kept(pt_spec, tmp_path, tripwire):
    write, pt, _ = pt_spec
    name = pt["spec"]["evaluations"][0]["name"]
    folder = tmp_path / "out" / name
    _other_run(folder, "LeakageEval", name, training="another-training")
    before = _snapshot(tmp_path / "out")
    for cmd in ("validate", "run"):
        code, out = _invoke(cmd, write(pt))
        assert code == 2, out
        assert (f"spec.evaluations[0].name: {folder} already exists, written by LeakageEval {name!r} (evaluation "
                "of PitTraining 'another-training'); the run of LeakageEval") in out
        assert "pass --overwrite to replace it (the old one is kept in" in out
        assert _snapshot(tmp_path / "out") == before  # the folder and its files are still there
    # --overwrite names what it deletes (validate lists it; run deletes it only after the inputs passed)
    code, out = _invoke("validate", write(pt), "--overwrite")
    assert code == 0 and f"note: {folder} exists (written by LeakageEval {name!r}" in out
    code, out = _invoke("run", write(pt), "--overwrite")
    assert f"--overwrite: replacing {folder} (written by LeakageEval {name!r} (evaluation of PitTraining " \
           "'another-training')) once the inputs are checked" in out
    assert code == 1 and "the input went past the preflight" in out  # the tripwire: the prepare stage was reached
    assert not (folder / "eval" / "results.json").exists()


def test_bad_input_with_overwrite_deletes_nothing(pt_spec, tmp_path, tripwire):
    write, pt, _ = pt_spec
    folder = tmp_path / "out" / pt["metadata"]["name"]
    _other_run(folder, "PitTraining", pt["metadata"]["name"])
    before = _snapshot(tmp_path / "out")
    pt["spec"]["corpus"]["textField"] = "body"  # refused by the preflight, before anything is deleted
    code, out = _invoke("run", write(pt), "--overwrite")
    assert code == 2 and "no field 'body' (spec.corpus.textField)" in out
    assert f"--overwrite: replacing {folder} (written by PitTraining" in out
    assert f"--overwrite: nothing was deleted: {folder} is as before" in out  # the announcement is taken back
    assert _snapshot(tmp_path / "out") == before


def _kept_runs(root: Path) -> list[Path]:
    return sorted((root / ".replaced").iterdir()) if (root / ".replaced").is_dir() else []


def test_overwrite_keeps_the_previous_run_until_the_new_one_succeeds(pt_spec, tmp_path, monkeypatch):
    """--overwrite moves the earlier run aside (byte for byte) once the inputs passed, and deletes it only after
    the new run succeeded."""
    write, _, le = pt_spec
    name = le["metadata"]["name"]
    root, folder = tmp_path / "out", tmp_path / "out" / name
    _other_run(folder, "LeakageEval", name)
    before = _snapshot(folder)
    seen = {}

    def stages(table, run, st, passthrough=()):  # the stages, instead of embedding and analysing
        seen["kept"] = [(p.name, _snapshot(p)) for p in _kept_runs(root)]
        seen["folder"] = sorted(p.name for p in folder.iterdir())

    monkeypatch.setattr("pitlab.local._walk", stages)
    code, out = _invoke("run", write(le), "--overwrite")
    assert code == 0, out
    [(kept_name, kept_files)] = seen["kept"]  # during the run: the earlier run aside, whole; the folder new
    assert re.fullmatch(rf"{name}\.\d{{8}}T\d{{6}}Z", kept_name) and kept_files == before
    assert seen["folder"] == ["status.json"]
    kept = root / ".replaced" / kept_name
    assert f"--overwrite: replacing {folder} (written by LeakageEval {name!r}) once the inputs are checked: it is " \
           f"kept in {root / '.replaced'}/ until the new run succeeds" in out
    assert f"--overwrite: moved {folder} to {kept}; it is deleted once this run succeeds" in out
    assert f"--overwrite: deleted the previous run {kept}" in out
    assert not (root / ".replaced").exists()  # deleted after the success, and the emptied folder with it
    assert json.loads((folder / "status.json").read_text())["status"]["phase"] == "Succeeded"


def test_overwrite_keeps_the_previous_run_when_the_new_one_fails(pt_spec, tmp_path, tripwire, monkeypatch):
    """A failed --overwrite run leaves the earlier run in out/.replaced/, byte for byte, and says how to put it
    back; the failed run stays in its folder (its status says Failed), and its --resume, once it succeeds,
    names the kept run rather than deleting it."""
    write, _, le = pt_spec
    name = le["metadata"]["name"]
    root, folder = tmp_path / "out", tmp_path / "out" / name
    _other_run(folder, "LeakageEval", name)
    before = _snapshot(folder)
    code, out = _invoke("run", write(le), "--overwrite")
    assert code == 1 and "the input went past the preflight" in out  # the tripwire: embedding was reached
    [kept] = _kept_runs(root)
    assert _snapshot(kept) == before
    assert f"--overwrite: the previous run of {folder} is kept in {kept} (this run's files are in {folder}); to " \
           f"put it back: rm -rf {folder} && mv {kept} {folder}" in out
    assert json.loads((folder / "status.json").read_text())["status"]["phase"] == "Failed"
    monkeypatch.setattr("pitlab.local._walk", lambda table, run, st, passthrough=(): None)
    code, out = _invoke("run", "--resume", write(le))
    assert code == 0, out
    assert f"note: {kept} holds an earlier run that `pitlab run --overwrite` replaced; delete it when it is no " \
           "longer needed" in out
    assert _snapshot(kept) == before


def _remote_run(uri: str, name: str) -> dict[str, str]:
    """An earlier run published to ``uri/name``: status.json and a published eval/ folder; returns its files."""
    src = _folder(Path(storage.cache_root()) / "earlier" / name, {"results.json": '{"models": {}}'})
    storage.upload_dir(src, f"{uri}/{name}/eval")
    storage.write_text(f"{uri}/{name}/status.json", json.dumps({"kind": "LeakageEval", "metadata": {"name": name},
                                                                 "status": {"phase": "Succeeded"}}))
    return {k: storage.read_text(f"{uri}/{name}/{k}") for k in storage.list_files(f"{uri}/{name}")}


def test_overwrite_of_an_s3_output_keeps_the_previous_run_until_the_new_one_succeeds(pt_spec, s3_bucket, tripwire,
                                                                                        monkeypatch):
    """Before, a failed --overwrite run published its Failed status.json over the earlier run's, beside the earlier
    run's eval/ (still marked complete): the earlier run's status was lost and the output mixed two runs. Now the
    earlier run is moved to <uri>/.replaced/ whole when the new run publishes, kept if the new run fails, and
    deleted once it succeeds."""
    write, _, le = pt_spec
    name, uri = le["metadata"]["name"], f"{s3_bucket.uri}/out"
    le["spec"]["output"] = {"uri": uri}
    before = _remote_run(uri, name)
    code, out = _invoke("run", write(le))
    assert code == 2 and f"{uri}/{name} already exists (an earlier run of {name!r}); pass --overwrite" in out
    code, out = _invoke("run", write(le), "--overwrite")  # fails in the embedding stage (the tripwire)
    assert code == 1 and "the input went past the preflight" in out, out
    assert f"--overwrite: replacing {uri}/{name}: when this run publishes, the earlier run is moved to " \
           f"{uri}/.replaced/ and deleted once the new run succeeds" in out
    [kept] = {k.split("/")[0] for k in storage.list_files(f"{uri}/.replaced")}
    assert re.fullmatch(rf"{name}\.\d{{8}}T\d{{6}}Z", kept)
    kept = f"{uri}/.replaced/{kept}"
    assert {k: storage.read_text(f"{kept}/{k}") for k in storage.list_files(kept)} == before  # byte for byte
    assert set(storage.list_files(f"{uri}/{name}")) == {"status.json"}  # the failed run alone, no old eval/
    assert json.loads(storage.read_text(f"{uri}/{name}/status.json"))["status"]["phase"] == "Failed"
    assert f"--overwrite: the previous run of {uri}/{name} is kept in {kept}; to put it back: aws s3 rm " \
           f"--recursive {uri}/{name}/ && aws s3 mv --recursive {kept}/ {uri}/{name}/" in out
    monkeypatch.setattr("pitlab.local._walk", lambda table, run, st, passthrough=(): None)
    storage.delete_tree(kept)
    _remote_run(uri, name)
    code, out = _invoke("run", write(le), "--overwrite")
    assert code == 0, out
    moved = re.search(rf"--overwrite: moved {uri}/{name} to ({uri}/\.replaced/{name}\.\d{{8}}T\d{{6}}Z); it is "
                      "deleted once this run succeeds", out)
    assert moved and f"--overwrite: deleted the previous run {moved[1]}" in out
    assert storage.list_files(f"{uri}/.replaced") == {}
    assert set(storage.list_files(f"{uri}/{name}")) == {"status.json"}  # the new run's files, none of the earlier
    assert json.loads(storage.read_text(f"{uri}/{name}/status.json"))["status"]["phase"] == "Succeeded"


def test_run_help_says_what_overwrite_deletes_and_mentions_resume():
    code, out = _invoke("run", "--help")
    assert code == 0
    assert "--overwrite Replace the run's existing folders: out/<name>/ (checkpoints included) and, for a " \
           "PitTraining, each evaluation's out/<evaluation name>/; each is named first, moved to out/.replaced/ " \
           "once the inputs passed, and deleted when the new run succeeds (kept there if it fails or is interrupted, " \
           "also through a later --resume)" in out
    assert "To continue an interrupted run instead, use --resume." in out


def test_an_earlier_run_of_the_same_resource_validates_with_a_note_and_run_needs_overwrite(pt_spec, tmp_path):
    write, _, le = pt_spec
    folder = tmp_path / "out" / le["metadata"]["name"]
    _other_run(folder, "LeakageEval", le["metadata"]["name"])
    before = _snapshot(tmp_path / "out")
    code, out = _invoke("validate", write(le))
    assert code == 0, out
    assert f"note: {folder} exists (written by LeakageEval {le['metadata']['name']!r}): `pitlab run` needs " \
           "--overwrite" in out
    code, out = _invoke("run", write(le))
    assert code == 2 and f"metadata.name: {folder} already exists, written by LeakageEval" in out
    assert _snapshot(tmp_path / "out") == before


def test_a_standalone_evaluation_named_like_a_pittraining_folder_is_refused(pt_spec, tmp_path):
    write, _, le = pt_spec
    folder = tmp_path / "out" / le["metadata"]["name"]
    _other_run(folder, "PitTraining", le["metadata"]["name"])
    before = _snapshot(tmp_path / "out")
    code, out = _invoke("validate", write(le))
    assert code == 2 and f"written by PitTraining {le['metadata']['name']!r}" in out
    assert _snapshot(tmp_path / "out") == before


def test_a_run_folder_path_that_is_a_file_is_refused_even_with_overwrite(pt_spec, tmp_path):
    write, _, le = pt_spec
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / le["metadata"]["name"]).write_text("notes")
    for extra in ((), ("--overwrite",)):
        code, out = _invoke("run", write(le), *extra)
        assert code == 2 and "exists and is not a folder" in out
    assert (tmp_path / "out" / le["metadata"]["name"]).read_text() == "notes"


def test_an_empty_folder_is_free(pt_spec, tmp_path):
    from pitlab.api import load_resource
    from pitlab.api.runfolders import check_run_folders

    write, pt, _ = pt_spec
    res = load_resource(write(pt))
    for f in (res.metadata.name, res.spec.evaluations[0].name):
        (tmp_path / "out" / f).mkdir(parents=True)
    assert check_run_folders(res, tmp_path / "out") == []


def test_overwrite_claims_every_folder_of_a_pittraining_before_training(pt_spec, tmp_path, monkeypatch):
    """Old evaluation results do not survive beside a new run: --overwrite empties them before training."""
    import pitlab.local as local
    from pitlab.api import load_resource

    write, pt, _ = pt_spec
    res = load_resource(write(pt))
    ev = tmp_path / "out" / res.spec.evaluations[0].name
    _other_run(ev, "LeakageEval", ev.name, training=res.metadata.name)
    monkeypatch.setattr("pitlab.pipeline.prepare.prepare_run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop here")))
    with pytest.raises(local.RunError, match="stop here"):
        local.run_pittraining_local(res, tmp_path / "out", overwrite=True)
    assert not ev.exists()
    status = json.loads((tmp_path / "out" / res.metadata.name / "status.json").read_text())
    assert status["status"]["phase"] == "Failed"


# --------------------------------------------------------------------------------------- push (item 2)
def _folder(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_push_refuses_a_local_folder_with_content_and_keeps_it(tmp_path):
    src = _folder(tmp_path / "src", {"a.txt": "new", "sub/b.txt": "new b"})
    dest = _folder(tmp_path / "dest", {"mine.txt": "keep me", "notes/x.md": "x"})
    before = _snapshot(dest)
    code, out = _invoke("push", src, dest)
    assert code == 2
    assert f"{dest}: already holds 2 file(s) that `pitlab push` did not write (mine.txt, notes/x.md); pass " \
           "--overwrite" in out
    assert _snapshot(dest) == before
    code, out = _invoke("push", src, dest, "--overwrite")
    assert code == 0, out
    after = _snapshot(dest)
    assert {k: v for k, v in after.items() if k not in storage.manifest.MARKERS} == {"a.txt": b"new",
                                                                                     "sub/b.txt": b"new b"}
    assert storage.read_manifest(dest).files.keys() == {"a.txt", "sub/b.txt"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".dest.")]  # nothing left aside


def test_push_to_a_new_or_empty_local_folder_needs_no_overwrite(tmp_path):
    src = _folder(tmp_path / "src", {"a.txt": "new"})
    (tmp_path / "empty").mkdir()
    for dest in (tmp_path / "new" / "deep", tmp_path / "empty"):
        code, out = _invoke("push", src, dest)
        assert code == 0, out
        assert (dest / "a.txt").read_text() == "new" and storage.is_published(dest)


def test_push_refuses_a_destination_inside_its_source_or_around_it(tmp_path, monkeypatch):
    src = _folder(tmp_path / "src", {"a.txt": "a", "sub/b.txt": "b"})
    monkeypatch.chdir(tmp_path)
    for args in ((src, src / "inner", "--overwrite"), (src, src / "sub"), (src / "sub", src), (src, tmp_path),
                 ("src", ".", "--overwrite")):
        code, out = _invoke("push", *args)
        assert code == 2, (args, out)  # bad input, not a failed upload
        assert f"DEST: {args[1]} and the source folder {args[0]} contain one another" in out
    assert _snapshot(src) == {"a.txt": b"a", "sub/b.txt": b"b"}


def test_push_into_its_own_earlier_output_says_so_and_needs_overwrite(tmp_path):
    src = _folder(tmp_path / "src", {"a.txt": "a", "b.txt": "b"})
    dest = tmp_path / "d2"
    assert _invoke("push", src, dest)[0] == 0
    before = _snapshot(dest)
    code, out = _invoke("push", src, dest)
    assert code == 2, out
    assert f"{dest}: holds an earlier `pitlab push` output (4 file(s): MANIFEST.json, _COMPLETE, a.txt, ...); " \
           "pass --overwrite to replace it" in out
    assert "did not write" not in out
    assert _snapshot(dest) == before
    (dest / "notes.txt").write_text("mine")  # a file the push did not write is named as such
    code, out = _invoke("push", src, dest)
    assert code == 2 and f"{dest}: already holds 1 file(s) that `pitlab push` did not write (notes.txt)" in out
    code, out = _invoke("push", src, dest, "--overwrite")
    assert code == 0 and f"--overwrite: replacing {dest} (5 file(s): MANIFEST.json, _COMPLETE, a.txt, ...)" in out
    assert not (dest / "notes.txt").exists()


def test_push_and_pull_argument_errors_are_bad_input(tmp_path):
    src = _folder(tmp_path / "src", {"a.txt": "a"})
    code, out = _invoke("push", src, "s3://")
    assert code == 2 and "DEST: 's3://'" in out
    code, out = _invoke("pull", "s3://Bad_Bucket/x", tmp_path / "new")
    assert code == 2 and "SRC: 's3://Bad_Bucket/x'" in out
    code, out = _invoke("pull", tmp_path / "src", tmp_path / "new")  # a folder nobody published
    assert code == 2 and "SRC: " in out and "not published" in out
    assert not (tmp_path / "new").exists()


def test_a_failed_local_push_leaves_the_old_folder_as_it_was(tmp_path, monkeypatch):
    import pitlab.storage.transfer as transfer

    src = _folder(tmp_path / "src", {"a.txt": "new"})
    dest = _folder(tmp_path / "dest", {"old.txt": "old"})
    before = _snapshot(dest)

    def broken(files, uri, *a, **k):
        (Path(uri) / "a.txt").write_text("half")
        raise storage.StorageError(f"{uri}: disk full")

    monkeypatch.setattr(transfer, "upload_files", broken)
    code, out = _invoke("push", src, dest, "--overwrite")
    assert code == 1 and "disk full" in out
    assert _snapshot(dest) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".dest.")]


def test_push_refuses_an_s3_prefix_with_content(s3_bucket, tmp_path):
    src = _folder(tmp_path / "src", {"a.txt": "new"})
    uri = f"{s3_bucket.uri}/data"
    storage.write_text(f"{uri}/mine.txt", "keep me")
    code, out = _invoke("push", src, uri)
    assert code == 2 and f"{uri}: already holds 1 file(s) that `pitlab push` did not write (mine.txt)" in out
    assert storage.read_text(f"{uri}/mine.txt") == "keep me"
    code, out = _invoke("push", src, uri, "--overwrite")
    assert code == 0, out
    assert set(storage.list_files(uri)) == {"a.txt", "MANIFEST.json", "_COMPLETE"}


def test_push_of_a_missing_source_is_bad_input(tmp_path):
    code, out = _invoke("push", tmp_path / "nope", tmp_path / "dest")
    assert code == 2 and f"SRC: {tmp_path / 'nope'}: not a folder" in out
    assert not (tmp_path / "dest").exists()


# -------------------------------------------------------------------------------------- merge (item 2)
def test_merge_refuses_an_out_folder_it_did_not_write_before_reading_anything(tmp_path):
    out = _folder(tmp_path / "model", {"config.json": "{}", "weights.bin": "precious"})
    before = _snapshot(out)
    code, text = _invoke("merge", "--checkpoint", tmp_path / "no-ckpt", "--base", tmp_path / "no-base", "--out", out)
    assert code == 2, text
    assert f"{out}: already holds 2 file(s) that `pitlab merge` did not write (config.json, weights.bin); pass " \
           "--overwrite" in text
    assert _snapshot(out) == before


def _merge_output(out: Path, extra: dict[str, str] | None = None) -> Path:
    """A folder as `pitlab merge` leaves it: its files, and merge_report.json listing them."""
    files = {"config.json": "{}", "model.safetensors": "old", "tokenizer.json": "{}"}
    _folder(out, files)
    (out / "merge_report.json").write_text(json.dumps({"verified": True,
                                                       "files": sorted(files) + ["merge_report.json"]}))
    return _folder(out, extra or {})


def test_merge_may_replace_its_own_earlier_output_and_a_failure_keeps_it(tmp_path):
    """A retried merge (the merge Job run again) goes past the folder check without --overwrite."""
    out = _merge_output(tmp_path / "model")
    before = _snapshot(out)
    code, text = _invoke("merge", "--checkpoint", tmp_path / "no-ckpt", "--base", tmp_path / "no-base", "--out", out)
    assert code == 2 and "no config.json" in text  # went past the folder check, refused on the inputs
    assert f"replacing the earlier merge output {out} (4 file(s)" in text
    assert _snapshot(out) == before


def test_merge_refuses_files_beside_a_merge_report_without_overwrite(tmp_path):
    """A merge_report.json (even `{}`) does not make the other files of a folder the merge's own."""
    for report in ("{}", None):
        out = tmp_path / f"mo-{report is None}"
        if report is None:
            _merge_output(out, {"keep.txt": "notes"})  # a real earlier output, plus a file of the user's
        else:
            _folder(out, {"merge_report.json": report, "keep.txt": "notes"})
        (out / "mydata").mkdir()
        before = _snapshot(out)
        code, text = _invoke("merge", "--checkpoint", tmp_path / "ck", "--base", tmp_path / "base", "--out", out)
        assert code == 2, text
        assert f"{out}: already holds" in text and "that `pitlab merge` did not write (keep.txt" in text
        assert "mydata/" in text and "pass --overwrite" in text
        assert _snapshot(out) == before and (out / "mydata").is_dir()


def test_merge_with_overwrite_goes_past_the_check(tmp_path):
    out = _folder(tmp_path / "model", {"weights.bin": "precious"})
    code, text = _invoke("merge", "--checkpoint", tmp_path / "no-ckpt", "--base", tmp_path / "no-base", "--out", out,
                         "--overwrite")
    assert code == 2 and "no config.json" in text
    assert f"--overwrite: replacing {out} (1 file(s): weights.bin)" in text
    assert (out / "weights.bin").read_text() == "precious"  # replaced only by a verified merge


def test_merge_input_errors_are_bad_input(tmp_path):
    base = _folder(tmp_path / "base", {"config.json": "{}"})
    (tmp_path / "emptydir").mkdir()
    cases = [
        (("--checkpoint", tmp_path / "ck", "--base", tmp_path / "emptydir"), "base model directory has no config.json"),
        (("--checkpoint", tmp_path / "ck", "--base", base), "not a complete DCP checkpoint"),
        (("--checkpoint", "s3://", "--base", base), "--checkpoint: 's3://'"),
    ]
    for args, msg in cases:
        code, text = _invoke("merge", *args, "--out", tmp_path / "new")
        assert code == 2 and msg in text, (args, text)
        assert not (tmp_path / "new").exists()
    from pitlab.trainer.merge import run_merge_command  # what `pitlab merge` runs once its options are parsed

    assert run_merge_command(str(tmp_path / "ck"), str(base), "s3://") == 2
    assert run_merge_command(str(tmp_path / "ck"), str(tmp_path / "emptydir"), str(tmp_path / "new")) == 2


def test_pull_refuses_an_existing_destination(tmp_path):
    dest = _folder(tmp_path / "dest", {"mine.txt": "keep"})
    code, text = _invoke("pull", "s3://bucket/x", dest)
    assert code == 2 and f"{dest} already exists" in text
    assert _snapshot(dest) == {"mine.txt": b"keep"}


def test_an_input_inside_a_run_folder_is_refused_even_with_overwrite(pt_spec, tmp_path):
    """--overwrite deletes the run folders: a spec input inside one of them is refused at validate and run."""
    write, pt, le = pt_spec
    folder = tmp_path / "out" / le["metadata"]["name"]
    write_jpx(folder / "jpx")  # the data set lives in the folder the run would replace
    le["spec"]["dataset"]["uri"] = str(folder / "jpx")
    before = _snapshot(folder)
    for args in (("validate",), ("run",), ("run", "--overwrite"), ("validate", "--overwrite")):
        code, out = _invoke(*args, write(le))
        assert code == 2, (args, out)
        assert f"spec.dataset.uri: {folder / 'jpx'} is inside {folder}, the run folder of LeakageEval " \
               f"{le['metadata']['name']!r}, which the run replaces" in out
        assert "--overwrite: replacing" not in out
        assert _snapshot(folder) == before
    ev = tmp_path / "out" / pt["spec"]["evaluations"][0]["name"]  # a PitTraining's corpus in its evaluation's folder
    ev.mkdir(parents=True)
    write_corpus(ev / "corpus.csv")
    pt["spec"]["corpus"]["uri"] = str(ev / "corpus.csv")
    code, out = _invoke("run", write(pt), "--overwrite")
    assert code == 2 and f"spec.corpus.uri: {ev / 'corpus.csv'} is inside {ev}, the run folder of LeakageEval" in out
    assert (ev / "corpus.csv").is_file()


def test_an_output_root_inside_another_run_folder_is_refused(pt_spec, tmp_path):
    """--out inside a run folder (found in a trial: its run folders were described as written by no pitlab run,
    and that run's --overwrite would have deleted them): refused at validate and run, with or without
    --overwrite, and nothing is written."""
    write, _, le = pt_spec
    outer = tmp_path / "out" / "pit-2016"
    _other_run(outer, "PitTraining", "pit-2016")
    before = _snapshot(tmp_path / "out")
    for inner in (outer, outer / "eval", outer / "new" / "deeper"):
        for args in (("validate",), ("run",), ("run", "--overwrite")):
            code, out = _invoke(*args, write(le), "--out", inner)
            assert code == 2, (args, out)
            assert f"spec.output.uri: the output root {inner} is inside {outer}, the run folder of PitTraining " \
                   "'pit-2016': this run's folders would mix with that run's files, and its --overwrite would " \
                   "replace them; give --out (or spec.output.uri) outside it" in out
            assert _snapshot(tmp_path / "out") == before and not (outer / "new").exists()
    code, out = _invoke("validate", write(le), "--out", tmp_path / "out")  # beside it is fine
    assert code == 0, out
    for inner in (tmp_path / "out" / ".replaced", tmp_path / "out" / ".replaced" / "x"):  # found in a trial
        for args in (("validate",), ("run",)):
            code, out = _invoke(*args, write(le), "--out", inner)
            assert code == 2 and f"spec.output.uri: the output root {inner} is in a .replaced folder, where `pitlab " \
                                 "run --overwrite` keeps the runs it replaced; give --out (or spec.output.uri) outside " \
                                 "it" in out, out
    assert not (tmp_path / "out" / ".replaced").exists()


def test_an_interrupted_overwrite_names_folders_it_had_not_written_yet(pt_spec, tmp_path, monkeypatch):
    """Found in a trial: interrupted during training, --overwrite said the evaluation's folder held this run's
    files when the run had not written it yet; the put-back command for it is then a plain mv. After the runs
    are put back by hand, the next successful run removes the emptied .replaced folder."""
    from pitlab.local import Interrupted

    write, pt, _ = pt_spec
    root = tmp_path / "out"
    own, ev = root / pt["metadata"]["name"], root / pt["spec"]["evaluations"][0]["name"]
    _other_run(own, "PitTraining", pt["metadata"]["name"])
    _other_run(ev, "LeakageEval", ev.name, training=pt["metadata"]["name"])

    def interrupted(table, run, st, passthrough=()):  # SIGINT during the first stage after the claim
        raise Interrupted("SIGINT")

    monkeypatch.setattr("pitlab.local._walk", interrupted)
    code, out = _invoke("run", write(pt), "--overwrite")
    assert code == 130, out
    kept = {p.name.split(".")[0]: p for p in _kept_runs(root)}
    assert f"--overwrite: the previous run of {own} is kept in {kept[own.name]} (this run's files are in {own}); " \
           f"to put it back: rm -rf {own} && mv {kept[own.name]} {own}" in out
    assert f"--overwrite: the previous run of {ev} is kept in {kept[ev.name]} (this run wrote nothing there); to " \
           f"put it back: mv {kept[ev.name]} {ev}" in out
    assert not ev.exists()
    import shutil
    shutil.rmtree(own)  # put back as told
    kept[own.name].rename(own)
    kept[ev.name].rename(ev)
    assert (root / ".replaced").is_dir() and not any((root / ".replaced").iterdir())
    monkeypatch.setattr("pitlab.local._walk", lambda table, run, st, passthrough=(): None)
    code, out = _invoke("run", write(pt), "--overwrite")
    assert code == 0, out
    assert not (root / ".replaced").exists()


def test_an_unset_data_root_is_named_beside_the_folder_refusal(pt_spec, tmp_path, monkeypatch):
    """Found in a trial: `pitlab run` named only the existing run folder; with --overwrite it then named the unset
    ${PITLAB_DATA_ROOT}. Both come in one refusal now, and nothing moves."""
    write, pt, _ = pt_spec
    folder = tmp_path / "out" / pt["metadata"]["name"]
    _other_run(folder, "PitTraining", pt["metadata"]["name"])
    pt["spec"]["corpus"]["uri"] = "${PITLAB_DATA_ROOT}/corpus.csv"
    monkeypatch.delenv("PITLAB_DATA_ROOT", raising=False)
    before = _snapshot(tmp_path / "out")
    code, out = _invoke("run", write(pt))
    assert code == 2, out
    assert "spec.corpus.uri: '${PITLAB_DATA_ROOT}/corpus.csv' uses ${PITLAB_DATA_ROOT}, which is not set" in out
    assert f"metadata.name: {folder} already exists, written by PitTraining" in out
    assert _snapshot(tmp_path / "out") == before
