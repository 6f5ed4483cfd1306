"""kernelops.nn: MultiheadAttention against a plain-torch float64 reference, FlashAttentionLayer == function."""

from __future__ import annotations

import pytest
import torch

from kernelops import FlashAttentionConfig, FwdParams, MaskInfo, flash_attention
from kernelops.nn import FlashAttentionLayer, MultiheadAttention, RotaryEmbedding

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"   # the Triton tests run the interpreter on CPU (tests/conftest.py)


# --- the reference: projections + rotary + materialised softmax attention, in plain torch ----------------------
def weights_of(mha: MultiheadAttention, dtype=torch.float64) -> dict[str, torch.Tensor | None]:
    """The module's projections as separate ``W [out, in]`` / ``b [out]`` leaves in ``dtype``."""
    Dq, Dkv = mha.num_heads * mha.head_dim, mha.num_kv_heads * mha.head_dim
    if mha.fused_qkv:
        w, b = mha.qkv_proj.weight, mha.qkv_proj.bias
        cuts = {"q": slice(0, Dq), "k": slice(Dq, Dq + Dkv), "v": slice(Dq + Dkv, Dq + 2 * Dkv)}
        parts = {n: (w[s], None if b is None else b[s]) for n, s in cuts.items()}
    else:
        parts = {n: (getattr(mha, f"{n}_proj").weight, getattr(mha, f"{n}_proj").bias) for n in "qkv"}
    parts["o"] = (mha.out_proj.weight, mha.out_proj.bias)
    out = {}
    for n, (w, b) in parts.items():
        out["W" + n] = w.detach().to(dtype).requires_grad_()
        out["b" + n] = None if b is None else b.detach().to(dtype).requires_grad_()
    return out


def ref_rotary(x, positions, dim, base, interleaved):
    """RoPE written two independent ways: complex multiplication (interleaved pairs) and the
    rotate-half formula (half-split pairs). ``x [B, S, H, D]``, ``positions [S]``."""
    freqs = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = positions.double()[:, None] * freqs                                # [S, R/2]
    rot, rest = x[..., :dim], x[..., dim:]
    if interleaved:
        pairs = rot.reshape(*rot.shape[:-1], dim // 2, 2)
        z = torch.view_as_complex(pairs.double() if x.dtype == torch.float64 else pairs.float().contiguous())
        z = z * torch.polar(torch.ones_like(ang), ang)[:, None, :].to(z.dtype)
        rot = torch.view_as_real(z).flatten(-2).to(x.dtype)
    else:
        cos = torch.cat((ang.cos(), ang.cos()), -1)[:, None, :].to(x.dtype)
        sin = torch.cat((ang.sin(), ang.sin()), -1)[:, None, :].to(x.dtype)
        half = torch.cat((-rot[..., dim // 2:], rot[..., : dim // 2]), -1)
        rot = rot * cos + half * sin
    return torch.cat((rot, rest), -1)


def ref_mha(x, W, *, num_heads, num_kv_heads, head_dim, causal=False, window=None, pad=None, rotary=None,
            softcap=None):
    """``x [B, S, E]`` -> ``[B, S, E]``; ``window`` a ``(left, right)`` pair; ``pad [B, S]`` True = real key;
    ``rotary`` a ``(dim, base, interleaved)`` triple. Queries that see no key output 0 before out_proj."""
    B, S, _ = x.shape

    def lin(t, n):
        y = t @ W["W" + n].T
        return y if W["b" + n] is None else y + W["b" + n]

    q = lin(x, "q").view(B, S, num_heads, head_dim)
    k = lin(x, "k").view(B, S, num_kv_heads, head_dim)
    v = lin(x, "v").view(B, S, num_kv_heads, head_dim)
    if rotary is not None:
        pos = torch.arange(S)
        q, k = (ref_rotary(t, pos, *rotary) for t in (q, k))
    group = num_heads // num_kv_heads
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * head_dim ** -0.5
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    ok = torch.ones(S, S, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if window is not None:
        ok &= (j >= i - window[0]) & (j <= i + window[1])
    ok = ok.expand(B, 1, S, S)
    if pad is not None:
        ok = ok & pad[:, None, None, :].bool()
    p = torch.softmax(s.masked_fill(~ok, float("-inf")), dim=-1)
    p = torch.where(ok.any(-1, keepdim=True), p, torch.zeros((), dtype=p.dtype))   # rows with no key -> 0
    out = torch.einsum("bhqk,bkhd->bqhd", p, v).reshape(B, S, num_heads * head_dim)
    return lin(out, "o")


def rel_err(got, ref):
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def module_grads(mha):
    """The module's parameter gradients laid out like ``weights_of``'s leaves (fused weights split)."""
    grads = {}
    Dq, Dkv = mha.num_heads * mha.head_dim, mha.num_kv_heads * mha.head_dim
    if mha.fused_qkv:
        g, gb = mha.qkv_proj.weight.grad, None if mha.qkv_proj.bias is None else mha.qkv_proj.bias.grad
        for n, s in (("q", slice(0, Dq)), ("k", slice(Dq, Dq + Dkv)), ("v", slice(Dq + Dkv, None))):
            grads["W" + n], grads["b" + n] = g[s], None if gb is None else gb[s]
    else:
        for n in "qkv":
            lin = getattr(mha, f"{n}_proj")
            grads["W" + n], grads["b" + n] = lin.weight.grad, None if lin.bias is None else lin.bias.grad
    grads["Wo"], grads["bo"] = mha.out_proj.weight.grad, None if mha.out_proj.bias is None else mha.out_proj.bias.grad
    return grads


CASES = {
    # name: (MultiheadAttention kwargs, reference kwargs, with a padding mask); rotary dim None = head_dim
    "plain": (dict(), dict(), False),
    "gqa-causal": (dict(num_kv_heads=2, causal=True), dict(causal=True), False),
    "mqa-rotary-half": (dict(num_kv_heads=1, rotary=True), dict(rotary=(None, 10000.0, False)), False),
    "rotary-interleaved-partial": (dict(rotary=True, rotary_interleaved=True, rotary_dim=4, rotary_base=500.0),
                                   dict(rotary=(4, 500.0, True)), False),
    "window-causal": (dict(num_kv_heads=2, causal=True, sliding_window=(5, 0)), dict(causal=True, window=(5, 0)),
                      False),
    "window-both-sides": (dict(sliding_window=3), dict(window=(3, 3)), False),
    "pad-gqa-rotary": (dict(num_kv_heads=2, rotary=True, causal=True),
                       dict(causal=True, rotary=(None, 10000.0, False)), True),
    "separate-nobias-softcap-pad": (dict(fused_qkv=False, qkv_bias=False, out_bias=False, logits_soft_cap=2.0),
                                    dict(softcap=2.0), True),
    "head-dim-not-E-over-H": (dict(num_kv_heads=2, head_dim=12, rotary=True, causal=True),
                              dict(causal=True, rotary=(12, 10000.0, False)), False),
}


def padding_mask(B, S, generator=None):
    """``[B, S]`` bool: row b keeps a random prefix (row 0 keeps everything, another row keeps 1 token)."""
    lengths = torch.randint(1, S + 1, (B,), generator=generator)
    lengths[0], lengths[-1] = S, 1
    return torch.arange(S)[None, :] < lengths[:, None]


def run_case(name, dtype=torch.float32, device="cpu", platform="auto", B=3, S=21, E=32, H=4):
    mod_kwargs, ref_kwargs, with_pad = CASES[name]
    mha = MultiheadAttention(E, H, platform=platform, **mod_kwargs).to(device=device, dtype=dtype)
    with torch.no_grad():  # biases are zero after reset_parameters: make them count
        for p in mha.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.5)
    x = torch.randn(B, S, E, device=device).to(dtype).requires_grad_()
    pad = padding_mask(B, S).to(device) if with_pad else None
    y = mha(x, attention_mask=pad)
    dy = torch.randn_like(y)
    y.backward(dy)

    dims = dict(num_heads=mha.num_heads, num_kv_heads=mha.num_kv_heads, head_dim=mha.head_dim)
    if ref_kwargs.get("rotary") is not None and ref_kwargs["rotary"][0] is None:
        ref_kwargs = dict(ref_kwargs, rotary=(mha.head_dim,) + ref_kwargs["rotary"][1:])

    def reference(ref_dtype):
        W = {n: None if t is None else t.detach().cpu().to(ref_dtype).requires_grad_() for n, t in
             weights_of(mha).items()}
        xr = x.detach().cpu().to(ref_dtype).requires_grad_()
        yr = ref_mha(xr, W, pad=None if pad is None else pad.cpu(), **dims, **ref_kwargs)
        yr.backward(dy.cpu().to(ref_dtype))
        return yr, xr.grad, {n: None if t is None else t.grad for n, t in W.items()}

    return mha, (y, x.grad, module_grads(mha)), reference


def errors(got, ref):
    """Relative errors of the output, dx and every parameter gradient."""
    (y, dx, grads), (yr, dxr, gr) = got, ref
    errs = {"out": rel_err(y.cpu(), yr), "dx": rel_err(dx.cpu(), dxr)}
    for n, g in grads.items():
        assert (g is None) == (gr[n] is None), n
        if n == "bk" and g is not None:
            # softmax ignores a shift shared by every key, so d(bk) is exactly 0 in exact arithmetic:
            # measure its error against the scale of d(bq) instead
            errs["dbk"] = (g.cpu().double() - gr[n].double()).norm().item() / gr["bq"].double().norm().item()
        elif g is not None:
            errs["d" + n] = rel_err(g.cpu(), gr[n])
    return errs


@pytest.mark.parametrize("name", list(CASES))
def test_matches_float64_reference(name):
    _, got, reference = run_case(name)
    errs = errors(got, reference(torch.float64))
    assert max(errs.values()) < 2e-5, errs


@pytest.mark.parametrize("name", ["gqa-causal", "pad-gqa-rotary"])
def test_triton_kernels_match_reference(name):
    """The same layer through the Triton kernels (the interpreter on CPU), float32, small."""
    _, got, reference = run_case(name, platform="triton", device=DEVICE, B=2, S=19, E=32, H=4)
    errs = errors(got, reference(torch.float64))
    assert max(errs.values()) < (1e-4 if HAS_CUDA else 2e-5), errs   # tf32x3 products on a GPU


def _flash_rule(name, dtype, device, **shape):
    """The flash-attn rule: error vs float64 within a small multiple of the reference run in ``dtype``."""
    _, got, reference = run_case(name, dtype=dtype, device=device, **shape)
    ref64 = reference(torch.float64)
    ours = errors(got, ref64)
    base = errors(reference(dtype), ref64)
    floor = {torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    bad = {n: (e, base[n]) for n, e in ours.items() if e > 3 * base[n] + floor}
    assert not bad, bad


@pytest.mark.parametrize("name", ["gqa-causal", "pad-gqa-rotary"])
def test_bfloat16_on_cpu(name):
    _flash_rule(name, torch.bfloat16, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_matches_reference(name, dtype):
    _flash_rule(name, dtype, "cuda", B=2, S=203, E=128, H=8)


@pytest.mark.gpu
def test_gpu_float32_matches_reference():
    _, got, reference = run_case("pad-gqa-rotary", device="cuda", B=2, S=203, E=128, H=8)
    errs = errors(got, reference(torch.float64))
    assert max(errs.values()) < 1e-4, errs   # float32 runs as tf32x3 products on the GPU


# --- packed sequences and rotary ----------------------------------------------------------------------------------
def test_packed_input_equals_each_sequence_alone():
    torch.manual_seed(0)
    mha = MultiheadAttention(32, 4, num_kv_heads=2, causal=True, rotary=True, sliding_window=(6, 0))
    lengths = [7, 1, 13, 0, 5]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    x = torch.randn(sum(lengths), 32, requires_grad=True)
    y = mha(x, cum_seqlens=cu)
    dy = torch.randn_like(y)
    y.backward(dy)
    xs = x.detach().split(lengths)
    ys, dxs = [], []
    for xi, dyi in zip(xs, dy.split(lengths)):
        xi = xi[None].clone().requires_grad_()
        yi = mha(xi) if xi.shape[1] else xi @ torch.zeros(32, 32)  # an empty sequence has no output
        if xi.shape[1]:
            yi.backward(dyi[None])
        ys.append(yi[0].detach())
        dxs.append(xi.grad[0] if xi.grad is not None else torch.zeros_like(xi[0]))
    torch.testing.assert_close(y.detach(), torch.cat(ys), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, torch.cat(dxs), rtol=1e-5, atol=1e-5)


def test_rotary_explicit_positions_and_cache_growth():
    rope = RotaryEmbedding(16, interleaved=False)
    q, k = torch.randn(2, 40, 4, 16, dtype=torch.float64), torch.randn(2, 40, 2, 16, dtype=torch.float64)
    short = rope(q[:, :5], k[:, :5])                    # builds a short table first
    full = rope(q, k)                                   # the table grows
    offset = rope(q[:, 10:], k[:, 10:], position_ids=torch.arange(10, 40))
    per_batch = rope(q, k, position_ids=torch.arange(40).expand(2, 40))
    torch.testing.assert_close(short[0], full[0][:, :5])
    torch.testing.assert_close(offset[0], full[0][:, 10:])
    torch.testing.assert_close(offset[1], full[1][:, 10:])
    torch.testing.assert_close(per_batch[0], full[0])
    torch.testing.assert_close(full[0], ref_rotary(q, torch.arange(40), 16, 10000.0, False))
    # relative: <rope(q)_i, rope(k)_j> depends on i - j only
    qi, kj = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)
    dots = [(rope(qi, kj, position_ids=torch.tensor([p + 3]))[0] * rope(qi, kj, position_ids=torch.tensor([p]))[1])
            .sum() for p in (0, 17)]
    torch.testing.assert_close(dots[0], dots[1])
    assert len(rope.state_dict()) == 0


# --- FlashAttentionLayer ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    dict(), dict(causal=True), dict(causal=True, sliding_window=(4, 0), logits_soft_cap=3.0),
    dict(softmax_scale=0.3, sliding_window=2),
])
def test_flash_attention_module_equals_function(kwargs):
    q = torch.randn(2, 17, 4, 16, requires_grad=True)
    k, v = torch.randn(2, 17, 2, 16, requires_grad=True), torch.randn(2, 17, 2, 16, requires_grad=True)
    mod = FlashAttentionLayer(**kwargs)
    assert list(mod.parameters()) == []
    out = mod(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    want = flash_attention(q, k, v, **kwargs)
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    assert torch.equal(out, want)
    for g, w in zip(grads, want_grads):
        assert torch.equal(g, w)
    seg = MaskInfo.from_segments(torch.tensor([[0] * 9 + [1] * 8, [0] * 17]))
    assert torch.equal(mod(q, k, v, mask_info=seg), flash_attention(q, k, v, mask_info=seg, **kwargs))


def test_flash_attention_module_fixed_cfg_and_repr():
    cfg = FlashAttentionConfig(fwd_params=FwdParams(16, 16, 4, 1), platform="triton")
    mod = FlashAttentionLayer(causal=True, cfg=cfg)
    q, k, v = (torch.randn(1, 20, 2, 16, device=DEVICE) for _ in range(3))
    assert torch.equal(mod(q, k, v), flash_attention(q, k, v, causal=True, cfg=cfg))
    torch.testing.assert_close(mod(q, k, v), flash_attention(q, k, v, causal=True, platform="torch"),
                               rtol=1e-4, atol=1e-4)
    assert "causal=True" in repr(mod) and "cfg=" in repr(mod)
    with pytest.raises(TypeError, match="causal"):
        mod(q, k, v, causal=False)


def test_dropout_only_in_training_mode():
    q = torch.randn(2, 33, 4, 16)
    k, v = torch.randn(2, 33, 2, 16), torch.randn(2, 33, 2, 16)
    mod = FlashAttentionLayer(causal=True, dropout=0.3)
    plain = flash_attention(q, k, v, causal=True)
    mod.eval()
    assert torch.equal(mod(q, k, v), plain)
    mod.train()
    torch.manual_seed(5)
    a = mod(q, k, v)
    b = mod(q, k, v)
    torch.manual_seed(5)
    again = mod(q, k, v)
    torch.manual_seed(5)
    fn = flash_attention(q, k, v, causal=True, dropout_prob=0.3)   # the seed comes from the same RNG draw
    assert not torch.allclose(a, plain) and not torch.allclose(a, b)   # fresh seed per call
    assert torch.equal(a, again) and torch.equal(a, fn)
    # the layer passes its training flag down
    mha = MultiheadAttention(32, 4, causal=True, dropout=0.5)
    x = torch.randn(2, 9, 32)
    mha.eval()
    assert torch.equal(mha(x), mha(x))
    mha.train()
    assert not torch.allclose(mha(x), mha(x))


# --- parameters, state_dict, layouts ---------------------------------------------------------------------------
def test_state_dict_round_trip_and_layouts():
    torch.manual_seed(1)
    a = MultiheadAttention(48, 6, num_kv_heads=3, rotary=True, causal=True)
    torch.manual_seed(2)
    b = MultiheadAttention(48, 6, num_kv_heads=3, rotary=True, causal=True)
    x = torch.randn(2, 11, 48)
    assert not torch.allclose(a(x), b(x))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(x), b(x))
    assert set(a.state_dict()) == {"qkv_proj.weight", "qkv_proj.bias", "out_proj.weight", "out_proj.bias"}
    assert a.qkv_proj.weight.shape == (6 * 8 + 2 * 3 * 8, 48)
    # the separate layout holds the same function: copy the fused rows into it
    sep = MultiheadAttention(48, 6, num_kv_heads=3, rotary=True, causal=True, fused_qkv=False)
    W = weights_of(a, torch.float32)
    with torch.no_grad():
        for n in "qkv":
            getattr(sep, f"{n}_proj").weight.copy_(W["W" + n])
            getattr(sep, f"{n}_proj").bias.copy_(W["b" + n])
    sep.out_proj.load_state_dict(a.out_proj.state_dict())
    torch.testing.assert_close(sep(x), a(x), rtol=1e-5, atol=1e-6)


def test_reset_parameters():
    mha = MultiheadAttention(64, 8, num_kv_heads=2)
    with torch.no_grad():
        for p in mha.parameters():
            p.fill_(3.0)
    mha.reset_parameters()
    assert torch.count_nonzero(mha.qkv_proj.bias) == 0 and torch.count_nonzero(mha.out_proj.bias) == 0
    w = mha.qkv_proj.weight
    for block, fan_out in ((w[:64], 64), (w[64:80], 16), (w[80:], 16)):   # Xavier bound per q/k/v block
        bound = (6 / (64 + fan_out)) ** 0.5
        assert block.abs().max() <= bound and block.abs().max() > 0.5 * bound


def test_trains_a_step_in_low_precision_dtypes():
    """A training step in bf16 / fp16 gives every parameter the gradient a float64 copy of the
    module gives, to the dtype's rounding."""
    for dtype, tol in ((torch.bfloat16, 3e-2), (torch.float16, 5e-3)):
        mha = MultiheadAttention(32, 4, num_kv_heads=2, causal=True, rotary=True, dtype=dtype)
        ref = MultiheadAttention(32, 4, num_kv_heads=2, causal=True, rotary=True, dtype=torch.float64)
        ref.load_state_dict({name: t.double() for name, t in mha.state_dict().items()})
        x = torch.randn(2, 10, 32, dtype=dtype)
        out = mha(x)
        assert out.dtype == dtype
        out.float().square().mean().backward()
        ref(x.double()).square().mean().backward()
        for (name, p), p64 in zip(mha.named_parameters(), ref.parameters()):
            assert p.grad is not None and p.grad.dtype == dtype, name
            err = (p.grad.double() - p64.grad).abs().max() / p64.grad.abs().max()
            assert err < tol, f"{name}: {dtype} gradient off the float64 one by {err:.2e} (relative to its max)"


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(embed_dim=30, num_heads=4), ValueError, "divisible"),
    (dict(embed_dim=32, num_heads=4, num_kv_heads=3), ValueError, "num_kv_heads"),
    (dict(embed_dim=32, num_heads=0), ValueError, "num_heads"),
    (dict(embed_dim=32, num_heads=4, rotary=True, rotary_dim=3), ValueError, "rotary_dim"),
    (dict(embed_dim=32, num_heads=4, rotary_dim=4), ValueError, "rotary=False"),
    (dict(embed_dim=32, num_heads=4, dropout=1.0), ValueError, "dropout"),
    (dict(embed_dim=32, num_heads=4, sliding_window=-1), ValueError, "sliding_window"),
    (dict(embed_dim=32, num_heads=4, sliding_window="wide"), TypeError, "sliding_window"),
    (dict(embed_dim=32, num_heads=4, logits_soft_cap=0.0), ValueError, "logits_soft_cap"),
    (dict(embed_dim=32, num_heads=1, head_dim=512), ValueError, "head_dim"),
    (dict(embed_dim=32, num_heads=4, platform="cuda"), ValueError, "platform"),
])
def test_constructor_errors(kwargs, error, text):
    with pytest.raises(error, match=text):
        MultiheadAttention(**kwargs)


def test_forward_errors():
    mha = MultiheadAttention(32, 4)
    with pytest.raises(ValueError, match=r"x.shape=\(2, 5, 16\)"):
        mha(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match=r"\[B, S, E\]"):
        mha(torch.randn(5, 32))
    with pytest.raises(TypeError, match="float64"):
        mha(torch.randn(2, 5, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="attention_mask"):
        mha(torch.randn(2, 5, 32), attention_mask=torch.ones(2, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="not both"):
        mha(torch.randn(2, 5, 32), attention_mask=torch.ones(2, 5, dtype=torch.bool),
            mask_info=MaskInfo.from_attention_mask(torch.ones(2, 5, dtype=torch.bool)))
    with pytest.raises(TypeError, match="cfg"):
        FlashAttentionLayer(cfg={"platform": "torch"})


def test_the_former_module_name_still_imports_and_warns():
    import kernelops
    import kernelops.nn

    for get in (lambda: kernelops.nn.FlashAttention, lambda: __import__("kernelops.nn.attention").nn.attention
                .FlashAttention):
        with pytest.warns(DeprecationWarning, match="FlashAttentionLayer"):
            assert get() is FlashAttentionLayer
    with pytest.warns(DeprecationWarning, match="FlashAttentionLayer"):
        from kernelops.nn import FlashAttention
    assert FlashAttention is FlashAttentionLayer
    assert kernelops.FlashAttention is not FlashAttentionLayer  # the op's Operation class keeps its name
    assert "FlashAttention" not in kernelops.nn.__all__
