"""Python's garbage collection during the step loop (docs/training.md, "Garbage collection"): :class:`SteadyGC`
collects everything once, freezes the survivors (``gc.freeze``) and turns automatic collection off;
:meth:`SteadyGC.after_launch` collects the young generations after each step's launch, while the device runs that
step, and every generation every :data:`FULL_EVERY_STEPS` steps (the frozen objects are not walked). On exit the
objects are unfrozen and automatic collection is on again. ``PITLAB_GC=python`` (:mod:`pitlab.trainer.knobs`)
leaves Python's own collection as it is.
"""

from __future__ import annotations

import gc

from pitlab.trainer.knobs import gc_mode

FULL_EVERY_STEPS = 50
"""Steps between two collections of every generation (the young ones are collected after every step)."""


class SteadyGC:
    """Context manager of the step loop's collections (module docstring). ``active``: whether it manages them
    (False under ``PITLAB_GC=python`` in ``env``, default ``os.environ``, or when automatic collection was already
    off on entry, which it then leaves as it was); ``collections``: how many :meth:`after_launch` made."""

    def __init__(self, env: dict | None = None):
        self.active = gc_mode(env) == "pitlab"
        self.collections = 0

    def __enter__(self) -> SteadyGC:
        self.active = self.active and gc.isenabled()
        if self.active:
            gc.collect()
            gc.freeze()
            gc.disable()
        return self

    def after_launch(self) -> None:
        """Call once per step, right after launching it: collect the young generations, and every generation
        every :data:`FULL_EVERY_STEPS` calls."""
        if not self.active:
            return
        self.collections += 1
        gc.collect(2 if self.collections % FULL_EVERY_STEPS == 0 else 1)

    def __exit__(self, *exc) -> None:
        if self.active:
            gc.unfreeze()
            gc.enable()
