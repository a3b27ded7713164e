"""Chunked linear + cross-entropy: the language-model loss without the ``tokens × vocab`` float32 logits.

The reference loss (``F.cross_entropy(lm_head(h).float(), labels)``) holds, at its peak in backward, the
compute-dtype logits, the float32 log-softmax and two float32 gradients of ``T × V`` elements: with the
248,320-entry Qwen3.5 vocabulary and 4,096 tokens that is 14 GB. :func:`chunked_linear_cross_entropy`
computes the same loss ``chunk`` tokens at a time and, in the same pass, the gradients of the hidden states and
of the head weight (the gradient of the mean cross-entropy with respect to the logits is
``(softmax(z) - onehot(y)) / N``), so at most ``chunk × V`` float32 elements exist at once and backward only
scales the stored gradients by the incoming scalar. The logits of each chunk are computed in the input's dtype
(bf16 under the trainer's mixed precision, as the reference's ``lm_head`` does) and the softmax in float32.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100
DEFAULT_CHUNK_TOKENS = 1024


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int):
        n_valid = (labels != IGNORE_INDEX).sum()
        denom = n_valid.clamp(min=1).to(torch.float32)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            h = hidden[start:start + chunk]
            y = labels[start:start + chunk]
            z = (h @ weight.t()).float()  # (c, V): logits in the compute dtype, softmax in float32
            lse = torch.logsumexp(z, dim=-1)
            valid = y != IGNORE_INDEX
            safe = torch.where(valid, y, 0)
            picked = z.gather(1, safe[:, None]).squeeze(1)
            total += torch.where(valid, lse - picked, 0.0).sum()
            if need_h or need_w:
                g = torch.exp_(z.sub_(lse[:, None]))  # softmax, in place of the logits
                g[torch.arange(g.shape[0], device=g.device), safe] -= 1.0
                g.mul_((valid.to(torch.float32) / denom)[:, None])
                g = g.to(hidden.dtype)
                if need_h:
                    grad_h[start:start + chunk] = g @ weight
                if need_w:
                    grad_w.add_(g.t() @ h)  # float32 accumulation over the chunks
            del z
        ctx.save_for_backward(grad_h if need_h else torch.empty(0), grad_w if need_w else torch.empty(0))
        ctx.weight_dtype = weight.dtype
        return total / denom

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        gh = gw = None
        if ctx.needs_input_grad[0]:
            gh = grad_h * grad_out.to(grad_h.dtype)
        if ctx.needs_input_grad[1]:
            gw = (grad_w * grad_out).to(ctx.weight_dtype)
        return gh, gw, None, None


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                                 chunk: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """Mean token cross-entropy (nats, float32 scalar) of ``hidden @ weight.T`` against ``labels``.

    ``hidden``: ``(N, H)`` or ``(B, T, H)`` (any float dtype; the logits are computed in it); ``weight``:
    ``(V, H)``, the output head; ``labels``: ``(N,)`` / ``(B, T)`` int64, :data:`IGNORE_INDEX` entries left out of
    the mean. Equal to ``F.cross_entropy((hidden @ weight.T).float(), labels)`` up to the summation order of the
    float32 reductions; peak extra memory about ``chunk × V × 4 × 2`` bytes. Raises ``ValueError`` for mismatched
    shapes or ``chunk < 1``.
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
    return (f"chunked linear cross-entropy ({chunk} tokens per chunk, float32 softmax)" if kind == "chunked"
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
        hidden = lm.model(input_ids=input_ids, **extra).last_hidden_state
        if kind == "chunked":
            loss = chunked_linear_cross_entropy(hidden, lm.get_output_embeddings().weight, labels, chunk)
        else:
            logits = lm.get_output_embeddings()(hidden)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return CausalLMOutputWithPast(loss=loss)

    lm.forward = forward
    return loss_label(kind, chunk)
