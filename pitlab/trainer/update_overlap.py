"""The single-device path's optimizer update on a CUDA side stream, overlapping the next step's forward.

The fused clip + AdamW + cast (:meth:`pitlab.trainer.fused_step.MasterAdamW.clip_step_cast`) is memory-bound
(about 30 bytes per parameter); the forward is mostly compute-bound. With ``PITLAB_UPDATE_OVERLAP=forward`` the
gradient norm is computed on the main stream, then the updates are issued group by group (a decoder layer, or
one parameter outside the layers) on a side stream, each followed by an event; the next step's forward waits
only for what it is about to use: the groups outside the decoder layers before it starts (the embedding), decoder
layer ``i``'s group in a pre-hook of layer ``i``, the final norm's and the LM head's groups in a pre-hook of the
final norm. The arithmetic and its order per parameter are unchanged, so the values are those of the sequential
step bit for bit (tests/test_update_overlap.py). :meth:`UpdateOverlap.settle` makes the main stream wait for
every issued update: the trainer calls it before anything else reads the master weights or the optimizer state
(a checkpoint, the end of training).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

HEAD, TAIL = -1, -2
"""Slots of :func:`run_slots` besides a decoder layer's index: needed before the forward starts, or by the
final norm and what follows it."""


def _prefixes(model: nn.Module, modules: list[nn.Module]) -> list[str]:
    """The ``named_modules`` names of ``modules`` in ``model`` (each followed by a dot), in their order."""
    names = {id(m): n for n, m in model.named_modules()}
    return [names[id(m)] + "." for m in modules if id(m) in names]


def run_slots(names: list[str], runs: list[tuple[int, int]], layer_prefixes: list[str],
              tail_prefixes: list[str]) -> list[int]:
    """For each run ``[a, b)`` of the parameter names ``names`` (the optimizer's order): the decoder layer index
    whose forward first uses it (every name under ``layer_prefixes[i]``), :data:`TAIL` (every name under one of
    ``tail_prefixes``: the final norm and the LM head) or :data:`HEAD` (anything else, or a run that mixes
    slots: the forward waits for it before it starts)."""
    def slot(name: str) -> int:
        for i, p in enumerate(layer_prefixes):
            if name.startswith(p):
                return i
        return TAIL if any(name.startswith(p) for p in tail_prefixes) else HEAD

    out = []
    for a, b in runs:
        found = {slot(n) for n in names[a:b]}
        out.append(found.pop() if len(found) == 1 else HEAD)
    return out


class UpdateOverlap:
    """The side stream, the events of the last issued update and the forward pre-hooks that wait for them.

    ``master``: the float32 model (parameter names in the optimizer's order: ``names``); ``compute``: the bf16
    copy the forward runs on (same structure); ``runs``: the optimizer's groups
    (:attr:`pitlab.trainer.fused_step.MasterAdamW.runs`); ``device``: a CUDA device. Raises ``TypeError`` (from
    :func:`pitlab.trainer.fsdp.decoder_layers`) for a model without decoder layers."""

    def __init__(self, master: nn.Module, compute: nn.Module, names: list[str], runs: list[tuple[int, int]],
                 device: torch.device):
        from pitlab.trainer.fsdp import decoder_layers

        self.stream = torch.cuda.Stream(device)
        # forward and backward on a stream of higher priority than the update's: the block scheduler dispatches
        # their kernels first, and the update's blocks fill what they leave free
        self.compute_stream = torch.cuda.Stream(device, priority=-1)
        inner = master.get_base_model() if hasattr(master, "get_base_model") else master
        tail = [m for m in (getattr(inner.model, "norm", None), master.get_output_embeddings()) if m is not None]
        self.slots = run_slots(names, runs, _prefixes(master, list(decoder_layers(master))),
                               _prefixes(master, tail))
        self._start = {a: k for k, (a, _b) in enumerate(runs)}
        self._waits: dict[int, list] = {}
        self._hooks = [layer.register_forward_pre_hook(self._waiter(i))
                       for i, layer in enumerate(decoder_layers(compute))]
        final_norm = getattr(getattr(compute, "model", None), "norm", None)
        if final_norm is not None and len(tail) == 2:
            self._hooks.append(final_norm.register_forward_pre_hook(self._waiter(TAIL)))
        else:  # no final norm to wait at: its groups are waited for before the forward
            self.slots = [HEAD if s == TAIL else s for s in self.slots]

    @contextlib.contextmanager
    def computing(self):
        """Forward and backward inside: on :attr:`compute_stream` (high priority), after what the current stream
        has queued (the batches) and after the groups outside the decoder layers; the current stream waits for
        them on exit."""
        main = torch.cuda.current_stream(self.stream.device)
        self.compute_stream.wait_stream(main)
        with torch.cuda.stream(self.compute_stream):
            self.wait(HEAD)
            yield
        main.wait_stream(self.compute_stream)

    def _waiter(self, slot: int):
        def hook(module, args):
            self.wait(slot)
        return hook

    def after_run(self, a: int, b: int) -> None:
        """:meth:`MasterAdamW.clip_step_cast`'s ``after_run``: an event on the side stream after the group that
        starts at parameter ``a``, kept for the slot whose forward waits for it."""
        event = torch.cuda.Event()
        event.record(self.stream)
        self._waits.setdefault(self.slots[self._start[a]], []).append(event)

    def wait(self, slot: int) -> None:
        """The current stream waits for the issued updates of ``slot`` (:data:`HEAD`, :data:`TAIL` or a layer
        index); nothing when none is pending."""
        stream = torch.cuda.current_stream(self.stream.device)
        for event in self._waits.pop(slot, ()):
            stream.wait_event(event)

    def settle(self) -> None:
        """The current stream waits for every update issued so far (before a checkpoint, an evaluation or the
        end of training reads the masters, the optimizer state or the copy)."""
        torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
        self._waits.clear()

    def close(self) -> None:
        """:meth:`settle`, then the forward pre-hooks removed."""
        self.settle()
        for h in self._hooks:
            h.remove()
        self._hooks = []
