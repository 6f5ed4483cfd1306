"""Helpers for launch code on the host: plain-Python integer helpers and the device guard.

``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr functions in recent Triton: callable
from Python, but each call goes through Triton's argument unwrapping (~3 us on this CPU), which
adds up on launch paths that are host-bound (decode, small calls). These are the same integer
results without that cost.

Triton launches on the *current* CUDA device and its current stream, not on the device of the
tensors it is given: a launcher called with tensors on ``cuda:1`` while ``cuda:0`` is current
fails (or, with peer access, runs on the wrong GPU). :func:`on_input_device` makes a launcher
switch to its first tensor's device for the call, as a CUDA device guard does in C++ ops.
"""

import functools
import os

import torch

#: compile option passed to every attention kernel launch: keep multiply-adds fused (FMA). It is
#: Triton's default up to 3.9, which warns that 3.10 turns it off; the kernels were tuned and
#: checked with it on (the exp2 arguments ``s * scale - m`` are one FMA each).
LAUNCH_OPTIONS = {"enable_fp_fusion": True}


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, ``b > 0``."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def cuda_capability(t: torch.Tensor) -> tuple[int, int]:
    """``(major, minor)`` of the CUDA device a tensor lives on (cached per device)."""
    return _capability(t.device.index if t.device.index is not None else torch.cuda.current_device())


def on_input_device(launcher):
    """Decorate a launcher whose first argument is a tensor: when that tensor is on a CUDA
    device other than the current one, the call runs with its device current (so its kernels
    launch there, on that device's current stream). Otherwise it is a plain call (~1 us of
    host time for the check)."""

    @functools.wraps(launcher)
    def launch(first, *args, **kwargs):
        if first.is_cuda:
            index = first.get_device()
            if index != torch.cuda.current_device():
                with torch.cuda.device(index):
                    return launcher(first, *args, **kwargs)
        return launcher(first, *args, **kwargs)

    return launch


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device, default: int) -> int:
    """Multiprocessors of ``device`` if it is a CUDA device (cached), else ``default``."""
    if device.type != "cuda":
        return default
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())
