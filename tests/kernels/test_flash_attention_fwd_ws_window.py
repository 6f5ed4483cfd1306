"""The warp-specialised forward with a causal sliding window (the kernel's ``CAUSAL == 2``: query
``i`` sees keys ``i + Sk - Sq - W .. i + Sk - Sq``; tiles start at their first row's first key
block): on an sm_90 GPU, dense, ragged and packed calls (one offsets tensor or two) against float64
with the outputs poisoned first, and the library's windowed calls through the kernel and its plans.
On the CPU: the launch's arguments and its checks."""

import pytest
import torch

from kernelops import BwdParams, FlashAttentionConfig, FwdParams, flash_attention
from kernelops.kernels.flash_attention import fwd_ws, ws_common
from tests.attention_checks import make_qkv
from tests.kernels.test_flash_attention_fwd_ws_packed import _offsets, check_packed_backward, check_two_offsets
from tests.modules.test_flash_attention import check_call
from tests.modules.test_flash_attention_ws_choice import _check_against_float64, launch_spy, needs_gluon, needs_sm90


@needs_gluon
def test_launch_passes_the_window():
    """``window`` sets the kernel's third causal mode and its bound; it needs causal and a bound in range."""
    q = torch.empty(1, 256, 2, 128, dtype=torch.bfloat16)
    lse = torch.empty(1, 2, 256)
    _, _, args, meta = fwd_ws.fwd_ws_launch(q, q, q, q, lse, 0.125, True, window=100, programs=132)
    assert meta["CAUSAL"] == 2 and args[-2] == 100
    for causal, want in ((True, 1), (False, 0)):
        _, _, args, meta = fwd_ws.fwd_ws_launch(q, q, q, q, lse, 0.125, causal, programs=132)
        assert meta["CAUSAL"] == want and args[-2] == 0
    for causal, window in ((False, 100), (True, -1), (True, 1 << 30), (True, 2.0), (True, True)):
        with pytest.raises(ValueError, match="window"):
            fwd_ws.fwd_ws_launch(q, q, q, q, lse, 0.125, causal, window=window, programs=132)


@pytest.mark.parametrize("left, right, seq, want", [
    (1 << 30, 0, 256, (True, None)), (255, 0, 256, (True, None)), (254, 0, 256, (True, 254)),
    (0, 0, 256, (True, 0)), (1 << 30, 1 << 30, 256, (False, None)), (100, 3, 256, None), (1 << 30, 3, 256, None)])
def test_window_band(left, right, seq, want):
    assert ws_common.window_band(left, right, seq) == want


def _poisoned(q):
    B, S, Hq, _ = q.shape
    return torch.full_like(q, float("nan")), torch.full((B, Hq, S), float("nan"), device=q.device)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("B, Sq, Sk, Hq, Hkv, D, window, extra", [
    (2, 512, 512, 4, 2, 128, 0, {}),             # the diagonal only
    (2, 512, 512, 4, 2, 128, 63, {}),
    (1, 512, 512, 2, 2, 128, 127, {}),           # one 128-key block's span
    (1, 512, 512, 2, 1, 128, 128, {}),
    (1, 1024, 1024, 4, 4, 128, 300, {}),
    (2, 1024, 1024, 4, 2, 128, 1000, {}),        # one key short of plain causal
    (2, 640, 640, 6, 2, 128, 200, dict(programs=3, chunk=2)),  # few programs walking many tiles
    (2, 512, 512, 4, 2, 128, 200, dict(kv_blocksize=64)),
    (2, 384, 384, 4, 2, 256, 100, {}),           # 64-key blocks, one Q buffer
    (1, 512, 512, 2, 1, 256, 64, {}),
    (2, 1536, 1536, 2, 1, 64, 250, dict(consumers=3)),  # 192-row tiles
    (1, 384, 384, 2, 2, 64, 30, dict(consumers=3)),
    (2, 200, 333, 4, 2, 128, 50, {}),            # ragged lengths: bottom-right, masked past the ends
    (1, 77, 300, 2, 1, 64, 10, {}),
    (1, 1, 1000, 2, 2, 128, 100, {}),            # one query row over many keys
    (2, 300, 300, 4, 2, 256, 70, {}),
])
def test_window_matches_float64(B, Sq, Sk, Hq, Hkv, D, window, extra):
    q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, D, torch.bfloat16, "cuda", requires_grad=False)
    out, lse = _poisoned(q)
    ragged = Sq != Sk or Sq % 128 != 0
    fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=0.9 * D ** -0.5, causal=True, window=window, out=out,
                                  lse=lse, ragged=ragged, **extra)
    _check_against_float64(out, lse, q, k, v, causal=True, sliding_window=(window, 0),
                           softmax_scale=0.9 * D ** -0.5)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("lens_q, lens_k, Hq, Hkv, D, window", [
    ([300, 0, 129, 128, 1, 517, 64], None, 4, 2, 128, 100),   # one offsets tensor
    ([1000, 24, 255, 256], None, 2, 1, 64, 0),
    ([200, 333, 1, 64], None, 4, 2, 256, 70),
    ([300, 0, 129, 128, 1, 517, 64], [300, 40, 200, 128, 1000, 517, 1], 4, 2, 128, 150),  # two
    ([200, 77, 5], [0, 300, 130], 4, 1, 64, 20),
    ([190, 66, 300], [64, 200, 1], 2, 2, 256, 40),
    ([50, 64], [1000, 300], 2, 1, 128, 20),                     # a long prefix, a short window
])
def test_packed_window_matches_float64(lens_q, lens_k, Hq, Hkv, D, window):
    """Packed sequences, each with its own bottom-right window; nothing written past the tokens."""
    check_packed_forward(lens_q, lens_k, Hq, Hkv, D, True, window, seed=sum(lens_q) + D + window)


def check_packed_forward(lens_q, lens_k, Hq, Hkv, D, causal, window, softcap=None, gain=1.0, seed=0):
    """The packed ws forward on fresh inputs (``lens_k`` None: one offsets tensor for both sides)
    with a left ``window`` (or None) and ``softcap`` (or None), scale ``gain / sqrt(D)``, against
    float64 per sequence, its output in a NaN-guarded buffer that must stay NaN past the tokens."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lens_k = lens_k or lens_q
    dtype, scale = torch.bfloat16, gain * D ** -0.5
    Tq, Tk = sum(lens_q), sum(lens_k)
    q = torch.randn(Tq, Hq, D, device="cuda", generator=gen).to(dtype)
    k, v = (torch.randn(Tk, Hkv, D, device="cuda", generator=gen).to(dtype) for _ in range(2))
    cu_q = _offsets(lens_q, "cuda")
    cu_k = cu_q if lens_k is lens_q else _offsets(lens_k, "cuda")
    guarded = torch.full((Tq + 2, Hq, D), float("nan"), device="cuda", dtype=dtype)
    out, lse = fwd_ws.flash_attention_fwd_ws_packed(q, k, v, cu_q, softmax_scale=scale, causal=causal, window=window,
                                                    softcap=softcap, out=guarded[1:-1],
                                                    cum_seqlens_k=None if cu_k is cu_q else cu_k)
    assert guarded[0].isnan().all() and guarded[-1].isnan().all()
    check_two_offsets(out, lse, q, k, v, lens_q, lens_k, causal, scale, dtype,
                      sliding_window=None if window is None else (window, 0), logits_soft_cap=softcap)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("lens_q, lens_k, Hq, Hkv, D, window", [
    ([300, 0, 129, 128, 1, 517, 64], None, 4, 2, 128, 100),    # one offsets tensor
    ([1000, 24, 255, 256], None, 2, 1, 64, 0),
    ([300, 0, 129, 128, 1, 517, 63], None, 4, 2, 256, 70),     # D=256: bwd_d256's 64-key programs
    ([300, 0, 129, 128, 1, 517, 64], [300, 40, 200, 128, 1000, 517, 1], 4, 2, 128, 150),  # two
    ([190, 66, 300, 0], [64, 200, 1, 70], 4, 2, 256, 40),
    ([1200], None, 2, 2, 128, 300),                             # key blocks whose last queries see none
    ([50, 64], [1000, 300], 2, 1, 128, 20),                     # a long prefix: key blocks no query sees
    ([50, 64], [1000, 300], 2, 1, 256, 20),
])
def test_packed_window_backward_matches_float64(monkeypatch, lens_q, lens_k, Hq, Hkv, D, window):
    """The fused Gluon backward over packed sequences with a causal window (PACKED with CAUSAL ==
    2: each program's query blocks end where the window leaves its keys): dQ, dK and dV of every
    sequence against float64, with dlse, nothing written past the tokens."""
    check_packed_backward(monkeypatch, lens_q, lens_k or lens_q, Hq, Hkv, D, True, window)


@pytest.fixture
def launches(monkeypatch):
    return launch_spy(monkeypatch, "flash_attention_fwd_ws_kernel")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("case", [(2, 512, 512, 4, 2, 128, True, (100, 0), None),
                                  (1, 384, 384, 4, 1, 256, True, 200, None),
                                  (2, 200, 333, 4, 2, 128, True, (40, 0), None)], ids=["gqa", "d256", "ragged"])
def test_ws_config_runs_windows_and_trains(launches, case):
    """A ws config runs a windowed call through the kernel (twice: the second through the plan the
    first bound); output, lse and gradients match float64."""
    cfg = FlashAttentionConfig(FwdParams(64, 64, 4, 3, ws=True), BwdParams(64, 64, 4, 2), platform="triton")
    for _ in range(2):
        check_call(case, torch.bfloat16, "triton", cfg=cfg)
    assert launches == ["ws", "ws"]


@pytest.mark.gpu
@needs_sm90
def test_default_windowed_call_runs_it(monkeypatch, launches):
    """The automatic rule sends a causal window over the FLOP floor to the kernel (packed too)."""
    from tests.modules.test_flash_attention_varlen import check_varlen

    q, k, v = make_qkv(1, 4096, 4096, 16, 4, 128, torch.bfloat16, "cuda", requires_grad=False)  # 3.4e10 FLOPs
    out, lse = flash_attention(q, k, v, causal=True, sliding_window=(1023, 0), return_lse=True)
    assert launches == ["ws"]
    _check_against_float64(out, lse, q, k, v, causal=True, sliding_window=(1023, 0))
    launches.clear()
    fused = launch_spy(monkeypatch, "flash_attention_bwd_fused_kernel")
    check_varlen([1500, 700, 0, 1801], [1500, 700, 0, 1801], 8, 2, 128, torch.bfloat16, "triton", device="cuda",
                 shared_offsets=True, causal=True, sliding_window=(300, 0))
    assert launches == ["ws"] and fused == ["ws"]  # the packed window's backward: the fused Gluon kernel


@needs_gluon
def test_rule_takes_windows():
    """Windowed calls over the FLOP floor go to the Gluon kernels by the automatic rule, dense
    (forward, and the dK/dV kernel's window backward) and packed (forward and the fused backward);
    a packed call's band is judged over its longest side."""
    from kernelops.modules.flash_attention import FLASH_ATTENTION
    from tests.kernels.test_flash_attention_fwd_ws_packed import _packed_inputs
    from tests.modules.test_flash_attention_ws_choice import H200, _inputs

    windowed = _inputs(4096, B=4, H=16, sliding_window=1024)
    assert FLASH_ATTENTION.ws_auto(windowed, H200) and FLASH_ATTENTION.ws_auto(windowed, H200, backward=True)
    q = torch.empty(300, 2, 64)
    assert ws_common.packed_window_band(100, 0, q, q) == (True, 100)
    assert ws_common.packed_window_band(1 << 30, 1 << 30, q, q) == (False, None)
    assert ws_common.packed_window_band(270, 0, q, q[:260]) == (True, 270)  # (over the 300 queries, not the keys)
    packed = _packed_inputs([1000, 3096], causal=True, sliding_window=256)
    assert FLASH_ATTENTION.ws_auto(packed, H200) and FLASH_ATTENTION.ws_auto(packed, H200, backward=True)
