"""kernelops: JAX-style functional GPU ops for PyTorch + Triton, with an autotuning executor.

>>> from kernelops import flash_attention
>>> out = flash_attention(q, k, v, causal=True)    # doctest: +SKIP
"""

from kernelops.version import __version__  # noqa: E402, F401

from kernelops.modules import (  # noqa: E402
    Attention, FlashAttention, FlashAttentionConfig, FlashAttentionFP8, FlashAttentionFP8Config,
    ScaledDotProductAttention, attention, estimate_memory_usage, flash_attention, flash_attention_backward,
    flash_attention_forward, flash_attention_fp8, get_optimal_block_sizes,
    scaled_dot_product_attention,
)
from kernelops.ops import (  # noqa: E402
    AutotunePolicy, BwdParams, ConfigCache, ConfigSelectorChain, DecodeParams, Executor, FwdParams, config_overlay,
)
from kernelops.types import MaskInfo  # noqa: E402

__all__ = [
    "Attention", "ScaledDotProductAttention", "attention", "estimate_memory_usage", "flash_attention_backward",
    "FlashAttentionFP8", "FlashAttentionFP8Config", "flash_attention_fp8",
    "flash_attention_forward", "get_optimal_block_sizes", "scaled_dot_product_attention",
    "AutotunePolicy", "BwdParams", "ConfigCache", "ConfigSelectorChain", "DecodeParams", "Executor", "FlashAttention",
    "FlashAttentionConfig", "FwdParams", "MaskInfo", "config_overlay", "flash_attention",
]

from kernelops import nn  # noqa: E402, F401  (modules: MultiheadAttention, the FlashAttention module, RotaryEmbedding)
