"""Tile sizes of the flash-attention kernels (the decode tile's height) and their shared-memory
footprints, with the shrinking rule that fits a launch config under a device's per-block limit.
Plain torch: the op reads these while it builds a call's key, on any platform, without importing
Triton."""

from __future__ import annotations

import dataclasses

import torch

from kernelops.ops.params import BwdParams, DecodeParams, FwdParams

#: decode launches handle at most this many query rows per KV head (group * Sq)
MAX_DECODE_ROWS = 128


def decode_rows(q: torch.Tensor, k: torch.Tensor) -> int:
    """Query rows per KV head, ``group * Sq`` (``q [B, Sq, Hq, D]``, ``k [B, Sk, Hkv, D]``): the decode
    tile's height."""
    return (q.shape[2] // k.shape[2]) * q.shape[1]


def block_dim(head_dim: int) -> int:
    """The tiles' width for ``head_dim``: the next power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def smem_elem(dtype: torch.dtype) -> int:
    """Bytes a tile element takes in shared memory: float32 counts twice, because the tf32x3 dots
    keep a high and a low tf32 part of each operand."""
    return 8 if dtype == torch.float32 else torch.empty((), dtype=dtype).element_size()


def smem_fwd(p: FwdParams, block_d: int, elem: int) -> int:
    """Shared memory of the forward: the Q tile plus ``num_stages`` buffered K and V tiles."""
    return elem * block_d * (p.q_blocksize + 2 * p.kv_blocksize * max(p.num_stages, 1))


def smem_decode(p: DecodeParams, block_d: int, elem: int, rows: int = 16) -> int:
    """Shared memory of the split-KV decode kernel: the query rows plus buffered K and V tiles."""
    return elem * block_d * (max(16, rows) + 2 * p.kv_blocksize * max(p.num_stages, 1))


def smem_bwd(p: BwdParams, block_d: int, elem: int) -> int:
    """Shared memory of the larger backward kernel (dK/dV): K, V resident, Q and dO streamed."""
    return elem * block_d * (2 * p.kv_blocksize + 2 * p.q_blocksize * max(p.num_stages, 1))


def fit_smem(params, smem, limit: int):
    """Shrink ``params`` until ``smem(params) <= limit``: fewer stages, then smaller tiles."""
    while smem(params) > limit:
        if params.num_stages > 1:
            params = dataclasses.replace(params, num_stages=params.num_stages - 1)
        elif params.kv_blocksize > 16 and params.kv_blocksize >= getattr(params, "q_blocksize", 0):
            params = dataclasses.replace(params, kv_blocksize=params.kv_blocksize // 2)
        elif getattr(params, "q_blocksize", 0) > 16:
            params = dataclasses.replace(params, q_blocksize=params.q_blocksize // 2)
        else:
            break
    return params
