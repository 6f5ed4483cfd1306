"""flash_attention_fp8 (e4m3 forward) beside the bf16 forward and cuDNN SDPA (bf16).

Accuracy first, on random data quantised per tensor (``x8 = (x / s).to(e4m3)``, ``s = max|x| / 448``,
``s`` passed as the descale): the relative error of the public ``flash_attention_fp8`` against
float64 attention on the dequantised inputs, beside the error of an emulation that only rounds P
to e4m3 the way the kernel does (P scaled by 2^8; the error the method itself costs), and against
float64 on the unquantised inputs.

Then speed: B*S = 16k tokens, H*D = 2048, D = 128 (``--dims``), causal and not, S = 1k..16k,
forward only. FLOPs ``4*B*H*S*S*D``, half when causal. Rows: ``kernelops_fp8`` (e4m3 inputs),
``kernelops`` (bf16) and ``sdpa_cudnn`` (bf16, BHSD).

    python -m benchmarks flash_attention_fp8 [--quick] [--dims 64 128 256] [--seqs 1024 16384]
"""

from __future__ import annotations

import pathlib
import sys

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import harness as H  # noqa: E402

KIND = "op"
OP = "flash_attention_fp8"
TOKENS, WIDTH = 16384, 2048


def quantize(t):
    """Per-tensor e4m3: ``(t / s).to(float8_e4m3fn), s`` with ``s = max|t| / 448``."""
    import torch

    scale = max(t.abs().max().item() / 448.0, 1e-12)
    return (t / scale).to(torch.float8_e4m3fn), scale


def accuracy(D: int, causal: bool) -> dict:
    """Relative errors (Frobenius) of one e4m3 call, ``[2, 1000, 4, D]``."""
    import torch

    from kernelops import flash_attention_fp8

    q, k, v = (torch.randn(2, 1000, 4, D, device="cuda") for _ in range(3))
    (q8, sq), (k8, sk), (v8, sv) = quantize(q), quantize(k), quantize(v)
    out = flash_attention_fp8(q8, k8, v8, q_descale=sq, k_descale=sk, v_descale=sv, causal=causal)
    qd, kd, vd = ((t8.double() * s).transpose(1, 2) for t8, s in ((q8, sq), (k8, sk), (v8, sv)))
    hide = torch.ones(1000, 1000, device="cuda", dtype=torch.bool).triu(1)

    def scores(a, b):
        s = a @ b.mT * D ** -0.5
        return s.masked_fill(hide, float("-inf")) if causal else s

    p = torch.exp((s := scores(qd, kd)) - s.amax(-1, keepdim=True))
    ref = (p @ vd) / p.sum(-1, keepdim=True)
    p8 = (p * 256).to(torch.float8_e4m3fn).double() / 256  # P rounded as the kernel rounds it
    emulated = (p8 @ vd) / p.sum(-1, keepdim=True)
    qr, kr, vr = (t.double().transpose(1, 2) for t in (q, k, v))
    real = torch.softmax(scores(qr, kr), -1) @ vr
    got = out.double().transpose(1, 2)
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    return {"case": "accuracy", "D": D, "causal": causal, "impl": "kernelops_fp8",
            "vs_dequantised_err": rel(got, ref), "p_rounding_alone_err": rel(emulated, ref),
            "vs_unquantised_err": rel(got, real)}


def main(argv=None) -> int:
    p = H.parser(__doc__, OP)
    p.add_argument("--dims", type=int, nargs="+", default=[128], help="head dims (64, 128, 256)")
    p.add_argument("--seqs", type=int, nargs="+", help="sequence lengths (default 1k..16k)")
    p.add_argument("--autotune", action="store_true", help="let kernelops tune each new key (default: never)")
    args = p.parse_args(argv)
    if (code := H.require_cuda()):
        return code
    H.set_autotune_policy(args.autotune)
    import torch

    from kernelops import flash_attention, flash_attention_fp8

    seqs = args.seqs or ([1024, 4096] if args.quick else [1024, 2048, 4096, 8192, 16384])
    results = H.Results.open(OP, args.out)
    results.start_run(H.metadata(), **H.ceilings(), autotune=args.autotune, quick=args.quick)
    run = results.data["runs"][results.run]
    print(f"{H.run_title(run)}; bf16 matmul {run['matmul_bf16_tflops']:.0f} TFLOP/s -> {results.path}")
    for D in args.dims:
        for causal in (False, True):
            try:
                row = results.add(accuracy(D, causal))
                print(f"accuracy D={D} causal={int(causal)}: vs float64 on the dequantised inputs "
                      f"{row['vs_dequantised_err']:.2e} (P rounding alone {row['p_rounding_alone_err']:.2e}), "
                      f"vs the unquantised inputs {row['vs_unquantised_err']:.2e}", flush=True)
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                results.add({"case": "accuracy", "D": D, "causal": causal, "impl": "kernelops_fp8",
                             "error": H.error_text(exc)})
                print(f"accuracy D={D} causal={int(causal)}: {H.error_text(exc)}", flush=True)
    for D in args.dims:
        for causal in (False, True):
            for S in seqs:
                B, heads = max(1, TOKENS // S), WIDTH // D
                q, k, v = (torch.randn(B, S, heads, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                (q8, sq), (k8, sk), (v8, sv) = quantize(q), quantize(k), quantize(v)
                qt, kt, vt = (H.bhsd(t) for t in (q, k, v))
                flops = H.attention_flops(B, heads, S, S, D, causal=causal)
                cudnn = H.sdpa("sdpa_cudnn", causal=causal)
                calls = {
                    "kernelops_fp8": lambda: flash_attention_fp8(q8, k8, v8, q_descale=sq, k_descale=sk,  # noqa: B023
                                                                 v_descale=sv, causal=causal),  # noqa: B023
                    "kernelops": lambda: flash_attention(q, k, v, causal=causal),  # noqa: B023
                    "sdpa_cudnn": lambda: cudnn(qt, kt, vt),  # noqa: B023
                }
                for impl, call in calls.items():
                    row = {"case": "forward", "impl": impl, "D": D, "causal": causal, "S": S, "B": B, "H": heads}
                    try:
                        with torch.no_grad():
                            ms = H.bench(call)
                        row.update(ms=ms, tflops=H.tflops(flops, ms))
                    except Exception as exc:  # noqa: BLE001 - reported, not fatal
                        row["error"] = H.error_text(exc)
                    results.add(row)
                    print(f"D={D} causal={int(causal)} S={S:6d} {impl:14s} "
                          + (f"{row['ms']:8.4f} ms {row['tflops']:7.1f} TFLOP/s" if "ms" in row else row["error"]),
                          flush=True)
    forward = [r for r in results.this_run() if r.get("case") == "forward"]
    print("\nkernelops_fp8's TFLOP/s and its speed-up over the bf16 forwards of the same run:")
    print(H.comparison_table(forward, ours="kernelops_fp8", peers=["kernelops", "sdpa_cudnn"]))
    if not args.no_plot:
        H.plot(results.path.with_suffix(".png"), [r for r in results.rows if r.get("case") == "forward"],
               panel=lambda r: (r["D"], r["causal"]), x="S", y="tflops",
               title=lambda k: f"D={k[0]} {'causal' if k[1] else 'full'}", xlabel="sequence length",
               ylabel="TFLOP/s", ceiling=run.get("matmul_bf16_tflops"),
               suptitle=f"flash_attention_fp8, {H.run_title(run)} (dashed: bf16 matmul)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
