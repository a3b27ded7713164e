"""Configs of the tiny random-initialised models the tests train (real architectures, toy sizes)."""

# Qwen3.5-MoE text: one linear-attention and one full-attention layer, 4 experts (2 active).
QWEN35_TINY = dict(
    hidden_size=64, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
    max_position_embeddings=512,
)

TINY_CONFIGS = {
    "qwen3_5_moe_text": QWEN35_TINY,
    "qwen3_moe": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                      num_experts_per_tok=2, max_position_embeddings=256),
    "llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256),
}
"""A tiny random-initialised config of each supported architecture (``randomInit.config``)."""
