"""Prompt templates: the fields a prompt may print (information at t only) and the check of a user's template.
Pure Python, so that the API models (and the operator, which has no numpy or pandas) can check a spec."""

from __future__ import annotations

import string

DEFAULT_PROMPT_TEMPLATE = (
    "Date: {date}. Stock: {name} ({security}). Close {close:.2f}. Returns: 1-day {ret_1d:+.2%}, "
    "5-day {ret_5d:+.2%}, 20-day {ret_20d:+.2%}. Volume {volume_ratio:.2f}x its 20-day average."
)
DEFAULT_PROMPT_TEMPLATE_NO_LEVELS = (
    "Date: {date}. Stock: {name} ({security}). Returns: 1-day {ret_1d:+.2%}, "
    "5-day {ret_5d:+.2%}, 20-day {ret_20d:+.2%}. Volume {volume_ratio:.2f}x its 20-day average."
)
"""The default prompt where price levels are left out (``dataset.priceLevels``; ``ohlcv`` by default)."""
PROMPT_FIELDS = ("date", "security", "name", "close", "ret_1d", "ret_5d", "ret_20d", "volume", "volume_ratio")
LEVEL_FIELDS = ("close", "volume")
"""Prompt fields that print a price or volume level (the others are ratios, unchanged by any adjustment)."""

PROMPT_SAMPLE = {"date": "2017-04-03", "security": "AAPL", "name": "Apple Inc.", "close": 143.7, "ret_1d": 0.0012,
                 "ret_5d": -0.013, "ret_20d": 0.041, "volume": 19985714.0, "volume_ratio": 0.87}
"""One prompt's values, of the types :func:`pitlab.data.sampling.build_panel` gives them (dates, codes and names as text)."""


def prompt_fields(template: str) -> set[str]:
    """The field names a ``str.format`` template uses; ValueError naming ``dataset.promptTemplate`` if invalid."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as err:
        raise ValueError(f"dataset.promptTemplate: invalid template ({err})") from None
    return {f.split(".")[0].split("[")[0] for f in fields}


def shows_levels(kind: str, price_levels: str = "auto") -> bool:
    """Whether prompts may print price/volume levels for a dataset ``kind`` (``ohlcv``/``jpx``) under
    ``dataset.priceLevels`` (``auto``: only where the levels are the ones traded at t, i.e. ``jpx``)."""
    return price_levels == "include" or (price_levels == "auto" and kind == "jpx")


def check_prompt_template(template: str, kind: str = "jpx", price_levels: str = "auto") -> None:
    """Raise ValueError naming ``dataset.promptTemplate`` if it uses a field not in :data:`PROMPT_FIELDS`
    (no field may refer to t+1 or later), is not a valid ``str.format`` template, or prints a level
    (:data:`LEVEL_FIELDS`) that ``dataset.priceLevels`` leaves out for ``kind``."""
    used = prompt_fields(template)
    unknown = sorted(used - set(PROMPT_FIELDS))
    if unknown:
        raise ValueError(f"dataset.promptTemplate: unknown field(s) {unknown}; available: {list(PROMPT_FIELDS)}")
    if not used:
        raise ValueError(f"dataset.promptTemplate: uses no field; every prompt would be the same text: use some of "
                         f"{list(PROMPT_FIELDS)}")
    try:  # what each field is when prompts are built: a format spec that cannot print it fails here, not later
        template.format(**PROMPT_SAMPLE)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
        raise ValueError(f"dataset.promptTemplate: cannot be filled in ({type(err).__name__}: {err}); fields: date, "
                         "security and name are text, the others numbers (e.g. {close:.2f}, {ret_1d:+.2%})") from None
    levels = sorted(used & set(LEVEL_FIELDS))
    if levels and not shows_levels(kind, price_levels):
        why = (f"dataset.priceLevels: {price_levels} leaves them out" if price_levels != "auto" else
               f"a kind {kind} file's prices are adjusted by its source with splits after t (levels not known "
               f"at t), so dataset.priceLevels: auto leaves them out")
        raise ValueError(f"dataset.promptTemplate: {levels} print price/volume levels; {why}. Remove them, or set "
                         f"dataset.priceLevels: include to print them anyway (reported as a look-ahead warning)")
