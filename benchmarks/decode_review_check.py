"""Decode plans where session 31's review found the rules slow (NOTES v61d), beside cuDNN (GPU).

bf16, Sq=1, Hq=32, Hkv=8, the heuristic's tile (``8192 // D`` keys, 4 warps, 3 stages), automatic
splits, each call under CUDA graphs (``do_bench_cudagraph`` median, best of two), plans cleared
between settings, every output checked against SDPA in float32. Settings: ``now`` (the module's
defaults), ``uniform`` (``DECODE_BALANCED`` and ``DECODE_WIDE`` off) and ``v61`` (the rule before the
review: no score cap on the doubled tile, doubled tiles and balanced plans at any key count). The
cases: D=16 (whose doubled tile is 1024 keys), short pairs (64-1000 keys) past two waves, and the
rows v61 measured. Prints one line a case (``results/NVIDIA_H200/decode_review_fixes.txt``).

    python benchmarks/decode_review_check.py
"""
import pathlib
import sys

import torch
import triton.testing as tt

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from decode_splits import cudnn_graph_ms  # noqa: E402

from kernelops.kernels.flash_attention import decode, plans  # noqa: E402

U = 1 << 30
CASES = [(16, 16, 4096), (16, 17, 4096), (16, 40, 4096), (32, 17, 4096), (32, 40, 1000), (64, 40, 300),
         (128, 40, 64), (128, 40, 100), (128, 48, 130), (128, 40, 512), (128, 40, 1024), (128, 40, 2048),
         (128, 17, 4096), (128, 40, 4096)]
for D, B, Sk in CASES:
    q = torch.randn(B, 1, 32, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Sk, 8, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2).float() for t in (q, k, v)),
                                                           enable_gqa=True).transpose(1, 2)
    res = {}
    for name, sets in (("now", {}), ("uniform", dict(DECODE_BALANCED=False, DECODE_WIDE=False)),
                       ("v61", dict(BALANCED_MIN_PAIR_KEYS=0, BALANCED_WIDE_KEYS=0, WIDE_MAX_SCORES=1 << 30))):
        saved = {a: getattr(decode, a) for a in sets}
        for a, b in sets.items():
            setattr(decode, a, b)
        plans._FWD_PLANS.clear()
        fn = lambda: decode.flash_attention_decode(  # noqa: E731, B023
            q, k, v, softmax_scale=D ** -0.5, win_left=U, win_right=U, softcap=None,  # noqa: B023
            kv_blocksize=8192 // D, num_warps=4, num_stages=3)  # noqa: B023
        err = (fn()[0].float() - ref).abs().max().item()
        assert err < 2e-2, (D, B, Sk, name, err)
        res[name] = (min(tt.do_bench_cudagraph(fn, rep=60, return_mode="median") for _ in range(2)) * 1e3,
                     decode.decode_splits(q, k, U, U, 8192 // D, 0, 3)[2:])
        for a, b in saved.items():
            setattr(decode, a, b)
    cu = cudnn_graph_ms(q, k, v) * 1e3
    cols = "  ".join(f"{n} {t:7.1f}us {p}" for n, (t, p) in res.items())
    print(f"D={D:3d} B={B} Sk={Sk:5d} cudnn {cu:7.1f}us {cols}", flush=True)
