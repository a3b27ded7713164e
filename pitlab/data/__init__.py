"""Point-in-time data: dated corpora and the cutoff filter; market panels, targets and prompts."""

from pitlab.data.corpus import CorpusAudit, CorpusError, cutoff_instant, filter_corpus, read_corpus
from pitlab.data.panels import PanelError, Prices, compute_target, load_jpx, load_ohlcv_long
from pitlab.data.sampling import DEFAULT_PROMPT_TEMPLATE, build_panel, sample_dates
from pitlab.data.types import Document, Panel

__all__ = ["CorpusAudit", "CorpusError", "cutoff_instant", "filter_corpus", "read_corpus", "PanelError",
           "Prices", "compute_target", "load_jpx", "load_ohlcv_long", "DEFAULT_PROMPT_TEMPLATE", "build_panel",
           "sample_dates", "Document", "Panel"]
