"""``pitlab push`` and ``pitlab pull``: publish a folder (files, MANIFEST.json, _COMPLETE) and download one,
verified."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from pitlab.api import SpecError
from pitlab.cli.errors import fail
from pitlab.cli.inputs import check_uri
from pitlab.cli.output import say


def push(src: Path = typer.Argument(..., metavar="SRC", help="Local folder (a model, a data set)."),
         dest: str = typer.Argument(..., metavar="DEST", help="s3://bucket/prefix (or a local folder)."),
         overwrite: bool = typer.Option(False, "--overwrite",
                                        help="Replace what DEST already holds (refused without it).")) -> None:
    """Publish a folder for pitlab to read: upload every file (multipart, parallel parts), then MANIFEST.json
    (sha256 of each) and _COMPLETE last. Models and base models in s3:// must be published this way. A DEST
    that already holds files is refused unless --overwrite; a local DEST is written aside and renamed into
    place, so it is either the old folder or the new one."""
    from pitlab import storage
    from pitlab.storage.outdir import OutputExists, check_output, describe, published_files

    if not src.is_dir():
        fail(SpecError([("SRC", f"{src}: not a folder")]), 2)
    check_uri("DEST", dest)
    if not storage.is_s3(dest):
        d, r = Path(dest).resolve(), src.resolve()
        if d.is_relative_to(r) or r.is_relative_to(d):
            fail(SpecError([("DEST", f"{dest} and the source folder {src} contain one another; give a "
                                     "destination outside SRC and not around it")]), 2)
    try:
        found = check_output(dest, overwrite, "pitlab push", own=published_files)
        if found:
            say(f"[yellow]--overwrite:[/] replacing {escape(describe(dest, found))} once the new copy is complete")
        m = storage.upload_dir(src, dest)
    except OutputExists as err:
        fail(err, 2)
    except storage.StorageError as err:
        fail(err, 1)
    say(f"[green]✓[/] published {len(m.files)} files, {m.total_bytes:,} bytes → {dest} "
        f"(manifest sha256 {m.digest[:16]}…)")


def pull(src: str = typer.Argument(..., metavar="SRC", help="A published s3://bucket/prefix."),
         dest: Path = typer.Argument(..., metavar="DEST", help="Local folder to create.")) -> None:
    """Download a published folder, verifying every file's sha256 against its manifest."""
    from pitlab import storage

    check_uri("SRC", src)
    if dest.exists():
        fail(SpecError([("DEST", f"{dest} already exists; `pitlab pull` creates the folder (give a new path)")]), 2)
    try:
        m = storage.download_dir(src, dest)
    except (storage.NotPublished, storage.ObjectNotFound) as err:
        fail(SpecError([("SRC", str(err))]), 2)  # the argument names nothing published
    except storage.StorageError as err:
        fail(err, 1)
    say(f"[green]✓[/] {len(m.files)} files, {m.total_bytes:,} bytes verified → {dest}")
