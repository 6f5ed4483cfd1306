"""Compile flash_attention's kernels for one shape on the GPU and report what the compiler made.

Prints, per kernel: registers, spills, shared memory, and counts in the IR of async copies
(software pipelining), TMA ops and wgmma instructions. Costs one launch of each kernel.

    python benchmarks/inspect_kernels.py [--D 128] [--causal]
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

PATTERNS = {"async_copy": r"async_copy_global_to_local", "tma": r"async_tma|descriptor_load",
            "wgmma": r"warp_group_dot ", "mma_sync": r"ttg\.nvidia_mma.*versionMajor = 2"}


def report(kernel_fn, label: str) -> None:
    for cache in getattr(kernel_fn, "device_caches", {}).values():
        for compiled in cache[0].values():
            ir = compiled.asm.get("ttgir", "")
            counts = {k: len(re.findall(p, ir)) for k, p in PATTERNS.items()}
            print(f"{label}: regs={getattr(compiled, 'n_regs', '?')} spills={getattr(compiled, 'n_spills', '?')} "
                  f"shared={compiled.metadata.shared} warps={compiled.metadata.num_warps} "
                  f"stages={compiled.metadata.num_stages} {counts}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--S", type=int, default=4096)
    p.add_argument("--causal", action="store_true")
    args = p.parse_args(argv)
    from kernelops import flash_attention
    from kernelops.kernels.flash_attention import bwd, fwd

    B, H = max(1, 16384 // args.S), 2048 // args.D
    q, k, v = (torch.randn(B, args.S, H, args.D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    flash_attention(q, k, v, causal=args.causal).sum().backward()
    torch.cuda.synchronize()
    report(fwd.flash_attention_fwd_kernel, "fwd")
    report(bwd.flash_attention_bwd_dkdv_kernel, "bwd_dkdv")
    report(bwd.flash_attention_bwd_dq_kernel, "bwd_dq")
    return 0


if __name__ == "__main__":
    sys.exit(main())
