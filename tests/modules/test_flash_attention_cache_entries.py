"""Stored configs (disk cache, shipped files) are completed and checked like an explicit cfg=:
an entry with null params is filled from the heuristic, an entry that cannot launch is declined
with its reason and the chain goes on; the executor's memo is per requested platform."""

import pytest
import torch

from kernelops import flash_attention
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops import ConfigSelectorChain, Executor
from kernelops.ops.cache import ConfigCache, make_entry
from kernelops.ops.device import device_info
from kernelops.ops.keys import key_text
from kernelops.ops.pretuned import PretunedStore, write_pretuned_file
from kernelops.ops.selectors import AutotunePolicy, Context
from tests.attention_checks import make_qkv, reference, rel_err
from tests.conftest import DEVICE

NULL_PARAMS = {"fwd_params": None, "bwd_params": None, "decode_params": None, "platform": "auto", "backend": "any"}
TOO_SMALL = {**NULL_PARAMS, "fwd_params": {"q_blocksize": 8, "kv_blocksize": 16, "num_warps": 4, "num_stages": 1}}


def _setup(tmp_path):
    cache, store = ConfigCache(tmp_path / "cache"), PretunedStore(tmp_path / "pretuned")
    ex = Executor(ConfigSelectorChain(cache=cache, pretuned=store, policy="never"))
    q, k, v = make_qkv(1, 40, 40, 2, 1, 16, torch.float32, DEVICE, requires_grad=False)
    inputs = FLASH_ATTENTION.prepare(query=q, key=k, value=v, causal=True)
    device = device_info(q.device)
    return ex, cache, store, (q, k, v), inputs, device


def _explain(ex, qkv):
    q, k, v = qkv
    return ex.explain(FLASH_ATTENTION, query=q, key=k, value=v, causal=True, platform="triton")


def _run_and_check(ex, qkv):
    q, k, v = qkv
    out = ex(FLASH_ATTENTION, query=q, key=k, value=v, causal=True, platform="triton")
    ref, _, _ = reference(q, k, v, causal=True)
    assert rel_err(out, ref) < 1e-5


def test_disk_entry_with_null_params_is_filled_from_the_heuristic(tmp_path):
    ex, cache, _, qkv, inputs, device = _setup(tmp_path)
    ctx = Context(FLASH_ATTENTION, inputs, FLASH_ATTENTION.key(inputs), device, AutotunePolicy.NEVER)
    cache.put_disk(ctx.disk_key, make_entry(NULL_PARAMS, ms=1.0))
    expl = _explain(ex, qkv)
    heuristic = FLASH_ATTENTION.heuristic_config(inputs, device)
    assert expl.selector == "disk" and expl.config.fwd_params == heuristic.fwd_params
    _run_and_check(ex, qkv)


@pytest.mark.parametrize("where", ["disk", "pretuned"])
def test_entry_that_cannot_launch_is_declined(tmp_path, where):
    ex, cache, store, qkv, inputs, device = _setup(tmp_path)
    if where == "disk":
        ctx = Context(FLASH_ATTENTION, inputs, FLASH_ATTENTION.key(inputs), device, AutotunePolicy.NEVER)
        cache.put_disk(ctx.disk_key, make_entry(TOO_SMALL, ms=1.0))
    else:
        write_pretuned_file(tmp_path / "pretuned", "flash_attention",
                            {key_text(FLASH_ATTENTION.key(inputs)): make_entry(TOO_SMALL, ms=1.0)}, device)
        store.reload()
    expl = _explain(ex, qkv)
    assert expl.selector == "heuristic"
    assert "entry is unusable" in dict(expl.declined)[where] and "at least 16" in dict(expl.declined)[where]
    _run_and_check(ex, qkv)


def test_memo_is_per_requested_platform(tmp_path):
    ex, _, _, (q, k, v), _, _ = _setup(tmp_path)
    for platform in ("torch", "triton", "torch"):
        ex(FLASH_ATTENTION, query=q, key=k, value=v, causal=True, platform=platform)
    assert sorted(key[-1] for key in ex._resolved) == ["torch", "triton"]  # noqa: SLF001


def test_backend_field_is_enforced(tmp_path):
    from kernelops import FlashAttentionConfig

    q, k, v = make_qkv(1, 16, 16, 2, 1, 16, torch.float32, DEVICE, requires_grad=False)
    wrong = "cpu" if q.is_cuda else "gpu"
    with pytest.raises(ValueError, match=f"backend='{wrong}'"):
        flash_attention(q, k, v, cfg=FlashAttentionConfig(backend=wrong))
    right = "gpu" if q.is_cuda else "cpu"
    assert flash_attention(q, k, v, cfg=FlashAttentionConfig(backend=right)).shape == q.shape


def test_a_torch_platform_call_does_not_pin_the_heuristic_for_triton(tmp_path, monkeypatch):
    """On a GPU a platform='torch' call has nothing to tune and gets the heuristic; a later
    triton call of the same key must still be tuned (it used to reuse the memoized heuristic).
    A stand-in CUDA device and a fake timer (later candidates time faster) play the GPU."""
    import itertools

    import kernelops.ops.executor as executor_mod
    from kernelops.ops import Autotuner
    from kernelops.ops.device import DeviceInfo

    fake = DeviceInfo("cuda", 0, "FAKE_GPU", (9, 0), 227 * 1024, 132)
    monkeypatch.setattr(executor_mod, "device_info", lambda device=None: fake)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    ticks = itertools.count()
    tuner = Autotuner(progress=False)
    tuner.time_fn = tuner.quick_time_fn = lambda fn: 1000.0 - next(ticks)
    ex = Executor(ConfigSelectorChain(cache=ConfigCache(tmp_path / "cache"), pretuned=PretunedStore(tmp_path / "p"),
                                      autotuner=tuner, policy="auto"))
    q, k, v = make_qkv(1, 32, 32, 2, 1, 16, torch.float16, DEVICE, requires_grad=False)
    ex(FLASH_ATTENTION, query=q, key=k, value=v, causal=True, platform="torch")
    inputs = FLASH_ATTENTION.prepare(query=q, key=k, value=v, causal=True, platform="triton")
    config, _ = ex._select(FLASH_ATTENTION, inputs)  # noqa: SLF001
    assert config != FLASH_ATTENTION.heuristic_config(inputs, fake)
    assert next(ticks) > 1, "the triton call was not tuned"
