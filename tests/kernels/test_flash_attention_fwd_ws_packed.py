"""The warp-specialised forward over packed sequences (fwd_ws.flash_attention_fwd_ws_packed): the
library's gate (CPU) and, on an sm_90 GPU, the kernel and the library path against float64 per
sequence."""

import pytest
import torch

from kernelops.kernels.flash_attention import dispatch, fwd_ws, ws_common
from kernelops.modules.flash_attention import FLASH_ATTENTION
from tests.attention_checks import assert_lse_matches, assert_matches, reference
from tests.modules.test_flash_attention_ws_choice import H200, A100, launch_spy, needs_gluon, needs_sm90


def _offsets(lengths, device="cpu"):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)


def _packed_inputs(lengths, D=128, Hq=16, Hkv=4, same=True, dtype=torch.bfloat16, **kw):
    T = sum(lengths)
    q = torch.randn(T, Hq, D).to(dtype)
    k = torch.randn(T, Hkv, D).to(dtype)
    cu = _offsets(lengths)
    return FLASH_ATTENTION.prepare(query=q, key=k, value=k, cum_seqlens_q=cu, cum_seqlens_k=cu if same else cu.clone(),
                                   **kw)


@needs_gluon
@pytest.mark.parametrize("extra, device, want", [
    ({"causal": True}, H200, True),
    ({}, H200, True),                                   # full attention
    ({"causal": True, "same": False}, H200, True),      # two offsets tensors (per-side lengths)
    ({"causal": True, "sliding_window": 256}, H200, True),           # a causal window (CAUSAL == 2)
    ({"sliding_window": (255, 16)}, H200, False),                    # a right window
    ({"causal": True, "dropout_prob": 0.1}, H200, False),
    ({"causal": True, "D": 96}, H200, False),
    ({"causal": True, "dtype": torch.float32}, H200, False),
    ({"causal": True}, A100, False),
    ({"causal": True, "Hq": 1, "Hkv": 1}, H200, False),  # under the forward's FLOP floor
])
def test_packed_rule(monkeypatch, extra, device, want):
    inputs = _packed_inputs([1000, 3096], **extra)
    assert FLASH_ATTENTION.ws_auto(inputs, device) is want
    # the fused backward (D=256: bwd_d256's) under the same conditions
    assert FLASH_ATTENTION.ws_auto(inputs, device, backward=True) is want


@needs_gluon
def test_flop_floor_counts_the_keys_of_two_offsets_tensors():
    """A short query chunk over a long prefix (two offsets tensors: 256 queries over 16k keys) is
    judged by the keys its queries see, so it clears the FLOP floor; the same queries over their
    own keys (one offsets tensor) do not."""
    q = torch.randn(256, 16, 128).to(torch.bfloat16)
    cu_q = _offsets([128, 128])
    for k, cu_k, want in ((torch.randn(16384, 4, 128), _offsets([8192, 8192]), True),
                          (torch.randn(256, 4, 128), cu_q, False)):
        inputs = FLASH_ATTENTION.prepare(query=q, key=k.to(q.dtype), value=k.to(q.dtype), cum_seqlens_q=cu_q,
                                         cum_seqlens_k=cu_k, causal=True)
        assert FLASH_ATTENTION.ws_auto(inputs, H200) is want


@needs_gluon
@pytest.mark.parametrize("D, want", [(256, True), (96, False)])
def test_packed_backward_rule_takes_d256(D, want):
    inputs = _packed_inputs([1000, 3096], D=D, Hq=8, causal=True)
    assert FLASH_ATTENTION.ws_auto(inputs, H200) is want
    assert FLASH_ATTENTION.ws_auto(inputs, H200, backward=True) is want


def test_dispatcher_declines_cpu_tensors():
    q, k = torch.randn(64, 2, 64), torch.randn(64, 1, 64)
    cu = _offsets([30, 34])
    band = dict(softmax_scale=0.125, win_left=1 << 30, win_right=0, cum_seqlens_q=cu, cum_seqlens_k=cu)
    assert not ws_common.ws_packed_supported(q, k, k, cu, cu)  # CPU tensors
    assert dispatch.ws_packed_forward(q, k, k, band) is None


def test_packed_gate_needs_one_offsets_tensor(monkeypatch):
    """With the tensor checks passed (as on an sm_90 GPU), the gate takes one offsets tensor (or a
    view of the same values) and refuses a copy, other dtypes, and offsets beyond the schedule's cap;
    with ``two_offsets`` (the forward's RAGGED == 3) it takes two tensors of one length and any
    token counts; the dispatcher (``dispatch.ws_packed_forward``) runs the forward with either and
    refuses the score terms the kernel lacks."""
    from kernelops.kernels.flash_attention.varlen import WS_PACKED_MAX_SEQS

    monkeypatch.setattr(ws_common, "ws_supported", lambda *args, **kw: True)
    q, k = torch.randn(64, 2, 64), torch.randn(64, 1, 64)
    cu = _offsets([30, 34])
    assert ws_common.ws_packed_supported(q, k, k, cu, cu)
    assert ws_common.ws_packed_supported(q, k, k, cu, cu[:])  # a view of the same values
    assert not ws_common.ws_packed_supported(q, k, k, cu, cu.clone())  # equal values, another tensor
    assert not ws_common.ws_packed_supported(q, k, k, cu.long(), cu.long())
    assert not ws_common.ws_packed_supported(q, k[:40], k[:40], cu, cu)  # token counts differ
    many = torch.arange(WS_PACKED_MAX_SEQS + 2, dtype=torch.int32)
    assert not ws_common.ws_packed_supported(q, k, k, many, many)
    cu_k = _offsets([10, 30])
    assert ws_common.ws_packed_supported(q, k[:40], k[:40], cu, cu_k, two_offsets=True)
    assert ws_common.ws_packed_supported(q, k, k, cu, cu.clone(), two_offsets=True)
    assert not ws_common.ws_packed_supported(q, k, k, cu, _offsets([10, 30, 24]), two_offsets=True)  # 3 sequences
    assert not ws_common.ws_packed_supported(q, k, k, cu, cu_k.long(), two_offsets=True)
    assert not ws_common.ws_packed_supported(q, k[:40], k[:39], cu, cu_k, two_offsets=True)  # k and v differ
    calls = []
    monkeypatch.setattr(dispatch, "flash_attention_fwd_ws_packed", lambda *args, **kw: calls.append(kw) or "ws")
    band = dict(softmax_scale=0.125, win_left=1 << 30, win_right=0, cum_seqlens_q=cu, cum_seqlens_k=cu)
    assert dispatch.ws_packed_forward(q, k, k, band) == "ws" and calls[-1]["cum_seqlens_k"] is None
    assert dispatch.ws_packed_forward(q, k, k, {**band, "win_right": 1 << 30}) == "ws"  # full attention
    other = cu.clone()
    assert dispatch.ws_packed_forward(q, k, k, {**band, "cum_seqlens_k": other}) == "ws"
    assert calls[-1]["cum_seqlens_k"] is other  # two tensors: the keys' own offsets
    # full attention over fewer keys than queries: bottom-right rows shift by up to Tq - 1, so a right
    # window of Tk - 1 is a band (query i of 64 sees keys up to i - 24 of 40), not the full one
    short = {**band, "cum_seqlens_k": cu_k, "win_right": 39}
    assert dispatch.ws_packed_forward(q, k[:40], k[:40], short) is None
    assert dispatch.ws_packed_forward(q, k[:40], k[:40], {**short, "win_right": 63}) == "ws"
    # a causal left window (the kernel's CAUSAL == 2) runs it, with the window passed on
    assert dispatch.ws_packed_forward(q, k, k, {**band, "win_left": 10}) == "ws" and calls[-1]["window"] == 10
    assert (calls[-1]["causal"], calls[-2]["window"]) == (True, None)
    # a soft cap (the kernel's SOFTCAP) runs it, with the cap passed on
    assert dispatch.ws_packed_forward(q, k, k, {**band, "softcap": 5.0}) == "ws" and calls[-1]["softcap"] == 5.0
    for extra in ({"dropout_p": 0.1}, {"win_left": 10, "win_right": 5},
                  {"softmax_aux": torch.zeros(2)}, {"alibi_slopes": torch.zeros(2)}, {"softmax_scale": -1.0}):
        assert dispatch.ws_packed_forward(q, k, k, {**band, **extra}) is None, extra


# --- on an H100 / H200 ------------------------------------------------------------------------
def _check_packed(out, lse, q, k, v, lengths, causal, scale, dtype):
    """``out [T, Hq, D]`` / ``lse [Hq, T]`` against float64 per sequence (and against the same
    computation in ``dtype`` for the tolerance)."""
    cu = _offsets(lengths)
    hi, lo = [], []
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        s = slice(cu[i].item(), cu[i + 1].item())
        args = (q[None, s], k[None, s], v[None, s])
        ref_out, ref_lse, _ = reference(*args, causal=causal, softmax_scale=scale)
        low_out, _, _ = reference(*args, dtype=dtype, causal=causal, softmax_scale=scale)
        hi.append(ref_out[0])
        lo.append(low_out[0])
        assert_lse_matches(lse[None, :, s], ref_lse, dtype)
    assert_matches("out", out, torch.cat(hi), torch.cat(lo), dtype)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("lengths, Hq, Hkv, D, causal, programs", [
    ([300, 0, 129, 128, 1, 517, 64], 4, 2, 128, True, None),
    ([300, 0, 129, 128, 1, 517, 64], 4, 2, 128, False, None),
    ([1000, 24, 255, 256], 2, 1, 64, True, 3),              # few programs: several units each
    ([777, 5, 130], 4, 4, 64, False, 2),
    ([200, 333, 1, 64], 4, 2, 256, True, None),             # 64-key blocks, one Q buffer
    ([129, 70], 2, 1, 256, False, 1),
    ([2048], 2, 2, 128, True, 5),                           # one sequence, whole tiles
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_packed_kernel_matches_float64(lengths, Hq, Hkv, D, causal, programs, dtype):
    gen = torch.Generator(device="cuda").manual_seed(sum(lengths) + D)
    T = sum(lengths)
    q, k, v = (torch.randn(T, h, D, device="cuda", generator=gen).to(dtype) for h in (Hq, Hkv, Hkv))
    cu = _offsets(lengths, "cuda")
    scale = 0.8 * D ** -0.5
    out, lse = torch.full_like(q, float("nan")), torch.full((Hq, T), float("nan"), device="cuda")
    fwd_ws.flash_attention_fwd_ws_packed(q, k, v, cu, softmax_scale=scale, causal=causal, programs=programs, out=out,
                                         lse=lse)
    _check_packed(out, lse, q, k, v, lengths, causal, scale, dtype)


@pytest.mark.gpu
@needs_sm90
def test_packed_kernel_writes_into_given_buffers_of_a_fused_projection():
    """q/k/v sliced from one packed QKV projection, out and lse given."""
    lengths, Hq, Hkv, D = [400, 90, 3], 4, 2, 128
    T = sum(lengths)
    qkv = torch.randn(T, Hq + 2 * Hkv, D, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv[:, :Hq], qkv[:, Hq:Hq + Hkv], qkv[:, Hq + Hkv:]
    out, lse = torch.full_like(q, float("nan")), torch.full((Hq, T), float("nan"), device="cuda")
    got = fwd_ws.flash_attention_fwd_ws_packed(q, k, v, _offsets(lengths, "cuda"), softmax_scale=D ** -0.5,
                                               causal=True, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    _check_packed(out, lse, q, k, v, lengths, True, D ** -0.5, torch.bfloat16)


#: per-side lengths of the two-offsets tests: fewer queries than keys (prefill after a cached
#: prefix), more (causal rows that see no key), none of either
TWO_LENGTHS = [
    ([300, 0, 129, 128, 1, 517, 64], [300, 40, 200, 128, 1000, 517, 1], 4, 2, 128, True),
    ([300, 0, 129, 128, 1, 517, 64], [300, 40, 200, 128, 1000, 517, 1], 4, 2, 128, False),
    ([200, 77, 5], [0, 300, 130], 4, 1, 64, True),
    ([200, 77, 5], [0, 300, 130], 4, 1, 64, False),
    ([1000], [1700], 2, 1, 128, True),
]


@pytest.fixture
def launches(monkeypatch):
    return launch_spy(monkeypatch, "flash_attention_fwd_ws_kernel")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("same, D, lens_k", [(True, 128, None), (False, 128, None), (True, 256, None),
                                             (False, 128, [1500, 2000, 60, 1]), (False, 256, [1500, 2000, 60, 1])],
                         ids=["one-offsets-tensor", "two", "one-offsets-tensor-D256", "two-lengths", "two-lengths-D256"])
def test_library_runs_it_for_packed_calls_and_trains(monkeypatch, launches, same, D, lens_k):
    """A packed causal call over the FLOP floor runs the kernel, and its backward the fused Gluon
    kernel (D=256: bwd_d256's), with one offsets tensor for both sides or two (per-side lengths
    too); output, lse and gradients (with an lse gradient) match float64 per sequence."""
    from tests.modules.test_flash_attention_varlen import check_varlen

    fused = launch_spy(monkeypatch, "flash_attention_bwd_d256_kernel" if D == 256 else "flash_attention_bwd_fused_kernel")
    lengths = [1500, 700, 0, 1801]
    check_varlen(lengths, lens_k or lengths, 8, 2, D, torch.bfloat16, "triton", device="cuda", shared_offsets=same,
                 causal=True)
    assert launches == ["ws"]
    assert fused == ["ws"]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("lengths, Hq, Hkv, D, causal", [
    ([300, 0, 129, 128, 1, 517, 64], 4, 2, 128, True),
    ([300, 0, 129, 128, 1, 517, 64], 4, 2, 128, False),
    ([1000, 24, 255, 256], 2, 1, 64, True),
    ([777, 5, 130], 4, 4, 64, False),
    ([2048], 2, 2, 128, True),
    # D=256 (bwd_d256's kernel, 64-key programs): partial, one-token and empty sequences, GQA
    ([300, 0, 129, 128, 1, 517, 63], 4, 2, 256, True),
    ([300, 0, 129, 128, 1, 517, 63], 4, 2, 256, False),
    ([190, 2, 65], 4, 1, 256, True),
    ([1024], 2, 2, 256, True),
])
def test_packed_fused_backward_matches_float64(monkeypatch, lengths, Hq, Hkv, D, causal):
    """The fused Gluon backward over packed sequences (flash_attention_bwd with ws and fused; at
    D=256 bwd_d256's kernel): dQ, dK and dV of every sequence against float64, with dlse, and
    nothing written past the tokens."""
    check_packed_backward(monkeypatch, lengths, lengths, Hq, Hkv, D, causal)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("lens_q, lens_k, Hq, Hkv, D, causal", TWO_LENGTHS + [
    # D=256 (bwd_d256's kernel, 64-key programs); a sequence without queries (its keys: zero gradients)
    ([190, 66, 300, 0], [64, 200, 1, 70], 4, 2, 256, True),
    ([190, 66, 300, 0], [64, 200, 1, 70], 4, 2, 256, False),
    ([129, 1023], [1000, 65], 2, 2, 256, True),
])
def test_packed_fused_backward_with_two_offsets_tensors_matches_float64(monkeypatch, lens_q, lens_k, Hq, Hkv, D,
                                                                        causal):
    """The fused Gluon backward over queries and keys delimited by two offsets tensors (the kernels'
    ``PACKED == 2``; bottom-right causal): each sequence's dQ, dK and dV against float64, with
    dlse, and nothing written past the tokens."""
    check_packed_backward(monkeypatch, lens_q, lens_k, Hq, Hkv, D, causal)


def check_packed_backward(monkeypatch, lens_q, lens_k, Hq, Hkv, D, causal, window=None, softcap=None, gain=1.0):
    """flash_attention_bwd (ws and fused) after the packed ws forward, one offsets tensor when the
    lengths agree, else two: the fused Gluon kernel runs, no gradient row past the tokens is
    written, and each sequence's gradients match float64 (a sequence without queries: its keys' are
    zero). ``window`` (causal): a left window of that many keys per sequence; ``softcap``: logits
    capped; ``gain``: the softmax scale is ``gain / sqrt(D)``."""
    from kernelops.kernels.flash_attention.dispatch import flash_attention_bwd

    fused = launch_spy(monkeypatch, "flash_attention_bwd_d256_kernel" if D == 256 else "flash_attention_bwd_fused_kernel")
    gen = torch.Generator(device="cuda").manual_seed(sum(lens_q) * 7 + sum(lens_k) + D)
    Tq, Tk, dtype, scale = sum(lens_q), sum(lens_k), torch.bfloat16, gain * D ** -0.5
    q = torch.randn(Tq, Hq, D, device="cuda", generator=gen).to(dtype)
    k, v = (torch.randn(Tk, Hkv, D, device="cuda", generator=gen).to(dtype) for _ in range(2))
    cu_q = _offsets(lens_q, "cuda")
    cu_k = cu_q if lens_q == lens_k else _offsets(lens_k, "cuda")
    out, lse = fwd_ws.flash_attention_fwd_ws_packed(q, k, v, cu_q, softmax_scale=scale, causal=causal, window=window,
                                                    softcap=softcap, cum_seqlens_k=None if cu_k is cu_q else cu_k)
    dout = torch.randn(out.shape, device="cuda", generator=gen).to(dtype)
    dlse = torch.randn(lse.shape, device="cuda", generator=gen)
    # gradients inside NaN guard rows: a row left unwritten, or a write past the tokens, shows
    guarded = [torch.full((t.shape[0] + 2, *t.shape[1:]), float("nan"), device="cuda", dtype=dtype) for t in (q, k, v)]
    dq, dk, dv = (g[1:-1] for g in guarded)
    flash_attention_bwd(q, k, v, out, dout, lse, dlse, softmax_scale=scale, win_left=1 << 30 if window is None else window,
                        win_right=0 if causal else 1 << 30, softcap=softcap, q_blocksize=64, kv_blocksize=64, num_warps=4,
                        num_stages=2, cum_seqlens_q=cu_q, cum_seqlens_k=cu_k, dq=dq, dk=dk, dv=dv, ws=True, fused=True)
    assert fused == ["ws"]
    for g in guarded:
        assert g[0].isnan().all() and g[-1].isnan().all()
    check_packed_grads((q, k, v, dout, dlse), (dq, dk, dv), lens_q, lens_k, causal, scale, dtype,
                       None if window is None else (window, 0), softcap)


def check_packed_grads(inputs, grads, lens_q, lens_k, causal, scale, dtype, sliding_window=None, softcap=None):
    """Packed gradients ``(dq, dk, dv)`` of ``(q, k, v, dout, dlse)`` (dlse may be None) against
    float64 per sequence (bottom-right causal; a sequence without queries: its keys' are zero).
    Without dlse, dq and dk of a sequence with one key are left out: there dS is the rounding left
    of dP - delta, with no relative error to judge."""
    (q, k, v, dout, dlse), (dq, dk, dv) = inputs, grads
    cq, ck = _offsets(lens_q).tolist(), _offsets(lens_k).tolist()
    for i in range(len(lens_q)):
        qs, ks = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        if qs.start == qs.stop:
            assert not dk[ks].any() and not dv[ks].any(), f"sequence {i}'s keys without queries"
            continue
        args = (q[None, qs], k[None, ks], v[None, ks])
        kw = dict(causal=causal, softmax_scale=scale, sliding_window=sliding_window, dout=dout[None, qs],
                  dlse=None if dlse is None else dlse[None, :, qs], logits_soft_cap=softcap)
        ref, low = reference(*args, **kw)[2], reference(*args, dtype=dtype, **kw)[2]
        for name, got, r, lo, rows in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low, (qs, ks, ks)):
            if rows.start < rows.stop and (name == "dv" or dlse is not None or ks.stop - ks.start > 1):
                assert_matches(f"{name} of sequence {i}", got[rows], r[0], lo[0], dtype)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("lens_q, lens_k, Hq, Hkv, D, causal", TWO_LENGTHS + [([190, 66, 300], [64, 200, 1], 2, 2, 256, True)])
def test_packed_kernel_with_two_offsets_tensors_matches_float64(lens_q, lens_k, Hq, Hkv, D, causal):
    """Queries and keys delimited by two offsets tensors (the kernel's RAGGED == 3): each sequence's
    out and lse against float64 (bottom-right causal; rows that see no key give 0 and -inf), and
    nothing written past the query tokens."""
    gen = torch.Generator(device="cuda").manual_seed(sum(lens_q) + 3 * sum(lens_k) + D)
    dtype, scale = torch.bfloat16, D ** -0.5
    Tq, Tk = sum(lens_q), sum(lens_k)
    q = torch.randn(Tq, Hq, D, device="cuda", generator=gen).to(dtype)
    k, v = (torch.randn(Tk, Hkv, D, device="cuda", generator=gen).to(dtype) for _ in range(2))
    cu_q, cu_k = _offsets(lens_q, "cuda"), _offsets(lens_k, "cuda")
    assert ws_common.ws_packed_supported(q, k, v, cu_q, cu_k, two_offsets=True)
    assert not ws_common.ws_packed_supported(q, k, v, cu_q, cu_k)  # (two tensors only with two_offsets)
    guarded = torch.full((Tq + 2, Hq, D), float("nan"), device="cuda", dtype=dtype)
    out, lse = fwd_ws.flash_attention_fwd_ws_packed(q, k, v, cu_q, softmax_scale=scale, causal=causal,
                                                    out=guarded[1:-1], cum_seqlens_k=cu_k)
    assert guarded[0].isnan().all() and guarded[-1].isnan().all()
    check_two_offsets(out, lse, q, k, v, lens_q, lens_k, causal, scale, dtype)


def check_two_offsets(out, lse, q, k, v, lens_q, lens_k, causal, scale, dtype, sliding_window=None,
                      logits_soft_cap=None):
    """A packed forward's ``out [Tq, Hq, D]`` / ``lse [Hq, Tq]`` with per-side lengths against float64
    per sequence (bottom-right causal, within ``sliding_window`` when given, logits capped by
    ``logits_soft_cap``; rows that see no key: 0 and -inf)."""
    cq, ck = _offsets(lens_q).tolist(), _offsets(lens_k).tolist()
    for i in range(len(lens_q)):
        qs, ks = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        if qs.start == qs.stop:
            continue
        args = (q[None, qs], k[None, ks], v[None, ks])
        kw = dict(causal=causal, softmax_scale=scale, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap)
        ref_out, ref_lse, _ = reference(*args, **kw)
        low_out, _, _ = reference(*args, **kw, dtype=dtype)
        assert_matches(f"out of sequence {i}", out[None, qs], ref_out, low_out, dtype)
        assert_lse_matches(lse[None, :, qs], ref_lse, dtype)
