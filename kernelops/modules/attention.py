"""attention: plain materialised attention that also returns the attention weights.

For debugging and short sequences: it builds the whole ``[B, Hq, Sq, Sk]`` score matrix, so
memory is O(Sq * Sk). Same conventions and features as :func:`kernelops.flash_attention` (BSHD,
bottom-right causal, windows, soft cap, bias, sinks) plus ``mask_info`` and dropout; it runs on
the ``torch`` platform on any device and differentiates through torch autograd.
"""

from __future__ import annotations

import dataclasses

import torch

from kernelops.modules.attention_args import check_extras, check_tensors, window_bounds, check_dropout, check_scalars
from kernelops.ops.device import DeviceInfo
from kernelops.ops.executor import default_executor
from kernelops.ops.keys import bucket
from kernelops.ops.operation import BACKENDS, PLATFORMS, NotSupportedError, Operation
from kernelops.ops.params import JsonConfig
from kernelops.types import MaskInfo


@dataclasses.dataclass(frozen=True)
class AttentionConfig(JsonConfig):
    """Nothing to tune: the platform only."""

    platform: str = "auto"
    backend: str = "any"

    def __post_init__(self):
        if self.platform not in PLATFORMS or self.backend not in BACKENDS:
            raise ValueError(f"AttentionConfig: platform in {PLATFORMS}, backend in {BACKENDS}; got {self}")


@dataclasses.dataclass(frozen=True)
class AttentionInputs:
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    softmax_scale: float
    causal: bool
    win_left: int
    win_right: int
    logits_soft_cap: float | None
    bias: torch.Tensor | None
    mask: torch.Tensor | None
    softmax_aux: torch.Tensor | None
    dropout_prob: float
    dropout_seed: int | None
    platform: str = "auto"


class Attention(Operation):
    """Materialised softmax attention returning ``(output, weights)``."""

    name = "attention"
    config_type = AttentionConfig
    platforms = ("torch",)

    def prepare(self, *, query, key, value, bias=None, mask_info=None, causal=False, sliding_window=None,
                logits_soft_cap=None, softmax_aux=None, dropout_prob=0.0, dropout_seed=None,
                softmax_scale=None, platform="auto") -> AttentionInputs:
        if platform not in PLATFORMS:
            raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
        check_tensors(query, key, value)
        check_extras(query, key, bias, None, softmax_aux)
        B, Sq, Hq, D = query.shape
        Sk = key.shape[1]
        mask = None
        if mask_info is not None:
            if not isinstance(mask_info, MaskInfo):
                raise TypeError(f"mask_info must be a kernelops.MaskInfo, got {type(mask_info).__name__}")
            mask = mask_info.to_dense().to(query.device)
            if mask.dim() != 4 or mask.shape[0] not in (1, B) or mask.shape[1] not in (1, Hq) or \
                    tuple(mask.shape[2:]) != (Sq, Sk):
                raise ValueError(f"mask_info must describe [B or 1, Hq or 1, Sq, Sk] = [{B}, {Hq}, {Sq}, {Sk}], "
                                 f"got a mask of shape {tuple(mask.shape)}")
        scale, logits_soft_cap = check_scalars(D, softmax_scale, logits_soft_cap)
        left, right, _ = window_bounds(sliding_window, bool(causal))
        return AttentionInputs(query, key, value, scale, bool(causal), left, right, logits_soft_cap, bias, mask,
                               softmax_aux, check_dropout(dropout_prob), dropout_seed, platform)

    def device_of(self, inputs):
        return inputs.query.device

    def not_supported_reasons(self, inputs, platform, device: DeviceInfo) -> list[str]:
        return [] if platform == "torch" else [f"attention is plain torch only, not {platform!r}"]

    def key(self, inputs):
        return (("dtype", str(inputs.query.dtype).removeprefix("torch.")), ("seq_q", bucket(inputs.query.shape[1])))

    def heuristic_config(self, inputs, device):
        return AttentionConfig()

    def deferred_config(self, inputs) -> AttentionConfig:
        """Under torch.compile: nothing to resolve (plain torch, traced into the graph)."""
        return AttentionConfig()

    def run(self, inputs, config):
        from kernelops.kernels.flash_attention.reference import ScoreTerms, attention_materialized

        if not torch.compiler.is_compiling():
            self.resolve_platform(inputs, config)
        else:  # the platform arguments are constants of the trace: only a forced "triton" can be refused
            asked = config.platform if config.platform != "auto" else inputs.platform
            if asked != "auto" and asked not in self.platforms:
                raise NotSupportedError(f"attention: platform={asked!r} cannot run this call: "
                                        f"attention is plain torch only, not {asked!r}")
        keep = None
        if inputs.dropout_prob > 0 and inputs.dropout_seed is not None:
            from kernelops.kernels.attention.registration import attention_keep_mask

            keep = attention_keep_mask(inputs.query, inputs.key, inputs.dropout_seed, inputs.dropout_prob)
        out, _, weights = attention_materialized(
            inputs.query, inputs.key, inputs.value, softmax_scale=inputs.softmax_scale, win_left=inputs.win_left,
            win_right=inputs.win_right, softcap=inputs.logits_soft_cap,
            terms=ScoreTerms(bias=inputs.bias, softmax_aux=inputs.softmax_aux, mask=inputs.mask),
            return_weights=True, dropout_prob=inputs.dropout_prob, dropout_mask=keep)
        return out, weights

    def estimate_memory(self, inputs) -> dict[str, int]:
        q, k = inputs.query, inputs.key
        B, Sq, Hq, _ = q.shape
        return {"inputs": (q.numel() + 2 * k.numel()) * q.element_size(), "outputs": q.numel() * q.element_size(),
                "workspace": 3 * B * Hq * Sq * k.shape[1] * q.element_size()}


ATTENTION = Attention()


def attention(query, key, value, *, bias=None, mask_info: MaskInfo | None = None, causal: bool = False,
              sliding_window=None, logits_soft_cap: float | None = None, softmax_aux=None,
              dropout_prob: float = 0.0, dropout_seed: int | None = None, softmax_scale: float | None = None,
              platform: str = "auto", cfg: AttentionConfig | None = None):
    """Materialised attention: ``(output [B, Sq, Hq, D], weights [B, Hq, Sq, Sk])``.

    ``query [B, Sq, Hq, D]``, ``key/value [B, Sk, Hkv, D]``. ``weights`` are the softmax
    probabilities before dropout (rows that see no key are all zero; a sink takes its share of
    each row's mass). ``mask_info`` (:class:`kernelops.MaskInfo`) masks on top of ``causal`` and
    ``sliding_window``. Other arguments as in :func:`kernelops.flash_attention`, including
    ``platform`` and ``cfg``: this op has only the ``torch`` platform (on any device), so
    ``"auto"`` and ``"torch"`` run it and ``"triton"`` raises :class:`~kernelops.ops.NotSupportedError`;
    ``cfg`` is an :class:`AttentionConfig` (its ``platform`` and ``backend``), used as given.

    >>> q = torch.randn(1, 16, 2, 8)
    >>> out, w = attention(q, q, q, causal=True)
    >>> out.shape, w.shape
    (torch.Size([1, 16, 2, 8]), torch.Size([1, 2, 16, 16]))
    """
    return default_executor()(ATTENTION, cfg=cfg, query=query, key=key, value=value, bias=bias,
                              mask_info=mask_info, causal=causal, sliding_window=sliding_window,
                              logits_soft_cap=logits_soft_cap, softmax_aux=softmax_aux, dropout_prob=dropout_prob,
                              dropout_seed=dropout_seed, softmax_scale=softmax_scale, platform=platform)
