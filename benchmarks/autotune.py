"""Autotuner checks for issue 4, on a GPU (a script, not a test).

Keys: flash_attention, bf16, ``B=2, S=8k, Hq=Hkv=16, D=128``, causal and not, forward+backward.

(a) **tune time** of a new key: each run in a fresh subprocess (no in-process kernel cache):
    ``fresh`` with an empty Triton cache (compiles included; ``--compile-jobs`` warm-up first, as
    ``kernelops tune`` does), ``warm`` again on the now-filled Triton cache, and with ``--serial``
    also a fresh run compiling while timing. Target: under 15 s a key.
(b) **exhaustive sweep**: every candidate of each phase timed with a long rep, on top of the
    tuned config; the tuned params' time over the best's (target: within 3%, ratio <= 1.03).
(c) **heuristic vs tuned** on the grid of benchmarks/flash_attention.py (bf16, ``B*S = 16k``,
    ``H*D = 2048``, D 64/128, causal and not, S 1k..16k): both configs re-timed with a long rep,
    heuristic / tuned for the forward and for forward+backward (target: <= 1.15).

    python benchmarks/autotune.py [--out benchmarks/results] [--parts a b c] [--compile-jobs 8] [--serial]

Prints tables and writes ``<out>/<DEVICE>/autotune.json`` after each part; parts not run keep
their earlier results there, each with a ``<part>_created`` time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

KEY_SPECS = ("B=2,S=8192,Hq=16,Hkv=16,D=128,dtype=bf16,causal=0", "B=2,S=8192,Hq=16,Hkv=16,D=128,dtype=bf16,causal=1")
LONG = dict(warmup_ms=25, rep_ms=200)


class _NoSink:
    def put(self, key, inputs, entry):
        return ""

    def close(self):
        pass


def child_tune(jobs: int) -> dict:
    """(a), inside a fresh process: optional compile warm-up, then tune each key."""
    from kernelops.modules.flash_attention import FLASH_ATTENTION as op
    from kernelops.ops import Autotuner
    from kernelops.ops.device import device_info
    from kernelops.tuning.compile import warm_compiles
    from kernelops.tuning.runner import tune_one
    from kernelops.tuning.specs import parse_attention_shape

    specs = [parse_attention_shape(text) for text in KEY_SPECS]
    warm_s = warm_compiles("flash_attention", specs, jobs).seconds if jobs > 0 else 0.0
    rows = [tune_one(op, spec, device=device_info("cuda"), tuner=Autotuner(progress=False), sink=_NoSink())[0]
            for spec in specs]
    return {"compile_jobs": jobs, "warmup_s": warm_s, "keys": [
        {"key": r.spec.summary(), "tune_s": r.seconds, "ms": r.ms, "heuristic_ms": r.heuristic_ms, "error": r.error}
        for r in rows]}


def part_a(jobs: int, serial: bool) -> list[dict]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="kernelops-triton-") as cache, \
            tempfile.TemporaryDirectory(prefix="kernelops-serial-") as serial_cache:
        plan = [("fresh", cache, jobs), ("warm", cache, 0)] + ([("fresh-serial", serial_cache, 0)] if serial else [])
        for label, folder, n in plan:
            env = {**os.environ, "TRITON_CACHE_DIR": folder, "KERNELOPS_AUTOTUNE": "never",
                   "KERNELOPS_CACHE_DIR": os.path.join(folder, "kernelops")}
            out = subprocess.run([sys.executable, __file__, "--child-tune", str(n)], env=env, check=True,
                                 capture_output=True, text=True).stdout
            run = {"run": label, **json.loads(out.strip().splitlines()[-1])}
            runs.append(run)
            for k in run["keys"]:
                error = f"  ERROR {k['error']}" if k["error"] else ""
                print(f"(a) {label:12s} compile warm-up {run['warmup_s']:6.1f}s  {k['key']:36s} "
                      f"tune {k['tune_s']:6.1f}s{error}", flush=True)
    return runs


def _timed(op, inputs, config, phase, timer) -> float:
    ms, err = timer._time_config(op, inputs, config, phase)  # noqa: SLF001 - the tuner's own timing path
    return float("inf") if ms is None else ms


def part_b(dev, jobs: int) -> list[dict]:
    from kernelops.modules.flash_attention import FLASH_ATTENTION as op
    from kernelops.ops import Autotuner
    from kernelops.ops.params import short
    from kernelops.tuning.compile import warm_compiles
    from kernelops.tuning.specs import parse_attention_shape

    specs = [parse_attention_shape(text) for text in KEY_SPECS]
    if jobs > 0:  # every candidate compiled in parallel first: serial compiles made (b) outrun its slot
        warm_compiles("flash_attention", specs, jobs)
    long = Autotuner(progress=False, **LONG)
    rows = []
    for spec in specs:
        inputs = op.prepare(**spec.kwargs("cuda"))
        tuned = Autotuner(progress=False).tune(op, inputs, dev).config
        base = op.heuristic_config(inputs, dev)
        for phase in op.phases(inputs):
            space = [op.params_of(base, phase)] + op.candidate_params(inputs, dev, phase)
            times = {p: _timed(op, inputs, op.with_params(tuned, phase, p), phase, long) for p in dict.fromkeys(space)}
            best = min(times, key=times.get)
            mine = op.params_of(tuned, phase)
            row = {"key": spec.summary(), "phase": phase, "tuned": short(mine), "tuned_ms": times[mine],
                   "best": short(best), "best_ms": times[best], "ratio": times[mine] / times[best],
                   "candidates": len(times)}
            rows.append(row)
            print(f"(b) {row['key']:36s} {phase:4s} tuned {row['tuned']:20s} {row['tuned_ms']:8.3f} ms  best "
                  f"{row['best']:20s} {row['best_ms']:8.3f} ms  ratio {row['ratio']:.3f} (target <= 1.03)", flush=True)
    return rows


def part_c(dev, jobs: int) -> list[dict]:
    from kernelops.modules.flash_attention import FLASH_ATTENTION as op
    from kernelops.ops import Autotuner
    from kernelops.tuning.compile import warm_compiles
    from kernelops.tuning.specs import AttentionSpec

    specs = [AttentionSpec(max(1, 16384 // S), S, S, 2048 // D, 2048 // D, D, "bfloat16", causal)
             for D in (64, 128) for causal in (False, True) for S in (1024, 2048, 4096, 8192, 16384)]
    if jobs > 0:
        warm_compiles("flash_attention", specs, jobs)
    long = Autotuner(progress=False, **LONG)
    rows = []
    print("(c) key                                   fwd: heur ms  tuned ms  ratio | fwd+bwd: heur ms  tuned ms  ratio")
    for spec in specs:
        inputs = op.prepare(**spec.kwargs("cuda"))
        tuned = Autotuner(progress=False).tune(op, inputs, dev).config
        heur = op.heuristic_config(inputs, dev)
        t = {(name, ph): _timed(op, inputs, cfg, ph, long) for name, cfg in (("heur", heur), ("tuned", tuned))
             for ph in ("fwd", "bwd")}
        fwd = t["heur", "fwd"] / t["tuned", "fwd"]
        both = (t["heur", "fwd"] + t["heur", "bwd"]) / (t["tuned", "fwd"] + t["tuned", "bwd"])
        rows.append({"key": spec.summary(), **{f"{n}_{ph}_ms": v for (n, ph), v in t.items()},
                     "fwd_ratio": fwd, "fwdbwd_ratio": both})
        print(f"(c) {spec.summary():36s} {t['heur', 'fwd']:12.3f} {t['tuned', 'fwd']:9.3f} {fwd:6.3f} | "
              f"{t['heur', 'fwd'] + t['heur', 'bwd']:16.3f} {t['tuned', 'fwd'] + t['tuned', 'bwd']:9.3f} {both:6.3f}",
              flush=True)
    worst = max(max(r["fwd_ratio"], r["fwdbwd_ratio"]) for r in rows)
    print(f"(c) worst heuristic/tuned ratio {worst:.3f} (target <= 1.15)")
    return rows


def main(argv=None) -> int:
    from kernelops.tuning.compile import default_jobs

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--parts", nargs="+", default=["a", "b", "c"], choices=["a", "b", "c"])
    p.add_argument("--compile-jobs", type=int, default=default_jobs())
    p.add_argument("--serial", action="store_true", help="(a) also time a fresh tune without compile warm-up")
    p.add_argument("--child-tune", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_tune is not None:
        print(json.dumps(child_tune(args.child_tune)))
        return 0
    os.environ.setdefault("KERNELOPS_AUTOTUNE", "never")  # nothing below may read or fill the user's caches

    import triton

    import kernelops
    from kernelops.ops.device import device_info

    dev = device_info("cuda")
    result = {"device": dev.name, "capability": dev.capability, "torch": torch.__version__,
              "triton": triton.__version__, "kernelops": kernelops.__version__,
              "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    out = pathlib.Path(args.out) / dev.name
    out.mkdir(parents=True, exist_ok=True)
    path = out / "autotune.json"
    if path.exists():  # parts not run now keep their earlier results (each part says when it ran)
        previous = json.loads(path.read_text())
        if previous.get("device") == dev.name:
            result = {**previous, **result}
    parts = {"a": ("tune_time", lambda: part_a(args.compile_jobs, args.serial)),
             "b": ("sweep", lambda: part_b(dev, args.compile_jobs)),
             "c": ("heuristic_vs_tuned", lambda: part_c(dev, args.compile_jobs))}
    for name in sorted(set(args.parts)):
        field, run = parts[name]
        result[field] = run()
        result[f"{field}_created"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        path.write_text(json.dumps(result, indent=1))  # after each part: a run cut short keeps what it did
        print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
