"""Exhaustive sweep of flash_attention's candidate space on a few shapes (GPU).

For each shape, times the heuristic and every forward and backward candidate (the space the
autotuner searches), and prints the best, the heuristic's standing and the top five of each
phase. Used to check the heuristic (issue: within 15% of tuned) and to pick better defaults.

    python benchmarks/sweep_configs.py [--dims 64 128] [--seqs 4096 16384]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    p.add_argument("--phases", nargs="+", default=["fwd", "bwd"])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    from kernelops.modules.flash_attention import FLASH_ATTENTION as op
    from kernelops.ops.autotune import Autotuner
    from kernelops.ops.device import device_info
    from kernelops.ops.params import short

    dev = device_info("cuda")
    tuner = Autotuner(warmup_ms=5, rep_ms=30)
    report = []
    for D in args.dims:
        for causal in args.causal:
            for S in args.seqs:
                B, H = max(1, 16384 // S), 2048 // D
                q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                inputs = op.prepare(query=q, key=k, value=v, causal=bool(causal))
                heur = op.heuristic_config(inputs, dev)
                flops = 4 * B * H * S * S * D / (2 if causal else 1)
                line = {"D": D, "causal": causal, "S": S, "heuristic": heur.to_dict()}
                for phase, mult in (("fwd", 1.0), ("bwd", 2.5)):
                    if phase not in args.phases:
                        continue
                    timed = []
                    for params in [op.params_of(heur, phase)] + op.candidate_params(inputs, dev, phase):
                        ms, err = tuner._time_config(op, inputs, op.with_params(heur, phase, params), phase)
                        timed.append((ms if ms is not None else float("inf"), params, err))
                    heur_ms = timed[0][0]
                    timed.sort(key=lambda t: t[0])
                    best_ms = timed[0][0]
                    tf = lambda ms: flops * mult / ms / 1e9  # noqa: E731
                    print(f"D={D} causal={causal} S={S} {phase}: best {short(timed[0][1])} {best_ms:.3f} ms "
                          f"({tf(best_ms):.0f} TFLOP/s); heuristic {short(op.params_of(heur, phase))} "
                          f"{heur_ms:.3f} ms ({best_ms / heur_ms:.2f} of best)", flush=True)
                    for ms, params, err in timed[:5]:
                        print(f"    {short(params):22s} {ms:.3f} ms {tf(ms):6.0f} TFLOP/s")
                    fails = [(short(p_), e) for _, p_, e in timed if e]
                    if fails:
                        print(f"    {len(fails)} failed, e.g. {fails[0]}")
                    line[phase] = [{"params": pp.to_dict(), "ms": ms, "error": e} for ms, pp, e in timed]
                report.append(line)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"device": dev.name, "rows": report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
