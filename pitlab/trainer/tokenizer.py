"""Train the byte-level BPE tokenizer of a random-initialised base model on the PIT-filtered corpus."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN)  # ids 0 and 1, in this order


def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and save it to ``out_dir`` (``save_pretrained``).

    The vocabulary holds the 256 byte symbols, the special tokens ``<|endoftext|>`` (id 0, used as eos
    and bos) and ``<|pad|>`` (id 1), and BPE merges up to ``vocab_size`` entries in total (fewer when the
    corpus has too few distinct pairs). Training is deterministic: the same texts and ``vocab_size`` give
    the same vocabulary and merges. ``AutoTokenizer.from_pretrained(out_dir)`` loads the result.

    Raises ``ValueError`` if ``texts`` is empty or holds only empty strings, or if ``vocab_size`` is
    smaller than 256 bytes + the special tokens.
    """
    min_size = 256 + len(SPECIAL_TOKENS)
    if vocab_size < min_size:
        raise ValueError(f"spec.baseModel.tokenizer.vocabSize: must be at least {min_size} (got {vocab_size})")
    if not any(t for t in texts):
        raise ValueError("tokenizer training: the corpus has no non-empty text (nothing passed the PIT filter?)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast
