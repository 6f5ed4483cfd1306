"""Causal sliding windows beside FlexAttention, and the warp-specialised forward's window (NOTES
v52) against the kernels that ran windows before it, in one process (GPU).

Dense cases: 16k tokens (B = 16k / S sequences of S tokens), H * D = 2048 (H = 16 at D=128), bf16,
causal with a left window of W keys (query ``i`` sees keys ``i - W .. i``: ``sliding_window=(W, 0)``).
Packed case (``--packed``): 16 random documents summing to 16k tokens, one offsets tensor, the
same window per document.

Rows per case and mode (``fwd``, ``fwdbwd``):
* ``kernelops``: the library's default call (its shipped config and rule: since v52 the
  warp-specialised forward, ``CAUSAL == 2``);
* ``kernelops_before``: the same call with ``fwd_ws.WS_WINDOWS`` off, so the forward runs the TMA or
  pointer kernel its config names and a packed backward the Triton kernels (the paths before v52;
  the dense backward is the same in both);
* ``flex``: FlexAttention (compiled; ``torch._dynamo.reset()`` between shapes) with a causal +
  window block mask (and the document mask when packed).

TFLOP/s count useful work: 4 * H * D * (visible (query, key) pairs), x3.5 for forward+backward.
Medians of triton.testing.do_bench on random inputs.

    python benchmarks/flash_attention_window.py --out benchmarks/results [--dims 64 128 256]
        [--seqs 4096 16384] [--windows 1024 4096] [--modes fwd fwdbwd] [--packed] [--no-flex]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from flash_attention_masks import timed  # noqa: E402  (the masks script's do_bench of fwd / fwd+bwd)

TOKENS = 16384


@contextlib.contextmanager
def windows_off():
    """Windows on the kernels that ran them before v52 (``fwd_ws.WS_WINDOWS`` off: the forward's, and
    the packed backward's), the forward and backward plans cleared on entry and exit so neither path
    reuses the other's bound launches (a plan reads the switch when it is made)."""
    from kernelops.kernels.flash_attention import fwd_ws, plans

    def clear():
        plans._FWD_PLANS.clear()
        plans._PLANS.clear()

    clear()
    fwd_ws.WS_WINDOWS = False
    try:
        yield
    finally:
        fwd_ws.WS_WINDOWS = True
        clear()


def visible_pairs(lengths: list[int], window: int) -> int:
    """(query, key) pairs a causal window of ``window`` keys left of each query leaves, per sequence."""
    return sum(sum(min(i + 1, window + 1) for i in range(n)) for n in lengths)


def run_case(rows, mode, D, S, window, packed, flex_too=True):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from kernelops import flash_attention

    H = 2048 // D
    gen = torch.Generator().manual_seed(S + window + D)
    if packed:
        cuts = torch.sort(torch.randperm(TOKENS - 1, generator=gen)[:15] + 1).values.tolist()
        lens = [b - a for a, b in zip([0] + cuts, cuts + [TOKENS])]
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(TOKENS, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        extra = dict(cum_seqlens_q=cu, cum_seqlens_k=cu)
        case = f"packed16 D={D} W={window}"
    else:
        lens = [S] * (TOKENS // S)
        q, k, v = (torch.randn(TOKENS // S, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        extra = {}
        case = f"S={S} D={D} W={window}"
    flops = 4 * H * D * visible_pairs(lens, window) * (1 if mode == "fwd" else 3.5)

    def ours(a, b, c):
        return flash_attention(a, b, c, causal=True, sliding_window=(window, 0), **extra)

    def record(impl, ms):
        rows.append({"case": case, "D": D, "S": S, "window": window, "packed": packed, "impl": impl, "mode": mode,
                     "ms": ms, "tflops": flops / ms / 1e9})
        print(f"{case:22s} {mode:7s} {impl:17s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s", flush=True)

    record("kernelops", timed(ours, (q, k, v), mode))
    with windows_off():
        record("kernelops_before", timed(ours, (q, k, v), mode))
    if not flex_too:
        return
    torch._dynamo.reset()
    if packed:
        doc = torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda"))

        def keep(b, h, i, j):
            return (doc[i] == doc[j]) & (i >= j) & (i - j <= window)
        mask = create_block_mask(keep, 1, None, TOKENS, TOKENS)
        qf, kf, vf = (t.transpose(0, 1)[None].contiguous() for t in (q, k, v))
    else:
        mask = create_block_mask(lambda b, h, i, j: (i >= j) & (i - j <= window), 1, None, S, S)
        qf, kf, vf = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    flex = torch.compile(flex_attention)
    record("flex", timed(lambda a, b, c: flex(a, b, c, block_mask=mask), (qf, kf, vf), mode))


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--dims", nargs="+", type=int, choices=[64, 128, 256], default=[128])
    p.add_argument("--seqs", nargs="+", type=int, default=[4096, 16384])
    p.add_argument("--windows", nargs="+", type=int, default=[1024, 4096])
    p.add_argument("--modes", nargs="+", choices=["fwd", "fwdbwd"], default=["fwd", "fwdbwd"])
    p.add_argument("--packed", action="store_true", help="also the packed case (16 documents, 16k tokens)")
    p.add_argument("--no-flex", action="store_true", help="kernelops rows only (an A/B of two trees)")
    p.add_argument("--name", default="flash_attention_window", help="the results file's name (without .json)")
    args = p.parse_args(argv)
    import triton

    from kernelops.ops.device import device_info

    dev = device_info("cuda")
    out = pathlib.Path(args.out) / dev.name
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    shapes = [(D, S, W, False) for D in args.dims for S in args.seqs for W in args.windows if W < S - 1]
    shapes += [(D, 0, W, True) for D in args.dims for W in args.windows] if args.packed else []
    for mode in args.modes:
        for D, S, W, packed in shapes:
            try:
                run_case(rows, mode, D, S, W, packed, not args.no_flex)
            except Exception as exc:  # noqa: BLE001 - report and go on
                rows.append({"D": D, "S": S, "window": W, "packed": packed, "mode": mode,
                             "error": f"{type(exc).__name__}: {exc}"[:300]})
                print(rows[-1], flush=True)
            (out / f"{args.name}.json").write_text(json.dumps(
                {"device": dev.name, "torch": torch.__version__, "triton": triton.__version__, "tokens": TOKENS,
                 "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
