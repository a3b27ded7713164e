"""The merge's errors: :class:`MergeError` (the merge or its verification failed: exit code 1) and
:class:`MergeInputError` (an input is not what it must be: exit code 2)."""

from __future__ import annotations


class MergeError(RuntimeError):
    """The merged model could not be written or does not match the checkpoint / training summary."""


class MergeInputError(MergeError):
    """An input of the merge is not what it must be (no checkpoint, no config.json, an unreadable summary):
    bad input, exit code 2."""
