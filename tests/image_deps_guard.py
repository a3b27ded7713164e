"""A pytest plugin (``-p image_deps_guard``) that makes the modules the operator's image lacks unimportable, so
that the operator's own tests show whether it runs with only what images/operator/Dockerfile installs."""

from __future__ import annotations

import importlib.abc
import sys

MISSING_FROM_OPERATOR_IMAGE = ("numpy", "pandas", "torch", "scipy", "sklearn", "transformers", "matplotlib",
                               "safetensors", "boto3", "botocore", "exchange_calendars", "typer", "rich", "peft",
                               "fla", "tokenizers", "moto")
"""Top-level packages pitlab uses that the operator image does not install (it has pydantic, pyyaml, kopf,
kubernetes and their dependencies)."""


class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in MISSING_FROM_OPERATOR_IMAGE:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the operator image)", name=name)
        return None


def pytest_configure(config) -> None:
    """Installed only when loaded as a plugin (``-p image_deps_guard``), never by importing the module."""
    sys.meta_path.insert(0, _Missing())
