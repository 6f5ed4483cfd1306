"""Public ops: one module each, holding the function, its Operation and its Config."""

from kernelops.modules.flash_attention import FlashAttention, FlashAttentionConfig, flash_attention

__all__ = ["FlashAttention", "FlashAttentionConfig", "flash_attention"]
