"""Reference computations the tests compare pitlab's results with (tests/ is on sys.path under pytest)."""

from pitlab.trainer.digest import tensor_sha256


def parameter_sha256(model) -> dict[str, str]:
    """``{name: sha256}`` of every parameter of a non-distributed ``model`` (``named_parameters()`` order), as the
    trainer's summary records them (``param_sha256``)."""
    return {name: tensor_sha256(p) for name, p in model.named_parameters()}
