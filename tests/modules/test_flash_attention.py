"""flash_attention against the float64 reference: outputs, lse and all three gradients.

On a CPU machine the Triton kernels run in the interpreter (float16/float32, small odd sizes);
with CUDA the same tests run on the GPU, and the ``gpu`` grid adds bfloat16, head dims to 256
and longer sequences.
"""

import functools
import math

import pytest
import torch

from kernelops import BwdParams, FlashAttentionConfig, FwdParams, MaskInfo, flash_attention
from kernelops.kernels.flash_attention.dispatch import flash_attention_bwd
from kernelops.kernels.flash_attention.fwd import flash_attention_fwd
from kernelops.kernels.flash_attention.reference import attention_materialized
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops import NotSupportedError
from tests.attention_checks import (
    UNBOUNDED,
    assert_attention_matches,
    assert_lse_matches,
    assert_matches,
    assert_sink_grad_matches,
    band,
    check_attention_gradients,
    gradient_term_norms,
    make_qkv,
    reference,
    rel_err,
)
from tests.conftest import DEVICE, HAS_CUDA
from tests.op_checks import BadInput, case_id, check_bad_inputs, nan_like, poisoned_allocations, shape_of

# (B, Sq, Sk, Hq, Hkv, D, causal, sliding_window, softcap)
CASES = [
    (1, 113, 203, 2, 1, 32, False, None, None),
    (1, 113, 203, 2, 1, 32, True, None, None),
    (2, 1, 77, 2, 2, 16, True, None, None),
    (1, 77, 1, 2, 1, 32, True, None, None),        # most rows see no key
    (1, 96, 48, 2, 1, 32, True, None, None),       # Sq > Sk, bottom-right causal
    (1, 64, 64, 4, 1, 40, False, (8, 3), None),     # MQA, asymmetric window, D not a power of two
    (1, 70, 70, 2, 2, 24, True, 16, 20.0),          # causal window + softcap
    (1, 50, 90, 4, 2, 32, False, (None, 5), 5.0),   # GQA, right-only window, strong softcap
    (1, 256, 512, 2, 1, 16, True, None, None),
]
PLATFORMS = ["triton", "torch"]
DTYPES = [torch.float32, torch.float16]


def _ids(case):
    B, Sq, Sk, Hq, Hkv, D, causal, win, cap = case
    return f"b{B}-q{Sq}-k{Sk}-h{Hq}/{Hkv}-d{D}-{'causal' if causal else 'full'}-w{win}-cap{cap}"


def make_extras(spec, B, Sq, Sk, Hq, dtype, device):
    """Optional score terms from a spec: {"bias": (Bb, Hb), "bias_dtype", "bias_grad", "bias_inf",
    "bias_expand", "alibi": "h" | "bh", "sinks": True}."""
    out = {}
    if "bias" in spec:
        Bb, Hb = spec["bias"]
        bdt = spec.get("bias_dtype", dtype)
        if spec.get("bias_expand"):  # a stride-0 view: broadcast without a copy
            bias = torch.randn(1, 1, Sq, Sk, device=device).to(bdt).expand(Bb, Hb, Sq, Sk)
        else:
            bias = torch.randn(Bb, Hb, Sq, Sk, device=device).to(bdt)
        if spec.get("bias_inf"):  # an additive mask: random -inf entries, and row 0 fully masked
            bias = bias.masked_fill(torch.rand(bias.shape, device=device) < 0.3, float("-inf"))
            bias[..., 0, :] = float("-inf")
        out["bias"] = bias.requires_grad_(spec.get("bias_grad", False))
    if "alibi" in spec:
        shape = (Hq,) if spec["alibi"] == "h" else (B, Hq)
        out["alibi_slopes"] = torch.rand(shape, device=device) * 0.5
    if spec.get("sinks"):
        out["softmax_aux"] = torch.randn(Hq, device=device).requires_grad_(True)
    if "segments" in spec:
        if spec["segments"] == "packed":  # sorted ids: packed documents
            ids = torch.sort(torch.randint(0, 4, (B, Sq), device=device), dim=1).values
            out["mask_info"] = MaskInfo.from_segments(ids) if Sq == Sk else None
        else:  # arbitrary ids, separate for queries and keys: some queries see no key at all
            out["mask_info"] = MaskInfo.from_segments(torch.randint(0, 3, (B, Sq), device=device),
                                                      torch.randint(0, 3, (B, Sk), device=device))
    if spec.get("padding"):
        lengths = torch.randint(1, Sk + 1, (B,), device=device)
        out["mask_info"] = MaskInfo.from_attention_mask(torch.arange(Sk, device=device)[None] < lengths[:, None],
                                                        seq_q=Sq)
    if spec.get("bool_mask"):
        out["mask_info"] = MaskInfo.from_attention_mask(torch.rand(B, 1, Sq, Sk, device=device) > 0.4)
    return out


def check_call(case, dtype, platform, cfg=None, device=DEVICE, extras=None):
    B, Sq, Sk, Hq, Hkv, D, causal, win, cap = case
    q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, D, dtype, device)
    terms = make_extras(extras or {}, B, Sq, Sk, Hq, dtype, device)
    with poisoned_allocations() as poisoned:  # every buffer the op allocates starts as NaN
        out, lse = flash_attention(q, k, v, causal=causal, sliding_window=win, logits_soft_cap=cap, return_lse=True,
                                   platform=platform, cfg=cfg, **terms)
        assert out.shape == q.shape and out.dtype == dtype and lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32
        dout = torch.randn_like(out)
        dlse = torch.randn_like(lse)
        finite = torch.isfinite(lse)
        loss = (out.float() * dout.float()).sum() + (torch.where(finite, lse, 0.0) * dlse).sum()
        loss.backward()
    assert platform != "triton" or poisoned.count >= 2, "the Triton path allocated no output through torch.empty*"
    kw = dict(causal=causal, sliding_window=win, logits_soft_cap=cap, dout=dout, dlse=dlse, **terms)
    ref_out, ref_lse, ref_grads, weights = reference(q, k, v, return_weights=True, **kw)
    low_out, _, low_grads = reference(q, k, v, dtype=dtype, **kw)
    assert_matches("out", out, ref_out, low_out, dtype)
    assert_lse_matches(lse, ref_lse, dtype)
    tensors = [("dq", q), ("dk", k), ("dv", v)]
    tensors += [(f"d{n}", terms[n]) for n in ("bias", "softmax_aux")
                if terms.get(n) is not None and terms[n].requires_grad]
    assert len(ref_grads) == len(tensors)
    term_norms = gradient_term_norms(q, k, v, weights, ref_out, dout, dlse)
    for (name, t), r, lo in zip(tensors, ref_grads, low_grads):
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype, name
        if name == "dsoftmax_aux":
            assert_sink_grad_matches(t.grad, r, t, ref_out, ref_lse, dout, dlse, dtype)
            continue
        # a gradient is returned in its tensor's dtype (an fp16 bias gets an fp16 dbias)
        assert_matches(name, t.grad, r, lo.to(t.dtype), t.dtype, term_norm=term_norms.get(name))


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_matches_float64_reference(case, dtype, platform):
    check_call(case, dtype, platform)


@pytest.mark.parametrize("blocks", [(16, 16), (16, 64), (64, 16)])
def test_block_sizes(blocks):
    """The masked/unmasked split must be right whatever the tile shape."""
    m, n = blocks
    cfg = FlashAttentionConfig(FwdParams(m, n, 4, 1), BwdParams(m, n, 4, 1), platform="triton")
    for case in [(1, 113, 203, 2, 1, 32, True, None, None), (1, 70, 70, 2, 2, 24, False, (9, 17), None)]:
        check_call(case, torch.float32, "triton", cfg=cfg)


def test_poisoned_outputs_are_fully_written():
    """Launch on NaN-filled output buffers: every element must be overwritten."""
    B, Sq, Sk, Hq, Hkv, D = 2, 45, 67, 4, 2, 24
    q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, D, torch.float32, DEVICE, requires_grad=False)
    left, right = band(True, (20, None))
    kw = dict(softmax_scale=D ** -0.5, win_left=left, win_right=right, softcap=None)
    p = dict(q_blocksize=16, kv_blocksize=32, num_warps=4, num_stages=1)
    out, lse = nan_like(q), nan_like(q, (B, Hq, Sq), torch.float32)
    flash_attention_fwd(q, k, v, **kw, **p, out=out, lse=lse)
    dout = torch.randn_like(q)
    dq, dk, dv = (nan_like(t) for t in (q, k, v))
    flash_attention_bwd(q, k, v, out, dout, lse, **kw, **p, dq=dq, dk=dk, dv=dv)
    assert not torch.isnan(lse).any()
    assert_attention_matches(out, q, k, v, lse=lse, dout=dout, grads=(dq, dk, dv), causal=True,
                             sliding_window=(20, None))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_strided_inputs_without_copies(platform):
    """q from a BHSD tensor, k and v as slices of one packed tensor: results match contiguous inputs."""
    B, S, H, D = 2, 37, 4, 32
    q_bhsd = torch.randn(B, H, S, D, device=DEVICE)
    kv = torch.randn(B, S, 2, H, D, device=DEVICE)
    q, k, v = q_bhsd.transpose(1, 2), kv[:, :, 0], kv[:, :, 1]
    assert not q.is_contiguous() and not k.is_contiguous()
    got = flash_attention(q, k, v, causal=True, platform=platform)
    want = flash_attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True, platform=platform)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_softmax_scale_and_no_grad_path():
    q, k, v = make_qkv(1, 33, 33, 2, 2, 16, torch.float32, DEVICE, requires_grad=False)
    assert_attention_matches(flash_attention(q, k, v, softmax_scale=0.3), q, k, v, softmax_scale=0.3)


def test_empty_sequences():
    q, k, v = make_qkv(1, 0, 5, 2, 1, 16, torch.float32, DEVICE, requires_grad=False)
    assert flash_attention(q, k, v).shape == (1, 0, 2, 16)
    q, k, v = make_qkv(1, 4, 0, 2, 1, 16, torch.float32, DEVICE, requires_grad=False)
    out, lse = flash_attention(q, k, v, return_lse=True, platform="triton")
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


# --- bias, ALiBi, attention sinks ---------------------------------------------------------------------
EXTRA_CASES = [
    ((2, 45, 67, 4, 2, 32, True, None, None), {"bias": (2, 4), "bias_grad": True}),
    ((1, 50, 50, 2, 1, 16, False, None, 10.0), {"bias": (1, 1), "bias_dtype": torch.float16, "bias_grad": True}),
    ((2, 33, 40, 2, 2, 16, False, None, None), {"bias": (2, 2), "bias_expand": True}),
    ((1, 40, 40, 2, 2, 16, False, None, None), {"bias": (1, 2), "bias_inf": True, "bias_grad": True}),
    ((1, 60, 60, 4, 4, 16, True, None, None), {"alibi": "h"}),
    ((2, 37, 52, 2, 1, 24, False, (10, 6), None), {"alibi": "bh"}),
    ((1, 70, 70, 4, 2, 32, True, None, None), {"sinks": True}),
    ((1, 48, 30, 2, 1, 16, True, None, None), {"sinks": True}),   # empty rows: lse = the sink
    ((1, 45, 45, 4, 2, 16, True, 12, 20.0), {"sinks": True, "alibi": "h", "bias": (1, 4), "bias_grad": True}),
    ((2, 77, 77, 2, 1, 16, True, None, None), {"segments": "packed"}),
    ((2, 50, 61, 2, 2, 16, False, None, None), {"segments": "random"}),
    ((2, 40, 57, 4, 2, 16, False, None, None), {"padding": True}),
    ((2, 33, 47, 2, 1, 16, True, (20, None), None), {"bool_mask": True, "sinks": True}),
]


@pytest.mark.parametrize("case,extras", EXTRA_CASES, ids=[str(sorted(e)) + _ids(c) for c, e in EXTRA_CASES])
@pytest.mark.parametrize("platform", PLATFORMS)
def test_bias_alibi_sinks(case, extras, platform):
    check_call(case, torch.float32, platform, extras=extras)


def test_bias_fp16_inputs_triton():
    check_call((1, 40, 56, 2, 1, 32, True, None, 15.0), torch.float16, "triton",
               extras={"bias": (1, 2), "bias_grad": True, "sinks": True, "alibi": "h"})


def test_deterministic_backward_is_bitwise_reproducible():
    q, k, v = make_qkv(2, 70, 90, 4, 1, 32, torch.float16 if not HAS_CUDA else torch.bfloat16, DEVICE)
    dout = torch.randn(q.shape, device=DEVICE).to(q.dtype)
    grads = []
    for _ in range(2):
        for t in (q, k, v):
            t.grad = None
        flash_attention(q, k, v, causal=True, deterministic=True, platform="triton").backward(dout)
        grads.append([t.grad.clone() for t in (q, k, v)])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


# --- bad input -----------------------------------------------------------------------------------
def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


#: a valid call: query [2, 8, 4, 16], key/value [2, 9, 2, 16]; each bad case changes some arguments
GOOD = dict(query=_t(2, 8, 4, 16), key=_t(2, 9, 2, 16), value=_t(2, 9, 2, 16))
Q, K = shape_of("query", GOOD["query"]), shape_of("key", GOOD["key"])


def _kv(*shape, dtype=torch.float32):
    return dict(key=_t(*shape, dtype=dtype), value=_t(*shape, dtype=dtype))


BAD = [
    BadInput(_kv(3, 9, 2, 16), ValueError, ["batch sizes differ", Q, "key.shape=(3, 9, 2, 16)"]),
    BadInput(dict(query=_t(2, 8, 3, 16)), ValueError, ["multiple of", "query.shape=(2, 8, 3, 16)", K]),
    BadInput(_kv(2, 9, 2, 32), ValueError, ["head dims differ", Q, "key.shape=(2, 9, 2, 32)"]),
    BadInput(dict(value=_t(2, 10, 2, 16)), ValueError, ["same shape", K, "value.shape=(2, 10, 2, 16)"]),
    BadInput(dict(query=_t(2, 8, 4, 320), **_kv(2, 9, 2, 320)), ValueError,
             ["head_dim", "query.shape=(2, 8, 4, 320)"]),
    BadInput(dict(key=_t(2, 9, 2, 16, dtype=torch.float16)), TypeError,
             ["share a dtype", "key.dtype=torch.float16", Q, K]),
    BadInput(dict(query=torch.ones(2, 8, 4, 16, dtype=torch.int32)), TypeError,
             ["floating-point", "query.dtype=torch.int32"]),
    BadInput(dict(query=_t(8, 4, 16)), ValueError, ["4-D", "query.shape=(8, 4, 16)"]),
    BadInput(dict(query=_t(2, 8, 4, 16).numpy()), TypeError, ["query must be a torch.Tensor", "ndarray"]),
    BadInput(dict(query=GOOD["query"].to("meta")), ValueError,
             ["one device", "query.device=device(type='meta')", Q]),
    BadInput(dict(sliding_window=-1), ValueError, ["sliding_window", "negative", "-1"]),
    BadInput(dict(sliding_window=(4, -2)), ValueError, ["sliding_window", "negative", "(4, -2)"]),
    BadInput(dict(logits_soft_cap=-1.0), ValueError, ["logits_soft_cap", "-1.0"]),
    BadInput(dict(softmax_scale=math.inf), ValueError, ["softmax_scale", "inf"]),
    BadInput(dict(platform="cuda"), ValueError, ["platform", "'cuda'"]),
    BadInput(dict(bias=_t(2, 3, 8, 9)), ValueError, ["bias must broadcast", "[2 or 1, 4 or 1, 8, 9]",
                                                     "bias.shape=(2, 3, 8, 9)"]),
    BadInput(dict(bias=_t(1, 1, 9, 8)), ValueError, ["bias must broadcast", "bias.shape=(1, 1, 9, 8)"]),
    BadInput(dict(bias=torch.ones(1, 1, 8, 9, dtype=torch.bool)), TypeError, ["bias", "bias.dtype=torch.bool"]),
    BadInput(dict(alibi_slopes=_t(2)), ValueError, ["alibi_slopes", "[4] or [2, 4]", "alibi_slopes.shape=(2,)"]),
    BadInput(dict(softmax_aux=_t(2)), ValueError, ["softmax_aux", "[Hq] = [4]", "softmax_aux.shape=(2,)"]),
    BadInput(dict(mask_info=MaskInfo.from_segments(torch.zeros(2, 10, dtype=torch.long))), ValueError,
             ["segment ids", "[B, Sq] = [2, 8]", "q_segment_ids.shape=(2, 10)"]),
    BadInput(dict(mask_info=MaskInfo(attention_mask=torch.ones(2, 1, 8, 7, dtype=torch.bool))), ValueError,
             ["mask_info.attention_mask", "[2, 4, 8, 9]", "(2, 1, 8, 7)"]),
    BadInput(dict(mask_info=torch.ones(2, 8)), TypeError, ["mask_info", "MaskInfo", "Tensor"]),
    BadInput(dict(dropout_prob=1.0), ValueError, ["dropout_prob", "[0, 1)", "1.0"]),
    BadInput(dict(dropout_prob=-0.5), ValueError, ["dropout_prob", "-0.5"]),
    BadInput(dict(dropout_prob=0.1, dropout_seed=-1), ValueError, ["dropout_seed", "-1"]),
]


@pytest.mark.parametrize("case", BAD, ids=case_id)
def test_bad_input_is_refused_naming_the_argument_and_its_shape(case):
    """Each bad call raises before the op runs anything, and its message names the argument with
    its shape, dtype or value (and the shape it should have had, where there is one)."""
    check_bad_inputs(flash_attention, [case], GOOD, op=FLASH_ATTENTION)


def test_forced_platform_that_cannot_run_explains_why():
    q = _t(1, 8, 2, 16, dtype=torch.float64)
    with pytest.raises(NotSupportedError, match="float16/bfloat16/float32"):
        flash_attention(q, q, q, platform="triton")
    if not HAS_CUDA:
        b = _t(1, 8, 2, 16, dtype=torch.bfloat16)
        with pytest.raises(NotSupportedError, match="bfloat16"):
            flash_attention(b, b, b, platform="triton")


def test_float64_on_torch_platform():
    """float64 end to end: the lse comes back in float64 and the backward, which rebuilds P from
    it, is float64-accurate too (a float32 lse left the gradients at ~1e-7)."""
    q, k, v = make_qkv(1, 21, 30, 2, 1, 8, torch.float64, DEVICE)
    # float64 inputs: the reference "in the input dtype" is float64 too, so the bound is the 1e-12 floor
    result = check_attention_gradients(functools.partial(flash_attention, causal=True, platform="torch",
                                                         return_lse=True), q, k, v, return_lse=True, causal=True)
    assert result.outputs[1].dtype == torch.float64


def test_second_order_gradients():
    """create_graph through the torch platform's backward gives float64-exact second-order
    gradients; through the Triton backward (differentiable once) differentiating the gradients
    raises, whatever the loss, and never silently drops the second-order term."""
    q, k, v = make_qkv(1, 12, 12, 2, 1, 8, torch.float64, DEVICE)
    out = flash_attention(q, k, v, causal=True, platform="torch")
    gq, = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    (out.sum() + gq.square().sum()).backward()
    qd, kd, vd = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref, _ = attention_materialized(qd, kd, vd, softmax_scale=8 ** -0.5, win_left=UNBOUNDED, win_right=0,
                                    softcap=None)
    ref_gq, = torch.autograd.grad(ref.square().sum(), qd, create_graph=True)
    (ref.sum() + ref_gq.square().sum()).backward()
    for t, r in ((q, qd), (k, kd), (v, vd)):
        assert rel_err(t.grad, r.grad) < 1e-10

    dtype = torch.float32 if not HAS_CUDA else torch.bfloat16
    q, k, v = make_qkv(1, 12, 12, 2, 1, 16, dtype, DEVICE)
    out = flash_attention(q, k, v, causal=True, platform="triton")
    gq, = torch.autograd.grad(out.float().square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once"):
        (out.float().sum() + gq.float().square().sum()).backward()
    # a loss linear in out (a gradient penalty's usual form): dout needs no grad, gq still depends on q
    out = flash_attention(q, k, v, causal=True, platform="triton")
    gq, = torch.autograd.grad(out.float().sum(), q, create_graph=True)
    assert gq.requires_grad
    with pytest.raises(RuntimeError, match="differentiable once"):
        (out.float().square().sum() + gq.float().square().sum()).backward()
    # create_graph used only for first-order gradients still works
    out = flash_attention(q, k, v, causal=True, platform="triton")
    g1, = torch.autograd.grad(out.float().sum(), q, create_graph=True)
    g0, = torch.autograd.grad(flash_attention(q, k, v, causal=True, platform="triton").float().sum(), q)
    assert torch.equal(g1.detach(), g0)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_wide_segment_ids_are_compared_exactly(platform):
    """int64 ids that agree in their low 32 bits (0 and 2**32) are different documents."""
    dtype = torch.float32 if platform == "torch" or not HAS_CUDA else torch.bfloat16
    q, k, v = make_qkv(2, 24, 24, 2, 1, 16, dtype, DEVICE)
    ids = torch.tensor([0] * 8 + [2 ** 32] * 8 + [-2 ** 40] * 8, device=DEVICE).repeat(2, 1)
    info = MaskInfo.from_segments(ids)
    check_attention_gradients(functools.partial(flash_attention, mask_info=info, causal=True, platform=platform),
                              q, k, v, mask_info=info, causal=True)


# --- the GPU grid ---------------------------------------------------------------------------------
GPU_SHAPES = [(2, 113, 203), (1, 1, 77), (1, 256, 512), (1, 1000, 1000), (2, 77, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("D", [32, 64, 96, 128, 160, 256])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: f"b{s[0]}-q{s[1]}-k{s[2]}")
@pytest.mark.parametrize("mode", ["full", "causal", "window", "softcap-gqa", "mqa-causal-window"])
def test_gpu_grid(dtype, D, shape, mode):
    B, Sq, Sk = shape
    Hq, Hkv, causal, win, cap = {
        "full": (4, 4, False, None, None),
        "causal": (4, 4, True, None, None),
        "window": (4, 2, False, (64, 32), None),
        "softcap-gqa": (8, 2, True, None, 30.0),
        "mqa-causal-window": (4, 1, True, 100, None),
    }[mode]
    check_call((B, Sq, Sk, Hq, Hkv, D, causal, win, cap), dtype, "triton", device="cuda")


# --- the torch platform's chunking ------------------------------------------------------------------
@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[6], CASES[4]], ids=_ids)
def test_torch_platform_across_many_key_chunks(case, monkeypatch):
    """Small chunks make every online-softmax and chunked-backward path run (the default 1024
    exceeds the test lengths)."""
    from kernelops.kernels.flash_attention import reference as ref_mod

    monkeypatch.setattr(ref_mod, "DEFAULT_CHUNK", 16)
    check_call(case, torch.float32, "torch")


@pytest.mark.gpu
def test_torch_platform_memory_is_not_quadratic():
    """At S=65536 one head's score matrix alone is 16 GiB in float32; the torch platform works
    chunk by chunk (a few temporaries of S x 1024), so its peak extra memory stays far below."""
    B, S, H, D = 1, 65536, 1, 64
    q, k, v = make_qkv(B, S, S, H, H, D, torch.float16, "cuda", requires_grad=False)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    flash_attention(q, k, v, causal=True, platform="torch")
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < S * S * 4 // 8, f"peak extra memory {extra / 2**20:.1f} MiB"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("case,extras", EXTRA_CASES, ids=[str(sorted(e)) + _ids(c) for c, e in EXTRA_CASES])
def test_gpu_bias_alibi_sinks(case, extras, D, dtype):
    B, Sq, Sk, Hq, Hkv, _, causal, win, cap = case
    check_call((B, Sq * 5, Sk * 5, Hq, Hkv, D, causal, win, cap), dtype, "triton", device="cuda",
               extras={**extras, "bias_dtype": extras.get("bias_dtype", dtype)})


# --- dropout ------------------------------------------------------------------------------------------
def _keep_mask(platform, seed, p, B, Hq, Hkv, Sq, Sk, device):
    from kernelops.kernels.flash_attention.dropout import triton_keep_mask
    from kernelops.kernels.flash_attention.reference import torch_keep_mask

    if platform == "triton":
        return triton_keep_mask(seed, p, B, Hq, Sq, Sk, device)
    return torch_keep_mask(seed, p, B, Hq, Hkv, Sq, Sk, device)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("case", [(2, 45, 67, 4, 2, 32, True, None, None), (1, 60, 60, 2, 2, 16, False, (9, 4), 12.0)],
                         ids=_ids)
def test_dropout_matches_reference_with_the_same_mask(case, platform):
    B, Sq, Sk, Hq, Hkv, D, causal, win, cap = case
    p, seed = 0.3, 1234
    q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, D, torch.float32, DEVICE)
    keep = _keep_mask(platform, seed, p, B, Hq, Hkv, Sq, Sk, DEVICE)
    kw = dict(causal=causal, sliding_window=win, logits_soft_cap=cap, dropout_prob=p)
    # the lse (and its gradient) is that of the undropped softmax
    check_attention_gradients(functools.partial(flash_attention, dropout_seed=seed, return_lse=True,
                                                platform=platform, **kw), q, k, v, return_lse=True,
                              dropout_mask=keep, **kw)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_dropout_same_seed_same_bits(platform):
    q, k, v = make_qkv(1, 40, 40, 2, 1, 16, torch.float16 if platform == "triton" else torch.float32, DEVICE,
                       requires_grad=False)
    a = flash_attention(q, k, v, dropout_prob=0.5, dropout_seed=7, platform=platform)
    b = flash_attention(q, k, v, dropout_prob=0.5, dropout_seed=7, platform=platform)
    c = flash_attention(q, k, v, dropout_prob=0.5, dropout_seed=8, platform=platform)
    assert torch.equal(a, b) and not torch.equal(a, c)
    # seeds differing only in the high bits draw other masks too (the CPU generator keeps 32 bits)
    d = flash_attention(q, k, v, dropout_prob=0.5, dropout_seed=7 + 2 ** 32, platform=platform)
    assert not torch.equal(a, d)


def test_dropout_kept_fraction():
    from kernelops.kernels.flash_attention.dropout import triton_keep_mask

    for p in (0.1, 0.5):
        # 2 x 2 x 256 x 256 draws: the kept fraction's standard deviation is under 0.001
        keep = triton_keep_mask(99, p, 2, 2, 256, 256, DEVICE)
        assert abs(keep.float().mean().item() - (1 - p)) < 0.01 * (1 - p)
        # independent across heads and batches (different seeds per head)
        assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])


def test_dropout_takes_numpy_scalars():
    np = pytest.importorskip("numpy")
    q = _t(1, 8, 2, 16)
    a = flash_attention(q, q, q, dropout_prob=np.float32(0.25), dropout_seed=np.int64(3), platform="torch")
    b = flash_attention(q, q, q, dropout_prob=0.25, dropout_seed=3, platform="torch")
    assert torch.equal(a, b)


@pytest.mark.gpu
def test_gpu_dropout_bf16_and_kept_fraction():
    check = test_dropout_matches_reference_with_the_same_mask
    check((2, 300, 513, 8, 2, 128, True, None, None), "triton")
    from kernelops.kernels.flash_attention.dropout import triton_keep_mask

    keep = triton_keep_mask(5, 0.17, 4, 16, 2048, 2048, "cuda")
    assert abs(keep.float().mean().item() - 0.83) < 0.01 * 0.83


@pytest.mark.gpu
def test_gpu_more_than_65535_batch_heads():
    """B * H above CUDA's 65535 limit of grid axes 1/2 (decode-shaped calls)."""
    check_call((2100, 1, 16, 32, 8, 64, True, None, None), torch.bfloat16, "triton", device="cuda")
