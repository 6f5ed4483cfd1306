"""``BwdParams.ws``: the warp-specialised Gluon dK/dV kernel (kernels/flash_attention/bwd_ws.py) computes
dK and dV of the calls it takes (the forward's scope: sm_90, D 64/128, Sq == Sk a multiple of 128,
causal, causal with a left window, or full, no other score terms or dropout) when a config asks for it or, with ``ws=None``,
by its own rule; dQ comes from the Triton dQ kernel or, with ``BwdParams.fused`` (by default,
never with ``deterministic=True``), from the fused Gluon kernel. Gradients match float64
every way."""

import dataclasses

import pytest
import torch

from kernelops import BwdParams, FlashAttentionConfig, FwdParams, flash_attention
from kernelops.kernels.flash_attention import bwd_ws
from kernelops.kernels.flash_attention.registration import _bwd_params
from kernelops.modules.flash_attention import FLASH_ATTENTION, WS_DQ_TILES
from kernelops.ops.params import short
from tests.attention_checks import make_qkv
from tests.conftest import DEVICE
from tests.modules.test_flash_attention import check_call
from tests.modules.test_flash_attention_ws_choice import A100, H100, _inputs, launch_spy, needs_gluon, needs_sm90


@needs_gluon
@pytest.mark.parametrize("S, D, causal, extra, want", [
    (4096, 64, True, {}, True),                 # the forward's rule says no here; the dK/dV kernel's yes
    (2048, 128, True, {}, True),
    (1024, 128, True, {}, True),                # 0.7e11 FLOPs: over the 1e10 floor
    (2048, 128, True, {"B": 1, "H": 4}, False),  # 0.4e10: under it
    (2048, 128, True, {"sliding_window": 256}, True),    # 3.2e10 FLOPs over the band
    (2048, 128, True, {"sliding_window": 256, "B": 2}, False),  # 0.8e10: under the floor
    (16384, 128, True, {"sliding_window": 4096}, True),  # 4.8e11 FLOPs over the band
    (16384, 64, True, {"sliding_window": 4096, "H": 32}, True),  # D=64 windows too
    (16384, 128, False, {"sliding_window": (4096, 4096)}, False),  # two-sided: not the kernel's
    (2048, 128, True, {"dropout_prob": 0.1}, False),
    (2048, 96, False, {"H": 16}, False),
    (4096, 256, False, {}, True),                # D=256: the fused kernel of bwd_d256
    (4096, 256, True, {"sliding_window": 1024}, True),
    (512, 256, True, {"B": 1, "H": 2}, False),   # under the floor
])
def test_automatic_rule(S, D, causal, extra, want):
    kw = {"B": max(1, 16384 // S), "H": 2048 // D, **extra}
    inputs = _inputs(S, D, causal, **kw)
    assert FLASH_ATTENTION.ws_auto(inputs, H100, backward=True) is want
    assert not FLASH_ATTENTION.ws_auto(inputs, A100, backward=True)


@needs_gluon
def test_tuning_candidates_offer_ws_beside_the_dq_tiles():
    on_hopper = FLASH_ATTENTION.candidate_params(_inputs(8192, B=2, H=16), H100, "bwd")
    split = [p for p in on_hopper if p.ws and p.fused is False]
    assert sorted((p.q_blocksize, p.kv_blocksize, p.num_warps, p.num_stages) for p in split) == sorted(WS_DQ_TILES)
    assert sum(bool(p.ws and p.fused) for p in on_hopper) == 1  # the fused kernel: no tiles of its own
    assert all(p.ws is False for p in on_hopper if not p.ws) and len(on_hopper) > len(WS_DQ_TILES) + 1
    windowed = FLASH_ATTENTION.candidate_params(_inputs(16384, H=16, sliding_window=4096), H100, "bwd")
    assert sum(bool(p.ws) for p in windowed) == len(WS_DQ_TILES) + 1
    d256 = FLASH_ATTENTION.candidate_params(_inputs(4096, 256, B=4, H=8), H100, "bwd")
    assert [(p.ws, p.fused) for p in d256 if p.ws] == [(True, True)]  # no dK/dV-only kernel at D=256
    for inputs, device in ((_inputs(8192), A100), (_inputs(8192, sliding_window=512), H100),
                           (_inputs(16384, H=16, causal=False, sliding_window=(4096, 4096)), H100)):
        assert all(p.ws is None for p in FLASH_ATTENTION.candidate_params(inputs, device, "bwd"))


@pytest.mark.parametrize("left, right, want", [(1 << 30, 0, (True, None)), (1 << 30, 1 << 30, (False, None)),
                                               (100, 0, (True, 100)), (0, 0, (True, 0)), (255, 0, (True, None)),
                                               (100, 100, None), (1 << 30, 5, None), (-1, 0, None)])
def test_band(left, right, want):
    """The bands the kernel takes over 256 keys: full, causal, causal with a left window."""
    assert bwd_ws.dkdv_ws_band(left, right, 256) == want


def test_params_json_and_validation():
    assert BwdParams(64, 64, 4, 2).to_dict() == {"q_blocksize": 64, "kv_blocksize": 64, "num_warps": 4,
                                                  "num_stages": 2}  # files written now read in older versions
    assert BwdParams.from_dict(BwdParams(32, 128, 4, 3, ws=True).to_dict()) == BwdParams(32, 128, 4, 3, ws=True)
    fused = BwdParams(64, 64, 4, 2, ws=True, fused=True)
    assert BwdParams.from_dict(fused.to_dict()) == fused and fused.to_dict()["fused"] is True
    assert short(BwdParams(32, 128, 4, 3, ws=False)).endswith("no-ws")
    assert short(fused).endswith("ws fused") and short(BwdParams(ws=True, fused=False)).endswith("ws split")
    with pytest.raises(ValueError, match="BwdParams.ws"):
        BwdParams(64, 64, 4, 2, ws=1)
    with pytest.raises(ValueError, match="BwdParams.fused"):
        BwdParams(64, 64, 4, 2, fused=1)


@pytest.mark.parametrize("flags, ws, fused", [([64, 64, 4, 2], False, False), ([64, 64, 4, 2, 2], True, False),
                                               ([64, 64, 4, 2, 1], False, False), ([64, 64, 4, 2, 6], True, True)])
def test_op_params_carry_the_flags(flags, ws, fused):
    got = _bwd_params(flags)
    assert got["ws"] is ws and got["fused"] is fused and got["num_stages"] == 2


@pytest.mark.parametrize("D, fused, deterministic, want", [
    (128, None, False, True), (64, None, False, True),  # the rule: both head dims
    (64, True, False, True), (128, False, False, False),  # a config's word
    (128, None, True, False), (128, True, True, False),  # deterministic: never (dQ adds in any order)
])
def test_fused_rule(D, fused, deterministic, want):
    inputs = dataclasses.replace(_inputs(4096, D, True, B=4, H=16), deterministic=deterministic)
    assert FLASH_ATTENTION.fused_on(inputs, BwdParams(64, 64, 4, 2, ws=True, fused=fused)) is want


def test_launch_args_carry_the_fused_bit(monkeypatch):
    """The op's backward params get bit 2 when the ws kernel runs with dQ fused; a deterministic
    call traced with deferred params gets SPLIT_AUTO, which resolves without the fused bit."""
    from kernelops.kernels.flash_attention.runtime_config import SPLIT_AUTO, is_auto, without_fused

    monkeypatch.setattr(FLASH_ATTENTION, "ws_on", lambda inputs, params: True)
    inputs = _inputs(4096, 128, True, B=4, H=16)
    monkeypatch.setattr(type(inputs), "needs_grad", property(lambda self: True))
    for fused, bit in ((None, 6), (False, 2)):
        cfg = FlashAttentionConfig(FwdParams(), BwdParams(64, 64, 4, 2, ws=True, fused=fused))
        assert FLASH_ATTENTION._launch_args(inputs, cfg, "triton")[8] == [64, 64, 4, 2, bit]
    deferred = FLASH_ATTENTION._launch_args(dataclasses.replace(inputs, deterministic=True), FlashAttentionConfig(),
                                            "triton")[8]
    assert tuple(deferred) == SPLIT_AUTO and is_auto(deferred)
    assert without_fused([64, 64, 4, 2, 6]) == [64, 64, 4, 2, 2] and without_fused([64, 64, 4, 2]) == [64, 64, 4, 2]


def test_calls_it_cannot_take_run_the_triton_kernel(monkeypatch):
    """A ws backward config on a call the kernel cannot take (100 keys; on CPU: any call) gives the
    tiles' gradients bit for bit."""
    ran = launch_spy(monkeypatch, "dkdv_ws_kernel")  # (the dispatcher launches it through bwd_ws.dkdv_ws_launch)
    grads = []
    for ws in (True, False):
        torch.manual_seed(3)
        q, k, v = make_qkv(1, 100, 100, 2, 1, 64, torch.float16, DEVICE)
        cfg = FlashAttentionConfig(FwdParams(16, 16, 4, 1), BwdParams(16, 16, 4, 1, ws=ws), platform="triton")
        flash_attention(q, k, v, causal=True, cfg=cfg).float().square().sum().backward()
        grads.append((q.grad, k.grad, v.grad))
    assert ran == []
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# --- on an H100 / H200 ------------------------------------------------------------------------
@pytest.fixture
def launches(monkeypatch):
    return launch_spy(monkeypatch, "dkdv_ws_kernel")


@pytest.fixture
def fused_launches(monkeypatch):
    return launch_spy(monkeypatch, "flash_attention_bwd_fused_kernel")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("case", [(2, 256, 256, 4, 4, 128, False, None, None), (2, 384, 384, 4, 1, 128, True, None, None),
                                  (1, 512, 512, 8, 2, 64, True, None, None), (1, 128, 128, 2, 2, 64, False, None, None),
                                  (2, 512, 512, 4, 2, 128, True, 100, None), (1, 384, 384, 2, 1, 64, True, 200, None)],
                         ids=["full", "gqa4-causal", "d64-gqa-causal", "one-block", "window100", "d64-window200"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
def test_ws_config_trains(launches, fused_launches, case, dtype, fused):
    """dQ, dK, dV (with a gradient reaching the lse too) against float64, dK/dV from the Gluon kernel
    (and dQ too, ``fused``)."""
    cfg = FlashAttentionConfig(FwdParams(64, 64, 4, 3, ws=False), BwdParams(64, 64, 4, 2, ws=True, fused=fused),
                               platform="triton")
    check_call(case, dtype, "triton", cfg=cfg)
    assert (fused_launches if fused else launches) == ["ws"] and (launches if fused else fused_launches) == []


@pytest.mark.gpu
@needs_sm90
def test_default_training_call_runs_it_by_its_rule(launches, fused_launches):
    """At D=128 and D=64 the rule fuses dQ in; ``deterministic=True`` keeps the split backward,
    whose gradients are bitwise the same run to run."""
    q, k, v = make_qkv(8, 2048, 2048, 16, 4, 128, torch.bfloat16, "cuda")  # 1.4e11 forward FLOPs, GQA 4
    flash_attention(q, k, v, causal=True).float().sum().backward()
    assert fused_launches == ["ws"] and launches == []
    grads = []
    for _ in range(2):
        for t in (q, k, v):
            t.grad = None
        flash_attention(q, k, v, causal=True, deterministic=True).float().sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v)])
    assert fused_launches == ["ws"] and launches == ["ws", "ws"]
    for got, want in zip(*grads):
        assert torch.equal(got, want)
    q, k, v = make_qkv(8, 2048, 2048, 32, 8, 64, torch.bfloat16, "cuda")
    flash_attention(q, k, v, causal=True).float().sum().backward()
    assert fused_launches == ["ws", "ws"] and launches == ["ws", "ws"]


@pytest.mark.gpu
@needs_sm90
def test_strided_dout_is_copied_into_outs_layout(launches):
    """A dout that is no row view (here [B, S, H, D] read through a transpose) is copied into out's
    layout and runs the same warp-specialised kernel through the backward's plan (the dK/dV
    kernel's row-view gate itself: test_gate_needs_row_views); both give the same gradients to
    rounding."""
    grads = []
    for transposed in (False, True):
        torch.manual_seed(5)
        q, k, v = make_qkv(1, 256, 256, 2, 2, 128, torch.bfloat16, "cuda")
        cfg = FlashAttentionConfig(FwdParams(64, 64, 4, 3), BwdParams(64, 64, 4, 2, ws=True, fused=False),
                                   platform="triton")
        out = flash_attention(q, k, v, causal=True, cfg=cfg)
        dout = torch.randn(1, 2, 256, 128, device="cuda", dtype=out.dtype)
        dout = dout.transpose(1, 2) if transposed else dout.transpose(1, 2).contiguous()
        out.backward(dout)
        grads.append((q.grad, k.grad, v.grad))
    assert launches == ["ws", "ws"]
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_gate_needs_row_views(monkeypatch):
    """Beyond the forward's conditions on q/k/v, dout, dk and dv must be row views of q's dtype."""
    q = torch.empty(1, 256, 2, 128, dtype=torch.bfloat16)
    assert not bwd_ws.dkdv_ws_supported(q, q, q, q, q, q)  # CPU tensors: never
    monkeypatch.setattr(bwd_ws, "ws_supported", lambda *args: True)  # as on an H100
    assert bwd_ws.dkdv_ws_supported(q, q, q, q, q, q)
    strided = torch.empty(1, 2, 256, 128, dtype=torch.bfloat16).transpose(1, 2)  # heads not side by side
    assert not bwd_ws.dkdv_ws_supported(q, q, q, strided, q, q)
    assert not bwd_ws.dkdv_ws_supported(q, q, q, q, strided, q)
    assert not bwd_ws.dkdv_ws_supported(q, q, q, q.half(), q, q)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("B, S, Hq, Hkv, D, window", [(2, 512, 4, 2, 128, 100), (1, 384, 2, 2, 64, 64),
                                                      (1, 256, 4, 1, 128, 0), (1, 512, 2, 2, 128, 500)])
def test_window_matches_float64(B, S, Hq, Hkv, D, window):
    """The dK/dV kernel's sliding-window path: causal, query i sees keys i - window .. i; dK and dV
    against float64. With window 0 each query sees only its own key: dS is 0 in exact arithmetic
    (dP = dO . v = delta), so dK is rounding noise, checked against dV's size."""
    from tests.attention_checks import assert_matches, reference

    q, k, v = make_qkv(B, S, S, Hq, Hkv, D, torch.bfloat16, "cuda", requires_grad=False)
    out, lse = flash_attention(q, k, v, causal=True, sliding_window=window, return_lse=True)
    dout = torch.randn_like(out)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    _, _, ref = reference(q, k, v, causal=True, sliding_window=window, dout=dout)
    _, _, low = reference(q, k, v, causal=True, sliding_window=window, dout=dout, dtype=torch.bfloat16)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    bwd_ws.flash_attention_bwd_dkdv_ws(q, k, v, dout, lse, delta, dk, dv, softmax_scale=D ** -0.5, causal=True,
                                       win_left=window)
    if window:
        assert_matches("dk", dk, ref[1], low[1], torch.bfloat16)
    else:
        assert ref[1].abs().max() < 1e-12 and dk.float().norm() < 1e-4 * dv.float().norm()
    assert_matches("dv", dv, ref[2], low[2], torch.bfloat16)


def test_window_needs_causal():
    q = torch.empty(1, 256, 2, 128, dtype=torch.bfloat16)
    stats = torch.empty(1, 2, 256)
    for kw in (dict(causal=False, win_left=100), dict(causal=True, win_left=-1), dict(causal=True, win_left=True)):
        with pytest.raises(ValueError, match="win_left"):
            bwd_ws.flash_attention_bwd_dkdv_ws(q, q, q, q, stats, stats, q, q, softmax_scale=0.1, warmup_only=True,
                                               **kw)


def test_split_auto_params_resolve_without_the_fused_bit(monkeypatch):
    """A deterministic call traced by torch.compile carries SPLIT_AUTO: the op resolves its params
    when it runs and clears the fused bit, so dQ comes from the (atomic-free) dQ kernel."""
    from kernelops.kernels.flash_attention import registration

    seen = []
    monkeypatch.setattr(registration, "_resolve", lambda *args: ([], [64, 64, 4, 2, 6]))
    monkeypatch.setattr(registration, "flash_attention_bwd", lambda *args, **kw: seen.append(kw) or (None,) * 5)
    q = torch.empty(1, 128, 2, 64)
    for params, fused in (([0], False), ([], True)):
        registration.bwd_impl(q, q, q, q, q, torch.empty(1, 2, 128), None, None, None, None, None, None, None, None,
                              False, 0.125, 1 << 30, 0, 0.0, 0.0, 0, "triton", params)
        assert seen[-1]["ws"] is True and seen[-1]["fused"] is fused
