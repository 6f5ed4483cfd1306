"""Compile Triton / Gluon kernels for an NVIDIA target on a machine without a GPU.

Triton needs an active driver only to learn the target, the current device and its stream;
compiling to PTX and a cubin uses the ptxas shipped in the triton wheel. ``install()`` puts a
stand-in driver in place so ``kernel.warmup(..., grid=(1,))`` compiles for ``sm_90`` (the
default) and returns the compiled kernel, whose ``asm`` holds ttgir / ptx / cubin. Nothing can be
launched. ``resources(compiled)`` reads registers, spills and shared memory from the cubin.

    PYTHONPATH=/path/to/triton-3.6 python benchmarks/gluon_fwd.py --offline   # compile checks only

Used for kernel work between GPU sessions: compile errors, register counts and spills are
found here; speed and results still need the GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import torch


class OfflineCudaDriver:
    """The parts of Triton's driver interface that compiling (not launching) touches."""

    def __init__(self, capability: int = 90):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)

    def is_active(self):
        return True

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        return torch.cuda

    def get_benchmarker(self):
        raise RuntimeError("offline_compile: nothing can be timed without a GPU")

    def get_empty_cache_for_benchmark(self):
        raise RuntimeError("offline_compile: nothing can be timed without a GPU")


def install(capability: int = 90) -> None:
    """Make the stand-in driver Triton's active driver (for this process)."""
    from triton.runtime import driver

    driver.set_active(OfflineCudaDriver(capability))


def resources(compiled) -> dict:
    """``{"shared_bytes", "registers", "stack_bytes", "local_bytes"}`` of a compiled kernel, from
    ``cuobjdump -res-usage`` on its cubin (the tool in the triton wheel's bin folder). Register
    spills show as stack / local bytes above 0."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    out = {"shared_bytes": compiled.metadata.shared}
    for name, pattern in (("registers", r"REG:(\d+)"), ("stack_bytes", r"STACK:(\d+)"),
                          ("local_bytes", r"LOCAL:(\d+)")):
        match = re.search(pattern, text)
        out[name] = int(match.group(1)) if match else None
    return out
