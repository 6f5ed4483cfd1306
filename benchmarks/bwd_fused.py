"""Experiment (NOTES v27): the fused Gluon backward (kernels/flash_attention/bwd_fused.py: dQ, dK and
dV from one warp-specialised kernel, dQ added by TMA reduce-add) against the split backward (the
Gluon dK/dV kernel, then the Triton dQ kernel) and cuDNN's SDPA backward, in one run.

``--check``: dQ, dK, dV of the fused kernel against float64 autograd (causal, full, GQA, windows,
D 64/128). ``--bench``: bf16, B*S = 16k tokens, H*D = 2048, per row the backward's time (median of
``triton.testing.do_bench``, the whole call: preprocess, kernels, the dQ conversion) for split and
fused at the same tiles, the kernels' device time from the profiler, and cuDNN's backward (the
``torch.autograd.grad`` of SDPA through a saved graph, so its forward is not counted). TFLOP/s
count the backward as 2.5 forwards (4*B*H*S^2*D per forward, half when causal). ``--variants``: also
check and time the fused (and, where its launcher takes the keywords, the split) backward with
launcher keywords, e.g. ``chunk=16`` (comma-separated ``key=int`` pairs; NOTES v28's ``stats=1``
switch no longer exists: that path is the only one).

    python benchmarks/bwd_fused.py --check --bench --out DIR [--dims 128 64] [--groups 4] [--windows 4096]
        [--variants KEY=INT[,KEY=INT] ...] [--fused-only] [--seqs 1024 4096 16384]
        [--bands full causal]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


#: ``(fused, variant)`` of the last :func:`_backward` call
_LAST_RUN = None


def _backward(q, k, v, out, dout, lse, causal, window, fused, variant=None):
    """The kernel-level backward with the Gluon kernels on: split (``fused=False``) or fused (with
    ``variant``, when given, as keyword arguments of the Gluon launch builder that runs:
    ``bwd_fused.fused_launch`` or ``bwd_ws.dkdv_ws_launch``, which ``bwd.ws_launches`` imports at
    each call). The launch plans are dropped whenever the path or variant changes from the last call."""
    import functools

    from kernelops.kernels.flash_attention import bwd_fused, bwd_ws, plans
    from kernelops.kernels.flash_attention.bwd import flash_attention_bwd
    from kernelops.modules.flash_attention_lowlevel import get_optimal_block_sizes

    S, H, D = q.shape[1], q.shape[2], q.shape[3]
    tiles = get_optimal_block_sizes(S, D, causal=causal, num_heads=H, num_kv_heads=k.shape[2]).bwd_params
    left = (1 << 30) if window is None else window
    global _LAST_RUN
    if _LAST_RUN != (fused, variant):  # a per-signature plan binds the launches of its first call
        plans._PLANS.clear()
        _LAST_RUN = (fused, variant)
    module, name = (bwd_fused, "fused_launch") if fused else (bwd_ws, "dkdv_ws_launch")
    kernel = getattr(module, name)
    if variant:
        setattr(module, name, functools.partial(kernel, **variant))
    try:
        return flash_attention_bwd(q, k, v, out, dout, lse, softmax_scale=D ** -0.5,
                                   win_left=left if causal else 1 << 30, win_right=0 if causal else 1 << 30,
                                   softcap=None, q_blocksize=tiles.q_blocksize, kv_blocksize=tiles.kv_blocksize,
                                   num_warps=tiles.num_warps, num_stages=tiles.num_stages, ws=True, fused=fused)[:3]
    finally:
        setattr(module, name, kernel)


def _split_takes(variant: dict) -> bool:
    """Whether the split backward's Gluon launch builder takes every keyword of ``variant``."""
    import inspect

    from kernelops.kernels.flash_attention.bwd_ws import dkdv_ws_launch

    return set(variant) <= set(inspect.signature(dkdv_ws_launch).parameters)


def check(variants=({},)) -> int:
    """dQ, dK, dV of the fused path (each variant: keyword arguments of the launcher) against float64 (the
    flash-attn rule: within a multiple of the bf16 reference's own error)."""
    from kernelops import flash_attention
    from tests.attention_checks import assert_matches, reference

    failures = 0
    cases = [(2, 256, 4, 4, 128, False, None), (2, 384, 4, 1, 128, True, None), (1, 512, 8, 2, 64, True, None),
             (1, 128, 2, 2, 64, False, None), (2, 512, 4, 2, 128, True, 100), (1, 384, 2, 1, 64, True, 200),
             (1, 1024, 4, 4, 128, True, None), (1, 256, 4, 1, 128, True, 0)]
    for B, S, Hq, Hkv, D, causal, window, variant in [(*case, variant) for variant in variants for case in cases]:
        q, k, v = (torch.randn(B, S, h, D, device="cuda", dtype=torch.bfloat16) for h in (Hq, Hkv, Hkv))
        band = dict(causal=causal, sliding_window=(window, 0) if window is not None else None)
        out, lse = flash_attention(q, k, v, return_lse=True, **band)
        dout = torch.randn_like(out)
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        from kernelops.kernels.flash_attention.bwd_fused import flash_attention_bwd_fused
        delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
        flash_attention_bwd_fused(q, k, v, dout, lse, delta, dq, dk, dv, softmax_scale=D ** -0.5, causal=causal,
                                  win_left=window, **variant)
        ref_kw = dict(causal=causal, sliding_window=window if window is not None else None, dout=dout)
        _, _, ref = reference(q, k, v, **ref_kw)
        _, _, low = reference(q, k, v, **ref_kw, dtype=torch.bfloat16)
        for name, got, want, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low):
            err = ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
            try:
                if window == 0 and name in ("dq", "dk"):  # dS is 0 in exact arithmetic: rounding noise only
                    assert got.float().norm() < 1e-3 * dv.float().norm(), f"{name} not ~0"
                else:
                    assert_matches(name, got, want, lo, torch.bfloat16)
                status = "ok"
            except AssertionError as e:
                failures += 1
                status = f"FAILED {str(e)[:200]}"
            print(f"B={B} S={S} H={Hq}/{Hkv} D={D} causal={int(causal)} window={window} {variant} {name}: "
                  f"rel err {err:.2e} {status}", flush=True)
    print("check:", "ok" if failures == 0 else f"{failures} FAILED")
    return 1 if failures else 0


def _cudnn_backward(q, k, v, dout, causal):
    """A function running cuDNN SDPA's backward alone on BHSD copies (its graph saved once)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    rep = q.shape[2] // k.shape[2]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=rep > 1)
    g = dout.transpose(1, 2).contiguous()
    return lambda: torch.autograd.grad(o, (qt, kt, vt), g, retain_graph=True)


def bench(out_dir, dims=(128, 64), groups=(4,), windows=(), variants=(), seqs=(1024, 4096, 16384),
          fused_only=False, bands=("full", "causal")) -> int:
    """Time split, fused and each fused variant (``{"name": kwargs}``) per row; write the rows.
    ``fused_only``: the variants' keywords go to the fused launcher only; ``bands``: full and / or
    causal rows (windows: causal)."""
    import triton.testing

    from gluon_bwd import _kernel_times
    from gluon_fwd import print_row, write_rows

    from kernelops import flash_attention

    cases = [(causal, S, group, None) for causal in (False, True) if ("causal" if causal else "full") in bands
             for S, group in (*((S, 1) for S in seqs), *((16384, g) for g in groups))]
    cases += [(True, 16384, 1, w) for w in windows]
    rows = []
    for D in dims:
        for causal, S, group, window in cases:
            B, H = max(1, 16384 // S), 2048 // D
            q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(B, S, H // group, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            out, lse = flash_attention(q, k, v, return_lse=True, causal=causal,
                                       sliding_window=(window, 0) if window is not None else None)
            dout = torch.randn_like(out)
            seen = (S * S / 2 if window is None else S * (window + 1) - (window + 1) * window / 2) if causal else S * S
            flops = 2.5 * 4 * B * H * D * seen
            row = {"D": D, "causal": causal, "S": S, "B": B, "H": H, "Hkv": H // group, "window": window}
            runs = [("split", False, None), ("fused", True, None)] + [
                (f"{path}_{n}", path == "fused", kw) for n, kw in variants for path in ("split", "fused")
                if path == "fused" or (_split_takes(kw) and not fused_only)]
            for name, fused, variant in runs:
                fn = lambda fused=fused, variant=variant: _backward(  # noqa: E731
                    q, k, v, out, dout, lse, causal, window, fused, variant)
                row[f"{name}_ms"] = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
                row[f"{name}_tflops"] = flops / row[f"{name}_ms"] / 1e9
                times = _kernel_times(fn, ("dkdv_ws", "bwd_dq", "bwd_fused", "preprocess", "elementwise", "Memset",
                                           "fill"))
                row[f"{name}_kernels_ms"] = {k2: round(t, 4) for k2, t in times.items()}
            if window is None:
                try:
                    fn = _cudnn_backward(q, k, v, dout, causal)
                    row["cudnn_ms"] = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
                    row["cudnn_tflops"] = flops / row["cudnn_ms"] / 1e9
                except RuntimeError as e:  # a shape cuDNN refuses
                    row["cudnn_error"] = str(e)[:200]
            row["fused_vs_split"] = row["split_ms"] / row["fused_ms"]
            for n, kw in variants:
                for path in ("split", "fused") if _split_takes(kw) and not fused_only else ("fused",):
                    row[f"{path}_{n}_vs_{path}"] = row[f"{path}_ms"] / row[f"{path}_{n}_ms"]
            if "cudnn_ms" in row:
                row["fused_vs_cudnn"] = row["cudnn_ms"] / row["fused_ms"]
            rows.append(row)
            print_row(row)
            write_rows(out_dir, "bwd_fused.json", rows)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="dQ, dK, dV against float64 on the GPU")
    p.add_argument("--bench", action="store_true", help="split vs fused backward vs cuDNN")
    p.add_argument("--out", help="where --bench writes <DEVICE>/bwd_fused.json")
    p.add_argument("--dims", type=int, nargs="+", default=[128, 64])
    p.add_argument("--groups", type=int, nargs="+", default=[4], help="GQA groups of the 16k rows")
    p.add_argument("--windows", type=int, nargs="*", default=[], help="left windows of causal 16k rows")
    p.add_argument("--variants", nargs="*", default=[],
                   help="also check and time these variants of the fused kernel: launcher keywords, as "
                        "chunk=16")
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096, 16384], help="sequence lengths of the rows")
    p.add_argument("--fused-only", action="store_true", help="the variants' keywords go to the fused launcher only")
    p.add_argument("--bands", nargs="+", choices=["full", "causal"], default=["full", "causal"])
    args = p.parse_args(argv)
    variants = [(text, {key: int(value) for key, value in (kv.split("=") for kv in text.split(","))})
                for text in args.variants]
    code = check(({}, *(kw for _, kw in variants))) if args.check else 0
    if args.bench:
        code = bench(args.out, args.dims, args.groups, args.windows, variants, args.seqs, args.fused_only,
                     args.bands) or code
    return code


if __name__ == "__main__":
    sys.exit(main())
