"""Packed D=64 fused backward with 64- or 128-query blocks (NOTES v76), one process per variant.

``bwd_fused.fused_block_q`` gives packed launches 64 rows; the variant 128 swaps the rule for one
that answers 128 where a dense call of the same heads and mask would. Launch plans bind once per
signature, so a variant never changes inside a process. Each case times a forward+backward and a
forward (do_bench medians; bf16, causal, random documents, D=64); the backward is their
difference. Prints one JSON line:

    for r in 1 2; do for v in 64 128; do python benchmarks/bwd_packed_rows_ab.py $v >> ab.jsonl; done; done
    python benchmarks/bwd_packed_rows_ab.py --table ab.jsonl
"""

from __future__ import annotations

import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# (tokens, documents, query heads, KV heads, window or None)
CASES = ((16384, 16, 32, 32, None), (16384, 64, 32, 32, None), (16384, 4, 32, 32, None),
         (16384, 16, 32, 8, None), (16384, 4, 32, 8, None), (32768, 8, 32, 32, 4096))


def force_rows(rows: int) -> None:
    """Packed D=64 launches stream ``rows``-query blocks wherever the dense rule would give 128."""
    from kernelops.kernels.flash_attention import bwd_fused

    rule = bwd_fused.fused_block_q

    def packed_too(head_dim, group, split=False, packed=False, window=False):
        dense = rule(head_dim, group, split, False, window)
        return rows if packed and dense == 128 else rule(head_dim, group, split, packed, window)

    bwd_fused.fused_block_q = packed_too


def bench(tokens: int, docs: int, hq: int, hkv: int, window: int | None) -> tuple[float, float]:
    """``(forward+backward ms, forward ms)`` of one packed call."""
    import triton.testing
    from documents import random_documents

    from kernelops import flash_attention

    _, cu = random_documents(tokens, docs, torch.Generator().manual_seed(0))
    q = torch.randn(tokens, hq, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(tokens, hkv, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    band = {} if window is None else {"sliding_window": (window - 1, 0)}
    fwd = lambda: flash_attention(q, k, v, causal=True, cum_seqlens_q=cu, cum_seqlens_k=cu, **band)  # noqa: E731
    dout = torch.randn(tokens, hq, 64, device="cuda", dtype=torch.bfloat16)
    both = lambda: fwd().backward(dout)  # noqa: E731
    both()
    t_both = triton.testing.do_bench(both, warmup=25, rep=200, return_mode="median", grad_to_none=[q, k, v])
    with torch.no_grad():
        t_fwd = triton.testing.do_bench(fwd, warmup=25, rep=200, return_mode="median")
    return t_both, t_fwd


def table(path: str) -> str:
    """Per case: each variant's forward+backward ms per round and the backward-time ratio 128 / 64."""
    runs = [json.loads(line) for line in open(path) if line.strip()]
    lines = ["tokens docs  hq/hkv  window   fwd+bwd ms (64 rows)   fwd+bwd ms (128 rows)   backward 128/64"]
    for i, case in enumerate(runs[0]["cases"]):
        got = {rows: [r["cases"][i] for r in runs if r["rows"] == rows] for rows in (64, 128)}
        bwd = {rows: [c["fwdbwd_ms"] - c["fwd_ms"] for c in cs] for rows, cs in got.items()}
        ratios = " ".join(f"{b / a:.3f}" for a, b in zip(bwd[64], bwd[128]))
        ms = {rows: " ".join(f"{c['fwdbwd_ms']:.3f}" for c in cs) for rows, cs in got.items()}
        lines.append(f"{case['tokens']:6d} {case['docs']:4d} {case['hq']:3d}/{case['hkv']:<3d} {case['window'] or '-':>7} "
                     f"  {ms[64]:22s} {ms[128]:23s} {ratios}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--table"]:
        print(table(argv[1]))
        return 0
    rows = int(argv[0])
    force_rows(rows)
    cases = [dict(zip(("tokens", "docs", "hq", "hkv", "window"), c)) for c in CASES]
    for case in cases:
        case["fwdbwd_ms"], case["fwd_ms"] = bench(*(case[f] for f in ("tokens", "docs", "hq", "hkv", "window")))
    print(json.dumps({"rows": rows, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "cases": cases}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
