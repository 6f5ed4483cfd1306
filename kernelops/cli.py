"""The ``kernelops`` command: ``demo``, ``info`` and ``tune`` (bench/cache come with later issues).

Exit codes: 0 success, 1 failure (e.g. a spec whose every candidate failed, or no GPU to tune
on), 2 usage errors (argparse's convention), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys


def _demo(args) -> int:
    import torch

    from kernelops import flash_attention
    from kernelops.kernels.flash_attention.reference import attention_materialized
    from kernelops.modules.flash_attention import FLASH_ATTENTION, UNBOUNDED
    from kernelops.ops import default_executor

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    B, S, Hq, Hkv, D = (2, 1024, 16, 4, 128) if device == "cuda" else (1, 256, 4, 2, 64)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    q = torch.randn(B, S, Hq, D, device=device, generator=gen).to(dtype)
    k = torch.randn(B, S, Hkv, D, device=device, generator=gen).to(dtype)
    v = torch.randn(B, S, Hkv, D, device=device, generator=gen).to(dtype)
    print(f"kernelops demo: flash_attention on {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'CPU'})")
    print(f"  q {tuple(q.shape)}, k/v {tuple(k.shape)} {str(dtype).removeprefix('torch.')}, causal, GQA {Hq // Hkv}")
    explanation = default_executor().explain(FLASH_ATTENTION, query=q, key=k, value=v, causal=True)
    print(f"  platform: {explanation.platform}; config from the '{explanation.selector}' selector")
    if explanation.platform == "triton":
        print(f"  config: {explanation.config}")
    else:
        print("  (the torch platform runs plain PyTorch: Triton tile parameters do not apply)")
    for name, reason in explanation.declined:
        print(f"    {name} declined: {reason}")
    out = flash_attention(q, k, v, causal=True)
    ref, _ = attention_materialized(q.double(), k.double(), v.double(), softmax_scale=D ** -0.5,
                                    win_left=UNBOUNDED, win_right=0, softcap=None)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    print(f"  relative error vs float64 reference: {err:.2e}")
    ok = err < (2e-2 if dtype == torch.bfloat16 else 1e-4)
    print("  OK" if ok else "  ERROR: larger than expected")
    return 0 if ok else 1


def _info(args) -> int:
    import torch
    import triton

    import kernelops
    from kernelops.ops.cache import default_cache_dir
    from kernelops.ops.device import device_info
    from kernelops.ops.pretuned import default_pretuned_root

    dev = device_info()
    print(f"kernelops {kernelops.__version__}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"device: {dev.name} capability={dev.capability} smem/block={dev.smem_bytes} SMs={dev.num_sms}")
    print(f"cache folder: {default_cache_dir()}")
    root = default_pretuned_root()
    files = sorted(p.relative_to(root).as_posix() for p in root.glob("*/*.json")) if root.exists() else []
    print(f"shipped pre-tuned files ({root}): {', '.join(files) or 'none'}")
    return 0


TUNE_EXAMPLES = """examples:
  kernelops tune flash_attention --preset llm --export autotune_cache/
  kernelops tune flash_attention --preset llm --head-dims 128 --dtypes bf16 --max-seq 16384 --limit-seconds 600
  kernelops tune flash_attention --shapes B=2,S=8k,Hq=32,Hkv=8,D=128,dtype=bf16,causal=1

Without --export the winners go to the user's disk cache, where the executor finds them like
entries it tuned itself. A training spec (train=1, the default) tunes forward and backward and
also writes the entry of the same call without gradients (marked "derived_from")."""


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _jobs(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _length(text: str) -> int:
    from kernelops.tuning.specs import parse_length

    try:
        return parse_length("length", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dtype(text: str) -> str:
    from kernelops.tuning.specs import dtype_name

    try:
        return dtype_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_tune(sub) -> None:
    from kernelops.tuning.compile import default_jobs
    from kernelops.tuning.presets import MASKS
    from kernelops.tuning.registry import TUNABLE

    tune = sub.add_parser("tune", help="tune an op's launch configs for given shapes or a preset",
                          description="Tune an op's launch configs (two timing rounds per phase) for given\n"
                                      "shapes or a named preset on this machine's GPU, and write the winners.",
                          epilog=TUNE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    tune.add_argument("op", help=f"the op to tune: {', '.join(sorted(TUNABLE))}")
    what = tune.add_mutually_exclusive_group(required=True)
    shapes = "; ".join(f"{name}: {t.shape_help}" for name, t in sorted(TUNABLE.items()))
    presets = "; ".join(f"{name}: {', '.join(sorted(t.presets))}" for name, t in sorted(TUNABLE.items()))
    what.add_argument("--shapes", action="append", metavar="SPEC", help=f"a call to tune (repeatable); {shapes}")
    what.add_argument("--preset", metavar="NAME", help=f"a named list of calls; {presets}")
    tune.add_argument("--export", metavar="DIR", help="write DIR/<device>/<op>.json (merged with the entries "
                                                      "already there) instead of the user's disk cache")
    filters = tune.add_argument_group("filters (on the preset's or the given specs)")
    filters.add_argument("--head-dims", type=int, nargs="+", metavar="D")
    filters.add_argument("--dtypes", type=_dtype, nargs="+", metavar="DTYPE", help="e.g. bf16 fp16")
    filters.add_argument("--gqa", type=int, nargs="+", metavar="RATIO", help="query heads per key/value head")
    filters.add_argument("--masks", nargs="+", choices=MASKS)
    filters.add_argument("--min-seq", type=_length, metavar="S", help="e.g. 1024 or 1k")
    filters.add_argument("--max-seq", type=_length, metavar="S", help="e.g. 16384 or 16k")
    tune.add_argument("--compile-jobs", type=_jobs, default=default_jobs(), metavar="N",
                      help="processes that compile every candidate first, in parallel (default: "
                           "min(8, CPUs); 0: compile while timing)")
    tune.add_argument("--limit-seconds", type=_positive_float, metavar="S",
                      help="stop starting new specs after S seconds; what is tuned is written")
    tune.add_argument("--dry-run", action="store_true", help="list the specs and exit")
    tune.add_argument("--quiet", action="store_true", help="no progress line and no table, only the totals")
    tune.set_defaults(func=_tune, parser=tune)


def _tune_specs(args) -> list:
    """The specs ``args`` select (``args.parser.error`` -> exit 2 on bad input)."""
    from kernelops.tuning.presets import filter_specs
    from kernelops.tuning.registry import get_tunable

    try:
        tunable = get_tunable(args.op)
    except KeyError as exc:
        args.parser.error(exc.args[0])
    if args.preset is not None:
        if args.preset not in tunable.presets:
            known = ", ".join(sorted(tunable.presets))
            args.parser.error(f"unknown preset {args.preset!r} for {args.op}; known: {known}")
        specs = tunable.presets[args.preset]()
    else:
        try:
            specs = [tunable.parse_shape(text) for text in args.shapes]
        except ValueError as exc:
            args.parser.error(f"--shapes: {exc}")
    specs = filter_specs(specs, head_dims=args.head_dims, dtypes=args.dtypes, gqa=args.gqa, masks=args.masks,
                         min_seq=args.min_seq, max_seq=args.max_seq)
    if not specs:
        args.parser.error("the filters leave no spec to tune")
    return specs


def _tune(args) -> int:
    from kernelops.tuning.runner import tuning_device

    specs = _tune_specs(args)
    if args.dry_run:
        for spec in specs:
            print(f"{spec.summary():40s} {spec.text()}")
        print(f"{len(specs)} spec(s)")
        return 0
    device = tuning_device()
    if device is None:
        print("kernelops tune: no CUDA GPU here, so nothing can be tuned: tuning times Triton kernels on the GPU "
              "that will run them (TRITON_INTERPRET=1 runs them in the interpreter on CPU, for tests only).",
              file=sys.stderr)
        return 1
    return _run_tune(args, specs, device)


def _run_tune(args, specs: list, device) -> int:
    from kernelops.ops import Autotuner, default_executor
    from kernelops.tuning.registry import get_tunable
    from kernelops.tuning.report import ProgressLine, summary_table, totals_line
    from kernelops.tuning.runner import tune_specs, wall_clock_timer
    from kernelops.tuning.sinks import DiskCacheSink, ExportSink

    op = get_tunable(args.op).op()
    progress = ProgressLine(args.op, len(specs), quiet=args.quiet)
    tuner = Autotuner(progress=progress.step)
    if not device.is_cuda:  # the interpreter: CUDA events do not exist, the wall clock does
        tuner.time_fn = tuner.quick_time_fn = wall_clock_timer()
    if args.export:
        sink = ExportSink(args.export, op, device)
    else:
        sink = DiskCacheSink(default_executor().chain.cache, op, device)
    if not args.quiet:
        print(f"kernelops tune {args.op}: {len(specs)} spec(s) on {device.name}, writing to "
              f"{sink.path if args.export else 'the disk cache'}", file=sys.stderr)
    limit = args.limit_seconds
    if device.is_cuda and args.compile_jobs > 0:
        spent = _warm_compiles(args, specs, progress)
        limit = None if limit is None else max(0.0, limit - spent)
    report = tune_specs(op, specs, device=device, tuner=tuner, sink=sink, limit_s=limit,
                        on_spec=progress.start, on_rows=progress.finish)
    progress.close()
    if not args.quiet:
        print(summary_table(report))
    print(totals_line(report))
    if report.stopped == "interrupted":
        return 130
    return 1 if report.failed else 0


def _warm_compiles(args, specs: list, progress) -> float:
    """Compile every candidate first in ``--compile-jobs`` processes; the seconds it took."""
    from kernelops.tuning.compile import warm_compiles

    warm = warm_compiles(args.op, specs, args.compile_jobs, on_done=lambda d, t: progress.phase("compiling", d, t))
    progress.close()
    if not args.quiet:
        print(f"compiled {warm.runs} candidate kernel(s) of {warm.groups} group(s) in {warm.seconds:.0f}s "
              f"with {args.compile_jobs} process(es)", file=sys.stderr)
    for error in warm.errors[:5]:
        print(f"  compile warm-up: {error}", file=sys.stderr)
    if len(warm.errors) > 5:
        print(f"  ... and {len(warm.errors) - 5} more", file=sys.stderr)
    return warm.seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernelops", description="kernelops command line")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run flash_attention on random data and check it against float64")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    info = sub.add_parser("info", help="device, versions, cache folder and shipped tuned files")
    info.set_defaults(func=_info)
    _add_tune(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
