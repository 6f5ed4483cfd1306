"""Test helpers every op's tests use, whatever the op (attention-specific ones: attention_checks.py).

- :func:`assert_close_to_reference`: the flash-attn error rule. The result is compared with a
  reference computed in float64; its error may be at most ``factor`` times the error of the same
  reference computed in the input dtype, plus a small floor. A kernel that rounds like the
  reference passes; a wrong mask, index or scale (errors of 1e-3 and up) fails.
- :func:`check_gradients`: forward and backward of the op and of a reference function, in float64
  and in the input dtype, with the same random upstream gradients; every output and every input's
  gradient compared by the rule above.
- :func:`nan_like` and :func:`poisoned_allocations`: outputs poisoned with NaN before the kernel
  writes them, for ops that take ``out=`` buffers and for ops that allocate their own.
- :func:`check_bad_inputs`: a table of bad calls, each refused with the right exception and a
  message naming the argument and its shape (:func:`shape_of`), before the op runs anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import torch

#: the floor added to the bound, by dtype: relative errors a correct kernel can show where the
#: low-precision reference happens to be almost exact (float32: a single key, where
#: dS = P * (dP - delta) cancels, carries ~1e-6..5e-6 relative error in kernels and references)
TOL_FLOOR = {torch.float32: 1e-5, torch.float16: 2e-4, torch.bfloat16: 2e-3, torch.float64: 1e-12}


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``|got - ref| / |ref|`` in the Frobenius norm, computed in float64 (0 / 0 counts as 0)."""
    got, ref = got.detach().double(), ref.detach().double()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _worst(got: torch.Tensor, ref: torch.Tensor) -> str:
    """Where the largest absolute difference is, for failure messages."""
    diff = (got - ref).abs()
    if diff.numel() == 0:
        return "empty"
    flat = int(diff.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    return f"max |diff| {diff.max().item():.3e} at {index} (got {got[index].item():.6g}, want {ref[index].item():.6g})"


def assert_close_to_reference(out: torch.Tensor, ref64: torch.Tensor, ref_lowp: torch.Tensor, *, name: str = "out",
                              dtype: torch.dtype | None = None, factor: float = 3.0,
                              floor: float | None = None) -> None:
    """The flash-attn rule: ``rel_err(out, ref64) <= factor * rel_err(ref_lowp, ref64) + floor``.

    ``ref64`` is the reference computed in float64 from the same inputs, ``ref_lowp`` the same
    reference computed in the input dtype (its error is the rounding the dtype forces on anyone);
    ``floor`` defaults to :data:`TOL_FLOOR` of ``dtype`` (default: ``out``'s dtype). Errors are
    relative, in the Frobenius norm, over the entries where ``ref64`` is finite; where it is not
    (an lse of -inf for a row that sees nothing) ``out`` must hold the same value exactly, and
    anywhere else ``out`` must be finite (a NaN left in a poisoned buffer fails here).
    """
    dtype = dtype or out.dtype
    same_shape = out.shape == ref64.shape or (out.numel() == ref64.numel()
                                              and out.squeeze().shape == ref64.squeeze().shape)
    assert same_shape, f"{name}: shape {tuple(out.shape)}, the reference's {tuple(ref64.shape)}"
    got, ref, low = (t.detach().double().reshape(ref64.shape) for t in (out, ref64, ref_lowp))
    finite = torch.isfinite(ref)
    if not finite.all():
        special = ~finite
        same = torch.equal(got[special].nan_to_num(0.5), ref[special].nan_to_num(0.5))
        assert same, f"{name}: {int(special.sum())} non-finite reference values not reproduced exactly"
        got, ref, low = got[finite], ref[finite], low[finite].nan_to_num(0.0)
    bad = ~torch.isfinite(got)
    assert not bad.any(), (f"{name}: {int(bad.sum())} non-finite values of {got.numel()} "
                           f"(first at flat index {int(bad.nonzero()[0, 0])}) in a {tuple(out.shape)} {dtype} result")
    err, ref_err = rel_err(got, ref), rel_err(low, ref)
    floor = TOL_FLOOR[dtype] if floor is None else floor
    bound = factor * ref_err + floor
    assert err <= bound, (f"{name}: relative error {err:.3e} vs float64 > bound {bound:.3e} = {factor:g} x "
                          f"{ref_err:.3e} (the reference in {str(dtype).removeprefix('torch.')}) + floor {floor:.1e}; "
                          f"{_worst(got.reshape(-1), ref.reshape(-1))} of {tuple(out.shape)}")


# --- gradients -------------------------------------------------------------------------------------
@dataclasses.dataclass
class GradientCheck:
    """What :func:`check_gradients` computed, for further checks: the op's outputs and input
    gradients (by input name), the upstream gradients used, and the float64 reference's."""

    outputs: tuple[torch.Tensor, ...]
    grads: dict[str, torch.Tensor]
    upstream: tuple[torch.Tensor | None, ...]
    ref_outputs: tuple[torch.Tensor, ...]
    ref_grads: dict[str, torch.Tensor]


def _as_tuple(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _loss(outputs, upstream):
    """``sum_i <out_i, g_i>`` over the finite entries of each output (an lse of -inf is skipped)."""
    total = 0
    for out, g in zip(outputs, upstream):
        if g is None:
            continue
        out = torch.where(torch.isfinite(out.detach()), out, 0) if not out.isfinite().all() else out
        total = total + (out.to(g.dtype) * g).sum()
    return total


def _grads(outputs, upstream, leaves: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    names = list(leaves)
    grads = torch.autograd.grad(_loss(outputs, upstream), [leaves[n] for n in names], allow_unused=True)
    return {n: (torch.zeros_like(leaves[n]) if g is None else g) for n, g in zip(names, grads)}


def _copies(inputs: Mapping[str, Any], dtype: torch.dtype | None) -> dict[str, Any]:
    """Detached copies of the floating-point tensors (in ``dtype``, or their own), grad flags kept."""
    out = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            copy = value.detach().to(dtype or value.dtype, copy=True)
            out[name] = copy.requires_grad_(value.requires_grad)
        else:
            out[name] = value
    return out


def _pick(spec, name: str, default):
    if isinstance(spec, Mapping):
        return spec.get(name, default)
    return default if spec is None else spec


def check_gradients(fn: Callable[..., Any], ref_fn: Callable[..., Any], inputs: Mapping[str, Any], *,
                    out_names: Sequence[str] | None = None, factor: float | Mapping[str, float] = 3.0,
                    floor: float | Mapping[str, float] | None = None, poison: bool = False,
                    generator: torch.Generator | None = None) -> GradientCheck:
    """Forward + backward of ``fn(**inputs)`` against ``ref_fn`` run in float64 and in the inputs'
    own dtypes, with the same random upstream gradient for every floating-point output.

    ``inputs`` maps argument names to values; tensors that require grad are the ones whose
    gradients are checked (named ``"d" + name``). ``fn`` and ``ref_fn`` return a tensor or a
    tuple of tensors (named by ``out_names``, default ``out``, ``out1``, ...). Every output and
    gradient goes through :func:`assert_close_to_reference` in its tensor's dtype; ``factor`` and
    ``floor`` may be numbers or dicts by name (``{"dkey": 1e-4}``). ``poison``: run the op's
    forward and backward under :func:`poisoned_allocations`. The op's gradients are taken with
    ``torch.autograd.grad``, so the inputs' ``.grad`` stay as they were.
    """
    leaves = {n: t for n, t in inputs.items() if isinstance(t, torch.Tensor) and t.requires_grad}
    assert leaves, "check_gradients: no input requires grad"
    with poisoned_allocations() if poison else contextlib.nullcontext():
        outputs = _as_tuple(fn(**inputs))
        lost = [i for i, o in enumerate(outputs) if o.is_floating_point() and not o.requires_grad]
        assert not lost, f"outputs {lost} carry no gradient although inputs {sorted(leaves)} require one"
        upstream = tuple(
            torch.randn(o.shape, device=o.device, generator=generator).to(o.dtype)
            if o.is_floating_point() and o.requires_grad else None for o in outputs)
        grads = _grads(outputs, upstream, leaves)
    names = list(out_names or ["out"] + [f"out{i}" for i in range(1, len(outputs))])
    assert len(names) == len(outputs), f"{len(outputs)} outputs, names {names}"

    refs = {}
    for which, dtype in (("hi", torch.float64), ("lo", None)):
        copies = _copies(inputs, dtype)
        ref_outputs = _as_tuple(ref_fn(**copies))
        assert len(ref_outputs) == len(outputs), f"{len(ref_outputs)} reference outputs, {len(outputs)} of the op's"
        ref_up = tuple(None if g is None else g.to(r.dtype) for g, r in zip(upstream, ref_outputs))
        refs[which] = (ref_outputs, _grads(ref_outputs, ref_up, {n: copies[n] for n in leaves}))

    for name, out, hi, lo in zip(names, outputs, refs["hi"][0], refs["lo"][0]):
        # the floor of the dtype the reference computed in (an lse may come back in float32 from
        # float16 inputs)
        assert_close_to_reference(out, hi, lo, name=name, dtype=lo.dtype, factor=_pick(factor, name, 3.0),
                                  floor=_pick(floor, name, None))
    for name, leaf in leaves.items():
        got = grads[name]
        assert got.shape == leaf.shape and got.dtype == leaf.dtype, (
            f"d{name}: {tuple(got.shape)} {got.dtype} for an input of {tuple(leaf.shape)} {leaf.dtype}")
        assert_close_to_reference(got, refs["hi"][1][name], refs["lo"][1][name], name=f"d{name}",
                                  factor=_pick(factor, f"d{name}", 3.0), floor=_pick(floor, f"d{name}", None))
    return GradientCheck(outputs, grads, upstream, tuple(r.detach() for r in refs["hi"][0]), refs["hi"][1])


# --- NaN-poisoned outputs --------------------------------------------------------------------------
def nan_like(t: torch.Tensor, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A NaN-filled buffer like ``t`` (or of ``shape`` / ``dtype`` on its device), for ``out=``
    arguments: every element the op fails to write stays NaN and fails the comparison."""
    return torch.full(tuple(t.shape if shape is None else shape), float("nan"), dtype=dtype or t.dtype,
                      device=t.device)


class Poisoned:
    """How many allocations :func:`poisoned_allocations` filled (so a test can tell it did something)."""

    def __init__(self):
        self.count = 0


#: the allocators :func:`poisoned_allocations` wraps: (namespace, attribute)
_ALLOCATORS = ((torch, "empty"), (torch, "empty_like"), (torch, "empty_strided"), (torch.Tensor, "new_empty"))


@contextlib.contextmanager
def poisoned_allocations(ints: bool = False):
    """Inside the block, ``torch.empty``, ``torch.empty_like``, ``torch.empty_strided`` and
    ``Tensor.new_empty`` return floating-point tensors filled with NaN (and, with ``ints``,
    integer tensors filled with their dtype's largest value), so an op that allocates its own
    outputs and leaves an element unwritten fails the comparison with the reference instead of
    passing on a lucky zero. Yields a :class:`Poisoned` counting the filled tensors.

    Eager calls only (torch.compile traces must not see the patched functions); allocations
    made inside C++ operators are not affected.
    """
    poisoned = Poisoned()
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr in _ALLOCATORS]

    def wrap(original):
        def allocate(*args, **kwargs):
            t = original(*args, **kwargs)
            if isinstance(t, torch.Tensor) and t.numel() and t.device.type != "meta":
                if t.is_floating_point() or t.is_complex():
                    value = float("nan")
                elif ints and t.dtype != torch.bool:
                    value = torch.iinfo(t.dtype).max
                else:
                    return t
                with torch.no_grad():
                    t.fill_(value)
                poisoned.count += 1
            return t

        return allocate

    try:
        for owner, attr, original in saved:
            setattr(owner, attr, wrap(original))
        yield poisoned
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


# --- bad input -------------------------------------------------------------------------------------
class BadInput(NamedTuple):
    """One bad call: the arguments it changes, the exception it must raise, and the words
    (plain substrings, not patterns) its message must contain: the argument's name and its shape
    (:func:`shape_of`) or value."""

    override: dict
    error: type[BaseException]
    words: str | Sequence[str]


def shape_of(name: str, t: torch.Tensor) -> str:
    """How error messages show a tensor argument: ``"query.shape=(2, 8, 4, 16)"``."""
    return f"{name}.shape={tuple(t.shape)}"


def case_id(case) -> str:
    """A pytest id for a :class:`BadInput`: the arguments it changes and the first word it expects."""
    override, _, words = case
    first = words if isinstance(words, str) else (list(words) or [""])[0]
    return f"{'+'.join(sorted(override)) or 'defaults'}: {first}"


class _Launched(AssertionError):
    pass


@contextlib.contextmanager
def _refuse_runs(op):
    """``op.run`` and ``op.launcher`` fail the test if called (the call got past ``prepare``)."""
    if op is None:
        yield
        return

    def refuse(*args, **kwargs):
        raise _Launched(f"{op.name}: the bad call reached run/launcher instead of being refused by prepare")

    op.run, op.launcher = refuse, refuse  # instance attributes shadow the class's methods
    try:
        yield
    finally:
        del op.run, op.launcher


def check_bad_inputs(fn: Callable[..., Any], cases: Iterable, base: Mapping[str, Any] | None = None, *,
                     op=None) -> None:
    """Call ``fn(**{**base, **override})`` for each ``(override, error, words)`` case: it must raise
    ``error`` (a subclass counts) whose message contains every one of ``words``. With ``op`` (the
    Operation ``fn`` runs), the refusal must come before ``op.run`` or ``op.launcher``: from
    ``prepare``, before anything is launched or allocated. (A public function's hot path reuses
    a remembered launcher for a signature it has seen and skips both: give each case a signature
    of its own, or call ``op.prepare`` directly, to check that order.)"""
    cases = list(cases)
    assert cases, "check_bad_inputs: no cases"
    for case in cases:
        override, error, words = case
        words = [words] if isinstance(words, str) else list(words)
        kwargs = {**(base or {}), **override}
        what = f"bad input ({case_id(case)})"
        try:
            with _refuse_runs(op):
                fn(**kwargs)
        except _Launched as exc:
            raise AssertionError(f"{what}: {exc}") from None
        except error as exc:
            message = str(exc)
            missing = [w for w in words if w not in message]
            assert not missing, f"{what}: the {type(exc).__name__} message lacks {missing}: {message!r}"
        except Exception as exc:  # noqa: BLE001 - name the case in the failure
            raise AssertionError(f"{what}: expected {error.__name__}, got {type(exc).__name__}: {exc}") from exc
        else:
            raise AssertionError(f"{what}: expected {error.__name__}, the call succeeded")
