"""nn.Modules over kernelops' functional ops, for use in models and training loops.

>>> import torch
>>> from kernelops.nn import MultiheadAttention
>>> mha = MultiheadAttention(64, num_heads=4, causal=True, rotary=True)
>>> mha(torch.randn(2, 16, 64)).shape
torch.Size([2, 16, 64])
"""

from kernelops.nn.attention import FlashAttention, MultiheadAttention
from kernelops.nn.rotary import RotaryEmbedding

__all__ = ["FlashAttention", "MultiheadAttention", "RotaryEmbedding"]
