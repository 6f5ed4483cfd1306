"""The config selector chain: explicit, overlay, memory, disk, pretuned, autotune, heuristic.

Each selector either answers with a :class:`Selection` or declines with a reason (a string);
the chain asks them in order and the first answer wins. The reasons of the selectors that
declined are kept, so ``Executor.explain`` can say why each earlier one did not answer.

Under torch.distributed (more than one rank) a call without ``cfg=`` or an overlay is resolved
once per key for all ranks (:mod:`kernelops.ops.agreement`): the first rank to meet the key runs
the chain and publishes its answer; the others adopt it (source ``"ranks"``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import sys
import warnings
from typing import Any, Iterator, Mapping

from kernelops.ops.agreement import RankAgreement
from kernelops.ops.autotune import (
    CAPTURING, TRANSIENT_BLOCKERS, Autotuner, AutotunePolicy, autotune_blocker, warn_capture_untuned,
)
from kernelops.ops.cache import ConfigCache, make_entry
from kernelops.ops.device import DeviceInfo, versions
from kernelops.ops.entries import check_config, check_entry
from kernelops.ops.keys import Key, key_text
from kernelops.ops.operation import Operation
from kernelops.ops.pretuned import PretunedStore

#: marks memory entries that this process tuned itself (never written to disk)
TUNED_HERE = "tuned_in_this_process"
#: the source of an answer adopted from the rank that resolved the key first
RANKS = "ranks"
#: the selectors whose answers a rank shares with the others (unless the entry records a failed tuning)
SHARED = ("memory", "disk", "pretuned", "autotune")

#: the kernelops package folder, with a separator (frames below it are the library's own)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_OVERLAY: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar("kernelops_overlay", default={})


@contextlib.contextmanager
def config_overlay(configs: Mapping[str, Any]) -> Iterator[None]:
    """Within the block, ops named in ``configs`` (op name -> config) use that config.

    Nested overlays merge, the inner one winning. Configs from an overlay are never cached.
    """
    token = _OVERLAY.set({**_OVERLAY.get(), **configs})
    try:
        yield
    finally:
        _OVERLAY.reset(token)


def current_overlay() -> Mapping[str, Any]:
    return _OVERLAY.get()


@dataclasses.dataclass
class Context:
    """Everything a selector may look at for one call."""

    op: Operation
    inputs: Any
    key: Key
    device: DeviceInfo
    policy: AutotunePolicy
    explicit: Any = None

    @property
    def memory_key(self) -> str:
        return f"{self.op.name}|{key_text(self.key)}|device={self.device.key}"

    @property
    def disk_key(self) -> str:
        v = versions()
        return (f"{self.memory_key}|torch={v['torch']}|triton={v['triton']}|kernelops={v['kernelops']}"
                f"|src={self.op.source_hash()}")


@dataclasses.dataclass(frozen=True)
class Selection:
    config: Any
    source: str
    entry: dict | None = None
    #: the executor may remember this answer for the rest of the process
    memoize: bool = True


class Selector:
    name = "selector"

    def select(self, ctx: Context) -> Selection | str:
        raise NotImplementedError


class ExplicitSelector(Selector):
    name = "explicit"

    def select(self, ctx):
        if ctx.explicit is None:
            return "no cfg= argument"
        return Selection(ctx.op.complete_config(ctx.explicit, ctx.inputs, ctx.device), self.name, memoize=False)


class OverlaySelector(Selector):
    name = "overlay"

    def select(self, ctx):
        cfg = current_overlay().get(ctx.op.name)
        if cfg is None:
            return "no config_overlay for this op"
        return Selection(ctx.op.complete_config(cfg, ctx.inputs, ctx.device), self.name, memoize=False)


def platform_refusal(ctx: Context, config) -> str | None:
    """Why a stored ``config`` cannot run this call on its platform, or None. A config that names
    a platform (not ``auto``) must be the platform the call asked for, if it asked for one, and one
    that can run these inputs (``op.not_supported_reasons``)."""
    platform = getattr(config, "platform", "auto")
    if platform == "auto":
        return None
    requested = getattr(ctx.inputs, "platform", "auto")
    if requested not in ("auto", platform):
        return f"its config names platform={platform!r}, but the call asks for platform={requested!r}"
    reasons = ctx.op.not_supported_reasons(ctx.inputs, platform, ctx.device)
    if reasons:
        return f"platform={platform!r} cannot run this call: " + "; ".join(reasons)
    return None


def _config_from_entry(ctx: Context, entry: dict, where: str, *, stored: bool = True):
    """``(config, None)``: a stored entry's config, checked (:func:`check_entry` for an entry read
    from disk or a shipped file; ``stored=False``, for this process's own memory entries and the
    ranks' answers, its config alone), completed and checked as an explicit ``cfg=`` is (fields
    left None come from the heuristic; tiles, shared memory and the like are validated) and able
    to run this call on its platform; or ``(None, reason)``: the entry is skipped and the chain
    goes on. A stored entry never fails the call, whatever goes wrong with it."""
    try:
        if stored:
            config = check_entry(ctx.op, entry, device=ctx.device)
        else:
            config = check_config(ctx.op, entry.get("config") if isinstance(entry, dict) else entry,
                                  device=ctx.device)
        config = ctx.op.complete_config(config, ctx.inputs, ctx.device)
        refusal = platform_refusal(ctx, config)
    except Exception as exc:  # noqa: BLE001 - whatever a stored entry holds, the call goes on without it
        config, refusal = None, str(exc) or type(exc).__name__
    if refusal is not None:
        return None, f"{where} entry is unusable ({refusal})"
    return config, None


#: a selector's set of keys it has warned about is dropped when it reaches this size
_MAX_WARNED = 4096


class StoredEntrySelector(Selector):
    """A selector that answers from stored entries: an entry that cannot serve the call is
    skipped with its reason (the chain goes on) and one warning per key."""

    def __init__(self):
        self._warned: set[str] = set()

    def usable(self, ctx: Context, entry: dict, *, stored: bool = True):
        """:func:`_config_from_entry` for this selector, warning once per key when it skips."""
        config, reason = _config_from_entry(ctx, entry, self.name, stored=stored)
        if reason is not None and ctx.memory_key not in self._warned:
            if len(self._warned) >= _MAX_WARNED:
                self._warned.clear()
            self._warned.add(ctx.memory_key)
            warnings.warn(f"kernelops: {ctx.op.name} {key_text(ctx.key)}: {reason}; it is skipped and the selector "
                          f"chain goes on (executor.explain(...) shows the chain; this warns once per key)",
                          RuntimeWarning, stacklevel=_user_stacklevel())
        return config, reason


def _user_stacklevel() -> int:
    """``warnings.warn`` stacklevel of the first frame outside kernelops (the user's call)."""
    frame, level = sys._getframe(1), 1  # noqa: SLF001 - the caller of warnings.warn
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


class MemorySelector(StoredEntrySelector):
    name = "memory"

    def __init__(self, cache: ConfigCache):
        super().__init__()
        self.cache = cache

    def select(self, ctx):
        entry = self.cache.get_memory(ctx.memory_key)
        if entry is None:
            return "not in this process's memory cache"
        if ctx.policy is AutotunePolicy.ALWAYS and not entry.get(TUNED_HERE):
            return "policy=always ignores entries not tuned in this process"
        # this process's own entries (read from disk or a shipped file, or tuned here), checked
        # again for this call: one key serves calls that differ in platform or environment
        cfg, err = self.usable(ctx, entry, stored=False)
        return err or Selection(cfg, self.name, entry)


class DiskSelector(StoredEntrySelector):
    name = "disk"

    def __init__(self, cache: ConfigCache):
        super().__init__()
        self.cache = cache

    def select(self, ctx):
        if ctx.policy is AutotunePolicy.ALWAYS:
            return "policy=always ignores the disk cache"
        if not self.cache.disk_available:
            return "disk cache unavailable (memory-only)"
        entry = self.cache.get_disk(ctx.disk_key)
        if entry is None:
            return f"no entry in {self.cache.directory}"
        cfg, err = self.usable(ctx, entry)
        if err:
            return err
        self.cache.put_memory(ctx.memory_key, entry)
        return Selection(cfg, self.name, entry)


class PretunedSelector(StoredEntrySelector):
    name = "pretuned"

    def __init__(self, store: PretunedStore, cache: ConfigCache):
        super().__init__()
        self.store, self.cache = store, cache

    def select(self, ctx):
        if ctx.policy is AutotunePolicy.ALWAYS:
            return "policy=always ignores shipped caches"
        entry, how = self.store.lookup(ctx.op.name, ctx.key, ctx.op.bucketed_fields, ctx.device)
        if entry is None:
            return how
        cfg, err = self.usable(ctx, entry)
        if err:
            return f"{err} [{how}]"
        entry = {**entry, "source": "pretuned", "how": how}
        self.cache.put_memory(ctx.memory_key, entry)
        return Selection(cfg, self.name, entry)


class AutotuneSelector(Selector):
    name = "autotune"

    def __init__(self, autotuner: Autotuner, cache: ConfigCache):
        self.autotuner, self.cache = autotuner, cache

    def blocker(self, ctx) -> str | None:
        if ctx.policy is AutotunePolicy.NEVER:
            return "policy=never"
        return autotune_blocker(ctx.op, ctx.inputs, ctx.device)

    def select(self, ctx):
        reason = self.blocker(ctx)
        if reason:
            if reason == CAPTURING:  # the heuristic gets captured: say so (once per key)
                warn_capture_untuned(ctx.op, ctx.inputs, key_text(ctx.key))
            return reason
        result = self.autotuner.tune(ctx.op, ctx.inputs, ctx.device)
        if result.ms is None:
            # Remember the failure for this process (memory only), so later calls do not re-tune.
            reason = "every candidate failed: " + "; ".join(r for _, r in result.failures[:3])
            entry = make_entry(result.config.to_dict(), candidates=result.candidates, source="autotune-failed")
            self.cache.put_memory(ctx.memory_key, {**entry, "reason": reason, TUNED_HERE: True})
            return Selection(result.config, "autotune-failed", {**entry, "reason": reason})
        entry = make_entry(result.config.to_dict(), ms=result.ms, heuristic_ms=result.heuristic_ms,
                           runner_up=result.runner_up.to_dict() if result.runner_up is not None else None,
                           runner_up_ms=result.runner_up_ms, candidates=result.candidates, source="autotune")
        self.cache.put_disk(ctx.disk_key, entry)
        self.cache.put_memory(ctx.memory_key, {**entry, TUNED_HERE: True})
        return Selection(result.config, self.name, entry)


class HeuristicSelector(Selector):
    name = "heuristic"

    def select(self, ctx):
        return Selection(ctx.op.heuristic_config(ctx.inputs, ctx.device), self.name)


class ConfigSelectorChain:
    """The seven selectors in the contract's order (or your own list)."""

    def __init__(self, selectors: list[Selector] | None = None, *, cache: ConfigCache | None = None,
                 pretuned: PretunedStore | None = None, autotuner: Autotuner | None = None,
                 policy: AutotunePolicy | str | None = None, agreement: RankAgreement | None | bool = True):
        #: ranks agree on one answer per key (True: through the default process group, when
        #: there is one; False/None: every rank resolves on its own; or a RankAgreement)
        self.agreement = RankAgreement() if agreement is True else (agreement or None)
        self.cache = cache if cache is not None else ConfigCache()
        self.pretuned = pretuned if pretuned is not None else PretunedStore()
        self.autotuner = autotuner if autotuner is not None else Autotuner()
        self._policy = AutotunePolicy(policy) if policy is not None else None
        self.selectors = selectors if selectors is not None else [
            ExplicitSelector(), OverlaySelector(), MemorySelector(self.cache), DiskSelector(self.cache),
            PretunedSelector(self.pretuned, self.cache), AutotuneSelector(self.autotuner, self.cache),
            HeuristicSelector(),
        ]

    @property
    def policy(self) -> AutotunePolicy:
        return self._policy if self._policy is not None else AutotunePolicy.from_env()

    @policy.setter
    def policy(self, value) -> None:
        self._policy = None if value is None else AutotunePolicy(value)

    def select(self, ctx: Context) -> tuple[Selection, list[tuple[str, str]]]:
        """``(selection, declined)``: the answer and the reasons of the selectors that declined."""
        if self.agreement is None or ctx.explicit is not None or ctx.op.name in current_overlay():
            return self.select_here(ctx)
        return self.agreement.agree(f"{ctx.disk_key}|policy={ctx.policy.value}", lambda: self._resolve_for_ranks(ctx),
                                    lambda payload, mine: self._adopt(ctx, payload, mine),
                                    lambda holder: self._pending(ctx, holder))

    def _resolve_for_ranks(self, ctx: Context):
        """The local answer, and what to publish of it: answers from a cache or from tuning (not
        a heuristic, which every rank computes alike, nor a transient one given while a graph is
        captured or tuning failed)."""
        selection, declined = self.select_here(ctx)
        payload = None
        failed = (selection.entry or {}).get("source") == "autotune-failed"
        if selection.memoize and selection.source in SHARED and not failed:
            payload = {"config": selection.config.to_dict(), "source": selection.source}
        return (selection, declined), payload

    def _adopt(self, ctx: Context, payload: dict, mine: bool):
        """A published answer as this call's selection (None: it cannot serve the call). This
        rank's own answer is read back from its memory cache when it is there, with its entry."""
        if mine:
            answer = MemorySelector(self.cache).select(ctx)
            if isinstance(answer, Selection) and answer.entry.get("config") == payload["config"]:
                return answer, []
        rank, source = payload["rank"], payload["source"]
        cfg, err = _config_from_entry(ctx, payload, f"rank {rank}'s", stored=False)
        if err:
            warnings.warn(f"kernelops: {err}; this rank resolves {ctx.op.name} {key_text(ctx.key)} on its own",
                          RuntimeWarning, stacklevel=5)
            return None
        entry = {"config": payload["config"], "source": RANKS, "rank": rank, "rank_source": source}
        return Selection(cfg, RANKS, entry), [(RANKS, f"rank {rank} resolved this key first (from '{source}')")]

    @staticmethod
    def _pending(ctx: Context, holder: int | None):
        """A call made while another rank resolves the key: the heuristic, not remembered."""
        reason = (f"rank {holder} is resolving this key; the heuristic runs (not remembered) until its answer "
                  f"is published")
        return Selection(ctx.op.heuristic_config(ctx.inputs, ctx.device), "heuristic", memoize=False), [(RANKS, reason)]

    def select_here(self, ctx: Context) -> tuple[Selection, list[tuple[str, str]]]:
        """:meth:`select` in this process alone (no agreement with other ranks)."""
        declined: list[tuple[str, str]] = []
        for selector in self.selectors:
            answer = selector.select(ctx)
            if isinstance(answer, Selection):
                if answer.source == "heuristic":
                    # remember a heuristic answer unless tuning was only ruled out for the moment
                    transient = dict(declined).get("autotune") in TRANSIENT_BLOCKERS
                    answer = dataclasses.replace(answer, memoize=not transient)
                return answer, declined
            declined.append((selector.name, answer))
        raise RuntimeError("the selector chain ended without an answer (it needs a HeuristicSelector last)")
