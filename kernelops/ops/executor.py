"""The Executor: prepare -> key -> selector chain -> run, with a fast path for repeated calls."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable

import torch

from kernelops.ops.autotune import policy_from_env
from kernelops.ops.device import DeviceInfo, device_info
from kernelops.ops.operation import Operation
from kernelops.ops.selectors import ConfigSelectorChain, Context, current_overlay
from kernelops.ops.tracing import assume_constant_result


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

    Under torch.compile no config is selected while tracing (see ``_run_traced``): ops that
    support it resolve theirs when the compiled graph runs, through :meth:`resolve`.
    """

    def __init__(self, chain: ConfigSelectorChain | None = None):
        self.chain = chain if chain is not None else ConfigSelectorChain()
        self._resolved: dict[tuple, Any] = {}
        self._launchers: dict[tuple, Any] = {}
        self._finished: dict[tuple, Any] = {}  # resolve_remembered's table
        self._lock = threading.Lock()

    def _context(self, op: Operation, cfg, kwargs) -> tuple[Context, Any]:
        inputs = op.prepare(**kwargs)
        device = device_info(op.device_of(inputs))
        return Context(op, inputs, op.key(inputs), device, self.chain.policy, cfg), inputs

    def __call__(self, op: Operation, *, cfg=None, **kwargs):
        if torch.compiler.is_compiling():
            return self._run_traced(op, cfg, kwargs)
        signature = None
        overlay = current_overlay()
        if cfg is None and not overlay:
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
        if cfg is None and not overlay:
            config, memoized = self._select(op, inputs)
            if memoized and signature is not None:
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

    def remembered_launcher(self, op_name: str, signature) -> Callable[[dict], Any] | None:
        """The hot path's launcher remembered for ``op_name`` under ``signature`` (what the op's
        ``signature(kwargs)`` returns), or None: for public functions that build their signature
        from their own arguments, before they gather keyword arguments for :meth:`__call__`. The
        caller has checked that no ``cfg=`` was given and that torch.compile is not tracing; an
        overlay, as in :meth:`__call__`, turns the hot path off."""
        if current_overlay():
            return None
        try:
            return self._launchers.get((op_name, self.chain.policy, signature))
        except TypeError:  # an unhashable argument: the full path will judge it
            return None

    def _select(self, op: Operation, inputs) -> tuple[Any, bool]:
        """The chain's config for prepared inputs (no ``cfg=``, no overlay) and whether it is
        remembered: one key build and one dict lookup once the key has been seen."""
        device = device_info(op.device_of(inputs))
        policy = self.chain.policy
        # the requested platform too: the key leaves it out (configs serve every platform), but
        # what the chain answers does not (a torch-platform call has nothing to tune)
        fast_key = (op.name, op.key(inputs), device.key, policy, getattr(inputs, "platform", None))
        config = self._resolved.get(fast_key)
        if config is not None:
            return config, True
        selection, _ = self.chain.select(Context(op, inputs, fast_key[1], device, policy, None))
        if selection.memoize:
            with self._lock:
                self._resolved[fast_key] = selection.config
        return selection.config, selection.memoize

    def _run_traced(self, op: Operation, cfg, kwargs):
        return run_traced(op, cfg, kwargs)

    def resolve(self, op: Operation, inputs):
        """The config for already prepared inputs, as a call without ``cfg=`` would get it (the
        overlay, then the memory, disk and shipped caches, tuning when policy and circumstances
        allow, the heuristic), remembered as ``__call__`` remembers it.

        Ops call this when they run with deferred launch parameters (torch.compile graphs, see
        ``_run_traced``); it never runs inside a trace.
        """
        if current_overlay():
            device = device_info(op.device_of(inputs))
            selection, _ = self.chain.select(Context(op, inputs, op.key(inputs), device, self.chain.policy, None))
            return selection.config
        return self._select(op, inputs)[0]

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

    def resolve_remembered(self, op: Operation, signature, make_inputs: Callable[[], Any],
                           finish: Callable[[Any, Any], Any]):
        """:meth:`resolve` for ops that resolve on every run (torch.compile graphs), with a hot
        path: ``finish(config, make_inputs())`` is remembered under ``signature`` (a hashable
        summary of the call that fixes its key, e.g. shapes, dtypes and flags), so a repeated
        call is one tuple build and one dict lookup. Only answers the executor would remember
        anyway are kept (not those of an overlay or of a transient heuristic)."""
        if current_overlay():
            inputs = make_inputs()
            return finish(self.resolve(op, inputs), inputs)
        full = (op.name, self.chain.policy, signature)
        done = self._finished.get(full)
        if done is not None:
            return done
        inputs = make_inputs()
        config, memoized = self._select(op, inputs)
        done = finish(config, inputs)
        if memoized:
            with self._lock:
                if len(self._finished) >= MAX_LAUNCHERS:
                    self._finished.clear()
                self._finished[full] = done
        return done

    def forget(self) -> None:
        """Drop the fast-path tables (the chain's caches are left as they are)."""
        with self._lock:
            self._resolved.clear()
            self._launchers.clear()
            self._finished.clear()


def run_traced(op: Operation, cfg, kwargs):
    """What an executor does while torch.compile traces a call: ``prepare`` is traced (argument
    checks, lowering), but no config is selected. An op with ``deferred_config(inputs)`` runs with
    that config, whose launch parameters it resolves each time the compiled graph runs it
    (through :meth:`Executor.resolve` of the default executor); other ops get their heuristic, a
    constant of the graph. An explicit ``cfg=`` is completed and used as given (a constant too)."""
    inputs = op.prepare(**kwargs)
    if cfg is not None:
        return op.run(inputs, op.complete_config(cfg, inputs, traced_device_info(op.device_of(inputs))))
    deferred = getattr(op, "deferred_config", None)
    if deferred is not None:
        return op.run(inputs, deferred(inputs))
    return op.run(inputs, op.heuristic_config(inputs, traced_device_info(op.device_of(inputs))))


@assume_constant_result
def _device_fields(device: torch.device) -> tuple:
    return dataclasses.astuple(device_info(device))


def traced_device_info(device: torch.device) -> DeviceInfo:
    """``device_info`` for code that torch.compile traces: looked up outside the trace (a graph
    constant), so dynamo neither traces the CUDA property queries nor their cache."""
    if not torch.compiler.is_compiling():
        return device_info(device)
    type_, index, name, capability, smem_bytes, num_sms = _device_fields(device)
    return DeviceInfo(type_, index, name, None if capability is None else tuple(capability), smem_bytes, num_sms)


class _TracingExecutor:
    """What :func:`default_executor` returns while torch.compile traces: a constant object (so
    graphs do not guard on, or recompile for, the default executor being created or replaced)
    that selects nothing; see :func:`run_traced`."""

    def __call__(self, op: Operation, *, cfg=None, **kwargs):
        return run_traced(op, cfg, kwargs)


_TRACING = _TracingExecutor()


_DEFAULT: Executor | None = None
_DEFAULT_LOCK = threading.Lock()


def default_executor() -> Executor:
    """The executor the module-level functions use (created on first use).

    While torch.compile traces, a stand-in that selects no config (see :func:`run_traced`); the
    compiled graph's ops resolve theirs through the real default executor when they run.
    """
    global _DEFAULT
    if torch.compiler.is_compiling():
        return _TRACING  # type: ignore[return-value]
    if _DEFAULT is None:
        with _DEFAULT_LOCK:
            if _DEFAULT is None:
                _DEFAULT = Executor()
    return _DEFAULT


def remembered_launcher(op_name: str, signature) -> Callable[[dict], Any] | None:
    """:meth:`Executor.remembered_launcher` of the default executor when it is an
    :class:`Executor` (not a subclass), for public functions' hot paths; else None (not while
    torch.compile traces: the caller checks that first)."""
    executor = _DEFAULT
    # only for the Executor class itself: a subclass (or a stand-in) may override __call__, which
    # every call must then reach (None: the caller goes through default_executor()(...)). The
    # method's body is inlined (a frame is ~0.1 us of every repeated call), the chain's policy
    # property too, unless the chain is a subclass that may override it
    if type(executor) is not Executor:
        return None
    if type(executor.chain) is not ConfigSelectorChain:
        return executor.remembered_launcher(op_name, signature)
    if current_overlay():
        return None
    policy = executor.chain._policy  # noqa: SLF001
    try:
        return executor._launchers.get((op_name, policy if policy is not None else policy_from_env(), signature))  # noqa: SLF001
    except TypeError:
        return None


def set_default_executor(executor: Executor) -> Executor:
    """Replace the default executor; returns the previous one."""
    global _DEFAULT
    previous = default_executor()
    _DEFAULT = executor
    return previous
