"""The command's exit codes, and the one way a command stops on an error (a message line, then the code)."""

from __future__ import annotations

import typer
from rich.markup import escape

from pitlab.cli.output import say

EXIT_CODES = ("Exit codes: 0 success; 2 bad input (a spec, file, column or argument is wrong; found before "
              "anything runs); 1 a stage failed (training, merge, evaluation, an upload or download); 3 `pitlab "
              "plan`: the run does not fit the GPU memory; 130 `pitlab run` was interrupted (SIGINT or SIGTERM; "
              "status Interrupted). (`pitlab train`, the pods' entry point, exits 2 on any pitlab error, "
              "a non-finite loss or an OS error, and 1 with a traceback on anything unexpected.)")


def fail(err: BaseException | str, code: int = 1, hint: str | None = None) -> None:
    """Print ``error: <err>`` (then ``  hint: <hint>`` when given) and exit with ``code`` (raises ``typer.Exit``)."""
    say(f"[bold red]error:[/] {escape(str(err))}")
    if hint:
        say(f"  hint: {escape(hint)}")
    raise typer.Exit(code)


def from_file(err: BaseException, file) -> BaseException:
    """``err``, or for a :class:`pitlab.errors.SpecError` that names no file, the same problems (and class)
    prefixed with ``file`` (the spec the command read), as the schema's errors are."""
    from pitlab.errors import SpecError

    if isinstance(err, SpecError) and not err.source:
        return type(err)(err.problems, str(file))
    return err
