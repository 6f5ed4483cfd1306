"""Shared pieces of the warp-specialised (Gluon, sm_90) flash-attention kernels: the forward
(:mod:`fwd_ws`), the dK/dV backward (:mod:`bwd_ws`), the fused backward (:mod:`bwd_fused`) and the
D=256 backward (:mod:`bwd_d256`).

Device side: the persistent schedule's work units (a causal unit pairs query blocks
``blocks - 1 - k`` and ``k`` of a head, so every unit holds the same number of key blocks; a full
unit is one query block) and their tiles, the slot table of a dense causal launch's last waves
(:mod:`fwd_tail`), the turns consumer warpgroups take to issue their products, and the soft-cap
tanh. Host side: which calls the kernels take (shapes, dtypes, scale, band, packed offsets).
"""

from __future__ import annotations

import torch

from kernelops.kernels.common.gluon import GLUON
from kernelops.kernels.common.host import cuda_capability
from kernelops.kernels.common.tma import tma_rows_view

LOG2E = 1.4426950408889634
#: head dims the forward takes (the dK/dV kernel's are ``bwd_ws.DKDV_HEAD_DIMS``)
WS_HEAD_DIMS = (64, 128, 256)
#: query rows per program (two consumer warpgroups of 64)
WS_BLOCK_M = 128

if GLUON:
    from kernelops.kernels.common.gluon import gl, gluon, mbarrier, tanh_approx

    ROWS = gl.constexpr(64)  # query rows per consumer warpgroup

    @gluon.constexpr_function
    def sched_paired(causal, ragged):
        """Whether a unit pairs query blocks ``blocks - 1 - k`` and ``k`` (:func:`sched_units`, :func:`sched_tiles`,
        :func:`sched_tile`): causal heads, and packed windowed ones (their schedule's units are causal
        pairs, ``varlen.ws_schedule_launch``); dense windowed heads take one tile a unit."""
        return causal == 1 or (causal == 2 and ragged >= 2)

    @gluon.jit
    def softcap_tanh(s, qk_scale):
        """``tanh(scale * s / cap)`` of raw scores ``s`` (``qk_scale = scale / cap`` from
        :func:`softcap_args`): one multiply and the MUFU's ``tanh.approx.f32`` (relative error about
        2^-11, FlashAttention-3's choice; on an H200 it ran 1.09-1.40x an exact tanh formed from an
        exp2 and a reciprocal, with O's error against float64 that of bf16 rounding either way)."""
        return tanh_approx(s * qk_scale)

    @gluon.jit
    def sched_units(seq, CAUSAL: gl.constexpr, RAGGED: gl.constexpr, WGS: gl.constexpr):
        """``(blocks, per_head)``: ``WGS * 64``-row query blocks per head and work units per head. A causal
        unit pairs query block ``blocks - 1 - k`` with block ``k`` (``blocks + 1`` key spans of a
        tile's rows in all, the same for every unit but an odd count's middle one), so programs that take units in turn
        stay balanced; otherwise (a window too: its tiles but the first few are as long) a unit is one
        query block."""
        blocks = (seq + WGS * ROWS - 1) // (WGS * ROWS)
        if sched_paired(CAUSAL, RAGGED):
            per_head = (blocks + 1) // 2
        else:
            per_head = blocks
        return blocks, per_head

    @gluon.jit
    def sched_unit(u, n_units, per_head, chunk):
        """``(bh, k)`` of unit ``u``: units go in chunks of ``chunk`` heads, each chunk unit index
        ``k`` by unit index (the chunk's heads' units ``k = 0``, the longest when causal, first)."""
        start = u // (chunk * per_head) * chunk
        size = gl.minimum(chunk, n_units // per_head - start)
        rank = u - start * per_head
        k = rank // size
        return start + rank - k * size, k

    @gluon.jit
    def sched_tiles(k, blocks, CAUSAL: gl.constexpr, RAGGED: gl.constexpr):
        """Query blocks in unit ``k``: 2 for a causal pair (packed sequences with a window pair their
        tiles too: their schedule's units), 1 for a causal middle block or a full or dense windowed unit."""
        if sched_paired(CAUSAL, RAGGED):
            n = 2 - (2 * k + 1 == blocks).to(gl.int32)
        else:
            n = k * 0 + 1
        return n

    @gluon.jit
    def sched_work(u, seq, heads, seq_k, n_units, chunk, Cu, CuK, Table, CAUSAL: gl.constexpr, RAGGED: gl.constexpr,
              WGS: gl.constexpr):
        """``(b, h, k, blocks, seq_q, seq_k, q_row0, kv_row0, lse0)`` of unit ``u``: its batch and
        query head, its unit index ``k`` within the head (:func:`sched_tiles`), the head's query blocks,
        the sequence's query and key lengths, the rows of its first query and key in q's and k's
        row views, and the offset of its first query's lse. ``RAGGED == 2`` (packed sequences):
        ``u`` indexes the schedule ``Table`` (:func:`varlen.ws_packed_schedule`: ``Table[1 + u]``
        the sequence, ``Table[1 + chunk + u]`` the head, ``Table[1 + 2 * chunk + u]`` ``k``),
        the sequence's tokens are rows ``Cu[s] .. Cu[s + 1]`` of both q and k, and ``seq`` is the
        packed token count (lse ``[Hq, total]``); ``RAGGED == 3``: the same with the keys' rows
        ``CuK[s] .. CuK[s + 1]`` of k (two offsets tensors, ``seq`` the query tokens); otherwise ``u``
        is unit ``u`` of :func:`sched_unit`'s order over ``B * Hq`` heads of ``seq`` queries and ``seq_k``
        keys (lse ``[B, Hq, Sq]``)."""
        if RAGGED >= 2:
            sid = gl.load(Table + 1 + u)
            h = gl.load(Table + 1 + chunk + u)
            k = gl.load(Table + 1 + 2 * chunk + u)
            q_row0 = gl.load(Cu + sid)
            seq_q = gl.load(Cu + sid + 1) - q_row0
            blocks = (seq_q + WGS * ROWS - 1) // (WGS * ROWS)
            if RAGGED == 3:
                kv_row0 = gl.load(CuK + sid)
                seq_kv = gl.load(CuK + sid + 1) - kv_row0
            else:
                kv_row0 = q_row0
                seq_kv = seq_q
            return 0, h, k, blocks, seq_q, seq_kv, q_row0, kv_row0, h * seq + q_row0
        else:
            blocks, per_head = sched_units(seq, CAUSAL, RAGGED, WGS)
            bh, k = sched_unit(u, n_units, per_head, chunk)
            b = bh // heads
            return b, bh % heads, k, blocks, seq, seq_k, b * seq, b * seq_k, bh * seq

    @gluon.jit
    def sched_n_work(n_units, Table, RAGGED: gl.constexpr, TAIL: gl.constexpr = False):
        """Units of the launch: ``n_units``, or with packed sequences the schedule's count (``TAIL``:
        the slot table's, :mod:`fwd_tail`)."""
        if RAGGED >= 2 or TAIL:
            return gl.load(Table)
        else:
            return n_units

    @gluon.jit
    def sched_slot(u, Table, TAIL: gl.constexpr):
        """``(unit, first, last)`` of work slot ``u``: the unit and its tiles ``first .. last - 1``
        (``last`` 2: all of them, :func:`sched_tile_end`). ``TAIL`` (dense causal, :mod:`fwd_tail`): the
        slot table's entry ``unit * 4 + code`` (code 0 both tiles, 1 the first, 2 the second, 3
        none); otherwise slot ``u`` is unit ``u``, whole."""
        if TAIL:
            e = gl.load(Table + 1 + u)
            code = e % 4
            first = (code == 2).to(gl.int32)
            last = gl.where(code == 0, 2, gl.where(code == 3, 0, first + 1))
            return e // 4, first, last
        else:
            return u, 0, 2

    @gluon.jit
    def sched_tile_end(last, k, blocks, CAUSAL: gl.constexpr, RAGGED: gl.constexpr, TAIL: gl.constexpr):
        """One past the last tile of a slot's unit to run (:func:`sched_slot`'s ``last``, at most the
        unit's :func:`sched_tiles`)."""
        if TAIL:
            return gl.minimum(last, sched_tiles(k, blocks, CAUSAL, RAGGED))
        else:
            return sched_tiles(k, blocks, CAUSAL, RAGGED)

    @gluon.jit
    def sched_tile(k, r, blocks, seq, seq_k, win_left, CAUSAL: gl.constexpr, RAGGED: gl.constexpr,
              BLOCK_N: gl.constexpr, WGS: gl.constexpr):
        """``(pid_m, lo, n_blocks)`` of tile ``r`` of unit ``k`` of a head (``WGS * 64`` query rows):
        the tile walks key blocks ``lo .. lo + n_blocks``; causal units run their longer block
        first, dense windowed ones take the head's blocks from the last (packed ones pair them as
        causal units do: a document's tiles differ in length as causal ones do). Without ``RAGGED``, ``seq`` is both lengths (a multiple of 128, so of ``BLOCK_N``; a
        192-row tile may reach past it). ``CAUSAL == 2`` (a window of ``win_left`` keys left of
        each query's last): ``lo`` is the block of the tile's first row's first key, else 0.
        ``RAGGED == 3``: a tile whose rows see no key (causal with fewer keys than queries, or no
        keys) still walks one key block, all masked."""
        if sched_paired(CAUSAL, RAGGED):
            pid_m = blocks - 1 - k + r * (2 * k + 1 - blocks)  # r 0: blocks - 1 - k, r 1: k
        elif CAUSAL == 2:  # the last blocks first: the short ones (the sequence's first keys) end the order
            pid_m = blocks - 1 - k
        else:
            pid_m = k
        if RAGGED:
            shift = seq_k - seq
            if CAUSAL:
                last = gl.minimum((pid_m + 1) * WGS * ROWS + shift, seq_k)
            else:
                last = seq_k
            n_blocks = (last + BLOCK_N - 1) // BLOCK_N
        elif CAUSAL:
            shift = 0
            n_blocks = (gl.minimum((pid_m + 1) * WGS * ROWS, seq) + BLOCK_N - 1) // BLOCK_N
        else:
            n_blocks = seq // BLOCK_N
        if CAUSAL == 2:  # (the first key of the tile's first row is under its last: lo < n_blocks when it sees any)
            lo = gl.maximum(pid_m * WGS * ROWS + shift - win_left, 0) // BLOCK_N
            n_blocks -= lo
        else:
            lo = 0
        if RAGGED == 3:  # at least one block, masked whole when no row of the tile sees a key (no NaN:
            n_blocks = gl.maximum(n_blocks, 1)  # softmax_block): the pipeline's shape stays as ever
        return pid_m, lo, n_blocks

    @gluon.jit
    def turn_wait(turn_bars, wg: gl.constexpr, k, TURNS: gl.constexpr = True):
        """Wait for consumer ``wg``'s ``k``-th turn to issue products (the turn goes round the
        consumers in order; consumer 0 goes first: a fresh barrier reads as having completed the
        phase before its first). Without ``TURNS`` (``fwd_ws.ws_turns``) the consumers issue as they
        are ready, and this and :func:`turn_pass` do nothing."""
        if not TURNS:
            pass
        elif wg == 0:
            mbarrier.wait(turn_bars.index(0), phase=(k & 1) ^ 1)
        else:
            mbarrier.wait(turn_bars.index(wg), phase=k & 1)

    @gluon.jit
    def turn_pass(turn_bars, wg: gl.constexpr, TURNS: gl.constexpr = True):
        if TURNS:
            mbarrier.arrive(turn_bars.index((wg + 1) % turn_bars.type.shape[0]), count=1)


def ws_shape_supported(q_shape, k_shape, dtype: torch.dtype, ragged: bool = False, head_dims=WS_HEAD_DIMS,
                       multiple: int = WS_BLOCK_M, dtypes=(torch.float16, torch.bfloat16)) -> bool:
    """Whether shapes and dtype fit the kernel: BSHD, D in {64, 128, 256}, Sq == Sk a multiple of 128,
    Hq a multiple of Hkv, nothing empty.
    ``ragged`` admits any 0 < Sq <= Sk (the kernel's RAGGED path, checked against float64 on an H100;
    the library runs it when a config or the tuner asks, not by the automatic rule). ``head_dims``
    and ``multiple``: another Gluon kernel's head dims and length multiple (the D=256 backward's);
    ``dtypes``: the input types taken (the FP8 launcher's e4m3, :mod:`fwd_ws_fp8`)."""
    if len(q_shape) != 4 or len(k_shape) != 4:
        return False
    Sq, Sk = q_shape[1], k_shape[1]
    lengths = (0 < Sq <= Sk) if ragged else (Sq == Sk and Sq > 0 and Sq % multiple == 0)
    return (lengths and q_shape[-1] in head_dims and k_shape[-1] == q_shape[-1] and q_shape[0] == k_shape[0]
            and k_shape[2] > 0 and q_shape[2] % k_shape[2] == 0 and q_shape[0] * q_shape[2] > 0
            and dtype in dtypes)


def ws_scale_ok(softmax_scale: float) -> bool:
    """Whether the kernel takes this scale: its float32 ``softmax_scale * log2(e)`` must be a
    positive normal number (the row maximum is taken before scaling, and a scale flushed to 0 would
    turn masked scores' ``-inf * 0`` into NaN). False for 0, negative, NaN and tiny scales."""
    return softmax_scale * LOG2E >= 2.0 ** -126


def softcap_args(softmax_scale: float, softcap: float | None) -> tuple[float, float, int]:
    """The Gluon kernels' ``(qk_scale, softcap)`` arguments and ``SOFTCAP`` constexpr:
    ``(softmax_scale * log2(e), 0, 0)`` without a cap; with one, ``(softmax_scale / cap,
    cap * log2(e), 1)`` (:func:`softcap_tanh`)."""
    if not softcap:
        return softmax_scale * LOG2E, 0.0, 0
    if not (0 < softcap < float("inf")):
        raise ValueError(f"softcap must be a positive finite float, got {softcap!r}")
    return softmax_scale / softcap, softcap * LOG2E, 1


def ws_band(win_left: int, win_right: int, seq: int) -> bool | None:
    """``True`` (causal) or ``False`` (full) when the band ``[win_left, win_right]`` over ``seq``
    keys is one of the two the kernel takes, else None."""
    if win_left < seq - 1:
        return None
    if win_right == 0:
        return True
    return False if win_right >= seq - 1 else None


def window_band(win_left: int, win_right: int, seq: int) -> tuple[bool, int | None] | None:
    """``(causal, win_left or None)`` when the band ``[win_left, win_right]`` over ``seq`` keys is
    one the kernels with a window mode take (this forward's and the Gluon backward's ``CAUSAL`` 0, 1
    or 2): full, causal, or causal with a left window (``win_right == 0``, ``0 <= win_left <
    seq - 1``), else None."""
    causal = ws_band(win_left, win_right, seq)
    if causal is not None:
        return causal, None
    return (True, win_left) if win_right == 0 and 0 <= win_left < seq - 1 else None


def ws_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ragged: bool = False, head_dims=WS_HEAD_DIMS,
                 multiple: int = WS_BLOCK_M) -> bool:
    """Whether ``fwd_ws.flash_attention_fwd_ws`` can run these inputs on this machine (see the module
    docstring; ``ragged``, ``head_dims`` and ``multiple`` as in :func:`ws_shape_supported`)."""
    if not GLUON or not q.is_cuda or not ws_shape_supported(q.shape, k.shape, q.dtype, ragged, head_dims, multiple):
        return False
    if cuda_capability(q) != (9, 0):
        return False  # warpgroup MMAs are sm_90's (sm_100 has its own tensor-core instructions)
    return all(t.dtype == q.dtype and t.device == q.device and tma_rows_view(t) for t in (q, k, v)) \
        and v.shape == k.shape


def ws_call_band(q, k, v, softmax_scale: float, win_left: int, win_right: int) -> tuple[bool, int | None] | None:
    """The kernel's ``(causal, window)`` (:func:`window_band`) when it takes this call, with ragged
    lengths (:func:`ws_supported`) and the scale (:func:`ws_scale_ok`), else None: the one gate of
    the dispatchers (``dispatch.flash_attention_fwd_dense``, ``plans.fwd_ws_plan``)."""
    band = window_band(win_left, win_right, k.shape[1]) if q.dim() == 4 else None
    if band is None or not ws_scale_ok(softmax_scale) or not ws_supported(q, k, v, ragged=True):
        return None
    return band


def packed_window_band(win_left: int, win_right: int, q, k) -> tuple[bool, int | None] | None:
    """:func:`window_band` of packed sequences ``q [Tq, Hq, D]``, ``k [Tk, Hkv, D]``: the packed
    kernels' ``(causal, window)``. Any sequence's band is the whole one's, judged over
    ``max(Tq, Tk)`` (with two offsets tensors a sequence may hold up to Tq queries and Tk keys, and
    bottom-right alignment shifts its rows by up to the larger count: a right window of Tk - 1 over
    fewer keys than queries is a band, not full attention); a sequence shorter than the window is causal."""
    return window_band(win_left, win_right, max(q.shape[0], k.shape[0]))


def ws_packed_supported(q, k, v, cum_seqlens_q, cum_seqlens_k, two_offsets: bool = False) -> bool:
    """Whether ``fwd_ws.flash_attention_fwd_ws_packed`` takes these packed inputs: q ``[total, Hq, D]`` and
    k/v ``[total, Hkv, D]`` as the dense kernel's rows (:func:`ws_supported`), one offsets tensor
    for both (the same int32 values: each sequence's queries are its keys, which the kernel reads
    from the one tensor), at most ``varlen.WS_PACKED_MAX_SEQS`` sequences. ``two_offsets``: two
    tensors are taken too (contiguous int32 of one length; k/v ``[total_k, Hkv, D]``): the
    forward's ``RAGGED == 3`` and the fused backward's ``PACKED == 2``."""
    from kernelops.kernels.flash_attention.varlen import WS_PACKED_MAX_SEQS

    if q.dim() != 3 or k.dim() != 3 or q.shape[0] == 0 or k.shape[0] == 0:
        return False
    same = same_offsets(cum_seqlens_q, cum_seqlens_k)
    if not (same or two_offsets) or (same and q.shape[0] != k.shape[0]):
        return False
    # dtypes, devices, head dims and row views (one token each: the kernel's tiles take any lengths)
    if v.shape != k.shape or not ws_supported(q[None, :1], k[None, :1], v[None, :1], True):
        return False
    return all(cu.dtype == torch.int32 and cu.device == q.device and cu.dim() == 1 and cu.is_contiguous()
               and 0 < cu.numel() - 1 <= WS_PACKED_MAX_SEQS and cu.numel() == cum_seqlens_q.numel()
               for cu in (cum_seqlens_q, cum_seqlens_k))


def same_offsets(cum_seqlens_q, cum_seqlens_k) -> bool:
    """Whether the two offsets tensors are one (the same object, or views of the same values: same
    address, shape and strides), so that every sequence has as many keys as queries."""
    return cum_seqlens_q is cum_seqlens_k or (
        cum_seqlens_q.data_ptr() == cum_seqlens_k.data_ptr() and cum_seqlens_q.shape == cum_seqlens_k.shape
        and cum_seqlens_q.stride() == cum_seqlens_k.stride() and cum_seqlens_q.dtype == cum_seqlens_k.dtype)


def check_positive(name: str, value) -> None:
    """Raise unless ``value`` (a launch order's ``chunk`` or ``programs``) is a positive int."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
