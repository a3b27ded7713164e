"""Configs of the tiny random-initialised models the tests train (real architectures, toy sizes)."""

# Qwen3.5-MoE text: one linear-attention and one full-attention layer, 4 experts (2 active).
QWEN35_TINY = dict(
    hidden_size=64, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
    max_position_embeddings=512,
)
