"""Per-signature launch plans (kernels/flash_attention/plans.py): a plan's later calls, which
repeat bound launches over new tensors, give the same results as its first call and as the general
path, against float64 on fresh random inputs each call; what a plan does not take goes to the
general path. On the CPU the Triton backward runs under the interpreter (split path); on an sm_90
GPU every path runs (warp-specialised forward, split, Gluon dK/dV and fused backward)."""

import pytest
import torch

from kernelops.kernels.common import launch
from kernelops.kernels.flash_attention import dispatch, plans
from kernelops.kernels.flash_attention.dispatch import flash_attention_bwd, flash_attention_fwd_dense
from tests.attention_checks import assert_matches, make_qkv, reference
from tests.conftest import DEVICE
from tests.modules.test_flash_attention_ws_choice import needs_sm90

UNBOUNDED = 1 << 30


def _band(causal):
    return dict(win_left=UNBOUNDED, win_right=0 if causal else UNBOUNDED)


def _inputs(B, S, Hq, Hkv, D, causal, dtype, device, offset=0):
    """q, k, v, out, lse (float64 reference's, rounded) and dout; ``offset`` elements shift every
    tensor's start (2 bytes at 16-bit: not 16-byte aligned)."""
    q, k, v = make_qkv(B, S, S, Hq, Hkv, D, dtype, device, requires_grad=False)
    out, lse, _ = reference(q, k, v, causal=causal)
    dout = torch.randn(B, S, Hq, D, device=device).to(dtype)
    tensors = [q, k, v, out.to(dtype), dout]
    if offset:
        tensors = [torch.empty(t.numel() + offset, dtype=dtype, device=device)[offset:].view(t.shape).copy_(t)
                   for t in tensors]
    q, k, v, out, dout = tensors
    return q, k, v, out, lse.float().contiguous(), dout


def _check_grads(grads, q, k, v, dout, causal, dtype):
    kw = dict(causal=causal, dout=dout)
    _, _, ref = reference(q, k, v, **kw)
    _, _, low = reference(q, k, v, **kw, dtype=dtype)
    for name, got, want, lo in zip(("dq", "dk", "dv"), grads[:3], ref, low):
        assert_matches(name, got, want, lo, dtype)


def _bwd(q, k, v, out, dout, lse, causal, tiles, **kw):
    return flash_attention_bwd(q, k, v, out, dout, lse, softmax_scale=q.shape[-1] ** -0.5, softcap=None,
                               **_band(causal), **tiles, **kw)


TILES = dict(q_blocksize=16, kv_blocksize=16, num_warps=4, num_stages=1)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_backward_plan_repeats_its_launches(causal):
    """Three calls of one signature (fresh inputs each): the plan made by the first serves the
    others, and each call's gradients match float64."""
    plans._PLANS.clear()
    for i in range(3):
        q, k, v, out, lse, dout = _inputs(1, 48, 4, 2, 32, causal, torch.float16, DEVICE)
        grads = _bwd(q, k, v, out, dout, lse, causal, TILES)
        assert len(plans._PLANS) == 1
        _check_grads(grads, q, k, v, dout, causal, torch.float16)


def test_plan_per_signature_and_general_path_for_the_rest():
    plans._PLANS.clear()
    q, k, v, out, lse, dout = _inputs(1, 32, 2, 2, 16, True, torch.float16, DEVICE)
    args = (q, k, v, out, dout, lse, None, 0.25, UNBOUNDED, 0, 16, 16, 4, 1, False, False)
    plan = plans.bwd_plan(*args)
    assert plan is not None and plans.bwd_plan(*args) is plan
    strided = dout.transpose(1, 2).contiguous().transpose(1, 2)  # same shape, other strides: another plan
    other = plans.bwd_plan(q, k, v, out, strided, *args[5:])
    assert other is not None and other is not plan
    assert plans.bwd_plan(q, k, v, out, dout, lse, None, 0.5, *args[8:]) is not plan  # another scale
    mis = _inputs(1, 32, 2, 2, 16, True, torch.float16, DEVICE, offset=1)
    assert plans.bwd_plan(*mis[:4], mis[5], mis[4], None, *args[7:]) is None  # not 16-byte aligned
    assert plans.bwd_plan(q, k, v, out, dout, lse.transpose(1, 2), None, *args[7:]) is None  # lse not contiguous
    assert plans.bwd_plan(q, k, v.float(), out, dout, lse, None, *args[7:]) is None  # mixed dtypes


def test_misaligned_inputs_take_the_general_path_and_match():
    plans._PLANS.clear()
    q, k, v, out, lse, dout = _inputs(1, 48, 2, 1, 32, True, torch.float16, DEVICE, offset=1)
    grads = _bwd(q, k, v, out, dout, lse, True, TILES)
    assert not plans._PLANS
    _check_grads(grads, q, k, v, dout, True, torch.float16)


def test_gradient_of_lse_goes_through_the_plan():
    """A dlse (a gradient reaching the returned lse) is one of the plan's tensors: two calls with
    different dlse give each its own delta."""
    plans._PLANS.clear()
    q, k, v, out, lse, dout = _inputs(1, 32, 2, 2, 16, False, torch.float16, DEVICE)
    ref_out, ref_lse, _ = reference(q, k, v)
    for _ in range(2):
        dlse = torch.randn_like(lse)
        got = _bwd(q, k, v, out, dout, lse, False, TILES, dlse=dlse)
        _, _, want = reference(q, k, v, dout=dout, dlse=dlse)
        _, _, low = reference(q, k, v, dout=dout, dlse=dlse, dtype=torch.float16)
        for name, g, w, lo in zip(("dq", "dk", "dv"), got[:3], want, low):
            assert_matches(name, g, w, lo, torch.float16)
    assert len(plans._PLANS) == 1


@pytest.mark.parametrize("dout_layout", ["rows", "transposed"])
def test_autograd_backward_runs_the_plan_its_forward_found(monkeypatch, dout_layout):
    """The eager autograd Function finds the backward's plan in its forward (``out`` standing for
    ``dout``) and runs it when ``dout`` has out's strides; a dout with other strides (out
    contiguous) is copied into out's layout and runs it too, not the general path. Gradients
    against float64 either way, two steps of fresh inputs."""
    from kernelops import BwdParams, FlashAttentionConfig, FwdParams, flash_attention

    from kernelops.kernels.flash_attention import registration

    general = []
    real = registration._grads
    monkeypatch.setattr(registration, "_grads", lambda *a: general.append(1) or real(*a))
    cfg = FlashAttentionConfig(FwdParams(16, 16, 4, 1), BwdParams(16, 16, 4, 1), platform="triton")
    plans._PLANS.clear()
    for step in range(2):
        q, k, v = make_qkv(1, 48, 48, 4, 2, 32, torch.float16, DEVICE)
        out = flash_attention(q, k, v, causal=True, cfg=cfg)
        assert step or len(plans._PLANS) == 1  # found in the forward
        dout = torch.randn(out.shape, device=DEVICE).to(out.dtype)
        if dout_layout == "transposed":
            dout = dout.transpose(1, 2).contiguous().transpose(1, 2)
        out.backward(dout)
        _check_grads((q.grad, k.grad, v.grad), q, k, v, dout, True, torch.float16)
    assert len(plans._PLANS) == 1 and general == []  # one plan served every backward


# --- on an H100 / H200: every path, the bound launches direct --------------------------------
def _kernels(monkeypatch) -> list:
    seen = []
    monkeypatch.setattr(launch, "observers", [seen.append])
    return seen


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("mode, ws, fused, kernel", [
    ("split", False, False, "flash_attention_bwd_dkdv_kernel"), ("ws", True, False, "dkdv_ws_kernel"),
    ("fused", True, True, "flash_attention_bwd_fused_kernel")])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_each_backward_path_through_its_plan(monkeypatch, mode, ws, fused, kernel, causal, dtype):
    plans._PLANS.clear()
    seen = _kernels(monkeypatch)
    tiles = dict(q_blocksize=64, kv_blocksize=64, num_warps=4, num_stages=2)
    for _ in range(3):
        q, k, v, out, lse, dout = _inputs(2, 256, 4, 2, 128, causal, dtype, "cuda")
        grads = _bwd(q, k, v, out, dout, lse, causal, tiles, ws=ws, fused=fused)
        _check_grads(grads, q, k, v, dout, causal, dtype)
    assert len(plans._PLANS) == 1 and seen.count(kernel) == 3 and seen.count("_bwd_preprocess_kernel") == 3
    assert ("flash_attention_bwd_dq_kernel" in seen) is (mode != "fused")


@pytest.mark.gpu
@needs_sm90
def test_split_plan_equals_the_general_path_bitwise(monkeypatch):
    """The split backward is deterministic: the plan's bound launches and the general path's
    launches give the same bits."""
    tiles = dict(q_blocksize=64, kv_blocksize=64, num_warps=4, num_stages=2)
    q, k, v, out, lse, dout = _inputs(2, 256, 4, 2, 64, True, torch.bfloat16, "cuda")
    planned = [_bwd(q, k, v, out, dout, lse, True, tiles, ws=ws) for ws in (False, True) for _ in range(2)]
    monkeypatch.setattr(dispatch, "bwd_plan", lambda *a: None)  # (the general path's plan lookup)
    general = [_bwd(q, k, v, out, dout, lse, True, tiles, ws=ws) for ws in (False, True)]
    for got, want in zip(planned[1::2], general):  # the second (bound) call of each path
        for g, w in zip(got[:3], want[:3]):
            assert torch.equal(g, w)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_forward_plan_repeats_the_ws_launch(monkeypatch, causal):
    plans._FWD_PLANS.clear()
    seen = _kernels(monkeypatch)
    for _ in range(3):
        q, k, v = make_qkv(2, 384, 384, 4, 2, 128, torch.bfloat16, "cuda", requires_grad=False)
        out, lse = flash_attention_fwd_dense(q, k, v, ws=True, softmax_scale=128 ** -0.5, softcap=None,
                                             **_band(causal), q_blocksize=128, kv_blocksize=64, num_warps=8,
                                             num_stages=3)
        ref_out, ref_lse, _ = reference(q, k, v, causal=causal)
        low_out, _, _ = reference(q, k, v, causal=causal, dtype=torch.bfloat16)
        assert_matches("out", out, ref_out, low_out, torch.bfloat16)
        torch.testing.assert_close(lse, ref_lse.float(), rtol=0, atol=2e-3)
    assert seen == ["flash_attention_fwd_ws_kernel"] * 3 and len(plans._FWD_PLANS) == 1


@pytest.mark.gpu
@needs_sm90
def test_raw_launches_engage_and_match_the_launcher_path(monkeypatch):
    """On the Triton whose launcher protocol kernels/common/raw_launch.py knows (3.6, the GPU
    image's), the plans' bound launches call the C launcher directly, and the outputs are bitwise
    those of the launcher's own path (KERNELOPS_RAW_LAUNCH=0)."""
    import sys

    from kernelops.kernels.common import raw_launch

    if getattr(sys.modules.get("triton.backends.nvidia.driver"), "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO":
        pytest.skip("not the Triton launcher protocol raw launches know")
    q, k, v, out, lse, dout = _inputs(2, 256, 4, 2, 128, True, torch.bfloat16, "cuda")
    tiles = dict(q_blocksize=64, kv_blocksize=64, num_warps=4, num_stages=2)
    results = {}
    for raw in (True, False):
        monkeypatch.setattr(raw_launch, "ENABLED", raw)
        plans._PLANS.clear()
        plans._FWD_PLANS.clear()
        runs = []
        for _ in range(2):  # the second call repeats the bound launches
            o, l = flash_attention_fwd_dense(q, k, v, ws=True, softmax_scale=128 ** -0.5, softcap=None,
                                             **_band(True), q_blocksize=128, kv_blocksize=64, num_warps=8,
                                             num_stages=3)
            runs.append((o, l, *_bwd(q, k, v, out, dout, lse, True, tiles, ws=True, fused=False)[:3]))
        bound = [b for p in (*plans._FWD_PLANS.values(), *plans._PLANS.values()) for b in p._bound]
        assert len(bound) == 4 and all((b._raw is not None) is raw for b in bound)
        results[raw] = runs[1]
    for got, want in zip(results[True], results[False]):
        assert torch.equal(got, want)


@pytest.mark.gpu
@needs_sm90
def test_flash_attention_calls_run_the_planned_function(monkeypatch):
    """The executor's repeated calls whose forward is the warp-specialised kernel go through
    PlannedCall (one layout entry, its plans, no general-path gradients); a call with other
    strides (BHSD storage) takes the general path. Gradients against float64, fresh inputs."""
    import importlib

    from kernelops import flash_attention
    from kernelops.kernels.flash_attention import registration

    fa = importlib.import_module("kernelops.modules.flash_attention")
    monkeypatch.setattr(fa, "WS_MIN_FLOPS", 0)  # the rule picks the ws kernels at this size
    monkeypatch.setattr(fa, "WS_MIN_FLOPS_BWD", 0)
    general = []
    real = registration._grads
    monkeypatch.setattr(registration, "_grads", lambda *a: general.append(1) or real(*a))
    applied = []
    real_apply = registration._PlannedFunction.forward
    monkeypatch.setattr(registration._PlannedFunction, "forward",
                        staticmethod(lambda ctx, *a: applied.append(1) or real_apply(ctx, *a)))
    seen = _kernels(monkeypatch)
    for step in range(3):
        q, k, v = make_qkv(2, 768, 768, 12, 4, 128, torch.bfloat16, "cuda")  # a signature of its own
        out = flash_attention(q, k, v, causal=True)
        dout = torch.randn(out.shape, device="cuda").to(out.dtype)
        out.backward(dout)
        _check_grads((q.grad, k.grad, v.grad), q, k, v, dout, True, torch.bfloat16)
    assert len(applied) >= 2 and not general  # the first call may be the executor's full path
    assert seen.count("flash_attention_fwd_ws_kernel") == 3 and seen.count("flash_attention_bwd_fused_kernel") == 3
    q, k, v = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
               for t in make_qkv(2, 768, 768, 12, 4, 128, torch.bfloat16, "cuda"))
    out = flash_attention(q, k, v, causal=True)
    dout = torch.randn(out.shape, device="cuda").to(out.dtype)
    out.backward(dout)
    _check_grads((q.grad, k.grad, v.grad), q, k, v, dout, True, torch.bfloat16)


def _scalars(**change):
    """The forward op's 15 scalars of a causal call with ws forward params (flag 2) and resolved
    backward params."""
    args = dict(softmax_scale=32 ** -0.5, win_left=UNBOUNDED, win_right=0, softcap=0.0, dropout_p=0.0,
                dropout_seed=0, platform="triton", fwd=[16, 16, 4, 1, 2], bwd=[16, 16, 4, 1], op_name="flash_attention",
                causal=True, windowed=False, train=True, max_q=0, max_k=0)
    args.update(change)
    return tuple(args.values())


def test_planned_call_only_for_plain_ws_forwards():
    from kernelops.kernels.flash_attention.registration import planned_call

    assert planned_call(_scalars(), True) is not None
    for change in (dict(softcap=30.0), dict(dropout_p=0.1), dict(platform="torch"), dict(fwd=[]),
                   dict(fwd=[16, 16, 4, 1]), dict(fwd=[16, 16, 4, 1, 1]), dict(fwd=[0, 64, 4, 2, 8])):
        assert planned_call(_scalars(**change), True) is None, change


@pytest.mark.parametrize("grad", [True, False])
def test_planned_call_layouts_without_a_plan_take_the_general_path(grad):
    """Where the warp-specialised forward's plan does not take the tensors (here: not on an sm_90
    GPU), the call runs the general Function / forward, and matches float64."""
    from kernelops.kernels.flash_attention.registration import planned_call

    call = planned_call(_scalars(train=grad), grad)
    q, k, v = make_qkv(1, 48, 48, 4, 2, 32, torch.float16, DEVICE, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        out, lse = call(q, k, v)
    ref_out, ref_lse, _ = reference(q, k, v, causal=True)
    low_out, _, _ = reference(q, k, v, causal=True, dtype=torch.float16)
    assert_matches("out", out, ref_out, low_out, torch.float16)
    if not grad:
        return
    dout = torch.randn_like(out)
    out.backward(dout)
    _check_grads((q.grad, k.grad, v.grad), q, k, v, dout, True, torch.float16)


@pytest.mark.gpu
@needs_sm90
def test_planned_call_with_a_gradient_on_lse(monkeypatch):
    """A planned call that returns lse, with a loss on both outputs: the backward gets a dlse, which
    the plan does not take, and the general backward runs from the planned forward's context."""
    import importlib

    from kernelops import flash_attention
    from kernelops.kernels.flash_attention import registration

    fa = importlib.import_module("kernelops.modules.flash_attention")
    monkeypatch.setattr(fa, "WS_MIN_FLOPS", 0)
    monkeypatch.setattr(fa, "WS_MIN_FLOPS_BWD", 0)
    applied = []
    real_apply = registration._PlannedFunction.forward
    monkeypatch.setattr(registration._PlannedFunction, "forward",
                        staticmethod(lambda ctx, *a: applied.append(1) or real_apply(ctx, *a)))
    for _ in range(3):
        q, k, v = make_qkv(2, 640, 640, 6, 2, 128, torch.bfloat16, "cuda")  # a signature of its own
        out, lse = flash_attention(q, k, v, causal=True, return_lse=True)
        dout = torch.randn(out.shape, device="cuda").to(out.dtype)
        dlse = torch.randn(lse.shape, device="cuda")
        torch.autograd.backward((out, lse), (dout, dlse))
        _, _, want = reference(q, k, v, causal=True, dout=dout, dlse=dlse)
        _, _, low = reference(q, k, v, causal=True, dout=dout, dlse=dlse, dtype=torch.bfloat16)
        for name, g, w, lo in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), want, low):
            assert_matches(name, g, w, lo, torch.bfloat16)
    assert len(applied) >= 2
