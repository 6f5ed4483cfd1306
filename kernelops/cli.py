"""The ``kernelops`` command: ``demo`` and ``info`` (tune/bench/cache come with later issues)."""

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernelops", description="kernelops command line")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run flash_attention on random data and check it against float64")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    info = sub.add_parser("info", help="device, versions, cache folder and shipped tuned files")
    info.set_defaults(func=_info)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
