"""Decode-shaped flash_attention (few queries, long K/V, GQA) beside torch SDPA, in one process.

bf16, Hq=32, Hkv=8, D=128, not causal (every query sees every key: the same semantics in all
implementations), Sq in {1, 4, 16}, Sk in {4k, 32k, 128k}, B in {1, 8}. The figure of merit is
K/V read bandwidth: bytes of K and V (read once) / time, in TB/s, against the device-to-device
copy measured in the same run (read + write bytes / time).

Rows: kernelops (split-KV decode kernel, the default for Sq <= 16), kernelops_general (the same
with the launchers' per-signature plans off, ``plans.ENABLED``: the host path before v56),
kernelops_dense (the dense forward launcher on the same call, for the split-KV speed-up), SDPA cuDNN and flash with
enable_gqa (when a backend refuses GQA it is retried on K/V expanded to Hq heads, and still
credited with the unexpanded bytes, i.e. the bytes a user's cache holds). Rows ending in
``_graph`` time the same call captured in a CUDA graph (``triton.testing.do_bench_cudagraph``), as
a serving loop runs it: GPU time without the host's launch cost, which dominates short calls.
Eager rows also record ``host_us``: the time to issue one call while a spin kernel holds the GPU
(``host_time.host_us``).

    python benchmarks/flash_attention_decode.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

HQ, HKV, D = 32, 8, 128
GRAPHED = ("kernelops", "sdpa_cudnn")  # also timed inside a CUDA graph


def copy_ceiling() -> float:
    """Device-to-device copy of 2 GiB, TB/s counting read plus write."""
    import triton.testing

    a = torch.randn(2 ** 30, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=25, rep=200, return_mode="median")
    return 2 * a.numel() * 2 / ms / 1e9


def sdpa(backend):
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    def run(q, k, v):
        with sdpa_kernel(backend):
            try:
                return scaled_dot_product_attention(q, k, v, enable_gqa=True)
            except RuntimeError:
                group = q.shape[1] // k.shape[1]
                return scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))

    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--queries", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--keys", type=int, nargs="+", default=[4096, 32768, 131072])
    args = p.parse_args(argv)
    import os

    os.environ.setdefault("KERNELOPS_AUTOTUNE", "never")
    import triton
    import triton.testing
    from torch.nn.attention import SDPBackend

    from kernelops import flash_attention
    from kernelops.kernels.flash_attention.fwd import flash_attention_fwd
    from kernelops.ops.device import device_info

    from host_time import host_us

    from kernelops.kernels.flash_attention import plans

    def unplanned(q, k, v):  # the launcher's general path: no per-signature plan (plans.decode_plan)
        plans.ENABLED = False
        try:
            return flash_attention(q, k, v)
        finally:
            plans.ENABLED = True

    dev = device_info("cuda")
    ceiling = copy_ceiling()
    peers = {"sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION)}
    rows = []
    for B in args.batches:
        for Sk in args.keys:
            for Sq in args.queries:
                q = torch.randn(B, Sq, HQ, D, device="cuda", dtype=torch.bfloat16)
                k, v = (torch.randn(B, Sk, HKV, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                kv_bytes = 2 * k.numel() * k.element_size()
                calls = {
                    "kernelops": lambda: flash_attention(q, k, v),
                    "kernelops_general": lambda: unplanned(q, k, v),
                    "kernelops_dense": lambda: flash_attention_fwd(
                        q, k, v, softmax_scale=D ** -0.5, win_left=1 << 30, win_right=1 << 30, softcap=None,
                        q_blocksize=16, kv_blocksize=128, num_warps=4, num_stages=3),
                }
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
                for name, fn in peers.items():
                    calls[name] = lambda fn=fn: fn(qt, kt, vt)
                for name in GRAPHED:
                    calls[name + "_graph"] = calls[name]
                for name, call in calls.items():
                    row = {"impl": name, "B": B, "Sq": Sq, "Sk": Sk, "Hq": HQ, "Hkv": HKV, "D": D}
                    try:
                        call()
                        if name.endswith("_graph"):
                            ms = triton.testing.do_bench_cudagraph(call, rep=100, return_mode="median")
                        else:
                            ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
                        row.update(ms=ms, tbps=kv_bytes / ms / 1e9)
                        if not name.endswith("_graph"):  # issuing one call with the GPU held busy
                            row["host_us"] = host_us(call)
                    except Exception as exc:  # noqa: BLE001 - reported, not fatal
                        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                    rows.append(row)
                    print(f"B={B} Sq={Sq:2d} Sk={Sk:6d} {name:16s} "
                          + (f"{row['ms'] * 1e3:8.1f} us {row['tbps']:5.2f} TB/s host {row.get('host_us', 0):6.1f} us"
                             if "ms" in row else row["error"]),
                          flush=True)
    result = {"device": dev.name, "torch": torch.__version__, "triton": triton.__version__,
              "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "copy_tbps": ceiling, "rows": rows}
    out = pathlib.Path(args.out) / dev.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "flash_attention_decode.json").write_text(json.dumps(result, indent=1))
    print(f"\n{dev.name} torch {torch.__version__} triton {triton.__version__}; copy {ceiling:.2f} TB/s (read+write)")
    get = {(r["impl"], r["B"], r["Sq"], r["Sk"]): r.get("tbps") for r in rows}
    host = {(r["impl"], r["B"], r["Sq"], r["Sk"]): r.get("host_us") for r in rows}
    names = ("kernelops", "kernelops_general", "kernelops_dense", "sdpa_cudnn", "sdpa_flash", "kernelops_graph",
             "sdpa_cudnn_graph")
    print("TB/s:                    eager                          graphs     | x cudnn        | host us")
    print("B  Sq  Sk      kernelops general dense  cudnn  flash  ko_gr  cu_gr | eager  graphs  | ko  general cudnn")
    for B in args.batches:
        for Sk in args.keys:
            for Sq in args.queries:
                cells = [get.get((n, B, Sq, Sk)) for n in names]
                ko, _, _, cudnn, _, ko_graph, cudnn_graph = cells
                text = " ".join(f"{x:6.2f}" if x else "    - " for x in cells)
                ratio = lambda a, b: f"{a / b:6.2f}" if a and b else "    - "  # noqa: E731
                us = " ".join(f"{host.get((n, B, Sq, Sk)) or 0:5.1f}" for n in ("kernelops", "kernelops_general",
                                                                                "sdpa_cudnn"))
                print(f"{B:<2d} {Sq:<3d} {Sk:<7d} {text} | {ratio(ko, cudnn)} {ratio(ko_graph, cudnn_graph)} | {us}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
