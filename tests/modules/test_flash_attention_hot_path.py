"""The executor's hot path for flash_attention: a repeated plain call skips prepare and runs a
remembered launcher; it must give what the full path gives, and never hide an argument error."""

import functools

import pytest
import torch

from kernelops import FlashAttentionConfig, flash_attention
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops import Executor, device_info, set_default_executor
from kernelops.ops.selectors import ConfigSelectorChain
from tests.attention_checks import assert_matches, check_attention_gradients, make_qkv, reference
from tests.conftest import DEVICE

DTYPE = torch.float32


def check_out(out, q, k, v, **kw):
    assert_matches("out", out, reference(q, k, v, **kw)[0], reference(q, k, v, dtype=DTYPE, **kw)[0], DTYPE)


@pytest.fixture
def executor():
    """A fresh default executor, so launchers remembered by other tests do not leak in."""
    ex = Executor(ConfigSelectorChain(policy="never"))
    previous = set_default_executor(ex)
    yield ex
    set_default_executor(previous)


@pytest.mark.parametrize("platform", ["triton", "torch"])
@pytest.mark.parametrize("seq_q", [40, 3], ids=["dense", "decode"])
@pytest.mark.parametrize("kw", [dict(causal=True), dict(sliding_window=(9, 4)), dict(logits_soft_cap=3.0),
                                dict(causal=True, softmax_scale=0.3)], ids=str)
def test_hot_path_matches_float64_forward_and_backward(executor, kw, seq_q, platform):
    q, k, v = make_qkv(1, seq_q, 56, 4, 2, 16, DTYPE, DEVICE)
    fn = functools.partial(flash_attention, return_lse=True, platform=platform, **kw)
    for call in range(3):  # the first call fills the table, the next ones take the hot path
        check_attention_gradients(fn, q, k, v, return_lse=True, **kw)
    assert len(executor._launchers) == 1  # noqa: SLF001


@pytest.mark.parametrize("seq_q", [24, 2], ids=["dense", "decode"])
@pytest.mark.parametrize("platform", ["triton", "torch"])
def test_no_grad_hot_path_matches_float64(executor, seq_q, platform):
    """Without grad the hot path calls the bound launcher directly (no autograd)."""
    q, k, v = make_qkv(2, seq_q, 33, 4, 1, 16, DTYPE, DEVICE, requires_grad=False)
    with torch.no_grad():
        outs = [flash_attention(q, k, v, causal=True, platform=platform) for _ in range(3)]
    for out in outs:
        check_out(out, q, k, v, causal=True)
    assert len(executor._launchers) == 1  # noqa: SLF001


def test_grad_and_no_grad_calls_get_separate_launchers(executor):
    q, k, v = make_qkv(1, 24, 24, 2, 2, 16, DTYPE, DEVICE, requires_grad=False)
    with torch.no_grad():
        flash_attention(q, k, v, causal=True)
        flash_attention(q, k, v, causal=True)
    qg = q.clone().requires_grad_()
    flash_attention(qg, k, v, causal=True)
    calls = []
    original = type(executor).__call__
    with pytest.MonkeyPatch.context() as patch:  # the next call must not go through the executor
        patch.setattr(type(executor), "__call__", lambda self, op, **a: calls.append(op) or original(self, op, **a))
        out = flash_attention(qg, k, v, causal=True)  # hot path with grad: must still build the graph
    assert calls == [] and out.grad_fn is not None
    dout = torch.randn_like(out)
    out.backward(dout)
    assert k.grad is None and v.grad is None
    ref_out, _, (ref_dq, _, _) = reference(qg, k, v, causal=True, dout=dout)
    low_out, _, (low_dq, _, _) = reference(qg, k, v, causal=True, dout=dout, dtype=DTYPE)
    assert_matches("out", out, ref_out, low_out, DTYPE)
    assert_matches("dq", qg.grad, ref_dq, low_dq, DTYPE)
    assert len(executor._launchers) == 2  # noqa: SLF001


def test_argument_errors_are_raised_on_every_call(executor):
    q, k, v = make_qkv(1, 16, 16, 2, 2, 16, DTYPE, DEVICE, requires_grad=False)
    flash_attention(q, k, v, softmax_scale=1.0)
    flash_attention(q, k, v, softmax_scale=1.0)
    for _ in range(2):
        with pytest.raises(ValueError, match="softmax_scale must be a finite number"):
            flash_attention(q, k, v, softmax_scale=True)  # == 1.0 and hashes alike; the type differs
        with pytest.raises(ValueError, match="softmax_scale must be a finite number"):
            flash_attention(q, k, v, softmax_scale=float("nan"))
        with pytest.raises(ValueError, match="key and value must have the same shape"):
            flash_attention(q, k, v[:, :8], softmax_scale=1.0)


def test_calls_with_extra_tensors_take_the_full_path(executor):
    q, k, v = make_qkv(1, 16, 16, 2, 2, 16, DTYPE, DEVICE, requires_grad=False)
    slopes = torch.rand(2, device=DEVICE)
    for _ in range(2):
        out = flash_attention(q, k, v, alibi_slopes=slopes)
    assert executor._launchers == {}  # noqa: SLF001
    check_out(out, q, k, v, alibi_slopes=slopes)
    assert FLASH_ATTENTION.signature(dict(query=q, key=k, value=v, dropout_prob=0.1)) is None


def test_explicit_cfg_does_not_use_or_fill_the_table(executor):
    q, k, v = make_qkv(1, 16, 16, 2, 2, 16, DTYPE, DEVICE, requires_grad=False)
    cfg = FLASH_ATTENTION.heuristic_config(FLASH_ATTENTION.prepare(query=q, key=k, value=v), device_info(q.device))
    assert isinstance(cfg, FlashAttentionConfig)
    for _ in range(2):
        check_out(flash_attention(q, k, v, cfg=cfg), q, k, v)
    assert executor._launchers == {}  # noqa: SLF001


def _packed(lengths, H=2, D=16, requires_grad=True):
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    q, k, v = (torch.randn(sum(lengths), H, D, device=DEVICE, dtype=DTYPE, requires_grad=requires_grad)
               for _ in range(3))
    return q, k, v, cu


@pytest.mark.parametrize("grad", [True, False])
def test_packed_calls_with_bounds_take_the_hot_path(executor, grad):
    """Packed calls with max_seqlen given are remembered; each call's offsets (same shape, new
    values) still give per-sequence float64 results."""
    # 40 tokens, 4 sequences each time (no 1-token sequence: its dq is exactly 0, which a relative error cannot judge)
    for lengths in ([7, 0, 20, 13], [20, 20, 0, 0], [2, 3, 4, 31]):
        q, k, v, cu = _packed(lengths, requires_grad=grad)
        with torch.set_grad_enabled(grad):
            out = flash_attention(q, k, v, causal=True, cum_seqlens_q=cu, cum_seqlens_k=cu, max_seqlen_q=34,
                                  max_seqlen_k=34)
        assert (out.grad_fn is not None) == grad
        dout = torch.randn_like(out)
        if grad:
            out.backward(dout)
        for i, n in enumerate(lengths):
            if n:
                s = slice(int(cu[i]), int(cu[i + 1]))
                args = (q[None, s].detach(), k[None, s].detach(), v[None, s].detach())
                check_out(out[None, s], *args, causal=True)
                if grad:
                    _, _, hi = reference(*args, dout=dout[None, s], causal=True)
                    _, _, lo = reference(*args, dout=dout[None, s], causal=True, dtype=DTYPE)
                    for name, t, ref, low in zip(("dq", "dk", "dv"), (q, k, v), hi, lo):
                        assert_matches(name, t.grad[None, s], ref, low, DTYPE)
    assert len(executor._launchers) == 1  # noqa: SLF001


@pytest.mark.skipif(DEVICE == "cuda", reason="a failed device-side assert poisons the CUDA context")
def test_packed_hot_path_still_checks_the_offsets(executor):
    q, k, v, cu = _packed([10, 30], requires_grad=False)
    for _ in range(2):
        flash_attention(q, k, v, cum_seqlens_q=cu, cum_seqlens_k=cu, max_seqlen_q=30, max_seqlen_k=30)
    assert len(executor._launchers) == 1  # noqa: SLF001
    with pytest.raises(ValueError, match="more than max_seqlen"):
        bad = torch.tensor([0, 5, 40], dtype=torch.int32, device=DEVICE)  # 35 > 30
        flash_attention(q, k, v, cum_seqlens_q=bad, cum_seqlens_k=bad, max_seqlen_q=30, max_seqlen_k=30)
    with pytest.raises(ValueError, match="must equal the packed token count"):
        bad = torch.tensor([0, 5, 39], dtype=torch.int32, device=DEVICE)
        flash_attention(q, k, v, cum_seqlens_q=bad, cum_seqlens_k=cu, max_seqlen_q=30, max_seqlen_k=30)
    with pytest.raises(ValueError, match="more than max_seqlen"):  # same bucket as 30: the call's own bound counts
        flash_attention(q, k, v, cum_seqlens_q=cu, cum_seqlens_k=cu, max_seqlen_q=29, max_seqlen_k=30)
    with pytest.raises(ValueError, match="non-negative int"):
        flash_attention(q, k, v, cum_seqlens_q=cu, cum_seqlens_k=cu, max_seqlen_q=-1, max_seqlen_k=30)


def test_packed_bounds_in_one_bucket_share_a_launcher(executor):
    q, k, v, cu = _packed([10, 30], requires_grad=False)
    for bound in (30, 31, 32):
        out = flash_attention(q, k, v, cum_seqlens_q=cu, cum_seqlens_k=cu, max_seqlen_q=bound, max_seqlen_k=bound)
        check_out(out[None, 10:], q[None, 10:], k[None, 10:], v[None, 10:])
    assert len(executor._launchers) == 1  # noqa: SLF001


def test_strided_offsets_give_per_sequence_results(executor):
    """Offsets viewed with a stride other than 1 (a column of a wider tensor) are read correctly."""
    q, k, v, cu = _packed([10, 0, 30], requires_grad=False)
    wide = torch.stack([cu, torch.full_like(cu, 99)], 1)[:, 0]
    assert wide.stride(0) == 2
    for bounds in (dict(), dict(max_seqlen_q=30, max_seqlen_k=30)):
        out = flash_attention(q, k, v, causal=True, cum_seqlens_q=wide, cum_seqlens_k=wide, **bounds)
        check_out(out[None, :10], q[None, :10], k[None, :10], v[None, :10], causal=True)
        check_out(out[None, 10:], q[None, 10:], k[None, 10:], v[None, 10:], causal=True)


def test_a_window_of_floats_is_refused_after_the_same_ints_were_remembered(executor):
    q, k, v = make_qkv(1, 16, 16, 2, 2, 16, DTYPE, DEVICE, requires_grad=False)
    for _ in range(2):
        flash_attention(q, k, v, sliding_window=(1, 3))
    with pytest.raises((TypeError, ValueError)):
        flash_attention(q, k, v, sliding_window=(1.0, 3))


def test_packed_calls_without_bounds_take_the_hot_path_once_remembered(executor, monkeypatch):
    """Without max_seqlen, packed calls take the full path until their offsets' longest lengths
    are remembered (packed_offsets.LONGEST: CUDA offsets, after the first call reads them; put
    there by hand on the CPU, where nothing is remembered); then the hot path, until the offsets
    change in place. Results match float64 per sequence each time."""
    from kernelops.modules import packed_offsets

    monkeypatch.setattr(packed_offsets, "LONGEST", packed_offsets.LongestLengths())
    q, k, v, cu = _packed([10, 30], requires_grad=False)
    flash_attention(q, k, v, cum_seqlens_q=cu, cum_seqlens_k=cu)
    if DEVICE != "cuda":
        assert executor._launchers == {}  # noqa: SLF001
        packed_offsets.LONGEST.put(cu, cu, (30, 30))
    for lengths in ([10, 30], [10, 30], [25, 15]):
        if lengths == [25, 15]:  # in place: the remembered lengths no longer answer
            cu[1] = 25
            assert packed_offsets.LONGEST.get(cu, cu) is None
        out = flash_attention(q, k, v, causal=True, cum_seqlens_q=cu, cum_seqlens_k=cu)
        assert len(executor._launchers) == 1  # noqa: SLF001
        a, b = lengths[0], sum(lengths)
        check_out(out[None, :a], q[None, :a], k[None, :a], v[None, :a], causal=True)
        check_out(out[None, a:b], q[None, a:b], k[None, a:b], v[None, a:b], causal=True)


def test_plain_calls_find_the_launcher_without_the_executor_call(executor, monkeypatch):
    """flash_attention() builds the signature FlashAttention.signature gives for its keyword
    arguments and runs the remembered launcher itself; an overlay or cfg= still goes the long way."""
    from kernelops.ops.selectors import config_overlay

    q, k, v = make_qkv(1, 24, 24, 2, 1, 16, DTYPE, DEVICE, requires_grad=False)
    kw = dict(causal=True, sliding_window=[5, None], logits_soft_cap=4.0, softmax_scale=0.2, return_lse=True)
    first = flash_attention(q, k, v, **kw)
    assert len(executor._launchers) == 1  # noqa: SLF001
    calls = []
    original = type(executor).__call__
    monkeypatch.setattr(type(executor), "__call__", lambda self, op, **a: calls.append(op) or original(self, op, **a))
    out, lse = flash_attention(q, k, v, **kw)  # fresh values, same signature: no executor call
    assert calls == []
    torch.testing.assert_close(out, first[0], rtol=0, atol=0)
    torch.testing.assert_close(lse, first[1], rtol=0, atol=0)
    check_out(out, q, k, v, causal=True, sliding_window=(5, None), logits_soft_cap=4.0, softmax_scale=0.2)
    with config_overlay({}):  # an empty overlay is no overlay
        flash_attention(q, k, v, **kw)
    assert calls == []
    cfg = FLASH_ATTENTION.heuristic_config(FLASH_ATTENTION.prepare(query=q, key=k, value=v), device_info(q.device))
    with config_overlay({FLASH_ATTENTION.name: cfg}):
        flash_attention(q, k, v, **kw)
    flash_attention(q, k, v, cfg=cfg, **kw)
    with pytest.raises(TypeError, match="must share a dtype"):  # a signature never remembered: the full path
        flash_attention(q, k, v.double(), **kw)
    assert len(calls) == 3


def test_a_subclassed_default_executor_sees_every_call():
    """flash_attention()'s own lookup is for the Executor class itself: a subclass that overrides
    __call__ (to count, log or change calls) gets every call, and a stand-in with only __call__
    works too."""
    calls = []

    class Counting(Executor):
        def __call__(self, op, **kwargs):
            calls.append(op.name)
            return super().__call__(op, **kwargs)

    class StandIn:
        def __call__(self, op, **kwargs):
            calls.append("stand-in")
            return inner(op, **kwargs)

    q, k, v = make_qkv(1, 16, 16, 2, 2, 16, DTYPE, DEVICE, requires_grad=False)
    inner = Counting(ConfigSelectorChain(policy="never"))
    previous = set_default_executor(inner)
    try:
        outs = [flash_attention(q, k, v, causal=True) for _ in range(3)]
        assert calls == ["flash_attention"] * 3 and len(inner._launchers) == 1  # noqa: SLF001
        set_default_executor(StandIn())
        outs.append(flash_attention(q, k, v, causal=True))
        assert calls[3:] == ["stand-in", "flash_attention"]
    finally:
        set_default_executor(previous)
    for out in outs:
        check_out(out, q, k, v, causal=True)
