"""Flash attention forward for Hopper in Gluon: warp-specialised, persistent, consumer warpgroups in ping-pong.

A tile is 128 query rows of one (batch, head), split between two consumer warpgroups of 64 rows
(192 rows and three warpgroups at D=64 from 1536 rows, causal 3072: :func:`ws_consumers`), plus a
one-warp producer partition that issues every TMA load (a tile's Q into one of two Q buffers, then
K and V blocks into rings of shared-memory stages, each stage with a "ready" and an "empty"
barrier; every consumer releases a stage). At D=256 the tiles are 64-key blocks and there is one Q
buffer, loaded after the tile's first K block once the tile before has stored its O
(:func:`ws_tiles`). The grid is persistent: one program per SM walks units of work
(a causal unit pairs the query blocks ``blocks - 1 - k`` and ``k`` of a head, so every unit holds
the same number of key blocks; a full unit is one query block) in chunks of heads
(:func:`fwd_order`); at D=64 (up to 4k rows) and D=256 a dense causal launch's last waves go
tile by tile, longest first, from a slot table (:mod:`fwd_tail`). The rings and the
turn barriers run on from tile to tile; with two Q buffers the next tile's Q loads while this one runs and a tile's O leaves by a TMA store that the next tile
waits for only after its first product (with one, each consumer waits for its store at the tile's
end). A consumer's loop issues S(j+1) = Q K(j+1)^T and O += P(j) V(j) as
asynchronous warpgroup MMAs, waits only for S(j+1), runs the online softmax of S(j+1) while P(j)
V(j) still runs, then waits for it (the intra-warpgroup overlap of FlashAttention-3). The
consumers take turns to issue their products (one mbarrier per consumer passes the turn round),
so one warpgroup's softmax runs while another's products occupy the tensor cores
(inter-warpgroup ping-pong); D=64 with two consumers issues without turns (:func:`ws_turns`).
A wgmma chain in each arm of a runtime ``if`` also made ptxas serialise them all: loops of one
trip or none do not. No MMA group stays in flight across the loop's back edge: ptxas
serialises every warpgroup MMA of a kernel where one does (its note C7514). Softmax in base 2 with
the scale folded in. Measured against the pointer and TMA kernels in docs/performance.md.

Scope (:func:`ws_supported`): an sm_90 GPU, a Triton with Gluon (3.6 or newer), float16 /
bfloat16 ``q [B, S, Hq, D]``, ``k/v [B, S, Hkv, D]`` (BSHD whose (batch, seq) dims flatten into
rows and whose heads sit side by side: contiguous, or sliced from a fused QKV projection),
``D`` in {64, 128, 256}, ``Sq == Sk == S`` a multiple of 128 (or, with ``ragged``, any ``0 < Sq <= Sk``,
bottom-right causal), causal or full attention or a causal sliding window (query ``i`` sees keys
``i + Sk - Sq - win_left .. i + Sk - Sq``: ``CAUSAL == 2``), GQA, soft-capped logits
(``SOFTCAP``, :func:`softcap_tanh`); no bias, ALiBi, sinks, right window, segments or
dropout (those run the other kernels). Returns ``out [B, Sq, Hq, D]`` (q's
dtype) and ``lse [B, Hq, Sq]`` float32, natural log, as fwd.py. FP8 (e4m3) inputs run the same
kernel through :mod:`fwd_ws_fp8`: its type-dependent parts (V read as V^T boxes, P as e4m3 scaled
by 2^8, O staged in boxes of its own) are constexpr branches on the descriptors' dtype.

Packed sequences (:func:`flash_attention_fwd_ws_packed`, ``RAGGED == 2`` in the kernel):
``q [total, Hq, D]``, ``k/v [total, Hkv, D]`` and one ``cum_seqlens`` for both sides. A schedule
launch (``varlen.ws_packed_schedule``) lists the (sequence, head, unit) triples, sequences longest
first, and the persistent programs take them in turn; K/V blocks are read as 2-D row blocks that
may run into the next sequence, whose keys the RAGGED mask hides, and rows past a sequence's end
are stored with a mask.
"""

from __future__ import annotations

import torch

from kernelops.kernels.common.gluon import GLUON
from kernelops.kernels.common.host import LAUNCH_OPTIONS, num_sms, on_input_device
from kernelops.kernels.common.launch import direct_launch
from kernelops.kernels.common.tma import descriptor, row_descriptor, tma_rows_view
from kernelops.kernels.flash_attention import fwd_tail
from kernelops.kernels.flash_attention.ws_common import (
    WS_BLOCK_M, WS_HEAD_DIMS, check_positive, same_offsets, softcap_args, ws_packed_supported, ws_scale_ok,
    ws_supported)

#: 16-bit head dims whose two consumer warpgroups (dense or packed) issue their products without turns
#: (:func:`ws_turns`)
NO_TURN_HEAD_DIMS = (64,)
#: shared memory a program may take on sm_90 (227 KB), less 1 KB for the mbarriers
WS_SMEM_BYTES = 232448 - 1024

if GLUON:
    from kernelops.kernels.common.gluon import (
        fence_async_shared, gl, gluon, mbarrier, mma_layout, thread_barrier, tma, tma_load, tma_store, warpgroup_mma,
        warpgroup_mma_wait)
    from kernelops.kernels.flash_attention.ws_common import (
        ROWS, sched_n_work, sched_slot, sched_tile, sched_tile_end, sched_work, softcap_tanh, turn_pass, turn_wait)

    @gluon.jit
    def softmax_block(s, m_i, l_i, qk_scale, rows, j, first_row, shift, seq_k, win_left, CAUSAL: gl.constexpr,
                      RAGGED: gl.constexpr, BLOCK_N: gl.constexpr, col_layout: gl.constexpr,
                      P_SHIFT: gl.constexpr = 0.0, softcap=0.0, SOFTCAP: gl.constexpr = 0):
        """Online softmax of score block ``j`` (``s [rows, BLOCK_N]`` float32) for query ``rows``
        (the lowest is ``first_row``), base 2 with the scale folded: ``(p, alpha, m_i, l_i)``.
        Causal: query ``i`` sees keys up to ``i + shift`` (``shift = Sk - Sq >= 0``, a constexpr 0
        unless ``RAGGED``); ``CAUSAL == 2`` (a sliding window) also hides keys before
        ``i + shift - win_left``; ``RAGGED`` also masks keys from ``seq_k`` on (a block past the end).
        ``RAGGED == 3`` (packed with two offsets tensors): ``shift`` may be negative and a row may
        have no key yet (its maximum ``-inf``, its ``p`` and ``l_i`` zero).
        ``qk_scale > 0``: the row maximum is taken over the raw scores and scaled once (a multiply
        per element less than scaling first; the same maximum, as rounding is monotone), and each
        exponent's argument is one fused multiply-add. ``P_SHIFT`` (FP8) lowers the
        running maximum by that many powers of two, so P and ``l_i`` come out ``2^P_SHIFT`` times
        their values (P in e4m3's normal range) for no extra operation per element. ``SOFTCAP``
        (a flag, :func:`softcap_tanh`): the scores become ``tanh(scale * s / cap)`` first, and
        ``softcap`` (``cap * log2(e)``, :func:`softcap_args`) scales them as ``qk_scale`` scales plain
        ones."""
        if SOFTCAP:  # (before the masks: a capped -inf would be -cap)
            s = softcap_tanh(s, qk_scale)
            qk_scale = softcap
        if CAUSAL:
            if (j + 1) * BLOCK_N > first_row + shift + 1:  # a key above the lowest row's last one
                cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_layout)
                s = gl.where(cols[None, :] <= rows[:, None] + shift, s, float("-inf"))
        if CAUSAL == 2:
            if j * BLOCK_N < first_row + s.shape[0] - 1 + shift - win_left:  # a key left of the highest row's window
                cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_layout)
                s = gl.where(cols[None, :] >= rows[:, None] + shift - win_left, s, float("-inf"))
        if RAGGED:
            if (j + 1) * BLOCK_N > seq_k:
                cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_layout)
                s = gl.where(cols[None, :] < seq_k, s, float("-inf"))
        m_blk = gl.max(s, 1) * qk_scale
        if P_SHIFT != 0.0:
            m_blk = m_blk - P_SHIFT
        m_new = gl.maximum(m_i, m_blk)
        if RAGGED == 3 or CAUSAL == 2:  # rows that have seen no key yet (fewer keys than queries, or a
            # block left of a row's window): no NaN
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s * qk_scale - m_use[:, None])
        return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)

    @gluon.jit
    def _load_q(q_desc, q_smem, q_ready, q_free, WGS: gl.constexpr, i, row, col):
        """Load tile ``i``'s Q (a ``[64, D]`` box per consumer from ``row``) into buffer ``i % Q_BUFS``
        once the consumers have stored the O they staged there: with two buffers, one barrier pair
        per buffer (every consumer frees it); with one, a pair per consumer (each box loads as soon
        as its own consumer is done)."""
        Q_BUFS: gl.constexpr = q_smem.type.shape[0] // WGS
        if Q_BUFS == 2:
            qb = i % 2
            mbarrier.wait(q_free.index(qb), phase=((i // 2) & 1) ^ 1)
            mbarrier.expect(q_ready.index(qb), WGS * q_desc.block_type.nbytes)
            for wg in gl.static_range(WGS):
                tma_load(q_desc, [row + wg * ROWS, col], q_ready.index(qb), q_smem.index(WGS * qb + wg))
        else:
            for wg in gl.static_range(WGS):
                mbarrier.wait(q_free.index(wg), phase=(i & 1) ^ 1)
                mbarrier.expect(q_ready.index(wg), q_desc.block_type.nbytes)
                tma_load(q_desc, [row + wg * ROWS, col], q_ready.index(wg), q_smem.index(wg))

    @gluon.jit
    def _producer(args, CAUSAL: gl.constexpr, RAGGED: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                  TAIL: gl.constexpr):
        """One warp: per tile of the program's units, its Q into a free Q buffer (with two, the next
        tile's Q arrives while this one runs; with one, after the tile's first K block), then its
        K(j) and V(j) into their rings as the consumers free the stages (the rings run on from tile
        to tile). ``args``: the kernel's
        runtime arguments and shared memory (:func:`flash_attention_fwd_ws_kernel`)."""
        (q_desc, k_desc, v_desc, _, _, _, seq, heads, group, seq_k, _, _, n_units, chunk, Cu, CuK, Table, q_smem,
         k_ring, v_ring, bars, _o_smem, _o_scale, win_left, _softcap) = args
        V_T: gl.constexpr = q_desc.dtype.is_fp8()  # FP8: V^T [B * Hkv * D, Sk] in [D, BLOCK_N] boxes
        q_ready, q_free, k_ready, k_empty, v_ready, v_empty, turn_bars = bars
        K_STAGES: gl.constexpr = k_ring.type.shape[0]
        V_STAGES: gl.constexpr = v_ring.type.shape[0]
        WGS: gl.constexpr = turn_bars.type.shape[0]
        Q_BUFS: gl.constexpr = q_smem.type.shape[0] // WGS
        i = 0  # tiles so far
        c = 0  # K/V blocks so far
        for u in range(gl.program_id(0), sched_n_work(n_units, Table, RAGGED, TAIL), gl.num_programs(0)):
            unit, first_r, last_r = sched_slot(u, Table, TAIL)
            b, h, k, blocks, seq_q, seq_kv, q_row0, kv_row, _ = sched_work(unit, seq, heads, seq_k, n_units, chunk, Cu, CuK,
                                                                       Table, CAUSAL, RAGGED, WGS)
            for r in range(first_r, sched_tile_end(last_r, k, blocks, CAUSAL, RAGGED, TAIL)):
                pid_m, lo, n_blocks = sched_tile(k, r, blocks, seq_q, seq_kv, win_left, CAUSAL, RAGGED, BLOCK_N, WGS)
                q_row = q_row0 + pid_m * WGS * ROWS
                first = lo - c  # block j of the rings is key block lo + j - c of the tile
                kv_col = (h // group) * HEAD_DIM
                if Q_BUFS == 2:
                    _load_q(q_desc, q_smem, q_ready, q_free, WGS, i, q_row, h * HEAD_DIM)
                for j in range(c, c + n_blocks):
                    ks = j % K_STAGES
                    mbarrier.wait(k_empty.index(ks), phase=((j // K_STAGES) & 1) ^ 1)
                    mbarrier.expect(k_ready.index(ks), k_desc.block_type.nbytes)
                    if RAGGED == 1:  # 3-D [B, Sk, H*D]: rows past this sequence's end come as zeros
                        tma_load(k_desc, [b, (first + j) * BLOCK_N, kv_col], k_ready.index(ks), k_ring.index(ks))
                    else:
                        tma_load(k_desc, [kv_row + (first + j) * BLOCK_N, kv_col], k_ready.index(ks), k_ring.index(ks))
                    if Q_BUFS == 1:  # one Q buffer: the tile's first K block loads while the last tile ends
                        if j == c:
                            _load_q(q_desc, q_smem, q_ready, q_free, WGS, i, q_row, h * HEAD_DIM)
                    vs = j % V_STAGES
                    mbarrier.wait(v_empty.index(vs), phase=((j // V_STAGES) & 1) ^ 1)
                    mbarrier.expect(v_ready.index(vs), v_desc.block_type.nbytes)
                    if V_T:  # (its own rows per (batch, head): no other sequence's keys, zeros past the end)
                        tma_load(v_desc, [(b * (heads // group) + h // group) * HEAD_DIM, (first + j) * BLOCK_N],
                                  v_ready.index(vs), v_ring.index(vs))
                    elif RAGGED == 1:
                        tma_load(v_desc, [b, (first + j) * BLOCK_N, kv_col], v_ready.index(vs), v_ring.index(vs))
                    else:
                        tma_load(v_desc, [kv_row + (first + j) * BLOCK_N, kv_col], v_ready.index(vs), v_ring.index(vs))
                c += n_blocks
                i += 1

    @gluon.jit
    def _stage(ring, i, RAGGED: gl.constexpr):
        """Stage ``i`` of a K/V ring as a ``[BLOCK_N, D]`` tile (``RAGGED == 1`` rings hold
        ``[1, BLOCK_N, D]`` boxes of 3-D descriptors)."""
        tile = ring.index(i)
        if RAGGED == 1:
            tile = tile.reshape([tile.type.shape[1], tile.type.shape[2]])
        return tile

    @gluon.jit
    def _v_operand(v_ring, i, RAGGED: gl.constexpr, V_T: gl.constexpr):
        """Stage ``i`` of the V ring as P V's ``[BLOCK_N, D]`` B operand: a K/V stage
        (:func:`_stage`), or with ``V_T`` (FP8, whose products take K-major operands only) a
        ``[D, BLOCK_N]`` V^T box read transposed."""
        if V_T:
            return v_ring.index(i).permute((1, 0))
        else:
            return _stage(v_ring, i, RAGGED)

    @gluon.jit
    def _pv_operand(acc, p, alpha, dtype: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
        """The accumulator rescaled by ``alpha`` and P as the register A operand of P V."""
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        return acc, gl.convert_layout(p.to(dtype), p_layout)

    @gluon.jit
    def _consumer(args, CAUSAL: gl.constexpr, RAGGED: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                  WG: gl.constexpr, SOFTCAP: gl.constexpr, TURNS: gl.constexpr, TAIL: gl.constexpr):
        """One warpgroup: query rows ``[WG * 64, WG * 64 + 64)`` of each tile's ``WGS * 64``, tile
        after tile (``args`` as :func:`_producer`'s)."""
        (q_desc, k_desc, v_desc, o_desc, Lse, qk_scale, seq, heads, _, seq_k, Out, stride_o, n_units, chunk, Cu,
         CuK, Table, q_smem, k_ring, v_ring, bars, o_smem, o_scale, win_left, softcap) = args
        WGS: gl.constexpr = bars[6].type.shape[0]
        i = 0  # tiles so far: Q buffer i % Q_BUFS
        c = 0  # K/V blocks so far: ring stages and phases run on across tiles
        turn = 0  # turns so far (n_blocks + 1 a tile)
        for u in range(gl.program_id(0), sched_n_work(n_units, Table, RAGGED, TAIL), gl.num_programs(0)):
            unit, first_r, last_r = sched_slot(u, Table, TAIL)
            _, h, k, blocks, seq_q, seq_kv, q_row0, _, lse0 = sched_work(unit, seq, heads, seq_k, n_units, chunk, Cu, CuK,
                                                                     Table, CAUSAL, RAGGED, WGS)
            for r in range(first_r, sched_tile_end(last_r, k, blocks, CAUSAL, RAGGED, TAIL)):
                pid_m, lo, n_blocks = sched_tile(k, r, blocks, seq_q, seq_kv, win_left, CAUSAL, RAGGED, BLOCK_N, WGS)
                _attend(q_desc, k_desc, v_desc, o_desc, Lse + lse0, qk_scale, seq_q, seq_kv, win_left, Out, stride_o,
                        q_smem, k_ring, v_ring, bars, o_smem, o_scale, pid_m, q_row0, h, lo, n_blocks, i, c, turn,
                        softcap, CAUSAL, RAGGED, BLOCK_N, HEAD_DIM, WG, SOFTCAP, TURNS)
                c += n_blocks
                turn += n_blocks + 1
                i += 1
        tma.store_wait(pendings=0)

    @gluon.jit
    def _attend(q_desc, k_desc, v_desc, o_desc, Lse, qk_scale, seq, seq_k, win_left, Out, stride_o, q_smem, k_ring,
                v_ring, bars, o_smem, o_scale, pid_m, q_row0, h, lo, n_blocks, i, c, turn, softcap,
                CAUSAL: gl.constexpr, RAGGED: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                WG: gl.constexpr, SOFTCAP: gl.constexpr, TURNS: gl.constexpr):
        """This warpgroup's 64 rows of tile ``i`` (query block ``pid_m`` of query head ``h`` of a
        sequence of ``seq`` queries from row ``q_row0`` of q's row view and ``seq_k`` keys, its lse
        from ``Lse``; key blocks ``c .. c + n_blocks`` of the rings, the tile's key blocks from ``lo``
        (``CAUSAL == 2``: a window of ``win_left``), turns from ``turn``): O stored by TMA without
        waiting; with two Q buffers the store of the tile before is waited for once this tile's first
        product is in, and its Q buffer freed; with one, this tile's store is waited for at its end.
        FP8 (e4m3 q/k and V^T): P enters P V as e4m3 scaled by 2^8 (:func:`softmax_block`'s
        ``P_SHIFT``), O is ``o_scale`` (V's descale) times the normalised sum, in ``o_desc``'s dtype,
        staged through this warpgroup's ``o_smem`` box (twice a Q box's bytes) instead of its Q box.
        ``SOFTCAP``: soft-capped scores (``softcap``, :func:`softmax_block`)."""
        q_ready, q_free, k_ready, k_empty, v_ready, v_empty, turn_bars = bars
        K_STAGES: gl.constexpr = k_ring.type.shape[0]
        V_STAGES: gl.constexpr = v_ring.type.shape[0]
        WGS: gl.constexpr = turn_bars.type.shape[0]
        Q_BUFS: gl.constexpr = q_smem.type.shape[0] // WGS
        dtype: gl.constexpr = q_desc.dtype
        FP8: gl.constexpr = dtype.is_fp8()
        P_SHIFT: gl.constexpr = 8.0 if FP8 else 0.0
        MMA_K: gl.constexpr = 256 // dtype.primitive_bitwidth  # the MMA instruction's reduction depth
        first_row = pid_m * WGS * ROWS + WG * ROWS
        if RAGGED:
            shift = seq_k - seq
        else:
            shift = 0

        s_layout: gl.constexpr = mma_layout(BLOCK_N, MMA_K)
        o_layout: gl.constexpr = mma_layout(HEAD_DIM, MMA_K)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                     k_width=32 // dtype.primitive_bitwidth)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
        qb = i % Q_BUFS
        q_tile = q_smem.index(WGS * qb + WG)
        rows = first_row + gl.arange(0, ROWS, layout=row_layout)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=row_layout)
        l_i = gl.zeros([ROWS], gl.float32, layout=row_layout)

        mbarrier.wait(q_ready.index(qb if Q_BUFS == 2 else WG), phase=(i // Q_BUFS) & 1)
        ks = c % K_STAGES
        mbarrier.wait(k_ready.index(ks), phase=(c // K_STAGES) & 1)
        turn_wait(turn_bars, WG, turn, TURNS)
        s = warpgroup_mma(q_tile, _stage(k_ring, ks, RAGGED).permute((1, 0)),
                          gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        turn_pass(turn_bars, WG, TURNS)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        mbarrier.arrive(k_empty.index(ks), count=1)
        if Q_BUFS == 2 and i > 0:  # the previous tile's O has left its Q buffer: the producer may refill it
            tma.store_wait(pendings=0)
            thread_barrier()
            mbarrier.arrive(q_free.index(1 - qb), count=1)
        p, alpha, m_i, l_i = softmax_block(s, m_i, l_i, qk_scale, rows, lo, first_row, shift, seq_k, win_left, CAUSAL,
                                           RAGGED, BLOCK_N, col_layout, P_SHIFT, softcap, SOFTCAP)
        acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)
        n_own = n_blocks
        if CAUSAL and BLOCK_N < WGS * ROWS:  # key blocks past this warpgroup's last row's keys: skipped
            n_own = gl.minimum((first_row + ROWS + shift + BLOCK_N - 1) // BLOCK_N - lo, n_blocks)
            if RAGGED == 3:  # rows that see no key (shift < 0) still take the first block, masked
                n_own = gl.maximum(n_own, 1)
        for j in range(n_own - 1):
            ks = (c + j + 1) % K_STAGES
            mbarrier.wait(k_ready.index(ks), phase=((c + j + 1) // K_STAGES) & 1)
            vs = (c + j) % V_STAGES
            mbarrier.wait(v_ready.index(vs), phase=((c + j) // V_STAGES) & 1)
            acc, p_op = _pv_operand(acc, p, alpha, dtype, o_layout, p_layout)
            turn_wait(turn_bars, WG, turn + j + 1, TURNS)
            s_next = warpgroup_mma(q_tile, _stage(k_ring, ks, RAGGED).permute((1, 0)),
                                   gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
            acc = warpgroup_mma(p_op, _v_operand(v_ring, vs, RAGGED, FP8), acc, is_async=True)
            turn_pass(turn_bars, WG, TURNS)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_next, ))
            mbarrier.arrive(k_empty.index(ks), count=1)
            p, alpha, m_i, l_i = softmax_block(s, m_i, l_i, qk_scale, rows, lo + j + 1, first_row, shift, seq_k,
                                               win_left, CAUSAL, RAGGED, BLOCK_N, col_layout, P_SHIFT, softcap,
                                               SOFTCAP)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(v_empty.index(vs), count=1)
        last = c + n_own - 1
        vs = last % V_STAGES
        mbarrier.wait(v_ready.index(vs), phase=(last // V_STAGES) & 1)
        acc, p_op = _pv_operand(acc, p, alpha, dtype, o_layout, p_layout)
        turn_wait(turn_bars, WG, turn + n_own, TURNS)
        acc = warpgroup_mma(p_op, _v_operand(v_ring, vs, RAGGED, FP8), acc, is_async=True)
        turn_pass(turn_bars, WG, TURNS)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(v_empty.index(vs), count=1)
        if RAGGED == 3 or CAUSAL == 2:  # rows that saw no key: O = 0, lse = -inf (l_i = 0, m_i = -inf; a window:
            # only rows past the sequence, never stored)
            l_i = gl.where(l_i == 0.0, 1.0, l_i)
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
        if FP8:
            out = (acc * (o_scale / l_o)[:, None]).to(o_desc.dtype)
            o_tile = o_smem.index(WG)
        else:
            out = (acc / l_o[:, None]).to(dtype)
            o_tile = q_tile
        # base 2 -> natural log (with P_SHIFT, m_i is P_SHIFT under the maximum and l_i 2^P_SHIFT times the sum)
        lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
        if RAGGED or WGS * ROWS % 128 != 0:  # the last tile may reach past Sq
            gl.store(Lse + rows, lse, mask=rows < seq)
            if first_row + ROWS > seq:  # rows past the sequence: a 2-D TMA store would write the next one's
                rows_o = first_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
                cols_o = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
                offsets = (q_row0 + rows_o)[:, None].to(gl.int64) * stride_o + h * HEAD_DIM + cols_o[None, :]
                gl.store(Out + offsets, out, mask=(rows_o < seq)[:, None])
            else:
                _store_tile(o_desc, out, o_tile, q_row0 + first_row, h * HEAD_DIM)
        else:
            _store_tile(o_desc, out, o_tile, q_row0 + first_row, h * HEAD_DIM)
            gl.store(Lse + rows, lse)
        # skipped blocks (causal, key blocks past this warpgroup's rows): free their stages and pass
        # the turns, after the O store is issued (it overlaps the other warpgroups' last products)
        for j in range(n_own, n_blocks):
            ks = (c + j) % K_STAGES
            mbarrier.wait(k_ready.index(ks), phase=((c + j) // K_STAGES) & 1)  # (loaded: its stage's last use is done)
            mbarrier.arrive(k_empty.index(ks), count=1)
            vs = (c + j) % V_STAGES
            mbarrier.wait(v_ready.index(vs), phase=((c + j) // V_STAGES) & 1)
            mbarrier.arrive(v_empty.index(vs), count=1)
            turn_wait(turn_bars, WG, turn + j + 1, TURNS)
            turn_pass(turn_bars, WG, TURNS)
        if Q_BUFS == 1:  # this warpgroup's Q box is free once this O has left it
            tma.store_wait(pendings=0)
            thread_barrier()
            mbarrier.arrive(q_free.index(WG), count=1)

    @gluon.jit
    def _store_tile(o_desc, out, tile, row, col):
        """Issue the TMA store of ``out`` through shared memory (``tile``, no longer read)."""
        tile.store(out)
        fence_async_shared()
        tma_store(o_desc, [row, col], tile)

    @direct_launch
    @gluon.jit
    def flash_attention_fwd_ws_kernel(q_desc, k_desc, v_desc, o_desc, Lse, qk_scale, seq, heads, group, seq_k, Out,
                                      stride_o, n_units, chunk, Cu, CuK, Table, o_scale, win_left, softcap,
                                      CAUSAL: gl.constexpr, RAGGED: gl.constexpr,
                                      BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                                      K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
                                      CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr, Q_BUFS: gl.constexpr = 2,
                                      SOFTCAP: gl.constexpr = 0, TURNS: gl.constexpr = True,
                                      TAIL: gl.constexpr = False):
        """q/o: ``[B * Sq, Hq * D]`` row views (TMA blocks of 64 rows), k/v: ``[B * Sk, Hkv * D]``
        (blocks of ``BLOCK_N`` rows); Lse ``[B, Hq, Sq]`` float32; ``seq`` is Sq. Without ``RAGGED``,
        Sq == Sk is a multiple of 128; with it, Sq <= Sk are any lengths and key blocks past Sk are
        masked (``RAGGED == 2`` / ``3``: packed sequences, :func:`sched_work`; with 3 any per-side lengths). Rows past Sq (``RAGGED``, or a 192-row tile past a multiple of 128) are stored
        through ``Out`` (row stride ``stride_o``) with a mask. ``CONSUMERS`` (2 or 3) warpgroups of
        64 query rows share a tile, taking turns to issue their products (``TURNS``; without, each
        issues as it is ready: :func:`ws_turns`). Persistent: a 1-D grid of
        at most one program per SM, program ``p`` taking units ``p, p + grid, ...`` of the
        ``n_units`` (``B * Hq`` heads times ``ws_common.sched_units``' per head, in chunks of ``chunk`` heads:
        ``ws_common.sched_unit``; ``TAIL``: the slots of the int32 table ``Table`` instead, whole units then
        the last waves' single tiles, :mod:`fwd_tail`); ``num_warps`` 4: the default partition is
        consumer 0, the other consumers and the producer are workers. ``SOFTCAP``: scores soft-capped (``qk_scale`` and ``softcap``
        from :func:`softcap_args`)."""
        dtype: gl.constexpr = q_desc.dtype
        # Q buffers [tile buffer * CONSUMERS + warpgroup]
        q_smem = gl.allocate_shared_memory(dtype, [Q_BUFS * CONSUMERS, ROWS, HEAD_DIM], q_desc.layout)
        k_ring = gl.allocate_shared_memory(dtype, [K_STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_ring = gl.allocate_shared_memory(dtype, [V_STAGES] + v_desc.block_type.shape, v_desc.layout)
        # Q barriers: a pair per buffer (two buffers) or per consumer (one buffer: :func:`_load_q`)
        Q_BARS: gl.constexpr = 2 if Q_BUFS == 2 else CONSUMERS
        q_ready = gl.allocate_shared_memory(gl.int64, [Q_BARS, 1], mbarrier.MBarrierLayout())
        q_free = gl.allocate_shared_memory(gl.int64, [Q_BARS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
        turn_bars = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(Q_BARS):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_free.index(i), count=CONSUMERS if Q_BUFS == 2 else 1)  # its consumers stored their O
        for i in gl.static_range(CONSUMERS):
            mbarrier.init(turn_bars.index(i), count=1)
        for i in gl.static_range(K_STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=CONSUMERS)  # every consumer releases a stage
        for i in gl.static_range(V_STAGES):
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=CONSUMERS)
        bars = (q_ready, q_free, k_ready, k_empty, v_ready, v_empty, turn_bars)
        if dtype.is_fp8():  # O (16 or 32 bits an element) is staged apart from the e4m3 Q boxes
            o_smem = gl.allocate_shared_memory(o_desc.dtype, [CONSUMERS, ROWS, HEAD_DIM], o_desc.layout)
        else:
            o_smem = q_smem  # (unread: O is staged in the tile's Q boxes)
        args = (q_desc, k_desc, v_desc, o_desc, Lse, qk_scale, seq, heads, group, seq_k, Out, stride_o, n_units, chunk,
                Cu, CuK, Table, q_smem, k_ring, v_ring, bars, o_smem, o_scale, win_left, softcap)
        # (constexprs written out in each tuple: one in a concatenated tuple reaches the partition as a tensor)
        if CONSUMERS == 3:
            gl.warp_specialize([(_consumer, (args, CAUSAL, RAGGED, BLOCK_N, HEAD_DIM, 0, SOFTCAP, TURNS, TAIL)),
                                (_consumer, (args, CAUSAL, RAGGED, BLOCK_N, HEAD_DIM, 1, SOFTCAP, TURNS, TAIL)),
                                (_consumer, (args, CAUSAL, RAGGED, BLOCK_N, HEAD_DIM, 2, SOFTCAP, TURNS, TAIL)),
                                (_producer, (args, CAUSAL, RAGGED, BLOCK_N, HEAD_DIM, TAIL))],
                               [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
        else:
            gl.warp_specialize([(_consumer, (args, CAUSAL, RAGGED, BLOCK_N, HEAD_DIM, 0, SOFTCAP, TURNS, TAIL)),
                                (_consumer, (args, CAUSAL, RAGGED, BLOCK_N, HEAD_DIM, 1, SOFTCAP, TURNS, TAIL)),
                                (_producer, (args, CAUSAL, RAGGED, BLOCK_N, HEAD_DIM, TAIL))],
                               [4, 1], [CONSUMER_REGS, 24])


@on_input_device
def flash_attention_fwd_ws(q, k, v, *, softmax_scale: float, causal: bool, kv_blocksize: int | None = None,
                           num_stages: int | None = None, q_buffers: int | None = None,
                           out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                           ragged: bool = False, chunk: int | None = None, programs: int | None = None,
                           consumers: int | None = None, window: int | None = None,
                           softcap: float | None = None, checked: bool = False, warmup_only: bool = False):
    """Launch the warp-specialised forward; returns ``(out [B, Sq, Hq, D], lse [B, Hq, Sq] float32)``.

    ``kv_blocksize`` (64 or 128) is the key block, ``num_stages`` the depth of the K and V rings,
    ``q_buffers`` (1 or 2) the tiles' Q buffers (None each: :func:`ws_tiles`). ``out`` may be
    given preallocated (a row view like q). ``ragged`` admits any ``0 < Sq <= Sk`` (bottom-right
    causal). ``chunk`` and ``programs``: the persistent grid's order and size
    (:func:`fwd_order`; None: its rule, one program per SM). ``consumers``: warpgroups of 64 query
    rows per tile (:func:`ws_consumers`; None: its rule). ``window`` (with ``causal``): a sliding
    window, query ``i`` sees keys ``i + Sk - Sq - window .. i + Sk - Sq``. ``softcap``: logits
    ``softcap * tanh(softmax_scale * q.k / softcap)``. ``checked``: the caller has run
    :func:`ws_supported` on q/k/v and on ``out`` (the dense dispatcher), so the launch does not
    repeat it. ``warmup_only`` compiles without launching and returns the compiled kernel
    (offline compiles)."""
    from kernelops.kernels.flash_attention.fwd import check_buffer

    if not (warmup_only or checked) and not ws_supported(q, k, v, ragged):
        raise ValueError(f"the warp-specialised forward needs an sm_90 GPU, Gluon, float16/bfloat16 BSHD row views, "
                         f"D in {WS_HEAD_DIMS} and Sq == Sk a multiple of {WS_BLOCK_M}; got q {tuple(q.shape)} "
                         f"{q.stride()}, k {tuple(k.shape)} {k.stride()}, {q.dtype} on {q.device}")
    B, S, Hq, D = q.shape
    out = torch.empty((B, S, Hq, D), dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty((B, Hq, S), dtype=torch.float32, device=q.device) if lse is None else lse
    check_buffer("out", out, (B, S, Hq, D), q.dtype)
    check_buffer("lse", lse, (B, Hq, S), torch.float32, contiguous=True)
    if not (warmup_only or checked) and not tma_rows_view(out):
        raise ValueError(f"out must be a 16-byte aligned [B*S, H*D] row view, got strides {out.stride()}")
    kernel, grid, args, meta = fwd_ws_launch(q, k, v, out, lse, softmax_scale, causal, kv_blocksize, num_stages,
                                             chunk, programs, consumers, q_buffers, window=window, softcap=softcap)
    if warmup_only:
        return kernel.warmup(*args, **meta, grid=grid)
    kernel[grid](*args, **meta)
    return out, lse


@on_input_device
def flash_attention_fwd_ws_packed(q, k, v, cum_seqlens, *, softmax_scale: float, causal: bool,
                                  out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                                  programs: int | None = None, cum_seqlens_k: torch.Tensor | None = None,
                                  window: int | None = None, softcap: float | None = None, checked: bool = False,
                                  warmup_only: bool = False):
    """The warp-specialised forward over packed sequences: ``q [total, Hq, D]``, ``k/v [total, Hkv, D]``
    (``[total_k, Hkv, D]`` with ``cum_seqlens_k``),
    ``cum_seqlens [n + 1]`` int32 (sequence ``s`` is tokens ``cum_seqlens[s] .. cum_seqlens[s + 1]``
    of q and of k/v alike; causal: query ``i`` of a sequence sees its keys ``0 .. i``); returns
    ``(out [total, Hq, D], lse [Hq, total] float32)`` as fwd.py's packed forward. A schedule launch
    (:func:`varlen.ws_packed_schedule`) orders the (sequence, head, query-tile pair) units longest
    sequence first; the persistent grid (``programs``, None: one per SM) takes them in turn, 128
    query rows a tile, K/V read in 2-D row blocks masked past each sequence's end, rows past it
    stored with a mask. No host sync. ``checked``: the caller ran :func:`ws_packed_supported`.
    ``cum_seqlens_k``: the keys' own offsets (``k/v [total_k, Hkv, D]``, as many sequences; None
    or the same tensor: ``cum_seqlens``): causal is then bottom-right aligned per sequence (query
    ``i`` of ``n`` sees keys up to ``i + m - n`` of ``m``), and a query that sees no key gets
    output 0 and lse ``-inf``, as in fwd.py. ``window`` (with ``causal``): a sliding window per
    sequence, query ``i`` of ``n`` sees keys ``i + m - n - window .. i + m - n`` of ``m``. ``softcap``:
    logits ``softcap * tanh(softmax_scale * q.k / softcap)``."""
    from kernelops.kernels.flash_attention.fwd import check_buffer
    from kernelops.kernels.flash_attention.varlen import ws_packed_table

    cu_k = cum_seqlens if cum_seqlens_k is None else cum_seqlens_k
    if not (warmup_only or checked) and not (ws_packed_supported(q, k, v, cum_seqlens, cu_k, two_offsets=True)
                                             and (out is None or tma_rows_view(out[None]))):
        raise ValueError(f"the warp-specialised packed forward needs an sm_90 GPU, Gluon, float16/bfloat16 "
                         f"[total, H, D] row views (out too; one token count for one offsets tensor), D in "
                         f"{WS_HEAD_DIMS} and contiguous int32 offsets of at most 4096 sequences on q's device; "
                         f"got q {tuple(q.shape)} {q.stride()}, k {tuple(k.shape)} {k.stride()}, {q.dtype} on "
                         f"{q.device}")
    T, Hq, D = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
    lse = torch.empty((Hq, T), dtype=torch.float32, device=q.device) if lse is None else lse
    check_buffer("out", out, (T, Hq, D), q.dtype)
    check_buffer("lse", lse, (Hq, T), torch.float32, contiguous=True)
    table = ws_packed_table(cum_seqlens, T, Hq)
    (schedule, s_grid, s_args, s_meta), (kernel, grid, args, meta) = packed_launches(
        q[None], k[None], v[None], out[None], lse[None], cum_seqlens, table, softmax_scale, causal, programs, cu_k,
        window, softcap)
    schedule[s_grid](*s_args, **s_meta)  # (also with warmup_only: the offline driver compiles it, no GPU)
    if warmup_only:
        return kernel.warmup(*args, **meta, grid=grid)
    kernel[grid](*args, **meta)
    return out, lse


def packed_launches(q4, k4, v4, out4, lse4, cum_seqlens, table, softmax_scale: float, causal: bool,
                    programs: int | None = None, cum_seqlens_k: torch.Tensor | None = None,
                    window: int | None = None, softcap: float | None = None) -> list:
    """The packed forward's two launches as ``[(kernel, grid, args, meta)]``: the schedule filling
    ``table`` (an unfilled ``varlen.ws_packed_table`` over q's heads), then the forward over the
    batch-of-one views (``q4/out4 [1, total, Hq, D]``, ``k4/v4 [1, total, Hkv, D]``, ``lse4
    [1, Hq, total]``): what :func:`flash_attention_fwd_ws_packed` runs and a per-signature plan binds.
    ``cum_seqlens_k``: the keys' own offsets (another tensor: the kernel's ``RAGGED == 3``), or None
    (``cum_seqlens`` delimits both sides); ``window`` and ``softcap`` as :func:`fwd_ws_launch`'s."""
    from kernelops.kernels.flash_attention.varlen import ws_schedule_launch

    cu_k = cum_seqlens if cum_seqlens_k is None else cum_seqlens_k
    schedule = (cum_seqlens, table, cu_k)
    return [ws_schedule_launch(cum_seqlens, table, q4.shape[2], causal, weights=cu_k),
            fwd_ws_launch(q4, k4, v4, out4, lse4, softmax_scale, causal, programs=programs, schedule=schedule,
                          window=window, softcap=softcap)]


def fwd_order(heads: int, seq: int, causal: bool, programs: int, chunk: int | None = None, block_m: int = WS_BLOCK_M,
              window: bool = False):
    """``(n_units, chunk, grid)`` of the persistent forward over ``heads`` (B * Hq) of ``seq``
    query rows in ``block_m``-row tiles with at most ``programs`` programs (one per SM): units as
    ``ws_common.sched_units`` makes them, in chunks of ``chunk`` heads (None: causal, about half a wave of
    tiles, ``programs // (2 * blocks)`` heads; full, 1: a sweep on the H200; a causal
    ``window``, 2: one tile a unit, each head's from its last, so the short tiles (a sequence's
    first keys) end each head's run; in a sweep on the H200 chunks of 1-16 heads and the
    causal pairs were within 5% of each other at D=128, chunks of 2 1.07-1.16x the pairs at D=64
    and D=256 over 16k keys)."""
    blocks = (seq + block_m - 1) // block_m
    per_head = (blocks + 1) // 2 if causal and not window else blocks
    if chunk is None:
        chunk = 2 if window else max(1, programs // (2 * blocks)) if causal else 1
    check_positive("chunk", chunk)
    check_positive("programs", programs)
    n_units = heads * per_head
    return n_units, min(chunk, heads), (min(n_units, programs),)


def ws_consumers(head_dim: int, causal: bool, seq: int) -> int:
    """Consumer warpgroups per tile for ``seq`` query rows: 3 (192-row tiles, FA3's D=64 shape)
    at D=64 from 1536 rows (causal: 3072) when the 192-row tiles pad the rows by at most 5% more
    than 128-row ones, else 2 (128-row tiles). Three fit only D=64's registers (160 a thread). On
    the H200 (kernel time, same process) three ran at 1.04-1.14x two's speed at D=64 full from 1536
    to 16k keys, 0.95x at 512 and 0.93-1.00x at 1k (tiles padding 12.5% of the rows);
    causal, once a warpgroup skips the key blocks past its rows (before, a 192-row
    tile's diagonal ran whole 128-key blocks its first warpgroups see nothing of, 0.62-0.98x),
    1.00-1.07x from 3k keys and 0.82-0.95x at 1-2k."""
    if head_dim != 64 or seq < (3072 if causal else 1536):
        return 2
    return 3 if -(-seq // 192) * 192 <= 1.05 * (-(-seq // 128) * 128) else 2


def ws_turns(head_dim: int, consumers: int, fp8: bool = False) -> bool:
    """Whether the forward's consumer warpgroups take turns to issue their products (one
    warpgroup's softmax then overlaps another's products): not for 16-bit calls (dense or packed)
    with D in :data:`NO_TURN_HEAD_DIMS` and two consumers. There a block's products are short
    against its softmax, and a warpgroup waiting for its turn idles the tensor pipe more than the
    turns keep it fed. Measured (H200, against turns): D=64 with two consumers +1.3-2.7%
    (causal 512-2k, full 512-1k), packed +2.1-3.3%; with three, full 4k-16k -28% (ptxas spills 536
    bytes without the turns' ordering), causal -1.2 to +1.8%, a window -1.4%; D=128 causal 512
    -2.6%. FP8 calls were not measured without them."""
    return fp8 or consumers != 2 or head_dim not in NO_TURN_HEAD_DIMS


def ws_tiles(head_dim: int) -> tuple[int, int, int]:
    """``(kv_blocksize, num_stages, q_buffers)`` the launch takes unless told: at D=64/128, 128-key
    blocks in two-stage K and V rings and two Q buffers (the next tile's Q loads while one runs);
    at D=256, 64-key blocks, two stages and one Q buffer (192 KB of shared memory; with two Q buffers
    only one K/V stage fits, which ran at 0.63-0.73x this on the H200)."""
    return (64, 2, 1) if head_dim == 256 else (128, 2, 2)


def ws_smem_bytes(head_dim: int, consumers: int, kv_blocksize: int, num_stages: int, q_buffers: int,
                  elem: int = 2, out_elem: int = 0) -> int:
    """Shared memory of the kernel's tiles: ``q_buffers`` Q tiles of ``64 * consumers`` rows
    and ``num_stages`` K and V blocks of ``kv_blocksize`` rows, all ``head_dim`` wide, ``elem``
    bytes an element (2; FP8 1), and with ``out_elem`` (FP8: O's element size) an O staging box of
    64 rows per consumer."""
    return head_dim * (elem * (q_buffers * consumers * 64 + 2 * num_stages * kv_blocksize)
                       + out_elem * consumers * 64)


def fwd_ws_launch(q, k, v, out, lse, softmax_scale: float, causal: bool, kv_blocksize: int | None = None,
                  num_stages: int | None = None, chunk: int | None = None, programs: int | None = None,
                  consumers: int | None = None, q_buffers: int | None = None, schedule=None,
                  v_t: torch.Tensor | None = None, o_scale: float = 1.0, window: int | None = None,
                  softcap: float | None = None):
    """``(kernel, grid, args, meta)`` of the warp-specialised forward over checked tensors (q/out
    ``[B, Sq, Hq, D]``, k/v ``[B, Sk, Hkv, D]`` row views, lse ``[B, Hq, Sq]`` float32): the launch
    :func:`flash_attention_fwd_ws` makes, and that a per-signature plan binds once. Tiles
    (``kv_blocksize``, ``num_stages``, ``q_buffers``; None each: :func:`ws_tiles`) must fit
    :data:`WS_SMEM_BYTES`. ``chunk`` and
    ``programs`` (None: one per SM) as in :func:`fwd_order`; ``consumers`` (None:
    :func:`ws_consumers`) 2, or 3 at D=64. ``softmax_scale`` must pass
    :func:`ws_scale_ok` (the kernel takes each row's maximum before scaling); the dispatchers send
    other scales to the other kernels. ``schedule``: packed sequences (:func:`packed_launches`),
    ``(cum_seqlens, table, cum_seqlens_k)`` (the same offsets tensor twice when it delimits both
    sides) with q/out ``[1, total, Hq, D]``, k/v ``[1, total, Hkv, D]`` and lse
    ``[1, Hq, total]``: the units are the table's (:func:`varlen.ws_schedule_launch`); or
    ``(cum_seqlens_q, table, cum_seqlens_k)``, keys delimited apart (``RAGGED == 3``: k/v
    ``[1, total_k, Hkv, D]``, the table over the queries). FP8 (e4m3
    q/k, :mod:`fwd_ws_fp8`): ``v_t [B, Hkv, D, Sk_pad]`` is V transposed (zeros past Sk; ``v`` is
    unread), ``o_scale`` multiplies O (V's descale), and ``out`` may be any 16/32-bit float.
    ``window`` (with ``causal``; an int ``0 <= window < 2**30``): a sliding window, query ``i`` sees
    keys ``i + Sk - Sq - window .. i + Sk - Sq`` (per sequence when packed): the kernel's
    ``CAUSAL == 2``, whose tiles start at their first row's first key block. ``softcap`` (a positive
    float, or None): logits ``cap * tanh(softmax_scale * q.k / cap)`` (the kernel's ``SOFTCAP``; not
    with FP8)."""
    if window is not None and (not causal or type(window) is not int or not 0 <= window < 2 ** 30):
        raise ValueError(f"window needs causal=True and an int 0 <= window < 2**30, got {window!r} (causal={causal})")
    if not ws_scale_ok(softmax_scale):
        raise ValueError(f"the warp-specialised forward needs softmax_scale > 0 (a normal float32 once "
                         f"times log2(e)), got {softmax_scale}")
    B, S, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    if consumers is None:  # (packed sequences: the schedule's 128-row tiles)
        consumers = 2 if schedule is not None else ws_consumers(D, bool(causal), S)
    if type(consumers) is not int or consumers not in (2, 3) or (consumers == 3 and D != 64):
        raise ValueError(f"consumers must be 2, or 3 at D=64 (registers), got {consumers!r} at D={D}")
    kv_blocksize, num_stages, q_buffers = (default if x is None else x
                                           for x, default in zip((kv_blocksize, num_stages, q_buffers), ws_tiles(D)))
    if (any(type(x) is not int for x in (kv_blocksize, num_stages, q_buffers)) or kv_blocksize not in (64, 128)
            or num_stages not in (1, 2, 3, 4) or q_buffers not in (1, 2)):
        raise ValueError(f"kv_blocksize must be 64 or 128, num_stages 1..4 and q_buffers 1 or 2, got "
                         f"{kv_blocksize}, {num_stages}, {q_buffers}")
    fp8 = v_t is not None
    if fp8 and softcap:
        raise ValueError("the FP8 forward takes no softcap")
    qk_scale, cap, softcap_mode = softcap_args(softmax_scale, softcap)
    if fp8 != (q.dtype == torch.float8_e4m3fn):  # the kernel reads V as V^T boxes exactly when q is e4m3
        raise ValueError(f"v_t (V^T) goes with e4m3 inputs and only with them; got {q.dtype} with "
                         f"v_t={'given' if fp8 else None}")
    smem = ws_smem_bytes(D, consumers, kv_blocksize, num_stages, q_buffers, q.element_size(),
                         out.element_size() if fp8 else 0)
    if smem > WS_SMEM_BYTES:
        raise ValueError(f"tiles kv_blocksize={kv_blocksize}, num_stages={num_stages}, q_buffers={q_buffers} at "
                         f"D={D} with {consumers} consumers need {smem} bytes of shared memory, over {WS_SMEM_BYTES}")
    use_tail = False  # the slot table of :mod:`fwd_tail` in Table
    every = programs or num_sms(q.device, 1)  # programs the launch may take
    if schedule is None:
        n_units, chunk, grid = fwd_order(B * Hq, S, bool(causal), every, chunk, 64 * consumers, window is not None)
        # the verified path (Sq == Sk, multiples of 128) compiles without the RAGGED code
        ragged = int(bool(S != Sk or S % WS_BLOCK_M or Sk % kv_blocksize))
        cu, cu_k, table = lse, lse, lse  # (unread)
        if causal and window is None and not ragged and not fp8 and fwd_tail.applies(D, S):
            # the last waves tile by tile (16-bit inputs: FP8 launches were not measured with a plan);
            # fewer units than programs spread their tiles over all of them
            tail = fwd_tail.tail_table(B * Hq, S, 64 * consumers, every, chunk, kv_blocksize, q.device)
            if tail is not None:
                table, use_tail, grid = tail, True, (every,)
    else:  # packed: 2-D K/V views (masked past each sequence), units from the table
        if consumers != 2:
            raise ValueError(f"packed sequences run two consumer warpgroups (the schedule's 128-row tiles), "
                             f"got {consumers}")
        from kernelops.kernels.flash_attention.varlen import table_capacity

        cu, table, cu_k = schedule
        n_units, ragged, chunk = 0, 2 if same_offsets(cu, cu_k) else 3, table_capacity(table)
        grid = (every,)
    if fp8:  # [D, BLOCK_N] boxes of the [B * Hkv * D, Sk_pad] rows
        v_desc = descriptor(v_t, [B * Hkv * D, v_t.shape[-1]], [v_t.shape[-1], 1], (D, kv_blocksize))
    else:
        v_desc = row_descriptor(v, kv_blocksize, ragged == 1)
    args = (row_descriptor(q, 64), row_descriptor(k, kv_blocksize, ragged == 1), v_desc, row_descriptor(out, 64),
            lse, qk_scale, S, Hq, Hq // Hkv, Sk, out, out.stride(1), n_units, chunk, cu, cu_k, table,
            float(o_scale), 0 if window is None else window, cap)
    # 12 warps (4 + 4 + the producer's, rounded to a warpgroup) share 64K registers: 168 each on
    # launch, then 240 for each consumer and 24 for the producer; with 3 consumers, 16 warps: 128
    # on launch, then 160 for each consumer (Triton 3.6's setmaxnreg values) and 24 for the producer
    regs, launch_regs = (240, 168) if consumers == 2 else (160, 128)
    meta = dict(CAUSAL=2 if window is not None else int(bool(causal)), RAGGED=ragged, BLOCK_N=kv_blocksize, HEAD_DIM=D, K_STAGES=num_stages,
                V_STAGES=num_stages, CONSUMERS=consumers, CONSUMER_REGS=regs, num_warps=4, maxnreg=launch_regs,
                Q_BUFS=q_buffers, SOFTCAP=softcap_mode, TURNS=ws_turns(D, consumers, fp8),
                TAIL=use_tail, **LAUNCH_OPTIONS)
    return flash_attention_fwd_ws_kernel, grid, args, meta
