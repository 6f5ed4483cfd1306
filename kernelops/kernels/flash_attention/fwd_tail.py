"""The last waves of the persistent causal forward, balanced tile by tile.

The warp-specialised forward (:mod:`fwd_ws`) hands its dense causal units round the programs in
turn: program ``p`` takes units ``p, p + P, ...``. A unit pairs query blocks ``blocks - 1 - k``
and ``k`` of a head, so every unit costs ``blocks + 1`` key blocks; but ``n_units`` is seldom a
multiple of the ``P`` programs, and in the last wave ``n_units % P`` programs work while the
rest idle (at B * S = 16k tokens, H = 16, D = 128: 1024 units on 132 SMs, 7.76 waves run as 8,
3% of the GPU idle). This module plans the last units as single tiles instead, longest first,
each to the program with the least work so far (LPT), and writes the whole launch as a table the
kernel reads (its ``TAIL`` flag): slot ``u`` (taken by program ``u % P``) holds ``unit * 4 +
code``, code 0 both tiles of the unit, 1 its first tile only (query block ``blocks - 1 - k``), 2
its second (block ``k``), 3 nothing. ``table[0]`` is the slot count.

Costs are counted in key blocks plus :data:`TILE_OVERHEAD` a tile (its Q wait, first product and
O store); the plan takes the last ``n_units % P + j * P`` units for the ``j`` in
``0 .. MAX_EXTRA_WAVES`` with the shortest modelled makespan, and none when no ``j`` shortens it
(or past :data:`MAX_UNITS` units). Which launches take a plan is measured, not modelled
(:func:`applies`): on the H200 the model's 2-3% came out as 1.0-1.7% at D=256, up to 2% at
D=64 up to 4k keys, and nothing or a loss at D=128.
"""

from __future__ import annotations

import heapq

import torch

from kernelops.kernels.common.launch import constant

#: (the slot tables are cached in :data:`_TABLES`: clear it after changing :data:`TILE_OVERHEAD` or
#: :data:`MAX_EXTRA_WAVES`)
#: head dim -> the longest sequence whose launches take a plan (None: any), by measurement on an
#: H200 against the unplanned launch (two rounds): D=256 +1.0-1.7% at 1k-16k keys (512:
#: -0.2%); D=64 +0.3-2.0% at 512-4k but -0.3% at 8k and -1 to -3% at 16k (three consumers, more
#: heads in flight in the planned waves); D=128 -0.4% at 512 and up to -1.2% at 4k, where the
#: planned build also spills 20 more bytes, so it takes none
MAX_SEQ = {64: 4096, 256: None}
#: a tile's fixed cost in key blocks, for the plan's model (its Q wait, first product, O store)
TILE_OVERHEAD = 0.5
#: full waves before the last one that the plan may also split into tiles (more waves: more
#: lengths to pack, so a makespan nearer the mean, but more heads in flight at once)
MAX_EXTRA_WAVES = 3
#: units past which no plan is made: the last wave is then under 0.4% of the launch on 132 SMs
MAX_UNITS = 1 << 15


def unit_of(u: int, n_units: int, per_head: int, chunk: int) -> tuple[int, int]:
    """``(bh, k)`` of unit ``u``: the kernel's ``ws_common.sched_unit`` (chunks of ``chunk`` heads, each
    chunk's units by unit index ``k``)."""
    start = u // (chunk * per_head) * chunk
    size = min(chunk, n_units // per_head - start)
    rank = u - start * per_head
    k = rank // size
    return start + rank - k * size, k


def unit_tiles(k: int, blocks: int, seq: int, rows: int, block_n: int) -> list[int]:
    """Key blocks of each tile of causal unit ``k`` (``rows``-row query blocks, ``blocks`` of
    them over ``seq`` rows; ``block_n``-key blocks): query block ``blocks - 1 - k`` then ``k``
    (one tile for an odd count's middle unit), as the kernel's ``sched_tiles`` / ``sched_tile``."""
    pids = [blocks - 1 - k] if 2 * k + 1 == blocks else [blocks - 1 - k, k]
    return [-(-min((p + 1) * rows, seq) // block_n) for p in pids]


def tail_schedule(heads: int, seq: int, rows: int, programs: int, chunk: int, block_n: int) -> list[int] | None:
    """The slot table of a dense causal launch over ``heads`` (B * Hq) heads of ``seq`` rows in
    ``rows``-row tiles (128 or 192) and ``block_n``-key blocks on ``programs`` programs with
    ``chunk`` heads a chunk (``fwd_ws.fwd_order``): ``[slots, e_0, e_1, ...]`` as the module
    says, or None when tiles do not shorten the modelled makespan (the launch keeps its units)."""
    blocks = -(-seq // rows)
    per_head = (blocks + 1) // 2
    n_units = heads * per_head
    P = programs
    if n_units % P == 0 or n_units > MAX_UNITS:
        return None
    # what a program's last unit may add
    pair_span = max(sum(n + TILE_OVERHEAD for n in unit_tiles(k, blocks, seq, rows, block_n)) for k in range(per_head))
    best = None
    for extra in range(MAX_EXTRA_WAVES + 1):
        tail = n_units % P + extra * P
        if tail > n_units:
            break
        first = n_units - tail  # a multiple of P: every program has done first // P units
        items = []
        for u in range(first, n_units):
            k = unit_of(u, n_units, per_head, chunk)[1]
            for r, n in enumerate(unit_tiles(k, blocks, seq, rows, block_n)):
                items.append((n + TILE_OVERHEAD, u, r))
        items.sort(key=lambda t: (-t[0], t[1], t[2]))
        load = [(0.0, p) for p in range(P)]  # a heap: (work so far, program)
        lists = [[] for _ in range(P)]
        for c, u, r in items:
            w, p = heapq.heappop(load)
            lists[p].append(u * 4 + 1 + r)
            heapq.heappush(load, (w + c, p))
        span = max(w for w, _ in load)
        # the pairs' last wave costs pair_span per extra wave plus one more: compare spans of the same units
        pairs = (extra + 1) * pair_span
        if span < pairs - 1e-9 and (best is None or span < best[0] - 1e-9):
            best = (span, first, lists)
    if best is None:
        return None
    _, first, lists = best
    depth = max(len(x) for x in lists)
    slots = [u * 4 for u in range(first)]
    for i in range(depth):
        slots += [lst[i] if i < len(lst) else 3 for lst in lists]
    return [len(slots)] + slots


#: launch shape -> its table on its device (None: no plan). Never evicted: a CUDA graph captured
#: from a launch holds the table's address, so freeing it would break the graph's replays; a table
#: is 4 bytes a unit (at most 128 KB, :data:`MAX_UNITS`) once per shape
_TABLES: dict = {}


def applies(head_dim: int, seq: int) -> bool:
    """Whether a 16-bit dense causal launch of ``seq`` rows at ``head_dim`` takes a plan
    (:data:`MAX_SEQ`)."""
    if head_dim not in MAX_SEQ:
        return False
    longest = MAX_SEQ[head_dim]
    return longest is None or seq <= longest


def tail_table(heads: int, seq: int, rows: int, programs: int, chunk: int, block_n: int,
               device: torch.device) -> torch.Tensor | None:
    """:func:`tail_schedule` as an int32 tensor on ``device``, made once per launch shape (None:
    no plan), marked as a launch constant (``launch.constant``: plans bind it once). Not made
    while the current stream is being captured into a CUDA graph (its copy would be captured): a
    first call of a shape under capture keeps the units."""
    key = (heads, seq, rows, programs, chunk, block_n, device)
    if key not in _TABLES:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        slots = tail_schedule(heads, seq, rows, programs, chunk, block_n)
        _TABLES[key] = None if slots is None else constant(torch.tensor(slots, dtype=torch.int32, device=device))
    return _TABLES[key]
