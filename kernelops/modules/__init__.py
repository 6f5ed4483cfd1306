"""Public ops: one module each, holding the function, its Operation and its Config."""

from kernelops.modules.attention import Attention, AttentionConfig, attention
from kernelops.modules.flash_attention import FlashAttention, FlashAttentionConfig, flash_attention
from kernelops.modules.flash_attention_fp8 import FlashAttentionFP8, FlashAttentionFP8Config, flash_attention_fp8
from kernelops.modules.flash_attention_lowlevel import (
    estimate_memory_usage, flash_attention_backward, flash_attention_forward, get_optimal_block_sizes,
)
from kernelops.modules.scaled_dot_product_attention import ScaledDotProductAttention, scaled_dot_product_attention

__all__ = [
    "Attention", "AttentionConfig", "ScaledDotProductAttention", "attention", "scaled_dot_product_attention",
    "FlashAttention", "FlashAttentionConfig", "FlashAttentionFP8", "FlashAttentionFP8Config", "estimate_memory_usage", "flash_attention", "flash_attention_backward",
    "flash_attention_forward", "flash_attention_fp8", "get_optimal_block_sizes",
]
