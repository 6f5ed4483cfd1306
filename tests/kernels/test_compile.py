"""torch.compile(fullgraph=True) over flash_attention, scaled_dot_product_attention and attention:
no graph breaks, one graph for every sequence length (dynamic shapes), no config selection while
tracing, launch configs resolved when the compiled graph runs; outputs and gradients against
float64 references."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from kernelops import FlashAttentionConfig, attention, config_overlay, flash_attention, scaled_dot_product_attention
from kernelops.kernels.attention.registration import keep_mask
from kernelops.kernels.flash_attention import registration
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops import BwdParams, Executor, FwdParams, device_info, set_default_executor
from kernelops.ops.cache import make_entry
from kernelops.ops.selectors import ConfigSelectorChain, Context
from tests.attention_checks import assert_matches, attention_floor, make_qkv, reference, reference_fn
from tests.conftest import DEVICE
from tests.op_checks import check_gradients

DTYPE = torch.float32
# (Sq, Sk): three seq buckets, odd sizes. Sq != Sk throughout: on CUDA torch's own SDPA (the
# torch platform) guards on Sq != Sk, so Sq == Sk would compile a second graph (not per length)
LENGTHS = [(17, 23), (40, 33), (61, 50)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture
def executor():
    ex = Executor(ConfigSelectorChain(policy="never"))
    previous = set_default_executor(ex)
    yield ex
    set_default_executor(previous)


@pytest.fixture
def selections(monkeypatch):
    """Every selector-chain run: (was torch.compile tracing?, the key's sequence buckets)."""
    seen = []
    select = ConfigSelectorChain.select

    def spy(self, ctx):
        seen.append((torch.compiler.is_compiling(), dict(ctx.key).get("seq_q"), dict(ctx.key).get("seq_k")))
        return select(self, ctx)

    monkeypatch.setattr(ConfigSelectorChain, "select", spy)
    return seen


def graphs() -> int:
    """Graphs dynamo compiled since the fixture reset (analysis restarts not counted)."""
    return counters["stats"]["unique_graphs"]


def sdpa_ref(causal):
    """torch's own SDPA (top-left causal) in the inputs' dtype, BSHD in and out."""
    def ref(query, key, value):
        qh, kh, vh = (t.transpose(1, 2) for t in (query, key, value))
        return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=causal,
                                                                enable_gqa=True).transpose(1, 2)
    return ref


CASES = {
    "flash_attention": (lambda q, k, v, p: flash_attention(q, k, v, causal=True, platform=p),
                        reference_fn(causal=True)),
    "flash_attention_window_softcap": (
        lambda q, k, v, p: flash_attention(q, k, v, sliding_window=(9, 4), logits_soft_cap=5.0, platform=p),
        reference_fn(sliding_window=(9, 4), logits_soft_cap=5.0)),
    "sdpa": (lambda q, k, v, p: scaled_dot_product_attention(q, k, v, causal=True, platform=p), sdpa_ref(True)),
    "attention": (lambda q, k, v, p: attention(q, k, v, causal=True)[0], reference_fn(causal=True)),
}


def run_lengths(fn, ref_fn, lengths=LENGTHS, Hq=4, Hkv=2, D=16):
    """``fn(q, k, v)`` forward and backward at each length, against ``ref_fn(query, key, value)`` run
    in float64 and in DTYPE (:func:`tests.op_checks.check_gradients`)."""
    for Sq, Sk in lengths:
        q, k, v = make_qkv(2, Sq, Sk, Hq, Hkv, D, DTYPE, DEVICE)
        check_gradients(lambda query, key, value: fn(query, key, value), ref_fn, dict(query=q, key=k, value=v),
                        floor=attention_floor(DTYPE, q))


@pytest.mark.parametrize("case,platform", [(case, platform) for case in CASES for platform in ("torch", "triton")
                                           if (case, platform) != ("attention", "triton")])  # plain torch only
def test_fullgraph_dynamic_one_graph_for_every_length(case, platform, executor, selections):
    op, ref_fn = CASES[case]
    compiled = torch.compile(lambda q, k, v: op(q, k, v, platform), backend="aot_eager", fullgraph=True,
                             dynamic=True)
    run_lengths(compiled, ref_fn)
    assert graphs() == 1, f"{graphs()} graphs for {len(LENGTHS)} lengths"
    assert not [s for s in selections if s[0]], "a config was selected while torch.compile traced"
    if platform == "triton" and case != "attention":  # resolved at run time, per length bucket
        assert {s[1:] for s in selections} == {(32, 32), (64, 64)}


def test_mark_dynamic_sequence_dims_one_graph(executor):
    """mark_dynamic on the sequence dims only (the usual way): still one graph."""
    def fn(q, k, v):
        return flash_attention(q, k, v, causal=True, platform="triton") + \
            scaled_dot_product_attention(q, k, v, causal=True, platform="triton")

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    for Sq, Sk in LENGTHS:
        q, k, v = make_qkv(1, Sq, Sk, 2, 1, 16, DTYPE, DEVICE)
        for t in (q, k, v):
            torch._dynamo.mark_dynamic(t, 1)
        out = compiled(q, k, v)
        want, low = (reference(q, k, v, causal=True, dtype=dt)[0] + sdpa_ref(True)(q.to(dt), k.to(dt), v.to(dt))
                     for dt in (torch.float64, DTYPE))
        assert_matches("out", out, want, low, DTYPE)
    assert graphs() == 1


class _Spy:
    """Records the forward launches' tile sizes (the Triton launcher's keyword arguments)."""

    def __init__(self, launch):
        self.launch, self.tiles = launch, []

    def __call__(self, *args, **kwargs):
        self.tiles.append((kwargs["q_blocksize"], kwargs["kv_blocksize"]))
        return self.launch(*args, **kwargs)


def test_compiled_graph_resolves_the_config_when_it_runs(executor, monkeypatch):
    """One compiled graph follows the run-time config: an overlay active when the graph runs
    changes the launch, without a recompile; without it the executor's choice applies."""
    spy = _Spy(registration.flash_attention_fwd_dense)
    monkeypatch.setattr(registration, "flash_attention_fwd_dense", spy)
    compiled = torch.compile(lambda q, k, v: flash_attention(q, k, v, causal=True, platform="triton"),
                             backend="aot_eager", fullgraph=True, dynamic=True)
    q, k, v = make_qkv(1, 40, 40, 2, 2, 16, DTYPE, DEVICE, requires_grad=False)
    small = FlashAttentionConfig(FwdParams(16, 16, 4, 1), BwdParams(16, 16, 4, 1))
    inputs = FLASH_ATTENTION.prepare(query=q, key=k, value=v, causal=True, platform="triton")
    fwd = FLASH_ATTENTION.heuristic_config(inputs, device_info(q.device)).fwd_params
    heuristic = (fwd.q_blocksize, fwd.kv_blocksize)
    assert heuristic != (16, 16)
    want = reference(q, k, v, causal=True)[0]
    low = reference(q, k, v, causal=True, dtype=DTYPE)[0]
    for overlay, tiles in ((None, heuristic), (small, (16, 16)), (None, heuristic)):
        spy.tiles.clear()
        if overlay is None:
            out = compiled(q, k, v)
        else:
            with config_overlay({"flash_attention": overlay}):
                out = compiled(q, k, v)
        assert spy.tiles == [tiles]
        assert_matches("out", out, want, low, DTYPE)
    assert graphs() == 1
    # the caches answer too: a (tuned) memory-cache entry for this key is what the graph launches
    executor.forget()
    ctx = Context(FLASH_ATTENTION, inputs, FLASH_ATTENTION.key(inputs), device_info(q.device), executor.chain.policy)
    executor.chain.cache.put_memory(ctx.memory_key, make_entry(small.to_dict(), source="autotune"))
    spy.tiles.clear()
    compiled(q, k, v)
    assert spy.tiles == [(16, 16)]
    assert graphs() == 1


def test_explicit_cfg_is_a_graph_constant(executor):
    cfg = FlashAttentionConfig(FwdParams(16, 32, 4, 1), BwdParams(16, 16, 4, 1))
    compiled = torch.compile(lambda q, k, v: flash_attention(q, k, v, causal=True, platform="triton", cfg=cfg),
                             backend="aot_eager", fullgraph=True)
    run_lengths(compiled, reference_fn(causal=True), lengths=[(24, 24)])
    assert graphs() == 1


def _cum(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("bounds", [False, True], ids=["no-max-seqlen", "max-seqlen"])
def test_packed_sequences_one_graph(bounds, executor):
    """Packed batches of different lengths and counts: one graph; with max_seqlen the trace reads
    no offsets, without it the op reads them when it runs (not while tracing)."""
    def fn(q, k, v, cq, ck, mq, mk):
        kw = dict(max_seqlen_q=mq, max_seqlen_k=mk) if bounds else {}
        return flash_attention(q, k, v, cum_seqlens_q=cq, cum_seqlens_k=ck, causal=True, platform="triton", **kw)

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=True)
    for lens in ([5, 0, 19], [11, 3, 7, 2], [30, 1]):
        cu = _cum(lens)
        # 8 and 2 heads: no size equal to a cum_seqlens length (3..5), which duck sizing would tie together
        q, k, v = (torch.randn(sum(lens), h, 16, device=DEVICE, requires_grad=True) for h in (8, 2, 2))
        out = compiled(q, k, v, cu, cu, max(lens), max(lens))
        dout = torch.randn_like(out)
        out.backward(dout)
        refs = {which: packed_reference(q, k, v, dout, cu, dt)
                for which, dt in (("hi", torch.float64), ("lo", DTYPE))}
        for i, (name, got) in enumerate((("out", out), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad))):
            assert_matches(name, got, refs["hi"][i], refs["lo"][i], DTYPE)
    assert graphs() == 1


def packed_reference(q, k, v, dout, cu, dtype):
    """(out, dq, dk, dv) of packed causal attention, per sequence in ``dtype``, concatenated."""
    parts = [[], [], [], []]
    for i in range(cu.numel() - 1):
        s = slice(int(cu[i]), int(cu[i + 1]))
        if s.start == s.stop:
            continue
        out, _, (dq, dk, dv) = reference(q[None, s], k[None, s], v[None, s], causal=True, dout=dout[None, s],
                                         dtype=dtype)
        for part, t in zip(parts, (out, dq, dk, dv)):
            part.append(t[0])
    return [torch.cat(p) for p in parts]


def test_attention_seeded_dropout_compiles_to_the_eager_mask():
    """The seeded dropout mask comes from a custom op (a torch.Generator cannot be created in a
    graph): compiled and eager draw the same mask (the compiled output and gradients match float64
    with the eager mask, and the eager output); a new seed or length does not recompile."""
    compiled = torch.compile(lambda q, k, v, seed: attention(q, k, v, causal=True, dropout_prob=0.3,
                                                             dropout_seed=seed)[0],
                             backend="aot_eager", fullgraph=True, dynamic=True)
    for S, seed in ((9, 1), (14, 2), (21, 3)):
        q, k, v = make_qkv(1, S, S, 2, 1, 8, DTYPE, DEVICE)
        keep = keep_mask(q, k, seed, 0.3)
        assert 0 < keep.float().mean() < 1
        result = check_gradients(lambda query, key, value: compiled(query, key, value, seed),
                                 reference_fn(causal=True, dropout_prob=0.3, dropout_mask=keep),
                                 dict(query=q, key=k, value=v), floor=attention_floor(DTYPE, q))
        eager = attention(q, k, v, causal=True, dropout_prob=0.3, dropout_seed=seed)[0]
        torch.testing.assert_close(result.outputs[0], eager, rtol=1e-5, atol=1e-6)
    assert graphs() == 1


class Block(torch.nn.Module):
    """A model calling each op once."""

    def forward(self, q, k, v):
        a = flash_attention(q, k, v, causal=True)
        b = scaled_dot_product_attention(q, k, v, causal=True)
        c, _ = attention(q, k, v, causal=True)
        return a + 2 * b + 3 * c


def test_inductor_model_with_every_op(executor):
    """The default (inductor) backend on a model with all three ops, at tiny sizes."""
    model = torch.compile(Block(), fullgraph=True, dynamic=True)
    run_lengths(model, _block_ref, lengths=[(12, 12), (29, 29)], Hq=2, Hkv=1, D=8)
    assert graphs() == 1


def _block_ref(query, key, value):
    """Block's output, materialised with autograd in the inputs' dtype (with Sq == Sk, all three
    ops are the same causal attention)."""
    a = reference_fn(causal=True)(query, key, value)
    return a + 2 * sdpa_ref(True)(query, key, value) + 3 * a
