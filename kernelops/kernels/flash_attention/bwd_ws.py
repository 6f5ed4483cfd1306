"""Flash attention dK/dV for Hopper in Gluon: warp-specialised, K and V resident in shared memory.

The Triton dK/dV kernel (bwd.py) holds K and V in registers as the A operands of S^T = K Q^T and
dP^T = V dO^T beside its two float32 accumulators, and spills in every shipped config. Here K and
V stay in shared memory (warpgroup MMAs read A from there), so a thread holds dK, dV, the two
score tiles and their 16-bit copies.

One program per 128 keys of one (batch, KV head): two consumer warpgroups of 64 keys each and a
one-warp producer that loads K/V once and streams Q(j) and dO(j) blocks of 64 (or 32) queries,
for every query head of the GQA group, into rings of shared-memory stages that both consumers
release. Per block a consumer issues S^T and dP^T as asynchronous MMAs, waits for S^T, forms
P^T = exp2(S^T * scale - lse) while dP^T runs, issues dV += P^T dO, waits for dP^T, forms
dS^T = P^T (dP^T - delta), issues dK += dS^T Q and waits for everything before the next block (no
group in flight across the loop's back edge: ptxas would serialise every MMA of the kernel).
``PINGPONG`` makes
the two warpgroups take turns at each of the three issue points (as the forward in fwd_ws.py).
dQ stays with the Triton dQ kernel, which does not spill. Measured in docs/performance.md.

Causal programs start at the first query block that sees one of their keys and, with a left
window, stop after the last; the 1-D grid goes in chunks of heads, each chunk key block by key
block (:func:`launch_order`), so the longest programs launch first within a chunk and the programs
running at once share a few heads' Q and dO in L2. Scope (:func:`dkdv_ws_supported`, :func:`dkdv_ws_band`): the forward's (ws_common.ws_supported:
sm_90, Gluon, float16 / bfloat16 BSHD row views, Sq == Sk a multiple of 128, GQA) at D 64/128
(:data:`DKDV_HEAD_DIMS`), with
dout, dk and dv row views as well; causal (with or without a left window) or full; no other
score terms or dropout.
"""

from __future__ import annotations

import torch

from kernelops.kernels.common.gluon import GLUON
from kernelops.kernels.common.host import LAUNCH_OPTIONS, num_sms
from kernelops.kernels.common.launch import direct_launch
from kernelops.kernels.common.tma import row_descriptor, tma_rows_view, vector_descriptor
from kernelops.kernels.flash_attention.ws_common import LOG2E, WS_BLOCK_M, check_positive, window_band, ws_supported

#: head dims the dK/dV kernel (and the fused backward built on it) takes; D=256 has bwd_d256.py
DKDV_HEAD_DIMS = (64, 128)

if GLUON:
    from kernelops.kernels.common.gluon import (
        fence_async_shared, gl, gluon, mbarrier, mma_layout, tma, tma_load, tma_store, warpgroup_mma,
        warpgroup_mma_wait)
    from kernelops.kernels.flash_attention.ws_common import sched_unit, softcap_tanh, turn_pass, turn_wait

    KEYS = gl.constexpr(64)  # keys per consumer warpgroup
    LOG2E_K = gl.constexpr(LOG2E)

    @gluon.jit
    def key_blocks(seq, win_left, chunk, CAUSAL: gl.constexpr, QROWS: gl.constexpr):
        """``(pid_n, bh, first query block, end query block)`` of this program (128 keys of head ``bh``).
        ``CAUSAL``: 0 full, 1 causal, 2 causal with a left window (query i sees keys i - win_left .. i),
        where queries past the last key + win_left see none of the program's keys. The grid is 1-D,
        ``B * Hkv * (S // 128)`` programs (the fused kernel's ``SPLIT``: ``B * Hq * (S // 128)``) in chunks of ``chunk`` heads (the last chunk may be smaller):
        within a chunk every head's first key block (the longest when causal) launches, then every
        head's second, and so on (:func:`launch_order`; the forward's unit order, :func:`ws_common.sched_unit`,
        with one key block a unit)."""
        bh, pid_n = sched_unit(gl.program_id(0), gl.num_programs(0), seq // (2 * KEYS), chunk)
        if CAUSAL:
            j0 = pid_n * 2 * KEYS // QROWS  # earlier queries see none of these keys
        else:
            j0 = pid_n * 0
        if CAUSAL == 2:
            j_end = gl.minimum(seq // QROWS, (pid_n * 2 * KEYS + 2 * KEYS - 1 + win_left) // QROWS + 1)
        else:
            j_end = seq // QROWS
        return pid_n, bh, j0, j_end

    @gluon.jit
    def program_heads(bh, heads, group, SPLIT: gl.constexpr):
        """``(b, hk, h0, n)``: the batch, KV head and first query head of unit head ``bh`` and how many
        query heads the program walks: a (batch, KV head)'s ``group`` heads, or with ``SPLIT`` (units
        over (batch, query head), the fused kernels' float32 dK/dV sums) the one."""
        if SPLIT:
            b = bh // heads
            h0 = bh % heads
            hk = h0 // group
            n = group * 0 + 1
        else:
            b = bh // (heads // group)
            hk = bh % (heads // group)
            h0 = hk * group
            n = group
        return b, hk, h0, n

    @gluon.jit
    def packed_program(packed, chunk, group, win_left, UNIT: gl.constexpr, QROWS: gl.constexpr,
                        CAUSAL: gl.constexpr, TWO: gl.constexpr = False):
        """:func:`dkdv_program`'s tuple for a packed program of ``UNIT`` keys (``packed = (Cu, Table, CuK)``,
        the schedule's entry ``program_id``; see there): the D=128 kernels' 128-key units and the
        D=256 kernel's 64-key ones. ``TWO``: the keys' rows and lengths come from ``CuK`` (the
        schedule's units are key blocks of those), else from ``Cu`` like the queries'. ``CAUSAL ==
        2``: the query blocks end at the last one holding a query whose window reaches the unit's
        last key (``win_left`` keys left of a query's own position)."""
        Cu, Table, CuK = packed
        u = gl.program_id(0)
        valid = (u < gl.load(Table)).to(gl.int32)
        e = u * valid  # past the count: entry 0, with its lengths taken as 0
        sid = gl.load(Table + 1 + e)
        hk = gl.load(Table + 1 + chunk + e)
        pid_n = gl.load(Table + 1 + 2 * chunk + e)
        row0 = gl.load(Cu + sid)
        q_len = (gl.load(Cu + sid + 1) - row0) * valid
        if TWO:
            krow0 = gl.load(CuK + sid)
            length = (gl.load(CuK + sid + 1) - krow0) * valid
        else:
            krow0 = row0
            length = q_len
        q_min = length - q_len  # the first query's place among the keys (bottom-right causal)
        shift = row0 % 4 * valid  # (past the count: no query block at all)
        if CAUSAL:  # the first block holding a query at or after the unit's first key
            j0 = gl.maximum(pid_n * UNIT - q_min + shift, 0) // QROWS
        else:
            j0 = pid_n * 0
        j_end = (q_len + shift + QROWS - 1) // QROWS * (q_len > 0).to(gl.int32)
        if CAUSAL == 2:  # the last query that sees the unit's last key stands at key position last + win_left
            last_q = pid_n * UNIT + UNIT - 1 + win_left - q_min + shift  # (negative: no query sees the unit)
            j_end = gl.minimum(j_end, (last_q + QROWS) // QROWS)  # (division rounds toward zero)
        return (pid_n, hk, hk * group, group, j0, j_end, row0, row0 - shift, length, shift, krow0, q_min)

    @gluon.jit
    def dkdv_program(seq, heads, group, win_left, chunk, packed, CAUSAL: gl.constexpr, QROWS: gl.constexpr,
                 SPLIT: gl.constexpr, PACKED: gl.constexpr):
        """``(pid_n, hk, h0, n_heads, j0, j_end, row0, stat0, length, shift, krow0, q_min)`` of this
        program: its key block (128 keys; bwd_d256: 64), KV head, first query head and query-head count
        (:func:`program_heads`), query blocks ``j0 .. j_end`` (:func:`key_blocks`), the row of its sequence's
        first query in the row views, the offset of its first query block's lse / delta values of
        head 0 (head ``h``'s: ``stat0 + h * seq``), the sequence's key count, ``shift`` (query block
        ``j`` holds the sequence's queries ``j * QROWS - shift ..``: rows ``row0 - shift + j * QROWS ..``),
        the row of its first key, and ``q_min``: the sequence's query ``i`` stands at key position
        ``i + q_min`` (bottom-right causal: it sees keys up to there; 0 unless the two sides' lengths
        differ). ``PACKED`` (1: one offsets tensor, 2: queries and keys delimited by two):
        ``packed = (Cu, Table, CuK)``, the offsets and the schedule of ``varlen.ws_packed_schedule``
        over KV heads with 128-key units of the keys' sequences (program ``u`` takes entry ``u``;
        programs past the count get length 0: no query block, nothing stored), ``seq`` the row
        length of lse / delta (``[Hq, seq]``, the query token count rounded up to a multiple of 4);
        blocks are local to the sequence (a window, ``CAUSAL == 2``, per sequence), and the query blocks start ``shift = row0 %
        4`` tokens before it, so that each block's lse and delta boxes start 16-byte aligned as
        1-D TMA loads need (the tokens before the sequence are masked)."""
        if PACKED:
            return packed_program(packed, chunk, group, win_left, 2 * KEYS, QROWS, CAUSAL, PACKED == 2)
        else:
            pid_n, bh, j0, j_end = key_blocks(seq, win_left, chunk, CAUSAL, QROWS)
            b, hk, h0, n_heads = program_heads(bh, heads, group, SPLIT)
            return pid_n, hk, h0, n_heads, j0, j_end, b * seq, b * heads * seq, seq, 0, b * seq, 0

    @gluon.jit
    def dkdv_producer(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads, group,
                  win_left, k_smem, v_smem, q_ring, do_ring, bars, CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr,
                  PINGPONG: gl.constexpr, chunk, stat_rings, SPLIT: gl.constexpr, packed, PACKED: gl.constexpr):
        """K and V once, then per query block its Q and dO tiles into their rings, and with them the
        block's lse and delta values (``Lse`` / ``Delta``: 1-D TMA descriptors) into ``stat_rings``
        (two ``[STAGES, QROWS]`` float32 rings): the consumers then read them from shared memory, not
        from global memory on their critical path. ``packed`` / ``PACKED``: :func:`dkdv_program`."""
        kv_bar, ready, free, turn_bars = bars
        STAGES: gl.constexpr = q_ring.type.shape[0]
        QROWS: gl.constexpr = q_ring.type.shape[1]  # queries per streamed block
        pid_n, hk, h0, n_heads, j0, j_end, row0, stat0, _, shift, krow0, _ = dkdv_program(
            seq, heads, group, win_left, chunk, packed, CAUSAL, QROWS, SPLIT, PACKED)
        mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
        for w in gl.static_range(2):
            tma_load(k_desc, [krow0 + pid_n * 2 * KEYS + w * KEYS, hk * HEAD_DIM], kv_bar, k_smem.index(w))
            tma_load(v_desc, [krow0 + pid_n * 2 * KEYS + w * KEYS, hk * HEAD_DIM], kv_bar, v_smem.index(w))
        it = 0
        for g in range(n_heads):
            h = h0 + g
            for j in range(j0, j_end):
                s = it % STAGES
                phase = ((it // STAGES) & 1) ^ 1
                stat_row = stat0 + h * seq + j * QROWS
                mbarrier.wait(free.index(s), phase=phase)  # both warpgroups are done with stage s
                mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes
                                + Lse.block_type.nbytes + Delta.block_type.nbytes)
                tma_load(q_desc, [row0 + j * QROWS - shift, h * HEAD_DIM], ready.index(s), q_ring.index(s))
                tma_load(do_desc, [row0 + j * QROWS - shift, h * HEAD_DIM], ready.index(s), do_ring.index(s))
                tma_load(Lse, [stat_row], ready.index(s), stat_rings[0].index(s))
                tma_load(Delta, [stat_row], ready.index(s), stat_rings[1].index(s))
                it += 1

    @gluon.jit
    def probs_t(st, lse, keys, queries, first_key, q_lo, win_left, qk_scale, softcap, length, q_min,
                 QUERIES: gl.constexpr, CAUSAL: gl.constexpr, PACKED: gl.constexpr, SOFTCAP: gl.constexpr):
        """P^T ``[KEYS, QUERIES]`` of one block from its raw scores S^T (``keys`` from ``first_key``,
        ``queries`` from ``q_lo``; ``lse [QUERIES]`` in log2 units) with the band's masks (``CAUSAL``,
        ``PACKED`` as in :func:`dv_and_ds`): ``(pt, st)``. With ``SOFTCAP`` the scores are
        ``cap * tanh(scale * s / cap)`` and the returned ``st`` is that tanh, for tanh's derivative
        in dS^T; else ``st`` comes back as it came."""
        if SOFTCAP:
            st = softcap_tanh(st, qk_scale)
            pt = gl.exp2(st * softcap - lse[None, :])
        else:
            pt = gl.exp2(st * qk_scale - lse[None, :])
        if CAUSAL:
            if first_key + KEYS - 1 > q_lo:  # a key after some query of the block
                pt = gl.where(keys[:, None] <= queries[None, :], pt, 0.0)
        if CAUSAL == 2:
            if q_lo + QUERIES - 1 > first_key + win_left:  # a query past some key's window
                pt = gl.where(queries[None, :] <= keys[:, None] + win_left, pt, 0.0)
        if PACKED:
            if (first_key + KEYS > length) | (q_lo + QUERIES > length) | (q_lo < q_min):  # another sequence's rows
                pt = gl.where((keys[:, None] < length) & ((queries < length) & (queries >= q_min))[None, :], pt, 0.0)
        return pt, st

    @gluon.jit
    def dv_and_ds(k_tile, v_tile, q_tile, do_tile, zeros_s, dv, lse_tile, delta_tile, queries, keys, first_key, q_lo,
                   win_left, qk_scale, turn_bars, it, a_layout: gl.constexpr, CAUSAL: gl.constexpr,
                   PINGPONG: gl.constexpr, WG: gl.constexpr, length=0, PACKED: gl.constexpr = False, q_min=0,
                   softcap=0.0, SOFTCAP: gl.constexpr = 0):
        """One query block (its lowest query ``q_lo``) against this warpgroup's keys: S^T and dP^T (``[KEYS, QROWS]``),
        P^T with the band's masks, ``dv += P^T dO`` issued (not waited for), and ``dS^T = P^T (dP^T -
        delta)`` in float32: ``(dst, dv)``, the block's lse and delta read from their ``[QROWS]``
        shared-memory tiles. With ``PINGPONG`` the block's first two turns. ``PACKED``: ``queries``
        and ``q_lo`` are key positions (:func:`dkdv_program`'s ``q_min``), and keys and queries from
        ``length`` on (the next sequence's rows) and queries before ``q_min`` (the previous one's)
        are masked out. ``SOFTCAP`` (``ws_common.softcap_tanh``; ``qk_scale`` and
        ``softcap`` from ``ws_common.softcap_args``): the scores are ``cap * tanh(scale * s / cap)``, and
        dS^T takes tanh's derivative, ``1 - tanh^2`` (the softmax scale stays the caller's to apply)."""
        QROWS: gl.constexpr = q_tile.type.shape[0]
        dtype: gl.constexpr = q_tile.dtype
        if PINGPONG:  # three turns per block, one per issue point: strict alternation of the warpgroups
            turn_wait(turn_bars, WG, 3 * it)
        st = warpgroup_mma(k_tile, q_tile.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_tile, do_tile.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
        if PINGPONG:
            turn_pass(turn_bars, WG)
        lse = lse_tile.load(queries.type.layout) * LOG2E_K  # natural log -> log2 units
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
        pt, st = probs_t(st, lse, keys, queries, first_key, q_lo, win_left, qk_scale, softcap, length, q_min, QROWS,
                          CAUSAL, PACKED, SOFTCAP)
        if PINGPONG:
            turn_wait(turn_bars, WG, 3 * it + 1)
        dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), a_layout), do_tile, dv, is_async=True)
        if PINGPONG:
            turn_pass(turn_bars, WG)
        if SOFTCAP:  # tanh's derivative folded into P^T while dP^T runs: tanh's registers free before the wait
            pt = pt * (1.0 - st * st)
        dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, ))
        delta = delta_tile.load(queries.type.layout)  # read late: fewer live registers
        return pt * (dpt - delta[None, :]), dv

    @gluon.jit
    def _consumer(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads, group,
                  win_left, k_smem, v_smem, q_ring, do_ring, bars, stat_rings, CAUSAL: gl.constexpr,
                  HEAD_DIM: gl.constexpr, PINGPONG: gl.constexpr, chunk, WG: gl.constexpr):
        """Keys ``[WG * 64, WG * 64 + 64)`` of the program's 128: dK and dV over every query head of
        the group and every query block that sees them."""
        kv_bar, ready, free, turn_bars = bars
        STAGES: gl.constexpr = q_ring.type.shape[0]
        QROWS: gl.constexpr = q_ring.type.shape[1]  # queries per streamed block
        dtype: gl.constexpr = q_desc.dtype
        pid_n, bh, j0, j_end = key_blocks(seq, win_left, chunk, CAUSAL, QROWS)
        b = bh // (heads // group)
        hk = bh % (heads // group)
        first_key = pid_n * 2 * KEYS + WG * KEYS

        s_layout: gl.constexpr = mma_layout(QROWS)
        d_layout: gl.constexpr = mma_layout(HEAD_DIM)
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=d_layout, k_width=2)
        key_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        query_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
        k_tile = k_smem.index(WG)
        v_tile = v_smem.index(WG)
        keys = first_key + gl.arange(0, KEYS, layout=key_layout)
        dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=d_layout)
        dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=d_layout)
        zeros_s = gl.zeros([KEYS, QROWS], gl.float32, layout=s_layout)

        mbarrier.wait(kv_bar, phase=0)
        it = 0
        for _ in range(group):
            for j in range(j0, j_end):
                s = it % STAGES
                phase = (it // STAGES) & 1
                queries = j * QROWS + gl.arange(0, QROWS, layout=query_layout)
                mbarrier.wait(ready.index(s), phase=phase)
                q_tile = q_ring.index(s)
                do_tile = do_ring.index(s)
                dst, dv = dv_and_ds(k_tile, v_tile, q_tile, do_tile, zeros_s, dv, stat_rings[0].index(s),
                                     stat_rings[1].index(s), queries, keys, first_key, j * QROWS, win_left, qk_scale,
                                     turn_bars,
                                     it, a_layout, CAUSAL, PINGPONG, WG)
                if PINGPONG:
                    turn_wait(turn_bars, WG, 3 * it + 2)
                dk = warpgroup_mma(gl.convert_layout(dst.to(dtype), a_layout), q_tile, dk, is_async=True)
                if PINGPONG:
                    turn_pass(turn_bars, WG)
                dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
                mbarrier.arrive(free.index(s), count=1)
                it += 1

        # K and V of this warpgroup are no longer read: their tiles stage dK and dV
        k_tile.store((dk * sm_scale).to(dtype))
        v_tile.store(dv.to(dtype))
        fence_async_shared()
        row = b * seq + first_key
        tma_store(dk_desc, [row, hk * HEAD_DIM], k_tile)
        tma_store(dv_desc, [row, hk * HEAD_DIM], v_tile)
        tma.store_wait(pendings=0)

    @direct_launch
    @gluon.jit
    def dkdv_ws_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads,
                       group, win_left, chunk, CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                       PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                       num_warps: gl.constexpr):
        """q/do ``[B * S, Hq * D]`` row views (TMA blocks of 32 or 64 queries), k/v/dk/dv ``[B * S, Hkv * D]``
        (blocks of 64 keys);
        Lse / Delta 1-D descriptors of the ``[B, Hq, S]`` float32 vectors (natural-log lse; delta =
        rowsum(dO * O)), boxes of one block's queries; ``CAUSAL`` 0/1/2
        as in :func:`key_blocks` (``win_left`` read with 2). Grid ``(B * Hkv * (S // 128),)`` in chunks of
        ``chunk`` heads (:func:`key_blocks`), ``num_warps`` 4."""
        dtype: gl.constexpr = q_desc.dtype
        QROWS: gl.constexpr = q_desc.block_type.shape[0]
        k_smem = gl.allocate_shared_memory(dtype, [2, KEYS, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [2, KEYS, HEAD_DIM], v_desc.layout)
        q_ring = gl.allocate_shared_memory(dtype, [STAGES, QROWS, HEAD_DIM], q_desc.layout)
        do_ring = gl.allocate_shared_memory(dtype, [STAGES, QROWS, HEAD_DIM], do_desc.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        stat_rings = (gl.allocate_shared_memory(gl.float32, [STAGES, QROWS], Lse.layout),
                      gl.allocate_shared_memory(gl.float32, [STAGES, QROWS], Delta.layout))
        for i in gl.static_range(2):
            mbarrier.init(turn_bars.index(i), count=1)
        mbarrier.init(kv_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)  # Q, dO, lse and delta of a block, by TMA
            mbarrier.init(free.index(i), count=2)  # one arrive per consumer warpgroup
        bars = (kv_bar, ready, free, turn_bars)
        gl.warp_specialize([
            (_consumer, (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads,
                         group, win_left, k_smem, v_smem, q_ring, do_ring, bars, stat_rings, CAUSAL, HEAD_DIM, PINGPONG,
                         chunk, 0)),
            (_consumer, (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads,
                         group, win_left, k_smem, v_smem, q_ring, do_ring, bars, stat_rings, CAUSAL, HEAD_DIM, PINGPONG,
                         chunk, 1)),
            (dkdv_producer, (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads,
                         group, win_left, k_smem, v_smem, q_ring, do_ring, bars, CAUSAL, HEAD_DIM, PINGPONG, chunk,
                         stat_rings, False, (seq, seq, seq), False)),
        ], [4, 1], [CONSUMER_REGS, 24])


#: ``(causal, win_left or None)`` for :func:`flash_attention_bwd_dkdv_ws` when the band
#: ``[win_left, win_right]`` over ``seq`` keys is one the kernel takes (full, causal, or causal with
#: a left window), else None: the forward's :func:`ws_common.window_band`
dkdv_ws_band = window_band


def _stats_vector(name: str, t: torch.Tensor, shape: tuple) -> torch.Tensor:
    """``t`` (the lse or delta of a Gluon backward launch) checked as a contiguous float32 ``shape``,
    copied when its address is not 16-byte aligned (TMA reads it)."""
    if t.shape != shape or t.dtype != torch.float32 or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous float32 [B, Hq, S] = {shape}, got {tuple(t.shape)} {t.dtype}")
    return t if t.data_ptr() % 16 == 0 else t.clone()


def launch_order(heads: int, seq: int, sms: int, chunk: int | None = None,
                 keys: int = 128) -> tuple[int, tuple[int]]:
    """``(chunk, grid)`` of the backward's Gluon kernels over ``heads`` (B * Hkv, or B * Hq when the
    fused kernels split the query heads) with ``seq // keys``
    key blocks each (128; the D=256 kernel's programs hold 64), on a GPU of ``sms`` multiprocessors. The grid is 1-D; its programs go in
    chunks of ``chunk`` heads, each chunk key block by key block (:func:`key_blocks`): ``chunk=1`` walks
    one head's key blocks, then the next head's; ``chunk=heads`` every head's first key block, then
    every head's second. The programs running at once then share a few heads' Q and dO (and the
    fused kernel's dQ sums) in L2, and causal programs start longest first within each chunk.
    None: a chunk of about one wave, ``sms // (seq // 128)`` heads rounded down to a power of two
    (H200, bf16, 512-16k keys, D 64/128, causal or not, GQA 1/4: within 3% of the best
    chunk measured on every row, and 1.07-1.37x faster than every head's first block first, the
    other order; at 512 keys, where 132 SMs made it 33 heads of four key blocks, 32 and
    every other chunk from 1 to 64 ran the fused backward 1.5-4.6% faster causal)."""
    blocks = seq // keys
    if chunk is None:
        chunk = 1 << (max(1, sms // max(1, blocks)).bit_length() - 1)
    check_positive("chunk", chunk)
    return min(chunk, heads), (heads * blocks,)


def launch_prologue(q, k, lse, delta, causal: bool, win_left: int | None, chunk: int | None, keys: int = 128,
                    per_query_head: bool = False, stats_len: int | None = None):
    """What both Gluon backward launches (dK/dV and fused) work out first, for ``q [B, S, Hq, D]``
    and ``k [B, S, Hkv, D]``: ``(lse, delta, chunk, grid, mode)`` with lse and delta checked
    ``[B, Hq, S]`` float32 vectors (copied when not 16-byte aligned), ``win_left`` checked, the
    :func:`launch_order` over this GPU's multiprocessors (programs of ``keys`` keys) and ``mode`` the kernels' ``CAUSAL``
    (0/1/2 as in :func:`key_blocks`). The grid's heads are k's, or with ``per_query_head`` q's.
    ``stats_len``: lse and delta rows of that many values, not S (packed sequences' padded rows)."""
    B, S, Hq, _ = q.shape
    shape = (B, Hq, S if stats_len is None else stats_len)
    lse, delta = (_stats_vector(name, t, shape) for name, t in (("lse", lse), ("delta", delta)))
    if win_left is not None and (not causal or isinstance(win_left, bool) or not 0 <= win_left < 2 ** 30):
        raise ValueError(f"win_left needs causal=True and 0 <= win_left < 2**30, got {win_left!r} (causal={causal})")
    chunk, grid = launch_order(B * (Hq if per_query_head else k.shape[2]), S, num_sms(q.device, 1), chunk, keys)
    return lse, delta, chunk, grid, 2 if win_left is not None else int(bool(causal))


def dkdv_ws_supported(q, k, v, dout, dk, dv, head_dims=DKDV_HEAD_DIMS, multiple: int = WS_BLOCK_M) -> bool:
    """Whether :func:`flash_attention_bwd_dkdv_ws` can run these tensors on this machine: the
    forward's conditions on q/k/v, and dout/dk/dv row views of the same dtype (``head_dims`` and
    ``multiple`` as in :func:`ws_common.ws_shape_supported`: the D=256 backward's scope)."""
    return ws_supported(q, k, v, False, head_dims, multiple) and dout.shape == q.shape and dk.shape == dv.shape == k.shape and all(
        t.dtype == q.dtype and t.device == q.device and tma_rows_view(t) for t in (dout, dk, dv))


def flash_attention_bwd_dkdv_ws(q, k, v, dout, lse, delta, dk, dv, *, softmax_scale: float, causal: bool,
                                block_q: int = 64, stages: int = 2, pingpong: bool = False, consumer_regs: int = 240,
                                maxnreg: int = 168, chunk: int | None = None, win_left: int | None = None,
                                checked: bool = False, warmup_only: bool = False):
    """Write ``dk`` and ``dv`` (``[B, S, Hkv, D]``, row views like k) from ``q/dout [B, S, Hq, D]``,
    ``k/v [B, S, Hkv, D]``, ``lse [B, Hq, S]`` float32 (natural log, the forward's) and ``delta
    [B, Hq, S]`` float32 (``rowsum(dO * O)`` minus any lse gradient); returns ``(dk, dv)``.
    ``block_q`` (64 or 32) queries per streamed block, ``stages`` the Q/dO ring depth. ``checked``:
    the caller ran :func:`dkdv_ws_supported`. ``warmup_only`` compiles without launching and returns
    the compiled kernel (offline compiles). ``chunk``: the launch order's heads per chunk
    (:func:`launch_order`; None: its rule). ``win_left`` (with ``causal``): a sliding window,
    query ``i`` sees keys ``i - win_left .. i``."""
    if not (warmup_only or checked) and not dkdv_ws_supported(q, k, v, dout, dk, dv):
        raise ValueError(f"the warp-specialised dK/dV kernel needs an sm_90 GPU, Gluon, float16/bfloat16 BSHD row "
                         f"views, D in (64, 128) and Sq == Sk a multiple of 128; got q {tuple(q.shape)} {q.stride()}, "
                         f"k {tuple(k.shape)} {k.stride()}, {q.dtype} on {q.device}")
    if block_q not in (32, 64) or not 1 <= stages <= 4:
        raise ValueError(f"block_q must be 32 or 64 and stages 1..4, got {block_q}, {stages}")
    kernel, grid, args, meta = dkdv_ws_launch(q, k, v, dout, lse, delta, dk, dv, softmax_scale, causal, block_q, stages,
                                              pingpong, consumer_regs, maxnreg, chunk, win_left)
    if warmup_only:
        return kernel.warmup(*args, **meta, grid=grid)
    kernel[grid](*args, **meta)
    return dk, dv


def dkdv_ws_launch(q, k, v, dout, lse, delta, dk, dv, softmax_scale: float, causal: bool, block_q: int = 64,
                   stages: int = 2, pingpong: bool = False, consumer_regs: int = 240, maxnreg: int = 168,
                   chunk: int | None = None, win_left: int | None = None):
    """``(kernel, grid, args, meta)`` of :func:`flash_attention_bwd_dkdv_ws` over checked tensors
    (lse and delta checked here): the launch it makes, and that a per-signature plan binds once."""
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    lse, delta, chunk, grid, mode = launch_prologue(q, k, lse, delta, causal, win_left, chunk)
    args = (row_descriptor(q, block_q), row_descriptor(k, 64), row_descriptor(v, 64), row_descriptor(dout, block_q),
            row_descriptor(dk, 64), row_descriptor(dv, 64),
            vector_descriptor(lse, block_q), vector_descriptor(delta, block_q),
            softmax_scale * LOG2E, softmax_scale, S, Hq,
            Hq // Hkv, 0 if win_left is None else win_left, chunk)
    # 12 warps (4 + 4 + the producer's, rounded to a warpgroup) share 64K registers: maxnreg each
    # on launch, then consumer_regs for each consumer and 24 for the producer
    meta = dict(CAUSAL=mode, HEAD_DIM=D, STAGES=stages, PINGPONG=bool(pingpong), CONSUMER_REGS=consumer_regs, num_warps=4,
                maxnreg=maxnreg, **LAUNCH_OPTIONS)
    return dkdv_ws_kernel, grid, args, meta
