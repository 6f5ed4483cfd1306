"""Compile Triton / Gluon kernels for an NVIDIA target on a machine without a GPU (a development tool).

Triton needs an active driver to learn the target, the current device and its stream, and to
load and launch a compiled kernel; compiling to PTX and a cubin uses the ptxas shipped in the
triton wheel. ``install()`` puts a stand-in driver in place for this process: launches compile
for ``sm_90`` (the default) and then do nothing, so a whole launcher (several kernels) runs on
CPU tensors and leaves its compiled kernels in each ``JITFunction``'s cache (``compiled_kernels``).
``kernel.warmup(..., grid=(1,))`` returns one compiled kernel, whose ``asm`` holds ttgir / ptx /
cubin. ``resources(compiled)`` reads registers, spills and shared memory from the cubin.

It must run without ``TRITON_INTERPRET`` (under the interpreter ``triton.jit`` builds no
compilable kernels), as in the child process of tests/kernels/test_sm90_compile.py. Compile
errors, register counts and spills are found this way without a GPU; speed and results still need
one.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import torch


#: what the stand-in driver reports for the device (an H100 SXM)
H100_PROPERTIES = {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32,
                   "sm_clock_rate": 1980000, "mem_clock_rate": 2619000, "mem_bus_width": 5120}


class _NoLaunch:
    """A launcher that launches nothing."""

    def __init__(self, src, metadata):
        self.metadata = metadata

    def __call__(self, *args, **kwargs):
        return None


class _Utils:
    """``driver.active.utils``: device properties and a ``load_binary`` that loads nothing."""

    def get_device_properties(self, device):
        return dict(H100_PROPERTIES)

    def load_binary(self, name, kernel, shared, device):
        return 0, 0, 0, 0, 1024  # module, function, registers, spills, max threads per block


class OfflineCudaDriver:
    """The parts of Triton's driver interface that compiling and (not) launching touch."""

    launcher_cls = _NoLaunch

    def __init__(self, capability: int = 90):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)
        self.utils = _Utils()

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


def compiled_kernels(jit_function) -> list:
    """The compiled kernels a ``JITFunction`` holds for device 0 (one per specialisation)."""
    return [k for cache in jit_function.device_caches.get(0, ({},))[:1] for k in cache.values()]


def _nvidia_tool(name: str) -> str:
    """The path of a CUDA tool (ptxas, cuobjdump) shipped in the triton wheel."""
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def ptxas_notes(compiled, arch: str = "sm_90a") -> list[str]:
    """ptxas's numbered notes and warnings for a compiled kernel's PTX (re-assembled with ``-v``),
    e.g. "(C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized ...",
    which Triton does not surface."""
    with tempfile.TemporaryDirectory() as folder:
        src = os.path.join(folder, "kernel.ptx")
        with open(src, "w") as f:
            f.write(compiled.asm["ptx"])
        out = os.path.join(folder, "kernel.cubin")
        run = subprocess.run([_nvidia_tool("ptxas"), f"-arch={arch}", "-v", src, "-o", out], capture_output=True,
                             text=True)
    return [line.strip() for line in (run.stdout + run.stderr).splitlines()
            if "warning" in line.lower() or re.search(r"\(C\d{4}\)", line)]


def resources(compiled) -> dict:
    """``{"shared_bytes", "wgmma_serialized", "registers", "stack_bytes", "local_bytes"}`` of a
    compiled kernel, from ``cuobjdump -res-usage`` on its cubin and ptxas's warnings (tools from the
    triton wheel's bin folder). Register spills show as stack / local bytes above 0;
    ``wgmma_serialized``: a ptxas note that it made the asynchronous warpgroup MMAs synchronous, for
    whatever reason it gives (C7514: one in flight across a loop's back edge; C7512: too few
    registers, which a spill-free count does not rule out)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run([_nvidia_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    out = {"shared_bytes": compiled.metadata.shared,
           "wgmma_serialized": any("mma_async instructions are serialized" in note for note in ptxas_notes(compiled))}
    for name, pattern in (("registers", r"REG:(\d+)"), ("stack_bytes", r"STACK:(\d+)"),
                          ("local_bytes", r"LOCAL:(\d+)")):
        match = re.search(pattern, text)
        out[name] = int(match.group(1)) if match else None
    return out
