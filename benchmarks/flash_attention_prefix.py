"""Chunked prefill over cached prefixes: packed queries and keys with per-side lengths (GPU).

Each of ``n`` sequences brings a chunk of new queries (random 128-2048 tokens) over its cached
prefix (random 0-16k tokens) plus the chunk itself: ``len_k = prefix + len_q``, bottom-right causal
(query ``i`` sees keys up to ``prefix + i``), packed as ``q [total_q, Hq, D]`` and ``k/v [total_k,
Hkv, D]`` with two offsets tensors (flash-attn's ``cu_seqlens_q / cu_seqlens_k``). bf16, Hq=32,
Hkv=8, D=128, forward only (serving), with ``max_seqlen`` given.

Rows: kernelops (the warp-specialised forward's ``RAGGED == 3``, NOTES v45; its schedule ordering
sequences by key length, v48), ``kernelops_order_by_queries`` (the same kernel with the schedule
ordering by query length, the rule before v48: the A/B of that change), and FlexAttention
(compiled) with a document + bottom-right causal block mask over the packed sequences. TFLOP/s
count useful work: 4 * Hq * D * (visible (query, key) pairs). Medians of triton.testing.do_bench.

    python benchmarks/flash_attention_prefix.py --out benchmarks/results [--seqs 8 32]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

HQ, HKV, D = 32, 8, 128


def lengths(n: int, seed: int) -> tuple[list[int], list[int]]:
    """``(lens_q, lens_k)`` of ``n`` sequences: chunks of 128-2048 queries over 0-16k cached keys."""
    gen = torch.Generator().manual_seed(seed)
    lens_q = torch.randint(128, 2049, (n,), generator=gen).tolist()
    prefix = torch.randint(0, 16385, (n,), generator=gen).tolist()
    return lens_q, [p + q for p, q in zip(prefix, lens_q)]


def offsets(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")


def own_length_order():
    """A context in which the packed schedule orders sequences by the units' own side (the rule
    before v48), the plans cleared on entry and exit so each order binds its own launches."""
    import contextlib

    from kernelops.kernels.flash_attention import plans, varlen

    @contextlib.contextmanager
    def ctx():
        original = varlen.ws_schedule_launch
        varlen.ws_schedule_launch = lambda *args, weights=None, **kw: original(*args, **kw)
        plans._FWD_PLANS.clear()
        try:
            yield
        finally:
            varlen.ws_schedule_launch = original
            plans._FWD_PLANS.clear()
    return ctx()


def case(n: int, seed: int, rows: list) -> None:
    import triton.testing
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from kernelops import flash_attention

    lens_q, lens_k = lengths(n, seed)
    pairs = sum(q * (k - q) + q * (q + 1) // 2 for q, k in zip(lens_q, lens_k))
    flops = 4 * HQ * D * pairs
    cq, ck = offsets(lens_q), offsets(lens_k)
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, HQ, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(tk, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bounds = dict(max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    shape = {"seqs": n, "tokens_q": tq, "tokens_k": tk}

    def run():
        return flash_attention(q, k, v, causal=True, cum_seqlens_q=cq, cum_seqlens_k=ck, **bounds)

    def timed(fn):
        fn()
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    for impl in ("kernelops", "kernelops_order_by_queries", "kernelops"):  # A, B, A again (drift)
        if impl == "kernelops":
            ms = timed(run)
        else:
            with own_length_order():
                ms = timed(run)
        rows.append({"impl": impl, **shape, "ms": ms, "tflops": flops / ms / 1e9})

    torch._dynamo.reset()
    doc_q = torch.repeat_interleave(torch.arange(n, device="cuda"), torch.tensor(lens_q, device="cuda"))
    doc_k = torch.repeat_interleave(torch.arange(n, device="cuda"), torch.tensor(lens_k, device="cuda"))
    # key position of query i within its sequence: prefix + (i - q start); key j's: j - k start
    shift = (ck[:-1] + (ck[1:] - ck[:-1]) - (cq[1:] - cq[:-1]) - cq[:-1]).long()

    def mask_mod(b, h, i, j):
        return (doc_q[i] == doc_k[j]) & (i + shift[doc_q[i]] >= j)

    mask = create_block_mask(mask_mod, 1, None, tq, tk)
    flex = torch.compile(flex_attention)
    qf, kf, vf = (t.transpose(0, 1)[None].contiguous() for t in (q, k, v))
    ms = timed(lambda: flex(qf, kf, vf, block_mask=mask, enable_gqa=True))
    rows.append({"impl": "flex_document_mask", **shape, "ms": ms, "tflops": flops / ms / 1e9})


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--seqs", nargs="+", type=int, default=[8, 32])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import triton

    from kernelops.ops.device import device_info

    dev = device_info("cuda")
    out = pathlib.Path(args.out) / dev.name
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.seqs:
        done = len(rows)
        case(n, args.seed + n, rows)
        for r in rows[done:]:
            print(f"{r['seqs']:3d} seqs {r['tokens_q']:6d} q {r['tokens_k']:7d} k  {r['impl']:28s} {r['ms']:8.3f} ms "
                  f"{r['tflops']:7.1f} TFLOP/s (useful)", flush=True)
        (out / "flash_attention_prefix.json").write_text(json.dumps(
            {"device": dev.name, "torch": torch.__version__, "triton": triton.__version__,
             "heads": [HQ, HKV], "head_dim": D, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
