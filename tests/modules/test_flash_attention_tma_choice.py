"""``FwdParams.tma``: a config picks the TMA-descriptor forward (kernels/flash_attention/fwd_tma.py)
or the pointer forward (fwd.py). Calls the TMA kernel cannot take run the pointer kernel with the
same tiles; results match float64 either way; the heuristic and the tuner offer it only where it
applies (Hopper or newer, plain score terms, D a power of two)."""

import pytest
import torch

from kernelops import BwdParams, FlashAttentionConfig, FwdParams, flash_attention
from kernelops.kernels.flash_attention import dispatch, fwd_tma
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops.device import DeviceInfo, device_info
from tests.attention_checks import make_qkv
from tests.conftest import DEVICE
from tests.modules.test_flash_attention import check_call

TMA_CFG = FlashAttentionConfig(FwdParams(16, 16, 4, 1, tma=True), BwdParams(16, 16, 4, 1), platform="triton")
H100 = DeviceInfo("cuda", 0, "NVIDIA_H100_80GB_HBM3", (9, 0), 232448, 132)
A100 = DeviceInfo("cuda", 0, "NVIDIA_A100-SXM4-80GB", (8, 0), 166912, 108)


@pytest.fixture
def launches(monkeypatch):
    """Which forward kernel each call ran: ``"tma"`` / ``"pointer"`` in call order."""
    seen = []

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            seen.append(name)
            return fn(*args, **kwargs)
        return wrapped

    # (the dispatcher holds the launchers by name)
    monkeypatch.setattr(dispatch, "flash_attention_fwd_tma", spy("tma", dispatch.flash_attention_fwd_tma))
    monkeypatch.setattr(dispatch, "flash_attention_fwd", spy("pointer", dispatch.flash_attention_fwd))
    planned = dispatch.planned_pointer_forward  # (on a GPU the pointer kernel may run through its plan)

    def planned_spy(*args):
        got = planned(*args)
        if got is not None:
            seen.append("pointer")
        return got
    monkeypatch.setattr(dispatch, "planned_pointer_forward", planned_spy)
    return seen


def _tma_runs_here() -> bool:
    q = torch.randn(1, 16, 2, 16, device=DEVICE, dtype=torch.float16)
    return fwd_tma.tma_supported(q, q, q)


needs_tma = pytest.mark.skipif(not _tma_runs_here(), reason="TMA descriptors need sm90+ (or the interpreter)")


@needs_tma
@pytest.mark.parametrize("case", [(2, 37, 53, 4, 2, 32, True, None, None), (1, 40, 40, 2, 2, 16, False, (9, 5), 6.0)],
                         ids=["causal-gqa", "window-softcap"])
def test_tma_config_forward_and_backward(launches, case):
    """A tma config runs the TMA forward; its lse feeds the backward: output, lse and gradients
    match float64."""
    check_call(case, torch.float16, "triton", cfg=TMA_CFG)
    assert launches == ["tma"]


@needs_tma
@pytest.mark.parametrize("extra", ["bias", "dropout", "bhsd"])
def test_calls_the_tma_kernel_cannot_take_run_the_pointer_kernel(launches, extra):
    """A bias, dropout or BHSD storage (no [B*S, H*D] row view) under a tma config: the pointer kernel
    runs, with the result of the pointer config."""
    q, k, v = make_qkv(2, 33, 45, 2, 2, 16, torch.float16, DEVICE, requires_grad=False)
    kw = dict(causal=True, platform="triton")
    if extra == "bias":
        kw["bias"] = torch.randn(2, 2, 33, 45, device=DEVICE, dtype=torch.float16)
    elif extra == "dropout":
        kw.update(dropout_prob=0.2, dropout_seed=7)
    else:
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    got = flash_attention(q, k, v, cfg=TMA_CFG, **kw)
    assert launches == ["pointer"]
    want = flash_attention(q, k, v, cfg=FlashAttentionConfig(FwdParams(16, 16, 4, 1), BwdParams(16, 16, 4, 1),
                                                             platform="triton"), **kw)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _inputs(S, D=128, causal=True, **kw):
    q = torch.randn(1, S, 2, D, dtype=torch.bfloat16)
    return FLASH_ATTENTION.prepare(query=q, key=q, value=q, causal=causal, **kw)


@pytest.mark.parametrize("S, D, causal, extra, device, want", [
    (1024, 128, False, {}, H100, True),
    (2048, 128, False, {}, H100, True),
    (4096, 128, True, {}, H100, True),
    (4096, 128, False, {}, H100, False),      # the H100 tuner kept the pointer kernel's 128x128 tiles there
    (8192, 128, True, {}, H100, False),
    (16384, 256, False, {}, H100, True),      # D=256: the TMA forward won at every length
    (1024, 64, True, {}, H100, False),
    (1024, 128, True, {"alibi": True}, H100, False),
    (1024, 128, True, {}, A100, False),       # no TMA descriptors before sm90
])
def test_heuristic_picks_tma_for_short_plain_calls_on_hopper(S, D, causal, extra, device, want):
    kw = {"alibi_slopes": torch.rand(2)} if extra.get("alibi") else {}
    fwd = FLASH_ATTENTION.heuristic_config(_inputs(S, D, causal, **kw), device).fwd_params
    assert fwd.tma is want
    if want and D == 128:
        assert (fwd.q_blocksize, fwd.kv_blocksize, fwd.num_warps) == (64, 64, 4)


def test_tuning_candidates_include_tma_only_where_it_applies():
    inputs = _inputs(8192)
    on_hopper = FLASH_ATTENTION.candidate_params(inputs, H100, "fwd")
    assert any(p.tma for p in on_hopper) and any(not p.tma for p in on_hopper)
    assert not any(p.tma for p in FLASH_ATTENTION.candidate_params(inputs, A100, "fwd"))
    assert not any(p.tma for p in FLASH_ATTENTION.candidate_params(inputs, device_info(torch.device("cpu")), "fwd"))
    padded = _inputs(8192, D=96)
    assert not any(p.tma for p in FLASH_ATTENTION.candidate_params(padded, H100, "fwd"))
