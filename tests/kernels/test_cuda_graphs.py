"""CUDA graphs: after one warm-up call the ops are captured in a torch.cuda.CUDAGraph and replayed
on new input values (checked against float64 references); a call that would need tuning during
capture uses the heuristic and says so once per key (unit-tested on CPU, and on a GPU)."""

import warnings

import pytest
import torch

from kernelops import attention, flash_attention, scaled_dot_product_attention
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops import ConfigCache, Executor, device_info, set_default_executor
from kernelops.ops.autotune import _CAPTURE_WARNED, AutotunePolicy
from kernelops.ops.pretuned import PretunedStore
from kernelops.ops.selectors import ConfigSelectorChain, Context
from tests.attention_checks import assert_attention_matches, assert_lse_matches, assert_matches, make_qkv, reference
from tests.kernels.test_compile import packed_reference
from tests.ops.toy_op import FAKE_CUDA, ToyOp

DTYPE = torch.float16


# --- the warning, on CPU ---------------------------------------------------------------------------
@pytest.fixture
def capturing(monkeypatch):
    """Pretend a CUDA graph is being captured; forget which keys have been warned about."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    saved = set(_CAPTURE_WARNED)
    _CAPTURE_WARNED.clear()
    yield
    _CAPTURE_WARNED.clear()
    _CAPTURE_WARNED.update(saved)


def _select(chain, op, n):
    inputs = op.prepare(x=torch.randn(n), alpha=2.0)
    return chain.select(Context(op, inputs, op.key(inputs), FAKE_CUDA, chain.policy))[0]


def _chain(tmp_path, policy="auto"):
    return ConfigSelectorChain(cache=ConfigCache(tmp_path / "cache", disk=False), pretuned=PretunedStore(tmp_path),
                               policy=policy)


def test_capture_uses_the_heuristic_and_warns_once_per_key(capturing, tmp_path):
    chain, op = _chain(tmp_path), ToyOp()
    with pytest.warns(RuntimeWarning, match="cannot be tuned while a CUDA graph is being captured") as record:
        first = _select(chain, op, 8)
    assert len(record) == 1 and "toy" in str(record[0].message)
    assert first.source == "heuristic" and first.config == op.heuristic_config(None, FAKE_CUDA)
    assert not first.memoize  # after capture, the key is still tuned on its next call
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):  # the same key again (still not cached): no second warning
            assert _select(chain, op, 8).source == "heuristic"
        with pytest.warns(RuntimeWarning, match="cannot be tuned"):  # a new key: warned about once
            _select(chain, op, 1000)
        _select(chain, op, 1000)


@pytest.mark.parametrize("policy,op", [("never", ToyOp()), ("auto", ToyOp(tunable=False))],
                         ids=["policy-never", "nothing-to-tune"])
def test_capture_says_nothing_when_nothing_would_be_tuned(capturing, tmp_path, policy, op):
    chain = _chain(tmp_path, policy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _select(chain, op, 8).source == "heuristic"


# --- capture and replay, on a GPU ----------------------------------------------------------------
@pytest.fixture
def executor():
    ex = Executor(ConfigSelectorChain(policy="never"))
    previous = set_default_executor(ex)
    yield ex
    set_default_executor(previous)


def _refill(*static):
    """Copy fresh random values into the captured graph's static inputs."""
    for t in static:
        with torch.no_grad():
            t.copy_(torch.randn(t.shape, device=t.device).to(t.dtype))


def _warm_up(fn):
    """One warm-up call on a side stream (the pattern torch.cuda.graphs documents)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)


def _check_out(out, q, k, v, **kw):
    assert_attention_matches(out, q, k, v, dtype=DTYPE, **kw)


OPS = {
    "flash_attention": (lambda q, k, v: flash_attention(q, k, v, causal=True), dict(causal=True)),
    "flash_attention_decode": (lambda q, k, v: flash_attention(q, k, v, causal=True), dict(causal=True)),
    # Sq == Sk: SDPA's top-left causal equals the reference's bottom-right one
    "sdpa": (lambda q, k, v: scaled_dot_product_attention(q, k, v, causal=True), dict(causal=True)),
    "attention": (lambda q, k, v: attention(q, k, v, causal=True)[0], dict(causal=True)),
}


def _shape(name):
    return (2, 3, 300, 8, 2, 64) if name == "flash_attention_decode" else (2, 300, 300, 8, 2, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(OPS))
def test_forward_capture_and_replay(name, executor):
    fn, ref_kw = OPS[name]
    q, k, v = make_qkv(*_shape(name), DTYPE, "cuda", requires_grad=False)
    _warm_up(lambda: fn(q, k, v))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(q, k, v)
    for _ in range(2):
        _refill(q, k, v)
        graph.replay()
        torch.cuda.synchronize()
        _check_out(out, q, k, v, **ref_kw)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["flash_attention", "sdpa", "attention"])
def test_forward_and_backward_capture_and_replay(name, executor):
    fn, ref_kw = OPS[name]
    q, k, v = make_qkv(2, 200, 200, 4, 2, 64, DTYPE, "cuda")
    dout = torch.randn(2, 200, 4, 64, device="cuda", dtype=DTYPE)

    def step():
        out = fn(q, k, v)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    _warm_up(step)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for _ in range(2):
        _refill(q, k, v, dout)
        graph.replay()
        torch.cuda.synchronize()
        assert_attention_matches(static[0], q, k, v, dtype=DTYPE, dout=dout, grads=static[1:], **ref_kw)


@pytest.mark.gpu
def test_packed_sequences_with_max_seqlen_capture_and_replay(executor):
    """With max_seqlen_q/k the packed path reads no offsets on the host: it can be captured,
    and replays with new offsets (same count and total) and values."""
    cu = torch.tensor([0, 70, 70, 200, 241], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(241, h, 64, device="cuda", dtype=DTYPE, requires_grad=True) for h in (8, 2, 2))
    dout = torch.randn(241, 8, 64, device="cuda", dtype=DTYPE)

    def step():
        out, lse = flash_attention(q, k, v, cum_seqlens_q=cu, cum_seqlens_k=cu, max_seqlen_q=160, max_seqlen_k=160,
                                   causal=True, return_lse=True)
        return (out, lse, *torch.autograd.grad(out, (q, k, v), dout))

    _warm_up(step)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for new_lens in ([70, 0, 130, 41], [160, 1, 40, 40]):
        cu.copy_(torch.tensor([0, *torch.tensor(new_lens).cumsum(0).tolist()], dtype=torch.int32))
        _refill(q, k, v, dout)
        graph.replay()
        torch.cuda.synchronize()
        refs = {which: packed_reference(q, k, v, dout, cu, dt)
                for which, dt in (("hi", torch.float64), ("lo", DTYPE))}
        for i, name in enumerate(("out", "dq", "dk", "dv")):
            got = static[0] if i == 0 else static[1 + i]
            assert_matches(name, got, refs["hi"][i], refs["lo"][i], DTYPE)
        for i in range(len(new_lens)):
            s = slice(int(cu[i]), int(cu[i + 1]))
            if s.start < s.stop:
                assert_lse_matches(static[1][None, :, s], reference(q[None, s], k[None, s], v[None, s],
                                                                    causal=True)[1], DTYPE)


@pytest.mark.gpu
def test_compiled_graph_capture_and_replay(executor):
    """A torch.compile'd function (configs resolved when it runs) captured after one warm-up."""
    compiled = torch.compile(lambda q, k, v: flash_attention(q, k, v, causal=True) +
                             scaled_dot_product_attention(q, k, v, causal=True), backend="aot_eager", fullgraph=True)
    q, k, v = make_qkv(1, 256, 256, 4, 4, 64, DTYPE, "cuda", requires_grad=False)
    _warm_up(lambda: compiled(q, k, v))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(q, k, v)
    _refill(q, k, v)
    graph.replay()
    torch.cuda.synchronize()
    assert_attention_matches(out / 2, q, k, v, dtype=DTYPE, causal=True)  # out = 2 x the attention


@pytest.mark.gpu
def test_untuned_key_during_capture_uses_the_heuristic_and_warns_once(tmp_path):
    """Policy auto, nothing cached or shipped: captured calls cannot tune, so the graph gets the
    heuristic and one warning; the kernels were compiled by a warm-up under policy never."""
    q, k, v = make_qkv(1, 200, 200, 4, 4, 64, DTYPE, "cuda", requires_grad=False)
    previous = set_default_executor(Executor(_chain(tmp_path, "never")))  # warm-up: the heuristic, compiled
    try:
        _warm_up(lambda: flash_attention(q, k, v, causal=True))
        tuned = Executor(_chain(tmp_path, AutotunePolicy.AUTO))
        selected = []  # (source, config) of every selection the captured calls make
        select = tuned.chain.select

        def spy(ctx):
            answer = select(ctx)
            selected.append((answer[0].source, answer[0].config))
            return answer

        tuned.chain.select = spy
        set_default_executor(tuned)
        _CAPTURE_WARNED.clear()
        with pytest.warns(RuntimeWarning, match="cannot be tuned while a CUDA graph is being captured") as record:
            graphs = []
            for _ in range(2):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = flash_attention(q, k, v, causal=True)
                graphs.append((graph, out))
        assert len([w for w in record if "cannot be tuned" in str(w.message)]) == 1
        heuristic = FLASH_ATTENTION.heuristic_config(FLASH_ATTENTION.prepare(query=q, key=k, value=v, causal=True),
                                                     device_info(q.device))
        assert selected == [("heuristic", heuristic)] * 2
        assert tuned._resolved == {}  # noqa: SLF001 - the heuristic is not remembered
        for graph, out in graphs:
            _refill(q, k, v)
            graph.replay()
            torch.cuda.synchronize()
            _check_out(out, q, k, v, causal=True)
    finally:
        set_default_executor(previous)
