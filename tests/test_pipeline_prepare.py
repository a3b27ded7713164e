"""The prepare stage module on its own (pitlab/pipeline/prepare.py): its report in JSON, the status and message
it gives locally and on a cluster, the corpus audit as the status records it, and the prepare Job's side."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from stage_ctx import World, ctx, example

from pitlab.api import ResourceStatus, stages
from pitlab.api.status import CorpusAuditStatus, get_condition
from pitlab.data.corpus import CorpusAudit
from pitlab.operator import builders
from pitlab.operator.context import Plan
from pitlab.pipeline import prepare
from pitlab.pipeline.prepare import PrepareReport

AUDIT = CorpusAuditStatus(included=2, excluded_by_date=1, rejected_timestamp=4, rejected_empty_text=3,
                          max_included_timestamp="2020-12-30T17:00:00+00:00", included_ids_sha256="ab12",
                          included_sha256="cd34", timestamp_format="iso8601", warnings=["late cutoff"])
AUDIT_JSON = {"included": 2, "excludedByDate": 1, "rejectedTimestamp": 4, "rejectedEmptyText": 3,
              "maxIncludedTimestamp": "2020-12-30T17:00:00+00:00", "includedIdsSha256": "ab12",
              "includedSha256": "cd34", "timestampFormat": "iso8601", "warnings": ["late cutoff"]}


def test_the_report_is_camel_case_json_and_ignores_unknown_keys() -> None:
    report = PrepareReport(corpus_audit=AUDIT, tokens=1000, knowledge_cutoff="2020-12-31", cluster=True)
    assert json.loads(report.to_json()) == {"corpusAudit": AUDIT_JSON, "tokens": 1000,
                                            "knowledgeCutoff": "2020-12-31", "cluster": True}
    doc = {**json.loads(report.to_json()), "podName": "t-prepare-x", "exitCode": 0}
    assert PrepareReport.model_validate(doc) == report
    assert PrepareReport.model_validate({"corpus_audit": AUDIT_JSON, "tokens": 1000, "knowledge_cutoff": "2020-12-31",
                                         "cluster": True}) == report  # field names are accepted too
    assert PrepareReport.model_validate({}) == PrepareReport(corpus_audit=None, tokens=None, cluster=False)
    with pytest.raises(ValidationError, match="tokens"):
        PrepareReport.model_validate({"tokens": "many"})


def test_local_message_counts_every_kind_of_document_and_the_tokens() -> None:
    status = ResourceStatus()
    message = prepare.to_status(PrepareReport(corpus_audit=AUDIT, tokens=1000), status)
    assert message == ("2 documents kept, 1 after the cutoff, 3 dropped for an empty text, 4 rejected for their "
                       "timestamp; 1000 tokens")
    assert status == ResourceStatus(corpus_audit=AUDIT)  # the audit, nothing else


def test_cluster_message_names_the_knowledge_cutoff() -> None:
    status = ResourceStatus()
    report = PrepareReport(corpus_audit=AUDIT, knowledge_cutoff="2020-12-31", cluster=True)
    assert prepare.to_status(report, status) == "2 documents up to 2020-12-31, 1 after it"
    assert status.corpus_audit == AUDIT and status.corpus_audit.warnings == ["late cutoff"]


def test_without_an_audit_the_status_keeps_what_it_had() -> None:
    earlier = AUDIT.model_copy(update={"included": 7})
    status = ResourceStatus(corpus_audit=earlier)
    assert prepare.to_status(PrepareReport(knowledge_cutoff="2020-12-31", cluster=True), status) == "corpus filtered"
    assert status == ResourceStatus(corpus_audit=earlier)
    status = ResourceStatus()
    assert prepare.to_status(PrepareReport(tokens=1000), status) == "corpus filtered; 1000 tokens"
    assert status == ResourceStatus()


def _corpus_audit(warnings: list[str]) -> CorpusAudit:
    return CorpusAudit(source="c.csv", source_sha256="f0", knowledge_cutoff="2020-12-31", timezone="UTC",
                       cutoff_instant_utc="2021-01-01T00:00:00+00:00", total=10, included=2, excluded_by_date=1,
                       rejected_timestamp=4, rejected_empty_text=3, max_included_timestamp="2020-12-30T17:00:00+00:00",
                       min_included_timestamp="2020-01-02T17:00:00+00:00", included_ids_sha256="ab12", included_sha256="cd34",
                       warnings=warnings, rejected_timestamp_examples=[{"row": 3, "value": "x"}])


def test_the_corpus_filters_audit_becomes_the_status_fields() -> None:
    assert prepare.audit_status(_corpus_audit(["late cutoff"])) == AUDIT
    assert prepare.audit_status(_corpus_audit([])).warnings is None  # no empty list in the status


def test_a_cluster_audit_is_read_and_a_malformed_one_is_ignored_with_a_warning() -> None:
    plan = Plan(status=ResourceStatus())
    assert prepare._corpus_audit(AUDIT_JSON, "t-prepare", plan) == AUDIT
    assert prepare._corpus_audit(None, "t-prepare", plan) is None and prepare._corpus_audit({}, "t", plan) is None
    assert plan.warnings == []
    assert prepare._corpus_audit({"included": "many", "excludedByDate": 3}, "t-prepare", plan) is None
    assert plan.warnings == [("MalformedCorpusAudit", (
        "Job t-prepare: corpus audit ignored: corpusAudit.included: Input should be a valid integer, unable to parse "
        "string as an integer (got 'many'); corpusAudit.rejectedTimestamp: Field required; "
        "corpusAudit.maxIncludedTimestamp: Field required; corpusAudit.includedIdsSha256: Field required"))]
    prepare._corpus_audit({**AUDIT_JSON, "warnings": [1] * 30}, "t-prepare", plan)  # 30 problems: cut at 1000
    reason, said = plan.warnings[-1]
    assert reason == "MalformedCorpusAudit" and len(said) == 1000 and said.startswith(
        "Job t-prepare: corpus audit ignored: corpusAudit.warnings[0]: Input should be a valid string (got 1); ")


def test_reconcile_creates_the_prepare_job_then_records_its_audit() -> None:
    pt = example("pittraining.yaml")
    world = World()
    c = ctx(pt, world)
    assert prepare.reconcile(c, stages.PREPARE, pt) is False
    job = builders.build_prepare_job(pt, c.cfg, c.body)
    assert [m["metadata"]["name"] for m in c.plan.creates] == ["qwen35-a3b-pit-2020-prepare"] == [
        job["metadata"]["name"]]
    cond = get_condition(c.status, "Prepared")
    assert (cond.status, cond.reason, cond.message) == ("False", "Preparing",
                                                        "Job qwen35-a3b-pit-2020-prepare: Created")

    world.finish_job(job, json.dumps({"corpusAudit": AUDIT_JSON}), container="prepare")
    c = ctx(pt, world, c.status)
    assert prepare.reconcile(c, stages.PREPARE, pt) is True
    cond = get_condition(c.status, "Prepared")
    assert (cond.status, cond.reason, cond.message) == ("True", "CorpusFiltered",
                                                        "2 documents up to 2020-12-31, 1 after it")
    assert c.status.corpus_audit == AUDIT and c.status.children == {"prepareJob": "qwen35-a3b-pit-2020-prepare"}
    assert c.plan.creates == [] and c.plan.warnings == [("CorpusWarning", "late cutoff")]

    c = ctx(pt, World(), c.status)  # done: the Job is not looked at again
    assert prepare.reconcile(c, stages.PREPARE, pt) is True and c.plan.creates == [] and c.plan.warnings == []
