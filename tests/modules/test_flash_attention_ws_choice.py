"""``FwdParams.ws``: the warp-specialised Gluon forward (kernels/flash_attention/fwd_ws.py) runs the
calls it takes (sm_90, D 64/128/256, Sq == Sk a multiple of 128, causal or full, no other score terms)
when a config asks for it or, with ``ws=None``, by its own rule; every other call runs the TMA or
pointer kernel with the config's tiles. Results match float64 either way."""

import pytest
import torch

from kernelops import BwdParams, FlashAttentionConfig, FwdParams, flash_attention
from kernelops.kernels.common.gluon import GLUON
from kernelops.kernels.flash_attention import dispatch, fwd_ws, ws_common
from kernelops.kernels.flash_attention.registration import _fwd_params
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops.device import DeviceInfo
from tests.attention_checks import assert_lse_matches, assert_matches, make_qkv, reference
from tests.conftest import DEVICE
from tests.modules.test_flash_attention import check_call

H100 = DeviceInfo("cuda", 0, "NVIDIA_H100_80GB_HBM3", (9, 0), 232448, 132)
H200 = DeviceInfo("cuda", 0, "NVIDIA_H200", (9, 0), 232448, 132)
A100 = DeviceInfo("cuda", 0, "NVIDIA_A100-SXM4-80GB", (8, 0), 166912, 108)
B200 = DeviceInfo("cuda", 0, "NVIDIA_B200", (10, 0), 232448, 148)
needs_gluon = pytest.mark.skipif(not GLUON, reason="this Triton has no Gluon warp specialisation")


def _inputs(Sq, D=128, causal=True, Sk=None, dtype=torch.bfloat16, B=1, H=4, **kw):
    """The op's inputs on the meta device (shapes only: no memory for the large ones)."""
    q = torch.empty(B, Sq, H, D, dtype=dtype, device="meta")
    k = torch.empty(B, Sk or Sq, 2, D, dtype=dtype, device="meta")
    return FLASH_ATTENTION.prepare(query=q, key=k, value=k, causal=causal, **kw)


# B*S = 16k tokens, H*D = 2048 (the benchmark grid) unless a case says otherwise
@needs_gluon
@pytest.mark.parametrize("S, D, causal, extra, device, want", [
    (2048, 128, True, {}, H100, True),
    (1024, 128, False, {}, H200, True),
    (32768, 128, True, {}, H100, True),
    (1024, 128, True, {}, H100, True),          # 0.7e11 FLOPs: over the forward's 1e10 floor
    (4096, 128, True, {"B": 1, "H": 4}, H100, True),   # 1.7e10
    (2048, 128, True, {"B": 1, "H": 4}, H100, False),  # 0.4e10: under it
    (4096, 64, True, {}, H100, True),           # D=64 at every length
    (16384, 64, False, {}, H100, True),
    (512, 256, True, {}, H200, True),           # D=256 (3.4e10)
    (16384, 256, False, {}, H100, True),
    (2000, 256, False, {}, H200, False),        # not a multiple of 128
    (1920, 128, False, {}, H100, True),         # a multiple of 128
    (2000, 128, False, {}, H100, False),        # not one
    (2048, 96, False, {"H": 16}, H100, False),
    (2048, 128, True, {"sliding_window": 256}, H100, True),   # a causal left window: CAUSAL == 2
    (2048, 128, False, {"sliding_window": (255, 16)}, H100, False),  # a right window: the other kernels
    (2048, 128, True, {"logits_soft_cap": 30.0}, H100, True),   # a soft cap: SOFTCAP
    (2048, 128, True, {"alibi": True}, H100, False),
    (2048, 128, True, {"dropout_prob": 0.1}, H100, False),
    (2048, 128, True, {"softmax_scale": -0.1}, H100, False),   # the kernel needs a positive scale
    (2048, 128, True, {"softmax_scale": 1e-45}, H100, False),  # flushed to 0 in float32
    (2048, 128, True, {"Sk": 4096}, H100, False),
    (2048, 128, True, {"dtype": torch.float32}, H100, False),
    (2048, 128, True, {}, A100, False),
    (256, 128, True, {"B": 2048, "H": 32}, H100, True),  # B * Hq over 65535: the grids are 1-D
    (2048, 128, False, {"B": 0}, H100, False),
    (2048, 128, True, {}, B200, False),         # warpgroup MMAs are sm_90 only
])
def test_automatic_rule(S, D, causal, extra, device, want):
    kw = {"B": max(1, 16384 // S), "H": 2048 // D, **extra}
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(kw["H"], device="meta")
    inputs = _inputs(S, D, causal, **kw)
    assert FLASH_ATTENTION.ws_auto(inputs, device) is want
    if want:
        assert FLASH_ATTENTION.ws_applies(inputs, device)


@needs_gluon
def test_tuning_candidates_offer_one_ws_config_where_it_applies():
    big = dict(B=2, H=16)  # 2.7e11 FLOPs causal
    on_hopper = FLASH_ATTENTION.candidate_params(_inputs(8192, **big), H100, "fwd")
    assert [p for p in on_hopper if p.ws] == [FwdParams(64, 64, 4, 3, tma=True, ws=True)]
    assert all(p.ws is False for p in on_hopper if not p.ws)  # tuned entries say so explicitly
    for inputs, device in ((_inputs(8192, **big), A100), (_inputs(8192, causal=False, sliding_window=(511, 16),
                                                                  **big), H100)):
        assert all(p.ws is None for p in FLASH_ATTENTION.candidate_params(inputs, device, "fwd"))
    windowed = FLASH_ATTENTION.candidate_params(_inputs(8192, sliding_window=512, **big), H100, "fwd")
    assert [p for p in windowed if p.ws] == [FwdParams(64, 64, 4, 3, tma=True, ws=True)]  # a causal window


@needs_gluon
@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_tuning_offers_no_ws_below_the_flop_floor(phase):
    """A key holds no batch or head count: a ws=True won on a small call would be reused on calls
    whose host cost it cannot hide, so under the floor (1e10 FLOPs) the tuner picks among the other kernels."""
    small = _inputs(2048, B=1, H=4)  # 4.3e9 FLOPs
    assert FLASH_ATTENTION.ws_applies(small, H100, backward=phase == "bwd")
    assert not any(p.ws for p in FLASH_ATTENTION.candidate_params(small, H100, phase))


@needs_gluon
@pytest.mark.parametrize("Sq, Sk", [(2048, 4096), (2000, 2000), (77, 65536)])
def test_other_lengths_run_it_on_request_only(Sq, Sk):
    """Lengths other than Sq == Sk multiples of 128 take the kernel's RAGGED path: a config or the
    tuner may choose it (the forward's candidates offer it), the automatic rule does not, and the
    dK/dV kernel never does."""
    inputs = _inputs(Sq, Sk=Sk, B=8, H=16)
    assert FLASH_ATTENTION.ws_applies(inputs, H100) and not FLASH_ATTENTION.ws_auto(inputs, H100)
    assert not FLASH_ATTENTION.ws_applies(inputs, H100, backward=True)
    assert any(p.ws for p in FLASH_ATTENTION.candidate_params(inputs, H100, "fwd"))
    assert all(p.ws is None for p in FLASH_ATTENTION.candidate_params(inputs, H100, "bwd"))


@pytest.mark.parametrize("win_left, win_right, band", [(600, 0, (True, None)), (511, 0, (True, None)),
                                                       (200, 0, (True, 200)), (0, 0, (True, 0)), (200, 3, None)])
def test_dispatcher_reads_the_band_against_the_keys(monkeypatch, win_left, win_right, band):
    """With Sq = 128 < Sk = 512 (bottom-right causal), a left bound of at least Sk - 1 is plain causal
    and goes to the ws kernel, a shorter one as a window (its CAUSAL == 2); a right window runs the
    other kernels."""
    seen = []
    monkeypatch.setattr(dispatch, "fwd_ws_plan", lambda *args, **kw: None)  # (a plan would launch the real kernel)
    monkeypatch.setattr(ws_common, "ws_supported", lambda *args, **kw: True)  # as on an H100
    monkeypatch.setattr(dispatch, "flash_attention_fwd_ws",
                        lambda *args, **kw: seen.append((kw["causal"], kw["window"])) or "ws")
    q, k, v = make_qkv(1, 128, 512, 1, 1, 16, torch.float16, DEVICE, requires_grad=False)
    got = dispatch.flash_attention_fwd_dense(q, k, v, ws=True, softmax_scale=0.25, win_left=win_left,
                                              win_right=win_right, softcap=None, q_blocksize=16, kv_blocksize=16,
                                              num_warps=4, num_stages=1)
    assert seen == ([band] if band else []) and (got == "ws") is bool(band)


@pytest.mark.parametrize("q_shape, k_shape, plain, ragged", [
    ((2, 256, 4, 128), (2, 256, 2, 128), True, True), ((2, 200, 4, 128), (2, 200, 2, 128), False, True),
    ((2, 128, 4, 64), (2, 512, 4, 64), False, True), ((2, 512, 4, 64), (2, 128, 4, 64), False, False),
    ((2, 0, 4, 64), (2, 128, 4, 64), False, False), ((2, 128, 3, 64), (2, 128, 2, 64), False, False),
    ((1, 384, 2, 256), (1, 384, 1, 256), True, True), ((1, 384, 2, 96), (1, 384, 1, 96), False, False)])
def test_shape_gate(q_shape, k_shape, plain, ragged):
    """The library's gate (multiples of 128, Sq == Sk) and the prepared ragged one (0 < Sq <= Sk)."""
    assert ws_common.ws_shape_supported(q_shape, k_shape, torch.bfloat16) is plain
    assert ws_common.ws_shape_supported(q_shape, k_shape, torch.bfloat16, ragged=True) is ragged


def test_heuristic_leaves_ws_automatic():
    assert FLASH_ATTENTION.heuristic_config(_inputs(4096), H100).fwd_params.ws is None


@pytest.mark.parametrize("flags, want", [([64, 64, 4, 3], (False, False)), ([64, 64, 4, 3, 1], (True, False)),
                                         ([64, 64, 4, 3, 2], (False, True)), ([64, 64, 4, 3, 3], (True, True))])
def test_op_params_carry_both_flags(flags, want):
    got = _fwd_params(flags)
    assert (got["tma"], got["ws"]) == want and got["q_blocksize"] == 64


@pytest.mark.parametrize("left, right, seq, want", [(1 << 30, 0, 256, True), (1 << 30, 1 << 30, 256, False),
                                                    (255, 255, 256, False), (255, 0, 256, True),
                                                    (100, 0, 256, None), (1 << 30, 3, 256, None)])
def test_band(left, right, seq, want):
    assert ws_common.ws_band(left, right, seq) is want


def test_calls_it_cannot_take_run_the_other_kernels(monkeypatch):
    """A ws config on a call the kernel cannot take (D=96, which it has no tiles for; on CPU: any
    call) runs the tiles' kernel, bit for bit."""
    ran = []
    monkeypatch.setattr(dispatch, "flash_attention_fwd_ws", lambda *a, **k: ran.append("ws"))
    q, k, v = make_qkv(1, 100, 100, 2, 2, 96, torch.float16, DEVICE, requires_grad=False)
    tiles = FwdParams(16, 16, 4, 1)
    base = dict(causal=True, platform="triton")
    got = flash_attention(q, k, v, cfg=FlashAttentionConfig(FwdParams(16, 16, 4, 1, ws=True),
                                                            BwdParams(16, 16, 4, 1), platform="triton"), **base)
    want = flash_attention(q, k, v, cfg=FlashAttentionConfig(tiles, BwdParams(16, 16, 4, 1), platform="triton"),
                           **base)
    assert ran == []
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# --- on an H100 / H200 ------------------------------------------------------------------------
def _ws_runs_here() -> bool:
    if not torch.cuda.is_available():
        return False
    q = torch.empty(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16)
    return ws_common.ws_supported(q, q, q)


needs_sm90 = pytest.mark.skipif(not _ws_runs_here(), reason="the warp-specialised kernels need an sm_90 GPU")


def launch_spy(monkeypatch, kernel: str) -> list:
    """A list that gets ``"ws"`` each time the kernel named ``kernel`` launches (through
    :mod:`kernels.common.launch`, whichever path: Triton's, a remembered or a bound launch)."""
    from kernelops.kernels.common import launch

    seen = []
    observers = list(launch.observers) + [lambda name: seen.append("ws") if name == kernel else None]
    monkeypatch.setattr(launch, "observers", observers)
    return seen


@pytest.fixture
def launches(monkeypatch):
    return launch_spy(monkeypatch, "flash_attention_fwd_ws_kernel")


def _check_against_float64(out, lse, q, k, v, dtype=torch.bfloat16, **kw):
    """``out`` / ``lse`` of the kernel against float64 (flash-attn's rule: within a small multiple of
    the error of the same computation in ``dtype``)."""
    ref_out, ref_lse, _ = reference(q, k, v, **kw)
    low_out, _, _ = reference(q, k, v, dtype=dtype, **kw)
    assert_matches("out", out, ref_out, low_out, dtype)
    assert_lse_matches(lse, ref_lse, dtype)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("B, S, Hq, Hkv, D, causal", [(2, 256, 4, 4, 128, False), (1, 512, 8, 2, 64, True),
                                                     (2, 384, 4, 1, 128, True), (1, 128, 2, 2, 64, False),
                                                     (1, 1024, 4, 2, 128, True),
                                                     (1, 1536, 4, 2, 64, False),  # the rule's three consumers
                                                     (2, 384, 4, 2, 256, True), (1, 512, 2, 1, 256, False)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_kernel_matches_float64(B, S, Hq, Hkv, D, causal, dtype):
    q, k, v = make_qkv(B, S, S, Hq, Hkv, D, dtype, "cuda", requires_grad=False)
    out, lse = fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=0.7 * D ** -0.5, causal=causal)
    _check_against_float64(out, lse, q, k, v, dtype, causal=causal, softmax_scale=0.7 * D ** -0.5)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("B, Sq, Sk, Hq, Hkv, D, causal, kv_blocksize", [
    (2, 200, 333, 4, 2, 128, True, 128), (2, 200, 333, 4, 2, 128, False, 128), (1, 77, 77, 2, 1, 64, True, 128),
    (3, 1000, 1000, 2, 2, 128, True, 64), (1, 128, 1024, 4, 4, 64, True, 128), (1, 1, 130, 2, 2, 128, False, 64),
    (2, 200, 333, 4, 2, 256, True, 64), (1, 77, 300, 2, 1, 256, False, 64)])
def test_ragged_path_matches_float64(B, Sq, Sk, Hq, Hkv, D, causal, kv_blocksize):
    """The kernel's RAGGED path (any 0 < Sq <= Sk, bottom-right causal; not yet taken by the
    library's gates): key blocks past Sk masked, rows past Sq stored with a mask, lse of every row."""
    q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, D, torch.bfloat16, "cuda", requires_grad=False)
    out, lse = fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=D ** -0.5, causal=causal, ragged=True,
                                             kv_blocksize=kv_blocksize, num_stages=2 if D < 256 else None)
    _check_against_float64(out, lse, q, k, v, causal=causal)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("S, causal, ragged", [(384, True, False), (512, True, False), (256, False, False),
                                              (333, True, True)], ids=["causal-odd", "causal", "full", "ragged"])
@pytest.mark.parametrize("programs, chunk", [(1, 1), (3, 2), (5, 4), (7, 64)])
@pytest.mark.parametrize("D", [64, 256])
def test_persistent_programs_match_float64(S, causal, ragged, programs, chunk, D):
    """Few programs each walking many units (tiles of several heads, causal pairs and an odd
    count's middle block): Q buffers (two, or D=256's one, refilled once a tile's O has left it),
    K/V rings and turns run on across tiles; every tile's out and lse against float64, outputs
    poisoned with NaN first."""
    B, Hq, Hkv = 2, 6, 2
    q, k, v = make_qkv(B, S, S, Hq, Hkv, D, torch.bfloat16, "cuda", requires_grad=False)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hq, S), float("nan"), device="cuda")
    fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=D ** -0.5, causal=causal, ragged=ragged, out=out, lse=lse,
                                  programs=programs, chunk=chunk)
    _check_against_float64(out, lse, q, k, v, causal=causal)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("B, Sq, Sk, Hq, Hkv, causal, ragged, programs, chunk", [
    (2, 128, 128, 4, 2, True, False, None, None),  # one 192-row tile reaching 64 rows past each sequence
    (3, 384, 384, 2, 1, False, False, None, None),  # two tiles, none past the end
    (2, 1024, 1024, 4, 4, True, False, None, None), (2, 1024, 1024, 4, 2, False, False, None, None),
    (2, 640, 640, 6, 2, True, False, 3, None),  # few programs walking causal pairs and middle blocks
    # one program, every head's block k before any head's block k + 1: batch 1's first tile is
    # stored before batch 0's last, whose rows 640-767 would land on it if stored without the mask
    (2, 640, 640, 4, 2, False, False, 1, 8),
    (2, 200, 333, 4, 2, True, True, None, None), (1, 77, 77, 2, 1, False, True, 1, None)])
def test_three_consumers_match_float64(B, Sq, Sk, Hq, Hkv, causal, ragged, programs, chunk):
    """D=64 with three consumer warpgroups (192-row tiles, turns passed round three): rows past a
    sequence stored with a mask, fully masked key blocks of the first warpgroup, every tile's out and
    lse against float64, outputs poisoned with NaN first."""
    q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, 64, torch.bfloat16, "cuda", requires_grad=False)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hq, Sq), float("nan"), device="cuda")
    fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=0.125, causal=causal, ragged=ragged, out=out, lse=lse,
                                  programs=programs, chunk=chunk, consumers=3)
    _check_against_float64(out, lse, q, k, v, causal=causal)


def test_consumers_checked():
    """The rule takes three consumer warpgroups at D=64 from 1536 rows (causal: 3072) where
    192-row tiles pad little, else two; three only at D=64 (registers); other counts refused."""
    rule = fwd_ws.ws_consumers
    assert [rule(64, False, S) for S in (512, 1024, 1536, 1600, 2048, 4096, 5000, 16384)] == [2, 2, 3, 3, 3, 3, 3, 3]
    # 1792 and 2176 rows: 192-row tiles pad 128 rows, more than 5% beyond 128-row tiles' none
    assert [rule(64, False, S) for S in (1792, 2176, 2560)] == [2, 2, 3]
    assert [rule(64, True, S) for S in (1024, 2048, 2560, 3072, 3200, 4096, 16384)] == [2, 2, 2, 3, 3, 3, 3]
    assert [rule(D, causal, 4096) for D, causal in ((128, False), (128, True), (256, False), (256, True))] == [2] * 4
    lse = torch.empty(1, 2, 128)
    for D, consumers in ((128, 3), (64, 4), (64, 1), (64, True), (64, 3.0)):
        q = torch.empty(1, 128, 2, D, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="consumers"):
            fwd_ws.fwd_ws_launch(q, q, q, q, lse, 0.125, True, 128, 2, consumers=consumers)


@needs_gluon
def test_tiles_by_head_dim_and_shared_memory_checked():
    """D=64/128 take 128-key blocks, two stages and two Q buffers; D=256 64-key blocks, two stages
    and one Q buffer (192 KB); tiles over 227 KB of shared memory or out of range are refused."""
    assert [fwd_ws.ws_tiles(D) for D in (64, 128, 256)] == [(128, 2, 2), (128, 2, 2), (64, 2, 1)]
    assert fwd_ws.ws_smem_bytes(256, 2, 64, 2, 1) == 192 * 1024
    assert fwd_ws.ws_smem_bytes(128, 2, 128, 2, 2) == 192 * 1024
    lse = torch.empty(1, 2, 256)
    q = torch.empty(1, 256, 2, 256, dtype=torch.bfloat16)
    _, _, _, meta = fwd_ws.fwd_ws_launch(q, q, q, q, lse, 0.0625, True, programs=132)
    assert (meta["BLOCK_N"], meta["K_STAGES"], meta["V_STAGES"], meta["Q_BUFS"]) == (64, 2, 2, 1)
    for tiles in (dict(q_buffers=2), dict(num_stages=3), dict(kv_blocksize=128)):  # 256, 256 and 320 KB
        with pytest.raises(ValueError, match="shared memory"):
            fwd_ws.fwd_ws_launch(q, q, q, q, lse, 0.0625, True, programs=132, **tiles)
    q128 = torch.empty(1, 256, 2, 128, dtype=torch.bfloat16)
    _, _, _, meta = fwd_ws.fwd_ws_launch(q128, q128, q128, q128, lse, 0.125, True, programs=132)
    assert (meta["BLOCK_N"], meta["K_STAGES"], meta["Q_BUFS"]) == (128, 2, 2)
    for tiles in (dict(q_buffers=3), dict(num_stages=0), dict(kv_blocksize=32), dict(q_buffers=True)):
        with pytest.raises(ValueError, match="kv_blocksize must be"):
            fwd_ws.fwd_ws_launch(q128, q128, q128, q128, lse, 0.125, True, programs=132, **tiles)


@needs_gluon
def test_launch_follows_the_consumer_rule():
    """The launch takes the rule's count unless told (its tiles, registers and persistent order
    follow): D=64 full from 1536 rows runs three consumers on 192-row tiles."""
    for S, causal, asked, want in ((1024, False, None, 2), (1536, False, None, 3), (1536, True, None, 2),
                                   (4096, True, None, 3),
                                   (1792, False, None, 2), (2048, False, None, 3), (1024, False, 3, 3),
                                   (2048, False, 2, 2)):
        q = torch.empty(1, S, 2, 64, dtype=torch.bfloat16)
        _, _, args, meta = fwd_ws.fwd_ws_launch(q, q, q, q, torch.empty(1, 2, S), 0.125, causal, 128, 2,
                                                programs=132, consumers=asked)
        assert (meta["CONSUMERS"], meta["maxnreg"]) == (want, 168 if want == 2 else 128)
        assert args[12] == fwd_ws.fwd_order(2, S, causal, 132, block_m=64 * want)[0]  # n_units
        assert meta["TURNS"] is (want == 3)  # D=64: two consumers issue without turns


def test_turn_rule():
    """Consumers take turns except 16-bit D=64 calls with two of them, dense or packed (
    three consumers without turns spilled and lost 28% at full 4k-16k; D=128 causal 512 lost 2.6%)."""
    assert fwd_ws.ws_turns(64, 2) is False
    assert fwd_ws.ws_turns(64, 3) and fwd_ws.ws_turns(64, 3, fp8=True) and fwd_ws.ws_turns(64, 2, fp8=True)
    assert fwd_ws.ws_turns(128, 2) and fwd_ws.ws_turns(256, 2)
    q = torch.empty(1, 1024, 2, 128, dtype=torch.bfloat16)
    assert fwd_ws.fwd_ws_launch(q, q, q, q, torch.empty(1, 2, 1024), 0.1, True, 128, 2, programs=132)[3]["TURNS"]


def test_persistent_order_rule_and_checks():
    """One program per SM or per unit; causal units pair query blocks (4 per head at 1k keys),
    full ones are single blocks; the causal chunk is about half a wave; bad values refused."""
    assert fwd_ws.fwd_order(256, 1024, True, 132) == (1024, 8, (132,))
    assert fwd_ws.fwd_order(256, 1024, False, 132) == (2048, 1, (132,))
    assert fwd_ws.fwd_order(2, 384, True, 132) == (4, 2, (4,))  # 3 blocks: a pair and a middle one per head
    assert fwd_ws.fwd_order(6, 333, True, 5, chunk=4) == (12, 4, (5,))
    assert fwd_ws.fwd_order(2, 1024, True, 132, block_m=192) == (6, 2, (6,))  # 6 blocks of 192 rows: 3 pairs a head
    for bad in (dict(chunk=0), dict(chunk=True), dict(programs=0), dict(programs=2.5)):
        kw = dict(dict(programs=132), **bad)
        with pytest.raises(ValueError, match="chunk|programs"):
            fwd_ws.fwd_order(6, 384, True, kw.pop("programs"), **kw)


@pytest.mark.gpu
@needs_sm90
def test_ragged_path_reads_no_other_sequence():
    """A NaN in the second sequence's K/V must not reach the first (its last key block runs past
    its end: the 3-D descriptors read zeros there)."""
    q, k, v = make_qkv(2, 100, 200, 2, 2, 128, torch.bfloat16, "cuda", requires_grad=False)
    k[1], v[1] = float("nan"), float("inf")
    out, lse = fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=128 ** -0.5, causal=False, ragged=True)
    _check_against_float64(out[:1], lse[:1], q[:1], k[:1], v[:1])


@pytest.mark.gpu
@needs_sm90
def test_fused_qkv_slices():
    """q/k/v sliced from one [B, S, 3H, D] projection are row views: the kernel reads them in place."""
    qkv = torch.randn(2, 256, 12, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.split(4, dim=2)
    assert ws_common.ws_supported(q, k, v)
    out, lse = fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=128 ** -0.5, causal=True)
    _check_against_float64(out, lse, q, k, v, causal=True)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("case", [(2, 256, 256, 4, 2, 128, True, None, None), (1, 384, 384, 2, 2, 128, False, None, None),
                                  (1, 1024, 1024, 2, 1, 64, True, None, None),
                                  (2, 384, 384, 4, 2, 256, True, None, None)], ids=["gqa-causal", "full", "d64", "d256"])
def test_ws_config_runs_it_and_trains(launches, case):
    """A ws config runs it; its lse feeds the backward: output, lse and gradients match float64."""
    cfg = FlashAttentionConfig(FwdParams(64, 64, 4, 3, ws=True), BwdParams(64, 64, 4, 2), platform="triton")
    check_call(case, torch.bfloat16, "triton", cfg=cfg)
    assert launches == ["ws"]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("case", [(2, 200, 333, 4, 2, 128, True, None, None), (1, 300, 300, 2, 1, 64, False, None, None)],
                         ids=["prefill-causal", "uneven-full"])
def test_ws_config_runs_other_lengths_and_trains(launches, case):
    """A ws config on lengths other than Sq == Sk multiples of 128 runs the kernel's RAGGED path
    (bottom-right causal); the backward runs the Triton kernels: all against float64."""
    cfg = FlashAttentionConfig(FwdParams(64, 64, 4, 3, ws=True), BwdParams(64, 64, 4, 2), platform="triton")
    check_call(case, torch.bfloat16, "triton", cfg=cfg)
    assert launches == ["ws"]


@pytest.mark.gpu
@needs_sm90
def test_default_call_runs_it_by_its_rule(launches):
    q, k, v = make_qkv(8, 2048, 2048, 16, 16, 128, torch.bfloat16, "cuda", requires_grad=False)  # 1.4e11 FLOPs
    flash_attention(q, k, v, causal=True)
    assert launches == ["ws"]


@pytest.mark.gpu
@needs_sm90
def test_explicit_no_ws_config_keeps_the_other_kernels(launches):
    q, k, v = make_qkv(1, 256, 256, 2, 2, 128, torch.bfloat16, "cuda", requires_grad=False)
    cfg = FlashAttentionConfig(FwdParams(64, 64, 4, 3, ws=False), BwdParams(64, 64, 4, 2), platform="triton")
    got = flash_attention(q, k, v, causal=True, cfg=cfg)
    assert launches == []
    want = flash_attention(q, k, v, causal=True, cfg=FlashAttentionConfig(FwdParams(64, 64, 4, 3, ws=True),
                                                                         BwdParams(64, 64, 4, 2), platform="triton"))
    assert launches == ["ws"]
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_launch_refuses_scales_the_kernel_cannot_take():
    """The kernel takes each row's maximum before scaling, so a scale <= 0 is refused at launch
    (the dispatchers send such calls to the other kernels)."""
    q = torch.empty(1, 128, 2, 64, dtype=torch.bfloat16)
    lse = torch.empty(1, 2, 128)
    for scale in (0.0, -0.125, float("nan"), 1e-45):
        with pytest.raises(ValueError, match="softmax_scale > 0"):
            fwd_ws.fwd_ws_launch(q, q, q, q, lse, scale, True, 128, 2)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("scale", [-0.1, 0.0, 1e-45])
def test_non_positive_scale_runs_the_other_kernels(launches, scale):
    """A ws config with a negative, zero or float32-subnormal scale runs the tiles' kernel, against
    float64."""
    cfg = FlashAttentionConfig(FwdParams(64, 64, 4, 3, ws=True), BwdParams(64, 64, 4, 2), platform="triton")
    q, k, v = make_qkv(1, 256, 256, 2, 2, 64, torch.bfloat16, "cuda", requires_grad=False)
    out = flash_attention(q, k, v, causal=True, softmax_scale=scale, cfg=cfg)
    assert launches == []
    ref, _, _ = reference(q, k, v, causal=True, softmax_scale=scale)
    low, _, _ = reference(q, k, v, causal=True, softmax_scale=scale, dtype=torch.bfloat16)
    assert_matches("out", out, ref, low, torch.bfloat16)
