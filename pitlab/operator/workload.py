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

Standard library only (plus :mod:`pitlab.api.summary`): it runs in the trainer and evaluator images.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

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


def report_audit(args: argparse.Namespace) -> int:
    """Run the prepare command, then report ``corpus_audit.json``."""
    rc = _run(args.command)
    if rc != 0:
        return rc
    audit = json.loads(Path(args.audit).read_text())
    write_termination_message({"corpusAudit": compact_audit(audit)}, args.termination_log)
    return 0


def report_results(args: argparse.Namespace) -> int:
    """Run the analysis command, then report the summary of ``results.json`` and the report's path."""
    rc = _run(args.command)
    if rc != 0:
        return rc
    summary = compact_results(json.loads(Path(args.results).read_text()))
    for doc in ({"results": summary, "reportUri": args.report},
                {"results": {"models": {m: {k: v for k, v in r.items() if k in ("premium", "premiumCI", "verdict")}
                                        for m, r in summary["models"].items()}, "truncated": True},
                 "reportUri": args.report},
                {"results": {"truncated": True}, "reportUri": args.report}):
        try:  # a large panel's summary may not fit in 4 KiB: keep what fits, the full results are on the volume
            write_termination_message(doc, args.termination_log)
            return 0
        except ValueError:
            continue
    return 1


def _last_record(path: Path, window: int = 65536) -> dict | None:
    """The last complete JSON line of ``path`` (reads only the file's tail), or None."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - window))
            data = f.read()
    except FileNotFoundError:
        return None
    lines = [ln for ln in data[: data.rfind(b"\n") + 1].splitlines() if ln.strip()]
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def progress(args: argparse.Namespace) -> int:
    """Print the newest metrics record whenever it changes (runs until the pod stops it)."""
    last = None
    for _ in iter(int, 1) if args.max_polls <= 0 else range(args.max_polls):
        rec = _last_record(Path(args.metrics))
        if rec is not None:
            line = PROGRESS_PREFIX + json.dumps(progress_record(rec), separators=(",", ":"), sort_keys=True)
            if line != last:
                print(line, flush=True)
                last = line
        time.sleep(args.interval)
    return 0


def embed_index(args: argparse.Namespace, env: dict[str, str] | None = None) -> int:
    """Run the command with ``{model}`` replaced by the model at ``$JOB_COMPLETION_INDEX``."""
    env = os.environ if env is None else env
    models = args.models.split(",")
    index = int(env["JOB_COMPLETION_INDEX"])
    if not 0 <= index < len(models):
        print(f"pitlab.operator.workload: JOB_COMPLETION_INDEX={index} outside 0..{len(models) - 1}", file=sys.stderr)
        return 2
    return _run([a.replace("{model}", models[index]) for a in args.command])


def parser() -> argparse.ArgumentParser:
    """The command-line interface (subcommands ``report-audit``, ``report-results``, ``progress``, ``embed-index``)."""
    ap = argparse.ArgumentParser(prog="python -m pitlab.operator.workload", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("report-audit")
    a.add_argument("--audit", required=True)
    a.add_argument("--termination-log", default=TERMINATION_LOG)
    a.add_argument("command", nargs=argparse.REMAINDER)
    r = sub.add_parser("report-results")
    r.add_argument("--results", required=True)
    r.add_argument("--report", required=True)
    r.add_argument("--termination-log", default=TERMINATION_LOG)
    r.add_argument("command", nargs=argparse.REMAINDER)
    p = sub.add_parser("progress")
    p.add_argument("--metrics", required=True)
    p.add_argument("--interval", type=float, default=15.0)
    p.add_argument("--max-polls", type=int, default=0, help="stop after this many polls (0: run forever)")
    e = sub.add_parser("embed-index")
    e.add_argument("--models", required=True, help="comma-separated model names, in completion-index order")
    e.add_argument("command", nargs=argparse.REMAINDER)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return {"report-audit": report_audit, "report-results": report_results, "progress": progress,
            "embed-index": embed_index}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
