"""Tuned-config cache: an in-process dict in front of a persistent, JSON-only ``diskcache`` store.

Keys are text (the op's key text plus device, versions and kernel-source hash, built by the
caller). Values are *entries*, dicts of plain JSON data with this shape (the same shape is used
in the shipped ``autotune_cache/`` files, see :mod:`kernelops.ops.pretuned`)::

    {
        "config": {...},            # the op config, ``JsonConfig.to_dict()``
        "ms": 0.41,                 # measured time of ``config`` (None when not timed)
        "heuristic_ms": 0.63,       # measured time of the heuristic's config (or None)
        "runner_up": {...} | None,  # second-best config
        "runner_up_ms": 0.43 | None,
        "candidates": 24,           # how many configs were timed
        "source": "autotune",       # who produced the entry ("autotune", "pretuned", ...)
        "created": "2025-01-01T12:00:00+00:00",   # UTC, ISO 8601
        "versions": {"kernelops": ..., "torch": ..., "triton": ...},
    }

Entries are stored as ``json.dumps(entry, sort_keys=True)``; a row that is not valid JSON or not
a JSON object reads as absent. This module stores any JSON object; what may be *used* is decided by
:func:`kernelops.ops.entries.check_entry` (shape, bounded sizes, a valid config), which the selector
chain applies to every entry it reads and ``kernelops cache import`` to every entry it stores; the
chain skips an entry that fails it, or that cannot run the call, and goes on.

Security: diskcache's default :class:`diskcache.Disk` pickles non-primitive keys and values, and
unpickling runs code. Anyone able to write the cache folder could then run code in every process
reading it. :class:`JsonDisk` therefore stores text only and refuses pickled rows on read
(:class:`PickledRowError`) without ever calling :mod:`pickle`; :class:`ConfigCache` treats such a
row as absent and warns once.

Robustness: any failure opening or using the disk store (corrupt database, read-only or
unwritable folder, database locked past ``timeout``) switches the :class:`ConfigCache` to
memory-only for the rest of its life with exactly one :class:`RuntimeWarning`; the user's call
never fails because of the cache. Several processes may share one folder: every write is a single
diskcache transaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import sqlite3
import sys
import threading
import warnings
from typing import Any, Iterable, Mapping

import diskcache
import diskcache.core
import platformdirs

__all__ = [
    "ConfigCache",
    "DiskKey",
    "JsonDisk",
    "PickledRowError",
    "default_cache_dir",
    "make_entry",
]

#: Environment variable naming the disk cache folder.
CACHE_DIR_ENV = "KERNELOPS_CACHE_DIR"


class PickledRowError(ValueError):
    """A cache row holds a pickled key or value; it is refused, never unpickled."""


class JsonDisk(diskcache.Disk):
    """A :class:`diskcache.Disk` that stores text keys and text values only and never pickles.

    ``store`` and ``put`` raise :class:`TypeError` for anything but ``str``. ``get`` (keys) and
    ``fetch`` (values) raise :class:`PickledRowError` for rows another writer stored pickled.
    """

    def put(self, key):
        """Database form of ``key``: text keys only (stored raw)."""
        if type(key) is not str:  # noqa: E721 - exact type: str subclasses could carry state
            raise TypeError(f"JsonDisk keys must be str, got {type(key).__name__}")
        return super().put(key)

    def get(self, key, raw):
        """Python form of a stored key; a pickled (non-raw) key is refused."""
        if not raw:
            raise PickledRowError("refusing a pickled cache key (it is never unpickled)")
        return super().get(key, raw)

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        """Database form of ``value``: JSON text only (small values inline, large ones in a text file)."""
        if read or type(value) is not str:  # noqa: E721
            raise TypeError(f"JsonDisk values must be str (JSON text), got {type(value).__name__}")
        return super().store(value, False, key=key)

    def fetch(self, mode, filename, value, read):
        """Python form of a stored value; a pickled value is refused."""
        if mode == diskcache.core.MODE_PICKLE:
            raise PickledRowError("refusing a pickled cache value (it is never unpickled)")
        return super().fetch(mode, filename, value, read)


def default_cache_dir() -> pathlib.Path:
    """``$KERNELOPS_CACHE_DIR`` if set, else the platform's user cache dir for ``kernelops``."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path(platformdirs.user_cache_dir("kernelops"))


def _to_plain(config: Any) -> Any:
    """A ``JsonConfig`` (anything with ``to_dict``) as a dict; dicts are copied; None stays None."""
    if config is None:
        return None
    if hasattr(config, "to_dict"):
        return config.to_dict()
    if isinstance(config, dict):
        return dict(config)
    raise TypeError(f"expected a config dict or a JsonConfig, got {type(config).__name__}")


def make_entry(
    config_dict: dict[str, Any],
    *,
    ms: float | None = None,
    heuristic_ms: float | None = None,
    runner_up: dict[str, Any] | None = None,
    runner_up_ms: float | None = None,
    candidates: int = 0,
    source: str = "autotune",
) -> dict[str, Any]:
    """A cache entry (see the module docstring) with ``created`` (UTC) and ``versions`` filled in.

    ``config_dict`` and ``runner_up`` may also be ``JsonConfig`` instances (converted with
    ``to_dict``).
    """
    from kernelops.ops.device import versions  # lazy: keeps torch out of cache-only imports

    return {
        "config": _to_plain(config_dict),
        "ms": None if ms is None else float(ms),
        "heuristic_ms": None if heuristic_ms is None else float(heuristic_ms),
        "runner_up": _to_plain(runner_up),
        "runner_up_ms": None if runner_up_ms is None else float(runner_up_ms),
        "candidates": int(candidates),
        "source": str(source),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": dict(versions()),
    }


def _encode(entry: dict[str, Any]) -> str:
    if not isinstance(entry, dict):
        raise TypeError(f"cache entries must be dicts, got {type(entry).__name__}")
    return json.dumps(entry, sort_keys=True)


def _decode(text: Any) -> dict[str, Any] | None:
    """The entry a stored row holds, or None when it is not JSON text of an object."""
    if not isinstance(text, str):
        return None
    try:
        entry = json.loads(text)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


#: the fields after the op's key text in a disk key, in order
_DISK_KEY_TAIL = ("device", "torch", "triton", "kernelops", "src")


@dataclasses.dataclass(frozen=True)
class DiskKey:
    """The parts of a disk-cache key: ``op|<key text>|device=D|torch=T|triton=R|kernelops=K|src=H``.

    ``key_text`` is the op's key in :func:`kernelops.ops.keys.key_text` form; ``device`` is
    :attr:`DeviceInfo.key` (``NVIDIA_H100_80GB_HBM3:sm90``, ``cpu``); the versions and ``src`` (the
    op's :meth:`Operation.source_hash`) make a kernel edit or an upgrade miss old entries. The
    selector chain writes keys of this form (``Context.disk_key``).

    >>> k = DiskKey("flash_attention", "dtype=float16|seq_q=128", "cpu", "2.5", "3.1", "0.1.0", "ab12")
    >>> DiskKey.parse(k.text) == k
    True
    """

    op: str
    key_text: str
    device: str
    torch: str
    triton: str
    kernelops: str
    src: str

    @property
    def text(self) -> str:
        """The key as stored on disk."""
        tail = "|".join(f"{name}={getattr(self, name)}" for name in _DISK_KEY_TAIL)
        return f"{self.op}|{self.key_text}|{tail}"

    @property
    def memory_key(self) -> str:
        """The key without versions and source hash (the in-process cache's key)."""
        return f"{self.op}|{self.key_text}|device={self.device}"

    @property
    def versions(self) -> dict[str, str]:
        return {"kernelops": self.kernelops, "torch": self.torch, "triton": self.triton}

    @classmethod
    def parse(cls, text: str) -> "DiskKey | None":
        """The parts of ``text``, or None when it is not a key of this form."""
        if not isinstance(text, str):
            return None
        parts = text.split("|")
        if len(parts) < 2 + len(_DISK_KEY_TAIL):
            return None
        tail = parts[-len(_DISK_KEY_TAIL):]
        values = {}
        for name, part in zip(_DISK_KEY_TAIL, tail):
            field, sep, value = part.partition("=")
            if field != name or not sep:
                return None
            values[name] = value
        op, key = parts[0], "|".join(parts[1:-len(_DISK_KEY_TAIL)])
        if not op or "=" in op or not key:
            return None
        return cls(op, key, **values)


class ConfigCache:
    """Memory dict in front of a lazily opened, JSON-only disk store (see the module docstring).

    ``directory`` defaults to :func:`default_cache_dir` (read when the instance is created).
    ``disk=False`` keeps everything in memory. ``timeout`` (seconds) bounds how long an operation
    waits for a database locked by another process before the cache degrades to memory-only.

    Entries returned by the getters are the cached dicts themselves: treat them as read-only.
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, disk: bool = True, timeout: float = 5.0):
        self._directory = pathlib.Path(directory) if directory is not None else default_cache_dir()
        self._use_disk = bool(disk)
        self._timeout = float(timeout)
        self._memory: dict[str, dict[str, Any]] = {}
        self._store: diskcache.Cache | None = None
        self._degraded = False
        self._warned_pickled = False
        self._lock = threading.Lock()

    # --- properties -----------------------------------------------------------------------------
    @property
    def directory(self) -> pathlib.Path:
        """The disk cache folder (whether or not it could be opened)."""
        return self._directory

    @property
    def disk_available(self) -> bool:
        """False when the disk is off, or once this cache has degraded to memory-only."""
        return self._use_disk and not self._degraded

    # --- memory ---------------------------------------------------------------------------------
    def get_memory(self, key: str) -> dict[str, Any] | None:
        """The in-process entry for ``key``, or None."""
        return self._memory.get(key)

    def put_memory(self, key: str, entry: dict[str, Any]) -> None:
        """Store ``entry`` in the in-process dict only (a normalised JSON copy)."""
        self._memory[key] = json.loads(_encode(entry))

    # --- disk -----------------------------------------------------------------------------------
    def get_disk(self, key: str) -> dict[str, Any] | None:
        """The entry stored on disk for ``key``; None when absent, unreadable or the disk is off."""
        store = self._open()
        if store is None:
            return None
        try:
            text = store.get(key)
        except PickledRowError:
            self._warn_pickled(f"the value of key {key!r}")
            return None
        except Exception as exc:  # noqa: BLE001 - any disk failure degrades, never fails the call
            self._degrade(exc)
            return None
        return _decode(text)

    def put_disk(self, key: str, entry: dict[str, Any]) -> None:
        """Store ``entry`` on disk (one atomic diskcache transaction); a disk failure degrades."""
        text = _encode(entry)
        store = self._open()
        if store is None:
            return
        try:
            store.set(key, text)
        except Exception as exc:  # noqa: BLE001
            self._degrade(exc)

    def disk_items(self) -> list[tuple[str, dict[str, Any]]]:
        """Every readable ``(key, entry)`` on disk, in insertion order; pickled rows are skipped."""
        store = self._open()
        if store is None:
            return []
        try:
            # diskcache's own iterators stop at the first key JsonDisk refuses, so select the
            # text keys directly and count the refused (pickled) ones.
            rows = store._sql("SELECT key, raw FROM Cache ORDER BY rowid").fetchall()  # noqa: SLF001
        except Exception as exc:  # noqa: BLE001
            self._degrade(exc)
            return []
        items = []
        for db_key, raw in rows:
            if not raw:
                self._warn_pickled("a key")
                continue
            if not isinstance(db_key, str):
                continue
            entry = self.get_disk(db_key)
            if entry is not None:
                items.append((db_key, entry))
        return items

    def disk_count(self) -> int:
        """How many rows the disk store holds (refused pickled rows included; 0 when unavailable)."""
        store = self._open()
        if store is None:
            return 0
        try:
            return int(store._sql("SELECT COUNT(*) FROM Cache").fetchone()[0])  # noqa: SLF001
        except Exception as exc:  # noqa: BLE001
            self._degrade(exc)
            return 0

    def put_disk_many(self, entries: Mapping[str, dict[str, Any]]) -> bool:
        """Store every ``key -> entry`` on disk in one transaction: all of them or none.

        Every entry is encoded before anything is written (a bad entry raises ``TypeError`` and
        nothing is stored). Returns False when the disk is off or fails (the cache then degrades,
        as for :meth:`put_disk`); True when every entry was written.
        """
        rows = []
        for key, entry in entries.items():
            if type(key) is not str:  # noqa: E721
                raise TypeError(f"cache keys must be str, got {type(key).__name__}")
            rows.append((key, _encode(entry)))
        store = self._open()
        if store is None:
            return False
        try:
            with store.transact():
                for key, text in rows:
                    store.set(key, text)
        except Exception as exc:  # noqa: BLE001
            self._degrade(exc)
            return False
        return True

    def delete_many(self, keys: Iterable[str]) -> int:
        """Remove ``keys`` from memory and disk (disk: one transaction); how many disk rows went."""
        keys = list(keys)
        for key in keys:
            self._memory.pop(key, None)
        store = self._open()
        if store is None:
            return 0
        removed = 0
        try:
            with store.transact():
                for key in keys:
                    removed += bool(store.delete(key))
        except Exception as exc:  # noqa: BLE001
            self._degrade(exc)
            return 0
        return removed

    def disk_size_bytes(self) -> int:
        """Estimated size of the disk store in bytes (0 when unavailable)."""
        store = self._open()
        if store is None:
            return 0
        try:
            return int(store.volume())
        except Exception as exc:  # noqa: BLE001
            self._degrade(exc)
            return 0

    # --- both -----------------------------------------------------------------------------------
    def get(self, key: str) -> dict[str, Any] | None:
        """Memory first, then disk; a disk hit is copied into memory."""
        entry = self._memory.get(key)
        if entry is not None:
            return entry
        entry = self.get_disk(key)
        if entry is not None:
            self._memory[key] = entry
        return entry

    def put(self, key: str, entry: dict[str, Any]) -> None:
        """Store ``entry`` in memory and on disk."""
        self.put_memory(key, entry)
        self.put_disk(key, entry)

    def delete(self, key: str) -> None:
        """Remove ``key`` from memory and disk (missing keys are ignored)."""
        self._memory.pop(key, None)
        store = self._open()
        if store is None:
            return
        try:
            store.delete(key)
        except Exception as exc:  # noqa: BLE001
            self._degrade(exc)

    def clear(self, memory: bool = True, disk: bool = True) -> None:
        """Drop every entry from memory and/or disk."""
        if memory:
            self._memory.clear()
        if not disk:
            return
        store = self._open()
        if store is None:
            return
        try:
            store.clear()
        except Exception as exc:  # noqa: BLE001
            self._degrade(exc)

    def close(self) -> None:
        """Close the disk store's connection (it reopens on next use); the memory dict is kept."""
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()

    def __repr__(self) -> str:
        state = "disk" if self.disk_available else "memory-only"
        return f"ConfigCache({str(self._directory)!r}, {state}, {len(self._memory)} in memory)"

    # --- internals ------------------------------------------------------------------------------
    def _open(self) -> diskcache.Cache | None:
        """The disk store, opened on first use; None when the disk is off or degraded."""
        store = self._store
        if store is not None or not self.disk_available:
            return store
        error = None
        with self._lock:
            if self._store is None and not self._degraded:
                try:
                    self._store = self._open_store()
                except Exception as exc:  # noqa: BLE001
                    error = exc
            store = self._store
        if error is not None:
            self._degrade(error)
            return None
        return store

    def _open_store(self) -> diskcache.Cache:
        self._directory.mkdir(parents=True, exist_ok=True)
        # diskcache's constructor retries a locked database for a fixed 60 s; probe for the write
        # lock first so that a database held by another process fails within ``timeout``. The
        # probe also surfaces corrupt and read-only databases.
        con = sqlite3.connect(str(self._directory / diskcache.core.DBNAME), timeout=self._timeout, isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")
            con.execute("ROLLBACK")
        finally:
            con.close()
        return diskcache.Cache(str(self._directory), disk=JsonDisk, timeout=self._timeout)

    def _degrade(self, exc: BaseException) -> None:
        """Switch to memory-only for good; warn on the first call only."""
        with self._lock:
            if self._degraded:
                return
            self._degraded = True
            store, self._store = self._store, None
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
        if isinstance(exc, diskcache.Timeout):
            reason = f"database locked by another process for more than {self._timeout:g} s"
        else:
            reason = f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"kernelops: the autotune disk cache at {str(self._directory)!r} is unusable "
            f"({reason}); continuing with an in-memory cache only",
            RuntimeWarning,
            stacklevel=_caller_stacklevel(),
        )

    def _warn_pickled(self, what: str) -> None:
        with self._lock:
            if self._warned_pickled:
                return
            self._warned_pickled = True
        warnings.warn(
            f"kernelops: refused a pickled row ({what}) in the autotune disk cache at "
            f"{str(self._directory)!r}; pickled rows are never loaded because unpickling can run "
            "code. The row is treated as absent.",
            RuntimeWarning,
            stacklevel=_caller_stacklevel(),
        )


def _caller_stacklevel() -> int:
    """``warnings.warn`` stacklevel of the first frame outside this module (the user's call)."""
    frame = sys._getframe(1)  # noqa: SLF001 - the function calling warnings.warn
    level = 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
        level += 1
    return level
