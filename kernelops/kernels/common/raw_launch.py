"""The C launcher of a compiled kernel called with its arguments already expanded (Triton 3.6).

Triton 3.6's ``CudaLauncher.__call__`` allocates the (absent) scratch buffers, and its
``wrap_handle_tensordesc`` wrapper walks every argument to expand each host tensor descriptor into
``(CUtensorMap, *shape, *strides)``, encoding the map with ``fill_tma_descriptor``. A bound launch
(:class:`kernels.common.launch.BoundLaunch`) repeats one launch whose descriptors keep their shape,
strides, box and layout and change only their base, so that expansion can be done once, leaving
per call one ``fill_tma_descriptor`` per descriptor and the C launch: on H200 hosts the
Python layers skipped cost ~15-25 us per launch of the Gluon kernels (``benchmarks/host_time.py``).

:func:`raw_launcher` recognises the 3.6 launcher it knows (the module's base argument format, the
wrapper's closure, no scratch, one CTA per program) and returns None for anything else (other
Triton versions, the interpreter, kernels that need scratch memory), whose launches keep the
launcher's own path. ``KERNELOPS_RAW_LAUNCH=0`` turns it off.
"""

from __future__ import annotations

import os
import sys

#: whether bound launches may call the C launcher directly (read when a launch is bound)
ENABLED = os.environ.get("KERNELOPS_RAW_LAUNCH", "1") != "0"


def _fill_function():
    """The CUDA driver utility that encodes a ``CUtensorMap`` (what ``make_tensordesc_arg`` calls)."""
    from triton.runtime.driver import driver

    return driver.active.utils.fill_tma_descriptor


class RawLaunch:
    """The C launcher of one compiled kernel and the expansion of one bound argument list.

    ``args``: every kernel parameter (positional and keyword, constexprs included) as the bound
    launch holds them, tensors and descriptor bases left as None; ``tensor_slots`` ``(i, j)``:
    parameter ``i`` is the call's tensor ``j``; ``desc_slots`` ``(i, j, desc)``: parameter ``i``
    is ``desc`` (its base stripped) over the call's tensor ``j``."""

    def __init__(self, raw, meta, coop, pdl, args, tensor_slots, desc_slots):
        to_host = sys.modules["triton.backends.nvidia.driver"].TMA_DTYPE_DEVICE_TO_HOST
        descs = {i: (j, desc) for i, j, desc in desc_slots}
        tensors = dict(tensor_slots)
        expanded, self.tensor_slots, self.desc_slots = [], [], []
        for i, a in enumerate(args):
            if i in descs:
                j, desc = descs[i]
                m = meta[len(self.desc_slots)]
                shape, strides = [int(x) for x in desc.shape], [int(x) for x in desc.strides]
                fill_args = (m["swizzle"], m["elem_size"], to_host[m["elem_type"]], m["block_size"], shape, strides,
                             1 if getattr(desc, "padding", "zero") == "nan" else 0)
                self.desc_slots.append((len(expanded), j, fill_args))
                expanded += [None, *shape, *strides]
            else:
                if i in tensors:
                    self.tensor_slots.append((len(expanded), tensors[i]))
                expanded.append(a)
        self.args, self.raw, self.coop, self.pdl = expanded, raw, coop, pdl
        self.fill = _fill_function() if self.desc_slots else None

    def __call__(self, grid3, stream, compiled, tensors) -> None:
        args = self.args.copy()
        for i, j in self.tensor_slots:
            args[i] = tensors[j]
        fill = self.fill
        for i, j, f in self.desc_slots:
            args[i] = fill(tensors[j].data_ptr(), *f)
        self.raw(grid3[0], grid3[1], grid3[2], stream, compiled.function, self.coop, self.pdl, None, None,
                 compiled.packed_metadata, None, None, None, *args)


def raw_launcher(compiled, args, tensor_slots, desc_slots) -> RawLaunch | None:
    """A :class:`RawLaunch` of ``compiled`` for the bound argument list (see there), or None when
    raw launches are off or ``compiled``'s launcher is not the Triton 3.6 CUDA launcher this module
    knows (module docstring); every descriptor must be TMA-encoded (compiled with its metadata)."""
    nv = sys.modules.get("triton.backends.nvidia.driver")
    run = getattr(compiled, "run", None)
    if not ENABLED or nv is None or getattr(nv, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO" or \
            not hasattr(nv, "TMA_DTYPE_DEVICE_TO_HOST") or type(run).__name__ != "CudaLauncher":
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1) or \
            getattr(run, "num_ctas", 1) != 1:
        return None
    launch, meta = run.launch, []
    if desc_slots:  # wrap_handle_tensordesc's closure over the C launcher: expand the descriptors here
        if getattr(launch, "__name__", None) != "inner" or not launch.__closure__:
            return None
        cells = dict(zip(launch.__code__.co_freevars, (c.cell_contents for c in launch.__closure__)))
        launch, meta = cells.get("launcher"), cells.get("tensordesc_meta")
        if not callable(launch) or not isinstance(meta, list) or len(meta) != len(desc_slots):
            return None
        if any(not isinstance(m, dict) or m.get("fp4_padded") for m in meta):
            return None
        if sorted(cells.get("tensordesc_indices", ())) != sorted(i for i, _, _ in desc_slots):
            return None
    return RawLaunch(launch, meta, run.launch_cooperative_grid, run.launch_pdl, args, tensor_slots, desc_slots)
