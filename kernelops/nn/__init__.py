"""nn.Modules over kernelops' functional ops, for use in models and training loops.

* :class:`FlashAttentionLayer`: :func:`kernelops.flash_attention` with its static arguments fixed
  (``kernelops.nn.FlashAttention`` is its deprecated former name);
* :class:`MultiheadAttention`: a self-attention layer (projections, GQA, rotary, output projection);
* :class:`RotaryEmbedding`: rotary position embeddings.

>>> import torch
>>> from kernelops.nn import MultiheadAttention
>>> mha = MultiheadAttention(64, num_heads=4, causal=True, rotary=True)
>>> mha(torch.randn(2, 16, 64)).shape
torch.Size([2, 16, 64])
"""

from kernelops.nn.attention import FlashAttentionLayer, MultiheadAttention
from kernelops.nn.rotary import RotaryEmbedding

__all__ = ["FlashAttentionLayer", "MultiheadAttention", "RotaryEmbedding"]


def __getattr__(name: str):
    if name == "FlashAttention":  # the deprecated former name of FlashAttentionLayer
        import warnings

        from kernelops.nn.attention import FLASH_ATTENTION_RENAMED

        warnings.warn(FLASH_ATTENTION_RENAMED, DeprecationWarning, stacklevel=2)
        return FlashAttentionLayer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
