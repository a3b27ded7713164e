"""Embedding at scale (issue 13): the truncated, meta-device path equals the whole model's hidden state of the
requested layer bit for bit on CPU, and the benchmark-only random-weights source is deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["Date: 2017-01-03. Stock: Company 5 (T5). Close 8.50.", "Close 1.", "Stock: Company 12 (T12).",
         "Date: 2017-01-09. Stock: Company 99 (T99). Close 168.30. Close 3.40.", "Date: 2017-01-04.",
         "Stock: Company 7 (T7). Close 2.25. Date: 2017-01-05."]

QWEN = dict(model_type="qwen3_5_moe_text", hidden_size=64, num_hidden_layers=4,
            layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=8,
            num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
            max_position_embeddings=512, vocab_size=512)
LLAMA = dict(model_type="llama", hidden_size=64, num_hidden_layers=3, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, vocab_size=512)


def _config(kw: dict):
    kw = dict(kw)
    return transformers.AutoConfig.for_model(kw.pop("model_type"), **kw)


@pytest.fixture(scope="module")
def tokenizer():
    """The tiny byte-level BPE tokenizer of tests/reference.py."""
    from reference import tiny_bpe_tokenizer

    return tiny_bpe_tokenizer()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tokenizer) -> dict[str, Path]:
    """Saved (safetensors) tiny causal LMs of two architectures, random-initialised with seed 0."""
    from transformers import AutoModelForCausalLM

    out = {}
    for name, kw in (("qwen", QWEN), ("llama", LLAMA)):
        folder = tmp_path_factory.mktemp(name)
        tokenizer.save_pretrained(folder)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(_config(kw)).save_pretrained(folder)
        out[name] = folder
    return out


def _reference(model_dir: Path, texts: list[str], layer: int, pooling: str, batch_size: int) -> np.ndarray:
    """The embedding path before issue 13: the whole model loaded on the host, ``output_hidden_states`` of
    every layer, ``hidden_states[layer]`` pooled; length-sorted batches of ``batch_size``."""
    from transformers import AutoModel, AutoTokenizer

    from pitlab.evaluator.embed import _pool

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.padding_side = "right"
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    enc = tok(texts, truncation=True, max_length=128, return_attention_mask=True)
    ids, masks = enc["input_ids"], enc["attention_mask"]
    order = np.argsort(-np.array([len(x) for x in ids]), kind="stable")
    out = np.empty((len(texts), model.config.hidden_size), dtype=np.float32)
    with torch.inference_mode():
        for s in range(0, len(texts), batch_size):
            idx = order[s:s + batch_size]
            b = tok.pad({"input_ids": [ids[i] for i in idx], "attention_mask": [masks[i] for i in idx]},
                        padding=True, return_tensors="pt")
            hs = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       output_hidden_states=True).hidden_states[layer]
            out[idx] = _pool(hs, b["attention_mask"], pooling).float().numpy()
    return out


@pytest.mark.parametrize("arch,layer,layers_run", [
    ("qwen", 2, 2), ("qwen", 0, 1), ("qwen", 1, 1), ("qwen", 3, 3), ("qwen", -1, 4), ("qwen", 4, 4),
    ("qwen", -3, 2), ("llama", 2, 2), ("llama", 0, 1), ("llama", -1, 3)])
def test_truncated_path_equals_whole_model_hidden_state(checkpoints, arch, layer, layers_run):
    from pitlab.evaluator.embed import embed_texts

    pooling = "mean" if layer == 2 else "last"
    info: dict = {}
    got = embed_texts(checkpoints[arch], TEXTS, kind="causal", layer=layer, pooling=pooling, batch_size=4, info=info)
    ref = _reference(checkpoints[arch], TEXTS, layer, pooling, 4)
    assert info["layers_run"] == layers_run and info["weights"] == "checkpoint"
    assert np.array_equal(got, ref)  # bit-identical, not close
    assert info["n_tokens"] == sum(len(x) for x in transformers.AutoTokenizer.from_pretrained(
        str(checkpoints[arch]))(TEXTS)["input_ids"])
    assert info["n_batches"] == 2 and info["prompts_per_s"] > 0 and info["tokens_per_s"] > info["prompts_per_s"]


def test_truncated_config_cuts_per_layer_lists():
    from pitlab.evaluator.embed import layers_to_run, truncated_config

    cfg = _config(QWEN)
    cut = truncated_config(cfg, 2)
    assert (cut.num_hidden_layers, cut.layer_types) == (2, ["linear_attention", "linear_attention"])
    assert (cfg.num_hidden_layers, len(cfg.layer_types)) == (4, 4)  # the original is untouched
    assert [layers_to_run(40, k) for k in (0, 1, 20, 39, 40, -1, -2, -41)] == [1, 1, 20, 39, 40, 40, 39, 1]


# ---------------------------------------------------------------- random weights (benchmarks and tests only)

def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kw", [QWEN, LLAMA], ids=["qwen", "llama"])
def test_random_weights_deterministic_truncatable_and_perturbed(kw):
    from pitlab.evaluator.embed import truncated_config
    from pitlab.evaluator.random_weights import RandomWeights, build_random_model

    cfg = _config(kw)
    a = _state(build_random_model(cfg, RandomWeights(seed=3)))
    b = _state(build_random_model(cfg, RandomWeights(seed=3)))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = _state(build_random_model(cfg, RandomWeights(seed=4)))
    assert not any(torch.equal(a[k], c[k]) for k in a if k.endswith("q_proj.weight") or k.endswith("down_proj"))
    # a model cut to its first two layers has exactly the first two layers of the whole one
    cut = _state(build_random_model(truncated_config(cfg, 2), RandomWeights(seed=3)))
    assert set(cut) == {k for k in a if not k.startswith(("layers.2.", "layers.3."))}
    assert all(torch.equal(cut[k], a[k]) for k in cut)
    # buffers (rotary frequencies) as a normal construction makes them; weights at the config's init scale
    ref = transformers.AutoModel.from_config(cfg)
    for name, buf in ref.named_buffers():
        assert torch.equal(a[name], buf) if name in a else True
    rot = [n for n, _ in ref.named_buffers() if "inv_freq" in n]
    assert rot, "the test models have rotary buffers"
    emb = a["embed_tokens.weight"]
    assert abs(float(emb.std()) - cfg.initializer_range) < 0.1 * cfg.initializer_range
    # the perturbed twin: every weight matrix moved by perturb × initializer_range × N(0, 1), vectors untouched
    p = _state(build_random_model(cfg, RandomWeights(seed=3, perturb=0.5, perturb_seed=9)))
    moved = [k for k in a if not torch.equal(a[k], p[k])]
    assert moved and all(a[k].ndim >= 2 for k in moved)
    assert {k for k in a if a[k].ndim >= 2 and a[k].is_floating_point()} == set(moved)
    d = p["embed_tokens.weight"] - a["embed_tokens.weight"]
    assert abs(float(d.std()) - 0.5 * cfg.initializer_range) < 0.05 * cfg.initializer_range


def test_random_folder_embeds_like_the_same_weights_saved_as_a_checkpoint(tmp_path, tokenizer):
    """Only the weight source differs: a random-weights folder gives the embeddings of a checkpoint holding
    the same weights, its own digest per seed/perturbation, and a loud warning."""
    from pitlab.evaluator.embed import embed_texts, model_digest
    from pitlab.evaluator.random_weights import RandomWeights, build_random_model, write_random_model

    cfg = _config(QWEN)
    rw = RandomWeights(seed=5, perturb=0.1)
    rand = write_random_model(tmp_path / "rand", cfg, rw, tokenizer)
    assert sorted(p.name for p in rand.iterdir() if p.suffix in (".json", ".safetensors")) == [
        "config.json", "pitlab-random-weights.json", "tokenizer.json", "tokenizer_config.json"]
    saved = tmp_path / "saved"
    build_random_model(cfg, rw).save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    info: dict = {}
    with pytest.warns(UserWarning, match="benchmarks and tests only"):
        got = embed_texts(rand, TEXTS, kind="auto", layer=2, batch_size=4, info=info, cache_dir=tmp_path / "c")
    assert info["weights"] == "random(seed 5, perturb 0.1 (seed 1); benchmark only)" and info["layers_run"] == 2
    assert np.array_equal(got, embed_texts(saved, TEXTS, layer=2, batch_size=4))
    twin = write_random_model(tmp_path / "twin", cfg, RandomWeights(seed=5, perturb=0.2), tokenizer)
    assert len({model_digest(rand), model_digest(twin), model_digest(saved)}) == 3
    with pytest.warns(UserWarning, match="perturb 0.2"):
        assert not np.array_equal(got, embed_texts(twin, TEXTS, layer=2, batch_size=4))
    hit: dict = {}
    again = embed_texts(rand, TEXTS, layer=2, batch_size=4, info=hit, cache_dir=tmp_path / "c")
    assert hit["cache_hit"] is True and np.array_equal(again, got)


def test_random_weights_file_errors_name_the_file_and_field(tmp_path, tokenizer):
    from pitlab.evaluator.embed import EmbeddingError, embed_texts
    from pitlab.evaluator.random_weights import RandomWeights, write_random_model

    folder = write_random_model(tmp_path / "m", _config(LLAMA), RandomWeights(), tokenizer)
    marker = folder / "pitlab-random-weights.json"
    for body, msg in (({"seed": -1}, "seed must be an integer >= 0"), ({"seed": 1.5}, "seed must be an integer"),
                      ({"perturb": "x"}, "perturb must be a number >= 0"),
                      ({"sed": 1}, r"unknown field\(s\) \['sed'\]")):
        marker.write_text(json.dumps(body))
        with pytest.raises(EmbeddingError, match=f"pitlab-random-weights.json: {msg}"):
            embed_texts(folder, TEXTS[:1])
    marker.write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(EmbeddingError, match="also holds weight files"):
        embed_texts(folder, TEXTS[:1])
    with pytest.raises(FileExistsError, match="holds weight files"):
        write_random_model(folder, _config(LLAMA), RandomWeights())


def test_gpu_batch_budget_from_measured_memory():
    from pitlab.evaluator.embed import MAX_BATCH_TOKENS, batch_token_budget

    # 35B-A3B on an H200: ≈ 70 GB free after the weights; 50 KB of activations per token → capped at 65,536
    assert batch_token_budget(50_000, 70 * 2**30, 8192) == MAX_BATCH_TOKENS == 65_536
    # 2 GiB free at 100 KB per token: half of it → 10,737 tokens (then prompts per batch = budget // length)
    assert batch_token_budget(100_000, 2 * 2**30, 4096) == 10_737
    # less than the first batch needed: never below what already ran
    assert batch_token_budget(1_000_000, 2**30, 4096) == 4096


@pytest.mark.parametrize("arch,layer", [("qwen", 2), ("qwen", -1), ("llama", -1)])
def test_compiled_decoder_layers_embed_as_eager(checkpoints, arch, layer):
    """The GPU default (``embedding.compile``) wired on the CPU with torch.compile's ``aot_eager`` backend (the
    same aten ops, no inductor codegen): batches of two shapes (the second recompiles with dynamic shapes), the
    mid-stack hook of layer 2 included, give bit-identical embeddings to the eager layers."""
    from pitlab.evaluator.embed import _embed_batches, _tokenize
    from pitlab.evaluator.embed_model import _forward_fn, _load_model, compile_decoder_layers

    tok, ids, masks, lengths, _ = _tokenize(checkpoints[arch], TEXTS, 128)
    order = np.argsort(-lengths, kind="stable")
    outs = []
    for compiled in (False, True):
        torch._dynamo.reset()
        model, n_run, n_layers, _ = _load_model(checkpoints[arch], "causal", "float32", "cpu", layer)
        label = compile_decoder_layers(model, backend="aot_eager") if compiled else None
        out, batching = _embed_batches(_forward_fn(model, "causal", layer, n_layers), tok, ids, masks, lengths,
                                       order, "last", 4, "cpu", None)
        assert batching["n_batches"] == 2
        outs.append(out)
        if compiled:
            assert label == f"torch.compile per decoder layer ({n_run} layers)"
    assert np.array_equal(outs[0], outs[1])


def test_compiled_embeddings_have_their_own_gpu_cache_entries(tmp_path):
    """``compile`` changes the cache key off the CPU only (on the CPU the layers always run eagerly)."""
    from pitlab.evaluator.embed import _cache_path

    meta = {"kind": "causal", "pooling": "last", "layer": -1, "digest": "d", "device": "cpu"}
    assert _cache_path(tmp_path, meta, 128, "bfloat16", TEXTS, True) == _cache_path(tmp_path, meta, 128,
                                                                                     "bfloat16", TEXTS, False)
    gpu = dict(meta, device="cuda")
    eager, compiled = (_cache_path(tmp_path, gpu, 128, "bfloat16", TEXTS, c) for c in (False, True))
    assert eager != compiled and eager != _cache_path(tmp_path, meta, 128, "bfloat16", TEXTS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inductor's compiled layers on a GPU")
def test_compiled_gpu_embeddings_match_eager_within_float32_rounding(checkpoints):
    """On a GPU, ``compile=True`` (inductor) against ``compile=False`` for a dense model (no routing to flip):
    float32 embeddings within 1e-4 of the largest value (fused kernels reorder sums), the compiled path recorded
    in ``kernels``."""
    from pitlab.evaluator.embed import embed_texts

    got = {}
    for compiled in (False, True):
        info: dict = {}
        got[compiled] = embed_texts(checkpoints["llama"], TEXTS, kind="causal", batch_size=4, dtype="float32",
                                    info=info, compile=compiled)
        assert ("decoder_layers" in info["kernels"]) is compiled
    assert np.abs(got[True] - got[False]).max() <= 1e-4 * np.abs(got[False]).max()


def test_failed_compilation_falls_back_to_the_eager_layers(checkpoints, tmp_path):
    """A backend that cannot compile (as inductor without a working compiler): the batch runs again with the
    eager layers, bit-identical to never compiling, with a warning naming the folder and the fallback recorded."""
    from pitlab.evaluator.embed import _embed_batches, _tokenize
    from pitlab.evaluator.embed_model import _forward_fn, _load_model, compile_decoder_layers, eager_if_compile_fails

    def broken(gm, example_inputs):
        raise RuntimeError("no C compiler")

    folder = checkpoints["qwen"]
    tok, ids, masks, lengths, _ = _tokenize(folder, TEXTS, 128)
    order = np.argsort(-lengths, kind="stable")
    torch._dynamo.reset()
    model, _, n_layers, _ = _load_model(folder, "causal", "float32", "cpu", -1)
    eager, _ = _embed_batches(_forward_fn(model, "causal", -1, n_layers), tok, ids, masks, lengths, order, "last",
                              4, "cpu", None)
    meta = {"kernels": {"decoder_layers": compile_decoder_layers(model, backend=broken)}}
    forward = eager_if_compile_fails(_forward_fn(model, "causal", -1, n_layers), model, folder, meta)
    with pytest.warns(UserWarning, match=rf"{folder}: torch.compile of the decoder layers failed \("
                                         r"BackendCompilerFailed from RuntimeError: no C compiler\); embedding "
                                         r"with the eager layers"):
        got, _ = _embed_batches(forward, tok, ids, masks, lengths, order, "last", 4, "cpu", None)
    assert np.array_equal(got, eager)
    assert meta == {"kernels": {"decoder_layers": "eager (torch.compile failed: BackendCompilerFailed)"},
                    "compile_failed": True}
    assert all("forward" not in layer.__dict__ for layer in model.layers)


def test_embeddings_after_a_failed_compilation_are_not_cached(checkpoints, tmp_path, monkeypatch):
    """Eager embeddings from the compiled path's fallback never land under a cache key: nothing is written."""
    import pitlab.evaluator.embed as embed

    def fell_back(*args):
        args[-2]["compile_failed"] = True  # meta, as eager_if_compile_fails leaves it
        return np.ones((len(TEXTS), 64), dtype=np.float32)

    monkeypatch.setattr(embed, "_embed_uncached", fell_back)
    monkeypatch.setattr(embed, "_log_embedded", lambda *a: None)
    info: dict = {}
    out = embed.embed_texts(checkpoints["llama"], TEXTS, cache_dir=tmp_path / "c", info=info)
    assert out.shape == (len(TEXTS), 64) and info["compile_failed"] is True
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())


def test_cpu_embedding_does_not_advise_installing_gpu_kernels(checkpoints):
    """Found in a trial: the demo's CPU embedding printed transformers' advice to install causal_conv1d and
    flash-linear-attention (GPU kernels). On the CPU that logger is quietened to errors; pitlab's own kernel
    report says what ran."""
    import logging

    from pitlab.evaluator.embed_model import _load_model

    hub = logging.getLogger("transformers.integrations.hub_kernels")
    before = hub.level
    try:
        hub.setLevel(logging.NOTSET)
        _load_model(checkpoints["qwen"], "causal", "float32", "cpu", -1)
        assert hub.getEffectiveLevel() == logging.ERROR
    finally:
        hub.setLevel(before)
