"""Hardware counters of the dense forward beside cuDNN's, one Nsight Compute pass per shape (GPU).

For each case (bf16, ``B * S = 16k`` tokens, ``H * D = 2048``) this runs ``ncu`` on a child process
that calls ``flash_attention`` and SDPA's cuDNN backend once each inside an NVTX range, and prints
per kernel: time, SM cycles active and elapsed, tensor-pipe and XU (MUFU) pipe use as a share of
active cycles, and the products ``active cycles x tensor share`` (the tensor pipe's busy cycles:
equal work gives equal figures) and the same for XU. It asks where a short row's gap to cuDNN
goes: more tensor work, more special-function work, or more cycles around the same work (NOTES v65).

    python benchmarks/fwd_ncu.py [--cases 128:512:1 64:512:1 ...] > results/<DEVICE>/fwd_ncu.txt

``--child D S CAUSAL`` is the profiled process.
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import subprocess
import sys

METRICS = ("gpu__time_duration.sum", "sm__cycles_active.avg", "sm__cycles_elapsed.avg",
           "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
           "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active", "launch__grid_size", "launch__block_size")


def child(D: int, S: int, causal: bool) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from kernelops import flash_attention

    B, H = 16384 // S, 2048 // D
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    for profiled in (False, False, True):  # two warm calls (compiles, plans), then the profiled pair
        if profiled:
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("prof")
        flash_attention(q, k, v, causal=causal)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            sdpa(qt, kt, vt, is_causal=causal)
        torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def profile(D: int, S: int, causal: bool) -> list[str]:
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    run = subprocess.run([ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", "prof/", "--metrics",
                          ",".join(METRICS), "--csv", sys.executable, __file__, "--child", str(D), str(S),
                          str(int(causal))], capture_output=True, text=True, check=True)
    rows = list(csv.DictReader(io.StringIO("\n".join(x for x in run.stdout.splitlines() if x.startswith('"')))))
    kernels: dict[str, dict[str, float]] = {}
    for r in rows:
        kernels.setdefault(r["Kernel Name"][:40], {})[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    lines = []
    for name, m in kernels.items():
        active = m["sm__cycles_active.avg"]
        tensor = m["sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"]
        xu = m["sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"]
        lines.append(f"D={D:3d} S={S:5d} {'causal' if causal else 'full  '} {name:40s} "
                     f"{m['gpu__time_duration.sum'] / 1e3:8.1f} us  active {active:10.0f} / elapsed "
                     f"{m['sm__cycles_elapsed.avg']:10.0f} cycles  tensor {tensor:5.1f}% ({active * tensor / 100:9.0f})"
                     f"  xu {xu:5.1f}% ({active * xu / 100:9.0f})  grid {m['launch__grid_size']:.0f} x "
                     f"{m['launch__block_size']:.0f}")
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["128:512:1", "128:2048:0", "64:512:1", "128:16384:1"],
                   help="D:S:causal")
    p.add_argument("--child", nargs=3, type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], bool(args.child[2]))
        return 0
    import torch
    import triton

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    for case in args.cases:
        D, S, causal = (int(x) for x in case.split(":"))
        print("\n".join(profile(D, S, bool(causal))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
