"""Experiment (NOTES v24, prepared without a GPU): a warp-specialised Hopper dK/dV kernel in Gluon.

The Triton dK/dV kernel spills registers in every shipped config (NOTES, session 6 finding): it
holds K and V in registers as the A operands of S^T = K Q^T and dP^T = V dO^T beside the two
float32 accumulators. Here K and V stay in shared memory (warpgroup MMAs read A from there), so a
thread holds dK and dV (64 + 64 registers at D=128), the two score tiles and their 16-bit copies:
spill-free with 32-query blocks; with 64-query blocks D=128 still spills 40-152 bytes (Triton 3.6).

Structure (as the forward of kernels/flash_attention/fwd_ws.py): one program per 128 keys of one
(batch, KV head); two consumer warpgroups of 64 keys each and a one-warp producer that loads K/V
once and streams Q(j) and dO(j) blocks of 32 or 64 queries, for every query head of the GQA group, into
rings whose stages both consumers release. Per block a consumer issues S^T and dP^T asynchronously,
waits for S^T, forms P^T = exp2(S^T - lse) while dP^T runs, issues dV += P^T dO, waits for dP^T,
forms dS^T = P^T (dP^T - delta), issues dK += dS^T Q and waits for everything before the next
block (no group in flight across the loop's back edge). Causal blocks start at the first query
block that sees a key of the program. dQ is left to the Triton dQ kernel, which does not spill.
``pingpong`` configs make the two warpgroups take turns at each of the three issue points (v23's
scheme), so one's elementwise work overlaps the other's products.

Scope: BSHD bf16/fp16, D in {64, 128}, Sq == Sk a multiple of 128, causal or full, GQA. Not wired
into kernelops.

    python benchmarks/gluon_bwd.py --check --bench --out DIR
    PYTHONPATH=<triton 3.6> python benchmarks/gluon_bwd.py --offline
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from kernelops.kernels.flash_attention.fwd_ws import (  # noqa: E402
    GLUON, LOG2E, _descriptor, _tma_load, _tma_store, _turn_pass, _turn_wait, fence_async_shared, gl, gluon, mbarrier,
    tma, warpgroup_mma, warpgroup_mma_wait)

assert GLUON, "needs a Triton with Gluon (3.6 or newer)"

KEYS = gl.constexpr(64)  # keys per consumer warpgroup
LOG2E_K = gl.constexpr(LOG2E)


@gluon.jit
def _blocks(seq, CAUSAL: gl.constexpr, QROWS: gl.constexpr):
    """``(pid_n, first query block, query blocks)`` of this program (128 keys)."""
    pid_n = gl.program_id(0)
    if CAUSAL:
        j0 = pid_n * 2 * KEYS // QROWS  # earlier queries see none of these keys
    else:
        j0 = pid_n * 0
    return pid_n, j0, seq // QROWS


@gluon.jit
def _producer(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads, group,
              k_smem, v_smem, q_ring, do_ring, bars, CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr,
              PINGPONG: gl.constexpr):
    kv_bar, q_ready, q_empty, do_ready, do_empty, turn_bars = bars
    STAGES: gl.constexpr = q_ring.type.shape[0]
    QROWS: gl.constexpr = q_ring.type.shape[1]  # queries per streamed block
    pid_n, j0, nq = _blocks(seq, CAUSAL, QROWS)
    bh = gl.program_id(1)
    b = bh // (heads // group)
    hk = bh % (heads // group)
    mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
    for w in gl.static_range(2):
        _tma_load(k_desc, [b * seq + pid_n * 2 * KEYS + w * KEYS, hk * HEAD_DIM], kv_bar, k_smem.index(w))
        _tma_load(v_desc, [b * seq + pid_n * 2 * KEYS + w * KEYS, hk * HEAD_DIM], kv_bar, v_smem.index(w))
    it = 0
    for g in range(group):
        h = hk * group + g
        for j in range(j0, nq):
            s = it % STAGES
            phase = ((it // STAGES) & 1) ^ 1
            mbarrier.wait(q_empty.index(s), phase=phase)
            mbarrier.expect(q_ready.index(s), q_desc.block_type.nbytes)
            _tma_load(q_desc, [b * seq + j * QROWS, h * HEAD_DIM], q_ready.index(s), q_ring.index(s))
            mbarrier.wait(do_empty.index(s), phase=phase)
            mbarrier.expect(do_ready.index(s), do_desc.block_type.nbytes)
            _tma_load(do_desc, [b * seq + j * QROWS, h * HEAD_DIM], do_ready.index(s), do_ring.index(s))
            it += 1


@gluon.jit
def _consumer(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads, group,
              k_smem, v_smem, q_ring, do_ring, bars, CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr,
              PINGPONG: gl.constexpr, WG: gl.constexpr):
    """Keys ``[WG * 64, WG * 64 + 64)`` of the program's 128: dK and dV over every query head of
    the group and every query block that sees them."""
    kv_bar, q_ready, q_empty, do_ready, do_empty, turn_bars = bars
    STAGES: gl.constexpr = q_ring.type.shape[0]
    QROWS: gl.constexpr = q_ring.type.shape[1]  # queries per streamed block
    dtype: gl.constexpr = q_desc.dtype
    pid_n, j0, nq = _blocks(seq, CAUSAL, QROWS)
    bh = gl.program_id(1)
    b = bh // (heads // group)
    hk = bh % (heads // group)
    first_key = pid_n * 2 * KEYS + WG * KEYS

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, QROWS, 16])
    d_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
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
    for g in range(group):
        h = hk * group + g
        row_base = (b * heads + h) * seq
        for j in range(j0, nq):
            s = it % STAGES
            phase = (it // STAGES) & 1
            queries = j * QROWS + gl.arange(0, QROWS, layout=query_layout)
            mbarrier.wait(q_ready.index(s), phase=phase)
            mbarrier.wait(do_ready.index(s), phase=phase)
            q_tile = q_ring.index(s)
            do_tile = do_ring.index(s)
            if PINGPONG:  # three turns per block, one per issue point: strict alternation of the warpgroups
                _turn_wait(turn_bars, WG, 3 * it)
            st = warpgroup_mma(k_tile, q_tile.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            dpt = warpgroup_mma(v_tile, do_tile.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
            if PINGPONG:
                _turn_pass(turn_bars, WG)
            lse = gl.load(Lse + row_base + queries) * LOG2E_K  # natural log -> log2 units
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
            pt = gl.exp2(st * qk_scale - lse[None, :])
            if CAUSAL:
                if first_key + KEYS - 1 > j * QROWS:  # a key after some query of the block
                    pt = gl.where(keys[:, None] <= queries[None, :], pt, 0.0)
            if PINGPONG:
                _turn_wait(turn_bars, WG, 3 * it + 1)
            dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), a_layout), do_tile, dv, is_async=True)
            if PINGPONG:
                _turn_pass(turn_bars, WG)
            dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, ))
            delta = gl.load(Delta + row_base + queries)  # loaded late: fewer live registers
            dst = pt * (dpt - delta[None, :])
            if PINGPONG:
                _turn_wait(turn_bars, WG, 3 * it + 2)
            dk = warpgroup_mma(gl.convert_layout(dst.to(dtype), a_layout), q_tile, dk, is_async=True)
            if PINGPONG:
                _turn_pass(turn_bars, WG)
            dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
            mbarrier.arrive(q_empty.index(s), count=1)
            mbarrier.arrive(do_empty.index(s), count=1)
            it += 1

    # K and V of this warpgroup are no longer read: their tiles stage dK and dV
    k_tile.store((dk * sm_scale).to(dtype))
    v_tile.store(dv.to(dtype))
    fence_async_shared()
    row = b * seq + first_key
    _tma_store(dk_desc, [row, hk * HEAD_DIM], k_tile)
    _tma_store(dv_desc, [row, hk * HEAD_DIM], v_tile)
    tma.store_wait(pendings=0)


@gluon.jit
def dkdv_ws_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads,
                   group, CAUSAL: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                   PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """q/do ``[B * S, Hq * D]`` row views (TMA blocks of 32 or 64 queries), k/v/dk/dv ``[B * S, Hkv * D]``
    (blocks of 64 keys);
    Lse / Delta ``[B, Hq, S]`` float32 (natural-log lse; delta = rowsum(dO * O)). Grid
    ``(S // 128, B * Hkv)``, ``num_warps`` 4."""
    dtype: gl.constexpr = q_desc.dtype
    QROWS: gl.constexpr = q_desc.block_type.shape[0]
    k_smem = gl.allocate_shared_memory(dtype, [2, KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, KEYS, HEAD_DIM], v_desc.layout)
    q_ring = gl.allocate_shared_memory(dtype, [STAGES, QROWS, HEAD_DIM], q_desc.layout)
    do_ring = gl.allocate_shared_memory(dtype, [STAGES, QROWS, HEAD_DIM], do_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(turn_bars.index(i), count=1)
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(do_empty.index(i), count=2)
    bars = (kv_bar, q_ready, q_empty, do_ready, do_empty, turn_bars)
    gl.warp_specialize([
        (_consumer, (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads,
                     group, k_smem, v_smem, q_ring, do_ring, bars, CAUSAL, HEAD_DIM, PINGPONG, 0)),
        (_consumer, (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads,
                     group, k_smem, v_smem, q_ring, do_ring, bars, CAUSAL, HEAD_DIM, PINGPONG, 1)),
        (_producer, (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, Lse, Delta, qk_scale, sm_scale, seq, heads,
                     group, k_smem, v_smem, q_ring, do_ring, bars, CAUSAL, HEAD_DIM, PINGPONG)),
    ], [4, 1], [CONSUMER_REGS, 24])


def row_delta(out, dout):
    """``rowsum(dO * O)`` as ``[B, Hq, S]`` float32 (the backward's preprocess)."""
    return (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()


def gluon_dkdv(q, k, v, delta, dout, lse, causal=False, block_q=64, stages=2, pingpong=False, consumer_regs=240,
               maxnreg=168, warmup_only=False):
    """``q/dout [B, S, Hq, D]``, ``k/v [B, S, Hkv, D]`` (contiguous), ``lse [B, Hq, S]`` float32
    natural log, ``delta [B, Hq, S]`` (:func:`row_delta`) -> ``(dk, dv)`` like k/v."""
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    assert S % 128 == 0 and D in (64, 128) and Hq % Hkv == 0 and k.shape[1] == S
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    args = (_descriptor(q, block_q), _descriptor(k, 64), _descriptor(v, 64), _descriptor(dout, block_q),
            _descriptor(dk, 64), _descriptor(dv, 64), lse, delta, D ** -0.5 * LOG2E,
            D ** -0.5, S, Hq, Hq // Hkv)
    meta = dict(CAUSAL=causal, HEAD_DIM=D, STAGES=stages, PINGPONG=pingpong, CONSUMER_REGS=consumer_regs, num_warps=4,
                maxnreg=maxnreg)
    grid = (S // 128, B * Hkv)
    if warmup_only:
        return dkdv_ws_kernel.warmup(*args, **meta, grid=grid)
    dkdv_ws_kernel[grid](*args, **meta)
    return dk, dv


# 32-query blocks: ~40 fewer registers (spill-free at D=128); ping-pong: the warpgroups take turns to issue
CONFIGS = [dict(stages=2), dict(stages=3), dict(block_q=32, stages=3), dict(block_q=32, stages=3, pingpong=True),
           dict(stages=2, pingpong=True)]


def offline() -> int:
    from kernelops.kernels.common import offline_compile

    offline_compile.install()
    for D in (64, 128):
        for causal in (False, True):
            for cfg in CONFIGS:
                q = torch.empty(1, 256, 4, D, dtype=torch.bfloat16)
                kv = torch.empty(1, 256, 2, D, dtype=torch.bfloat16)
                stats = torch.empty(1, 4, 256)
                compiled = gluon_dkdv(q, kv, kv, stats, q, stats, causal=causal, warmup_only=True, **cfg)
                print(f"D={D} causal={int(causal)} {cfg}: {offline_compile.resources(compiled)}", flush=True)
    return 0


def check() -> int:
    """dK and dV against float64 autograd of materialised attention."""
    from kernelops import flash_attention

    worst = 0.0
    for B, S, Hq, Hkv, D, causal in [(2, 256, 4, 4, 128, False), (2, 256, 4, 4, 128, True), (1, 512, 8, 2, 64, True),
                                     (1, 384, 2, 1, 128, False), (1, 128, 2, 2, 64, True)]:
        q = torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
        dout = torch.randn_like(out)
        qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
        rep = Hq // Hkv
        s = torch.einsum("bqhd,bkhd->bhqk", qd, kd.repeat_interleave(rep, 2)) * D ** -0.5
        if causal:
            s = s.masked_fill(torch.ones(S, S, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), vd.repeat_interleave(rep, 2))
        ref_dk, ref_dv = torch.autograd.grad(o, (kd, vd), dout.double())
        for cfg in CONFIGS:
            dk, dv = gluon_dkdv(q, k, v, row_delta(out, dout), dout, lse, causal=causal, **cfg)
            errs = [((x.double() - r).norm() / r.norm()).item() for x, r in ((dk, ref_dk), (dv, ref_dv))]
            worst = max(worst, *errs)
            print(f"B={B} S={S} H={Hq}/{Hkv} D={D} causal={int(causal)} {cfg}: dk rel err {errs[0]:.2e}, "
                  f"dv {errs[1]:.2e}", flush=True)
    ok = worst < 2e-2
    print("check:", "ok" if ok else "FAILED")
    return 0 if ok else 1


def _kernel_times(fn, names=("dkdv",)) -> dict:
    """CUDA time per call (ms) of the kernels whose names contain each of ``names``, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    out = {}
    for event in prof.key_averages():
        for name in names:
            if name in event.key:
                out[name] = out.get(name, 0.0) + event.device_time_total / 1e3 / 10  # us -> ms per call
    return out


def bench(out_dir: str | None) -> int:
    """dK/dV kernel time, Gluon beside the Triton dK/dV kernel (device time from the profiler for
    both, same run), bf16, B*S = 16k tokens, H*D = 2048, plain and GQA (group 2)."""
    import triton.testing

    from kernelops import flash_attention

    rows = []
    for D in (64, 128):
        for causal in (False, True):
            for S, Hkv in ((4096, None), (16384, None), (16384, 8 * 128 // D)):
                B, H = max(1, 16384 // S), 2048 // D
                Hkv = Hkv or H
                q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                        for _ in range(2))
                out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
                dout = torch.randn_like(out)
                flops = 8 * B * H * S * S * D / (2 if causal else 1)  # dK/dV: 4 of the backward's 5 products
                delta = row_delta(out.detach(), dout)
                triton_ms = _kernel_times(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
                row = {"D": D, "causal": causal, "S": S, "B": B, "H": H, "Hkv": Hkv,
                       "triton_dkdv_ms": triton_ms.get("dkdv")}
                for i, cfg in enumerate(CONFIGS):
                    fn = lambda cfg=cfg: gluon_dkdv(q.detach(), k.detach(), v.detach(), delta, dout, lse,  # noqa: E731
                                                    causal=causal, **cfg)
                    # device time from the profiler, as for the Triton kernel (do_bench also counts host time)
                    row[f"gluon{i}_ms"] = _kernel_times(fn, ("dkdv_ws",)).get("dkdv_ws")
                    row[f"gluon{i}_tflops"] = flops / row[f"gluon{i}_ms"] / 1e9
                    row[f"gluon{i}_do_bench_ms"] = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                if row["triton_dkdv_ms"]:
                    row["triton_dkdv_tflops"] = flops / row["triton_dkdv_ms"] / 1e9
                rows.append(row)
                print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
    from gluon_fwd import write_rows

    write_rows(out_dir, "gluon_bwd.json", rows)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--offline", action="store_true", help="compile for sm_90 only (no GPU needed)")
    p.add_argument("--check", action="store_true", help="dK, dV against float64 on the GPU")
    p.add_argument("--bench", action="store_true", help="dK/dV kernel time beside the Triton kernel")
    p.add_argument("--out", help="where --bench writes <DEVICE>/gluon_bwd.json")
    args = p.parse_args(argv)
    if args.offline:
        return offline()
    code = check() if args.check else 0
    if args.bench and code == 0:
        code = bench(args.out)
    return code


if __name__ == "__main__":
    sys.exit(main())
