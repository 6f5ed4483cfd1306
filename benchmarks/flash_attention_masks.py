"""Masked flash_attention cases beside their peers, in one process (issue 3's evidence).

* varlen: random document lengths summing to 16k tokens, causal, H=16, D=128, bf16.
  kernelops packed (cum_seqlens; ``kernelops``: without max_seqlen, so the offsets are read on the
  host at the first call and remembered for the same tensor after; ``kernelops_max_seqlen``: with
  the bounds; ``kernelops_two_offsets``: a copy of the offsets for the keys, which keeps the forward
  on the Triton pointer kernel and the backward on the Triton kernels (until ``fwd_ws.WS_TWO_OFFSETS``
  is on: then the warp-specialised forward), as one tensor for both sides runs the Gluon ones) vs torch SDPA on the right-padded batch (flash and cuDNN
  backends; with causal masking the padding never reaches a real query, so is_causal is exact)
  vs FlexAttention (compiled) with a document + causal block mask on the packed sequence.
* window: one 16k sequence, causal with a 4096-token window, H=16, D=128, bf16: kernelops
  sliding_window vs FlexAttention.
* gqa: one 16k causal sequence, Hq=32, Hkv=8, D=128, bf16: kernelops vs SDPA (cuDNN, flash;
  enable_gqa) vs FlexAttention (enable_gqa).
* window_gqa: the window case with GQA 32/8 heads, vs FlexAttention (enable_gqa).

``--head-dim 256`` runs the same cases at D=256 with the head counts halved (H*D kept: H=8, GQA
16/4), written to ``flash_attention_masks_d256.json``.

TFLOP/s count useful work only: 4 * H * D * (number of visible (query, key) pairs) per forward,
x3.5 for forward+backward. Medians of triton.testing.do_bench on random inputs.

    python benchmarks/flash_attention_masks.py --out benchmarks/results [--cases varlen window gqa window_gqa] [--modes fwdbwd]

Rows are printed, and the JSON rewritten, as each case finishes.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

H, D, TOKENS, WINDOW = 16, 128, 16384, 4096


def set_head_dim(d: int) -> None:
    """Run the cases at head dim ``d`` with H*D kept (H = 16 * 128 / d)."""
    global H, D
    H, D = 16 * 128 // d, d


def timed(fn, args, mode):
    import triton.testing

    if mode == "fwd":
        call = lambda: fn(*args)  # noqa: E731
        grads = None
    else:
        for t in args:
            t.requires_grad_(True)
        out = fn(*args)
        dout = torch.randn_like(out)
        call = lambda: fn(*args).backward(dout)  # noqa: E731
        grads = list(args)
    call()
    return triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median", grad_to_none=grads)


def varlen_case(mode, rows):
    from documents import random_documents
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from kernelops import flash_attention

    gen = torch.Generator().manual_seed(0)
    lens, cu = random_documents(TOKENS, 16, gen)
    pairs = sum(n * (n + 1) // 2 for n in lens)
    flops = 4 * H * D * pairs * (1 if mode == "fwd" else 3.5)
    q, k, v = (torch.randn(TOKENS, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ms = timed(lambda a, b, c: flash_attention(a, b, c, causal=True, cum_seqlens_q=cu, cum_seqlens_k=cu), (q, k, v), mode)
    rows.append({"case": "varlen", "impl": "kernelops", "mode": mode, "ms": ms, "tflops": flops / ms / 1e9})
    cu2 = cu.clone()  # two offsets tensors: the lengths may differ, so the Triton pointer kernel runs
    ms = timed(lambda a, b, c: flash_attention(a, b, c, causal=True, cum_seqlens_q=cu, cum_seqlens_k=cu2), (q, k, v), mode)
    rows.append({"case": "varlen", "impl": "kernelops_two_offsets", "mode": mode, "ms": ms, "tflops": flops / ms / 1e9})
    longest = max(lens)  # with max_seqlen given, no host sync per call
    ms = timed(lambda a, b, c: flash_attention(a, b, c, causal=True, cum_seqlens_q=cu, cum_seqlens_k=cu,
                                               max_seqlen_q=longest, max_seqlen_k=longest), (q, k, v), mode)
    rows.append({"case": "varlen", "impl": "kernelops_max_seqlen", "mode": mode, "ms": ms,
                 "tflops": flops / ms / 1e9})

    n, longest = len(lens), max(lens)
    qp, kp, vp = (torch.randn(n, H, longest, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for name, backend in (("sdpa_flash_padded", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn_padded", SDPBackend.CUDNN_ATTENTION)):
        def run(a, b, c, backend=backend):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=True)
        ms = timed(run, (qp, kp, vp), mode)
        rows.append({"case": "varlen", "impl": name, "mode": mode, "ms": ms, "tflops": flops / ms / 1e9})

    torch._dynamo.reset()
    doc = torch.repeat_interleave(torch.arange(n, device="cuda"), torch.tensor(lens, device="cuda"))
    mask = create_block_mask(lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j), 1, None, TOKENS, TOKENS)
    flex = torch.compile(flex_attention)
    qf, kf, vf = (t.transpose(0, 1)[None].contiguous() for t in (q, k, v))  # [1, H, S, D]
    ms = timed(lambda a, b, c: flex(a, b, c, block_mask=mask), (qf, kf, vf), mode)
    rows.append({"case": "varlen", "impl": "flex_document_mask", "mode": mode, "ms": ms, "tflops": flops / ms / 1e9})


def window_case(mode, rows, hq=None, hkv=None):
    """One 16k causal sequence with a 4096-key window, H heads (or GQA ``hq``/``hkv``): kernelops vs
    Flex (enable_gqa when grouped)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from kernelops import flash_attention

    hq, hkv = hq or H, hkv or H
    case = "window4096" + ("" if hq == hkv else f"_gqa{hq}/{hkv}")
    pairs = sum(min(i + 1, WINDOW) for i in range(TOKENS))
    flops = 4 * hq * D * pairs * (1 if mode == "fwd" else 3.5)
    q = torch.randn(1, TOKENS, hq, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, TOKENS, hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = timed(lambda a, b, c: flash_attention(a, b, c, causal=True, sliding_window=(WINDOW - 1, 0)), (q, k, v), mode)
    rows.append({"case": case, "impl": "kernelops", "mode": mode, "ms": ms, "tflops": flops / ms / 1e9})
    torch._dynamo.reset()
    mask = create_block_mask(lambda b, h, i, j: (i >= j) & (i - j < WINDOW), 1, None, TOKENS, TOKENS)
    flex = torch.compile(flex_attention)
    qf, kf, vf = (t.detach().transpose(1, 2).contiguous() for t in (q, k, v))
    ms = timed(lambda a, b, c: flex(a, b, c, block_mask=mask, enable_gqa=hq != hkv), (qf, kf, vf), mode)
    rows.append({"case": case, "impl": "flex", "mode": mode, "ms": ms, "tflops": flops / ms / 1e9})


def gqa_case(mode, rows, hq=None, hkv=None):
    """One 16k causal sequence, GQA 32/8 at D=128 (``2 * H`` / ``H / 2`` heads): kernelops vs cuDNN
    SDPA (enable_gqa) vs Flex (enable_gqa)."""
    hq, hkv = hq or 2 * H, hkv or H // 2
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from kernelops import flash_attention

    flops = 4 * hq * D * TOKENS * (TOKENS + 1) // 2 * (1 if mode == "fwd" else 3.5)
    q = torch.randn(1, TOKENS, hq, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, TOKENS, hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = timed(lambda a, b, c: flash_attention(a, b, c, causal=True), (q, k, v), mode)
    rows.append({"case": f"gqa{hq}/{hkv}", "impl": "kernelops", "mode": mode, "ms": ms, "tflops": flops / ms / 1e9})
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        def run(a, b, c, backend=backend):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True)
        try:
            ms = timed(run, (qt.detach(), kt.detach(), vt.detach()), mode)
            rows.append({"case": f"gqa{hq}/{hkv}", "impl": name, "mode": mode, "ms": ms, "tflops": flops / ms / 1e9})
        except Exception as exc:  # noqa: BLE001 - a backend that cannot take GQA is reported, not fatal
            rows.append({"case": f"gqa{hq}/{hkv}", "impl": name, "mode": mode, "error": f"{type(exc).__name__}: {exc}"[:200]})
    torch._dynamo.reset()
    mask = create_block_mask(lambda b, h, i, j: i >= j, 1, None, TOKENS, TOKENS)
    flex = torch.compile(flex_attention)
    ms = timed(lambda a, b, c: flex(a, b, c, block_mask=mask, enable_gqa=True), (qt.detach(), kt.detach(), vt.detach()),
               mode)
    rows.append({"case": f"gqa{hq}/{hkv}", "impl": "flex", "mode": mode, "ms": ms, "tflops": flops / ms / 1e9})


CASES = {"varlen": varlen_case, "window": window_case, "gqa": gqa_case,
         "window_gqa": lambda mode, rows: window_case(mode, rows, 2 * H, H // 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--modes", nargs="+", choices=["fwd", "fwdbwd"], default=["fwd", "fwdbwd"])
    p.add_argument("--head-dim", type=int, choices=[64, 128, 256], default=128)
    args = p.parse_args(argv)
    set_head_dim(args.head_dim)
    import triton

    from kernelops.ops.device import device_info

    dev = device_info("cuda")
    out = pathlib.Path(args.out) / dev.name
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in args.modes:
        for name in args.cases:
            done = len(rows)
            try:
                CASES[name](mode, rows)
            except Exception as exc:  # noqa: BLE001 - report and go on
                rows.append({"case": name, "mode": mode, "error": f"{type(exc).__name__}: {exc}"[:300]})
            for r in rows[done:]:  # as each case finishes, so a run cut short still reports
                print(f"{r.get('case'):11s} {r.get('mode'):7s} {r.get('impl', ''):20s} "
                      + (f"{r['ms']:8.3f} ms {r['tflops']:7.1f} TFLOP/s (useful)" if "tflops" in r else r["error"]),
                      flush=True)
            # a subset of the cases gets its own file, so it never replaces a whole run's
            subset = "" if set(args.cases) == set(CASES) else "_" + "_".join(args.cases)
            fname = "flash_attention_masks" + ("" if D == 128 else f"_d{D}") + subset + ".json"
            (out / fname).write_text(json.dumps(
                {"device": dev.name, "torch": torch.__version__, "triton": triton.__version__, "head_dim": D,
                 "rows": rows},
                indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
