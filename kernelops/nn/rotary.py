"""RotaryEmbedding: rotary position embeddings (RoPE) for BSHD query/key tensors.

Channel pairs ``(x_a, x_b)`` of each head are rotated by the angle ``p * base ** (-2i / R)``
(``p`` the token's position, ``i`` the pair index, ``R`` the rotary dim). Two pairings exist in
the wild and both are supported:

* half-split (``interleaved=False``, the default; GPT-NeoX, Llama/HF checkpoints): pair ``i`` is
  channels ``(i, i + R/2)``;
* interleaved (``interleaved=True``; GPT-J, RoFormer, Meta's original Llama code): pair ``i`` is
  channels ``(2i, 2i + 1)``.

Only the first ``R`` channels of a head rotate (partial rotary, as in GPT-NeoX); the rest pass
through. The cos/sin table is built lazily, once per (device, dtype), in float64 and cast to the
inputs' dtype, and grown to the next power of two when a longer sequence arrives.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Applies RoPE to ``q [B, S, Hq, D]`` and ``k [B, S, Hkv, D]`` (or packed ``[T, H, D]``).

    Args:
        dim: rotary dim ``R`` (even, ``<= D``): the first ``R`` channels of each head rotate.
        base: the frequency base (10000 in most models, 500000 in Llama 3).
        interleaved: pair channels ``(2i, 2i+1)`` instead of ``(i, i + R/2)``.

    Holds no parameters and no state_dict entries (the table is a cache, rebuilt on demand).

    Example:
        >>> import torch
        >>> from kernelops.nn import RotaryEmbedding
        >>> rope = RotaryEmbedding(32)
        >>> q, k = torch.randn(2, 10, 4, 32), torch.randn(2, 10, 2, 32)
        >>> q2, k2 = rope(q, k)
        >>> q2.shape, k2.shape
        (torch.Size([2, 10, 4, 32]), torch.Size([2, 10, 2, 32]))
    """

    def __init__(self, dim: int, base: float = 10000.0, interleaved: bool = False):
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 2 or dim % 2:
            raise ValueError(f"rotary dim must be a positive even int, got dim={dim!r}")
        if isinstance(base, bool) or not isinstance(base, numbers.Real) or not base > 1:
            raise ValueError(f"rotary base must be a number > 1, got base={base!r}")
        self.dim, self.base, self.interleaved = int(dim), float(base), bool(interleaved)
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base:g}, interleaved={self.interleaved}"

    def _angles(self, positions: torch.Tensor) -> torch.Tensor:
        """``positions [...]`` (any numeric dtype) -> angles ``[..., R/2]`` in float64."""
        idx = torch.arange(0, self.dim, 2, dtype=torch.float64, device=positions.device)
        inv_freq = self.base ** (-idx / self.dim)
        return positions.to(torch.float64)[..., None] * inv_freq

    def cos_sin(self, seq_len: int, device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)``, each ``[seq_len, R/2]`` in ``dtype``, for positions ``0 .. seq_len-1``."""
        key = (torch.device(device), dtype)
        table = self._tables.get(key)
        if table is None or table[0].shape[0] < seq_len:
            length = max(16, 1 << max(seq_len - 1, 0).bit_length())
            angles = self._angles(torch.arange(length, device=device))
            table = (angles.cos().to(dtype), angles.sin().to(dtype))
            self._tables[key] = table
        return table[0][:seq_len], table[1][:seq_len]

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate ``x [..., S, H, D]`` by ``cos/sin [..., S, R/2]`` (broadcast over heads)."""
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [..., S, 1, R/2]
        R = self.dim
        rot, rest = x[..., :R], x[..., R:]
        if self.interleaved:
            a, b = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
        else:
            a, b = rot[..., : R // 2], rot[..., R // 2:]
            out = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
        return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out

    def forward(self, q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor | None = None):
        """Rotate query and key.

        Args:
            q: ``[B, S, Hq, D]`` or packed ``[T, Hq, D]``.
            k: ``[B, S, Hkv, D]`` or packed ``[T, Hkv, D]`` (same leading dims as ``q``).
            position_ids: integer ``[S]``, ``[B, S]`` (or ``[T]`` when packed); default
                ``0 .. S-1`` (from the cached table). Explicit positions are computed per call.

        Returns:
            ``(q_rotated, k_rotated)``, same shapes and dtypes as the inputs.
        """
        for name, t in (("q", q), ("k", k)):
            if not isinstance(t, torch.Tensor) or t.dim() not in (3, 4) or t.shape[-1] < self.dim:
                raise ValueError(f"{name} must be [B, S, H, D] or [T, H, D] with D >= rotary dim {self.dim}, "
                                 f"got {name}.shape={tuple(getattr(t, 'shape', ()))}")
        if q.shape[:-2] != k.shape[:-2]:
            raise ValueError(f"q and k must share their leading dims, got q.shape={tuple(q.shape)}, "
                             f"k.shape={tuple(k.shape)}")
        seq_len = q.shape[-3]
        if position_ids is None:
            cos, sin = self.cos_sin(seq_len, q.device, q.dtype)
        else:
            if not isinstance(position_ids, torch.Tensor) or position_ids.is_floating_point() or \
                    position_ids.dim() == 0 or position_ids.shape[-1] != seq_len or \
                    position_ids.dim() > q.dim() - 2 or \
                    (position_ids.dim() == 2 and position_ids.shape[0] not in (1, q.shape[0])):
                raise ValueError(f"position_ids must be an integer tensor [S] or [B, S] (packed: [T]) with "
                                 f"S={seq_len}, got "
                                 f"{getattr(position_ids, 'dtype', type(position_ids).__name__)} of shape "
                                 f"{tuple(getattr(position_ids, 'shape', ()))}")
            angles = self._angles(position_ids.to(q.device))
            cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        return self.rotate(q, cos, sin), self.rotate(k, cos, sin)
