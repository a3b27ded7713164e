"""Child names: deterministic, valid for their kind, distinct, short enough for the pods they lead to, from any
name the API server accepts for a PitTraining or LeakageEval (a DNS-1123 subdomain of 1–253 characters)."""

import random
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pitlab.api.names import is_label, is_subdomain
from pitlab.operator import naming

DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Label values (Kubernetes: at most 63, alphanumerics, '-', '_', '.', starting and ending alphanumeric)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
MAX_MODELS = 64  # spec.models' maxItems: the indexed embedding Job's largest index is 63
MAX_WORKER_INDEX = 9998  # nodes = 10,000: Master ×1 + Worker ×9,999 (indices 0..9998)


def _label(name: str) -> bool:
    return bool(DNS1123.match(name)) and len(name) <= 63


def _label1035(name: str) -> bool:
    return bool(DNS1035.match(name)) and len(name) <= 63


_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
_part = st.tuples(st.sampled_from(_ALNUM), st.text(_ALNUM + "-", max_size=61), st.sampled_from(_ALNUM)).map(
    "".join)
_long_part = st.tuples(st.sampled_from(_ALNUM), st.text(_ALNUM + "-", min_size=40, max_size=61),
                       st.sampled_from(_ALNUM)).map("".join)


@st.composite
def subdomains(draw) -> str:
    """Any DNS-1123 subdomain of 1-253 characters: dot-separated labels, leading digits, '-' runs."""
    name = ".".join(draw(st.lists(st.one_of(_part, _long_part), min_size=1, max_size=8)))
    return name[:draw(st.integers(1, 253))].rstrip(".-")


def all_children(parent: str, models: list[str], n_models: int, workers: int) -> dict[str, tuple[str, bool]]:
    """Every name derived from ``parent``: name → (the name, whether it must be DNS-1035)."""
    job = naming.pytorchjob(parent)
    indexed = naming.embed_indexed_job(parent, n_models)
    out = {
        "training ConfigMap": (naming.training_spec_configmap(parent), False),
        "prepare Job": (naming.prepare_job(parent), False),
        "PyTorchJob": (job, True),
        "master pod and Service": (naming.master_pod(parent), True),
        "last worker pod and Service": (naming.worker_pod(parent, workers - 1), True),
        "merge Job": (naming.merge_job(parent), False),
        "evaluation child": (naming.evaluation(parent, "leakage-2016"), False),
        "eval ConfigMap": (naming.eval_spec_configmap(parent), False),
        "indexed embed Job": (indexed, False),
        "last indexed embed pod hostname": (f"{indexed}-{n_models - 1}", False),
        "analyze Job": (naming.analyze_job(parent), False),
    }
    for m in models:
        out[f"embed Job {m}"] = (naming.embed_job(parent, m), False)
    return out


def test_plain_names() -> None:
    assert naming.training_spec_configmap("fomc") == "fomc-pit-spec"
    assert naming.eval_spec_configmap("fomc") == "fomc-eval-spec"
    assert naming.prepare_job("fomc") == "fomc-prepare"
    assert naming.pytorchjob("fomc") == "fomc-train"
    assert naming.master_pod("fomc") == "fomc-train-master-0"
    assert naming.worker_pod("fomc", 3) == "fomc-train-worker-3"
    assert naming.merge_job("fomc") == "fomc-merge"
    assert naming.embed_job("jpx", "base") == "jpx-embed-base"
    assert naming.embed_indexed_job("jpx", 12) == "jpx-embed"
    assert naming.analyze_job("jpx") == "jpx-analyze"


def test_long_and_odd_names_are_shortened_with_a_hash() -> None:
    parent = "a" * 63
    name = naming.pytorchjob(parent)
    assert len(name) == naming.PYTORCHJOB_NAME_MAX and name == "a" * 36 + f"-{naming.short_hash(parent)}-train"
    assert naming.pytorchjob("2020-run") == f"p2020-run-{naming.short_hash('2020-run')}-train"  # DNS-1035
    assert naming.prepare_job("2020-run") == "2020-run-prepare"  # a Job name may start with a digit
    assert naming.embed_job("jpx", "Qwen_3.5") == f"jpx-embed-qwen-3-5-{naming.short_hash('Qwen_3.5')}"
    assert naming.embed_job("jpx", "qwen-3-5") == "jpx-embed-qwen-3-5"  # no collision with the rewritten one
    assert len(naming.short_hash("x")) == 8


def test_dotted_names_from_the_issue() -> None:
    """``qwen3.5-pit`` is valid for ``kubectl apply``; its children replace the dot and add a hash."""
    h = naming.short_hash("qwen3.5-pit")
    assert naming.training_spec_configmap("qwen3.5-pit") == f"qwen3-5-pit-{h}-pit-spec"
    assert naming.pytorchjob("qwen3.5-pit") == f"qwen3-5-pit-{h}-train"
    assert naming.master_pod("qwen3.5-pit") == f"qwen3-5-pit-{h}-train-master-0"
    assert naming.merge_job("qwen3.5-pit") == f"qwen3-5-pit-{h}-merge"
    assert naming.pytorchjob("qwen3-5-pit") == "qwen3-5-pit-train"  # the undotted name stays distinct
    assert naming.evaluation("qwen3.5-pit", "leakage") == (
        f"qwen3-5-pit-leakage-{naming.short_hash('qwen3.5-pit/leakage')}")
    # digits first and dotted: the PyTorchJob gets a letter in front, the Jobs keep the digit
    assert naming.pytorchjob("2016.fomc") == f"p2016-fomc-{naming.short_hash('2016.fomc')}-train"
    assert naming.prepare_job("2016.fomc") == f"2016-fomc-{naming.short_hash('2016.fomc')}-prepare"
    # labels keep the resource's own name where it is a valid label value
    assert naming.labels("PitTraining", "qwen3.5-pit", "training")["app.kubernetes.io/instance"] == "qwen3.5-pit"


def test_indexed_job_leaves_room_for_its_largest_index() -> None:
    """Found by a new user: a 57-character LeakageEval with 9 models got a 63-character indexed Job whose
    pod hostname ``<job>-8`` had 65 characters, which the API server refuses (from 56 characters on, some
    model count gives a hostname over 63)."""
    parent = "e" * 57
    job9 = naming.embed_indexed_job(parent, 9)
    assert job9 == "e" * 46 + f"-{naming.short_hash(parent)}-embed" and len(f"{job9}-8") == 63
    job64 = naming.embed_indexed_job(parent, 64)
    assert len(f"{job64}-63") == 63
    assert naming.embed_indexed_job("e" * 55, 10) == "e" * 55 + "-embed"  # 61 + len("-9") = 63: unchanged
    assert naming.embed_indexed_job("e" * 55, 11) != "e" * 55 + "-embed"  # <job>-10 would have 64


def test_labels() -> None:
    assert naming.labels("PitTraining", "fomc", "training", **{"x/y": "z"}) == {
        "app.kubernetes.io/name": "pitlab", "app.kubernetes.io/instance": "fomc",
        "app.kubernetes.io/component": "training", "app.kubernetes.io/part-of": "pitlab",
        "app.kubernetes.io/managed-by": "pitlab-operator", "pitlab.io/owner-kind": "pittraining", "x/y": "z"}


@settings(max_examples=400, deadline=None)
@given(subdomains(), st.lists(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", fullmatch=True), max_size=3),
       st.integers(1, MAX_MODELS), st.integers(1, MAX_WORKER_INDEX + 1))
@example("qwen3.5-pit", ["Qwen_3.5"], 9, 1)
@example("e" * 56, ["m"], 9, 1)  # the issue's indexed Job
@example("1" * 253, ["9"], MAX_MODELS, MAX_WORKER_INDEX + 1)
@example("a." * 126 + "b", ["a" * 63], MAX_MODELS, MAX_WORKER_INDEX + 1)
@example("0", ["0"], 1, 1)
def test_every_derived_name_is_valid_for_its_kind(parent: str, models: list[str], n_models: int,
                                                   workers: int) -> None:
    assert is_subdomain(parent) and 1 <= len(parent) <= 253  # the strategy gives what the API server accepts
    for what, (name, dns1035) in all_children(parent, models, n_models, workers).items():
        assert (_label1035(name) if dns1035 else _label(name)), (what, name)
        assert is_label(name, dns1035), (what, name)
    assert LABEL_VALUE.match(naming.labels("LeakageEval", parent, "embed")["app.kubernetes.io/instance"])
    for m in models:
        assert LABEL_VALUE.match(naming.dns_label(m))
    # the evaluation child is itself a valid parent: its own children are valid too
    child = naming.evaluation(parent, "leakage-2016")
    assert is_subdomain(child)
    assert all(is_label(n, d) for n, d in all_children(child, models, n_models, workers).values())
    # deterministic: the same parent gives the same names
    assert all_children(parent, models, n_models, workers) == all_children(parent, models, n_models, workers)


def _random_parents(seed: int, n: int) -> list[str]:
    """Valid resource names that stress the hash: long shared prefixes (the part a cut keeps), dots where
    another name has a '-', leading digits, lengths up to 253."""
    rnd = random.Random(seed)
    prefixes = ["x" * 60, "2016-fomc-" * 6, "qwen3.5-" * 8, "a.b-" * 20, "9" * 100]
    out = set()
    while len(out) < n:
        tail = "".join(rnd.choice(_ALNUM + "-.") for _ in range(rnd.randint(1, 200)))
        name = (rnd.choice(prefixes) + tail)[:rnd.randint(64, 253)]
        name = re.sub(r"[.-]{2,}", "-", name).strip(".-")
        if is_subdomain(name):
            out.add(name)
    out |= {n.replace(".", "-") for n in out if is_subdomain(n.replace(".", "-"))}  # dotted vs hyphenated twins
    return sorted(out)


def test_distinct_parents_get_distinct_children() -> None:
    """3,000+ names of 61-253 characters sharing 60-100 character prefixes: every kind of child is distinct across them (the
    8-hex-digit hash; 5 digits collided here)."""
    parents = _random_parents(0, 3000)
    assert len(parents) > 3000
    for fn in (naming.training_spec_configmap, naming.prepare_job, naming.pytorchjob, naming.merge_job,
               naming.eval_spec_configmap, naming.analyze_job, lambda p: naming.embed_indexed_job(p, 64),
               lambda p: naming.embed_job(p, "Qwen_3.5"), lambda p: naming.evaluation(p, "leakage")):
        names = [fn(p) for p in parents]
        assert len(set(names)) == len(parents)


def test_evaluation_children_are_named_after_parent_and_evaluation() -> None:
    assert naming.evaluation("fomc-2016", "leakage") == "fomc-2016-leakage"
    assert naming.evaluation("fomc-2017", "leakage") == "fomc-2017-leakage"  # same evaluation, other parent
    assert naming.evaluation("fomc-2016", "fomc-2016-leakage") == "fomc-2016-leakage"  # already prefixed
    parent, ev = "p" * 40, "e" * 40
    name = naming.evaluation(parent, ev)
    assert name == "p" * 40 + "-" + "e" * 13 + "-" + naming.short_hash(f"{parent}/{ev}") and len(name) == 63
    assert naming.evaluation("q" + "p" * 39, ev) != name


def test_a_suffix_without_room_is_an_error() -> None:
    with pytest.raises(ValueError, match="no room"):
        naming.derive("a" * 100, "s" * 60)
