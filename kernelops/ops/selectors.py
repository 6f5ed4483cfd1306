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
import warnings
from typing import Any, Iterator, Mapping

from kernelops.ops.agreement import RankAgreement
from kernelops.ops.autotune import (
    CAPTURING, TRANSIENT_BLOCKERS, Autotuner, AutotunePolicy, autotune_blocker, warn_capture_untuned,
)
from kernelops.ops.cache import ConfigCache, make_entry
from kernelops.ops.device import DeviceInfo, versions
from kernelops.ops.keys import Key, key_text
from kernelops.ops.operation import Operation
from kernelops.ops.pretuned import PretunedStore

#: marks memory entries that this process tuned itself (never written to disk)
TUNED_HERE = "tuned_in_this_process"
#: the source of an answer adopted from the rank that resolved the key first
RANKS = "ranks"
#: the selectors whose answers a rank shares with the others (unless the entry records a failed tuning)
SHARED = ("memory", "disk", "pretuned", "autotune")

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


def _config_from_entry(ctx: Context, entry: dict, where: str):
    """A stored entry's config, completed and checked as an explicit ``cfg=`` is (fields left
    None come from the heuristic; tiles, shared memory and the like are validated), or the
    reason it cannot serve this call: a bad entry falls through to the next selector."""
    try:
        config = ctx.op.config_type.from_dict(entry["config"])
        return ctx.op.complete_config(config, ctx.inputs, ctx.device), None
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"{where} entry is unusable ({exc})"


class MemorySelector(Selector):
    name = "memory"

    def __init__(self, cache: ConfigCache):
        self.cache = cache

    def select(self, ctx):
        entry = self.cache.get_memory(ctx.memory_key)
        if entry is None:
            return "not in this process's memory cache"
        if ctx.policy is AutotunePolicy.ALWAYS and not entry.get(TUNED_HERE):
            return "policy=always ignores entries not tuned in this process"
        cfg, err = _config_from_entry(ctx, entry, "memory")
        return err or Selection(cfg, self.name, entry)


class DiskSelector(Selector):
    name = "disk"

    def __init__(self, cache: ConfigCache):
        self.cache = cache

    def select(self, ctx):
        if ctx.policy is AutotunePolicy.ALWAYS:
            return "policy=always ignores the disk cache"
        if not self.cache.disk_available:
            return "disk cache unavailable (memory-only)"
        entry = self.cache.get_disk(ctx.disk_key)
        if entry is None:
            return f"no entry in {self.cache.directory}"
        cfg, err = _config_from_entry(ctx, entry, "disk")
        if err:
            return err
        self.cache.put_memory(ctx.memory_key, entry)
        return Selection(cfg, self.name, entry)


class PretunedSelector(Selector):
    name = "pretuned"

    def __init__(self, store: PretunedStore, cache: ConfigCache):
        self.store, self.cache = store, cache

    def select(self, ctx):
        if ctx.policy is AutotunePolicy.ALWAYS:
            return "policy=always ignores shipped caches"
        entry, how = self.store.lookup(ctx.op.name, ctx.key, ctx.op.bucketed_fields, ctx.device)
        if entry is None:
            return how
        cfg, err = _config_from_entry(ctx, entry, "pretuned")
        if err:
            return err
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
        cfg, err = _config_from_entry(ctx, payload, f"rank {rank}'s")
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
