"""Offline merge: a DCP training checkpoint → a verified Hugging Face model directory.

A separate single process with no process group (so no collective watchdog can kill it)::

    python -m pitlab.trainer.merge --checkpoint CKPT_DIR --base BASE_DIR --out MODEL_DIR [--summary SUMMARY]

The output appears at ``MODEL_DIR`` only after verification passed: it is written to ``MODEL_DIR.tmp``,
reloaded with ``from_pretrained`` and compared with the checkpoint-loaded model (probe logits bit-equal,
every parameter's sha256 equal, and equal to the training summary's ``param_sha256`` when given), then
renamed. On any mismatch the ``.tmp`` is deleted and :class:`MergeError` is raised.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from pitlab.trainer.checkpoint import LATEST, latest_checkpoint
from pitlab.trainer.digest import parameter_sha256
from pitlab.trainer.files import fsync_dir, make_readable, write_json_atomic

REPORT = "merge_report.json"
PROBE_SEED = 0
PROBE_SHAPE = (3, 24)  # (sequences, tokens) of the logits probe
MAX_SHARD_SIZE = "2GB"


class MergeError(RuntimeError):
    """The merged model could not be written or does not match the checkpoint / training summary."""


def resolve_checkpoint(path: Path) -> Path:
    """A DCP checkpoint directory: ``path`` itself, or the one ``path/latest`` names when ``path`` is the
    checkpoint root. Raises :class:`MergeError` naming the path if it holds no complete checkpoint."""
    path = Path(path)
    if (path / LATEST).is_file():
        found = latest_checkpoint(path)
        if found is not None:
            return found
    if path.name.endswith(".tmp"):
        raise MergeError(f"{path}: is an incomplete checkpoint (.tmp); merge a complete step-<N> directory")
    if not (path / ".metadata").is_file():
        raise MergeError(f"{path}: not a complete DCP checkpoint (no .metadata and no 'latest' pointer)")
    return path


def load_checkpoint_model(checkpoint_dir: Path, base_dir: Path) -> torch.nn.Module:
    """The causal LM of ``base_dir``'s config (CPU, float32, eval mode) with the model weights of a DCP
    checkpoint loaded in this process (no process group). Raises :class:`MergeError` when the checkpoint's
    model keys differ from the architecture's state dict keys (missing or extra tensors)."""
    config = AutoConfig.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = model.state_dict()
    metadata = dcp.FileSystemReader(str(checkpoint_dir)).read_metadata()
    saved = {k[len("model."):] for k in metadata.state_dict_metadata if k.startswith("model.")}
    missing, extra = sorted(set(state) - saved), sorted(saved - set(state))
    if missing or extra:
        raise MergeError(f"{checkpoint_dir}: model tensors do not match {base_dir}'s architecture "
                         f"(missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''})")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
        dcp.load({"model": state}, checkpoint_id=checkpoint_dir, no_dist=True)
    model.load_state_dict(state)  # DCP loads in place; this also covers tied or replaced entries
    model.eval()
    return model


def probe_logits(model: torch.nn.Module) -> torch.Tensor:
    """Logits (float32, shape ``(3, 24, vocab)``) of a fixed pseudo-random batch of token ids."""
    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(PROBE_SEED)
    ids = torch.randint(0, vocab, PROBE_SHAPE, generator=gen)
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def merge_checkpoint(checkpoint_dir: Path, base_dir: Path, out_dir: Path,
                     expected_sha256: dict[str, str] | None = None) -> dict:
    """Write the checkpoint's model as a Hugging Face directory at ``out_dir`` and verify it.

    ``checkpoint_dir``: a ``step-<N>`` DCP directory or the checkpoint root holding ``latest``.
    ``base_dir``: the HF directory training started from (config and tokenizer are taken from it).
    ``expected_sha256``: ``{parameter name: sha256}`` from the training summary, checked when given.
    Writes safetensors (sharded with an index above 2 GB) + config + tokenizer + ``merge_report.json``.
    Returns the report: ``checkpoint``, ``out``, ``tensors`` (count in the safetensors files), ``bytes``
    (size of the safetensors files), ``parameters``, ``seconds``, ``bytes_per_second``, ``verified``
    (always True: a failed check raises). An existing ``out_dir`` is replaced only after verification.
    Raises :class:`MergeError` for any mismatch or missing input (no complete-looking ``out_dir`` left).
    """
    t0 = time.perf_counter()
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    if not (base_dir / "config.json").is_file():
        raise MergeError(f"{base_dir}: base model directory has no config.json")
    ckpt = resolve_checkpoint(checkpoint_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model = load_checkpoint_model(ckpt, base_dir)
        digests = parameter_sha256(model)
        if expected_sha256 is not None:
            _compare_digests(digests, expected_sha256, "the training summary's param_sha256",
                             f"checkpoint {ckpt}")
        expected_logits = probe_logits(model)
        try:
            tokenizer = AutoTokenizer.from_pretrained(base_dir)
        except (OSError, ValueError) as err:
            raise MergeError(f"{base_dir}: no loadable tokenizer to ship with the model: {err}") from None
        model.save_pretrained(tmp, safe_serialization=True, max_shard_size=MAX_SHARD_SIZE)
        tokenizer.save_pretrained(tmp)
        make_readable(tmp)
        del model

        reloaded, info = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, output_loading_info=True)
        problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        if problems:
            raise MergeError(f"{tmp}: reloading the written model reported {problems}")
        reloaded.eval()
        _compare_digests(parameter_sha256(reloaded), digests, f"checkpoint {ckpt}", f"written model {tmp}")
        got_logits = probe_logits(reloaded)
        if not torch.equal(got_logits, expected_logits):
            diff = (got_logits - expected_logits).abs().max().item()
            raise MergeError(f"{tmp}: probe logits differ from the checkpoint-loaded model (max |diff| {diff:g})")
        tensors, nbytes = _safetensors_stats(tmp)
        seconds = time.perf_counter() - t0
        report = {
            "checkpoint": str(ckpt), "base": str(base_dir), "out": str(out_dir),
            "tensors": tensors, "bytes": nbytes, "parameters": len(digests),
            "seconds": seconds, "bytes_per_second": nbytes / seconds if seconds > 0 else None,
            "probe_shape": list(PROBE_SHAPE), "summary_digests_checked": expected_sha256 is not None,
            "verified": True,
        }
        write_json_atomic(tmp / REPORT, report)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def _compare_digests(got: dict[str, str], want: dict[str, str], want_name: str, got_name: str) -> None:
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    differ = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    if missing or extra or differ:
        raise MergeError(f"{got_name}: parameters do not match {want_name}: {len(differ)} differ {differ[:5]}, "
                         f"{len(missing)} missing {missing[:5]}, {len(extra)} unexpected {extra[:5]}")


def _safetensors_stats(model_dir: Path) -> tuple[int, int]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise MergeError(f"{model_dir}: no .safetensors file was written")
    tensors = 0
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            tensors += len(list(st.keys()))
    return tensors, sum(f.stat().st_size for f in files)


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; an existing ``dst`` is moved aside first and deleted afterwards."""
    old = dst.with_name(dst.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    fsync_dir(dst.parent)
    shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pitlab.trainer.merge", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, type=Path, help="step-<N> DCP dir or the checkpoint root")
    parser.add_argument("--base", required=True, type=Path, help="base HF model directory (config, tokenizer)")
    parser.add_argument("--out", required=True, type=Path, help="output HF model directory")
    parser.add_argument("--summary", type=Path, default=None,
                        help="training summary.json whose param_sha256 the merged weights must match")
    args = parser.parse_args(argv)
    expected = None
    try:
        if args.summary is not None:
            try:
                expected = json.loads(args.summary.read_text())["param_sha256"]
            except (OSError, ValueError, KeyError) as err:
                raise MergeError(f"{args.summary}: cannot read param_sha256: {err!r}") from None
        report = merge_checkpoint(args.checkpoint, args.base, args.out, expected)
    except MergeError as err:
        print(f"pitlab.trainer.merge: error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
