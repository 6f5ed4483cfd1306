"""A stored entry never fails a call: an entry from the memory cache, the disk cache or a shipped
file that cannot run the call (its platform cannot run these inputs, or a config the op refuses)
is skipped with its reason in ``explain()`` and one warning per key, and the chain goes on. An
explicit ``cfg=`` still raises. With the toy op and with the real flash_attention op, on CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

import kernelops
from kernelops.modules.flash_attention import FLASH_ATTENTION, FlashAttentionConfig
from kernelops.ops import ConfigCache, ConfigSelectorChain, Executor, NotSupportedError, PretunedStore
from kernelops.ops.autotune import AutotunePolicy
from kernelops.ops.cache import make_entry
from kernelops.ops.device import device_info
from kernelops.ops.executor import set_default_executor
from kernelops.ops.keys import key_text
from kernelops.ops.params import FwdParams
from kernelops.ops.pretuned import write_pretuned_file
from kernelops.ops.selectors import Context
from tests.attention_checks import make_qkv, reference, rel_err
from tests.ops.toy_op import HEURISTIC, ToyConfig, ToyOp

TRITON_CONFIG = {"platform": "triton"}


class Chain:
    """An executor over its own disk cache and shipped-file folder (no tuning)."""

    def __init__(self, tmp_path, op):
        self.op = op
        self.cache = ConfigCache(tmp_path / "cache")
        self.root = tmp_path / "pretuned"
        self.store = PretunedStore(self.root)
        self.chain = ConfigSelectorChain(cache=self.cache, pretuned=self.store, policy="never", agreement=False)
        self.ex = Executor(self.chain)

    def context(self, **kwargs) -> Context:
        inputs = self.op.prepare(**kwargs)
        return Context(self.op, inputs, self.op.key(inputs), device_info(self.op.device_of(inputs)),
                       AutotunePolicy.NEVER)

    def store_entry(self, where: str, config: dict, **kwargs) -> None:
        ctx = self.context(**kwargs)
        entry = make_entry(config, ms=1.0, source="autotune")
        if where == "memory":
            self.cache.put_memory(ctx.memory_key, entry)
        elif where == "disk":
            self.cache.put_disk(ctx.disk_key, entry)
        else:
            write_pretuned_file(self.root, self.op.name, {key_text(ctx.key): entry}, ctx.device)
            self.store.reload()


def _skips(record) -> list[str]:
    return [str(w.message) for w in record if "it is skipped" in str(w.message)]


# --- the toy op ----------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["memory", "disk", "pretuned"])
def test_toy_entry_naming_a_platform_the_op_lacks_is_skipped(tmp_path, where):
    """ToyOp has only the torch platform: an entry naming triton is skipped, the call runs."""
    c = Chain(tmp_path, ToyOp())
    x = torch.arange(8, dtype=torch.float32)
    c.store_entry(where, TRITON_CONFIG, x=x, alpha=2.0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        expl = c.ex.explain(c.op, x=x, alpha=2.0)
        c.ex.explain(c.op, x=x, alpha=2.0)
        out = c.ex(c.op, x=x, alpha=2.0)
    torch.testing.assert_close(out, x * 2.0)
    assert expl.selector == "heuristic" and expl.config == HEURISTIC and c.op.runs[-1] == HEURISTIC
    reason = dict(expl.declined)[where]
    assert reason.startswith(f"{where} entry is unusable (platform='triton' cannot run this call: "
                             "toy_scale has no triton implementation)"), reason
    assert reason in str(expl)  # explain()'s text carries it
    skips = _skips(record)
    assert len(skips) == 1 and "toy_scale dtype=float32|n=8" in skips[0] and "no triton" in skips[0]


def test_toy_skipped_disk_entry_falls_through_to_the_shipped_one(tmp_path):
    c = Chain(tmp_path, ToyOp())
    x = torch.arange(8, dtype=torch.float32)
    c.store_entry("disk", TRITON_CONFIG, x=x, alpha=2.0)
    shipped = ToyConfig(FwdParams(16, 64, 2, 1), HEURISTIC.bwd_params)
    c.store_entry("pretuned", shipped.to_dict(), x=x, alpha=2.0)
    with pytest.warns(RuntimeWarning, match="disk entry is unusable"):
        expl = c.ex.explain(c.op, x=x, alpha=2.0)
    assert expl.selector == "pretuned" and expl.config == shipped
    assert c.ex(c.op, x=x, alpha=2.0) is not None and c.op.runs[-1] == shipped


@pytest.mark.parametrize("config, words", [
    ({"fwd_params": {"q_blocksize": 1 << 30, "kv_blocksize": 64, "num_warps": 4, "num_stages": 2}}, "q_blocksize"),
    ({"fwd_params": {"q_blocksize": 64, "kv_blocksize": 64, "num_warps": 4, "num_stages": 10 ** 9}}, "num_stages"),
    ({"fwd_params": {"q_blocksize": 8, "kv_blocksize": 64, "num_warps": 4, "num_stages": 2}}, "at least 16"),
    ({"platform": "x" * 5000}, "platform"),
    ({"fwd_params": [64, 64]}, "fwd_params"),
    ({"backend": "gpu"}, "backend='gpu'"),
])
def test_toy_entry_the_validation_refuses_is_skipped(tmp_path, config, words):
    c = Chain(tmp_path, ToyOp())
    x = torch.arange(8, dtype=torch.float32)
    c.store_entry("disk", config, x=x, alpha=2.0)
    with pytest.warns(RuntimeWarning, match="it is skipped"):
        expl = c.ex.explain(c.op, x=x, alpha=2.0)
    assert expl.selector == "heuristic" and words in dict(expl.declined)["disk"]
    torch.testing.assert_close(c.ex(c.op, x=x, alpha=2.0), x * 2.0)


def test_toy_explicit_cfg_naming_a_missing_platform_still_raises(tmp_path):
    c = Chain(tmp_path, ToyOp())
    x = torch.arange(8, dtype=torch.float32)
    with pytest.raises(NotSupportedError, match="no triton implementation"):
        c.ex(c.op, x=x, alpha=2.0, cfg=ToyConfig(platform="triton"))


def test_toy_warning_is_once_per_key(tmp_path):
    c = Chain(tmp_path, ToyOp())
    xs = [torch.arange(n, dtype=torch.float32) for n in (8, 7, 100)]  # buckets 8, 8, 128
    for x in xs:
        c.store_entry("disk", TRITON_CONFIG, x=x, alpha=2.0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            for x in xs:
                c.ex.explain(c.op, x=x, alpha=2.0)
    skips = _skips(record)
    assert len(skips) == 2 and "n=8" in skips[0] and "n=128" in skips[1]


# --- flash_attention on CPU ------------------------------------------------------------------------
def _qkv(dtype=torch.float32):
    return make_qkv(1, 40, 40, 2, 1, 16, dtype, "cpu", requires_grad=False)


def _check(out, q, k, v):
    ref, _, _ = reference(q, k, v, causal=True)
    assert rel_err(out, ref) < 1e-5


@pytest.fixture
def no_interpreter(monkeypatch):
    """CPU tensors with no Triton interpreter: the triton platform cannot run them. The kernel
    modules are imported first, as the process started (Triton reads the variable at import)."""
    FLASH_ATTENTION.source_hash()  # imports every kernel module of the op
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture
def default_executor_of():
    """Makes ``Chain``'s executor the default one (the public functions use it) for the test."""
    previous = []

    def install(chain: Chain):
        previous.append(set_default_executor(chain.ex))

    yield install
    if previous:
        set_default_executor(previous[0])


@pytest.mark.parametrize("where", ["disk", "pretuned"])
def test_flash_attention_triton_entry_on_a_cpu_call_is_skipped(tmp_path, no_interpreter, default_executor_of, where):
    """``{"config": {"platform": "triton"}}`` served to a CPU call: the public function runs (on
    the torch platform), explain() says why the entry was skipped, one warning."""
    c = Chain(tmp_path, FLASH_ATTENTION)
    q, k, v = _qkv()
    c.store_entry(where, TRITON_CONFIG, query=q, key=k, value=v, causal=True)
    default_executor_of(c)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            _check(kernelops.flash_attention(q, k, v, causal=True), q, k, v)
        expl = c.ex.explain(FLASH_ATTENTION, query=q, key=k, value=v, causal=True)
    assert expl.selector == "heuristic" and expl.platform == "torch"
    reason = dict(expl.declined)[where]
    assert reason.startswith(f"{where} entry is unusable (platform='triton' cannot run this call: cpu tensors "
                             "need a CUDA device, or TRITON_INTERPRET=1"), reason
    assert len(_skips(record)) == 1


def test_flash_attention_bfloat16_in_the_interpreter_skips_a_triton_entry(tmp_path, monkeypatch):
    """The interpreter runs triton on CPU, but not bfloat16 dots: a triton entry for a bf16 call is skipped."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    c = Chain(tmp_path, FLASH_ATTENTION)
    q, k, v = _qkv(torch.bfloat16)
    c.store_entry("disk", TRITON_CONFIG, query=q, key=k, value=v, causal=True)
    with pytest.warns(RuntimeWarning, match="bfloat16"):
        expl = c.ex.explain(FLASH_ATTENTION, query=q, key=k, value=v, causal=True)
    assert expl.selector == "heuristic" and "bfloat16" in dict(expl.declined)["disk"]
    out = c.ex(FLASH_ATTENTION, query=q, key=k, value=v, causal=True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape


def test_flash_attention_entry_naming_another_platform_than_the_call_is_skipped(tmp_path, monkeypatch):
    """A call that asks for platform='torch' is not overridden by an entry naming triton."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    c = Chain(tmp_path, FLASH_ATTENTION)
    q, k, v = _qkv()
    c.store_entry("disk", TRITON_CONFIG, query=q, key=k, value=v, causal=True)
    with pytest.warns(RuntimeWarning, match="asks for platform='torch'"):
        expl = c.ex.explain(FLASH_ATTENTION, query=q, key=k, value=v, causal=True, platform="torch")
    assert expl.selector == "heuristic" and expl.platform == "torch"
    _check(c.ex(FLASH_ATTENTION, query=q, key=k, value=v, causal=True, platform="torch"), q, k, v)


@pytest.mark.parametrize("config, words", [
    ({"fwd_params": {"q_blocksize": 1 << 30, "kv_blocksize": 64, "num_warps": 4, "num_stages": 2}}, "q_blocksize"),
    ({"bwd_params": {"q_blocksize": 64, "kv_blocksize": 64, "num_warps": 4, "num_stages": 10 ** 9}}, "num_stages"),
    ({"decode_params": {"kv_blocksize": 8, "num_warps": 4, "num_stages": 1}}, "at least 16"),
    ({"backend": "gpu"}, "backend='gpu'"),
    ({"platform": "cuda"}, "platform"),
])
@pytest.mark.parametrize("where", ["disk", "pretuned"])
def test_flash_attention_entry_the_op_refuses_is_skipped(tmp_path, where, config, words):
    c = Chain(tmp_path, FLASH_ATTENTION)
    q, k, v = _qkv()
    c.store_entry(where, config, query=q, key=k, value=v, causal=True)
    with pytest.warns(RuntimeWarning, match="it is skipped"):
        expl = c.ex.explain(FLASH_ATTENTION, query=q, key=k, value=v, causal=True, platform="torch")
    assert expl.selector == "heuristic" and words in dict(expl.declined)[where], expl
    _check(c.ex(FLASH_ATTENTION, query=q, key=k, value=v, causal=True, platform="torch"), q, k, v)


def test_flash_attention_explicit_triton_cfg_on_cpu_still_raises(tmp_path, no_interpreter):
    c = Chain(tmp_path, FLASH_ATTENTION)
    q, k, v = _qkv()
    with pytest.raises(NotSupportedError, match="TRITON_INTERPRET=1"):
        c.ex(FLASH_ATTENTION, query=q, key=k, value=v, causal=True, cfg=FlashAttentionConfig(platform="triton"))
