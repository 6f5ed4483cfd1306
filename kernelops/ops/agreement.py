"""Rank agreement under torch.distributed: every rank runs one config per key, without collectives.

Under an initialised process group of more than one rank, the first rank to meet a key resolves
it as a lone process would (its memory, disk and shipped caches, tuning) and publishes the answer
in the group's key-value store (the store ``init_process_group`` made); a rank that meets the key
later adopts that answer instead of asking its own caches, so every rank runs the same launch
configuration for the same key (identical numerics across ranks).

No rank ever blocks on another. Tuning synchronises the whole device (``do_bench``), so a rank
that tunes waits for the collectives it has queued; a rank that blocked until that tuning ended
could be holding back one of those collectives. So a rank that meets a key another rank is
resolving waits only briefly, the first time (``KERNELOPS_RANK_WAIT_S``, default 2 s: enough
for an answer from a cache), then runs the heuristic for that call without remembering it, and
looks again at its next call with the key. Ranks that meet different keys (packed batches of
other lengths), meet keys in another order, or hold other caches (node-local cache folders) thus
never wait on each other; they differ only for the calls made while one rank tunes. (A broadcast
inside the autotuner, as kernelops had before, was entered only by ranks that missed every cache:
it paired up different keys' tunings, or waited for a rank that never joined.)

Store protocol, one store key per chain key (``kernelops/`` + the disk key and the policy: the
op, its key, the device and the versions, so different GPUs or builds never share an answer):

* ``compare_set(key, "", claim)`` claims an absent key and otherwise returns what the key holds:
  the same call is the claim, the poll while another rank's claim stands, and the read of the
  answer;
* the claimer publishes ``answer:`` + JSON (config, source, rank) when the answer came from a
  cache or from tuning; it deletes its claim when there is nothing worth sharing (a heuristic:
  every rank computes the same one) or the resolution raised, so another rank may claim the key;
* a claim older than ``stale_s`` (600 s: the claimer died), an answer that cannot serve this
  call, or a store that fails: the key is resolved locally, with a warning. The user's call never
  fails for it.
"""

from __future__ import annotations

import itertools
import json
import os
import time
import warnings
from typing import Any, Callable, TypeVar

T = TypeVar("T")

CLAIM = "claim:"
ANSWER = "answer:"
PREFIX = "kernelops/"
DEFAULT_WAIT_S = 2.0
DEFAULT_STALE_S = 600.0
_POLL_FIRST_S, _POLL_MAX_S = 0.001, 0.05
_CLAIMS = itertools.count()


def process_group_store() -> tuple[Any, int] | None:
    """``(store, rank)`` of the default process group when one of more than one rank is
    initialised, else None."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return None
    return dist.distributed_c10d._get_default_store(), dist.get_rank()  # noqa: SLF001


class RankAgreement:
    """The store protocol of the module docstring.

    ``store``/``rank`` fix the endpoint (tests, or a store of your own); by default it is found
    by ``find`` on each call that misses, i.e. the default process group's store, or none (a
    single process: every key is resolved locally, the store is never touched). ``wait_s``
    bounds the wait, at a rank's first meeting with a key, for another rank's answer (default
    ``KERNELOPS_RANK_WAIT_S`` or 2 s); ``stale_s`` is the age of a claim after which its rank is
    taken for dead.
    """

    def __init__(self, store=None, rank: int | None = None, *, wait_s: float | None = None,
                 stale_s: float = DEFAULT_STALE_S, find: Callable[[], tuple[Any, int] | None] = process_group_store):
        if (store is None) != (rank is None):
            raise ValueError(f"RankAgreement: give both store and rank or neither, got {store=}, {rank=}")
        self.store, self.rank, self.wait_s, self.stale_s, self.find = store, rank, wait_s, stale_s, find
        #: store key -> when this process first found it claimed by another rank
        self._pending: dict[str, float] = {}

    def endpoint(self) -> tuple[Any, int] | None:
        if self.store is not None:
            return self.store, self.rank
        return self.find()

    def _wait_s(self) -> float:
        if self.wait_s is not None:
            return self.wait_s
        return float(os.environ.get("KERNELOPS_RANK_WAIT_S", DEFAULT_WAIT_S))

    def agree(self, name: str, resolve: Callable[[], tuple[T, dict | None]],
              adopt: Callable[[dict, bool], T | None], pending: Callable[[int | None], T]) -> T:
        """The agreed result for store key ``name``.

        ``resolve()`` resolves locally and returns ``(result, payload)``: ``payload`` is the
        JSON-able dict to publish, or None when there is nothing to share. ``adopt(payload,
        mine)`` turns a published payload (with ``"rank"`` added; ``mine``: published by this
        rank) into a result, or returns None when it cannot serve this call (then this rank
        resolves locally). ``pending(rank)`` is the result for a call made while ``rank`` holds
        the claim (not to be remembered). Outside a process group this is ``resolve()[0]``.
        """
        try:
            endpoint = self.endpoint()
        except Exception as exc:  # noqa: BLE001 - a broken process group must not fail the call
            return _alone(f"the process group's store is unavailable ({type(exc).__name__}: {exc})", name, resolve)
        if endpoint is None:
            return resolve()[0]
        store, rank = endpoint
        key = PREFIX + name
        claim = f"{CLAIM}{rank}:{os.getpid()}:{next(_CLAIMS)}"
        start = time.monotonic()
        deadline, pause = start + (0.0 if key in self._pending else self._wait_s()), _POLL_FIRST_S
        while True:
            try:
                value = store.compare_set(key, "", claim).decode()
            except Exception as exc:  # noqa: BLE001
                return _alone(f"the process group's store failed ({type(exc).__name__}: {exc})", name, resolve)
            if value == claim:
                self._pending.pop(key, None)
                return _resolve_claimed(store, key, rank, resolve)
            if value.startswith(ANSWER):
                self._pending.pop(key, None)
                try:
                    payload = json.loads(value[len(ANSWER):])
                    adopted = adopt(payload, payload["rank"] == rank)
                except Exception as exc:  # noqa: BLE001 - a malformed answer
                    warnings.warn(f"kernelops: another rank's answer for {name} is unusable ({type(exc).__name__}: "
                                  f"{exc}); rank {rank} resolves it on its own", RuntimeWarning, stacklevel=3)
                    adopted = None
                return adopted if adopted is not None else resolve()[0]
            now = time.monotonic()
            if now - self._pending.setdefault(key, start) > self.stale_s:
                return _alone(f"the claim {value!r} is older than {self.stale_s:.0f} s (its rank may have died)",
                              name, resolve)
            if now >= deadline:
                return pending(_claim_rank(value))
            time.sleep(pause)
            pause = min(2 * pause, _POLL_MAX_S)


def _alone(why: str, name: str, resolve: Callable[[], tuple[T, dict | None]]) -> T:
    warnings.warn(f"kernelops: {why}; this rank resolves {name} on its own, so ranks may run different configs "
                  f"for it", RuntimeWarning, stacklevel=4)
    return resolve()[0]


def _claim_rank(value: str) -> int | None:
    try:
        return int(value.split(":")[1])
    except (IndexError, ValueError):
        return None


def _resolve_claimed(store, key: str, rank: int, resolve: Callable[[], tuple[T, dict | None]]) -> T:
    try:
        result, payload = resolve()
    except BaseException:
        _release(store, key)
        raise
    if payload is None:
        _release(store, key)
        return result
    try:
        store.set(key, ANSWER + json.dumps({**payload, "rank": rank}))
    except Exception as exc:  # noqa: BLE001
        _release(store, key)
        warnings.warn(f"kernelops: rank {rank} could not publish its answer for {key} ({exc}); other ranks "
                      f"resolve it on their own", RuntimeWarning, stacklevel=4)
    return result


def _release(store, key: str) -> None:
    try:
        store.delete_key(key)
    except Exception:  # noqa: BLE001 - the claim then goes stale
        pass
