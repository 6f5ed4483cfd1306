"""Plain-Python integer helpers for launch code on the host.

``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr functions in recent Triton: callable
from Python, but each call goes through Triton's argument unwrapping (~3 us on this CPU), which
adds up on launch paths that are host-bound (decode, small calls). These are the same integer
results without that cost.
"""


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, ``b > 0``."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
