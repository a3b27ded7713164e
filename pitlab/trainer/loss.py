"""Fused linear + cross-entropy: the language-model loss without the ``tokens × vocab`` float32 logits.

The reference loss (``F.cross_entropy(lm_head(h).float(), labels)``) holds, at its peak in backward, the
compute-dtype logits, their float32 copy, the float32 log-softmax and its float32 gradient, ``T × V (2 + 12)``
bytes: 14 GB for 4,096 tokens of the 248,320-entry Qwen3.5 vocabulary (12.2 GB measured on an H200).
:func:`chunked_linear_cross_entropy` computes the logits ``chunk`` tokens at a time in the compute dtype (bf16
under the trainer's mixed precision, as the reference's ``lm_head``), and from them, in one pass, the summed loss
and the gradient of the mean loss with respect to the logits, ``(softmax(z) - onehot(y)) / N``, stored in the
compute dtype (what the reference's backward feeds its matrix products too). On CUDA that pass is one
``torch.compile``-d kernel, so the float32 softmax lives in registers only. The gradients of the hidden states and
of the head weight are then two matrix products over all rows, done in forward; backward only scales them by the
incoming scalar. Same three matrix products as the reference, ``T × V × 2`` bytes instead of ``T × V × 14``.
"""

from __future__ import annotations

import contextlib
import threading

import torch

IGNORE_INDEX = -100
DEFAULT_CHUNK_TOKENS = 4096
_compiled_rows = None  # torch.compile of _loss_and_grad_rows, built on the first CUDA call
_OWN_POSITIONS = threading.local()  # .on: the running forward's position ids are the model's own 0..T-1


def _unpacked_when_own_positions(original):
    """``transformers.masking_utils.find_packed_sequence_indices`` returning None (no packed sequences) without
    looking while :func:`own_positions` is on: its look (``(mask[:, -1] == 0).all()`` in Python) waits for the
    device, the one host sync left inside a training step (bench/results/profile_step_h200_2026-12-01.log)."""

    def find_packed_sequence_indices(position_ids):
        if getattr(_OWN_POSITIONS, "on", False):
            return None
        return original(position_ids)

    find_packed_sequence_indices.pitlab_original = original
    return find_packed_sequence_indices


@contextlib.contextmanager
def own_positions(on: bool):
    """While ``on``: the model builds its own position ids (``0 .. T-1`` for every row: the caller passed neither
    ``position_ids`` nor ``attention_mask``), so no row packs several sequences and Hugging Face's check for that
    is skipped (the answer it would give, without a host sync)."""
    from transformers import masking_utils

    current = getattr(masking_utils, "find_packed_sequence_indices", None)
    if on and current is not None and not hasattr(current, "pitlab_original"):
        masking_utils.find_packed_sequence_indices = _unpacked_when_own_positions(current)
    before = getattr(_OWN_POSITIONS, "on", False)
    _OWN_POSITIONS.on = on
    try:
        yield
    finally:
        _OWN_POSITIONS.on = before


def _loss_and_grad_rows(z: torch.Tensor, y: torch.Tensor, denom: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For logits ``z`` ``(c, V)`` and labels ``y`` ``(c,)``: the summed cross-entropy of the valid rows (float32)
    and its gradient divided by ``denom``, ``(softmax(z) - onehot(y)) / denom`` (zero rows for ignored labels), in
    ``z``'s dtype. The softmax is computed in float32; compiled on CUDA into one kernel that never stores a
    float32 ``(c, V)`` tensor."""
    zf = z.float()
    lse = torch.logsumexp(zf, dim=-1)
    valid = y != IGNORE_INDEX
    safe = torch.where(valid, y, 0)
    picked = zf.gather(1, safe[:, None]).squeeze(1)
    loss_sum = torch.where(valid, lse - picked, 0.0).sum()
    onehot = torch.arange(z.shape[1], device=z.device)[None, :] == safe[:, None]
    scale = valid.to(torch.float32) / denom
    g = (torch.exp(zf - lse[:, None]) - onehot.to(torch.float32)) * scale[:, None]
    return loss_sum, g.to(z.dtype)


def _rows_fn(device: torch.device):
    global _compiled_rows
    if device.type != "cuda":
        return _loss_and_grad_rows
    if _compiled_rows is None:
        _compiled_rows = torch.compile(_loss_and_grad_rows, dynamic=False)
    return _compiled_rows


def _disable_compiled():
    global _compiled_rows
    import warnings
    warnings.warn("pitlab.trainer.loss: torch.compile of the loss failed; the eager loss is used", stacklevel=2)
    _compiled_rows = _loss_and_grad_rows
    return _loss_and_grad_rows


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int):
        n = hidden.shape[0]
        denom = (labels != IGNORE_INDEX).sum().clamp(min=1).to(torch.float32)
        rows = _rows_fn(hidden.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grads = None if n <= chunk else torch.empty((n, weight.shape[0]), dtype=hidden.dtype, device=hidden.device)
        for start in range(0, n, chunk):
            z = hidden[start:start + chunk] @ weight.t()  # (c, V) logits in the compute dtype
            try:
                loss_sum, g = rows(z, labels[start:start + chunk], denom)
            except Exception:  # noqa: BLE001 - a compiler failure falls back to the same function, eager
                if rows is _loss_and_grad_rows:
                    raise
                rows = _disable_compiled()
                loss_sum, g = rows(z, labels[start:start + chunk], denom)
            del z
            total += loss_sum
            if grads is None:
                grads = g
            else:
                grads[start:start + chunk] = g
            del g
        # the gradients of the mean loss: two products over all rows, as the reference's backward does
        grad_h = grads @ weight if ctx.needs_input_grad[0] else None
        grad_w = grads.t() @ hidden if ctx.needs_input_grad[1] else None
        del grads
        ctx.save_for_backward(grad_h if grad_h is not None else torch.empty(0),
                              grad_w if grad_w is not None else torch.empty(0))
        return total / denom

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        gh = grad_h * grad_out.to(grad_h.dtype) if ctx.needs_input_grad[0] else None
        gw = grad_w * grad_out.to(grad_w.dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                                 chunk: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """Mean token cross-entropy (nats, float32 scalar) of ``hidden @ weight.T`` against ``labels``.

    ``hidden``: ``(N, H)`` or ``(B, T, H)`` (any float dtype; the logits are computed in it); ``weight``:
    ``(V, H)``, the output head; ``labels``: ``(N,)`` / ``(B, T)`` int64, :data:`IGNORE_INDEX` entries left out of
    the mean. Equal to ``F.cross_entropy((hidden @ weight.T).float(), labels)`` up to the summation order of the
    float32 reductions. Extra memory: the ``N × V`` gradient of the logits in the compute dtype, plus ``chunk × V``
    logits and (on the CPU, not compiled) their float32 softmax. Raises ``ValueError`` for mismatched shapes or
    ``chunk < 1``.
    """
    if chunk < 1:
        raise ValueError(f"chunk: must be >= 1 (got {chunk})")
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    if h.shape[0] != y.shape[0] or weight.shape[-1] != h.shape[-1]:
        raise ValueError(f"chunked_linear_cross_entropy: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)} "
                         f"and labels {tuple(labels.shape)} do not match")
    return _ChunkedLinearCrossEntropy.apply(h, weight, y, chunk)


LOSSES = ("chunked", "reference")


def loss_label(kind: str, chunk: int = DEFAULT_CHUNK_TOKENS) -> str:
    """How :func:`install_loss` computes the loss, for the kernel report."""
    return (f"fused linear cross-entropy (pitlab, chunks of {chunk} tokens)"
            if kind == "chunked"
            else "reference (full logits, float32 cross-entropy)")


def install_loss(model: torch.nn.Module, kind: str = "chunked", chunk: int = DEFAULT_CHUNK_TOKENS) -> str:
    """Make ``model(input_ids=..., labels=...)`` return the LM loss of already shifted ``labels`` (``(B, T)``
    int64, the next token of each input position) as ``output.loss`` with no logits kept, and return the loss's
    label. ``kind``: ``"chunked"`` (:func:`chunked_linear_cross_entropy` over the output head's weight) or
    ``"reference"`` (``F.cross_entropy(lm_head(h).float(), labels)``, the logits materialised). A head that is not
    a plain bias-free ``nn.Linear`` (e.g. LoRA-wrapped) always gets the reference. The forward of the causal LM
    inside ``model`` (a peft model's base model too) is replaced on the instance, so FSDP2's hooks on the module
    still run around it and the head's weight is the unsharded one inside. Raises ``ValueError`` for another
    ``kind``."""
    if kind not in LOSSES:
        raise ValueError(f"spec.training.loss: must be one of {', '.join(LOSSES)} (got {kind!r})")
    import torch.nn.functional as F
    from transformers.modeling_outputs import CausalLMOutputWithPast

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = lm.get_output_embeddings()
    if kind == "chunked" and not (type(head) is torch.nn.Linear and head.bias is None):
        kind = "reference"

    def forward(input_ids: torch.Tensor, labels: torch.Tensor, **kwargs) -> CausalLMOutputWithPast:
        extra = {k: v for k, v in kwargs.items() if v is not None and k in ("attention_mask", "position_ids")}
        with own_positions(not extra):
            hidden = lm.model(input_ids=input_ids, **extra).last_hidden_state
        if kind == "chunked":
            loss = chunked_linear_cross_entropy(hidden, lm.get_output_embeddings().weight, labels, chunk)
        else:
            logits = lm.get_output_embeddings()(hidden)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return CausalLMOutputWithPast(loss=loss)

    lm.forward = forward
    return loss_label(kind, chunk)
