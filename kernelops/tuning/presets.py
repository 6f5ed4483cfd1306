"""Named presets: lists of call specs to tune, and the filters ``kernelops tune`` applies to them.

Preset ``llm`` (``flash_attention``): the attention shapes of LLM training, as training keys
(forward and backward tuned; the inference keys are derived from them on export):

- head dims 64, 128, 256; dtypes bfloat16 and float16; GQA ratios 1, 4, 8;
- masks: none, causal, causal with a 4096-key sliding window (only where ``S > 4096``: below
  that the window covers every key and the call is plain causal);
- ``S = Sq = Sk`` in 512, 1k, 2k, ..., 128k.

Shapes keep each call's GPU time bounded: ``B * S = 16k`` tokens up to ``S = 16k`` (``B =
16384 // S``), ``B = 1`` beyond; ``Hq = 2048 // D`` query heads, divided by ``S / 16k`` beyond
16k, but at least the GQA ratio and a multiple of it; ``Hkv = Hq // ratio``.
That is ``3 dims x 2 dtypes x 3 ratios x (4 lengths x 2 masks + 5 lengths x 3 masks) = 414`` specs.

Preset ``llm`` of ``flash_attention_fp8``: the same shapes and masks as forward-only e4m3 calls
(``3 dims x 3 ratios x 23 = 207`` specs).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from kernelops.tuning.specs import AttentionSpec, FP8AttentionSpec

LLM_HEAD_DIMS = (64, 128, 256)
LLM_DTYPES = ("bfloat16", "float16")
LLM_GQA = (1, 4, 8)
LLM_SEQS = tuple(512 << i for i in range(9))  # 512 .. 128k
LLM_WINDOW = 4096
LLM_TOKENS = 16384
LLM_HIDDEN = 2048
MASKS = ("none", "causal", "window")


def llm_shape(seq: int, head_dim: int, ratio: int) -> tuple[int, int, int]:
    """``(B, Hq, Hkv)`` of the ``llm`` preset for one sequence length, head dim and GQA ratio."""
    batch = max(1, LLM_TOKENS // seq)
    heads = LLM_HIDDEN // head_dim
    if seq > LLM_TOKENS:
        heads = heads * LLM_TOKENS // seq
    heads = max(ratio, heads // ratio * ratio)
    return batch, heads, heads // ratio


def llm_preset(dtypes: Sequence[str] = LLM_DTYPES, spec_type: type = AttentionSpec) -> list[AttentionSpec]:
    """The ``llm`` preset's specs (see the module docstring), grouped by dtype and head dim."""
    specs = []
    for dtype in dtypes:
        for head_dim in LLM_HEAD_DIMS:
            for ratio in LLM_GQA:
                for mask in MASKS:
                    for seq in LLM_SEQS:
                        if mask == "window" and seq <= LLM_WINDOW:
                            continue
                        batch, hq, hkv = llm_shape(seq, head_dim, ratio)
                        specs.append(spec_type(batch, seq, seq, hq, hkv, head_dim, dtype, causal=mask != "none",
                                               window=LLM_WINDOW if mask == "window" else None))
    return specs


def llm_fp8_preset() -> list[FP8AttentionSpec]:
    """``flash_attention_fp8``'s ``llm`` preset: :func:`llm_preset`'s shapes in e4m3, forward only."""
    return llm_preset(FP8AttentionSpec.dtypes, FP8AttentionSpec)


def filter_specs(specs: Iterable, *, head_dims: Sequence[int] | None = None, dtypes: Sequence[str] | None = None,
                 gqa: Sequence[int] | None = None, masks: Sequence[str] | None = None,
                 min_seq: int | None = None, max_seq: int | None = None) -> list:
    """The specs that pass every filter given (None: no filter). ``dtypes`` are torch dtype names;
    the sequence bounds apply to the longer of ``seq_q`` / ``seq_k``."""
    def keep(spec) -> bool:
        return ((head_dims is None or spec.head_dim in head_dims) and (dtypes is None or spec.dtype in dtypes)
                and (gqa is None or spec.gqa in gqa) and (masks is None or spec.mask in masks)
                and (min_seq is None or spec.seq >= min_seq) and (max_seq is None or spec.seq <= max_seq))

    return [spec for spec in specs if keep(spec)]
