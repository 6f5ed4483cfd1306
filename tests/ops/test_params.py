"""Tests for kernelops.ops.params: validation and the JSON round trip of configs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kernelops.ops.params import BwdParams, FwdParams, JsonConfig, short


@dataclasses.dataclass(frozen=True)
class _OpConfig(JsonConfig):
    """A small op config nesting launch parameters, like a real op's config."""

    platform: str = "auto"
    fwd_params: FwdParams | None = None
    bwd_params: BwdParams | None = None


@pytest.mark.parametrize("cls", [FwdParams, BwdParams])
@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("q_blocksize", 0, "positive int"),
        ("kv_blocksize", -64, "positive int"),
        ("num_warps", 4.0, "positive int"),
        ("num_stages", True, "positive int"),
        ("q_blocksize", "64", "positive int"),
        ("q_blocksize", 48, "power of two"),
        ("kv_blocksize", 96, "power of two"),
        ("num_warps", 6, "power of two"),
    ],
)
def test_params_validation(cls, field, value, match):
    with pytest.raises(ValueError, match=match):
        cls(**{field: value})


def test_num_stages_need_not_be_power_of_two():
    assert FwdParams(num_stages=3).num_stages == 3


@pytest.mark.parametrize("params", [FwdParams(), FwdParams(128, 32, 8, 3), BwdParams(16, 128, 2, 1),
                                    FwdParams(64, 64, 4, 3, tma=True, ws=True), FwdParams(ws=False),
                                    BwdParams(64, 64, 4, 2, ws=True, fused=False)])
def test_params_json_round_trip(params):
    data = json.loads(json.dumps(params.to_dict()))
    defaults = {"tma": False, "ws": None, "fused": None}  # fields added after files shipped: left out at their default
    kept = {k: v for k, v in dataclasses.asdict(params).items() if k not in defaults or defaults[k] != v}
    assert data == kept
    back = type(params).from_dict(data)
    assert back == params and type(back) is type(params)


def test_ws_field():
    assert FwdParams.from_dict({"q_blocksize": 64}).ws is None  # a file written before the field: automatic
    assert FwdParams(ws=False).to_dict()["ws"] is False
    with pytest.raises(ValueError, match="bool or None"):
        FwdParams(ws=1)
    assert short(FwdParams(64, 64, 4, 3, tma=True, ws=True)) == "q64 kv64 w4 s3 tma ws"
    assert short(FwdParams(ws=False)).endswith(" no-ws") and short(FwdParams()) == "q64 kv64 w4 s2"


def test_unknown_field_rejected():
    data = FwdParams().to_dict() | {"num_ctas": 2}
    with pytest.raises(ValueError, match="unknown field"):
        FwdParams.from_dict(data)


def test_from_dict_requires_dict():
    with pytest.raises(TypeError):
        FwdParams.from_dict([64, 64, 4, 2])


def test_from_dict_validates_values():
    with pytest.raises(ValueError, match="power of two"):
        FwdParams.from_dict({"q_blocksize": 100})


def test_nested_round_trip():
    cfg = _OpConfig(platform="triton", fwd_params=FwdParams(128, 64, 8, 3), bwd_params=BwdParams(64, 128, 4, 2))
    data = json.loads(json.dumps(cfg.to_dict()))
    assert data["fwd_params"] == {"q_blocksize": 128, "kv_blocksize": 64, "num_warps": 8, "num_stages": 3}
    assert data["bwd_params"] == {"q_blocksize": 64, "kv_blocksize": 128, "num_warps": 4, "num_stages": 2}
    back = _OpConfig.from_dict(data)
    assert back == cfg
    assert type(back.fwd_params) is FwdParams and type(back.bwd_params) is BwdParams


def test_fwd_params_tma_flag():
    """Entries written before ``FwdParams.tma`` existed read as the pointer kernel, and entries
    without it are written as before; the flag round-trips and must be a bool."""
    old = {"q_blocksize": 64, "kv_blocksize": 64, "num_warps": 4, "num_stages": 3}
    assert FwdParams.from_dict(old) == FwdParams(64, 64, 4, 3) and not FwdParams.from_dict(old).tma
    assert FwdParams(64, 64, 4, 3).to_dict() == old
    tma = FwdParams(64, 64, 4, 3, tma=True)
    assert tma.to_dict() == {**old, "tma": True}
    assert FwdParams.from_dict(json.loads(json.dumps(tma.to_dict()))) == tma != FwdParams(64, 64, 4, 3)
    assert short(tma) == "q64 kv64 w4 s3 tma" and short(FwdParams(64, 64, 4, 3)) == "q64 kv64 w4 s3"
    with pytest.raises(ValueError, match="tma must be a bool"):
        FwdParams(64, 64, 4, 3, tma=1)
    with pytest.raises(TypeError):
        BwdParams(64, 64, 4, 3, tma=True)  # the backward has one kernel


def test_nested_none_round_trip():
    cfg = _OpConfig()
    assert _OpConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_nested_unknown_field_rejected():
    data = _OpConfig(fwd_params=FwdParams()).to_dict()
    data["fwd_params"]["bogus"] = 1
    with pytest.raises(ValueError, match="unknown field"):
        _OpConfig.from_dict(data)


def test_short():
    assert short(None) == "-"
    assert short(FwdParams(128, 64, 8, 3)) == "q128 kv64 w8 s3"
