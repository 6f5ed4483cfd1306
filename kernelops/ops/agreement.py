"""Rank agreement under torch.distributed: every rank runs one config per key, without collectives.

Under an initialised process group of more than one rank, the first rank to meet a key resolves
it as a lone process would (its memory, disk and shipped caches, tuning, the heuristic) and
publishes the answer in the group's key-value store (the store ``init_process_group`` made); a
rank that meets the key later adopts that answer instead of asking its own caches, so every rank
runs the same launch configuration for the same key (identical numerics across ranks).

No collective is entered. A rank waits only while another rank is resolving the very key it
needs, which that rank finishes on its own; so ranks that meet different keys (packed batches of
other lengths), meet keys in another order, or hold other caches (node-local cache folders) never
wait on each other. (A broadcast inside the autotuner, as kernelops had before, is entered only by
ranks that miss every cache: it pairs up different keys' tunings, or waits for a rank that never
joins.)

Store protocol, one store key per chain key (``kernelops/`` + the disk key, which names the op,
its key, the device and the versions, so different GPUs or builds never share an answer):

* ``compare_set(key, "", claim)`` claims an absent key and otherwise returns what the key holds:
  the same call is the claim, the poll while another rank's claim stands, and the read of the
  answer (with back-off, 1 to 50 ms, up to ``KERNELOPS_RANK_WAIT_S``, default 600 s);
* the claimer publishes ``answer:`` + JSON (config, source, rank), or deletes its claim when the
  answer may not be remembered (a heuristic given while a CUDA graph is captured) or the
  resolution raised, so that a waiting rank claims the key itself;
* a waiter whose wait runs out (the claimer died), an answer that does not fit this rank's call,
  or a store that fails, resolve the key locally, with a warning: the user's call never fails
  for it.
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
DEFAULT_WAIT_S = 600.0
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
    bounds a wait for another rank's claim (default ``KERNELOPS_RANK_WAIT_S`` or 600 s).
    """

    def __init__(self, store=None, rank: int | None = None, *, wait_s: float | None = None,
                 find: Callable[[], tuple[Any, int] | None] = process_group_store):
        if (store is None) != (rank is None):
            raise ValueError(f"RankAgreement: give both store and rank or neither, got {store=}, {rank=}")
        self.store, self.rank, self.wait_s, self.find = store, rank, wait_s, find

    def endpoint(self) -> tuple[Any, int] | None:
        if self.store is not None:
            return self.store, self.rank
        return self.find()

    def _wait_s(self) -> float:
        if self.wait_s is not None:
            return self.wait_s
        return float(os.environ.get("KERNELOPS_RANK_WAIT_S", DEFAULT_WAIT_S))

    def agree(self, name: str, resolve: Callable[[], tuple[T, dict | None]],
              adopt: Callable[[dict], T | None]) -> T:
        """The agreed result for store key ``name``.

        ``resolve()`` resolves locally and returns ``(result, payload)``: ``payload`` is the
        JSON-able dict to publish, or None when the result must not be shared. ``adopt(payload)``
        turns a published payload (with ``"rank"`` added) into a result, or returns None when it
        cannot serve this rank's call (then this rank resolves locally). Outside a process group
        this is ``resolve()[0]``.
        """
        endpoint = self.endpoint()
        if endpoint is None:
            return resolve()[0]
        store, rank = endpoint
        key = PREFIX + name
        claim = f"{CLAIM}{rank}:{os.getpid()}:{next(_CLAIMS)}"
        deadline, pause = time.monotonic() + self._wait_s(), _POLL_FIRST_S
        while True:
            try:
                value = store.compare_set(key, "", claim).decode()
            except Exception as exc:  # noqa: BLE001 - a broken store must not fail the call
                warnings.warn(f"kernelops: the process group's store failed ({type(exc).__name__}: {exc}); "
                              f"rank {rank} resolves {name} on its own", RuntimeWarning, stacklevel=3)
                return resolve()[0]
            if value == claim:
                return self._resolve_claimed(store, key, rank, resolve)
            if value.startswith(ANSWER):
                adopted = adopt(json.loads(value[len(ANSWER):]))
                return adopted if adopted is not None else resolve()[0]
            if time.monotonic() > deadline:
                warnings.warn(f"kernelops: rank {rank} waited {self._wait_s():.0f} s (KERNELOPS_RANK_WAIT_S) for "
                              f"another rank's answer for {name} (held as {value!r}); resolving it on its own, "
                              f"so ranks may run different configs for it", RuntimeWarning, stacklevel=3)
                return resolve()[0]
            time.sleep(pause)
            pause = min(2 * pause, _POLL_MAX_S)

    @staticmethod
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
            warnings.warn(f"kernelops: rank {rank} could not publish its answer for {key} ({exc}); other ranks "
                          f"resolve it on their own after KERNELOPS_RANK_WAIT_S", RuntimeWarning, stacklevel=4)
        return result


def _release(store, key: str) -> None:
    try:
        store.delete_key(key)
    except Exception:  # noqa: BLE001 - waiters time out instead
        pass
