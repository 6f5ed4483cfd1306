"""Tests for kernelops.ops.keys: bucketing, key text round trip, bucket distance."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelops.ops.keys import bucket, bucket_distance, key_text, parse_key_text


@pytest.mark.parametrize(
    ("n", "expected"),
    [(-5, 1), (0, 1), (1, 1), (2, 2), (3, 4), (113, 128), (128, 128), (129, 256), (1000, 1024), (4097, 8192)],
)
def test_bucket(n, expected):
    assert bucket(n) == expected


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=2, max_value=1 << 40))
def test_bucket_is_smallest_power_of_two_at_least_n(n):
    b = bucket(n)
    assert b >= n and b & (b - 1) == 0 and b // 2 < n


def test_key_text_round_trip_primitives():
    key = (("dtype", "float16"), ("seq_q", 1024), ("causal", True), ("dropout", False), ("window", None), ("heads", -3))
    text = key_text(key)
    assert text == "dtype=float16|seq_q=1024|causal=True|dropout=False|window=None|heads=-3"
    parsed = parse_key_text(text)
    assert parsed == key
    # types survive, not just equality (True == 1 would hide a bool -> int slip)
    assert [type(v) for _, v in parsed] == [type(v) for _, v in key]


# Text values that cannot read back as another type ("inf", "nan", "12", "True" would not: the
# text form does not record value types, so ops keep such strings out of their keys).
_text_values = st.from_regex(r"[a-z]{1,4}_[a-z0-9_]{0,6}", fullmatch=True)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
            st.one_of(st.none(), st.booleans(), st.integers(-(10**9), 10**9), _text_values),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_key_text_round_trip_property(pairs):
    key = tuple(pairs)
    assert parse_key_text(key_text(key)) == key


@pytest.mark.parametrize(
    "key",
    [
        (("a|b", 1),),
        (("a=b", 1),),
        (("field", "x|y"),),
        (("field", "x=y"),),
    ],
)
def test_key_text_rejects_reserved_characters(key):
    with pytest.raises(ValueError, match="reserved"):
        key_text(key)


def test_parse_key_text_rejects_malformed():
    with pytest.raises(ValueError, match="malformed"):
        parse_key_text("dtype=float16|seq_q")


def test_bucket_distance():
    base = (("dtype", "float16"), ("seq_q", 1024), ("seq_k", 2048))
    bucketed = ("seq_q", "seq_k")
    assert bucket_distance(base, base, bucketed) == 0.0
    assert bucket_distance(base, (("dtype", "float16"), ("seq_q", 2048), ("seq_k", 2048)), bucketed) == 1.0
    # log2 scale: 1k -> 4k plus 2k -> 1k
    assert bucket_distance(base, (("dtype", "float16"), ("seq_q", 4096), ("seq_k", 1024)), bucketed) == 3.0
    # field order does not matter
    assert bucket_distance(base, tuple(reversed(base)), bucketed) == 0.0


def test_bucket_distance_incomparable_keys():
    base = (("dtype", "float16"), ("seq_q", 1024))
    # a non-bucketed field differs
    assert bucket_distance(base, (("dtype", "bfloat16"), ("seq_q", 1024)), ("seq_q",)) is None
    # different field sets
    assert bucket_distance(base, (("dtype", "float16"),), ("seq_q",)) is None
    # a bucketed field that is not an int
    assert bucket_distance(base, (("dtype", "float16"), ("seq_q", "big")), ("seq_q",)) is None
    # a field that is not bucketed must match exactly
    assert bucket_distance(base, (("dtype", "float16"), ("seq_q", 2048)), ()) is None


def test_bucket_distance_is_symmetric_and_scale_free():
    a = (("n", 1024),)
    b = (("n", 2048),)
    c = (("n", 8192),)
    d = (("n", 16384),)
    assert bucket_distance(a, b, ("n",)) == bucket_distance(b, a, ("n",))
    assert math.isclose(bucket_distance(a, b, ("n",)), bucket_distance(c, d, ("n",)))
