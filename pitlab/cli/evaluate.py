"""The evaluation's commands: ``pitlab evaluate`` (a LeakageEval here), the embedding and analyze Jobs' entry
points (``embed``, ``analyze``), and ``report`` (rebuilt from results.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pitlab.api.layout import EvalOutputs, EvaluationLayout
from pitlab.cli.errors import fail, from_file
from pitlab.cli.inputs import DataRoot, load_eval
from pitlab.cli.output import progress, say
from pitlab.cli.results import print_results_table
from pitlab.cli.run import run
from pitlab.errors import InputError


def evaluate(file: Path = typer.Argument(..., metavar="FILE", help="LeakageEval YAML."),
             out: Optional[Path] = typer.Option(None, "--out", "-o",
                                                help="Output root (default: the spec's output.uri, else ./out)."),
             data_root: Optional[Path] = DataRoot,
             overwrite: bool = typer.Option(False, "--overwrite",
                                            help="Replace an existing out/<name>/ folder (as `pitlab run "
                                                 "--overwrite`: once the inputs passed it is moved to "
                                                 "out/.replaced/ and deleted only when the new run succeeds).")) -> None:
    """Run one LeakageEval here: embed every model, then analyze (same as `pitlab run` on a LeakageEval)."""
    load_eval(file, data_root)
    run(file, out, data_root, overwrite, None, False)


def embed(spec: Path = typer.Option(..., "--spec", help="LeakageEval (YAML or JSON)."),
          model: str = typer.Option(..., "--model", help="Name of one of spec.models."),
          out: Path = typer.Option(..., "--out", help="Evaluation folder; embeddings go to OUT/embeddings/."),
          data_root: Optional[Path] = DataRoot) -> None:
    """Embed the panel's prompts with one model (the embedding Job's entry point). The result is the cache
    entry `pitlab analyze` reads (keyed by model digest, embedding settings and prompts)."""
    from pitlab.evaluator.inputs import load_panel, resolve_models
    from pitlab.evaluator.run import embed_panel

    res = load_eval(spec, data_root)
    names = [m.name for m in res.spec.models]
    if model not in names:
        fail(f"--model {model!r}: not in spec.models {names}", 2)
    try:
        path, kind = resolve_models(res.spec)[model]
        panel = load_panel(res.spec)
    except InputError as err:
        fail(from_file(err, spec), err.exit_code)
    info: dict = {}
    with progress() as p:
        task = p.add_task(f"embed {model}", total=len(panel.rows), info="")
        X = embed_panel(res.spec, panel.rows["prompt"].astype(str).tolist(), path, kind,
                        cache_dir=EvalOutputs(out).embeddings, info=info,
                        progress=lambda d, t: p.update(task, completed=d, total=t))
    say(f"[green]✓[/] {model}: {X.shape[0]:,} × {X.shape[1]} embeddings → {EvalOutputs(out).embeddings}"
        f"{' (cached)' if info.get('cache_hit') else ''}")


def analyze(spec: Path = typer.Option(..., "--spec", help="LeakageEval (YAML or JSON)."),
            out: Path = typer.Option(..., "--out", help="Evaluation folder: results.json, report.md, premium.png."),
            data_root: Optional[Path] = DataRoot) -> None:
    """Protocols, clustered bootstrap and report from the embeddings in OUT/embeddings/ (the analyze Job's
    entry point); a model without cached embeddings is embedded here."""
    from pitlab.api.summary import compact_results
    from pitlab.evaluator.inputs import load_panel, resolve_models
    from pitlab.evaluator.run import run_leakage_eval

    res = load_eval(spec, data_root)
    try:
        models = resolve_models(res.spec)
        panel = load_panel(res.spec)
    except InputError as err:
        fail(from_file(err, spec), err.exit_code)
    results = run_leakage_eval(res.spec, panel, models, out, cache_dir=EvalOutputs(out).embeddings)
    print_results_table(compact_results(results), f"Leakage evaluation {res.metadata.name}")
    say(f"  report: {EvalOutputs(out).report}   plot: {EvalOutputs(out).plot}")


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
        fail(ValueError(f"{out}: no {RESULTS_FILE} here nor in {EvaluationLayout(out).eval_dir} ({err.strerror})"
                        + _evaluations_of(out)), 2)
    except (ValueError, KeyError) as err:
        fail(ValueError(f"{EvalOutputs(out).results} cannot be rendered: {err}"), 2)
    for p in written:
        say(f"  wrote {p}")


def _evaluations_of(folder: Path) -> str:
    """``; it is PitTraining x's run folder: its evaluations are in A, B`` when ``folder`` holds a PitTraining's
    status.json naming evaluations, else empty."""
    import json

    try:
        doc = json.loads((Path(folder) / "status.json").read_text(encoding="utf-8"))
        names = [e["name"] for e in doc["spec"].get("evaluations") or []]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ""
    if doc.get("kind") != "PitTraining" or not names:
        return ""
    where = ", ".join(str(Path(folder).parent / n) for n in names)
    return (f"; it is the run folder of PitTraining {doc.get('metadata', {}).get('name')!r}, whose "
            f"evaluation{'s are' if len(names) > 1 else ' is'} in {where} (by default; --out moves them)")
