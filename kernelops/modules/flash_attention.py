"""flash_attention: the stateless function, its Operation and its Config.

Tensors are BSHD: ``query [B, Sq, Hq, D]``, ``key/value [B, Sk, Hkv, D]`` (any strides; Hq a
multiple of Hkv gives GQA/MQA without repeating K/V), output ``[B, Sq, Hq, D]`` in the inputs'
dtype, optional ``lse [B, Hq, Sq]`` float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import dataclasses
import numbers
import os

import torch

from kernelops.kernels.flash_attention.runtime_config import SPLIT_AUTO, register_resolver
from kernelops.kernels.flash_attention.smem import block_dim, fit_smem, smem_bwd, smem_decode, smem_elem, smem_fwd
from kernelops.modules.attention_args import (
    check_dropout, check_extras, check_scalars, check_tensors, check_varlen,
    lower_mask_info, window_bounds,
)
from kernelops.modules.packed_offsets import check_offset_values, packed_signature
from kernelops.ops.device import DeviceInfo, device_info
from kernelops.ops.executor import default_executor, remembered_launcher
from kernelops.ops.keys import bucket
from kernelops.ops.operation import BACKENDS, PLATFORMS, Operation
from kernelops.ops.params import BwdParams, DecodeParams, FwdParams, JsonConfig
from kernelops.ops.tracing import assume_constant_result

#: forwards with at most this many queries (and no bias/ALiBi/segments/dropout) use split-KV decode
DECODE_MAX_SEQ_Q = 16
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: the smallest call (FLOPs) the warp-specialised forward takes by default (FlashAttention.ws_auto);
#: 1e11 until direct launches (kernels/common/launch.py) brought its host time to the TMA kernel's
WS_MIN_FLOPS = 1e10
#: the backward's floor (same measure: forward FLOPs); 1e11 until per-signature launch plans
#: (kernels/flash_attention/plans.py) made the fused path's host time the split path's
WS_MIN_FLOPS_BWD = 1e10
#: (q_blocksize, kv_blocksize, num_warps, num_stages) of the tuner's BwdParams(ws=True) candidates:
#: the dQ kernel's tiles that won most often in the shipped H100 file
WS_DQ_TILES = ((32, 128, 4, 3), (64, 64, 4, 2), (32, 64, 8, 3), (64, 128, 8, 3))


@dataclasses.dataclass(frozen=True)
class FlashAttentionConfig(JsonConfig):
    """Launch configuration. Fields left as None are filled from the heuristic.

    ``decode_params`` apply to decode-shaped forwards (``Sq <= 16``, see
    :meth:`FlashAttention.decode_applies`), which run the split-KV kernel instead of the dense one.
    """

    fwd_params: FwdParams | None = None
    bwd_params: BwdParams | None = None
    platform: str = "auto"
    backend: str = "any"
    decode_params: DecodeParams | None = None

    def __post_init__(self):
        if self.platform not in PLATFORMS:
            raise ValueError(f"FlashAttentionConfig.platform must be one of {PLATFORMS}, got {self.platform!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"FlashAttentionConfig.backend must be one of {BACKENDS}, got {self.backend!r}")
        for name, kind in (("fwd_params", FwdParams), ("bwd_params", BwdParams), ("decode_params", DecodeParams)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise TypeError(f"FlashAttentionConfig.{name} must be a {kind.__name__}, got {type(value).__name__}")


@dataclasses.dataclass(frozen=True)
class FlashAttentionInputs:
    """Normalised arguments of one call (see :func:`flash_attention`)."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    softmax_scale: float
    causal: bool
    win_left: int
    win_right: int
    windowed: bool
    logits_soft_cap: float | None
    return_lse: bool
    platform: str = "auto"
    bias: torch.Tensor | None = None
    alibi_slopes: torch.Tensor | None = None
    softmax_aux: torch.Tensor | None = None
    deterministic: bool = False
    q_segment_ids: torch.Tensor | None = None
    kv_segment_ids: torch.Tensor | None = None
    cum_seqlens_q: torch.Tensor | None = None
    cum_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    dropout_prob: float = 0.0
    dropout_seed: int = 0

    @property
    def varlen(self) -> bool:
        return self.cum_seqlens_q is not None

    @property
    def seq_lens(self) -> tuple[int, int]:
        """(query length, key length): the longest sequence's for packed batches."""
        if self.varlen:
            return self.max_seqlen_q, self.max_seqlen_k
        return self.query.shape[1], self.key.shape[1]

    @property
    def heads(self) -> tuple[int, int]:
        """(query heads, key/value heads)."""
        return self.query.shape[-2], self.key.shape[-2]

    @property
    def bias_kind(self) -> str | None:
        """How the bias broadcasts: ``"full"``, ``"per-batch"``, ``"per-head"`` or ``"shared"``."""
        if self.bias is None:
            return None
        per_batch, per_head = self.bias.shape[0] > 1, self.bias.shape[1] > 1
        return {(True, True): "full", (True, False): "per-batch", (False, True): "per-head",
                (False, False): "shared"}[(per_batch, per_head)]

    @property
    def needs_grad(self) -> bool:
        tensors = (self.query, self.key, self.value, self.bias, self.softmax_aux)
        return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


@dataclasses.dataclass(frozen=True)
class _RunTimeInputs(FlashAttentionInputs):
    """Inputs rebuilt inside the custom op (no autograd there): ``train`` says whether the call's
    key is a training key."""

    train: bool = False

    @property
    def needs_grad(self) -> bool:
        return self.train


def _ws_floor(backward: bool) -> float:
    """The forward FLOPs below which the warp-specialised kernels are neither the rule nor offered
    to the tuner (read at call time, so a benchmark may move it)."""
    return WS_MIN_FLOPS_BWD if backward else WS_MIN_FLOPS


def _call_signature(q, k, v, causal, scale, window, cap, return_lse, platform, deterministic, packed=None):
    """The executor's hot-path signature of a call without extra tensors or dropout
    (:meth:`FlashAttention.signature`; :func:`flash_attention` builds it from its own arguments):
    shapes, dtypes, devices, the grad flag and the scalars with their types, or None for tensor
    subclasses (fake / distributed tensors, Parameters), which take the full path. ``packed``:
    :func:`packed_signature`'s tuple for packed calls."""
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return None
    if isinstance(window, list):
        window = tuple(window)
    # (1.0, 3) == (1, 3) and hashes alike: the types go in, so only the full path judges a float
    window_types = tuple(map(type, window)) if isinstance(window, tuple) else None
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, grad, bool(causal),
            type(causal), scale, type(scale), window, type(window), window_types, cap, type(cap), bool(return_lse),
            platform, bool(deterministic), packed)


@assume_constant_result
def _platform_while_tracing(op_name: str, config_platform: str, call_platform: str, device: torch.device,
                            dtype: torch.dtype) -> str:
    """``resolve_platform`` from what a trace holds as constants (device, dtype, platform
    arguments), evaluated outside the trace: the platform is fixed per compiled graph."""
    op = _TRACED_OPS[op_name]
    probe = _PlatformProbe(torch.empty(0, dtype=dtype, device=device), call_platform)
    return Operation.resolve_platform(op, probe, FlashAttentionConfig(platform=config_platform))


@dataclasses.dataclass(frozen=True)
class _PlatformProbe:
    """What platform resolution reads of an inputs object: the query's device and dtype."""

    query: torch.Tensor
    platform: str


#: ops by name, for _platform_while_tracing
_TRACED_OPS: dict[str, "FlashAttention"] = {}


def register_traced_op(op: "FlashAttention") -> None:
    """Make ``op`` (a FlashAttention subclass instance) resolvable by name while torch.compile
    traces: the platform of a traced call is looked up by the op's name."""
    _TRACED_OPS[op.name] = op


class FlashAttention(Operation):
    """Exact attention without materialising the score matrix, forward and backward."""

    name = "flash_attention"
    config_type = FlashAttentionConfig
    platforms = ("triton", "torch")
    bucketed_fields = ("seq_q", "seq_k")
    kernel_modules = ("kernelops.kernels.common.masking", "kernelops.kernels.flash_attention.fwd",
                      "kernelops.kernels.flash_attention.fwd_tma", "kernelops.kernels.flash_attention.fwd_ws",
                      "kernelops.kernels.flash_attention.bwd", "kernelops.kernels.flash_attention.bwd_ws",
                      "kernelops.kernels.flash_attention.varlen",
                      "kernelops.kernels.flash_attention.decode",
                      "kernelops.modules.flash_attention")  # the last holds the candidate space and smem model

    def prepare(self, *, query, key, value, causal=False, softmax_scale=None, sliding_window=None,
                logits_soft_cap=None, return_lse=False, platform="auto", bias=None, alibi_slopes=None,
                softmax_aux=None, deterministic=False, mask_info=None, cum_seqlens_q=None,
                cum_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, dropout_prob=0.0,
                dropout_seed=None) -> FlashAttentionInputs:
        dropout_prob = check_dropout(dropout_prob)
        if dropout_seed is None:  # a fresh seed from torch's RNG (torch.manual_seed makes it reproducible)
            dropout_seed = int(torch.randint(0, 2 ** 31 - 1, (1,)).item()) if dropout_prob > 0 else 0
        elif isinstance(dropout_seed, bool) or not isinstance(dropout_seed, numbers.Integral) or \
                not 0 <= dropout_seed < 2 ** 62:
            raise ValueError(f"dropout_seed must be an int in [0, 2**62) or None, got {dropout_seed!r}")
        else:
            dropout_seed = int(dropout_seed)
        max_q = max_k = 0
        if cum_seqlens_q is not None or cum_seqlens_k is not None:
            max_q, max_k = check_varlen(query, key, value, cum_seqlens_q, cum_seqlens_k, max_seqlen_q, max_seqlen_k)
            if bias is not None or mask_info is not None:
                given = f"bias.shape={tuple(bias.shape)}" if bias is not None else "mask_info"
                raise ValueError(f"bias and mask_info are not supported with packed sequences (cum_seqlens), got "
                                 f"{given} with query.shape={tuple(query.shape)}: the sequences are already separated")
            num_seqs, heads = cum_seqlens_q.numel() - 1, query.shape[1]
            if alibi_slopes is not None and tuple(alibi_slopes.shape) not in ((heads,), (num_seqs, heads)):
                raise ValueError(f"alibi_slopes must be [Hq] or [num_seqs, Hq] = [{heads}] or [{num_seqs}, {heads}], "
                                 f"got alibi_slopes.shape={tuple(alibi_slopes.shape)}")
            check_extras(query.unsqueeze(0), key.unsqueeze(0), None, None, softmax_aux)
        else:
            if max_seqlen_q is not None or max_seqlen_k is not None:
                raise ValueError("max_seqlen_q/max_seqlen_k go with packed sequences (cum_seqlens_q/k)")
            check_tensors(query, key, value)
            check_extras(query, key, bias, alibi_slopes, softmax_aux)
        bias, q_seg, kv_seg = lower_mask_info(mask_info, query, key, bias)
        if platform not in PLATFORMS:
            raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
        softmax_scale, logits_soft_cap = check_scalars(query.shape[-1], softmax_scale, logits_soft_cap)
        left, right, windowed = window_bounds(sliding_window, bool(causal))
        return FlashAttentionInputs(query, key, value, softmax_scale, bool(causal), left, right, windowed,
                                    logits_soft_cap, bool(return_lse), platform, bias, alibi_slopes, softmax_aux,
                                    bool(deterministic), q_seg, kv_seg, cum_seqlens_q, cum_seqlens_k, max_q, max_k,
                                    dropout_prob, dropout_seed)

    def device_of(self, inputs):
        return inputs.query.device

    # --- the hot path ---------------------------------------------------------------------------
    def signature(self, kwargs):
        """Plain q/k/v calls (causal, window, softcap, scale, lse; no extra tensors, no dropout),
        and packed ones with ``max_seqlen_q/k`` given or their offsets' lengths remembered
        (``packed_offsets.packed_signature``): :func:`_call_signature` (for packed calls with the
        offsets' shapes, dtypes and devices and the bounds' buckets appended; their values are
        checked on the device every call)."""
        get = kwargs.get
        if get("dropout_prob") or get("bias") is not None or get("alibi_slopes") is not None or \
                get("softmax_aux") is not None or get("mask_info") is not None:
            return None
        packed = packed_signature(get("cum_seqlens_q"), get("cum_seqlens_k"), get("max_seqlen_q"),
                                   get("max_seqlen_k"))
        if packed is False:
            return None
        return _call_signature(kwargs["query"], kwargs["key"], kwargs["value"], get("causal", False),
                               get("softmax_scale"), get("sliding_window"), get("logits_soft_cap"),
                               get("return_lse", False), get("platform", "auto"), get("deterministic", False), packed)

    def launcher(self, inputs, config):
        from kernelops.kernels.flash_attention.registration import FlashAttentionFunction, plain_forward, planned_call

        args = self._launch_args(inputs, config, self.resolve_platform(inputs, config))
        if inputs.varlen:
            packed = self._packed_launcher(inputs, args)
            return packed if inputs.return_lse else lambda kw: packed(kw)[0]
        if (planned := planned_call(args, inputs.needs_grad)) is not None:
            fn = planned
        elif inputs.needs_grad:
            extras = (None,) * 7 + args
            fn = lambda q, k, v: FlashAttentionFunction.apply(q, k, v, *extras)  # noqa: E731
        else:
            fn = plain_forward(*args)
        # one frame between the executor and the launch (host time: benchmarks/dispatch_overhead.py)
        if inputs.return_lse:
            return lambda kw: fn(kw["query"], kw["key"], kw["value"])
        return lambda kw: fn(kw["query"], kw["key"], kw["value"])[0]

    @staticmethod
    def _packed_launcher(inputs, args):
        """The hot-path launcher of packed calls: the offsets' values checked (one device
        launch on CUDA), then the forward (through autograd when gradients are needed)."""
        from kernelops.kernels.flash_attention.registration import FlashAttentionFunction, fwd_impl

        run = FlashAttentionFunction.apply if inputs.needs_grad else fwd_impl
        total_q, total_k = inputs.query.shape, inputs.key.shape

        def launch(kw):  # the signature holds the bounds' buckets; the call's own bounds are checked
            cu_q, cu_k = kw["cum_seqlens_q"], kw["cum_seqlens_k"]
            check_offset_values(cu_q, cu_k, total_q, total_k, kw["max_seqlen_q"], kw["max_seqlen_k"])
            return run(kw["query"], kw["key"], kw["value"], *(None,) * 5, cu_q, cu_k, *args)
        return launch

    def not_supported_reasons(self, inputs, platform, device: DeviceInfo) -> list[str]:
        if platform == "torch":
            return []
        if platform != "triton":
            return [f"unknown platform {platform!r}"]
        reasons = []
        dtype = inputs.query.dtype
        if dtype not in _TRITON_DTYPES:
            reasons.append(f"triton kernels take float16/bfloat16/float32, got {dtype}")
        if not device.is_cuda:
            if os.environ.get("TRITON_INTERPRET") != "1":
                reasons.append(f"{device.name} tensors need a CUDA device, or TRITON_INTERPRET=1 for the interpreter")
            elif dtype == torch.bfloat16:
                reasons.append("the Triton interpreter computes bfloat16 dots wrongly on CPU; use float16/float32")
        return reasons

    def key(self, inputs):
        q = inputs.query
        (seq_q, seq_k), (hq, hkv) = inputs.seq_lens, inputs.heads
        window = f"{bucket(inputs.win_left)}:{bucket(inputs.win_right)}" if inputs.windowed else None
        key = (("dtype", str(q.dtype).removeprefix("torch.")), ("head_dim", q.shape[-1]),
                ("causal", inputs.causal), ("window", window), ("softcap", inputs.logits_soft_cap is not None),
                ("gqa", hq // hkv), ("varlen", inputs.varlen), ("bias", inputs.bias_kind),
                ("alibi", inputs.alibi_slopes is not None), ("sinks", inputs.softmax_aux is not None),
                ("segments", inputs.q_segment_ids is not None), ("dropout", inputs.dropout_prob > 0),
                ("train", inputs.needs_grad),
                ("seq_q", bucket(seq_q)), ("seq_k", bucket(seq_k)))
        if self.decode_applies(inputs):  # only then: so shipped lookups never mix decode and dense entries
            key += (("decode", True),)
        return key

    def compile_variant(self, inputs) -> tuple:
        """What, besides the key's compile fields (``Tunable.runtime_key_fields`` left out) and a
        candidate's params, makes the Gluon kernels compile another variant: causal (a constexpr
        there, a window bound in the Triton kernels), a causal window (the backward's third causal
        mode), a group of 1 (Triton specialises ints equal to 1), the forward's consumer warpgroups
        (:func:`fwd_ws.ws_consumers`, by length at D=64) and the backward's GQA split (by length,
        group and band). ``kernelops tune``'s compile warm-up (tuning/compile.py) keeps one spec per
        such variant, so a key's kernels compile in the warm-up's processes, not while it is timed."""
        from kernelops.kernels.flash_attention.bwd_d256 import D256, d256_split
        from kernelops.kernels.flash_attention.bwd_fused import fused_split
        from kernelops.kernels.flash_attention.bwd_ws import dkdv_ws_band
        from kernelops.kernels.flash_attention.fwd_ws import ws_consumers

        (seq_q, seq_k), (hq, hkv), D = inputs.seq_lens, inputs.heads, inputs.query.shape[-1]
        band = dkdv_ws_band(inputs.win_left, inputs.win_right, seq_k)
        rule = d256_split if D == D256 else fused_split
        split = band is not None and rule((1, seq_q, hq, D), (1, seq_k, hkv, D), *band)
        # a causal window is the Gluon backward's third CAUSAL mode; a group of 1 is an int Triton
        # specialises (== 1) in every kernel that takes the group
        return (("causal", inputs.causal), ("causal_window", band is not None and band[1] is not None),
                ("group1", hq == hkv), ("consumers", ws_consumers(D, inputs.causal, seq_q)), ("gqa_split", split))

    # --- configs ------------------------------------------------------------------------------
    def decode_applies(self, inputs) -> bool:
        """Decode-shaped forwards run the split-KV kernel (kernels/flash_attention/decode.py):
        dense (not packed) calls with ``Sq <= 16`` and ``group * Sq <= 128`` whose score terms
        are at most causal / window / softcap / sinks."""
        from kernelops.kernels.flash_attention.smem import MAX_DECODE_ROWS, decode_rows

        q = inputs.query
        return (not inputs.varlen and q.dim() == 4 and q.shape[1] <= DECODE_MAX_SEQ_Q
                and decode_rows(q, inputs.key) <= MAX_DECODE_ROWS and inputs.bias is None
                and inputs.alibi_slopes is None and inputs.q_segment_ids is None and inputs.dropout_prob == 0)

    def smem_bytes(self, config: FlashAttentionConfig, inputs) -> int:
        """Estimated shared memory of the largest kernel the call launches (forward or decode,
        and backward)."""
        D = inputs.query.shape[-1]
        block_d, elem = block_dim(D), smem_elem(inputs.query.dtype)
        if self.decode_applies(inputs) and config.decode_params is not None:
            first = smem_decode(config.decode_params, block_d, elem, self._decode_rows(inputs))
        else:
            first = smem_fwd(config.fwd_params, block_d, elem)
        return max(first, smem_bwd(config.bwd_params, block_d, elem))

    @staticmethod
    def _decode_rows(inputs) -> int:
        from kernelops.kernels.flash_attention.smem import decode_rows

        return decode_rows(inputs.query, inputs.key)

    def complete_config(self, config, inputs, device: DeviceInfo):
        """An explicit/overlay config, completed from the heuristic and checked before any launch."""
        config = super().complete_config(config, inputs, device)
        for name in ("fwd_params", "bwd_params"):
            p = getattr(config, name)
            if min(p.q_blocksize, p.kv_blocksize) < 16:
                raise ValueError(f"{name}: tiles must be at least 16 (tl.dot's minimum), got {p}")
        if config.decode_params.kv_blocksize < 16:
            raise ValueError(f"decode_params: tiles must be at least 16 (tl.dot's minimum), got {config.decode_params}")
        if device.is_cuda and self.smem_bytes(config, inputs) > device.smem_bytes:
            raise ValueError(f"config needs ~{self.smem_bytes(config, inputs)} bytes of shared memory, more than the "
                             f"{device.smem_bytes} of {device.name}: use smaller tiles or fewer stages ({config})")
        return config

    def heuristic_config(self, inputs, device: DeviceInfo) -> FlashAttentionConfig:
        from kernelops.kernels.flash_attention.smem import MAX_DECODE_ROWS

        D = inputs.query.shape[-1]
        if not device.is_cuda:  # interpreter / torch platform: few, large programs run fastest
            return FlashAttentionConfig(FwdParams(32, 32, 4, 1), BwdParams(32, 32, 4, 1),
                                        decode_params=DecodeParams(32, 4, 1))
        # From a sweep of launch configs on an H100 (bf16).
        keys = bucket(inputs.seq_lens[1])  # per bucket: every length in a bucket gets the same tiles
        if D <= 64:
            fwd, bwd = FwdParams(128, 64, 4, 3), BwdParams(32, 128, 4, 3)
        elif D <= 128:
            fwd, bwd = FwdParams(128, 128 if keys >= 8192 else 64, 8, 3), BwdParams(64, 128, 8, 3)
            if keys <= 2048:  # short sequences: smaller tiles, more programs (H100/H200 llm tuning logs)
                bwd = BwdParams(64, 64, 4, 2)
            if keys <= 1024:
                fwd = FwdParams(64, 64, 4, 3)
            if self.tma_applies(inputs, device) and (keys <= 2048 or (keys <= 4096 and inputs.win_right == 0)):
                fwd = FwdParams(64, 64, 4, 3, tma=True)  # what the H100 tuner chose there (docs/performance.md)
        else:  # D=256: the H100 tuner took the TMA forward at every length and 64x64 backward tiles
            fwd, bwd = FwdParams(128, 32, 8, 3), BwdParams(64, 64, 8, 2)
            if self.tma_applies(inputs, device):
                fwd = FwdParams(64, 64, 4, 3, tma=True) if keys <= 4096 else FwdParams(128, 64, 8, 2, tma=True)
        # decode is memory-bound: deep pipelines of ~32 KiB K/V tiles; more warps for tall tiles
        elem = smem_elem(inputs.query.dtype)
        block_d = block_dim(D)
        rows = min(self._decode_rows(inputs), MAX_DECODE_ROWS) if inputs.query.dim() == 4 else 16
        decode = DecodeParams(max(16, 8192 // block_d), 4 if rows <= 64 else 8, 3)
        fwd = fit_smem(fwd, lambda p: smem_fwd(p, block_d, elem), device.smem_bytes)
        bwd = fit_smem(bwd, lambda p: smem_bwd(p, block_d, elem), device.smem_bytes)
        decode = fit_smem(decode, lambda p: smem_decode(p, block_d, elem, rows), device.smem_bytes)
        return FlashAttentionConfig(fwd, bwd, decode_params=decode)

    def tma_applies(self, inputs, device: DeviceInfo) -> bool:
        """Whether the call may run the TMA-descriptor forward (``FwdParams.tma``):
        ``kernels.flash_attention.choice.tma_applies``."""
        from kernelops.kernels.flash_attention import choice

        return choice.tma_applies(inputs, device)

    def ws_applies(self, inputs, device: DeviceInfo, backward: bool = False) -> bool:
        """Whether the call may run the warp-specialised Gluon kernels (``FwdParams.ws`` /
        ``BwdParams.ws``): ``kernels.flash_attention.choice.ws_applies``."""
        from kernelops.kernels.flash_attention import choice

        return choice.ws_applies(inputs, device, backward)

    def ws_auto(self, inputs, device: DeviceInfo, backward: bool = False) -> bool:
        """``FwdParams.ws=None`` / ``BwdParams.ws=None`` resolved: the warp-specialised kernels where
        they apply, for calls of at least :data:`WS_MIN_FLOPS` forward FLOPs (the backward
        :data:`WS_MIN_FLOPS_BWD`): ``kernels.flash_attention.choice.ws_auto``."""
        from kernelops.kernels.flash_attention import choice

        return choice.ws_auto(inputs, device, _ws_floor(backward), backward)

    def ws_worth_tuning(self, inputs, device: DeviceInfo, backward: bool = False) -> bool:
        """Whether the tuner offers the warp-specialised kernel: where it applies and the call has at
        least the rule's floor of forward FLOPs (:func:`_ws_floor`). A key holds no batch or head
        count, so a ``ws=True`` won on a small call would be reused on calls whose host cost it
        cannot hide; below the floor the tuner chooses among the other kernels (``ws=False``), above
        it the winner may be either."""
        from kernelops.kernels.flash_attention import choice

        return choice.ws_applies(inputs, device, backward) and choice.ws_flops(inputs) >= _ws_floor(backward)

    def ws_on(self, inputs, params: FwdParams | BwdParams) -> bool:
        """``params.ws`` with None (automatic) resolved for this call. While torch.compile traces an
        explicit config, None means off: the rule reads shapes, which would add guards to the graph
        (configs resolved when the op runs, the compiled default, apply the rule then)."""
        if params.ws is not None:
            return params.ws
        if torch.compiler.is_compiling():
            return False
        return self.ws_auto(inputs, device_info(inputs.query.device), backward=isinstance(params, BwdParams))

    def fused_on(self, inputs, params: BwdParams) -> bool:
        """Whether a backward that runs the warp-specialised dK/dV kernel forms dQ in it too
        (``BwdParams.fused``; kernels/flash_attention/bwd_fused.py). Never with ``deterministic``:
        the fused kernel adds dQ (and, splitting long GQA calls, dK and dV) in float32 in any
        order. ``None``: yes (D=64 and 128, bwd_fused.py;
        D=256, bwd_d256.py, the only Gluon backward there). With each block's lse and delta loaded by TMA (docs/performance.md) it
        measured on an H200 1.04-1.16x the split backward at D=64 and 1.12-1.24x at D=128 except the
        causal 1k row (0.89-0.91x, below the FLOP floor where the Gluon kernels do not run by
        default). A tuned config may still say ``fused=False`` for its key."""
        if inputs.deterministic:
            return False
        if params.fused is not None:
            return params.fused
        return inputs.query.shape[-1] in (64, 128, 256)

    def phases(self, inputs):
        # tune only what will run: nothing when the call resolves to the torch platform
        if self.resolve_platform(inputs, FlashAttentionConfig()) != "triton":
            return ()
        first = "decode" if self.decode_applies(inputs) else "fwd"
        return (first, "bwd") if inputs.needs_grad else (first,)

    def candidate_params(self, inputs, device: DeviceInfo, phase: str):
        D = inputs.query.shape[-1]
        block_d = block_dim(D)
        elem = smem_elem(inputs.query.dtype)
        if phase == "fwd":
            tiles = [(64, 64), (128, 64), (128, 128), (64, 128)] if D <= 128 else [(64, 32), (64, 64), (128, 32)]
            space = [FwdParams(m, n, w, s) for m, n in tiles for w in (4, 8) for s in (2, 3, 4)]
            if self.tma_applies(inputs, device):  # the TMA kernel at the tiles that won for it on an H100
                space += [FwdParams(m, n, w, s, tma=True) for m, n, w, s in
                          ((64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3))]
            if self.ws_worth_tuning(inputs, device):  # one config: its tiles are fixed (the others say ws=False)
                space = [dataclasses.replace(p, ws=False) for p in space] + [FwdParams(64, 64, 4, 3, tma=True, ws=True)]
            smem = lambda p: smem_fwd(p, block_d, elem)  # noqa: E731
        elif phase == "decode":
            rows = self._decode_rows(inputs)
            space = [DecodeParams(n, w, s) for n in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)]
            smem = lambda p: smem_decode(p, block_d, elem, rows)  # noqa: E731
        else:
            tiles = [(32, 64), (32, 128), (64, 64), (64, 128)] if D <= 128 else \
                [(16, 64), (32, 64), (32, 32), (64, 64), (64, 32), (16, 128)]
            space = [BwdParams(m, n, w, s) for m, n in tiles for w in (4, 8) for s in (1, 2, 3)]
            if self.ws_worth_tuning(inputs, device, backward=True):
                # the Gluon dK/dV kernel beside the best dQ tiles, and the fused kernel (no tiles of its
                # own); at D=256 only the fused kernel exists (bwd_d256)
                split = [] if D > 128 else [BwdParams(*t, ws=True, fused=False) for t in WS_DQ_TILES]
                space = [dataclasses.replace(p, ws=False) for p in space] + split + [
                    BwdParams(*WS_DQ_TILES[1], ws=True, fused=True)]
            smem = lambda p: smem_bwd(p, block_d, elem)  # noqa: E731
        # shrink what does not fit (float32, large head dims) instead of dropping it; drop repeats
        fitted = [fit_smem(p, smem, device.smem_bytes) for p in space]
        return [p for i, p in enumerate(fitted) if smem(p) <= device.smem_bytes and p not in fitted[:i]]

    # --- running ------------------------------------------------------------------------------
    def _launch_args(self, inputs, config, platform):
        """The custom op's arguments after the tensors. Params left None in ``config`` (the
        :meth:`deferred_config` of a torch.compile trace) go as ``[]``: resolved when the op runs."""
        f, b = config.fwd_params, config.bwd_params
        fwd = []
        if f is not None:
            fwd = [f.q_blocksize, f.kv_blocksize, f.num_warps, f.num_stages]
            ws = platform == "triton" and self.ws_on(inputs, f)
            if f.tma or ws:  # a fifth element: bit 0 FwdParams.tma, bit 1 the warp-specialised kernel
                fwd.append(int(f.tma) | 2 * int(ws))
        bwd = [] if b is None else [b.q_blocksize, b.kv_blocksize, b.num_warps, b.num_stages]
        if b is None and inputs.deterministic:
            bwd = list(SPLIT_AUTO)  # resolved when the op runs, without the fused dQ
        if b is not None and platform == "triton" and inputs.needs_grad and self.ws_on(inputs, b):
            # a fifth element: bit 1 the warp-specialised dK/dV kernel (BwdParams.ws resolved), bit 2 with dQ fused in
            bwd.append(2 | 4 * int(self.fused_on(inputs, b)))
        if platform == "triton" and f is not None and self.decode_applies(inputs):
            d = config.decode_params
            if d is None:  # a cached config from before decode_params existed
                d = self.heuristic_config(inputs, device_info(inputs.query.device)).decode_params
            fwd = [0, d.kv_blocksize, d.num_warps, d.num_stages, d.num_splits]
        return (inputs.softmax_scale, inputs.win_left, inputs.win_right, inputs.logits_soft_cap or 0.0,
                inputs.dropout_prob, inputs.dropout_seed, platform, fwd, bwd, self.name, inputs.causal,
                inputs.windowed, inputs.needs_grad, inputs.max_seqlen_q, inputs.max_seqlen_k)

    def run(self, inputs, config):
        from kernelops.kernels.flash_attention.registration import flash_attention_apply

        platform = self.resolve_platform(inputs, config)
        out, lse = flash_attention_apply(inputs.query, inputs.key, inputs.value, inputs.bias, inputs.alibi_slopes,
                                          inputs.softmax_aux, inputs.q_segment_ids, inputs.kv_segment_ids,
                                          inputs.cum_seqlens_q, inputs.cum_seqlens_k,
                                          *self._launch_args(inputs, config, platform))
        return (out, lse) if inputs.return_lse else out

    # --- torch.compile: configs resolved when the op runs --------------------------------------
    def deferred_config(self, inputs) -> FlashAttentionConfig:
        """The config a torch.compile trace bakes in: no launch params (they are resolved by
        :meth:`resolve_at_run_time` each time the compiled graph runs the op)."""
        return FlashAttentionConfig()

    def resolve_platform(self, inputs, config) -> str:
        if torch.compiler.is_compiling():  # a graph constant, computed outside the trace
            return _platform_while_tracing(self.name, getattr(config, "platform", "auto"), inputs.platform,
                                           inputs.query.device, inputs.query.dtype)
        return super().resolve_platform(inputs, config)

    def resolve_at_run_time(self, tensors, scalars, train: bool) -> tuple[list[int], list[int]]:
        """``(fwd_params, bwd_params)`` for a custom-op call with auto (``[]``) params: the
        call's inputs rebuilt from the op's arguments, its config from the default executor
        (memory, disk, shipped caches, tuning when policy and circumstances allow, heuristic),
        remembered per call signature (shapes, dtypes, devices, scalars) like the eager hot path."""
        q, k, v, bias, alibi, aux, q_seg, kv_seg, cu_q, cu_k = tensors
        max_q, max_k = scalars.max_seqlen_q, scalars.max_seqlen_k
        signature = None
        if cu_q is None or (max_q and max_k):  # else the key depends on the offsets' values
            # what the key and the decode choice read (not the scale or the dropout seed)
            signature = (tuple(None if t is None else (t.shape, t.dtype, t.device) for t in tensors), scalars.causal,
                         scalars.windowed, scalars.win_left, scalars.win_right, scalars.softcap > 0,
                         scalars.dropout_p > 0, max_q, max_k, train)

        def make_inputs():
            mq, mk = max_q, max_k
            if cu_q is not None and not (mq and mk):  # not given: read the offsets (a host sync)
                lens_q, lens_k = (cu[1:] - cu[:-1] for cu in (cu_q, cu_k))
                mq, mk = int(lens_q.max()), int(lens_k.max())
            return _RunTimeInputs(q, k, v, scalars.softmax_scale, scalars.causal, scalars.win_left, scalars.win_right,
                                  scalars.windowed, scalars.softcap or None, False, scalars.platform, bias, alibi, aux,
                                  False, q_seg, kv_seg, cu_q, cu_k, mq, mk, scalars.dropout_p, scalars.dropout_seed,
                                  train=train)

        def finish(config, inputs):
            args = self._launch_args(inputs, config, scalars.platform)
            return args[7], args[8]

        executor = default_executor()
        if signature is None:
            inputs = make_inputs()
            return finish(executor.resolve(self, inputs), inputs)
        return executor.resolve_remembered(self, signature, make_inputs, finish)

    def bench_fn(self, inputs, config, phase):
        from kernelops.kernels.flash_attention.dispatch import flash_attention_bwd
        from kernelops.kernels.flash_attention.dispatch import flash_attention_decode
        from kernelops.kernels.flash_attention.dispatch import flash_attention_fwd_dense

        q, k, v = inputs.query.detach(), inputs.key.detach(), inputs.value.detach()
        band = dict(softmax_scale=inputs.softmax_scale, win_left=inputs.win_left, win_right=inputs.win_right,
                    softcap=inputs.logits_soft_cap, bias=inputs.bias, alibi_slopes=inputs.alibi_slopes,
                    softmax_aux=inputs.softmax_aux, q_segment_ids=inputs.q_segment_ids,
                    kv_segment_ids=inputs.kv_segment_ids, cum_seqlens_q=inputs.cum_seqlens_q,
                    cum_seqlens_k=inputs.cum_seqlens_k, dropout_p=inputs.dropout_prob,
                    dropout_seed=inputs.dropout_seed)
        if phase == "decode":
            return lambda: flash_attention_decode(q, k, v, softmax_scale=inputs.softmax_scale,
                                                  win_left=inputs.win_left, win_right=inputs.win_right,
                                                  softcap=inputs.logits_soft_cap, softmax_aux=inputs.softmax_aux,
                                                  **dataclasses.asdict(config.decode_params))
        fwd = dict(dataclasses.asdict(config.fwd_params), ws=self.ws_on(inputs, config.fwd_params))
        if phase == "fwd":
            return lambda: flash_attention_fwd_dense(q, k, v, **band, **fwd)
        out, lse = flash_attention_fwd_dense(q, k, v, **band, **fwd)
        dout = torch.randn_like(out)
        bwd = dict(dataclasses.asdict(config.bwd_params), ws=self.ws_on(inputs, config.bwd_params),
                   fused=self.fused_on(inputs, config.bwd_params))
        bias_grad = inputs.bias is not None and inputs.bias.requires_grad
        return lambda: flash_attention_bwd(q, k, v, out, dout, lse, **band, **bwd, bias_grad=bias_grad)

    def fused_by_default(self, inputs) -> bool:
        """Whether a training call's backward takes the fused Gluon kernel by default on an sm_90
        GPU (``BwdParams.ws`` and ``fused`` left to their rules, read for an H100-class device), so
        an estimate for another device is an upper bound."""
        return self.ws_auto(inputs, _SM90, backward=True) and self.fused_on(inputs, BwdParams())

    def estimate_memory(self, inputs) -> dict[str, int]:
        q, k = inputs.query, inputs.key
        rows = q.numel() // q.shape[-1]  # B * Sq * Hq (or total_q * Hq when packed)
        elem = q.element_size()
        train = inputs.needs_grad
        # the fused backward's float32 dQ buffer where it runs by default (sm_90: see fused_by_default)
        dq_acc = q.numel() * 4 if train and self.fused_by_default(inputs) else 0
        return {
            "inputs": (q.numel() + 2 * k.numel()) * elem,
            "outputs": q.numel() * elem,
            "saved_statistics": rows * 4,                               # lse, float32
            "workspace": (rows * 4 + dq_acc) if train else 0,           # delta of the backward (+ dQ in float32)
            "gradients": (2 * q.numel() + 2 * k.numel()) * elem if train else 0,  # dout, dq, dk, dv
        }


#: the device the memory estimate assumes for the fused backward's rule (an H100 SXM's limits)
_SM90 = DeviceInfo("cuda", 0, "sm_90", (9, 0), 232448, 132)

FLASH_ATTENTION = FlashAttention()
register_traced_op(FLASH_ATTENTION)
register_resolver(FLASH_ATTENTION.name, FLASH_ATTENTION.resolve_at_run_time)


def flash_attention(query, key, value, *, causal: bool = False, softmax_scale: float | None = None,
                    sliding_window: int | tuple[int | None, int | None] | None = None,
                    logits_soft_cap: float | None = None, bias: torch.Tensor | None = None,
                    alibi_slopes: torch.Tensor | None = None, softmax_aux: torch.Tensor | None = None,
                    mask_info=None, cum_seqlens_q: torch.Tensor | None = None,
                    cum_seqlens_k: torch.Tensor | None = None, max_seqlen_q: int | None = None,
                    max_seqlen_k: int | None = None, dropout_prob: float = 0.0,
                    dropout_seed: int | None = None, deterministic: bool = False, return_lse: bool = False,
                    platform: str = "auto", cfg: FlashAttentionConfig | None = None):
    """Exact softmax attention, memory O(S * D), forward and backward.

    Args:
        query: ``[B, Sq, Hq, D]`` float16 / bfloat16 / float32 (float64 on the torch platform).
        key, value: ``[B, Sk, Hkv, D]``, same dtype and device; ``Hq % Hkv == 0`` (GQA / MQA).
        causal: mask keys after the query; with ``Sq != Sk`` the mask is aligned bottom-right
            (query ``i`` sees keys ``j <= i + Sk - Sq``), as in flash-attn >= 2.1.
        softmax_scale: logits multiplier, default ``1 / sqrt(D)``.
        sliding_window: ``w`` or ``(left, right)``: query ``i`` sees keys
            ``i + Sk - Sq - left <= j <= i + Sk - Sq + right`` (``None`` on a side: unbounded;
            an int ``w`` means ``(w, w)``; with ``causal`` the right side is 0).
        logits_soft_cap: ``c`` applies ``c * tanh(logits / c)`` to the scaled logits (Gemma 2).
        bias: additive ``[B or 1, Hq or 1, Sq, Sk]`` in any float dtype and any strides (broadcast
            without copies), added after the soft cap; it gets a gradient when it requires one.
        alibi_slopes: ``[Hq]`` or ``[B, Hq]``: adds ``-slope_h * |j - (i + Sk - Sq)|`` (ALiBi),
            computed in the kernel.
        softmax_aux: ``[Hq]`` sink logits (gpt-oss attention sinks): each row's softmax
            denominator gains ``exp(softmax_aux[h])``; differentiable.
        mask_info: a :class:`kernelops.MaskInfo`, combined with causal / window / bias. Segment ids
            (``MaskInfo.from_segments``, or a ``[B, S]`` padding mask) are applied inside the
            kernels from the ``[B, S]`` ids; a ``[B, 1 or H, Sq, Sk]`` boolean mask becomes an
            additive bias. A query that sees no key gets output 0 and zero gradients.
        cum_seqlens_q, cum_seqlens_k: packed variable-length batches: ``query [total_q, Hq, D]``,
            ``key/value [total_k, Hkv, D]`` with int32 offsets ``[num_seqs + 1]`` (starting at 0,
            non-decreasing, ending at the token count). Sequences of length 0 and 1 are fine;
            causal/window align per sequence. The launch does work ~ the sum of lengths (no
            padding to the longest). Output ``[total_q, Hq, D]``, lse ``[Hq, total_q]``;
            ``alibi_slopes`` may be ``[num_seqs, Hq]``; ``bias``/``mask_info`` are not allowed.
        max_seqlen_q, max_seqlen_k: with packed batches, upper bounds on the sequence lengths
            (as in flash-attn). Without them the offsets are read on the host to check them and
            find the longest (a device sync per call, which also rules out CUDA-graph capture);
            with them, CUDA offsets are checked by a device-side assert instead (no sync; a bad
            tensor fails the next synchronising call) and the bounds pick the tuned config.
        dropout_prob: drop attention probabilities with this probability (kept ones scaled by
            ``1 / (1 - p)``); the lse is that of the undropped softmax.
        dropout_seed: the mask's seed. The Triton kernels draw it with Philox per element and
            regenerate it in the backward (never stored): the same seed gives bitwise the same
            output. ``None`` draws a seed from torch's RNG. The torch platform draws its own masks
            (also reproducible from the seed, but not the Triton kernels' masks).
        deterministic: ask for bitwise-reproducible gradients. The split backward (Triton or Gluon
            dK/dV kernel, then the Triton dQ kernel) accumulates without atomics (dK/dV per KV head
            over its GQA group) and is always deterministic; the fused Gluon backward (sm_90, D=64
            and 128 by default, ``BwdParams.fused``) adds dQ in float32 in any order, so
            ``deterministic=True`` keeps the split backward.
        return_lse: also return the log-sum-exp ``[B, Hq, Sq]`` float32, float64 for float64
            inputs (natural log; -inf for a query that sees no key, whose output row is 0). It is
            differentiable.
        platform: ``"auto"`` (triton on CUDA, torch elsewhere), ``"triton"`` or ``"torch"``.
        cfg: an explicit :class:`FlashAttentionConfig` (used as given, never cached).

    Under ``torch.compile(fullgraph=True)`` the call traces to one custom op without graph
    breaks, and one graph serves every sequence length: the launch config is resolved each time
    the graph runs (the default executor's caches, tuning when allowed, else the heuristic), not
    baked in while tracing. Pass ``dropout_seed`` there (drawing one reads a tensor on the host).

    Returns:
        ``out [B, Sq, Hq, D]`` (dtype of query), or ``(out, lse)`` with ``return_lse=True``.

    Example:
        >>> import torch
        >>> from kernelops import flash_attention
        >>> q = torch.randn(2, 128, 8, 64)
        >>> k = v = torch.randn(2, 128, 2, 64)
        >>> flash_attention(q, k, v, causal=True).shape
        torch.Size([2, 128, 8, 64])
    """
    if cfg is None and bias is None and alibi_slopes is None and softmax_aux is None and mask_info is None and \
            cum_seqlens_q is None and cum_seqlens_k is None and max_seqlen_q is None and max_seqlen_k is None and \
            not dropout_prob and not torch.compiler.is_compiling():
        # the executor's hot path without gathering the keyword arguments: the signature it would
        # build (FlashAttention.signature) from the arguments themselves, its launcher if remembered
        signature = _call_signature(query, key, value, causal, softmax_scale, sliding_window, logits_soft_cap,
                                    return_lse, platform, deterministic)
        if signature is not None:
            launch = remembered_launcher(FLASH_ATTENTION.name, signature)
            if launch is not None:
                return launch({"query": query, "key": key, "value": value})
    return default_executor()(FLASH_ATTENTION, cfg=cfg, query=query, key=key, value=value, causal=causal,
                              softmax_scale=softmax_scale, sliding_window=sliding_window,
                              logits_soft_cap=logits_soft_cap, bias=bias, alibi_slopes=alibi_slopes,
                              softmax_aux=softmax_aux, mask_info=mask_info, cum_seqlens_q=cum_seqlens_q,
                              cum_seqlens_k=cum_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                              dropout_prob=dropout_prob, dropout_seed=dropout_seed,
                              deterministic=deterministic, return_lse=return_lse, platform=platform)
