"""The user's tuned-config disk cache as ``kernelops cache`` shows and moves it: list its entries,
export them as shipped-format files, and import such files (validated) on another machine.

Disk keys have the form of :class:`kernelops.ops.cache.DiskKey`: the op's key text, the device key
(``NVIDIA_H100_80GB_HBM3:sm90``, ``cpu``), the torch / triton / kernelops versions and the op's
kernel-source hash. An entry is *current* when its versions and hash are this install's, i.e. when
the executor can still find it; others are *stale* (an upgrade or a kernel edit made them
unreachable).

Files (the shipped format of :mod:`kernelops.ops.pretuned`)::

    DIR/<DEVICE>/<op>.json = {"metadata": {"device", "capability", "kernelops", "torch", "triton",
                                           "created", "kernel_source_hash"},
                              "entries": {"<key text>": <entry>, ...}}

:func:`export_cache` writes current entries only, one file per (op, device), merged into a file
already there; ``kernel_source_hash`` is an extra metadata field (files written by ``kernelops tune
--export`` lack it). Such a file can be committed to ``autotune_cache/`` or imported elsewhere.

:func:`import_cache_file` reads one file with :func:`read_cache_file`, which refuses anything but
UTF-8 JSON of that shape (a pickle, a binary or truncated file, ``NaN``, duplicated names, an
unknown op, a file over ``MAX_FILE_BYTES`` or with more than ``MAX_ENTRIES`` entries, ...) with a
:class:`CacheFileError` naming the problem. Each entry is checked by
:func:`kernelops.ops.entries.check_entry`, the function the executor checks the entries it reads
with: fields and their types, every string's length, the config (unknown fields, types, launch
parameters inside the bounds, ``backend`` of the file's device). One bad entry refuses the file.
Then:

- device: the file's device (name and capability) must be this machine's, else the file is
  refused, because the executor only looks up entries of its own device key. ``any_device=True``
  stores them under the file's device key anyway (for a cache folder shared with such machines).
- versions: the disk key carries this install's versions and kernel hash. When the file's
  torch / triton / kernelops versions (and its ``kernel_source_hash``, when it records one) are not
  this install's, the file is refused; ``accept_versions=True`` stores the entries under this
  install's versions anyway (each entry keeps its own ``versions`` record). A file without a
  ``kernel_source_hash`` is taken to match this install's kernels (a note says so).
- every entry is written in one disk transaction: all or nothing. Imported entries get
  ``"imported_from": <file path>`` (its last ``MAX_TEXT_CHARS`` characters).

>>> from kernelops.ops import ConfigCache
>>> rows = cache_rows(ConfigCache("/tmp/my-cache"))                       # doctest: +SKIP
>>> export_cache(ConfigCache("/tmp/my-cache"), "exported/")               # doctest: +SKIP
>>> import_cache_file(ConfigCache("/tmp/other"), "exported/cpu/flash_attention.json")   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import pathlib
import re
from typing import Any

from kernelops.ops.cache import ConfigCache, DiskKey
from kernelops.ops.device import DeviceInfo, device_info, versions
from kernelops.ops.entries import MAX_FILE_BYTES, EntryError, check_entry, clip_text
from kernelops.ops.operation import Operation
from kernelops.ops.pretuned import MalformedPretunedFile, parse_pretuned, write_pretuned_file

__all__ = [
    "CacheFile", "CacheFileError", "CacheRow", "ExportReport", "ImportReport", "ShippedFile", "cache_rows",
    "config_summary", "device_from_key", "export_cache", "files_for_device", "import_cache_file", "known_operations",
    "operation_named", "read_cache_file", "shipped_files",
]

#: device names go into paths and disk keys
_DEVICE_NAME = re.compile(r"[A-Za-z0-9_.+()\-]+")
#: entry fields that are bookkeeping of one cache folder, not part of an exported entry
_LOCAL_FIELDS = ("imported_from",)


class CacheFileError(ValueError):
    """A cache file was refused; the message says why (nothing was written)."""


# --- ops by name --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _public_ops() -> dict[str, type]:
    importlib.import_module("kernelops.modules")  # defines the public Operation subclasses
    found: dict[str, type] = {}
    stack = list(Operation.__subclasses__())
    while stack:
        cls = stack.pop(0)
        stack += cls.__subclasses__()
        name = cls.__dict__.get("name")
        if isinstance(name, str) and cls.__module__.startswith("kernelops.") and name not in found:
            found[name] = cls
    return found


def known_operations() -> list[str]:
    """The names of kernelops' public ops (``flash_attention``, ...)."""
    return sorted(_public_ops())


def operation_named(name: str) -> Operation | None:
    """An instance of the public op called ``name``, or None."""
    cls = _public_ops().get(name)
    return None if cls is None else cls()


# --- listing ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CacheRow:
    """One disk entry: its full key, the key's parts (None for a key of another form), the entry
    and its status: ``"current"``, or why the executor can no longer use it."""

    key: str
    parts: DiskKey | None
    entry: dict[str, Any]
    status: str

    @property
    def current(self) -> bool:
        return self.status == "current"

    @property
    def op(self) -> str:
        return self.parts.op if self.parts is not None else "?"

    def to_dict(self) -> dict[str, Any]:
        """The row as ``kernelops cache list --json`` prints it: the key and its parts (None for a
        key of another form), the status, and the entry's config, timings, source and creation time."""
        parts = self.parts
        entry = self.entry
        return {
            "key": self.key, "op": None if parts is None else parts.op,
            "key_text": None if parts is None else parts.key_text, "device": None if parts is None else parts.device,
            "versions": None if parts is None else {**parts.versions, "kernel_source_hash": parts.src},
            "status": self.status, "current": self.current, "config": entry.get("config"),
            "config_summary": config_summary(entry.get("config")),
            **{name: entry.get(name) for name in ("ms", "heuristic_ms", "source", "created", "imported_from")},
        }


def _status(parts: DiskKey | None) -> str:
    if parts is None:
        return "not a kernelops key"
    op = operation_named(parts.op)
    if op is None:
        return f"unknown op {parts.op!r}"
    here = versions()
    changed = [f"{name} {parts.versions[name]} (now {here[name]})" for name in ("torch", "triton", "kernelops")
               if parts.versions[name] != here[name]]
    if parts.src != op.source_hash():
        changed.append("kernel sources changed")
    return "current" if not changed else "stale: " + ", ".join(changed)


def cache_rows(cache: ConfigCache, *, op: str | None = None) -> list[CacheRow]:
    """The readable disk entries of ``cache`` (of op ``op`` only, if given), in insertion order."""
    rows = []
    for key, entry in cache.disk_items():
        parts = DiskKey.parse(key)
        if op is not None and (parts is None or parts.op != op):
            continue
        rows.append(CacheRow(key, parts, entry, _status(parts)))
    return rows


_ABBREVIATIONS = {"q_blocksize": "q", "kv_blocksize": "kv", "num_warps": "w", "num_stages": "s"}
_FIELD_ORDER = ("fwd_params", "bwd_params", "decode_params", *_ABBREVIATIONS)


def _ordered(items) -> list:
    """Known fields first, in :data:`_FIELD_ORDER`, then the rest as given."""
    rank = {name: i for i, name in enumerate(_FIELD_ORDER)}
    return sorted(items, key=lambda item: rank.get(item[0], len(rank)))


def config_summary(config: Any) -> str:
    """A config dict in one short line: ``fwd q128,kv64,w8,s3; bwd q64,kv64,w4,s2``.

    Nested ``*_params`` objects become ``<phase> <fields>`` (tile sizes ``q``/``kv``, ``w`` warps,
    ``s`` stages, others ``name=value``); top-level values at their defaults (``auto``, ``any``,
    null) are left out.

    >>> config_summary({"fwd_params": {"num_warps": 8, "q_blocksize": 128}, "platform": "auto"})
    'fwd q128,w8'
    """
    if not isinstance(config, dict):
        return repr(config)
    parts = []
    for name, value in _ordered(config.items()):
        if isinstance(value, dict):
            inner = ",".join(f"{_ABBREVIATIONS[k]}{v}" if k in _ABBREVIATIONS else f"{k}={v}"
                             for k, v in _ordered(value.items()))
            parts.append(f"{name.removesuffix('_params')} {inner}")
        elif value not in (None, "auto", "any"):
            parts.append(f"{name}={value}")
    return "; ".join(parts) or "-"


# --- devices -----------------------------------------------------------------------------------------
def device_from_key(text: str) -> DeviceInfo:
    """The :class:`DeviceInfo` (name and capability only) a device key names:
    ``"NVIDIA_H100_80GB_HBM3:sm90"`` -> name and ``(9, 0)``; ``"cpu"`` -> a CPU."""
    name, sep, cap = text.rpartition(":")
    if not sep:
        return DeviceInfo("cpu" if text == "cpu" else "cuda", 0, text, None, 0, 0)
    match = re.fullmatch(r"sm(\d+)(\d)", cap)
    if match is None or not name:
        raise ValueError(f"malformed device key {text!r}: expected NAME:smXY or a name")
    return DeviceInfo("cuda", 0, name, (int(match[1]), int(match[2])), 0, 0)


def _device_key(name: str, capability: tuple[int, int] | None) -> str:
    return f"{name}:sm{capability[0]}{capability[1]}" if capability is not None else name


# --- export ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ExportReport:
    """What :func:`export_cache` wrote: ``files`` (path -> entries written) and the entries it
    left out with the reason (``(disk key, status)``)."""

    files: dict[pathlib.Path, int] = dataclasses.field(default_factory=dict)
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    @property
    def exported(self) -> int:
        return sum(self.files.values())


def export_cache(cache: ConfigCache, root: str | os.PathLike, *, op: str | None = None) -> ExportReport:
    """Write the current entries of ``cache`` (of op ``op`` only, if given) as
    ``root/<DEVICE>/<op>.json`` shipped-format files, merged into files already there."""
    report = ExportReport()
    groups: dict[tuple[str, str, str], dict[str, dict]] = {}
    for row in cache_rows(cache, op=op):
        if not row.current:
            report.skipped.append((row.key, row.status))
            continue
        entry = {k: v for k, v in row.entry.items() if k not in _LOCAL_FIELDS}
        groups.setdefault((row.parts.op, row.parts.device, row.parts.src), {})[row.parts.key_text] = entry
    for (op_name, device, src), entries in groups.items():
        path = write_pretuned_file(root, op_name, entries, device_from_key(device),
                                   metadata={"kernel_source_hash": src})
        report.files[path] = report.files.get(path, 0) + len(entries)
    return report


# --- reading and validating a file -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CacheFile:
    """A validated shipped-format file: its op, metadata (capability as a tuple) and entries."""

    path: pathlib.Path
    op: str
    metadata: dict[str, Any]
    entries: dict[str, dict[str, Any]]

    @property
    def device_key(self) -> str:
        return _device_key(self.metadata["device"], self.metadata["capability"])


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out = {}
    for name, value in pairs:
        if name in out:
            raise ValueError(f"the name {name!r} appears twice in one object")
        out[name] = value
    return out


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _check_entries(operation: Operation, path: pathlib.Path, entries: dict[str, Any], device: DeviceInfo) -> None:
    """Every entry as the executor checks what it reads (:func:`kernelops.ops.entries.check_entry`):
    as the file holds it (the executor's words for a bad entry), then in the form an import stores
    it (with its local fields), so that no stored row is refused later."""
    local = {name: clip_text(str(path)) for name in _LOCAL_FIELDS}
    for key, entry in entries.items():
        try:
            check_entry(operation, entry, key=key, device=device)
            check_entry(operation, {**entry, **local}, key=key, device=device)
        except EntryError as exc:
            raise CacheFileError(f"{path}: {exc}") from None


def read_cache_file(path: str | os.PathLike, *, op: str | None = None) -> CacheFile:
    """Read and validate one shipped-format file; :class:`CacheFileError` on anything else.

    ``op`` names the op its entries belong to (default: the file name's stem, ``<op>.json``).
    """
    path = pathlib.Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise CacheFileError(f"{path} is not a regular file")
        if size > MAX_FILE_BYTES:
            raise CacheFileError(f"{path} is {size} bytes, more than the {MAX_FILE_BYTES} (MAX_FILE_BYTES) a cache "
                                 "file may have")
        raw = path.read_bytes()
    except OSError as exc:
        raise CacheFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if raw[:1] == b"\x80" or raw[:2] in (b"(d", b"(l", b"}q"):
        raise CacheFileError(f"{path} looks like a Python pickle: cache files are JSON only and are never unpickled")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CacheFileError(f"{path} is not UTF-8 text (byte {exc.start}): cache files are JSON") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:
        raise CacheFileError(f"{path} is not valid JSON: {exc}") from None
    try:
        metadata, entries = parse_pretuned(data)
    except MalformedPretunedFile as exc:
        raise CacheFileError(f"{path} is not a kernelops cache file: {exc}") from None
    device = metadata["device"]
    if not _DEVICE_NAME.fullmatch(device) or device.startswith("."):
        raise CacheFileError(f"{path}: metadata.device {device!r} is not a device name (letters, digits, _.+()-)")
    source_hash = metadata.get("kernel_source_hash")
    if source_hash is not None and not isinstance(source_hash, str):
        raise CacheFileError(f"{path}: metadata.kernel_source_hash must be a string, got {source_hash!r}")
    op_name = op if op is not None else path.stem
    operation = operation_named(op_name)
    if operation is None:
        origin = "" if op is not None else f" (from the file name {path.name!r}; name the op with --op)"
        raise CacheFileError(f"{path}: unknown op {op_name!r}{origin}; known: {', '.join(known_operations())}")
    if not entries:
        raise CacheFileError(f"{path} has no entries")
    _check_entries(operation, path, entries, device_from_key(_device_key(device, metadata["capability"])))
    return CacheFile(path, op_name, metadata, entries)


# --- import ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ImportReport:
    """What :func:`import_cache_file` stored: how many entries, under which device key, notes."""

    file: CacheFile
    stored: int
    device_key: str
    notes: list[str] = dataclasses.field(default_factory=list)


def _version_mismatches(file: CacheFile, operation: Operation) -> list[str]:
    here = versions()
    out = [f"{name} {file.metadata[name]} (this install: {here[name]})" for name in ("torch", "triton", "kernelops")
           if file.metadata[name] != here[name]]
    recorded = file.metadata.get("kernel_source_hash")
    if recorded is not None and recorded != operation.source_hash():
        out.append(f"kernel sources {recorded} (this install: {operation.source_hash()})")
    return out


def import_cache_file(cache: ConfigCache, path: str | os.PathLike, *, op: str | None = None,
                      device: DeviceInfo | None = None, any_device: bool = False,
                      accept_versions: bool = False) -> ImportReport:
    """Validate ``path`` (:func:`read_cache_file`) and store its entries in ``cache``'s disk store
    under the keys the executor looks up (see the module docstring for the device and version
    rules). All or nothing: :class:`CacheFileError` and nothing written when refused.

    ``device`` is the machine's device (default: :func:`device_info`, the current CUDA device or
    the CPU).
    """
    file = read_cache_file(path, op=op)
    operation = operation_named(file.op)
    device = device if device is not None else device_info()
    notes = []
    if file.device_key != device.key:
        if not any_device:
            raise CacheFileError(
                f"{file.path} holds configs tuned on {file.device_key}, but this machine is {device.key}: the "
                f"executor here would never use them. Nothing was imported (--any-device stores them under "
                f"{file.device_key} anyway, for a cache folder shared with such a machine)")
        notes.append(f"stored for device {file.device_key}; this machine ({device.key}) will not use them")
    mismatches = _version_mismatches(file, operation)
    if mismatches:
        if not accept_versions:
            raise CacheFileError(
                f"{file.path} was tuned with {'; '.join(mismatches)}. The disk cache keys entries by version, so "
                "these would be stale here. Nothing was imported (--accept-versions stores them under this "
                "install's versions anyway; each entry keeps its own 'versions' record)")
        notes.append("accepted version differences: " + "; ".join(mismatches))
    if "kernel_source_hash" not in file.metadata:
        notes.append("the file records no kernel_source_hash (files from `kernelops tune --export` do not): "
                     "its configs are taken to fit this install's kernels")
    here = versions()
    src = operation.source_hash()
    rows = {
        DiskKey(file.op, text, file.device_key, here["torch"], here["triton"], here["kernelops"], src).text:
            {**entry, "imported_from": clip_text(str(file.path))}
        for text, entry in file.entries.items()
    }
    if not cache.put_disk_many(rows):
        raise CacheFileError(f"the disk cache at {cache.directory} is unavailable; nothing was imported")
    return ImportReport(file, len(rows), file.device_key, notes)


# --- shipped files and this device --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ShippedFile:
    """One ``<DEVICE>/<op>.json`` under a pre-tuned root and how it relates to a device:
    ``"exact device"``, ``"same capability"`` (the pretuned selector's fallback) or
    ``"other device"``; ``error`` is set (and ``relation`` is ``"unusable"``) for a malformed file."""

    label: str
    op: str
    relation: str
    entries: int = 0
    metadata: dict[str, Any] | None = None
    error: str | None = None


def shipped_files(root: str | os.PathLike, device: DeviceInfo) -> list[ShippedFile]:
    """Every shipped file under ``root`` with its relation to ``device``, sorted by label."""
    from kernelops.ops.pretuned import read_pretuned_file

    root = pathlib.Path(root)
    out = []
    paths = sorted(root.glob("*/*.json")) if root.is_dir() else []
    for path in paths:
        label = path.relative_to(root).as_posix()
        try:
            metadata, entries = read_pretuned_file(path)
        except (OSError, ValueError, RecursionError) as exc:
            out.append(ShippedFile(label, path.stem, "unusable", error=f"{type(exc).__name__}: {exc}"))
            continue
        if path.parent.name == device.name:
            relation = "exact device"
        elif device.capability is not None and metadata["capability"] == tuple(device.capability):
            relation = "same capability"
        else:
            relation = "other device"
        out.append(ShippedFile(label, path.stem, relation, len(entries), metadata))
    return out


def files_for_device(files: list[ShippedFile]) -> dict[str, list[ShippedFile]]:
    """Per op, the files the pretuned selector reads for the device ``files`` were listed for: its
    own file if there is one (then the same-capability files only serve keys it lacks), else the
    same-capability files; ops with neither are absent."""
    out: dict[str, list[ShippedFile]] = {}
    for relation in ("exact device", "same capability"):
        for file in files:
            if file.relation == relation:
                out.setdefault(file.op, []).append(file)
    return out
