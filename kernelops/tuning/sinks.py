"""Where ``kernelops tune`` writes entries: a shipped-format file (``--export DIR``) or the
user's disk cache (under the keys the autotune selector would have used).

A sink has ``put(key, inputs, entry) -> where`` (a text for the summary table) and ``close()``.
"""

from __future__ import annotations

import os
import time

from kernelops.ops.autotune import AutotunePolicy
from kernelops.ops.device import DeviceInfo
from kernelops.ops.keys import Key, key_text
from kernelops.ops.operation import Operation
from kernelops.ops.pretuned import write_pretuned_file
from kernelops.ops.selectors import Context


class ExportSink:
    """Collects entries for ``root/<device>/<op>.json`` and merges them into the file
    (:func:`write_pretuned_file`) every ``flush_s`` seconds and on :meth:`close`."""

    def __init__(self, root, op: Operation, device: DeviceInfo, flush_s: float = 60.0):
        self.root, self.op, self.device, self.flush_s = root, op, device, flush_s
        self.path = os.path.join(str(root), device.name, f"{op.name}.json")
        self.pending: dict[str, dict] = {}
        self.last_flush = time.monotonic()

    def put(self, key: Key, inputs, entry: dict) -> str:
        self.pending[key_text(key)] = entry
        if time.monotonic() - self.last_flush > self.flush_s:
            self.flush()
        return self.path

    def flush(self) -> None:
        if self.pending:
            write_pretuned_file(self.root, self.op.name, self.pending, self.device)
            self.pending = {}
        self.last_flush = time.monotonic()

    close = flush


class DiskCacheSink:
    """Writes entries to a :class:`~kernelops.ops.cache.ConfigCache`'s disk store under the keys
    the selector chain reads (op key, device, versions, kernel-source hash)."""

    def __init__(self, cache, op: Operation, device: DeviceInfo):
        self.cache, self.op, self.device = cache, op, device

    def put(self, key: Key, inputs, entry: dict) -> str:
        self.cache.put_disk(Context(self.op, inputs, key, self.device, AutotunePolicy.AUTO).disk_key, entry)
        return f"disk cache {self.cache.directory}" if self.cache.disk_available else "memory only (disk unavailable)"

    def close(self) -> None:
        pass
