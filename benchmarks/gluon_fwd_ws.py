"""Experiment (NOTES v23): the Gluon forward of v22 with warp specialisation and warpgroup ping-pong.

v22 (`gluon_fwd.py`) overlaps one warpgroup's softmax with its own P V product, but both of its
warpgroups run the same phase at the same time: they issue their products together and then
both run the softmax while the tensor cores idle. Here each program holds 128 query rows split
between two consumer partitions of one warpgroup (64 rows each), plus a one-warp producer that
issues every TMA load. The consumers take turns to issue their products (two mbarriers pass the
turn), so one warpgroup's softmax runs while the other's products run (FlashAttention-3's
ping-pong) on top of v22's intra-warpgroup overlap. K/V stages are released by both consumers
(barrier count 2) and refilled by the producer.

Scope as v22: BSHD bf16/fp16, D in {64, 128}, S a multiple of 128, causal or not, GQA. Not wired
into kernelops.

    python benchmarks/gluon_fwd_ws.py --check --bench --out DIR
    PYTHONPATH=<triton 3.6> python benchmarks/gluon_fwd_ws.py --offline
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import gluon_fwd  # noqa: E402
from gluon_fwd import LOG2E, _descriptor, _softmax_block  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

ROWS = gl.constexpr(64)  # query rows per consumer warpgroup


@gluon.jit
def _turn_wait(turn_bars, wg: gl.constexpr, k):
    """Wait for consumer ``wg``'s ``k``-th turn to issue products (consumer 0 goes first)."""
    if wg == 0:
        mbarrier.wait(turn_bars.index(0), phase=(k & 1) ^ 1)
    else:
        mbarrier.wait(turn_bars.index(1), phase=k & 1)


@gluon.jit
def _turn_pass(turn_bars, wg: gl.constexpr):
    mbarrier.arrive(turn_bars.index(1 - wg), count=1)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, o_desc, Lse, qk_scale, seq, heads, group, q_smem, k_ring, v_ring, bars,
              CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """One warp: Q once, then K(j) and V(j) into their rings as the consumers free the stages."""
    q_bar, k_ready, k_empty, v_ready, v_empty, turn_bars = bars
    K_STAGES: gl.constexpr = k_ring.type.shape[0]
    V_STAGES: gl.constexpr = v_ring.type.shape[0]
    pid_m, b, h, n_blocks = _program(seq, heads, CAUSAL, BLOCK_N)
    q_row = b * seq + pid_m * 2 * ROWS
    kv_row = b * seq
    kv_col = (h // group) * HEAD_DIM
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    for wg in gl.static_range(2):
        tma.async_copy_global_to_shared(q_desc, [q_row + wg * ROWS, h * HEAD_DIM], q_bar, q_smem.index(wg))
    for j in range(n_blocks):
        ks = j % K_STAGES
        mbarrier.wait(k_empty.index(ks), phase=((j // K_STAGES) & 1) ^ 1)
        mbarrier.expect(k_ready.index(ks), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, kv_col], k_ready.index(ks), k_ring.index(ks))
        vs = j % V_STAGES
        mbarrier.wait(v_empty.index(vs), phase=((j // V_STAGES) & 1) ^ 1)
        mbarrier.expect(v_ready.index(vs), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, kv_col], v_ready.index(vs), v_ring.index(vs))


@gluon.jit
def _program(seq, heads, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr):
    """``(pid_m, b, h, n_blocks)`` of this program; causal programs take query blocks longest first."""
    pid_m = gl.program_id(0)
    if CAUSAL:
        pid_m = gl.num_programs(0) - 1 - pid_m
    bh = gl.program_id(1)
    if CAUSAL:
        n_blocks = gl.minimum((pid_m + 1) * 2 * ROWS, seq) // BLOCK_N
    else:
        n_blocks = seq // BLOCK_N
    return pid_m, bh // heads, bh % heads, n_blocks


@gluon.jit
def _consumer(q_desc, k_desc, v_desc, o_desc, Lse, qk_scale, seq, heads, group, q_smem, k_ring, v_ring, bars,
              CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, WG: gl.constexpr):
    """One warpgroup: query rows ``[WG * 64, WG * 64 + 64)`` of the program's 128; v22's loop with
    each turn's two products issued only when the other warpgroup has issued its own."""
    q_bar, k_ready, k_empty, v_ready, v_empty, turn_bars = bars
    K_STAGES: gl.constexpr = k_ring.type.shape[0]
    V_STAGES: gl.constexpr = v_ring.type.shape[0]
    dtype: gl.constexpr = q_desc.dtype
    pid_m, b, h, n_blocks = _program(seq, heads, CAUSAL, BLOCK_N)
    first_row = pid_m * 2 * ROWS + WG * ROWS

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    q_tile = q_smem.index(WG)
    rows = first_row + gl.arange(0, ROWS, layout=row_layout)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=row_layout)
    l_i = gl.zeros([ROWS], gl.float32, layout=row_layout)

    mbarrier.wait(q_bar, phase=0)
    mbarrier.wait(k_ready.index(0), phase=0)
    _turn_wait(turn_bars, WG, 0)
    s = warpgroup_mma(q_tile, k_ring.index(0).permute((1, 0)), gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout),
                      use_acc=False, is_async=True)
    _turn_pass(turn_bars, WG)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    mbarrier.arrive(k_empty.index(0), count=1)
    p, alpha, m_i, l_i = _softmax_block(s, m_i, l_i, qk_scale, rows, 0, first_row, CAUSAL, BLOCK_N, col_layout)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)
    for j in range(n_blocks - 1):
        ks = (j + 1) % K_STAGES
        mbarrier.wait(k_ready.index(ks), phase=((j + 1) // K_STAGES) & 1)
        vs = j % V_STAGES
        mbarrier.wait(v_ready.index(vs), phase=(j // V_STAGES) & 1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        _turn_wait(turn_bars, WG, j + 1)
        s_next = warpgroup_mma(q_tile, k_ring.index(ks).permute((1, 0)),
                               gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        acc = warpgroup_mma(p_op, v_ring.index(vs), acc, is_async=True)
        _turn_pass(turn_bars, WG)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_next, ))
        mbarrier.arrive(k_empty.index(ks), count=1)
        p, alpha, m_i, l_i = _softmax_block(s, m_i, l_i, qk_scale, rows, j + 1, first_row, CAUSAL, BLOCK_N,
                                            col_layout)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(v_empty.index(vs), count=1)
    last = n_blocks - 1
    vs = last % V_STAGES
    mbarrier.wait(v_ready.index(vs), phase=(last // V_STAGES) & 1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    _turn_wait(turn_bars, WG, n_blocks)
    acc = warpgroup_mma(p_op, v_ring.index(vs), acc, is_async=True)
    _turn_pass(turn_bars, WG)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(v_empty.index(vs), count=1)

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    out = acc / l_o[:, None]
    q_tile.store(out.to(dtype))  # this warpgroup's Q tile is no longer read: it stages the output
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b * seq + first_row, h * HEAD_DIM], q_tile)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453  # base 2 -> natural log
    gl.store(Lse + (b * heads + h) * seq + rows, lse)
    tma.store_wait(pendings=0)


@gluon.jit
def attention_fwd_ws_kernel(q_desc, k_desc, v_desc, o_desc, Lse, qk_scale, seq, heads, group,
                            CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                            K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                            num_warps: gl.constexpr):
    """q/o: ``[B * S, Hq * D]`` views (TMA blocks of 64 rows), k/v: ``[B * S, Hkv * D]`` views;
    Lse ``[B, Hq, S]`` float32. Grid ``(S // 128, B * Hq)``; ``num_warps`` must be 4 (the
    default partition is consumer 0; consumer 1 and the producer are workers)."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    k_ring = gl.allocate_shared_memory(dtype, [K_STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_ring = gl.allocate_shared_memory(dtype, [V_STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(K_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # both consumers release a stage
    for i in gl.static_range(V_STAGES):
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turn_bars.index(i), count=1)
    bars = (q_bar, k_ready, k_empty, v_ready, v_empty, turn_bars)
    # (tuples written out: a constexpr in a concatenated tuple reaches the partition as a tensor)
    gl.warp_specialize([
        (_consumer, (q_desc, k_desc, v_desc, o_desc, Lse, qk_scale, seq, heads, group, q_smem, k_ring, v_ring, bars,
                     CAUSAL, BLOCK_N, HEAD_DIM, 0)),
        (_consumer, (q_desc, k_desc, v_desc, o_desc, Lse, qk_scale, seq, heads, group, q_smem, k_ring, v_ring, bars,
                     CAUSAL, BLOCK_N, HEAD_DIM, 1)),
        (_producer, (q_desc, k_desc, v_desc, o_desc, Lse, qk_scale, seq, heads, group, q_smem, k_ring, v_ring, bars,
                     CAUSAL, BLOCK_N, HEAD_DIM)),
    ], [4, 1], [CONSUMER_REGS, 24])


def gluon_attention_fwd_ws(q, k, v, causal=False, block_n=128, k_stages=2, v_stages=2, consumer_regs=240,
                           maxnreg=168, warmup_only=False):
    """``q [B, S, Hq, D]``, ``k/v [B, S, Hkv, D]`` (contiguous, bf16/fp16, S % 128 == 0) ->
    ``(out [B, S, Hq, D], lse [B, Hq, S] float32)``."""
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    assert S % 128 == 0 and 128 % block_n == 0 and D in (64, 128) and Hq % Hkv == 0
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    out = torch.empty_like(q)
    lse = torch.empty((B, Hq, S), device=q.device, dtype=torch.float32)
    q_desc = _descriptor(q.view(B * S, Hq * D), [64, D])
    o_desc = _descriptor(out.view(B * S, Hq * D), [64, D])
    k_desc = _descriptor(k.view(B * S, Hkv * D), [block_n, D])
    v_desc = _descriptor(v.view(B * S, Hkv * D), [block_n, D])
    args = (q_desc, k_desc, v_desc, o_desc, lse, D ** -0.5 * LOG2E, S, Hq, Hq // Hkv)
    meta = dict(CAUSAL=causal, BLOCK_N=block_n, HEAD_DIM=D, K_STAGES=k_stages, V_STAGES=v_stages,
                CONSUMER_REGS=consumer_regs, num_warps=4, maxnreg=maxnreg)
    grid = (S // 128, B * Hq)
    if warmup_only:
        return attention_fwd_ws_kernel.warmup(*args, **meta, grid=grid)
    attention_fwd_ws_kernel[grid](*args, **meta)
    return out, lse


CONFIGS = [dict(k_stages=2, v_stages=2), dict(block_n=64, k_stages=3, v_stages=3)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--offline", action="store_true", help="compile for sm_90 only (no GPU needed)")
    p.add_argument("--check", action="store_true", help="compare with float64 SDPA on the GPU")
    p.add_argument("--bench", action="store_true", help="TFLOP/s beside v22, kernelops and cuDNN")
    p.add_argument("--out", help="where --bench writes <DEVICE>/gluon_fwd_ws.json")
    args = p.parse_args(argv)
    variants = {f"ws{i}": (gluon_attention_fwd_ws, cfg) for i, cfg in enumerate(CONFIGS)}
    if args.offline:
        return gluon_fwd.offline(variants)
    code = gluon_fwd.check(variants) if args.check else 0
    if args.bench and code == 0:
        variants["v22"] = (gluon_fwd.gluon_attention_fwd, gluon_fwd.CONFIGS[0])
        code = gluon_fwd.bench(args.out, variants, "gluon_fwd_ws.json")
    return code


if __name__ == "__main__":
    sys.exit(main())
