"""Launching a compiled Triton kernel without Triton's per-call argument binding.

``kernel[grid](*args, **kwargs)`` on a ``@triton.jit`` (or ``@gluon.jit``) function runs
``JITFunction.run``: it binds and specialises every argument (type, divisibility by 16, value 1),
builds a cache key from them and the options, looks the compiled kernel up, and only then calls
its launcher. On H200 hosts that binding is tens of microseconds per launch, and a
forward+backward issues four or five launches, which makes short calls host-bound
(``benchmarks/host_time.py``).

:class:`DirectLaunch` wraps a kernel so that ``kernel[grid](...)`` keeps that meaning but, after the
first launch of a specialisation, finds the compiled kernel by a cheaper fingerprint of the same
facts Triton specialises on (Triton 3.6's ``native_specialize_impl``):

- a tensor: its dtype and whether its address is 16-byte aligned;
- an int: whether it is 1, whether it is divisible by 16, and its type (i32, i64 or u64 by range);
- a float, a bool, None: the type alone (None is a constexpr);
- a tensor descriptor: its dtype, block shape and (Gluon) shared-memory layout;
- keyword arguments (constexprs and options such as ``num_warps``): their names and values.

The fingerprint is never coarser than Triton's key, so a remembered kernel is the one Triton would
have chosen. Anything else (an argument of another type, an enter/exit launch hook such as the
Proton profiler's, the interpreter) takes Triton's own path. ``KERNELOPS_DIRECT_LAUNCH=0`` (or
setting :data:`ENABLED` to False) turns the shortcut off.

:meth:`DirectLaunch.bind` goes one step further for launchers that cache per call signature
(:class:`BoundLaunch`): the arguments are fixed once and later calls pass only the tensors that
change, so no fingerprint is taken at all.
"""

from __future__ import annotations

import os
import weakref

import torch
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from kernelops.kernels.common.raw_launch import raw_launcher

#: whether launches may skip JITFunction.run (read at each launch)
ENABLED = os.environ.get("KERNELOPS_DIRECT_LAUNCH", "1") != "0"
#: remembered specialisations per kernel before the table is dropped (packed calls vary their ints)
MAX_ENTRIES = 1024

#: callables given each launched kernel's name (tests watch which kernels a call runs); empty in use
observers: list = []

_Tensor = torch.Tensor
_I32 = (-(1 << 31), (1 << 31) - 1)
_I64 = (-(1 << 63), (1 << 63) - 1)


def fingerprint(args: tuple) -> tuple | None:
    """What Triton specialises on for positional ``args`` (see the module docstring), or None when
    an argument is of a type this does not know. An int becomes 1 when it is 1, else its
    type and divisibility: 2, plus 1 when divisible by 16, plus 2 in the i64 and 4 in the u64 range."""
    out = []
    put = out.append
    for a in args:
        t = type(a)
        if t is int:
            width = 0 if _I32[0] <= a <= _I32[1] else 2 if _I64[0] <= a <= _I64[1] else 4
            put(1 if a == 1 else 2 + (a % 16 == 0) + width)
        elif t is _Tensor or isinstance(a, _Tensor):
            put((a.dtype, a.data_ptr() % 16 == 0))
        elif t is float or t is bool or a is None:
            put(t)
        elif _is_descriptor(a):
            put((a.base.dtype, tuple(a.block_shape), getattr(a, "layout", None)))
        else:
            return None
    return tuple(out)


class DirectLaunch:
    """A Triton kernel whose ``[grid](*args, **kwargs)`` launches a remembered compiled kernel
    directly (module docstring). Every other attribute is the wrapped kernel's (``warmup``,
    ``fn``, ``src``...), so the wrapper stands in for it anywhere.

    Positional arguments must come first in the kernel's signature (as in any Python call);
    keyword arguments may be parameters (constexprs, defaults filled) or launch options."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._compiled: dict[tuple, tuple] = {}
        self._direct = isinstance(kernel, JITFunction)  # not under the interpreter

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args: tuple, kwargs: dict):
        if observers:
            _tell(self)
        if not (ENABLED and self._direct and _quiet(knobs.runtime.launch_enter_hook)
                and _quiet(knobs.runtime.launch_exit_hook)):
            return self.kernel[grid](*args, **kwargs)
        device = driver.active.get_current_device()
        spec = fingerprint(args)
        try:
            key = None if spec is None else (device, spec, tuple(kwargs.items()))
            entry = None if key is None else self._compiled.get(key)
        except TypeError:  # an unhashable keyword value: Triton's path judges it
            key = entry = None
        if entry is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if key is not None:
                self._remember(key, compiled, len(args))
            return compiled
        compiled, run, stream_of, tail = entry
        full = args + tuple([kwargs[name] if name in kwargs else default for name, default in tail])
        n = len(grid)
        run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream_of(device), compiled.function,
            compiled.packed_metadata, None, None, None, *full)
        return compiled

    def bind(self, grid, args: tuple, kwargs: dict, tensors: tuple, aligned: bool = False) -> "BoundLaunch":
        """Launch ``self[grid](*args, **kwargs)`` now and return a :class:`BoundLaunch` that
        repeats it with ``tensors`` (a tuple holding every tensor of ``args`` that changes from
        call to call, and of the bases of its tensor descriptors) replaced by the ones it is
        called with. ``aligned``: the caller guarantees that every tensor it binds and calls with
        is 16-byte aligned, so calls skip that check."""
        compiled = self.launch(grid, args, kwargs)
        return BoundLaunch(self, grid, args, kwargs, tensors, compiled, aligned)

    def _remember(self, key, compiled, positional: int) -> None:
        """Keep ``compiled`` for ``key`` when it is a CUDA compiled kernel with the launcher
        protocol this module calls (Triton 3.6-3.9); otherwise (the interpreter) keep nothing."""
        if not all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
            return
        tail = _param_tail(self, positional)
        if len(self._compiled) >= MAX_ENTRIES:
            self._compiled.clear()
        self._compiled[key] = (compiled, compiled.run, driver.active.get_current_stream, tail)


def _param_tail(kernel: DirectLaunch, positional: int) -> tuple:
    """``(name, default)`` of the kernel's parameters after its ``positional`` first ones: the
    launcher takes every parameter, so those come from the keywords or their defaults."""
    return tuple((p.name, p.default) for p in kernel.kernel.params[positional:])


def _is_descriptor(a) -> bool:
    """Whether ``a`` is a host tensor descriptor (Triton's or Gluon's)."""
    return hasattr(a, "block_shape") and hasattr(a, "base")


#: tensors a bound launch may keep as fixed arguments (:func:`constant`): id -> tensor, weakly
_CONSTANTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def constant(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t`` as a launch constant and return it: a table made once per launch shape and never
    written after (``fwd_tail``'s slot tables), which a :class:`BoundLaunch` keeps among its fixed
    arguments instead of taking it per call like the bound tensors."""
    _CONSTANTS[id(t)] = t
    return t


def _aligned(tensors) -> tuple:
    """The 16-byte alignment of each tensor of ``tensors`` (None entries: None)."""
    return tuple(None if t is None else t.data_ptr() % 16 == 0 for t in tensors)


def _rebased(desc, base):
    """A copy of the host tensor descriptor ``desc`` over ``base`` (same shape, strides, box and
    layout: the caller's signature fixes them), without the constructor's checks."""
    new = object.__new__(type(desc))
    new.__dict__.update(desc.__dict__)
    new.base = base
    return new


class BoundLaunch:
    """One launch of a :class:`DirectLaunch` kernel with its grid, keyword arguments and every
    positional argument fixed but the tensors named at binding (``tensors``): calling it with
    another tuple of that shape launches the same compiled kernel over those tensors (a tensor
    marked by :func:`constant` stays a fixed argument). Tensor descriptors whose base is one of
    them are rebuilt over the new tensor with the same shape, strides, box and layout.

    The caller's contract (a per-signature plan): the new tensors have the bound ones' dtypes,
    shapes and strides. Their 16-byte alignment, which Triton specialises on, is checked here
    unless the caller guarantees it (``aligned``): a call whose alignment differs goes through
    :meth:`DirectLaunch.launch`, as do calls with a launch hook set, with :data:`ENABLED` off, on
    another current device, or under the interpreter."""

    def __init__(self, kernel: DirectLaunch, grid, args: tuple, kwargs: dict, tensors: tuple, compiled,
                 aligned: bool = False):
        index = {id(t): j for j, t in enumerate(tensors) if t is not None}
        self._tensor_slots, self._desc_slots = [], []
        template = list(args)  # the tensors' slots are left None: a plan must not hold them alive
        for i, a in enumerate(args):
            desc = not isinstance(a, _Tensor) and _is_descriptor(a)
            if not (desc or isinstance(a, _Tensor)):
                continue
            if id(a.base if desc else a) not in index:  # a stale tensor would be launched again
                if not desc and _CONSTANTS.get(id(a)) is a:  # (held by the template: fixed for the launch)
                    continue
                raise ValueError(f"argument {i} of {kernel.kernel} is a tensor (or descriptor) not in the bound tensors")
            if desc:  # kept without its base
                self._desc_slots.append((i, index[id(a.base)], _rebased(a, None)))
            else:
                self._tensor_slots.append((i, index[id(a)]))
            template[i] = None
        self.kernel, self.grid, self.kwargs, self._positional = kernel, tuple(grid), kwargs, len(args)
        self._alignment = None if aligned else _aligned(tensors)
        self._run = self._raw = None
        if kernel._direct and all(hasattr(compiled, n) for n in ("run", "function", "packed_metadata")):
            tail = [kwargs[name] if name in kwargs else default for name, default in _param_tail(kernel, len(args))]
            self._args = template + tail
            self._run, self._compiled = compiled.run, compiled
            self._device = driver.active.get_current_device()
            self._stream_of = driver.active.get_current_stream
            self._grid3 = self.grid + (1,) * (3 - len(self.grid))
            self._raw = raw_launcher(compiled, self._args, self._tensor_slots, self._desc_slots)
        else:
            self._args = template

    def __call__(self, *tensors):
        direct = (self._run is not None and ENABLED
                  and (self._alignment is None or _aligned(tensors) == self._alignment)
                  and _quiet(knobs.runtime.launch_enter_hook) and _quiet(knobs.runtime.launch_exit_hook)
                  and driver.active.get_current_device() == self._device)
        if direct and self._raw is not None and not observers:
            self._raw(self._grid3, self._stream_of(self._device), self._compiled, tensors)
            return self._compiled
        args = self._args.copy()
        for i, j in self._tensor_slots:
            args[i] = tensors[j]
        for i, j, desc in self._desc_slots:
            args[i] = _rebased(desc, tensors[j])
        if not direct:
            return self.kernel.launch(self.grid, tuple(args[:self._positional]), self.kwargs)
        if observers:
            _tell(self.kernel)
        compiled = self._compiled
        g0, g1, g2 = self._grid3
        self._run(g0, g1, g2, self._stream_of(self._device), compiled.function, compiled.packed_metadata, None, None,
                  None, *args)
        return compiled


def _tell(kernel) -> None:
    name = getattr(kernel.kernel if isinstance(kernel, DirectLaunch) else kernel, "__name__", "?")
    for observe in observers:
        observe(name)


def _quiet(hook) -> bool:
    """Whether a launch hook slot holds nothing to call (None, or Triton's empty ``HookChain``)."""
    return hook is None or (isinstance(hook, knobs.HookChain) and not hook.calls)


def direct_launch(kernel) -> DirectLaunch:
    """Wrap a ``@triton.jit`` / ``@gluon.jit`` kernel in :class:`DirectLaunch` (a decorator)."""
    return DirectLaunch(kernel)
