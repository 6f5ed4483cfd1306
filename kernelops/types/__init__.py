"""User-facing value types."""

from kernelops.types.mask import MaskInfo

__all__ = ["MaskInfo"]
