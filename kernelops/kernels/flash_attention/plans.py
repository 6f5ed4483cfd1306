"""Forward and backward launches bound once per call signature (host time of short calls).

A training step calls attention with tensors of the same shapes, strides, dtypes and device every
time, and everything the launchers work out besides the tensors (which kernels take the call,
grids, strides, constexprs, the Gluon descriptors' boxes) follows from those. On H200
hosts that work and Triton's per-launch argument handling cost 100-200 us per forward and 250-450
us per backward (``benchmarks/host_time.py``), more than the kernels run at 512-1k keys.

A plan is kept per signature and taken by calls whose tensors are BSHD, 16-byte aligned, with a
unit last stride:

- :func:`fwd_ws_plan`: the warp-specialised forward (:mod:`fwd_ws`), outputs not preallocated;
- :func:`bwd_plan`: the backward without extra score terms, dropout, soft cap, packed sequences
  or preallocated gradients, on any of its three paths (fused Gluon, Gluon dK/dV with the Triton
  dQ kernel, Triton dK/dV and dQ);
- :func:`ptr_fwd_plan`: the Triton pointer forward (:mod:`fwd`) without extra score terms or
  dropout, dense or packed, outputs not preallocated (the small calls under the warp-specialised
  kernels' FLOP floor);
- :func:`decode_plan`: the split-KV decode forward (:mod:`decode`), outputs not preallocated
  (eager decode steps: microseconds of kernels at 4k-32k keys);
- :func:`packed_fwd_plan` and :func:`packed_bwd_plan`: packed sequences on the warp-specialised
  forward and the fused backward (:func:`fwd_ws.flash_attention_fwd_ws_packed`, ``backward.ws_mode``'s
  packed case), schedule launches included. The signature holds the offsets tensor's shape (the
  sequence count), which with the token count fixes every launch argument; the offsets' values
  may change from call to call (the kernels read them).

A plan's first call launches through the same builders as the general path
(:func:`fwd_ws.fwd_ws_launch`, :func:`backward.bwd_launches`) and binds each launch (:class:`kernels.common.launch.BoundLaunch`);
later calls allocate the outputs and repeat the bound launches over the new tensors.
"""

from __future__ import annotations


import torch

from kernelops.kernels.common.host import on_input_device
from kernelops.kernels.flash_attention import backward, bwd, bwd_fused, decode, fwd, fwd_ws, smem, varlen, ws_common

#: plans kept (each table) before the table is dropped (a signature per shape, dtype and config)
MAX_PLANS = 256
_PLANS: dict[tuple, BwdPlan | PackedBwdPlan | bool] = {}
_FWD_PLANS: dict[tuple, FwdWsPlan | PackedFwdPlan | PtrFwdPlan | bool] = {}


def _keep(table: dict, key: tuple, plan):
    if len(table) >= MAX_PLANS:
        table.clear()
    table[key] = plan
    return plan


def _launch(plan, tensors: tuple, launches) -> None:
    """A plan's launches over ``tensors``: on its first call those ``launches()`` builds, each bound
    (:meth:`DirectLaunch.bind`, every tensor 16-byte aligned as the plans require); later, the bound
    ones again."""
    if plan._bound is None:
        plan._bound = [kernel.bind(grid, args, meta, tensors, aligned=True) for kernel, grid, args, meta in launches()]
    else:
        for launch in plan._bound:
            launch(*tensors)


class FwdWsPlan:
    """The warp-specialised forward of one call signature: ``plan(q, k, v)`` returns ``(out, lse)``
    as :func:`fwd_ws.flash_attention_fwd_ws` does (``window``: its sliding window, or None;
    ``softcap``: its soft cap, or None)."""

    def __init__(self, softmax_scale: float, causal: bool, dense: bool, window: int | None = None,
                 softcap: float | None = None):
        self.softmax_scale, self.causal, self.dense, self.window = softmax_scale, causal, dense, window
        self.softcap = softcap
        self._bound = None

    def __call__(self, q, k, v):
        B, S, Hq, D = q.shape
        out = _empty(q, self.dense)
        lse = q.new_empty((B, Hq, S), dtype=torch.float32)
        _launch(self, (q, k, v, out, lse),
                lambda: [fwd_ws.fwd_ws_launch(q, k, v, out, lse, self.softmax_scale, self.causal, window=self.window,
                                              softcap=self.softcap)])
        return out, lse


@on_input_device
def run_on_device(q, plan, *tensors):
    """``plan(q, *tensors)`` with q's CUDA device current (its launches go there)."""
    return plan(q, *tensors)


def fwd_ws_plan(q, k, v, softmax_scale: float, win_left: int, win_right: int,
                softcap: float | None = None) -> FwdWsPlan | None:
    """The plan of this forward's signature (made on first use), or None when the warp-specialised
    forward does not take it (:func:`ws_common.ws_call_band`) or a tensor is not 16-byte aligned."""
    if q.dim() != 4 or not q.is_cuda or not _aligned(q, k, v):
        return None
    key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device,
           softmax_scale, win_left, win_right, softcap, _aliases(q, k, v))
    plan = _FWD_PLANS.get(key)
    if plan is None:  # False: the kernel does not take the signature (alignment aside)
        band = ws_common.ws_call_band(q, k, v, softmax_scale, win_left, win_right)
        plan = _keep(_FWD_PLANS, key, False if band is None else FwdWsPlan(softmax_scale, band[0], q.is_contiguous(),
                                                                          band[1], softcap))
    return plan or None


#: :func:`fwd.fwd_launch`'s keywords a pointer-forward plan fixes, in the order of :func:`ptr_scalars`
PTR_SCALARS = ("softmax_scale", "win_left", "win_right", "softcap", "q_blocksize", "kv_blocksize", "num_warps",
               "num_stages")


def ptr_scalars(kwargs: dict) -> tuple:
    """The values of :data:`PTR_SCALARS` in ``kwargs`` (a pointer forward's keywords): the part of a
    :class:`PtrFwdPlan`'s signature that is neither tensor nor layout."""
    return tuple(kwargs[n] for n in PTR_SCALARS)


class PtrFwdPlan:
    """The Triton pointer forward (:func:`fwd.flash_attention_fwd`) of one call signature without
    extra score terms or dropout, dense or packed: ``plan(q, k, v, cu_q, cu_k)`` returns
    ``(out, lse)`` as that function does (``cu_q`` / ``cu_k`` None when dense). The calls a config
    sends to the pointer kernel are the small ones (under the warp-specialised kernels' FLOP floor)
    and the ones the other kernels do not take, so their host time is most of their time."""

    def __init__(self, scalars: tuple, dense: bool, packed: bool):
        self.scalars, self.dense, self.packed = dict(zip(PTR_SCALARS, scalars)), dense, packed
        self._bound = None

    def __call__(self, q, k, v, cu_q=None, cu_k=None):
        out = _empty(q, self.dense)
        if self.packed:
            lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
            views = (q[None], k[None], v[None], out[None])
            tensors = (q, k, v, out, lse, cu_q, cu_k) + views
        else:
            B, S, Hq, _ = q.shape
            lse = q.new_empty((B, Hq, S), dtype=torch.float32)
            views = None
            tensors = (q, k, v, out, lse)
        _launch(self, tensors, lambda: [fwd.fwd_launch(q, k, v, out, lse, **self.scalars, cum_seqlens_q=cu_q,
                                                       cum_seqlens_k=cu_k, views=views)])
        return out, lse


def ptr_fwd_plan(q, k, v, cu_q, cu_k, scalars: tuple) -> PtrFwdPlan | None:
    """The plan of this pointer forward's signature (made on first use), or None when a plan does
    not take the call: not CUDA, a tensor (or offsets tensor) not 16-byte aligned or without a unit
    last stride, offsets not contiguous, or nothing to compute. ``scalars``: the band, scale, soft
    cap and tiles (:func:`ptr_scalars`); the caller has checked the rest (no extra terms or
    dropout, outputs not preallocated)."""
    if not q.is_cuda or not q.numel() or not _aligned(q, k, v, cu_q, cu_k):
        return None
    packed = cu_q is not None
    if packed and (q.dim() != 3 or not cu_q.is_contiguous() or not cu_k.is_contiguous()):
        return None
    key = ("pointer", q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
           q.device, scalars, _aliases(q, k, v, cu_q, cu_k),
           *((cu_q.shape, cu_q.dtype, cu_q.device, cu_k.shape, cu_k.dtype, cu_k.device) if packed else ()))
    plan = _FWD_PLANS.get(key)
    if plan is None:
        ok = q.dtype == k.dtype == v.dtype and (q.dim() == 3 if packed else q.dim() == 4) and k.numel() > 0
        plan = _keep(_FWD_PLANS, key, PtrFwdPlan(scalars, q.is_contiguous(), packed) if ok else False)
    return plan or None


class DecodePlan:
    """The split-KV decode forward (:func:`dispatch.flash_attention_decode`) of one call signature:
    ``plan(q, k, v, softmax_aux)`` returns ``(out, lse)`` as that function does. The split count,
    the workspace's shapes and both launches follow from the signature (``tiles``: the band,
    scale, soft cap and tiles; ``num_splits``: as asked, 0 for the rule)."""

    def __init__(self, q, k, num_splits: int, tiles: dict, dense: bool):
        self.tiles, self.dense = tiles, dense
        self.splits = decode.decode_splits(q, k, tiles["win_left"], tiles["win_right"], tiles["kv_blocksize"],
                                           num_splits, tiles["num_stages"])
        self.shapes = decode.workspace_shapes(q, k, self.splits[2])
        self.lse_shape = (q.shape[0], q.shape[2], q.shape[1])
        self._bound = None

    def __call__(self, q, k, v, softmax_aux=None):
        out = _empty(q, self.dense)
        lse = q.new_empty(self.lse_shape, dtype=torch.float32)
        o_part, l_part = (q, lse) if self.shapes is None else (q.new_empty(s, dtype=torch.float32) for s in self.shapes)
        sink = q if softmax_aux is None else softmax_aux
        _launch(self, (q, k, v, out, lse, o_part, l_part, sink),
                lambda: decode.decode_launches(q, k, v, out, lse, o_part, l_part, sink, **self.tiles, splits=self.splits,
                                               has_sink=softmax_aux is not None))
        return out, lse


def decode_plan(q, k, v, softmax_aux, num_splits: int, tiles: dict) -> DecodePlan | None:
    """The plan of this decode call's signature (made on first use), or None when a plan does not
    take it: not BSHD, a tensor not 16-byte aligned or without a unit last stride (sink
    logits: not contiguous), nothing to compute, or more query rows per KV head than the decode
    kernel takes (the general path raises)."""
    if q.dim() != 4 or not q.numel() or not k.shape[1] or not _aligned(q, k, v):
        return None
    if softmax_aux is not None and not (softmax_aux.is_contiguous() and _aligned(softmax_aux)):
        return None
    key = ("decode", q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
           q.device, num_splits, *tiles.values(), *decode.plan_thresholds(), _aliases(q, k, v, softmax_aux),
           None if softmax_aux is None else (softmax_aux.shape, softmax_aux.dtype, softmax_aux.device))
    plan = _FWD_PLANS.get(key)
    if plan is None:
        ok = q.dtype == k.dtype == v.dtype and smem.decode_rows(q, k) <= smem.MAX_DECODE_ROWS
        plan = _keep(_FWD_PLANS, key, DecodePlan(q, k, num_splits, tiles, q.is_contiguous()) if ok else False)
    return plan or None


class BwdPlan:
    """The backward of one call signature: ``plan(q, k, v, out, dout, lse, dlse)`` returns
    ``(dq, dk, dv, None, None)`` as :func:`dispatch.flash_attention_bwd` does. ``mode`` and ``band``:
    :func:`backward.ws_mode`'s choice; ``tiles``: the Triton kernels' keyword arguments."""

    def __init__(self, mode: int, band, softmax_scale: float, win_left: int, win_right: int, tiles: dict,
                 dense: tuple[bool, bool, bool]):
        self.mode, self.band, self.softmax_scale, self.tiles = mode, band, softmax_scale, tiles
        self.win_left, self.win_right, self.dense = win_left, win_right, dense
        self._bound = None

    def __call__(self, q, k, v, out, dout, lse, dlse):
        dense_q, dense_k, dense_v = self.dense
        dq, dk, dv = _empty(q, dense_q), _empty(k, dense_k), _empty(v, dense_v)
        delta = torch.empty_like(lse)  # lse: contiguous float32 (bwd_plan's condition)
        dq_acc = _empty(q, dense_q, torch.float32) if self.mode == 2 else None
        dkv_acc = backward.dkv_workspace(q, k, *self.band) if self.mode == 2 else None  # long GQA: float32 dK, dV sums
        dk_into, dv_into = (dk, dv) if dkv_acc is None else dkv_acc.unbind(0)
        _launch(self, (q, k, v, out, dout, lse, dlse, delta, dq, dk_into, dv_into, dq_acc), lambda: backward.bwd_launches(
            self.mode, self.band, q, k, v, out, dout, lse, dlse, delta, dq_acc, dq, dk_into, dv_into, (None,) * 5,
            softmax_scale=self.softmax_scale, win_left=self.win_left, win_right=self.win_right, softcap=None,
            **self.tiles))
        if dq_acc is not None:
            bwd_fused.copy_workspaces(dq_acc, dkv_acc, dq, dk, dv)
        return dq, dk, dv, None, None


def _empty(like, dense: bool, dtype=None):
    """A contiguous tensor of ``like``'s shape (and dtype unless given) on its device:
    ``empty_like`` when ``like`` is contiguous (``dense``, fixed by the plan's signature), the
    cheaper call on H200 hosts (~2 us against ~4 for ``torch.empty``)."""
    if dense:
        return torch.empty_like(like, dtype=dtype)
    return torch.empty(like.shape, dtype=like.dtype if dtype is None else dtype, device=like.device)


def _aliases(*tensors) -> tuple:
    """Which of ``tensors`` are one object (``k is v``; the pointer plan's offsets, one tensor for
    both sides): empty when none are, else each one's first position. Part of every plan's key: a
    bound launch maps its arguments to the call's tensors by position, so a plan bound where two
    arguments were one tensor would read that one for both on a later call that passes two. (The
    packed ws plans bind the keys' offsets only when they differ from the queries',
    :func:`_offsets_key`.)"""
    ids = [id(t) for t in tensors if t is not None]
    if len(set(ids)) == len(ids):
        return ()
    return tuple(next(j for j, u in enumerate(tensors) if u is t) for t in tensors)


def _aligned(*tensors) -> bool:
    return all(t is None or (t.data_ptr() % 16 == 0 and t.stride(-1) == 1) for t in tensors)


def bwd_plan(q, k, v, out, dout, lse, dlse, softmax_scale: float, win_left: int, win_right: int, q_blocksize: int,
             kv_blocksize: int, num_warps: int, num_stages: int, ws: bool, fused: bool) -> BwdPlan | None:
    """The plan of this call's signature (made on first use), or None when the call is not one a
    plan takes: BSHD tensors with a unit last stride, 16-byte aligned, nothing empty, lse (and
    dlse, if given) contiguous ``[B, Hq, Sq]``. The caller has checked the rest (no extra terms,
    dropout, soft cap, packed sequences or preallocated gradients)."""
    if q.dim() != 4 or not q.numel() or not k.numel() or not _aligned(q, k, v, out, dout, lse, dlse):
        return None
    if not lse.is_contiguous() or (dlse is not None and not dlse.is_contiguous()):
        return None
    key = (q.shape, k.shape, v.shape, out.shape, dout.shape, lse.shape, q.stride(), k.stride(), v.stride(),
           out.stride(), dout.stride(), None if dlse is None else dlse.shape, q.dtype, k.dtype, v.dtype, out.dtype,
           dout.dtype, q.device, softmax_scale, win_left, win_right, q_blocksize, kv_blocksize, num_warps, num_stages,
           ws, fused, _aliases(q, k, v, out, dout, lse, dlse))
    plan = _PLANS.get(key)
    if plan is None:
        B, Sq, Hq, _ = q.shape
        if lse.shape != (B, Hq, Sq) or (dlse is not None and dlse.shape != lse.shape):
            return None
        if not q.dtype == k.dtype == v.dtype == out.dtype == dout.dtype:
            return None  # the general path says what is wrong
        # the support check reads dk/dv as k (the plan allocates them contiguous, like k's dtype)
        mode, band = backward.ws_mode(q, k, v, dout, k, k, win_left, win_right, None, (None,) * 5, 0.0, False, fused) \
            if ws else (0, None)
        tiles = dict(q_blocksize=q_blocksize, kv_blocksize=kv_blocksize, num_warps=num_warps, num_stages=num_stages)
        dense = (q.is_contiguous(), k.is_contiguous(), v.is_contiguous())
        plan = _keep(_PLANS, key, BwdPlan(mode, band, softmax_scale, win_left, win_right, tiles, dense))
    return plan


def _offsets_key(cu, cu_k) -> tuple:
    """The offsets' part of a packed plan's signature, ``(two, *layouts)``: ``two`` whether the keys
    have a tensor of their own (:func:`ws_common.same_offsets`), then each tensor's shape, stride,
    dtype and device (the keys' only when two)."""
    two = not ws_common.same_offsets(cu, cu_k)
    key = (two, cu.shape, cu.stride(), cu.dtype, cu.device)
    return key + (cu_k.shape, cu_k.stride(), cu_k.dtype, cu_k.device) if two else key


class PackedFwdPlan:
    """The packed warp-specialised forward of one call signature: ``plan(q, k, v, cum_seqlens,
    cum_seqlens_k)`` returns ``(out [total, Hq, D], lse [Hq, total])`` as
    :func:`fwd_ws.flash_attention_fwd_ws_packed` does (its two launches: the schedule, then the
    forward); ``two``: the keys have offsets of their own (``cum_seqlens_k`` read; else unread);
    ``window``: a sliding window, or None; ``softcap``: a soft cap, or None."""

    def __init__(self, softmax_scale: float, causal: bool, dense: bool, two: bool = False,
                 window: int | None = None, softcap: float | None = None):
        self.softmax_scale, self.causal, self.dense, self.two = softmax_scale, causal, dense, two
        self.window, self.softcap = window, softcap
        self._bound = None

    def __call__(self, q, k, v, cu, cu_k=None):
        T, Hq, _ = q.shape
        out = _empty(q, self.dense)
        lse = q.new_empty((Hq, T), dtype=torch.float32)
        table = varlen.ws_packed_table(cu, T, Hq)
        q4, k4, v4, out4, lse4 = q[None], k[None], v[None], out[None], lse[None]
        cu_k = cu_k if self.two else None
        _launch(self, (cu, table, q4, k4, v4, out4, lse4) + ((cu_k, ) if self.two else ()),
                lambda: fwd_ws.packed_launches(q4, k4, v4, out4, lse4, cu, table, self.softmax_scale, self.causal,
                                               cum_seqlens_k=cu_k, window=self.window, softcap=self.softcap))
        return out, lse


def packed_fwd_plan(q, k, v, cum_seqlens_q, cum_seqlens_k, softmax_scale: float, win_left: int,
                    win_right: int, softcap: float | None = None) -> PackedFwdPlan | None:
    """The plan of this packed forward's signature (made on first use), or None when the packed
    warp-specialised forward does not take it (:func:`ws_common.ws_packed_supported`, a causal or
    full band or a causal window, :func:`ws_common.ws_scale_ok`) or a tensor is not 16-byte aligned. One offsets tensor
    and two (:func:`ws_common.same_offsets`, checked each call) are two signatures. The caller has
    checked the rest (no extra terms or dropout, a soft cap it may take; outputs not preallocated)."""
    if q.dim() != 3 or not q.is_cuda or not _aligned(q, k, v, cum_seqlens_q, cum_seqlens_k):
        return None
    offsets = _offsets_key(cum_seqlens_q, cum_seqlens_k)
    cu, cu_k, two = cum_seqlens_q, cum_seqlens_k, offsets[0]
    key = ("packed", q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device,
           softmax_scale, win_left, win_right, softcap, _aliases(q, k, v), *offsets)
    plan = _FWD_PLANS.get(key)
    if plan is None:
        band = ws_common.packed_window_band(win_left, win_right, q, k) if ws_common.ws_scale_ok(softmax_scale) else None
        ok = band is not None and ws_common.ws_packed_supported(q, k, v, cu, cu_k, two_offsets=True)
        plan = _keep(_FWD_PLANS, key, PackedFwdPlan(softmax_scale, band[0], q.is_contiguous(), two, band[1], softcap)
                     if ok else False)
    return plan or None


class PackedBwdPlan:
    """The packed fused backward of one call signature: ``plan(q, k, v, out, dout, lse, cum_seqlens,
    cum_seqlens_k)`` (``lse [Hq, total_q]``, the packed forward's) returns ``(dq, dk, dv, None, None)``
    as :func:`dispatch.flash_attention_bwd` does, through its launches: the delta kernel (zeroing the
    float32 dQ buffer), the programs' schedule, the fused kernel, then dQ converted; ``two``: the
    keys have offsets of their own (``cum_seqlens_k`` read; else unread)."""

    def __init__(self, softmax_scale: float, causal: bool, dense: tuple[bool, bool, bool], two: bool = False,
                 window: int | None = None):
        self.softmax_scale, self.causal, self.dense, self.two = softmax_scale, causal, dense, two
        self.window = window
        self._bound = None

    def __call__(self, q, k, v, out, dout, lse, cu, cu_k=None):
        dense_q, dense_k, dense_v = self.dense
        dq, dk, dv = _empty(q, dense_q), _empty(k, dense_k), _empty(v, dense_v)
        lse4, delta4 = bwd_fused.padded_stats(lse)
        dq_acc = q.new_empty((1, *q.shape), dtype=torch.float32)
        cu_k = cu_k if self.two else cu
        table = bwd_fused.packed_table(cu_k, k.shape[0], k.shape[1], q.shape[-1])
        q4, k4, v4, out4, dout4, dk4, dv4 = (t[None] for t in (q, k, v, out, dout, dk, dv))
        _launch(self, (q4, k4, v4, out4, dout4, lse4, delta4, dq_acc, dk4, dv4, cu, table) + ((cu_k, ) if self.two else ()),
                lambda: [bwd.preprocess_launch(out4, dout4, None, delta4, dq_acc),
                         *backward.packed_launches(q4, k4, v4, dout4, lse4, delta4, dq_acc, dk4, dv4, cu, table,
                                                    self.softmax_scale, self.causal, cum_seqlens_k=cu_k,
                                                    win_left=self.window)])
        dq.copy_(dq_acc[0])
        return dq, dk, dv, None, None


def packed_bwd_plan(q, k, v, out, dout, lse, cum_seqlens_q, cum_seqlens_k, softmax_scale: float, win_left: int,
                    win_right: int) -> PackedBwdPlan | None:
    """The plan of this packed backward's signature (made on first use), or None when the fused
    kernel does not take it (``backward.ws_mode``'s packed case), a tensor is not 16-byte aligned or lse is
    not a contiguous ``[Hq, total_q]``. One offsets tensor and two (:func:`ws_common.same_offsets`,
    checked each call) are two signatures. The caller has checked the rest: the fused backward
    chosen, no lse gradient, extra terms, soft cap or dropout, gradients not preallocated."""
    if q.dim() != 3 or not q.is_cuda or not lse.is_contiguous() or \
            not _aligned(q, k, v, out, dout, lse, cum_seqlens_q, cum_seqlens_k):
        return None
    offsets = _offsets_key(cum_seqlens_q, cum_seqlens_k)
    cu, cu_k, two = cum_seqlens_q, cum_seqlens_k, offsets[0]
    key = ("packed", q.shape, k.shape, v.shape, out.shape, dout.shape, lse.shape, q.stride(), k.stride(), v.stride(),
           out.stride(), dout.stride(), q.dtype, k.dtype, v.dtype, out.dtype, dout.dtype, lse.dtype, q.device,
           softmax_scale, win_left, win_right, _aliases(q, k, v, out, dout, lse), *offsets)
    plan = _PLANS.get(key)
    if plan is None:
        ok = (lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
              and q.dtype == k.dtype == v.dtype == out.dtype == dout.dtype and out.shape == q.shape)
        # the support check reads dk/dv as k and dq as dout (the plan allocates them like those)
        mode, band = backward.ws_mode(q, k, v, dout, k, k, win_left, win_right, None, (None,) * 5, 0.0, (cu, cu_k), True) \
            if ok else (0, None)
        dense = (q.is_contiguous(), k.is_contiguous(), v.is_contiguous())
        plan = _keep(_PLANS, key, PackedBwdPlan(softmax_scale, band[0], dense, two, band[1]) if mode == 2 else False)
    return plan or None
