"""Audit a shipped cache on this GPU: each training entry's config against today's heuristic.

A shipped entry pins what won when it was tuned; kernels and rules change after (session 38 found
four H200 entries pinning the Triton backward, from before the Gluon backwards took their shapes).
For every ``train=True`` entry of ``autotune_cache/<DEVICE>/flash_attention.json`` that the filters
keep, this re-creates its call from the entry's ``spec`` and resolves both configs to the launches
they make (``FlashAttention._launch_args``: which kernels, and the tiles only where the kernel reads
them). An entry whose launches equal the heuristic's is listed untimed, ``ratio`` 1. The others are
timed, forward and backward, with the tuner's timer and a long rep, shipped and heuristic
alternating for ``--rounds`` rounds, the best of each kept. ``ratio`` is shipped over heuristic
forward+backward time: above 1 the pin costs time today. Entries at or above ``--flag`` are printed
as ``--shapes`` arguments for ``kernelops tune ... --export autotune_cache/``. One JSON line a key.

(Session 38's first version timed every entry once with the tuner's short rep: pairs that launch
the same kernels read 0.84-1.17x, so its flags were noise. Hence the resolution and the rounds.)

    python benchmarks/cache_audit.py [--head-dims 128] [--max-seq 32k] [--flag 1.03] > audit.jsonl
    python benchmarks/cache_audit.py --table audit.jsonl
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def key_fields(key: str) -> dict[str, str]:
    """``"dtype=bfloat16|head_dim=128|..."`` as a dict of its text fields."""
    return dict(part.split("=", 1) for part in key.split("|"))


def selected(entries: dict, head_dims, min_seq: int, max_seq: int) -> list[tuple[str, dict]]:
    """The training entries with a ``spec`` whose head dim and key count the filters keep, shortest
    calls first."""
    keep = []
    for key, entry in entries.items():
        f = key_fields(key)
        if f.get("train") != "True" or "spec" not in entry:
            continue
        if head_dims and int(f["head_dim"]) not in head_dims:
            continue
        if not min_seq <= int(f["seq_k"]) <= max_seq:
            continue
        keep.append((key, entry))
    return sorted(keep, key=lambda item: (int(key_fields(item[0])["seq_k"]), item[0]))


def launches(op, inputs, config) -> tuple[tuple, tuple]:
    """``(forward, backward)`` launch params the config resolves to on the Triton platform, the tiles
    dropped where the warp-specialised forward or the fused Gluon backward runs (they read none)."""
    fwd, bwd = op._launch_args(inputs, config, "triton")[7:9]  # noqa: SLF001 - what run() launches
    if len(fwd) == 5 and fwd[4] & 2:
        fwd = ["ws"]
    if len(bwd) == 5 and bwd[4] == 6:
        bwd = ["ws fused"]
    return tuple(fwd), tuple(bwd)


def audit_one(op, device, timer, entry: dict, rounds: int) -> dict:
    """Forward and backward ms (best of ``rounds`` alternating rounds) of the entry's config and of
    the heuristic's, on its spec's call; untimed when both make the same launches."""
    from kernelops.tuning.specs import parse_attention_shape

    inputs = op.prepare(**parse_attention_shape(entry["spec"]).kwargs("cuda"))
    configs = {"shipped": op.complete_config(op.config_type.from_dict(entry["config"]), inputs, device),
               "heuristic": op.heuristic_config(inputs, device)}
    made = {name: launches(op, inputs, config) for name, config in configs.items()}
    row = {"spec": entry["spec"], "created": entry.get("created"), "same": made["shipped"] == made["heuristic"],
           "launches": {name: [list(m) for m in pair] for name, pair in made.items()}}
    if row["same"]:
        return {**row, "ratio": 1.0, **{f"{n}_{ph}_ms": None for n in configs for ph in ("fwd", "bwd")}}
    for _ in range(rounds):
        for name, config in configs.items():
            for phase in ("fwd", "bwd"):
                ms, err = timer._time_config(op, inputs, config, phase)  # noqa: SLF001 - the tuner's timing path
                if err:
                    row[f"{name}_{phase}_error"] = err
                best = row.get(f"{name}_{phase}_ms")
                row[f"{name}_{phase}_ms"] = ms if best is None else (best if ms is None else min(best, ms))
    shipped, heur = (row[f"{n}_fwd_ms"] and row[f"{n}_bwd_ms"] and row[f"{n}_fwd_ms"] + row[f"{n}_bwd_ms"]
                     for n in ("shipped", "heuristic"))
    row["ratio"] = shipped / heur if shipped and heur else None
    del inputs
    return row


def table(path: str, flag: float) -> str:
    """The audit's rows, worst first, and the ``--shapes`` arguments of those at or above ``flag``."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows.sort(key=lambda r: -(r["ratio"] or 0))
    lines = ["ratio  same  shipped fwd+bwd ms  heuristic ms  created               spec"]
    for r in rows:
        tot = {n: (r[f"{n}_fwd_ms"] or 0) + (r[f"{n}_bwd_ms"] or 0) for n in ("shipped", "heuristic")}
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "  -  "
        lines.append(f"{ratio}  {'yes' if r['same'] else 'no ':4s}  {tot['shipped']:18.3f}  {tot['heuristic']:12.3f}  "
                     f"{(r.get('created') or '')[:19]:20s}  {r['spec']}")
    stale = [r["spec"] for r in rows if r["ratio"] and r["ratio"] >= flag]
    lines.append(f"{len(stale)} of {len(rows)} entries at or above {flag}: "
                 + " ".join(f"--shapes {s}" for s in stale))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head-dims", type=int, nargs="+", default=None)
    p.add_argument("--min-seq", default="0")
    p.add_argument("--max-seq", default="128k")
    p.add_argument("--flag", type=float, default=1.03)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--table", default=None, help="no GPU: print the table of an audit's JSON lines")
    args = p.parse_args(argv)
    if args.table:
        print(table(args.table, args.flag))
        return 0
    from kernelops.modules.flash_attention import FLASH_ATTENTION as op
    from kernelops.ops import Autotuner
    from kernelops.ops.device import device_info
    from kernelops.ops.pretuned import default_pretuned_root, read_pretuned_file
    from kernelops.tuning.specs import parse_length

    device = device_info("cuda")
    _, entries = read_pretuned_file(default_pretuned_root() / device.name / "flash_attention.json")
    timer = Autotuner(progress=False, warmup_ms=25, rep_ms=200)
    for _, entry in selected(entries, args.head_dims, parse_length('--min-seq', args.min_seq),
                            parse_length('--max-seq', args.max_seq)):
        print(json.dumps(audit_one(op, device, timer, entry, args.rounds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
