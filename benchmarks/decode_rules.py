"""A/B of the decode plan's rules beside cuDNN, every call inside a CUDA graph (GPU).

bf16, Sq=1, Hq=32, Hkv=8, not causal; per row the split-KV launcher with the heuristic's tile
(``8192 // D`` keys, 4 warps, 3 stages) and the automatic split count, with one rule's switch off
(``rule``) and on (``wide`` / ``balanced``, or the settings of :data:`RULES`), each timed twice in alternation
(``triton.testing.do_bench_cudagraph``, median). Values are K/V read TB/s; ``plan`` is
:func:`decode.decode_splits`' ``(num_splits, split_len, key tile, programs)`` with the switch on.
Each output is checked against SDPA in float32 first.

- ``--rule wide`` (``decode.DECODE_WIDE``, :func:`decode.wide_tile`, NOTES v59): D=128 at B = 8-17
  (64-136 pairs: the rule's 4 splits down to one, and past the SM count) at 4k and 32k keys, D=64
  at B = 10, 12 and 16, D=128 at 1k keys for B = 12 and 16; ``decode_wide_ab.json``.
- ``--rule balanced`` (``decode.DECODE_BALANCED``, :func:`decode.balanced_split`, NOTES v60):
  D=128 at B = 17-48 (136-384 pairs) at 4k and 32k keys, D=64 at B = 24; ``decode_balanced_ab.json``.
- ``--rule review`` (NOTES v61d): v61's rule before a review's fixes (no score cap on the doubled
  tile, doubled tiles and balanced plans at any key count), uniform plans (``DECODE_BALANCED`` and
  ``DECODE_WIDE`` off) and the fixed rule, at D=16 (whose doubled tile is 1024 keys), short pairs
  (64-1000 keys) past two waves and rows v61 measured; ``decode_review_ab.json``
  (``results/NVIDIA_H200/decode_review_fixes.txt`` holds the first run, in microseconds, of the
  same calls from a standalone copy of this loop).
- ``--rule splits`` (``decode.DECODE_WIDE_SPLITS``, :func:`decode.wide_splits`, NOTES v63): D=128 and
  D=64 at B = 1-8 (8-64 pairs, at most half the SMs) at 4k, 32k and 128k keys; ``decode_splits_rule_ab.json``.
- ``--rule wave`` (NOTES v61): session 30's balanced plans (``rule``: two programs per SM, no
  near rule), with the near rule (``decode.BALANCED_NEAR``: single-wave pairs at most 10% over
  the SMs from 2k keys) and both with one program per SM and the doubled tile
  (``decode.BALANCED_WIDE``, the default); D=128 at B = 17-24 from 1k to 4k keys and B = 17-48 at
  16k / 32k keys, D=64 at B = 17, 18 and 24; ``decode_wave_ab.json``.

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
#: per rule: the cases ``(D, batches, keys)`` and the settings timed side by side, the first one
#: the baseline (``rule``); every other switch keeps its module default
RULES = {
    "wide": (((128, (8, 9, 10, 11, 12, 13, 14, 15, 16, 17), (4096, 32768)), (64, (10, 12, 16), (4096, 32768)),
              (128, (12, 16), (1024,))),
             {"rule": dict(DECODE_WIDE=False), "wide": dict(DECODE_WIDE=True)}),
    "balanced": (((128, (17, 20, 24, 28, 32, 33, 40, 48), (4096, 32768)), (64, (24,), (4096, 32768))),
                 {"rule": dict(DECODE_BALANCED=False), "balanced": dict(DECODE_BALANCED=True)}),
    "wave": (((128, (17, 18, 19, 20, 24), (1024, 2048, 4096)), (128, (17, 24, 40, 48), (16384, 32768)),
              (128, (40, 48), (4096,)), (64, (17, 18, 24), (4096,))),
             {"rule": dict(BALANCED_WIDE=False, BALANCED_NEAR=-1.0), "near": dict(BALANCED_WIDE=False),
              "wave": {}}),
    "splits": (((128, (1, 2, 4, 8), (4096, 32768, 131072)), (64, (1, 2, 4, 8), (4096, 32768, 131072))),
               {"rule": dict(DECODE_WIDE_SPLITS=False), "splits": dict(DECODE_WIDE_SPLITS=True)}),
    "review": (((16, (16, 17, 40), (4096,)), (32, (17,), (4096,)), (32, (40,), (1000,)), (64, (40,), (300,)),
                (128, (40,), (64, 100, 512, 1024, 2048, 4096)), (128, (48,), (130,)), (128, (17,), (4096,))),
               {"v61": dict(BALANCED_MIN_PAIR_KEYS=0, BALANCED_WIDE_KEYS=0, WIDE_MAX_SCORES=1 << 30),
                "uniform": dict(DECODE_BALANCED=False, DECODE_WIDE=False), "review": {}}),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--rule", choices=sorted(RULES), default="wide")
    args = p.parse_args(argv)
    import triton.testing as tt

    from kernelops.kernels.common.host import num_sms
    from kernelops.kernels.flash_attention import decode, plans

    cases, variants = RULES[args.rule]
    defaults = {name: getattr(decode, name) for sets in variants.values() for name in sets}
    big, rows = 1 << 30, []

    def setting(sets: dict) -> None:
        for name, value in {**defaults, **sets}.items():
            setattr(decode, name, value)
        plans._FWD_PLANS.clear()  # plans key on the main switches only

    for D, batches, keys in cases:
        for Sk in keys:
            for B in batches:
                q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(B, Sk, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                tbps = lambda ms: 2 * k.numel() * 2 / ms / 1e9  # noqa: B023, E731
                ref = torch.nn.functional.scaled_dot_product_attention(
                    *(t.transpose(1, 2).float() for t in (q, k, v)), enable_gqa=True).transpose(1, 2)
                row = dict(D=D, B=B, Sk=Sk, cudnn=tbps(cudnn_graph_ms(q, k, v)), **{n: [] for n in variants})
                fn = lambda: decode.flash_attention_decode(  # noqa: B023, E731
                    q, k, v, softmax_scale=D ** -0.5, win_left=big, win_right=big, softcap=None,  # noqa: B023
                    kv_blocksize=8192 // D, num_warps=4, num_stages=3)  # noqa: B023
                for _ in range(2):
                    for name, sets in variants.items():
                        setting(sets)
                        err = (fn()[0].float() - ref).abs().max().item()
                        assert err < 2e-2, (D, B, Sk, name, err)
                        row[name].append(tbps(tt.do_bench_cudagraph(fn, rep=100, return_mode="median")))
                        row.setdefault("plans", {})[name] = decode.decode_splits(q, k, big, big, 8192 // D, 0, 3)[2:]
                setting({})
                rows.append(row)
                c = row["cudnn"]
                print(f"D={D} B={B:2d} Sk={Sk:6d} cudnn {c:.2f} TB/s  " + "  ".join(
                    f"{n} {max(row[n]) / c:.3f}x" for n in variants) + f"  plans {row['plans']}", flush=True)
    name = f"decode_{args.rule}{'_rule' if args.rule == 'splits' else ''}_ab.json"  # (decode_splits_ab.json: v44's)
    save_rows(args.out, name, num_sms(torch.device("cuda"), 0), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
