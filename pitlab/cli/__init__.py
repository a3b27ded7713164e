"""The ``pitlab`` command: run, validate, and the entry points the pods run (train, merge, evaluate).

One module per job: :mod:`~pitlab.cli.run` and :mod:`~pitlab.cli.validate` (a resource here),
:mod:`~pitlab.cli.train` (prepare, train, plan), :mod:`~pitlab.cli.evaluate` (evaluate, embed, analyze, report),
:mod:`~pitlab.cli.merge`, :mod:`~pitlab.cli.publish` (push, pull); shared by them: :mod:`~pitlab.cli.inputs`
(the spec, arguments), :mod:`~pitlab.cli.output` (console, progress), :mod:`~pitlab.cli.results` (the premium
table) and :mod:`~pitlab.cli.errors` (exit codes). This module builds the typer app.
"""

from __future__ import annotations

from importlib import metadata

import typer

from pitlab.cli import evaluate, merge, publish, render, run, train, validate
from pitlab.cli.errors import EXIT_CODES

# rich_markup_mode=None: click's own help formatter, which flows each docstring paragraph to the terminal
# width, prints flags without a value type, and needs no patching of typer's rich panels
app = typer.Typer(
    rich_markup_mode=None, context_settings={"max_content_width": 120},
    help="pitlab: point-in-time language models for finance, and how much look-ahead leakage inflates their "
         "backtests. One YAML resource (PitTraining or LeakageEval) runs here with `pitlab run`, or on "
         "Kubernetes with `kubectl apply`.",
    epilog=EXIT_CODES,
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)


def _version() -> str:
    try:
        return metadata.version("pitlab")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        print(f"pitlab {_version()}")
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print the version of pitlab and exit.")) -> None:
    pass


SHORT_HELP = {
    "validate": "Check a spec without running it: schema, files, columns, corpus, models, run folders.",
    "run": "Run a PitTraining (filter → train → merge → evaluate) or a LeakageEval on this machine.",
    "prepare": "Filter the corpus, train the tokenizer, write the base model and packed tokens.",
    "analyze": "Protocols, clustered bootstrap and report from OUT/embeddings/ (the analyze Job).",
    "merge": "Merge a DCP checkpoint into a Hugging Face model folder (the merge Job), streaming.",
    "push": "Publish a folder: upload every file, then MANIFEST.json (sha256) and _COMPLETE.",
    "evaluate": "Run one LeakageEval here: embed every model, then analyze (as `pitlab run` does).",
    "embed": "Embed the panel's prompts with one model (the embedding Job's entry point).",
    "plan": "Predict per-GPU memory by component; exit 3 if the run cannot fit the GPU the spec names.",
    "report": "Rebuild report.md, report.html and the plots of an evaluation folder from its results.json.",
    "train": "Training entry point, run by torchrun in every rank (the PyTorchJob's command).",
    "pull": "Download a published folder, verifying every file's sha256 against its manifest.",
    "render": "Print the Kubernetes objects the operator would create for a resource (a dry run, no cluster).",
}
"""What `pitlab --help` lists for each command: click wraps these to the terminal, where it cuts a docstring's
first sentence off with "..." at the terminal's width."""

# the order of `pitlab --help`
for _command in (validate.validate, run.run, evaluate.evaluate, train.prepare, evaluate.embed, evaluate.analyze,
                 train.plan, render.render, evaluate.report, train.train, merge.merge, publish.push, publish.pull):
    app.command(short_help=SHORT_HELP[_command.__name__])(_command)
del _command

__all__ = ["app", "EXIT_CODES"]
