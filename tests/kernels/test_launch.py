"""DirectLaunch (kernels/common/launch.py): its fingerprint is never coarser than Triton's own
specialisation, and a remembered launch passes the compiled launcher what JITFunction.run would."""

import itertools

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from kernelops.kernels.common import launch
from kernelops.kernels.common.launch import DirectLaunch, fingerprint

native = pytest.importorskip("triton._C.libtriton").native_specialize_impl


def _triton_spec(a):
    from triton.backends.compiler import BaseBackend

    return native(BaseBackend, a, False, True, True)


INTS = [0, 1, 2, 15, 16, 17, 32, 48, -1, -16, -17, (1 << 31) - 16, (1 << 31) - 1, 1 << 31, (1 << 31) + 16,
        -(1 << 31), -(1 << 31) - 16, (1 << 40) + 3, 1 << 40, (1 << 63) - 1, -(1 << 63), 1 << 63, (1 << 63) + 16]


def _tensors():
    base = torch.empty(64, dtype=torch.float32)
    return [base, base[1:], base[4:], base.to(torch.bfloat16), base.to(torch.bfloat16)[8:], base.to(torch.bfloat16)[1:],
            base.to(torch.float16), torch.empty(8, dtype=torch.int32)]


@pytest.mark.parametrize("values", [INTS, _tensors(), [1.0, 0.0, -2.5, True, False, None]], ids=["int", "tensor", "other"])
def test_fingerprint_never_merges_what_triton_separates(values):
    for a, b in itertools.product(values, repeat=2):
        if fingerprint((a,)) == fingerprint((b,)):
            assert _triton_spec(a) == _triton_spec(b), (a if not isinstance(a, torch.Tensor) else a.dtype, b)


def test_fingerprint_declines_unknown_types():
    assert fingerprint((1, "text")) is None
    assert fingerprint((1, [2, 3])) is None


def _probe(X, n, scale, FLAG: tl.constexpr, BLOCK: tl.constexpr = 8):
    pass


class _Compiled:
    """A stand-in compiled kernel: its launcher records what it was given."""

    def __init__(self):
        self.function, self.packed_metadata, self.calls = "fn-handle", "packed", []

    def run(self, *args):
        self.calls.append(args)


class _Driver:
    class active:  # noqa: N801 - mirrors triton.runtime.driver.driver.active
        get_current_device = staticmethod(lambda: 0)
        get_current_stream = staticmethod(lambda device: 1234)


@pytest.fixture
def probe(monkeypatch):
    """A real JITFunction whose Triton path is replaced by one that records the call and returns
    a stand-in compiled kernel (no GPU needed)."""
    jit = JITFunction(_probe)
    compiled, through_triton = _Compiled(), []

    def run(*args, grid, warmup, **kwargs):
        through_triton.append((grid, args, kwargs))
        return compiled

    monkeypatch.setattr(jit, "run", run)
    monkeypatch.setattr(launch, "driver", _Driver)
    monkeypatch.setattr(launch, "ENABLED", True)
    return DirectLaunch(jit), compiled, through_triton


def test_second_launch_skips_triton_and_passes_bound_args(probe):
    kernel, compiled, through_triton = probe
    x = torch.empty(16)
    assert kernel[(3, 2)](x, 32, 0.5, FLAG=True, num_warps=4) is compiled
    assert len(through_triton) == 1 and not compiled.calls
    kernel[(5,)](x, 48, 0.25, FLAG=True, num_warps=4)  # same specialisation: 48 is divisible by 16 too
    assert len(through_triton) == 1
    (call,) = compiled.calls
    # grid padded to three, stream, handle, metadata, no launch metadata or hooks, then every
    # parameter in signature order: positional ones, the constexpr keyword, the default BLOCK
    assert call == (5, 1, 1, 1234, "fn-handle", "packed", None, None, None, x, 48, 0.25, True, 8)


@pytest.mark.parametrize("change", ["int_class", "int_one", "constexpr", "option", "alignment", "dtype"])
def test_a_new_specialisation_goes_through_triton(probe, change):
    kernel, compiled, through_triton = probe
    x = torch.empty(32)
    args, kwargs = [x, 32, 0.5], dict(FLAG=True, num_warps=4)
    kernel[(1,)](*args, **kwargs)
    if change == "int_class":
        args[1] = 33
    elif change == "int_one":
        args[1] = 1
    elif change == "constexpr":
        kwargs["FLAG"] = False
    elif change == "option":
        kwargs["num_warps"] = 8
    elif change == "alignment":
        args[0] = x[1:]
    else:
        args[0] = x.to(torch.float16)
    kernel[(1,)](*args, **kwargs)
    assert len(through_triton) == 2 and not compiled.calls


def test_disabled_hooked_or_interpreted_launches_go_through_triton(probe, monkeypatch):
    kernel, compiled, through_triton = probe
    x = torch.empty(16)
    kernel[(1,)](x, 32, 0.5, FLAG=True)
    monkeypatch.setattr(launch, "ENABLED", False)
    kernel[(1,)](x, 32, 0.5, FLAG=True)
    monkeypatch.setattr(launch, "ENABLED", True)
    chain = triton.knobs.HookChain()
    chain.add(lambda *a: None)  # a profiler's hook: every launch must reach it
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", chain)
    kernel[(1,)](x, 32, 0.5, FLAG=True)
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: None)
    kernel[(1,)](x, 32, 0.5, FLAG=True)
    assert len(through_triton) == 4 and not compiled.calls
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", triton.knobs.HookChain())  # empty: direct again
    kernel[(1,)](x, 32, 0.5, FLAG=True)
    assert len(through_triton) == 4 and len(compiled.calls) == 1


def test_wrapper_stands_in_for_the_kernel(probe):
    kernel, _, _ = probe
    assert kernel.fn is _probe and [p.name for p in kernel.params][:2] == ["X", "n"]


# --- BoundLaunch: a launch bound once, repeated over new tensors -------------------------------
class _Desc:
    """A host tensor descriptor stand-in (what BoundLaunch reads: base, block_shape, the rest copied)."""

    def __init__(self, base, block_shape):
        self.base, self.block_shape, self.layout = base, block_shape, "swizzle-128"


def test_bound_launch_swaps_only_the_named_tensors(probe):
    kernel, compiled, through_triton = probe
    x, y = torch.empty(16), torch.empty(16)
    desc = _Desc(x, [8])
    bound = kernel.bind((4, 2), (x, 32, 0.5), dict(FLAG=True, num_warps=4), (x,))
    assert len(through_triton) == 1  # bind launches now, through Triton the first time
    assert bound(y) is compiled and len(through_triton) == 1
    assert compiled.calls[-1] == (4, 2, 1, 1234, "fn-handle", "packed", None, None, None, y, 32, 0.5, True, 8)
    with_desc = kernel.bind((1,), (desc, 16, 0.5), dict(FLAG=False), (x,))
    with_desc(y)
    rebuilt = compiled.calls[-1][9]
    assert isinstance(rebuilt, _Desc) and rebuilt is not desc and rebuilt.base is y
    assert (rebuilt.block_shape, rebuilt.layout) == ([8], "swizzle-128") and desc.base is x  # the bound one is kept


def test_bound_launch_checks_alignment_unless_promised(probe):
    kernel, compiled, through_triton = probe
    x = torch.empty(32)
    bound = kernel.bind((1,), (x, 32, 0.5), dict(FLAG=True), (x,))
    bound(x[1:])  # 4-byte offset: another specialisation, so Triton's path
    assert len(through_triton) == 2 and not compiled.calls
    promised = kernel.bind((1,), (x, 32, 0.5), dict(FLAG=True), (x,), aligned=True)  # remembered: direct
    promised(x.clone())
    assert len(through_triton) == 2 and len(compiled.calls) == 2  # (the promise is the caller's)


def test_bound_launch_refuses_a_tensor_it_was_not_told_about(probe):
    kernel, _, _ = probe
    x, stale = torch.empty(16), torch.empty(16)
    with pytest.raises(ValueError, match="not in the bound tensors"):
        kernel.bind((1,), (stale, 32, 0.5), dict(FLAG=True), (x,))


def test_bound_launch_keeps_a_constant_tensor(probe):
    """A tensor marked by ``launch.constant`` (a table made once per launch shape) stays a fixed
    argument: every call launches it, beside the call's own tensors."""
    kernel, compiled, _ = probe
    x, y, table = torch.empty(16), torch.empty(16), launch.constant(torch.arange(4, dtype=torch.int32))
    bound = kernel.bind((1,), (table, 32, 0.5), dict(FLAG=True), (x,))
    bound(y)
    assert compiled.calls[-1][9] is table
    with_both = kernel.bind((1,), (x, 32, table), dict(FLAG=True), (x,))
    with_both(y)
    assert compiled.calls[-1][9] is y and compiled.calls[-1][11] is table


def test_bound_launch_falls_back_when_disabled_or_hooked(probe, monkeypatch):
    kernel, compiled, through_triton = probe
    x = torch.empty(16)
    bound = kernel.bind((1,), (x, 32, 0.5), dict(FLAG=True), (x,))
    monkeypatch.setattr(launch, "ENABLED", False)
    bound(x)
    monkeypatch.setattr(launch, "ENABLED", True)
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda *a: None)
    bound(x)
    assert len(through_triton) == 3 and not compiled.calls


def test_observers_see_every_launch(probe, monkeypatch):
    kernel, _, _ = probe
    seen = []
    monkeypatch.setattr(launch, "observers", [seen.append])
    x = torch.empty(16)
    kernel[(1,)](x, 32, 0.5, FLAG=True)  # Triton's path
    kernel[(1,)](x, 32, 0.5, FLAG=True)  # remembered
    bound = kernel.bind((1,), (x, 32, 0.5), dict(FLAG=True), (x,))
    bound(x)
    assert seen == ["_probe"] * 4


def test_bound_launch_keeps_no_tensor_alive(probe):
    """A plan lives as long as its signature is in use: its bound launches must not hold the first
    call's tensors (or their memory) alive."""
    import weakref

    kernel, compiled, through_triton = probe
    x = torch.empty(16)
    refs = [weakref.ref(x)]
    bound = kernel.bind((1,), (x, 32, 0.5), dict(FLAG=True), (x,))
    desc_base = torch.empty(16)
    refs.append(weakref.ref(desc_base))
    with_desc = kernel.bind((1,), (_Desc(desc_base, [8]), 16, 0.5), dict(FLAG=False), (desc_base,))
    del x, desc_base
    through_triton.clear()  # the stand-ins' own records of the binding launches
    compiled.calls.clear()
    assert all(r() is None for r in refs)
    y = torch.empty(16)
    bound(y)
    with_desc(y)
    assert compiled.calls[-2][9] is y and compiled.calls[-1][9].base is y


# --- raw launches: Triton 3.6's C launcher called with the descriptors expanded once ------------
class CudaLauncher:
    """A stand-in of Triton 3.6's ``CudaLauncher`` (the class name is what raw_launcher checks):
    ``launch`` is ``wrap_handle_tensordesc``'s closure over a recording C launcher."""

    def __init__(self, meta, indices):
        self.global_scratch_size = self.profile_scratch_size = 0
        self.num_ctas, self.launch_cooperative_grid, self.launch_pdl = 1, False, True
        self.raw_calls = []
        launcher, tensordesc_meta, tensordesc_indices = (lambda *a: self.raw_calls.append(a)), meta, indices

        def inner(*args):  # never called by a raw launch: the closure is only read
            return launcher, tensordesc_meta, tensordesc_indices

        self.launch = inner


class _RawCompiled:
    function, packed_metadata = "fn-handle", "packed"

    def __init__(self, run):
        self.run = run


@pytest.fixture
def raw_driver(monkeypatch):
    """Triton 3.6's launcher protocol (base argument format, dtype map) on the driver module, and
    a fill_tma_descriptor that returns what it was asked to encode."""
    import sys

    from kernelops.kernels.common import raw_launch

    nv = pytest.importorskip("triton.backends.nvidia.driver")
    monkeypatch.setitem(sys.modules, "triton.backends.nvidia.driver", nv)
    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT", "iiiKKppOOOOOO", raising=False)
    monkeypatch.setattr(nv, "TMA_DTYPE_DEVICE_TO_HOST", {i: i + 100 for i in range(16)}, raising=False)
    monkeypatch.setattr(raw_launch, "_fill_function", lambda: lambda *a: ("map", *a))
    monkeypatch.setattr(raw_launch, "ENABLED", True)
    return raw_launch


class _HostDesc:
    def __init__(self, shape, strides, box):
        self.base, self.shape, self.strides, self.block_shape, self.padding = None, shape, strides, box, "zero"


def test_raw_launch_expands_descriptors_once_and_encodes_each_call(raw_driver):
    meta = [dict(swizzle=128, elem_size=2, elem_type=5, block_size=[64, 128], fp4_padded=False)]
    run = CudaLauncher(meta, {1})
    desc = _HostDesc([256, 512], [512, 1], [64, 128])
    # parameters: X (tensor j=1), the descriptor over tensor j=0, an int, a constexpr
    args = [None, None, 7, True]
    raw = raw_driver.raw_launcher(_RawCompiled(run), args, [(0, 1)], [(1, 0, desc)])
    assert raw is not None
    a, b = torch.empty(8), torch.empty(8)
    raw((3, 2, 1), 99, _RawCompiled(run), (a, b))
    (call,) = run.raw_calls
    base = (3, 2, 1, 99, "fn-handle", False, True, None, None, "packed", None, None, None)
    assert call[:13] == base
    # X, then the descriptor as (CUtensorMap, *shape, *strides), then the scalars
    assert call[13] is b
    assert call[14] == ("map", a.data_ptr(), 128, 2, 105, [64, 128], [256, 512], [512, 1], 0)
    assert call[15:] == (256, 512, 512, 1, 7, True)
    assert args == [None, None, 7, True]  # the bound template is left as it was


@pytest.mark.parametrize("change", ["format", "scratch", "fp4", "indices", "off", "launcher_class"])
def test_raw_launch_declines_what_it_does_not_know(raw_driver, monkeypatch, change):
    meta = [dict(swizzle=128, elem_size=2, elem_type=5, block_size=[64, 128], fp4_padded=change == "fp4")]
    run = CudaLauncher(meta, {0} if change == "indices" else {1})
    if change == "scratch":
        run.global_scratch_size = 256
    if change == "format":
        import sys

        monkeypatch.setattr(sys.modules["triton.backends.nvidia.driver"], "_BASE_ARGS_FORMAT", "iiiKKOOOO")
    if change == "off":
        monkeypatch.setattr(raw_driver, "ENABLED", False)
    compiled = _RawCompiled(run if change != "launcher_class" else object())
    desc = _HostDesc([256, 512], [512, 1], [64, 128])
    assert raw_driver.raw_launcher(compiled, [None, None, 7, True], [(0, 1)], [(1, 0, desc)]) is None

