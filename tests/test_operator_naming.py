"""Child names: deterministic, valid DNS labels, distinct, short enough for the pods they lead to."""

import re

from hypothesis import given
from hypothesis import strategies as st

from pitlab.operator import naming

DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_plain_names() -> None:
    assert naming.training_spec_configmap("fomc") == "fomc-pit-spec"
    assert naming.eval_spec_configmap("fomc") == "fomc-eval-spec"
    assert naming.prepare_job("fomc") == "fomc-prepare"
    assert naming.pytorchjob("fomc") == "fomc-train"
    assert naming.master_pod("fomc") == "fomc-train-master-0"
    assert naming.merge_job("fomc") == "fomc-merge"
    assert naming.embed_job("jpx", "base") == "jpx-embed-base"
    assert naming.embed_indexed_job("jpx") == "jpx-embed"
    assert naming.analyze_job("jpx") == "jpx-analyze"


def test_long_and_odd_names_are_shortened_with_a_hash() -> None:
    parent = "a" * 63
    name = naming.pytorchjob(parent)
    assert len(name) <= naming.PYTORCHJOB_NAME_MAX and name.endswith(f"-{naming.short_hash(parent)}-train")
    assert naming.pytorchjob("2020-run") == f"p2020-run-{naming.short_hash('2020-run')}-train"  # DNS-1035
    assert naming.embed_job("jpx", "Qwen_3.5") == f"jpx-embed-qwen-3-5-{naming.short_hash('Qwen_3.5')}"
    assert naming.embed_job("jpx", "qwen-3-5") == "jpx-embed-qwen-3-5"  # no collision with the rewritten one


def test_labels() -> None:
    assert naming.labels("PitTraining", "fomc", "training", **{"x/y": "z"}) == {
        "app.kubernetes.io/name": "pitlab", "app.kubernetes.io/instance": "fomc",
        "app.kubernetes.io/component": "training", "app.kubernetes.io/part-of": "pitlab",
        "app.kubernetes.io/managed-by": "pitlab-operator", "pitlab.io/owner-kind": "pittraining", "x/y": "z"}


@given(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True),
       st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", fullmatch=True))
def test_every_child_name_is_a_valid_label(parent: str, model: str) -> None:
    for name in (naming.prepare_job(parent), naming.merge_job(parent), naming.training_spec_configmap(parent),
                 naming.embed_job(parent, model), naming.analyze_job(parent)):
        assert DNS1123.match(name) and len(name) <= 63, name
    job = naming.pytorchjob(parent)
    assert re.match(r"^[a-z]", job) and len(f"{job}-worker-999") <= 63


def test_evaluation_children_are_named_after_parent_and_evaluation() -> None:
    assert naming.evaluation("fomc-2016", "leakage") == "fomc-2016-leakage"
    assert naming.evaluation("fomc-2017", "leakage") == "fomc-2017-leakage"  # same evaluation, other parent
    assert naming.evaluation("fomc-2016", "fomc-2016-leakage") == "fomc-2016-leakage"  # already prefixed
    parent, ev = "p" * 40, "e" * 40
    name = naming.evaluation(parent, ev)
    assert name == "p" * 40 + "-" + "e" * 16 + "-" + naming.short_hash(f"{parent}/{ev}") and len(name) == 63
    assert naming.evaluation("q" + "p" * 39, ev) != name
