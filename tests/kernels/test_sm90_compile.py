"""Every kernel launcher compiles for sm_90 (Hopper) with the installed Triton, on a machine
without a GPU: CI's interpreter runs never build PTX, so a Triton upgrade that breaks the GPU
compile path (or a kernel that stops using the tensor cores / TMA there) shows up here.

A child process (without TRITON_INTERPRET) runs each launcher on CPU tensors with the offline
driver of tests/kernels/offline_compile.py: kernels compile, nothing launches."""

import json
import os
import subprocess
import sys

import pytest

from kernelops.kernels.common.gluon import GLUON
from tests.conftest import HAS_CUDA

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TENSOR_CORE_KERNELS = ["fwd.flash_attention_fwd_kernel", "fwd_tma.flash_attention_fwd_tma_kernel",
                       "bwd.flash_attention_bwd_dkdv_kernel", "bwd.flash_attention_bwd_dq_kernel"]
OTHER_KERNELS = ["bwd._bwd_preprocess_kernel", "decode.decode_split_kernel", "decode.decode_combine_kernel",
                 "varlen._check_offsets_kernel", "dropout._keep_mask_kernel"]


def compile_group(group: str) -> dict:
    """The kernels one group of launchers compiled to, from the child process (``sm90_compile_child``)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, "-m", "tests.kernels.sm90_compile_child", group], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["errors"] == [], report["errors"]
    return report["kernels"]


def check_triton(kernels):
    missing = [name for name in TENSOR_CORE_KERNELS + OTHER_KERNELS if name not in kernels]
    assert not missing, f"not compiled: {missing}"
    for name in TENSOR_CORE_KERNELS:
        assert kernels[name]["wgmma"], f"{name} does not use Hopper's warpgroup MMA on sm_90"
    assert kernels["fwd_tma.flash_attention_fwd_tma_kernel"]["tma"], "the TMA forward issues no TMA copy"
    assert kernels["fwd.flash_attention_fwd_kernel"]["variants"] == 3  # causal, window + all terms, packed
    split = kernels["decode.decode_split_kernel"]  # TMA reads with a dependent combine; pointers; both balanced
    assert split["variants"] == 6 and split["tma"]  # (balanced: the query rows read per block and per pair), "the decode kernel issues no TMA copy"
    combine = kernels["decode.decode_combine_kernel"]  # a programmatic dependent launch, and not; both balanced
    assert split["gdc"] and combine["gdc"] and combine["variants"] == 4, "no grid dependency control in decode"
    assert not any(r["local_bytes"] for r in split["resources"]), "ptxas spilled the decode kernel's registers"


def check_fwd_ws(kernels, variants):
    """The warp-specialised forward: TMA copies, asynchronous warpgroup MMAs left asynchronous."""
    ws = kernels["fwd_ws.flash_attention_fwd_ws_kernel"]
    assert ws["variants"] == variants and ws["wgmma"] and ws["tma"]
    assert not any(r["local_bytes"] for r in ws["resources"]), "ptxas spilled the ws kernel's registers"
    assert not any(r["wgmma_serialized"] for r in ws["resources"]), "ptxas serialised the ws kernel's MMAs"


def check_bwd_ws(kernels):
    dkdv = kernels["bwd_ws.dkdv_ws_kernel"]  # causal, full, causal with a window, q32 pingpong
    assert dkdv["variants"] == 4 and dkdv["wgmma"] and dkdv["tma"]
    assert not any(r["wgmma_serialized"] for r in dkdv["resources"]), "ptxas serialised the dK/dV MMAs"
    # the same three bands, causal split, packed causal and full, packed with two offsets tensors,
    # packed with a window; soft caps: causal, packed with a window; D=64 causal with 128-query blocks
    fused = kernels["bwd_fused.flash_attention_bwd_fused_kernel"]
    assert fused["variants"] == 12 and fused["wgmma"] and fused["tma"]
    assert not any(r["wgmma_serialized"] for r in fused["resources"]), "ptxas serialised the fused MMAs"
    # D=256: the same three bands, causal split, packed causal and full, packed with two offsets
    # tensors, packed with a window; soft caps: causal, packed with two offsets tensors
    d256 = kernels["bwd_d256.flash_attention_bwd_d256_kernel"]
    assert d256["variants"] == 10 and d256["wgmma"] and d256["tma"]
    assert not any(r["local_bytes"] for r in d256["resources"]), "ptxas spilled the D=256 backward's registers"
    assert not any(r["wgmma_serialized"] for r in d256["resources"]), "ptxas serialised the D=256 MMAs"


@pytest.mark.skipif(HAS_CUDA, reason="with a GPU the kernels compile (and run) in the GPU tests")
@pytest.mark.parametrize("group", ["triton", "fwd_ws", "fwd_ws_more", "bwd_ws"])
def test_every_launcher_compiles_for_sm90(group):
    """Each group compiles in a child process of its own, so parallel workers share the compiles."""
    if group != "triton" and not GLUON:
        pytest.skip("this Triton has no Gluon: the warp-specialised kernels are not built")
    kernels = compile_group(group)
    if group == "triton":
        check_triton(kernels)
    elif group == "fwd_ws":
        # causal, full, ragged; packed causal, full, D=256 and two offsets tensors (D=128, D=256);
        # a causal window (CAUSAL == 2): D=128, ragged, packed with one and two offsets tensors;
        # soft caps: D=128 causal and windowed, packed windowed with two offsets tensors
        check_fwd_ws(kernels, 15)
        assert "varlen._ws_schedule_kernel" in kernels, "the packed schedule kernel did not compile"
    elif group == "fwd_ws_more":
        # D=256 and three consumers (D=64): causal, full, ragged, a window, a capped window; FP8 (e4m3):
        # D=128 causal, full, ragged, D=64 three consumers, D=256, float32 O
        check_fwd_ws(kernels, 16)
    else:
        check_bwd_ws(kernels)
