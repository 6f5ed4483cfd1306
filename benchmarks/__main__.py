"""``python -m benchmarks [name ...] [--list] [--quick] [--out DIR] [--no-plot] [options of one benchmark]``

Runs the named benchmarks (every one without names), each writing
``benchmarks/results/<DEVICE>/<name>.json`` and a plot. Options this command does not know are
passed on to the benchmarks (name one benchmark when you use them, e.g.
``python -m benchmarks flash_attention --cases dense,decode --dims 128``). On a machine without a
CUDA GPU it says so and exits with status 2; ``--list`` works anywhere.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from benchmarks import discover


def main(argv=None) -> int:
    known = discover()
    names = [b.name for b in known]
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", add_help=False,
        description="Run kernelops' benchmark suite, or the named benchmarks.",
        epilog="benchmarks: " + ", ".join(names) + ". Options not listed here go to the benchmarks "
               "(see python -m benchmarks NAME --help).")
    p.add_argument("-h", "--help", action="store_true", help="this help; with names, theirs")
    p.add_argument("names", nargs="*", metavar="name", help="benchmarks to run (default: all)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--quick", action="store_true", help="small grids (a smoke run)")
    p.add_argument("--out", help="results root (default benchmarks/results)")
    p.add_argument("--no-plot", action="store_true", help="write no plots")
    args, rest = p.parse_known_args(argv)
    if args.list:
        width = max(len(n) for n in names)
        for b in known:
            print(f"{b.name:{width}s}  {b.kind:9s}  {b.summary}")
        return 0
    unknown = [n for n in args.names if n not in names]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(names)}", file=sys.stderr)
        return 2
    if args.help:
        if not args.names:
            p.print_help()
        for name in args.names:
            print(f"\n=== {name}")
            try:
                importlib.import_module(f"benchmarks.{name}").main(["--help"])
            except SystemExit:
                pass
        return 0
    from benchmarks import harness

    if "--report" not in rest and (code := harness.require_cuda()):
        return code
    forward = rest + (["--quick"] if args.quick else []) + (["--out", args.out] if args.out else []) + \
        (["--no-plot"] if args.no_plot else [])
    failed = []
    for name in args.names or names:
        print(f"\n=== {name}", flush=True)
        module = importlib.import_module(f"benchmarks.{name}")
        try:
            code = module.main(forward)
        except SystemExit as exc:  # argparse rejected an option meant for another benchmark
            code = exc.code if isinstance(exc.code, int) else 2
        except KeyboardInterrupt:
            print(f"{name}: interrupted; rows measured so far are in its results file", file=sys.stderr)
            return 130
        if code:
            failed.append(f"{name} ({code})")
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
