"""Checks of packed-sequence offsets (``cum_seqlens_q/k``) and the longest lengths they imply.

The kernels need only the offsets themselves (kernels/flash_attention/varlen.py); the longest
lengths pick the tuning key. Three ways to get them, cheapest first:

* given as ``max_seqlen_q/k``: CUDA offsets are checked by one Triton launch and an asynchronous
  assert (no host sync), CPU offsets are read;
* not given, CUDA offsets already read once (the same tensor object, unmodified: its version
  counter unchanged): the remembered lengths, with the values checked asynchronously again. A
  model passes one offsets tensor to every layer, so a step syncs once, not once per layer
  (writes that bypass the version counter, through ``.data`` or DLPack, go unseen: the lengths
  then only pick a less suited tuning bucket; the kernels never read them);
* otherwise the values are read on the host (a sync on CUDA) and checked there, with precise
  errors.

While torch.compile traces, values are never read: torch ops assert on them, and without bounds
the lengths are 0 ("unknown"; the op finds them when it runs).
"""

from __future__ import annotations

import numbers
import weakref

import torch

from kernelops.ops.keys import bucket


def check_max_seqlen(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative int or None, got {value!r}")
    return int(value)


def assert_offsets_async(name: str, cu: torch.Tensor, total: int, max_len: int | None) -> None:
    """The value checks as torch ops and an asynchronous assert (while tracing, or where the
    Triton check kernel cannot run)."""
    lens = cu[1:] - cu[:-1]
    ok = (cu[0] == 0) & (cu[-1] == total) & (lens >= 0).all()
    if max_len is not None:
        ok = ok & (lens <= max_len).all()
    torch._assert_async(ok, f"{name} must start at 0, be non-decreasing, end at the packed token count and "
                            f"hold no sequence longer than max_seqlen")


def _tokens(packed):
    """The token count of ``packed``: a packed tensor's shape ``[total_tokens, heads, head_dim]``
    (a tuple or ``torch.Size``) or the count itself (kept as given: symbolic while tracing)."""
    return packed[0] if isinstance(packed, tuple) else packed


def check_offsets_host(name: str, cu: torch.Tensor, packed, max_len: int | None) -> int:
    """Check one ``cum_seqlens`` tensor's values on the host (or, while tracing, with torch ops
    and an asynchronous assert); returns the longest length (``max_len`` when given). ``packed``:
    the shape ``[total_tokens, heads, head_dim]`` of the packed tensor the offsets index (or
    its token count)."""
    total = _tokens(packed)
    if torch.compiler.is_compiling():
        assert_offsets_async(name, cu, total, max_len)
        return 0 if max_len is None else max_len
    values = cu.tolist()
    lens = [b - a for a, b in zip(values, values[1:])]
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {name}[0]={values[0]}")
    if min(lens) < 0:
        raise ValueError(f"{name} must be non-decreasing, got {name}={values}")
    if values[-1] != total:
        tensor = "query" if name.endswith("q") else "key"
        shown = f"{tensor}.shape={tuple(packed)}" if isinstance(packed, tuple) else f"{tensor}.shape[0]={total}"
        raise ValueError(f"{name}[-1]={values[-1]} must equal the packed token count {total} ({shown})")
    if max_len is not None and max(lens) > max_len:
        raise ValueError(f"a sequence of {name} is {max(lens)} long, more than max_seqlen={max_len}")
    return max(lens) if max_len is None else max_len


class LongestLengths:
    """The longest lengths read from pairs of offset tensors, remembered by the tensors' identity
    (weak references) and version counters: an in-place change or a new tensor reads again."""

    def __init__(self, size: int = 16):
        self.size = size
        self._entries: dict[tuple[int, int], tuple] = {}

    @staticmethod
    def _versions(cu_q: torch.Tensor, cu_k: torch.Tensor) -> tuple[int, int] | None:
        try:
            return cu_q._version, cu_k._version
        except RuntimeError:  # inference tensors keep no version counter: never remembered
            return None

    def get(self, cu_q: torch.Tensor, cu_k: torch.Tensor) -> tuple[int, int] | None:
        entry = self._entries.get((id(cu_q), id(cu_k)))
        if entry is None:
            return None
        ref_q, ref_k, versions, longest = entry
        if ref_q() is not cu_q or ref_k() is not cu_k or self._versions(cu_q, cu_k) != versions:
            return None
        return longest

    def put(self, cu_q: torch.Tensor, cu_k: torch.Tensor, longest: tuple[int, int]) -> None:
        versions = self._versions(cu_q, cu_k)
        if versions is None:
            return
        if len(self._entries) >= self.size:
            self._entries.clear()
        self._entries[(id(cu_q), id(cu_k))] = (weakref.ref(cu_q), weakref.ref(cu_k), versions, longest)


LONGEST = LongestLengths()


def check_offset_values(cum_seqlens_q: torch.Tensor, cum_seqlens_k: torch.Tensor, packed_q, packed_k,
                        max_q: int | None, max_k: int | None) -> tuple[int, int]:
    """Check both offset tensors' values (the executor's hot path repeats only this); returns
    the longest query and key lengths (the bounds when given). See the module docstring.

    ``packed_q`` / ``packed_k``: the shapes ``[total_tokens, heads, head_dim]`` of the packed
    query and key (errors show them), or just their token counts."""
    device_side = cum_seqlens_q.is_cuda and not torch.compiler.is_compiling()
    if device_side:
        from kernelops.kernels.flash_attention.varlen import check_offsets as check_on_device

        longest = (max_q, max_k) if max_q is not None else LONGEST.get(cum_seqlens_q, cum_seqlens_k)
        if longest is not None:
            total_q, total_k = _tokens(packed_q), _tokens(packed_k)
            try:
                check_on_device(cum_seqlens_q, cum_seqlens_k, total_q, total_k, max_q, max_k)  # one launch, no sync
            except Exception:  # noqa: BLE001 - a GPU Triton cannot compile for: the same checks as torch ops
                assert_offsets_async("cum_seqlens_q", cum_seqlens_q, total_q, max_q)
                assert_offsets_async("cum_seqlens_k", cum_seqlens_k, total_k, max_k)
            return longest
    longest = (check_offsets_host("cum_seqlens_q", cum_seqlens_q, packed_q, max_q),
               check_offsets_host("cum_seqlens_k", cum_seqlens_k, packed_k, max_k))
    if max_q is None and device_side:
        LONGEST.put(cum_seqlens_q, cum_seqlens_k, longest)
    return longest


def packed_signature(cum_seqlens_q, cum_seqlens_k, max_seqlen_q, max_seqlen_k):
    """The packed part of ``FlashAttention.signature``: None for dense calls, False when the
    call must take the full path (offsets not plain tensors, one bound without the other, or no
    bounds and offsets not remembered: :data:`LONGEST`). Offsets read before (the same tensors,
    unmodified) stand for their remembered longest lengths, so a model that passes one offsets
    tensor to every layer without bounds takes the hot path from the second layer on."""
    if cum_seqlens_q is None and cum_seqlens_k is None and max_seqlen_q is None and max_seqlen_k is None:
        return None
    if type(cum_seqlens_q) is not torch.Tensor or type(cum_seqlens_k) is not torch.Tensor:
        return False
    if max_seqlen_q is None and max_seqlen_k is None:
        longest = LONGEST.get(cum_seqlens_q, cum_seqlens_k)  # (only CUDA offsets are remembered)
        if longest is None:
            return False
        max_seqlen_q, max_seqlen_k = longest
    elif type(max_seqlen_q) is not int or type(max_seqlen_k) is not int or min(max_seqlen_q, max_seqlen_k) < 0:
        return False
    # the bounds by tuning bucket (the config depends on nothing finer), so a new longest
    # sequence each step reuses the launcher; the launcher checks the call's own bounds
    return (cum_seqlens_q.shape, cum_seqlens_q.dtype, cum_seqlens_q.device, cum_seqlens_k.shape, cum_seqlens_k.dtype,
            cum_seqlens_k.device, bucket(max_seqlen_q), bucket(max_seqlen_k))
