"""Host-side TMA descriptors for the Hopper kernels (Triton's and Gluon's), built once per launch.

A BSHD tensor ``[B, S, H, D]`` whose rows of ``H * D`` elements sit at a fixed pitch reads as a
2-D row matrix (:func:`tma_row_pitch`, :func:`tma_rows_view`); :func:`descriptor` makes a
descriptor over any such view without the descriptor classes' constructor checks, which cost
~10 us a descriptor on a GPU host (the callers have checked what they check: 16-byte aligned base
and row stride, unit last stride). :func:`row_descriptor` and :func:`vector_descriptor` are the
views the attention kernels use.
"""

from __future__ import annotations

import torch


try:  # triton >= 3.3
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the pointer kernels serve every call
    TensorDescriptor = None


def tma_row_pitch(t: torch.Tensor) -> int | None:
    """Rows of ``H * D`` elements from one batch's first row to the next one's, when a BSHD tensor
    reads as rows of a 2-D matrix through its strides (unit last stride, heads side by side, rows
    that do not overlap, 16-byte aligned base and row stride, as TMA descriptors need, and a batch
    stride that is a whole number of rows, at least ``S`` of them); else None. ``S`` for a tensor
    whose batches follow each other (``[B * S, H * D]``); more for a slice ``cache[:, :S]`` of a
    longer cache."""
    B, S, H, D = t.shape
    sb, ss, sh, sd = t.stride()
    # (one row per batch, S == 1, may have a narrower positive sequence stride: the descriptor never steps it
    # within a batch, and rows of different batches are a batch pitch apart)
    if not (sd == 1 and (sh == D or H == 1) and ss > 0 and (S == 1 or ss >= (H - 1) * sh + D)
            and t.data_ptr() % 16 == 0 and (ss * t.element_size()) % 16 == 0):
        return None
    if B == 1:
        return S
    return sb // ss if sb % ss == 0 and sb >= S * ss else None


def tma_rows_view(t: torch.Tensor) -> bool:
    """Whether a BSHD tensor reads as a 2-D ``[B * S, H * D]`` matrix through its strides, 16-byte
    aligned as TMA descriptors need (base and row stride): :func:`tma_row_pitch` is ``S``."""
    return tma_row_pitch(t) == t.shape[1]


def descriptor(t: torch.Tensor, shape: list, strides: list, box, gluon: bool = True):
    """A TMA descriptor over ``t`` seen as ``shape`` with ``strides`` in ``box`` tiles: Gluon's
    (with the box's NVMMA shared layout), or without ``gluon`` Triton's ``TensorDescriptor``, made
    without the constructor's checks."""
    if gluon:
        from kernelops.kernels.common.gluon import GluonTensorDescriptor, smem_layout

        cls, fields = GluonTensorDescriptor, {"layout": smem_layout(tuple(box), t.dtype)}
    else:
        cls, fields = TensorDescriptor, {}
    desc = object.__new__(cls)
    desc.__dict__.update(base=t, shape=shape, strides=strides, block_shape=list(box), padding="zero", **fields)
    return desc


def row_descriptor(t: torch.Tensor, block_rows: int, per_sequence: bool = False, block_cols: int | None = None, *,
                   gluon: bool = True):
    """The ``[B * S, H * D]`` row view of a BSHD tensor ``t`` (checked by :func:`tma_rows_view`) in
    ``[block_rows, D]`` tiles (a Gluon descriptor; Triton's without ``gluon``); with ``per_sequence`` the 3-D ``[B, S, H * D]`` view in
    ``[1, block_rows, D]`` boxes (rows past a sequence's end read as zeros, not as the next
    sequence's); ``block_cols`` narrows the tile to that many of D's columns."""
    B, S, H, D = t.shape
    cols = D if block_cols is None else block_cols
    if per_sequence:
        return descriptor(t, [B, S, H * D], [t.stride(0), t.stride(1), 1], (1, block_rows, cols), gluon)
    return descriptor(t, [B * S, H * D], [t.stride(1), 1], (block_rows, cols), gluon)


def vector_descriptor(t: torch.Tensor, block: int):
    """A contiguous float32 tensor (the backward's lse and delta) as a 1-D Gluon TMA descriptor of
    ``block``-value boxes."""
    return descriptor(t, [t.numel()], [1], (block,))


__all__ = ["TensorDescriptor", "descriptor", "row_descriptor", "tma_row_pitch", "tma_rows_view",
           "vector_descriptor"]
