"""``pitlab render``: the Kubernetes objects the operator would create for a resource, as multi-document YAML, for
review without a cluster (the objects and their order: :mod:`pitlab.operator.render`)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import List, Optional

import typer

from pitlab.api import PitTraining, SpecError
from pitlab.cli.errors import fail, from_file
from pitlab.cli.inputs import load
from pitlab.cli.output import say
from pitlab.operator.config import TRAINING_BACKENDS, OperatorConfig

DEFAULT_NAMESPACE = "default"
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def render(file: Path = typer.Argument(..., metavar="FILE",
                                       help="PitTraining or LeakageEval YAML, as you would `kubectl apply` it."),
           namespace: Optional[str] = typer.Option(None, "--namespace", "-n",
                                                   help="Namespace of the resource when its metadata.namespace is "
                                                        f"unset (default: {DEFAULT_NAMESPACE}); as with kubectl, "
                                                        "a different metadata.namespace is refused."),
           backend: Optional[str] = typer.Option(None, "--backend", metavar="|".join(TRAINING_BACKENDS),
                                                 help="Training backend when spec.resources.backend is unset "
                                                      "(default: PITLAB_TRAINING_BACKEND, else auto). auto has no "
                                                      "cluster to ask: TrainJob is assumed, and the output says so."),
           training: List[Path] = typer.Option([], "--training", metavar="FILE",
                                               help="A PitTraining YAML that a LeakageEval's trainingRef names "
                                                    "(repeatable): the models' paths come from it."),
           output: Optional[Path] = typer.Option(None, "--output", "-o",
                                                 help="Write the YAML to this file (atomically) instead of "
                                                      "stdout.")) -> None:
    """Print, as multi-document YAML, the objects the operator would create for FILE, in the order it creates them,
    each after a comment naming the stage that creates it: for a PitTraining its spec ConfigMap, prepare Job,
    training child (TrainJob, JobSet or PyTorchJob), merge Job and, per spec.evaluations entry, the child
    LeakageEval with its ConfigMap, embedding Jobs and analyze Job; for a LeakageEval its ConfigMap, embedding
    Jobs and analyze Job. Nothing is read from or sent to a cluster, e.g. `pitlab render FILE | kubectl apply
    --dry-run=server -f -`.

    The operator's settings come from the same PITLAB_* environment variables the Helm chart sets on the
    operator's pod (PITLAB_TRAINER_IMAGE, PITLAB_EVALUATOR_IMAGE, PITLAB_PVC, PITLAB_MOUNT_PATH,
    PITLAB_DATA_ROOT, PITLAB_TRAINING_BACKEND, PITLAB_TRAINING_RUNTIME, PITLAB_IMAGE_PULL_SECRETS, ...;
    see charts/pitlab/templates/deployment.yaml); export your chart values to reproduce them. Unset ones take the
    operator's defaults. ownerReferences' uid is a placeholder: on a cluster it is the owner object's."""
    from pitlab.operator import render as rendering

    if backend is not None and backend not in TRAINING_BACKENDS:
        fail(f"--backend {backend!r}: give {', '.join(TRAINING_BACKENDS[:-1])} or {TRAINING_BACKENDS[-1]}", 2)
    res = load(file, None)
    named = getattr(res.spec.resources, "backend", None) if isinstance(res, PitTraining) else None
    if backend is not None and named and named != backend:
        say(f"note: --backend {backend} is not used: {file} names spec.resources.backend: {named}, which the "
            "operator takes first")
    trainings = _trainings(training)
    ns = _namespace(res, namespace)
    cfg = _config()
    _note_data_root(cfg)
    try:
        text = rendering.dump(rendering.render(res, ns, cfg, backend, trainings))
    except SpecError as err:
        fail(from_file(err, file), 2)
    _write(text, output)


def _config() -> OperatorConfig:
    """:meth:`OperatorConfig.from_env`; exit 2 naming the variables it refuses."""
    try:
        return OperatorConfig.from_env()
    except ValueError as err:
        bad = []
        for key, value in sorted(os.environ.items()):
            if key.startswith("PITLAB_"):
                try:
                    OperatorConfig.from_env({key: value})
                except ValueError:
                    bad.append(f"{key}={value!r}")
        fail(f"operator settings ({', '.join(bad) or 'PITLAB_* environment variables'}): {err}", 2)


def _note_data_root(cfg: OperatorConfig) -> None:
    """A note when the pods' data root (``PITLAB_DATA_ROOT``, which a local ``pitlab run`` also reads) is not on
    their volume: likely this machine's data folder, not the chart's ``storage.dataRoot``."""
    mount = cfg.mount_path.rstrip("/")
    if cfg.data_root != mount and not cfg.data_root.startswith(mount + "/"):
        say(f"note: PITLAB_DATA_ROOT={cfg.data_root} is not under the pods' mount path {cfg.mount_path}: the "
            "output uses it as the pods' data root; export the chart's storage.dataRoot (default /pitlab/data) "
            "to render what the operator creates")


def _namespace(res, option: Optional[str]) -> str:
    """The resource's namespace: metadata.namespace, else ``--namespace``, else ``default``; exit 2 on a
    namespace that is not a DNS label, or on two that differ."""
    given = res.metadata.namespace
    if given and option and given != option:
        fail(SpecError([("metadata.namespace", f"{given!r} differs from --namespace {option!r} (kubectl refuses "
                                               "this too)")]), 2)
    ns = given or option or DEFAULT_NAMESPACE
    if not _LABEL.match(ns) or len(ns) > 63:
        field = "metadata.namespace" if given else "--namespace"
        fail(SpecError([(field, f"{ns!r} is not a namespace name (a DNS-1123 label: lowercase letters, digits "
                                "and '-', at most 63 characters)")]), 2)
    return ns


def _trainings(files: List[Path]) -> dict[str, PitTraining]:
    """The ``--training`` PitTrainings by name; exit 2 on an invalid one or another kind."""
    out: dict[str, PitTraining] = {}
    for path in files:
        res = load(path, None)
        if not isinstance(res, PitTraining):
            fail(f"--training {path}: kind {res.kind}: give a PitTraining", 2)
        out[res.metadata.name] = res
    return out


def _write(text: str, output: Optional[Path]) -> None:
    """``text`` to stdout, or to ``output`` atomically (a temporary file beside it, then renamed); exit 2 when
    it cannot be written."""
    if output is None:
        sys.stdout.write(text)
        return
    from pitlab.trainer.files import write_text_atomic

    try:
        write_text_atomic(output, text)
    except OSError as err:
        fail(f"--output {output}: {err.strerror or err}", 2)
    say(f"wrote {output}")
