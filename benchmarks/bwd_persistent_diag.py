"""Persistent fused backward diagnostics: per-block loop cost vs schedule (one-off)."""
import json, sys
import torch, triton.testing
from kernelops import flash_attention
from kernelops.kernels.flash_attention import bwd_fused

rows = []
for causal, S in ((True, 512), (True, 2048), (False, 1024), (True, 16384), (False, 16384)):
    D, H = 128, 16
    B = 16384 // S
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = flash_attention(q, k, v, return_lse=True, causal=causal)
    dout = torch.randn_like(out)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    acc = torch.zeros(q.shape, dtype=torch.float32, device="cuda")
    blocks = S // 128
    units = B * H * ((blocks + 1) // 2 if causal else blocks)
    variants = {"per_block": (False, 132, None), "pers_132": (True, 132, None), "pers_all": (True, units, None),
                "pers_132_chunk1": (True, 132, 1), "pers_264": (True, 264, None)}
    res = {k2: [] for k2 in variants}
    for rnd in range(2):
        for name, (pers, progs, chunk) in (variants.items() if rnd == 0 else reversed(variants.items())):
            bwd_fused.num_sms = lambda device, default=1, p=progs: p
            fn = lambda: bwd_fused.flash_attention_bwd_fused(q, k, v, dout, lse, delta, dq, dk, dv, softmax_scale=D ** -0.5,
                                                             causal=causal, dq_acc=acc, persistent=pers, chunk=chunk)
            res[name].append(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
    row = {"causal": causal, "S": S, "units": units, **{k2: min(v2) for k2, v2 in res.items()}}
    print(json.dumps(row), flush=True)
