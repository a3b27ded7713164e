"""Reference computations the tests compare pitlab's results with (tests/ is on sys.path under pytest)."""

import numpy as np

from pitlab.trainer.digest import tensor_sha256


def parameter_sha256(model) -> dict[str, str]:
    """``{name: sha256}`` of every parameter of a non-distributed ``model`` (``named_parameters()`` order), as the
    trainer's summary records them (``param_sha256``)."""
    return {name: tensor_sha256(p) for name, p in model.named_parameters()}


def synthetic_panel(S: int = 24, T: int = 12, d: int = 10, seed: int = 0):
    """A balanced panel of ``S`` securities × ``T`` dates: ``(X float64 [S·T, d] with date effects and an offset
    of 3, y = 0.4·X[:, 0] + a date effect + noise, security index, date index)``, rows ordered date-major."""
    rng = np.random.default_rng(seed)
    sec, date = np.tile(np.arange(S), T), np.repeat(np.arange(T), S)
    X = rng.standard_normal((S * T, d)) + rng.standard_normal((T, d))[date] + 3.0
    y = 0.4 * X[:, 0] + rng.standard_normal(T)[date] + rng.standard_normal(S * T)
    return X, y, sec, date


def tiny_bpe_tokenizer():
    """A byte-level BPE tokenizer (vocabulary 512, ``<|endoftext|>`` as EOS) trained on 300 prompt-like lines."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = [f"Date: 2017-01-{i % 28 + 1:02d}. Stock: Company {i} (T{i}). Close {i * 1.7:.2f}." for i in range(300)]
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")


def gloo_world_of_one() -> None:
    """Initialise the default process group as rank 0 of a one-rank gloo world on a free local port (the
    environment variables torchrun would set); for worker scripts that run pitlab's trainer in-process."""
    import os
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo")
