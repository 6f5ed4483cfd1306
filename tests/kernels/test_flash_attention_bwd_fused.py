"""The fused Gluon backward (kernels/flash_attention/bwd_fused.py): dQ, dK and dV from one
warp-specialised kernel, dQ added in float32 by TMA reduce-add. Gradients against float64 on an
sm_90 GPU (bf16 and fp16, causal, full, GQA, sliding windows, D 64/128, outputs poisoned with NaN
first); argument checks everywhere."""

import pytest
import torch

from kernelops.kernels.flash_attention import bwd_d256, bwd_fused
from kernelops.kernels.flash_attention.dispatch import flash_attention_bwd
from tests.attention_checks import assert_matches, make_qkv, reference
from tests.modules.test_flash_attention_ws_choice import launch_spy, needs_sm90


def _case(B, S, Hq, Hkv, D, causal, window, dtype):
    from kernelops import flash_attention

    q, k, v = make_qkv(B, S, S, Hq, Hkv, D, dtype, "cuda", requires_grad=False)
    band = dict(causal=causal, sliding_window=(window, 0) if window is not None else None)
    out, lse = flash_attention(q, k, v, return_lse=True, **band)
    return q, k, v, out, lse, torch.randn_like(out)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("B, S, Hq, Hkv, D, causal, window", [
    (2, 256, 4, 4, 128, False, None), (2, 384, 4, 1, 128, True, None), (1, 512, 8, 2, 64, True, None),
    (1, 128, 2, 2, 64, False, None), (2, 512, 4, 2, 128, True, 100), (1, 384, 2, 1, 64, True, 200),
    (1, 1024, 2, 2, 128, True, None)],
    ids=["full", "gqa4-causal", "d64-gqa-causal", "one-block", "window100", "d64-window200", "causal-1k"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_matches_float64(B, S, Hq, Hkv, D, causal, window, dtype):
    q, k, v, out, lse, dout = _case(B, S, Hq, Hkv, D, causal, window, dtype)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    bwd_fused.flash_attention_bwd_fused(q, k, v, dout, lse, delta, dq, dk, dv, softmax_scale=D ** -0.5,
                                        causal=causal, win_left=window)
    assert_grads_match((dq, dk, dv), q, k, v, dout, dtype, causal=causal, sliding_window=window)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("causal, window, softcap", [(False, None, None), (True, None, None), (True, 200, None),
                                                     (True, None, 30.0)],
                         ids=["full", "causal", "window200", "causal-softcap"])
@pytest.mark.parametrize("block_q", [64, 128])
def test_d64_query_blocks_match_float64(block_q, causal, window, softcap):
    """D=64 with 64-query blocks (each warpgroup's dQ products: every query, half the columns) and
    128-query blocks (its 64 queries, every column): gradients against float64 with GQA over three
    key blocks of 128, outputs poisoned with NaN."""
    from kernelops import flash_attention

    B, S, Hq, Hkv, D = 2, 384, 4, 2, 64
    q, k, v = make_qkv(B, S, S, Hq, Hkv, D, torch.bfloat16, "cuda", requires_grad=False)
    band = dict(causal=causal, sliding_window=(window, 0) if window is not None else None)
    out, lse = flash_attention(q, k, v, return_lse=True, logits_soft_cap=softcap, **band)
    dout = torch.randn_like(out)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    bwd_fused.flash_attention_bwd_fused(q, k, v, dout, lse, delta, dq, dk, dv, softmax_scale=D ** -0.5,
                                        causal=causal, win_left=window, softcap=softcap, block_q=block_q)
    assert_grads_match((dq, dk, dv), q, k, v, dout, torch.bfloat16, f" block_q={block_q}", causal=causal,
                       sliding_window=window, logits_soft_cap=softcap)


def test_block_q_rule_and_checks():
    """128-query blocks for dense D=64 calls except GQA ones with a window, 64 elsewhere; other sizes,
    and 128 rows for packed sequences, refused before any compile."""
    rule = bwd_fused.fused_block_q
    assert rule(64, 1) == rule(64, 4) == rule(64, 1, window=True) == 128
    assert rule(64, 4, window=True) == 64
    assert rule(64, 1, split=True) == rule(64, 1, packed=True) == rule(128, 1) == 64
    stats = torch.empty(1, 4, 256)
    for D, block_q, split in ((128, 128, False), (64, 128, True), (64, 32, False), (64, 256, False)):
        q = torch.empty(1, 256, 4, D, dtype=torch.bfloat16)
        kv = torch.empty(1, 256, 2, D, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="block_q"):
            bwd_fused.flash_attention_bwd_fused(q, kv, kv, q, stats, stats, q, kv, kv, softmax_scale=0.1, causal=True,
                                                block_q=block_q, split=split, warmup_only=True)
    q, kv = torch.empty(1, 256, 4, 64, dtype=torch.bfloat16), torch.empty(1, 256, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 100, 256], dtype=torch.int32)
    with pytest.raises(ValueError, match="packed=True"):
        bwd_fused.fused_launch(q, kv, kv, q, stats, stats, torch.empty(1, 256, 4, 64), kv, kv, 0.1, True,
                               schedule=(cu, torch.empty(64, dtype=torch.int32), cu), block_q=128)
    # the rule's own choice for a packed D=64 launch: 64-query Q blocks
    launch = bwd_fused.fused_launch(q, kv, kv, q, stats, stats, torch.empty(1, 256, 4, 64), kv, kv, 0.1, True,
                                    schedule=(cu, torch.empty(64, dtype=torch.int32), cu))
    assert list(launch[2][0].block_shape) == [64, 64]


def assert_grads_match(grads, q, k, v, dout, dtype, tag="", **band):
    """``(dq, dk, dv)`` against float64 (flash-attn's rule: within a small multiple of the error of
    the same computation in ``dtype``); ``band``: the reference's causal / sliding_window."""
    _, _, ref = reference(q, k, v, dout=dout, **band)
    _, _, low = reference(q, k, v, dout=dout, dtype=dtype, **band)
    for name, got, want, lo in zip(("dq", "dk", "dv"), grads, ref, low):
        assert_matches(name + tag, got, want, lo, dtype)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("B, S, Hq, Hkv, D, causal, window, chunk", [
    (2, 384, 4, 1, 128, True, None, None), (1, 512, 8, 2, 64, True, None, 3), (2, 512, 4, 2, 128, True, 100, None),
    (1, 256, 6, 2, 64, False, None, None), (2, 256, 2, 2, 128, True, None, 1)],
    ids=["gqa4-causal", "d64-gqa4-chunk3", "window100", "d64-gqa3-full", "no-gqa-chunk1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_split_heads_match_float64(B, S, Hq, Hkv, D, causal, window, chunk, dtype):
    """``split=True``: one query head per program, dK and dV added into a float32 workspace by every
    head of the group (outputs poisoned with NaN; chunks that split groups across chunks too)."""
    q, k, v, out, lse, dout = _case(B, S, Hq, Hkv, D, causal, window, dtype)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    bwd_fused.flash_attention_bwd_fused(q, k, v, dout, lse, delta, dq, dk, dv, softmax_scale=D ** -0.5,
                                        causal=causal, win_left=window, chunk=chunk, split=True)
    assert_grads_match((dq, dk, dv), q, k, v, dout, dtype, " split", causal=causal, sliding_window=window)


def test_split_rule():
    """D=128 GQA calls without a window split from :data:`bwd_fused.SPLIT_MIN_KEYS` keys, causal ones
    with a group of 8 from :data:`bwd_fused.SPLIT_MIN_KEYS_GROUP8`; windowed, D=64 and GQA-1 calls
    never."""
    at, at8 = bwd_fused.SPLIT_MIN_KEYS, bwd_fused.SPLIT_MIN_KEYS_GROUP8
    split = bwd_fused.fused_split

    def shapes(s, hq, hkv, d=128):
        return (1, s, hq, d), (1, s, hkv, d)

    assert split(*shapes(at, 32, 8), True) and split(*shapes(at, 32, 8), False)
    assert not split(*shapes(at - 128, 32, 8), True) and not split(*shapes(at - 128, 32, 8), False)
    assert split(*shapes(at8, 16, 2), True) and not split(*shapes(at8 - 128, 16, 2), True)
    assert not split(*shapes(at8, 16, 2), False)  # GQA 8 without causality: from SPLIT_MIN_KEYS
    assert not split(*shapes(at, 32, 8), True, 1024)
    assert not split(*shapes(2 * at, 32, 4, 64), True)
    assert not split(*shapes(2 * at, 8, 8), True)


def use_plans(monkeypatch, on: bool) -> None:
    """Launch plans on (:mod:`plans`' makers) or off: every plan lookup of the dispatchers and of the
    eager autograd Function finds none, so calls take the general path."""
    from kernelops.kernels.flash_attention import dispatch, plans, registration

    for module in (dispatch, registration):  # (they hold the plan makers by name)
        for name in ("bwd_plan", "fwd_ws_plan", "packed_bwd_plan", "packed_fwd_plan", "ptr_fwd_plan", "decode_plan"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(plans, name) if on else lambda *args: None)


def assert_splits_on_every_path(monkeypatch, kernel: str, k, step) -> None:
    """Run ``step(tag)`` (one backward, checking its gradients) on the general path, then a plan's
    first and bound calls, and assert that each launched ``kernel`` once over a float32 dK/dV
    workspace of ``k``'s shape (:func:`backward.dkv_workspace`) and that one bound plan served both
    planned calls."""
    from kernelops.kernels.flash_attention import backward, dispatch, plans

    made = []
    workspace = backward.dkv_workspace
    spy = lambda *a: made.append(workspace(*a)) or made[-1]  # noqa: E731
    monkeypatch.setattr(backward, "dkv_workspace", spy)  # the plans'
    monkeypatch.setattr(dispatch, "dkv_workspace", spy)  # the general path's
    seen = launch_spy(monkeypatch, kernel)
    plans._PLANS.clear()  # the plan's first call binds, the second repeats the bound launches
    for planned in (False, True, True):  # the general path, then a plan's first and bound calls
        use_plans(monkeypatch, planned)
        step(f" plans={planned}")
    assert seen == ["ws"] * 3
    assert len(made) == 3 and all(w is not None and w.shape == (2, *k.shape) for w in made)
    bound = [plan for plan in plans._PLANS.values() if plan._bound is not None]
    assert len(bound) == 1 and bound[0].mode == 2  # the two planned calls went through one bound plan


@pytest.mark.gpu
@needs_sm90
def test_kernel_level_gqa_backward_splits_heads(monkeypatch):
    """``flash_attention_bwd(..., ws=True, fused=True)`` at D=128 with GQA 8 and 2k causal keys splits
    the query heads, through the general path and a plan's first and bound calls alike: gradients
    match float64 each time."""
    q, k, v, out, lse, dout = _case(1, 2048, 16, 2, 128, True, None, torch.bfloat16)
    kw = dict(softmax_scale=128 ** -0.5, win_left=1 << 30, win_right=0, softcap=None, q_blocksize=64,
              kv_blocksize=64, num_warps=4, num_stages=2, ws=True, fused=True)

    def step(tag):
        dq, dk, dv = flash_attention_bwd(q, k, v, out, dout, lse, **kw)[:3]
        assert_grads_match((dq, dk, dv), q, k, v, dout, torch.bfloat16, tag, causal=True)

    assert_splits_on_every_path(monkeypatch, "flash_attention_bwd_fused_kernel", k, step)


@pytest.mark.gpu
@needs_sm90
def test_kernel_level_backward_runs_it_when_asked(monkeypatch):
    """``flash_attention_bwd(..., ws=True, fused=True)`` takes the fused kernel and skips the dQ
    kernel; its gradients equal the split path's to rounding (dQ's adds land in any order)."""
    seen = launch_spy(monkeypatch, "flash_attention_bwd_fused_kernel")
    q, k, v, out, lse, dout = _case(2, 512, 8, 2, 128, True, None, torch.bfloat16)
    kw = dict(softmax_scale=128 ** -0.5, win_left=1 << 30, win_right=0, softcap=None, q_blocksize=64,
              kv_blocksize=64, num_warps=4, num_stages=2, ws=True)
    fused = flash_attention_bwd(q, k, v, out, dout, lse, fused=True, **kw)
    assert seen == ["ws"]
    split = flash_attention_bwd(q, k, v, out, dout, lse, fused=False, **kw)
    assert seen == ["ws"]
    for got, want in zip(fused[:3], split[:3]):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("kernel", ["fused", "dkdv"])
def test_every_launch_order_covers_every_program(kernel, causal):
    """Chunks of 1, 2, 4 (two chunks of 4 and 2 heads), all 6 heads and more than there are: every
    order writes every key block (outputs poisoned with NaN), the gradients match float64, and dK /
    dV are bitwise those of ``chunk=1`` (a program's sums do not depend on when it runs)."""
    from kernelops.kernels.flash_attention.bwd_ws import flash_attention_bwd_dkdv_ws

    B, S, Hq, Hkv, D = 3, 384, 4, 2, 64  # 6 (batch, KV head) pairs of 3 key blocks
    q, k, v, out, lse, dout = _case(B, S, Hq, Hkv, D, causal, None, torch.bfloat16)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    _, _, ref = reference(q, k, v, causal=causal, dout=dout)
    _, _, low = reference(q, k, v, causal=causal, dout=dout, dtype=torch.bfloat16)
    first = None
    for chunk in (1, 2, 4, 6, 64):
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        if kernel == "fused":
            bwd_fused.flash_attention_bwd_fused(q, k, v, dout, lse, delta, dq, dk, dv, softmax_scale=D ** -0.5,
                                                causal=causal, chunk=chunk)
            got, want, lo = (dq, dk, dv), ref, low
        else:
            flash_attention_bwd_dkdv_ws(q, k, v, dout, lse, delta, dk, dv, softmax_scale=D ** -0.5, causal=causal,
                                        chunk=chunk)
            got, want, lo = (dk, dv), ref[1:], low[1:]
        for name, g, w, lw in zip(("dq", "dk", "dv")[-len(got):], got, want, lo):
            assert_matches(f"{name} chunk={chunk}", g, w, lw, torch.bfloat16)
        if first is None:
            first = (dk.clone(), dv.clone())
        assert torch.equal(dk, first[0]) and torch.equal(dv, first[1]), f"chunk={chunk} changed dK/dV"


def test_launch_order_rule_and_checks():
    """About one wave of programs per chunk, rounded down to a power of two heads (132 SMs: 16
    heads of 8 key blocks at 1k keys, 32 of 4 at 512, 1 head at 16k), never more heads than there
    are, a 1-D grid of every program; bad chunks refused."""
    from kernelops.kernels.flash_attention.bwd_ws import launch_order

    assert launch_order(256, 1024, 132) == (16, (2048,))
    assert launch_order(512, 512, 132) == (32, (2048,))  # 33 a wave, rounded down
    assert launch_order(16, 16384, 132) == (1, (2048,))
    assert launch_order(8, 512, 132) == (8, (32,))  # 32 asked, 8 heads in all
    assert launch_order(100, 256, 132) == (64, (200,))  # 66 a wave
    assert launch_order(4, 128, 1) == (1, (4,))
    assert launch_order(6, 384, 132, chunk=4) == (4, (18,))
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="chunk"):
            launch_order(6, 384, 132, chunk=bad)


@pytest.mark.parametrize("fn, D", [(bwd_fused.flash_attention_bwd_fused, 128),
                                   (bwd_d256.flash_attention_bwd_d256, 256)], ids=["fused", "d256"])
def test_bad_arguments_are_refused_before_any_launch(fn, D):
    """Both fused Gluon backwards: a wrong-sized lse, a wrong dQ workspace, a window without causal,
    and CPU tensors are refused before anything compiles or launches."""
    q = torch.empty(1, 256, 4, D, dtype=torch.bfloat16)
    kv = torch.empty(1, 256, 2, D, dtype=torch.bfloat16)
    stats = torch.empty(1, 4, 256)
    call = dict(softmax_scale=0.1, causal=True, warmup_only=True)
    with pytest.raises(ValueError, match="lse"):
        fn(q, kv, kv, q, stats[..., :128], stats, q, kv, kv, **call)
    with pytest.raises(ValueError, match="dq_acc"):
        fn(q, kv, kv, q, stats, stats, q, kv, kv, dq_acc=q.float()[:, :128], **call)
    with pytest.raises(ValueError, match="win_left"):
        fn(q, kv, kv, q, stats, stats, q, kv, kv, softmax_scale=0.1, causal=False, win_left=5, warmup_only=True)
    with pytest.raises(ValueError, match="sm_90"):  # CPU tensors: never supported
        fn(q, kv, kv, q, stats, stats, q, kv, kv, softmax_scale=0.1, causal=True)


def _shifted(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` whose data starts 4 bytes past a 16-byte boundary (a view into a larger buffer)."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    assert view.is_contiguous() and view.data_ptr() % 16 == 4
    return view


def test_stats_vectors_are_checked_and_realigned():
    """The Gluon launchers read lse and delta by TMA: they must be contiguous float32 [B, Hq, S], and
    a view not 16-byte aligned is replaced by an aligned copy of the same values."""
    from kernelops.kernels.flash_attention.bwd_ws import _stats_vector

    lse = torch.randn(2, 3, 128)
    assert _stats_vector("lse", lse, (2, 3, 128)) is lse
    moved = _stats_vector("lse", _shifted(lse), (2, 3, 128))
    assert moved.data_ptr() % 16 == 0 and torch.equal(moved, lse)
    for bad in (lse[:1], lse[..., :64].contiguous(), lse.double(), lse.transpose(1, 2).contiguous().transpose(1, 2)):
        with pytest.raises(ValueError, match="contiguous float32"):  # a wrong shape, dtype or layout
            _stats_vector("lse", bad, (2, 3, 128))


@pytest.mark.gpu
@needs_sm90
def test_unaligned_lse_and_delta_give_the_same_gradients():
    """Both Gluon backward kernels given lse/delta views 4 bytes off a 16-byte boundary: the same dK
    and dV bit for bit, and dQ to rounding (its adds land in any order)."""
    from kernelops.kernels.flash_attention import bwd_ws

    q, k, v, out, lse, dout = _case(2, 256, 4, 2, 128, True, None, torch.bfloat16)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    results = []
    for stats in ((lse, delta), (_shifted(lse), _shifted(delta))):
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        bwd_fused.flash_attention_bwd_fused(q, k, v, dout, *stats, dq, dk, dv, softmax_scale=128 ** -0.5, causal=True)
        split = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
        bwd_ws.flash_attention_bwd_dkdv_ws(q, k, v, dout, *stats, *split, softmax_scale=128 ** -0.5, causal=True)
        results.append((dq, dk, dv, *split))
    assert not any(t.isnan().any() for t in results[0])
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-2, atol=1e-2)
    for got, want in zip(results[1][1:], results[0][1:]):
        assert torch.equal(got, want)
