"""The packed-sequence tile map and the offsets check of kernels/flash_attention/varlen.py."""

import pytest
import torch
import triton
import triton.language as tl

from kernelops.kernels.flash_attention.varlen import check_offsets, packed_rows, sequence_of
from tests.conftest import DEVICE


@triton.jit
def _map_kernel(Cu, Seq, Start, Len, num_seqs, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    sid, start, seq_q, seq_k, q_start, k_start = sequence_of(row, Cu, Cu, Cu, num_seqs, BLOCK)
    tl.store(Seq + row, sid.to(tl.int32))
    tl.store(Start + row, start)
    tl.store(Len + row, seq_q)


def tile_map(lengths, block):
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    rows = packed_rows(sum(lengths), len(lengths), block)
    seq, start, length = (torch.full((rows,), -7, dtype=torch.int32, device=DEVICE) for _ in range(3))
    _map_kernel[(rows,)](cu, seq, start, length, len(lengths), BLOCK=block)
    return seq.tolist(), start.tolist(), length.tolist()


@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("case", ["few", "many-short", "zeros-and-long"])
def test_every_tile_of_every_sequence_gets_exactly_one_row(case, block):
    gen = torch.Generator().manual_seed(len(case) * 1000 + block)
    if case == "few":
        lengths = torch.randint(0, 200, (7,), generator=gen).tolist()
    elif case == "many-short":  # more than one 256-wide search chunk
        lengths = torch.randint(0, 9, (300,), generator=gen).tolist()
    else:
        lengths = [0, 0, 300, 0, 1, block, block + 1, 0] + torch.randint(0, 3 * block, (252,), generator=gen).tolist()
    seq, start, length = tile_map(lengths, block)
    seen = set()
    for r, (s, st, n) in enumerate(zip(seq, start, length)):
        assert 0 <= s < len(lengths), (r, s)
        if n == 0:  # a row past its sequence's tiles: it must really be past them
            assert st >= lengths[s], (r, s, st)
            continue
        assert n == lengths[s] and 0 <= st < n and st % block == 0, (r, s, st, n)
        assert (s, st) not in seen, (r, s, st)
        seen.add((s, st))
    want = {(s, t) for s, n in enumerate(lengths) for t in range(0, n, block)}
    assert seen == want


def _cu(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def test_check_offsets_accepts_good_offsets():
    check_offsets(_cu([0, 3, 3, 10]), _cu([0, 5, 6, 6]), 10, 6, 7, 5)
    check_offsets(_cu([0, 3, 3, 10]), _cu([0, 5, 6, 6]), 10, 6, None, None)
    many = [0] + torch.arange(1, 1500).tolist()  # more than one 1024-wide chunk
    check_offsets(_cu(many), _cu(many), 1499, 1499, 1, 1)
    if DEVICE == "cuda":
        torch.cuda.synchronize()


BAD = {
    "q starts above 0": ([1, 3, 10], [0, 5, 6], 10, 6, None, None),
    "k decreases": ([0, 3, 10], [0, 5, 4], 10, 4, None, None),
    "q ends short of the tokens": ([0, 3, 9], [0, 5, 6], 10, 6, None, None),
    "k longer than max_seqlen_k": ([0, 3, 10], [0, 5, 6], 10, 6, 7, 4),
    "q longer than max_seqlen_q": ([0, 3, 10], [0, 5, 6], 10, 6, 6, 5),
    "late chunk decreases": ([0] + list(range(1, 1100)) + [1098, 1100], [0] + list(range(1, 1102)), 1100, 1101,
                             None, None),
}


@pytest.mark.skipif(DEVICE == "cuda", reason="a failed device-side assert poisons the CUDA context")
@pytest.mark.parametrize("name", list(BAD))
def test_check_offsets_refuses_bad_offsets(name):
    cq, ck, tq, tk, mq, mk = BAD[name]
    with pytest.raises(RuntimeError, match="cum_seqlens"):
        check_offsets(_cu(cq), _cu(ck), tq, tk, mq, mk)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["k longer than max_seqlen_k", "late chunk decreases"])
def test_check_offsets_fails_the_next_sync_on_cuda(name):
    """On CUDA the check is an asynchronous device assert: run in a child process, since a failed
    one poisons the CUDA context."""
    import subprocess
    import sys

    script = ("import torch\nfrom kernelops.kernels.flash_attention.varlen import check_offsets\n"
              f"cq, ck, tq, tk, mq, mk = {BAD[name]!r}\n"
              "cu = lambda x: torch.tensor(x, dtype=torch.int32, device='cuda')\n"
              "check_offsets(cu(cq), cu(ck), tq, tk, mq, mk)\ntorch.cuda.synchronize()\nprint('NOT RAISED')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "NOT RAISED" not in done.stdout
    assert "cum_seqlens" in done.stderr or "device-side assert" in done.stderr, done.stderr[-2000:]
