"""Audit a shipped cache on this GPU: each training entry's config against today's heuristic.

A shipped entry pins what won when it was tuned; kernels and rules change after (session 38 found
four H200 entries pinning the Triton backward at 1.3-1.7x the time of the rule's Gluon one). For
every ``train=True`` entry of ``autotune_cache/<DEVICE>/flash_attention.json`` that the filters
keep, this re-creates its call from the entry's ``spec``, completes both configs for it, and times
the forward and the backward of each with the tuner's own timer (``Autotuner._time_config``,
do_bench medians); an entry equal to the heuristic's config is listed untimed, ratio 1. ``ratio`` is shipped over heuristic forward+backward time: above 1 the pin costs
time today. The entries at or above ``--flag`` are printed as ``--shapes`` arguments for
``kernelops tune ... --export autotune_cache/``. Writes one JSON line a key as it goes.

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


def audit_one(op, device, timer, entry: dict) -> dict:
    """Forward and backward ms of the entry's config and of the heuristic's, on its spec's call."""
    from kernelops.tuning.specs import parse_attention_shape

    inputs = op.prepare(**parse_attention_shape(entry["spec"]).kwargs("cuda"))
    configs = {"shipped": op.complete_config(op.config_type.from_dict(entry["config"]), inputs, device),
               "heuristic": op.heuristic_config(inputs, device)}
    row = {"spec": entry["spec"], "created": entry.get("created"), "same": configs["shipped"] == configs["heuristic"]}
    if row["same"]:  # nothing to compare: the entry pins what the heuristic gives today
        return {**row, "ratio": 1.0, **{f"{n}_{ph}_ms": None for n in configs for ph in ("fwd", "bwd")}}
    for name, config in configs.items():
        for phase in ("fwd", "bwd"):
            ms, err = timer._time_config(op, inputs, config, phase)  # noqa: SLF001 - the tuner's timing path
            row[f"{name}_{phase}_ms"] = ms
            if err:
                row[f"{name}_{phase}_error"] = err
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
    timer = Autotuner(progress=False)
    for _, entry in selected(entries, args.head_dims, parse_length('--min-seq', args.min_seq),
                            parse_length('--max-seq', args.max_seq)):
        print(json.dumps(audit_one(op, device, timer, entry)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
