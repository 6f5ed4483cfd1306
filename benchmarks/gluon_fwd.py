"""Experiment (NOTES v22): a Hopper attention forward in Gluon that keeps Q K^T in flight across the softmax.

Plain Triton does not keep the next block's scores (an asynchronous warpgroup MMA) in flight
while the softmax of the current block runs (NOTES v17). Gluon exposes the asynchronous MMA and
its wait directly, so each iteration here issues S(j+1) = Q K(j+1)^T and O += P(j) V(j), waits
only for S(j+1), and computes the softmax of S(j+1) while P(j) V(j) runs (FlashAttention-3's
intra-warpgroup overlap). No MMA group stays in flight across the loop's back edge: ptxas
serialises every wgmma of a kernel where one does (C7514). K and V arrive by TMA into rings of
shared-memory stages, each with its own barrier; a K stage is refilled as soon as its scores are
done, a V stage once its P V is.

Scope of this first version: BSHD bf16/fp16, D in {64, 128}, S a multiple of 128, causal or
not, GQA; one program per (128-query block, batch * head), 8 warps (two warpgroups of 64 rows).
It is not wired into kernelops: `--check` compares it with torch SDPA on the GPU, `--bench`
times it beside kernelops and cuDNN, `--offline` only compiles it for sm_90 (no GPU needed;
kernels/common/offline_compile.py).

    python benchmarks/gluon_fwd.py --check --bench
    PYTHONPATH=<triton 3.6> python benchmarks/gluon_fwd.py --offline
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

# the library kernel's softmax (since NOTES v33 its row maximum is over the raw scores), not v22's
from kernelops.kernels.flash_attention.fwd_ws import softmax_block as _softmax_block  # noqa: E402

LOG2E = 1.4426950408889634


@gluon.jit
def _issue_kv(desc, ring, bars, block, row0, col, STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
    """TMA-load key block ``block`` (rows ``row0 + block * BLOCK_N``) into its ring stage."""
    stage = block % STAGES
    bar = bars.index(stage)
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [row0 + block * BLOCK_N, col], bar, ring.index(stage))


@gluon.jit
def _wait_kv(bars, block, STAGES: gl.constexpr):
    mbarrier.wait(bars.index(block % STAGES), phase=(block // STAGES) & 1)


@gluon.jit
def _issue_pv(acc, p, alpha, v_ring, v_bars, j, dtype: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr,
              V_STAGES: gl.constexpr):
    """Rescale the (waited) accumulator and issue O += P V(j) asynchronously, P from registers."""
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    _wait_kv(v_bars, j, V_STAGES)
    return warpgroup_mma(p_op, v_ring.index(j % V_STAGES), acc, is_async=True)


@gluon.jit
def attention_fwd_kernel(q_desc, k_desc, v_desc, o_desc, Lse, qk_scale, seq, heads, group,
                         CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         HEAD_DIM: gl.constexpr, K_STAGES: gl.constexpr, V_STAGES: gl.constexpr,
                         num_warps: gl.constexpr):
    """q/o: ``[B * S, Hq * D]`` views, k/v: ``[B * S, Hkv * D]`` views (BSHD, contiguous);
    Lse ``[B, Hq, S]`` float32 (natural log). Grid ``(S // BLOCK_M, B * Hq)``; causal programs
    take their query blocks longest first."""
    num_m = gl.num_programs(0)
    pid_m = gl.program_id(0)
    if CAUSAL:
        pid_m = num_m - 1 - pid_m
    bh = gl.program_id(1)
    b = bh // heads
    h = bh % heads
    q_row = b * seq + pid_m * BLOCK_M
    kv_row = b * seq
    q_col = h * HEAD_DIM
    kv_col = (h // group) * HEAD_DIM
    if CAUSAL:
        n_blocks = gl.minimum((pid_m + 1) * BLOCK_M, seq) // BLOCK_N
    else:
        n_blocks = seq // BLOCK_N

    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_ring = gl.allocate_shared_memory(dtype, [K_STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_ring = gl.allocate_shared_memory(dtype, [V_STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(K_STAGES):
        mbarrier.init(k_bars.index(i), count=1)
    for i in gl.static_range(V_STAGES):
        mbarrier.init(v_bars.index(i), count=1)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, q_col], q_bar, q_smem)
    for i in gl.static_range(K_STAGES):
        if i < n_blocks:
            _issue_kv(k_desc, k_ring, k_bars, i, kv_row, kv_col, K_STAGES, BLOCK_N)
    for i in gl.static_range(V_STAGES):
        if i < n_blocks:
            _issue_kv(v_desc, v_ring, v_bars, i, kv_row, kv_col, V_STAGES, BLOCK_N)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)

    mbarrier.wait(q_bar, phase=0)
    _wait_kv(k_bars, 0, K_STAGES)
    s = warpgroup_mma(q_smem, k_ring.index(0).permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                      use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    # K block 0 is read: its stage takes block K_STAGES
    if K_STAGES < n_blocks:
        _issue_kv(k_desc, k_ring, k_bars, K_STAGES, kv_row, kv_col, K_STAGES, BLOCK_N)

    # FlashAttention-3's order: P V(j) runs on the tensor cores while the softmax of S(j+1) runs; no
    # MMA group is left in flight across the loop's back edge (ptxas would serialise every wgmma)
    p, alpha, m_i, l_i = _softmax_block(s, m_i, l_i, qk_scale, rows, 0, pid_m * BLOCK_M, 0, 0, 0, CAUSAL, False,
                                        BLOCK_N, col_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    for j in range(n_blocks - 1):
        _wait_kv(k_bars, j + 1, K_STAGES)
        s_next = warpgroup_mma(q_smem, k_ring.index((j + 1) % K_STAGES).permute((1, 0)),
                               gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        acc = _issue_pv(acc, p, alpha, v_ring, v_bars, j, dtype, o_layout, p_layout, V_STAGES)
        # S(j+1) is done (P V(j) may still run): its K stage takes block j + 1 + K_STAGES
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_next, ))
        if j + 1 + K_STAGES < n_blocks:
            _issue_kv(k_desc, k_ring, k_bars, j + 1 + K_STAGES, kv_row, kv_col, K_STAGES, BLOCK_N)
        p, alpha, m_i, l_i = _softmax_block(s, m_i, l_i, qk_scale, rows, j + 1, pid_m * BLOCK_M, 0, 0, 0, CAUSAL,
                                            False, BLOCK_N, col_layout)
        # P V(j) is done: its V stage takes block j + V_STAGES
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        if j + V_STAGES < n_blocks:
            _issue_kv(v_desc, v_ring, v_bars, j + V_STAGES, kv_row, kv_col, V_STAGES, BLOCK_N)
    acc = _issue_pv(acc, p, alpha, v_ring, v_bars, n_blocks - 1, dtype, o_layout, p_layout, V_STAGES)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(K_STAGES):
        mbarrier.invalidate(k_bars.index(i))
    for i in gl.static_range(V_STAGES):
        mbarrier.invalidate(v_bars.index(i))

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    out = acc / l_o[:, None]
    q_smem.store(out.to(dtype))  # Q is no longer read: its tile stages the output
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row, q_col], q_smem)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453  # base 2 -> natural log
    gl.store(Lse + bh * seq + rows, lse)
    tma.store_wait(pendings=0)


def _descriptor(t2d: torch.Tensor, block: list[int]):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16 if t2d.dtype == torch.bfloat16 else gl.float16)
    return TensorDescriptor(t2d, list(t2d.shape), list(t2d.stride()), block, layout)


def gluon_attention_fwd(q, k, v, causal=False, block_m=128, block_n=128, k_stages=2, v_stages=2, num_warps=8,
                        warmup_only=False):
    """``q [B, S, Hq, D]``, ``k/v [B, S, Hkv, D]`` (contiguous, bf16/fp16, S % 128 == 0) ->
    ``(out [B, S, Hq, D], lse [B, Hq, S] float32)``."""
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    assert S % block_m == 0 and S % block_n == 0 and block_m % block_n == 0 and D in (64, 128) and Hq % Hkv == 0
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    out = torch.empty_like(q)
    lse = torch.empty((B, Hq, S), device=q.device, dtype=torch.float32)
    q_desc = _descriptor(q.view(B * S, Hq * D), [block_m, D])
    o_desc = _descriptor(out.view(B * S, Hq * D), [block_m, D])
    k_desc = _descriptor(k.view(B * S, Hkv * D), [block_n, D])
    v_desc = _descriptor(v.view(B * S, Hkv * D), [block_n, D])
    args = (q_desc, k_desc, v_desc, o_desc, lse, D ** -0.5 * LOG2E, S, Hq, Hq // Hkv)
    meta = dict(CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=D, K_STAGES=k_stages, V_STAGES=v_stages,
                num_warps=num_warps)
    grid = (S // block_m, B * Hq)
    if warmup_only:
        return attention_fwd_kernel.warmup(*args, **meta, grid=grid)
    attention_fwd_kernel[grid](*args, **meta)
    return out, lse


CONFIGS = [dict(k_stages=2, v_stages=2), dict(k_stages=2, v_stages=3),
           dict(block_n=64, k_stages=3, v_stages=3)]  # narrower score tiles: fewer registers, more iterations


def offline(variants) -> int:
    """Compile every variant (``{name: (launcher, config)}``) for sm_90 without a GPU; print
    registers, spills and shared memory."""
    from kernelops.kernels.common import offline_compile

    offline_compile.install()
    for D in (64, 128):
        for causal in (False, True):
            for name, (launch, cfg) in variants.items():
                q = torch.empty(1, 256, 2, D, dtype=torch.bfloat16)
                compiled = launch(q, q, q, causal=causal, warmup_only=True, **cfg)
                print(f"D={D} causal={int(causal)} {name} {cfg}: {offline_compile.resources(compiled)}", flush=True)
    return 0


def check(variants) -> int:
    """Each variant against float64 SDPA on small shapes (GQA, causal, one-block sequences)."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    worst = 0.0
    for B, S, Hq, Hkv, D, causal in [(2, 512, 4, 4, 128, False), (2, 512, 4, 4, 128, True), (1, 1024, 8, 2, 64, True),
                                     (1, 384, 2, 1, 128, False), (1, 128, 2, 2, 64, True)]:
        q = torch.randn(B, S, Hq, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
        ref = sdpa(qd, kd, vd, is_causal=causal, enable_gqa=Hq != Hkv).transpose(1, 2)
        scores = (qd @ kd.repeat_interleave(Hq // Hkv, 1).transpose(-1, -2)) * D ** -0.5
        if causal:
            scores = scores.masked_fill(torch.ones(S, S, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
        ref_lse = scores.logsumexp(-1)
        for name, (launch, cfg) in variants.items():
            out, lse = launch(q, k, v, causal=causal, **cfg)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            lse_err = (lse.double() - ref_lse).abs().max().item()
            worst = max(worst, err, lse_err / 10)  # lse in natural-log units: 1e-1 fails
            print(f"B={B} S={S} H={Hq}/{Hkv} D={D} causal={int(causal)} {name}: rel err {err:.2e}, "
                  f"lse max err {lse_err:.2e}", flush=True)
    ok = worst < 1e-2
    print("check:", "ok" if ok else "FAILED")
    return 0 if ok else 1


def bench(out_dir: str | None, variants, filename: str) -> int:
    """TFLOP/s of each variant beside kernelops and cuDNN SDPA in one run (bf16, B*S = 16k tokens,
    H*D = 2048); writes ``<out_dir>/<DEVICE>/<filename>``."""
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from kernelops import flash_attention

    rows = []
    for D in (64, 128):
        for causal in (False, True):
            for S in (1024, 4096, 16384):
                B, H = max(1, 16384 // S), 2048 // D
                q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                flops = 4 * B * H * S * S * D / (2 if causal else 1)

                def cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return sdpa(qt, kt, vt, is_causal=causal)

                fns = {"kernelops": lambda: flash_attention(q, k, v, causal=causal), "cudnn": cudnn}
                for name, (launch, cfg) in variants.items():
                    fns[name] = lambda launch=launch, cfg=cfg: launch(q, k, v, causal=causal, **cfg)
                row = {"D": D, "causal": causal, "S": S, "B": B, "H": H}
                for name, fn in fns.items():
                    fn()
                    ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                    row[name] = flops / ms / 1e9
                rows.append(row)
                print_row(row, digits=1)
    write_rows(out_dir, filename, rows)
    return 0


def print_row(row: dict, digits: int = 3, skip: tuple = ()) -> None:
    """One measured row on one line, ``key=value`` with floats to ``digits`` places, without ``skip`` keys."""
    print(" ".join(f"{k}={v:.{digits}f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                   if k not in skip), flush=True)


def write_rows(out_dir: str | None, filename: str, rows: list) -> None:
    """``<out_dir>/<DEVICE>/<filename>``: the torch version and the measured rows (nothing without ``out_dir``)."""
    import json

    if out_dir:
        from kernelops.ops.device import device_info

        path = pathlib.Path(out_dir) / device_info("cuda").name
        path.mkdir(parents=True, exist_ok=True)
        (path / filename).write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))


def run(argv, description: str, variants: dict, filename: str, bench_only: dict | None = None) -> int:
    """The command line shared by the Gluon experiments: ``--offline`` / ``--check`` / ``--bench``
    over ``variants`` (``{name: (launcher, config)}``; ``bench_only`` variants join the timing)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--offline", action="store_true", help="compile for sm_90 only (no GPU needed)")
    p.add_argument("--check", action="store_true", help="compare with float64 SDPA on the GPU")
    p.add_argument("--bench", action="store_true", help="TFLOP/s beside kernelops and cuDNN (bf16, 16k tokens)")
    p.add_argument("--out", help=f"where --bench writes <DEVICE>/{filename}")
    args = p.parse_args(argv)
    if args.offline:
        return offline(variants)
    code = check(variants) if args.check else 0
    if args.bench and code == 0:
        code = bench(args.out, {**variants, **(bench_only or {})}, filename)
    return code


def main(argv=None) -> int:
    return run(argv, __doc__.splitlines()[0], {f"gluon{i}": (gluon_attention_fwd, cfg) for i, cfg in enumerate(CONFIGS)},
               "gluon_fwd.json")


if __name__ == "__main__":
    sys.exit(main())
