"""The Executor: prepare -> key -> selector chain -> run, with a fast path for repeated calls."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import torch

from kernelops.ops.device import device_info
from kernelops.ops.operation import Operation
from kernelops.ops.selectors import ConfigSelectorChain, Context, current_overlay


#: the hot-path table is dropped when it reaches this many signatures
MAX_LAUNCHERS = 4096


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What ``Executor.explain`` reports for one call."""

    op: str
    selector: str
    key: tuple
    config: Any
    platform: str
    declined: list[tuple[str, str]]
    entry: dict | None

    def __str__(self) -> str:
        lines = [f"{self.op}: config from '{self.selector}' on platform '{self.platform}'",
                 f"  key: {self.key}", f"  config: {self.config}"]
        lines += [f"  {name}: {reason}" for name, reason in self.declined]
        return "\n".join(lines)


class Executor:
    """Runs operations with configs chosen by a :class:`ConfigSelectorChain`.

    >>> ex = Executor(ConfigSelectorChain(policy="never"))
    >>> out = ex(FlashAttention(), query=q, key=k, value=v, causal=True)   # doctest: +SKIP

    Hot path: an op that implements ``signature``/``launcher`` runs a repeated call (same
    signature, no ``cfg=``, no overlay, not while torch.compile traces) as one tuple build and
    one dict lookup to a ready launcher, skipping ``prepare``. Otherwise, after the first call
    with a given key, a call takes ``prepare``, one key build and one dict lookup to its config.
    ``cfg=`` and overlay configs are never remembered.
    """

    def __init__(self, chain: ConfigSelectorChain | None = None):
        self.chain = chain if chain is not None else ConfigSelectorChain()
        self._resolved: dict[tuple, Any] = {}
        self._launchers: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def _context(self, op: Operation, cfg, kwargs) -> tuple[Context, Any]:
        inputs = op.prepare(**kwargs)
        device = device_info(op.device_of(inputs))
        return Context(op, inputs, op.key(inputs), device, self.chain.policy, cfg), inputs

    def __call__(self, op: Operation, *, cfg=None, **kwargs):
        signature = None
        if cfg is None and not current_overlay() and not torch.compiler.is_compiling():
            signature = op.signature(kwargs)
            if signature is not None:
                signature = (op.name, self.chain.policy, signature)
                try:
                    launch = self._launchers.get(signature)
                except TypeError:  # an unhashable argument: the full path will judge it
                    launch = signature = None
                if launch is not None:
                    return launch(kwargs)
        inputs = op.prepare(**kwargs)
        if cfg is None and not current_overlay():
            device = device_info(op.device_of(inputs))
            policy = self.chain.policy
            fast_key = (op.name, op.key(inputs), device.key, policy)
            config = self._resolved.get(fast_key)
            if config is None:
                ctx = Context(op, inputs, fast_key[1], device, policy, None)
                selection, _ = self.chain.select(ctx)
                config = selection.config
                if not selection.memoize:
                    return op.run(inputs, config)
                with self._lock:
                    self._resolved[fast_key] = config
            if signature is not None:
                launch = op.launcher(inputs, config)
                if launch is not None:
                    with self._lock:
                        if len(self._launchers) >= MAX_LAUNCHERS:  # e.g. a new length every call
                            self._launchers.clear()
                        self._launchers[signature] = launch
            return op.run(inputs, config)
        device = device_info(op.device_of(inputs))
        ctx = Context(op, inputs, op.key(inputs), device, self.chain.policy, cfg)
        selection, _ = self.chain.select(ctx)
        return op.run(inputs, selection.config)

    def select(self, op: Operation, *, cfg=None, **kwargs):
        """The config this executor would use for the call (selection runs; the op does not)."""
        return self.explain(op, cfg=cfg, **kwargs).config

    def explain(self, op: Operation, *, cfg=None, **kwargs) -> Explanation:
        """Which selector answers for this call, the key, the config, and why earlier ones declined.

        Selection runs as for a real call (it may tune and fill caches), the op itself does not.
        """
        ctx, inputs = self._context(op, cfg, kwargs)
        selection, declined = self.chain.select(ctx)
        config = selection.config
        return Explanation(op.name, selection.source, ctx.key, config, op.resolve_platform(inputs, config),
                           declined, selection.entry)

    def forget(self) -> None:
        """Drop the fast-path tables (the chain's caches are left as they are)."""
        with self._lock:
            self._resolved.clear()
            self._launchers.clear()


_DEFAULT: Executor | None = None
_DEFAULT_LOCK = threading.Lock()


def default_executor() -> Executor:
    """The executor the module-level functions use (created on first use)."""
    global _DEFAULT
    if _DEFAULT is None:
        with _DEFAULT_LOCK:
            if _DEFAULT is None:
                _DEFAULT = Executor()
    return _DEFAULT


def set_default_executor(executor: Executor) -> Executor:
    """Replace the default executor; returns the previous one."""
    global _DEFAULT
    previous = default_executor()
    _DEFAULT = executor
    return previous
