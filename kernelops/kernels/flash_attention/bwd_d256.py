"""Flash attention backward at D=256 for Hopper in Gluon: dK, dV and dQ from one warp-specialised kernel.

At D=256 a warpgroup cannot hold dK and dV of 64 keys over all 256 columns (two 64x256 float32
tiles, 256 registers a thread), so the two consumer warpgroups of a program split the head dim
instead of the keys (FlashAttention-3's layout for its largest head dim): a program owns 64 keys
of one (batch, KV head), and warpgroup ``w`` accumulates columns ``[128 w, 128 w + 128)`` of their
dK and dV. A one-warp producer loads K and V once and streams 64-query blocks of Q and dO (with
their lse and delta) into a two-stage ring; every tile is kept as two ``[rows, 128]`` column halves.

Per query block, warpgroup ``w`` computes the scores of its 32 queries against the 64 keys over the
whole head dim (``S^T = K Q^T`` and ``dP^T = V dO^T``, ``[64 keys, 32 queries]``, two MMAs each over
the column halves), forms ``P^T`` and ``dS^T = P^T (dP^T - delta)`` and stores them as the column
half ``w`` of two shared ``[64 keys, 64 queries]`` tiles. Once both halves are in (an mbarrier both
warpgroups arrive on), it issues ``dV[:, w] += P^T dO[:, w]``, ``dK[:, w] += dS^T Q[:, w]`` and
``dQ[:, w] = dS K[:, w]`` (A of the last one is dS^T transposed from shared memory). When both
warpgroups are done with the block (a second mbarrier), the stage's bytes are free: warpgroup 0
stages its float32 ``[64, 128]`` dQ tile in the Q stage, warpgroup 1 in the dO stage, each adds it
into a zeroed float32 ``[B, S, Hq, 256]`` buffer with one TMA reduce-add and then frees the stage.
That keeps shared memory at 209 KB (K and V 64 KB, the ring 128 KB, P^T and dS^T 16 KB).

With GQA a program walks its KV head's query heads one after another, or (``SPLIT``,
:func:`d256_split`: causal or windowed calls with groups of 4 or more from 4k keys, causal groups
of 8 or more at any length, full calls and causal groups of 2-3 from 8k) the grid runs over query
heads, one head a program, and each program adds its float32 partial dK and dV into a zeroed
workspace with TMA reduce-adds (staged in its ring once the last dQ add has left it): the programs
running at once then stream one or two query heads, which stay in L2, where walking the group
spreads them over the group's heads, and causal programs are a group's times shorter.

dQ (and with ``SPLIT`` dK and dV) lands in any order: not bit-reproducible run to run
(``deterministic=True`` runs the Triton kernels). Scope (:func:`d256_supported`): an sm_90 GPU, Gluon, float16 / bfloat16 BSHD row views
(q/dout ``[B, S, Hq, 256]``, k/v/dk/dv ``[B, S, Hkv, 256]``), ``S`` a multiple of 64, GQA; full
attention, causal, or causal with a left window; no other score terms or dropout.
"""

from __future__ import annotations

import torch

from kernelops.kernels.common.gluon import GLUON
from kernelops.kernels.common.host import LAUNCH_OPTIONS
from kernelops.kernels.common.launch import direct_launch
from kernelops.kernels.common.tma import row_descriptor, vector_descriptor
from kernelops.kernels.flash_attention.bwd_fused import launch_with_dq, schedule_prologue, splits_heads
from kernelops.kernels.flash_attention.bwd_ws import dkdv_ws_supported
from kernelops.kernels.flash_attention.ws_common import LOG2E, softcap_args, ws_shape_supported

#: the head dim this kernel takes, and the rows of its key and query blocks
D256 = 256
BLOCK = 64
#: when a GQA call's programs take one query head each (:func:`d256_split`): causal calls (with or
#: without a window) from this many keys with a group of 4 or more, or without a window with a group
#: of 8 or more at any length; full attention and causal groups of 2-3 without a window from
#: :data:`SPLIT_MIN_KEYS`
SPLIT_MIN_KEYS_CAUSAL = 4096
SPLIT_MIN_KEYS = 8192

if GLUON:
    from kernelops.kernels.common.gluon import (
        as_float32, fence_async_shared, gl, gluon, mbarrier, mma_layout, thread_barrier, tma, tma_load,
        tma_reduce_add, tma_store, warpgroup_mma, warpgroup_mma_wait)
    from kernelops.kernels.flash_attention.bwd_fused import store_rows
    from kernelops.kernels.flash_attention.bwd_ws import packed_program, probs_t, program_heads
    from kernelops.kernels.flash_attention.ws_common import sched_unit

    KEYS = gl.constexpr(BLOCK)  # keys per program
    QROWS = gl.constexpr(BLOCK)  # queries per streamed block (32 per warpgroup)
    HALF = gl.constexpr(D256 // 2)  # columns per warpgroup
    LOG2E_C = gl.constexpr(LOG2E)

    @gluon.jit
    def _blocks(seq, win_left, chunk, CAUSAL: gl.constexpr):
        """``(pid_n, bh, first query block, end query block)`` of this program (64 keys of head ``bh``);
        ``CAUSAL`` 0 full, 1 causal, 2 causal with a left window, as :func:`bwd_ws.key_blocks` with
        64-key programs (units of one key block in chunks of ``chunk`` heads)."""
        bh, pid_n = sched_unit(gl.program_id(0), gl.num_programs(0), seq // KEYS, chunk)
        if CAUSAL:
            j0 = pid_n * KEYS // QROWS
        else:
            j0 = pid_n * 0
        if CAUSAL == 2:
            j_end = gl.minimum(seq // QROWS, (pid_n * KEYS + KEYS - 1 + win_left) // QROWS + 1)
        else:
            j_end = seq // QROWS
        return pid_n, bh, j0, j_end

    @gluon.jit
    def _program(seq, heads, group, win_left, chunk, packed, CAUSAL: gl.constexpr, SPLIT: gl.constexpr,
                 PACKED: gl.constexpr):
        """``(pid_n, hk, h0, n_heads, j0, j_end, row0, stat0, length, shift, krow0, q_min)`` of this program, as
        :func:`bwd_ws.dkdv_program` with 64-key programs: :func:`_blocks` and :func:`bwd_ws.program_heads`, or
        with ``PACKED`` the schedule's entry (``varlen.ws_packed_schedule`` over KV heads in 64-key
        units; query block ``j`` holds the sequence's queries ``j * 64 - shift ..``)."""
        if PACKED:
            return packed_program(packed, chunk, group, win_left, KEYS, QROWS, CAUSAL, PACKED == 2)
        else:
            pid_n, bh, j0, j_end = _blocks(seq, win_left, chunk, CAUSAL)
            b, hk, h0, n_heads = program_heads(bh, heads, group, SPLIT)
            return pid_n, hk, h0, n_heads, j0, j_end, b * seq, b * heads * seq, seq, 0, b * seq, 0

    @gluon.jit
    def _producer(args, CAUSAL: gl.constexpr, SPLIT: gl.constexpr, PACKED: gl.constexpr):
        """One warp: K and V (two column halves each) once, then per query block its Q and dO halves,
        lse and delta into ring stage ``it % 2`` once both warpgroups have freed it."""
        (q_desc, k_desc, v_desc, do_desc, _, _, _, Lse, Delta, _, _, seq, heads, group, win_left, chunk, k_smem, v_smem,
         q_ring, do_ring, _, _, stat_rings, bars, packed, _) = args
        kv_bar, ready, free, _, _, _ = bars
        pid_n, hk, h0, n_heads, j0, j_end, row0, stat0, _, shift, krow0, _ = _program(
            seq, heads, group, win_left, chunk, (packed[0], packed[1], packed[6]), CAUSAL, SPLIT, PACKED)
        mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
        for c in gl.static_range(2):  # (packed: rows past the sequence are the next one's, masked; past the end, zeros)
            tma_load(k_desc, [krow0 + pid_n * KEYS, hk * 2 * HALF + c * HALF], kv_bar, k_smem.index(c))
            tma_load(v_desc, [krow0 + pid_n * KEYS, hk * 2 * HALF + c * HALF], kv_bar, v_smem.index(c))
        it = 0
        for g in range(n_heads):
            h = h0 + g
            for j in range(j0, j_end):
                s = it % 2
                mbarrier.wait(free.index(s), phase=((it // 2) & 1) ^ 1)
                mbarrier.expect(ready.index(s), 2 * q_desc.block_type.nbytes + 2 * do_desc.block_type.nbytes
                                + Lse.block_type.nbytes + Delta.block_type.nbytes)
                row = row0 + j * QROWS - shift
                for c in gl.static_range(2):
                    tma_load(q_desc, [row, h * 2 * HALF + c * HALF], ready.index(s), q_ring.index(2 * s + c))
                    tma_load(do_desc, [row, h * 2 * HALF + c * HALF], ready.index(s), do_ring.index(2 * s + c))
                stat_row = stat0 + h * seq + j * QROWS
                tma_load(Lse, [stat_row], ready.index(s), stat_rings[0].index(s))
                tma_load(Delta, [stat_row], ready.index(s), stat_rings[1].index(s))
                it += 1

    @gluon.jit
    def _scores_t(a_smem, ring, s, zeros, WG: gl.constexpr):
        """``A B^T`` over both column halves for this warpgroup's 32 queries of the block: ``[64, 32]``
        (A: K or V halves ``[64 keys, 128]``, B: stage ``s``'s Q or dO halves ``[64 queries, 128]``), issued."""
        acc = warpgroup_mma(a_smem.index(0), ring.index(2 * s).slice(WG * 32, 32, dim=0).permute((1, 0)), zeros,
                            use_acc=False, is_async=True)
        return warpgroup_mma(a_smem.index(1), ring.index(2 * s + 1).slice(WG * 32, 32, dim=0).permute((1, 0)), acc,
                             is_async=True)

    @gluon.jit
    def _share(half, value, bar, it):
        """Store this warpgroup's half of a shared ``[64 keys, 64 queries]`` tile and wait until the
        other warpgroup has stored its half (``bar``: an mbarrier both arrive on once a block)."""
        half.store(value)
        fence_async_shared()  # the generic-proxy stores before the MMAs read them
        thread_barrier()  # every thread of this warpgroup has stored before one thread arrives
        mbarrier.arrive(bar, count=1)
        mbarrier.wait(bar, phase=it & 1)

    @gluon.jit
    def _consumer(args, CAUSAL: gl.constexpr, SPLIT: gl.constexpr, PACKED: gl.constexpr, WG: gl.constexpr,
                  SOFTCAP: gl.constexpr):
        """Columns ``[WG * 128, WG * 128 + 128)`` of dK, dV (the program's 64 keys) and dQ (each query
        block's 64 queries), and the scores of queries ``[WG * 32, WG * 32 + 32)`` of each block.
        ``PACKED``: keys and queries outside the program's sequence are masked (their dQ adds into
        the neighbours' rows add zeros), and a key block that runs past the sequence stores its dK
        and dV rows through pointers with a mask. ``SOFTCAP`` (a flag): soft-capped scores as in
        ``bwd_ws.dv_and_ds``."""
        (q_desc, _, _, _, dk_desc, dv_desc, dq_desc, _, _, qk_scale, sm_scale, seq, heads, group, win_left, chunk,
         k_smem, v_smem, q_ring, do_ring, pt_smem, ds_smem, stat_rings, bars, packed, softcap) = args
        kv_bar, ready, free, p_ready, ds_ready, done = bars
        dtype: gl.constexpr = q_desc.dtype
        pid_n, hk, h0, n_heads, j0, j_end, row0, _, length, shift, krow0, q_min = _program(
            seq, heads, group, win_left, chunk, (packed[0], packed[1], packed[6]), CAUSAL, SPLIT, PACKED)
        first_key = pid_n * KEYS

        s_layout: gl.constexpr = mma_layout(32)
        d_layout: gl.constexpr = mma_layout(HALF)
        key_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        query_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
        keys = first_key + gl.arange(0, KEYS, layout=key_layout)
        dk = gl.zeros([KEYS, HALF], gl.float32, layout=d_layout)
        dv = gl.zeros([KEYS, HALF], gl.float32, layout=d_layout)
        zeros_s = gl.zeros([KEYS, 32], gl.float32, layout=s_layout)
        zeros_q = gl.zeros([QROWS, HALF], gl.float32, layout=d_layout)
        pt_half = pt_smem.slice(WG * 32, 32, dim=1)
        ds_half = ds_smem.slice(WG * 32, 32, dim=1)

        mbarrier.wait(kv_bar, phase=0)
        it = 0
        for g in range(n_heads):
            h = h0 + g
            for j in range(j0, j_end):
                s = it % 2
                mbarrier.wait(ready.index(s), phase=(it // 2) & 1)
                first_query = j * QROWS - shift + q_min + WG * 32  # (key positions: bwd_ws.dkdv_program)
                queries = first_query + gl.arange(0, 32, layout=query_layout)
                st = _scores_t(k_smem, q_ring, s, zeros_s, WG)
                dpt = _scores_t(v_smem, do_ring, s, zeros_s, WG)
                if it > 0:  # the previous block's dQ add has read its stage by now (or soon): free it
                    tma.store_wait(pendings=0)
                    thread_barrier()
                    mbarrier.arrive(free.index(1 - s), count=1)
                lse = stat_rings[0].index(s).slice(WG * 32, 32).load(query_layout) * LOG2E_C
                st = warpgroup_mma_wait(num_outstanding=2, deps=(st, ))
                pt, st = probs_t(st, lse, keys, queries, first_key, first_query, win_left, qk_scale, softcap, length,
                                  q_min, 32, CAUSAL, PACKED, SOFTCAP)  # this half's 32 queries
                # both warpgroups' halves of P^T [64 keys, 64 queries] in shared memory, then dV's product
                _share(pt_half, pt.to(dtype), p_ready, it)
                dv = warpgroup_mma(pt_smem, do_ring.index(2 * s + WG), dv, is_async=True)
                if SOFTCAP:  # tanh's derivative folded into P^T while dP^T runs
                    pt = pt * (1.0 - st * st)
                dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, ))  # dV's product runs on
                delta = stat_rings[1].index(s).slice(WG * 32, 32).load(query_layout)
                _share(ds_half, (pt * (dpt - delta[None, :])).to(dtype), ds_ready, it)
                dk = warpgroup_mma(ds_smem, q_ring.index(2 * s + WG), dk, is_async=True)
                dq = warpgroup_mma(ds_smem.permute((1, 0)), k_smem.index(WG), zeros_q, use_acc=False, is_async=True)
                dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq))
                # both warpgroups are done with the stage, P^T and dS^T: stage dQ in the stage's bytes
                thread_barrier()
                mbarrier.arrive(done, count=1)
                mbarrier.wait(done, phase=it & 1)
                if WG == 0:  # the ring as two float32 [64, 128] tiles: tile s is stage s's 32 KB
                    dq_tile = as_float32(q_ring, [2, QROWS, HALF], dq_desc.layout).index(s)
                else:
                    dq_tile = as_float32(do_ring, [2, QROWS, HALF], dq_desc.layout).index(s)
                dq_tile.store(dq * sm_scale)
                fence_async_shared()
                tma_reduce_add(dq_desc, [row0 + j * QROWS - shift, h * 2 * HALF + WG * HALF], dq_tile)
                it += 1  # the stage is freed once the add has read it, in the next block

        row = krow0 + first_key
        col = hk * 2 * HALF + WG * HALF
        if PACKED:  # (never SPLIT) the last block's barrier passed, as below
            if first_key + KEYS > length:  # this block's keys end in the sequence: masked stores
                store_rows(packed, dk * sm_scale, dv, row, first_key, length, col, d_layout)
            else:
                _store_halves(dk, dv, sm_scale, row, col, k_smem, v_smem, dk_desc, dv_desc, WG)
        elif SPLIT:  # float32 partial sums of one query head: add them where the group's heads meet
            tma.store_wait(pendings=0)  # this warpgroup's last dQ add has read its ring stage
            thread_barrier()
            if WG == 0:  # after the last block's barrier only this warpgroup's dQ tiles use its ring
                tiles = as_float32(q_ring, [2, QROWS, HALF], dk_desc.layout)
            else:
                tiles = as_float32(do_ring, [2, QROWS, HALF], dk_desc.layout)
            tiles.index(0).store(dk * sm_scale)
            tiles.index(1).store(dv)
            fence_async_shared()
            tma_reduce_add(dk_desc, [row, col], tiles.index(0))
            tma_reduce_add(dv_desc, [row, col], tiles.index(1))
        else:
            _store_halves(dk, dv, sm_scale, row, col, k_smem, v_smem, dk_desc, dv_desc, WG)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _store_halves(dk, dv, sm_scale, row, col, k_smem, v_smem, dk_desc, dv_desc, WG: gl.constexpr):
        """This warpgroup's column half of dK (times ``sm_scale``) and dV by TMA at ``[row, col]``, in
        their dtype, staged in its K and V halves (after the last block's barrier no MMA reads them)."""
        k_tile = k_smem.index(WG)
        v_tile = v_smem.index(WG)
        k_tile.store((dk * sm_scale).to(k_tile.dtype))
        v_tile.store(dv.to(v_tile.dtype))
        fence_async_shared()
        tma_store(dk_desc, [row, col], k_tile)
        tma_store(dv_desc, [row, col], v_tile)

    @direct_launch
    @gluon.jit
    def flash_attention_bwd_d256_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, dq_desc, Lse, Delta,
                                        qk_scale, sm_scale, seq, heads, group, win_left, chunk, Cu, Table, CuK, DK,
                                        DV, stride_dk, stride_dv, softcap, CAUSAL: gl.constexpr,
                                        SPLIT: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
                                        PACKED: gl.constexpr = 0, SOFTCAP: gl.constexpr = 0):
        """q/do ``[B * S, Hq * 256]`` and k/v/dk/dv ``[B * S, Hkv * 256]`` row views in ``[64, 128]``
        boxes; dq ``[B * S, Hq * 256]`` float32 (zeroed; receives dQ times the scale) in ``[64, 128]``
        boxes; Lse / Delta 1-D descriptors of the ``[B, Hq, S]`` float32 vectors (natural-log lse;
        delta = rowsum(dO * O)) in boxes of 64. ``CAUSAL`` 0/1/2 as in :func:`_blocks`. Grid
        ``(B * Hkv * (S // 64),)`` in chunks of ``chunk`` heads; ``num_warps`` 4. With ``SPLIT`` the
        grid is ``(B * Hq * (S // 64),)``, a program walks one query head, and dk/dv are zeroed
        float32 row views (boxes as dq's) that receive the group's partial dK (times the scale) and
        dV by TMA reduce-add. ``PACKED``: packed sequences as :func:`bwd_fused.flash_attention_bwd_fused_kernel`
        takes them (``seq`` the lse / delta row length, the token count rounded up to a multiple of
        4; ``Table`` the schedule in 64-key units, the grid its capacity; ``CuK`` the keys' offsets
        with ``PACKED`` 2; ``DK`` / ``DV`` with row strides ``stride_dk`` / ``stride_dv``: dk and dv
        again, for the masked stores). ``SOFTCAP`` (a flag): soft-capped scores, ``qk_scale`` and
        ``softcap`` from ``ws_common.softcap_args``."""
        dtype: gl.constexpr = q_desc.dtype
        k_smem = gl.allocate_shared_memory(dtype, [2, KEYS, HALF], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [2, KEYS, HALF], v_desc.layout)
        # [2 * stage + column half]: a stage's two halves are 32 KB in a row, a float32 [64, 128] dQ tile
        q_ring = gl.allocate_shared_memory(dtype, [4, QROWS, HALF], q_desc.layout)
        do_ring = gl.allocate_shared_memory(dtype, [4, QROWS, HALF], do_desc.layout)
        pt_smem = gl.allocate_shared_memory(dtype, [KEYS, QROWS], gl.NVMMASharedLayout.get_default_for([KEYS, QROWS],
                                                                                                   dtype))
        ds_smem = gl.allocate_shared_memory(dtype, [KEYS, QROWS], gl.NVMMASharedLayout.get_default_for([KEYS, QROWS],
                                                                                                   dtype))
        stat_rings = (gl.allocate_shared_memory(gl.float32, [2, QROWS], Lse.layout),
                      gl.allocate_shared_memory(gl.float32, [2, QROWS], Delta.layout))
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ds_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        mbarrier.init(p_ready, count=2)  # both halves of P^T are stored
        mbarrier.init(ds_ready, count=2)  # both halves of dS^T are stored
        mbarrier.init(done, count=2)  # both warpgroups' products of the block are complete
        for i in gl.static_range(2):
            mbarrier.init(ready.index(i), count=1)  # Q, dO, lse and delta of a block, by TMA
            mbarrier.init(free.index(i), count=2)  # both dQ adds have read the stage
        bars = (kv_bar, ready, free, p_ready, ds_ready, done)
        args = (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, dq_desc, Lse, Delta, qk_scale, sm_scale, seq, heads,
                group, win_left, chunk, k_smem, v_smem, q_ring, do_ring, pt_smem, ds_smem, stat_rings, bars,
                (Cu, Table, DK, DV, stride_dk, stride_dv, CuK), softcap)
        gl.warp_specialize([(_consumer, (args, CAUSAL, SPLIT, PACKED, 0, SOFTCAP)),
                            (_consumer, (args, CAUSAL, SPLIT, PACKED, 1, SOFTCAP)),
                            (_producer, (args, CAUSAL, SPLIT, PACKED))],
                           [4, 1], [CONSUMER_REGS, 24])


def d256_shape_supported(q_shape, k_shape, dtype: torch.dtype) -> bool:
    """Shapes and dtype the kernel takes: BSHD, D = 256, Sq == Sk a positive multiple of 64, Hq a
    multiple of Hkv, nothing empty, float16 / bfloat16 (``ws_common.ws_shape_supported``'s rule)."""
    return ws_shape_supported(q_shape, k_shape, dtype, head_dims=(D256,), multiple=BLOCK)


def d256_supported(q, k, v, dout, dk, dv) -> bool:
    """Whether :func:`flash_attention_bwd_d256` can run these tensors on this machine: the dK/dV
    kernel's conditions (:func:`bwd_ws.dkdv_ws_supported`) at D=256 and lengths a multiple of 64."""
    return dkdv_ws_supported(q, k, v, dout, dk, dv, head_dims=(D256,), multiple=BLOCK)


def d256_split(q_shape, k_shape, causal: bool, win_left: int | None = None) -> bool:
    """Whether a GQA call's programs each walk one query head (``SPLIT``) rather than their KV head's
    group (q ``[B, S, Hq, 256]``, k ``[B, S, Hkv, 256]``; ``causal`` and ``win_left`` the band).

    Walking the group costs two ways. Programs stream the group's heads one after another, and
    programs that started at different times stream different heads, so the L2 working set grows to
    the group's Q, dO and float32 dQ (4 x 32 MB at 16k keys and GQA 4) and the kernel reads from HBM
    what one head at a time keeps in L2 (one 16k causal sequence, GQA 16/4: 6.2 GB read and 91% L2
    hits, against 0.8 GB and 99% with the heads split). And a causal program's length is the group
    times its key block's rows, so the longest programs set the tail. Split, the partial dK and dV
    go through a float32 workspace (:func:`backward.dkv_workspace`), zeroed and converted per call.
    Measured (H200, bf16, B*S = 16k, Hq = 8): causal GQA 8 1.28-1.33x at 1k-16k keys;
    causal GQA 4 0.96x at 1k, 0.99-1.00x at 2k, 1.03-1.09x from 4k; causal GQA 2 0.86x at 1k, 0.93x
    at 2k, 0.99x at 4k, 1.02-1.03x at 8k-16k; full attention (GQA 2, 4 and 8) 0.94-0.95x at 1k,
    0.98-1.00x at 2k-4k, 1.02-1.03x from 8k; windows of 1k-4k keys at 4k-16k 1.03-1.19x with GQA 4
    and 8, 0.95x with GQA 2 (8k keys, a 1k window). The rule: :data:`SPLIT_MIN_KEYS_CAUSAL` and
    :data:`SPLIT_MIN_KEYS` above; windowed calls with a group under 4 never split, and windowed
    calls split from :data:`SPLIT_MIN_KEYS_CAUSAL` keys whatever their group (windows were measured
    from 4k keys only)."""
    group = q_shape[2] // k_shape[2]
    if group == 1:
        return False
    if causal and ((group >= 8 and win_left is None) or (group >= 4 and k_shape[1] >= SPLIT_MIN_KEYS_CAUSAL)):
        return True
    return (not causal or win_left is None) and k_shape[1] >= SPLIT_MIN_KEYS


def flash_attention_bwd_d256(q, k, v, dout, lse, delta, dq, dk, dv, *, softmax_scale: float, causal: bool,
                             win_left: int | None = None, chunk: int | None = None, dq_acc: torch.Tensor | None = None,
                             split: bool | None = None, softcap: float | None = None, checked: bool = False,
                             warmup_only: bool = False):
    """Write ``dq`` (``[B, S, Hq, 256]``, any strides), ``dk`` and ``dv`` (``[B, S, Hkv, 256]`` row
    views) from ``q/dout [B, S, Hq, 256]``, ``k/v [B, S, Hkv, 256]``, ``lse [B, Hq, S]`` float32
    (natural log, the forward's) and ``delta [B, Hq, S]`` float32 (``rowsum(dO * O)`` minus any lse
    gradient); returns ``(dq, dk, dv)``. ``dq_acc``: a zeroed contiguous float32 ``[B, S, Hq, 256]``
    workspace (allocated when None). ``win_left`` (with ``causal``): query ``i`` sees keys
    ``i - win_left .. i``. ``chunk``: heads per chunk of the launch order (None: about one wave).
    ``split``: programs walk one query head each, dK and dV summed in a float32 workspace (None:
    :func:`d256_split`'s rule). ``softcap``: the forward's soft cap. ``checked``: the caller ran
    :func:`d256_supported`. ``warmup_only``
    compiles without launching. dQ (and with ``split`` dK and dV) are float32 sums in any order: not
    bit-reproducible run to run."""
    if not (warmup_only or checked) and not d256_supported(q, k, v, dout, dk, dv):
        raise ValueError(f"the D=256 Gluon backward needs an sm_90 GPU, Gluon, float16/bfloat16 BSHD row views, "
                         f"D=256 and Sq == Sk a multiple of {BLOCK}; got q {tuple(q.shape)} {q.stride()}, "
                         f"k {tuple(k.shape)} {k.stride()}, {q.dtype} on {q.device}")
    split = d256_split(q.shape, k.shape, causal, win_left) if split is None else split
    return launch_with_dq(lambda acc, dk_into, dv_into: d256_launch(
        q, k, v, dout, lse, delta, acc, dk_into, dv_into, softmax_scale, causal, win_left, chunk, softcap=softcap),
        q, dq, dk, dv, dq_acc, warmup_only, split)


def d256_launch(q, k, v, dout, lse, delta, dq_acc, dk, dv, softmax_scale: float, causal: bool,
                win_left: int | None = None, chunk: int | None = None, schedule=None, softcap: float | None = None):
    """``(kernel, grid, args, meta)`` of :func:`flash_attention_bwd_d256` over checked tensors
    (lse, delta and win_left checked here): the launch it makes, and that a plan binds once. ``dk``
    and ``dv``: the outputs, or a :func:`backward.dkv_workspace`'s two float32 halves (``SPLIT``).
    ``schedule``: packed sequences as :func:`bwd_fused.fused_launch` takes them (``(cum_seqlens,
    table, cum_seqlens_k)``, a table in 64-key units: :func:`backward.packed_launches`; batch-of-one tensors,
    causal or full, no ``SPLIT``). ``softcap``: soft-capped logits (``ws_common.softcap_tanh``)."""
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    split = splits_heads(dk, dv)
    lse, delta, chunk, grid, mode, S, pointers, packed = schedule_prologue(q, k, lse, delta, causal, win_left, chunk,
                                                                           split, schedule, keys=BLOCK)
    half = D // 2
    qk_scale, cap, softcap_mode = softcap_args(softmax_scale, softcap)
    args = (row_descriptor(q, BLOCK, block_cols=half), row_descriptor(k, BLOCK, block_cols=half),
            row_descriptor(v, BLOCK, block_cols=half), row_descriptor(dout, BLOCK, block_cols=half),
            row_descriptor(dk, BLOCK, block_cols=half), row_descriptor(dv, BLOCK, block_cols=half),
            row_descriptor(dq_acc, BLOCK, block_cols=half), vector_descriptor(lse, BLOCK),
            vector_descriptor(delta, BLOCK), qk_scale, softmax_scale, S, Hq, Hq // Hkv,
            0 if win_left is None else win_left, chunk, *pointers, dk, dv, dk.stride(1), dv.stride(1), cap)
    # 12 warps (4 + 4 + the producer's, rounded to a warpgroup) share 64K registers: 168 each on
    # launch, then 240 for each consumer and 24 for the producer
    meta = dict(CAUSAL=mode, SPLIT=split, CONSUMER_REGS=240, num_warps=4, maxnreg=168, PACKED=packed,
                SOFTCAP=softcap_mode, **LAUNCH_OPTIONS)
    return flash_attention_bwd_d256_kernel, grid, args, meta
