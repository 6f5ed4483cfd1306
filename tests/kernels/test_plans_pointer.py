"""Per-signature plans of the Triton pointer forward (plans.ptr_fwd_plan): on a CUDA GPU, calls of
one signature with fresh values (and, packed, new lengths) each time run the first call's bound
launch and match float64; what a plan does not take goes to the general path. On the CPU: the gate
declines."""

import pytest
import torch

from kernelops.kernels.flash_attention import plans
from kernelops.kernels.flash_attention.dispatch import dense_forward, flash_attention_fwd_dense, planned_pointer_forward
from tests.attention_checks import assert_lse_matches, assert_matches, reference
from tests.kernels.test_flash_attention_fwd_ws_packed import _offsets, check_two_offsets
from tests.modules.test_flash_attention_ws_choice import launch_spy

UNBOUNDED = 1 << 30
TILES = dict(q_blocksize=64, kv_blocksize=64, num_warps=4, num_stages=2)
SCALARS = dict(softmax_scale=0.125, win_left=UNBOUNDED, win_right=0, softcap=None, **TILES)
KEY = plans.ptr_scalars(SCALARS)  # ptr_fwd_plan takes the scalars as its signature's tuple
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="plans bind CUDA launches")


def test_gate_declines_cpu_tensors():
    q = torch.randn(1, 16, 2, 64)
    assert plans.ptr_fwd_plan(q, q, q, None, None, KEY) is None


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("kw", [dict(), dict(softcap=20.0, win_left=37, win_right=5)], ids=["causal", "softcap-window"])
def test_dense_calls_repeat_one_bound_launch(monkeypatch, kw):
    """dense_forward's pointer launcher (the executor's hot path without the ws or TMA kernels):
    three calls of one signature, one plan bound on the first, each call against float64."""
    spy = launch_spy(monkeypatch, "flash_attention_fwd_kernel")
    plans._FWD_PLANS.clear()
    scalars = {**SCALARS, **kw}
    run = dense_forward(**scalars, dropout_p=0.0, dropout_seed=0)
    gen = torch.Generator(device="cuda").manual_seed(5)
    for call in range(3):
        q = torch.randn(2, 100, 8, 64, device="cuda", generator=gen).to(torch.float16)
        k, v = (torch.randn(2, 130, 2, 64, device="cuda", generator=gen).to(torch.float16) for _ in range(2))
        out, lse = run(q, k, v)
        plan = next(iter(plans._FWD_PLANS.values()))
        assert len(plans._FWD_PLANS) == 1 and isinstance(plan, plans.PtrFwdPlan) and len(plan._bound) == 1
        assert spy == ["ws"] * (call + 1)  # the pointer kernel, once per call
        ref_kw = dict(softmax_scale=0.125, logits_soft_cap=kw.get("softcap"),
                      **(dict(sliding_window=(kw["win_left"], kw["win_right"])) if kw else dict(causal=True)))
        ref_out, ref_lse, _ = reference(q, k, v, **ref_kw)
        low_out, _, _ = reference(q, k, v, dtype=torch.float16, **ref_kw)
        assert_matches("out", out, ref_out, low_out, torch.float16)
        assert_lse_matches(lse, ref_lse, torch.float16)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("two", [False, True], ids=["one-offsets-tensor", "two"])
def test_packed_calls_repeat_one_bound_launch(monkeypatch, two):
    """The pointer forward of packed sequences (flash_attention_fwd_dense without ws): calls with
    new lengths each time (per-side lengths with two offsets tensors) share one plan, each
    sequence's out and lse against float64."""
    spy = launch_spy(monkeypatch, "flash_attention_fwd_kernel")
    plans._FWD_PLANS.clear()
    gen = torch.Generator(device="cuda").manual_seed(9)
    cases = (([30, 0, 70], [50, 10, 40]), ([1, 98, 1], [60, 0, 40]), ([33, 33, 34], [1, 1, 98]))
    for call, (lens_q, lens_k) in enumerate(cases):
        lens_k = lens_k if two else lens_q
        q = torch.randn(100, 4, 64, device="cuda", generator=gen).to(torch.bfloat16)
        k, v = (torch.randn(100, 2, 64, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
        cu_q = _offsets(lens_q, "cuda")
        cu_k = _offsets(lens_k, "cuda") if two else cu_q
        out, lse = flash_attention_fwd_dense(q, k, v, **SCALARS, cum_seqlens_q=cu_q, cum_seqlens_k=cu_k,
                                             dropout_p=0.0, dropout_seed=0)
        assert len(plans._FWD_PLANS) == 1 and isinstance(next(iter(plans._FWD_PLANS.values())), plans.PtrFwdPlan)
        assert spy == ["ws"] * (call + 1)
        check_two_offsets(out, lse, q, k, v, lens_q, lens_k, True, 0.125, torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
def test_plans_decline_what_they_do_not_take():
    q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.float16)
    plans._FWD_PLANS.clear()
    assert plans.ptr_fwd_plan(q, q, q, None, None, KEY) is not None
    assert plans.ptr_fwd_plan(q[..., 1:33], q[..., :32], q[..., :32], None, None, KEY) is None  # misaligned
    assert plans.ptr_fwd_plan(q[:, :0], q, q, None, None, KEY) is None                     # nothing to compute
    qp = torch.randn(64, 2, 64, device="cuda", dtype=torch.float16)
    cu = _offsets([30, 34], "cuda")
    shifted = torch.empty(4, dtype=cu.dtype, device="cuda")[1:].copy_(cu)
    assert plans.ptr_fwd_plan(qp, qp, qp, cu, cu, KEY) is not None
    assert plans.ptr_fwd_plan(qp, qp, qp, shifted, shifted, KEY) is None                 # offsets misaligned
    # the general path keeps dropout, extra terms and preallocated outputs
    kw = dict(SCALARS, dropout_p=0.0, dropout_seed=0)
    assert planned_pointer_forward(q, q, q, dict(kw, dropout_p=0.1)) is None
    assert planned_pointer_forward(q, q, q, dict(kw, alibi_slopes=torch.ones(2, device="cuda"))) is None
    assert planned_pointer_forward(q, q, q, dict(kw, out=torch.empty_like(q))) is None
    assert planned_pointer_forward(q, q, q, kw) is not None
