"""Condition bookkeeping: stage conditions plus kstatus Ready/Reconciling/Stalled, transitions timed once."""

from pitlab.api.status import ResourceStatus
from pitlab.api import conditions

T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z"


def table(s: ResourceStatus) -> list[tuple]:
    return [(c.type, c.status, c.reason, c.last_transition_time, c.observed_generation) for c in s.conditions]


def test_running_done_failed() -> None:
    s = ResourceStatus()
    conditions.stage_running(s, "Trained", "Training", "Training", "step 1", 1, T0)
    assert s.phase == "Training" and table(s) == [
        ("Trained", "False", "Training", T0, 1), ("Ready", "False", "Training", T0, 1),
        ("Reconciling", "True", "Training", T0, 1), ("Stalled", "False", "Training", T0, 1)]
    conditions.stage_running(s, "Trained", "Training", "Training", "step 2", 1, T1)
    assert [c[3] for c in table(s)] == [T0] * 4  # same status: transition time kept
    conditions.stage_done(s, "Trained", "PyTorchJobSucceeded", "", 1, T1)
    conditions.stage_failed(s, "Merged", "BackoffLimitExceeded", "Job m: boom", 1, T2)
    assert s.phase == "Failed" and table(s) == [
        ("Trained", "True", "PyTorchJobSucceeded", T1, 1), ("Merged", "False", "BackoffLimitExceeded", T2, 1),
        ("Ready", "False", "BackoffLimitExceeded", T0, 1), ("Reconciling", "False", "BackoffLimitExceeded", T2, 1),
        ("Stalled", "True", "BackoffLimitExceeded", T2, 1)]
    assert conditions.is_true(s, "Trained") and not conditions.is_true(s, "Merged")


def test_succeeded_and_refused_spec_change() -> None:
    s = ResourceStatus()
    conditions.succeeded(s, "Succeeded", "model at m", 1, T0)
    assert [(c.type, c.status) for c in s.conditions] == [("Ready", "True"), ("Reconciling", "False"),
                                                          ("Stalled", "False")]
    conditions.refuse_spec_change(s, "spec changed", 2, T1)
    assert s.observed_generation == 2
    assert table(s)[0] == ("Ready", "False", "SpecImmutable", T1, 2)
    assert table(s)[2] == ("Stalled", "True", "SpecImmutable", T1, 2)
