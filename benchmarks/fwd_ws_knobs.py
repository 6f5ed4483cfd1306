"""The warp-specialised forward's launch knobs on the short dense rows, beside cuDNN (GPU, one run).

For each shape (bf16, ``B*S = 16k`` tokens, H = 16, D = 128, as in ``flash_attention.py``) this times
``fwd_ws.flash_attention_fwd_ws`` with its defaults and with one knob changed at a time (the
persistent order's ``chunk``, ``programs``, 64-key blocks with 2-4 stages, 128-key blocks with 3-4
stages, one Q buffer, two or three consumer warpgroups at D=64), the
Triton TMA kernel at three tile shapes, and SDPA's cuDNN backend, all on the same random inputs,
``triton.testing.do_bench`` medians of kernel time. It asks whether a knob already in the launcher
closes the rows where the default reads under cuDNN (NOTES v39: no).

    python benchmarks/fwd_ws_knobs.py [--shapes 1024:0 512:1 ...] [--head-dim 64] [--dtype fp16]
        [--variants ws "ws chunk=2"] [--rounds 3] > results/<DEVICE>/fwd_ws_knobs.txt

``H = 2048 / D`` heads; ``--variants`` times only the named launcher variants (and no TMA kernel).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

VARIANTS = {"ws": {}, **{f"ws chunk={c}": dict(chunk=c) for c in (2, 4, 8, 16)},
            **{f"ws kv64 stages={s}": dict(kv_blocksize=64, num_stages=s) for s in (2, 3, 4)},
            "ws qbuf=1": dict(q_buffers=1), "ws qbuf=1 stages=3": dict(q_buffers=1, num_stages=3),
            "ws programs=128": dict(programs=128),
            **{f"ws stages={s}": dict(num_stages=s) for s in (3, 4)},
            **{f"ws consumers={c}": dict(consumers=c) for c in (2, 3)}}
TMA_TILES = ((64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2))


def main(argv=None) -> int:
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from kernelops.kernels.flash_attention.fwd_tma import flash_attention_fwd_tma
    from kernelops.kernels.flash_attention.fwd_ws import flash_attention_fwd_ws

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["1024:0", "512:1", "512:0", "2048:0"], help="S:causal")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--variants", nargs="+", default=None, help="names of VARIANTS to time (default: all, and TMA)")
    p.add_argument("--rounds", type=int, default=1, help="time every variant this many times, alternating; "
                   "report each one's median")
    args = p.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    variants = VARIANTS if args.variants is None else {name: VARIANTS[name] for name in args.variants}

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")

    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    for shape in args.shapes:
        S, causal = int(shape.split(":")[0]), shape.split(":")[1] == "1"
        D = args.head_dim
        B, H = 16384 // S, 2048 // D
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=dtype) for _ in range(3))
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        band = dict(win_left=1 << 30, win_right=0 if causal else 1 << 30, softcap=None)
        runs = {"cudnn": lambda: sdpa(qt, kt, vt, is_causal=causal)}  # (timed under sdpa_kernel below)
        for name, kw in variants.items():
            def run(kw=kw):
                return flash_attention_fwd_ws(q, k, v, softmax_scale=D ** -0.5, causal=causal, ragged=True, **kw)
            try:
                run()
            except Exception as exc:  # noqa: BLE001 - a knob value the launcher refuses: reported
                print(f"{name}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            runs[name] = run
        for qb, kb, warps, stages in TMA_TILES if args.variants is None else ():
            def tma(qb=qb, kb=kb, warps=warps, stages=stages):
                return flash_attention_fwd_tma(q, k, v, softmax_scale=D ** -0.5, **band, q_blocksize=qb,
                                               kv_blocksize=kb, num_warps=warps, num_stages=stages)
            runs[f"tma q{qb} kv{kb} w{warps} s{stages}"] = tma
        samples = {name: [] for name in runs}
        for r in range(args.rounds):  # alternate the order round by round
            for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                if name == "cudnn":
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        samples[name].append(bench(runs[name]))
                else:
                    samples[name].append(bench(runs[name]))
        times = {name: statistics.median(ms) for name, ms in samples.items()}
        print(f"--- {args.dtype} S={S} causal={causal} B={B} H={H} D={D}")
        for name, ms in sorted(times.items(), key=lambda kv: kv[1]):
            print(f"{name:24s} {ms * 1e3:8.1f} us {flops / ms / 1e9:6.0f} TFLOP/s  x cudnn {times['cudnn'] / ms:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
