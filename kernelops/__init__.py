"""kernelops: JAX-style functional GPU ops for PyTorch + Triton, with an autotuning executor.

>>> from kernelops import flash_attention
>>> out = flash_attention(q, k, v, causal=True)    # doctest: +SKIP

The names below load on first use (``import kernelops`` itself imports neither torch nor Triton):
``kernelops.flash_attention`` imports the op modules, and an op imports its kernels (and Triton)
the first time it runs.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

from kernelops.version import __version__  # noqa: F401 (public: kernelops.__version__)

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys((
        "Attention", "AttentionConfig", "FlashAttention", "FlashAttentionConfig", "FlashAttentionFP8",
        "FlashAttentionFP8Config", "ScaledDotProductAttention", "attention", "estimate_memory_usage",
        "flash_attention", "flash_attention_backward", "flash_attention_forward", "flash_attention_fp8",
        "get_optimal_block_sizes", "scaled_dot_product_attention",
    ), "kernelops.modules"),
    **dict.fromkeys((
        "AutotunePolicy", "BwdParams", "ConfigCache", "ConfigSelectorChain", "DecodeParams", "Executor", "FwdParams",
        "config_overlay",
    ), "kernelops.ops"),
    "MaskInfo": "kernelops.types",
}

#: subpackages reachable as attributes (``kernelops.nn.MultiheadAttention``) without importing them first
_SUBMODULES = ("compat", "integrations", "kernels", "modules", "nn", "ops", "tuning", "types")

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(_importlib.import_module(module), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    dunders = {name for name in globals() if name.startswith("__")}
    return sorted(dunders | set(__all__) | set(_SUBMODULES))


if _TYPE_CHECKING:  # what the names above resolve to, for type checkers and IDEs
    from kernelops import nn  # noqa: F401
    from kernelops.modules import (  # noqa: F401
        Attention, AttentionConfig, FlashAttention, FlashAttentionConfig, FlashAttentionFP8, FlashAttentionFP8Config,
        ScaledDotProductAttention, attention, estimate_memory_usage, flash_attention, flash_attention_backward,
        flash_attention_forward, flash_attention_fp8, get_optimal_block_sizes, scaled_dot_product_attention,
    )
    from kernelops.ops import (  # noqa: F401
        AutotunePolicy, BwdParams, ConfigCache, ConfigSelectorChain, DecodeParams, Executor, FwdParams,
        config_overlay,
    )
    from kernelops.types import MaskInfo  # noqa: F401
