"""The step loop's garbage collection (pitlab.trainer.gcpolicy): none inside a step, the young generations after
each launch, every generation every FULL_EVERY_STEPS launches, and Python's own collection back afterwards."""

import gc

import pytest

from pitlab.errors import SpecError
from pitlab.trainer import gcpolicy
from pitlab.trainer.knobs import check_knobs


@pytest.fixture
def collections():
    """The generation of every collection made while the test runs."""
    seen: list[int] = []

    def record(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(record)
    yield seen
    gc.callbacks.remove(record)


def _cycles(n: int) -> None:
    for _ in range(n):
        a: list = []
        a.append(a)  # garbage only a collection frees


def test_no_automatic_collection_inside_and_scheduled_ones_after_each_launch(collections):
    assert gc.isenabled()
    with gcpolicy.SteadyGC(env={}) as c:
        assert c.active and not gc.isenabled() and gc.get_freeze_count() > 0
        collections.clear()
        _cycles(50_000)  # far past generation 0's threshold (700 allocations)
        assert collections == []
        for _ in range(gcpolicy.FULL_EVERY_STEPS + 1):
            c.after_launch()
        assert collections == [1] * (gcpolicy.FULL_EVERY_STEPS - 1) + [2, 1]
        assert c.collections == gcpolicy.FULL_EVERY_STEPS + 1
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_python_mode_and_a_collector_already_off_are_left_alone(collections):
    with gcpolicy.SteadyGC(env={"PITLAB_GC": "python"}) as c:
        assert not c.active and gc.isenabled() and gc.get_freeze_count() == 0
        collections.clear()
        c.after_launch()
        assert collections == [] and c.collections == 0
    gc.disable()
    try:
        with gcpolicy.SteadyGC(env={}) as c:
            assert not c.active and gc.get_freeze_count() == 0
        assert not gc.isenabled()  # as it was
    finally:
        gc.enable()


def test_an_unknown_mode_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match="PITLAB_GC='auto': give one of pitlab, python"):
        gcpolicy.SteadyGC(env={"PITLAB_GC": "auto"})
    with pytest.raises(SpecError, match="PITLAB_GC"):
        check_knobs({"PITLAB_GC": "auto"})


def test_a_loop_left_by_an_error_gives_the_collector_back_when_closed():
    """As train.py walks run_steps: a generator inside SteadyGC, left by the caller's error, then closed."""
    from contextlib import closing

    def steps():
        with gcpolicy.SteadyGC(env={}) as c:
            for i in range(10):
                c.after_launch()
                yield i

    with pytest.raises(RuntimeError, match="a save failed"):
        with closing(steps()) as it:
            for i in it:
                assert not gc.isenabled()
                if i == 3:
                    raise RuntimeError("a save failed")
    assert gc.isenabled() and gc.get_freeze_count() == 0
