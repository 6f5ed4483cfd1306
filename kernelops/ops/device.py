"""Device identity: normalised name, compute capability, shared-memory limit, versions."""

from __future__ import annotations

import dataclasses
import functools

import torch


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """What the executor needs to know about the device a call runs on.

    ``name`` is the normalised device name used for shipped cache folders
    (``torch.cuda.get_device_name()`` with spaces as ``_``, e.g. ``NVIDIA_H100_80GB_HBM3``), or
    ``"cpu"``. ``smem_bytes`` is the most shared memory one program may use (opt-in limit).
    """

    type: str
    index: int
    name: str
    capability: tuple[int, int] | None
    smem_bytes: int
    num_sms: int

    @property
    def is_cuda(self) -> bool:
        return self.type == "cuda"

    @property
    def key(self) -> str:
        cap = "" if self.capability is None else f"sm{self.capability[0]}{self.capability[1]}"
        return f"{self.name}:{cap}" if cap else self.name


def normalize_device_name(name: str) -> str:
    return "_".join(name.strip().split())


# Shared-memory budget assumed for the Triton interpreter on CPU: a Hopper-sized limit, so the
# same pruning code runs; the interpreter itself has no such limit.
_CPU_SMEM = 227 * 1024


@functools.lru_cache(maxsize=None)
def _device_info(type_: str, index: int) -> DeviceInfo:
    if type_ != "cuda":
        return DeviceInfo(type_, index, type_, None, _CPU_SMEM, 1)
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or 0
    if not smem:
        try:
            import triton

            smem = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
        except Exception:  # noqa: BLE001 - any failure: fall back to the common 48 KiB limit
            smem = 48 * 1024
    return DeviceInfo(
        "cuda",
        index,
        normalize_device_name(torch.cuda.get_device_name(index)),
        (props.major, props.minor),
        int(smem),
        int(props.multi_processor_count),
    )


def device_info(device: torch.device | str | None = None) -> DeviceInfo:
    """DeviceInfo for a tensor's device (``None``: the current CUDA device, else CPU)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return _device_info(device.type, index or 0)


@functools.lru_cache(maxsize=None)
def versions() -> dict[str, str]:
    """Versions that invalidate tuned entries: kernelops, torch, triton."""
    from kernelops.version import __version__

    try:  # the installed distribution's version, without importing triton (a torch-platform call needs none)
        from importlib.metadata import PackageNotFoundError, version

        triton_version = version("triton")
    except PackageNotFoundError:  # pragma: no cover - triton is a dependency
        try:
            import triton

            triton_version = triton.__version__
        except ImportError:
            triton_version = "none"
    return {"kernelops": __version__, "torch": torch.__version__, "triton": triton_version}
