"""Validation of stored tuned-config entries: one set of rules for every reader.

An *entry* (shape in :mod:`kernelops.ops.cache`) reaches the executor from the user's disk cache
and from the shipped ``autotune_cache/`` files, and reaches the disk cache through ``kernelops
cache import``. All of them check it with :func:`check_entry`, so an import accepts exactly what
the executor would read, and refuses what it would skip:

- the entry's shape: the documented fields with their JSON types, extra fields as scalars only;
- bounded sizes: every string (values, field names, key texts) and the number of fields, so a
  file cannot grow a cache by megabytes per entry;
- the config: ``Config.from_dict`` (unknown fields refused), every field of the type its
  dataclass declares, ``platform`` / ``backend`` among the known names, and launch parameters
  inside the bounds below (the tile floor the attention kernels enforce, and ceilings no kernel
  comes near);
- with a device: the config's ``backend`` ("gpu" / "cpu") must be that device's kind.

The executor then completes the config for the call and checks what depends on the call itself
(the op's ``complete_config``: shared memory of the tiles at this head dim, and whether the
config's platform can run these inputs); an entry that fails there is skipped for that call
(see :mod:`kernelops.ops.selectors`).

The limits are module constants, documented in ``docs/guide/caches_and_security.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any

from kernelops.ops.keys import key_text, parse_key_text
from kernelops.ops.params import DecodeParams, JsonConfig, TileParams

__all__ = [
    "ENTRY_FIELDS", "EntryError", "MAX_BLOCKSIZE", "MAX_CONFIG_INT", "MAX_ENTRIES", "MAX_ENTRY_FIELDS",
    "MAX_FILE_BYTES", "MAX_KEY_CHARS", "MAX_NAME_CHARS", "MAX_NUM_STAGES", "MAX_NUM_WARPS", "MAX_TEXT_CHARS",
    "MIN_TILE", "check_config", "check_entry", "check_key_text", "clip_text",
]

#: longest key text (``dtype=bfloat16|head_dim=128|...``); today's longest is under 200 characters
MAX_KEY_CHARS = 1024
#: longest string value anywhere in an entry (``source``, ``created``, versions, extra fields, paths)
MAX_TEXT_CHARS = 1024
#: longest field name (extra fields of an entry, names in its ``versions`` record)
MAX_NAME_CHARS = 64
#: most fields in one entry, and most names in its ``versions`` record
MAX_ENTRY_FIELDS = 32
#: most entries in one shipped-format file (the largest shipped file has under 1,000)
MAX_ENTRIES = 8192
#: largest shipped-format file read or imported, in bytes (shipped files are under 2 MiB)
MAX_FILE_BYTES = 16 << 20
#: smallest tile of the tiled attention parameters (``TileParams``, ``DecodeParams``): ``tl.dot``'s minimum
MIN_TILE = 16
#: largest block size (fields named ``*blocksize`` / ``block*``) of any config
MAX_BLOCKSIZE = 1024
#: most warps per program (1,024 threads, the CUDA limit)
MAX_NUM_WARPS = 32
#: deepest software pipeline (``num_stages``); the tuners' spaces stop at 4
MAX_NUM_STAGES = 8
#: bound on the magnitude of any other integer in a config
MAX_CONFIG_INT = 1 << 16

_NUMBER_OR_NULL = "number or null"
#: the fields every entry has (see :func:`kernelops.ops.cache.make_entry`) and their JSON types
ENTRY_FIELDS = {
    "config": "object", "ms": _NUMBER_OR_NULL, "heuristic_ms": _NUMBER_OR_NULL, "runner_up": "object or null",
    "runner_up_ms": _NUMBER_OR_NULL, "candidates": "int", "source": "string", "created": "string",
    "versions": "object",
}
_EXTRA = "a string, number, boolean or null (extra field)"


class EntryError(ValueError):
    """A stored entry (or its config or key text) breaks the rules of this module."""


def clip_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters, keeping its end (for paths): ``...tail``."""
    return text if len(text) <= limit else "..." + text[len(text) - limit + 3:]


def _show(value: Any) -> str:
    """A short repr for messages (a refused 16 MiB string is not echoed whole)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _clip_message(text: str) -> str:
    return text if len(text) <= 300 else f"{text[:300]}... ({len(text)} characters)"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_text(value: str, where: str, limit: int = MAX_TEXT_CHARS, what: str = "MAX_TEXT_CHARS") -> None:
    if len(value) > limit:
        raise EntryError(f"{where} is {len(value)} characters long, more than {what} ({limit})")


def check_key_text(text: Any) -> None:
    """A key text as stored in files and disk keys: a string of at most :data:`MAX_KEY_CHARS`,
    ``field=value`` parts, in the canonical form :func:`kernelops.ops.keys.key_text` writes."""
    if not isinstance(text, str):
        raise EntryError(f"key text must be a string, got {type(text).__name__}")
    _check_text(text, f"key text {_show(text)}", MAX_KEY_CHARS, "MAX_KEY_CHARS")
    try:
        canonical = key_text(parse_key_text(text))
    except ValueError as exc:
        raise EntryError(f"malformed key text {_show(text)} ({exc})") from None
    if canonical != text:
        raise EntryError(f"key text {_show(text)} is not in canonical form ({canonical!r})")


# --- configs ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _matches(value: Any, hint: Any) -> bool:
    """Whether a JSON value read into a config field fits the field's declared type."""
    if hint is None or hint is Any:
        return value is None or isinstance(value, (str, bool)) or _is_number(value)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return _is_number(value)
    if hint is str:
        return isinstance(value, str)
    if isinstance(hint, type):
        return isinstance(value, hint)
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (tuple, list):
        item = args[0] if args else None
        return (isinstance(value, (tuple, list)) and len(value) <= MAX_ENTRY_FIELDS
                and all(_matches(v, item) for v in value))
    return bool(args) and any(_matches(value, arg) for arg in args)  # Union / Optional


def _int_bounds(owner: Any, name: str) -> tuple[int, int, str]:
    """``(low, high, what)`` for an integer config field, by its name."""
    if name.endswith("blocksize") or name.startswith("block"):
        if isinstance(owner, (TileParams, DecodeParams)):
            return MIN_TILE, MAX_BLOCKSIZE, (f"at least {MIN_TILE} (MIN_TILE, tl.dot's minimum) and at most "
                                             f"{MAX_BLOCKSIZE} (MAX_BLOCKSIZE)")
        return 1, MAX_BLOCKSIZE, f"from 1 to {MAX_BLOCKSIZE} (MAX_BLOCKSIZE)"
    if name == "num_warps":
        return 1, MAX_NUM_WARPS, f"from 1 to {MAX_NUM_WARPS} (MAX_NUM_WARPS)"
    if name == "num_stages":
        return 1, MAX_NUM_STAGES, f"from 1 to {MAX_NUM_STAGES} (MAX_NUM_STAGES)"
    return -MAX_CONFIG_INT, MAX_CONFIG_INT, f"at most {MAX_CONFIG_INT} (MAX_CONFIG_INT) in magnitude"


def _check_fields(obj: Any, where: str) -> None:
    """Every field of the config dataclass ``obj`` (nested ones too) has its declared type and is
    inside the bounds."""
    from kernelops.ops.operation import BACKENDS, PLATFORMS  # lazy: operation imports torch

    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value, at = getattr(obj, f.name), f"{where}.{f.name}"
        if not _matches(value, hints.get(f.name)):
            raise EntryError(f"{at} must be {hints.get(f.name)}, got {_show(value)}")
        if isinstance(value, JsonConfig):
            _check_fields(value, at)
        elif isinstance(value, str):
            _check_text(value, at)
            allowed = {"platform": PLATFORMS, "backend": BACKENDS}.get(f.name)
            if allowed is not None and value not in allowed:
                raise EntryError(f"{at} must be one of {allowed}, got {_show(value)}")
        elif isinstance(value, float) and not math.isfinite(value):
            raise EntryError(f"{at} must be finite, got {value!r}")
        elif isinstance(value, int) and not isinstance(value, bool):
            low, high, what = _int_bounds(obj, f.name)
            if not low <= value <= high:
                raise EntryError(f"{at} must be {what}, got {_show(value)}")
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                if isinstance(item, str):
                    _check_text(item, f"{at}[{i}]")
                elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_CONFIG_INT:
                    raise EntryError(f"{at}[{i}] must be at most MAX_CONFIG_INT ({MAX_CONFIG_INT}) in magnitude")


def check_config(op: Any, data: Any, *, device: Any = None, where: str = "config"):
    """The config ``data`` (a stored dict) describes, as ``op.config_type``, checked by the rules
    in the module docstring; :class:`EntryError` says what is wrong. ``device`` (a
    :class:`~kernelops.ops.device.DeviceInfo`), when given, must be of the config's ``backend``."""
    if not isinstance(data, dict):
        raise EntryError(f"{where} must be an object, got {type(data).__name__}")
    try:
        config = op.config_type.from_dict(data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise EntryError(f"{where} is not a valid {op.config_type.__name__}: {_clip_message(str(exc))}") from None
    _check_fields(config, where)
    backend = getattr(config, "backend", "any")
    if device is not None and (backend == "gpu" and not device.is_cuda or backend == "cpu" and device.is_cuda):
        raise EntryError(f"{where} asks for backend={backend!r}, but the device is {device.type} ({device.name})")
    return config


# --- entries ------------------------------------------------------------------------------------------
def _check_value(name: str, value: Any, where: str) -> None:
    kind = ENTRY_FIELDS.get(name)
    ok = {
        "object": isinstance(value, dict),
        "object or null": value is None or isinstance(value, dict),
        _NUMBER_OR_NULL: value is None or (_is_number(value) and value >= 0),
        "int": isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_CONFIG_INT,
        "string": isinstance(value, str),
        None: value is None or isinstance(value, (str, bool)) or _is_number(value),
    }[kind]
    if not ok:
        expected = {None: _EXTRA, "int": f"an int from 0 to {MAX_CONFIG_INT}"}.get(kind, kind)
        raise EntryError(f"{where}: field {name!r} must be {expected}, got {_show(value)}")
    if isinstance(value, str):
        _check_text(value, f"{where}: field {name!r}")


def check_entry(op: Any, entry: Any, *, key: str | None = None, device: Any = None):
    """Check a stored entry of ``op`` (and its key text ``key``, when given) and return its config,
    parsed but not completed (fields left None stay None). :class:`EntryError` names the problem.

    >>> from kernelops.modules.flash_attention import FLASH_ATTENTION                  # doctest: +SKIP
    >>> check_entry(FLASH_ATTENTION, make_entry(FlashAttentionConfig(), source="me"))  # doctest: +SKIP
    """
    if key is not None:
        check_key_text(key)
    where = "entry" if key is None else f"entry {key!r}"
    if not isinstance(entry, dict):
        raise EntryError(f"{where} must be an object, got {type(entry).__name__}")
    if len(entry) > MAX_ENTRY_FIELDS:
        raise EntryError(f"{where} has {len(entry)} fields, more than MAX_ENTRY_FIELDS ({MAX_ENTRY_FIELDS})")
    missing = [name for name in ENTRY_FIELDS if name not in entry]
    if missing:
        raise EntryError(f"{where} lacks field(s) {missing}")
    for name, value in entry.items():
        if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:
            raise EntryError(f"{where}: field name {_show(name)} is not a string of at most MAX_NAME_CHARS "
                             f"({MAX_NAME_CHARS}) characters")
        _check_value(name, value, where)
    record = entry["versions"]
    if len(record) > MAX_ENTRY_FIELDS:
        raise EntryError(f"{where}: 'versions' has {len(record)} names, more than MAX_ENTRY_FIELDS "
                         f"({MAX_ENTRY_FIELDS})")
    for name, value in record.items():
        if not (isinstance(name, str) and isinstance(value, str)) or len(name) > MAX_NAME_CHARS:
            raise EntryError(f"{where}: 'versions' must map names to version strings, got {_show(record)}")
        _check_text(value, f"{where}: versions[{name!r}]")
    config = check_config(op, entry["config"], device=device, where=f"{where}: config")
    if entry["runner_up"] is not None:
        check_config(op, entry["runner_up"], where=f"{where}: runner_up")
    return config
