"""The output folder's layout: safetensors shards in Hugging Face's names, grouped by size, and their index."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from pitlab.api import layout as run_layout
from pitlab.trainer.files import write_json_atomic
from pitlab.trainer.merge.errors import MergeError

REPORT = run_layout.MERGE_REPORT
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DEFAULT_MAX_SHARD_SIZE = 5 * 10 ** 9  # bytes ("5GB", as Hugging Face counts it)
_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}


def parse_size(text: str | int) -> int:
    """Bytes from ``5GB``, ``500MB``, ``2GiB``, ``123`` (decimal units as Hugging Face uses them; KiB/MiB/GiB
    binary). Raises ``ValueError`` naming ``--max-shard-size`` for anything else or a size < 1 byte."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
        if not m or m.group(2) not in _UNITS:
            raise ValueError(f"--max-shard-size: {text!r} is not a size like 5GB, 500MB or 2GiB")
        value = int(float(m.group(1)) * _UNITS[m.group(2)])
    if value < 1:
        raise ValueError(f"--max-shard-size: must be at least 1 byte (got {text!r})")
    return value


def natural_key(name: str) -> list:
    """Sort key that orders ``layers.2`` before ``layers.10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def plan_groups(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Split tensor names (natural order) into consecutive groups of at most ``max_bytes`` bytes each (``sizes``
    in bytes); a tensor larger than ``max_bytes`` forms a group of its own. Returns the groups in order."""
    groups: list[list[str]] = []
    current, used = [], 0
    for name in sorted(sizes, key=natural_key):
        if current and used + sizes[name] > max_bytes:
            groups.append(current)
            current, used = [], 0
        current.append(name)
        used += sizes[name]
    if current:
        groups.append(current)
    return groups


def shard_file_names(n: int) -> list[str]:
    """``model.safetensors`` for one shard, else ``model-0000i-of-0000n.safetensors`` (Hugging Face's names)."""
    return [SINGLE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def write_index(tmp: Path, weight_map: dict[str, str], total: int, n_files: int,
                 expected: dict[str, tuple]) -> None:
    """Check the written names against the expected Hugging Face names, then (for several shards) write
    ``model.safetensors.index.json`` in Hugging Face's layout."""
    missing, extra = sorted(expected.keys() - weight_map.keys()), sorted(weight_map.keys() - expected.keys())
    if missing or extra:
        raise MergeError(f"{tmp}: written tensors differ from the expected Hugging Face names: {len(missing)} "
                         f"missing {missing[:5]}, {len(extra)} unexpected {extra[:5]}")
    if n_files > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {k: weight_map[k] for k in sorted(weight_map, key=natural_key)}}
        write_json_atomic(tmp / INDEX, index)


def copy_generation_config(base_dir: Path, tmp: Path) -> None:
    """Copy ``generation_config.json`` of ``base_dir`` into ``tmp`` when the base has one."""
    src = base_dir / "generation_config.json"
    if src.is_file():
        shutil.copyfile(src, tmp / src.name)
