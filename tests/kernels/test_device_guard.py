"""Launchers and the autotuner run on their inputs' CUDA device, not on whichever is current.

Triton launches on the current device and stream. The CPU tests check the guard's logic with
stand-ins for a CUDA tensor and for ``torch.cuda``; the two-GPU test runs the real kernels on
``cuda:1`` while ``cuda:0`` is current and compares them with the float64 reference.
"""

import contextlib

import pytest
import torch

from kernelops.kernels.common.host import on_input_device
from kernelops.ops import Autotuner
from kernelops.ops.device import DeviceInfo
from tests.attention_checks import assert_matches, make_qkv, reference


class FakeCudaTensor:
    """What the guard reads from a tensor: ``is_cuda`` and ``get_device()``."""

    is_cuda = True

    def __init__(self, index):
        self.index = index

    def get_device(self):
        return self.index


class FakeCuda:
    """``torch.cuda.current_device`` / ``torch.cuda.device`` with a recorded current index."""

    def __init__(self, current):
        self.current = current
        self.switches = []

    def current_device(self):
        return self.current

    @contextlib.contextmanager
    def device(self, index):
        self.switches.append(index)
        before, self.current = self.current, index
        try:
            yield
        finally:
            self.current = before


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCuda(current=0)
    monkeypatch.setattr(torch.cuda, "current_device", fake.current_device)
    monkeypatch.setattr(torch.cuda, "device", fake.device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return fake


def test_launcher_runs_with_its_first_tensors_device_current(fake_cuda):
    seen = []

    @on_input_device
    def launcher(x, y, *, scale):
        seen.append((fake_cuda.current, y, scale))
        return "ran"

    assert launcher(FakeCudaTensor(1), 7, scale=0.5) == "ran"
    assert seen == [(1, 7, 0.5)] and fake_cuda.switches == [1]
    assert fake_cuda.current == 0, "the previous device is current again after the call"
    assert launcher(FakeCudaTensor(0), 8, scale=1.0) == "ran"
    assert seen[-1] == (0, 8, 1.0) and fake_cuda.switches == [1], "no switch when already current"


def test_launcher_restores_the_device_when_it_raises(fake_cuda):
    @on_input_device
    def launcher(x):
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError, match="launch failed"):
        launcher(FakeCudaTensor(3))
    assert fake_cuda.switches == [3] and fake_cuda.current == 0


def test_cpu_tensors_never_ask_for_a_cuda_device(monkeypatch):
    def refuse(*args):
        raise AssertionError("a CPU tensor must not query or switch CUDA devices")

    monkeypatch.setattr(torch.cuda, "current_device", refuse)
    monkeypatch.setattr(torch.cuda, "device", refuse)
    launcher = on_input_device(lambda x, n: x * n)
    assert torch.equal(launcher(torch.ones(3), 2), torch.full((3,), 2.0))


def test_autotuner_times_on_the_inputs_device(fake_cuda, monkeypatch):
    tuner = Autotuner(progress=False)
    seen = []
    monkeypatch.setattr(tuner, "_tune_local", lambda op, inputs, device: seen.append(fake_cuda.current) or "result")
    device = DeviceInfo("cuda", 2, "FAKE", (9, 0), 232448, 132)
    assert tuner.tune(None, None, device) == "result"
    assert seen == [2] and fake_cuda.switches == [2] and fake_cuda.current == 0
    cpu = DeviceInfo("cpu", 0, "cpu", None, 0, 0)
    assert tuner.tune(None, None, cpu) == "result"
    assert seen == [2, 0] and fake_cuda.switches == [2]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_kernels_run_on_a_device_that_is_not_current():
    from kernelops import flash_attention

    torch.cuda.set_device(0)
    dev = torch.device("cuda", 1)
    cases = [dict(shape=(2, 300, 300, 4, 2, 64), causal=True),      # prefill, GQA
             dict(shape=(2, 1, 4096, 8, 2, 128), causal=False)]     # decode-shaped (split-KV)
    for case in cases:
        B, Sq, Sk, Hq, Hkv, D = case["shape"]
        q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, D, torch.bfloat16, dev)
        out, lse = flash_attention(q, k, v, causal=case["causal"], return_lse=True)
        dout = torch.randn_like(out)
        out.backward(dout)
        assert out.device == dev and torch.cuda.current_device() == 0
        ref_out, _, ref_grads = reference(q, k, v, causal=case["causal"], dout=dout)
        low_out, _, low_grads = reference(q, k, v, causal=case["causal"], dout=dout, dtype=torch.bfloat16)
        assert_matches("out", out, ref_out, low_out, torch.bfloat16)
        for name, t, r, lo in zip(("dq", "dk", "dv"), (q, k, v), ref_grads, low_grads):
            assert_matches(name, t.grad, r, lo, torch.bfloat16)
    # packed sequences: the offsets check runs on cuda:1 too
    lens = [37, 200, 5]
    cu = torch.tensor([0, 37, 237, 242], dtype=torch.int32, device=dev)
    q = torch.randn(sum(lens), 4, 64, device=dev, dtype=torch.bfloat16)
    out = flash_attention(q, q, q, cum_seqlens_q=cu, cum_seqlens_k=cu, causal=True)
    torch.cuda.synchronize(dev)
    for i in range(3):
        s = slice(cu[i].item(), cu[i + 1].item())
        ref, _, _ = reference(q[None, s], q[None, s], q[None, s], causal=True)
        low, _, _ = reference(q[None, s], q[None, s], q[None, s], causal=True, dtype=torch.bfloat16)
        assert_matches("out", out[None, s], ref, low, torch.bfloat16)
