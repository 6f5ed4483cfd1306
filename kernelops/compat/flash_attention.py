"""The API of the CUDA flash-attention package that kernelops replaces, over kernelops' kernels.

Code written for that package runs unchanged: tensors are BHSD, ``[B, H, N, D]`` (batch, heads,
sequence, head dim), the softmax scale is ``1 / sqrt(D)`` and there is no mask. ``Bc`` / ``Br``
are the key / query tile sizes of the launch; they are rounded to a tile the Triton kernels run
(a power of two from 16 to 128), with a warning when that changes them.

The forward keeps one statistic per query row, the log-sum-exp of the scaled scores, where the
CUDA package kept two, the row maximum ``m`` and the row sum ``l = sum_j exp(s_j - m)``. They
carry the same information, ``lse = m + log(l)``: the backward accepts any ``(l, m)`` pair with
that sum, the pair a plain torch computation gives included, and the forward's
``return_stats=True`` returns ``l = 1, m = lse`` (or the true row maxima, with
``exact_stats=True``, at the cost of one more ``Q @ K^T`` pass).

>>> import torch
>>> from kernelops.compat.flash_attention import flash_attention_forward
>>> Q = K = V = torch.randn(2, 4, 100, 64)                 # [B, H, N, D]
>>> flash_attention_forward(Q, K, V).shape
torch.Size([2, 4, 100, 64])
"""

from __future__ import annotations

import math
import operator
import warnings

import torch
from torch import nn

from kernelops import BwdParams, FlashAttentionConfig, FwdParams, flash_attention
from kernelops import estimate_memory_usage as _estimate_memory
from kernelops import flash_attention_backward as _backward
from kernelops import flash_attention_forward as _forward
from kernelops import get_optimal_block_sizes as _heuristic
from kernelops.kernels.flash_attention.smem import block_dim, fit_smem, smem_bwd, smem_elem, smem_fwd
from kernelops.ops.device import device_info

__all__ = ["FlashAttention", "estimate_memory_usage", "flash_attention_backward", "flash_attention_forward",
           "get_optimal_block_sizes"]

#: the tile sizes the Triton kernels take: powers of two from tl.dot's minimum up to the largest
#: tile the tuner tries
MIN_BLOCK, MAX_BLOCK = 16, 128
_PLATFORMS = ("auto", "triton", "torch")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: scores held at once while ``exact_stats`` finds the row maxima (float32: 256 MiB)
_ROW_MAX_ELEMENTS = 1 << 26


# --- argument checks ------------------------------------------------------------------------------
def _block(name: str, value) -> int:
    """A tile size as the kernels take it: the largest power of two <= ``value``, clamped to
    [MIN_BLOCK, MAX_BLOCK], with a warning when that changes it."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a positive int, got {value!r}")
    try:
        size = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}") from None
    if size <= 0:
        raise ValueError(f"{name} must be a positive int, got {size}")
    rounded = min(max(1 << (size.bit_length() - 1), MIN_BLOCK), MAX_BLOCK)
    if rounded != size:
        warnings.warn(f"{name}={size} is not a tile the kernels take (a power of two from {MIN_BLOCK} to "
                      f"{MAX_BLOCK}); using {name}={rounded}", UserWarning, stacklevel=3)
    return rounded


def _check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _check_tensor(name: str, t, ndim: int, dims: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {dims}, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims {dims}, got {name}.shape={tuple(t.shape)}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {name}.dtype={t.dtype} "
                        f"({name}.shape={tuple(t.shape)})")


def _check_qkv(Q, K, V) -> None:
    for name, t in (("Q", Q), ("K", K), ("V", V)):
        _check_tensor(name, t, 4, "[B, H, N, D]")
    if K.shape != V.shape:
        raise ValueError(f"K and V must have the same shape, got K.shape={tuple(K.shape)}, V.shape={tuple(V.shape)}")
    if (K.shape[0], K.shape[1], K.shape[3]) != (Q.shape[0], Q.shape[1], Q.shape[3]):
        raise ValueError(f"K must match Q in B, H and D ([B, H, N, D]), got Q.shape={tuple(Q.shape)}, "
                         f"K.shape={tuple(K.shape)}")
    for name, t in (("K", K), ("V", V)):
        if t.dtype != Q.dtype:
            raise TypeError(f"{name} must have Q's dtype, got Q.dtype={Q.dtype}, {name}.dtype={t.dtype}")
        if t.device != Q.device:
            raise ValueError(f"{name} must be on Q's device, got Q.device={Q.device}, {name}.device={t.device}")
    if Q.shape[3] == 0:
        raise ValueError(f"Q must have a head dim D > 0 ([B, H, N, D]), got Q.shape={tuple(Q.shape)}")


def _check_like(name: str, t, shape: tuple, device: torch.device, dims: str) -> None:
    _check_tensor(name, t, len(shape), dims)
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} {dims}, got {name}.shape={tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on Q's device, got Q.device={device}, {name}.device={t.device}")


def _check_platform(platform) -> str:
    if platform not in _PLATFORMS:
        raise ValueError(f"platform must be one of {_PLATFORMS}, got {platform!r}")
    return platform


def _compute_dtype(dtype: torch.dtype, use_half: bool) -> torch.dtype:
    return torch.float16 if use_half else dtype


# --- launch parameters ----------------------------------------------------------------------------
def _heuristic_for(q, k) -> FlashAttentionConfig:
    """The heuristic's config for BHSD ``q`` / ``k``."""
    _, H, N, D = q.shape
    return _heuristic(max(N, 1), D, dtype=q.dtype, device=q.device, seq_len_k=max(k.shape[2], 1), num_heads=H)


def _tiles(q, k, block_q: int, block_kv: int, backward: bool, heuristic: FlashAttentionConfig | None = None) -> dict:
    """Launch parameters for BHSD ``q`` / ``k``: the given tiles with the heuristic's warps and
    stages (``heuristic``: its config, when the caller has it); on a GPU, fewer stages (then
    smaller tiles, with a warning) where they would not fit in shared memory."""
    D = q.shape[3]
    cfg = _heuristic_for(q, k) if heuristic is None else heuristic
    base = cfg.bwd_params if backward else cfg.fwd_params
    kind, smem = (BwdParams, smem_bwd) if backward else (FwdParams, smem_fwd)
    params = kind(block_q, block_kv, base.num_warps, base.num_stages)
    if q.is_cuda:
        block_d, elem = block_dim(D), smem_elem(q.dtype)
        params = fit_smem(params, lambda p: smem(p, block_d, elem), device_info(q.device).smem_bytes)
        if (params.q_blocksize, params.kv_blocksize) != (block_q, block_kv):
            warnings.warn(f"Br={block_q}, Bc={block_kv} do not fit in the shared memory of {q.device} at D={D} "
                          f"({q.dtype}); using Br={params.q_blocksize}, Bc={params.kv_blocksize}", UserWarning,
                          stacklevel=3)
    return dict(block_q=params.q_blocksize, block_kv=params.kv_blocksize, num_warps=params.num_warps,
                num_stages=params.num_stages)


def _config(q, k, block_q: int, block_kv: int) -> FlashAttentionConfig:
    """An explicit config for :func:`kernelops.flash_attention` that runs exactly these tiles (the
    warp-specialised and TMA kernels, whose tiles are their own, off)."""
    heuristic = _heuristic_for(q, k)
    f, b = _tiles(q, k, block_q, block_kv, False, heuristic), _tiles(q, k, block_q, block_kv, True, heuristic)
    fwd = FwdParams(f["block_q"], f["block_kv"], f["num_warps"], f["num_stages"], tma=False, ws=False)
    bwd = BwdParams(b["block_q"], b["block_kv"], b["num_warps"], b["num_stages"], ws=False, fused=False)
    return FlashAttentionConfig(fwd, bwd)


# --- row statistics -------------------------------------------------------------------------------
def _row_max(Q, K) -> torch.Tensor:
    """The true row maxima of the scaled scores ``Q @ K^T / sqrt(D)``, ``[B, H, N]``, float32
    (float64 for float64 inputs), computed a block of rows at a time."""
    B, H, N, D = Q.shape
    acc = torch.float64 if Q.dtype == torch.float64 else torch.float32
    out = torch.full((B, H, N), float("-inf"), dtype=acc, device=Q.device)
    if K.shape[2] == 0 or N == 0:
        return out
    kt = K.to(acc).transpose(-1, -2)
    rows = max(1, _ROW_MAX_ELEMENTS // (B * H * K.shape[2]))
    for i in range(0, N, rows):
        out[:, :, i:i + rows] = torch.matmul(Q[:, :, i:i + rows].to(acc), kt).amax(-1)
    return out * (1.0 / math.sqrt(D))


def _lse(l, m, dtype: torch.dtype) -> torch.Tensor:
    """``m + log(l)`` computed in float64, in the dtype the kernels keep the lse in."""
    lse = m.detach().double() + torch.log(l.detach().double())
    return lse.to(torch.float64 if dtype == torch.float64 else torch.float32).contiguous()


# --- the functions --------------------------------------------------------------------------------
def flash_attention_forward(Q, K, V, Bc=32, Br=32, use_half=False, *, return_stats: bool = False,
                            exact_stats: bool = False, platform: str = "auto"):
    """Attention ``softmax(Q @ K^T / sqrt(D)) @ V`` without a mask, forward only.

    Args:
        Q: ``[B, H, N, D]`` float16 / bfloat16 / float32 (float64 on the torch platform), any strides.
        K, V: ``[B, H, Nk, D]`` (``Nk`` is usually ``N``), Q's dtype and device.
        Bc, Br: key / query tile sizes of the launch, rounded down to a power of two in [16, 128]
            (a warning says when); on a GPU, tiles that do not fit in shared memory at this D are
            halved, with a warning. The torch platform takes them and ignores them.
        use_half: compute in float16 and return float16 (inputs of another dtype are cast).
        return_stats: also return the row statistics ``(l, m)``, each ``[B, H, N]`` float32
            (float64 for float64 inputs), with ``m + log(l)`` the log-sum-exp of the scaled scores.
            By default ``l = 1`` and ``m`` is the log-sum-exp itself (what the kernels keep).
        exact_stats: with ``return_stats``, ``m`` is the true row maximum and ``l`` the row sum
            ``sum_j exp(s_j - m)``, as the CUDA package returned them. It costs one more
            ``Q @ K^T`` pass (in torch, a block of rows at a time).
        platform: ``"auto"`` (Triton kernels on CUDA tensors, plain torch on the CPU), ``"triton"``
            or ``"torch"``.

    Returns:
        ``O [B, H, N, D]`` (a BHSD view of a ``[B, N, H, D]`` buffer: call ``.contiguous()``
        where a contiguous tensor is needed), or ``(O, l, m)`` with ``return_stats``.

    Example:
        >>> Q, K, V = (torch.randn(1, 2, 77, 40) for _ in range(3))
        >>> O, l, m = flash_attention_forward(Q, K, V, return_stats=True)
        >>> (O.shape, l.shape, m.shape)
        (torch.Size([1, 2, 77, 40]), torch.Size([1, 2, 77]), torch.Size([1, 2, 77]))
    """
    _check_qkv(Q, K, V)
    block_kv, block_q = _block("Bc", Bc), _block("Br", Br)
    dtype = _compute_dtype(Q.dtype, _check_flag("use_half", use_half))
    _check_flag("return_stats", return_stats)
    _check_flag("exact_stats", exact_stats)
    _check_platform(platform)
    q, k, v = (t.to(dtype) for t in (Q, K, V))
    O, lse = _forward(q, k, v, layout="bhsd", platform=platform, **_tiles(q, k, block_q, block_kv, False))
    if not return_stats:
        return O
    if exact_stats:
        m = _row_max(q, k)
        # a row with no keys: lse = m = -inf and no mass (l = 0, not exp(-inf + inf) = NaN)
        l = torch.where(torch.isneginf(m), torch.zeros_like(m), torch.exp(lse.to(m.dtype) - m))
        return O, l, m
    return O, torch.ones_like(lse), lse


def flash_attention_backward(Q, K, V, O, dO, l, m, Bc=32, Br=32, use_half=False, *, platform: str = "auto"):
    """Gradients of :func:`flash_attention_forward`: ``(dQ, dK, dV)``.

    Args:
        Q: ``[B, H, N, D]``; K, V: ``[B, H, Nk, D]``, as given to the forward.
        O, dO: ``[B, H, N, D]``: the forward's output and the gradient reaching it.
        l, m: ``[B, H, N]`` row statistics: any pair with ``m + log(l)`` equal to the log-sum-exp
            of the scaled scores ``Q @ K^T / sqrt(D)``: the forward's ``return_stats=True`` pair,
            or the true row maxima ``m`` and row sums ``l = sum_j exp(s_j - m)`` computed
            elsewhere (for example in plain torch).
        Bc, Br: key / query tile sizes, as in the forward.
        use_half: compute in float16 and return float16 gradients.
        platform: as in the forward.

    Returns:
        ``dQ [B, H, N, D]``, ``dK``, ``dV [B, H, Nk, D]`` in the compute dtype, BHSD views like
        the forward's output.

    Example:
        >>> Q, K, V = (torch.randn(1, 2, 77, 40) for _ in range(3))
        >>> O, l, m = flash_attention_forward(Q, K, V, return_stats=True)
        >>> dQ, dK, dV = flash_attention_backward(Q, K, V, O, torch.ones_like(O), l, m)
        >>> dQ.shape == Q.shape
        True
    """
    _check_qkv(Q, K, V)
    dims = "[B, H, N, D] (Q's shape)"
    _check_like("O", O, Q.shape, Q.device, dims)
    _check_like("dO", dO, Q.shape, Q.device, dims)
    _check_like("l", l, Q.shape[:3], Q.device, "[B, H, N]")
    _check_like("m", m, Q.shape[:3], Q.device, "[B, H, N]")
    block_kv, block_q = _block("Bc", Bc), _block("Br", Br)
    dtype = _compute_dtype(Q.dtype, _check_flag("use_half", use_half))
    _check_platform(platform)
    q, k, v, o, do = (t.detach().to(dtype) for t in (Q, K, V, O, dO))
    return _backward(q, k, v, o, do, _lse(l, m, dtype), layout="bhsd", platform=platform,
                     **_tiles(q, k, block_q, block_kv, True))


class FlashAttention(nn.Module):
    """Attention as a module: ``forward(Q, K, V)`` is differentiable (autograd), and
    ``backward(Q, K, V, O, dO, l, m)`` gives the gradients explicitly.

    Args:
        bc, br: key / query tile sizes (rounded as in :func:`flash_attention_forward`, with a
            warning here when that changes them).
        use_half: compute in float16; the output (and its gradient) is float16, and gradients
            reach float32 inputs as float32 through the cast.
        platform: ``"auto"``, ``"triton"`` or ``"torch"``.

    Example:
        >>> attn = FlashAttention(bc=64, br=64)
        >>> Q, K, V = (torch.randn(2, 3, 50, 32, requires_grad=True) for _ in range(3))
        >>> attn(Q, K, V).sum().backward()
        >>> Q.grad.shape
        torch.Size([2, 3, 50, 32])
    """

    def __init__(self, bc=32, br=32, use_half=False, *, platform: str = "auto"):
        super().__init__()
        self.bc, self.br = _block("bc", bc), _block("br", br)
        self.use_half = _check_flag("use_half", use_half)
        self.platform = _check_platform(platform)

    def forward(self, Q, K, V):
        """``O [B, H, N, D]`` for ``Q [B, H, N, D]``, ``K/V [B, H, Nk, D]``; differentiable with
        respect to all three."""
        _check_qkv(Q, K, V)
        dtype = _compute_dtype(Q.dtype, self.use_half)
        q, k, v = (t.to(dtype) for t in (Q, K, V))
        cfg = _config(q, k, self.br, self.bc)
        out = flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), platform=self.platform,
                              cfg=cfg)
        return out.transpose(1, 2)

    def backward(self, Q, K, V, O, dO, l, m):
        """``(dQ, dK, dV)`` as :func:`flash_attention_backward` gives them, with this module's
        tile sizes and ``use_half``."""
        return flash_attention_backward(Q, K, V, O, dO, l, m, Bc=self.bc, Br=self.br, use_half=self.use_half,
                                        platform=self.platform)

    def extra_repr(self) -> str:
        return f"bc={self.bc}, br={self.br}, use_half={self.use_half}, platform={self.platform!r}"


# --- sizing helpers -------------------------------------------------------------------------------
def get_optimal_block_sizes(sequence_length, head_dim, *, use_half: bool = False, device=None) -> tuple[int, int]:
    """``(Bc, Br)``: the key / query tiles kernelops' heuristic picks for a forward of this shape
    (float16 with ``use_half``, else float32) on ``device`` (default: the current CUDA device,
    else the CPU, where the heuristic picks tiles for the Triton interpreter).

    >>> get_optimal_block_sizes(1024, 64, device="cpu")
    (32, 32)
    """
    for name, value in (("sequence_length", sequence_length), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    dtype = torch.float16 if _check_flag("use_half", use_half) else torch.float32
    p = _heuristic(sequence_length, head_dim, dtype=dtype, device=device).fwd_params
    return int(p.kv_blocksize), int(p.q_blocksize)


def estimate_memory_usage(batch_size, num_heads, seq_len, head_dim, use_half=False, *, train: bool = False) -> dict:
    """Bytes of one call by kind (ints), from :func:`kernelops.estimate_memory_usage`.

    ``input_memory``: Q, K, V. ``internal_memory``: the row statistics (one float32 per query row
    and head), and with ``train`` the backward's workspace. ``output_memory``: O, and with
    ``train`` the gradients (dQ, dK, dV and the incoming dO). ``total_memory`` is their sum and
    ``total_memory_mb`` that in MiB (float). There is no ``N x N`` term: the scores are never
    materialised.

    >>> estimate_memory_usage(1, 8, 1024, 64)["input_memory"]
    6291456
    """
    for name, value in (("batch_size", batch_size), ("num_heads", num_heads), ("seq_len", seq_len),
                        ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    dtype = torch.float16 if _check_flag("use_half", use_half) else torch.float32
    est = _estimate_memory(batch_size, num_heads, seq_len, head_dim, dtype=dtype, train=_check_flag("train", train))
    parts = dict(input_memory=est["inputs"], internal_memory=est["saved_statistics"] + est["workspace"],
                 output_memory=est["outputs"] + est["gradients"])
    parts = {k: int(v) for k, v in parts.items()}
    total = sum(parts.values())
    return {**parts, "total_memory": total, "total_memory_mb": total / 2**20}
