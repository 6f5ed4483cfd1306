"""flash_attention beside torch SDPA (flash, cuDNN, efficient backends), in one process.

bf16 and fp16, B*S = 16k tokens (B = 1 beyond), H*D = 2048, D in {64, 128, 256}, causal and not,
S from 512 to 32k, forward and forward+backward. FLOPs: 4*B*H*S*S*D per forward (half when causal); forward+backward counts 3.5x
the forward. Times are triton.testing.do_bench medians on fresh random inputs (never zeros).
Each implementation gets its native layout: kernelops BSHD, SDPA BHSD (both contiguous).

    python benchmarks/flash_attention.py --out benchmarks/results [--autotune] [--dims 64 128] [--dtypes bf16]

Writes ``<out>/<DEVICE>/flash_attention.partial.json`` after every row (a run cut short keeps
what it measured there) and replaces ``flash_attention.json`` with it at the end, then prints the
ratio table. ``--merge`` starts from the file's rows and replaces each only when this run
re-measures it, so a grid too long for one sitting can be measured in parts (e.g. per dtype);
every row names its run (``runs``: date, versions and matmul ceiling), and ratios are only taken
between rows of one shape, which one run measures back to back.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def impls():
    from torch.nn.attention import SDPBackend

    from kernelops import flash_attention

    return {
        "kernelops": ("bshd", lambda q, k, v, causal: flash_attention(q, k, v, causal=causal)),
        "sdpa_flash": ("bhsd", _sdpa(SDPBackend.FLASH_ATTENTION)),
        "sdpa_cudnn": ("bhsd", _sdpa(SDPBackend.CUDNN_ATTENTION)),
        "sdpa_efficient": ("bhsd", _sdpa(SDPBackend.EFFICIENT_ATTENTION)),
    }


def matmul_ceiling() -> float:
    """Measured bf16 matmul TFLOP/s (8192^3) on random data: the device's arithmetic ceiling."""
    import triton.testing

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    return 2 * 8192 ** 3 / ms / 1e9


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def row_call(layout, fn, D, causal, S, mode, dtype="bf16"):
    """One row's call on fresh random inputs: ``(call, FLOPs, B, H, grads)``, where ``grads`` are the
    tensors whose ``.grad`` a timer resets between fwd+bwd calls (None for the forward)."""
    B, H = max(1, 16384 // S), 2048 // D
    shape = (B, S, H, D) if layout == "bshd" else (B, H, S, D)
    q, k, v = (torch.randn(shape, device="cuda", dtype=DTYPES[dtype]) for _ in range(3))
    flops = 4 * B * H * S * S * D / (2 if causal else 1)
    if mode == "fwd":
        return (lambda: fn(q, k, v, causal)), flops, B, H, None
    for t in (q, k, v):
        t.requires_grad_(True)
    do = torch.randn(shape, device="cuda", dtype=DTYPES[dtype])
    return (lambda: fn(q, k, v, causal).backward(do)), flops * 3.5, B, H, [q, k, v]


def bench_row(name, layout, fn, D, causal, S, mode, dtype="bf16"):
    import triton.testing

    call, flops, B, H, grads = row_call(layout, fn, D, causal, S, mode, dtype)
    try:
        call()  # warm-up: compilation / tuning outside the timing
        ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median", grad_to_none=grads)
        return {"impl": name, "dtype": dtype, "D": D, "causal": causal, "S": S, "B": B, "H": H, "mode": mode,
                "ms": ms, "tflops": flops / ms / 1e9}
    except Exception as exc:  # noqa: BLE001 - a backend that cannot run the shape is reported, not fatal
        return {"impl": name, "dtype": dtype, "D": D, "causal": causal, "S": S, "B": B, "H": H, "mode": mode,
                "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--seqs", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384, 32768])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwdbwd"])
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=list(DTYPES))
    p.add_argument("--impls", nargs="+", default=["kernelops", "sdpa_flash", "sdpa_cudnn"])
    p.add_argument("--autotune", action="store_true", help="let kernelops tune each key (else: heuristic/caches)")
    p.add_argument("--merge", action="store_true",
                   help="start from the existing file; a row is replaced only when re-measured")
    p.add_argument("--report", metavar="JSON",
                   help="no GPU: write the ratio table (.txt) and the bf16 markdown rows (.md) of a results file")
    args = p.parse_args(argv)
    if args.report:
        return report(pathlib.Path(args.report))
    os.environ["KERNELOPS_AUTOTUNE"] = "auto" if args.autotune else os.environ.get("KERNELOPS_AUTOTUNE", "never")

    import triton

    from kernelops.ops.device import device_info

    dev = device_info("cuda")
    out = pathlib.Path(args.out) / dev.name
    out.mkdir(parents=True, exist_ok=True)
    path = out / "flash_attention.json"
    shapes = {(dtype, mode, D, causal, S) for dtype in args.dtypes for mode in args.modes for D in args.dims
              for causal in (False, True) for S in args.seqs}
    result = _merged_start(path) if args.merge else {"runs": [], "rows": []}
    partial = path.with_suffix(".partial.json")  # rows so far; the file itself is replaced at the end
    run = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "triton": triton.__version__, "autotune": args.autotune,
           "matmul_bf16_tflops": matmul_ceiling()}
    result.update(device=dev.name, capability=dev.capability, **run)  # the latest run's, at the top level
    result["runs"].append(run)
    run_id = len(result["runs"]) - 1
    table = impls()
    for dtype, mode, D, causal, S in sorted(shapes, key=lambda t: (args.dtypes.index(t[0]), args.modes.index(t[1]),
                                                                    t[2], t[3], t[4])):
        for name in args.impls:
            layout, fn = table[name]
            r = {**bench_row(name, layout, fn, D, causal, S, mode, dtype), "run": run_id}
            same = (dtype, mode, D, causal, S, name)  # an old row goes only when it is re-measured
            result["rows"] = [x for x in result["rows"] if _row_id(x) != same] + [r]
            print(f"{dtype} {mode:7s} D={D:3d} causal={int(causal)} S={S:6d} {name:15s} "
                  + (f"{r['tflops']:7.1f} TFLOP/s" if "tflops" in r else r["error"]), flush=True)
            partial.write_text(json.dumps(result, indent=1))
    os.replace(partial, path)
    print_ratio_table(result)
    return 0


def _row_id(row: dict) -> tuple:
    return row.get("dtype", "bf16"), row["mode"], row["D"], row["causal"], row["S"], row["impl"]


def _merged_start(path: pathlib.Path) -> dict:
    """The existing file's runs and rows (rows of older files, without a run, get run 0: the
    file's top-level metadata); each is replaced only when this run re-measures it."""
    if not path.exists():
        return {"runs": [], "rows": []}
    old = json.loads(path.read_text())
    runs = old.get("runs") or [{name: old.get(name) for name in ("created", "torch", "triton", "autotune",
                                                                 "matmul_bf16_tflops")}]
    return {"runs": runs, "rows": [{"run": 0, **r} for r in old["rows"]]}


def _measured(result) -> tuple[dict, dict]:
    """``{(impl, dtype, mode, D, causal, S): TFLOP/s}`` and ``{(dtype, mode, D, causal, S): run}`` of
    kernelops' rows."""
    rows = [r for r in result["rows"] if "tflops" in r]
    get = {(r["impl"], r.get("dtype", "bf16"), r["mode"], r["D"], r["causal"], r["S"]): r["tflops"] for r in rows}
    run_of = {(r.get("dtype", "bf16"), r["mode"], r["D"], r["causal"], r["S"]): r.get("run", 0) for r in rows
              if r["impl"] == "kernelops"}
    return get, run_of


def report(path: pathlib.Path) -> int:
    """``<stem>.txt`` (the ratio table) and ``<stem>.md`` (bf16 rows as markdown, for
    docs/benchmarks.md; fp16 rows, if any, in a second table under an ``fp16`` line) beside a
    results file ``<stem>.json``."""
    import contextlib
    import io

    result = json.loads(path.read_text())
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        print_ratio_table(result)
    path.with_suffix(".txt").write_text(text.getvalue())
    get, run_of = _measured(result)
    lines = []
    for want in ("bf16", "fp16"):
        rows = [(key, run) for key, run in run_of.items() if key[0] == want]
        if not rows:
            continue
        if lines:
            lines += ["", want, ""]
        lines += ["| mode | D | causal | S | kernelops | SDPA flash | SDPA cuDNN | vs flash | vs cuDNN | run |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for (dtype, mode, D, causal, S), run in sorted(rows, key=lambda kv: (kv[0][1] != "fwd", *kv[0][2:])):
            tf = get[("kernelops", dtype, mode, D, causal, S)]
            fl, cu = (get.get((n, dtype, mode, D, causal, S)) for n in ("sdpa_flash", "sdpa_cudnn"))
            cells = [f"{x:.0f}" if x else "-" for x in (tf, fl, cu)] + [f"{tf / x:.2f}x" if x else "-" for x in (fl, cu)]
            size = f"{S // 1024}k" if S >= 1024 else str(S)
            lines.append(f"| {'fwd' if mode == 'fwd' else 'fwd+bwd'} | {D} | {'yes' if causal else 'no'} | {size} | "
                         + " | ".join(cells) + f" | {run} |")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(text.getvalue())
    return 0


def print_ratio_table(result) -> None:
    get, run_of = _measured(result)
    print(f"\n{result['device']} torch {result['torch']} triton {result['triton']}; "
          f"bf16 matmul ceiling {result['matmul_bf16_tflops']:.0f} TFLOP/s")
    for i, run in enumerate(result.get("runs", [])):  # each row's ratios come from one run
        print(f"run {i}: {run['created']} torch {run['torch']} triton {run['triton']}, matmul ceiling "
              f"{run['matmul_bf16_tflops']:.0f} TFLOP/s")
    print("dtype mode    D   causal S      kernelops  flash   cudnn  | x flash  x best-sdpa  run")
    for (impl, *rest), tf in sorted(get.items(), key=lambda kv: kv[0][1:]):
        if impl != "kernelops":
            continue
        dtype, mode, D, causal, S = rest
        peers = {n: get.get((n, *rest)) for n in ("sdpa_flash", "sdpa_cudnn")}
        best = max((x for x in peers.values() if x), default=None)
        fl = peers["sdpa_flash"]
        cells = " ".join(f"{x:7.1f}" if x else "     - " for x in peers.values())
        print(f"{dtype:5s} {mode:7s} {D:3d} {int(causal):5d}  {S:6d} {tf:9.1f} {cells} | "
              f"{tf / fl if fl else float('nan'):6.2f}   {tf / best if best else float('nan'):6.2f}"
              f"       {run_of[tuple(rest)]}")


if __name__ == "__main__":
    sys.exit(main())
