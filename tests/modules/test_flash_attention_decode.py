"""Decode-shaped flash_attention (Sq <= 16): the split-KV kernel against float64 references.

Forward outputs and lse come from kernels/flash_attention/decode.py; gradients go through the
dense backward with the decode lse, so they check that lse too.
"""

import pytest
import torch

import kernelops.kernels.flash_attention.registration as registration
from kernelops import DecodeParams, FlashAttentionConfig, flash_attention
from kernelops.kernels.flash_attention import decode
from kernelops.kernels.flash_attention.decode import split_plan
from kernelops.kernels.flash_attention.dispatch import flash_attention_decode
from kernelops.modules.attention_args import UNBOUNDED
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops import device_info
from kernelops.ops.keys import bucket_distance
from tests.attention_checks import assert_lse_matches, assert_matches, make_qkv, reference
from tests.conftest import DEVICE

# (B, Sq, Sk, Hq, Hkv, D, options)
CASES = [
    (2, 1, 300, 4, 2, 32, {}),
    (1, 3, 129, 6, 2, 16, dict(causal=True)),                  # group 3: rows not a power of two
    (1, 5, 200, 4, 1, 24, dict(sliding_window=(40, 3))),       # MQA, window, D not a power of two
    (1, 1, 77, 2, 2, 16, dict(logits_soft_cap=2.0)),
    (1, 4, 64, 8, 2, 16, dict(causal=True, sinks=True)),
    (1, 3, 2, 2, 1, 16, dict(causal=True)),                    # Sq > Sk: the first query sees nothing
    (1, 16, 16, 2, 1, 16, dict(causal=True)),
]


def _ids(case):
    B, Sq, Sk, Hq, Hkv, D, opts = case
    return f"b{B}-q{Sq}-k{Sk}-h{Hq}/{Hkv}-d{D}-{'-'.join(opts) or 'full'}"


def check(B, Sq, Sk, Hq, Hkv, D, opts, dtype, device=DEVICE, grads=True):
    opts = dict(opts)
    if opts.pop("sinks", False):
        opts["softmax_aux"] = torch.randn(Hq, device=device)
    q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, D, dtype, device, requires_grad=grads)
    out, lse = flash_attention(q, k, v, return_lse=True, platform="triton", **opts)
    dout = torch.randn_like(out)
    ref_out, ref_lse, ref_grads = reference(q, k, v, dout=dout if grads else None, **opts)
    low_out, _, low_grads = reference(q, k, v, dout=dout if grads else None, dtype=dtype, **opts)
    assert_matches("out", out, ref_out, low_out, dtype)
    assert_lse_matches(lse, ref_lse, dtype)
    if grads:
        out.backward(dout)
        for name, t, ref, low in zip(("dq", "dk", "dv"), (q, k, v), ref_grads, low_grads):
            assert_matches(name, t.grad, ref, low.to(t.dtype), t.dtype)


def assert_forward_matches(out, lse, q, k, v, dtype, **opts):
    """``out`` and ``lse`` against float64's reference, with the tolerance of the reference computed
    in ``dtype`` (``opts``: :func:`reference`'s masks, scale and sinks)."""
    ref_out, ref_lse, _ = reference(q, k, v, **opts)
    low_out, _, _ = reference(q, k, v, dtype=dtype, **opts)
    assert_matches("out", out, ref_out, low_out, dtype)
    assert_lse_matches(lse, ref_lse, dtype)


@pytest.fixture
def decode_calls(monkeypatch):
    """Counts split-KV launches, so a test knows the decode kernel ran."""
    calls = []
    original = registration.flash_attention_decode

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(registration, "flash_attention_decode", counting)
    return calls


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_decode_matches_float64(case, decode_calls):
    check(*case, torch.float32)
    assert len(decode_calls) == 1


def test_decode_fp16(decode_calls):
    check(2, 2, 250, 8, 2, 32, dict(causal=True), torch.float16)
    assert len(decode_calls) == 1


@pytest.mark.parametrize("splits", [1, 3, 7, 40])
@pytest.mark.parametrize("window", [(UNBOUNDED, 0), (50, 0), (20, 7), (5, 5)], ids=str)
def test_forced_split_counts(splits, window):
    """Any split count (more splits than key blocks, splits that see no key under a window)
    gives the same result."""
    q, k, v = make_qkv(2, 3, 333, 4, 2, 32, torch.float32, DEVICE, requires_grad=False)
    left, right = window
    out, lse = flash_attention_decode(q, k, v, softmax_scale=0.2, win_left=left, win_right=right, softcap=None,
                                      kv_blocksize=32, num_warps=4, num_stages=1, num_splits=splits)
    sliding = (None if left == UNBOUNDED else left, right)
    assert_forward_matches(out, lse, q, k, v, torch.float32, softmax_scale=0.2, sliding_window=sliding)


def launched_kernels(monkeypatch) -> list[str]:
    """The names of the kernels launched from now on (kernels.common.launch's observers)."""
    from kernelops.kernels.common import launch

    names: list[str] = []
    monkeypatch.setattr(launch, "observers", [*launch.observers, names.append])
    return names


def test_one_split_skips_the_combine_with_sinks_and_softcap(monkeypatch):
    """A single split writes out/lse itself (sink term and softcap included): the combine kernel
    is not launched, and the result is that of several splits merged by the combine kernel, and
    float64's."""
    q, k, v = make_qkv(2, 2, 200, 6, 2, 32, torch.float32, DEVICE, requires_grad=False)
    aux = torch.randn(6, device=DEVICE)
    args = dict(softmax_scale=0.2, win_left=UNBOUNDED, win_right=0, softcap=3.0, kv_blocksize=32, num_warps=4,
                num_stages=1, softmax_aux=aux)
    launched = launched_kernels(monkeypatch)
    out1, lse1 = flash_attention_decode(q, k, v, num_splits=1, **args)
    assert launched == ["decode_split_kernel"]
    out3, lse3 = flash_attention_decode(q, k, v, num_splits=3, **args)
    assert launched == ["decode_split_kernel", "decode_split_kernel", "decode_combine_kernel"]
    ref_out, ref_lse, _ = reference(q, k, v, softmax_scale=0.2, causal=True, logits_soft_cap=3.0, softmax_aux=aux)
    low_out, _, _ = reference(q, k, v, softmax_scale=0.2, causal=True, logits_soft_cap=3.0, softmax_aux=aux,
                              dtype=torch.float32)
    for out, lse in ((out1, lse1), (out3, lse3)):
        assert_matches("out", out, ref_out, low_out, torch.float32)
        assert_lse_matches(lse, ref_lse, torch.float32)
    assert torch.allclose(out1, out3, atol=1e-5) and torch.allclose(lse1, lse3, atol=1e-5)


def _tma_runs() -> bool:
    """Whether this test device runs the TMA reads: an sm_90+ GPU, or the interpreter."""
    from kernelops.kernels.common.host import interpreting

    if torch.device(DEVICE).type == "cuda":
        return torch.cuda.get_device_capability()[0] >= 9
    return interpreting()


def without_plans(monkeypatch, planned: bool) -> None:
    """Unless ``planned``, decode calls take the general path: the dispatcher finds no plan."""
    from kernelops.kernels.flash_attention import dispatch

    if not planned:
        monkeypatch.setattr(dispatch, "decode_plan", lambda *args: None)


@pytest.mark.parametrize("planned", [True, False], ids=["plan", "general"])
def test_tma_reads_match_float64(planned, monkeypatch):
    """K/V tiles read through TMA descriptors (where the GPU or the interpreter runs them),
    through the signature's plan or the general path, give the float64 result: several splits, a
    window, sinks, and a split's last tile past the keys of its sequence, which in the descriptors'
    [B * Sk, Hkv * D] view are the next sequence's rows. Those rows are poisoned (K +-inf, V NaN;
    no query of their own sequence sees them under the window): the mask and the V zeroing must
    keep them out."""
    without_plans(monkeypatch, planned)
    aux = torch.randn(6, device=DEVICE)
    q, k, v = make_qkv(2, 6, 200, 6, 2, 32, torch.float16, DEVICE, requires_grad=False)
    assert decode.decode_tma(q, k, v) == _tma_runs()
    for splits, window in ((11, (UNBOUNDED, 0)), (1, (UNBOUNDED, UNBOUNDED)), (5, (90, 2))):
        args = dict(softmax_scale=0.2, win_left=window[0], win_right=window[1], softcap=None, kv_blocksize=16,
                    num_warps=4, num_stages=1, softmax_aux=aux)
        sliding = (None if window[0] == UNBOUNDED else window[0], None if window[1] == UNBOUNDED else window[1])
        ref_out, ref_lse, _ = reference(q, k, v, softmax_scale=0.2, sliding_window=sliding, softmax_aux=aux)
        low_out, _, _ = reference(q, k, v, softmax_scale=0.2, sliding_window=sliding, softmax_aux=aux,
                                  dtype=torch.float16)
        k_in, v_in = k, v
        if window[0] == 90:  # batch 1's first 16 keys: outside its window, inside batch 0's last tile
            k_in, v_in = k.clone(), v.clone()
            k_in[1, :16] = float("inf")
            k_in[1, :16, :, ::2] = float("-inf")
            v_in[1, :16] = float("nan")
        out, lse = flash_attention_decode(q, k_in, v_in, num_splits=splits, **args)
        assert_matches("out", out, ref_out, low_out, torch.float16)
        assert_lse_matches(lse, ref_lse, torch.float16)


def poisoned_cache_slices(B: int, seq_k: int, Hkv: int, D: int, layout: str):
    """``(k, v, v_cache)``: float16 K/V as ``cache[:, :seq_k]`` of caches of 96 rows per sequence,
    stored BSHD or BHSD (``layout``), whose rows past ``seq_k`` hold K = +-inf and V = NaN."""
    shape = (B, 96, Hkv, D) if layout == "bshd" else (B, Hkv, 96, D)
    k_cache, v_cache = (torch.randn(shape, device=DEVICE).to(torch.float16) for _ in range(2))
    if layout == "bhsd":
        k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    k_cache[:, seq_k:] = float("inf")
    k_cache[:, seq_k:, :, ::2] = float("-inf")
    v_cache[:, seq_k:] = float("nan")
    return k_cache[:, :seq_k], v_cache[:, :seq_k], v_cache


@pytest.mark.parametrize("planned", [True, False], ids=["plan", "general"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_slices_of_a_longer_cache_read_through_tma(layout, planned, monkeypatch):
    """K/V as ``cache[:, :Sk]`` of a cache of 96 rows per sequence (a serving loop's view of its
    cache), stored BSHD (rows of Hkv * D, 96 rows from batch to batch) or BHSD (rows of D, 96 rows
    from head to head): TMA reads them (where the GPU or interpreter runs TMA). The cache's rows
    past Sk are poisoned (K +-inf, V NaN): a split's last tile reads them and the key mask must
    drop them. Several splits, a window, sinks; the result matches float64."""
    without_plans(monkeypatch, planned)
    B, Sk, Hq, Hkv, D = 3, 70, 4, 2, 32
    q = torch.randn(B, 2, Hq, D, device=DEVICE).to(torch.float16)
    k, v, v_cache = poisoned_cache_slices(B, Sk, Hkv, D, layout)
    expected = (Hkv * D, 96, 0, D) if layout == "bshd" else (D, Hkv * 96, 96, 0)
    assert decode.tma_rows(q, k, v) == (expected if _tma_runs() else None)
    assert decode.tma_rows(q, k, v_cache[:, :Sk].contiguous()) is None  # K and V of two layouts
    aux = torch.randn(Hq, device=DEVICE)
    for splits, window in ((3, (UNBOUNDED, 0)), (1, (UNBOUNDED, UNBOUNDED)), (4, (30, 1))):
        sliding = (None if window[0] == UNBOUNDED else window[0], None if window[1] == UNBOUNDED else window[1])
        ref_out, ref_lse, _ = reference(q, k, v, softmax_scale=0.2, sliding_window=sliding, softmax_aux=aux)
        low_out, _, _ = reference(q, k, v, softmax_scale=0.2, sliding_window=sliding, softmax_aux=aux,
                                  dtype=torch.float16)
        out, lse = flash_attention_decode(q, k, v, softmax_scale=0.2, win_left=window[0], win_right=window[1],
                                          softcap=None, kv_blocksize=16, num_warps=4, num_stages=1,
                                          num_splits=splits, softmax_aux=aux)
        assert_matches("out", out, ref_out, low_out, torch.float16)
        assert_lse_matches(lse, ref_lse, torch.float16)


def test_bhsd_pitches_of_layouts():
    """Rows of D from batch to batch and head to head for BHSD storage and its slices; None where
    heads' rows would overlap or are not whole rows apart, or for BSHD storage of several heads."""
    bhsd = torch.randn(3, 4, 50, 32, device=DEVICE).to(torch.float16).transpose(1, 2)  # [3, 50, 4, 32]
    assert decode.bhsd_pitches(bhsd) == (200, 50)
    assert decode.bhsd_pitches(bhsd[:, :20]) == (200, 50)
    assert decode.bhsd_pitches(bhsd[:1, :20, :1]) == (0, 0)
    assert decode.bhsd_pitches(bhsd[:, :, ::2]) == (200, 100)                           # every other head
    assert decode.bhsd_pitches(torch.randn(3, 50, 4, 32, device=DEVICE).to(torch.float16)) is None  # BSHD
    assert decode.bhsd_pitches(bhsd[:, :1].expand(3, 7, 4, 32)) is None                 # rows overlap
    odd = torch.randn(3 * 4 * 50 * 32 + 64, device=DEVICE).to(torch.float16)
    assert decode.bhsd_pitches(torch.as_strided(odd, (3, 50, 4, 32), (4 * 50 * 32, 32, 50 * 32 + 8, 1))) is None


def test_a_plan_bound_with_one_tensor_for_k_and_v_is_not_reused_for_two():
    """Bound launches find their tensors by position; a plan made by a call with ``k is v`` would
    read V as K for a later call with two tensors of that signature. The alias pattern is part of
    the key: each call gets a plan of its own pattern, and both match float64."""
    from kernelops.kernels.flash_attention import plans

    plans._FWD_PLANS.clear()
    tiles = dict(softmax_scale=0.2, win_left=UNBOUNDED, win_right=UNBOUNDED, softcap=None, kv_blocksize=16,
                 num_warps=4, num_stages=1)
    q, k, v = make_qkv(2, 1, 100, 4, 2, 32, torch.float16, DEVICE, requires_grad=False)
    for keys, values in ((k, k), (k, v)):
        out, _ = flash_attention_decode(q, keys, values, num_splits=3, **tiles)
        assert_matches("out", out, reference(q, keys, values, softmax_scale=0.2)[0],
                       reference(q, keys, values, softmax_scale=0.2, dtype=torch.float16)[0], torch.float16)
    assert len(plans._FWD_PLANS) == 2
    assert plans._aliases(q, k, v) == () and plans._aliases(q, k, k, None) == (0, 1, 1, 3)
    assert plans._aliases(q, k, v, None, None) == ()


def test_tma_reads_only_row_viewable_16_bit_inputs(monkeypatch):
    """K/V go through descriptors only for 16-bit, power-of-two D, [B * Sk, Hkv * D] row views
    with fewer rows than the descriptors' int32 coordinates reach; everything else through
    pointers."""
    q, k, v = make_qkv(1, 1, 64, 4, 2, 32, torch.float16, DEVICE, requires_grad=False)
    assert decode.decode_tma(q, k, v) == _tma_runs()
    assert not decode.decode_tma(q.float(), k.float(), v.float())
    assert not decode.decode_tma(*make_qkv(1, 1, 64, 4, 2, 24, torch.float16, DEVICE, requires_grad=False))
    wide = torch.randn(1, 64, 2, 64, device=DEVICE).to(torch.float16)[..., :32]  # rows of 128, heads 64 apart
    assert not decode.decode_tma(q, wide, wide)
    monkeypatch.setattr(decode, "TMA_MAX_ROWS", 64)
    assert not decode.decode_tma(q, k, v)
    monkeypatch.setattr(decode, "TMA_MAX_ROWS", 65)
    assert decode.decode_tma(q, k, v) == _tma_runs()


def test_dependent_combine_launch_only_on_hopper_gpus():
    """The combine goes as a programmatic dependent launch only on CUDA devices of sm_90 or newer;
    never in the interpreter or on the CPU."""
    q = torch.randn(1, 1, 4, 32, device=DEVICE)
    hopper = q.is_cuda and torch.cuda.get_device_capability()[0] >= 9 and not decode.interpreting()
    assert decode.decode_pdl(q) == hopper
    assert not decode.decode_pdl(q.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [0, 37])
def test_gpu_dependent_combine_in_cuda_graph_replays(splits):
    """Split and combine captured in a CUDA graph (the combine a programmatic dependent launch on
    sm_90+) and replayed over fresh inputs copied into the captured tensors: each replay matches
    float64, so the combine reads the splits' results of its own replay."""
    B, Sk, Hq, Hkv, D = 2, 8192, 16, 4, 128
    q, k, v = make_qkv(B, 1, Sk, Hq, Hkv, D, torch.bfloat16, "cuda", requires_grad=False)
    tiles = dict(softmax_scale=D ** -0.5, win_left=UNBOUNDED, win_right=UNBOUNDED, softcap=None, kv_blocksize=64,
                 num_warps=4, num_stages=3, num_splits=splits)
    assert decode.decode_splits(q, k, UNBOUNDED, UNBOUNDED, 64, splits, 3)[2] > 1
    flash_attention_decode(q, k, v, **tiles)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = flash_attention_decode(q, k, v, **tiles)
    for _ in range(3):
        fresh = make_qkv(B, 1, Sk, Hq, Hkv, D, torch.bfloat16, "cuda", requires_grad=False)
        for dst, src in zip((q, k, v), fresh):
            dst.copy_(src)
        graph.replay()
        assert_forward_matches(out, lse, q, k, v, torch.bfloat16, softmax_scale=D ** -0.5)


@pytest.mark.parametrize("splits,sinks", [(0, False), (1, True), (5, True)],
                         ids=["rule", "one-split-sinks", "five-splits"])
def test_decode_plan_repeats_its_launches(splits, sinks, monkeypatch):
    """Three calls of one signature with fresh inputs: the first makes the plan and binds its
    launches (split, and combine with more than one split), the others repeat them over the new
    tensors; every call matches float64. A query sliced from a wider tensor takes its own plan."""
    from kernelops.kernels.flash_attention import plans

    monkeypatch.setattr(decode, "WIDE_MIN_FILL", 1.0)  # no wide tile: the rule's several splits (test_wide_tile_*: one)
    plans._FWD_PLANS.clear()
    tiles = dict(softmax_scale=0.2, win_left=UNBOUNDED, win_right=0, softcap=None, kv_blocksize=16, num_warps=4,
                 num_stages=1)
    aux = torch.randn(6, device=DEVICE) if sinks else None
    for i in range(4):
        q, k, v = make_qkv(2, 2, 150, 6, 2, 32, torch.float16, DEVICE, requires_grad=False)
        if i == 3:  # every other head of a [B, Sq, 12, D] tensor: not contiguous
            q = torch.randn(2, 2, 12, 32, device=DEVICE).to(torch.float16)[:, :, ::2]
        out, lse = flash_attention_decode(q, k, v, num_splits=splits, softmax_aux=aux, **tiles)
        assert_forward_matches(out, lse, q, k, v, torch.float16, softmax_scale=0.2, causal=True, softmax_aux=aux)
        assert out.is_contiguous()
        assert len(plans._FWD_PLANS) == (1 if i < 3 else 2)
        plan = plans._FWD_PLANS[next(iter(plans._FWD_PLANS))]
        assert len(plan._bound) == (1 if splits == 1 else 2)


def test_decode_plan_takes_only_what_it_can_bind():
    from kernelops.kernels.flash_attention import plans

    q, k, v = make_qkv(1, 1, 64, 4, 2, 32, torch.float16, DEVICE, requires_grad=False)
    tiles = dict(softmax_scale=0.2, win_left=UNBOUNDED, win_right=UNBOUNDED, softcap=None, kv_blocksize=16,
                 num_warps=4, num_stages=1)
    plan = plans.decode_plan(q, k, v, None, 0, tiles)
    assert plan is not None and plans.decode_plan(q, k, v, None, 0, tiles) is plan
    assert plans.decode_plan(q, k, v, None, 3, tiles) is not plan                      # another split count
    shifted = torch.empty(k.numel() + 1, dtype=k.dtype, device=DEVICE)[1:].view(k.shape).copy_(k)
    assert plans.decode_plan(q, shifted, v, None, 0, tiles) is None                    # not 16-byte aligned
    assert plans.decode_plan(q, k, v, torch.randn(8, device=DEVICE)[::2], 0, tiles) is None  # sinks strided
    assert plans.decode_plan(q, k[:, :0], v[:, :0], None, 0, tiles) is None            # no keys
    wide = make_qkv(1, 40, 64, 8, 2, 32, torch.float16, DEVICE, requires_grad=False)[0]
    assert plans.decode_plan(wide, k, v, None, 0, tiles) is None                       # 160 rows per KV head
    with pytest.raises(ValueError, match="query rows per KV head"):
        flash_attention_decode(wide, k, v, **tiles)


def test_split_plan():
    # one sequence, 8 KV heads, 132 SMs: splits for 2 programs per SM, each >= 2 blocks
    splits, length = split_plan(8, 131072, 64, 0, 132)
    assert splits == 33 and length % 64 == 0 and splits * length >= 131072 > (splits - 1) * length
    assert split_plan(8, 100, 64, 0, 132) == (1, 128)      # two blocks: one split
    assert split_plan(1024, 8192, 64, 0, 132) == (1, 8192)  # the batch fills the GPU already
    assert split_plan(1, 640, 64, 32, 132) == (10, 64)      # forced counts are capped at the blocks
    # one wave of 2 programs per SM (264 on 132 SMs), never a second partly full one
    assert split_plan(64, 131072, 64, 0, 132)[0] == 4      # 256 programs (5 would be 320)
    assert split_plan(16, 131072, 64, 0, 132)[0] == 16     # 256 programs (17 would be 272)
    assert split_plan(200, 131072, 64, 0, 132)[0] == 1     # 200 pairs: splitting would start a second wave
    for pairs in (1, 3, 8, 50, 131, 264):
        assert pairs * split_plan(pairs, 1 << 20, 64, 0, 132)[0] <= 264


def test_wide_tile_rule():
    """One split with twice the tile where the pairs fill more than WIDE_MIN_FILL of the SMs and no
    more than all of them, the split count is automatic and the wider stages fit; else the tile
    as given."""
    assert decode.wide_tile(128, 0, 64, 3, 128, 2, 132) == 128   # B=16 x 8 KV heads: 192 KiB of stages
    assert decode.wide_tile(96, 0, 64, 3, 128, 2, 132) == 128    # B=12
    assert decode.wide_tile(64, 0, 64, 3, 128, 2, 132) == 64     # half the SMs: the rule's 4 splits
    assert decode.wide_tile(133, 0, 64, 3, 128, 2, 132) == 64    # more pairs than SMs
    assert decode.wide_tile(128, 2, 64, 3, 128, 2, 132) == 64    # a split count asked for
    assert decode.wide_tile(128, 0, 64, 4, 128, 2, 132) == 64    # 4 stages of 128 keys: 256 KiB
    assert decode.wide_tile(128, 0, 64, 3, 256, 2, 132) == 64    # D=256
    assert decode.wide_tile(128, 0, 64, 3, 128, 4, 132) == 64    # float32
    assert decode.wide_tile(128, 0, 64, 3, 128, 2, 132, 16) == 128  # Sq=4 at GQA 4: 16 rows
    assert decode.wide_tile(128, 0, 64, 3, 128, 2, 132, 32) == 64   # taller tiles: the rule's splits
    assert decode.wide_tile(100, 0, 128, 3, 64, 2, 142, 4, 232448) == 256  # D=64 on an sm_90 part
    assert decode.wide_tile(100, 0, 128, 3, 64, 2, 142, 4, 101376) == 128  # ~99 KiB a program: as given


@pytest.mark.parametrize("planned", [True, False], ids=["plan", "general"])
def test_wide_tile_plan_matches_float64(planned, monkeypatch):
    """Pairs that fill the SMs (4 of 4 here): the automatic plan takes one split of twice the tile
    (one launch, no combine), through the plan or the general path, and matches float64 with a
    window, sinks and keys not a multiple of the tile."""
    from kernelops.kernels.flash_attention import dispatch, plans

    without_plans(monkeypatch, planned)
    monkeypatch.setattr(decode, "num_sms", lambda device, default: 4)
    plans._FWD_PLANS.clear()
    q, k, v = make_qkv(2, 3, 150, 6, 2, 32, torch.float16, DEVICE, requires_grad=False)
    aux = torch.randn(6, device=DEVICE)
    assert decode.decode_splits(q, k, 40, 0, 16, 0, 3) == (96, 150, 1, 64, 32, 0)  # keys 107.. of 150
    launches = []
    original = decode.decode_launches

    def counting(*args, **kwargs):
        launches.append(original(*args, **kwargs))
        return launches[-1]

    monkeypatch.setattr(decode, "decode_launches", counting)  # the plans'
    monkeypatch.setattr(dispatch, "decode_launches", counting)  # the general path's
    out, lse = flash_attention_decode(q, k, v, softmax_scale=0.2, win_left=40, win_right=0, softcap=None,
                                      kv_blocksize=16, num_warps=4, num_stages=3, softmax_aux=aux)
    assert len(launches) == 1 and len(launches[0]) == 1 and launches[0][0][3]["BLOCK_N"] == 32
    assert_forward_matches(out, lse, q, k, v, torch.float16, softmax_scale=0.2, sliding_window=(40, 0), softmax_aux=aux)


def test_balanced_split_rule():
    """Equal runs of key blocks over all pairs, ``wave`` programs per SM, where there are more pairs
    than SMs, one split per pair would leave more than 5% of its waves' slots idle (waves of two
    programs per SM), and either the pairs need more than one wave, or each has at least
    BALANCED_MIN_KEYS keys, or the pairs exceed the SMs by at most BALANCED_NEAR with at least
    BALANCED_NEAR_KEYS keys each; never for pairs of fewer than BALANCED_MIN_PAIR_KEYS keys."""
    assert decode.balanced_split(136, 512, 64, 0, 132) == (264, 264, 3)  # B=17 x 8 KV heads, 32k keys
    assert decode.balanced_split(200, 512, 64, 0, 132) == (264, 388, 3)
    assert decode.balanced_split(136, 64, 64, 0, 132) == (264, 33, 3)    # 4k keys, 4 pairs over the SMs
    assert decode.balanced_split(136, 32, 128, 0, 132, wave=1) == (132, 33, 2)  # one program per SM
    assert decode.balanced_split(136, 32, 64, 0, 132) == (256, 17, 3)    # 2k keys
    assert decode.balanced_split(136, 16, 64, 0, 132) is None            # 1k keys, one wave: uniform
    assert decode.balanced_split(136, 32, 64, 0, 132, keys=1985) is None  # the pairs' keys, not whole tiles'
    assert decode.balanced_split(145, 64, 64, 0, 132) == (258, 36, 3)    # 13 pairs over the SMs: near
    assert decode.balanced_split(146, 64, 64, 0, 132) is None            # 14 over (> 10%), 4k keys: uniform
    assert decode.balanced_split(146, 256, 64, 0, 132) == (264, 142, 3)  # ... but 16k keys
    assert decode.balanced_split(320, 64, 64, 0, 132) == (263, 78, 2)    # 1.2 waves of single splits
    assert decode.balanced_split(320, 32, 128, 0, 132, wave=1) == (132, 78, 2)
    assert decode.balanced_split(256, 512, 64, 0, 132) is None           # 256 of 264 slots: uniform
    assert decode.balanced_split(128, 512, 64, 0, 132) is None           # no more pairs than SMs
    assert decode.balanced_split(136, 512, 64, 2, 132) is None           # a split count asked for
    assert decode.balanced_split(320, 8, 64, 0, 132) == (256, 10, 2)    # 512 keys, more than two waves
    assert decode.balanced_split(320, 7, 64, 0, 132) is None             # 448 keys: runs of a few blocks
    assert decode.balanced_split(320, 0, 64, 0, 132) is None             # no keys


def test_wide_splits_rule(monkeypatch):
    """Pairs filling at most half the SMs take one program per SM with the doubled tile and
    ``SMs // pairs`` splits, when each split keeps WIDE_SPLIT_MIN_KEYS keys; else (short keys, more
    pairs, a split count asked for, a tile that does not double) the two programs per SM of
    :func:`decode.split_plan`."""
    smem = 227 * 1024
    assert decode.wide_splits(32, 0, 32768, 64, 3, 128, 2, 4, 132, smem) == (128, 4)   # B=4 x 8 KV heads
    assert decode.wide_splits(64, 0, 32768, 128, 3, 64, 2, 4, 132, smem) == (256, 2)   # D=64, B=8
    assert decode.wide_splits(8, 0, 131072, 64, 3, 128, 2, 4, 132, smem) == (128, 16)  # B=1, 128k keys
    assert decode.wide_splits(8, 0, 32768, 64, 3, 128, 2, 4, 132, smem) is None        # 2048 keys a split
    assert decode.wide_splits(32, 0, 4096, 64, 3, 128, 2, 4, 132, smem) is None        # 4k keys
    assert decode.wide_splits(67, 0, 1 << 20, 64, 3, 128, 2, 4, 132, smem) is None     # over half the SMs
    assert decode.wide_splits(32, 4, 32768, 64, 3, 128, 2, 4, 132, smem) is None       # splits asked for
    assert decode.wide_splits(32, 0, 32768, 64, 3, 128, 2, 32, 132, smem) is None      # 32 rows: no doubling
    assert decode.wide_splits(32, 0, 32768, 64, 3, 128, 2, 4, 132, 100 * 1024) is None  # ~100 KiB GPUs
    monkeypatch.setattr(decode, "num_sms", lambda device, default: 132)
    q = torch.empty(4, 1, 32, 128, dtype=torch.bfloat16)
    k = torch.empty(4, 32768, 8, 128, dtype=torch.bfloat16)
    if decode.device_info(q.device).smem_bytes >= 200 * 1024:
        assert decode.decode_splits(q, k, UNBOUNDED, UNBOUNDED, 64, 0, 3) == (0, 32768, 4, 8192, 128, 0)
    monkeypatch.setattr(decode, "WIDE_SPLIT_MIN_KEYS", 8193)  # 4 splits of 8192 keys: too short
    assert decode.decode_splits(q, k, UNBOUNDED, UNBOUNDED, 64, 0, 3) == (0, 32768, 8, 4096, 64, 0)


@pytest.mark.parametrize("window", [(UNBOUNDED, UNBOUNDED), (60, 0)], ids=["full", "window"])
def test_wide_split_plan_matches_float64(window, monkeypatch):
    """2 pairs on 5 SMs: two splits of the doubled tile each (:func:`decode.wide_splits`), keys not a
    multiple of it, sinks: float64's result."""
    monkeypatch.setattr(decode, "num_sms", lambda device, default: 5)
    monkeypatch.setattr(decode, "WIDE_SPLIT_MIN_KEYS", 0)
    q, k, v = make_qkv(1, 2, 150, 6, 2, 32, torch.float16, DEVICE, requires_grad=False)
    assert decode.decode_splits(q, k, window[0], window[1], 16, 0, 3)[2:5:2] == (2, 32)
    aux = torch.randn(6, device=DEVICE)
    out, lse = flash_attention_decode(q, k, v, softmax_scale=0.2, win_left=window[0], win_right=window[1],
                                      softcap=None, kv_blocksize=16, num_warps=4, num_stages=3, softmax_aux=aux)
    sliding = (None, None) if window[0] == UNBOUNDED else window
    assert_forward_matches(out, lse, q, k, v, torch.float16, softmax_scale=0.2, sliding_window=sliding,
                           softmax_aux=aux)


def test_balanced_plans_take_one_program_per_sm_with_the_doubled_tile(monkeypatch):
    """Where the doubled key tile fits (:func:`decode.widened`), a balanced plan puts one program on
    each SM with it; where it does not (more than WIDE_MAX_ROWS query rows) or the pairs have fewer
    than BALANCED_WIDE_KEYS keys, two programs per SM with the given tile."""
    monkeypatch.setattr(decode, "num_sms", lambda device, default: 132)
    q = torch.empty(17, 1, 32, 128, dtype=torch.bfloat16)
    k = torch.empty(17, 4096, 8, 128, dtype=torch.bfloat16)
    assert decode.decode_splits(q, k, UNBOUNDED, UNBOUNDED, 64, 0, 3) == (0, 4096, 2, 33 * 128, 128, 132)
    tall = torch.empty(17, 5, 32, 128, dtype=torch.bfloat16)  # 4 * 5 = 20 rows a tile
    assert decode.decode_splits(tall, k, UNBOUNDED, UNBOUNDED, 64, 0, 3)[3:] == (33 * 64, 64, 264)
    # under BALANCED_WIDE_KEYS keys (a program walks several pairs), or a doubled tile over
    # WIDE_MAX_SCORES scores (D=16's 512-key tile): two programs per SM with the given tile
    batch = torch.empty(40, 1, 32, 128, dtype=torch.bfloat16)
    short = torch.empty(40, 1024, 8, 128, dtype=torch.bfloat16)
    assert decode.decode_splits(batch, short, UNBOUNDED, UNBOUNDED, 64, 0, 3)[4:] == (64, 256)
    narrow_q = torch.empty(17, 1, 32, 16, dtype=torch.bfloat16)
    narrow_k = torch.empty(17, 4096, 8, 16, dtype=torch.bfloat16)
    assert decode.decode_splits(narrow_q, narrow_k, UNBOUNDED, UNBOUNDED, 512, 0, 3)[4:] == (512, 218)
    assert decode.wide_tile(128, 0, 512, 3, 16, 2, 132) == 512 and decode.wide_tile(128, 0, 256, 3, 32, 2, 132) == 512


@pytest.mark.parametrize("knob,value", [("BALANCED_NEAR_KEYS", 1 << 20), ("BALANCED_MIN_PAIR_KEYS", 1 << 20),
                                         ("BALANCED_MIN_FILL", 0.0), ("BALANCED_WIDE_KEYS", 1 << 20)])
def test_decode_plan_follows_the_plan_knobs(knob, value, monkeypatch):
    """A knob changed after a call (here one that turns a balanced plan uniform, or one per SM into
    two) takes effect at the next call: every value :func:`decode.plan_thresholds` lists is in the
    plan's signature. Both plans give float64's result."""
    from kernelops.kernels.flash_attention import plans

    monkeypatch.setattr(decode, "num_sms", lambda device, default: 10)
    monkeypatch.setattr(decode, "BALANCED_NEAR_KEYS", 0)
    monkeypatch.setattr(decode, "BALANCED_MIN_PAIR_KEYS", 0)
    monkeypatch.setattr(decode, "BALANCED_WIDE_KEYS", 0)
    plans._FWD_PLANS.clear()
    q, k, v = make_qkv(1, 1, 96, 11, 11, 32, torch.float16, DEVICE, requires_grad=False)  # 11 pairs on 10 SMs
    tiles = dict(softmax_scale=0.2, win_left=UNBOUNDED, win_right=UNBOUNDED, softcap=None, kv_blocksize=16,
                 num_warps=4, num_stages=3)
    before = decode.decode_splits(q, k, UNBOUNDED, UNBOUNDED, 16, 0, 3)
    flash_attention_decode(q, k, v, **tiles)
    monkeypatch.setattr(decode, knob, value)
    after = decode.decode_splits(q, k, UNBOUNDED, UNBOUNDED, 16, 0, 3)
    assert before != after and before[5] > 0
    out, lse = flash_attention_decode(q, k, v, **tiles)
    plan = plans.decode_plan(q, k, v, None, 0, tiles)
    assert plan is not None and plan.splits == after and len(plans._FWD_PLANS) == 2
    assert_forward_matches(out, lse, q, k, v, torch.float16, softmax_scale=0.2)


@pytest.mark.parametrize("wide", [True, False], ids=["one-a-sm", "two-a-sm"])
@pytest.mark.parametrize("planned", [True, False], ids=["plan", "general"])
@pytest.mark.parametrize("sms,seq_k,window", [(2, 150, (UNBOUNDED, UNBOUNDED)), (2, 150, (60, 0)),
                                              (2, 20, (UNBOUNDED, 0)), (2, 10, (UNBOUNDED, 0))],
                         ids=["runs-cross-pairs", "window", "programs-span-pairs", "whole-pairs-direct"])
def test_balanced_plan_matches_float64(sms, seq_k, window, planned, wide, monkeypatch):
    """6 pairs on 2 SMs (more than a wave of 4): the automatic plan cuts all pairs' key blocks into
    equal runs, one per program (one program per SM with the doubled tile, or two with the given
    one). Runs end inside a pair (its pieces merged by the combine) or cover the ends of several
    pairs (one program, several segments); with a window, causal, sinks and keys not a multiple of
    the tile, through the plan or the general path, the query rows read with every block (plans)
    or at each pair's start (general path): float64's result."""
    from kernelops.kernels.flash_attention import plans

    without_plans(monkeypatch, planned)
    monkeypatch.setattr(decode, "Q_EACH_BLOCK_MAX", 1 << 20 if planned else 0)
    # (these pairs are a few tiles long: no key floor, one program per SM with the doubled tile; else two)
    monkeypatch.setattr(decode, "BALANCED_WIDE_KEYS", 0 if wide else 1 << 20)
    monkeypatch.setattr(decode, "BALANCED_MIN_PAIR_KEYS", 0)
    monkeypatch.setattr(decode, "num_sms", lambda device, default: sms)
    plans._FWD_PLANS.clear()
    q, k, v = make_qkv(3, 2, seq_k, 6, 2, 32, torch.float16, DEVICE, requires_grad=False)
    aux = torch.randn(6, device=DEVICE)
    block_n, programs = decode.decode_splits(q, k, window[0], window[1], 16, 0, 3)[4:]
    assert block_n == (32 if wide else 16) and 0 < programs <= (1 if wide else 2) * sms
    for _ in range(2):
        out, lse = flash_attention_decode(q, k, v, softmax_scale=0.2, win_left=window[0], win_right=window[1],
                                          softcap=None, kv_blocksize=16, num_warps=4, num_stages=3, softmax_aux=aux)
        sliding = (None if window[0] == UNBOUNDED else window[0], None if window[1] == UNBOUNDED else window[1])
        assert_forward_matches(out, lse, q, k, v, torch.float16, softmax_scale=0.2, sliding_window=sliding,
                               softmax_aux=aux)
        q, k, v = make_qkv(3, 2, seq_k, 6, 2, 32, torch.float16, DEVICE, requires_grad=False)


@pytest.mark.parametrize("q_each_block", [True, False], ids=["q-each-block", "q-each-pair"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("seq_k", [70, 10], ids=["last-tile-moved-back", "pairs-under-a-tile"])
def test_balanced_plan_reads_no_key_past_a_cache_slice(seq_k, layout, q_each_block, monkeypatch):
    """A balanced plan over ``cache[:, :Sk]`` whose rows past Sk are poisoned (K +-inf, V NaN): a
    pair's last tile is moved back to end at its last key (70 keys in 16-key tiles), or, for pairs
    shorter than a tile, the rows past the keys are zeroed. 10 pairs on 2 SMs, runs crossing pairs,
    causal, sinks, the query rows read with every block or at each pair's start; the result matches
    float64."""
    monkeypatch.setattr(decode, "Q_EACH_BLOCK_MAX", 1 << 20 if q_each_block else 0)
    monkeypatch.setattr(decode, "BALANCED_MIN_PAIR_KEYS", 0)  # (pairs under BALANCED_WIDE_KEYS: two per SM)
    monkeypatch.setattr(decode, "num_sms", lambda device, default: 2)
    B, Hq, Hkv, D = 5, 4, 2, 32
    q = torch.randn(B, 1, Hq, D, device=DEVICE).to(torch.float16)
    k, v, _ = poisoned_cache_slices(B, seq_k, Hkv, D, layout)
    assert decode.decode_splits(q, k, UNBOUNDED, 0, 16, 0, 3)[5] > 0  # balanced
    aux = torch.randn(Hq, device=DEVICE)
    out, lse = flash_attention_decode(q, k, v, softmax_scale=0.2, win_left=UNBOUNDED, win_right=0, softcap=None,
                                      kv_blocksize=16, num_warps=4, num_stages=3, softmax_aux=aux)
    assert_forward_matches(out, lse, q, k, v, torch.float16, softmax_scale=0.2, sliding_window=(None, 0),
                           softmax_aux=aux)


def test_balanced_plan_keeps_a_nan_in_its_pair(monkeypatch):
    """A NaN among one pair's keys (a bad slot of a static cache) makes that pair's rows NaN and
    leaves every other pair's rows as they are, bit for bit, though programs of a balanced plan walk
    several pairs: each pair starts from a fresh softmax state."""
    monkeypatch.setattr(decode, "BALANCED_MIN_PAIR_KEYS", 0)  # (pairs under BALANCED_WIDE_KEYS: two per SM)
    monkeypatch.setattr(decode, "num_sms", lambda device, default: 2)
    q, k, v = make_qkv(5, 1, 70, 4, 2, 32, torch.float16, DEVICE, requires_grad=False)
    assert decode.decode_splits(q, k, UNBOUNDED, 0, 16, 0, 3)[5] > 0  # balanced, runs crossing pairs
    tiles = dict(softmax_scale=0.2, win_left=UNBOUNDED, win_right=0, softcap=None, kv_blocksize=16, num_warps=4,
                 num_stages=3)
    out, lse = flash_attention_decode(q, k, v, **tiles)
    assert_forward_matches(out, lse, q, k, v, torch.float16, softmax_scale=0.2)
    bad = v.clone()
    bad[0, 3, 0, 0] = float("nan")  # batch 0, KV head 0: query heads 0 and 1
    out_bad, lse_bad = flash_attention_decode(q, k, bad, **tiles)
    hit = torch.zeros(5, 4, dtype=torch.bool)
    hit[0, :2] = True
    assert out_bad[:, 0][hit.to(out.device)].isnan().any(-1).all()
    assert torch.equal(out_bad[:, 0][~hit.to(out.device)], out[:, 0][~hit.to(out.device)])
    assert torch.equal(lse_bad[~hit.to(out.device)], lse[~hit.to(out.device)])


DENSE_FORWARD_KERNELS = {"flash_attention_fwd_kernel", "flash_attention_fwd_tma_kernel",
                         "flash_attention_fwd_ws_kernel"}


def test_calls_with_other_score_terms_use_the_dense_kernel(decode_calls, monkeypatch):
    """Decode-shaped calls with ALiBi, and calls of more than 16 queries, launch one dense forward
    kernel and no split-KV kernel."""
    q, k, v = make_qkv(1, 2, 64, 2, 2, 16, torch.float32, DEVICE, requires_grad=False)
    slopes = torch.rand(2, device=DEVICE)
    launched = launched_kernels(monkeypatch)
    out = flash_attention(q, k, v, alibi_slopes=slopes, platform="triton")
    assert decode_calls == [] and len(launched) == 1 and launched[0] in DENSE_FORWARD_KERNELS, launched
    assert_matches("out", out, reference(q, k, v, alibi_slopes=slopes)[0],
                   reference(q, k, v, alibi_slopes=slopes, dtype=torch.float32)[0], torch.float32)
    long_q = make_qkv(1, 17, 64, 2, 2, 16, torch.float32, DEVICE, requires_grad=False)[0]
    launched.clear()
    out = flash_attention(long_q, k, v, platform="triton")
    assert decode_calls == [] and len(launched) == 1 and launched[0] in DENSE_FORWARD_KERNELS, launched
    assert_matches("out", out, reference(long_q, k, v)[0], reference(long_q, k, v, dtype=torch.float32)[0],
                   torch.float32)


def test_decode_params_in_configs_and_tuning_phases():
    q, k, v = make_qkv(1, 1, 64, 8, 2, 16, torch.float32, DEVICE, requires_grad=False)
    inputs = FLASH_ATTENTION.prepare(query=q, key=k, value=v, platform="triton")
    dev = device_info(q.device)
    assert FLASH_ATTENTION.phases(inputs) == ("decode",)
    assert isinstance(FLASH_ATTENTION.heuristic_config(inputs, dev).decode_params, DecodeParams)
    space = FLASH_ATTENTION.candidate_params(inputs, dev, "decode")
    assert space and all(isinstance(p, DecodeParams) for p in space)
    grad_inputs = FLASH_ATTENTION.prepare(query=q.requires_grad_(), key=k, value=v, platform="triton")
    assert FLASH_ATTENTION.phases(grad_inputs) == ("decode", "bwd")
    with pytest.raises(ValueError, match="num_splits must be an int >= 0"):
        DecodeParams(64, 4, 3, -1)
    # decode keys carry decode=True, so a shipped dense entry is never their "nearest bucket"
    key = FLASH_ATTENTION.key(inputs)
    dense_key = FLASH_ATTENTION.key(FLASH_ATTENTION.prepare(query=k, key=k, value=v, platform="triton"))
    assert dict(key)["decode"] is True and "decode" not in dict(dense_key)
    assert bucket_distance(key, dense_key, FLASH_ATTENTION.bucketed_fields) is None


def test_explicit_and_legacy_configs(decode_calls):
    """cfg= with decode_params is used as given; a cached config without decode_params (older
    entries) runs with the heuristic's."""
    q, k, v = make_qkv(1, 1, 100, 2, 1, 16, torch.float32, DEVICE, requires_grad=False)
    ref = reference(q, k, v)[0]
    low = reference(q, k, v, dtype=torch.float32)[0]
    cfg = FlashAttentionConfig(decode_params=DecodeParams(16, 4, 1, 5))
    assert_matches("out", flash_attention(q, k, v, cfg=cfg, platform="triton"), ref, low, torch.float32)
    assert decode_calls[-1]["num_splits"] == 5 and decode_calls[-1]["kv_blocksize"] == 16
    inputs = FLASH_ATTENTION.prepare(query=q, key=k, value=v, platform="triton")
    legacy = FlashAttentionConfig.from_dict({k: v for k, v in FLASH_ATTENTION.heuristic_config(
        inputs, device_info(q.device)).to_dict().items() if k != "decode_params"})
    assert legacy.decode_params is None
    assert_matches("out", FLASH_ATTENTION.run(inputs, legacy), ref, low, torch.float32)
    assert len(decode_calls) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("shape", [(1, 1, 32768, 32, 8), (4, 4, 4099, 16, 2), (2, 16, 8192, 8, 8), (1, 9, 777, 64, 8)],
                         ids=lambda s: f"b{s[0]}-q{s[1]}-k{s[2]}-h{s[3]}/{s[4]}")
@pytest.mark.parametrize("opts", [{}, dict(causal=True), dict(causal=True, sliding_window=1024),
                                  dict(logits_soft_cap=30.0, sinks=True)], ids=lambda o: "-".join(o) or "full")
def test_gpu_decode(dtype, D, shape, opts, decode_calls):
    B, Sq, Sk, Hq, Hkv = shape
    if (Hq // Hkv) * Sq > 128:
        pytest.skip("more than 128 rows per KV head: dense kernel")
    check(B, Sq, Sk, Hq, Hkv, D, opts, dtype, device="cuda", grads=Sk <= 8192)
    assert len(decode_calls) == 1
