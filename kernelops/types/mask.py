"""MaskInfo: a user-facing description of which keys each query may attend.

A MaskInfo holds either segment ids (packed documents: a query attends only keys of its own
segment) or a boolean attention mask, never both materialised. ``to_dense`` expands it to a
boolean ``[B, 1 or H, Sq, Sk]`` mask for the plain-torch paths and tests. (Kernel-side:
``flash_attention(mask_info=...)`` applies segment ids inside the kernels and a boolean mask as
an additive bias.)
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class MaskInfo:
    """Segment ids ``q_segment_ids [B, Sq]`` / ``kv_segment_ids [B, Sk]`` (int), or a boolean
    ``attention_mask [B, 1 or H, Sq, Sk]`` (True = may attend)."""

    q_segment_ids: torch.Tensor | None = None
    kv_segment_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None

    def __post_init__(self):
        has_segments = self.q_segment_ids is not None or self.kv_segment_ids is not None
        if has_segments == (self.attention_mask is not None):
            raise ValueError("MaskInfo needs exactly one of: segment ids, or attention_mask")
        if has_segments:
            for name in ("q_segment_ids", "kv_segment_ids"):
                t = getattr(self, name)
                if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.is_floating_point() or t.dtype == torch.bool:
                    shape = tuple(t.shape) if isinstance(t, torch.Tensor) else None
                    raise ValueError(f"MaskInfo.{name} must be an integer tensor [batch, seq], got shape={shape}, "
                                     f"type={type(t).__name__}")
            if self.q_segment_ids.shape[0] != self.kv_segment_ids.shape[0]:
                raise ValueError(f"segment id batch sizes differ: {self.q_segment_ids.shape=}, "
                                 f"{self.kv_segment_ids.shape=}")
        else:
            m = self.attention_mask
            if not isinstance(m, torch.Tensor) or m.dtype != torch.bool or m.dim() != 4:
                raise ValueError(f"MaskInfo.attention_mask must be a bool tensor [B, 1 or H, Sq, Sk], got "
                                 f"{getattr(m, 'dtype', type(m).__name__)} of shape {tuple(getattr(m, 'shape', ()))}")

    @classmethod
    def from_segments(cls, segment_ids: torch.Tensor, kv_segment_ids: torch.Tensor | None = None) -> "MaskInfo":
        """Packed sequences: ``segment_ids [B, S]`` (and optionally separate ``kv_segment_ids [B, Sk]``)."""
        return cls(q_segment_ids=segment_ids, kv_segment_ids=segment_ids if kv_segment_ids is None else kv_segment_ids)

    @classmethod
    def from_attention_mask(cls, mask: torch.Tensor, seq_q: int | None = None) -> "MaskInfo":
        """``[B, S]`` padding mask (True/1 = real token) or ``[B, 1 or H, Sq, Sk]`` boolean mask.

        A padding mask masks padded keys for every query (``seq_q`` rows; default S). It is kept
        as segment ids (every query id 1, each key its 0/1 flag), so kernels apply it from
        ``[B, S]`` ids instead of a materialised ``Sq x Sk`` mask.
        """
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
        if mask.dim() == 2:
            keys = mask.bool().to(torch.int32)
            rows = keys.shape[1] if seq_q is None else seq_q
            return cls(q_segment_ids=torch.ones(keys.shape[0], rows, dtype=torch.int32, device=mask.device),
                       kv_segment_ids=keys)
        if mask.dim() == 4:
            return cls(attention_mask=mask if mask.dtype == torch.bool else mask.bool())
        raise ValueError(f"mask must be [B, S] or [B, 1 or H, Sq, Sk], got mask.shape={tuple(mask.shape)}")

    def to_dense(self) -> torch.Tensor:
        """Boolean ``[B, 1 or H, Sq, Sk]``: True where the query may attend the key."""
        if self.attention_mask is not None:
            return self.attention_mask
        return (self.q_segment_ids[:, None, :, None] == self.kv_segment_ids[:, None, None, :])
