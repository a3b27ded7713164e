"""A dry run of the operator (``pitlab render``): the Kubernetes objects it creates for a resource, in the order it
creates them, each with a comment naming the stage that creates it and when (docs/kubernetes.md, "Review before
applying: pitlab render").

Pure: parsed resources and the operator's settings in, (comment, object) pairs and their YAML text out; no cluster
and no files. Every object comes from the builders the operator calls (:mod:`pitlab.operator.builders`, the
chosen backend's ``build``), from the resource as the operator reads it (:func:`resource_body`, parsed by
:func:`pitlab.operator.validation.parse`), so what is reviewed is what a cluster gets. What only a cluster knows is
assumed and said: the owner's uid (:data:`PLACEHOLDER_UID`), and what ``auto`` finds served (the first of
:data:`pitlab.operator.backends.AUTO_ORDER`).
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any, Mapping

import yaml

from pitlab.api import LeakageEval, PitTraining, SpecError, dump_resource, stages
from pitlab.operator import backends, builders, validation
from pitlab.operator.backends import Backend
from pitlab.operator.config import OperatorConfig

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
WIDTH = 116  # comment lines are wrapped to this width


@dataclasses.dataclass(frozen=True)
class Document:
    """One object to create and the comment printed before it (which stage creates it, and when)."""

    comment: str
    obj: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Rendering:
    """What ``pitlab render`` prints: header comment paragraphs, then the documents in creation order."""

    header: list[str]
    documents: list[Document]


def resource_body(res: PitTraining | LeakageEval, namespace: str) -> dict[str, Any]:
    """``res`` as the API server hands it to the operator: every default filled in, in ``namespace``, with
    :data:`PLACEHOLDER_UID` for the uid the API server would give it."""
    doc = dump_resource(res)
    doc["metadata"] = {**doc["metadata"], "namespace": namespace, "uid": PLACEHOLDER_UID}
    return doc


def _as_created(obj: dict[str, Any]) -> dict[str, Any]:
    """A child resource the operator creates (a LeakageEval) as the operator then reads it: with a uid."""
    return {**obj, "metadata": {**obj["metadata"], "uid": PLACEHOLDER_UID}}


def assume_backend(spec_backend: str | None, default: str, default_source: str,
                   runtime: str) -> tuple[Backend, str]:
    """The training backend the operator would choose (:func:`pitlab.operator.backends.choose`) on a cluster that
    serves every kind, and a sentence saying so: a named backend is itself; ``auto``, with no cluster to ask, is
    the first of :data:`~pitlab.operator.backends.AUTO_ORDER`. ``default``: the backend when ``spec_backend`` is
    None, named by ``default_source``; ``runtime``: the ClusterTrainingRuntime a TrainJob names."""
    choice = backends.choose(spec_backend, default, lambda _resource: True, lambda: True)
    backend = choice.backend
    assert backend is not None  # every kind is served here
    requested, source = (spec_backend, backends.SPEC_SOURCE) if spec_backend else (default, default_source)
    order = ", ".join(b.kind for b in backends.AUTO_ORDER)
    if requested == "auto":
        said = (f"Training backend: {source} is auto, and render has no cluster to ask which kinds it serves: it "
                f"assumed {backend.kind} ({backend.crd}), the first that auto takes ({order}). On a cluster auto "
                f"takes the first one served; name one (--backend or spec.resources.backend) to render another.")
    else:
        said = f"Training backend: {backend.kind} ({source}: {requested})."
    if backend is backends.TRAINJOB:
        said += (f" The TrainJob names the ClusterTrainingRuntime {runtime} (PITLAB_TRAINING_RUNTIME; the chart's is "
                 "pitlab-torch.<release namespace>), which must exist.")
    return backend, said


def _problems(problems: list[tuple[str, str]], prefix: str = "") -> None:
    """Raise the operator's validation ``problems`` (its Validated=False: it would create nothing) as a
    :class:`SpecError`, the fields under ``prefix``."""
    if problems:
        raise SpecError([(prefix + field if field else prefix.rstrip("."), message) for field, message in problems])


def _eval_documents(le: LeakageEval, owner: dict[str, Any], cfg: OperatorConfig, uris: dict[str, str],
                    who: str, accepted: str) -> list[Document]:
    """The LeakageEval's own children (ConfigMap, embedding Jobs, analyze Job), as its reconciliation builds them
    for a new resource; ``who`` prefixes each comment, ``accepted`` says when its ConfigMap is created."""
    docs = [Document(f"{who}stage {stages.VALIDATE.condition}: {accepted}: the resolved spec its pods read "
                     "(trainingRef models given as their paths)",
                     builders.build_eval_configmap(le, uris, owner))]
    # indexed=None: the operator's own choice for a LeakageEval with no embedding Job yet (pitlab.pipeline.embed
    # records none), i.e. the builders' indexed_embed_threshold
    jobs = builders.build_embed_jobs(le, cfg, owner, None)
    n = len(le.spec.models)
    for k, job in enumerate(jobs):
        if job["spec"].get("completionMode") == "Indexed":
            what = (f"one indexed Job for the {n} models (completion index = model: more than "
                    f"PITLAB_INDEXED_EMBED_THRESHOLD={cfg.indexed_embed_threshold})")
        else:  # one Job per model, in the order of spec.models
            what = (f"model {le.spec.models[k].name} ({k + 1} of {n}; one Job per model up to "
                    f"PITLAB_INDEXED_EMBED_THRESHOLD={cfg.indexed_embed_threshold} models)")
        docs.append(Document(f"{who}stage {stages.EMBED.condition}: created right after its ConfigMap: {what}", job))
    docs.append(Document(f"{who}stage {stages.ANALYZE.condition}: created when {stages.EMBED.condition} is True "
                         "(every embedding Job succeeded)", builders.build_analyze_job(le, cfg, owner)))
    return docs


def render_training(body: dict[str, Any], cfg: OperatorConfig, backend: Backend) -> list[Document]:
    """Every object the operator creates for the PitTraining ``body`` (:func:`resource_body`) with ``backend``: its
    spec ConfigMap, prepare Job, training child and merge Job, then for each ``spec.evaluations[]`` entry the
    child LeakageEval and, as the operator builds them once the child's models exist, the child's ConfigMap,
    embedding Jobs and analyze Job. Raises :class:`SpecError` where the operator would refuse the spec."""
    pt = validation.parse(body, "PitTraining")
    _problems(validation.check_training(pt, cfg))
    docs = [
        Document(f"stage {stages.VALIDATE.condition}: created when the PitTraining is accepted (its spec valid, its "
                 "training backend chosen): the resolved spec its pods read",
                 builders.build_training_configmap(pt, body)),
        Document(f"stage {stages.PREPARE.condition}: created when the PitTraining is accepted, right after its spec "
                 "ConfigMap", builders.build_prepare_job(pt, cfg, body)),
        Document(f"stage {stages.TRAIN.condition}: created when {stages.PREPARE.condition} is True (the prepare Job "
                 f"succeeded); backend {backend.name}", backend.build(pt, cfg, body)),
        Document(f"stage {stages.MERGE.condition}: created when {stages.TRAIN.condition} is True (the {backend.kind} "
                 "succeeded)", builders.build_merge_job(pt, cfg, body)),
    ]
    for i, tpl in enumerate(pt.spec.evaluations):
        child = builders.build_evaluation(pt, tpl, body)
        name = child["metadata"]["name"]
        docs.append(Document(f"stage {stages.EVALUATE.condition}: created when {stages.MERGE.condition} is True (the "
                             f"merge Job succeeded): spec.evaluations[{i}] {tpl.name}", child))
        owner = _as_created(child)
        le = validation.parse(owner, "LeakageEval")
        _problems(validation.check_eval(le, cfg), f"spec.evaluations[{i}].")
        uris = {m.name: builders.training_ref_uri(pt, m.training_ref, cfg) for m in le.spec.models if m.training_ref}
        docs += _eval_documents(le, owner, cfg, uris, f"LeakageEval {name}, ",
                                "created when the operator accepts the LeakageEval above")
    return docs


def render_eval(body: dict[str, Any], cfg: OperatorConfig, trainings: Mapping[str, PitTraining]) -> list[Document]:
    """Every object the operator creates for the LeakageEval ``body`` (:func:`resource_body`): its ConfigMap,
    embedding Jobs and analyze Job. ``trainings``: the PitTrainings its ``trainingRef`` models name, by name
    (a cluster would give them); the model paths are computed as the operator does
    (:func:`pitlab.operator.builders.training_ref_uri`). Raises :class:`SpecError` naming the model when its
    PitTraining is not given, or where the operator would refuse the spec."""
    le = validation.parse(body, "LeakageEval")
    _problems(validation.check_eval(le, cfg))
    uris: dict[str, str] = {}
    waits: list[str] = []
    for j, m in enumerate(le.spec.models):
        ref = m.training_ref
        if ref is None:
            continue
        pt = trainings.get(ref.name)
        field = f"spec.models[{j}].trainingRef"
        if pt is None:
            given = f" (the --training files given name {', '.join(sorted(trainings))})" if trainings else ""
            raise SpecError([(field, f"model {m.name} is the {ref.artifact} of PitTraining {ref.name}, which render "
                                     f"cannot read from a cluster: give its YAML with --training FILE{given}")])
        namespace = body["metadata"].get("namespace")
        if pt.metadata.namespace and namespace and pt.metadata.namespace != namespace:
            raise SpecError([(field, f"model {m.name}: the --training PitTraining {ref.name} is in namespace "
                                     f"{pt.metadata.namespace}, but the operator looks for it in the LeakageEval's "
                                     f"namespace {namespace} (each namespace has its own volume)")])
        uris[m.name] = builders.training_ref_uri(pt, ref, cfg)
        waits.append(f"PitTraining {ref.name} {'Merged' if ref.artifact == 'model' else 'Prepared'}")
    accepted = "created when the LeakageEval is accepted" + (
        f" and its trainingRef models exist ({', '.join(dict.fromkeys(waits))})" if waits else "")
    return _eval_documents(le, body, cfg, uris, "", accepted)


def render(res: PitTraining | LeakageEval, namespace: str, cfg: OperatorConfig, backend: str | None = None,
           trainings: Mapping[str, PitTraining] | None = None) -> Rendering:
    """The :class:`Rendering` of ``res`` in ``namespace``: :func:`render_training` or :func:`render_eval`, with the
    header saying what was assumed. ``backend``: the training backend when ``spec.resources.backend`` is unset
    (``--backend``), else ``cfg.training_backend``."""
    body = resource_body(res, namespace)
    header = [f"pitlab render: the objects the pitlab operator creates for {res.kind} {res.metadata.name} in "
              f"namespace {namespace}, in the order it creates them. A dry run: nothing was read from or sent to a "
              "cluster.",
              f"Operator settings: the PITLAB_* environment variables the chart sets on the operator's pod (unset: "
              f"the operator's defaults): trainer image {cfg.trainer_image}, evaluator image {cfg.evaluator_image}, "
              f"PersistentVolumeClaim {cfg.pvc} at {cfg.mount_path}, data root {cfg.data_root}.",
              f"ownerReferences[].uid is a placeholder ({PLACEHOLDER_UID}): on a cluster the operator sets the uid "
              "of the owner object the API server created. Review or dry-run this output; do not apply it as it "
              "is (the garbage collector deletes objects whose owner does not exist)."]
    if isinstance(res, PitTraining):
        source = "--backend" if backend else "the operator's default (PITLAB_TRAINING_BACKEND, chart value " \
                                             "trainingBackend)"
        chosen, said = assume_backend(res.spec.resources.backend, backend or cfg.training_backend, source,
                                      cfg.training_runtime)
        header.append(said)
        warning = backends.kueue_warning(chosen, res.spec.resources.queue_name)
        if warning:
            header.append(f"Warning: {warning}.")
        documents = render_training(body, cfg, chosen)
    else:
        documents = render_eval(body, cfg, trainings or {})
    return Rendering(header, documents)


class _Dumper(yaml.SafeDumper):
    """The safe dumper, writing a string of several lines (a ConfigMap's spec) as a literal block."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def _comment(text: str) -> str:
    return "\n".join("# " + line for line in textwrap.wrap(text, WIDTH - 2, break_on_hyphens=False)) + "\n"


def dump(rendering: Rendering) -> str:
    """The rendering as multi-document YAML: the header comments, then each object after ``---`` and its
    comment (``yaml.safe_load_all`` reads back exactly the objects)."""
    out = [_comment(p) for p in rendering.header]
    for doc in rendering.documents:
        out.append("---\n" + _comment(doc.comment)
                   + yaml.dump(doc.obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                               width=1 << 16))  # a long command line stays on one line
    return "".join(out)
