"""The operator's status write: it carries the resourceVersion it was computed from, and a write refused as
stale (409) is skipped quietly until it happens STALE_WRITES_BEFORE_ERROR times in a row."""

from __future__ import annotations

from types import SimpleNamespace

import kopf
import pytest
from kubernetes.client import ApiException

from pitlab.operator import handlers


class FakeKube:
    """Answers each status patch with the next code of ``codes`` (200: written) and records the calls."""

    def __init__(self, codes: list[int]):
        self.codes, self.calls = list(codes), []

    def patch_status(self, resource, namespace, name, status, resource_version=None):
        self.calls.append((resource, namespace, name, status, resource_version))
        code = self.codes.pop(0)
        if code != 200:
            raise ApiException(status=code, reason="Conflict" if code == 409 else "Internal Server Error")


def _write(memo, rv: str = "42") -> None:
    body = kopf.Body({"apiVersion": "pitlab.io/v1alpha1", "kind": "LeakageEval",
                      "metadata": {"name": "le", "namespace": "research", "resourceVersion": rv}})
    patch = kopf.Patch()
    patch["status"] = {"phase": "Embedding"}
    handlers.write_status("leakageevals", body, memo, patch)
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
