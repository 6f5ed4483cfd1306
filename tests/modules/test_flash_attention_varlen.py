"""Packed variable-length flash_attention against per-sequence float64 references."""

import pytest
import torch

from kernelops import flash_attention
from kernelops.modules.flash_attention import FLASH_ATTENTION
from tests.attention_checks import assert_lse_matches, assert_matches, reference
from tests.conftest import DEVICE
from tests.op_checks import BadInput, case_id, check_bad_inputs


def cum(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)


def check_varlen(lens_q, lens_k, Hq, Hkv, D, dtype, platform, device=DEVICE, shared_offsets=False, **kw):
    """A packed call (``shared_offsets``: one offsets tensor for both sides, ``lens_q == lens_k``)
    with lse and its gradient, against float64 per sequence."""
    cq, ck = cum(lens_q).to(device), cum(lens_k).to(device)
    if shared_offsets:
        assert lens_q == lens_k
        ck = cq
    q = torch.randn(sum(lens_q), Hq, D, device=device).to(dtype).requires_grad_()
    k = torch.randn(sum(lens_k), Hkv, D, device=device).to(dtype).requires_grad_()
    v = torch.randn(sum(lens_k), Hkv, D, device=device).to(dtype).requires_grad_()
    extra = {}
    bounds = {name: kw.pop(name) for name in ("max_seqlen_q", "max_seqlen_k") if name in kw}
    if kw.pop("sinks", False):
        extra["softmax_aux"] = torch.randn(Hq, device=device).requires_grad_()
    if kw.pop("alibi", False):
        extra["alibi_slopes"] = torch.rand(len(lens_q), Hq, device=device)
    out, lse = flash_attention(q, k, v, cum_seqlens_q=cq, cum_seqlens_k=ck, return_lse=True, platform=platform,
                               **kw, **extra, **bounds)
    assert out.shape == q.shape and lse.shape == (Hq, sum(lens_q))
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    ((out.float() * dout.float()).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * dlse).sum()).backward()

    ref_all = {name: {"hi": [], "lo": []} for name in ("out", "dq", "dk", "dv", "dsink")}
    for i in range(len(lens_q)):
        qs, ks = slice(cq[i].item(), cq[i + 1].item()), slice(ck[i].item(), ck[i + 1].item())
        seq_extra = dict(extra)
        if "alibi_slopes" in extra:
            seq_extra["alibi_slopes"] = extra["alibi_slopes"][i]
        args = (q[None, qs], k[None, ks], v[None, ks])
        grads_kw = dict(dout=dout[None, qs], dlse=dlse[None, :, qs], **kw, **seq_extra)
        if qs.stop == qs.start:  # nothing to compare; its keys get zero gradients
            for name in ("dk", "dv"):
                for which in ("hi", "lo"):
                    ref_all[name][which].append(torch.zeros_like(k[ks], dtype=torch.float64))
            continue
        for which, rdt in (("hi", torch.float64), ("lo", dtype)):
            o, l, g = reference(*args, dtype=rdt, **grads_kw)
            ref_all["out"][which].append(o[0])
            for name, t in zip(("dq", "dk", "dv"), g[:3]):
                ref_all[name][which].append(t[0])
            if "softmax_aux" in extra:
                ref_all["dsink"][which].append(g[3])
            if which == "hi":
                assert_lse_matches(lse[:, qs], l[0], dtype)
    assert_matches("out", out, torch.cat(ref_all["out"]["hi"]), torch.cat(ref_all["out"]["lo"]), dtype)
    for name, t in (("dq", q), ("dk", k), ("dv", v)):
        assert_matches(name, t.grad, torch.cat(ref_all[name]["hi"]), torch.cat(ref_all[name]["lo"]), dtype)
    if "softmax_aux" in extra:
        sink = extra["softmax_aux"]
        assert_matches("dsink", sink.grad, sum(ref_all["dsink"]["hi"]), sum(ref_all["dsink"]["lo"]).float(),
                       torch.float32)


LENGTHS = [([5, 0, 37, 1, 20], [9, 3, 37, 1, 44]), ([64, 17], [64, 17]), ([1], [77]), ([33, 50, 2], [33, 50, 2])]
MODES = {
    "full": dict(),
    "causal": dict(causal=True),
    "window": dict(sliding_window=(7, 3)),
    "causal-softcap-sinks": dict(causal=True, logits_soft_cap=15.0, sinks=True),
    "alibi-window": dict(sliding_window=(12, None), alibi=True),
}


@pytest.mark.parametrize("platform", ["triton", "torch"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda lens: f"q{lens[0]}-k{lens[1]}")
def test_varlen_matches_per_sequence_reference(lengths, mode, platform):
    check_varlen(*lengths, 4, 2, 16, torch.float32, platform, **MODES[mode])


def test_varlen_fp16_mqa():
    check_varlen([40, 1, 0, 29], [52, 7, 5, 29], 4, 1, 32, torch.float16, "triton", causal=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("mode", list(MODES))
def test_gpu_varlen(dtype, D, mode):
    gen = torch.Generator().manual_seed(D)
    lens = torch.randint(0, 700, (9,), generator=gen).tolist() + [1, 0]
    check_varlen(lens, lens, 8, 2, D, dtype, "triton", device="cuda", **MODES[mode])


def _packed(total_q=10, total_k=12):
    return torch.randn(total_q, 2, 16), torch.randn(total_k, 1, 16), torch.randn(total_k, 1, 16)


def _offsets(*values):
    return torch.tensor(values, dtype=torch.int32)


#: a valid packed call: query [10, 2, 16], key/value [12, 1, 16], one sequence each side
PACKED = dict(zip(("query", "key", "value"), _packed()), cum_seqlens_q=_offsets(0, 10), cum_seqlens_k=_offsets(0, 12))
BAD = [
    BadInput(dict(cum_seqlens_q=torch.tensor([0, 10])), ValueError, ["cum_seqlens_q", "int32", "torch.int64",
                                                                     "shape (2,)"]),
    BadInput(dict(cum_seqlens_q=_offsets(1, 10)), ValueError, ["start at 0", "cum_seqlens_q[0]=1"]),
    BadInput(dict(cum_seqlens_q=_offsets(0, 6, 4, 10), cum_seqlens_k=_offsets(0, 4, 8, 12)), ValueError,
             ["non-decreasing", "cum_seqlens_q=[0, 6, 4, 10]"]),
    BadInput(dict(cum_seqlens_q=_offsets(0, 9)), ValueError, ["cum_seqlens_q[-1]=9", "token count 10",
                                                              "query.shape=(10, 2, 16)"]),
    BadInput(dict(cum_seqlens_q=_offsets(0, 5, 10)), ValueError, ["cum_seqlens_q and cum_seqlens_k",
                                                                  "same number of sequences", "cum_seqlens_q.shape=(3,)",
                                                                  "cum_seqlens_k.shape=(2,)"]),
    BadInput(dict(cum_seqlens_k=None), ValueError, ["cum_seqlens_q and cum_seqlens_k must be given together"]),
    BadInput(dict(bias=torch.zeros(1, 1, 10, 12)), ValueError, ["bias.shape=(1, 1, 10, 12)", "not supported with packed",
                                                                    "query.shape=(10, 2, 16)"]),
    BadInput(dict(cum_seqlens_q=_offsets(0, 4, 10), cum_seqlens_k=_offsets(0, 6, 12), max_seqlen_q=5, max_seqlen_k=6),
             ValueError, ["cum_seqlens_q", "6 long", "more than max_seqlen=5"]),
    BadInput(dict(max_seqlen_q=10), ValueError, ["max_seqlen_q and max_seqlen_k must be given together"]),
    BadInput(dict(max_seqlen_q=-1, max_seqlen_k=12), ValueError, ["max_seqlen_q", "non-negative int", "-1"]),
]


@pytest.mark.parametrize("case", BAD, ids=case_id)
def test_bad_cum_seqlens(case):
    check_bad_inputs(flash_attention, [case], PACKED, op=FLASH_ATTENTION)


def test_packed_arguments_with_dense_tensors_are_refused():
    q = torch.randn(1, 10, 2, 16)
    cu = _offsets(0, 10)
    check_bad_inputs(flash_attention, [
        BadInput(dict(max_seqlen_q=10, max_seqlen_k=10), ValueError,
                 ["max_seqlen_q/max_seqlen_k go with packed sequences"]),
        BadInput(dict(cum_seqlens_q=cu, cum_seqlens_k=cu), ValueError, ["3-D", "query.shape=(1, 10, 2, 16)"]),
    ], dict(query=q, key=q, value=q), op=FLASH_ATTENTION)


@pytest.mark.parametrize("mode", ["full", "causal"])
def test_varlen_with_max_seqlen_bounds(mode):
    """With max_seqlen given (CUDA: no host sync, device-side checks) results are the same; a
    bound above the longest sequence is fine."""
    lens_q, lens_k = [5, 0, 37, 1, 20], [9, 3, 37, 1, 44]
    check_varlen(lens_q, lens_k, 4, 2, 16, torch.float32, "triton", max_seqlen_q=40, max_seqlen_k=44, **MODES[mode])


@pytest.mark.parametrize("change, error, words", [
    (lambda q, k, v: (q, k.half(), v.half()), TypeError, "share a dtype"),
    (lambda q, k, v: (q, k[:, :, :8], v[:, :, :8]), ValueError, "head dims differ"),
    (lambda q, k, v: (q[:, :1], k.expand(-1, 2, -1), v.expand(-1, 2, -1)), ValueError, "multiple of key/value heads"),
])
def test_packed_errors_show_the_shapes_as_given(change, error, words):
    """Packed calls are checked with the dense call's rules; the messages show the 3-D shapes the
    caller passed, not the 4-D views the checks read."""
    q, k, v = change(*_packed())
    cu = torch.tensor([0, q.shape[0]], dtype=torch.int32)
    cu_k = torch.tensor([0, k.shape[0]], dtype=torch.int32)
    with pytest.raises(error, match=words) as info:
        flash_attention(q, k, v, cum_seqlens_q=cu, cum_seqlens_k=cu_k)
    assert f"query.shape={tuple(q.shape)}" in str(info.value) and "(1, " not in str(info.value)


def test_varlen_dropout_uses_per_sequence_masks():
    """Packed dropout draws, for sequence i, the mask a dense launch draws for batch row i."""
    from kernelops.kernels.flash_attention.dropout import triton_keep_mask

    lens_q, lens_k, Hq, Hkv, D, p, seed = [23, 0, 41], [30, 5, 41], 4, 2, 16, 0.25, 77
    cq, ck = cum(lens_q), cum(lens_k)
    q = torch.randn(sum(lens_q), Hq, D, device=DEVICE, requires_grad=True)
    k = torch.randn(sum(lens_k), Hkv, D, device=DEVICE, requires_grad=True)
    v = torch.randn(sum(lens_k), Hkv, D, device=DEVICE, requires_grad=True)
    out = flash_attention(q, k, v, causal=True, cum_seqlens_q=cq, cum_seqlens_k=ck, dropout_prob=p, dropout_seed=seed,
                          platform="triton")
    dout = torch.randn_like(out)
    out.backward(dout)
    for i in range(len(lens_q)):
        qs, ks = slice(cq[i].item(), cq[i + 1].item()), slice(ck[i].item(), ck[i + 1].item())
        if qs.stop == qs.start:
            continue
        keep = triton_keep_mask(seed, p, i + 1, Hq, lens_q[i], lens_k[i], DEVICE)[i:i + 1]
        kw = dict(causal=True, dropout_prob=p, dropout_mask=keep, dout=dout[None, qs])
        ref, _, grads = reference(q[None, qs], k[None, ks], v[None, ks], **kw)
        low, _, low_grads = reference(q[None, qs], k[None, ks], v[None, ks], dtype=torch.float32, **kw)
        assert_matches("out", out[qs], ref[0], low[0], torch.float32)
        assert_matches("dq", q.grad[qs], grads[0][0], low_grads[0][0], torch.float32)
        # dk/dv of sequence i come only from sequence i's queries
        assert_matches("dk", k.grad[ks], grads[1][0], low_grads[1][0], torch.float32)
        assert_matches("dv", v.grad[ks], grads[2][0], low_grads[2][0], torch.float32)
