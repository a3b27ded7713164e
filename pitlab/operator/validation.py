"""Checks the operator makes before starting a run: the spec as pydantic validates it (the same rules the
CRD's schema and CEL rules express, for API servers that did not enforce them) and what the schema cannot
express (URIs the pods can read, names the children need). Each problem names the field as written in YAML.
"""

from __future__ import annotations

from typing import Any

from pitlab.api import LeakageEval, PitTraining, SpecError, parse_resource
from pitlab.operator import naming
from pitlab.operator.config import OperatorConfig


def parse(body: dict[str, Any], kind: str) -> PitTraining | LeakageEval:
    """The resource's spec as a pydantic model; raises :class:`SpecError` naming the field path."""
    doc = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec")}
    doc["kind"] = doc.get("kind") or kind
    meta = dict(body.get("metadata") or {})
    doc["metadata"] = {k: meta[k] for k in ("name", "namespace", "labels", "annotations", "generation") if k in meta}
    res = parse_resource(doc)
    if res.kind != kind:
        raise SpecError([("kind", f"expected {kind}, got {res.kind}")])
    return res


def _uri(cfg: OperatorConfig, uri: str, field: str, problems: list[tuple[str, str]]) -> None:
    try:
        cfg.resolve(uri)
    except ValueError as err:
        problems.append((field, str(err)))


def _output_uri(cfg: OperatorConfig, uri: str, field: str, problems: list[tuple[str, str]]) -> None:
    if uri.startswith("s3://"):
        problems.append((field, "s3:// outputs are not supported on Kubernetes yet: the run folders are on the "
                                "shared volume (inputs, models and spec.checkpoint.uri can be s3://; "
                                "`pitlab run` publishes s3:// outputs)"))
    else:
        _uri(cfg, uri, field, problems)


def check_training(pt: PitTraining, cfg: OperatorConfig) -> list[tuple[str, str]]:
    """Problems of a PitTraining that its schema cannot see (empty list: fine)."""
    problems: list[tuple[str, str]] = []
    s = pt.spec
    _uri(cfg, s.corpus.uri, "spec.corpus.uri", problems)
    _output_uri(cfg, s.output.uri, "spec.output.uri", problems)
    if s.base_model.uri:
        _uri(cfg, s.base_model.uri, "spec.baseModel.uri", problems)
    if s.checkpoint.uri:
        _uri(cfg, s.checkpoint.uri, "spec.checkpoint.uri", problems)
    names = [e.name for e in s.evaluations]
    children = [naming.evaluation(pt.metadata.name, n) for n in names]
    for i, e in enumerate(s.evaluations):
        if names.count(e.name) > 1:
            problems.append((f"spec.evaluations[{i}].name", f"duplicate evaluation name {e.name!r}"))
        elif children.count(children[i]) > 1:
            problems.append((f"spec.evaluations[{i}].name", f"evaluation {e.name!r} would be LeakageEval "
                                                            f"{children[i]!r}, like another evaluation"))
        for j, m in enumerate(e.spec.models):
            field = f"spec.evaluations[{i}].spec.models[{j}]"
            if m.training_ref is not None and m.training_ref.name != pt.metadata.name:
                problems.append((f"{field}.trainingRef.name",
                                 f"an evaluation of PitTraining {pt.metadata.name!r} can only refer to it "
                                 f"(got {m.training_ref.name!r})"))
            if m.uri is not None:
                _uri(cfg, m.uri, f"{field}.uri", problems)
        if e.spec.output is not None:
            _output_uri(cfg, e.spec.output.uri, f"spec.evaluations[{i}].spec.output.uri", problems)
    return problems


def check_eval(le: LeakageEval, cfg: OperatorConfig) -> list[tuple[str, str]]:
    """Problems of a LeakageEval that its schema cannot see (empty list: fine)."""
    problems: list[tuple[str, str]] = []
    _uri(cfg, le.spec.dataset.uri, "spec.dataset.uri", problems)
    if le.spec.output is not None:
        _output_uri(cfg, le.spec.output.uri, "spec.output.uri", problems)
    for j, m in enumerate(le.spec.models):
        if m.uri is not None:
            _uri(cfg, m.uri, f"spec.models[{j}].uri", problems)
    return problems


def message(problems: list[tuple[str, str]]) -> str:
    """Problems as one message: ``field: problem; field: problem``."""
    return "; ".join(f"{p}: {m}" if p else m for p, m in problems)
