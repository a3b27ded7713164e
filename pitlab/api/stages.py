"""The pipeline, once: the stages of a PitTraining and of a LeakageEval, in order.

For each stage: the condition it sets (False with ``phase`` as its reason while it runs, True with ``done``
when it finished), the phase of the resource meanwhile, the reason when it fails, what it reads and writes in
the run folder, and the ``pitlab`` entry point that does its work. The operator
(:mod:`pitlab.operator.lifecycle`) runs a stage as the child named in ``child``; ``pitlab run``
(:mod:`pitlab.local`) runs the same entry point's code on this machine. Both walk these tables in order
(tests/test_stages.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from pitlab.api import layout
from pitlab.api.layout import folder


@dataclass(frozen=True)
class Stage:
    """One stage of a resource's pipeline.

    ``failed`` is the reason ``pitlab run`` sets when the stage fails; the operator sets the failed child's own
    reason instead (e.g. ``BackoffLimitExceeded``, ``PyTorchJobFailed``), so that ``kubectl`` shows what
    Kubernetes said. ``done_from_child``: on a cluster the done reason is the child's own (a TrainJob's
    ``JobSetCompleted``, a PyTorchJob's ``PyTorchJobSucceeded``). ``empty``: the done reason when there is nothing
    to run. ``child``: the kind of the cluster child, in words (the train stage's is the run's backend).
    """

    name: str
    condition: str
    phase: str
    done: str
    failed: str
    entry_point: tuple[str, ...]
    child: str
    consumes: tuple[str, ...] = ()
    produces: tuple[str, ...] = ()
    empty: str = ""
    done_from_child: bool = False


VALIDATE = Stage("validate", "Validated", "Validating", "SpecValid", "InvalidSpec", ("pitlab", "validate"), "",
                 consumes=("spec", "corpus", "panel files", "models"))
PREPARE = Stage("prepare", "Prepared", "Preparing", "CorpusFiltered", "PrepareFailed", ("pitlab", "prepare"), "Job",
                consumes=("spec", "corpus", "baseModel"),
                produces=(layout.SPEC, layout.CORPUS_AUDIT, folder(layout.BASE), layout.TOKENS))
TRAIN = Stage("train", "Trained", "Training", "Succeeded", "TrainingFailed", ("pitlab", "train"),
              "TrainJob, JobSet or PyTorchJob",
              consumes=(layout.SPEC, folder(layout.BASE), layout.TOKENS),
              produces=(f"{layout.CHECKPOINT}/step-N/", layout.METRICS, layout.SUMMARY), done_from_child=True)
MERGE = Stage("merge", "Merged", "Merging", "MergeSucceeded", "MergeFailed", ("pitlab", "merge"), "Job",
              consumes=(folder(layout.CHECKPOINT), folder(layout.BASE), layout.SUMMARY),
              produces=(folder(layout.MODEL),))
EVALUATE = Stage("evaluate", "Evaluated", "Evaluating", "EvaluationsSucceeded", "EvaluationFailed", ("pitlab", "run"),
                 "LeakageEval", consumes=(folder(layout.BASE), folder(layout.MODEL)), produces=("<evaluation name>/",),
                 empty="NoEvaluations")

EMBED = Stage("embed", "Embedded", "Embedding", "EmbeddingsWritten", "EmbeddingFailed", ("pitlab", "embed"), "Job",
              consumes=("spec", "panel files", "models"), produces=(folder(layout.EMBEDDINGS),))
ANALYZE = Stage("analyze", "Analyzed", "Analyzing", "ResultsWritten", "AnalysisFailed", ("pitlab", "analyze"), "Job",
                consumes=("spec", "panel files", folder(layout.EMBEDDINGS)),
                produces=(layout.RESULTS, layout.REPORT, layout.HTML, layout.PLOT, layout.REPLICATES))

PITTRAINING = (VALIDATE, PREPARE, TRAIN, MERGE, EVALUATE)
LEAKAGEEVAL = (VALIDATE, EMBED, ANALYZE)
SUCCEEDED = "Succeeded"  # the reason of phase Succeeded

STAGES = {"PitTraining": PITTRAINING, "LeakageEval": LEAKAGEEVAL}


def conditions_of(kind: str) -> tuple[str, ...]:
    """The stage condition types of ``kind`` (``PitTraining`` or ``LeakageEval``), in order."""
    return tuple(s.condition for s in STAGES[kind])
