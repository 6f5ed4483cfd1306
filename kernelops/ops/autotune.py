"""The autotuner: times candidate configs of an op on clones of the call's inputs.

Phases (``op.phases(inputs)``, e.g. forward then backward) are searched one after the other:
each phase's candidates are timed with the other phases at the best choice so far, so the search
costs the sum of the phase spaces, not their product.

Each phase takes two rounds, so that tuning hundreds of keys stays cheap:

1. **round 1** times every candidate briefly (:meth:`Autotuner.quick_time_fn`: a warm-up call,
   which also compiles, then a few calls measured with CUDA events, ``quick_ms`` / ``quick_reps``;
   a first call that spent under 1% of its time on the host needed no warm-up and counts);
2. **round 2** re-times the ``finalists`` fastest of round 1 plus the heuristic with the full
   ``triton.testing.do_bench`` (median, ``warmup_ms`` / ``rep_ms``; a call longer than ``rep_ms``
   is timed as the median of 3 calls instead). The winner is the best of round 2, and every
   time reported (``ms``, ``heuristic_ms``, runner-up) is a round-2 time.

A phase with at most ``finalists`` candidates besides the heuristic skips round 1 (it could
eliminate nothing). A candidate that fails to compile or launch is skipped and its reason kept.
The time budget bounds the candidates timed for the first time (round 1, or round 2 when round 1
was skipped); the heuristic is always timed, and so are round 1's finalists. The autotuner is
local to its process: under torch.distributed the selector chain has one rank resolve each key
for all (:mod:`kernelops.ops.agreement`), so every rank runs the same config.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import torch

from kernelops.ops.cache import make_entry
from kernelops.ops.device import DeviceInfo
from kernelops.ops.operation import Operation, clone_inputs

log = logging.getLogger("kernelops")

DEFAULT_BUDGET_S = 60.0


class AutotunePolicy(str, enum.Enum):
    """``auto``: tune on a cache miss when safe; ``never``: caches then heuristic;
    ``always``: ignore persisted caches and tune each key once per process."""

    AUTO = "auto"
    NEVER = "never"
    ALWAYS = "always"

    @classmethod
    def from_env(cls) -> "AutotunePolicy":
        return policy_from_env()


_ENV_POLICIES: dict[str | bytes | None, AutotunePolicy] = {None: AutotunePolicy.AUTO}
# ``os.environ.get`` costs ~0.8 us (it encodes the key and decodes the value), a sixth of the
# executor's hot path; where os.environ keeps its encoded table (CPython's posix builds), the policy
# is read from that table, which ``os.environ`` updates on every assignment (monkeypatch too)
# (os.environ replaced by another mapping, as a test may do: read through the mapping)
_ENVIRON = os.environ
_ENV_TABLE = getattr(os.environ, "_data", None)
_ENV_NAME = "KERNELOPS_AUTOTUNE"
_ENV_KEY = os.environ.encodekey(_ENV_NAME) if _ENV_TABLE is not None and hasattr(os.environ, "encodekey") else None


def policy_from_env() -> AutotunePolicy:
    """The policy ``KERNELOPS_AUTOTUNE`` names (unset: ``auto``), read on every call (the executor's
    hot path reads it): parsed once per raw value."""
    raw = _ENV_TABLE.get(_ENV_KEY) if _ENV_KEY is not None and os.environ is _ENVIRON else os.environ.get(_ENV_NAME)
    policy = _ENV_POLICIES.get(raw)
    if policy is None:
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        value = text.strip().lower() or "auto"
        try:
            policy = AutotunePolicy(value)
        except ValueError:
            raise ValueError(f"KERNELOPS_AUTOTUNE must be one of auto|never|always, got {value!r}") from None
        _ENV_POLICIES[raw] = policy
    return policy


CAPTURING = "a CUDA graph is being captured"
TRACING = "torch.compile is tracing"
FAKE_INPUTS = "inputs are fake/meta tensors"
#: refusals that pass (capture, tracing): a heuristic given for them is not remembered
TRANSIENT_BLOCKERS = (CAPTURING, TRACING, FAKE_INPUTS)


def autotune_blocker(op: Operation, inputs, device: DeviceInfo) -> str | None:
    """Why tuning is unsafe or impossible for this call right now (None: it is safe).

    Reasons in ``TRANSIENT_BLOCKERS`` pass; the others (not a GPU, nothing to tune) are final.
    """
    if not device.is_cuda:
        return f"device {device.name} is not a GPU"
    if torch.cuda.is_current_stream_capturing():
        return CAPTURING
    if torch.compiler.is_compiling():
        return TRACING
    for f in dataclasses.fields(inputs):
        value = getattr(inputs, f.name)
        if isinstance(value, torch.Tensor) and (value.is_meta or _is_fake(value)):
            return FAKE_INPUTS
    if not op.phases(inputs):
        return "this call has nothing to tune"
    return None


_CAPTURE_WARNED: set[tuple[str, str]] = set()


def warn_capture_untuned(op: Operation, inputs, key_text: str) -> bool:
    """Say, once per (op, key) and process, that a call made while a CUDA graph is captured
    would have been tuned but runs (and is captured) with the heuristic config. Calls with
    nothing to tune say nothing. Returns whether it warned."""
    marker = (op.name, key_text)
    if marker in _CAPTURE_WARNED or not op.phases(inputs):
        return False
    _CAPTURE_WARNED.add(marker)
    warnings.warn(f"kernelops: {op.name} key {key_text} has no tuned config and cannot be tuned while a CUDA graph "
                  f"is being captured, so the graph captures the heuristic config. Make the call once before "
                  f"capture (a warm-up tunes it), or set KERNELOPS_AUTOTUNE=never. (Said once per key.)",
                  RuntimeWarning, stacklevel=2)
    return True


def _is_fake(t: torch.Tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(t, FakeTensor)


@dataclasses.dataclass
class PhaseResult:
    """One phase's outcome: the winning params and round-2 times in ms."""

    params: Any
    ms: float
    heuristic_ms: float | None
    runner_up: Any = None
    runner_up_ms: float | None = None
    #: configs timed in this phase, the heuristic included (round 2's re-timings not counted)
    candidates: int = 0


@dataclasses.dataclass
class TuneResult:
    """Outcome of one tuning run (times in ms, summed over phases; per phase in ``phase_results``)."""

    config: Any
    ms: float | None
    heuristic_ms: float | None
    runner_up: Any = None
    runner_up_ms: float | None = None
    candidates: int = 0
    failures: list[tuple[dict, str]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    phase_results: dict[str, PhaseResult] = dataclasses.field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        if self.ms and self.heuristic_ms:
            return self.heuristic_ms / self.ms
        return None

    def entry(self, source: str = "autotune") -> dict:
        """This result as a cache entry (the shape of :func:`kernelops.ops.cache.make_entry`)."""
        return make_entry(self.config, ms=self.ms, heuristic_ms=self.heuristic_ms, runner_up=self.runner_up,
                          runner_up_ms=self.runner_up_ms, candidates=self.candidates, source=source)

    def for_phases(self, op: Operation, phases: tuple[str, ...]) -> "TuneResult | None":
        """The result as if only ``phases`` had been tuned (same config; times, runner-up and
        candidates over those phases), or None when one of them has no result. E.g. a training
        tune's ``("fwd",)`` part is what tuning the forward-only call would have found."""
        if not phases or any(ph not in self.phase_results for ph in phases):
            return None
        results = {ph: self.phase_results[ph] for ph in phases}
        ms, heuristic_ms, runner_up, runner_up_ms = combine_phases(op, self.config, results, phases)
        return TuneResult(self.config, ms, heuristic_ms, runner_up, runner_up_ms,
                          candidates=sum(r.candidates for r in results.values()), phase_results=results)


def combine_phases(op: Operation, config, results: dict[str, PhaseResult], phases) -> tuple:
    """``(ms, heuristic_ms, runner_up, runner_up_ms)`` of ``config`` over ``phases``: times are
    sums of the phases' round-2 times (``heuristic_ms`` None unless every phase has one); the
    runner-up swaps in the runner-up params of the phase where they come closest."""
    ms = sum(r.ms for r in results.values())
    heuristic_times = [results[ph].heuristic_ms if ph in results else None for ph in phases]
    heuristic_ms = None if None in heuristic_times else sum(heuristic_times)
    close = [(r.runner_up_ms - r.ms, ph) for ph, r in results.items() if r.runner_up is not None]
    if not close:
        return ms, heuristic_ms, None, None
    delta, phase = min(close, key=lambda t: t[0])  # the first phase wins ties
    return ms, heuristic_ms, op.with_params(config, phase, results[phase].runner_up), ms + delta


class _Progress:
    """Progress of one key: a one-line bar on a terminal (``enabled`` None: when stderr is a
    tty), or calls of ``enabled(done, total, note)`` when it is a callable."""

    def __init__(self, label: str, total: int, enabled: bool | None | Callable[[int, int, str], None]):
        self.label, self.total, self.done = label, total, 0
        self.callback = enabled if callable(enabled) else None
        self.enabled = sys.stderr.isatty() if enabled is None else bool(enabled)

    def step(self, note: str = "") -> None:
        self.done += 1
        if self.callback is not None:
            self.callback(self.done, self.total, note)
        elif self.enabled:
            width = 24
            filled = int(width * self.done / max(self.total, 1))
            sys.stderr.write(f"\rkernelops tune {self.label} [{'#' * filled}{'.' * (width - filled)}] "
                             f"{self.done}/{self.total} {note[:40]:<40}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.callback is None:
            sys.stderr.write("\n")


def _event_times(fn, n: int) -> list[float]:
    """ms of ``n`` back-to-back calls of ``fn``, each between two CUDA events (one sync at the end)."""
    events = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def _first_call_ms(fn) -> float:
    """ms of ``fn``'s first call; when that call spent more than 1% of its time on the host
    (compiling or loading a kernel, while the GPU idled between the events), it was a warm-up
    and the second call is timed instead. Long kernels thus save their warm-up call."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    host = time.perf_counter()
    fn()
    host = (time.perf_counter() - host) * 1e3
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end)
    return ms if host <= 0.01 * ms else _event_times(fn, 1)[0]


class Autotuner:
    """Times candidates in two rounds per phase; see the module docstring.

    ``budget_s`` caps the wall time spent on one key (env ``KERNELOPS_AUTOTUNE_BUDGET_S``):
    candidates not timed yet when it runs out are skipped with that reason (the heuristic and
    round 1's finalists are still timed in round 2).

    Rounds: ``warmup_ms`` / ``rep_ms`` are round 2's do_bench arguments; ``quick_ms`` /
    ``quick_reps`` bound round 1's measurement of one candidate (after its warm-up call);
    ``finalists`` is how many of round 1's fastest go to round 2 (with the heuristic).
    ``progress``: None (a bar when stderr is a terminal), a bool, or ``callback(done, total, note)``.

    ``time_fn(fn)`` (round 2) and ``quick_time_fn(fn)`` (round 1) return milliseconds; both may be
    replaced on an instance (e.g. a wall-clock timer on CPU). When only ``time_fn`` is replaced,
    round 1 uses it too.
    """

    def __init__(self, budget_s: float | None = None, warmup_ms: float = 10.0, rep_ms: float = 40.0,
                 progress: bool | None | Callable[[int, int, str], None] = None, *, finalists: int = 3,
                 quick_ms: float = 5.0, quick_reps: int = 10):
        if finalists < 1 or quick_reps < 1:
            raise ValueError(f"Autotuner: finalists and quick_reps must be >= 1, got {finalists=}, {quick_reps=}")
        self.budget_s = budget_s
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms
        self.progress = progress
        self.finalists = finalists
        self.quick_ms = quick_ms
        self.quick_reps = quick_reps

    def _budget(self) -> float:
        if self.budget_s is not None:
            return self.budget_s
        return float(os.environ.get("KERNELOPS_AUTOTUNE_BUDGET_S", DEFAULT_BUDGET_S))

    def time_fn(self, fn) -> float:
        """Round 2: median ms of ``fn`` with CUDA events, through ``triton.testing.do_bench``
        (``warmup_ms`` / ``rep_ms``). A call longer than ``rep_ms`` (where do_bench would time one
        call after seven others) is timed as the median of 3 calls instead."""
        import triton.testing

        first = _first_call_ms(fn)
        if first < self.rep_ms:
            return float(triton.testing.do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))
        return float(statistics.median([first] + _event_times(fn, 2)))

    def quick_time_fn(self, fn) -> float:
        """Round 1: the median ms of calls timed with CUDA events, as many as fit in ``quick_ms``
        (judged by the first), 1 to ``quick_reps``, after a warm-up call where one is needed."""
        if "time_fn" in self.__dict__:  # a replaced timer serves both rounds
            return self.time_fn(fn)
        first = _first_call_ms(fn)
        reps = min(self.quick_reps, max(1, int(self.quick_ms / max(first, 1e-3))))
        return float(statistics.median([first] + _event_times(fn, reps - 1)))

    def _time_config(self, op: Operation, inputs, config, phase: str, timer=None) -> tuple[float | None, str | None]:
        try:
            fn = op.bench_fn(inputs, config, phase)
            return (timer or self.time_fn)(fn), None
        except Exception as exc:  # noqa: BLE001 - any compile/launch failure skips the candidate
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
            return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"

    def tune(self, op: Operation, inputs, device: DeviceInfo) -> TuneResult:
        """Tune one call in this process, with the inputs' CUDA device current (the candidates'
        launches and the timing events and syncs must all be on the device the inputs live on)."""
        if device.is_cuda and torch.cuda.is_available() and device.index != torch.cuda.current_device():
            with torch.cuda.device(device.index):
                return self._tune_local(op, inputs, device)
        return self._tune_local(op, inputs, device)

    def _tune_local(self, op: Operation, inputs, device: DeviceInfo) -> TuneResult:
        start = time.perf_counter()
        inputs = clone_inputs(inputs)
        base = op.heuristic_config(inputs, device)
        phases = op.phases(inputs)
        spaces = {}
        for ph in phases:  # the heuristic's params and repeats are dropped: round 2 times the heuristic
            heuristic, space = op.params_of(base, ph), op.candidate_params(inputs, device, ph)
            spaces[ph] = [p for i, p in enumerate(space) if p != heuristic and p not in space[:i]]
        progress = _Progress(op.name, sum(self._steps(len(s)) for s in spaces.values()), self.progress)
        failures: list[tuple[dict, str]] = []
        best, results, attempted = base, {}, 0
        for phase in phases:
            space = spaces[phase]
            timed = _Timings(self, op, inputs, best, phase, start, progress, failures)
            if len(space) > self.finalists:
                finalists = timed.round1(space)
                progress.total -= self.finalists - len(finalists)  # fewer survivors than finalists
                result = timed.round2([op.params_of(base, phase)] + finalists, new=False)
            else:  # round 1 could not eliminate anything: every candidate goes to round 2
                result = timed.round2([op.params_of(base, phase)] + space, new=True)
            attempted += timed.attempts
            if result is not None:
                result.candidates = timed.attempts + 1
                results[phase] = result
                best = op.with_params(best, phase, result.params)
        progress.close()
        return self._summarise(op, base, best, phases, results, attempted + len(phases), failures,
                               time.perf_counter() - start)

    def _steps(self, n: int) -> int:
        """Progress steps of a phase with ``n`` candidates besides the heuristic (at most)."""
        return n + self.finalists + 1 if n > self.finalists else n + 1

    def _summarise(self, op, base, best, phases, results, candidates, failures, seconds) -> TuneResult:
        if not results:
            warnings.warn(f"kernelops: every candidate of {op.name} failed; using the heuristic. "
                          f"Reasons: {[r for _, r in failures][:3]}", RuntimeWarning, stacklevel=4)
            return TuneResult(base, None, None, candidates=candidates, failures=failures, seconds=seconds)
        best_ms, heuristic_ms, runner_up, runner_up_ms = combine_phases(op, best, results, phases)
        result = TuneResult(best, best_ms, heuristic_ms, runner_up, runner_up_ms, candidates=candidates,
                            failures=failures, seconds=seconds, phase_results=results)
        speed = f", {result.speedup:.2f}x over the heuristic" if result.speedup else ""
        log.info("kernelops: tuned %s in %.1fs over %d candidates: %.4f ms%s; winner %s", op.name, result.seconds,
                 result.candidates, best_ms, speed, best.to_dict() if hasattr(best, "to_dict") else best)
        return result


class _Timings:
    """The two rounds of one phase; ``attempts`` counts the candidates other than the heuristic
    that were timed (failures included, budget skips and round-2 re-timings not)."""

    def __init__(self, tuner: Autotuner, op: Operation, inputs, best, phase: str, start: float, progress: _Progress,
                 failures: list):
        self.tuner, self.op, self.inputs, self.best, self.phase = tuner, op, inputs, best, phase
        self.start, self.progress, self.failures = start, progress, failures
        self.budget = tuner._budget()
        self.attempts = 0

    def _time(self, params, timer, label: str, new: bool) -> float | None:
        """Time ``params`` (a ``new`` candidate is skipped once the budget is spent, and counted)."""
        cfg = self.op.with_params(self.best, self.phase, params)
        if new and time.perf_counter() - self.start > self.budget:
            self.failures.append((cfg.to_dict(), f"{self.phase}: skipped, tuning budget of {self.budget:.0f}s spent"))
            self.progress.step("budget spent")
            return None
        self.attempts += new
        ms, reason = self.tuner._time_config(self.op, self.inputs, cfg, self.phase, timer)
        self.progress.step(f"{self.phase} {label}: {ms:.3f} ms" if ms is not None else f"{self.phase} failed")
        if ms is None:
            self.failures.append((cfg.to_dict(), f"{self.phase}: {reason}"))
        return ms

    def round1(self, space: list) -> list:
        """Quick-time ``space`` while the budget lasts; the params of the fastest ``finalists``."""
        timed = []
        for params in space:
            ms = self._time(params, self.tuner.quick_time_fn, "round 1", new=True)
            if ms is not None:
                timed.append((ms, params))
        timed.sort(key=lambda t: t[0])
        return [params for _, params in timed[:self.tuner.finalists]]

    def round2(self, finalists: list, new: bool) -> PhaseResult | None:
        """Time ``finalists`` (the heuristic's params first, always timed) with the full timer;
        ``new``: no round 1 chose the others, so they count as candidates and the budget applies."""
        heuristic, timed = finalists[0], []
        for i, params in enumerate(finalists):
            ms = self._time(params, self.tuner.time_fn, "round 2", new and i > 0)
            if ms is not None:
                timed.append((ms, params))
        if not timed:
            return None
        heuristic_ms = timed[0][0] if timed[0][1] == heuristic else None
        timed.sort(key=lambda t: t[0])  # stable: the heuristic stays first among equal times
        runner = timed[1] if len(timed) > 1 else (None, None)
        return PhaseResult(timed[0][1], timed[0][0], heuristic_ms, runner[1], runner[0])

