"""What the command prints: the stderr console, message lines, and the runner's stages and progress bars."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

# not a terminal (CI logs, `| tee`, a pod's log): tables 160 columns wide, and message lines never wrapped
# (soft wrap), so that a grep for a phrase of an error finds it
console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def say(*objects, **kwargs) -> None:
    """Print a message line: unwrapped when not on a terminal (the terminal wraps it, a log keeps it whole)."""
    console.print(*objects, soft_wrap=not console.is_terminal, **kwargs)


FEW_UNITS = 20
"""A progress task counted in at most this many units (the analyze stage's statistics: the baseline and each
model) gets a log line at every change: between two of them minutes can pass."""


class RichReporter:
    """Draws the runner's stages and progress bars with rich."""

    def __init__(self, progress: Progress):
        self.p = progress
        self.tasks: dict[str, int] = {}
        self.t0: dict[str, float] = {}
        self.last_line: dict[str, float] = {}
        self.last_text: dict[str, str] = {}
        self.deleted_paths: list[Path] = []
        self.replaced: list[tuple[Path, Path]] = []  # (run folder, where its previous content is kept)

    def deleted(self, path: Path) -> None:
        """``--overwrite`` deleted ``path`` (after the inputs passed)."""
        self.deleted_paths.append(path)
        say(f"[yellow]--overwrite:[/] deleted {path}")

    def set_aside(self, path: Path, kept: Path) -> None:
        """``--overwrite`` moved the previous run in ``path`` to ``kept`` (after the inputs passed)."""
        self.replaced.append((path, kept))
        say(f"[yellow]--overwrite:[/] moved {path} to {kept}; it is deleted once this run succeeds")

    def stage(self, name: str, detail: str = "") -> None:
        self.t0[name] = time.monotonic()
        say(f"[bold cyan]▶ {name}[/] {detail}")

    def progress(self, task: str, done: int, total: int, info: str = "") -> None:
        """A bar on a terminal; in a log a plain line: every change of a task counted in at most
        :data:`FEW_UNITS` (models, stages), else every 15 s (prompts, steps) and at the end."""
        if task not in self.tasks:
            self.tasks[task] = self.p.add_task(task, total=total, info=info)
        self.p.update(self.tasks[task], completed=done, total=total, info=info)
        if not console.is_terminal:  # logs and CI: plain lines instead of a live bar
            now, line = time.monotonic(), f"  {task}: {done}/{total} {info}".rstrip()
            changed = total <= FEW_UNITS and line != self.last_text.get(task)
            if changed or now - self.last_line.get(task, 0.0) > 15 or done == total:
                self.last_line[task], self.last_text[task] = now, line
                say(line)

    def done(self, name: str, detail: str = "") -> None:
        t0 = self.t0.pop(name, None)  # a stage done without running (a resume skips it) has no start
        took = "skipped" if t0 is None else f"{time.monotonic() - t0:.1f} s"
        say(f"[green]✓ {name}[/] {detail} [dim]({took})[/]")


def progress(terminal_only: bool = False) -> Progress:
    """The progress bars of a run or an embedding, drawn on :data:`console`. With ``terminal_only`` nothing is
    drawn when the console is not a terminal (the caller prints plain lines there, as :class:`RichReporter`
    does), so a log does not end with the bars' last state after the stage lines."""
    return Progress(TextColumn("  {task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=console, transient=False, disable=terminal_only and not console.is_terminal)
