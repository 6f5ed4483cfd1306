"""A kernel-free Operation for testing the op-agnostic machinery (executor, selectors, autotuner).

``ToyOp`` computes ``x * alpha``. It records every config ``run`` received (``op.runs``), counts
calls of its contract methods (``op.counts``), and its ``bench_fn`` returns a :class:`Bench`
that carries the config and phase, so a fake ``Autotuner.time_fn`` (:class:`FakeTimer`) can
return deterministic times per ``(phase, params)`` without timing anything.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Callable

import torch

from kernelops.ops.device import DeviceInfo
from kernelops.ops.keys import bucket
from kernelops.ops.operation import Operation
from kernelops.ops.params import BwdParams, FwdParams, JsonConfig

CPU = DeviceInfo("cpu", 0, "cpu", None, 227 * 1024, 1)
FAKE_CUDA = DeviceInfo("cuda", 0, "FAKE_GPU", (9, 0), 227 * 1024, 132)

HEURISTIC_FWD = FwdParams(64, 64, 4, 2)
HEURISTIC_BWD = BwdParams(64, 64, 4, 2)

#: the default fwd space: the heuristic's params plus three others
FWD_SPACE = (HEURISTIC_FWD, FwdParams(32, 64, 4, 2), FwdParams(128, 64, 8, 2), FwdParams(128, 128, 8, 3))
#: the default bwd space: the heuristic's params plus two others
BWD_SPACE = (HEURISTIC_BWD, BwdParams(32, 32, 4, 2), BwdParams(128, 64, 8, 3))


@dataclasses.dataclass(frozen=True)
class ToyConfig(JsonConfig):
    fwd_params: FwdParams | None = None
    bwd_params: BwdParams | None = None
    platform: str = "auto"
    backend: str = "any"


HEURISTIC = ToyConfig(HEURISTIC_FWD, HEURISTIC_BWD)


@dataclasses.dataclass(frozen=True)
class ToyInputs:
    x: torch.Tensor
    alpha: float


class Bench:
    """What ``ToyOp.bench_fn`` returns: runs the phase once; knows its config and phase."""

    def __init__(self, op: "ToyOp", inputs: ToyInputs, config: ToyConfig, phase: str):
        self.op, self.inputs, self.config, self.phase = op, inputs, config, phase
        self.params = op.params_of(config, phase)

    def __call__(self):
        with torch.no_grad():
            return self.inputs.x * self.inputs.alpha


class ToyOp(Operation):
    """``x * alpha``; a test double: it keeps call records, which a real op never does."""

    name = "toy_scale"
    config_type = ToyConfig
    platforms = ("torch",)
    bucketed_fields = ("n",)

    def __init__(self, *, fwd_space=FWD_SPACE, bwd_space=BWD_SPACE, tunable: bool = True,
                 bench_hook: Callable[[ToyInputs, ToyConfig, str], Any] | None = None):
        self.fwd_space = list(fwd_space)
        self.bwd_space = list(bwd_space)
        self.tunable = tunable
        #: called by bench_fn before it returns (may raise, to fail a candidate, or mutate inputs)
        self.bench_hook = bench_hook
        self.runs: list[ToyConfig] = []
        self.counts: collections.Counter = collections.Counter()

    # --- contract -----------------------------------------------------------------------------
    def prepare(self, *, x=None, alpha=1.0) -> ToyInputs:
        self.counts["prepare"] += 1
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"toy_scale: x must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim != 1:
            raise ValueError(f"toy_scale: x must be 1-D, got {x.shape=}")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise TypeError(f"toy_scale: alpha must be a real number, got {type(alpha).__name__}")
        if not math.isfinite(alpha):
            raise ValueError(f"toy_scale: alpha must be finite, got {alpha=}")
        return ToyInputs(x, float(alpha))

    def device_of(self, inputs) -> torch.device:
        return inputs.x.device

    def not_supported_reasons(self, inputs, platform, device) -> list[str]:
        if platform not in self.platforms:
            return [f"toy_scale has no {platform} implementation"]
        return []

    def key(self, inputs):
        return (("dtype", str(inputs.x.dtype).removeprefix("torch.")), ("n", bucket(inputs.x.shape[0])))

    def heuristic_config(self, inputs, device) -> ToyConfig:
        self.counts["heuristic_config"] += 1
        return HEURISTIC

    def run(self, inputs, config):
        self.counts["run"] += 1
        self.runs.append(config)
        platform = self.resolve_platform(inputs, config)
        assert platform == "torch"
        return inputs.x * inputs.alpha

    # --- tuning -------------------------------------------------------------------------------
    def phases(self, inputs) -> tuple[str, ...]:
        if not self.tunable:
            return ()
        return ("fwd", "bwd") if inputs.x.requires_grad else ("fwd",)

    def candidate_params(self, inputs, device, phase):
        self.counts[f"candidate_params:{phase}"] += 1
        return list(self.fwd_space if phase == "fwd" else self.bwd_space)

    def bench_fn(self, inputs, config, phase):
        self.counts["bench_fn"] += 1
        if self.bench_hook is not None:
            self.bench_hook(inputs, config, phase)
        return Bench(self, inputs, config, phase)


class FakeTimer:
    """A deterministic stand-in for ``Autotuner.time_fn``: ``times[(phase, params)]`` ms.

    Every call is recorded in ``calls`` as ``(phase, config)``; ``default`` is returned for
    params not in ``times``; ``on_call`` (if given) runs first (e.g. to advance a fake clock).
    """

    def __init__(self, times: dict | None = None, default: float = 10.0, on_call=None):
        self.times = dict(times or {})
        self.default = default
        self.on_call = on_call
        self.calls: list[tuple[str, ToyConfig]] = []

    def __call__(self, fn: Bench) -> float:
        self.calls.append((fn.phase, fn.config))
        if self.on_call is not None:
            self.on_call(fn)
        fn()
        return float(self.times.get((fn.phase, fn.params), self.default))


class HotToyOp(ToyOp):
    """``ToyOp`` with the executor's hot path: ``signature`` and ``launcher``.

    ``op.counts["launch"]`` counts calls that went through a remembered launcher.
    """

    def signature(self, kwargs):
        x, alpha = kwargs.get("x"), kwargs.get("alpha", 1.0)
        if type(x) is not torch.Tensor:
            return None
        return (x.shape, x.dtype, x.device, alpha, type(alpha))

    def launcher(self, inputs, config):
        def launch(kwargs):
            self.counts["launch"] += 1
            self.runs.append(config)
            return kwargs["x"] * inputs.alpha

        return launch
