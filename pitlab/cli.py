"""The ``pitlab`` command: run, validate, and the entry points the pods run (train, merge, evaluate)."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from pitlab.api import DATA_ROOT_ENV, LeakageEval, PitTraining, SpecError, load_resource
from pitlab.api.layout import EvalOutputs, EvaluationLayout, TrainingLayout
from pitlab.errors import InputError


EXIT_CODES = ("Exit codes: 0 success; 2 bad input (a spec, file, column or argument is wrong; found before "
              "anything runs); 1 a stage failed (training, merge, evaluation, an upload or download); 3 `pitlab "
              "plan`: the run does not fit the GPU memory; 130 `pitlab run` was interrupted (SIGINT or SIGTERM; "
              "status Interrupted). (`pitlab train`, the pods' entry point, exits 2 on any pitlab error, "
              "a non-finite loss or an OS error, and 1 with a traceback on anything unexpected.)")

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
# not a terminal (CI logs, `| tee`, a pod's log): tables 160 columns wide, and message lines never wrapped
# (soft wrap), so that a grep for a phrase of an error finds it
console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def _say(*objects, **kwargs) -> None:
    """Print a message line: unwrapped when not on a terminal (the terminal wraps it, a log keeps it whole)."""
    console.print(*objects, soft_wrap=not console.is_terminal, **kwargs)


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

DataRoot = typer.Option(None, "--data-root", envvar=DATA_ROOT_ENV,
                        help=f"Folder of the shared data sets, substituted for ${{{DATA_ROOT_ENV}}} in spec URIs.")


class RichReporter:
    """Draws the runner's stages and progress bars with rich."""

    def __init__(self, progress: Progress):
        self.p = progress
        self.tasks: dict[str, int] = {}
        self.t0: dict[str, float] = {}
        self.last_line: dict[str, float] = {}
        self.deleted_paths: list[Path] = []

    def deleted(self, path: Path) -> None:
        """``--overwrite`` deleted ``path`` (after the inputs passed)."""
        self.deleted_paths.append(path)
        _say(f"[yellow]--overwrite:[/] deleted {path}")

    def stage(self, name: str, detail: str = "") -> None:
        self.t0[name] = time.monotonic()
        _say(f"[bold cyan]▶ {name}[/] {detail}")

    def progress(self, task: str, done: int, total: int, info: str = "") -> None:
        if task not in self.tasks:
            self.tasks[task] = self.p.add_task(task, total=total, info=info)
        self.p.update(self.tasks[task], completed=done, total=total, info=info)
        if not console.is_terminal:  # logs and CI: a plain line every 15 s instead of a live bar
            now = time.monotonic()
            if now - self.last_line.get(task, 0.0) > 15 or done == total:
                self.last_line[task] = now
                _say(f"  {task}: {done}/{total} {info}".rstrip())

    def done(self, name: str, detail: str = "") -> None:
        t0 = self.t0.pop(name, None)  # a stage done without running (a resume skips it) has no start
        took = "skipped" if t0 is None else f"{time.monotonic() - t0:.1f} s"
        _say(f"[green]✓ {name}[/] {detail} [dim]({took})[/]")


def _progress() -> Progress:
    return Progress(TextColumn("  {task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=console, transient=False)


def _fail(err: BaseException, code: int = 1) -> None:
    _say(f"[bold red]error:[/] {escape(str(err))}")
    raise typer.Exit(code)


def _load(path: Path, data_root: Optional[Path]):
    if data_root is not None:
        os.environ[DATA_ROOT_ENV] = str(data_root)
    try:
        return load_resource(path)
    except SpecError as err:
        _fail(err, 2)


def _est(p, ci) -> str:
    """``+0.1234 [+0.0100, +0.2000]`` (blank when not recorded)."""
    if p is None:
        return ""
    lo, hi = ci or [float("nan")] * 2
    return f"{p:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def _print_results_table(results: dict, title: str) -> None:
    table = Table(title=title)
    for col in ("model", "market-neutral premium [CI]", "verdict", "raw premium [CI]", "bias", "date-only part",
                "excess over date-only [CI]", "raw verdict", "reason"):
        table.add_column(col, justify="left" if col in ("model", "verdict", "raw verdict", "reason") else "right")
    for name, r in results.get("models", {}).items():
        table.add_row(name, _est(r.get("marketNeutralPremium"), r.get("marketNeutralCI")),
                      r.get("marketNeutralVerdict") or "", _est(r["premium"], r.get("premiumCI")),
                      "" if r.get("premiumBias") is None else f"{r['premiumBias']:+.4f}",
                      "" if r.get("dateOnlyPremium") is None else f"{r['dateOnlyPremium']:+.4f}",
                      _est(r.get("excessPremium"), r.get("excessCI")) + (f" {r['excessVerdict']}"
                                                                          if r.get("excessVerdict") else ""),
                      r.get("verdict") or "", "; ".join(r.get("reasons") or []))
    console.print(table)
    _say("  premiums: R²(on) − R²(off) on the same rows (the leakage-off test dates); market-neutral = target minus "
         "its date's cross-sectional mean; date-only part = the premium of features that identify the date only")
    for x in results.get("reductions", []):
        lo, hi = x.get("ci") or [float("nan")] * 2
        bias = "" if x.get("bias") is None else f" bias {x['bias']:+.4f}"
        why = f" ({'; '.join(x['reasons'])})" if x.get("reasons") else ""
        _say(f"  premium({x['from']}) − premium({x['to']}): {x['reduction']:+.4f} [{lo:+.4f}, {hi:+.4f}]{bias} "
              f"{x.get('verdict') or ''}{why}")


@app.command()
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
    from pitlab.api.runfolders import check_run_folders, folder_owner, resumable
    from pitlab.data.corpus import local_isoformat
    from pitlab.local import preflight

    res = _load(file, data_root)
    if schema_only:
        _say(f"[green]✓[/] {file}: valid {res.kind} {res.metadata.name!r} (schema)")
        _spec_warnings(res)
        return
    try:
        plan = preflight(res).corpus
        spec_out = res.spec.output.uri if res.spec.output else "out"
        existing = [] if out is None and storage.is_s3(spec_out) else \
            check_run_folders(res, out or Path(spec_out), overwrite, str(file), earlier_runs_ok=True)
    except InputError as err:
        _fail(err, err.exit_code)
    msg = f"{file}: valid {res.kind} {res.metadata.name!r}"
    if plan is not None:
        a = plan.audit
        msg += (f"; corpus keeps {a.included} of {a.total} documents "
                f"(latest {local_isoformat(a.max_included_timestamp, a.timezone)}; timestamps {a.timestamp_format})")
        if a.rejected_timestamp:
            msg += f"; {a.rejected_timestamp} dropped for their timestamp (onMissingTimestamp: drop)"
        if a.rejected_empty_text:
            msg += f"; {a.rejected_empty_text} dropped for an empty text (onEmptyText: drop)"
    _say(f"[green]✓[/] {msg}")
    if plan is not None:
        _say_audit_notes(plan.audit)
    _spec_warnings(res)
    phase = resumable(res, out or Path(spec_out)) if existing else None
    for path in existing:
        resume = f" (or --resume, to continue its unfinished run: status {phase})" if phase else ""
        _say(f"  note: {path} exists (written by {escape(folder_owner(path)[1])}): `pitlab run` needs --overwrite, "
             f"which deletes it{resume}")


def _say_audit_notes(audit) -> None:
    """Print a corpus audit's warnings and its first refused timestamps (dropped with onMissingTimestamp: drop)."""
    for w in audit.warnings:
        _say(f"[yellow]warning:[/] {escape(w)}")
    for x in audit.rejected_timestamp_examples:
        _say(f"  dropped row {x['row']} (id {x['id']!r}): {escape(x['error'])}")


def _spec_warnings(res) -> None:
    """Print the warnings about a valid spec (a LeakageEval's, or a PitTraining's evaluations')."""
    from pitlab.api.leakageeval import LeakageEvalSpec, spec_warnings

    specs = [("spec", res.spec)] if isinstance(res.spec, LeakageEvalSpec) else \
        [(f"spec.evaluations[{i}].spec", e.spec) for i, e in enumerate(getattr(res.spec, "evaluations", []))]
    for where, spec in specs:
        for w in spec_warnings(spec):
            _say(f"[yellow]warning:[/] {where}.{escape(w)}")


@app.command()
def run(file: Path = typer.Argument(..., metavar="FILE", help="PitTraining or LeakageEval YAML."),
        out: Optional[Path] = typer.Option(None, "--out", "-o",
                                           help="Output root (default: the spec's output.uri, else ./out)."),
        data_root: Optional[Path] = DataRoot,
        overwrite: bool = typer.Option(False, "--overwrite",
                                       help="Delete the run's existing folders first: out/<name>/ (checkpoints "
                                            "included) and, for a PitTraining, each evaluation's "
                                            "out/<evaluation name>/; each is named before it is deleted, and only "
                                            "once the inputs passed. To continue an interrupted run instead, use "
                                            "--resume."),
        nproc: Optional[int] = typer.Option(None, "--nproc",
                                            help="torchrun processes (default: spec.resources.gpusPerNode)."),
        resume: bool = typer.Option(False, "--resume",
                                    help="Continue the interrupted run in out/<name>/ from its first unfinished "
                                         "stage (training from its last checkpoint); refused if the spec changed."),
        ) -> None:
    """Run a resource on this machine: corpus filter → train → merge → evaluate (PitTraining), or the
    evaluation alone (LeakageEval). Writes out/<name>/ (and out/<evaluation name>/ for each evaluation) with
    status.json as the operator would. An existing run folder is refused unless --overwrite (which deletes it) or,
    for an interrupted run of the same spec, --resume (which continues it)."""
    from pitlab import storage
    from pitlab.api.summary import compact_results
    from pitlab.local import Interrupted, RunError, local_work_root, run_leakage_eval_local, run_pittraining_local

    if nproc is not None and nproc < 1:
        _fail(SpecError([("--nproc", f"{nproc}: give at least 1 torchrun process")]), 2)
    if resume and overwrite:
        _fail("--resume and --overwrite exclude each other: --resume continues the run folder, --overwrite "
              "deletes it", 2)
    res = _load(file, data_root)
    spec_out = res.spec.output.uri if res.spec.output else "out"
    # s3:// output.uri (and no --out): work in the cache, then publish every run folder to <output.uri>/<name>
    remote = spec_out.rstrip("/") if out is None and storage.is_s3(spec_out) else None
    root = out or (local_work_root(remote) if remote else Path(spec_out))
    names = [res.metadata.name] + [e.name for e in getattr(res.spec, "evaluations", [])]
    if remote and resume:
        _fail(SpecError([("--resume", f"works on a local output folder; spec.output.uri is {spec_out} (give --out "
                                      "DIR, where the interrupted run is)")]), 2)
    if remote:
        _claim_remote(res, remote, names, overwrite)
        shutil.rmtree(root, ignore_errors=True)  # the local working copy of a remote output is scratch
    doomed: list[Path] = []
    if not remote and not resume:
        doomed = _claim_message(res, root, overwrite, file)
    t0 = time.monotonic()

    def publish() -> None:
        _publish_runs(root, remote, names)

    def kept() -> None:
        _say_kept(doomed, reporter.deleted_paths)

    with _interruptible(Interrupted), _progress() as p:
        reporter = RichReporter(p)
        try:
            if isinstance(res, PitTraining):
                status = run_pittraining_local(res, root, reporter, overwrite or bool(remote), nproc, resume)
                results = status["status"].get("results") or {}
            else:
                results = {res.metadata.name: compact_results(
                    run_leakage_eval_local(res, root, reporter, overwrite or bool(remote), resume=resume))}
        except InputError as err:
            publish()  # bad input found after the run folder exists (its status.json says Failed)
            kept()
            _fail(err, err.exit_code)
        except RunError as err:
            publish()
            _fail(f"{err.reason}: {err}\n(status: {TrainingLayout(root / res.metadata.name).status})", err.exit_code)
        except KeyboardInterrupt as err:
            kept()
            status = TrainingLayout(root / res.metadata.name).status
            _fail(f"interrupted by {getattr(err, 'signal_name', 'SIGINT')}; status Interrupted ({status})"
                  f"{_interrupted_detail(status)}; continue with `pitlab run --resume {file}`", 130)
    publish()
    if remote:
        _say(f"  published to {remote}/{{{','.join(names)}}} (local copy: {root})")
    _say_results(results, root)
    _say(f"[bold green]Succeeded[/] in {time.monotonic() - t0:.0f} s → {root / res.metadata.name}")


def _publish_runs(root: Path, remote: str | None, names: list[str]) -> None:
    """Publish every run folder ``root/<name>`` that exists to ``remote/<name>`` (nothing for a local output);
    exit 1 when an upload fails."""
    from pitlab import storage
    from pitlab.local import publish_run

    for n in names:
        if remote and (root / n).is_dir():
            try:
                publish_run(root / n, storage.join(remote, n))
            except storage.StorageError as err:
                _fail(f"run finished but publishing {root / n} to {storage.join(remote, n)} failed: {err}", 1)


def _say_kept(doomed: list[Path], deleted: list[Path]) -> None:
    """After a refusal: say which folders --overwrite announced (``doomed``) but did not delete."""
    left = [p for p in doomed if p not in deleted]
    if left:
        _say(f"[yellow]--overwrite:[/] nothing was deleted: {', '.join(map(str, left))} "
             f"{'is' if len(left) == 1 else 'are'} as before")


def _claim_remote(res, remote: str, names: list[str], overwrite: bool) -> None:
    """Refuse (exit 2) an s3:// output whose run folders ``names`` under ``remote`` already hold files, unless
    ``overwrite``; an unreadable output is a bad ``spec.output.uri``."""
    from pitlab import storage

    try:
        taken = [str(storage.join(remote, n)) for n in names if storage.list_files(storage.join(remote, n))]
    except storage.StorageError as err:
        _fail(SpecError([("spec.output.uri", str(err))]), 2)
    if taken and not overwrite:
        _fail(f"{taken[0]} already exists (an earlier run of {res.metadata.name!r}); pass --overwrite to delete "
              "it, checkpoints included, and start again", 2)


def _say_results(results: dict, root: Path) -> None:
    """The premium table of every evaluation in ``results`` (name → compact results) and where its report is."""
    for name, r in results.items():
        _print_results_table(r, f"Leakage evaluation {name} (R² out of sample, benchmark: training mean)")
        out = EvaluationLayout(root / name).outputs
        _say(f"  report: {out.report}   plot: {out.plot}")


def _interrupted_detail(status_path: Path) -> str:
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


def _claim_message(res, root: Path, overwrite: bool, file: Path) -> list[Path]:
    """Refuse (exit 2) run folders under ``root`` that exist without ``--overwrite`` or that coincide; with
    ``--overwrite``, say which folders the run will delete (and whose they are) and return them."""
    from pitlab.api.runfolders import check_run_folders, folder_owner

    try:
        doomed = check_run_folders(res, root, overwrite, str(file))
    except SpecError as err:
        _fail(err, 2)
    for path in doomed:
        _say(f"[yellow]--overwrite:[/] deleting {path} (written by {escape(folder_owner(path)[1])}) once the "
             "inputs are checked")
    return doomed


@app.command()
def evaluate(file: Path = typer.Argument(..., metavar="FILE", help="LeakageEval YAML."),
             out: Path = typer.Option(Path("out"), "--out", "-o", help="Output root."),
             data_root: Optional[Path] = DataRoot,
             overwrite: bool = typer.Option(False, "--overwrite",
                                            help="Delete an existing out/<name>/ folder first (named before it is "
                                                 "deleted, and only once the inputs passed).")) -> None:
    """Run one LeakageEval here: embed every model, then analyze (same as `pitlab run` on a LeakageEval)."""
    _load_eval(file, data_root)
    run(file, out, data_root, overwrite, None, False)


@app.command()
def prepare(spec: Path = typer.Option(..., "--spec", help="PitTraining as YAML or JSON."),
            run_dir: Path = typer.Option(..., "--run-dir", help="Run folder to write base/, data/, spec.json into."),
            data_root: Optional[Path] = DataRoot) -> None:
    """Filter the corpus to the knowledge cutoff, train the tokenizer, write the base model and packed tokens
    (the prepare Job's entry point; `pitlab run` does the same before training)."""
    from pitlab.trainer.files import write_json_atomic
    from pitlab.trainer.inputs import check_corpus, prepare_run

    res = _load(spec, data_root)
    if not isinstance(res, PitTraining):
        _fail(f"{spec}: kind {res.kind}: `pitlab prepare` takes a PitTraining", 2)
    try:
        plan = check_corpus(res)
        _say_audit_notes(plan.audit)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(TrainingLayout(run_dir).corpus_audit, plan.audit.to_dict())
        base_dir, n_tokens = prepare_run(res, plan, run_dir)
    except InputError as err:
        _fail(err, err.exit_code)
    _say(f"[green]✓[/] {plan.audit.included} documents, {n_tokens:,} tokens → {run_dir}")


def _load_eval(spec: Path, data_root: Optional[Path]) -> LeakageEval:
    res = _load(spec, data_root)
    if not isinstance(res, LeakageEval):
        _fail(f"{spec}: kind {res.kind}: this command takes a LeakageEval", 2)
    return res


@app.command()
def embed(spec: Path = typer.Option(..., "--spec", help="LeakageEval (YAML or JSON)."),
          model: str = typer.Option(..., "--model", help="Name of one of spec.models."),
          out: Path = typer.Option(..., "--out", help="Evaluation folder; embeddings go to OUT/embeddings/."),
          data_root: Optional[Path] = DataRoot) -> None:
    """Embed the panel's prompts with one model (the embedding Job's entry point). The result is the cache
    entry `pitlab analyze` reads (keyed by model digest, embedding settings and prompts)."""
    from pitlab.evaluator.inputs import load_panel, resolve_models
    from pitlab.evaluator.run import embed_panel

    res = _load_eval(spec, data_root)
    names = [m.name for m in res.spec.models]
    if model not in names:
        _fail(f"--model {model!r}: not in spec.models {names}", 2)
    try:
        path, kind = resolve_models(res.spec)[model]
        panel = load_panel(res.spec)
    except InputError as err:
        _fail(err, err.exit_code)
    info: dict = {}
    with _progress() as p:
        task = p.add_task(f"embed {model}", total=len(panel.rows), info="")
        X = embed_panel(res.spec, panel.rows["prompt"].astype(str).tolist(), path, kind,
                        cache_dir=EvalOutputs(out).embeddings, info=info,
                        progress=lambda d, t: p.update(task, completed=d, total=t))
    _say(f"[green]✓[/] {model}: {X.shape[0]:,} × {X.shape[1]} embeddings → {EvalOutputs(out).embeddings}"
          f"{' (cached)' if info.get('cache_hit') else ''}")


@app.command()
def analyze(spec: Path = typer.Option(..., "--spec", help="LeakageEval (YAML or JSON)."),
            out: Path = typer.Option(..., "--out", help="Evaluation folder: results.json, report.md, premium.png."),
            data_root: Optional[Path] = DataRoot) -> None:
    """Protocols, clustered bootstrap and report from the embeddings in OUT/embeddings/ (the analyze Job's
    entry point); a model without cached embeddings is embedded here."""
    from pitlab.api.summary import compact_results
    from pitlab.evaluator.inputs import load_panel, resolve_models
    from pitlab.evaluator.run import run_leakage_eval

    res = _load_eval(spec, data_root)
    try:
        models = resolve_models(res.spec)
        panel = load_panel(res.spec)
    except InputError as err:
        _fail(err, err.exit_code)
    results = run_leakage_eval(res.spec, panel, models, out, cache_dir=EvalOutputs(out).embeddings)
    _print_results_table(compact_results(results), f"Leakage evaluation {res.metadata.name}")
    _say(f"  report: {EvalOutputs(out).report}   plot: {EvalOutputs(out).plot}")


@app.command()
def plan(file: Path = typer.Argument(..., metavar="FILE", help="PitTraining YAML."),
         data_root: Optional[Path] = DataRoot,
         gpu_memory_gib: Optional[float] = typer.Option(None, "--gpu-memory-gib",
                                                        help="GPU memory in GiB (overrides "
                                                             "spec.resources.gpuMemoryGiB).")) -> None:
    """Predict per-GPU memory by component; exit 3 if the run cannot fit the GPU the spec names."""
    from pitlab.trainer.plan import plan_memory

    if gpu_memory_gib is not None and not math.isfinite(gpu_memory_gib):
        _fail(SpecError([("--gpu-memory-gib", f"{gpu_memory_gib}: give a finite number of GiB (e.g. 80)")]), 2)
    if gpu_memory_gib is not None and gpu_memory_gib <= 0.5:
        _fail(SpecError([("--gpu-memory-gib", f"{gpu_memory_gib:g} GiB: must exceed the 0.5 GiB a CUDA context "
                                              "takes")]), 2)
    res = _load(file, data_root)
    if not isinstance(res, PitTraining):
        _fail(SpecError([("kind", f"pitlab plan takes a PitTraining, got {res.kind}")], str(file)), 2)
    try:
        result = plan_memory(res.spec, gpu_memory_gib=gpu_memory_gib)
    except SpecError as err:
        _fail(err, 2)
    print(result.table())
    if result.fits is None:
        _say("[yellow]no GPU memory given[/] (spec.resources.gpuMemoryGiB, --gpu-memory-gib or, with layer "
              "streaming, spec.training.layerStreaming.gpuMemoryBudgetBytes): no fit check")
    elif not result.fits:
        source = "--gpu-memory-gib" if gpu_memory_gib is not None else "spec.resources.gpuMemoryGiB"
        _fail(RuntimeError(f"{file}: {result.refusal(source)}"), 3)
    else:
        def size(n: int) -> str:
            return f"{n / 2**30:.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:.1f} MiB"
        _say(f"[green]✓[/] fits: {size(result.peak_bytes)} of {size(result.capacity_bytes)} per GPU")


@app.command()
def report(out: Path = typer.Argument(..., metavar="OUT",
                                     help="Evaluation folder holding results.json, or the run folder "
                                          "out/<name> whose eval/ holds it.")) -> None:
    """Rebuild report.md, report.html and the plots of an evaluation folder from its results.json."""
    from pitlab.evaluator.report import RESULTS_FILE, rebuild_report

    if not EvalOutputs(out).results.is_file() and EvaluationLayout(out).outputs.results.is_file():
        out = EvaluationLayout(out).eval_dir  # a LeakageEval's run folder: its results are in eval/
    try:
        written = rebuild_report(out)
    except FileNotFoundError as err:
        _fail(ValueError(f"{out}: no {RESULTS_FILE} here nor in {EvaluationLayout(out).eval_dir} ({err.strerror})"), 2)
    except (ValueError, KeyError) as err:
        _fail(ValueError(f"{EvalOutputs(out).results} cannot be rendered: {err}"), 2)
    for p in written:
        _say(f"  wrote {p}")


@app.command()
def train(spec: Path = typer.Option(..., "--spec", help="Resolved PitTraining (JSON) written by the runner."),
          run_dir: Path = typer.Option(..., "--run-dir", help="Run folder with base/ and data/."),
          base: Optional[Path] = typer.Option(None, "--base", help="Base model folder (default RUN_DIR/base).")
          ) -> None:
    """Training entry point, run by torchrun in every rank (the PyTorchJob's command)."""
    from pitlab.trainer.lifetime import exit_with_parent
    from pitlab.trainer.rank_exit import exit_rank
    from pitlab.trainer.train import run_rank

    exit_with_parent()  # a rank whose torchrun is gone (killed with its driver) stops instead of training on

    exit_rank(lambda: run_rank(spec, run_dir, base))  # ends without finalization (see pitlab.trainer.rank_exit)


@app.command()
def merge(checkpoint: str = typer.Option(..., "--checkpoint", help="DCP checkpoint folder (or s3://...)."),
          base: str = typer.Option(..., "--base", help="Base model folder (config + tokenizer; or s3://...)."),
          out: str = typer.Option(..., "--out", help="Output Hugging Face model folder (or s3://..., published "
                                                     "with MANIFEST.json and _COMPLETE)."),
          summary: Optional[str] = typer.Option(None, "--summary",
                                                help="Training summary.json whose param_sha256 must match."),
          max_shard_size: str = typer.Option("5GB", "--max-shard-size",
                                             help="Bytes per safetensors shard, also the memory bound (5GB, 500MB)."),
          logits_probe: str = typer.Option("auto", "--logits-probe",
                                           help="auto (model <= shard size), always or never."),
          merge_adapter: str = typer.Option("auto", "--merge-adapter",
                                            help="LoRA: merge into the base (yes), adapter folder (no), or "
                                                 "auto (lora.mergeIntoBase)."),
          overwrite: bool = typer.Option(False, "--overwrite",
                                         help="Replace an OUT that holds files an earlier merge did not write "
                                              "(they are named, then deleted once the new model is verified).")
          ) -> None:
    """Merge a DCP checkpoint into a Hugging Face model folder in one process (the merge Job's entry point),
    streaming shard by shard. Any of the paths may be an s3:// URI. An OUT holding anything but an earlier
    merge's output (the files its merge_report.json lists) is refused (exit 2), naming those files, unless
    --overwrite is given; OUT is written aside and renamed into place."""
    from pitlab.trainer.merge import MERGE_ADAPTER, run_merge_command

    for field, value in (("--checkpoint", checkpoint), ("--base", base), ("--out", out), ("--summary", summary)):
        if value is not None:
            _check_uri(field, value)

    if logits_probe not in ("auto", "always", "never"):
        _fail(f"--logits-probe {logits_probe!r}: give auto, always or never", 2)
    if merge_adapter not in MERGE_ADAPTER:
        _fail(f"--merge-adapter {merge_adapter!r}: give auto, yes or no", 2)
    sys.exit(run_merge_command(checkpoint, base, out, summary, max_shard_size, logits_probe, merge_adapter,
                               overwrite=overwrite))


def _check_uri(field: str, value: str) -> None:
    """Refuse (exit 2) an ``s3://`` argument that is not a valid bucket/prefix, naming ``field``."""
    from pitlab import storage

    if storage.is_s3(str(value)):
        try:
            storage.parse_s3(str(value))
        except storage.StorageError as err:
            _fail(SpecError([(field, str(err))]), 2)


@app.command()
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
        _fail(SpecError([("SRC", f"{src}: not a folder")]), 2)
    _check_uri("DEST", dest)
    if not storage.is_s3(dest):
        d, r = Path(dest).resolve(), src.resolve()
        if d.is_relative_to(r) or r.is_relative_to(d):
            _fail(SpecError([("DEST", f"{dest} and the source folder {src} contain one another; give a "
                                      "destination outside SRC and not around it")]), 2)
    try:
        found = check_output(dest, overwrite, "pitlab push", own=published_files)
        if found:
            _say(f"[yellow]--overwrite:[/] replacing {escape(describe(dest, found))} once the new copy is complete")
        m = storage.upload_dir(src, dest)
    except OutputExists as err:
        _fail(err, 2)
    except storage.StorageError as err:
        _fail(err, 1)
    _say(f"[green]✓[/] published {len(m.files)} files, {m.total_bytes:,} bytes → {dest} "
          f"(manifest sha256 {m.digest[:16]}…)")


@app.command()
def pull(src: str = typer.Argument(..., metavar="SRC", help="A published s3://bucket/prefix."),
         dest: Path = typer.Argument(..., metavar="DEST", help="Local folder to create.")) -> None:
    """Download a published folder, verifying every file's sha256 against its manifest."""
    from pitlab import storage

    _check_uri("SRC", src)
    if dest.exists():
        _fail(SpecError([("DEST", f"{dest} already exists; `pitlab pull` creates the folder (give a new path)")]), 2)
    try:
        m = storage.download_dir(src, dest)
    except (storage.NotPublished, storage.ObjectNotFound) as err:
        _fail(SpecError([("SRC", str(err))]), 2)  # the argument names nothing published
    except storage.StorageError as err:
        _fail(err, 1)
    _say(f"[green]✓[/] {len(m.files)} files, {m.total_bytes:,} bytes verified → {dest}")


if __name__ == "__main__":
    app()
