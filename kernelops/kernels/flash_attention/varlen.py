"""Variable-length (packed) batches: the tile -> sequence map, computed inside the kernels.

Sequences are packed along one token axis: ``q [total_q, H, D]`` with ``cum_seqlens_q [n + 1]``
(int32, starting at 0). A launch over packed sequences has one program per (tile of ``BLOCK``
tokens of one sequence, head). Sequence ``i`` owns the grid rows
``[f(i), f(i + 1))`` with ``f(i) = cum[i] // BLOCK + i``: that range has
``cum[i+1] // BLOCK - cum[i] // BLOCK + 1 >= ceil(len_i / BLOCK)`` rows, so it holds every tile of
the sequence, and the ranges partition ``[0, total // BLOCK + n)``. A program finds its sequence
from ``f`` (strictly increasing): one vector load for up to 256 sequences, a binary search beyond,
and rows past a sequence's last tile do nothing (at most one per sequence). Work
is therefore ~ the sum of lengths, never n x the longest, and nothing is built on the host or
launched before the attention kernels.

``check_offsets`` validates both offset tensors in one launch, without a host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelops.kernels.common.host import on_input_device
from kernelops.kernels.common.launch import direct_launch

SEARCH = tl.constexpr(256)  # up to this many sequences: one vector load; more: a binary search


def packed_rows(total: int, num_seqs: int, block: int) -> int:
    """Grid rows (per head) of a packed launch with tiles of ``block`` tokens: ``f(n)``."""
    return max(total // block + num_seqs, 1)


@triton.jit
def packed_tile(row, CuTiles, num_seqs, BLOCK: tl.constexpr):
    """``(seq, start)``: the sequence owning grid row ``row`` of tiles laid along ``CuTiles``
    (``[n + 1]`` int32 offsets) and the tile's first token within that sequence.

    Up to ``SEARCH`` sequences: one vector load, counting the ``i >= 1`` with ``f(i) <= row``.
    More: a binary search on ``f`` (``log2 n`` loads), so the work per program never grows with n.
    """
    if num_seqs <= SEARCH:
        idx = 1 + tl.arange(0, SEARCH)
        ok = idx <= num_seqs
        cum = tl.load(CuTiles + idx, mask=ok, other=0)
        sid = tl.sum((ok & (cum // BLOCK + idx <= row)).to(tl.int32), 0)
    else:  # invariant: f(lo) <= row < f(hi), with f(0) = 0 and f(n) = the row count
        lo = 0
        hi = num_seqs
        while hi - lo > 1:
            mid = (lo + hi) // 2
            below = tl.load(CuTiles + mid) // BLOCK + mid <= row
            lo = tl.where(below, mid, lo)
            hi = tl.where(below, hi, mid)
        sid = lo
    start = (row - (tl.load(CuTiles + sid) // BLOCK + sid)) * BLOCK
    return sid, start


@triton.jit
def sequence_of(row, CuTiles, CuQ, CuK, num_seqs, BLOCK: tl.constexpr):
    """Varlen: ``(seq, tile start within it, seq_q, seq_k, q_start, k_start)`` for grid row
    ``row`` of tiles laid along ``CuTiles`` (``CuQ`` for query tiles, ``CuK`` for key tiles).
    A row past its sequence's last tile gets zero lengths, so its program does nothing."""
    sid, start = packed_tile(row, CuTiles, num_seqs, BLOCK)
    q_start = tl.load(CuQ + sid)
    k_start = tl.load(CuK + sid)
    seq_q = tl.load(CuQ + sid + 1) - q_start
    seq_k = tl.load(CuK + sid + 1) - k_start
    tile_len = tl.load(CuTiles + sid + 1) - tl.load(CuTiles + sid)
    valid = start < tile_len
    seq_q = tl.where(valid, seq_q, 0)
    seq_k = tl.where(valid, seq_k, 0)
    return sid.to(tl.int64), start, seq_q, seq_k, q_start.to(tl.int64), k_start.to(tl.int64)


@direct_launch
@triton.jit(do_not_specialize=["num_seqs", "total_q", "total_k", "max_q", "max_k"])
def _check_offsets_kernel(CuQ, CuK, Ok, num_seqs, total_q, total_k, max_q, max_k, BLOCK: tl.constexpr):
    """One program: ``Ok[0] = 1`` when both offset tensors start at 0, never decrease, end at their
    token counts and hold no sequence longer than its bound (-1: no bound); else 0."""
    good = (tl.load(CuQ) == 0) & (tl.load(CuK) == 0)
    good = good & (tl.load(CuQ + num_seqs) == total_q) & (tl.load(CuK + num_seqs) == total_k)
    bad = 0
    for c0 in range(0, num_seqs, BLOCK):
        idx = c0 + tl.arange(0, BLOCK)
        ok = idx < num_seqs
        len_q = tl.load(CuQ + idx + 1, mask=ok, other=0) - tl.load(CuQ + idx, mask=ok, other=0)
        len_k = tl.load(CuK + idx + 1, mask=ok, other=0) - tl.load(CuK + idx, mask=ok, other=0)
        wrong = (len_q < 0) | (len_k < 0) | ((max_q >= 0) & (len_q > max_q)) | ((max_k >= 0) & (len_k > max_k))
        bad += tl.sum((ok & wrong).to(tl.int32), 0)
    tl.store(Ok, (good & (bad == 0)).to(tl.int32))


@on_input_device
def check_offsets(cum_seqlens_q: torch.Tensor, cum_seqlens_k: torch.Tensor, total_q: int, total_k: int,
                  max_q: int | None, max_k: int | None) -> None:
    """Device-side check of two CUDA offset tensors (``[n + 1]`` int32 each): one launch and an
    asynchronous assert, no host sync; a bad tensor fails the next synchronising call."""
    cum_seqlens_q, cum_seqlens_k = cum_seqlens_q.contiguous(), cum_seqlens_k.contiguous()
    ok = torch.empty(1, dtype=torch.int32, device=cum_seqlens_q.device)
    _check_offsets_kernel[(1,)](cum_seqlens_q, cum_seqlens_k, ok, cum_seqlens_q.numel() - 1, total_q, total_k,
                                -1 if max_q is None else max_q, -1 if max_k is None else max_k, BLOCK=1024)
    torch._assert_async(ok, "cum_seqlens_q/k must start at 0, be non-decreasing, end at the packed token counts "
                            "and hold no sequence longer than max_seqlen")


#: the most sequences the warp-specialised packed forward schedules (each schedule program reads
#: every sequence's length: quadratic work in the count)
WS_PACKED_MAX_SEQS = 4096


def ws_packed_capacity(total: int, num_seqs: int, heads: int, block: int = 128) -> int:
    """Schedule entries a packed launch of ``total`` tokens in ``num_seqs`` sequences can need:
    each sequence has at most ``len // block + 1`` query tiles, so at most that many units a head."""
    return heads * (total // block + num_seqs)


@direct_launch
@triton.jit(do_not_specialize=["num_seqs", "heads", "cap"])
def _ws_schedule_kernel(Cu, CuW, Table, num_seqs, heads, cap, BLOCK: tl.constexpr, CAUSAL: tl.constexpr,
                        CHUNK: tl.constexpr):
    """Program ``i``: the units of sequence ``i`` (tiles of ``BLOCK`` tokens of ``Cu``'s side;
    causal units pair tile ``t`` with ``tiles - 1 - t``, so all of a sequence's units cost about
    the same), for every head, at their place in the order of sequences by their ``CuW`` length
    (the other side's, which each unit walks; ``Cu`` again with one offsets tensor), longest first
    (ties by index)."""
    i = tl.program_id(0)
    start = tl.load(Cu + i)
    length = tl.load(Cu + i + 1) - start
    weight = tl.load(CuW + i + 1) - tl.load(CuW + i)
    tiles = (length + BLOCK - 1) // BLOCK
    if CAUSAL:
        units = (tiles + 1) // 2
    else:
        units = tiles
    before = 0
    total = 0
    for c0 in range(0, num_seqs, CHUNK):
        j = c0 + tl.arange(0, CHUNK)
        ok = j < num_seqs
        len_j = tl.load(Cu + j + 1, mask=ok, other=0) - tl.load(Cu + j, mask=ok, other=0)
        weight_j = tl.load(CuW + j + 1, mask=ok, other=0) - tl.load(CuW + j, mask=ok, other=0)
        tiles_j = (len_j + BLOCK - 1) // BLOCK
        if CAUSAL:
            units_j = (tiles_j + 1) // 2
        else:
            units_j = tiles_j
        first = ok & ((weight_j > weight) | ((weight_j == weight) & (j < i)))
        before += tl.sum(tl.where(first, units_j, 0), 0)
        total += tl.sum(units_j, 0)
    if i == 0:  # (offsets that break their contract, which the launches' async check reports, stay in bounds)
        tl.store(Table, tl.minimum(total * heads, cap))
    base = 1 + before * heads
    for c0 in range(0, units * heads, CHUNK):
        idx = c0 + tl.arange(0, CHUNK)
        ok = (idx < units * heads) & (before * heads + idx < cap)
        h = idx // tl.maximum(units, 1)
        tl.store(Table + base + idx, tl.zeros([CHUNK], tl.int32) + i, mask=ok)
        tl.store(Table + cap + base + idx, h, mask=ok)
        tl.store(Table + 2 * cap + base + idx, idx - h * units, mask=ok)


@on_input_device
def ws_packed_schedule(cum_seqlens: torch.Tensor, total: int, heads: int, causal: bool, block: int = 128,
                       weights: torch.Tensor | None = None):
    """The unit table of the warp-specialised packed forward (``fwd_ws.flash_attention_fwd_ws_packed``):
    ``(table, capacity)``, ``table`` int32 ``[1 + 3 * capacity]`` with ``table[0]`` the unit count
    and, for unit ``u``, ``table[1 + u]`` its sequence, ``table[1 + capacity + u]`` its head and
    ``table[1 + 2 * capacity + u]`` its index within the (sequence, head). One launch of one
    program per sequence, no host sync; ``cum_seqlens`` ``[n + 1]`` int32 offsets over ``total``
    tokens, ``n <= WS_PACKED_MAX_SEQS``. ``weights``: the other side's offsets, whose lengths
    order the sequences (:func:`ws_schedule_launch`)."""
    table = ws_packed_table(cum_seqlens, total, heads, block)
    kernel, grid, args, meta = ws_schedule_launch(cum_seqlens, table, heads, causal, block, weights)
    kernel[grid](*args, **meta)
    return table, table_capacity(table)


def ws_packed_table(cum_seqlens: torch.Tensor, total: int, heads: int, block: int = 128) -> torch.Tensor:
    """An unfilled schedule table for :func:`ws_schedule_launch` (int32 ``[1 + 3 * capacity]``);
    ValueError unless ``cum_seqlens`` holds 1..``WS_PACKED_MAX_SEQS`` sequences."""
    num_seqs = cum_seqlens.numel() - 1
    if not 0 < num_seqs <= WS_PACKED_MAX_SEQS:
        raise ValueError(f"the packed schedule takes 1..{WS_PACKED_MAX_SEQS} sequences, got {num_seqs}")
    cap = ws_packed_capacity(total, num_seqs, heads, block)
    return torch.empty(1 + 3 * cap, dtype=torch.int32, device=cum_seqlens.device)


def table_capacity(table: torch.Tensor) -> int:
    """The unit capacity of a schedule table (:func:`ws_packed_table`: ``[1 + 3 * capacity]``)."""
    return (table.numel() - 1) // 3


def ws_schedule_launch(cum_seqlens: torch.Tensor, table: torch.Tensor, heads: int, causal: bool, block: int = 128,
                       weights: torch.Tensor | None = None):
    """``(kernel, grid, args, meta)`` of the launch that fills ``table`` (:func:`ws_packed_table`):
    what :func:`ws_packed_schedule` runs, and what the packed launch builders
    (``fwd_ws.packed_launches``, ``backward.packed_launches``) put before their kernel's launch.
    The units are ``cum_seqlens``' tiles; ``weights`` (offsets of the other side, as many
    sequences; None: ``cum_seqlens``) order the sequences, longest first: a unit walks the other
    side, so with per-side lengths (a short query chunk over a long cached prefix) its length is
    the unit's cost."""
    num_seqs, cap = cum_seqlens.numel() - 1, table_capacity(table)
    weights = cum_seqlens if weights is None else weights
    if weights.shape != cum_seqlens.shape:
        raise ValueError(f"weights must be offsets of as many sequences as cum_seqlens {tuple(cum_seqlens.shape)}, "
                         f"got {tuple(weights.shape)}")
    return _ws_schedule_kernel, (num_seqs,), (cum_seqlens, weights, table, num_seqs, heads, cap), dict(
        BLOCK=block, CAUSAL=bool(causal), CHUNK=1024)
