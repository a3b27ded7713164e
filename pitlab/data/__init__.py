"""Point-in-time data: dated corpora and the cutoff filter; market panels, targets and prompts.

The names below load their modules on first use (PEP 562), so that the API models can import the pure-Python
checks (:mod:`pitlab.data.prompts`, :mod:`pitlab.data.encoding`, :mod:`pitlab.data.timestamps`' format check)
without pandas: the operator's image has none."""

from __future__ import annotations

import importlib

_EXPORTS = {"CorpusAudit": "corpus", "CorpusError": "corpus", "cutoff_instant": "corpus", "filter_corpus": "corpus",
            "read_corpus": "corpus", "PanelError": "panels", "Prices": "panels", "compute_target": "panels",
            "load_jpx": "panels", "load_ohlcv_long": "panels", "DEFAULT_PROMPT_TEMPLATE": "prompts",
            "build_panel": "sampling", "sample_dates": "sampling", "Document": "types", "Panel": "types"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pitlab.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pitlab.data.{_EXPORTS[name]}"), name)
