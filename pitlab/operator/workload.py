"""Small helpers that run *inside* the pods the operator creates, so that results reach the operator
without giving the workloads any API access:

- ``report-audit`` / ``report-results`` run a command (``pitlab prepare`` / ``pitlab analyze``) and, when it
  succeeds, write a compact JSON summary of its output file to the container's termination message
  (``/dev/termination-log``, at most 4096 bytes), which the operator reads from the pod's status.
  When the command fails nothing is written, so ``terminationMessagePolicy: FallbackToLogsOnError`` makes
  the last log lines (the command's error) the message.
- ``progress`` (the training master's sidecar) prints the newest training metrics record as one
  ``PITLAB_PROGRESS {json}`` line whenever it changes; the operator reads the sidecar's last log line.
- ``embed-index`` runs the embedding of the model whose position is ``$JOB_COMPLETION_INDEX`` (indexed Job).

    python -m pitlab.operator.workload report-results --results E/results.json --report E/report.md -- \
        pitlab analyze --spec /etc/pitlab/leakageeval.yaml --out E

Standard library, typer (its options, declared once) and :mod:`pitlab.api.summary` only: it runs in the trainer and
evaluator images.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from pitlab.api.progress import newest_record
from pitlab.api.summary import PROGRESS_PREFIX, TERMINATION_LIMIT, compact_audit, compact_results, progress_record

TERMINATION_LOG = "/dev/termination-log"


def _run(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("pitlab.operator.workload: no command given after --", file=sys.stderr)
        return 2
    return subprocess.call(argv)


def write_termination_message(doc: dict, path: str = TERMINATION_LOG) -> str:
    """Write ``doc`` as compact JSON to ``path``; raises ``ValueError`` if it exceeds the 4096-byte limit."""
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > TERMINATION_LIMIT:
        raise ValueError(f"termination message of {len(text.encode())} bytes exceeds {TERMINATION_LIMIT}")
    Path(path).write_text(text)
    return text


def report_audit(audit: Path, command: list[str], termination_log: str = TERMINATION_LOG) -> int:
    """Run the prepare ``command``, then report ``audit`` (``corpus_audit.json``); returns the exit code."""
    rc = _run(command)
    if rc != 0:
        return rc
    doc = json.loads(Path(audit).read_text())
    write_termination_message({"corpusAudit": compact_audit(doc)}, termination_log)
    return 0


HEADLINE_FIELDS = ("marketNeutralPremium", "marketNeutralCI", "marketNeutralVerdict")
RAW_FIELDS = ("premium", "premiumCI", "verdict")
SHORT_FIELDS = HEADLINE_FIELDS + RAW_FIELDS
"""A model's fields in a results summary too large for the termination message: the headline (market-neutral)
premium and the raw one, each with its interval and verdict; if those do not fit either, the headline only (the
raw premium's for results without it)."""


def report_results(results: Path, report: str, command: list[str], termination_log: str = TERMINATION_LOG) -> int:
    """Run the analysis ``command``, then report the summary of ``results`` (``results.json``) and the report's
    path ``report``; returns the exit code (1 when not even the shortest summary fits the message)."""
    rc = _run(command)
    if rc != 0:
        return rc
    summary = compact_results(json.loads(Path(results).read_text()))

    def cut(fields: tuple[str, ...]) -> dict:
        return {"results": {"models": {m: {k: v for k, v in r.items() if k in fields}
                                       for m, r in summary["models"].items()}, "truncated": True},
                "reportUri": report}

    headline = HEADLINE_FIELDS if any("marketNeutralPremium" in r for r in summary["models"].values()) else RAW_FIELDS
    for doc in ({"results": summary, "reportUri": report}, cut(SHORT_FIELDS), cut(headline),
                {"results": {"truncated": True}, "reportUri": report}):
        try:  # a large panel's summary may not fit in 4 KiB: keep what fits, the full results are on the volume
            write_termination_message(doc, termination_log)
            return 0
        except ValueError:
            continue
    return 1


def progress(metrics: Path, interval: float = 15.0, max_polls: int = 0) -> int:
    """Print the newest record of ``metrics`` whenever it changes, polling every ``interval`` seconds, ``max_polls``
    times (0: until the pod stops it); returns 0."""
    last = None
    for _ in iter(int, 1) if max_polls <= 0 else range(max_polls):
        rec = newest_record(Path(metrics))
        if rec is not None:
            line = PROGRESS_PREFIX + json.dumps(progress_record(rec), separators=(",", ":"), sort_keys=True)
            if line != last:
                print(line, flush=True)
                last = line
        time.sleep(interval)
    return 0


def embed_index(models: str, command: list[str], env: dict[str, str] | None = None) -> int:
    """Run ``command`` with ``{model}`` replaced by the model of ``models`` (comma-separated) at
    ``$JOB_COMPLETION_INDEX`` (of ``env``, default the process's); returns its exit code, 2 for an index outside."""
    env = os.environ if env is None else env
    models = models.split(",")
    index = int(env["JOB_COMPLETION_INDEX"])
    if not 0 <= index < len(models):
        print(f"pitlab.operator.workload: JOB_COMPLETION_INDEX={index} outside 0..{len(models) - 1}", file=sys.stderr)
        return 2
    return _run([a.replace("{model}", models[index]) for a in command])


app = typer.Typer(rich_markup_mode=None, context_settings={"max_content_width": 120}, no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False,
                  help="Helpers that run inside the pods: the corpus audit and the results as termination messages, "
                       "training progress lines, the indexed embedding Job.")
# everything after the options (after `--`) is the command to run, never parsed as this program's options
_PASS_THROUGH = {"allow_interspersed_args": False, "ignore_unknown_options": True}
_COMMAND = typer.Argument(None, metavar="-- COMMAND...", help="The command to run, after --.")
_TERMINATION_LOG = typer.Option(TERMINATION_LOG, "--termination-log",
                                help="File the summary is written to (the container's termination message).")


@app.command("report-audit", context_settings=_PASS_THROUGH)
def _report_audit(audit: Path = typer.Option(..., "--audit", help="corpus_audit.json the command writes."),
                  termination_log: str = _TERMINATION_LOG, command: Optional[List[str]] = _COMMAND) -> None:
    """Run the prepare command; when it succeeds, report its corpus audit."""
    raise typer.Exit(report_audit(audit, command or [], termination_log))


@app.command("report-results", context_settings=_PASS_THROUGH)
def _report_results(results: Path = typer.Option(..., "--results", help="results.json the command writes."),
                    report: str = typer.Option(..., "--report", help="Path of the report, as the status names it."),
                    termination_log: str = _TERMINATION_LOG, command: Optional[List[str]] = _COMMAND) -> None:
    """Run the analysis command; when it succeeds, report the summary of its results."""
    raise typer.Exit(report_results(results, report, command or [], termination_log))


@app.command("progress")
def _progress(metrics: Path = typer.Option(..., "--metrics", help="The training's metrics.jsonl."),
              interval: float = typer.Option(15.0, "--interval", help="Seconds between polls."),
              max_polls: int = typer.Option(0, "--max-polls", help="Stop after this many polls (0: run forever).")
              ) -> None:
    """Print the newest training metrics record whenever it changes (the training master's sidecar)."""
    raise typer.Exit(progress(metrics, interval, max_polls))


@app.command("embed-index", context_settings=_PASS_THROUGH)
def _embed_index(models: str = typer.Option(..., "--models",
                                            help="Comma-separated model names, in completion-index order."),
                 command: Optional[List[str]] = _COMMAND) -> None:
    """Run the embedding command of the model at $JOB_COMPLETION_INDEX ({model} in the command is replaced)."""
    raise typer.Exit(embed_index(models, command or []))


def main(argv: list[str] | None = None) -> int:
    """``python -m pitlab.operator.workload ARGV`` (default ``sys.argv[1:]``); returns the exit code (2: bad
    arguments)."""
    try:
        app(args=argv, prog_name="python -m pitlab.operator.workload")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
