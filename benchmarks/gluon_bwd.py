"""Experiment (NOTES v24): the warp-specialised Hopper dK/dV kernel in Gluon
(kernels/flash_attention/bwd_ws.py, whose docstring describes it) against float64 and beside the
Triton dK/dV kernel, in its configurations: 64- or 32-query blocks, ring depth, ping-pong.

The Triton dK/dV kernel spills registers in every shipped config (NOTES, session 6 finding); the
Gluon kernel keeps K and V in shared memory: spill-free with 32-query blocks, 40-152 bytes of
spills at D=128 with 64-query blocks (Triton 3.6). Scope: BSHD bf16/fp16, D in {64, 128},
Sq == Sk a multiple of 128, causal or full, GQA. The library runs it through ``BwdParams.ws``.

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

from kernelops.kernels.flash_attention.bwd_ws import GLUON, TMA_REDUCE, flash_attention_bwd_dkdv_ws  # noqa: E402

assert GLUON, "needs a Triton with Gluon (3.6 or newer)"


def row_delta(out, dout):
    """``rowsum(dO * O)`` as ``[B, Hq, S]`` float32 (the backward's preprocess)."""
    return (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()


def gluon_dkdv(q, k, v, delta, dout, lse, causal=False, block_q=64, stages=2, pingpong=False, dq_mode=0,
               heads_first=False, warmup_only=False):
    """``q/dout [B, S, Hq, D]``, ``k/v [B, S, Hkv, D]`` (contiguous), ``lse [B, Hq, S]`` float32
    natural log, ``delta [B, Hq, S]`` (:func:`row_delta`) -> ``(dk, dv)`` like k/v, and with
    ``dq_mode`` 1/2 (v25, the fused dQ) ``(dk, dv, dq)``; with ``warmup_only`` the compiled kernel."""
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    scale = q.shape[-1] ** -0.5
    acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if dq_mode else None
    got = flash_attention_bwd_dkdv_ws(q, k, v, dout, lse, delta, dk, dv, softmax_scale=scale, causal=causal,
                                      block_q=block_q, stages=stages, pingpong=pingpong, dq_acc=acc, dq_mode=dq_mode,
                                      heads_first=heads_first, warmup_only=warmup_only)
    if warmup_only or not dq_mode:
        return got
    return dk, dv, (acc * scale).to(q.dtype)


# 32-query blocks: ~40 fewer registers (spill-free at D=128); ping-pong: the warpgroups take turns to issue;
# dq_mode (v25): dQ in the same kernel, by pointer atomics (1) or TMA reduce-add (2, Triton >= 3.9);
# heads_first: the grid walks heads first, so causal programs launch longest first across heads
CONFIGS = [dict(stages=2), dict(stages=3), dict(block_q=32, stages=3), dict(block_q=32, stages=3, pingpong=True),
           dict(stages=2, pingpong=True), dict(stages=2, dq_mode=1), dict(stages=2, pingpong=True, dq_mode=1),
           dict(stages=2, heads_first=True), dict(stages=2, pingpong=True, heads_first=True)]
if TMA_REDUCE:  # last, so the indices above are the same on every Triton
    CONFIGS += [dict(stages=2, dq_mode=2)]


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


def check(configs=None) -> int:
    """dK and dV (and dQ from the fused configs) against float64 autograd of materialised attention."""
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
        ref_dq, ref_dk, ref_dv = torch.autograd.grad(o, (qd, kd, vd), dout.double())
        for i, cfg in enumerate(CONFIGS):
            if configs is not None and i not in configs:
                continue
            got = gluon_dkdv(q, k, v, row_delta(out, dout), dout, lse, causal=causal, **cfg)
            errs = [((x.double() - r).norm() / r.norm()).item() for x, r in zip(got, (ref_dk, ref_dv, ref_dq))]
            worst = max(worst, *errs)
            print(f"B={B} S={S} H={Hq}/{Hkv} D={D} causal={int(causal)} {cfg}: dk rel err {errs[0]:.2e}, "
                  f"dv {errs[1]:.2e}" + (f", dq {errs[2]:.2e}" if len(errs) > 2 else ""), flush=True)
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


def bench(out_dir: str | None, dims=(64, 128), configs=None, groups=(2,)) -> int:
    """dK/dV kernel time, Gluon beside the Triton dK/dV kernel (device time from the profiler for
    both, same run), bf16, B*S = 16k tokens, H*D = 2048, plain at 4k and 16k and GQA at 16k (query
    heads per KV head in ``groups``); ``configs`` indexes :data:`CONFIGS` (all by default). Rows
    are written as they come."""
    import triton.testing

    from gluon_fwd import write_rows

    from kernelops import flash_attention
    from kernelops.modules.flash_attention_lowlevel import flash_attention_backward, get_optimal_block_sizes

    rows = []
    for D in dims:
        for causal in (False, True):
            for S, group in ((4096, 1), (16384, 1), *((16384, g) for g in groups)):
                B, H = max(1, 16384 // S), 2048 // D
                Hkv = H // group
                q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16)
                        for _ in range(2))
                out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
                dout = torch.randn_like(out)
                flops = 8 * B * H * S * S * D / (2 if causal else 1)  # dK/dV: 4 of the backward's 5 products
                delta = row_delta(out.detach(), dout)
                # the Triton kernels at the heuristic's tiles (explicit tiles keep the Gluon kernel out)
                tiles = get_optimal_block_sizes(S, D, causal=causal, num_heads=H, num_kv_heads=Hkv).bwd_params
                triton_ms = _kernel_times(lambda: flash_attention_backward(  # noqa: B023
                    q, k, v, out, dout, lse, causal=causal, block_q=tiles.q_blocksize, block_kv=tiles.kv_blocksize,
                    num_warps=tiles.num_warps, num_stages=tiles.num_stages), ("dkdv", "bwd_dq"))
                # the library's backward as a default call runs it (the ws rule, then the dQ kernel)
                lib_ms = _kernel_times(lambda: flash_attention_backward(q, k, v, out, dout, lse, causal=causal),  # noqa: B023
                                       ("dkdv_ws", "bwd_dq"))
                row = {"D": D, "causal": causal, "S": S, "B": B, "H": H, "Hkv": Hkv,
                       "triton_dkdv_ms": triton_ms.get("dkdv"), "triton_dq_ms": triton_ms.get("bwd_dq"),
                       "lib_dkdv_ws_ms": lib_ms.get("dkdv_ws"), "lib_dq_ms": lib_ms.get("bwd_dq")}
                for i, cfg in enumerate(CONFIGS):
                    if configs is not None and i not in configs:
                        continue
                    fn = lambda cfg=cfg: gluon_dkdv(q.detach(), k.detach(), v.detach(), delta, dout, lse,  # noqa: E731
                                                    causal=causal, **cfg)
                    # device time from the profiler, as for the Triton kernel (do_bench also counts host time)
                    # with dq_mode the kernel also computes dQ: compare it with lib_dkdv_ws_ms + lib_dq_ms
                    row[f"gluon{i}_ms"] = _kernel_times(fn, ("dkdv_ws",)).get("dkdv_ws")
                    products = 5 / 4 if cfg.get("dq_mode") else 1  # the fused kernel does all five products
                    row[f"gluon{i}_tflops"] = flops * products / row[f"gluon{i}_ms"] / 1e9
                    row[f"gluon{i}_do_bench_ms"] = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                if row["triton_dkdv_ms"]:
                    row["triton_dkdv_tflops"] = flops / row["triton_dkdv_ms"] / 1e9
                rows.append(row)
                print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
                write_rows(out_dir, "gluon_bwd.json", rows)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--offline", action="store_true", help="compile for sm_90 only (no GPU needed)")
    p.add_argument("--check", action="store_true", help="dK, dV against float64 on the GPU")
    p.add_argument("--bench", action="store_true", help="dK/dV kernel time beside the Triton kernel")
    p.add_argument("--out", help="where --bench writes <DEVICE>/gluon_bwd.json")
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--configs", type=int, nargs="+", help="indices into CONFIGS to check and time (default: all)")
    p.add_argument("--groups", type=int, nargs="+", default=[2], help="GQA groups of the 16k rows")
    args = p.parse_args(argv)
    if args.offline:
        return offline()
    code = check(args.configs) if args.check else 0
    if args.bench and code == 0:
        code = bench(args.out, args.dims, args.configs, args.groups)
    return code


if __name__ == "__main__":
    sys.exit(main())
