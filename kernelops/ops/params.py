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

    #: fields added after cache files were shipped: left out while at their default, so files
    #: written now still read in versions that predate the field
    _omit_default: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name in self._omit_default and value == f.default:
                continue
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


def _check_ws(obj) -> None:
    if obj.ws is not None and not isinstance(obj.ws, bool):
        raise ValueError(f"{type(obj).__name__}.ws must be a bool or None (automatic), got {obj.ws!r}")


@dataclasses.dataclass(frozen=True)
class TileParams(JsonConfig):
    """Launch parameters of a tiled attention kernel: tile sizes over queries and keys, warps and
    pipeline depth."""

    q_blocksize: int = 64
    kv_blocksize: int = 64
    num_warps: int = 4
    num_stages: int = 2

    _pow2: ClassVar[tuple[str, ...]] = ("q_blocksize", "kv_blocksize", "num_warps")

    def __post_init__(self):
        _check_positive(self, ("q_blocksize", "kv_blocksize", "num_warps", "num_stages"))
        _check_pow2(self, self._pow2)


@dataclasses.dataclass(frozen=True)
class FwdParams(TileParams):
    """Forward launch parameters. ``tma=True`` runs calls the TMA-descriptor kernel takes (Hopper
    or newer, BSHD row views, D a power of two, no bias / ALiBi / segments / packing / dropout;
    kernels/flash_attention/fwd_tma.py) with it, and every other call with the pointer kernel
    (kernels/flash_attention/fwd.py); the tiles are the same either way.

    ``ws`` chooses the warp-specialised Gluon kernel (kernels/flash_attention/fwd_ws.py; sm_90,
    D 64/128/256, Sq == Sk a multiple of 128, causal or full, no other score terms, a positive scale) for the
    calls it takes: ``True`` always, ``False`` never, ``None`` (configs written before it existed, and the
    heuristic) by its own rule (``FlashAttention.ws_auto``). It has fixed tiles; the tiles here
    serve the calls it does not take."""

    tma: bool = False
    ws: bool | None = None

    _omit_default: ClassVar[tuple[str, ...]] = ("tma", "ws")

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.tma, bool):
            raise ValueError(f"FwdParams.tma must be a bool, got {self.tma!r}")
        _check_ws(self)


@dataclasses.dataclass(frozen=True)
class BwdParams(TileParams):
    """Backward launch parameters (shared by the dK/dV and the dQ kernels).

    ``ws`` chooses the warp-specialised Gluon dK/dV kernel (kernels/flash_attention/bwd_ws.py;
    the forward's scope: sm_90, D 64/128, Sq == Sk a multiple of 128, causal (also with a left
    window) or full, no other score terms) for the calls it takes, as ``FwdParams.ws`` does: ``True``, ``False`` or ``None``
    (automatic, ``FlashAttention.ws_auto``). The tiles then serve the dQ kernel only.

    ``fused`` (with the warp-specialised kernel) forms dQ in the same Gluon kernel
    (kernels/flash_attention/bwd_fused.py), where the tiles are unused: ``True``, ``False`` (the
    Triton dQ kernel) or ``None`` (``FlashAttention.fused_on``'s rule). Its float32 dQ adds land in
    any order, so ``deterministic=True`` calls never take it."""

    ws: bool | None = None
    fused: bool | None = None

    _omit_default: ClassVar[tuple[str, ...]] = ("ws", "fused")

    def __post_init__(self):
        super().__post_init__()
        _check_ws(self)
        if self.fused is not None and not isinstance(self.fused, bool):
            raise ValueError(f"BwdParams.fused must be a bool or None (automatic), got {self.fused!r}")


@dataclasses.dataclass(frozen=True)
class DecodeParams(JsonConfig):
    """Split-KV (decode) launch parameters: key tile, warps, pipeline depth and the number of key
    splits per (batch, KV head); ``num_splits = 0`` sizes it from the device's SM count."""

    kv_blocksize: int = 64
    num_warps: int = 4
    num_stages: int = 3
    num_splits: int = 0

    def __post_init__(self):
        _check_positive(self, ("kv_blocksize", "num_warps", "num_stages"))
        _check_pow2(self, ("kv_blocksize", "num_warps"))
        if isinstance(self.num_splits, bool) or not isinstance(self.num_splits, int) or self.num_splits < 0:
            raise ValueError(f"DecodeParams.num_splits must be an int >= 0 (0 = automatic), got {self.num_splits!r}")


def short(params: TileParams | DecodeParams | None) -> str:
    """Compact text for logs and tables: ``q128 kv64 w8 s3`` (``q64 kv64 w4 s3 tma``, ``... ws`` or
    ``... no-ws`` where ``FwdParams.ws`` / ``BwdParams.ws`` is set, ``fused`` / ``split`` where
    ``BwdParams.fused`` is; decode:
    ``kv64 w4 s3 splits=auto``)."""
    if params is None:
        return "-"
    if isinstance(params, DecodeParams):
        splits = params.num_splits or "auto"
        return f"kv{params.kv_blocksize} w{params.num_warps} s{params.num_stages} splits={splits}"
    text = f"q{params.q_blocksize} kv{params.kv_blocksize} w{params.num_warps} s{params.num_stages}"
    text += " tma" if getattr(params, "tma", False) else ""
    ws = getattr(params, "ws", None)
    fused = getattr(params, "fused", None)
    text += "" if ws is None else " ws" if ws else " no-ws"
    return text + ("" if fused is None else " fused" if fused else " split")
