"""Training FLOPs per token and the GPUs' peak bf16 FLOP/s: the two terms of MFU (model FLOPs utilisation)."""

from __future__ import annotations

from pitlab.trainer.plan import ModelShape


def train_flops_per_token(shape: ModelShape, seq_len: int, frozen_base: bool = False) -> float:
    """Training FLOPs per token: ``6 N_active + 6 L_full S d_attn`` (forward + backward = 3 × forward;
    matmul parameters ``N_active`` excluding the input embedding lookup; causal attention scores and values
    ``2 × 2 × S/2 × d_attn`` per layer and token forward). Source: Kaplan et al. 2020, "Scaling Laws for
    Neural Language Models", §2.1 (C ≈ 6N), and Chowdhery et al. 2022, "PaLM", Appendix B (attention term,
    halved for causal masking); linear-attention layers through their projections. ``frozen_base`` (LoRA): no
    weight gradient for frozen weights, ``4 N_active`` (adapter not counted); the attention term unchanged."""
    n_matmul = shape.active - shape.vocab * shape.hidden  # the embedding is a lookup, not a matmul
    return (4.0 if frozen_base else 6.0) * n_matmul + 6.0 * shape.full_attention_layers * seq_len * shape.attention_dim


# Dense bf16 tensor-core peak FLOP/s by device name (datasheets: H100/H200 SXM 989.4 TFLOP/s, A100 312).
PEAK_BF16_FLOPS = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12}


def peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of a device from :data:`PEAK_BF16_FLOPS`, None when unknown (e.g. CPU)."""
    for key, value in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return value
    return None
