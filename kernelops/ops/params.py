"""Launch parameters and the JSON round-trip every op config shares.

Configs are frozen dataclasses. ``to_dict`` gives plain JSON data; ``from_dict`` rebuilds the
dataclass (nested dataclass fields included) and rejects unknown fields, so a cache file written
by a newer or foreign version never turns into a silently wrong config.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar


class JsonConfig:
    """Mixin for frozen dataclasses that round-trip through JSON-compatible dicts."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, JsonConfig) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__}.from_dict expects a dict, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"{cls.__name__}.from_dict: unknown field(s) {unknown}; known: {sorted(fields)}")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for name, value in data.items():
            nested = _json_config_type(hints.get(name))
            if nested is not None and isinstance(value, dict):
                value = nested.from_dict(value)
            kwargs[name] = value
        return cls(**kwargs)


def _json_config_type(hint) -> type | None:
    """The JsonConfig class inside a type hint such as ``FwdParams | None``, if any."""
    if isinstance(hint, type) and issubclass(hint, JsonConfig):
        return hint
    for arg in typing.get_args(hint):
        found = _json_config_type(arg)
        if found is not None:
            return found
    return None


def _check_positive(obj, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{type(obj).__name__}.{name} must be a positive int, got {value!r}")


def _check_pow2(obj, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value & (value - 1):
            raise ValueError(f"{type(obj).__name__}.{name} must be a power of two, got {value}")


@dataclasses.dataclass(frozen=True)
class FwdParams(JsonConfig):
    """Forward launch parameters: tile sizes over queries and keys, warps and pipeline depth."""

    q_blocksize: int = 64
    kv_blocksize: int = 64
    num_warps: int = 4
    num_stages: int = 2

    _pow2: ClassVar[tuple[str, ...]] = ("q_blocksize", "kv_blocksize", "num_warps")

    def __post_init__(self):
        _check_positive(self, ("q_blocksize", "kv_blocksize", "num_warps", "num_stages"))
        _check_pow2(self, self._pow2)


@dataclasses.dataclass(frozen=True)
class BwdParams(FwdParams):
    """Backward launch parameters (shared by the dK/dV and the dQ kernels)."""


def short(params: FwdParams | None) -> str:
    """Compact text for logs and tables: ``q128 kv64 w8 s3``."""
    if params is None:
        return "-"
    return f"q{params.q_blocksize} kv{params.kv_blocksize} w{params.num_warps} s{params.num_stages}"
