"""The dropout keep mask's random bits (``fwd.dropout_keep``), read through a one-row kernel.

Query row ``i`` and key column ``j`` are Philox counter words of their own, so the bits of an
element depend on ``(seed, i, j)`` alone, never on the key count: an earlier counter
was the 32-bit offset ``i * Sk + j``, which repeated the mask along rows once ``Sq * Sk > 2**32``.
(Masks, gradients and the materialised masks agree: tests/modules/test_flash_attention.py.)"""

import torch
import triton
import triton.language as tl

from kernelops.kernels.flash_attention.fwd import dropout_keep
from tests.conftest import DEVICE

N = 128


@triton.jit
def _row_keep_kernel(Keep, Old, row, seq_k, seed, dropout_p, N: tl.constexpr):
    cols = tl.arange(0, N)[None, :]
    rows = tl.zeros([1, 1], tl.int32) + row
    tl.store(Keep + cols, dropout_keep(rows, cols, seed, dropout_p).to(tl.int8))
    # what the earlier 32-bit offset drew
    tl.store(Old + cols, tl.rand(seed, (rows * seq_k + cols).to(tl.uint32)) >= dropout_p)


def _row(row: int, seq_k: int, seed: int, p: float = 0.5):
    keep = torch.empty(N, dtype=torch.int8, device=DEVICE)
    old = torch.empty(N, dtype=torch.bool, device=DEVICE)
    _row_keep_kernel[(1,)](keep, old, row, seq_k, seed, p, N=N)
    return keep.bool(), old


def test_dropout_rows_whose_32_bit_offsets_coincide_draw_other_bits():
    seq_k = 2 ** 31  # rows 0 and 2 start at offsets 0 and 2**32: equal modulo 2**32
    first, old_first = _row(0, seq_k, 11)
    third, old_third = _row(2, seq_k, 11)
    assert torch.equal(old_third, old_first)  # the 32-bit offset repeated the row
    assert not torch.equal(third, first)  # equal by chance with probability 2**-128
    for keep in (first, third):
        assert 0.25 < keep.float().mean().item() < 0.75


def test_dropout_bits_do_not_depend_on_the_key_count():
    for row in (0, 5, 3000):
        a, _ = _row(row, 300, 2 ** 40 + 3)
        b, _ = _row(row, 1_000_000, 2 ** 40 + 3)
        c, _ = _row(row, 300, 2 ** 40 + 4)
        assert torch.equal(a, b) and not torch.equal(a, c)
