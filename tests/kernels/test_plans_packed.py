"""Per-signature plans of packed sequences (plans.packed_fwd_plan / packed_bwd_plan): on an sm_90
GPU, calls of one signature (token count, sequence count, heads, layout) with new lengths and fresh
values each time run the first call's bound launches (schedule included) and match float64 per
sequence; what the plans do not take goes to the general path. On the CPU: the gates decline."""

import pytest
import torch

from kernelops.kernels.flash_attention import plans
from kernelops.kernels.flash_attention.dispatch import flash_attention_bwd, flash_attention_fwd_dense
from tests.attention_checks import assert_lse_matches, assert_matches, reference
from tests.kernels.test_flash_attention_fwd_ws_packed import _offsets
from tests.modules.test_flash_attention_ws_choice import launch_spy, needs_sm90

UNBOUNDED = 1 << 30


def _band(causal):
    return dict(win_left=UNBOUNDED, win_right=0 if causal else UNBOUNDED)


def _packed(lengths, Hq, Hkv, D, dtype, device, gen=None):
    T = sum(lengths)
    q, k, v = (torch.randn(T, h, D, device=device, generator=gen).to(dtype) for h in (Hq, Hkv, Hkv))
    return q, k, v, _offsets(lengths, device)


def _step(lengths, Hq, Hkv, D, causal, scale, gen, dtype=torch.bfloat16):
    """One packed forward and backward through the kernels' entry points (the ws forward, the fused
    backward) on fresh inputs: ``((q, k, v, cu, dout), (out, lse, dq, dk, dv))``."""
    q, k, v, cu = _packed(lengths, Hq, Hkv, D, dtype, "cuda", gen)
    band = dict(softmax_scale=scale, **_band(causal), softcap=None, cum_seqlens_q=cu, cum_seqlens_k=cu)
    tiles = dict(q_blocksize=64, kv_blocksize=64, num_warps=4, num_stages=2)
    out, lse = flash_attention_fwd_dense(q, k, v, **band, **tiles, ws=True)
    dout = torch.randn(out.shape, device="cuda", generator=gen).to(dtype)
    grads = flash_attention_bwd(q, k, v, out, dout, lse, **band, **tiles, ws=True, fused=True)[:3]
    return (q, k, v, cu, dout), (out, lse, *grads)


def _check_sequences(inputs, results, causal, scale, dtype=torch.bfloat16):
    """Each sequence's out, lse and gradients against float64 (dq and dk of one-token sequences
    left out: with one key, dS is the rounding left of dP - delta, no relative error to judge)."""
    (q, k, v, cu, dout), (out, lse, dq, dk, dv) = inputs, results
    cuts = cu.tolist()
    for i in range(cu.numel() - 1):
        s = slice(cuts[i], cuts[i + 1])
        if s.start == s.stop:
            continue
        args = (q[None, s], k[None, s], v[None, s])
        kw = dict(causal=causal, softmax_scale=scale, dout=dout[None, s])
        ref_out, ref_lse, ref = reference(*args, **kw)
        low_out, _, low = reference(*args, dtype=dtype, **kw)
        assert_matches(f"out of sequence {i}", out[None, s], ref_out, low_out, dtype)
        assert_lse_matches(lse[None, :, s], ref_lse, dtype)
        for name, got, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low):
            if name == "dv" or s.stop - s.start > 1:
                assert_matches(f"{name} of sequence {i}", got[None, s], r, lo, dtype)


def test_gates_decline_cpu_tensors():
    q, k, v, cu = _packed([5, 11], 2, 1, 64, torch.float16, "cpu")
    assert plans.packed_fwd_plan(q, k, v, cu, cu, 0.125, UNBOUNDED, 0) is None
    lse = torch.zeros(2, 16)
    assert plans.packed_bwd_plan(q, k, v, q, q, lse, cu, cu, 0.125, UNBOUNDED, 0) is None


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("lengths_per_call, Hq, Hkv, D, causal", [
    ([[300, 0, 129, 128, 1, 517, 65], [1140, 0, 0, 0, 0, 0, 0], [1, 40, 0, 77, 0, 900, 122]], 4, 2, 128, True),
    ([[700, 300, 28], [28, 300, 700], [512, 512, 4]], 4, 4, 64, False),  # 1028 tokens: no padding of lse rows
    ([[330, 95, 0], [1, 0, 424]], 4, 1, 64, True),                        # 425 tokens: lse rows padded to 428
    ([[330, 95, 0, 77], [1, 0, 424, 77]], 4, 2, 256, True),              # bwd_d256's kernel: 64-key programs
])
def test_packed_plans_repeat_their_launches(monkeypatch, lengths_per_call, Hq, Hkv, D, causal):
    """Calls of one signature with other lengths each time: one forward and one backward plan,
    both bound on the first call (the schedules are launches of the plans, run every call), and
    each call's out, lse and gradients against float64 per sequence."""
    fwd_kernel = launch_spy(monkeypatch, "flash_attention_fwd_ws_kernel")
    bwd_kernel = launch_spy(monkeypatch, "flash_attention_bwd_d256_kernel" if D == 256 else
                            "flash_attention_bwd_fused_kernel")
    plans._PLANS.clear()
    plans._FWD_PLANS.clear()
    scale = 0.9 * D ** -0.5
    gen = torch.Generator(device="cuda").manual_seed(D + Hq)
    for call, lengths in enumerate(lengths_per_call):
        inputs, results = _step(lengths, Hq, Hkv, D, causal, scale, gen)
        assert len(plans._FWD_PLANS) == len(plans._PLANS) == 1
        fwd_plan, bwd_plan = next(iter(plans._FWD_PLANS.values())), next(iter(plans._PLANS.values()))
        assert isinstance(fwd_plan, plans.PackedFwdPlan) and isinstance(bwd_plan, plans.PackedBwdPlan)
        assert len(fwd_plan._bound) == 2 and len(bwd_plan._bound) == 3  # schedule, forward; delta, schedule, fused
        assert fwd_kernel == bwd_kernel == ["ws"] * (call + 1)
        _check_sequences(inputs, results, causal, scale)


@pytest.mark.gpu
@needs_sm90
def test_packed_plans_decline_what_they_do_not_take():
    q, k, v, cu = _packed([300, 212], 4, 2, 128, torch.bfloat16, "cuda")
    args = (0.1, UNBOUNDED, 0)
    plans._FWD_PLANS.clear()
    plan = plans.packed_fwd_plan(q, k, v, cu, cu, *args)
    assert plan is not None and plans.packed_fwd_plan(q, k, v, cu, cu[:], *args) is plan  # a view of the same offsets
    two = plans.packed_fwd_plan(q, k, v, cu, cu.clone(), *args)            # two tensors: another signature
    assert two is not None and two is not plan and two.two and not plan.two
    shifted = torch.empty(cu.numel() + 1, dtype=cu.dtype, device="cuda")[1:].copy_(cu)
    assert plans.packed_fwd_plan(q, k, v, shifted, shifted, *args) is None  # offsets not 16-byte aligned
    windowed = plans.packed_fwd_plan(q, k, v, cu, cu, 0.1, 100, 0)          # a causal window: its own plan
    assert windowed is not None and windowed is not plan and (windowed.causal, windowed.window) == (True, 100)
    assert plan.window is None
    assert plans.packed_fwd_plan(q, k, v, cu, cu, 0.1, 100, 5) is None      # a right window
    assert plans.packed_fwd_plan(q, k, v, cu, cu, -0.1, UNBOUNDED, 0) is None  # the kernel's scale condition
    lse = torch.zeros(4, 512, device="cuda")
    plans._PLANS.clear()
    bwd_plan = plans.packed_bwd_plan(q, k, v, q, q, lse, cu, cu, *args)
    assert bwd_plan is not None and not bwd_plan.two
    two = plans.packed_bwd_plan(q, k, v, q, q, lse, cu, cu.clone(), *args)  # two tensors: another signature
    assert two is not None and two is not bwd_plan and two.two
    assert plans.packed_bwd_plan(q, k, v, q, q, lse.t().contiguous().t(), cu, cu, *args) is None  # lse strided
    windowed = plans.packed_bwd_plan(q, k, v, q, q, lse, cu, cu, 0.1, 100, 0)  # a causal window: its own plan
    assert windowed is not None and windowed is not bwd_plan and windowed.window == 100 and bwd_plan.window is None
    assert plans.packed_bwd_plan(q, k, v, q, q, lse, cu, cu, 0.1, 100, 5) is None  # a right window
    d256 = _packed([300, 212], 2, 1, 256, torch.bfloat16, "cuda")
    assert plans.packed_bwd_plan(*d256[:3], d256[0], d256[0], torch.zeros(2, 512, device="cuda"), cu, cu,
                                 *args) is not None  # bwd_d256's packed kernel
    d96 = _packed([300, 212], 2, 1, 96, torch.bfloat16, "cuda")
    assert plans.packed_bwd_plan(*d96[:3], d96[0], d96[0], torch.zeros(2, 512, device="cuda"), cu, cu,
                                 *args) is None  # no Gluon backward at D=96


@pytest.mark.gpu
@needs_sm90
def test_packed_plans_raw_launches_match_float64():
    """Without launch observers (which keep bound launches off Triton's C launcher), the plans'
    launches go through the raw launcher on the Triton whose protocol it knows, as in use: the
    second and third calls of a signature (other lengths) still match float64 per sequence."""
    import sys

    raw_known = getattr(sys.modules.get("triton.backends.nvidia.driver"), "_BASE_ARGS_FORMAT", None) == "iiiKKppOOOOOO"
    plans._PLANS.clear()
    plans._FWD_PLANS.clear()
    scale = 128 ** -0.5
    gen = torch.Generator(device="cuda").manual_seed(3)
    for lengths in ([500, 0, 77, 447], [1, 1000, 23, 0], [256, 256, 256, 256]):
        inputs, results = _step(lengths, 8, 2, 128, True, scale, gen)
        bound = [b for p in (*plans._FWD_PLANS.values(), *plans._PLANS.values()) for b in p._bound]
        assert len(bound) == 5 and all((b._raw is not None) is raw_known for b in bound)
        _check_sequences(inputs, results, True, scale)


@pytest.mark.gpu
@needs_sm90
def test_packed_plans_with_two_offsets_tensors_match_float64(monkeypatch):
    """Packed calls with the keys' own offsets run one forward plan (the kernel's RAGGED == 3) and
    one backward plan (the fused kernel's PACKED == 2) across calls with new lengths each time,
    per-side lengths that differ (rows that see no key, keys no query sees among them); each
    sequence's out, lse and gradients against float64."""
    from tests.kernels.test_flash_attention_fwd_ws_packed import (
        _offsets as offsets, check_packed_grads, check_two_offsets)

    fused = launch_spy(monkeypatch, "flash_attention_bwd_fused_kernel")
    plans._FWD_PLANS.clear()
    plans._PLANS.clear()
    gen = torch.Generator(device="cuda").manual_seed(11)
    scale, dtype = 128 ** -0.5, torch.bfloat16
    for call, (lens_q, lens_k) in enumerate((([300, 5, 200], [500, 0, 100]), ([1, 300, 204], [1, 301, 298]),
                                             ([505, 0, 0], [1, 1, 598]))):
        q = torch.randn(505, 4, 128, device="cuda", generator=gen).to(dtype)
        k, v = (torch.randn(600, 2, 128, device="cuda", generator=gen).to(dtype) for _ in range(2))
        band = dict(softmax_scale=scale, **_band(True), softcap=None, cum_seqlens_q=offsets(lens_q, "cuda"),
                    cum_seqlens_k=offsets(lens_k, "cuda"))
        tiles = dict(q_blocksize=64, kv_blocksize=64, num_warps=4, num_stages=2)
        out, lse = flash_attention_fwd_dense(q, k, v, **band, **tiles, ws=True)
        dout = torch.randn(out.shape, device="cuda", generator=gen).to(dtype)
        grads = flash_attention_bwd(q, k, v, out, dout, lse, **band, **tiles, ws=True, fused=True)[:3]
        assert len(plans._FWD_PLANS) == len(plans._PLANS) == 1
        assert next(iter(plans._FWD_PLANS.values())).two and next(iter(plans._PLANS.values())).two
        assert fused == ["ws"] * (call + 1)
        check_two_offsets(out, lse, q, k, v, lens_q, lens_k, True, scale, dtype)
        check_packed_grads((q, k, v, dout, None), grads, lens_q, lens_k, True, scale, dtype)
