"""The persistent causal forward's last waves planned tile by tile (kernels/flash_attention/fwd_tail.py):
the plan covers every tile once, puts slot ``u`` on program ``u % P``, shortens the modelled
makespan, and the kernel's ``TAIL`` launches match float64 and the unplanned launch bit for bit."""

import heapq

import pytest
import torch

from kernelops.kernels.flash_attention import fwd_tail, fwd_ws
from tests.attention_checks import make_qkv
from tests.modules.test_flash_attention_ws_choice import _check_against_float64, needs_gluon, needs_sm90


class _Launch:
    """A dense causal launch's units as the kernel walks them (``ws_common.sched_unit`` / ``sched_tiles``)."""

    def __init__(self, heads, seq, rows, P, block_n):
        self.seq, self.rows, self.P, self.block_n = seq, rows, P, block_n
        self.blocks = -(-seq // rows)
        self.per_head = (self.blocks + 1) // 2
        self.n_units = heads * self.per_head
        self.chunk = fwd_ws.fwd_order(heads, seq, True, P, None, rows)[1]

    def tiles(self, u):
        """Key blocks of unit ``u``'s tiles."""
        k = fwd_tail.unit_of(u, self.n_units, self.per_head, self.chunk)[1]
        return fwd_tail.unit_tiles(k, self.blocks, self.seq, self.rows, self.block_n)

    def run(self, slots):
        """``([(unit, r)] of every tile run, each program's modelled work)`` of a slot table, as the
        kernel's ``sched_slot`` / ``sched_tile_end`` read it (a code-0 slot runs the unit's tiles, one or two)."""
        ran, load = [], [0.0] * self.P
        for u, e in enumerate(slots[1:]):
            unit, code = divmod(e, 4)
            first, last = {0: (0, 2), 1: (0, 1), 2: (1, 2), 3: (0, 0)}[code]
            tiles = self.tiles(unit)
            for r in range(first, min(last, len(tiles))):
                ran.append((unit, r))
                load[u % self.P] += tiles[r] + fwd_tail.TILE_OVERHEAD
        return ran, max(load)

    def pairs_span(self):
        """Modelled makespan of the unplanned launch: units round the programs in turn."""
        load = [0.0] * self.P
        for u in range(self.n_units):
            load[u % self.P] += sum(n + fwd_tail.TILE_OVERHEAD for n in self.tiles(u))
        return max(load)


@pytest.mark.parametrize("heads, seq, rows, P, block_n", [
    (512, 512, 128, 132, 128),     # the benchmark grid's D=128 causal 512: 1024 units, 7.76 waves
    (256, 1024, 128, 132, 128), (16, 16384, 128, 132, 128), (256, 1024, 128, 132, 64),
    (32, 16384, 192, 132, 128),    # D=64, three consumers: 192-row tiles, the last one past the end
    (6, 384, 128, 5, 128),         # an odd block count: a middle unit of one tile per head
    (4, 512, 128, 132, 128),       # fewer units than programs: their tiles spread over all of them
    (1, 256, 128, 132, 128)])
def test_plan_covers_every_tile_once_and_shortens_the_span(heads, seq, rows, P, block_n):
    launch = _Launch(heads, seq, rows, P, block_n)
    slots = fwd_tail.tail_schedule(heads, seq, rows, P, launch.chunk, block_n)
    assert slots is not None and slots[0] == len(slots) - 1 and (len(slots) - 1) % P == 0
    ran, span = launch.run(slots)
    assert sorted(ran) == [(u, r) for u in range(launch.n_units) for r in range(len(launch.tiles(u)))]
    # whole units first, the same count on every program: slots 0 .. first - 1 are units 0 .. first - 1
    whole = [e // 4 for e in slots[1:] if e % 4 == 0]
    assert whole == list(range(len(whole))) and len(whole) % P == 0
    assert all(e % 4 != 0 for e in slots[1 + len(whole):])
    assert span < launch.pairs_span()


def test_no_plan_without_a_gain():
    """Units that fill every wave, or too many units to matter, keep the unplanned launch."""
    assert fwd_tail.tail_schedule(132, 512, 128, 132, 16, 128) is None  # 264 units: two full waves
    assert fwd_tail.tail_schedule(16, 2048, 128, 132, 1, 128) is None   # 128 units of 18 blocks: no tiling helps
    assert fwd_tail.tail_schedule(fwd_tail.MAX_UNITS + 1, 256, 128, 132, 1, 128) is None


def test_lpt_matches_a_direct_model():
    """D=128 causal 512 on 132 SMs (1024 units of 4 + 1 key blocks): seven waves of whole units,
    then the last 100 units' 200 tiles packed longest first on the least loaded program."""
    launch = _Launch(512, 512, 128, 132, 128)
    slots = fwd_tail.tail_schedule(512, 512, 128, 132, launch.chunk, 128)
    heap = [0.0] * 132
    for t in sorted((n + 0.5 for u in range(924, 1024) for n in launch.tiles(u)), reverse=True):
        heapq.heappush(heap, heapq.heappop(heap) + t)
    assert launch.run(slots)[1] == 7 * 6.0 + max(heap) < 8 * 6.0


@needs_gluon
def test_launch_flag_and_grid():
    """16-bit dense causal launches at D=64 (up to 4k rows) and D=256 with a plan pass the table
    and TAIL; D=128, longer D=64, full, windowed, ragged, FP8 and switched-off launches do not."""
    q = torch.empty(1, 1024, 2, 64, dtype=torch.bfloat16)
    lse = torch.empty(1, 2, 1024)
    _, grid, args, meta = fwd_ws.fwd_ws_launch(q, q, q, q, lse, 0.1, True, programs=132)
    assert meta["TAIL"] and grid == (132,) and args[16].dtype == torch.int32  # 8 units: 16 tiles over 132 programs
    q256 = torch.empty(1, 1024, 2, 256, dtype=torch.bfloat16)
    assert fwd_ws.fwd_ws_launch(q256, q256, q256, q256, lse, 0.1, True, programs=132)[3]["TAIL"]
    q128 = torch.empty(1, 1024, 2, 128, dtype=torch.bfloat16)
    _, grid, args, meta = fwd_ws.fwd_ws_launch(q128, q128, q128, q128, lse, 0.1, True, programs=132)
    assert not meta["TAIL"] and grid == (8,) and args[16] is lse
    for kw in (dict(causal=False), dict(causal=True, window=100)):
        _, grid, args, meta = fwd_ws.fwd_ws_launch(q, q, q, q, lse, 0.1, programs=132, **kw)
        assert not meta["TAIL"] and args[16] is lse
    q8k = torch.empty(1, 8192, 1, 64, dtype=torch.bfloat16)  # D=64 past MAX_SEQ: none
    assert not fwd_ws.fwd_ws_launch(q8k, q8k, q8k, q8k, torch.empty(1, 1, 8192), 0.1, True, programs=132)[3]["TAIL"]
    assert fwd_tail.applies(64, 4096) and not fwd_tail.applies(64, 4224) and fwd_tail.applies(256, 1 << 17)
    assert not fwd_tail.applies(128, 512)
    q2 = torch.empty(1, 1000, 2, 64, dtype=torch.bfloat16)
    assert not fwd_ws.fwd_ws_launch(q2, q2, q2, q2, torch.empty(1, 2, 1000), 0.1, True, programs=132)[3]["TAIL"]
    f8 = torch.empty(1, 1024, 2, 64).to(torch.float8_e4m3fn)
    v_t = torch.empty(1, 2, 64, 1024).to(torch.float8_e4m3fn)
    assert not fwd_ws.fwd_ws_launch(f8, f8, f8, q, lse, 0.1, True, programs=132, v_t=v_t)[3]["TAIL"]
    with pytest.MonkeyPatch.context() as mp:  # a launch the rule does not plan: units round the programs
        mp.setattr(fwd_tail, "applies", lambda head_dim, seq: False)
        _, grid, _, meta = fwd_ws.fwd_ws_launch(q, q, q, q, lse, 0.1, True, programs=132)
        assert not meta["TAIL"] and grid == (8,)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("B, S, H, D, programs, consumers", [
    (2, 512, 6, 64, None, None), (3, 384, 4, 64, 5, None),    # odd block count: middle units
    (2, 1024, 6, 64, 7, None), (1, 3072, 4, 64, 11, 3),        # 192-row tiles
    (2, 512, 4, 256, 9, None), (1, 640, 3, 256, None, None),
    (1, 256, 1, 64, None, None)])                              # one unit's two tiles on two programs
def test_planned_launch_matches_float64_and_the_unplanned_one(B, S, H, D, programs, consumers):
    q, k, v = make_qkv(B, S, S, H, max(1, H // 2), D, torch.bfloat16, "cuda", requires_grad=False)
    outs = []
    for enabled in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            if not enabled:  # the same launch unplanned: units round the programs
                mp.setattr(fwd_tail, "applies", lambda head_dim, seq: False)
            out = torch.full_like(q, float("nan"))
            lse = torch.full((B, H, S), float("nan"), device="cuda")
            _, _, _, meta = fwd_ws.fwd_ws_launch(q, k, v, out, lse, D ** -0.5, True, programs=programs,
                                                 consumers=consumers)
            assert meta["TAIL"] == enabled
            fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=D ** -0.5, causal=True, out=out, lse=lse,
                                          programs=programs, consumers=consumers)
        outs.append((out, lse))
    _check_against_float64(*outs[0], q, k, v, causal=True)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("raw", [True, False], ids=["raw", "launcher"])
@pytest.mark.parametrize("D", [64, 256])
def test_bound_plan_repeats_the_planned_launch(monkeypatch, raw, D):
    """A per-signature plan binds the TAIL launch once, the slot table as a fixed argument
    (``launch.constant``); its later calls, over fresh tensors, match float64."""
    from kernelops.kernels.common import raw_launch
    from kernelops.kernels.flash_attention import plans
    from kernelops.kernels.flash_attention.dispatch import flash_attention_fwd_dense

    monkeypatch.setattr(raw_launch, "ENABLED", raw)
    plans._FWD_PLANS.clear()
    for _ in range(3):
        q, k, v = make_qkv(2, 512, 512, 6, 3, D, torch.bfloat16, "cuda", requires_grad=False)
        out, lse = flash_attention_fwd_dense(q, k, v, ws=True, softmax_scale=D ** -0.5, softcap=None,
                                             win_left=1 << 30, win_right=0, q_blocksize=128, kv_blocksize=64,
                                             num_warps=8, num_stages=3)
        _check_against_float64(out, lse, q, k, v, causal=True)
    bound = [b for p in plans._FWD_PLANS.values() for b in p._bound]
    assert len(bound) == 1 and bound[0].kwargs["TAIL"]
