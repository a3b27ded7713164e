"""What the prepare stage reads, read once: the corpus filtered to the knowledge cutoff (checked before a run
starts, then handed to :func:`prepare_run`), and the run folder it writes for every training rank."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from pitlab import storage
from pitlab.api import PitTraining, SpecError, layout, resolve_input, resolve_local_path
from pitlab.api.layout import TrainingLayout
from pitlab.data import filter_corpus, read_corpus
from pitlab.data.corpus import CorpusAudit, file_sha256
from pitlab.data.types import Document
from pitlab.storage.outdir import swap_in
from pitlab.trainer.files import write_json_atomic, write_spec


@dataclass
class CorpusPlan:
    """The corpus after the cutoff filter: its file, the kept documents (in file order) and the audit."""

    path: Path
    documents: list[Document]
    audit: CorpusAudit


def check_memory(spec, config) -> None:
    """Refuse ``spec`` (a ``PitTrainingSpec``) whose memory plan for the model of ``config`` (its transformers
    config) exceeds ``spec.resources.gpuMemoryGiB``: :class:`SpecError` naming that field, with what would fit.
    Nothing is checked without a typed GPU memory or with layer streaming (its own budget)."""
    if spec.resources.gpu_memory_gib is None or spec.training.layer_streaming.enabled:
        return
    from pitlab.trainer.plan import model_shape, plan_memory

    fit = plan_memory(spec, model_shape(config))
    if fit.fits is False:
        raise SpecError([("spec.resources.gpuMemoryGiB", fit.refusal("spec.resources.gpuMemoryGiB"))])


def check_corpus(res: PitTraining) -> CorpusPlan:
    """Read and filter the corpus; raises SpecError/CorpusError naming the field, file and row."""
    c = res.spec.corpus
    path = resolve_input(c.uri, "spec.corpus.uri")  # s3://: downloaded (verified) into the cache
    docs = read_corpus(path, c.format, c.text_field, c.timestamp_field, c.timezone, c.id_field, c.timestamp_format,
                       c.encoding)
    source = c.uri if storage.is_s3(c.uri) else str(path)
    kept, audit = filter_corpus(docs, res.spec.knowledge_cutoff, c.timezone, c.on_missing_timestamp,
                                source=source, source_sha256=file_sha256(path), timestamp_format=c.timestamp_format,
                                on_empty_text=c.on_empty_text)
    check_corpus_length(res, kept)
    return CorpusPlan(path, kept, audit)


def check_corpus_length(res: PitTraining, kept: list[Document]) -> None:
    """Refuse a filtered corpus shorter than one packed sequence (``seqLen + 1`` tokens) before anything runs.

    With ``randomInit`` the tokenizer does not exist yet: its byte-level BPE gives at most one token per UTF-8
    byte plus one eos per document, so a corpus below that bound is refused (prepare counts exactly). With a
    local ``baseModel.uri`` its tokenizer counts the documents (stopping once there are enough). Raises SpecError
    naming ``spec.training.seqLen`` (or ``spec.baseModel.uri`` if its tokenizer cannot be loaded)."""
    seq_len = res.spec.training.seq_len
    uri = res.spec.base_model.uri
    if res.spec.base_model.random_init is not None:
        most = sum(len(d.text.encode("utf-8")) + 1 for d in kept)
        if most < seq_len + 1:
            raise SpecError([("spec.training.seqLen", short_corpus_message(
                f"at most {most} tokens (its {len(kept)} documents hold {most - len(kept)} UTF-8 bytes, one eos each)",
                seq_len))])
    elif uri is not None and not storage.is_s3(uri):  # a published model is counted by prepare, after its download
        from transformers import AutoTokenizer

        path = resolve_local_path(uri, "spec.baseModel.uri")
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception as err:  # noqa: BLE001 - whatever transformers raises, the folder is not usable
            raise SpecError([("spec.baseModel.uri",
                              f"{str(path)!r}: its tokenizer cannot be loaded ({err})")]) from None
        count = 0
        for d in kept:
            count += len(tokenizer(d.text, add_special_tokens=False)["input_ids"]) + 1
            if count > seq_len:
                return
        raise SpecError([("spec.training.seqLen", short_corpus_message(f"{count} tokens", seq_len))])


def short_corpus_message(count: str, seq_len: int) -> str:
    """Why a corpus shorter than one packed training sequence (``seq_len + 1`` tokens) is refused."""
    return (f"the filtered corpus has {count}, fewer than one packed sequence of seqLen + 1 = {seq_len + 1} tokens; "
            "lower spec.training.seqLen or give a corpus with more text up to the knowledge cutoff")


def prepare_run(res: PitTraining, plan: CorpusPlan, run_dir: Path) -> tuple[Path, int]:
    """Write what every training rank reads: ``base/`` (tokenizer trained on the kept documents + base
    model; with ``randomInit`` its model card, the run's knowledge cutoff and method ``random-init``),
    ``data/tokens.npy`` (packed corpus tokens) and ``spec.json`` (the resolved resource).

    This is the ``pitlab prepare`` entry point's work (a single-pod Job on a cluster). Returns
    (base model folder, number of corpus tokens).
    """
    from transformers import AutoTokenizer

    from pitlab.trainer.prepare import ShortCorpusError, prepare_base_model, tokenize_corpus
    from pitlab.trainer.report import model_card

    run_dir.mkdir(parents=True, exist_ok=True)
    paths = TrainingLayout(run_dir)
    write_spec(res, paths.spec)
    if not paths.corpus_audit.exists():
        write_json_atomic(paths.corpus_audit, plan.audit.to_dict())
    texts = [d.text for d in plan.documents]
    # a random-initialised base has read nothing but the kept documents (its tokenizer's): its card says so
    card = model_card(res, run_dir, method="random-init") if res.spec.base_model.random_init else None
    base_dir = prepare_base_model(res.spec, texts, paths.base, card)
    if res.spec.base_model.uri and storage.is_s3(res.spec.base_model.uri):
        # the download lives in this process's cache; the ranks and the merge (other pods on a cluster) read
        # RUN/base, so the verified copy goes there
        tmp = run_dir / f"{layout.BASE}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(base_dir, tmp, ignore=shutil.ignore_patterns(storage.MANIFEST, storage.COMPLETE))
        swap_in(tmp, paths.base)
        base_dir = paths.base
    need = res.spec.training.seq_len + 1
    try:
        n_tokens = tokenize_corpus(texts, AutoTokenizer.from_pretrained(base_dir), paths.tokens,
                                   min_tokens=need)
    except ShortCorpusError as err:
        raise SpecError([("spec.training.seqLen",
                          short_corpus_message(f"{err.tokens} tokens", res.spec.training.seq_len))]) from None
    return base_dir, n_tokens
