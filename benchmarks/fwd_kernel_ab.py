"""Forward kernel time, before/after, on one GPU: run this script once per tree (alternating, so
drift shows up as a spread) and compare the JSON lines.

    python benchmarks/fwd_kernel_ab.py --tree /tmp/old --tag old1 --save /tmp/o >> ab.jsonl
    python benchmarks/fwd_kernel_ab.py --tree .        --tag new1 --against /tmp/o >> ab.jsonl

Rows (medians of triton.testing.do_bench, random inputs):

* ``ws``: the warp-specialised forward launched directly (outputs preallocated), B*S = 16k tokens,
  H*D = 2048, D 64 and 128, causal and full, S in --seqs, each dtype of --dtypes (bf16); cuDNN's forward (SDPA) in the same
  process. ``--save DIR`` writes these outputs, ``--against DIR`` says whether they equal the
  written ones bit for bit. ``--consumers 2 3`` times each count of consumer warpgroups side by
  side (three only at D=64; without it, the kernel's rule picks).
* ``api``: forward calls through ``flash_attention`` (the shipped cache picks the kernel) that run
  the Triton kernels: a 4096-token causal window over 16k tokens, 16 packed documents (16k tokens,
  causal), D=256 causal at 4k (B=4), H=16 (D 128 unless said).

Useful TFLOP/s: 4*B*H*S*S*D for the ws rows (half when causal), 4*H*D*(visible pairs) for the api rows.
A first check prints each ws case's largest error against float64 on a small odd-sized input.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", default=".", help="folder holding the kernelops package to import")
    p.add_argument("--tag", default="new")
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--consumers", type=int, nargs="+", default=None,
                   help="consumer warpgroups per tile to time side by side (D=64 takes 2 or 3; default: the rule)")
    p.add_argument("--dtypes", nargs="+", default=["bf16"], choices=["bf16", "fp16"])
    p.add_argument("--parts", nargs="+", default=["ws", "api"], choices=["ws", "api"])
    p.add_argument("--save", default=None)
    p.add_argument("--against", default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, args.tree)
    import torch

    def emit(**row):
        print(json.dumps(dict(tag=args.tag, **row)), flush=True)

    torch.manual_seed(0)
    if "ws" in args.parts:
        ws_rows(args, emit)
    if "api" in args.parts:
        api_rows(emit)
    return 0


def ws_rows(args, emit):
    import torch
    import torch.nn.functional as F
    import triton.testing as tt
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernelops.kernels.flash_attention import fwd_ws

    def run(q, k, v, causal, out=None, lse=None, consumers=None):
        extra = {} if consumers is None else dict(consumers=consumers)  # trees before the knob have none
        return fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=q.shape[-1] ** -0.5, causal=causal, out=out,
                                             lse=lse, **extra)

    def consumer_counts(D):
        return [None] if args.consumers is None else [c for c in args.consumers if c == 2 or D == 64]

    for D in args.dims:
        for causal in (False, True):
            q, k, v = (torch.randn(2, 384, 3, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
            s = qd @ kd.transpose(-1, -2) * D ** -0.5
            if causal:
                s = s.masked_fill(torch.ones(384, 384, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
            ref = (s.softmax(-1) @ vd).transpose(1, 2)
            for c in consumer_counts(D):
                err = (run(q, k, v, causal, consumers=c)[0].double() - ref).abs().max().item()
                emit(check="small", D=D, causal=causal, consumers=c, err_vs_f64=err)
    for D, S, dt in ((D, S, dt) for D in args.dims for S in args.seqs for dt in args.dtypes):
        H, B = 2048 // D, max(1, 16384 // S)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=dtype) for _ in range(3))
        for causal in (False, True):
            flops = 4 * B * H * S * S * D / (2 if causal else 1)
            out, lse = torch.empty_like(q), torch.empty(B, H, S, device="cuda", dtype=torch.float32)
            for c in consumer_counts(D):
                ms = tt.do_bench(lambda: run(q, k, v, causal, out, lse, c), warmup=50, rep=300)  # noqa: B023
                row = dict(part="ws", dtype=dt, D=D, S=S, B=B, H=H, causal=causal, consumers=c, ms=ms,
                           tflops=flops / ms * 1e-9)
                name = f"o_{dt}_{D}_{S}_{int(causal)}.pt"
                if args.save:
                    torch.save(out.cpu(), f"{args.save}/{name}")
                if args.against:
                    row["bitwise_vs_against"] = bool(torch.equal(torch.load(f"{args.against}/{name}").cuda(), out))
                emit(**row)
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                ms = tt.do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),  # noqa: B023
                                 warmup=50, rep=300)
            emit(part="ws", peer="cudnn", dtype=dt, D=D, S=S, causal=causal, ms=ms, tflops=flops / ms * 1e-9)


def api_rows(emit):
    import torch
    import triton.testing as tt
    from documents import random_documents

    from kernelops import flash_attention

    tokens, H, window = 16384, 16, 4096

    def bench(case, fn, tensors, pairs, D):
        with torch.no_grad():
            ms = tt.do_bench(lambda: fn(*tensors), warmup=25, rep=200)
        emit(part="api", case=case, ms=ms, tflops=4 * H * D * pairs / ms * 1e-9)

    q, k, v = (torch.randn(1, tokens, H, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bench("window4096", lambda a, b, c: flash_attention(a, b, c, causal=True, sliding_window=(window - 1, 0)),
          (q, k, v), sum(min(i + 1, window) for i in range(tokens)), 128)
    gen = torch.Generator().manual_seed(0)
    lens, cu = random_documents(tokens, 16, gen)
    longest = max(lens)
    bench("packed16", lambda a, b, c: flash_attention(a, b, c, causal=True, cum_seqlens_q=cu, cum_seqlens_k=cu,
                                                      max_seqlen_q=longest, max_seqlen_k=longest),
          (q[0], k[0], v[0]), sum(n * (n + 1) // 2 for n in lens), 128)
    q, k, v = (torch.randn(4, 4096, H, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bench("d256_causal4k", lambda a, b, c: flash_attention(a, b, c, causal=True), (q, k, v), 4 * 4096 * 4097 // 2, 256)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
