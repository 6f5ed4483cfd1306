"""kernelops.compat.flash_attention: the CUDA flash-attention package's API (BHSD ``[B, H, N, D]``)
against a plain-torch float64 reference, with the flash-attn error rule: the error against float64
is at most a small multiple of the same reference's error when run in the input dtype."""

import doctest
import warnings

import pytest
import torch

import kernelops
from kernelops.compat import flash_attention as compat
from kernelops.compat.flash_attention import (FlashAttention, estimate_memory_usage, flash_attention_backward,
                                              flash_attention_forward, get_optimal_block_sizes)
from tests.conftest import DEVICE

FLOOR = {torch.float32: 1e-5, torch.float16: 2e-4, torch.bfloat16: 2e-3}
FACTOR = 3.0


def make(B, H, N, D, dtype, Nk=None, device=DEVICE):
    """Fresh random Q ``[B, H, N, D]``, K / V ``[B, H, Nk, D]`` and dO ``[B, H, N, D]``."""
    def r(n):
        return torch.randn(B, H, n, D, device=device).to(dtype)
    Nk = N if Nk is None else Nk
    return r(N), r(Nk), r(Nk), r(N)


def reference(Q, K, V, dO, dtype=torch.float64):
    """Materialised attention in ``dtype``: ``O``, row sums ``l``, row maxima ``m`` of the scaled
    scores, and ``(dQ, dK, dV)`` for the output gradient ``dO``."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (Q, K, V))
    s = q @ k.transpose(-1, -2) * Q.shape[-1] ** -0.5
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    O = (p / l) @ v
    grads = torch.autograd.grad(O, (q, k, v), dO.to(dtype))
    return O.detach(), l[..., 0].detach(), m[..., 0].detach(), grads


def rel_err(got, ref):
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm()).item()


def check(name, got, ref64, ref_low, dtype):
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    err, ref_err = rel_err(got, ref64), rel_err(ref_low, ref64)
    bound = FACTOR * ref_err + FLOOR[dtype]
    assert err <= bound, f"{name}: rel err {err:.3e} > {bound:.3e} (reference in {dtype}: {ref_err:.3e})"


def check_all(got, Q, K, V, dO, dtype):
    """``got = (O, dQ, dK, dV)`` against the float64 reference, judged by the ``dtype`` one."""
    O64, _, _, g64 = reference(Q, K, V, dO)
    Olo, _, _, glo = reference(Q, K, V, dO, dtype)
    for name, g, r, lo in zip(("O", "dQ", "dK", "dV"), got, (O64, *g64), (Olo, *glo)):
        if g is not None:
            assert g.dtype == dtype, f"{name}: dtype {g.dtype}, expected {dtype}"
            check(name, g, r, lo, dtype)


def lse_of(l, m):
    return m.double() + torch.log(l.double())


# --- the torch platform (CPU) and the default platform on a GPU --------------------------------------
@pytest.mark.parametrize("dtype,D,Nk", [(torch.float32, 40, None), (torch.float16, 64, None),
                                        (torch.float32, 64, 97)])
def test_forward_and_backward_with_forward_stats(dtype, D, Nk):
    Q, K, V, dO = make(2, 3, 113, D, dtype, Nk)
    O, l, m = flash_attention_forward(Q, K, V, return_stats=True)
    assert O.shape == Q.shape and l.shape == m.shape == Q.shape[:3]
    dQ, dK, dV = flash_attention_backward(Q, K, V, O, dO, l, m)
    assert dK.shape == K.shape and dV.shape == V.shape
    check_all((O, dQ, dK, dV), Q, K, V, dO, dtype)
    assert torch.equal(flash_attention_forward(Q, K, V), O)


def test_stats_are_the_log_sum_exp_by_default_and_true_maxima_on_request():
    Q, K, V, dO = make(2, 3, 113, 40, torch.float32)
    _, l64, m64, _ = reference(Q, K, V, dO)
    _, l, m = flash_attention_forward(Q, K, V, return_stats=True)
    assert l.dtype == m.dtype == torch.float32
    assert torch.equal(l, torch.ones_like(l))
    torch.testing.assert_close(lse_of(l, m), lse_of(l64, m64), atol=1e-5, rtol=0)
    _, l, m = flash_attention_forward(Q, K, V, return_stats=True, exact_stats=True)
    torch.testing.assert_close(m.double(), m64, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(l.double(), l64, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_backward_with_stats_from_a_torch_reference(dtype):
    """Genuine (row sum, row max) pairs, as the CUDA package kept them, computed in plain torch."""
    Q, K, V, dO = make(2, 3, 113, 64, dtype)
    O, l, m, _ = reference(Q, K, V, dO, torch.float32)
    grads = flash_attention_backward(Q, K, V, O.to(dtype), dO, l, m)
    check_all((None, *grads), Q, K, V, dO, dtype)
    assert not torch.equal(l, torch.ones_like(l))  # a pair unlike the forward's default one


def test_module_forward_is_differentiable_and_its_backward_agrees():
    Q, K, V, dO = make(2, 3, 113, 40, torch.float32)
    attn = FlashAttention(bc=64, br=32)
    leaves = [t.clone().requires_grad_() for t in (Q, K, V)]
    O = attn(*leaves)
    O.backward(dO)
    check_all((O.detach(), *(t.grad for t in leaves)), Q, K, V, dO, torch.float32)
    _, l, m = flash_attention_forward(Q, K, V, Bc=64, return_stats=True)
    explicit = attn.backward(Q, K, V, O.detach(), dO, l, m)
    for name, g, t in zip(("dQ", "dK", "dV"), explicit, leaves):
        torch.testing.assert_close(g, t.grad, atol=1e-5, rtol=1e-5, msg=name)
    assert "bc=64, br=32" in repr(attn)


def test_use_half_computes_in_float16():
    Q, K, V, dO = make(2, 3, 113, 40, torch.float32)
    O, l, m = flash_attention_forward(Q, K, V, use_half=True, return_stats=True)
    grads = flash_attention_backward(Q, K, V, O, dO, l, m, use_half=True)
    half = [t.half() for t in (Q, K, V, dO)]  # what the float16 computation sees
    check_all((O, *grads), *half, torch.float16)
    attn = FlashAttention(use_half=True)
    leaves = [t.clone().requires_grad_() for t in (Q, K, V)]
    out = attn(*leaves)
    assert out.dtype == torch.float16
    out.backward(dO.half())
    assert all(t.grad.dtype == torch.float32 for t in leaves)
    check_all((out.detach(), None, None, None), *half, torch.float16)
    check("dQ (module, float32 leaf)", leaves[0].grad, reference(*half)[3][0], reference(*half, torch.float16)[3][0],
          torch.float16)


# --- the Triton kernels (under the interpreter on a CPU) ----------------------------------------------
@pytest.mark.parametrize("dtype,Bc,Br", [(torch.float32, 16, 32), (torch.float16, 32, 16)])
def test_triton_kernels_forward_backward(dtype, Bc, Br):
    Q, K, V, dO = make(1, 2, 37, 32, dtype)
    O, l, m = flash_attention_forward(Q, K, V, Bc=Bc, Br=Br, return_stats=True, platform="triton")
    grads = flash_attention_backward(Q, K, V, O, dO, l, m, Bc=Bc, Br=Br, platform="triton")
    check_all((O, *grads), Q, K, V, dO, dtype)


def test_triton_module_forward_autograd():
    Q, K, V, dO = make(1, 2, 37, 32, torch.float32)
    leaves = [t.clone().requires_grad_() for t in (Q, K, V)]
    O = FlashAttention(bc=16, br=16, platform="triton")(*leaves)
    O.backward(dO)
    check_all((O.detach(), *(t.grad for t in leaves)), Q, K, V, dO, torch.float32)


def test_block_sizes_reach_the_launch(monkeypatch):
    """Bc / Br are the launch's key / query tiles, forward and backward, function and module."""
    seen = []

    def spy(fn):
        def wrapper(*args, **kwargs):
            seen.append(kwargs.get("cfg") or kwargs)
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(compat, "_forward", spy(compat._forward))
    monkeypatch.setattr(compat, "_backward", spy(compat._backward))
    monkeypatch.setattr(compat, "flash_attention", spy(compat.flash_attention))
    Q, K, V, dO = make(1, 1, 20, 16, torch.float32)
    O, l, m = flash_attention_forward(Q, K, V, Bc=64, Br=16, return_stats=True)
    flash_attention_backward(Q, K, V, O, dO, l, m, Bc=16, Br=128)
    FlashAttention(bc=32, br=64)(Q, K, V)
    fwd, bwd, cfg = seen
    assert (fwd["block_kv"], fwd["block_q"]) == (64, 16) and (bwd["block_kv"], bwd["block_q"]) == (16, 128)
    assert (cfg.fwd_params.kv_blocksize, cfg.fwd_params.q_blocksize) == (32, 64)
    assert (cfg.bwd_params.kv_blocksize, cfg.bwd_params.q_blocksize) == (32, 64)
    assert cfg.fwd_params.ws is False and cfg.bwd_params.fused is False  # kernels with tiles of their own stay off


@pytest.mark.parametrize("Bc,Br,expect", [(48, 32, "Bc=48.*Bc=32"), (32, 8, "Br=8.*Br=16"),
                                          (512, 32, "Bc=512.*Bc=128")])
def test_block_sizes_are_rounded_with_a_warning(Bc, Br, expect):
    Q, K, V, dO = make(1, 2, 29, 16, torch.float32)
    with pytest.warns(UserWarning, match=expect):
        O = flash_attention_forward(Q, K, V, Bc=Bc, Br=Br)
    check_all((O, None, None, None), Q, K, V, dO, torch.float32)
    with pytest.warns(UserWarning, match=expect.replace("B", "b")):
        FlashAttention(bc=Bc, br=Br)


def test_supported_block_sizes_do_not_warn():
    Q, K, V, _ = make(1, 1, 20, 16, torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for b in (16, 32, 64, 128):
            flash_attention_forward(Q, K, V, Bc=b, Br=b)
        FlashAttention(bc=128, br=16)


# --- sizing helpers -----------------------------------------------------------------------------------
def test_get_optimal_block_sizes_is_the_heuristic():
    for N, D in ((128, 64), (4096, 128), (1000, 40)):
        sizes = get_optimal_block_sizes(N, D)
        assert isinstance(sizes, tuple) and len(sizes) == 2 and all(type(s) is int for s in sizes)
        p = kernelops.get_optimal_block_sizes(N, D, dtype=torch.float32).fwd_params
        assert sizes == (p.kv_blocksize, p.q_blocksize)
        half = kernelops.get_optimal_block_sizes(N, D, dtype=torch.float16).fwd_params
        assert get_optimal_block_sizes(N, D, use_half=True) == (half.kv_blocksize, half.q_blocksize)


def test_get_optimal_block_sizes_follows_the_gpu_heuristic(monkeypatch):
    """On a GPU the tiles vary with the shape: the compat answer is the op's heuristic_config for
    an H200 (its device facts stand in for the GPU this machine lacks)."""
    from kernelops.modules import flash_attention_lowlevel
    from kernelops.modules.flash_attention import FLASH_ATTENTION
    from kernelops.ops.device import DeviceInfo

    h200 = DeviceInfo("cuda", 0, "NVIDIA_H200", (9, 0), 232448, 132)
    monkeypatch.setattr(flash_attention_lowlevel, "device_info", lambda device: h200)
    seen = set()
    for N, D, half in ((128, 64, False), (4096, 128, True), (1000, 40, True), (16384, 256, False), (64, 16, True)):
        dtype = torch.float16 if half else torch.float32
        q = torch.empty((1, N, 1, D), dtype=dtype, device="meta")
        want = FLASH_ATTENTION.heuristic_config(FLASH_ATTENTION.prepare(query=q, key=q, value=q), h200).fwd_params
        got = get_optimal_block_sizes(N, D, use_half=half, device="cuda")
        assert got == (want.kv_blocksize, want.q_blocksize), (N, D, half)
        seen.add(got)
    assert len(seen) > 1  # shapes that the GPU heuristic tiles differently


def test_estimate_memory_usage():
    keys = {"input_memory", "internal_memory", "output_memory", "total_memory", "total_memory_mb"}
    B, H, N, D = 2, 4, 1000, 64
    est = estimate_memory_usage(B, H, N, D)
    assert set(est) == keys
    assert all(type(est[k]) is int for k in keys - {"total_memory_mb"}) and type(est["total_memory_mb"]) is float
    assert est["input_memory"] == 3 * B * H * N * D * 4 and est["output_memory"] == B * H * N * D * 4
    assert est["internal_memory"] == B * H * N * 4  # the lse
    assert est["total_memory"] == est["input_memory"] + est["internal_memory"] + est["output_memory"]
    assert est["total_memory_mb"] == est["total_memory"] / 2**20
    half = estimate_memory_usage(B, H, N, D, use_half=True)
    assert half["input_memory"] * 2 == est["input_memory"]
    totals = [estimate_memory_usage(B, H, n, D)["total_memory"] for n in (64, 113, 1000, 4096)]
    assert totals == sorted(totals) and len(set(totals)) == len(totals)
    assert estimate_memory_usage(B, H, N, D, train=True)["total_memory"] > est["total_memory"]


# --- bad input ----------------------------------------------------------------------------------------
def _bad_cases():
    Q, K, V, dO = make(1, 2, 8, 16, torch.float32)
    l = m = torch.zeros(1, 2, 8, device=DEVICE)
    fwd, bwd = flash_attention_forward, flash_attention_backward
    return [
        ("Q rank", lambda: fwd(Q[0], K, V), ValueError, ["Q", "(2, 8, 16)"]),
        ("Q not a tensor", lambda: fwd(Q.tolist(), K, V), TypeError, ["Q", "list"]),
        ("K, V shapes", lambda: fwd(Q, K, V[:, :, :5]), ValueError, ["V.shape", "(1, 2, 5, 16)"]),
        ("K head dim", lambda: fwd(Q, K[..., :8], V[..., :8]), ValueError, ["K.shape", "(1, 2, 8, 8)"]),
        ("K heads", lambda: fwd(Q, K[:, :1], V[:, :1]), ValueError, ["K.shape", "(1, 1, 8, 16)"]),
        ("integer Q", lambda: fwd(Q.long(), K.long(), V.long()), TypeError,
         ["Q.dtype", "torch.int64", "(1, 2, 8, 16)"]),
        ("mixed dtypes", lambda: fwd(Q, K.half(), V), TypeError, ["K.dtype", "float16"]),
        ("Bc zero", lambda: fwd(Q, K, V, Bc=0), ValueError, ["Bc", "0"]),
        ("Br float", lambda: fwd(Q, K, V, Br=32.0), TypeError, ["Br", "32.0"]),
        ("Bc bool", lambda: fwd(Q, K, V, Bc=True), TypeError, ["Bc"]),
        ("use_half not bool", lambda: fwd(Q, K, V, use_half="yes"), TypeError, ["use_half"]),
        ("platform", lambda: fwd(Q, K, V, platform="cuda"), ValueError, ["platform", "cuda"]),
        ("O shape", lambda: bwd(Q, K, V, dO[:, :1], dO, l, m), ValueError, ["O.shape", "(1, 1, 8, 16)"]),
        ("dO shape", lambda: bwd(Q, K, V, dO, dO[..., :4], l, m), ValueError, ["dO.shape", "(1, 2, 8, 4)"]),
        ("l shape", lambda: bwd(Q, K, V, dO, dO, l[..., :3], m), ValueError, ["l.shape", "(1, 2, 3)"]),
        ("m rank", lambda: bwd(Q, K, V, dO, dO, l, m[None]), ValueError, ["m.shape", "(1, 1, 2, 8)"]),
        ("integer l", lambda: bwd(Q, K, V, dO, dO, l.int(), m), TypeError, ["l.dtype", "torch.int32"]),
        ("bwd Br negative", lambda: bwd(Q, K, V, dO, dO, l, m, Br=-16), ValueError, ["Br", "-16"]),
        ("module bc", lambda: FlashAttention(bc=0), ValueError, ["bc"]),
        ("module input", lambda: FlashAttention()(Q, K[:, :, :, :3], V), ValueError, ["K.shape"]),
        ("seq len", lambda: get_optimal_block_sizes(0, 64), ValueError, ["sequence_length"]),
        ("head dim", lambda: estimate_memory_usage(1, 2, 8, "64"), ValueError, ["head_dim"]),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())), ids=[c[0] for c in _bad_cases()])
def test_bad_input_names_the_argument(case, monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a kernel was launched before the arguments were checked")

    for name in ("_forward", "_backward", "flash_attention"):
        monkeypatch.setattr(compat, name, no_launch)
    _, call, exc, words = _bad_cases()[case]
    with pytest.raises(exc) as info:
        call()
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value!s}"


def test_docstring_examples_hold():
    result = doctest.testmod(compat, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# --- GPU ------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("Bc,Br", [(32, 32), (64, 128), (128, 64)])
def test_gpu_forward_backward(dtype, Bc, Br):
    Q, K, V, dO = make(2, 3, 1000, 64, dtype, device="cuda")
    O, l, m = flash_attention_forward(Q, K, V, Bc=Bc, Br=Br, return_stats=True)
    grads = flash_attention_backward(Q, K, V, O, dO, l, m, Bc=Bc, Br=Br)
    floor = {**FLOOR, torch.float32: 2e-5}  # float32 dots run as 3xTF32 on the GPU
    O64, _, _, g64 = reference(Q, K, V, dO)
    Olo, _, _, glo = reference(Q, K, V, dO, dtype)
    for name, g, r, lo in zip(("O", "dQ", "dK", "dV"), (O, *grads), (O64, *g64), (Olo, *glo)):
        err, bound = rel_err(g, r), FACTOR * rel_err(lo, r) + floor[dtype]
        assert g.dtype == dtype and err <= bound, f"{name}: {err:.3e} > {bound:.3e}"


@pytest.mark.gpu
def test_gpu_module_and_stats_from_reference():
    Q, K, V, dO = make(2, 3, 513, 128, torch.float16, device="cuda")
    leaves = [t.clone().requires_grad_() for t in (Q, K, V)]
    O = FlashAttention(bc=64, br=64)(*leaves)
    O.backward(dO)
    check_all((O.detach(), *(t.grad for t in leaves)), Q, K, V, dO, torch.float16)
    O32, l, m, _ = reference(Q, K, V, dO, torch.float32)
    grads = flash_attention_backward(Q, K, V, O32.half(), dO, l, m, Bc=64, Br=64)
    check_all((None, *grads), Q, K, V, dO, torch.float16)


@pytest.mark.gpu
def test_gpu_tiles_that_do_not_fit_shrink_with_a_warning():
    Q, K, V, dO = make(1, 2, 300, 256, torch.float32, device="cuda")
    with pytest.warns(UserWarning, match="shared memory"):
        O, l, m = flash_attention_forward(Q, K, V, Bc=128, Br=128, return_stats=True)
    with pytest.warns(UserWarning, match="shared memory"):
        grads = flash_attention_backward(Q, K, V, O, dO, l, m, Bc=128, Br=128)
    O64, _, _, g64 = reference(Q, K, V, dO)
    Olo, _, _, glo = reference(Q, K, V, dO, torch.float32)
    for name, g, r, lo in zip(("O", "dQ", "dK", "dV"), (O, *grads), (O64, *g64), (Olo, *glo)):
        err, bound = rel_err(g, r), FACTOR * rel_err(lo, r) + 2e-5
        assert err <= bound, f"{name}: {err:.3e} > {bound:.3e}"
