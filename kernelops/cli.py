"""The ``kernelops`` command: ``demo``, ``info``, ``tune``, ``bench`` and ``cache``.

Every subcommand has ``--help`` with examples. The work happens in library modules
(:mod:`kernelops.tuning`: ``runner``, ``bench``, ``cache_admin``); this file only parses and prints.

Exit codes: 0 success, 1 failure (e.g. a spec whose every candidate failed, no GPU to tune on, a
cache file refused, a key not in the cache), 2 usage errors (argparse's convention),
130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys


def _demo(args) -> int:
    import torch

    from kernelops import flash_attention
    from kernelops.kernels.flash_attention.reference import attention_materialized
    from kernelops.modules.attention_args import UNBOUNDED
    from kernelops.modules.flash_attention import FLASH_ATTENTION
    from kernelops.ops import AutotunePolicy, default_executor

    try:
        AutotunePolicy.from_env()
    except ValueError as exc:
        return _fail("demo", str(exc))
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


INFO_EXAMPLES = """examples:
  kernelops info
  KERNELOPS_CACHE_DIR=/scratch/kernelops-cache kernelops info

Shows the versions, the device (on a GPU: its compute capability, shared memory per block and
SM count), the autotune policy, the user's disk cache (folder, size, entries and how many of them
this install can still use), every op with its platforms and the shipped pre-tuned file the
executor reads for it on this device, and every shipped pre-tuned file, marking those the executor
reads on this device (its own folder, or another of the same compute capability)."""


def _size_text(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _info(args) -> int:
    import platform

    import torch
    import triton

    import kernelops
    from kernelops.ops.autotune import AutotunePolicy
    from kernelops.ops.cache import default_cache_dir
    from kernelops.ops.device import device_info
    from kernelops.ops.pretuned import default_pretuned_root
    from kernelops.tuning.cache_admin import files_for_device, shipped_files

    dev = device_info()
    print(f"kernelops {kernelops.__version__}, torch {torch.__version__}, triton {triton.__version__}, "
          f"python {platform.python_version()}")
    if dev.is_cuda:
        capability = "-" if dev.capability is None else f"sm{dev.capability[0]}{dev.capability[1]}"
        print(f"device: {dev.name} (capability {capability}, smem/block {dev.smem_bytes} B, SMs {dev.num_sms})")
    else:
        print(f"device: {dev.name} (no CUDA GPU: ops run their torch platform; TRITON_INTERPRET=1 runs the Triton "
              "kernels, for tests)")
    try:
        policy = AutotunePolicy.from_env().value
    except ValueError as exc:
        policy = f"invalid ({exc})"
    print(f"autotune policy: {policy} (KERNELOPS_AUTOTUNE)")
    _print_cache_summary(default_cache_dir())
    root = default_pretuned_root()
    files = shipped_files(root, dev)
    _print_ops(files_for_device(files), dev.name)
    print(f"shipped pre-tuned files under {root}: {len(files) or 'none'}")
    for file in files:
        if file.error:
            print(f"  {file.label}: UNUSABLE ({file.error})")
            continue
        meta = file.metadata
        cap = "-" if meta["capability"] is None else f"sm{meta['capability'][0]}{meta['capability'][1]}"
        print(f"  {file.label}: {file.entries} entries, {cap}, torch {meta['torch']}, triton {meta['triton']}"
              f" [{file.relation}]")
    return 0


def _print_ops(used: dict, device_name: str) -> None:
    """One line per op: its platforms and the shipped pre-tuned files the executor reads for it here
    (``used``: :func:`~kernelops.tuning.cache_admin.files_for_device`'s answer)."""
    from kernelops.modules import operations

    ops = operations()
    rows = [("op", "platforms", f"shipped pre-tuned cache for {device_name}")]
    for name, op in ops.items():
        files = used.get(name, [])
        if files:
            cache = "yes: " + ", ".join(f"{f.label} ({f.relation})" for f in files)
        else:
            cache = "no" if "triton" in op.platforms else "no (nothing to tune)"
        rows.append((name, ", ".join(op.platforms), cache))
    print(f"ops: {len(ops)}")
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    for row in rows:
        print(f"  {row[0].ljust(widths[0])}  {row[1].ljust(widths[1])}  {row[2]}")


def _print_cache_summary(folder) -> None:
    import diskcache.core

    from kernelops.ops.cache import ConfigCache
    from kernelops.tuning.cache_admin import cache_rows

    if not (folder / diskcache.core.DBNAME).is_file():
        print(f"disk cache: {folder} (not created yet: 0 entries)")
        return
    cache = ConfigCache(folder)
    try:
        count, size = cache.disk_count(), cache.disk_size_bytes()
        current = sum(row.current for row in cache_rows(cache))
        state = "" if cache.disk_available else " UNUSABLE (see the warning above)"
    finally:
        cache.close()
    print(f"disk cache: {folder}{state}")
    print(f"  {count} entries ({current} usable by this install), {_size_text(size)}")


TUNE_EXAMPLES = """examples:
  kernelops tune flash_attention --preset llm --export autotune_cache/
  kernelops tune flash_attention --preset llm --head-dims 128 --dtypes bf16 --max-seq 16384 --limit-seconds 600
  kernelops tune flash_attention --preset llm --export autotune_cache/ --limit-seconds 540 --resume-since 2026-11-24
  kernelops tune flash_attention --shapes B=2,S=8k,Hq=32,Hkv=8,D=128,dtype=bf16,causal=1
  kernelops tune flash_attention_fp8 --preset llm --export autotune_cache/

Without --export the winners go to the user's disk cache, where the executor finds them like
entries it tuned itself. A training spec (train=1, the default) tunes forward and backward and
also writes the entry of the same call without gradients (marked "derived_from"). A campaign
longer than one sitting: run it with --limit-seconds, then again with the same arguments and
--resume-since the date it began; keys the file holds from since then (same versions) are kept."""


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
    tune.add_argument("--resume-since", metavar="WHEN",
                      help="with --export: skip specs whose key the file already holds from a tune at or after "
                           "WHEN (ISO date or date-time, UTC unless given) by this install's versions, so a "
                           "campaign split by --limit-seconds goes on where it stopped")
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


def _resume(args, specs: list) -> list:
    """``--resume-since``: the specs still to tune (the others are reported and kept)."""
    from kernelops.tuning.specs import parse_since

    if not args.export:
        args.parser.error("--resume-since needs --export (it reads the exported file)")
    try:
        since = parse_since(args.resume_since)
    except ValueError:
        args.parser.error(f"--resume-since: not an ISO date or date-time: {args.resume_since!r}")
    from kernelops.ops.device import versions
    from kernelops.ops.pretuned import read_pretuned_file
    from kernelops.tuning.registry import get_tunable
    from kernelops.tuning.runner import resume_split, tuned_since, tuning_device

    device = tuning_device()
    if device is None:
        return specs  # _tune reports that nothing can be tuned here
    path = os.path.join(args.export, device.name, f"{args.op}.json")
    try:
        entries = read_pretuned_file(path)[1] if os.path.exists(path) else {}
    except (OSError, ValueError) as exc:
        raise SystemExit(_fail("tune", f"--resume-since: cannot read {path}: {type(exc).__name__}: {exc}"))
    op = get_tunable(args.op).op()
    to_tune, kept = resume_split(op, specs, tuned_since(entries, since, versions()))
    print(f"kernelops tune: --resume-since {since.isoformat()}: {len(kept)} spec(s) already tuned in {path}, "
          f"{len(to_tune)} left", file=sys.stderr)
    return to_tune


def _tune(args) -> int:
    specs = _tune_specs(args)
    if args.resume_since is not None:
        specs = _resume(args, specs)
        if not specs:
            print("tuned 0 key(s): every spec was already tuned since --resume-since")
            return 0
    if args.dry_run:
        for spec in specs:
            print(f"{spec.summary():40s} {spec.text()}")
        print(f"{len(specs)} spec(s)")
        return 0
    from kernelops.tuning.runner import tuning_device

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
        problem = _unwritable(os.path.join(args.export, device.name))
        if problem:
            return _fail("tune", f"cannot write to --export {args.export}: {problem}")
        sink = ExportSink(args.export, op, device)
    else:
        cache = default_executor().chain.cache
        cache.disk_count()  # opens the store: an unusable one degrades to memory-only here
        if not cache.disk_available:
            return _fail("tune", f"the disk cache at {cache.directory} is unusable, so nothing tuned could be kept: "
                                 "fix or clear it (kernelops cache clear), or tune with --export DIR")
        sink = DiskCacheSink(cache, op, device)
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


# --- kernelops cache ------------------------------------------------------------------------------------
CACHE_EXAMPLES = """examples:
  kernelops cache list --op flash_attention
  kernelops cache show 'flash_attention|dtype=bfloat16|head_dim=128|...|seq_k=4096'
  kernelops cache export tuned/             # tuned/<DEVICE>/<op>.json, the shipped format
  kernelops cache import tuned/NVIDIA_H100_80GB_HBM3/flash_attention.json
  kernelops cache clear --stale --yes

The cache is the user's disk cache (KERNELOPS_CACHE_DIR, else the platform's user cache folder;
--cache-dir overrides both). Its keys hold the op's key, the device, the torch/triton/kernelops
versions and a hash of the op's kernel sources: an entry is "current" when this install would use
it, "stale" after an upgrade or a kernel edit."""

CACHE_IMPORT_HELP = """Validate a shipped-format file (DIR/<DEVICE>/<op>.json as written by `kernelops cache export`
or `kernelops tune --export`) and store its entries in the disk cache, where the executor finds them.

Refused whole (exit 1, nothing written): anything but UTF-8 JSON of that shape (a pickle, a binary
or truncated file, NaN, duplicated names), an unknown op (the op is the file name's stem, or --op),
an entry lacking a field or with a config field the op does not know, and:
  - a file tuned on another device (name and compute capability): the executor here would never
    use it. --any-device stores the entries under that device's key anyway (for a cache folder
    shared with such machines);
  - a file tuned with other torch/triton/kernelops versions or other kernel sources (when the file
    records a kernel_source_hash): entries are keyed by version. --accept-versions stores them under
    this install's versions anyway (each entry keeps its own "versions" record).
All entries are written in one transaction and marked "imported_from": FILE."""

CACHE_CLEAR_HELP = """Delete entries from the disk cache: all of them, those of one op (--op), or only those this
install cannot use any more (--stale). Asks for confirmation on a terminal; when stdin is not a
terminal (scripts, CI) it refuses (exit 1) unless --yes is given."""


def _add_cache(sub) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache-dir", metavar="DIR",
                        help="the cache folder (default: $KERNELOPS_CACHE_DIR, else the user cache folder)")
    cache = sub.add_parser("cache", help="list, show, clear, export or import tuned configs in the disk cache",
                           description="Manage the user's disk cache of tuned launch configs.",
                           epilog=CACHE_EXAMPLES, formatter_class=raw)
    verbs = cache.add_subparsers(dest="verb", required=True, metavar="{list,show,clear,export,import}")

    ls = verbs.add_parser("list", parents=[common], help="one line per entry", formatter_class=raw,
                          description="One line per disk entry: op, key text, config summary, tuned ms, source, "
                                      "device and status (current or stale). --json prints {\"cache_dir\", "
                                      "\"entries\": [...]} instead, each entry with its full key and the key's "
                                      "parts (op, key_text, device, versions), status, current, config, "
                                      "config_summary, ms, heuristic_ms, source, created and imported_from.",
                          epilog="examples:\n  kernelops cache list\n  kernelops cache list --op flash_attention "
                                 "--full-keys\n  kernelops cache list --json | jq '.entries[] | select(.current) "
                                 "| .key_text'")
    ls.add_argument("--op", help="only entries of this op")
    ls.add_argument("--full-keys", action="store_true",
                    help="print each entry's full disk key (with device, versions, source hash) instead of the "
                         "op's key text")
    ls.add_argument("--json", action="store_true", help="print the entries as JSON (one object, see above)")
    ls.set_defaults(func=_cache_list, parser=ls)

    show = verbs.add_parser("show", parents=[common], help="print the full JSON of an entry", formatter_class=raw,
                            description="Print the entries whose key is KEY as JSON ({disk key: entry}). KEY is a "
                                        "full disk key, 'op|key text', or the op's key text (all devices and "
                                        "versions). Exit 1 when nothing matches.",
                            epilog="examples:\n  kernelops cache show 'flash_attention|dtype=float16|head_dim=64|"
                                   "...'\n  kernelops cache list --full-keys   # to find keys")
    show.add_argument("key", metavar="KEY")
    show.set_defaults(func=_cache_show, parser=show)

    clear = verbs.add_parser("clear", parents=[common], help="delete entries", description=CACHE_CLEAR_HELP,
                             formatter_class=raw,
                             epilog="examples:\n  kernelops cache clear --yes\n  kernelops cache clear --op "
                                    "flash_attention --stale")
    clear.add_argument("--op", help="only entries of this op")
    clear.add_argument("--stale", action="store_true", help="only entries this install can no longer use")
    clear.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    clear.set_defaults(func=_cache_clear, parser=clear)

    export = verbs.add_parser("export", parents=[common], help="write entries as shipped-format files",
                              formatter_class=raw,
                              description="Write the cache's current entries (stale ones are skipped and counted) "
                                          "as DIR/<DEVICE>/<op>.json in the shipped format, merged into files "
                                          "already there. Such a file can be committed to autotune_cache/ or "
                                          "imported on another machine. Exit 1 when nothing was exported.",
                              epilog="examples:\n  kernelops cache export tuned/\n  kernelops cache export "
                                     "autotune_cache/ --op flash_attention")
    export.add_argument("dir", metavar="DIR")
    export.add_argument("--op", help="only entries of this op")
    export.set_defaults(func=_cache_export, parser=export)

    imp = verbs.add_parser("import", parents=[common], help="validate a shipped-format file and store its entries",
                           description=CACHE_IMPORT_HELP, formatter_class=raw,
                           epilog="examples:\n  kernelops cache import tuned/NVIDIA_H100_80GB_HBM3/flash_attention.json"
                                  "\n  kernelops cache import old.json --op flash_attention --accept-versions")
    imp.add_argument("file", metavar="FILE")
    imp.add_argument("--op", help="the op the entries belong to (default: the file name's stem)")
    imp.add_argument("--any-device", action="store_true", help="store entries tuned on another device")
    imp.add_argument("--accept-versions", action="store_true",
                     help="store entries tuned with other versions under this install's versions")
    imp.set_defaults(func=_cache_import, parser=imp)


def _open_cache(args, *, create: bool):
    """The ConfigCache of ``--cache-dir`` (or the default), or None when it does not exist and
    ``create`` is False (so that reading commands never create the folder)."""
    import pathlib

    import diskcache.core

    from kernelops.ops.cache import ConfigCache, default_cache_dir

    folder = pathlib.Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_dir()
    if not create and not (folder / diskcache.core.DBNAME).is_file():
        return None, folder
    return ConfigCache(folder), folder


def _unwritable(folder) -> str | None:
    """Why files cannot be written into ``folder`` (created if missing), or None when they can."""
    import tempfile

    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".kernelops-write-check-"):
            pass
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _fail(command: str, message: str) -> int:
    print(f"kernelops {command}: {message}", file=sys.stderr)
    return 1


def _cache_list(args) -> int:
    import json

    from kernelops.tuning.cache_admin import cache_rows

    cache, folder = _open_cache(args, create=False)
    rows = [] if cache is None else cache_rows(cache, op=args.op)
    if args.json:
        print(json.dumps({"cache_dir": str(folder), "entries": [row.to_dict() for row in rows]}, indent=1))
    else:
        _print_cache_table(rows, full_keys=args.full_keys)
    which = f" of {args.op}" if args.op else ""
    print(f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'}{which} in {folder}"
          + ("" if cache is not None else " (no cache there yet)"), file=sys.stderr)
    if cache is not None and not cache.disk_available:
        return _fail("cache list", f"the disk cache at {folder} is unusable")
    return 0


def _print_cache_table(rows, *, full_keys: bool) -> None:
    from kernelops.tuning.cache_admin import config_summary

    header = ("op", "key", "config", "ms", "source", "device", "status")
    lines = []
    for row in rows:
        parts = row.parts
        key = row.key if full_keys or parts is None else parts.key_text
        ms = row.entry.get("ms")
        lines.append((row.op, key, config_summary(row.entry.get("config")),
                      f"{ms:.4g}" if isinstance(ms, (int, float)) else "-", str(row.entry.get("source", "-")),
                      parts.device if parts is not None else "-", row.status))
    if lines:
        widths = [max(len(x[i]) for x in [header] + lines) for i in range(len(header) - 1)]
        for cells in [header] + lines:
            print("  ".join([c.ljust(w) for c, w in zip(cells[:-1], widths)] + [cells[-1]]))


def _cache_show(args) -> int:
    import json

    from kernelops.tuning.cache_admin import cache_rows

    cache, folder = _open_cache(args, create=False)
    rows = [] if cache is None else cache_rows(cache)
    found = {}
    for row in rows:
        names = {row.key}
        if row.parts is not None:
            names |= {row.parts.key_text, f"{row.parts.op}|{row.parts.key_text}", row.parts.memory_key}
        if args.key in names:
            found[row.key] = row.entry
    if not found:
        return _fail("cache show", f"no entry with key {args.key!r} in {folder} (`kernelops cache list` shows the keys)")
    print(json.dumps(found, indent=2, sort_keys=True))
    return 0


def _cache_clear(args) -> int:
    from kernelops.tuning.cache_admin import cache_rows

    cache, folder = _open_cache(args, create=False)
    if cache is None:
        print(f"nothing to delete: no cache at {folder}")
        return 0
    everything = args.op is None and not args.stale
    if everything:
        count, keys = cache.disk_count(), None
    else:
        keys = [row.key for row in cache_rows(cache, op=args.op) if not (args.stale and row.current)]
        count = len(keys)
    if not cache.disk_available:  # known once it has been read
        return _fail("cache clear", f"the disk cache at {folder} is unusable; remove the folder by hand to start over")
    if count == 0:
        print(f"nothing to delete in {folder}")
        return 0
    what = f"{count} entr{'y' if count == 1 else 'ies'}" + (f" of {args.op}" if args.op else "") + \
        (" (stale)" if args.stale else "")
    if not args.yes:
        if not sys.stdin.isatty():
            return _fail("cache clear", f"refusing to delete {what} from {folder} without confirmation: stdin is not "
                                        "a terminal; pass --yes")
        answer = input(f"delete {what} from {folder}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing deleted")
            return 1
    if everything:
        cache.clear()
        deleted = count
    else:
        deleted = cache.delete_many(keys)
    if not cache.disk_available:
        return _fail("cache clear", f"the disk cache at {folder} is unusable; nothing deleted")
    print(f"deleted {deleted} entr{'y' if deleted == 1 else 'ies'} from {folder}")
    return 0


def _cache_export(args) -> int:
    from kernelops.tuning.cache_admin import export_cache

    cache, folder = _open_cache(args, create=False)
    if cache is None:
        return _fail("cache export", f"nothing to export: no cache at {folder}")
    try:
        report = export_cache(cache, args.dir, op=args.op)
    except (OSError, ValueError) as exc:
        return _fail("cache export", f"{type(exc).__name__}: {exc}")
    for path, n in report.files.items():
        print(f"wrote {n} entr{'y' if n == 1 else 'ies'} to {path}")
    if report.skipped:
        reasons = {}
        for _, status in report.skipped:
            reasons[status] = reasons.get(status, 0) + 1
        print(f"skipped {len(report.skipped)} entries this install cannot use: "
              + "; ".join(f"{n} x {status}" for status, n in reasons.items()), file=sys.stderr)
    if not report.files:
        return _fail("cache export", f"no current entries{' of ' + args.op if args.op else ''} in {folder}; "
                                     "nothing written")
    return 0


def _cache_import(args) -> int:
    from kernelops.tuning.cache_admin import CacheFileError, import_cache_file

    cache, folder = _open_cache(args, create=True)
    try:
        report = import_cache_file(cache, args.file, op=args.op, any_device=args.any_device,
                                   accept_versions=args.accept_versions)
    except CacheFileError as exc:
        return _fail("cache import", str(exc))
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"imported {report.stored} {report.file.op} entr{'y' if report.stored == 1 else 'ies'} for "
          f"{report.device_key} into {folder}")
    return 0


# --- kernelops bench ------------------------------------------------------------------------------------
BENCH_EXAMPLES = """examples:
  kernelops bench flash_attention --shapes B=2,S=4k,Hq=32,Hkv=8,D=128,dtype=bf16,causal=1
  kernelops bench flash_attention --shapes B=1,S=16k,Hq=16,D=128,causal=1 --backward --json bench.json
  kernelops bench flash_attention --shapes B=1,S=256,Hq=4,D=64,dtype=fp32 --impls kernelops sdpa-math
  kernelops bench scaled_dot_product_attention --shapes B=2,Sq=1k,Sk=4k,Hq=16,D=64,dtype=fp16,causal=1
  kernelops bench attention --shapes B=1,S=512,Hq=8,D=64,dtype=fp32,window=128

OP is the kernelops function in the "kernelops" rows: flash_attention, scaled_dot_product_attention
or attention (its output; it also materialises the weights). A spec is one attention: causal is
bottom-right aligned and a window is two-sided (one-sided with causal), as flash_attention reads
them; scaled_dot_product_attention gets causal=True when Sq == Sk and a boolean [Sq, Sk]
attention_mask otherwise (its causal is top-left aligned, as torch's).

Implementations: kernelops (BSHD, config from the default executor, as your calls get it); torch
SDPA restricted to one backend (sdpa-cudnn, sdpa-flash, sdpa-efficient, sdpa-math; BHSD, GQA via
enable_gqa, bottom-right causal via causal_lower_right when Sq != Sk, windows as a boolean mask);
flex (FlexAttention: compiled on CUDA, eager and forward-only on CPU). Default: all but sdpa-math
on CUDA; kernelops, sdpa-math and flex on CPU. A backend that refuses a call is listed with why.

Times: triton.testing.do_bench median on CUDA, wall-clock median on CPU, after an untimed call.
TFLOP/s count 4*B*Hq*Sq*Sk*D per forward (half when causal; the visible pairs with a window) and
3.5x that for forward+backward. "kernelops speed-up" = their ms / kernelops ms (above 1: kernelops
is faster); max|diff| = largest forward output difference to kernelops. The spec's train flag is
ignored (--backward adds forward+backward rows). Exit 1 when a kernelops row failed."""


def _add_bench(sub) -> None:
    from kernelops.tuning.bench import IMPLS, OPS

    bench = sub.add_parser("bench", help="time an op beside torch SDPA backends and FlexAttention",
                           description="Time an op beside torch's SDPA backends and FlexAttention on random "
                                       "inputs and print a side-by-side table.",
                           epilog=BENCH_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("op", choices=OPS, help=f"the op to bench: {', '.join(OPS)}")
    bench.add_argument("--shapes", action="append", required=True, metavar="SPEC",
                       help="a call (repeatable): B=2,S=4096,Hq=32,Hkv=8,D=128,dtype=bf16,causal=1[,window=W]")
    bench.add_argument("--impls", nargs="+", choices=IMPLS, metavar="IMPL",
                       help=f"implementations to time (kernelops always runs): {', '.join(IMPLS)}")
    bench.add_argument("--backward", action="store_true", help="also time forward+backward")
    bench.add_argument("--json", metavar="FILE", help="also write the rows, device and versions as JSON")
    bench.add_argument("--warmup-ms", type=_positive_float, default=25.0, metavar="MS",
                       help="do_bench warm-up on CUDA (default 25)")
    bench.add_argument("--rep-ms", type=_positive_float, default=100.0, metavar="MS",
                       help="time spent timing each row (default 100; on CPU at least 3 calls)")
    bench.add_argument("--seed", type=int, help="seed of the random inputs (default: fresh)")
    bench.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    bench.set_defaults(func=_bench, parser=bench)


def _bench(args) -> int:
    import json
    import pathlib

    from kernelops.tuning.specs import parse_attention_shape

    try:
        specs = [parse_attention_shape(text) for text in args.shapes]
    except ValueError as exc:
        args.parser.error(f"--shapes: {exc}")
    import torch

    from kernelops.tuning.bench import bench_report, cpu_timer, cuda_timer, format_table, run_bench
    if args.json:
        problem = _unwritable(pathlib.Path(args.json).parent)
        if problem:
            return _fail("bench", f"cannot write --json {args.json}: {problem}")
    cuda = torch.cuda.is_available()
    timer = cuda_timer(args.warmup_ms, args.rep_ms) if cuda else cpu_timer(args.rep_ms)
    modes = ("fwd", "fwd+bwd") if args.backward else ("fwd",)
    if not args.quiet:
        where = torch.cuda.get_device_name() if cuda else "CPU (kernelops runs its torch platform; wall-clock timing)"
        print(f"kernelops bench {args.op}: {len(specs)} spec(s) on {where}", file=sys.stderr)

    def progress(row) -> None:
        if not args.quiet:
            result = f"{row.ms:.3f} ms" if row.ms is not None else f"not run: {row.note}"
            print(f"  {row.summary} {row.impl}: {result}", file=sys.stderr)

    rows = run_bench(specs, impls=args.impls, modes=modes, timer=timer, on_row=progress, seed=args.seed, op=args.op)
    print(format_table(rows))
    if args.json:
        path = pathlib.Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(bench_report(rows), indent=1) + "\n")
        if not args.quiet:
            print(f"wrote {path}", file=sys.stderr)
    failed = [row for row in rows if row.impl == "kernelops" and row.ms is None]
    if failed:
        return _fail("bench", f"kernelops failed on {len(failed)} row(s): {failed[0].note}")
    return 0


DEMO_EXAMPLES = """examples:
  kernelops demo
  kernelops demo --seed 3"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernelops", description="kernelops command line",
                                     epilog="Run `kernelops COMMAND --help` for a command's options and examples. "
                                            "Exit codes: 0 ok, 1 failure, 2 usage error.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run flash_attention on random data and check it against float64",
                          description="Run flash_attention on random data and check it against a float64 reference.",
                          epilog=DEMO_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    info = sub.add_parser("info", help="device, versions, ops, cache folder and shipped tuned files",
                          description="Device, versions, autotune policy, the disk cache, the ops with their "
                                      "platforms, and the shipped pre-tuned files that match this device.",
                          epilog=INFO_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    info.set_defaults(func=_info)
    _add_tune(sub)
    _add_bench(sub)
    _add_cache(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
