"""``PitTraining``: one point-in-time continued-pretraining run and its evaluations (docs/design.md, "The
resources")."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pitlab.api.base import GROUP_VERSION, FieldError, ISODate, SpecModel
from pitlab.api.leakageeval import SEED_MAX, LeakageEvalTemplate
from pitlab.api.meta import ObjectMeta
from pitlab.api.model_config import check_random_init, check_random_init_positions
from pitlab.api.scheduling import PodScheduling, Quantity
from pitlab.api.status import ResourceStatus
from pitlab.api.storage import StorageSpec, check_location

ARCHITECTURES = ("qwen3_5_moe_text", "qwen3_moe", "llama")


class RandomInit(SpecModel):
    """A random-initialised model of a real architecture (for tests, demos and rehearsals).

    ``modelType`` is a transformers ``model_type``; ``config`` overrides that architecture's defaults
    (``hidden_size``, ``num_hidden_layers``, ...; snake_case keys as in the Hugging Face config);
    ``vocab_size`` is set from the trained tokenizer. ``seed`` fixes the initial weights.
    """

    model_type: Literal["qwen3_5_moe_text", "qwen3_moe", "llama"]
    config: dict[str, Any] = Field(default_factory=dict)
    seed: int = Field(0, ge=0, le=SEED_MAX)

    @model_validator(mode="after")
    def _consistent_config(self) -> "RandomInit":
        """Refuse a config that transformers would refuse or fail on once training starts (sizes, heads,
        experts, layer types: :func:`pitlab.api.model_config.check_random_init`); FieldError naming
        ``config.<key>``."""
        check_random_init(self.model_type, self.config)
        return self


class TokenizerSpec(SpecModel):
    """Byte-level BPE tokenizer trained on the filtered corpus (only with ``baseModel.randomInit``)."""

    vocab_size: int = Field(4096, ge=300, le=262144)


class BaseModelSpec(SpecModel):
    """Where training starts: a Hugging Face model directory (``uri``) or ``randomInit``. Exactly one."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.uri) != has(self.randomInit)", "message": "give exactly one of uri and randomInit"}]})

    uri: str | None = None
    random_init: RandomInit | None = None
    tokenizer: TokenizerSpec = TokenizerSpec()

    @model_validator(mode="after")
    def _one_source(self) -> "BaseModelSpec":
        if (self.uri is None) == (self.random_init is None):
            raise ValueError("give exactly one of uri and randomInit")
        return self


class CorpusSpec(SpecModel):
    """Dated documents. ``timestampField`` values are read strictly in ``timestampFormat`` (default ISO 8601
    dates or datetimes, docs/inputs.md "Accepted timestamp formats"); values without an offset are read in
    ``timezone``. ``idField`` names a unique document id (default: the 1-based data row number). A document with
    an empty text is an error naming its row unless ``onEmptyText: drop``, which counts it in the audit."""

    uri: str
    format: Literal["jsonl", "csv"]
    text_field: str = "text"
    timestamp_field: str = "date"
    timestamp_format: str | None = Field(None, description=(
        "how timestampField values are written; default iso8601 (YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS[.fff]] with an "
        "optional Z or +HH:MM offset). Else a strftime pattern read in full (e.g. \"%d/%m/%Y\"; needs %Y and the day, "
        "no %Z or %y), or epoch_s / epoch_ms / epoch_us for numbers since 1970-01-01T00:00:00Z. A value that does "
        "not match is an error naming the row and the value (or dropped and counted with onMissingTimestamp: drop)"))
    id_field: str | None = None
    timezone: str = "UTC"
    on_missing_timestamp: Literal["error", "drop"] = "error"
    on_empty_text: Literal["error", "drop"] = Field("error", description=(
        "a document whose textField is empty (or only white space): error (default) names its row; drop skips it "
        "and counts it in the corpus audit (status.corpusAudit.rejectedEmptyText)"))
    encoding: str = Field("utf-8", min_length=1, max_length=40, description=(
        "text encoding of the corpus file (a Python codec name: utf-8, utf-16, latin-1, cp1252, shift_jis, ...); "
        "a byte that is not valid in it is an error naming the file, line and byte offset"))

    @model_validator(mode="after")
    def _tz(self) -> "CorpusSpec":
        from pitlab.data.timestamps import check_timezone

        check_timezone(self.timezone)  # ValueError naming timezone
        return self

    @field_validator("encoding")
    @classmethod
    def _encoding(cls, value: str) -> str:
        from pitlab.data.encoding import check_encoding_name

        return check_encoding_name(value)

    @field_validator("timestamp_format")
    @classmethod
    def _timestamp_format(cls, value: str | None) -> str | None:
        from pitlab.data.timestamps import check_format

        check_format(value)  # ValueError saying why the pattern is refused
        return value


class LoraSpec(SpecModel):
    """LoRA (peft) settings for ``method: lora``: rank ``r``, scaling ``alpha / r``, ``dropout`` on the adapter
    input, ``targetModules`` (module-name suffixes of linear layers). The base stays frozen (bfloat16 with
    ``precision: bf16``); only the adapter is trained and checkpointed. ``mergeIntoBase`` (default true): the
    merge step writes the base with the adapter merged in (a full model, what evaluations load); false writes
    the adapter folder (peft format, naming the base model folder) instead."""

    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
                                      min_length=1)
    merge_into_base: bool = True


_BNB_REFUSAL = ("bitsandbytes 8-bit optimizers are refused under FSDP2: they expect plain tensors and "
                "quantise optimizer state per local tensor, which breaks on FSDP2's DTensor parameter shards "
                "(the published 35B recipe crashed this way); use optimizer: adamw")


class LayerStreamingSpec(SpecModel):
    """Layer streaming (``method: lora``, one GPU): the frozen weights of each decoder layer live in host
    memory (page-locked with ``pinHost``) and are copied into one of ``buffers`` GPU slots before the layer runs,
    on a side CUDA stream while the previous layer computes; backward recomputes each layer. A frozen untied
    input embedding stays in host memory too; the final norm, the head and the LoRA adapter (with its AdamW
    state) stay on the GPU. ``gpuMemoryBudgetBytes``: GPU bytes the run may use; ``pitlab plan`` and the
    trainer refuse a run whose predicted peak exceeds it (or ``resources.gpuMemoryGiB``, or the process's
    CUDA memory fraction)."""

    enabled: bool = False
    buffers: int = Field(2, ge=2, le=8, description="GPU slots for decoder layers (2: one computes, one loads)")
    pin_host: bool = Field(True, description="page-locked host store (fast asynchronous copies); CUDA only")
    host_store: Literal["auto", "memory", "mmap"] = Field("auto", description=(
        "where the frozen layers' host store lives. memory: in RAM (pinned with pinHost), refused when it does "
        "not fit the host's available memory; mmap: written once to a file under the run directory "
        "(streaming-store/) and memory-mapped, so only page cache is needed, but copies from it are slower "
        "(pageable pages, not pinned; disk / page-cache bound); auto: memory when it fits MemAvailable, else mmap "
        "with a warning"))
    gpu_memory_budget_bytes: int | None = Field(None, ge=1, description=(
        "GPU bytes this run may use; refused before training when the predicted peak exceeds it"))
    layer_major: bool = Field(True, description=(
        "with training.gradientAccumulationSteps k > 1: each streamed layer runs forward for all k microbatches "
        "of a step before the next layer is fetched, and backward likewise, so every layer is copied twice per "
        "step instead of twice per microbatch (bit-identical to microbatch order); the microbatches' boundary "
        "activations (each layer's input) live where boundaryStore says. false: one microbatch at a time"))
    boundary_store: Literal["auto", "gpu", "host"] = Field("auto", description=(
        "layer-major order: where each decoder layer's input for the k microbatches is kept until backward "
        "(layers x k x microBatchSize x seqLen x hidden x 2 bytes in bf16). gpu: all on the GPU; host: all in "
        "page-locked host memory (copied back one ahead of backward); auto: on the GPU for as many of the last "
        "layers as the budget allows with 2 % of it left free, the rest on the host"))


class TrainingSpec(SpecModel):
    """Optimisation settings. Units: ``seqLen`` in tokens; ``learningRate`` peak LR; ``warmupSteps`` in
    optimizer steps. One optimizer step consumes seqLen × microBatchSize × gradientAccumulationSteps ×
    world-size tokens."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.optimizer) || self.optimizer == 'adamw'", "message": "optimizer: " + _BNB_REFUSAL}]})

    seq_len: int = Field(2048, ge=8)
    micro_batch_size: int = Field(1, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    learning_rate: float = Field(1e-5, gt=0)
    min_learning_rate_ratio: float = Field(0.1, ge=0, le=1)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    optimizer: Literal["adamw", "adamw8bit", "paged_adamw8bit"] = Field("adamw", description=(
        "adamw: torch AdamW (fused on CUDA). The bitsandbytes 8-bit optimizers are refused under FSDP2: "
        "they quantise state per flat tensor and mishandle FSDP2's DTensor shards"))
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    activation_checkpointing: bool | None = Field(None, description=(
        "recompute each decoder layer in backward instead of keeping its activations (true) or keep them (false); "
        "unset (auto, the default): off when the memory planner predicts that the run fits the GPU without it "
        "(faster), else on"))
    compile: bool | None = Field(None, description=(
        "torch.compile each decoder layer (regional compilation, CUDA only: no effect on CPU ranks); on an "
        "H200 it made Qwen3.5 training steps 1.21x faster (bench/RESULTS.md). Unset (auto): on for full-weight "
        "training without layer streaming (the measured configurations), off for LoRA and layer streaming"))
    loss: Literal["reference", "chunked"] = Field("chunked", description=(
        "chunked (default): fused linear + cross-entropy that never stores the tokens x vocabulary logits in "
        "float32 (8 GB less at 4096 tokens of a 248k vocabulary, and faster: bench/RESULTS.md). reference: full "
        "logits and torch's float32 cross-entropy"))
    fused_optimizer: bool | None = Field(None, description=(
        "clipping and AdamW in one pass per parameter (the same arithmetic and state as torch's AdamW). World "
        "size 1, full bf16 training (the single-device path): with the cast of the float32 masters into the bf16 "
        "compute copy, reading the bf16 gradients directly (30 instead of 52 bytes of memory traffic per "
        "parameter). FSDP2: over each rank's float32 shards. Unset (auto): on for CUDA devices, except LoRA under "
        "FSDP2 (1.16x torch's AdamW under FSDP2, bench/RESULTS.md). false: torch's fused AdamW and "
        "clip_grad_norm_. No effect with layer streaming"))
    gradient_sync_every_microbatch: bool = Field(True, description=(
        "reduce-scatter gradients after every microbatch (FSDP2 default: only sharded gradients are kept). "
        "false skips the sync until the last microbatch of a step: less communication, but every rank holds "
        "the full unsharded gradients (parameters x 4 bytes: FSDP2 sums them in float32) between microbatches; "
        "see pitlab plan. With one rank FSDP2 reduces once per step either way (the same bits)"))
    precision: Literal["fp32", "bf16"] = "bf16"
    seed: int = Field(0, ge=0, le=SEED_MAX)
    deterministic: bool = Field(False, description=(
        "run every rank under torch.use_deterministic_algorithms(True) (with CUBLAS_WORKSPACE_CONFIG=:4096:8): "
        "an eager forward and backward through pitlab's kernels then repeated bit for bit on an H100 (the "
        "compiled layers, the optimizer step, FSDP2, the cost in speed and a whole resumed GPU run under it are "
        "not measured yet). false (the default): "
        "SDPA's cuDNN attention backward sums in a varying order, and GPU runs from one seed drift apart in the "
        "fifth significant digit after their first backward (bench/RESULTS.md)"))
    layer_streaming: LayerStreamingSpec = LayerStreamingSpec()

    @model_validator(mode="after")
    def _no_bnb(self) -> "TrainingSpec":
        if self.optimizer != "adamw":
            raise ValueError(f"optimizer: {self.optimizer}: {_BNB_REFUSAL}")
        return self


class ResourcesSpec(PodScheduling):
    """Cluster resources. Locally, ``gpusPerNode`` is the number of torchrun processes (CPU ranks if no GPU)."""

    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(8, ge=1)
    gpu_memory_gib: float | None = Field(None, gt=0, alias="gpuMemoryGiB", description=(
        "memory of one GPU in GiB as torch reports it (`torch.cuda.get_device_properties(0).total_memory / 2**30`: "
        "79.18 on an H100 80GB, 139.0 on the H200s measured here; the names' 80 and 141 are GB, and more than "
        "torch can use); `pitlab plan` and `pitlab run` refuse a run whose predicted per-GPU peak exceeds it"))
    image: str | None = None
    cpu: Quantity | None = None
    memory: Quantity | None = None
    backend: Literal["auto", "trainjob", "jobset", "pytorchjob"] | None = Field(None, description=(
        "what runs the training stage on a cluster (the operator; `pitlab run` ignores it): trainjob (Kubeflow "
        "Trainer v2 TrainJob on the chart's ClusterTrainingRuntime), jobset (a JobSet, no Kubeflow), pytorchjob "
        "(the legacy Kubeflow PyTorchJob), or auto: TrainJob when the cluster serves it, else JobSet, else "
        "PyTorchJob. Unset: the operator's default (chart value trainingBackend, default auto). The choice and "
        "its reason are in status.backend"))


class CheckpointSpec(SpecModel):
    """DCP sharded checkpoints: every ``everySteps`` optimizer steps (0 = only at the end), last ``keep`` kept."""

    uri: str | None = None
    every_steps: int = Field(0, ge=0)
    keep: int = Field(2, ge=1)

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str | None) -> str | None:
        return None if v is None else check_location(v)


class OutputSpec(SpecModel):
    """Where run folders go: ``<uri>/<name>`` (a local folder, or ``s3://bucket/prefix`` for ``pitlab run``)."""

    uri: str = "out"

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        return check_location(v)


_STREAMING_RULE = ("!has(self.training) || !has(self.training.layerStreaming) || "
                   "!has(self.training.layerStreaming.enabled) || !self.training.layerStreaming.enabled || "
                   "(self.method == 'lora' && has(self.resources) && "
                   "(!has(self.resources.nodes) || self.resources.nodes == 1) && "
                   "has(self.resources.gpusPerNode) && self.resources.gpusPerNode == 1)")
_STREAMING_MESSAGE = ("training.layerStreaming: enabled needs method: lora and one process "
                      "(resources.nodes: 1, resources.gpusPerNode: 1)")


class PitTrainingSpec(SpecModel):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.lora) || self.method == 'lora'",
         "message": "lora: the lora block is only allowed with method: lora"},
        {"rule": _STREAMING_RULE, "message": _STREAMING_MESSAGE}]})

    base_model: BaseModelSpec
    corpus: CorpusSpec
    knowledge_cutoff: ISODate
    tokens: int = Field(ge=1, description="training token budget")
    method: Literal["full", "lora"] = "full"
    lora: LoraSpec | None = None
    training: TrainingSpec = TrainingSpec()
    resources: ResourcesSpec = ResourcesSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    output: OutputSpec = OutputSpec()
    storage: StorageSpec | None = None
    evaluations: list[LeakageEvalTemplate] = Field(
        default_factory=list, max_length=16,
        description="LeakageEvals created (owned by this PitTraining) once the merge succeeds")

    def optimizer_steps(self, world_size: int) -> int:
        """Optimizer steps of the token budget with ``world_size`` training processes:
        ``ceil(tokens / (seqLen * microBatchSize * gradientAccumulationSteps * world_size))``, as the trainer counts
        them (:func:`pitlab.trainer.data.steps_for_budget`). Raises ``ValueError`` if ``world_size`` < 1."""
        if world_size < 1:
            raise ValueError(f"optimizer_steps: world_size must be >= 1 (got {world_size})")
        tr = self.training
        return -(-self.tokens // (tr.seq_len * tr.micro_batch_size * tr.gradient_accumulation_steps * world_size))

    @model_validator(mode="after")
    def _lora(self) -> "PitTrainingSpec":
        if self.lora is not None and self.method != "lora":
            raise ValueError("lora: the lora block is only allowed with method: lora")
        if self.method == "lora" and self.lora is None:
            self.lora = LoraSpec()  # the defaults, written out in the resolved spec
        if self.method == "lora" and not self.lora.merge_into_base:
            for i, ev in enumerate(self.evaluations):
                for j, m in enumerate(ev.spec.models):
                    if m.training_ref is not None and m.training_ref.artifact == "model":
                        raise ValueError(
                            f"lora.mergeIntoBase: false writes an adapter folder, which evaluations cannot load, but "
                            f"evaluations[{i}].spec.models[{j}] evaluates the trained model; set "
                            "lora.mergeIntoBase: true")
        ls = self.training.layer_streaming
        if ls.enabled:
            if self.method != "lora":
                raise ValueError(f"training.layerStreaming: enabled needs method: lora (got method: {self.method}); "
                                 "streaming keeps the base frozen and trains a LoRA adapter")
            res = self.resources
            if res.nodes != 1 or res.gpus_per_node != 1:
                raise ValueError(f"training.layerStreaming: enabled needs one process (resources.nodes: 1, "
                                 f"resources.gpusPerNode: 1; got {res.nodes} and {res.gpus_per_node}); "
                                 "for several GPUs use FSDP2 (layerStreaming.enabled: false)")
            if not self.training.gradient_sync_every_microbatch:
                raise ValueError("training.gradientSyncEveryMicrobatch: false is an FSDP2 setting; with "
                                 "training.layerStreaming.enabled there is nothing to sync, leave it true")
        return self


class PitTraining(SpecModel):
    api_version: Literal["pitlab.io/v1alpha1"] = Field(GROUP_VERSION, alias="apiVersion")
    kind: Literal["PitTraining"] = "PitTraining"
    metadata: ObjectMeta
    spec: PitTrainingSpec
    status: ResourceStatus | None = None

    @model_validator(mode="after")
    def _evaluation_folders(self) -> "PitTraining":
        """Each evaluation gets a run folder ``<out>/<evaluation name>`` beside ``<out>/<metadata.name>``: the
        names must differ from each other and from the PitTraining's."""
        names = [e.name for e in self.spec.evaluations]
        for i, name in enumerate(names):
            if name == self.metadata.name:
                raise FieldError(f"spec.evaluations[{i}].name", f"{name!r} is also metadata.name; the evaluation's "
                                 f"run folder <out>/{name} would be the PitTraining's own (which holds its model): "
                                 "give the evaluation another name")
            if name in names[:i]:
                raise FieldError(f"spec.evaluations[{i}].name", f"duplicate evaluation name {name!r} (also "
                                 f"spec.evaluations[{names.index(name)}].name); each evaluation writes its own run "
                                 f"folder <out>/{name}")
        return self

    @model_validator(mode="after")
    def _context_length(self) -> "PitTraining":
        """A ``randomInit`` model is built for ``max_position_embeddings`` tokens (given or the architecture's
        default): refused (FieldError naming it, with ``spec.training.seqLen``) when that is less than
        ``spec.training.seqLen``. A ``baseModel.uri``'s config.json is checked by ``pitlab validate``."""
        ri = self.spec.base_model.random_init
        if ri is not None:
            check_random_init_positions(ri.model_type, ri.config, self.spec.training.seq_len)
        return self

    @model_validator(mode="after")
    def _evaluation_cutoffs(self) -> "PitTraining":
        """An evaluation of this PitTraining's own model (``trainingRef: {name: <metadata.name>, artifact:
        model}``) inherits ``spec.knowledgeCutoff`` when its ``knowledgeCutoff`` is left out, and is refused when
        it states another date (pitlab.api.artifacts)."""
        cutoff = self.spec.knowledge_cutoff
        for i, ev in enumerate(self.spec.evaluations):
            for j, m in enumerate(ev.spec.models):
                ref = m.training_ref
                if ref is None or ref.artifact != "model" or ref.name != self.metadata.name:
                    continue
                if m.knowledge_cutoff is None:
                    m.knowledge_cutoff = cutoff
                elif m.knowledge_cutoff != cutoff:
                    raise FieldError(f"spec.evaluations[{i}].spec.models[{j}].knowledgeCutoff",
                                     f"{m.knowledge_cutoff.isoformat()} differs from spec.knowledgeCutoff "
                                     f"{cutoff.isoformat()}, the cutoff this PitTraining trains its model to; leave "
                                     "it out (it is inherited) or make them agree")
        return self
