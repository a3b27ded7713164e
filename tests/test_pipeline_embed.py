"""The embed stage module on its own (pitlab/pipeline/embed.py): its report in JSON, the Embedded message, how the
embedding Jobs' layout is decided once per resource, and the embedding Jobs' side."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from stage_ctx import World, ctx, example

from pitlab.api import ResourceStatus, stages
from pitlab.api.status import get_condition
from pitlab.operator import builders
from pitlab.pipeline import embed
from pitlab.pipeline.embed import EmbedReport

LE = "jpx-leakage-2021"  # examples/leakageeval.yaml: models qwen35-base, qwen35-pit-2020, minilm


def test_the_report_is_camel_case_json_and_ignores_unknown_keys() -> None:
    report = EmbedReport(models=["base", "pit"])
    assert json.loads(report.to_json()) == {"models": ["base", "pit"]}
    assert EmbedReport.model_validate({"models": ["base", "pit"], "cacheHits": 1}) == report
    with pytest.raises(ValidationError, match="models"):
        EmbedReport.model_validate({})


def test_to_status_counts_the_models_and_records_nothing_else() -> None:
    status = ResourceStatus(report_uri="/r.md")
    assert embed.to_status(EmbedReport(models=["base", "pit", "minilm"]), status) == "3 model(s) embedded"
    assert status == ResourceStatus(report_uri="/r.md")
    assert embed.to_status(EmbedReport(models=[]), status) == "0 model(s) embedded"


def test_the_embedding_layout_is_what_the_resource_chose_first() -> None:
    le = example("leakageeval.yaml")
    world = World()
    assert embed._embed_indexed(ResourceStatus(), le, world, "ns") is None  # not decided: the threshold decides
    for children, indexed in (({"embedJob.all": f"{LE}-embed-3"}, True), ({"embedJob.minilm": "x"}, False)):
        status = ResourceStatus(children={"analyzeJob": "a", **children})
        assert embed._embed_indexed(status, le, world, "ns") is indexed
    # restarted before the status was written: the Jobs that exist say it
    one, = builders.build_embed_jobs(le, ctx(le).cfg, ctx(le).body, indexed=True)
    world.add(one)
    assert embed._embed_indexed(ResourceStatus(), le, world, "ns") is True
    world = World()
    world.add(builders.build_embed_jobs(le, ctx(le).cfg, ctx(le).body, indexed=False)[2])
    assert embed._embed_indexed(ResourceStatus(), le, world, "ns") is False


def test_reconcile_creates_one_job_per_model_and_is_done_when_all_completed() -> None:
    le = example("leakageeval.yaml")
    world = World()
    c = ctx(le, world)
    assert embed.reconcile(c, stages.EMBED, le) is False
    names = [f"{LE}-embed-qwen35-base", f"{LE}-embed-qwen35-pit-2020", f"{LE}-embed-minilm"]
    assert [m["metadata"]["name"] for m in c.plan.creates] == names
    assert c.status.children == dict(zip(["embedJob.qwen35-base", "embedJob.qwen35-pit-2020", "embedJob.minilm"],
                                         names))
    cond = get_condition(c.status, "Embedded")
    assert (cond.status, cond.reason, cond.message) == ("False", "Embedding", "Created")

    jobs = c.plan.creates
    for job in jobs[:2]:
        world.finish_job(job)
    world.add(jobs[2], {"active": 1})
    c = ctx(le, world, c.status)
    assert embed.reconcile(c, stages.EMBED, le) is False and c.plan.creates == []
    assert get_condition(c.status, "Embedded").message == "2/3 Jobs complete"

    world.finish_job(jobs[2])
    c = ctx(le, world, c.status)
    assert embed.reconcile(c, stages.EMBED, le) is True
    cond = get_condition(c.status, "Embedded")
    assert (cond.status, cond.reason, cond.message) == ("True", "EmbeddingsWritten", "3 model(s) embedded")
    c = ctx(le, World(), c.status)
    assert embed.reconcile(c, stages.EMBED, le) is True and c.plan.creates == []


def test_a_failed_embedding_job_fails_the_stage_with_its_reason() -> None:
    le = example("leakageeval.yaml")
    world = World()
    c = ctx(le, world)
    embed.reconcile(c, stages.EMBED, le)
    for job in c.plan.creates:
        world.finish_job(job)
    world.add(c.plan.creates[1], {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                                  "message": "Job has reached the specified backoff limit"}]})
    c = ctx(le, world, c.status)
    assert embed.reconcile(c, stages.EMBED, le) is False
    cond = get_condition(c.status, "Embedded")
    assert (cond.status, cond.reason, cond.message, c.status.phase) == (
        "False", "BackoffLimitExceeded",
        f"Job {LE}-embed-qwen35-pit-2020: Job has reached the specified backoff limit", "Failed")
