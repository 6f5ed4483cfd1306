"""flash_attention_fp8: the opt-in FP8 (e4m3) forward, its Operation and its Config.

Tensors are BSHD like :func:`kernelops.flash_attention`: ``query [B, Sq, Hq, D]``,
``key/value [B, Sk, Hkv, D]`` in ``torch.float8_e4m3fn`` with per-tensor descale factors (the real
values are ``descale * stored``); output ``[B, Sq, Hq, D]`` in bfloat16 (or ``out_dtype``),
optional ``lse [B, Hq, Sq]`` float32. Forward only (inference / serving): no autograd.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import os

import torch

from kernelops.modules.attention_args import check_extras, check_tensors, window_bounds, check_scalars
from kernelops.ops.device import DeviceInfo
from kernelops.ops.executor import default_executor
from kernelops.ops.keys import bucket
from kernelops.ops.operation import BACKENDS, PLATFORMS, Operation
from kernelops.ops.params import FwdParams, JsonConfig

FP8_DTYPE = torch.float8_e4m3fn
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclasses.dataclass(frozen=True)
class FlashAttentionFP8Config(JsonConfig):
    """Launch configuration of the FP8 forward: the TMA kernel's tiles, and ``fwd_params.ws``, the
    warp-specialised kernel (``True``, ``False``, or ``None``: :meth:`FlashAttentionFP8.ws_on`'s
    rule); None fields come from the heuristic."""

    fwd_params: FwdParams | None = None
    platform: str = "auto"
    backend: str = "any"

    def __post_init__(self):
        if self.platform not in PLATFORMS:
            raise ValueError(f"FlashAttentionFP8Config.platform must be one of {PLATFORMS}, got {self.platform!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"FlashAttentionFP8Config.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.fwd_params is not None and not isinstance(self.fwd_params, FwdParams):
            raise TypeError(f"FlashAttentionFP8Config.fwd_params must be a FwdParams, "
                            f"got {type(self.fwd_params).__name__}")


@dataclasses.dataclass(frozen=True)
class FlashAttentionFP8Inputs:
    """Normalised arguments of one call (see :func:`flash_attention_fp8`)."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    descale: tuple[float, float, float]
    softmax_scale: float
    causal: bool
    win_left: int
    win_right: int
    windowed: bool
    logits_soft_cap: float | None
    softmax_aux: torch.Tensor | None
    out_dtype: torch.dtype
    return_lse: bool
    platform: str = "auto"


def _descale(name: str, value) -> float:
    """A per-tensor descale factor: a positive finite number or a one-element tensor (read once
    on the host, which synchronises with the device when the tensor lives there)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a number or a one-element tensor (per-tensor scaling), "
                             f"got {name}.shape={tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


class FlashAttentionFP8(Operation):
    """Softmax attention over e4m3 inputs, forward only; on Hopper the warp-specialised Gluon kernel
    (causal or full calls without soft cap or sinks, D 64/128/256) or Triton's TMA kernel, a
    dequantising float32 path on the torch platform."""

    name = "flash_attention_fp8"
    config_type = FlashAttentionFP8Config
    platforms = ("triton", "torch")
    bucketed_fields = ("seq_q", "seq_k")
    kernel_modules = ("kernelops.kernels.common.masking", "kernelops.kernels.flash_attention.fwd_tma",
                      "kernelops.kernels.flash_attention.fwd_ws", "kernelops.kernels.flash_attention.fwd_ws_fp8",
                      "kernelops.modules.flash_attention_fp8")

    def prepare(self, *, query, key, value, q_descale=1.0, k_descale=1.0, v_descale=1.0, causal=False,
                softmax_scale=None, sliding_window=None, logits_soft_cap=None, softmax_aux=None,
                out_dtype=torch.bfloat16, return_lse=False, platform="auto") -> FlashAttentionFP8Inputs:
        check_tensors(query, key, value)
        if query.dtype != FP8_DTYPE:
            raise TypeError(f"flash_attention_fp8 takes {FP8_DTYPE} query/key/value (quantise with a per-tensor "
                            f"scale first), got {query.dtype=}")
        grads = [name for name, t in (("query", query), ("key", key), ("value", value)) if t.requires_grad]
        if grads:
            raise ValueError(f"flash_attention_fp8 is forward-only (no autograd), but {', '.join(grads)} "
                             f"require{'s' if len(grads) == 1 else ''} grad; train with flash_attention in bf16/fp16")
        check_extras(query, key, None, None, softmax_aux)
        if out_dtype not in OUT_DTYPES:
            raise TypeError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype!r}")
        if platform not in PLATFORMS:
            raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
        descale = (_descale("q_descale", q_descale), _descale("k_descale", k_descale),
                   _descale("v_descale", v_descale))
        softmax_scale, logits_soft_cap = check_scalars(query.shape[-1], softmax_scale, logits_soft_cap)
        left, right, windowed = window_bounds(sliding_window, bool(causal))
        return FlashAttentionFP8Inputs(query, key, value, descale, softmax_scale, bool(causal), left, right,
                                       windowed, logits_soft_cap, softmax_aux, out_dtype, bool(return_lse), platform)

    def device_of(self, inputs):
        return inputs.query.device

    def not_supported_reasons(self, inputs, platform, device: DeviceInfo) -> list[str]:
        if platform == "torch":
            return []
        if platform != "triton":
            return [f"unknown platform {platform!r}"]
        from kernelops.kernels.flash_attention.fwd_tma import tma_supported

        reasons = []
        if device.is_cuda and device.capability < (9, 0):
            reasons.append(f"FP8 attention needs Hopper (sm90+) tensor-memory copies, {device.name} is "
                           f"sm{device.capability[0]}{device.capability[1]}")
        elif not device.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            reasons.append(f"{device.name} tensors need a CUDA device, or TRITON_INTERPRET=1 for the interpreter")
        elif not tma_supported(inputs.query, inputs.key, inputs.value):
            reasons.append("the FP8 kernel needs D in {16, 32, 64, 128, 256}, 16-byte aligned rows and BSHD "
                           "strides that read as [B*S, H*D] (contiguous, or sliced from a fused QKV projection)")
        return reasons

    def key(self, inputs):
        q, k = inputs.query, inputs.key
        window = f"{bucket(inputs.win_left)}:{bucket(inputs.win_right)}" if inputs.windowed else None
        return (("dtype", "float8_e4m3fn"), ("head_dim", q.shape[-1]), ("causal", inputs.causal),
                ("window", window), ("softcap", inputs.logits_soft_cap is not None),
                ("gqa", q.shape[2] // k.shape[2]), ("sinks", inputs.softmax_aux is not None),
                ("seq_q", bucket(q.shape[1])), ("seq_k", bucket(k.shape[1])))

    def heuristic_config(self, inputs, device: DeviceInfo) -> FlashAttentionFP8Config:
        if not device.is_cuda:
            return FlashAttentionFP8Config(FwdParams(32, 32, 4, 1))
        # benchmarks/flash_attention_fp8.py on an H100 (D=128): 64x128 tiles from 4k keys up (2k when not
        # causal), 128x64 below; D=256 keeps the tile's shared memory like D=128's
        D, keys = inputs.query.shape[-1], bucket(inputs.key.shape[1])
        if D > 128:
            return FlashAttentionFP8Config(FwdParams(64, 64, 4, 2))
        if keys >= (4096 if inputs.causal else 2048):
            return FlashAttentionFP8Config(FwdParams(64, 128, 4, 3))
        return FlashAttentionFP8Config(FwdParams(128, 64, 4, 3))

    def complete_config(self, config, inputs, device: DeviceInfo):
        config = super().complete_config(config, inputs, device)
        p = config.fwd_params
        if min(p.q_blocksize, p.kv_blocksize) < 16 or any(x & (x - 1) for x in (p.q_blocksize, p.kv_blocksize)):
            raise ValueError(f"fwd_params: tiles must be powers of two >= 16, got {p}")
        return config

    def phases(self, inputs):
        return ("fwd",) if self.resolve_platform(inputs, FlashAttentionFP8Config()) == "triton" else ()

    @staticmethod
    def ws_applies(inputs) -> bool:
        """Whether the warp-specialised kernel can run the call (:mod:`kernels.flash_attention.fwd_ws_fp8`):
        an sm_90 GPU with Gluon, D 64/128/256, ``0 < Sq <= Sk``, q/k row views (``ws_fp8_supported``,
        which reads the tensors' device), a causal or full band, no soft cap or sinks, and a scale
        times the q/k descales it takes."""
        from kernelops.kernels.flash_attention.fwd_ws_fp8 import ws_fp8_supported
        from kernelops.kernels.flash_attention.ws_common import ws_band, ws_scale_ok

        q, k, v = inputs.query, inputs.key, inputs.value
        dq, dk, _ = inputs.descale
        return (ws_band(inputs.win_left, inputs.win_right, k.shape[1]) is not None
                and not inputs.logits_soft_cap and inputs.softmax_aux is None
                and ws_scale_ok(inputs.softmax_scale * dq * dk) and ws_fp8_supported(q, k, v))

    def compile_variant(self, inputs) -> tuple:
        """What, besides the key's compile fields (the registry's runtime fields left out) and a
        candidate's params, makes the kernels compile another variant, now that the Gluon kernel runs
        the op: causal (a constexpr there), a group of 1 (an int Triton specialises) and the consumer
        warpgroups (:func:`fwd_ws.ws_consumers`, by length at D=64); the forward's part of
        ``FlashAttention.compile_variant``, for ``kernelops tune``'s compile warm-up."""
        from kernelops.kernels.flash_attention.fwd_ws import ws_consumers

        q, k = inputs.query, inputs.key
        return (("causal", inputs.causal), ("group1", q.shape[2] == k.shape[2]),
                ("consumers", ws_consumers(q.shape[-1], inputs.causal, q.shape[1])))

    def ws_on(self, inputs, params: FwdParams) -> bool:
        """``params.ws`` resolved for this call: ``True``/``False`` where the kernel applies (``True``
        elsewhere runs the TMA kernel), ``None``: wherever it applies (benchmarks/flash_attention_fp8.py)."""
        if not self.ws_applies(inputs):
            return False
        return True if params.ws is None else params.ws

    def candidate_params(self, inputs, device: DeviceInfo, phase: str):
        D = inputs.query.shape[-1]
        tiles = [(64, 128), (128, 64), (128, 128), (64, 64)] if D <= 128 else [(64, 64), (128, 64), (64, 32)]
        space = [FwdParams(m, n, w, s) for m, n in tiles for w in (4, 8) for s in (2, 3, 4)]
        # Q tile + stages x (K tile + V^T tile), one byte an element
        space = [p for p in space if D * (p.q_blocksize + 2 * p.kv_blocksize * p.num_stages) <= device.smem_bytes]
        if self.ws_applies(inputs):  # one config: its tiles are fixed (the others say ws=False)
            space = [dataclasses.replace(p, ws=False) for p in space] + [FwdParams(64, 64, 4, 3, ws=True)]
        return space

    def _kernel_args(self, inputs, params: FwdParams) -> dict:
        return dict(softmax_scale=inputs.softmax_scale, win_left=inputs.win_left, win_right=inputs.win_right,
                    softcap=inputs.logits_soft_cap, q_blocksize=params.q_blocksize,
                    kv_blocksize=params.kv_blocksize, num_warps=params.num_warps, num_stages=params.num_stages,
                    softmax_aux=inputs.softmax_aux, descale=inputs.descale, out_dtype=inputs.out_dtype)

    def _launcher(self, inputs, params: FwdParams):
        """The Triton launch of this call under ``params``: a callable ``() -> (out, lse)``."""
        q, k, v = inputs.query, inputs.key, inputs.value
        if self.ws_on(inputs, params):
            from kernelops.kernels.flash_attention.fwd_ws_fp8 import flash_attention_fwd_ws_fp8
            from kernelops.kernels.flash_attention.ws_common import ws_band

            return functools.partial(flash_attention_fwd_ws_fp8, q, k, v, softmax_scale=inputs.softmax_scale,
                                     causal=ws_band(inputs.win_left, inputs.win_right, k.shape[1]),
                                     descale=inputs.descale, out_dtype=inputs.out_dtype, checked=True)
        from kernelops.kernels.flash_attention.fwd_tma import flash_attention_fwd_tma

        return functools.partial(flash_attention_fwd_tma, q, k, v, **self._kernel_args(inputs, params))

    def run(self, inputs, config):
        platform = self.resolve_platform(inputs, config)
        if platform == "triton":
            out, lse = self._launcher(inputs, config.fwd_params)()
        else:
            out, lse = fp8_reference(inputs)
        return (out, lse) if inputs.return_lse else out

    def bench_fn(self, inputs, config, phase):
        return self._launcher(inputs, config.fwd_params)

    def estimate_memory(self, inputs) -> dict[str, int]:
        q, k = inputs.query, inputs.key
        return {"inputs": q.numel() + 2 * k.numel(), "outputs": q.numel() * inputs.out_dtype.itemsize,
                "saved_statistics": q.numel() // q.shape[-1] * 4,
                "workspace": k.numel() + 16 * k.shape[0] * k.shape[2] * k.shape[3]}  # V^T copy, padded rows


def fp8_reference(inputs: FlashAttentionFP8Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch platform: dequantise to float32 and run the chunked torch attention (exact
    softmax, no e4m3 rounding of P, so slightly more accurate than the kernel)."""
    from kernelops.kernels.flash_attention.reference import ScoreTerms, flash_attention_torch_fwd

    dq, dk, dv = inputs.descale
    q, k, v = (t.float() * s for t, s in ((inputs.query, dq), (inputs.key, dk), (inputs.value, dv)))
    aux = inputs.softmax_aux.float() if inputs.softmax_aux is not None else None
    out, lse = flash_attention_torch_fwd(q, k, v, softmax_scale=inputs.softmax_scale, win_left=inputs.win_left,
                                         win_right=inputs.win_right, softcap=inputs.logits_soft_cap, dropout_p=0.0,
                                         dropout_seed=0, terms=ScoreTerms(None, None, aux))
    return out.to(inputs.out_dtype), lse


FLASH_ATTENTION_FP8 = FlashAttentionFP8()


def flash_attention_fp8(query, key, value, *, q_descale=1.0, k_descale=1.0, v_descale=1.0, causal: bool = False,
                        softmax_scale: float | None = None,
                        sliding_window: int | tuple[int | None, int | None] | None = None,
                        logits_soft_cap: float | None = None, softmax_aux: torch.Tensor | None = None,
                        out_dtype: torch.dtype = torch.bfloat16, return_lse: bool = False, platform: str = "auto",
                        cfg: FlashAttentionFP8Config | None = None):
    """FP8 (e4m3) attention forward with per-tensor descale factors: the opt-in inference path.

    Args:
        query: ``[B, Sq, Hq, D]`` ``torch.float8_e4m3fn``; the real values are ``q_descale * query``.
        key, value: ``[B, Sk, Hkv, D]`` e4m3 (``Hq % Hkv == 0``), descaled by ``k_descale`` / ``v_descale``.
        q_descale, k_descale, v_descale: positive numbers (or one-element tensors, read once on the
            host). Quantise as ``x8 = (x / s).to(torch.float8_e4m3fn)`` with ``s = x.abs().max() / 448``
            and pass ``s``.
        causal, softmax_scale, sliding_window, logits_soft_cap, softmax_aux: as in
            :func:`kernelops.flash_attention` (bottom-right causal, windows, soft cap on the real logits,
            sink logits ``[Hq]``).
        out_dtype: bfloat16 (default), float16 or float32.
        return_lse: also return the float32 log-sum-exp ``[B, Hq, Sq]``.
        platform: ``"auto"``, ``"triton"`` (Hopper GPUs: the warp-specialised Gluon kernel for causal or
            full calls without soft cap or sinks, else the TMA kernel) or ``"torch"`` (dequantise and
            compute in float32, any device).
        cfg: an explicit :class:`FlashAttentionFP8Config`.

    On the Triton path the scores ``Q K^T`` come from e4m3 tensor-core products, and P enters the
    second product as e4m3 (scaled by 2^8 into its normal range), so the error against float64
    on the dequantised inputs is about that of rounding P to 3 mantissa bits (~2e-2 relative on
    random data, benchmarks/flash_attention_fp8.py) rather than bf16's ~4e-3. V is copied once into a
    transposed layout per call (FP8 tensor-core products need it).

    Returns:
        ``out [B, Sq, Hq, D]`` (``out_dtype``), or ``(out, lse)``.

    Example:
        >>> import torch
        >>> from kernelops import flash_attention_fp8
        >>> q, k, v = (torch.randn(1, 64, 4, 64) for _ in range(3))
        >>> s = [t.abs().max() / 448 for t in (q, k, v)]
        >>> q8, k8, v8 = ((t / si).to(torch.float8_e4m3fn) for t, si in zip((q, k, v), s))
        >>> flash_attention_fp8(q8, k8, v8, q_descale=s[0], k_descale=s[1], v_descale=s[2], causal=True).dtype
        torch.bfloat16
    """
    return default_executor()(FLASH_ATTENTION_FP8, cfg=cfg, query=query, key=key, value=value, q_descale=q_descale,
                              k_descale=k_descale, v_descale=v_descale, causal=causal, softmax_scale=softmax_scale,
                              sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
                              softmax_aux=softmax_aux, out_dtype=out_dtype, return_lse=return_lse,
                              platform=platform)
