"""Experiment (NOTES v24): the warp-specialised Hopper dK/dV kernel in Gluon
(kernels/flash_attention/bwd_ws.py, whose docstring describes it) against float64 and beside the
Triton dK/dV kernel, in its configurations: 64- or 32-query blocks, ring depth, ping-pong, grid
order; with ``--windows`` also causal sliding-window rows.

The Triton dK/dV kernel spills registers in every shipped config (NOTES, session 6 finding); the
Gluon kernel keeps K and V in shared memory: spill-free with 32-query blocks, 40-152 bytes of
spills at D=128 with 64-query blocks (Triton 3.6). Scope: BSHD bf16/fp16, D in {64, 128},
Sq == Sk a multiple of 128, causal (with or without a left window) or full, GQA. The library runs it through ``BwdParams.ws``.

    python benchmarks/gluon_bwd.py --check --bench --out DIR [--configs s2 s2hf] [--windows 4096]
    PYTHONPATH=<triton 3.6> python benchmarks/gluon_bwd.py --offline
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from kernelops.kernels.flash_attention.bwd_ws import GLUON, flash_attention_bwd_dkdv_ws  # noqa: E402

assert GLUON, "needs a Triton with Gluon (3.6 or newer)"


def row_delta(out, dout):
    """``rowsum(dO * O)`` as ``[B, Hq, S]`` float32 (the backward's preprocess)."""
    return (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()


def gluon_dkdv(q, k, v, delta, dout, lse, causal=False, block_q=64, stages=2, pingpong=False, chunk=1,
               win_left=None, warmup_only=False):
    """``q/dout [B, S, Hq, D]``, ``k/v [B, S, Hkv, D]`` (contiguous), ``lse [B, Hq, S]`` float32
    natural log, ``delta [B, Hq, S]`` (:func:`row_delta`) -> ``(dk, dv)`` like k/v; with
    ``warmup_only`` the compiled kernel."""
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    return flash_attention_bwd_dkdv_ws(q, k, v, dout, lse, delta, dk, dv, softmax_scale=q.shape[-1] ** -0.5,
                                       causal=causal, block_q=block_q, stages=stages, pingpong=pingpong,
                                       chunk=chunk, win_left=win_left, warmup_only=warmup_only)


# 32-query blocks: ~40 fewer registers (spill-free at D=128); pp (ping-pong): the warpgroups take turns
# to issue; hf (heads first): the launch order takes every head's first key block, then every head's
# second (bwd_ws.launch_order with one chunk of all heads), so causal programs launch longest first. Rows name their columns gluon_<name>_*. (Session 8's
# fused dQ, dQ added by atomics from this kernel, ran 2.7x slower than the two kernels: NOTES v25.)
CONFIGS = {"s2": dict(stages=2), "s3": dict(stages=3), "q32s3": dict(block_q=32, stages=3),
           "q32s3pp": dict(block_q=32, stages=3, pingpong=True), "s2pp": dict(stages=2, pingpong=True),
           "s2hf": dict(stages=2, chunk=1 << 20), "s2pphf": dict(stages=2, pingpong=True, chunk=1 << 20)}


def offline() -> int:
    from kernelops.kernels.common import offline_compile

    offline_compile.install()
    for D in (64, 128):
        for causal in (False, True):
            for cfg in CONFIGS.values():
                q = torch.empty(1, 256, 4, D, dtype=torch.bfloat16)
                kv = torch.empty(1, 256, 2, D, dtype=torch.bfloat16)
                stats = torch.empty(1, 4, 256)
                compiled = gluon_dkdv(q, kv, kv, stats, q, stats, causal=causal, warmup_only=True, **cfg)
                print(f"D={D} causal={int(causal)} {cfg}: {offline_compile.resources(compiled)}", flush=True)
    return 0


def check(configs=None) -> int:
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
        _, ref_dk, ref_dv = torch.autograd.grad(o, (qd, kd, vd), dout.double())
        for name, cfg in CONFIGS.items():
            if configs is not None and name not in configs:
                continue
            got = gluon_dkdv(q, k, v, row_delta(out, dout), dout, lse, causal=causal, **cfg)
            errs = [((x.double() - r).norm() / r.norm()).item() for x, r in zip(got, (ref_dk, ref_dv))]
            worst = max(worst, *errs)
            print(f"B={B} S={S} H={Hq}/{Hkv} D={D} causal={int(causal)} {name}: dk rel err {errs[0]:.2e}, "
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


def bench(out_dir: str | None, dims=(64, 128), configs=None, groups=(2,), windows=()) -> int:
    """dK/dV kernel time, Gluon beside the Triton dK/dV kernel (device time from the profiler for
    both, same run), bf16, B*S = 16k tokens, H*D = 2048, plain at 4k and 16k and GQA at 16k (query
    heads per KV head in ``groups``), and causal 16k rows with a left window of each of ``windows``
    keys; ``configs`` names :data:`CONFIGS` (all by default). Rows are written as they come."""
    import triton.testing

    from gluon_fwd import print_row, write_rows

    from kernelops import flash_attention
    from kernelops.modules.flash_attention_lowlevel import flash_attention_backward, get_optimal_block_sizes

    cases = [(causal, S, group, None) for causal in (False, True)
             for S, group in ((4096, 1), (16384, 1), *((16384, g) for g in groups))]
    cases += [(True, 16384, 1, w) for w in windows]
    rows = []
    for D in dims:
        for causal, S, group, window in cases:
            B, H = max(1, 16384 // S), 2048 // D
            Hkv = H // group
            q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            band = dict(causal=causal, sliding_window=(window, 0) if window is not None else None)
            out, lse = flash_attention(q, k, v, return_lse=True, **band)
            dout = torch.randn_like(out)
            # dK/dV: 4 of the backward's 5 products, over the keys each query sees
            seen = S * S / 2 if window is None else S * (window + 1) - (window + 1) * window / 2
            flops = 8 * B * H * D * (seen if causal else S * S)
            delta = row_delta(out.detach(), dout)
            # the Triton kernels at the heuristic's tiles (explicit tiles keep the Gluon kernel out)
            tiles = get_optimal_block_sizes(S, D, causal=causal, num_heads=H, num_kv_heads=Hkv).bwd_params
            triton_ms = _kernel_times(lambda: flash_attention_backward(  # noqa: B023
                q, k, v, out, dout, lse, **band, block_q=tiles.q_blocksize,  # noqa: B023
                block_kv=tiles.kv_blocksize, num_warps=tiles.num_warps, num_stages=tiles.num_stages),
                ("dkdv", "bwd_dq"))
            # the library's backward as a default call runs it (the ws rule, then the dQ kernel)
            lib_ms = _kernel_times(lambda: flash_attention_backward(q, k, v, out, dout, lse, **band),  # noqa: B023
                                   ("dkdv_ws", "bwd_dq"))
            row = {"D": D, "causal": causal, "S": S, "B": B, "H": H, "Hkv": Hkv, "window": window,
                   "triton_dkdv_ms": triton_ms.get("dkdv"), "triton_dq_ms": triton_ms.get("bwd_dq"),
                   "lib_dkdv_ws_ms": lib_ms.get("dkdv_ws"), "lib_dq_ms": lib_ms.get("bwd_dq")}
            for name, cfg in CONFIGS.items():
                if configs is not None and name not in configs:
                    continue
                fn = lambda cfg=cfg: gluon_dkdv(q.detach(), k.detach(), v.detach(), delta, dout, lse,  # noqa: E731
                                                causal=causal, win_left=window, **cfg)  # noqa: B023
                # device time from the profiler, as for the Triton kernel (do_bench also counts host time)
                row[f"gluon_{name}_ms"] = _kernel_times(fn, ("dkdv_ws",)).get("dkdv_ws")
                row[f"gluon_{name}_tflops"] = flops / row[f"gluon_{name}_ms"] / 1e9
                row[f"gluon_{name}_do_bench_ms"] = triton.testing.do_bench(fn, warmup=25, rep=100,
                                                                           return_mode="median")
            if row["triton_dkdv_ms"]:
                row["triton_dkdv_tflops"] = flops / row["triton_dkdv_ms"] / 1e9
            rows.append(row)
            print_row(row)
            write_rows(out_dir, "gluon_bwd.json", rows)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--offline", action="store_true", help="compile for sm_90 only (no GPU needed)")
    p.add_argument("--check", action="store_true", help="dK, dV against float64 on the GPU")
    p.add_argument("--bench", action="store_true", help="dK/dV kernel time beside the Triton kernel")
    p.add_argument("--out", help="where --bench writes <DEVICE>/gluon_bwd.json")
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), help="CONFIGS to check and time (default: all)")
    p.add_argument("--groups", type=int, nargs="+", default=[2], help="GQA groups of the 16k rows")
    p.add_argument("--windows", type=int, nargs="*", default=[], help="left windows of causal 16k rows")
    args = p.parse_args(argv)
    if args.offline:
        return offline()
    code = check(args.configs) if args.check else 0
    if args.bench and code == 0:
        code = bench(args.out, args.dims, args.configs, args.groups, args.windows)
    return code


if __name__ == "__main__":
    sys.exit(main())
