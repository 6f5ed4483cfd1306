"""A/B of the decode plan's rules beside cuDNN, every call inside a CUDA graph (GPU).

bf16, Sq=1, Hq=32, Hkv=8, not causal; per row the split-KV launcher with the heuristic's tile
(``8192 // D`` keys, 4 warps, 3 stages) and the automatic split count, with one rule's switch off
(``rule``) and on (``wide`` / ``balanced``), each timed twice in alternation
(``triton.testing.do_bench_cudagraph``, median). Values are K/V read TB/s; ``plan`` is
:func:`decode.decode_splits`' ``(num_splits, split_len, key tile, programs)`` with the switch on.
Each output is checked against SDPA in float32 first.

- ``--rule wide`` (``decode.DECODE_WIDE``, :func:`decode.wide_tile`, NOTES v59): D=128 at B = 8-17
  (64-136 pairs: the rule's 4 splits down to one, and past the SM count) at 4k and 32k keys, D=64
  at B = 10, 12 and 16, D=128 at 1k keys for B = 12 and 16; ``decode_wide_ab.json``.
- ``--rule balanced`` (``decode.DECODE_BALANCED``, :func:`decode.balanced_split`, NOTES v60):
  D=128 at B = 17-48 (136-384 pairs) at 4k and 32k keys, D=64 at B = 24; ``decode_balanced_ab.json``.

    python benchmarks/decode_rules.py --out benchmarks/results [--rule balanced]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from decode_splits import cudnn_graph_ms, save_rows  # noqa: E402

HQ, HKV = 32, 8
CASES = {"wide": ((128, (8, 9, 10, 11, 12, 13, 14, 15, 16, 17), (4096, 32768)), (64, (10, 12, 16), (4096, 32768)),
                  (128, (12, 16), (1024,))),  # (D, batches, keys)
         "balanced": ((128, (17, 20, 24, 28, 32, 33, 40, 48), (4096, 32768)), (64, (24,), (4096, 32768)))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--rule", choices=sorted(CASES), default="wide")
    args = p.parse_args(argv)
    import triton.testing as tt

    from kernelops.kernels.common.host import num_sms
    from kernelops.kernels.flash_attention import decode

    switch = "DECODE_" + args.rule.upper()
    big, rows, saved = 1 << 30, [], getattr(decode, switch)
    for D, batches, keys in CASES[args.rule]:
        for Sk in keys:
            for B in batches:
                q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(B, Sk, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                tbps = lambda ms: 2 * k.numel() * 2 / ms / 1e9  # noqa: B023, E731
                ref = torch.nn.functional.scaled_dot_product_attention(
                    *(t.transpose(1, 2).float() for t in (q, k, v)), enable_gqa=True).transpose(1, 2)
                row = dict(D=D, B=B, Sk=Sk, cudnn=tbps(cudnn_graph_ms(q, k, v)), rule=[], **{args.rule: []})
                for on in (False, True, False, True):
                    setattr(decode, switch, on)
                    fn = lambda: decode.flash_attention_decode(  # noqa: B023, E731
                        q, k, v, softmax_scale=D ** -0.5, win_left=big, win_right=big, softcap=None,  # noqa: B023
                        kv_blocksize=8192 // D, num_warps=4, num_stages=3)  # noqa: B023
                    err = (fn()[0].float() - ref).abs().max().item()
                    assert err < 2e-2, (D, B, Sk, on, err)
                    row[args.rule if on else "rule"].append(tbps(tt.do_bench_cudagraph(fn, rep=100,
                                                                                     return_mode="median")))
                row["plan"] = decode.decode_splits(q, k, big, big, 8192 // D, 0, 3)[2:]
                setattr(decode, switch, saved)
                rows.append(row)
                c = row["cudnn"]
                print(f"D={D} B={B:2d} Sk={Sk:6d} cudnn {c:.2f} TB/s  rule {max(row['rule']) / c:.3f}x  "
                      f"{args.rule} {max(row[args.rule]) / c:.3f}x  plan {row['plan']}", flush=True)
    save_rows(args.out, f"decode_{args.rule}_ab.json", num_sms(torch.device("cuda"), 0), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
