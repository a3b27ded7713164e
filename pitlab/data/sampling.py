"""Seeded sampling of an evaluation panel (dates × securities) and prompts built from information at t only."""

from __future__ import annotations

import datetime as dt
import warnings

import numpy as np
import pandas as pd

from pitlab.data.panels import (HISTORY_DAYS, PanelError, Prices, compute_features, compute_target, split_chain,
                                 target_close)
from pitlab.data.prompts import (  # noqa: F401 - re-exported: the prompt API lives in pitlab.data.prompts
    DEFAULT_PROMPT_TEMPLATE, DEFAULT_PROMPT_TEMPLATE_NO_LEVELS, LEVEL_FIELDS, PROMPT_FIELDS, PROMPT_SAMPLE,
    check_prompt_template, prompt_fields, shows_levels)
from pitlab.data.types import Panel

UNIVERSE0_SNAPSHOT = pd.Timestamp("2021-12-01")
"""First day of the month of the JPX stock_list.csv Universe0 snapshot (December 2021)."""


def sample_dates(calendar: pd.DatetimeIndex, count: int, seed: int, start: dt.date | None = None,
                 end: dt.date | None = None) -> pd.DatetimeIndex:
    """Draw ``count`` distinct trading days (sorted) with ``numpy.random.default_rng(seed)``.

    Eligible days lie in [start, end], have ``HISTORY_DAYS`` (20) trading days before them (for the
    features) and two after them (for the target). Raises PanelError naming ``dataset.dates.count`` when
    fewer days are eligible.
    """
    idx = np.arange(len(calendar))
    ok = (idx >= HISTORY_DAYS) & (idx <= len(calendar) - 3)
    if start is not None:
        ok &= calendar >= pd.Timestamp(start)
    if end is not None:
        ok &= calendar <= pd.Timestamp(end)
    eligible = calendar[ok]
    if len(eligible) < count:
        span = (f"; the prices cover {calendar[0].date()}..{calendar[-1].date()}" if len(calendar) else
                "; the price file has no dates")
        raise PanelError(f"dataset.dates.count: {count} dates requested but only {len(eligible)} trading days "
                         f"are eligible (20 days of history before, 2 days after, inside dates.start..end = "
                         f"{start or 'first'}..{end or 'last'}){span}")
    rng = np.random.default_rng(seed)
    return pd.DatetimeIndex(np.sort(rng.choice(eligible.to_numpy(), size=count, replace=False)))


def _eligible(prices: Prices, feats: dict[str, pd.DataFrame], first: pd.Timestamp, universe: str,
              panel_warnings: list[str]) -> np.ndarray:
    """The securities the universe may be drawn from (sorted): a close and 20 trading days of history at
    ``first``; with ``universe0`` also flagged Universe0 (a survivorship warning, appended to
    ``panel_warnings``, when ``first`` precedes the snapshot). Raises PanelError naming ``dataset.universe``."""
    hist_ok = feats["ret_20d"].loc[first].notna() & feats["volume_ratio"].loc[first].notna()
    eligible = np.array(sorted(hist_ok.index[hist_ok.to_numpy()]))
    if universe == "universe0":
        if prices.universe0 is None:
            raise PanelError(f"dataset.universe: universe0 needs a Universe0 column in stock_list.csv "
                             f"({prices.source})")
        eligible = np.array([s for s in eligible if s in prices.universe0])
        if first < UNIVERSE0_SNAPSHOT:
            msg = (f"dataset.universe: universe0 picks the universe with stock_list.csv's Universe0, a snapshot of "
                   f"{UNIVERSE0_SNAPSHOT.date():%B %Y}, for dates from {first.date()}: securities delisted or "
                   f"demoted before the snapshot are excluded (survivorship, a look-ahead). Use "
                   f"universe: point-in-time.")
            panel_warnings.append(msg)
            warnings.warn(msg, UserWarning, stacklevel=3)  # at build_panel's caller
    elif universe != "point-in-time":
        raise PanelError(f"dataset.universe must be point-in-time or universe0 (got {universe!r})")
    return eligible


def build_panel(prices: Prices, universe_size: int, date_count: int, seed: int,
                start: dt.date | None = None, end: dt.date | None = None,
                template: str | None = None, universe: str = "point-in-time",
                price_levels: str = "auto") -> Panel:
    """Sample dates, then a universe, and build one prompt and target per (date, security) row.

    Universe (point-in-time): securities with a close and 20 trading days of history at the *first* sampled
    date, drawn with ``default_rng(seed + 1)``; whether a security survives later is not used to pick it.
    Rows whose target or features are missing (a security delisted or halted later) are dropped and
    counted in ``Panel.dropped`` (``missing_target``, ``missing_features``). Raises PanelError naming
    ``dataset.universeSize`` when fewer securities are eligible.

    ``universe="universe0"`` (JPX): only securities flagged in stock_list.csv's ``Universe0`` are eligible.
    That flag is a December 2021 snapshot (:data:`UNIVERSE0_SNAPSHOT`): picking a universe with it for earlier
    dates keeps only securities that survived to December 2021 (survivorship, itself look-ahead), so a
    ``UserWarning`` is issued and kept in ``Panel.warnings`` when the first sampled date precedes it.

    Prompts are built as of t (:func:`pitlab.data.panels.compute_features`); ``price_levels``
    (``dataset.priceLevels``) decides whether they may print levels: the default template omits ``Close``
    where they are left out, and a template printing one raises PanelError naming ``dataset.promptTemplate``.
    Targets use :func:`pitlab.data.panels.target_close` (the competition's adjusted close for JPX).
    """
    kind = "jpx" if prices.levels_as_of_t else "ohlcv"
    levels = shows_levels(kind, price_levels)
    template = template or (DEFAULT_PROMPT_TEMPLATE if levels else DEFAULT_PROMPT_TEMPLATE_NO_LEVELS)
    try:
        check_prompt_template(template, kind, price_levels)
    except ValueError as err:
        raise PanelError(str(err)) from None
    printed = sorted(prompt_fields(template) & set(LEVEL_FIELDS))
    panel_warnings: list[str] = []
    if printed and not prices.levels_as_of_t:
        panel_warnings.append(f"dataset.priceLevels: include: prompts print {printed} as the file gives them; "
                              f"{prices.source} may be adjusted by its source with splits after t (a level not "
                              f"known at t, a look-ahead)")
    dates = sample_dates(prices.calendar, date_count, seed, start, end)
    feats = compute_features(prices)
    target = compute_target(target_close(prices))
    first = dates[0]
    eligible = _eligible(prices, feats, first, universe, panel_warnings)
    if len(eligible) < universe_size:
        raise PanelError(f"dataset.universeSize: {universe_size} securities requested but only {len(eligible)} "
                         f"have 20 trading days of history at the first sampled date {first.date()}")
    rng = np.random.default_rng(seed + 1)
    universe = np.sort(rng.choice(eligible, size=universe_size, replace=False))

    long = pd.DataFrame({"date": np.repeat(dates.to_numpy(), len(universe)),
                         "security": np.tile(universe, len(dates))})
    for name, frame in {**feats, "target": target}.items():
        long[name] = frame.loc[dates, universe].to_numpy().ravel()
    feature_cols = ["close", "ret_1d", "ret_5d", "ret_20d", "volume", "volume_ratio"]
    missing_feat = long[feature_cols].isna().any(axis=1)
    missing_target = long["target"].isna() & ~missing_feat
    dropped = {"missing_features": int(missing_feat.sum()), "missing_target": int(missing_target.sum())}
    dropped_rows = _dropped_rows(prices, long[missing_feat | missing_target], missing_feat)
    long = long[~missing_feat & ~missing_target].reset_index(drop=True)
    if long.empty:
        raise PanelError(f"{prices.source}: every sampled row lacks a target or features")
    for note in (large_moves(prices, dates, universe), survivorship_note(prices, eligible, first)):
        if note:
            panel_warnings.append(note)
    long["name"] = long["security"].map(prices.names)
    long["prompt"] = [
        template.format(date=r.date.date().isoformat(), security=r.security, name=r.name, close=r.close,
                        ret_1d=r.ret_1d, ret_5d=r.ret_5d, ret_20d=r.ret_20d, volume=r.volume,
                        volume_ratio=r.volume_ratio)
        for r in long.itertuples(index=False)
    ]
    rows = long[["date", "security", "prompt", "target"]].sort_values(["date", "security"]).reset_index(drop=True)
    dataset = {**prices.info, "price_levels_in_prompts": printed, "prompt_template": template}
    return Panel(rows=rows, calendar=prices.calendar, source=prices.source, dropped=dropped,
                 warnings=panel_warnings, dataset=dataset, dropped_rows=dropped_rows)


def _dropped_rows(prices: Prices, lost: pd.DataFrame, missing_feat: pd.Series) -> list[dict]:
    """``{"date", "security", "why"}`` of each sampled row ``lost``: the days without a close or volume in its
    features' 21 days t−20 … t (the first of them and how many), or the missing close at t+1 or t+2."""
    cal, out = prices.calendar, []
    for i, r in zip(lost.index, lost.itertuples(index=False)):
        p = cal.get_loc(r.date)
        if missing_feat[i]:
            window = cal[max(p - HISTORY_DAYS, 0):p + 1]
            gaps = window[(prices.close.loc[window, r.security].isna()
                           | prices.volume.loc[window, r.security].isna()).to_numpy()]
            why = (f"no close or volume on {gaps[0].date()}" + (f" and {len(gaps) - 1} more of the 21 days up to t"
                                                               if len(gaps) > 1 else "")
                   if len(gaps) else f"fewer than {HISTORY_DAYS} trading days of history before t")
        else:
            ahead = cal[p + 1:p + 3]
            gaps = ahead[prices.close.loc[ahead, r.security].isna().to_numpy()] if len(ahead) == 2 else ahead[:0]
            why = (f"no close on {', '.join(str(d.date()) for d in gaps)} (the target's t+1 or t+2)" if len(gaps)
                   else "the target's t+2 lies after the price file's last day")
        out.append({"date": r.date.date().isoformat(), "security": str(r.security), "why": why})
    return out


MOVE_LIMITS = (0.6, 1 / 0.6)
"""One-day close ratios outside these (a fall of more than 40 %, a rise of more than 67 %) are named when they enter
a sampled row: an unadjusted split (×0.5, ×2) or spin-off is one, and so is a data error."""
SPLIT_RATIOS = (1 / 10, 1 / 5, 1 / 4, 1 / 3, 1 / 2, 2 / 3, 3 / 2, 2, 3, 4, 5, 10)


def large_moves(prices: Prices, dates: pd.DatetimeIndex, universe: np.ndarray, shown: int = 5) -> str | None:
    """The warning naming one-day close moves outside :data:`MOVE_LIMITS` that enter the sampled rows (a feature's
    20 days up to t, or the target's close t+1 → t+2; for JPX the moves of the split-adjusted closes), with the
    security, day, both closes and the ratio (``near a 2:1 split`` within 3 % of a split ratio), the first
    ``shown`` of them; None when there is none. A file that is not adjusted for splits and spin-offs makes these
    the returns the regressions see, and pitlab cannot tell a split from a crash."""
    cal = prices.calendar
    adjusted = prices.close / split_chain(prices)
    found: dict[tuple[pd.Timestamp, str], tuple[float, float]] = {}
    for close, days in ((adjusted, _feature_days(cal, dates)), (target_close(prices), _target_days(cal, dates))):
        sub = close.loc[:, universe]
        ratio = sub / sub.shift(1)
        bad = ((ratio < MOVE_LIMITS[0]) | (ratio > MOVE_LIMITS[1])) & ratio.index.isin(days)[:, None]
        for d, sec in zip(*np.nonzero(bad.to_numpy())):
            found.setdefault((cal[d], universe[sec]), (float(sub.iat[d - 1, sec]), float(sub.iat[d, sec])))
    if not found:
        return None
    items = []
    for (day, sec), (before, after) in sorted(found.items())[:shown]:
        r = after / before
        near = next((k for k in SPLIT_RATIOS if abs(r / k - 1) < 0.03), None)
        split = f", near a {_split_name(near)} split" if near is not None else ""
        items.append(f"{sec} {day.date()}: {before:g} → {after:g} (×{r:.3f}{split})")
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    return (f"dataset: {len(found)} one-day close move{'s' if len(found) > 1 else ''} beyond −40 % / +67 % enter"
            f"{'' if len(found) > 1 else 's'} sampled rows' features or targets in {prices.source}: "
            f"{'; '.join(items)}{more}. If the file is not adjusted for splits and spin-offs these are not returns "
            "(pitlab cannot tell a split from a crash): use an adjusted file (JPX: AdjustmentFactor) or leave "
            "the securities out")


SURVIVOR_SECURITY_YEARS = 150.0
"""Security-years from the first sampled date to a price file's last day above which a file in which no eligible
security stops trading is called a survivorship snapshot: at 2 % delistings a year (mergers, bankruptcies; large
US stocks lose 3-5 % of their names a year) a complete file would show none with probability e^-3, about 5 %."""


def survivorship_note(prices: Prices, eligible: np.ndarray, first: pd.Timestamp) -> str | None:
    """The warning that ``prices`` looks like a survivorship snapshot: every one of the ``eligible`` securities at
    ``first`` still has a close on the file's last trading day, over at least :data:`SURVIVOR_SECURITY_YEARS`
    security-years (the file then lists the securities that survived to its end, and a universe drawn from it
    is conditioned on the future). None when some security stops trading before the last day, or when there are
    too few security-years to tell."""
    if len(eligible) == 0:
        return None
    last = prices.calendar[-1]
    years = (last - first).days / 365.25
    if len(eligible) * years < SURVIVOR_SECURITY_YEARS:
        return None
    if prices.close.loc[last, eligible].isna().any():
        return None
    return (f"dataset: all {len(eligible)} securities eligible at the first sampled date {first.date()} still trade "
            f"on {prices.source}'s last day {last.date()}, {years:.1f} years later: no delisting, merger or "
            "bankruptcy in the file, so it looks like a survivorship snapshot (the securities that survived to its "
            "end). A universe drawn from it knows who survives, a look-ahead that flatters any model; use a price "
            "file that keeps the securities that stopped trading, or read the premia as conditional on survival")


def _feature_days(cal: pd.DatetimeIndex, dates: pd.DatetimeIndex) -> pd.DatetimeIndex:
    """The days whose one-day move enters a feature of a row at a date of ``dates``: t−19 … t."""
    pos = cal.get_indexer(dates)
    return cal[np.unique(np.concatenate([np.arange(max(p - HISTORY_DAYS + 1, 1), p + 1) for p in pos]))]


def _target_days(cal: pd.DatetimeIndex, dates: pd.DatetimeIndex) -> pd.DatetimeIndex:
    """The days whose one-day move is the target of a row at a date of ``dates``: t+2."""
    pos = cal.get_indexer(dates) + 2
    return cal[pos[pos < len(cal)]]


def _split_name(ratio: float) -> str:
    """``2:1`` for a close ×1/2 (two new shares for one), ``1:2`` for ×2 (a reverse split)."""
    from fractions import Fraction

    f = Fraction(ratio).limit_denominator(10)
    return f"{f.denominator}:{f.numerator}"


def dropped_note(dropped: dict[str, int], kept: int, rows: list[dict] | None = None, shown: int = 3,
                 listed_in: str = "in results.json") -> str:
    """What ``Panel.dropped`` says in words, for the console and the report: ``""`` when no row was dropped, else
    e.g. ``"; 8 of 240 sampled rows dropped: 7 without features (price history missing: not yet listed,
    delisted or halted), 1 without a target (no close at t+1 or t+2)"``, then the first ``shown`` of
    ``rows`` (``Panel.dropped_rows``), e.g. ``"; e.g. AAPL 2016-10-31: no close or volume on 2016-10-05"``;
    ``kept``: the panel's rows (the sampled count is they plus the dropped); ``listed_in``: where the rest are
    listed, e.g. ``"(+8 more in results.json)"``."""
    lost = dropped.get("missing_features", 0) + dropped.get("missing_target", 0)
    if not lost:
        return ""
    parts = []
    if dropped.get("missing_features"):
        parts.append(f"{dropped['missing_features']:,} without features (price history missing: not yet listed, "
                     "delisted or halted)")
    if dropped.get("missing_target"):
        parts.append(f"{dropped['missing_target']:,} without a target (no close at t+1 or t+2)")
    named = "; ".join(f"{r['security']} {r['date']}: {r['why']}" for r in (rows or [])[:shown])
    more = f" (+{len(rows) - shown} more {listed_in})" if rows and len(rows) > shown else ""
    return f"; {lost:,} of {kept + lost:,} sampled rows dropped: {', '.join(parts)}" + (
        f"; e.g. {named}{more}" if named else "")
