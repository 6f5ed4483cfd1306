"""The first call in a fresh process: forward and backward, with a cold and a warm Triton cache.

What a new user waits for before the first step runs. Each case is a fresh Python subprocess
that imports torch and kernelops, makes its inputs (GQA 32/8, B=1, S=4096, D=128, bf16, causal;
the CUDA context is created before any timing), then times the first forward and the first
backward (``out.backward(dout)``, synchronised), and the second of each for scale. Cases:

- ``kernelops``, cold: an empty Triton cache (``TRITON_CACHE_DIR``) and an empty kernelops disk
  cache (``KERNELOPS_CACHE_DIR``), so every kernel the call needs is compiled;
- ``kernelops``, warm: a second process on the caches the cold one left;
- ``sdpa_cudnn``, cold and warm, the same way (cuDNN compiles no Triton kernels; its first call
  still pays its own plan building).

Each child also reports how long ``import torch`` and then ``import kernelops`` took, and which
selector answered the call's config (``executor.explain``: ``pretuned`` where a shipped cache
covers this GPU). The autotune policy is the user's (``KERNELOPS_AUTOTUNE``, default ``auto``).

    python -m benchmarks first_call [--repeats 3]
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import harness as H  # noqa: E402

KIND = "machinery"
OP = "first_call"
SHAPE = {"B": 1, "S": 4096, "Hq": 32, "Hkv": 8, "D": 128, "dtype": "bf16", "causal": True}
IMPLS = ("kernelops", "sdpa_cudnn")
MARK = "FIRST_CALL_RESULT "


def child(impl: str) -> int:
    """Runs in the fresh process: prints one ``MARK``-prefixed JSON line."""
    start = time.perf_counter()
    import torch

    torch_s = time.perf_counter() - start
    start = time.perf_counter()
    import kernelops

    kernelops_s = time.perf_counter() - start
    B, S, hq, hkv, D = (SHAPE[k] for k in ("B", "S", "Hq", "Hkv", "D"))
    layout = (lambda h: (B, S, h, D)) if impl == "kernelops" else (lambda h: (B, h, S, D))
    q = torch.randn(layout(hq), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(layout(hkv), device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    dout = torch.randn(layout(hq), device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    if impl == "kernelops":
        def fn():
            return kernelops.flash_attention(q, k, v, causal=True)
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention

        def fn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def timed(step):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        result = step()
        torch.cuda.synchronize()
        return time.perf_counter() - begin, result

    row = {"import_torch_s": torch_s, "import_kernelops_s": kernelops_s}
    row["first_fwd_s"], out = timed(fn)
    row["first_bwd_s"], _ = timed(lambda: out.backward(dout))
    q.grad = k.grad = v.grad = None
    row["second_fwd_s"], out = timed(fn)
    row["second_bwd_s"], _ = timed(lambda: out.backward(dout))
    if impl == "kernelops":
        try:
            from benchmarks.dispatch_overhead import operation
            from kernelops.ops import default_executor

            explained = default_executor().explain(operation("flash_attention"), query=q, key=k, value=v,
                                                   causal=True)
            row["source"] = getattr(explained, "selector", None) or str(explained).splitlines()[0]
        except Exception as exc:  # noqa: BLE001 - the figure stands without it
            row["source"] = f"? ({H.error_text(exc)})"
    print(MARK + json.dumps(row), flush=True)
    return 0


def spawn(impl: str, env: dict, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.first_call", "--child", impl]
    done = subprocess.run(cmd, cwd=H.ROOT.parent, env=env, capture_output=True, text=True, timeout=timeout)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    raise RuntimeError(f"child {impl} exited {done.returncode}: " + " | ".join(tail))


def main(argv=None) -> int:
    p = H.parser(__doc__, OP)
    p.add_argument("--repeats", type=int, default=1, help="fresh cold/warm pairs per implementation (medians)")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--timeout", type=float, default=900, help="seconds per child process")
    p.add_argument("--child", choices=IMPLS, help=argparse_hidden())
    args = p.parse_args(argv)
    if args.child:
        return child(args.child)
    if (code := H.require_cuda()):
        return code
    results = H.Results.open(OP, args.out)
    results.start_run(H.metadata(), repeats=args.repeats)
    print(f"{H.run_title(results.data['runs'][results.run])} -> {results.path}")
    for impl in args.impls:
        measured = {"cold": [], "warm": []}
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="first_call_") as tmp:
                env = {**os.environ, "TRITON_CACHE_DIR": os.path.join(tmp, "triton"),
                       "KERNELOPS_CACHE_DIR": os.path.join(tmp, "kernelops")}
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(H.ROOT.parent), env.get("PYTHONPATH")]))
                for cache in ("cold", "warm"):  # the warm process runs on what the cold one compiled
                    try:
                        measured[cache].append(spawn(impl, env, args.timeout))
                    except Exception as exc:  # noqa: BLE001 - reported, not fatal
                        measured[cache].append({"error": H.error_text(exc)})
        for cache, runs in measured.items():
            row = {"case": "first_call", "impl": impl, "cache": cache, **SHAPE}
            good = [r for r in runs if "error" not in r]
            if good:
                for name in good[0]:
                    values = [r[name] for r in good if isinstance(r.get(name), (int, float))]
                    row[name] = statistics.median(values) if values else good[0][name]
            else:
                row["error"] = runs[0]["error"]
            results.add(row)
            print(f"{impl:11s} {cache:5s} " + (
                f"forward {row['first_fwd_s']:6.2f} s  backward {row['first_bwd_s']:6.2f} s  (then "
                f"{row['second_fwd_s'] * 1e3:.1f} / {row['second_bwd_s'] * 1e3:.1f} ms)  import torch "
                f"{row['import_torch_s']:.2f} s, kernelops +{row['import_kernelops_s']:.2f} s"
                + (f"  config: {row['source']}" if "source" in row else "") if "error" not in row else row["error"]),
                flush=True)
    rows = {(r["impl"], r["cache"]): r for r in results.this_run()}
    body = []
    for cache in ("cold", "warm"):
        ko, cu = rows.get(("kernelops", cache), {}), rows.get(("sdpa_cudnn", cache), {})
        body.append([cache, ko.get("first_fwd_s"), ko.get("first_bwd_s"), cu.get("first_fwd_s"), cu.get("first_bwd_s")])
    print("\nfirst call, seconds (GQA 32/8, S=4096, D=128, bf16, causal):")
    print(H.table(["Triton cache", "kernelops forward", "kernelops backward", "cuDNN forward", "cuDNN backward"],
                  [[c if isinstance(c, str) else "-" if c is None else f"{c:.2f}" for c in r] for r in body]))
    return 0


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    sys.exit(main())
