"""``kernelops bench``: a kernelops op timed side by side with torch SDPA backends and FlexAttention.

Each call is a :class:`~kernelops.tuning.specs.AttentionSpec` (the ``--shapes`` grammar of
``kernelops tune``; its ``train`` flag is ignored here: ``modes`` decides). The spec fixes one
attention (mask: bottom-right causal, sliding window, as ``flash_attention`` reads them); every
implementation expresses it through its own arguments and gets fresh random inputs (normal,
never zeros) in its native layout, contiguous:

- ``kernelops``: the public function of the benched op (one of :data:`OPS`) on ``[B, S, H, D]``
  (BSHD), config chosen by the default executor, as a user's call would get it.
  :func:`kernelops.flash_attention` and :func:`kernelops.attention` (its output; the weights are
  computed and dropped) take ``causal`` and ``sliding_window``;
  :func:`kernelops.scaled_dot_product_attention` takes ``causal=True`` when ``Sq == Sk`` (its
  causal mask is top-left aligned, the same then) and a boolean ``[Sq, Sk]`` ``attention_mask``
  for a window or a causal mask with ``Sq != Sk``;
- ``sdpa-cudnn``, ``sdpa-flash``, ``sdpa-efficient``, ``sdpa-math``: ``torch.nn.functional.
  scaled_dot_product_attention`` on ``[B, H, S, D]`` (BHSD) restricted to one backend with
  ``torch.nn.attention.sdpa_kernel``; GQA through ``enable_gqa``; causal with ``Sq != Sk`` through
  ``causal_lower_right`` (kernelops aligns causal masks bottom-right); a sliding window as a
  boolean mask. A backend that refuses the call is reported with its reason;
- ``flex``: ``torch.nn.attention.flex_attention`` with a ``mask_mod`` of the same mask, compiled
  with ``torch.compile`` on CUDA (``torch._dynamo.reset()`` before each spec), eager on CPU
  (forward only there: FlexAttention has no CPU backward).

Modes: ``fwd`` times the forward on inputs without gradients; ``fwd+bwd`` times the forward and
``torch.autograd.grad`` of the output with a fixed random output gradient.

Timing: on CUDA ``triton.testing.do_bench`` (median, after one untimed call that absorbs
compilation and tuning); on CPU the median wall-clock time of at least 3 calls (after one
untimed call). FLOPs: ``4 * B * Hq * Sq * Sk * D`` for the forward, half that when causal, and
``4 * B * Hq * D * (visible query/key pairs)`` with a sliding window; forward+backward counts 3.5
times the forward. ``speedup`` is the implementation's time over kernelops' (above 1: kernelops
is faster). ``max_abs_diff`` is the largest forward output difference to kernelops'.

>>> from kernelops.tuning.specs import parse_attention_shape
>>> rows = run_bench([parse_attention_shape("B=1,S=64,Hq=4,Hkv=2,D=16,dtype=fp32,causal=1")],
...                  impls=("kernelops", "sdpa-math"), device="cpu",
...                  op="scaled_dot_product_attention")                  # doctest: +SKIP
>>> print(format_table(rows))                                             # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib
import re
import statistics
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

if TYPE_CHECKING:
    import torch

#: the ops ``kernelops bench`` times (their public functions fill the "kernelops" column)
OPS = ("flash_attention", "scaled_dot_product_attention", "attention")
IMPLS = ("kernelops", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math", "flex")
MODES = ("fwd", "fwd+bwd")
_SDPA_BACKENDS = {"sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-flash": "FLASH_ATTENTION",
                  "sdpa-efficient": "EFFICIENT_ATTENTION", "sdpa-math": "MATH"}


def default_impls(cuda: bool) -> tuple[str, ...]:
    """Every fused implementation on CUDA (SDPA's math backend left out); on CPU kernelops, SDPA's
    math backend and eager FlexAttention."""
    return tuple(name for name in IMPLS if name != "sdpa-math") if cuda else ("kernelops", "sdpa-math", "flex")


@dataclasses.dataclass
class BenchRow:
    """One timed (or refused) implementation for one spec and mode."""

    spec: str  # the spec in --shapes syntax
    summary: str
    impl: str
    mode: str
    ms: float | None = None
    tflops: float | None = None
    speedup: float | None = None  # ms / kernelops' ms
    max_abs_diff: float | None = None
    note: str = ""
    op: str = "flash_attention"  # the kernelops op of the "kernelops" row (one of OPS)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- masks and FLOPs -------------------------------------------------------------------------------
def window_bounds(spec) -> tuple[int | None, int | None]:
    """``(left, right)`` of the spec's mask: query ``i`` sees key ``j`` iff
    ``-left <= j - (i + Sk - Sq) <= right`` (None: unbounded), as ``flash_attention`` reads
    ``causal`` and ``sliding_window``."""
    left = spec.window
    right = 0 if spec.causal else spec.window
    return left, right


def visible_mask(seq_q: int, seq_k: int, left: int | None, right: int | None, device="cpu") -> torch.Tensor:
    """Boolean ``[Sq, Sk]``: True where query ``i`` sees key ``j`` (bottom-right aligned)."""
    import torch

    i = torch.arange(seq_q, device=device)[:, None]
    j = torch.arange(seq_k, device=device)[None, :]
    rel = j - (i + seq_k - seq_q)
    mask = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if left is not None:
        mask &= rel >= -left
    if right is not None:
        mask &= rel <= right
    return mask


def visible_pairs(seq_q: int, seq_k: int, left: int | None, right: int | None) -> int:
    """How many (query, key) pairs a mask lets through (exact, no ``[Sq, Sk]`` tensor)."""
    import torch

    i = torch.arange(seq_q, dtype=torch.int64)
    diag = i + seq_k - seq_q
    lo = torch.zeros_like(i) if left is None else (diag - left).clamp(min=0)
    hi = torch.full_like(i, seq_k - 1) if right is None else (diag + right).clamp(max=seq_k - 1)
    return int((hi - lo + 1).clamp(min=0).sum())


def attention_flops(spec, mode: str = "fwd") -> float:
    """FLOPs of one call: ``4 * B * Hq * Sq * Sk * D`` forward, half when causal, the visible
    pairs with a sliding window; ``fwd+bwd`` is 3.5x the forward."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if spec.window is not None:
        pairs = visible_pairs(spec.seq_q, spec.seq_k, *window_bounds(spec))
    else:
        pairs = spec.seq_q * spec.seq_k / (2 if spec.causal else 1)
    flops = 4.0 * spec.batch * spec.heads_q * spec.head_dim * pairs
    return flops * (3.5 if mode == "fwd+bwd" else 1.0)


# --- implementations ---------------------------------------------------------------------------------
class Unsupported(RuntimeError):
    """An implementation cannot run this call here (the reason is the message)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


@dataclasses.dataclass
class KernelopsCall:
    """``run(q, k, v)`` of the "kernelops" column: a public function called with the keyword
    arguments that express the spec (``first_output``: it returns ``(output, ...)``)."""

    fn: Callable
    operation: Any  # the function's Operation, for explain
    kwargs: dict[str, Any]
    first_output: bool = False

    def __call__(self, q, k, v):
        out = self.fn(q, k, v, **self.kwargs)
        return out[0] if self.first_output else out

    def explain(self, q, k, v) -> str:
        """Which platform and selector the default executor picks for this call."""
        from kernelops.ops import default_executor

        try:
            how = default_executor().explain(self.operation, query=q, key=k, value=v, **self.kwargs)
        except Exception as exc:  # noqa: BLE001 - the call itself reports the real error
            return _first_line(exc)
        return f"platform {how.platform}, config from '{how.selector}'"


def _sdpa_mask(spec, device, *, lower_right_bias: bool) -> tuple[Any, bool, str]:
    """The spec's mask in torch SDPA's terms: ``(mask or None, is_causal, note)``. A window is a
    boolean ``[Sq, Sk]`` mask; causal is ``is_causal`` when ``Sq == Sk`` (top-left and bottom-right
    agree), else torch's ``causal_lower_right`` bias (``lower_right_bias``) or a boolean mask."""
    left, right = window_bounds(spec)
    if spec.window is not None:
        return visible_mask(spec.seq_q, spec.seq_k, left, right, device), False, "window as a boolean [Sq, Sk] mask"
    if not spec.causal:
        return None, False, ""
    if spec.seq_q == spec.seq_k:
        return None, True, ""
    if lower_right_bias:
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(spec.seq_q, spec.seq_k), False, ""
    return visible_mask(spec.seq_q, spec.seq_k, left, right, device), False, "causal as a boolean [Sq, Sk] mask"


def _kernelops(spec, device, op: str) -> tuple[str, KernelopsCall, str]:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; kernelops bench knows: {', '.join(OPS)}")
    module = importlib.import_module(f"kernelops.modules.{op}")  # the function `op`, its Operation `op.upper()`
    if op == "scaled_dot_product_attention":
        mask, causal, note = _sdpa_mask(spec, device, lower_right_bias=False)
        kwargs = {"attention_mask": mask, "causal": causal}
    else:
        kwargs = {"causal": spec.causal, "sliding_window": spec.window}
        note = "weights materialised" if op == "attention" else ""
    call = KernelopsCall(getattr(module, op), getattr(module, op.upper()), kwargs, first_output=op == "attention")
    return "bshd", call, note


def _refusal_reasons(caught) -> str:
    """The reasons in SDPA's "kernel not used" warnings, without their headers and source locations."""
    reasons = []
    for w in caught:
        text = re.sub(r"\s*\(Triggered internally at [^)]*\)\.?", "", str(w.message)).strip()
        if text and not text.endswith("because:") and text not in reasons:
            reasons.append(text.splitlines()[0])
    return "; ".join(reasons[:3])


def _sdpa(name: str, spec, device) -> tuple[str, Callable, str]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    backend = getattr(SDPBackend, _SDPA_BACKENDS[name])
    mask, causal, note = _sdpa_mask(spec, device, lower_right_bias=True)
    kwargs = {"attn_mask": mask, "is_causal": causal, "enable_gqa": spec.heads_q != spec.heads_kv}

    def run(q, k, v):
        with sdpa_kernel(backend), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return scaled_dot_product_attention(q, k, v, **kwargs)
            except RuntimeError as exc:  # "no available kernel": the warnings say why
                raise Unsupported(_refusal_reasons(caught) or _first_line(exc)) from None

    return "bhsd", run, note


def _block_mask(create_block_mask, mask_mod, spec, device):
    """FlexAttention's block mask; on CUDA built compiled (eager building evaluates ``Sq * Sk``
    elements), through ``_compile=True`` where this torch still takes it (deprecated)."""
    import torch

    if torch.device(device).type != "cuda":
        return create_block_mask(mask_mod, None, None, spec.seq_q, spec.seq_k, device=device)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*_compile flag on create_block_mask.*")
            return create_block_mask(mask_mod, None, None, spec.seq_q, spec.seq_k, device=device, _compile=True)
    except TypeError:  # a torch without the flag
        return torch.compile(create_block_mask)(mask_mod, None, None, spec.seq_q, spec.seq_k, device=device)


def _flex(spec, device) -> tuple[str, Callable, str]:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    left, right = window_bounds(spec)
    offset = spec.seq_k - spec.seq_q
    block_mask = None
    if left is not None or right is not None:
        def mask_mod(b, h, q_idx, kv_idx):
            rel = kv_idx - (q_idx + offset)
            if left is None:
                return rel <= right
            if right is None:
                return rel >= -left
            return (rel >= -left) & (rel <= right)

        block_mask = _block_mask(create_block_mask, mask_mod, spec, device)
    if torch.device(device).type == "cuda":
        torch._dynamo.reset()  # a fresh compile per spec: no recompile limits, no stale guards
        fn, note = torch.compile(flex_attention, dynamic=False), "compiled"
    else:
        fn, note = flex_attention, "eager (unfused) on CPU"
    gqa = spec.heads_q != spec.heads_kv

    def run(q, k, v):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            return fn(q, k, v, block_mask=block_mask, enable_gqa=gqa)

    return "bhsd", run, note


def build_impl(name: str, spec, device, op: str = "flash_attention") -> tuple[str, Callable, str]:
    """``(layout, run, note)``: ``run(q, k, v)`` computes ``spec``'s attention in ``layout``
    ("bshd" or "bhsd") with implementation ``name`` (one of :data:`IMPLS`; "kernelops" calls the
    public function of ``op``, one of :data:`OPS`); ``note`` says how (e.g. "compiled"), or is empty."""
    if name == "kernelops":
        return _kernelops(spec, device, op)
    if name in _SDPA_BACKENDS:
        return _sdpa(name, spec, device)
    if name == "flex":
        return _flex(spec, device)
    raise ValueError(f"unknown implementation {name!r}; known: {', '.join(IMPLS)}")


def make_inputs(spec, device, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random normal ``q [B, Sq, Hq, D]``, ``k, v [B, Sk, Hkv, D]`` of the spec's dtype (BSHD)."""
    import torch

    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    dtype = getattr(torch, spec.dtype)

    def tensor(seq, heads):
        return torch.randn(spec.batch, seq, heads, spec.head_dim, device=device, generator=gen).to(dtype)

    return tensor(spec.seq_q, spec.heads_q), tensor(spec.seq_k, spec.heads_kv), tensor(spec.seq_k, spec.heads_kv)


def _to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A new contiguous leaf copy of BSHD ``t`` in ``layout``."""
    t = t.detach()
    return t.transpose(1, 2).contiguous() if layout == "bhsd" else t.clone()


def _to_bshd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.transpose(1, 2) if layout == "bhsd" else t


# --- timing -----------------------------------------------------------------------------------------
def cuda_timer(warmup_ms: float = 25, rep_ms: float = 100) -> Callable[[Callable], float]:
    """``triton.testing.do_bench`` median, in ms."""
    def time_fn(fn) -> float:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))

    return time_fn


def cpu_timer(rep_ms: float = 100, min_reps: int = 3, max_reps: int = 100) -> Callable[[Callable], float]:
    """Median wall-clock ms of ``min_reps`` to ``max_reps`` calls (until ``rep_ms`` have passed)."""
    def time_fn(fn) -> float:
        times: list[float] = []
        begin = time.perf_counter()
        while len(times) < min_reps or (len(times) < max_reps and (time.perf_counter() - begin) * 1e3 < rep_ms):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    return time_fn


def _call(run, q, k, v, mode: str, grad_out):
    """The zero-argument callable timed for ``mode`` (inputs already in the implementation's layout)."""
    import torch

    if mode == "fwd":
        return lambda: run(q, k, v)
    return lambda: torch.autograd.grad(run(q, k, v), (q, k, v), grad_out)


def bench_one(spec, impl: str, mode: str, device, inputs, grad_out, timer, *, reference: torch.Tensor | None = None,
              op: str = "flash_attention") -> tuple[BenchRow, torch.Tensor | None]:
    """Time one implementation on one spec and mode; ``(row, forward output in BSHD or None)``.

    ``inputs`` are ``(q, k, v)`` in BSHD and ``grad_out`` ``[B, Sq, Hq, D]`` (used by ``fwd+bwd``);
    each implementation gets its own contiguous copies in its layout. One that cannot run gives a
    row with ``ms=None`` and the reason in ``note``.
    """
    import torch

    row = BenchRow(spec.text(), spec.summary(mode == "fwd+bwd"), impl, mode, op=op)
    if mode == "fwd+bwd" and impl == "flex" and torch.device(device).type != "cuda":
        row.note = "skipped: FlexAttention has no backward on CPU"
        return row, None
    out = None
    try:
        layout, run, row.note = build_impl(impl, spec, device, op)
        q, k, v = (_to_layout(t, layout).requires_grad_(mode == "fwd+bwd") for t in inputs)
        if isinstance(run, KernelopsCall):
            row.note = "; ".join(filter(None, [run.explain(q, k, v), row.note]))
        fn = _call(run, q, k, v, mode, _to_layout(grad_out, layout))
        with torch.no_grad() if mode == "fwd" else contextlib.nullcontext():
            first = fn()  # untimed: compiles, tunes
            if mode == "fwd":
                out = _to_bshd(first, layout)
            del first
            row.ms = timer(fn)
    except Exception as exc:  # noqa: BLE001 - a refusal is a row, not a failure of the whole bench
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
        note = str(exc) if isinstance(exc, Unsupported) else _first_line(exc)
        row.note = f"{row.note}; {note}" if row.note else note
        return row, None
    row.tflops = attention_flops(spec, mode) / row.ms / 1e9
    if out is not None and reference is not None:
        row.max_abs_diff = float((out.float() - reference.float()).abs().max())
    return row, out


def run_bench(specs: Iterable, *, impls: Sequence[str] | None = None, modes: Sequence[str] = ("fwd",),
              device=None, timer: Callable[[Callable], float] | None = None,
              on_row: Callable[[BenchRow], None] | None = None, seed: int | None = None,
              op: str = "flash_attention") -> list[BenchRow]:
    """Bench every spec in every mode with every implementation (kernelops first, since the others'
    speed-up and output difference are relative to it); the "kernelops" rows call ``op``'s public
    function (one of :data:`OPS`)."""
    import torch

    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; kernelops bench knows: {', '.join(OPS)}")
    cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    device = torch.device(device if device is not None else ("cuda" if cuda else "cpu"))
    impls = list(impls) if impls is not None else list(default_impls(cuda))
    for name in impls:
        if name not in IMPLS:
            raise ValueError(f"unknown implementation {name!r}; known: {', '.join(IMPLS)}")
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    impls = ["kernelops"] + [name for name in impls if name != "kernelops"]
    if timer is None:
        timer = cuda_timer() if cuda else cpu_timer()
    rows = []
    for spec in specs:
        inputs = make_inputs(spec, device, seed)
        grad = torch.randn(spec.batch, spec.seq_q, spec.heads_q, spec.head_dim, device=device).to(inputs[0].dtype)
        for mode in modes:
            reference, base = None, None
            for impl in impls:
                row, out = bench_one(spec, impl, mode, device, inputs, grad, timer, reference=reference, op=op)
                if impl == "kernelops":
                    reference, base = out, row.ms
                    if out is not None:
                        row.max_abs_diff = 0.0
                if row.ms is not None and base is not None:
                    row.speedup = row.ms / base
                rows.append(row)
                if on_row is not None:
                    on_row(row)
                del out
    return rows


# --- output -------------------------------------------------------------------------------------------
def format_table(rows: Sequence[BenchRow]) -> str:
    """The side-by-side table: one block per spec and mode, one line per implementation."""
    header = ("call", "impl", "ms", "TFLOP/s", "kernelops speed-up", "max|diff|", "note")
    lines_in = []
    previous = None
    for r in rows:
        label = f"{r.summary}" if (r.spec, r.mode) != previous else ""
        previous = (r.spec, r.mode)
        lines_in.append((label, r.impl, "-" if r.ms is None else f"{r.ms:.3f}",
                         "-" if r.tflops is None else f"{r.tflops:.3g}",
                         "-" if r.speedup is None else f"{r.speedup:.2f}x",
                         "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.1e}", r.note))
    widths = [max(len(x[i]) for x in [header] + lines_in) for i in range(len(header) - 1)]
    out = []
    for cells in [header] + lines_in:
        left = [cells[0].ljust(widths[0]), cells[1].ljust(widths[1])]
        right = [c.rjust(w) for c, w in zip(cells[2:-1], widths[2:])]
        out.append("  ".join(left + right + [cells[-1]]).rstrip())
    return "\n".join(out)


def bench_report(rows: Sequence[BenchRow], device=None) -> dict[str, Any]:
    """The machine-readable result: device, versions, date and every row."""
    from kernelops.ops.device import device_info, versions

    dev = device_info(device)
    return {
        "device": dev.name, "capability": None if dev.capability is None else list(dev.capability),
        **versions(), "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "flops": "4*B*Hq*Sq*Sk*D forward (half causal, visible pairs with a window); fwd+bwd = 3.5x",
        "speedup": "ms / kernelops ms (above 1: kernelops is faster)",
        "rows": [r.to_dict() for r in rows],
    }
