"""kernelops.modules.attention_args: the argument checks the attention ops share (flash_attention,
flash_attention_fp8, attention, scaled_dot_product_attention). Each op's tests refuse bad calls
through the public functions; these pin the helpers' own rules."""

import math

import pytest
import torch

from kernelops.modules.attention_args import (
    MAX_HEAD_DIM, UNBOUNDED, bool_mask_bias, check_dropout, check_extras, check_scalars, check_tensors,
    check_varlen, window_bounds,
)
from tests.op_checks import BadInput, shape_of


@pytest.mark.parametrize("window, causal, want", [
    (None, False, (UNBOUNDED, UNBOUNDED, False)),
    (None, True, (UNBOUNDED, 0, False)),
    (7, False, (7, 7, True)),
    ((5, None), False, (5, UNBOUNDED, True)),
    ((None, 3), True, (UNBOUNDED, 0, True)),   # causal fixes the right bound at 0
    ([4, 2], False, (4, 2, True)),
    (1 << 40, False, (UNBOUNDED, UNBOUNDED, True)),  # wider than any sequence: clipped
])
def test_window_bounds(window, causal, want):
    assert window_bounds(window, causal) == want


@pytest.mark.parametrize("window, error", [
    (True, TypeError), (1.5, TypeError), ((1, 2, 3), TypeError), ((1.0, 2), TypeError), (-1, ValueError),
    ((3, -2), ValueError),
])
def test_window_bounds_refuses(window, error):
    with pytest.raises(error, match="sliding_window"):
        window_bounds(window, False)


def test_check_scalars():
    assert check_scalars(64, None, None) == (0.125, None)
    scale, cap = check_scalars(113, 2, 30)
    assert (scale, cap) == (2.0, 30.0) and type(scale) is float and type(cap) is float
    for bad in (math.inf, math.nan, True, "1"):
        with pytest.raises(ValueError, match="softmax_scale"):
            check_scalars(64, bad, None)
    for bad in (0, -1.0, math.inf, True):
        with pytest.raises(ValueError, match="logits_soft_cap"):
            check_scalars(64, None, bad)


def test_check_dropout():
    assert check_dropout(0) == 0.0 and check_dropout(0.25) == 0.25
    for bad in (1.0, -0.1, True, None):
        with pytest.raises(ValueError, match="dropout_prob"):
            check_dropout(bad)


def _qkv(B=2, Sq=13, Sk=11, Hq=4, Hkv=2, D=16):
    return torch.randn(B, Sq, Hq, D), torch.randn(B, Sk, Hkv, D), torch.randn(B, Sk, Hkv, D)


@pytest.mark.parametrize("case", [
    BadInput(dict(query=torch.randn(2, 13, 4)), ValueError, ["query", "4-D", "query.shape=(2, 13, 4)"]),
    BadInput(dict(key=torch.randn(2, 11, 3, 16), value=torch.randn(2, 11, 3, 16)), ValueError,
             ["multiple", "Hq=4, Hkv=3"]),
    BadInput(dict(value=torch.randn(2, 12, 2, 16)), ValueError, ["key.shape=(2, 11, 2, 16)",
                                                                  "value.shape=(2, 12, 2, 16)"]),
    BadInput(dict(key=torch.randn(3, 11, 2, 16), value=torch.randn(3, 11, 2, 16)), ValueError, ["batch"]),
    BadInput(dict(value=torch.randn(2, 11, 2, 16).half()), TypeError, ["share a dtype", "value.dtype"]),
    BadInput(dict(query=torch.ones(2, 13, 4, 16, dtype=torch.int32)), TypeError, ["floating-point",
                                                                                  "query.dtype=torch.int32"]),
    BadInput(dict(query=[1.0]), TypeError, ["query must be a torch.Tensor"]),
], ids=lambda c: c.error.__name__)
def test_check_tensors_names_the_argument_and_shape(case):
    q, k, v = _qkv()
    args = {"query": q, "key": k, "value": v, **case.override}
    with pytest.raises(case.error) as info:
        check_tensors(args["query"], args["key"], args["value"])
    for word in case.words:
        assert word in str(info.value), (word, str(info.value))


def test_check_tensors_head_dim_limit():
    q = torch.randn(1, 4, 1, MAX_HEAD_DIM + 1)
    with pytest.raises(ValueError, match=f"1..{MAX_HEAD_DIM}"):
        check_tensors(q, q, q)
    q = torch.randn(1, 4, 1, MAX_HEAD_DIM)
    check_tensors(q, q, q)


def test_check_extras():
    q, k, _ = _qkv()
    check_extras(q, k, torch.zeros(1, 4, 13, 11), torch.ones(4), torch.zeros(4))
    check_extras(q, k, torch.zeros(2, 1, 13, 11), torch.ones(2, 4), None)
    with pytest.raises(ValueError, match=r"bias\.shape=\(1, 4, 13, 12\)"):
        check_extras(q, k, torch.zeros(1, 4, 13, 12), None, None)
    with pytest.raises(ValueError, match=r"alibi_slopes\.shape=\(3,\)"):
        check_extras(q, k, None, torch.ones(3), None)
    with pytest.raises(ValueError, match=r"softmax_aux\.shape=\(2,\)"):
        check_extras(q, k, None, None, torch.zeros(2))
    with pytest.raises(TypeError, match=r"bias\.dtype=torch\.int64"):
        check_extras(q, k, torch.zeros(1, 4, 13, 11, dtype=torch.int64), None, None)


def test_check_varlen_gives_the_longest_lengths_and_names_shapes():
    q, k = torch.randn(10, 4, 16), torch.randn(12, 2, 16)
    cu_q = torch.tensor([0, 3, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 8, 12], dtype=torch.int32)
    assert check_varlen(q, k, k, cu_q, cu_k) == (7, 8)
    with pytest.raises(ValueError) as info:
        check_varlen(q, k, k, cu_q, torch.tensor([0, 12], dtype=torch.int32))
    assert "cum_seqlens_q.shape=(3,)" in str(info.value) and "cum_seqlens_k.shape=(2,)" in str(info.value)
    with pytest.raises(ValueError, match=shape_of("query", q).replace("(", r"\(").replace(")", r"\)")):
        check_varlen(q, k, k, torch.tensor([0, 3, 9], dtype=torch.int32), cu_k)
    with pytest.raises(ValueError, match="given together"):
        check_varlen(q, k, k, cu_q, None)


def test_bool_mask_bias():
    mask = torch.rand(2, 1, 5, 7) > 0.5
    bias = bool_mask_bias(mask, torch.float16)
    assert bias.dtype == torch.float16 and bias.shape == mask.shape
    assert torch.equal(bias == 0, mask) and torch.isneginf(bias[~mask]).all()
