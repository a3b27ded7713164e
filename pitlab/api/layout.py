"""The run-folder layout: where every artifact of a run folder lies (docs/design.md, "The stage table").

A PitTraining's run folder (:class:`TrainingLayout`) and a LeakageEval's (:class:`EvaluationLayout`, whose
outputs live in its ``eval/`` folder, :class:`EvalOutputs`). A root may be a local :class:`~pathlib.Path` or a
URI string (``s3://…``, or a path inside a pod); every path is then of the same type. The names below are the
on-disk names; :data:`pitlab.api.stages` lists what each stage reads and writes with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Union

STATUS = "status.json"
SPEC = "spec.json"
CORPUS_AUDIT = "corpus_audit.json"
BASE = "base"
DATA = "data"
TOKENS = "data/tokens.npy"
CHECKPOINT = "checkpoint"
TRAIN = "train"
METRICS = "train/metrics.jsonl"
SUMMARY = "train/summary.json"
ADAPTER = "adapter"
MODEL = "model"
MERGE_REPORT = "merge_report.json"  # inside model/
EVAL = "eval"
EMBEDDINGS = "embeddings"
RESULTS = "results.json"
REPORT = "report.md"
HTML = "report.html"
PLOT = "premium.png"
REPLICATES = "bootstrap_replicates.csv"
ROWS = "rows.csv"

Root = Union[Path, str]


def join(root: Root, rel: str) -> Root:
    """``root/rel``: a Path for a Path root, ``f"{root}/{rel}"`` for a URI string."""
    return Path(root) / rel if isinstance(root, Path) else f"{root}/{rel}"


def folder(name: str) -> str:
    """A folder's name as the stage table writes it (``base/``)."""
    return f"{name}/"


@dataclass(frozen=True)
class TrainingLayout:
    """The run folder of a PitTraining (``<output>/<name>``)."""

    root: Root

    status = property(lambda self: join(self.root, STATUS))
    spec = property(lambda self: join(self.root, SPEC))
    corpus_audit = property(lambda self: join(self.root, CORPUS_AUDIT))
    base = property(lambda self: join(self.root, BASE))
    tokens = property(lambda self: join(self.root, TOKENS))
    checkpoint = property(lambda self: join(self.root, CHECKPOINT))
    train_dir = property(lambda self: join(self.root, TRAIN))
    metrics = property(lambda self: join(self.root, METRICS))
    summary = property(lambda self: join(self.root, SUMMARY))
    adapter = property(lambda self: join(self.root, ADAPTER))
    model = property(lambda self: join(self.root, MODEL))
    merge_report = property(lambda self: join(self.root, f"{MODEL}/{MERGE_REPORT}"))

    def artifact(self, name: str) -> Root:
        """The path of a name of the stage table (``base/``, ``train/summary.json``, ``checkpoint/step-N/``)."""
        return join(self.root, name.split("/step-N")[0].rstrip("/"))


@dataclass(frozen=True)
class EvalOutputs:
    """A LeakageEval's output folder (``eval/`` of its run folder, or ``pitlab analyze --out``)."""

    root: Root

    results = property(lambda self: join(self.root, RESULTS))
    report = property(lambda self: join(self.root, REPORT))
    html = property(lambda self: join(self.root, HTML))
    plot = property(lambda self: join(self.root, PLOT))
    replicates = property(lambda self: join(self.root, REPLICATES))
    rows = property(lambda self: join(self.root, ROWS))
    embeddings = property(lambda self: join(self.root, EMBEDDINGS))


@dataclass(frozen=True)
class EvaluationLayout:
    """The run folder of a LeakageEval (``<output>/<name>``): ``status.json`` and ``eval/``."""

    root: Root

    status = property(lambda self: join(self.root, STATUS))
    eval_dir = property(lambda self: join(self.root, EVAL))

    @property
    def outputs(self) -> EvalOutputs:
        """The ``eval/`` folder's files."""
        return EvalOutputs(self.eval_dir)
