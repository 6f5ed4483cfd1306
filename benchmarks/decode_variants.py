"""A/B of the split-KV decode kernel's K/V reads beside cuDNN, every call inside a CUDA graph (GPU).

bf16, Sq=1, Hq=32, Hkv=8, D=128, not causal, B in {1, 2, 4, 8, 16} and Sk in {4k, 32k, 128k}
(B * Sk up to 512k keys). Per row, K/V read bandwidth (bytes of K and V read once over the median
time of ``triton.testing.do_bench_cudagraph``, so host time is left out) of:

- ``cudnn``: SDPA's cuDNN backend (``enable_gqa``);
- ``ptr``: K/V tiles through pointers (``decode.DECODE_TMA`` off: the kernel of v44), 64-key
  tiles, 4 warps, 3 stages, the split rule's count (:func:`decode.split_plan`);
- ``tma``: the same through TMA descriptors; with more than one split the combine launch goes as a
  programmatic dependent launch (``decode.DECODE_PDL``, NOTES v57);
- ``tma_nopdl``: the same with the combine launched after the split kernel ends;
- ``tma_<keys>_<warps>_<stages>``: other tiles, and ``tma_s<n>`` other split counts;
- with ``--slices``: ``cudnn_slice``, ``ptr_slice`` and ``tma_slice``, the same call on K/V that
  are ``cache[:, :Sk]`` of BSHD caches 4096 rows longer (a serving loop's view of its cache):
  before NOTES v58 such slices read through pointers when B > 1; and ``cudnn_bhsd``, ``ptr_bhsd``,
  ``tma_bhsd`` on slices of BHSD caches (``[B, Hkv, Sk + 4096, D]``, SDPA's layout; TMA since v58).

Each variant's output is checked against a float64 reference on the row's inputs before it is
timed (relative error of the largest element).

    python benchmarks/decode_variants.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from decode_splits import cudnn_graph_ms, save_rows  # noqa: E402

HQ, HKV, D = 32, 8, 128
TILES = ((64, 4, 2), (64, 4, 4), (128, 4, 3), (128, 8, 3), (32, 4, 4))  # (kv_blocksize, num_warps, num_stages)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--keys", type=int, nargs="+", default=[4096, 32768, 131072])
    p.add_argument("--no-tiles", action="store_true", help="leave out the other tiles (TILES)")
    p.add_argument("--slices", action="store_true", help="also time K/V sliced from longer caches")
    args = p.parse_args(argv)
    import triton.testing as tt

    from kernelops.kernels.common.host import num_sms
    from kernelops.kernels.flash_attention import decode

    dev = torch.device("cuda")
    sms = num_sms(dev, 4)
    big = 1 << 30
    saved = decode.DECODE_TMA, decode.DECODE_PDL
    rows = []
    for B in args.batches:
        for Sk in args.keys:
            if B * Sk > 4 * 131072:
                continue
            q = torch.randn(B, 1, HQ, D, device=dev, dtype=torch.bfloat16)
            k, v = (torch.randn(B, Sk, HKV, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
            tbps = lambda ms: 2 * k.numel() * 2 / ms / 1e9  # noqa: B023, E731
            k64, v64 = (t.double().repeat_interleave(HQ // HKV, 2) for t in (k, v))  # [B, Sk, Hq, D]
            ref = torch.einsum("bhk,bkhd->bhd", torch.softmax(
                torch.einsum("bhd,bkhd->bhk", q[:, 0].double(), k64) * D ** -0.5, -1), v64)
            del k64, v64
            ms = cudnn_graph_ms(q, k, v)
            rule = decode.split_plan(B * HKV, Sk, 64, 0, sms)[0]
            row = dict(B=B, Sk=Sk, cudnn=tbps(ms), rule=rule)
            runs = [("ptr", False, True, (64, 4, 3), 0), ("tma", True, True, (64, 4, 3), 0),
                    ("tma_nopdl", True, False, (64, 4, 3), 0)]
            runs += [] if args.no_tiles else [("tma_{}_{}_{}".format(*t), True, True, t, 0) for t in TILES]
            runs += [(f"tma_s{n}", True, True, (64, 4, 3), n) for n in sorted({max(1, rule // 2), 2 * rule})
                     if n != rule]
            kv = {}
            if args.slices:
                for suffix, shape in (("_slice", (B, Sk + 4096, HKV, D)), ("_bhsd", (B, HKV, Sk + 4096, D))):
                    caches = [torch.randn(shape, device=dev, dtype=torch.bfloat16) for _ in range(2)]
                    if suffix == "_bhsd":
                        caches = [cache.transpose(1, 2) for cache in caches]
                    for cache, t in zip(caches, (k, v)):
                        cache[:, :Sk] = t
                    kv[suffix] = tuple(cache[:, :Sk] for cache in caches)
                    del caches
                    row["cudnn" + suffix] = tbps(cudnn_graph_ms(q, *kv[suffix]))
                    runs += [("ptr" + suffix, False, True, (64, 4, 3), 0), ("tma" + suffix, True, True, (64, 4, 3), 0)]
            for name, tma, pdl, (n, w, st), splits in runs:
                decode.DECODE_TMA, decode.DECODE_PDL = tma, pdl
                keys, values = kv.get(name[3:], (k, v))
                fn = lambda: decode.flash_attention_decode(  # noqa: B023, E731
                    q, keys, values, softmax_scale=D ** -0.5, win_left=big, win_right=big,  # noqa: B023
                    softcap=None, kv_blocksize=n, num_warps=w, num_stages=st, num_splits=splits)  # noqa: B023
                err = ((fn()[0][:, 0].double() - ref).abs().max() / ref.abs().max()).item()
                assert err < 2e-2, (name, err)
                row[name] = tbps(tt.do_bench_cudagraph(fn, rep=100, return_mode="median"))
            decode.DECODE_TMA, decode.DECODE_PDL = saved
            rows.append(row)
            print(f"B={B:2d} Sk={Sk:6d} rule={rule:2d} cudnn {row['cudnn']:.2f} | "
                  + " ".join(f"{key}:{val:.2f}({val / row['cudnn']:.2f}x)" for key, val in row.items()
                             if key not in ("B", "Sk", "cudnn", "rule")), flush=True)
    save_rows(args.out, "decode_variants_ab.json", sms, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
