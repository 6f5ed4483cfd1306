"""The packed-sequence tile map and the offsets check of kernels/flash_attention/varlen.py."""

import pytest
import torch
import triton
import triton.language as tl

from kernelops.kernels.flash_attention.varlen import check_offsets, packed_rows, sequence_of
from tests.conftest import DEVICE


@triton.jit
def _map_kernel(CuTiles, CuQ, CuK, Out, num_seqs, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    sid, start, seq_q, seq_k, q_start, k_start = sequence_of(row, CuTiles, CuQ, CuK, num_seqs, BLOCK)
    tl.store(Out + row * 6 + 0, sid.to(tl.int32))
    tl.store(Out + row * 6 + 1, start)
    tl.store(Out + row * 6 + 2, seq_q)
    tl.store(Out + row * 6 + 3, seq_k)
    tl.store(Out + row * 6 + 4, q_start.to(tl.int32))
    tl.store(Out + row * 6 + 5, k_start.to(tl.int32))


def _offsets(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)


def tile_map(tile_lengths, other_lengths, block, tiles_on_keys):
    """Rows of ``sequence_of`` for tiles laid along ``tile_lengths``; the other side (keys for
    query tiles, queries for key tiles) has ``other_lengths``."""
    tiles, other = _offsets(tile_lengths), _offsets(other_lengths)
    cu_q, cu_k = (other, tiles) if tiles_on_keys else (tiles, other)
    rows = packed_rows(sum(tile_lengths), len(tile_lengths), block)
    out = torch.full((rows, 6), -7, dtype=torch.int32, device=DEVICE)
    _map_kernel[(rows,)](tiles, cu_q, cu_k, out, len(tile_lengths), BLOCK=block)
    return out.tolist(), cu_q.tolist(), cu_k.tolist()


CASES = {
    "few": lambda gen, block: torch.randint(0, 200, (7,), generator=gen).tolist(),
    "shorter-than-a-block": lambda gen, block: [1, 0, block // 2 - 3],
    "256": lambda gen, block: torch.randint(0, 3, (256,), generator=gen).tolist(),  # the vector search's limit
    "257": lambda gen, block: torch.randint(0, 3, (257,), generator=gen).tolist(),  # the binary search's first n
    "zeros-and-long": lambda gen, block: [0, 0, 300, 0, 1, block, block + 1, 0]
    + torch.randint(0, 3 * block, (292,), generator=gen).tolist(),
}


@pytest.mark.parametrize("tiles_on_keys", [False, True], ids=["query-tiles", "key-tiles"])
@pytest.mark.parametrize("block", [16, 64])
@pytest.mark.parametrize("case", list(CASES))
def test_every_tile_of_every_sequence_gets_exactly_one_row(case, block, tiles_on_keys):
    gen = torch.Generator().manual_seed(len(case) * 1000 + block)
    lengths = CASES[case](gen, block)
    other = torch.randint(0, 50, (len(lengths),), generator=gen).tolist()
    rows, cu_q, cu_k = tile_map(lengths, other, block, tiles_on_keys)
    seen = set()
    for r, (s, st, n_q, n_k, q0, k0) in enumerate(rows):
        assert 0 <= s < len(lengths), (r, s)
        if n_q == 0 and n_k == 0 and st >= lengths[s]:  # a row past its sequence's tiles does nothing
            continue
        assert 0 <= st < lengths[s] and st % block == 0, (r, s, st)
        assert (n_q, n_k) == (cu_q[s + 1] - cu_q[s], cu_k[s + 1] - cu_k[s]), (r, s, n_q, n_k)
        assert (q0, k0) == (cu_q[s], cu_k[s]), (r, s, q0, k0)
        assert (s, st) not in seen, (r, s, st)
        seen.add((s, st))
    assert seen == {(s, t) for s, n in enumerate(lengths) for t in range(0, n, block)}


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


def _schedule_reference(lengths, heads, causal, block=128, weights=None):
    """The ws packed schedule's units in order: sequences by length (``weights``: by those lengths
    instead), longest first (ties by index), each sequence's (head, unit) pairs head by head."""
    weights = lengths if weights is None else weights
    units = []
    for s in sorted(range(len(lengths)), key=lambda i: (-weights[i], i)):
        tiles = -(-lengths[s] // block)
        per_head = (tiles + 1) // 2 if causal else tiles
        units += [(s, h, k) for h in range(heads) for k in range(per_head)]
    return units


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths, heads", [([300, 0, 129, 128, 1, 300, 7], 3), ([1], 1), ([0, 0, 5], 2),
                                            (None, 4), ("many", 1), ([128 * 1100 + 5, 3], 1)],
                         ids=["mixed", "one", "empties", "random", "over-a-chunk-of-sequences",
                              "over-a-chunk-of-units"])
def test_ws_packed_schedule_orders_units_longest_first(lengths, heads, causal):
    from kernelops.kernels.flash_attention.varlen import ws_packed_capacity, ws_packed_schedule

    if lengths is None:
        gen = torch.Generator().manual_seed(3)
        lengths = torch.randint(0, 900, (37,), generator=gen).tolist()
    elif lengths == "many":  # more sequences than the kernel's 1024-wide chunks
        gen = torch.Generator().manual_seed(4)
        lengths = torch.randint(0, 300, (1100,), generator=gen).tolist()
    cu = _offsets(lengths)
    table, cap = ws_packed_schedule(cu, sum(lengths), heads, causal)
    assert cap == ws_packed_capacity(sum(lengths), len(lengths), heads) and table.shape == (1 + 3 * cap,)
    want = _schedule_reference(lengths, heads, causal)
    t = table.tolist()
    count = t[0]
    assert count == len(want) <= cap
    got = list(zip(t[1:1 + count], t[1 + cap:1 + cap + count], t[1 + 2 * cap:1 + 2 * cap + count]))
    assert got == want


@pytest.mark.parametrize("causal", [True, False])
def test_ws_packed_schedule_orders_by_the_other_sides_lengths(causal):
    """With two offsets tensors the units (tiles of the first side) go in the order of the other
    side's lengths, which each unit walks: a short query chunk over a long cached prefix first."""
    from kernelops.kernels.flash_attention.varlen import ws_packed_schedule

    lens_q, lens_k = [512, 512, 300, 0, 512, 1], [1024, 16000, 300, 77, 4096, 16000]
    table, cap = ws_packed_schedule(_offsets(lens_q), sum(lens_q), 2, causal, weights=_offsets(lens_k))
    want = _schedule_reference(lens_q, 2, causal, weights=lens_k)
    t = table.tolist()
    assert t[0] == len(want)
    assert list(zip(t[1:1 + t[0]], t[1 + cap:1 + cap + t[0]], t[1 + 2 * cap:1 + 2 * cap + t[0]])) == want
    assert list(dict.fromkeys(s for s, _, _ in want)) == [1, 5, 4, 0, 2]  # (sequence 3: no query, no unit)
    with pytest.raises(ValueError, match="as many sequences"):
        ws_packed_schedule(_offsets(lens_q), sum(lens_q), 2, causal, weights=_offsets(lens_k[:-1]))


def test_ws_packed_schedule_refuses_too_many_sequences():
    from kernelops.kernels.flash_attention.varlen import WS_PACKED_MAX_SEQS, ws_packed_schedule

    cu = torch.arange(WS_PACKED_MAX_SEQS + 2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="sequences"):
        ws_packed_schedule(cu, WS_PACKED_MAX_SEQS + 1, 1, True)
