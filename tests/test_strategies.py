"""Which execution strategy a run gets (:func:`pitlab.trainer.strategies.choose_strategy`); that each strategy
computes what the old paths computed is the bit-equality tests' job (test_single_device, test_trainer*,
test_local_streaming, test_resume)."""

from __future__ import annotations

from types import SimpleNamespace

from pitlab.trainer.single_device import LABEL
from pitlab.trainer.strategies import FSDP2Strategy, SingleDeviceStrategy, StreamingStrategy, choose_strategy

from test_single_device import resource  # noqa: E402  (tests/ is on sys.path under pytest)


def test_the_strategy_follows_the_spec_the_world_size_and_the_plan(monkeypatch, tmp_path) -> None:
    spec = resource(tmp_path, 1).spec
    assert type(choose_strategy(spec, 1)) is SingleDeviceStrategy
    assert type(choose_strategy(spec, 2)) is FSDP2Strategy
    only_fsdp2_fits = SimpleNamespace(world_size=1, single_device=False)
    assert type(choose_strategy(spec, 1, only_fsdp2_fits)) is FSDP2Strategy
    assert type(choose_strategy(spec, 1, SimpleNamespace(world_size=1, single_device=True))) is SingleDeviceStrategy
    assert type(choose_strategy(spec, 1, SimpleNamespace(world_size=2, single_device=False))) is SingleDeviceStrategy
    lora = spec.model_copy(update={"method": "lora"})
    assert type(choose_strategy(lora, 1)) is FSDP2Strategy
    streaming = SimpleNamespace(training=SimpleNamespace(layer_streaming=SimpleNamespace(enabled=True)))
    assert type(choose_strategy(streaming, 1)) is StreamingStrategy
    monkeypatch.setenv("PITLAB_FORCE_FSDP2", "1")
    assert type(choose_strategy(spec, 1)) is FSDP2Strategy
    assert (FSDP2Strategy.label, SingleDeviceStrategy.label, StreamingStrategy.label) == (
        "FSDP2", LABEL, "layer streaming (one device)")
    assert StreamingStrategy.compiled_by_default is False and FSDP2Strategy().report() == {"layer_streaming": None}
