"""Child process of test_sm90_compile.py: run the kernel launchers of one group on CPU tensors with
the offline driver (compile for sm_90, launch nothing) and print, as JSON, what each kernel
compiled to. Run without TRITON_INTERPRET: ``python -m tests.kernels.sm90_compile_child GROUP``,
GROUP one of :data:`GROUPS` or ``all``. The groups split the compiles so that parallel test
workers share them."""

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") != "1", "the interpreter builds no compilable kernels"

from tests.kernels import offline_compile  # noqa: E402

offline_compile.install()

import torch  # noqa: E402

from kernelops.kernels.common.gluon import GLUON  # noqa: E402
from kernelops.kernels.flash_attention import (  # noqa: E402
    backward, bwd, bwd_d256, bwd_fused, bwd_ws, decode, dispatch, dropout, fwd, fwd_tma, fwd_ws, plans, varlen)

BIG = 1 << 30
errors = []
#: the Triton kernels (pointer and TMA forward, backward, decode, offsets, dropout); the
#: warp-specialised forward's 16-bit D=128 variants; its D=256, three-consumer and FP8 variants;
#: the warp-specialised backwards
GROUPS = ("triton", "fwd_ws", "fwd_ws_more", "bwd_ws")
GROUP = sys.argv[1] if len(sys.argv) > 1 else "all"
assert GROUP in GROUPS + ("all",), f"unknown group {GROUP!r}: one of {GROUPS} or 'all'"
_section = ["triton"]


def section(name):
    """The group the launches below belong to (until the next section)."""
    _section[0] = name


def attempt(name, fn):
    if GROUP not in ("all", _section[0]):
        return
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - reported; the kernels compiled before it still count
        errors.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")


def t(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


B, S, H, Hkv, D = 2, 256, 4, 2, 128
q, k, v = t(B, S, H, D), t(B, S, Hkv, D), t(B, S, Hkv, D)
band = dict(softmax_scale=D ** -0.5, win_left=BIG, win_right=0, softcap=None)
tiles = dict(q_blocksize=128, kv_blocksize=64, num_warps=8, num_stages=3)
section("triton")
attempt("fwd causal", lambda: fwd.flash_attention_fwd(q, k, v, **band, **tiles))
attempt("fwd window+softcap+terms", lambda: fwd.flash_attention_fwd(
    q, k, v, softmax_scale=D ** -0.5, win_left=64, win_right=8, softcap=30.0, **tiles,
    bias=t(B, H, S, S), alibi_slopes=torch.rand(H), softmax_aux=torch.randn(H),
    q_segment_ids=torch.zeros(B, S, dtype=torch.int64), kv_segment_ids=torch.zeros(B, S, dtype=torch.int64)))
cu = torch.tensor([0, 100, 512], dtype=torch.int32)
attempt("fwd packed", lambda: fwd.flash_attention_fwd(t(512, H, D), t(512, Hkv, D), t(512, Hkv, D), **band, **tiles,
                                                      cum_seqlens_q=cu, cum_seqlens_k=cu))
fwd_tma.interpreting = lambda: True  # its CPU-tensor gate is meant for the interpreter; here it lets CPU tensors in
attempt("fwd tma", lambda: fwd_tma.flash_attention_fwd_tma(q, k, v, **band, q_blocksize=64, kv_blocksize=64,
                                                           num_warps=4, num_stages=3))
section("fwd_ws")
if GLUON:
    for causal in (True, False):
        attempt(f"fwd ws causal={causal}", lambda: fwd_ws.flash_attention_fwd_ws(
            q, k, v, softmax_scale=D ** -0.5, causal=causal, warmup_only=True))
    attempt("fwd ws ragged", lambda: fwd_ws.flash_attention_fwd_ws(
        t(B, 200, H, D), k, v, softmax_scale=D ** -0.5, causal=True, ragged=True, warmup_only=True))
    for causal in (True, False):  # packed sequences (one offsets tensor; the schedule launch runs too)
        attempt(f"fwd ws packed causal={causal}", lambda: fwd_ws.flash_attention_fwd_ws_packed(  # noqa: B023
            t(512, H, D), t(512, Hkv, D), t(512, Hkv, D), cu, softmax_scale=D ** -0.5, causal=causal,  # noqa: B023
            warmup_only=True))
    attempt("fwd ws packed two offsets", lambda: fwd_ws.flash_attention_fwd_ws_packed(
        t(512, H, D), t(300, Hkv, D), t(300, Hkv, D), cu, softmax_scale=D ** -0.5, causal=True,
        cum_seqlens_k=torch.tensor([0, 200, 300], dtype=torch.int32), warmup_only=True))
    attempt("fwd ws packed two offsets D=256", lambda: fwd_ws.flash_attention_fwd_ws_packed(  # one Q buffer
        t(512, H, 256), t(300, Hkv, 256), t(300, Hkv, 256), cu, softmax_scale=0.0625, causal=True,
        cum_seqlens_k=torch.tensor([0, 200, 300], dtype=torch.int32), warmup_only=True))
    attempt("fwd ws packed D=256", lambda: fwd_ws.flash_attention_fwd_ws_packed(
        t(512, H, 256), t(512, Hkv, 256), t(512, Hkv, 256), cu, softmax_scale=0.0625, causal=True, warmup_only=True))
    # a causal sliding window (CAUSAL == 2): D=128, ragged, packed with one and two offsets tensors
    attempt("fwd ws window", lambda: fwd_ws.flash_attention_fwd_ws(
        q, k, v, softmax_scale=D ** -0.5, causal=True, window=100, warmup_only=True))
    attempt("fwd ws window ragged", lambda: fwd_ws.flash_attention_fwd_ws(
        t(B, 200, H, D), k, v, softmax_scale=D ** -0.5, causal=True, ragged=True, window=100, warmup_only=True))
    attempt("fwd ws packed window", lambda: fwd_ws.flash_attention_fwd_ws_packed(
        t(512, H, D), t(512, Hkv, D), t(512, Hkv, D), cu, softmax_scale=D ** -0.5, causal=True, window=100,
        warmup_only=True))
    attempt("fwd ws packed two offsets window", lambda: fwd_ws.flash_attention_fwd_ws_packed(
        t(512, H, D), t(300, Hkv, D), t(300, Hkv, D), cu, softmax_scale=D ** -0.5, causal=True, window=100,
        cum_seqlens_k=torch.tensor([0, 200, 300], dtype=torch.int32), warmup_only=True))
    # soft-capped scores (SOFTCAP): D=128 causal and windowed, packed windowed (two offsets tensors)
    attempt("fwd ws softcap", lambda: fwd_ws.flash_attention_fwd_ws(
        q, k, v, softmax_scale=D ** -0.5, causal=True, softcap=50.0, warmup_only=True))
    attempt("fwd ws window softcap", lambda: fwd_ws.flash_attention_fwd_ws(
        q, k, v, softmax_scale=D ** -0.5, causal=True, window=100, softcap=50.0, warmup_only=True))
    attempt("fwd ws packed two offsets window softcap", lambda: fwd_ws.flash_attention_fwd_ws_packed(
        t(512, H, D), t(300, Hkv, D), t(300, Hkv, D), cu, softmax_scale=D ** -0.5, causal=True, window=100,
        softcap=30.0, cum_seqlens_k=torch.tensor([0, 200, 300], dtype=torch.int32), warmup_only=True))
    section("fwd_ws_more")
    q256, k256 = t(B, S, H, 256), t(B, S, Hkv, 256)  # D=256: 64-key blocks, one Q buffer (ws_tiles)
    q64, k64 = t(B, S, H, 64), t(B, S, Hkv, 64)  # three consumer warpgroups (192-row tiles): D=64 only
    for tag, qx, kx, extra in (("D=256", q256, k256, {}), ("3 consumers", q64, k64, dict(consumers=3))):
        for causal, ragged, window, cap in ((True, False, None, None), (False, False, None, None),
                                            (True, True, None, None), (True, False, 100, None),
                                            (True, False, 100, 50.0)):
            attempt(f"fwd ws {tag} causal={causal} ragged={ragged} window={window} softcap={cap}",
                    lambda: fwd_ws.flash_attention_fwd_ws(
                        qx[:, :200] if ragged else qx, kx, kx, softmax_scale=qx.shape[-1] ** -0.5,  # noqa: B023
                        causal=causal, ragged=ragged, window=window, softcap=cap,  # noqa: B023
                        warmup_only=True, **extra))  # noqa: B023
if GLUON:  # FP8: e4m3 q/k, V^T tiles, O staged apart (D=128 causal/full/ragged, D=64 x3, D=256, fp32 O)
    from kernelops.kernels.flash_attention import fwd_ws_fp8

    f8 = torch.float8_e4m3fn
    for dx, causal, ragged, extra in ((128, True, False, {}), (128, False, False, {}), (128, True, True, {}),
                                      (64, True, False, dict(consumers=3)), (256, True, False, {}),
                                      (128, False, False, dict(out_dtype=torch.float32))):
        attempt(f"fwd ws fp8 D={dx} causal={causal} ragged={ragged} {extra}",
                lambda: fwd_ws_fp8.flash_attention_fwd_ws_fp8(  # noqa: B023
                    t(B, 200 if ragged else S, H, dx, dtype=f8), t(B, S, Hkv, dx, dtype=f8),  # noqa: B023
                    t(B, S, Hkv, dx, dtype=f8), softmax_scale=dx ** -0.5, causal=causal,  # noqa: B023
                    descale=(0.01, 0.01, 0.01), warmup_only=True, **extra))  # noqa: B023
out, lse = torch.empty_like(q), torch.zeros(B, H, S)


def bwd_fused_packed(causal, D=D, two=False, window=None, softcap=None):
    """The packed fused backward's launches compiled: the general path's (backward.py) with the Gluon
    kernel's packed variant (D=256: bwd_d256's; what ``flash_attention_bwd`` launches, made warmups);
    ``two``: the keys with offsets of their own (``PACKED == 2``, 300 keys); ``window``: a causal
    window (``CAUSAL == 2``); ``softcap``: capped logits (``SOFTCAP``)."""
    qp, kp = t(512, H, D), t(300 if two else 512, Hkv, D)
    cu_k = torch.tensor([0, 100, 300], dtype=torch.int32) if two else cu
    lse_p = torch.zeros(H, 512)
    table = bwd_fused.packed_table(cu_k, kp.shape[0], Hkv, D)
    for kernel, grid, args, meta in backward.packed_launches(
            qp[None], kp[None], kp[None], qp[None], lse_p[None], lse_p[None], torch.empty(1, 512, H, D),
            torch.empty_like(kp)[None], torch.empty_like(kp)[None], cu, table, D ** -0.5, causal, cum_seqlens_k=cu_k,
            win_left=window, softcap=softcap):
        kernel.warmup(*args, **meta, grid=grid)
section("bwd_ws")
if GLUON:  # dK/dV: causal, full, causal with a left window
    for causal, window in ((True, None), (False, None), (True, 100)):
        attempt(f"bwd ws causal={causal} window={window}", lambda: bwd_ws.flash_attention_bwd_dkdv_ws(  # noqa: B023
            q, k, v, out, lse, lse, torch.empty_like(k), torch.empty_like(v), softmax_scale=D ** -0.5,
            causal=causal, win_left=window, warmup_only=True))  # noqa: B023
        attempt(f"bwd fused causal={causal} window={window}", lambda: bwd_fused.flash_attention_bwd_fused(  # noqa: B023
            q, k, v, out, lse, lse, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            softmax_scale=D ** -0.5, causal=causal, win_left=window, dq_acc=torch.empty(q.shape),  # noqa: B023
            split=False, warmup_only=True))
    for causal in (True, False):  # packed sequences (the general backward path, as the library calls it)
        attempt(f"bwd fused packed causal={causal}", lambda: bwd_fused_packed(causal))  # noqa: B023
    attempt("bwd fused packed two offsets", lambda: bwd_fused_packed(True, two=True))
    attempt("bwd fused packed window", lambda: bwd_fused_packed(True, window=100))
    attempt("bwd fused causal split", lambda: bwd_fused.flash_attention_bwd_fused(
        q, k, v, out, lse, lse, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), softmax_scale=D ** -0.5,
        causal=True, dq_acc=torch.empty(q.shape), split=True, warmup_only=True))
    attempt("bwd fused causal softcap", lambda: bwd_fused.flash_attention_bwd_fused(  # soft caps (SOFTCAP)
        q, k, v, out, lse, lse, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), softmax_scale=D ** -0.5,
        causal=True, dq_acc=torch.empty(q.shape), split=False, softcap=50.0, warmup_only=True))
    attempt("bwd fused packed window softcap", lambda: bwd_fused_packed(True, window=100, softcap=50.0))
    q64, k64 = t(B, S, H, 64), t(B, S, Hkv, 64)
    attempt("bwd fused d64 q128", lambda: bwd_fused.flash_attention_bwd_fused(  # 128-query blocks (D=64)
        q64, k64, k64, q64, lse, lse, q64, k64, k64, softmax_scale=0.125, causal=True, dq_acc=torch.empty(q64.shape),
        split=False, block_q=128, warmup_only=True))
    q64, lse64 = t(B, S, Hkv, 64), lse[:, :Hkv].contiguous()  # no GQA: Triton specialises group == 1
    attempt("bwd fused d64 q128 no gqa", lambda: bwd_fused.flash_attention_bwd_fused(
        q64, k64, k64, q64, lse64, lse64, q64, k64, k64, softmax_scale=0.125, causal=False,
        dq_acc=torch.empty(q64.shape), split=False, block_q=128, warmup_only=True))
if GLUON:  # D=256: full, causal, causal with a left window; causal with the query heads split
    for causal, window, split in ((True, None, False), (False, None, False), (True, 100, False), (True, None, True)):
        attempt(f"bwd d256 causal={causal} window={window} split={split}", lambda: bwd_d256.flash_attention_bwd_d256(
            q256, k256, k256, q256, lse, lse, q256, k256, k256, softmax_scale=0.0625, causal=causal,  # noqa: B023
            win_left=window, dq_acc=torch.empty(q256.shape), split=split, warmup_only=True))  # noqa: B023
    for causal in (True, False):  # packed sequences
        attempt(f"bwd d256 packed causal={causal}", lambda: bwd_fused_packed(causal, 256))  # noqa: B023
    attempt("bwd d256 packed two offsets", lambda: bwd_fused_packed(True, 256, two=True))
    attempt("bwd d256 packed window", lambda: bwd_fused_packed(True, 256, window=100))
    attempt("bwd d256 causal softcap", lambda: bwd_d256.flash_attention_bwd_d256(  # soft caps (SOFTCAP)
        q256, k256, k256, q256, lse, lse, q256, k256, k256, softmax_scale=0.0625, causal=True,
        dq_acc=torch.empty(q256.shape), split=False, softcap=50.0, warmup_only=True))
    attempt("bwd d256 packed two offsets softcap", lambda: bwd_fused_packed(True, 256, two=True, softcap=50.0))
if GLUON:  # the dK/dV kernel's other tiles: 32-query blocks (32-value lse/delta boxes), pingpong
    attempt("bwd ws q32 pingpong", lambda: bwd_ws.flash_attention_bwd_dkdv_ws(
        q, k, v, out, lse, lse, torch.empty_like(k), torch.empty_like(v), softmax_scale=D ** -0.5, causal=True,
        block_q=32, stages=3, pingpong=True, warmup_only=True))
section("triton")
attempt("bwd", lambda: dispatch.flash_attention_bwd(q, k, v, out, t(B, S, H, D), lse, **band, q_blocksize=64,
                                               kv_blocksize=128, num_warps=8, num_stages=3))
interpreting_rule, pdl_rule = decode.interpreting, decode.decode_pdl
for name, tma in (("decode", True), ("decode pointer", False)):
    # K/V tiles through TMA descriptors (as for fwd_tma: the interpreter's gate lets CPU tensors take the TMA
    # reads) with a programmatic dependent combine; or, the gate left shut, through pointers (the reads of
    # inputs TMA does not take: float32, D not a power of two, sm_80) without one
    decode.interpreting = (lambda: True) if tma else interpreting_rule
    decode.decode_pdl = (lambda q: True) if tma else pdl_rule
    plans._FWD_PLANS.clear()  # (a decode plan's signature does not hold the TMA and PDL choices patched here)
    attempt(name, lambda: dispatch.flash_attention_decode(t(B, 1, H, D), k, v, softmax_scale=D ** -0.5, win_left=BIG,
                                                        win_right=BIG, softcap=None, kv_blocksize=64, num_warps=4,
                                                        num_stages=3, num_splits=4))
    rules = decode.num_sms, decode.BALANCED_MIN_KEYS, decode.BALANCED_MIN_PAIR_KEYS  # a balanced plan: 4 pairs
    decode.num_sms, decode.BALANCED_MIN_KEYS, decode.BALANCED_MIN_PAIR_KEYS = lambda device, default: 3, 0, 0
    q_default = decode.Q_EACH_BLOCK_MAX
    for q_max in (q_default, 0):  # the query rows read with every block, or once a pair
        decode.Q_EACH_BLOCK_MAX = q_max
        attempt(f"{name} balanced q{q_max}", lambda: dispatch.flash_attention_decode(
            t(B, 1, H, D), k, v, softmax_scale=D ** -0.5, win_left=BIG, win_right=BIG, softcap=None, kv_blocksize=64,
            num_warps=4, num_stages=3))
    decode.Q_EACH_BLOCK_MAX = q_default
    decode.num_sms, decode.BALANCED_MIN_KEYS, decode.BALANCED_MIN_PAIR_KEYS = rules
torch._assert_async = lambda *args, **kwargs: None  # nothing launched: its result flag holds no verdict
attempt("offsets check", lambda: varlen.check_offsets(cu, cu, 512, 512, None, None))
attempt("dropout mask", lambda: dropout.triton_keep_mask(1, 0.1, 1, 2, 64, 64, "cpu"))

report = {}
for module in (fwd, fwd_tma, fwd_ws, bwd, bwd_ws, bwd_fused, bwd_d256, decode, varlen, dropout):
    for name in dir(module):
        fn = getattr(module, name)
        if hasattr(fn, "device_caches") and hasattr(fn, "fn"):
            kernels = offline_compile.compiled_kernels(fn)
            if kernels:
                ptx = "\n".join(k.asm["ptx"] for k in kernels)
                report[f"{module.__name__.rsplit('.', 1)[-1]}.{name}"] = {
                    "variants": len(kernels), "wgmma": "wgmma.mma_async" in ptx, "mma": "mma.sync" in ptx,
                    "tma": "cp.async.bulk.tensor" in ptx, "gdc": "griddepcontrol" in ptx,
                    "resources": [offline_compile.resources(k) for k in kernels]}
json.dump({"kernels": report, "errors": errors}, sys.stdout)
