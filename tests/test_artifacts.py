"""The model card: a PIT model's knowledge cutoff is inherited by its evaluations and a contradicting hand-typed
cutoff is refused (in the PitTraining spec, at preflight, and when an evaluation starts)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import yaml

from pitlab.api import SpecError
from pitlab.api.artifacts import MODEL_CARD, ModelCard, read_model_card, resolve_cutoff
from pitlab.api.load import parse_resource
from pitlab.evaluator.run import model_cutoffs

REPO = Path(__file__).resolve().parents[1]


def _demo_doc() -> dict:
    return yaml.safe_load((REPO / "examples" / "local-sp500-fomc.yaml").read_text())


def test_an_evaluation_of_the_trainings_own_model_inherits_its_cutoff():
    doc = _demo_doc()
    models = doc["spec"]["evaluations"][0]["spec"]["models"]
    assert [m["name"] for m in models] == ["base", "pit-2016", "minilm"]
    assert "knowledgeCutoff" not in models[1]  # the demo leaves it to be inherited
    pt = parse_resource(doc)
    got = [m.knowledge_cutoff for m in pt.spec.evaluations[0].spec.models]
    assert got == [None, dt.date(2016, 12, 31), None]  # the base artifact and an outside model inherit nothing


def test_a_contradicting_cutoff_on_the_trainings_own_model_is_refused():
    doc = _demo_doc()
    doc["spec"]["evaluations"][0]["spec"]["models"][1]["knowledgeCutoff"] = "2017-06-30"
    with pytest.raises(SpecError) as err:
        parse_resource(doc, "demo.yaml")
    assert ("spec.evaluations[0].spec.models[1].knowledgeCutoff: 2017-06-30 differs from spec.knowledgeCutoff "
            "2016-12-31") in str(err.value)


def _model_folder(tmp_path: Path, cutoff: str | None) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    if cutoff is not None:
        card = ModelCard(knowledge_cutoff=cutoff, training="t", method="full")
        (d / MODEL_CARD).write_text(card.model_dump_json(by_alias=True))
    return d


def _eval_spec(uri: str, cutoff: str | None):
    m = {"name": "pit", "uri": uri}
    if cutoff:
        m["knowledgeCutoff"] = cutoff
    return parse_resource({"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval", "metadata": {"name": "e"},
                           "spec": {"models": [m], "dataset": {"kind": "ohlcv", "uri": "x"},
                                    "protocol": {"trainEnd": "2020-01-31", "testStart": "2020-02-03"}}}).spec


@pytest.mark.parametrize("typed,card,expect", [(None, "2019-12-31", dt.date(2019, 12, 31)),
                                               ("2019-12-31", "2019-12-31", dt.date(2019, 12, 31)),
                                               ("2018-06-30", None, dt.date(2018, 6, 30)),
                                               (None, None, None)])
def test_an_evaluation_reads_the_cutoff_from_the_model_card(tmp_path, typed, card, expect):
    d = _model_folder(tmp_path, card)
    spec = _eval_spec(str(d), typed)
    assert model_cutoffs(spec, {"pit": (d, "auto")}) == {"pit": expect}
    if card:
        assert read_model_card(d).knowledge_cutoff == dt.date.fromisoformat(card)
        assert json.loads((d / MODEL_CARD).read_text())["knowledgeCutoff"] == card


def test_a_typed_cutoff_that_contradicts_the_model_card_is_refused_at_preflight_and_at_the_start(tmp_path):
    from pitlab.evaluator.inputs import check_models

    d = _model_folder(tmp_path, "2019-12-31")
    spec = _eval_spec(str(d), "2020-12-31")
    msg = "spec.models[0].knowledgeCutoff: 2020-12-31 differs from the knowledge cutoff 2019-12-31 of the model card"
    with pytest.raises(SpecError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        check_models(spec, "spec", None)
    with pytest.raises(SpecError, match=r"spec.models\[0\].knowledgeCutoff: 2020-12-31 differs"):
        model_cutoffs(spec, {"pit": (d, "auto")})


def test_a_card_that_does_not_parse_is_refused_naming_the_file(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / MODEL_CARD).write_text('{"knowledgeCutoff": "31/12/2019"}')
    with pytest.raises(SpecError, match="pitlab_model.json: not a pitlab model card"):
        read_model_card(d)
    assert resolve_cutoff(None, None, "f", "s") is None
