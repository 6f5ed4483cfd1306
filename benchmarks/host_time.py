"""Host time against kernel time of the short rows of the flash_attention table (GPU).

A row of ``flash_attention.py`` is host-bound when issuing one call takes longer than its kernels
run: the GPU then idles between calls and the table's time is the host's. For each row this prints,
for kernelops and the SDPA backends:

- ``host``: microseconds to issue one call while the GPU is held busy by a spin kernel
  (``torch.cuda._sleep``), so nothing waits on the device (a call that synchronises shows up as
  milliseconds);
- ``gpu``: the call's kernels' device time (torch.profiler, summed per call);
- ``bench``: the table's measure (``triton.testing.do_bench`` median, cache flush between calls).

Shapes as in ``flash_attention.py``: B*S = 16k tokens, H*D = 2048, random inputs.

    python benchmarks/host_time.py [--rows fwd:128:1:512 fwdbwd:64:0:1024 ...] [--profile ROW]
        [--ws-floor FLOPS] [--out DIR]

``--ws-floor`` sets both warp-specialised floors (``WS_MIN_FLOPS`` and ``WS_MIN_FLOPS_BWD``)
before the first call; ``--profile ROW`` prints cProfile's top host functions for kernelops on
that row.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from flash_attention import DTYPES, impls, row_call  # noqa: E402

DEFAULT_ROWS = ["fwd:128:1:512", "fwd:128:0:512", "fwd:128:1:1024", "fwd:128:1:2048", "fwd:64:1:512",
                "fwd:64:0:2048", "fwdbwd:128:1:512", "fwdbwd:128:0:512", "fwdbwd:128:1:1024",
                "fwdbwd:128:1:2048", "fwdbwd:64:1:1024", "fwdbwd:64:0:1024"]


def parse_row(text: str) -> tuple[str, int, bool, int]:
    """``mode:D:causal:S`` -> ``(mode, D, causal, S)``."""
    mode, D, causal, S = text.split(":")
    return mode, int(D), bool(int(causal)), int(S)


def make_call(layout, fn, mode, D, causal, S, dtype):
    """``flash_attention.row_call``'s call and FLOPs; a fwd+bwd call drops its gradients after
    itself (the table's do_bench does that between calls)."""
    run, flops, _, _, grads = row_call(layout, fn, D, causal, S, mode, dtype)
    if grads is None:
        return run, flops

    def call():
        run()
        for t in grads:
            t.grad = None

    return call, flops


def host_us(call, n: int = 10, rounds: int = 5) -> float:
    """Median over rounds of the wall time to issue ``n`` calls behind a ~50 ms spin kernel."""
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)
        start = time.perf_counter()
        for _ in range(n):
            call()
        times.append((time.perf_counter() - start) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def gpu_us(call, n: int = 10) -> tuple[float, list[tuple[str, float]]]:
    """Device time per call (kernels summed) and the kernels' names with their per-call times."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    kernels = [(e.key, e.self_device_time_total / n) for e in prof.key_averages() if e.self_device_time_total > 0]
    kernels.sort(key=lambda kv: -kv[1])
    return sum(t for _, t in kernels), kernels


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="+", default=DEFAULT_ROWS)
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--impls", nargs="+", default=["kernelops", "sdpa_cudnn"])
    p.add_argument("--ws-floor", type=float, default=None)
    p.add_argument("--profile", nargs="*", default=[], metavar="ROW")
    p.add_argument("--out", default=None, help="write <out>/<DEVICE>/host_time[_<tag>].json")
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    os.environ.setdefault("KERNELOPS_AUTOTUNE", "never")
    import triton
    import triton.testing

    import importlib

    fa = importlib.import_module("kernelops.modules.flash_attention")  # the module, not the function
    from kernelops.ops.device import device_info

    if args.ws_floor is not None:
        fa.WS_MIN_FLOPS = fa.WS_MIN_FLOPS_BWD = args.ws_floor
    table = impls()
    rows = []
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
          f"ws floor {fa.WS_MIN_FLOPS:g}/{fa.WS_MIN_FLOPS_BWD:g}")
    print(f"{'row':22s} {'impl':11s} {'host us':>8s} {'gpu us':>8s} {'bench us':>9s} {'TFLOP/s':>8s}  kernels")
    for text in args.rows:
        mode, D, causal, S = parse_row(text)
        for name in args.impls:
            layout, fn = table[name]
            call, flops = make_call(layout, fn, mode, D, causal, S, args.dtype)
            call()
            torch.cuda.synchronize()
            h = host_us(call)
            g, kernels = gpu_us(call)
            b = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median") * 1e3
            top = ", ".join(f"{k[:40]} {t:.0f}" for k, t in kernels[:4])
            print(f"{text:22s} {name:11s} {h:8.1f} {g:8.1f} {b:9.1f} {flops / b / 1e6:8.1f}  {top}", flush=True)
            rows.append({"row": text, "impl": name, "dtype": args.dtype, "host_us": h, "gpu_us": g, "bench_us": b,
                         "tflops": flops / b / 1e6, "kernels": kernels[:8]})
    for text in args.profile:
        import cProfile
        import pstats

        mode, D, causal, S = parse_row(text)
        call, _ = make_call(*table["kernelops"], mode, D, causal, S, args.dtype)
        call()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            call()
        prof.disable()
        torch.cuda.synchronize()
        print(f"\n--- cProfile, kernelops {text}, 200 calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    if args.out:
        out = pathlib.Path(args.out) / device_info("cuda").name
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"host_time{'_' + args.tag if args.tag else ''}.json"
        path.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "triton": triton.__version__, "ws_floor": [fa.WS_MIN_FLOPS, fa.WS_MIN_FLOPS_BWD],
                                    "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
