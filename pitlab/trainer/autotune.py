"""Triton autotuning results shipped with pitlab (:data:`SEEDS`), copied into Triton's cache before the first
fla kernel runs, so that a machine of a known GPU type compiles the chosen candidate of each kernel instead of
compiling and timing every candidate. A file whose key (Triton version, GPU target, kernel source, environment,
tuning key, candidates) does not match is never read. Why and what it saves: docs/evaluation-at-scale.md,
"Compiling and autotuning".
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

SEEDS = Path(__file__).with_name("autotune_seeds")
"""The shipped results: ``<key dir>/<kernel>.autotune.json``, as Triton writes them."""
ENV = "PITLAB_AUTOTUNE_SEEDS"
"""A folder of results to seed from instead of :data:`SEEDS`; ``0`` or ``off`` seeds nothing."""
SUFFIX = ".autotune.json"


def triton_cache_dir() -> Path:
    """Triton's cache folder: ``TRITON_CACHE_DIR``, else ``$TRITON_HOME/.triton/cache`` (home by default), as
    ``triton.knobs.cache.dir`` resolves it."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return Path(os.environ["TRITON_CACHE_DIR"])
    return Path(os.environ.get("TRITON_HOME") or os.path.expanduser("~")) / ".triton" / "cache"


def pin_triton_cache_dir() -> Path:
    """Set ``TRITON_CACHE_DIR`` to :func:`triton_cache_dir` where it is unset; returns the folder. Without it,
    torch's inductor sets the variable to its own ``<inductor cache>/triton/<device>`` when it builds its first
    kernel, and from then on every Triton kernel of the process (fla's, Liger's) reads and writes its autotuning
    results there: results seeded into, or tuned before that in, Triton's default folder are not read again."""
    folder = triton_cache_dir()
    os.environ.setdefault("TRITON_CACHE_DIR", str(folder))
    return folder


def seed_source() -> Path | None:
    """The folder :func:`seed_autotune_cache` copies from by default (:data:`ENV`, else :data:`SEEDS`); None when
    seeding is turned off."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in ("0", "off", "false", "no"):
        return None
    return Path(value) if value else SEEDS


def seed_autotune_cache(seeds: Path | None = None, cache_dir: Path | None = None) -> int:
    """Copy every ``<key dir>/<kernel>.autotune.json`` of ``seeds`` (default :func:`seed_source`) into
    ``cache_dir`` (default: Triton's folder, pinned for the process by :func:`pin_triton_cache_dir`) where the
    cache lacks it; files the cache has are left as they are. Each file is written under a temporary name and
    renamed, so a concurrent reader never sees half of one. Returns the number of files copied (0 when seeding is
    off or ``seeds`` does not exist). An unwritable cache folder is logged and skipped: Triton then tunes as it
    would without seeds."""
    cache_dir = pin_triton_cache_dir() if cache_dir is None else cache_dir
    seeds = seed_source() if seeds is None else seeds
    if seeds is None or not seeds.is_dir():
        return 0
    copied = 0
    for src in sorted(seeds.glob(f"*/*{SUFFIX}")):
        dst = cache_dir / src.parent.name / src.name
        if dst.exists():
            continue
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        except OSError as err:
            log.warning("autotune seeds: cannot write %s (%s); Triton will tune that kernel itself", dst, err)
            continue
        copied += 1
    if copied:
        log.info("autotune seeds: %d Triton autotuning result(s) copied from %s into %s", copied, seeds, cache_dir)
    return copied


def export_autotune_results(cache_dir: Path, out: Path) -> int:
    """Copy every ``<key dir>/<kernel>.autotune.json`` of the Triton cache ``cache_dir`` into ``out`` (same
    layout), to be shipped as seeds; returns the number of files copied."""
    n = 0
    for src in sorted(Path(cache_dir).glob(f"*/*{SUFFIX}")):
        dst = Path(out) / src.parent.name / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        n += 1
    return n
