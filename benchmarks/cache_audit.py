"""Audit a shipped cache on this GPU: each training entry's config against today's heuristic.

A shipped entry pins what won when it was tuned; kernels and rules change after (session 38 found
four H200 entries pinning the Triton backward, from before the Gluon backwards took their shapes).
For every ``train=True`` entry of ``autotune_cache/<DEVICE>/flash_attention.json`` that the filters
keep, this re-creates its call from the entry's ``spec`` and resolves both configs to the launches
they make (``FlashAttention._launch_args``: which kernels, and the tiles only where the kernel reads
them). An entry whose launches equal the heuristic's is listed untimed, ``ratio`` 1. The others are
timed with the tuner's timer and a long rep, the phases whose launches differ in both configs and
the others once, for ``--rounds`` rounds in alternating order, the best of each kept. ``ratio`` is
shipped over heuristic forward+backward time: above 1 the pin costs time today ("fails" where only
the shipped config fails). Entries at or above ``--flag`` are printed
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


def selected(entries: dict, head_dims, min_seq: int, max_seq: int) -> list[tuple[str, dict]]:
    """The training entries with a ``spec`` whose head dim and key count the filters keep, shortest
    calls first."""
    from kernelops.ops.keys import parse_key_text

    keep = []
    for key, entry in entries.items():
        f = dict(parse_key_text(key))
        if f.get("train") is not True or "spec" not in entry:
            continue
        if head_dims and f["head_dim"] not in head_dims:
            continue
        if not min_seq <= f["seq_k"] <= max_seq:
            continue
        keep.append((f["seq_k"], key, entry))
    return [(key, entry) for _, key, entry in sorted(keep, key=lambda item: item[:2])]


def launches(op, inputs, config) -> tuple[tuple, tuple]:
    """``(forward, backward)`` launch params the config resolves to on the Triton platform, the tiles
    dropped where it asks for the warp-specialised forward or the fused Gluon backward (they read
    none). Those kernels take every plain preset call; a call they declined would run the tiles'
    kernels, whose params this would then hide."""
    fwd, bwd = op._launch_args(inputs, config, "triton")[7:9]  # noqa: SLF001 - what run() launches
    if len(fwd) == 5 and fwd[0] != 0 and fwd[4] & 2:  # (a decode forward starts with 0, its 5th is splits)
        fwd = ["ws"]
    if len(bwd) == 5 and bwd[4] == 6:
        bwd = ["ws fused"]
    return tuple(fwd), tuple(bwd)


def audit_one(op, device, timer, entry: dict, rounds: int) -> dict:
    """Forward and backward ms of the entry's config and of the heuristic's on its spec's call, best
    of ``rounds`` rounds (the configs' order alternating); a phase whose launches are the same in
    both is timed once, for both; untimed when every launch is the same. ``ratio``: shipped over
    heuristic forward+backward, infinite when only the shipped config fails."""
    from kernelops.tuning.specs import parse_attention_shape

    row = {"spec": entry["spec"], "created": entry.get("created")}
    try:
        inputs = op.prepare(**parse_attention_shape(entry["spec"]).kwargs("cuda"))
        configs = {"shipped": op.complete_config(op.config_type.from_dict(entry["config"]), inputs, device),
                   "heuristic": op.heuristic_config(inputs, device)}
        made = {name: launches(op, inputs, config) for name, config in configs.items()}
    except Exception as exc:  # noqa: BLE001 - out of memory, a config this install refuses: reported
        return {**row, "same": False, "ratio": None, "error": f"{type(exc).__name__}: {exc}"[:200]}
    row["same"] = made["shipped"] == made["heuristic"]
    row["launches"] = {name: [list(m) for m in pair] for name, pair in made.items()}
    times = {(n, ph): None for n in configs for ph in ("fwd", "bwd")}
    if not row["same"]:
        for r in range(rounds):
            for name in (("shipped", "heuristic") if r % 2 == 0 else ("heuristic", "shipped")):
                for i, phase in enumerate(("fwd", "bwd")):
                    if name == "shipped" and made["shipped"][i] == made["heuristic"][i]:
                        continue  # the heuristic's timing stands for both
                    ms, err = timer._time_config(op, inputs, configs[name], phase)  # noqa: SLF001 - the tuner's
                    if err and times[name, phase] is None:
                        row[f"{name}_{phase}_error"] = err
                    if ms is not None:
                        row.pop(f"{name}_{phase}_error", None)
                        times[name, phase] = ms if times[name, phase] is None else min(times[name, phase], ms)
        for i, phase in enumerate(("fwd", "bwd")):
            if made["shipped"][i] == made["heuristic"][i]:
                times["shipped", phase] = times["heuristic", phase]
    row.update({f"{n}_{ph}_ms": ms for (n, ph), ms in times.items()})
    total = {n: None if None in (times[n, "fwd"], times[n, "bwd"]) else times[n, "fwd"] + times[n, "bwd"]
             for n in configs}
    if row["same"]:
        row["ratio"] = 1.0
    elif total["heuristic"] is not None:
        row["ratio"] = float("inf") if total["shipped"] is None else total["shipped"] / total["heuristic"]
    else:
        row["ratio"] = None
    return row


def table(path: str, flag: float) -> str:
    """The audit's rows, worst first (failures of the shipped config first), and the ``--shapes``
    arguments of those at or above ``flag``."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows.sort(key=lambda r: -(r["ratio"] if r["ratio"] is not None else 0))

    def ms(r, name):
        parts = [r.get(f"{name}_{ph}_ms") for ph in ("fwd", "bwd")]
        return "-" if None in parts else f"{sum(parts):.3f}"

    lines = ["ratio  same  shipped fwd+bwd ms  heuristic ms  created               spec"]
    for r in rows:
        ratio = "  -  " if r["ratio"] is None else ("fails" if r["ratio"] == float("inf") else f"{r['ratio']:.3f}")
        lines.append(f"{ratio}  {'yes' if r['same'] else 'no ':4s}  {ms(r, 'shipped'):>18s}  {ms(r, 'heuristic'):>12s}  "
                     f"{(r.get('created') or '')[:19]:20s}  {r['spec']}" + (f"  ({r['error']})" if "error" in r else ""))
    stale = [r["spec"] for r in rows if r["ratio"] is not None and r["ratio"] >= flag]
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
