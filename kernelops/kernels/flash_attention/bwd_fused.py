"""Flash attention backward for Hopper in Gluon with dQ fused in: dK, dV and dQ from one kernel.

The split backward (bwd_ws.py for dK/dV, then bwd.py's Triton dQ kernel) recomputes S and dP in
the dQ kernel: five products per score block for dK/dV plus three for dQ, where a fused kernel
needs five. Here the dK/dV kernel of bwd_ws.py (one program per 128 keys of one (batch, KV head),
two consumer warpgroups of 64 keys, a one-warp TMA producer streaming 64-query blocks of Q and
dO) also forms dQ, in FlashAttention-3's layout: each warpgroup writes its dS^T [64 keys, 64
queries] (16-bit) to shared memory, the two wait for each other (an mbarrier both arrive on), and
then each computes half of dQ's columns over all 128 keys, dQ[:, half] = dS K[:, half] (two
warpgroup MMAs, A = dS^T transposed from shared memory, B = a column half of each K tile), and
adds its [64, D/2] float32 tile into a float32 buffer with one TMA reduce-add
(``cp.reduce.async.bulk.tensor ... .add``). The dS^T tiles are double-buffered like the Q/dO ring
(two stages): stage s's "free" mbarrier, on which both warpgroups arrive once their products of the
block are done, frees its Q, dO, lse and delta and dS^T buffer s alike. One dQ tile per
program and query block, half the bytes of each warpgroup adding its own [64, D] share (which
lost). Dense D=64 calls stream 128-query blocks instead (the rule: :func:`fused_block_q`): S^T and dP^T are [64 keys, 128 queries] products, and each warpgroup's dQ products
cover its own 64 of the block's queries in every column, dQ[rows] = dS[rows, 128 keys] K (A = its
row slice of both dS^T tiles), so every product has N >= 64 and a block's barriers and exchange
serve twice the queries. With GQA that build walks the group's (head, block) pairs in one flat loop
(``FLAT``): the nested loops kept more values live and spilled registers to L2.

dQ is accumulated in float32 (already multiplied by the softmax scale) and converted to the
gradient's dtype after the kernel. With ``SPLIT`` (:func:`fused_split`, long GQA calls at D=128)
the grid runs over (batch, query head) instead, and each program adds its float32 partial dK and
dV into a zeroed workspace the same way. The adds land in any order: results are not
bit-reproducible run to run (``deterministic=True`` keeps the split backward).

Scope: as the dK/dV kernel (:func:`bwd_ws.dkdv_ws_supported`, :func:`bwd_ws.dkdv_ws_band`),
with a dq row view as well; and packed sequences with one offsets tensor
or two (per-side lengths, bottom-right causal), causal, full or a causal window (``PACKED``,
:func:`bwd_fused_packed_supported`, ``backward.packed_launches``, :func:`padded_stats`).
"""

from __future__ import annotations

import torch

from kernelops.kernels.common.gluon import GLUON
from kernelops.kernels.common.host import LAUNCH_OPTIONS
from kernelops.kernels.common.launch import direct_launch
from kernelops.kernels.common.tma import row_descriptor, tma_rows_view, vector_descriptor
from kernelops.kernels.flash_attention.bwd_ws import dkdv_ws_supported, launch_prologue
from kernelops.kernels.flash_attention.ws_common import same_offsets, softcap_args, ws_packed_supported

#: the fewest keys at which a D=128 GQA call's programs take one query head each (:func:`fused_split`),
#: and the fewest at which a causal one with a group of 8 or more does
SPLIT_MIN_KEYS = 8192
SPLIT_MIN_KEYS_GROUP8 = 2048

if GLUON:
    from kernelops.kernels.common.gluon import (
        as_float32, fence_async_shared, gl, gluon, mbarrier, mma_layout, thread_barrier, tma, tma_reduce_add,
        tma_store, warpgroup_mma, warpgroup_mma_wait)
    from kernelops.kernels.flash_attention.bwd_ws import KEYS, dkdv_producer, dkdv_program, dv_and_ds

    @gluon.jit
    def _share_ds(ds_smem, ds_ready, free, dst16, it, WG: gl.constexpr):
        """Write this warpgroup's dS^T into buffer ``it % 2`` once both warpgroups' dQ products of two
        blocks ago have read it (``free``: the stage barrier, two stages), then wait until the other
        warpgroup has written its half."""
        buf = it % 2
        use = (it // 2) & 1
        mbarrier.wait(free.index(buf), phase=use ^ 1)  # a fresh barrier passes: no earlier use
        ds_smem.index(2 * buf + WG).store(dst16)
        fence_async_shared()  # the generic-proxy stores before the other warpgroup's MMA reads them
        thread_barrier()  # every thread of this warpgroup has stored before one thread arrives
        mbarrier.arrive(ds_ready.index(buf), count=1)
        mbarrier.wait(ds_ready.index(buf), phase=use)

    @gluon.jit
    def _ds_rows(ds_smem, index, WG: gl.constexpr, ROWS: gl.constexpr):
        """The A operand of a dQ product: dS (queries x 64 keys) from dS^T buffer ``index`` (``[64 keys,
        QROWS]``), transposed; with ``ROWS`` (128-query blocks) only this warpgroup's 64 queries."""
        ds_t = ds_smem.index(index)
        if ROWS:
            ds_t = ds_t.slice(WG * KEYS, KEYS, dim=1)
        return ds_t.permute((1, 0))

    @gluon.jit
    def _consumer(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads, group,
                  win_left, k_smem, v_smem, q_ring, do_ring, bars, dq_desc, ds_smem, dq_smem, stat_rings,
                  chunk, packed, softcap, CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, SPLIT: gl.constexpr,
                  PACKED: gl.constexpr, WG: gl.constexpr, SOFTCAP: gl.constexpr, FLAT: gl.constexpr):
        """Keys ``[WG * 64, WG * 64 + 64)`` of the program's 128: dK and dV of those keys, and columns
        ``[WG * D/2, WG * D/2 + D/2)`` of dQ over all 128 keys (with 128-query blocks: every column of
        the block's queries ``[WG * 64, WG * 64 + 64)``), for every query head of the group (with
        ``SPLIT`` the program's one) and every query block that sees the program's keys. ``PACKED``
        (``packed = (Cu, Table, DK, DV, stride_dk, stride_dv, CuK)``; 2: two offsets tensors): the
        program's sequence and key block from the schedule (:func:`bwd_ws.dkdv_program`), and a key tile
        reaching past the sequence's end stores dK / dV through the pointers with a mask (a TMA store
        would write the next sequence's rows). ``SOFTCAP``: capped scores (``bwd_ws.dv_and_ds``). ``FLAT``:
        one loop over the (head, block) pairs instead of a block loop in a head loop (GQA with 128-query
        blocks, whose nested loops spill registers)."""
        kv_bar, ready, free, ds_ready = bars
        STAGES: gl.constexpr = q_ring.type.shape[0]
        gl.static_assert(STAGES == 2, "stage s's free barrier also frees dS^T buffer s")
        QROWS: gl.constexpr = q_ring.type.shape[1]  # queries per streamed block: 64, or 128 (ROWS)
        if SPLIT:  # SPLIT stages a float32 [KEYS, D] tile in each two-stage ring and in each pair of K / V tiles
            gl.static_assert(QROWS == KEYS, "the rings' bytes hold a float32 dK / dV tile")
        # ROWS: 128-query blocks, each warpgroup's dQ products cover its 64 of them in every column;
        # else 64-query blocks, each warpgroup's cover every query in half of the columns
        ROWS: gl.constexpr = QROWS == 2 * KEYS
        HALF: gl.constexpr = HEAD_DIM // 2
        DQ_COLS: gl.constexpr = HEAD_DIM if ROWS else HALF
        dtype: gl.constexpr = q_desc.dtype
        pid_n, hk, h0, n_heads, j0, j_end, row0, _, length, shift, krow0, q_min = dkdv_program(
            seq, heads, group, win_left, chunk, (packed[0], packed[1], packed[6]), CAUSAL, QROWS, SPLIT, PACKED)
        first_key = pid_n * 2 * KEYS + WG * KEYS

        s_layout: gl.constexpr = mma_layout(QROWS)
        d_layout: gl.constexpr = mma_layout(HEAD_DIM)
        h_layout: gl.constexpr = mma_layout(DQ_COLS)
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=d_layout, k_width=2)
        key_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        query_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
        k_tile = k_smem.index(WG)
        v_tile = v_smem.index(WG)
        if ROWS:  # B operands of this warpgroup's dQ products: both K tiles whole, or its column halves
            k_half0 = k_smem.index(0)
            k_half1 = k_smem.index(1)
        else:
            k_half0 = k_smem.index(0).slice(WG * HALF, HALF, dim=1)
            k_half1 = k_smem.index(1).slice(WG * HALF, HALF, dim=1)
        dq_tile = dq_smem.index(WG)
        keys = first_key + gl.arange(0, KEYS, layout=key_layout)
        dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=d_layout)
        dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, layout=d_layout)
        zeros_s = gl.zeros([KEYS, QROWS], gl.float32, layout=s_layout)
        zeros_q = gl.zeros([KEYS, DQ_COLS], gl.float32, layout=h_layout)  # 64 queries' dQ columns

        mbarrier.wait(kv_bar, phase=0)
        it = 0
        if FLAT:  # one flat loop over (head, block): nested ones spill this build to L2 
            blocks = j_end - j0
            outer = 1
            lo = 0
            hi = n_heads * blocks
        else:
            outer = n_heads
            lo = j0
            hi = j_end
        for g in range(outer):
            for t in range(lo, hi):
                if FLAT:
                    h = h0 + t // blocks
                    j = j0 + t % blocks
                else:
                    h = h0 + g
                    j = t
                s = it % STAGES
                phase = (it // STAGES) & 1
                q_lo = j * QROWS - shift + q_min  # (key positions: bwd_ws.dkdv_program)
                queries = q_lo + gl.arange(0, QROWS, layout=query_layout)
                mbarrier.wait(ready.index(s), phase=phase)
                q_tile = q_ring.index(s)
                do_tile = do_ring.index(s)
                dst, dv = dv_and_ds(k_tile, v_tile, q_tile, do_tile, zeros_s, dv, stat_rings[0].index(s),
                                     stat_rings[1].index(s), queries, keys, first_key, q_lo, win_left, qk_scale, None, it,
                                     a_layout, CAUSAL, False, WG, length, PACKED, q_min, softcap, SOFTCAP)
                dst = dst.to(dtype)
                dk = warpgroup_mma(gl.convert_layout(dst, a_layout), q_tile, dk, is_async=True)
                _share_ds(ds_smem, ds_ready, free, dst, it, WG)
                buf = it % 2
                dq = warpgroup_mma(_ds_rows(ds_smem, 2 * buf, WG, ROWS), k_half0, zeros_q, use_acc=False,
                                   is_async=True)
                dq = warpgroup_mma(_ds_rows(ds_smem, 2 * buf + 1, WG, ROWS), k_half1, dq, is_async=True)
                dk, dv, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, dq))
                mbarrier.arrive(free.index(s), count=1)  # Q, dO, lse, delta and dS^T buffer s (s == buf)
                tma.store_wait(pendings=0)  # the previous block's add has read dq_tile
                thread_barrier()
                dq_tile.store(dq * sm_scale)
                fence_async_shared()
                if ROWS:
                    tma_reduce_add(dq_desc, [row0 + j * QROWS - shift + WG * KEYS, h * HEAD_DIM], dq_tile)
                else:
                    tma_reduce_add(dq_desc, [row0 + j * QROWS - shift, h * HEAD_DIM + WG * HALF], dq_tile)
                it += 1

        tma.store_wait(pendings=0)
        # the other warpgroup's last dQ product reads this warpgroup's K tile (and with SPLIT its last
        # products read the rings and K / V tiles staged below): wait for it
        if it > 0:
            mbarrier.wait(free.index((it - 1) % 2), phase=((it - 1) // 2) & 1)
        thread_barrier()
        row = krow0 + first_key
        if PACKED:
            if first_key + KEYS > length:  # this tile's keys end in the sequence: masked stores
                store_rows(packed, dk * sm_scale, dv, row, first_key, length, hk * HEAD_DIM, d_layout)
            else:
                _store_tiles(dk, dv, sm_scale, row, hk, q_ring, do_ring, k_smem, v_smem, dk_desc, dv_desc, HEAD_DIM,
                             SPLIT, WG)
        else:
            _store_tiles(dk, dv, sm_scale, row, hk, q_ring, do_ring, k_smem, v_smem, dk_desc, dv_desc, HEAD_DIM, SPLIT,
                         WG)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _store_tiles(dk, dv, sm_scale, row, hk, q_ring, do_ring, k_smem, v_smem, dk_desc, dv_desc,
                     HEAD_DIM: gl.constexpr, SPLIT: gl.constexpr, WG: gl.constexpr):
        """This warpgroup's dK (times ``sm_scale``) and dV out by TMA from ``row``: stored in their dtype
        through its K / V tiles, or with ``SPLIT`` added in float32 (staged where no MMA reads any more)."""
        if SPLIT:  # float32 partial sums of one query head
            if WG == 0:  # the Q / dO rings (the producer loads nothing after the last block)
                dk_tile = as_float32(q_ring, [1, KEYS, HEAD_DIM], dk_desc.layout).index(0)
                dv_tile = as_float32(do_ring, [1, KEYS, HEAD_DIM], dv_desc.layout).index(0)
            else:  # both K tiles and both V tiles: the other warpgroup's products are done (the caller waited)
                dk_tile = as_float32(k_smem, [1, KEYS, HEAD_DIM], dk_desc.layout).index(0)
                dv_tile = as_float32(v_smem, [1, KEYS, HEAD_DIM], dv_desc.layout).index(0)
            dk_tile.store(dk * sm_scale)
            dv_tile.store(dv)
            fence_async_shared()
            tma_reduce_add(dk_desc, [row, hk * HEAD_DIM], dk_tile)
            tma_reduce_add(dv_desc, [row, hk * HEAD_DIM], dv_tile)
        else:  # K and V of this warpgroup are no longer read
            k_tile = k_smem.index(WG)
            v_tile = v_smem.index(WG)
            k_tile.store((dk * sm_scale).to(k_tile.dtype))
            v_tile.store(dv.to(v_tile.dtype))
            fence_async_shared()
            tma_store(dk_desc, [row, hk * HEAD_DIM], k_tile)
            tma_store(dv_desc, [row, hk * HEAD_DIM], v_tile)

    @gluon.jit
    def store_rows(packed, dk, dv, row, first_key, length, col0, layout: gl.constexpr):
        """dK / dV (``[KEYS, C]`` float32 in ``layout``) of keys ``first_key ..`` (row ``row`` on) of a
        packed sequence of ``length``, columns ``col0 .. col0 + C``: the rows before ``length`` stored
        through the pointers of ``packed`` (its DK, DV and row strides), in their dtype."""
        _, _, DK, DV, stride_dk, stride_dv, _ = packed
        rows = gl.arange(0, KEYS, layout=gl.SliceLayout(1, layout))
        cols = col0 + gl.arange(0, dk.shape[1], layout=gl.SliceLayout(0, layout))
        keep = (first_key + rows < length)[:, None]
        offsets = (row + rows)[:, None].to(gl.int64)
        gl.store(DK + offsets * stride_dk + cols[None, :], dk.to(DK.dtype.element_ty), mask=keep)
        gl.store(DV + offsets * stride_dv + cols[None, :], dv.to(DV.dtype.element_ty), mask=keep)

    @direct_launch
    @gluon.jit
    def flash_attention_bwd_fused_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, dq_desc, Lse, Delta,
                                         qk_scale, sm_scale, seq, heads, group, win_left, chunk, Cu, Table, CuK, DK,
                                         DV, stride_dk, stride_dv, softcap, CAUSAL: gl.constexpr,
                                         HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, SPLIT: gl.constexpr,
                                         CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr, PACKED: gl.constexpr = 0,
                                         SOFTCAP: gl.constexpr = 0, FLAT: gl.constexpr = False):
        """q/do ``[B * S, Hq * D]`` row views (TMA blocks of 64 queries, or 128 at D=64 without
        ``SPLIT``), k/v/dk/dv ``[B * S, Hkv * D]`` (blocks of 64 keys), dq ``[B * S, Hq * D]``
        float32 (zeroed; blocks of ``[64, D/2]``, or ``[64, D]`` with 128-query blocks; receives dQ);
        Lse / Delta 1-D descriptors of the ``[B, Hq, S]`` float32 vectors (natural-log lse; delta =
        rowsum(dO * O)), boxes of one block's queries; ``CAUSAL`` 0/1/2 as in :func:`bwd_ws.key_blocks`. Grid
        ``(B * Hkv * (S // 128),)`` in chunks of ``chunk`` heads (:func:`bwd_ws.key_blocks`), ``num_warps`` 4.
        With ``SPLIT`` the grid is ``(B * Hq * (S // 128),)``, a program walks one query head, and
        dk/dv are zeroed float32 row views (boxes of ``[64, D]``) that receive the group's partial dK
        (times the scale) and dV by TMA reduce-add. ``PACKED``: packed sequences, ``[1, total, H, D]``
        row views with ``seq`` the token count and Lse / Delta ``[Hq, total]``; program ``u`` takes the
        schedule ``Table``'s unit ``u`` (``varlen.ws_packed_schedule`` over KV heads, 128-key units; the grid
        its capacity) of the sequences ``Cu`` delimits (``PACKED`` 1), or with ``PACKED`` 2 whose
        queries ``Cu`` and keys ``CuK`` delimit (``[1, total_q, Hq, D]`` / ``[1, total_k, Hkv, D]``,
        ``seq`` from total_q, the table's units over the keys); ``DK`` / ``DV`` (row strides ``stride_dk`` /
        ``stride_dv``) are dk and dv again, for the masked stores of tiles that end a sequence.
        ``SOFTCAP`` (a flag): soft-capped scores, ``qk_scale`` and ``softcap`` from
        ``ws_common.softcap_args`` (``bwd_ws.dv_and_ds``). ``FLAT``: the consumers walk a GQA group's (head,
        block) pairs in one loop (:func:`_consumer`)."""
        dtype: gl.constexpr = q_desc.dtype
        QROWS: gl.constexpr = q_desc.block_type.shape[0]
        k_smem = gl.allocate_shared_memory(dtype, [2, KEYS, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [2, KEYS, HEAD_DIM], v_desc.layout)
        q_ring = gl.allocate_shared_memory(dtype, [STAGES, QROWS, HEAD_DIM], q_desc.layout)
        do_ring = gl.allocate_shared_memory(dtype, [STAGES, QROWS, HEAD_DIM], do_desc.layout)
        # [buffer * 2 + warpgroup]: dS^T [64 keys, QROWS queries], double-buffered
        ds_smem = gl.allocate_shared_memory(dtype, [4, KEYS, QROWS],
                                            gl.NVMMASharedLayout.get_default_for([KEYS, QROWS], dtype))
        dq_smem = gl.allocate_shared_memory(gl.float32, [2, dq_desc.block_type.shape[0], dq_desc.block_type.shape[1]],
                                            dq_desc.layout)
        stat_rings = (gl.allocate_shared_memory(gl.float32, [STAGES, QROWS], Lse.layout),
                      gl.allocate_shared_memory(gl.float32, [STAGES, QROWS], Delta.layout))
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)  # Q, dO, lse and delta of a block, by TMA
            # both warpgroups are done with stage i: its Q, dO, lse, delta and dS^T buffer i
            mbarrier.init(free.index(i), count=2)
            mbarrier.init(ds_ready.index(i), count=2)  # both halves of dS^T buffer i are written
        bars = (kv_bar, ready, free, ds_ready)  # the producer reads the first three
        packed = (Cu, Table, DK, DV, stride_dk, stride_dv, CuK)
        gl.warp_specialize([
            (_consumer, (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads,
                         group, win_left, k_smem, v_smem, q_ring, do_ring, bars, dq_desc, ds_smem, dq_smem,
                         stat_rings, chunk, packed, softcap, CAUSAL, HEAD_DIM, SPLIT, PACKED, 0, SOFTCAP, FLAT)),
            (_consumer, (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads,
                         group, win_left, k_smem, v_smem, q_ring, do_ring, bars, dq_desc, ds_smem, dq_smem,
                         stat_rings, chunk, packed, softcap, CAUSAL, HEAD_DIM, SPLIT, PACKED, 1, SOFTCAP, FLAT)),
            (dkdv_producer, (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads,
                         group, win_left, k_smem, v_smem, q_ring, do_ring, bars, CAUSAL, HEAD_DIM, False, chunk,
                         stat_rings, SPLIT, (Cu, Table, CuK), PACKED)),
        ], [4, 1], [CONSUMER_REGS, 24])


#: keys of a packed program's block (the schedule's units): two 64-key halves, one per consumer;
#: at D=256 (:mod:`bwd_d256`) one 64-key block whose columns the consumers split
PACKED_KEYS = 2 * 64
PACKED_KEYS_D256 = 64
#: head dims of the packed Gluon backward: this kernel at 64 / 128, :mod:`bwd_d256`'s at 256
PACKED_HEAD_DIMS = (64, 128, 256)


def packed_unit(head_dim: int) -> int:
    """Keys of a packed backward program at this head dim (:data:`PACKED_KEYS`, or
    :data:`PACKED_KEYS_D256` at D=256)."""
    return PACKED_KEYS_D256 if head_dim == 256 else PACKED_KEYS


def packed_table(cum_seqlens: torch.Tensor, total: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """An unfilled schedule table for ``backward.packed_launches`` (``varlen.ws_packed_table`` over the
    KV heads in units of :func:`packed_unit` keys; ``cum_seqlens`` and ``total``: the keys')."""
    from kernelops.kernels.flash_attention.varlen import ws_packed_table

    return ws_packed_table(cum_seqlens, total, kv_heads, block=packed_unit(head_dim))


def padded_stats(lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lse, delta)`` for the packed fused backward from the forward's ``lse [Hq, total]``, as a
    batch of one ``[1, Hq, padded]``: rows of ``total`` rounded up to a multiple of 4 values (each
    query block's 1-D TMA boxes then start 16-byte aligned, :func:`bwd_ws.dkdv_program`), lse copied in
    (a view of the same tensor when no padding is needed), both zero past the tokens (finite values
    the kernel masks); delta for the preprocess kernel to fill."""
    Hq, total = lse.shape
    padded = -(-total // 4) * 4
    delta = torch.zeros((1, Hq, padded), dtype=torch.float32, device=lse.device)
    if padded == total and lse.is_contiguous():
        return lse[None], delta
    out = torch.zeros((1, Hq, padded), dtype=torch.float32, device=lse.device)
    out[0, :, :total].copy_(lse)
    return out, delta


def bwd_fused_packed_supported(q, k, v, dout, dq, dk, dv, cum_seqlens_q, cum_seqlens_k) -> bool:
    """Whether the fused backward (D=256: ``bwd_d256``'s) takes these packed tensors (``[total, H, D]``):
    the forward's packed conditions (``ws_common.ws_packed_supported``, one offsets tensor or two) at
    :data:`PACKED_HEAD_DIMS`, and dout, dq, dk, dv row views of the same dtype and shapes."""
    return (q.shape[-1] in PACKED_HEAD_DIMS
            and ws_packed_supported(q, k, v, cum_seqlens_q, cum_seqlens_k, two_offsets=True)
            and dout.shape == dq.shape == q.shape and dk.shape == dv.shape == k.shape
            and all(t.dtype == q.dtype and t.device == q.device and tma_rows_view(t[None]) for t in (dout, dk, dv))
            and dq.dtype == q.dtype and dq.device == q.device)


def bwd_fused_supported(q, k, v, dout, dq, dk, dv) -> bool:
    """Whether :func:`flash_attention_bwd_fused` can run these tensors: the dK/dV kernel's
    conditions, and dq a row view of q's shape and dtype."""
    return (dkdv_ws_supported(q, k, v, dout, dk, dv) and dq.shape == q.shape and dq.dtype == q.dtype
            and dq.device == q.device)


def fused_split(q_shape, k_shape, causal: bool, win_left: int | None = None) -> bool:
    """Whether a GQA call's programs each walk one query head (``SPLIT``) rather than their KV head's
    group (q ``[B, S, Hq, D]``, k ``[B, S, Hkv, D]``; the reasons: :func:`bwd_d256.d256_split`).
    Measured (H200, bf16, B*S = 16k, H*D = 2048, kernel time with the workspace): D=128
    causal GQA 8 1.11-1.15x at 2k-16k keys, causal GQA 4 0.95x at 2k, 0.97x at 4k, 1.03x at 8k,
    1.06-1.07x at 16k; full attention 0.95x at 2k, 0.99x at 4k, 1.00-1.03x at 8k-16k; a 1k window
    0.92-0.96x; at D=64 (whose group's rows take half of D=128's bytes) 0.87-1.02x, split nowhere.
    The rule: D=128 without a window, from :data:`SPLIT_MIN_KEYS` keys, or causal with a group of
    8 from :data:`SPLIT_MIN_KEYS_GROUP8`."""
    group = q_shape[2] // k_shape[2]
    if group == 1 or q_shape[-1] < 128 or (causal and win_left is not None):
        return False
    if causal and group >= 8 and k_shape[1] >= SPLIT_MIN_KEYS_GROUP8:
        return True
    return k_shape[1] >= SPLIT_MIN_KEYS


def fused_block_q(head_dim: int, group: int, split: bool = False, packed: bool = False, window: bool = False) -> int:
    """Queries per streamed block of the fused backward: 128 for dense D=64 calls except GQA ones
    with a sliding ``window``, else 64. Measured (H200, bf16, B*S = 16k, H*D = 2048): without GQA 128
    rows run 0.90-0.95x 64 rows' kernel time, full and causal from 1k keys, 0.92x with a 4096-key
    window at 16k. With GQA 4 and 8 (the build walking (head, block) pairs in one loop,
    ``FLAT``; its nested loops had spilled registers) kernel time 0.93-0.94x causal and
    0.97-1.01x full at 1k-16k keys; forward+backward causal +4-6%, full +0.3-1.4%; but with a 1024- or
    4096-key window 1.02-1.03x (backward time, 8k-16k keys), so windowed GQA calls keep 64. Packed
    sequences keep 64: there 128 rows took 1.02-1.11x the backward time without GQA (4-16 documents
    in 16k tokens, or 8 in 32k with a 4096-key window) and 1.5x with GQA 4, and
    :func:`fused_launch` refuses them when asked for explicitly."""
    if head_dim != 64 or split or packed or (group > 1 and window):
        return 64
    return 128


def flash_attention_bwd_fused(q, k, v, dout, lse, delta, dq, dk, dv, *, softmax_scale: float, causal: bool,
                              consumer_regs: int = 240, maxnreg: int = 168,
                              chunk: int | None = None, win_left: int | None = None,
                              dq_acc: torch.Tensor | None = None, split: bool | None = None,
                              softcap: float | None = None, block_q: int | None = None, checked: bool = False,
                              warmup_only: bool = False):
    """Write ``dq`` (``[B, S, Hq, D]``, any strides), ``dk`` and ``dv`` (``[B, S, Hkv, D]``, row views
    like k) from ``q/dout [B, S, Hq, D]``, ``k/v [B, S, Hkv, D]``, ``lse [B, Hq, S]`` float32 (natural
    log, the forward's) and ``delta [B, Hq, S]`` float32 (``rowsum(dO * O)`` minus any lse gradient);
    returns ``(dq, dk, dv)``; the Q/dO ring has two stages. ``dq_acc``: a zeroed contiguous
    float32 ``[B, S, Hq, D]`` workspace (allocated when None). ``chunk`` and ``win_left`` as
    in :func:`bwd_ws.flash_attention_bwd_dkdv_ws`. ``split``: programs walk one query head each,
    dK and dV summed in a float32 workspace (None: :func:`fused_split`'s rule). ``softcap``: the
    forward's soft cap (logits ``softcap * tanh(softmax_scale * q.k / softcap)``). ``block_q``: queries
    per streamed block (:func:`fused_launch`). ``checked``: the
    caller ran :func:`bwd_fused_supported`. ``warmup_only`` compiles without launching and returns
    the compiled kernel (offline compiles)."""
    if not (warmup_only or checked) and not bwd_fused_supported(q, k, v, dout, dq, dk, dv):
        raise ValueError(f"the fused Gluon backward needs an sm_90 GPU, Gluon, float16/bfloat16 BSHD row views, "
                         f"D in (64, 128) and Sq == Sk a multiple of 128; got q {tuple(q.shape)} {q.stride()}, "
                         f"k {tuple(k.shape)} {k.stride()}, {q.dtype} on {q.device}")
    split = fused_split(q.shape, k.shape, causal, win_left) if split is None else split
    return launch_with_dq(lambda acc, dk_into, dv_into: fused_launch(
        q, k, v, dout, lse, delta, acc, dk_into, dv_into, softmax_scale, causal, consumer_regs, maxnreg, chunk,
        win_left, softcap=softcap, block_q=block_q), q, dq, dk, dv, dq_acc, warmup_only, split)


def launch_with_dq(make_launch, q, dq, dk, dv, dq_acc, warmup_only: bool, split: bool = False):
    """Run a fused backward's launch (``make_launch(dq_acc, dk_into, dv_into)`` gives ``(kernel,
    grid, args, meta)``) over ``dq_acc``, the float32 dQ workspace (checked: a float32 row view of
    q's shape; a zeroed one when None), and dk, dv or with ``split`` a zeroed float32 ``[2, *dk.shape]``
    workspace's halves, then convert the workspaces into ``dq`` (and dk, dv): returns ``(dq, dk,
    dv)``, or with ``warmup_only`` the compiled kernel (nothing launched)."""
    if dq_acc is None:
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    elif dq_acc.shape != q.shape or dq_acc.dtype != torch.float32 or not tma_rows_view(dq_acc):
        raise ValueError(f"dq_acc must be a float32 row view of q's shape {tuple(q.shape)}, got "
                         f"{tuple(dq_acc.shape)} {dq_acc.dtype} {dq_acc.stride()}")
    dkv_acc = dkv_buffer(dk, zeroed=not warmup_only) if split else None  # a compile reads nothing
    kernel, grid, args, meta = make_launch(dq_acc, *((dk, dv) if dkv_acc is None else dkv_acc.unbind(0)))
    if warmup_only:
        return kernel.warmup(*args, **meta, grid=grid)
    kernel[grid](*args, **meta)
    copy_workspaces(dq_acc, dkv_acc, dq, dk, dv)
    return dq, dk, dv


def dkv_buffer(k: torch.Tensor, zeroed: bool = True) -> torch.Tensor:
    """The float32 ``[2, *k.shape]`` a ``SPLIT`` launch adds dK and dV into (zeroed unless only a
    compile reads it)."""
    return (torch.zeros if zeroed else torch.empty)((2, *k.shape), dtype=torch.float32, device=k.device)


def splits_heads(dk, dv) -> bool:
    """Whether a launch over these dK / dV targets is a ``SPLIT`` one: the outputs (16-bit) walk the
    group, a :func:`dkv_buffer`'s float32 halves split it; mixed dtypes are refused."""
    if dv.dtype != dk.dtype:
        raise ValueError(f"dk and dv must both be the outputs or both float32 workspace halves, got {dk.dtype} "
                         f"and {dv.dtype}")
    return dk.dtype == torch.float32


def copy_workspaces(dq_acc, dkv_acc, dq, dk, dv) -> None:
    """The fused kernels' float32 sums into the gradients: ``dq_acc`` into dq, and when the kernel
    summed dK and dV too (``dkv_acc``, ``SPLIT``: :func:`kernels.flash_attention.backward.dkv_workspace`)
    its halves into dk and dv."""
    dq.copy_(dq_acc)
    if dkv_acc is not None:
        dk.copy_(dkv_acc[0])
        dv.copy_(dkv_acc[1])


def schedule_prologue(q, k, lse, delta, causal: bool, win_left, chunk, split: bool, schedule, keys: int = 128):
    """:func:`bwd_ws.launch_prologue` for the fused kernels (this one and ``bwd_d256``'s, programs of
    ``keys`` keys), dense or packed (``schedule``: ``(cum_seqlens, table, cum_seqlens_k)``, as in
    :func:`fused_launch`): ``(lse, delta, chunk, grid, mode, seq, pointers, packed)`` with ``seq``
    the kernel's lse / delta row length (packed: the query token count rounded up to a multiple of
    4), ``pointers`` the kernels' ``(Cu, Table, CuK)`` and ``packed`` their ``PACKED`` (0 dense, 1
    one offsets tensor, 2 two) and, packed, a grid of one program per entry the table can hold
    (those past its count store nothing) and ``chunk`` the table's capacity; dense, the pointers
    are unread placeholders."""
    B, S = q.shape[:2]
    stats_len = None
    if schedule is not None:
        stats_len = -(-S // 4) * 4
        if split or B != 1:
            raise ValueError("packed sequences take the fused backward as a batch of one, without SPLIT")
    lse, delta, chunk, grid, mode = launch_prologue(q, k, lse, delta, causal, win_left, chunk, keys=keys,
                                                    per_query_head=split, stats_len=stats_len)
    if schedule is None:
        return lse, delta, chunk, grid, mode, S, (lse, lse, lse), 0
    from kernelops.kernels.flash_attention.varlen import table_capacity

    cu, table, cu_k = schedule
    capacity = table_capacity(table)
    return lse, delta, capacity, (capacity,), mode, stats_len, (cu, table, cu_k), 1 if same_offsets(cu, cu_k) else 2


def fused_launch(q, k, v, dout, lse, delta, dq_acc, dk, dv, softmax_scale: float, causal: bool,
                 consumer_regs: int = 240, maxnreg: int = 168, chunk: int | None = None,
                 win_left: int | None = None, schedule=None, softcap: float | None = None,
                 block_q: int | None = None):
    """``(kernel, grid, args, meta)`` of :func:`flash_attention_bwd_fused` over checked tensors (lse,
    delta and win_left checked here, :func:`bwd_ws.launch_prologue`; ``dq_acc`` the zeroed float32
    workspace): the launch it makes, and that a per-signature plan binds once. ``dk`` and ``dv``: the
    outputs, or a float32 workspace's two halves (``SPLIT``, :func:`launch_with_dq`). ``schedule``:
    packed sequences, ``(cum_seqlens, table, cum_seqlens_k)`` (``backward.packed_launches``; the same
    tensor twice when one delimits both sides) with every tensor a batch of one (``[1, total, H, D]``;
    lse and delta ``[1, Hq, total_q rounded up to a multiple of 4]``, zero past the tokens:
    :func:`padded_stats`); causal, full or a causal window (per sequence), no ``SPLIT``. ``softcap``:
    soft-capped logits (``ws_common.softcap_tanh``). ``block_q``: queries per streamed block, 64 or
    (D=64, neither ``SPLIT`` nor packed) 128; None: :func:`fused_block_q`."""
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    split = splits_heads(dk, dv)
    rows = (fused_block_q(D, Hq // Hkv, split, schedule is not None, causal and win_left is not None)
            if block_q is None else block_q)
    # packed launches take the rule's 64 (128-row blocks measured slower for packed calls)
    if rows not in (64, 128) or (rows == 128 and (split or D != 64 or (block_q is not None and schedule is not None))):
        raise ValueError(f"block_q must be 64, or 128 at D=64 without split or packed sequences, got {block_q} "
                         f"(D={D}, split={split}, packed={schedule is not None})")
    lse, delta, chunk, grid, mode, S, pointers, packed = schedule_prologue(q, k, lse, delta, causal, win_left, chunk,
                                                                           split, schedule)
    qk_scale, cap, softcap_mode = softcap_args(softmax_scale, softcap)
    args = (row_descriptor(q, rows), row_descriptor(k, 64), row_descriptor(v, 64), row_descriptor(dout, rows),
            row_descriptor(dk, 64), row_descriptor(dv, 64), row_descriptor(dq_acc, 64, block_cols=D if rows == 128 else D // 2),
            vector_descriptor(lse, rows), vector_descriptor(delta, rows), qk_scale,
            softmax_scale, S, Hq, Hq // Hkv, 0 if win_left is None else win_left, chunk, *pointers, dk, dv,
            dk.stride(1), dv.stride(1), cap)
    # 12 warps (4 + 4 + the producer's, rounded to a warpgroup) share 64K registers: maxnreg each
    # on launch, then consumer_regs for each consumer and 24 for the producer
    meta = dict(CAUSAL=mode, HEAD_DIM=D, STAGES=2, SPLIT=split,
                CONSUMER_REGS=consumer_regs, num_warps=4, maxnreg=maxnreg, PACKED=packed,
                SOFTCAP=softcap_mode, FLAT=rows == 128 and Hq != Hkv, **LAUNCH_OPTIONS)
    return flash_attention_bwd_fused_kernel, grid, args, meta
