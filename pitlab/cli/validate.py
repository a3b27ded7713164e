"""``pitlab validate``: check a spec, its inputs and its run folders without running anything."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from pitlab.cli.errors import fail, from_file
from pitlab.cli.inputs import DataRoot, load, say_audit_notes, say_base_model_warning, say_spec_warnings
from pitlab.cli.output import say
from pitlab.errors import InputError


def validate(file: Path = typer.Argument(..., metavar="FILE", help="PitTraining or LeakageEval YAML."),
             data_root: Optional[Path] = DataRoot,
             schema_only: bool = typer.Option(False, "--schema-only",
                                              help="Check the schema only (for cluster specs whose files live "
                                                   "on the cluster's volume)."),
             out: Optional[Path] = typer.Option(None, "--out", "-o",
                                                help="Output root `pitlab run` would use (default: the spec's "
                                                     "output.uri, else ./out)."),
             overwrite: bool = typer.Option(False, "--overwrite",
                                            help="Check as `pitlab run --overwrite` would: existing run folders "
                                                 "of other resources are then listed, not refused.")) -> None:
    """Check a spec without running it: schema, then files, columns, corpus cutoff, models and the run folders
    under the output root (a folder another resource or no pitlab run wrote is refused without --overwrite)."""
    from pitlab import storage
    from pitlab.api.runfolders import REPLACED, check_run_folders, folder_owner, resumable
    from pitlab.local import preflight

    res = load(file, data_root)
    if schema_only:
        say(f"[green]✓[/] {file}: valid {res.kind} {res.metadata.name!r} (schema)")
        say_spec_warnings(res)
        return
    try:
        checked = preflight(res)
        plan = checked.corpus
        spec_out = res.spec.output.uri if res.spec.output else "out"
        existing = [] if out is None and storage.is_s3(spec_out) else \
            check_run_folders(res, out or Path(spec_out), overwrite, str(file), earlier_runs_ok=True)
    except InputError as err:
        hint = (f"a cluster spec's inputs live on the cluster's volume: `pitlab validate --schema-only {file}` "
                "checks its schema alone") if _missing_input(err) else None
        fail(from_file(err, file), err.exit_code, hint)
    say(f"[green]✓[/] {file}: valid {res.kind} {res.metadata.name!r}{_corpus_summary(plan)}")
    if plan is not None:
        say_audit_notes(plan.audit)
    say_spec_warnings(res)
    _say_panels(res, checked.evaluations)
    say_base_model_warning(res)
    phase = resumable(res, out or Path(spec_out)) if existing else None
    resume = _resume_note(res, out or Path(spec_out), phase) if phase else ""
    for path in existing:
        say(f"  note: {path} exists (written by {escape(folder_owner(path)[1])}): `pitlab run` needs --overwrite, "
            f"which replaces it (kept in {REPLACED}/ until the new run succeeds){resume}")


def _missing_input(err: InputError) -> bool:
    """Whether ``err`` is a spec error naming an input path that does not exist here."""
    from pitlab.errors import MissingInputError

    return isinstance(err, MissingInputError)


def _resume_note(res, root: Path, phase: str) -> str:
    """How ``--resume`` would treat the unfinished run (status ``phase``) of ``res`` under ``root``: offered, or
    the first reason `pitlab run --resume` would refuse it (a changed spec field, with both values)."""
    from pitlab.api.runfolders import folder_holder
    from pitlab.resume import resume_refusal

    pid = folder_holder(root / res.metadata.name)
    if pid is not None:
        return f"; a pitlab run (pid {pid}) is running it now (status {phase}): wait for it to end"
    refused = resume_refusal(res, root)
    if refused:
        return f"; its unfinished run (status {phase}) cannot be resumed with this spec: {refused}"
    if phase not in ("Interrupted", "Failed"):  # a stage's phase that no process holds: killed (kill -9, a crash)
        return (f" (or --resume, to continue its unfinished run: status {phase}, but no pitlab run holds it: its "
                "process ended without a word, e.g. killed)")
    return f" (or --resume, to continue its unfinished run: status {phase})"


def _say_panels(res, evaluations) -> None:
    """Each evaluation's sampled panel: the rows it will drop and the warnings about its construction (an
    unadjusted split in a sampled row's window, a survivorship snapshot), its protocols (training labels that
    overlap the test period) and its models (a knowledge cutoff on or after the test start), as the run will
    report them."""
    from pitlab.data.sampling import dropped_note

    names = [res.metadata.name] if res.kind == "LeakageEval" else [e.name for e in res.spec.evaluations]
    for name, checked in zip(names, evaluations):
        panel = checked.panel
        note = dropped_note(panel.dropped, len(panel.rows), panel.dropped_rows,
                            listed_in="in the run's results.json; validate writes no file")
        say(f"  panel of {name}: {len(panel.rows):,} rows ({panel.rows.date.nunique()} dates × "
            f"{panel.rows.security.nunique()} securities){note}")
        for w in panel.warnings + checked.warnings:
            say(f"  [yellow]warning:[/] {escape(w)}")


def _corpus_summary(plan) -> str:
    """``; corpus keeps … documents (…)`` of a PitTraining's corpus plan (with what it dropped); empty for None."""
    from pitlab.data.corpus import local_isoformat

    if plan is None:
        return ""
    a = plan.audit
    msg = (f"; corpus keeps {a.included} of {a.total} documents "
           f"(latest {local_isoformat(a.max_included_timestamp, a.timezone)}; timestamps {a.timestamp_format})")
    if a.rejected_timestamp:
        msg += f"; {a.rejected_timestamp} dropped for their timestamp (onMissingTimestamp: drop)"
    if a.rejected_empty_text:
        msg += f"; {a.rejected_empty_text} dropped for an empty text (onEmptyText: drop)"
    return msg
