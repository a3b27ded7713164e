"""pitlab.trainer.host_store: the memory-mapped host store of layer streaming (hostStore: mmap) is bit-exact against
the resident model and the in-memory store, `auto` falls back to it (with a warning) when MemAvailable is too small,
an interrupted or stale store is never reused, and a complete matching one is reused without a rewrite."""

from __future__ import annotations

import functools

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from pitlab.api import PitTraining
from pitlab.trainer.host_store import STORE_FILE
from pitlab.trainer.loading import load_sharded_model
from pitlab.trainer.lora import lora_record
from pitlab.trainer.plan_streaming import StreamingBudgetError
from pitlab.trainer.prepare import build_config
from pitlab.trainer.streaming import load_streamed_model, streamed_loss
from test_streaming import CONFIGS, VOCAB, batch, streaming_doc

CPU = torch.device("cpu")


def save_base(path, model_type: str = "llama", seed: int = 3):
    config = build_config(model_type, CONFIGS[model_type], vocab_size=VOCAB)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def spec_of(base, **streaming):
    return PitTraining.model_validate(streaming_doc(base, **streaming)).spec


def randomize_adapter(model) -> None:
    """Every adapter tensor non-zero (lora_B starts at zero), the same values in every model."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _, p in sorted((n, p) for n, p in model.named_parameters() if p.requires_grad):
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def logits(model, ids):
    model.train()
    return model(input_ids=ids).logits


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_mmap_store_is_bit_exact_against_the_resident_model_and_the_memory_store(model_type, tmp_path):
    base = save_base(tmp_path / "base", model_type)
    spec = spec_of(base, hostStore="mmap")
    resident = load_sharded_model(base, None, "bf16", CPU, lora=lora_record(spec.lora), seed=0)
    memory, _ = load_streamed_model(base, spec_of(base, hostStore="memory"), CPU, store_dir=tmp_path / "unused")
    mapped, streamer = load_streamed_model(base, spec, CPU, store_dir=tmp_path / "store")
    assert not (tmp_path / "unused").exists()  # the memory store writes no file
    report = streamer.report()
    path = tmp_path / "store" / STORE_FILE
    assert report["host_store"] == "mmap" and report["pinned"] is False and report["host_store_written"] is True
    assert report["host_store_path"] == str(path) and report["host_store_file_bytes"] == path.stat().st_size
    # every region starts on a page; the file holds the header page plus the data, nothing more
    assert report["host_store_file_bytes"] >= report["host_bytes"] and path.stat().st_size % 4096 == 0
    # the frozen decoder-layer weights and the input embedding live in the file's mapping, not in fresh memory
    raw = streamer.store.raw.untyped_storage().data_ptr()
    hosts = [t for flat in streamer.host for t in flat.values()] + [streamer.embedding.weight]
    assert all(t.untyped_storage().data_ptr() == raw for t in hosts)
    models = [resident, memory, mapped]
    for m in models:
        randomize_adapter(m)
    ids, labels = batch()
    got = [logits(m, ids) for m in models]
    assert torch.equal(got[2], got[0]) and torch.equal(got[1], got[0])
    losses = [streamed_loss(m, ids, labels) for m in models]
    assert torch.equal(losses[2], losses[0]) and torch.equal(losses[1], losses[0])
    for loss in losses:
        loss.backward()
    grads = [{n: p.grad for n, p in m.named_parameters() if p.requires_grad} for m in models]
    assert len(grads[0]) >= 8 and all(g.abs().sum() > 0 for g in grads[0].values())
    assert grads[2].keys() == grads[0].keys()
    assert [n for n in grads[0] if not torch.equal(grads[2][n], grads[0][n])] == []
    assert [n for n in grads[0] if not torch.equal(grads[1][n], grads[0][n])] == []
    for m in models:  # one AdamW step: the same adapter afterwards
        torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2).step()
    after = dict(resident.named_parameters())
    assert all(torch.equal(p, after[n]) for n, p in mapped.named_parameters() if p.requires_grad)
    # the frozen base through the mapping equals the resident one, name for name
    sd_r, sd_m = resident.state_dict(), mapped.state_dict()
    assert list(sd_m) == list(sd_r) and all(torch.equal(sd_m[k], sd_r[k]) for k in sd_r)


def test_auto_uses_the_memory_store_when_it_fits_and_mmap_with_a_warning_when_not(tmp_path, monkeypatch, capsys):
    import pitlab.trainer.plan_streaming as ps

    base = save_base(tmp_path / "base")
    spec = spec_of(base)  # hostStore defaults to auto
    assert spec.training.layer_streaming.host_store == "auto"
    monkeypatch.setattr(ps, "available_host_memory", lambda: 10 ** 12)
    _, streamer = load_streamed_model(base, spec, CPU, store_dir=tmp_path / "store")
    assert streamer.report()["host_store"] == "memory" and not (tmp_path / "store").exists()
    assert "WARNING" not in capsys.readouterr().err
    host = streamer.host_bytes  # 330,240 bytes: the 4 layers' and the embedding's bf16 weights
    monkeypatch.setattr(ps, "available_host_memory", lambda: 300_000)  # MemAvailable smaller than the store
    _, streamer = load_streamed_model(base, spec, CPU, store_dir=tmp_path / "store")
    r = streamer.report()
    assert r["host_store"] == "mmap" and r["host_store_written"] is True and r["host_bytes"] == host
    err = " ".join(capsys.readouterr().err.split())
    assert (f"WARNING: training.layerStreaming: the host store needs {host / 1e9:.1f} GB of host memory (plus 10 % "
            "while loading) but 0.0 GB are available (MemAvailable); hostStore: auto uses a memory-mapped store "
            f"file ({tmp_path / 'store'}/layers.store) instead; copies from a memory-mapped store are "
            "synchronous") in err
    assert "1.3 GB/s cold from disk and 4.5 GB/s from the page cache" in err and "55 GB/s pinned host→GPU" in err
    assert f"host store memory-mapped from {tmp_path / 'store' / STORE_FILE} (0.3 MB, written in " in err
    assert "not pinned (pinHost does not apply to a memory-mapped store)" in err
    # hostStore: memory refuses instead, naming the bytes, MemAvailable and the setting to change
    with pytest.raises(StreamingBudgetError, match=r"the host store needs 0\.0 GB of host memory .* but 0\.0 GB are "
                                                   r"available \(MemAvailable\); set training\.layerStreaming\."
                                                   r"hostStore: mmap \(or auto\)"):
        load_streamed_model(base, spec_of(base, hostStore="memory"), CPU, store_dir=tmp_path / "store")


def test_plan_panel_warns_when_auto_falls_back_to_mmap(tmp_path, monkeypatch):
    import pitlab.trainer.plan_streaming as ps
    from pitlab.cli import app

    path = tmp_path / "stream.yaml"
    path.write_text(yaml.safe_dump(streaming_doc(save_base(tmp_path / "base"))))
    monkeypatch.setattr(ps, "available_host_memory", lambda: 10 ** 12)
    res = CliRunner().invoke(app, ["plan", str(path)], env={"COLUMNS": "300"})
    assert res.exit_code == 0 and "host store: in memory (hostStore: auto; 1000.0 GB available here" in res.output
    monkeypatch.setattr(ps, "available_host_memory", lambda: 300_000)
    res = CliRunner().invoke(app, ["plan", str(path)], env={"COLUMNS": "300"})
    out = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert "WARNING: training.layerStreaming: the host store needs 0.0 GB of host memory" in out
    assert "hostStore: auto uses a memory-mapped store file instead" in out and "pinHost does not apply" in out


def test_an_interrupted_or_stale_store_is_never_reused(tmp_path, monkeypatch):
    import pitlab.trainer.loading as loading

    base = save_base(tmp_path / "base")
    spec = spec_of(base, hostStore="mmap")
    store = tmp_path / "store"
    # a write that dies after the first layer leaves only the .tmp file, nothing that looks complete
    real, calls = loading.load_tensors, []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise Killed("killed while writing the store")
        return real(*args, **kwargs)

    monkeypatch.setattr(loading, "load_tensors", dying)
    with pytest.raises(Killed):
        load_streamed_model(base, spec, CPU, store_dir=store)
    monkeypatch.setattr(loading, "load_tensors", real)
    assert sorted(p.name for p in store.iterdir()) == [STORE_FILE + ".tmp"]
    # the next run does not reuse the partial file: it writes the store anew and removes the .tmp
    ids, _ = batch(2)
    model, streamer = load_streamed_model(base, spec, CPU, store_dir=store)
    assert streamer.report()["host_store_written"] is True
    assert sorted(p.name for p in store.iterdir()) == [STORE_FILE]
    want = logits(model, ids)
    # a truncated store (the size does not match its header) is rewritten too
    good = (store / STORE_FILE).read_bytes()
    (store / STORE_FILE).write_bytes(good[:-4096])
    _, streamer = load_streamed_model(base, spec, CPU, store_dir=store)
    assert streamer.report()["host_store_written"] is True and (store / STORE_FILE).read_bytes() == good
    # another base model in the same folder (other weights): the fingerprint differs, the store is rewritten
    save_base(tmp_path / "base", seed=4)
    model, streamer = load_streamed_model(base, spec, CPU, store_dir=store)
    assert streamer.report()["host_store_written"] is True and (store / STORE_FILE).read_bytes() != good
    assert not torch.equal(logits(model, ids), want)
    # another layout (LoRA on other modules: other frozen parameter names): rewritten
    doc = streaming_doc(base, hostStore="mmap")
    doc["spec"]["lora"]["targetModules"] = ["q_proj"]
    _, streamer = load_streamed_model(base, PitTraining.model_validate(doc).spec, CPU, store_dir=store)
    assert streamer.report()["host_store_written"] is True


def test_a_complete_matching_store_is_reused_without_a_rewrite(tmp_path, monkeypatch):
    import pitlab.trainer.host_store as hs

    import pitlab.trainer.loading as loading

    base = save_base(tmp_path / "base", "qwen3_moe")
    spec = spec_of(base, hostStore="mmap")
    store = tmp_path / "store" / STORE_FILE

    def whole_model(*args, **kwargs):
        raise AssertionError("the mmap path loaded the whole model into memory")

    monkeypatch.setattr(loading, "load_sharded_model", whole_model)  # the layer-by-layer path only
    first, s1 = load_streamed_model(base, spec, CPU, store_dir=store.parent)
    assert s1.report()["host_store_written"] is True
    before, stat = store.read_bytes(), store.stat()
    writes = []
    monkeypatch.setattr(hs.torch, "from_file", functools.partial(_from_file, writes))
    second, s2 = load_streamed_model(base, spec, CPU, store_dir=store.parent)
    r = s2.report()
    assert r["host_store_written"] is False and r["host_store_write_seconds"] == 0.0
    assert writes == [False]  # one read-only (private) mapping, no shared mapping to write through
    after = store.stat()
    assert (after.st_mtime_ns, after.st_ino) == (stat.st_mtime_ns, stat.st_ino) and store.read_bytes() == before
    ids, _ = batch(3)
    for m in (first, second):
        randomize_adapter(m)
    assert torch.equal(logits(second, ids), logits(first, ids))


class Killed(Exception):
    pass


_REAL_FROM_FILE = torch.from_file


def _from_file(log, *args, **kwargs):
    log.append(kwargs.get("shared"))
    return _REAL_FROM_FILE(*args, **kwargs)


def test_the_embedding_is_read_in_blocks_of_rows(tmp_path):
    """The host embedding goes into the store a few rows at a time (a float32 checkpoint converted to bf16 never
    holds the whole matrix); the blocks give the tensor bit for bit, and a misshapen target is refused."""
    from safetensors import safe_open

    from pitlab.trainer.loading import WeightLoadError
    from pitlab.trainer.streaming import _read_rows_in_blocks

    base = save_base(tmp_path / "base")
    with safe_open(str(base / "model.safetensors"), framework="pt") as f:
        want = f.get_tensor("model.embed_tokens.weight")
    assert want.dtype == torch.float32 and want.shape == (VOCAB, 64)
    out = torch.empty(want.shape, dtype=torch.bfloat16)
    _read_rows_in_blocks(base, "model.embed_tokens.weight", out, block_bytes=1000)  # 3 rows of 256 bytes a block
    assert torch.equal(out, want.to(torch.bfloat16))
    with pytest.raises(WeightLoadError, match=r"model\.embed_tokens\.weight has shape \(256, 64\), the model built "
                                              r"from .* expects \(255, 64\)"):
        _read_rows_in_blocks(base, "model.embed_tokens.weight", out[:-1])
