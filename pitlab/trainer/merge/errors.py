"""The merge's errors, on the taxonomy of :mod:`pitlab.errors`: :class:`MergeError` (the merge or its verification
failed: exit code 1) and :class:`MergeInputError` (an input is not what it must be: exit code 2)."""

from __future__ import annotations

from pitlab.errors import InputError, MergeError  # noqa: F401  (MergeError re-exported)


class MergeInputError(InputError, ValueError):
    """An input of the merge is not what it must be (no checkpoint, no config.json, an unreadable summary):
    bad input, exit code 2, reason ``InvalidSpec``."""
