"""The operator's status write: it carries the resourceVersion it was computed from, and a write refused as
stale (409) is skipped quietly until it happens STALE_WRITES_BEFORE_ERROR times in a row."""

from __future__ import annotations

from types import SimpleNamespace

import kopf
import pytest
from kubernetes.client import ApiException

from pitlab.api.status import ResourceStatus
from pitlab.operator import handlers
from pitlab.operator.context import Plan


class FakeKube:
    """Answers each status patch with the next code of ``codes`` (200: written) and records the calls."""

    def __init__(self, codes: list[int]):
        self.codes, self.calls = list(codes), []

    def patch_status(self, resource, namespace, name, status, resource_version=None):
        self.calls.append((resource, namespace, name, status, resource_version))
        code = self.codes.pop(0)
        if code != 200:
            raise ApiException(status=code, reason="Conflict" if code == 409 else "Internal Server Error")


def _raw(rv: str) -> dict:
    return {"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval",
            "metadata": {"name": "le", "namespace": "research", "resourceVersion": rv}, "spec": {}, "status": {}}


def _write(memo, rv: str = "42") -> None:
    patch = kopf.Patch()
    patch["status"] = {"phase": "Embedding"}
    handlers.write_status("leakageevals", kopf.Body(_raw(rv)), memo, patch, rv)
    assert "status" not in patch  # kopf never writes it itself


def test_the_write_carries_the_resource_version_it_was_computed_from():
    memo = kopf.Memo(kube=FakeKube([200]), config=SimpleNamespace(reconcile_interval=0.1))
    _write(memo, rv="1234")
    assert memo.kube.calls == [("pitlab.io/v1alpha1/leakageevals", "research", "le", {"phase": "Embedding"}, "1234")]
    assert memo.stale_status_writes == 0


def test_stale_writes_are_skipped_then_reported_and_a_write_resets_the_count():
    n = handlers.STALE_WRITES_BEFORE_ERROR
    memo = kopf.Memo(kube=FakeKube([409] * n + [200, 409]), config=SimpleNamespace(reconcile_interval=0.1))
    for i in range(1, n):  # the next timer tick reconciles afresh: nothing raised, nothing posted
        _write(memo)
        assert memo.stale_status_writes == i
    with pytest.raises(kopf.TemporaryError, match=f"409 Conflict.*{n} times in a row") as err:
        _write(memo)
    assert err.value.delay == 0.1 and memo.stale_status_writes == 0
    _write(memo)
    _write(memo)  # one stale write after a successful one counts from 1 again
    assert memo.stale_status_writes == 1 and len(memo.kube.calls) == n + 2


def test_another_api_error_is_retried_after_five_seconds():
    memo = kopf.Memo(kube=FakeKube([500]), config=SimpleNamespace(reconcile_interval=0.1))
    with pytest.raises(kopf.TemporaryError, match="status not written \\(500 Internal Server Error") as err:
        _write(memo)
    assert err.value.delay == 5


def test_the_version_is_read_before_the_reconcile_copies_the_object():
    """kopf updates the body in place when the watch delivers a newer object, also while the reconcile runs (in a
    worker thread): the write must carry the version the status was computed from (100), not the newer one (101)
    that would let a status computed from the older object through."""
    raw = _raw("100")
    body = kopf.Body(raw)
    seen = []

    def reconcile(doc, kube, config):
        seen.append(doc["metadata"]["resourceVersion"])
        raw["metadata"]["resourceVersion"] = "101"  # the watch delivers the operator's previous write meanwhile
        raw["status"] = {"phase": "Embedding"}
        return Plan(status=ResourceStatus(phase="Pending"))

    memo = kopf.Memo(kube=FakeKube([409]), config=SimpleNamespace(reconcile_interval=0.1))
    handlers._reconcile_and_write("LeakageEval", "leakageevals", body, memo, kopf.Patch(), reconcile)
    assert seen == ["100"] and body.metadata["resourceVersion"] == "101"
    assert [c[4] for c in memo.kube.calls] == ["100"]  # refused by the server: the next reconcile reads 101
    assert memo.kube.calls[0][3]["phase"] == "Pending" and memo.stale_status_writes == 1
