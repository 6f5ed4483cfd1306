"""Causal sliding windows (and soft caps) beside FlexAttention, and the warp-specialised forward's
window (NOTES v52) and soft cap (v54) against the kernels that ran them before, in one process (GPU).

Dense cases: 16k tokens (B = 16k / S sequences of S tokens), H * D = 2048 (H = 16 at D=128), bf16,
causal with a left window of W keys (query ``i`` sees keys ``i - W .. i``: ``sliding_window=(W, 0)``;
``none``: plain causal). Packed case (``--packed``): 16 random documents summing to 16k tokens, one
offsets tensor, the same window per document. ``--softcap CAP``: every row's logits capped,
``CAP * tanh(logit / CAP)`` (Gemma 2: 50).

Rows per case and mode (``fwd``, ``fwdbwd``):
* ``kernelops``: the library's default call (its shipped config and rule: since v52 the
  warp-specialised forward, ``CAUSAL == 2``);
* ``kernelops_before``: the same call with ``fwd_ws.WS_WINDOWS`` off (with ``--softcap``,
  ``fwd_ws.WS_SOFTCAP``), so the forward runs the TMA or pointer kernel its config names and a
  packed backward the Triton kernels (the paths before v52 / v54; the dense backward is the same in
  both);
* ``kernelops_nocap`` (with ``--softcap``): the same call without the cap, what the cap costs;
* ``flex``: FlexAttention (compiled; ``torch._dynamo.reset()`` between shapes) with a causal +
  window block mask (and the document mask when packed), and the cap as its score_mod.

TFLOP/s count useful work: 4 * H * D * (visible (query, key) pairs), x3.5 for forward+backward.
Medians of triton.testing.do_bench on random inputs.

    python benchmarks/flash_attention_window.py --out benchmarks/results [--dims 64 128 256]
        [--seqs 4096 16384] [--windows 1024 4096 none] [--modes fwd fwdbwd] [--packed] [--no-flex]
        [--softcap 50]
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

from documents import random_documents
from flash_attention_masks import timed  # noqa: E402  (the masks script's do_bench of fwd / fwd+bwd)

TOKENS = 16384


@contextlib.contextmanager
def switched_off(switch: str = "WS_WINDOWS"):
    """Windows (or soft caps: ``switch="WS_SOFTCAP"``) on the kernels that ran them before v52 (v54)
    (``fwd_ws.WS_WINDOWS`` off: the forward's, and the packed backward's), the forward and backward
    plans cleared on entry and exit so neither path reuses the other's bound launches (a plan reads
    the switch when it is made)."""
    from kernelops.kernels.flash_attention import fwd_ws, plans

    def clear():
        plans._FWD_PLANS.clear()
        plans._PLANS.clear()

    clear()
    setattr(fwd_ws, switch, False)
    try:
        yield
    finally:
        setattr(fwd_ws, switch, True)
        clear()


def visible_pairs(lengths: list[int], window: int | None) -> int:
    """(query, key) pairs a causal window of ``window`` keys left of each query leaves, per sequence
    (None: causal)."""
    if window is None:
        return sum(n * (n + 1) // 2 for n in lengths)
    return sum(sum(min(i + 1, window + 1) for i in range(n)) for n in lengths)


def run_case(rows, mode, D, S, window, packed, flex_too=True, softcap=None):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from kernelops import flash_attention

    H = 2048 // D
    gen = torch.Generator().manual_seed(S + (window or 0) + D)
    if packed:
        lens, cu = random_documents(TOKENS, 16, gen)
        q, k, v = (torch.randn(TOKENS, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        extra = dict(cum_seqlens_q=cu, cum_seqlens_k=cu)
        case = f"packed16 D={D} W={window}"
    else:
        lens = [S] * (TOKENS // S)
        q, k, v = (torch.randn(TOKENS // S, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        extra = {}
        case = f"S={S} D={D} W={window}"
    flops = 4 * H * D * visible_pairs(lens, window) * (1 if mode == "fwd" else 3.5)
    case += "" if softcap is None else f" cap={softcap:g}"
    left = (1 << 30) if window is None else window

    def ours(a, b, c, cap=softcap):
        return flash_attention(a, b, c, causal=True, sliding_window=None if window is None else (window, 0),
                               logits_soft_cap=cap, **extra)

    def record(impl, ms):
        rows.append({"case": case, "D": D, "S": S, "window": window, "packed": packed, "softcap": softcap,
                     "impl": impl, "mode": mode, "ms": ms, "tflops": flops / ms / 1e9})
        print(f"{case:30s} {mode:7s} {impl:17s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s", flush=True)

    record("kernelops", timed(ours, (q, k, v), mode))
    with switched_off("WS_WINDOWS" if softcap is None else "WS_SOFTCAP"):
        record("kernelops_before", timed(ours, (q, k, v), mode))
    if softcap is not None:
        record("kernelops_nocap", timed(lambda a, b, c: ours(a, b, c, None), (q, k, v), mode))
    if not flex_too:
        return
    torch._dynamo.reset()
    if packed:
        doc = torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda"))

        def keep(b, h, i, j):
            return (doc[i] == doc[j]) & (i >= j) & (i - j <= left)
        mask = create_block_mask(keep, 1, None, TOKENS, TOKENS)
        qf, kf, vf = (t.transpose(0, 1)[None].contiguous() for t in (q, k, v))
    else:
        mask = create_block_mask(lambda b, h, i, j: (i >= j) & (i - j <= left), 1, None, S, S)
        qf, kf, vf = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    flex = torch.compile(flex_attention)
    kw = {} if softcap is None else dict(score_mod=lambda score, b, h, i, j: softcap * torch.tanh(score / softcap))
    record("flex", timed(lambda a, b, c: flex(a, b, c, block_mask=mask, **kw), (qf, kf, vf), mode))


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--dims", nargs="+", type=int, choices=[64, 128, 256], default=[128])
    p.add_argument("--seqs", nargs="+", type=int, default=[4096, 16384])
    p.add_argument("--windows", nargs="+", type=lambda w: None if w == "none" else int(w), default=[1024, 4096],
                   help="left windows in keys; none: plain causal")
    p.add_argument("--softcap", type=float, default=None, help="cap every row's logits (Gemma 2: 50)")
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
    shapes = [(D, S, W, False) for D in args.dims for S in args.seqs for W in args.windows if W is None or W < S - 1]
    shapes += [(D, 0, W, True) for D in args.dims for W in args.windows] if args.packed else []
    for mode in args.modes:
        for D, S, W, packed in shapes:
            try:
                run_case(rows, mode, D, S, W, packed, not args.no_flex, args.softcap)
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
