"""pitlab: point-in-time language models for finance and look-ahead leakage measurement."""

__version__ = "0.1.0"
