"""The autotuner: times candidate configs of an op on clones of the call's inputs.

Phases (``op.phases(inputs)``, e.g. forward then backward) are searched one after the other:
each phase's candidates are timed with the other phases at the best choice so far, so the search
costs the sum of the phase spaces, not their product. Timing is ``triton.testing.do_bench``
(CUDA events, median) after a warm-up that absorbs compilation. A candidate that fails to compile
or launch is skipped and its reason kept. Under torch.distributed rank 0 tunes and broadcasts its
choice, so every rank runs the same config.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import sys
import time
import warnings
from typing import Any

import torch

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
        value = os.environ.get("KERNELOPS_AUTOTUNE", "auto").strip().lower() or "auto"
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"KERNELOPS_AUTOTUNE must be one of auto|never|always, got {value!r}") from None


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


def _is_fake(t: torch.Tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(t, FakeTensor)


@dataclasses.dataclass
class TuneResult:
    """Outcome of one tuning run (times in ms, summed over phases)."""

    config: Any
    ms: float | None
    heuristic_ms: float | None
    runner_up: Any = None
    runner_up_ms: float | None = None
    candidates: int = 0
    failures: list[tuple[dict, str]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def speedup(self) -> float | None:
        if self.ms and self.heuristic_ms:
            return self.heuristic_ms / self.ms
        return None


class _Progress:
    """A one-line progress bar on a terminal; silent otherwise."""

    def __init__(self, label: str, total: int, enabled: bool | None):
        self.label, self.total, self.done = label, total, 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled

    def step(self, note: str = "") -> None:
        self.done += 1
        if self.enabled:
            width = 24
            filled = int(width * self.done / max(self.total, 1))
            sys.stderr.write(f"\rkernelops tune {self.label} [{'#' * filled}{'.' * (width - filled)}] "
                             f"{self.done}/{self.total} {note[:40]:<40}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


class Autotuner:
    """Times candidates; see the module docstring.

    ``budget_s`` caps the wall time spent on one key (env ``KERNELOPS_AUTOTUNE_BUDGET_S``);
    candidates left when it runs out are skipped with that reason.
    """

    def __init__(self, budget_s: float | None = None, warmup_ms: float = 10.0, rep_ms: float = 40.0,
                 progress: bool | None = None):
        self.budget_s = budget_s
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms
        self.progress = progress

    def _budget(self) -> float:
        if self.budget_s is not None:
            return self.budget_s
        return float(os.environ.get("KERNELOPS_AUTOTUNE_BUDGET_S", DEFAULT_BUDGET_S))

    def time_fn(self, fn) -> float:
        """Median ms of ``fn`` (CUDA events through triton.testing.do_bench)."""
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))

    def _time_config(self, op: Operation, inputs, config, phase: str) -> tuple[float | None, str | None]:
        try:
            fn = op.bench_fn(inputs, config, phase)
            return self.time_fn(fn), None
        except Exception as exc:  # noqa: BLE001 - any compile/launch failure skips the candidate
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
            return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"

    def tune(self, op: Operation, inputs, device: DeviceInfo) -> TuneResult:
        """Tune one call (rank 0 under torch.distributed; the others receive its result)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            payload = [None]
            if dist.get_rank() == 0:
                result = self._tune_local(op, inputs, device)
                payload = [_result_to_wire(result)]
            dist.broadcast_object_list(payload, src=0)
            return _result_from_wire(op, payload[0])
        return self._tune_local(op, inputs, device)

    def _tune_local(self, op: Operation, inputs, device: DeviceInfo) -> TuneResult:
        start = time.perf_counter()
        budget = self._budget()
        inputs = clone_inputs(inputs)
        base = op.heuristic_config(inputs, device)
        phases = op.phases(inputs)
        spaces = {ph: op.candidate_params(inputs, device, ph) for ph in phases}
        progress = _Progress(op.name, len(phases) + sum(len(s) for s in spaces.values()), self.progress)
        failures: list[tuple[dict, str]] = []
        best = base
        heuristic_ms = 0.0
        best_ms = 0.0
        runner_up, runner_up_delta = None, None
        n_timed = 0
        for phase in phases:
            base_ms, reason = self._time_config(op, inputs, base, phase)
            progress.step(f"{phase} heuristic")
            if base_ms is None:
                failures.append((base.to_dict(), f"{phase}: {reason}"))
                heuristic_ms = None
            elif heuristic_ms is not None:
                heuristic_ms += base_ms
            timed: list[tuple[float, Any]] = []
            if base_ms is not None:
                timed.append((base_ms, op.params_of(base, phase)))
            for params in spaces[phase]:
                if params == op.params_of(base, phase):
                    progress.step()
                    continue
                cfg = op.with_params(best, phase, params)
                if time.perf_counter() - start > budget:
                    failures.append((cfg.to_dict(), f"{phase}: skipped, tuning budget of {budget:.0f}s spent"))
                    progress.step("budget spent")
                    continue
                ms, reason = self._time_config(op, inputs, cfg, phase)
                progress.step(f"{phase} {ms:.3f} ms" if ms is not None else f"{phase} failed")
                n_timed += 1
                if ms is None:
                    failures.append((cfg.to_dict(), f"{phase}: {reason}"))
                else:
                    timed.append((ms, params))
            if not timed:
                continue
            timed.sort(key=lambda t: t[0])
            best = op.with_params(best, phase, timed[0][1])
            best_ms += timed[0][0]
            if len(timed) > 1 and (runner_up_delta is None or timed[1][0] - timed[0][0] < runner_up_delta):
                runner_up_delta = timed[1][0] - timed[0][0]
                runner_up = (phase, timed[1][1])
        progress.close()
        if not best_ms:
            warnings.warn(f"kernelops: every candidate of {op.name} failed; using the heuristic. "
                          f"Reasons: {[r for _, r in failures][:3]}", RuntimeWarning, stacklevel=3)
            return TuneResult(base, None, None, candidates=n_timed + len(phases), failures=failures,
                              seconds=time.perf_counter() - start)
        runner_cfg = op.with_params(best, runner_up[0], runner_up[1]) if runner_up else None
        result = TuneResult(best, best_ms, heuristic_ms or None, runner_cfg,
                            best_ms + runner_up_delta if runner_up else None,
                            candidates=n_timed + len(phases), failures=failures,
                            seconds=time.perf_counter() - start)
        speed = f", {result.speedup:.2f}x over the heuristic" if result.speedup else ""
        log.info("kernelops: tuned %s in %.1fs over %d candidates: %.4f ms%s", op.name, result.seconds,
                 result.candidates, best_ms, speed)
        return result


def _result_to_wire(result: TuneResult) -> dict:
    return {
        "config": result.config.to_dict(), "ms": result.ms, "heuristic_ms": result.heuristic_ms,
        "runner_up": result.runner_up.to_dict() if result.runner_up is not None else None,
        "runner_up_ms": result.runner_up_ms, "candidates": result.candidates,
        "failures": result.failures, "seconds": result.seconds,
    }


def _result_from_wire(op: Operation, data: dict) -> TuneResult:
    ct = op.config_type
    return TuneResult(ct.from_dict(data["config"]), data["ms"], data["heuristic_ms"],
                      ct.from_dict(data["runner_up"]) if data["runner_up"] else None, data["runner_up_ms"],
                      data["candidates"], [tuple(f) for f in data["failures"]], data["seconds"])
