"""The Operation base class: a declarative description of one op (see DESIGN.md, "Operation contract").

An Operation holds no tensors and no per-call state. The executor drives it:

    inputs = op.prepare(**kwargs)              # validate + normalise once (frozen dataclass)
    key = op.key(inputs)                       # primitives only, lengths bucketed
    config = <selector chain>(op, inputs, key) # explicit / overlay / caches / autotune / heuristic
    out = op.run(inputs, config)

Tuning is split into *phases* (e.g. ``"fwd"`` and ``"bwd"``) that are searched one after the
other, each with the other phases held at the best choice so far (the heuristic's parameters for
phases not tuned yet), so the search costs the sum of the phase spaces, not their product.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import inspect
from typing import Any, Callable, ClassVar, Hashable

import torch

from kernelops.ops.device import DeviceInfo
from kernelops.ops.keys import Key

PLATFORMS = ("auto", "triton", "torch")
BACKENDS = ("any", "gpu", "cpu")


class NotSupportedError(ValueError):
    """A forced platform cannot run these inputs; the message lists every reason."""


class Operation:
    """Base class. Subclasses set the class attributes and implement the methods below."""

    name: ClassVar[str]
    config_type: ClassVar[type]
    platforms: ClassVar[tuple[str, ...]] = ("triton", "torch")
    #: key fields holding bucketed lengths (pretuned lookup may fall back to the nearest bucket)
    bucketed_fields: ClassVar[tuple[str, ...]] = ()
    #: modules whose source is hashed into disk-cache keys: a kernel edit invalidates old entries
    kernel_modules: ClassVar[tuple[str, ...]] = ()

    # --- the contract -------------------------------------------------------------------------
    def prepare(self, **kwargs) -> Any:
        """Validate and normalise the call's arguments into a frozen dataclass."""
        raise NotImplementedError

    def device_of(self, inputs) -> torch.device:
        """The device the call runs on."""
        raise NotImplementedError

    def not_supported_reasons(self, inputs, platform: str, device: DeviceInfo) -> list[str]:
        """Empty when ``platform`` can run ``inputs``; otherwise one human-readable reason each."""
        raise NotImplementedError

    def key(self, inputs) -> Key:
        """Cache key: ``(field, primitive)`` pairs; bucketed lengths via ``ops.keys.bucket``."""
        raise NotImplementedError

    def heuristic_config(self, inputs, device: DeviceInfo):
        """A valid config for these inputs on this device, chosen without timing anything."""
        raise NotImplementedError

    def run(self, inputs, config):
        """Run on ``config.platform`` (``auto`` resolved by :meth:`resolve_platform`)."""
        raise NotImplementedError

    def estimate_memory(self, inputs) -> dict[str, int]:
        """Bytes for inputs, outputs, saved statistics and workspace (where meaningful)."""
        return {}

    # --- the hot path (optional) ----------------------------------------------------------------
    def signature(self, kwargs: dict) -> Hashable | None:
        """A cheap hashable summary of a call's arguments (shapes, dtypes, devices, grad flags,
        scalars; never tensor values) that determines everything :meth:`prepare` checks and
        :meth:`key`/:meth:`resolve_platform` compute, or None when the call cannot take the hot
        path. Two calls with equal signatures must get the same config and platform."""
        return None

    def launcher(self, inputs, config) -> Callable[[dict], Any] | None:
        """A ready callable ``launch(kwargs) -> output`` for calls with this call's signature
        (config and platform resolved once), or None. The executor remembers it by signature."""
        return None

    # --- tuning ---------------------------------------------------------------------------------
    def phases(self, inputs) -> tuple[str, ...]:
        """Tuning phases that apply to this call (e.g. ``("fwd", "bwd")`` when grads are needed)."""
        return ()

    def candidate_params(self, inputs, device: DeviceInfo, phase: str) -> list:
        """The search space of one phase, already pruned by the device's shared memory."""
        return []

    def params_of(self, config, phase: str):
        """``phase``'s parameters in ``config`` (by convention the field ``<phase>_params``)."""
        return getattr(config, f"{phase}_params")

    def with_params(self, config, phase: str, params):
        """``config`` with ``phase``'s parameters replaced by ``params``."""
        return dataclasses.replace(config, **{f"{phase}_params": params})

    def complete_config(self, config, inputs, device: DeviceInfo):
        """``config`` with every field left as None taken from the heuristic (explicit cfg= calls);
        a config whose ``backend`` ("gpu" / "cpu") is not the inputs' device is refused."""
        if not isinstance(config, self.config_type):
            raise TypeError(f"{self.name}: cfg must be a {self.config_type.__name__}, got {type(config).__name__}")
        backend = getattr(config, "backend", "any")
        if (backend == "gpu" and not device.is_cuda) or (backend == "cpu" and device.is_cuda):
            raise ValueError(f"{self.name}: the config asks for backend={backend!r}, but the inputs are on "
                             f"{device.type} ({device.name})")
        missing = {f.name for f in dataclasses.fields(config) if getattr(config, f.name) is None}
        if not missing:
            return config
        heuristic = self.heuristic_config(inputs, device)
        return dataclasses.replace(config, **{name: getattr(heuristic, name) for name in missing})

    def bench_fn(self, inputs, config, phase: str) -> Callable[[], Any]:
        """A zero-argument callable that runs ``phase`` once with ``config`` (timed by the autotuner)."""
        raise NotImplementedError

    def candidate_configs(self, inputs, device: DeviceInfo) -> list:
        """The autotune space: the heuristic, then each phase's candidates on top of it."""
        base = self.heuristic_config(inputs, device)
        configs = [base]
        for phase in self.phases(inputs):
            for params in self.candidate_params(inputs, device, phase):
                cfg = self.with_params(base, phase, params)
                if cfg not in configs:
                    configs.append(cfg)
        return configs

    # --- shared helpers -----------------------------------------------------------------------
    def resolve_platform(self, inputs, config) -> str:
        """``auto`` -> triton on CUDA tensors, torch elsewhere; a forced platform is checked.

        The config's platform wins; when it is ``auto``, the call's own ``platform`` argument
        (``inputs.platform``, if the op has one) decides.
        """
        platform = getattr(config, "platform", "auto")
        if platform == "auto":
            platform = getattr(inputs, "platform", "auto")
        if platform not in PLATFORMS:
            raise ValueError(f"{self.name}: platform must be one of {PLATFORMS}, got {platform!r}")
        from kernelops.ops.device import device_info

        device = device_info(self.device_of(inputs))
        if platform == "auto":
            if device.is_cuda and "triton" in self.platforms:
                if not self.not_supported_reasons(inputs, "triton", device):
                    return "triton"
            return "torch"
        reasons = self.not_supported_reasons(inputs, platform, device)
        if reasons:
            raise NotSupportedError(f"{self.name}: platform={platform!r} cannot run this call: " + "; ".join(reasons))
        return platform

    @classmethod
    @functools.lru_cache(maxsize=None)
    def source_hash(cls) -> str:
        """Hash of the kernel modules' source text (part of every disk-cache key)."""
        digest = hashlib.sha256(cls.__name__.encode())
        for name in cls.kernel_modules:
            module = importlib.import_module(name)
            try:
                digest.update(inspect.getsource(module).encode())
            except (OSError, TypeError):
                digest.update(name.encode())
        return digest.hexdigest()[:16]


def clone_inputs(inputs):
    """A copy of a frozen inputs dataclass with every tensor field cloned (grad flags kept).

    The autotuner times candidates on such copies, so in-place kernels never touch user data.
    """
    changes = {}
    for f in dataclasses.fields(inputs):
        value = getattr(inputs, f.name)
        if isinstance(value, torch.Tensor):
            changes[f.name] = value.detach().clone().requires_grad_(value.requires_grad)
    return dataclasses.replace(inputs, **changes)
