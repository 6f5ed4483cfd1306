"""Gluon (Triton's explicit-layout layer) for the Hopper kernels, across Triton versions.

``GLUON`` says whether this Triton has what the warp-specialised kernels use: Gluon with Hopper's
warpgroup MMAs, TMA and mbarriers, and the ``warp_specialize`` signature of Triton 3.6 and newer.
Without it (an older Triton) the names below are absent and the dispatchers never pick those
kernels: the Triton pointer and TMA kernels serve every call. Where Triton renamed an operation
between 3.6 and 3.9 this module exports one name for both:

- ``tma_load`` / ``tma_store``: TMA copies between global and shared memory;
- ``thread_barrier``: a barrier over the calling partition's threads;
- ``tma_reduce_add``: a TMA reduce-add of a shared-memory tile into global memory;
- ``as_float32``: a shared-memory buffer's bytes viewed as a float32 tile.

Also the warpgroup accumulator layout (:func:`mma_layout`), the MUFU's approximate reciprocal and
tanh, and the NVMMA shared layout of a TMA box (:func:`smem_layout`).
"""

from __future__ import annotations

import functools
import inspect

import torch

try:  # Gluon with Hopper warpgroup MMAs: Triton >= 3.6
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
    # Triton 3.4/3.5 have Gluon with an older warp_specialize signature the kernels do not use
    GLUON = "functions_and_args" in inspect.signature(gl.warp_specialize).parameters
except (ImportError, AttributeError):  # pragma: no cover - older Triton (or a partial Gluon): the other kernels
    GLUON = False

__all__ = ["GLUON"]

if GLUON:
    __all__ += ["GluonTensorDescriptor", "as_float32", "fence_async_shared", "gl", "gluon", "mbarrier", "mma_layout",
                "rcp", "smem_layout", "tanh_approx", "thread_barrier", "tma", "tma_load", "tma_reduce_add",
                "tma_store", "warpgroup_mma", "warpgroup_mma_wait"]
    from triton.experimental.gluon.language._core import builtin

    # Triton 3.9 renamed the TMA copies (the old names raise there); 3.6 has only the old ones
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    # a barrier over the calling partition's threads: thread_barrier in Triton 3.6, barrier from 3.9
    thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

    @builtin
    def as_float32(smem, shape, layout, _semantic=None):
        """The bytes of ``smem`` viewed as a float32 tile (``_reinterpret`` in Triton 3.6, ``reinterpret`` later)."""
        return _semantic.memdesc_reinterpret(smem, gl.float32, [gl._unwrap_if_constexpr(s) for s in shape],
                                             gl._unwrap_if_constexpr(layout))

    if hasattr(tma, "async_atomic_add"):  # Triton >= 3.9
        tma_reduce_add = tma.async_atomic_add
    else:  # Triton 3.6's builder has the op; only Gluon's wrapper is missing
        from triton._C.libtriton import ir

        @builtin
        def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
            """Add the shared-memory tile ``src`` into ``tensor_desc``'s tensor at ``coord`` (TMA reduce-add)."""
            coord = _semantic._convert_to_ir_values(coord, require_i64=False)
            _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                      src.handle)

    @gluon.constexpr_function
    def mma_layout(n, k=16):
        """The accumulator layout of one 4-warp warpgroup's MMA into a 64-row tile of ``n`` columns
        (``k``: the instruction's reduction depth, 256 bits of the operands' type: 16 for 16-bit
        operands, 32 for FP8)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, k])

    @gluon.jit
    def rcp(x):
        """1 / x (float32) by the MUFU's approximate reciprocal (about 1 ulp; 1 / inf = 0)."""
        return gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                         pack=1)

    @gluon.jit
    def tanh_approx(x):
        """tanh(x) (float32) by the MUFU's approximation (one instruction; relative error about 2^-11)."""
        return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                         pack=1)

    @functools.lru_cache(maxsize=None)
    def smem_layout(block_shape: tuple[int, ...], dtype: torch.dtype):
        """The NVMMA shared-memory layout of a TMA box of ``dtype`` (cached: building it costs ~5 us a call)."""
        gl_dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32,
                    torch.float8_e4m3fn: gl.float8e4nv}[dtype]
        return gl.NVMMASharedLayout.get_default_for(list(block_shape), gl_dtype)
