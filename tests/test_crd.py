"""The CRDs: generated from pitlab.api and in sync, structurally what kubectl and the API server need, and
their CEL rules mirrored by the pydantic validators (same documents refused by both)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from test_builders_schemas import REPO, cel_errors, crd_schema, pitlab_crd, validate, validate_pitlab

from pitlab.api import SpecError, crd, parse_resource

EXAMPLES = ["examples/pittraining.yaml", "examples/pittraining-trainjob.yaml", "examples/leakageeval.yaml",
            "examples/local-sp500-fomc.yaml",
            "examples/local-lora-streaming.yaml"]


def load(path: str) -> dict:
    return yaml.safe_load((REPO / path).read_text())


def test_crds_are_in_sync_with_the_models() -> None:
    """Fails when pitlab/api changed and `make crds` was not run."""
    assert crd.drift(REPO / "crds") == [], "run `make crds`"
    assert crd.drift(REPO / "charts" / "pitlab" / "crds") == [], "run `make crds`"


def test_drift_is_detected(tmp_path: Path) -> None:
    crd.write(tmp_path)
    (tmp_path / "pitlab.io_leakageevals.yaml").write_text("stale\n")
    assert crd.drift(tmp_path) == ["pitlab.io_leakageevals.yaml"]
    assert crd.main(["--check", str(tmp_path)]) == 1


@pytest.mark.parametrize("kind", ["PitTraining", "LeakageEval"])
def test_crd_is_a_valid_apiextensions_object(kind: str) -> None:
    doc = yaml.safe_load(pitlab_crd(kind).read_text())
    assert validate(doc) == []
    v = doc["spec"]["versions"][0]
    assert (v["name"], v["served"], v["storage"], v["subresources"]) == ("v1alpha1", True, True, {"status": {}})
    assert doc["spec"]["names"]["categories"] == ["pitlab"]


def test_names_and_printer_columns() -> None:
    pit = yaml.safe_load(pitlab_crd("PitTraining").read_text())["spec"]
    le = yaml.safe_load(pitlab_crd("LeakageEval").read_text())["spec"]
    assert pit["names"]["shortNames"] == ["pit", "pits"] and le["names"]["shortNames"] == ["leak", "le"]
    cols = lambda s: [(c["name"], c["jsonPath"]) for c in s["versions"][0]["additionalPrinterColumns"]]  # noqa: E731
    assert cols(pit) == [("Phase", ".status.phase"), ("Cutoff", ".spec.knowledgeCutoff"),
                         ("Step", ".status.progress.step"), ("Done%", ".status.progress.percent"),
                         ("ETA", ".status.progress.eta"), ("Loss", ".status.progress.loss"),
                         ("Age", ".metadata.creationTimestamp")]
    assert cols(le) == [("Phase", ".status.phase"), ("Premium", ".status.premiumSummary"),
                        ("Age", ".metadata.creationTimestamp")]


@pytest.mark.parametrize("kind", ["PitTraining", "LeakageEval"])
def test_printer_columns_name_schema_fields_of_their_type(kind: str) -> None:
    """Every column's jsonPath is a field of the schema with the column's type (metadata aside), so a renamed
    status field cannot leave an empty column behind."""
    doc = yaml.safe_load(pitlab_crd(kind).read_text())
    version = doc["spec"]["versions"][0]
    for col in version["additionalPrinterColumns"]:
        parts = col["jsonPath"].lstrip(".").split(".")
        if parts[0] == "metadata":
            continue
        node = version["schema"]["openAPIV3Schema"]
        for part in parts:
            node = node["properties"][part]
        assert node["type"] == col["type"] or (node.get("format") == "date" and col.get("format") == "date"), col


def test_schema_types_enums_required_defaults_formats() -> None:
    spec = crd_schema(pitlab_crd("PitTraining"))["properties"]["spec"]
    assert spec["required"] == ["baseModel", "corpus", "knowledgeCutoff", "tokens"]
    p = spec["properties"]
    assert p["knowledgeCutoff"] == {"type": "string", "format": "date", "maxLength": 10}
    assert p["method"] == {"type": "string", "enum": ["full", "lora"], "default": "full"}
    assert p["training"]["default"] == {} and p["training"]["properties"]["seqLen"] == {
        "type": "integer", "default": 2048, "minimum": 8}
    assert p["training"]["properties"]["learningRate"] == {"type": "number", "default": 1e-05, "minimum": 0,
                                                           "exclusiveMinimum": True}
    assert p["baseModel"]["properties"]["randomInit"]["properties"]["config"] == {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True}
    models = crd_schema(pitlab_crd("LeakageEval"))["properties"]["spec"]["properties"]["models"]
    assert models["x-kubernetes-list-type"] == "map" and models["x-kubernetes-list-map-keys"] == ["name"]


def _spec_doc(kind: str) -> dict:
    if kind == "PitTraining":
        return load("examples/pittraining.yaml")
    return load("examples/leakageeval.yaml")


STREAMING_CEL = ("spec: training.layerStreaming: enabled needs method: lora and one process (resources.nodes: 1, "
                 "resources.gpusPerNode: 1)")
# (kind, how to break a valid document, the CRD's message, the pydantic message)
CEL_CASES = [
    ("LeakageEval", lambda d: d["spec"]["protocol"].update(testStart="2020-12-31"),
     "spec.protocol: testStart must be after trainEnd", "must be after trainEnd"),
    ("LeakageEval", lambda d: d["spec"]["models"][0].update(trainingRef={"name": "x"}),
     "spec.models[0]: give exactly one of uri and trainingRef", "give exactly one of uri and trainingRef"),
    ("LeakageEval", lambda d: d["spec"]["models"][0].pop("uri"),
     "spec.models[0]: give exactly one of uri and trainingRef", "give exactly one of uri and trainingRef"),
    ("PitTraining", lambda d: d["spec"]["baseModel"].update(randomInit={"modelType": "llama"}),
     "spec.baseModel: give exactly one of uri and randomInit", "give exactly one of uri and randomInit"),
    ("PitTraining", lambda d: d["spec"].update(lora={"r": 8}),
     "spec: lora: the lora block is only allowed with method: lora", "only allowed with method: lora"),
    ("PitTraining", lambda d: d["spec"]["training"].update(layerStreaming={"enabled": True}),
     STREAMING_CEL,
     "training.layerStreaming: enabled needs method: lora"),
    ("PitTraining", lambda d: (d["spec"].update(method="lora"), d["spec"]["training"].update(
        layerStreaming={"enabled": True})),  # the example's 8 GPUs per node
     STREAMING_CEL,
     r"training.layerStreaming: enabled needs one process \(resources.nodes: 1, resources.gpusPerNode: 1; got 1 and 8"),
    ("PitTraining", lambda d: d["spec"]["evaluations"][0]["spec"]["protocol"].update(trainEnd="2021-06-30"),
     "spec.evaluations[0].spec.protocol: testStart must be after trainEnd", "must be after trainEnd"),
]


@pytest.mark.parametrize("kind, breaks, cel_message, pydantic_message", CEL_CASES)
def test_cel_rules_and_pydantic_validators_agree(kind, breaks, cel_message, pydantic_message) -> None:
    doc = _spec_doc(kind)
    assert validate_pitlab(doc) == [] and parse_resource(copy.deepcopy(doc))
    breaks(doc)
    assert cel_message in validate_pitlab(doc)
    with pytest.raises(SpecError, match=pydantic_message):
        parse_resource(doc)


def test_duplicate_model_names_refused_by_list_map_and_pydantic() -> None:
    doc = _spec_doc("LeakageEval")
    doc["spec"]["models"][1]["name"] = doc["spec"]["models"][0]["name"]
    with pytest.raises(SpecError, match="duplicate model names"):
        parse_resource(doc)
    names = [m["name"] for m in doc["spec"]["models"]]
    assert len(names) != len(set(names))  # the API server refuses duplicate keys of a list-type map


@pytest.mark.parametrize("kind, edit", [
    ("PitTraining", lambda spec: spec.update(tokens=2_000_000_000)),
    ("LeakageEval", lambda spec: spec["bootstrap"].update(resamples=500)),
])
def test_spec_is_immutable_once_the_run_started(kind, edit) -> None:
    schema = crd_schema(pitlab_crd(kind))
    old = _spec_doc(kind)
    old["spec"].setdefault("bootstrap", {"resamples": 200})
    new = copy.deepcopy(old)
    edit(new["spec"])
    assert new["spec"] != old["spec"]
    rule = "spec is immutable once the run has started (status.specDigest is set): create a new resource to change it"
    assert cel_errors(schema, new, old) == []  # not started: edits allowed
    old["status"] = {"phase": "Embedding" if kind == "LeakageEval" else "Training", "specDigest": "ab" * 32}
    new["status"] = old["status"]
    assert cel_errors(schema, new, old) == [f"<root>: {rule}"]
    assert cel_errors(schema, copy.deepcopy(old), old) == []  # status-only updates pass


@pytest.mark.parametrize("path", EXAMPLES)
def test_examples_are_valid_against_the_crds(path: str) -> None:
    doc = load(path)
    assert validate(doc) == []
    parse_resource(doc)


def test_cluster_example_shape() -> None:
    pit = parse_resource(load("examples/pittraining.yaml"))
    assert (pit.spec.resources.nodes, pit.spec.resources.gpus_per_node) == (1, 8)
    assert pit.spec.tokens == 1_000_000_000 and str(pit.spec.knowledge_cutoff) == "2020-12-31"
    assert pit.spec.base_model.uri.endswith("Qwen3.5-35B-A3B-Base")
    le = parse_resource(load("examples/leakageeval.yaml"))
    assert le.spec.dataset.kind == "jpx" and le.spec.bootstrap.resamples == 200


def test_unknown_field_and_wrong_enum_are_refused_by_the_schema() -> None:
    doc = _spec_doc("PitTraining")
    doc["spec"]["training"]["seqLength"] = 4096
    doc["spec"]["corpus"]["format"] = "xml"
    errors = validate_pitlab(doc)
    assert any("seqLength" in e for e in errors) and any("'xml' is not one of" in e for e in errors)


def test_both_kinds_share_the_scheduling_fields() -> None:
    """nodeSelector, tolerations and queueName: one pydantic model (PodScheduling) for both resources blocks,
    so both CRDs have the same schema for them; an evaluation template carries them too."""
    from pitlab.api.leakageeval import EvalResources
    from pitlab.api.pittraining import ResourcesSpec
    from pitlab.api.scheduling import PodScheduling

    assert issubclass(ResourcesSpec, PodScheduling) and issubclass(EvalResources, PodScheduling)
    fields = ("nodeSelector", "tolerations", "queueName")
    pit = crd_schema(pitlab_crd("PitTraining"))["properties"]["spec"]["properties"]
    le = crd_schema(pitlab_crd("LeakageEval"))["properties"]["spec"]["properties"]["resources"]["properties"]
    tpl = pit["evaluations"]["items"]["properties"]["spec"]["properties"]["resources"]["properties"]
    for f in fields:
        assert pit["resources"]["properties"][f] == le[f] == tpl[f], f
    # a Toleration's own fields, so the API server refuses (kubectl --validate=strict) or prunes a misspelt one
    items = le["tolerations"]["items"]
    assert set(items["properties"]) == {"key", "operator", "value", "effect", "tolerationSeconds"}
    assert "x-kubernetes-preserve-unknown-fields" not in items
    assert items["properties"]["effect"]["enum"] == ["NoSchedule", "PreferNoSchedule", "NoExecute", ""]
    assert le["nodeSelector"]["additionalProperties"] == {"type": "string"}
