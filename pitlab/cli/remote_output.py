"""An ``s3://`` ``spec.output.uri`` in ``pitlab run``: the run folders it already holds are claimed before any
work, moved to ``<uri>/.replaced/`` by ``--overwrite`` when the new run publishes (its previous run stays in place
while the new one works in the local cache), and deleted only once the new run succeeded."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pitlab import storage
from pitlab.api import SpecError
from pitlab.api.runfolders import REPLACED
from pitlab.cli.errors import fail
from pitlab.cli.output import say


class RemoteOutput:
    """The run folders ``names`` under the output ``uri`` (None: a local output, and every method does nothing).
    ``taken``: the names whose folder held files when claimed; ``kept``: name → where its previous run was moved."""

    def __init__(self, uri: str | None, names: list[str]):
        self.uri, self.names = uri, names
        self.taken: list[str] = []
        self.kept: dict[str, str] = {}

    def folder(self, name: str) -> str:
        return str(storage.join(self.uri, name))

    def claim(self, resource_name: str, overwrite: bool) -> None:
        """Refuse (exit 2) run folders that hold files, unless ``overwrite``, which names each; an unreadable
        output is a bad ``spec.output.uri``."""
        if self.uri is None:
            return
        try:
            self.taken = [n for n in self.names if storage.list_files(self.folder(n))]
        except storage.StorageError as err:
            fail(SpecError([("spec.output.uri", str(err))]), 2)
        if self.taken and not overwrite:
            fail(f"{self.folder(self.taken[0])} already exists (an earlier run of {resource_name!r}); pass "
                 f"--overwrite to replace it (the earlier run is kept in {self.uri}/{REPLACED}/ until the new run "
                 "succeeds)", 2)
        for n in self.taken:
            say(f"[yellow]--overwrite:[/] replacing {self.folder(n)}: when this run publishes, the earlier run is "
                f"moved to {self.uri}/{REPLACED}/ and deleted once the new run succeeds")

    def publish(self, root: Path) -> None:
        """Move the claimed folders aside (once, all of them, so that the output never mixes two runs), then publish
        every run folder ``root/<name>`` that exists to ``<uri>/<name>``; exit 1 when a move or an upload fails,
        saying where the earlier runs are."""
        from pitlab.local import publish_run

        if self.uri is None:
            return
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        for n in self.taken:
            if n in self.kept:
                continue
            dest = str(storage.join(self.uri, REPLACED, f"{n}.{stamp}"))
            try:
                storage.move_tree(self.folder(n), dest)
            except storage.StorageError as err:
                self.say_kept()
                fail(f"--overwrite: cannot move the earlier run {self.folder(n)} to {dest} ({err}); it is as it "
                     f"was, and this run is in {root / n}", 1)
            self.kept[n] = dest
            say(f"[yellow]--overwrite:[/] moved {self.folder(n)} to {dest}; it is deleted once this run succeeds")
        for n in self.names:
            if (root / n).is_dir():
                try:
                    publish_run(root / n, self.folder(n))
                except storage.StorageError as err:
                    self.say_kept()
                    fail(f"run finished but publishing {root / n} to {self.folder(n)} failed: {err}", 1)

    def drop_kept(self) -> None:
        """After the run succeeded: delete the earlier runs moved aside."""
        for dest in self.kept.values():
            storage.delete_tree(dest)
            say(f"[yellow]--overwrite:[/] deleted the previous run {dest}")
        self.kept.clear()

    def say_kept(self) -> None:
        """After a failure: where each earlier run is kept, and the commands (AWS CLI) that put it back."""
        for n, dest in self.kept.items():
            say(f"[yellow]--overwrite:[/] the previous run of {self.folder(n)} is kept in {dest}; to put it back: "
                f"aws s3 rm --recursive {self.folder(n)}/ && aws s3 mv --recursive {dest}/ {self.folder(n)}/")
