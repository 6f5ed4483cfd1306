"""Public ops: one module each, holding the function, its Operation and its Config.

Importing this package imports every op module (and torch), but no Triton kernel: an op imports
its kernels (and Triton) the first time it runs. :func:`operations` lists the ops.
"""

from kernelops.modules.attention import Attention, AttentionConfig, attention
from kernelops.modules.flash_attention import FlashAttention, FlashAttentionConfig, flash_attention
from kernelops.modules.flash_attention_fp8 import FlashAttentionFP8, FlashAttentionFP8Config, flash_attention_fp8
from kernelops.modules.flash_attention_lowlevel import (
    estimate_memory_usage, flash_attention_backward, flash_attention_forward, get_optimal_block_sizes,
)
from kernelops.modules.scaled_dot_product_attention import ScaledDotProductAttention, scaled_dot_product_attention
from kernelops.ops.operation import Operation

__all__ = [
    "Attention", "AttentionConfig", "ScaledDotProductAttention", "attention", "scaled_dot_product_attention",
    "FlashAttention", "FlashAttentionConfig", "FlashAttentionFP8", "FlashAttentionFP8Config", "estimate_memory_usage",
    "flash_attention", "flash_attention_backward", "flash_attention_forward", "flash_attention_fp8",
    "get_optimal_block_sizes", "operations",
]


def operations() -> dict[str, type[Operation]]:
    """Every op of this package: ``{op name: its Operation class}``, sorted by name.

    Found from the Operation subclasses defined in ``kernelops.modules.*`` that set their own
    ``name``, so an op module imported above is listed without being named here.

    >>> sorted(operations())[:2]
    ['attention', 'flash_attention']
    """
    found: dict[str, type[Operation]] = {}
    pending = list(Operation.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith(f"{__name__}.") and "name" in vars(cls):
            found[cls.name] = cls
    return dict(sorted(found.items()))
