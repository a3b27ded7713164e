"""``pitlab run``: a resource on this machine, its run folders claimed first, its results printed, an s3:// output
published; SIGINT and SIGTERM end it with status Interrupted (exit 130)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from pitlab.api import DATA_ROOT_ENV, PitTraining, SpecError
from pitlab.api.layout import TrainingLayout
from pitlab.api.runfolders import REPLACED, folder_phase, lock_run_folders
from pitlab.cli.errors import fail, from_file
from pitlab.cli.inputs import DataRoot, load, say_run_warnings
from pitlab.cli.output import RichReporter, progress, say
from pitlab.cli.remote_output import RemoteOutput
from pitlab.cli.results import say_results
from pitlab.errors import InputError


def run(file: Path = typer.Argument(..., metavar="FILE", help="PitTraining or LeakageEval YAML."),
        out: Optional[Path] = typer.Option(None, "--out", "-o",
                                           help="Output root (default: the spec's output.uri, else ./out)."),
        data_root: Optional[Path] = DataRoot,
        overwrite: bool = typer.Option(False, "--overwrite",
                                       help="Replace the run's existing folders: out/<name>/ (checkpoints "
                                            "included) and, for a PitTraining, each evaluation's "
                                            "out/<evaluation name>/; each is named first, moved to out/.replaced/ "
                                            "once the inputs passed, and deleted when the new run succeeds (kept "
                                            "there if it fails or is interrupted, also through a later --resume). "
                                            "To continue an interrupted run instead, use --resume."),
        nproc: Optional[int] = typer.Option(None, "--nproc", metavar="N",
                                            help="torchrun processes (default: spec.resources.gpusPerNode)."),
        resume: bool = typer.Option(False, "--resume",
                                    help="Continue the interrupted run in out/<name>/ from its first unfinished "
                                         "stage (training from its last checkpoint); refused if the spec changed."),
        ) -> None:
    """Run a resource on this machine: corpus filter → train → merge → evaluate (PitTraining), or the
    evaluation alone (LeakageEval). Writes out/<name>/ (and out/<evaluation name>/ for each evaluation) with
    status.json as the operator would. An existing run folder is refused unless --overwrite (which replaces it) or,
    for an interrupted run of the same spec, --resume (which continues it)."""
    from pitlab import storage
    from pitlab.local import local_work_root

    # --data-root belongs in a resume advice only when given on the command line (not read from the environment)
    root_flag = data_root if data_root is not None and os.environ.get(DATA_ROOT_ENV) != str(data_root) else None
    if nproc is not None and nproc < 1:
        fail(SpecError([("--nproc", f"{nproc}: give at least 1 torchrun process")]), 2)
    if resume and overwrite:
        fail("--resume and --overwrite exclude each other: --resume continues the run folder, --overwrite "
             "deletes it", 2)
    res = load(file, data_root)
    if nproc not in (None, 1) and isinstance(res, PitTraining) and res.spec.training.layer_streaming.enabled:
        fail(SpecError([("--nproc", f"{nproc}: spec.training.layerStreaming runs in one process; leave --nproc out "
                                    "or give 1")]), 2)
    spec_out = res.spec.output.uri if res.spec.output else "out"
    # s3:// output.uri (and no --out): work in the cache, then publish every run folder to <output.uri>/<name>
    remote = spec_out.rstrip("/") if out is None and storage.is_s3(spec_out) else None
    root = out or (local_work_root(remote) if remote else Path(spec_out))
    names = [res.metadata.name] + [e.name for e in getattr(res.spec, "evaluations", [])]
    again = " ".join(["pitlab run --resume", str(file)] + (["--out", str(out)] if out else [])
                     + (["--data-root", str(root_flag)] if root_flag else [])
                     + (["--nproc", str(nproc)] if nproc else []))  # the command that continues this run
    if remote and resume:
        fail(SpecError([("--resume", f"works on a local output folder; spec.output.uri is {spec_out} (give --out "
                                     "DIR, where the interrupted run is)")]), 2)
    published = RemoteOutput(remote, names)
    published.claim(res.metadata.name, overwrite)
    if remote:
        shutil.rmtree(root, ignore_errors=True)  # the local working copy of a remote output is scratch
    try:  # one pitlab run per run folder, until this command returns
        locks = lock_run_folders(root, names)
    except SpecError as err:
        fail(err, 2)
    try:
        doomed: list[Path] = []
        if not remote and not resume:
            doomed = _claim_message(res, root, overwrite, file, again)
        say_run_warnings(res, nproc)
        t0 = time.monotonic()
        finished = resume and folder_phase(root / res.metadata.name) == "Succeeded"
        results, replaced = _run_stages(res, file, root, published, doomed, overwrite, nproc, resume, again)
        published.publish(root)
        published.drop_kept()
        _drop_replaced(replaced, root, names)
        if remote:
            say(f"  published to {remote}/{{{','.join(names)}}} (local copy: {root})")
        say_results(results, root)
        evaluations = [str(root / n) for n in names[1:]]
        if finished:
            shown = " (its results above)" if results else ""
            say(f"[yellow]--resume:[/] nothing to resume: {root / res.metadata.name} had already succeeded{shown}; "
                "--overwrite starts it again")
            return
        listed = f" (evaluation{'s' if len(evaluations) > 1 else ''}: {', '.join(evaluations)})" if evaluations else ""
        say(f"[bold green]Succeeded[/] in {time.monotonic() - t0:.0f} s → {root / res.metadata.name}{listed}")
    finally:  # closed here, not when the frame is collected: a caught SystemExit keeps the frame alive
        for f in locks:
            f.close()


def _run_stages(res, file: Path, root: Path, published: RemoteOutput, doomed: list[Path],
                overwrite: bool, nproc: int | None, resume: bool, again: str) -> tuple[dict, list[tuple[Path, Path]]]:
    """Run ``res``'s stages under ``root`` with progress bars; return its compact results by evaluation name and
    the folders ``--overwrite`` replaced with where their previous content is kept (``root/.replaced/``). Exits on
    a failure: the input's exit code, a stage's (after publishing what was written), or 130 with ``again``, the
    command that resumes the run; each says where the replaced runs are kept."""
    from pitlab.api.summary import compact_results
    from pitlab.local import Interrupted, RunError, run_leakage_eval_local, run_pittraining_local

    remote = published.uri is not None
    with _interruptible(Interrupted):
        p = progress(terminal_only=True)
        reporter = RichReporter(p)
        keep = overwrite and not remote  # a remote output's local copy is scratch
        try:
            with p:  # the bars stop (their last state drawn) before an error below is printed, not after it
                if isinstance(res, PitTraining):
                    status = run_pittraining_local(res, root, reporter, overwrite or remote, nproc, resume,
                                                   keep_replaced=keep)
                    return status["status"].get("results") or {}, reporter.replaced
                return {res.metadata.name: compact_results(
                    run_leakage_eval_local(res, root, reporter, overwrite or remote, resume=resume,
                                           keep_replaced=keep))}, reporter.replaced
        except InputError as err:
            published.publish(root)  # bad input found after the run folder exists (status.json: Failed)
            _say_kept(doomed, reporter)
            published.say_kept()
            fail(from_file(err, file), err.exit_code)
        except RunError as err:
            published.publish(root)
            _say_kept(doomed, reporter)
            published.say_kept()
            fail(f"{err.reason}: {err}\n(status: {TrainingLayout(root / res.metadata.name).status})", err.exit_code)
        except KeyboardInterrupt as err:
            _say_kept(doomed, reporter)
            fail(interrupted_message(getattr(err, "signal_name", "SIGINT"), root / res.metadata.name, again), 130)


def _say_kept(doomed: list[Path], reporter: RichReporter) -> None:
    """After a failure: say which folders --overwrite announced (``doomed``) and left as they were, and where
    the previous runs it moved aside are kept (with the commands that put one back)."""
    touched = set(reporter.deleted_paths) | {path for path, _ in reporter.replaced}
    left = [p for p in doomed if p not in touched]
    if left:
        say(f"[yellow]--overwrite:[/] nothing was deleted: {', '.join(map(str, left))} "
            f"{'is' if len(left) == 1 else 'are'} as before")
    for path, kept in reporter.replaced:
        if path.exists():
            say(f"[yellow]--overwrite:[/] the previous run of {path} is kept in {kept} (this run's files are in "
                f"{path}); to put it back: rm -rf {path} && mv {kept} {path}")
        else:
            say(f"[yellow]--overwrite:[/] the previous run of {path} is kept in {kept} (this run wrote nothing "
                f"there); to put it back: mv {kept} {path}")


def _drop_replaced(replaced: list[tuple[Path, Path]], root: Path, names: list[str]) -> None:
    """After a run succeeded: delete the previous runs ``--overwrite`` kept aside, and ``root/.replaced`` once
    empty; name the ones of ``names`` an earlier, failed ``--overwrite`` left there (a resumed run's)."""
    for _, kept in replaced:
        shutil.rmtree(kept)
        say(f"[yellow]--overwrite:[/] deleted the previous run {kept}")
    aside = root / REPLACED
    older = sorted(p for n in names for p in aside.glob(f"{n}.*")) if aside.is_dir() else []
    for p in older:
        say(f"  note: {p} holds an earlier run that `pitlab run --overwrite` replaced; delete it when it is no "
            "longer needed")
    with contextlib.suppress(OSError):
        aside.rmdir()  # only when empty: after the runs above were deleted, or put back by hand


def _claim_message(res, root: Path, overwrite: bool, file: Path, again: str) -> list[Path]:
    """Refuse (exit 2) run folders under ``root`` that exist without ``--overwrite`` or that coincide (an
    unfinished run with the advice ``again``); with ``--overwrite``, say which folders the run will replace (and
    whose they are) and return them."""
    from pitlab.api.runfolders import check_run_folders, folder_owner
    from pitlab.resume import resume_refusal

    try:  # the refusal is named only where check_run_folders finds an unfinished run of res
        refused = None if overwrite else resume_refusal(res, root)
        doomed = check_run_folders(res, root, overwrite, str(file), resume_command=again, resume_refused=refused)
    except SpecError as err:
        fail(err, 2)
    for path in doomed:
        say(f"[yellow]--overwrite:[/] replacing {path} (written by {escape(folder_owner(path)[1])}) once the "
            f"inputs are checked: it is kept in {root / REPLACED}/ until the new run succeeds")
    return doomed


def interrupted_message(signal_name: str, run_dir: Path, again: str) -> str:
    """What an interrupted ``pitlab run`` says: the Interrupted status and ``again`` (the command that resumes it)
    when the run wrote one in ``run_dir``; otherwise that it stopped before its run folder was written (nothing
    to resume) or before it replaced the run already there (named with its phase, as before)."""
    from pitlab.api.runfolders import folder_phase

    status = TrainingLayout(run_dir).status
    phase = folder_phase(run_dir)
    if phase == "Interrupted":
        return (f"interrupted by {signal_name}; status Interrupted ({status}){interrupted_detail(status)}; "
                f"continue with `{again}`")
    if phase is None:
        return (f"interrupted by {signal_name} before the run wrote {run_dir}: nothing to resume; run the same "
                "command again to start it")
    return (f"interrupted by {signal_name} before the run started: {run_dir} is as before (status {phase}, "
            f"{status})")


def interrupted_detail(status_path: Path) -> str:
    """``: <message>`` of the Interrupted condition in ``status_path`` (it names the last durable checkpoint);
    empty when there is none."""
    import json

    try:
        conds = json.loads(status_path.read_text(encoding="utf-8"))["status"]["conditions"]
        msg = next(c.get("message") for c in conds if c.get("reason") == "Interrupted" and c.get("message"))
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return ""
    return f": {msg}"


@contextlib.contextmanager
def _interruptible(interrupted: type[KeyboardInterrupt]):
    """SIGINT and SIGTERM raise ``interrupted(signal name)`` in the main thread while the block runs (the run
    then ends with status Interrupted); the previous handlers are restored afterwards."""
    def handler(signum, frame) -> None:
        raise interrupted(signal.Signals(signum).name)

    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in old:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
