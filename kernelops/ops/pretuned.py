"""Shipped pre-tuned configs: ``autotune_cache/<DEVICE>/<op>.json``, plain JSON data, never code.

File format::

    {
        "metadata": {"device": "NVIDIA_H100_80GB_HBM3", "capability": [9, 0],
                     "kernelops": "0.1.0", "torch": "2.x", "triton": "3.x", "created": "ISO date"},
        "entries": {"<key text>": <entry>, ...}
    }

``DEVICE`` is :attr:`DeviceInfo.name`; an entry has the shape documented in
:mod:`kernelops.ops.cache`. ``capability`` is ``null`` for files written on a CPU.

Lookup order (:meth:`PretunedStore.lookup`): the file of this device (exact key text, then the
nearest bucket), then the files of other devices whose metadata has the same compute capability
(exact, then nearest), else nothing, with a reason. A malformed file is skipped with one
:class:`RuntimeWarning` naming it; lookups never raise because of file contents. A file over
:data:`~kernelops.ops.entries.MAX_FILE_BYTES`, with more than ``MAX_ENTRIES`` entries or a key
text that is not canonical or longer than ``MAX_KEY_CHARS`` is malformed. Each entry is checked
when the selector chain uses it (:func:`kernelops.ops.entries.check_entry`, then against the call);
one that cannot serve a call is skipped there, with its reason.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import pathlib
import tempfile
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelops.ops.entries import (
    MAX_ENTRIES, MAX_ENTRY_FIELDS, MAX_FILE_BYTES, MAX_TEXT_CHARS, EntryError, check_key_text,
)
from kernelops.ops.keys import Key, bucket_distance, key_text, parse_key_text

if TYPE_CHECKING:
    from kernelops.ops.device import DeviceInfo

__all__ = ["MalformedPretunedFile", "PretunedStore", "default_pretuned_root", "parse_pretuned", "read_pretuned_file",
           "write_pretuned_file"]

#: Environment variable overriding the folder of shipped files.
PRETUNED_DIR_ENV = "KERNELOPS_PRETUNED_DIR"
#: the ``kernelops`` package folder (this file is kernelops/ops/pretuned.py)
_PACKAGE_DIR = pathlib.Path(__file__).parent.parent

_METADATA_TEXT_FIELDS = ("device", "kernelops", "torch", "triton", "created")


def default_pretuned_root() -> pathlib.Path:
    """``$KERNELOPS_PRETUNED_DIR``, else ``autotune_cache/`` inside the installed package, else the
    one at the root of a source checkout."""
    env = os.environ.get(PRETUNED_DIR_ENV)
    if env:
        return pathlib.Path(env).expanduser()
    # found from this file, not by importing the package (ops/ sits below it): a wheel installs
    # the files as kernelops/autotune_cache (pyproject maps the package there); a source checkout
    # keeps them at the repository's root, next to kernelops/
    installed = _PACKAGE_DIR / "autotune_cache"
    return installed if installed.is_dir() else _PACKAGE_DIR.parent / "autotune_cache"


class MalformedPretunedFile(ValueError):
    """A shipped file does not have the documented shape."""


@dataclass(frozen=True)
class _PretunedFile:
    """One parsed file: its metadata and entries, with the entries' keys parsed once."""

    label: str  # "<DEVICE>/<op>.json", for messages
    capability: tuple[int, int] | None
    entries: dict[str, dict[str, Any]]
    keys: tuple[tuple[str, Key], ...]  # (key text, parsed key), sorted by key text


def _check_name(kind: str, name: str) -> None:
    """Op and device names become path components: refuse anything that could escape the root."""
    if not isinstance(name, str) or not name or name.startswith(".") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"invalid {kind} name for a pretuned file: {name!r}")


def _parse_capability(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return (value[0], value[1])
    raise MalformedPretunedFile(f"metadata.capability must be [major, minor] or null, got {value!r}")


def _validate(data: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``(metadata, entries)`` of a parsed file; :class:`MalformedPretunedFile` when off-format."""
    if not isinstance(data, dict):
        raise MalformedPretunedFile(f"top level must be an object, got {type(data).__name__}")
    missing = sorted({"metadata", "entries"} - set(data))
    if missing:
        raise MalformedPretunedFile(f"missing top-level key(s) {missing}")
    metadata, entries = data["metadata"], data["entries"]
    if not isinstance(metadata, dict):
        raise MalformedPretunedFile("metadata must be an object")
    if len(metadata) > MAX_ENTRY_FIELDS:
        raise MalformedPretunedFile(f"metadata has {len(metadata)} fields, more than MAX_ENTRY_FIELDS "
                                    f"({MAX_ENTRY_FIELDS})")
    for field in _METADATA_TEXT_FIELDS:
        if not isinstance(metadata.get(field), str):
            raise MalformedPretunedFile(f"metadata.{field} must be a string, got {metadata.get(field)!r:.80}")
    for field, value in metadata.items():
        if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
            raise MalformedPretunedFile(f"metadata.{str(field)[:64]} is {len(value)} characters long, more than "
                                        f"MAX_TEXT_CHARS ({MAX_TEXT_CHARS})")
    if "capability" not in metadata:
        raise MalformedPretunedFile("metadata.capability is missing")
    _parse_capability(metadata["capability"])
    if not isinstance(entries, dict):
        raise MalformedPretunedFile("entries must be an object")
    if len(entries) > MAX_ENTRIES:
        raise MalformedPretunedFile(f"{len(entries)} entries, more than MAX_ENTRIES ({MAX_ENTRIES})")
    for text, entry in entries.items():
        try:
            check_key_text(text)
        except EntryError as exc:
            raise MalformedPretunedFile(str(exc)) from None
        if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
            raise MalformedPretunedFile(f"entry {text!r} must be an object with a 'config' object")
    return metadata, entries


def _read_file(path: pathlib.Path, label: str) -> _PretunedFile:
    """Parse and validate one file (raises OSError, ValueError)."""
    with open(path, encoding="utf-8") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_FILE_BYTES:
            raise MalformedPretunedFile(f"{size} bytes, more than MAX_FILE_BYTES ({MAX_FILE_BYTES})")
        data = json.load(f)
    metadata, entries = _validate(data)
    keys = tuple((text, parse_key_text(text)) for text in sorted(entries))
    return _PretunedFile(label, _parse_capability(metadata["capability"]), entries, keys)


def read_pretuned_file(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``(metadata, entries)`` of a shipped-format file, validated as :class:`PretunedStore` does.

    Raises ``OSError`` when it cannot be read, ``ValueError`` (``json.JSONDecodeError``,
    :class:`MalformedPretunedFile`) when it is not such a file. ``metadata["capability"]`` is
    returned as a ``(major, minor)`` tuple or None.

    >>> meta, entries = read_pretuned_file("autotune_cache/NVIDIA_H200/flash_attention.json")  # doctest: +SKIP
    """
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return parse_pretuned(data)


def parse_pretuned(data: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``(metadata, entries)`` of an already parsed JSON document in the shipped format
    (:class:`MalformedPretunedFile` when it is not); ``metadata["capability"]`` as a tuple or None."""
    metadata, entries = _validate(data)
    return {**metadata, "capability": _parse_capability(metadata["capability"])}, entries


def _cap_text(capability: tuple[int, int]) -> str:
    return f"sm{capability[0]}{capability[1]}"


def _nearest(files: list[_PretunedFile], key: Key, bucketed: tuple[str, ...]):
    """``(distance, file, key text)`` of the closest entry over ``files``, or None."""
    best = None
    for file in files:
        for text, other in file.keys:
            distance = bucket_distance(key, other, bucketed)
            if distance is None:
                continue
            candidate = (distance, file.label, text, file)
            if best is None or candidate[:3] < best[:3]:
                best = candidate
    return None if best is None else (best[0], best[3], best[2])


class PretunedStore:
    """Reads shipped pre-tuned files under ``root`` (default :func:`default_pretuned_root`).

    Each file is parsed at most once per instance; :meth:`reload` forgets what was read.
    """

    def __init__(self, root: str | os.PathLike | None = None):
        self._root = pathlib.Path(root) if root is not None else default_pretuned_root()
        self._files: dict[pathlib.Path, _PretunedFile | None] = {}
        self._device_dirs: list[str] | None = None
        self._lock = threading.Lock()

    @property
    def root(self) -> pathlib.Path:
        return self._root

    def reload(self) -> None:
        """Forget parsed files and the device-folder listing (e.g. after writing new files)."""
        with self._lock:
            self._files.clear()
            self._device_dirs = None

    def lookup(
        self,
        op_name: str,
        key: Key,
        bucketed_fields: tuple[str, ...],
        device: DeviceInfo,
    ) -> tuple[dict[str, Any] | None, str]:
        """``(entry, how)``: the best shipped entry for ``key`` on ``device`` and how it was found.

        Order: this device's file (exact key, then nearest bucket), then the files of other
        devices with the same compute capability (exact, then nearest). CPU devices (no
        capability) only use their own folder. ``entry`` is a copy; when it is None, ``how`` says
        why nothing matched.
        """
        _check_name("op", op_name)
        _check_name("device", device.name)
        text = key_text(key)
        bucketed = tuple(bucketed_fields)
        filename = f"{op_name}.json"
        reasons = []

        own = self._load(device.name, filename)
        if own is None:
            reasons.append(f"no usable {device.name}/{filename} under {self._root}")
        else:
            found = self._match([own], text, key, bucketed)
            if found is not None:
                return found
            reasons.append(f"no entry in {own.label} matches {text!r} (exactly or by bucket)")

        if device.capability is None:
            reasons.append("no capability fallback for a device without a compute capability")
            return None, "; ".join(reasons)

        cap = tuple(device.capability)
        peers = []
        for name in self._list_device_dirs():
            if name == device.name:
                continue
            file = self._load(name, filename)
            if file is not None and file.capability == cap:
                peers.append(file)
        if not peers:
            reasons.append(f"no other device folder with capability {_cap_text(cap)} has {filename}")
            return None, "; ".join(reasons)
        found = self._match(peers, text, key, bucketed)
        if found is not None:
            entry, how = found
            return entry, f"same capability {_cap_text(cap)}: {how}"
        labels = ", ".join(p.label for p in peers)
        reasons.append(f"no entry matches in same-capability ({_cap_text(cap)}) files {labels}")
        return None, "; ".join(reasons)

    # --- internals ------------------------------------------------------------------------------
    @staticmethod
    def _match(files: list[_PretunedFile], text: str, key: Key, bucketed: tuple[str, ...]):
        for file in files:
            if text in file.entries:
                return copy.deepcopy(file.entries[text]), f"exact key in {file.label}"
        near = _nearest(files, key, bucketed)
        if near is not None:
            distance, file, other = near
            how = f"nearest bucket (distance {distance:.1f}) {other!r} in {file.label}"
            return copy.deepcopy(file.entries[other]), how
        return None

    def _list_device_dirs(self) -> list[str]:
        with self._lock:
            if self._device_dirs is None:
                try:
                    self._device_dirs = sorted(p.name for p in self._root.iterdir() if p.is_dir())
                except OSError:
                    self._device_dirs = []
            return self._device_dirs

    def _load(self, device_name: str, filename: str) -> _PretunedFile | None:
        """The parsed file, or None when absent or malformed (warned once)."""
        path = self._root / device_name / filename
        with self._lock:
            if path in self._files:
                return self._files[path]
            label = f"{device_name}/{filename}"
            parsed = None
            if path.is_file():
                try:
                    parsed = _read_file(path, label)
                except (OSError, ValueError, RecursionError) as exc:
                    warnings.warn(
                        f"kernelops: skipping malformed pretuned file {str(path)!r}: {type(exc).__name__}: {exc}",
                        RuntimeWarning,
                        stacklevel=3,
                    )
            self._files[path] = parsed
            return parsed


def write_pretuned_file(
    root: str | os.PathLike,
    op_name: str,
    entries: dict[str, dict[str, Any]],
    device: DeviceInfo,
    metadata: dict[str, Any] | None = None,
) -> pathlib.Path:
    """Write ``root/<device.name>/<op_name>.json`` atomically and return its path.

    Entries already in the file are kept unless ``entries`` has the same key text (new ones
    override). Metadata is filled from ``device`` and :func:`kernelops.ops.device.versions`;
    ``metadata`` adds extra (JSON) fields, e.g. ``{"kernel_source_hash": ...}``, but cannot
    replace the documented ones. An existing malformed file is replaced (with a warning).
    """
    from kernelops.ops.device import versions

    _check_name("op", op_name)
    _check_name("device", device.name)
    folder = pathlib.Path(root) / device.name
    path = folder / f"{op_name}.json"

    merged: dict[str, dict[str, Any]] = {}
    if path.exists():
        try:
            with open(path, encoding="utf-8") as f:
                _, merged = _validate(json.load(f))
        except (OSError, ValueError, RecursionError) as exc:
            warnings.warn(
                f"kernelops: replacing malformed pretuned file {str(path)!r}: {type(exc).__name__}: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )
            merged = {}
    merged = dict(merged)
    merged.update(entries)

    v = versions()
    data = {
        "metadata": {
            **(metadata or {}),
            "device": device.name,
            "capability": None if device.capability is None else list(device.capability),
            "kernelops": v["kernelops"],
            "torch": v["torch"],
            "triton": v["triton"],
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
        "entries": merged,
    }
    _validate(json.loads(json.dumps(data)))  # refuse writing what lookup would skip
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"

    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{op_name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; shipped data is world-readable
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
