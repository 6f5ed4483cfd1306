"""flash_attention's key, heuristic and candidate space: bucketing and shared-memory fitting."""

import pytest
import torch

from kernelops import BwdParams, FlashAttentionConfig, FwdParams
from kernelops.modules.flash_attention import FLASH_ATTENTION as OP
from kernelops.ops.device import DeviceInfo

H100 = DeviceInfo("cuda", 0, "NVIDIA_H100_80GB_HBM3", (9, 0), 232448, 132)


def _inputs(Sq, Sk, D=128, dtype=torch.bfloat16, **kw):
    q = torch.empty(2, Sq, 8, D, dtype=dtype, device="meta")
    kv = torch.empty(2, Sk, 2, D, dtype=dtype, device="meta")
    return OP.prepare(query=q, key=kv, value=kv, **kw)


def test_key_buckets_lengths_and_keeps_static_flags():
    a = dict(OP.key(_inputs(1000, 3000, causal=True, sliding_window=(100, None))))
    assert a["seq_q"] == 1024 and a["seq_k"] == 4096 and a["gqa"] == 4 and a["head_dim"] == 128
    assert a["causal"] is True and a["window"] == "128:1" and a["dtype"] == "bfloat16"  # causal: right = 0
    assert OP.key(_inputs(1000, 3000)) == OP.key(_inputs(513, 2049))        # same buckets
    assert OP.key(_inputs(1000, 3000)) != OP.key(_inputs(1000, 3000, D=96))  # exact head dim
    assert OP.key(_inputs(1000, 3000)) != OP.key(_inputs(1000, 3000, causal=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("D", [32, 64, 96, 128, 160, 256])
def test_heuristic_and_candidates_fit_shared_memory(D, dtype):
    inputs = _inputs(4096, 4096, D=D, dtype=dtype)
    heuristic = OP.heuristic_config(inputs, H100)
    assert OP.smem_bytes(heuristic, inputs) <= H100.smem_bytes
    for phase in ("fwd", "bwd"):
        space = OP.candidate_params(inputs, H100, phase)
        assert space, f"empty {phase} space for D={D} {dtype}"
        assert len(space) == len(set(space))
        for p in space:
            assert OP.smem_bytes(OP.with_params(heuristic, phase, p), inputs) <= H100.smem_bytes
    decode_inputs = _inputs(16, 4096, D=D, dtype=dtype)  # Sq <= 16: the split-KV kernel
    heuristic = OP.heuristic_config(decode_inputs, H100)
    assert OP.smem_bytes(heuristic, decode_inputs) <= H100.smem_bytes
    space = OP.candidate_params(decode_inputs, H100, "decode")
    assert space and len(space) == len(set(space))
    for p in space:
        assert OP.smem_bytes(OP.with_params(heuristic, "decode", p), decode_inputs) <= H100.smem_bytes


def test_heuristic_is_constant_within_a_bucket():
    """5000 and 8192 keys share a bucket, so they must share tiles (the heuristic may be memoised)."""
    assert OP.heuristic_config(_inputs(8192, 5000), H100) == OP.heuristic_config(_inputs(8192, 8192), H100)


def test_explicit_config_is_validated_before_launch():
    inputs = _inputs(1024, 1024)
    with pytest.raises(ValueError, match="at least 16"):
        OP.complete_config(FlashAttentionConfig(FwdParams(8, 64, 4, 2)), inputs, H100)
    with pytest.raises(ValueError, match="shared memory"):
        OP.complete_config(FlashAttentionConfig(FwdParams(256, 256, 8, 4), BwdParams()), inputs, H100)
