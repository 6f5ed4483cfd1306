"""Tune a list of call specs and hand the winners to a sink (:mod:`kernelops.tuning.sinks`):
shipped-format files (``--export``) or the user's disk cache.

A training spec (tensors that require grad) is tuned forward and backward. Its forward phase is
timed exactly as a forward-only call's would be, so it also gives the entry of the call's
inference key: the key of the same call under ``torch.no_grad()`` (for ``flash_attention`` that
flips ``train`` to False). That entry is written too, with ``"derived_from"`` naming the
training key.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import statistics
import time
import warnings
from typing import Any, Callable

import torch

from kernelops.ops.autotune import Autotuner, TuneResult
from kernelops.ops.device import DeviceInfo, device_info
from kernelops.ops.keys import Key, key_text
from kernelops.ops.operation import Operation
from kernelops.tuning.specs import parse_since


@dataclasses.dataclass
class Outcome:
    """One row of the summary: a tuned key, an entry derived from one, or a spec that failed."""

    spec: Any
    key: str
    heuristic_ms: float | None = None
    ms: float | None = None
    seconds: float = 0.0
    written: str = ""
    train: bool = True
    derived_from: str | None = None
    error: str | None = None

    @property
    def speedup(self) -> float | None:
        return self.heuristic_ms / self.ms if self.ms and self.heuristic_ms else None


@dataclasses.dataclass
class RunReport:
    """What :func:`tune_specs` did: the rows, and how many specs were left when it stopped."""

    outcomes: list[Outcome]
    left: int = 0
    stopped: str | None = None  # why it stopped early ("time limit", "interrupted")

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is not None]


def tuning_device() -> DeviceInfo | None:
    """The device to tune on: the current CUDA device; without one, the CPU when Triton's
    interpreter is on (``TRITON_INTERPRET=1``, for tests); else None (nothing can be tuned)."""
    if torch.cuda.is_available():
        return device_info("cuda")
    return device_info("cpu") if os.environ.get("TRITON_INTERPRET") == "1" else None


def tuning_platform(device: DeviceInfo) -> str:
    """The ``platform`` argument for specs on ``device``: Triton is forced on the CPU (the
    interpreter), where ``auto`` would pick the untunable torch platform."""
    return "auto" if device.is_cuda else "triton"


def wall_clock_timer(reps: int = 1) -> Callable[[Callable], float]:
    """A timer for the Triton interpreter on CPU: one warm-up call, then the median ms of
    ``reps`` calls by the wall clock."""
    def time_fn(fn) -> float:
        fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    return time_fn


def derived_inference_entry(op: Operation, inputs, result: TuneResult) -> tuple[Key, dict] | None:
    """``(key, entry)`` of the inference variant of a training call, from the tune's phases.

    The inference variant is the same call under ``torch.no_grad()``; it gets an entry when its
    key differs from the call's and every phase it would tune was tuned here (for flash_attention:
    ``fwd``, timed identically with or without gradients). The config is the tuned one (its
    backward params are unused without gradients).
    """
    key = op.key(inputs)
    with torch.no_grad():
        inference_key, phases = op.key(inputs), op.phases(inputs)
    if inference_key == key:
        return None
    part = result.for_phases(op, phases)
    if part is None:
        return None
    return inference_key, {**part.entry(), "derived_from": key_text(key)}


def torch_device(device: DeviceInfo) -> torch.device:
    """The torch device a :class:`DeviceInfo` describes."""
    return torch.device("cuda", device.index) if device.is_cuda else torch.device(device.type)


def spec_key_text(op: Operation, spec) -> str:
    """The key text a spec tunes (its training key), built on the meta device: no memory, no GPU."""
    return key_text(op.key(op.prepare(**spec.kwargs(torch.device("meta")))))


def tuned_since(entries: dict[str, dict], since: datetime.datetime, versions: dict[str, str]) -> set[str]:
    """Key texts of ``entries`` (a shipped-format file's) that were tuned at or after ``since``
    by these kernelops/torch/triton ``versions``: what a resumed campaign keeps."""
    kept = set()
    for text, entry in entries.items():
        try:
            created = parse_since(str(entry.get("created", "")))
        except ValueError:
            continue
        same = all(entry.get("versions", {}).get(name) == value for name, value in versions.items())
        if same and created >= since:
            kept.add(text)
    return kept


def resume_split(op: Operation, specs: list, kept_keys: set[str]) -> tuple[list, list]:
    """``(to_tune, kept)``: the specs whose training key is not in ``kept_keys``, and those that are."""
    to_tune, kept = [], []
    for spec in specs:
        (kept if spec_key_text(op, spec) in kept_keys else to_tune).append(spec)
    return to_tune, kept


def _error_text(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def tune_one(op: Operation, spec, *, device: DeviceInfo, tuner: Autotuner, sink) -> list[Outcome]:
    """Tune one spec on ``device``; its rows (the tuned key, a derived inference key) or one failed row."""
    start = time.perf_counter()
    row = Outcome(spec, "", train=getattr(spec, "train", True))
    try:
        inputs = op.prepare(**spec.kwargs(torch_device(device), tuning_platform(device)))
        row.key = key_text(op.key(inputs))
        if not op.phases(inputs):
            raise RuntimeError("nothing to tune: this call does not run a tunable (Triton) kernel here")
        with warnings.catch_warnings():  # "every candidate failed" is reported in the row instead
            warnings.simplefilter("ignore", RuntimeWarning)
            result = tuner.tune(op, inputs, device)
    except Exception as exc:  # noqa: BLE001 - one bad spec is reported, the others still run
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
        row.error, row.seconds = _error_text(exc), time.perf_counter() - start
        return [row]
    row.seconds = time.perf_counter() - start
    if result.ms is None:
        row.error = "every candidate failed: " + "; ".join(r for _, r in result.failures[:2])
        return [row]
    row.heuristic_ms, row.ms = result.heuristic_ms, result.ms
    row.written = sink.put(op.key(inputs), inputs, {**result.entry(), "spec": spec.text()})
    rows = [row]
    derived = derived_inference_entry(op, inputs, result)
    if derived is not None:
        key, entry = derived
        rows.append(Outcome(spec, key_text(key), entry["heuristic_ms"], entry["ms"], 0.0,
                            sink.put(key, inputs, entry), train=False, derived_from=row.key))
    return rows


def tune_specs(op: Operation, specs: list, *, device: DeviceInfo, tuner: Autotuner, sink,
               limit_s: float | None = None, on_spec=None, on_rows=None,
               clock: Callable[[], float] = time.monotonic) -> RunReport:
    """Tune ``specs`` one after the other, writing each winner to ``sink``.

    Stops before a spec once ``limit_s`` seconds have passed (and on Ctrl-C); what was tuned is
    written either way (``sink.close()``). ``on_spec(i, spec)`` is called before each spec and
    ``on_rows(rows)`` after it.
    """
    report, i = RunReport([]), 0
    start = clock()
    try:
        for i, spec in enumerate(specs):
            if limit_s is not None and clock() - start >= limit_s:
                report.left, report.stopped = len(specs) - i, "time limit"
                break
            if on_spec is not None:
                on_spec(i, spec)
            rows = tune_one(op, spec, device=device, tuner=tuner, sink=sink)
            report.outcomes += rows
            if on_rows is not None:
                on_rows(rows)
    except KeyboardInterrupt:
        report.left, report.stopped = len(specs) - i, "interrupted"
    finally:
        sink.close()
    return report
