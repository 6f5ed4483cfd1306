"""The ops ``kernelops tune`` knows: how to parse their ``--shapes``, their presets, and which
key fields select no distinct compiled kernel (for deduplicating compile warm-up)."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from kernelops.tuning.presets import llm_fp8_preset, llm_preset
from kernelops.tuning.specs import parse_attention_shape, parse_fp8_shape


@dataclasses.dataclass(frozen=True)
class Tunable:
    """What the tuning tools need to know about one op."""

    #: ``"module:ATTRIBUTE"`` of the op's Operation instance (imported on first use)
    operation: str
    #: ``--shapes`` text -> spec (ValueError on bad text)
    parse_shape: Callable[[str], object]
    #: preset name -> function returning its specs
    presets: dict[str, Callable[[], list]]
    #: key fields that are runtime arguments of the kernels (no new compile per value); the rest
    #: of the key, plus the candidate params, names one compiled kernel
    runtime_key_fields: frozenset[str] = frozenset()
    #: the ``--shapes`` syntax, for --help
    shape_help: str = ""

    def op(self):
        module, _, attribute = self.operation.partition(":")
        return getattr(importlib.import_module(module), attribute)


# lengths, head counts and window bounds are do_not_specialize arguments of the attention kernels;
# causal is a window bound: a compile depends on dtype, head dim, the feature flags and the params
_ATTENTION_RUNTIME_FIELDS = frozenset({"causal", "window", "gqa", "seq_q", "seq_k"})

TUNABLE: dict[str, Tunable] = {
    "flash_attention": Tunable(
        operation="kernelops.modules.flash_attention:FLASH_ATTENTION",
        parse_shape=parse_attention_shape,
        presets={"llm": llm_preset},
        runtime_key_fields=_ATTENTION_RUNTIME_FIELDS,
        shape_help="B=2,S=4096,Hq=32,Hkv=8,D=128,dtype=bf16,causal=1[,window=4096][,train=0]",
    ),
    "flash_attention_fp8": Tunable(
        operation="kernelops.modules.flash_attention_fp8:FLASH_ATTENTION_FP8",
        parse_shape=parse_fp8_shape,
        presets={"llm": llm_fp8_preset},
        runtime_key_fields=_ATTENTION_RUNTIME_FIELDS,  # (causal and the group refined by its compile_variant)
        shape_help="B=1,S=8k,Hq=32,Hkv=8,D=128,causal=1[,window=4096] (e4m3, forward only)",
    ),
}


def get_tunable(name: str) -> Tunable:
    """The registry entry of op ``name`` (KeyError with the known names)."""
    try:
        return TUNABLE[name]
    except KeyError:
        raise KeyError(f"no tuning support for op {name!r}; known: {', '.join(sorted(TUNABLE))}") from None
