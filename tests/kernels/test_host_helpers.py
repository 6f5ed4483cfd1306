"""The plain-Python launch helpers agree with Triton's own on every integer they are used on."""

import triton

from kernelops.kernels.common.host import cdiv, next_pow2


def test_cdiv_matches_triton():
    for a in range(0, 1000, 7):
        for b in (1, 2, 3, 16, 64, 127, 128):
            assert cdiv(a, b) == triton.cdiv(a, b) == -(-a // b)


def test_next_pow2_matches_triton():
    for n in list(range(1, 300)) + [1023, 1024, 1025, 1 << 20, (1 << 20) + 1]:
        p = next_pow2(n)
        assert p == triton.next_power_of_2(n)
        assert p >= n and p & (p - 1) == 0 and (p == 1 or p // 2 < n)
    assert next_pow2(0) == 1
