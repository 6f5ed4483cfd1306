"""torch.library registration of flash attention: custom ops, fake (meta) kernels, autograd.

``kernelops::flash_attention_fwd(q, k, v, bias?, alibi_slopes?, softmax_aux?, q_segment_ids?,
kv_segment_ids?, cum_seqlens_q?, cum_seqlens_k?, softmax_scale, win_left, win_right, softcap,
dropout_p, dropout_seed, platform, fwd_params, bwd_params, op_name, causal, windowed, train,
max_seqlen_q, max_seqlen_k) -> (out, lse)``

``kernelops::flash_attention_bwd(q, k, v, out, dout, lse, dlse?, <the same optional tensors>,
bias_grad, <the same scalars up to platform>, bwd_params, op_name, causal, windowed, max_seqlen_q,
max_seqlen_k) -> (dq, dk, dv, dbias, dsink)``

``platform`` is ``"triton"`` or ``"torch"``; params are ``[q_blocksize, kv_blocksize, num_warps,
num_stages]`` (forward params may get a fifth element: bit 0 ``FwdParams.tma``, bit 1 the
warp-specialised kernel, ``FwdParams.ws`` resolved; backward params likewise bit 1 for
``BwdParams.ws`` and bit 2 for ``BwdParams.fused``, both resolved), or for the split-KV
decode forward ``[0, kv_blocksize, num_warps, num_stages, num_splits]``, or ``[]``
(:data:`~kernelops.kernels.flash_attention.runtime_config.AUTO`): resolve them when the op runs,
through the resolver registered for ``op_name`` (the executor's caches, tuning when safe, else the
heuristic), from the real tensors. ``op_name``, ``causal``,
``windowed``, ``train`` and ``max_seqlen_q/k`` (0: read from the offsets) are read only then, to
rebuild the call's tuning key. torch.compile traces use ``[]``, so a compiled graph holds no
launch config and one graph serves every sequence length. The forward op carries the
backward's params so autograd can launch the tuned backward. ``dbias`` / ``dsink`` are empty
tensors when not computed (custom ops return tensors only). The torch platform takes no params.
"""

from __future__ import annotations

import functools

import torch

from kernelops.kernels.flash_attention.dispatch import (
    dense_forward, flash_attention_bwd, flash_attention_decode, flash_attention_fwd_dense)
from kernelops.kernels.flash_attention.plans import bwd_plan, fwd_ws_plan, run_on_device
from kernelops.kernels.flash_attention.reference import (
    ScoreTerms, flash_attention_torch_bwd, flash_attention_torch_bwd_varlen, flash_attention_torch_fwd,
    flash_attention_torch_fwd_varlen, lse_dtype,
)
from kernelops.kernels.flash_attention.runtime_config import SPLIT_AUTO, RunTimeScalars, is_auto, resolve, without_fused

Tensor = torch.Tensor
OptTensor = Tensor | None


def _params(p: list[int]) -> dict:
    """Tile keyword arguments of the dense kernels from ``[q_blocksize, kv_blocksize, num_warps,
    num_stages, ...]``."""
    return dict(q_blocksize=p[0], kv_blocksize=p[1], num_warps=p[2], num_stages=p[3])


def _fwd_params(p: list[int]) -> dict:
    """Keyword arguments of ``flash_attention_fwd_dense`` from dense forward params (a fifth
    element, bit 0: ``FwdParams.tma``, bit 1: the warp-specialised kernel)."""
    flags = p[4] if len(p) == 5 else 0
    return dict(_params(p), tma=bool(flags & 1), ws=bool(flags & 2))


def _bwd_params(p: list[int]) -> dict:
    """Keyword arguments of ``flash_attention_bwd`` from backward params (a fifth element, bit 1:
    the warp-specialised dK/dV kernel, bit 2: dQ fused into it)."""
    flags = p[4] if len(p) == 5 else 0
    return dict(_params(p), ws=bool(flags & 2), fused=bool(flags & 4))


def _is_decode(p: list[int]) -> bool:
    """``[0, kv_blocksize, num_warps, num_stages, num_splits]`` selects the split-KV decode kernel."""
    return len(p) == 5 and p[0] == 0


def _decode_kwargs(softmax_scale, win_left, win_right, softcap, fwd_params) -> dict:
    """Keyword arguments of ``flash_attention_decode`` from the op's scalars and decode params."""
    _, kv, warps, stages, splits = fwd_params
    return dict(softmax_scale=softmax_scale, win_left=win_left, win_right=win_right, softcap=softcap or None,
                kv_blocksize=kv, num_warps=warps, num_stages=stages, num_splits=splits)


def _band(softmax_scale, win_left, win_right, softcap, dropout_p, dropout_seed) -> dict:
    return dict(softmax_scale=softmax_scale, win_left=win_left, win_right=win_right, softcap=softcap or None,
                dropout_p=dropout_p, dropout_seed=dropout_seed)


def _terms(bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids) -> ScoreTerms:
    return ScoreTerms(bias, alibi_slopes, softmax_aux, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)


def _resolve(tensors, softmax_scale, win_left, win_right, softcap, dropout_p, dropout_seed, platform, op_name,
             causal, windowed, train, max_seqlen_q, max_seqlen_k) -> tuple[list[int], list[int]]:
    scalars = RunTimeScalars(softmax_scale, win_left, win_right, softcap, dropout_p, dropout_seed, platform, causal,
                             windowed, max_seqlen_q, max_seqlen_k)
    return resolve(op_name, tensors, scalars, train)


def fwd_impl(q, k, v, bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids, cum_seqlens_q, cum_seqlens_k,
             softmax_scale, win_left, win_right, softcap, dropout_p, dropout_seed, platform, fwd_params, bwd_params,
             op_name="flash_attention", causal=False, windowed=False, train=False, max_seqlen_q=0, max_seqlen_k=0):
    """The forward on either platform: ``(out, lse)`` (the custom op and the eager Function both call it).

    Empty ``fwd_params`` on the triton platform are resolved here, from the real tensors."""
    if platform == "triton" and not fwd_params:
        fwd_params, _ = _resolve((q, k, v, bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids,
                                  cum_seqlens_q, cum_seqlens_k), softmax_scale, win_left, win_right, softcap,
                                 dropout_p, dropout_seed, platform, op_name, causal, windowed, train, max_seqlen_q,
                                 max_seqlen_k)
    band = _band(softmax_scale, win_left, win_right, softcap, dropout_p, dropout_seed)
    if platform == "triton" and _is_decode(fwd_params):
        return flash_attention_decode(q, k, v, **_decode_kwargs(softmax_scale, win_left, win_right, softcap, fwd_params),
                                      softmax_aux=softmax_aux)
    if platform == "triton":
        return flash_attention_fwd_dense(q, k, v, **band, **_fwd_params(fwd_params), bias=bias,
                                         alibi_slopes=alibi_slopes, softmax_aux=softmax_aux, q_segment_ids=q_segment_ids,
                                         kv_segment_ids=kv_segment_ids, cum_seqlens_q=cum_seqlens_q,
                                         cum_seqlens_k=cum_seqlens_k)
    terms = _terms(bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids)
    if cum_seqlens_q is not None:
        return flash_attention_torch_fwd_varlen(q, k, v, cum_seqlens_q, cum_seqlens_k, terms=terms, **band)
    return flash_attention_torch_fwd(q, k, v, **band, terms=terms)


def plain_forward(softmax_scale, win_left, win_right, softcap, dropout_p, dropout_seed, platform, fwd_params,
                  bwd_params=None, *key_args):
    """``fwd_impl`` for calls without extra tensors, with everything but ``(q, k, v)`` bound
    once: a callable ``(q, k, v) -> (out, lse)`` for the executor's hot path (no autograd).
    ``key_args`` are ``fwd_impl``'s trailing ``(op_name, causal, windowed, train, max_seqlen_q,
    max_seqlen_k)``, read only for auto (empty) params."""
    if platform == "triton" and fwd_params and _is_decode(fwd_params):
        return functools.partial(flash_attention_decode,
                                 **_decode_kwargs(softmax_scale, win_left, win_right, softcap, fwd_params))
    if platform == "triton" and fwd_params:
        return dense_forward(**_band(softmax_scale, win_left, win_right, softcap, dropout_p, dropout_seed),
                             **_fwd_params(fwd_params))
    scalars = (softmax_scale, win_left, win_right, softcap, dropout_p, dropout_seed, platform, fwd_params, bwd_params,
               *key_args)
    return lambda q, k, v: fwd_impl(q, k, v, *(None,) * 7, *scalars)


@torch.library.custom_op("kernelops::flash_attention_fwd", mutates_args=())
def flash_attention_fwd_op(q: Tensor, k: Tensor, v: Tensor, bias: OptTensor, alibi_slopes: OptTensor,
                           softmax_aux: OptTensor, q_segment_ids: OptTensor, kv_segment_ids: OptTensor,
                           cum_seqlens_q: OptTensor, cum_seqlens_k: OptTensor, softmax_scale: float, win_left: int,
                           win_right: int, softcap: float, dropout_p: float, dropout_seed: int, platform: str,
                           fwd_params: list[int], bwd_params: list[int], op_name: str, causal: bool, windowed: bool,
                           train: bool, max_seqlen_q: int, max_seqlen_k: int) -> tuple[Tensor, Tensor]:
    return fwd_impl(q, k, v, bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids, cum_seqlens_q,
                    cum_seqlens_k, softmax_scale, win_left, win_right, softcap, dropout_p, dropout_seed, platform,
                    fwd_params, bwd_params, op_name, causal, windowed, train, max_seqlen_q, max_seqlen_k)


@flash_attention_fwd_op.register_fake
def _fwd_fake(q, k, v, bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids, cum_seqlens_q, cum_seqlens_k,
              *scalars):
    if cum_seqlens_q is not None:  # packed: out [total_q, Hq, D], lse [Hq, total_q]
        return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=lse_dtype(q.dtype))
    B, Sq, Hq, D = q.shape
    return q.new_empty((B, Sq, Hq, D)), q.new_empty((B, Hq, Sq), dtype=lse_dtype(q.dtype))


def bwd_impl(q, k, v, out, dout, lse, dlse, bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids,
             cum_seqlens_q, cum_seqlens_k, bias_grad, softmax_scale, win_left, win_right, softcap, dropout_p,
             dropout_seed, platform, bwd_params, op_name="flash_attention", causal=False, windowed=False,
             max_seqlen_q=0, max_seqlen_k=0):
    """The backward on either platform: ``(dq, dk, dv, dbias, dsink)``, empty tensors for absent ones.

    Auto ``bwd_params`` (empty, or ``SPLIT_AUTO``: then without the fused dQ) on the triton
    platform are resolved here (the training key)."""
    if platform == "triton" and is_auto(bwd_params):
        split = tuple(bwd_params) == SPLIT_AUTO
        _, bwd_params = _resolve((q, k, v, bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids,
                                  cum_seqlens_q, cum_seqlens_k), softmax_scale, win_left, win_right, softcap,
                                 dropout_p, dropout_seed, platform, op_name, causal, windowed, True, max_seqlen_q,
                                 max_seqlen_k)
        bwd_params = without_fused(bwd_params) if split else bwd_params
    band = _band(softmax_scale, win_left, win_right, softcap, dropout_p, dropout_seed)
    if platform == "triton":
        grads = flash_attention_bwd(q, k, v, out, dout, lse, dlse, **band, **_bwd_params(bwd_params), bias=bias,
                                    alibi_slopes=alibi_slopes, softmax_aux=softmax_aux, q_segment_ids=q_segment_ids,
                                    kv_segment_ids=kv_segment_ids, cum_seqlens_q=cum_seqlens_q,
                                    cum_seqlens_k=cum_seqlens_k, bias_grad=bias_grad)
    else:
        terms = _terms(bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids)
        if cum_seqlens_q is not None:
            grads = flash_attention_torch_bwd_varlen(q, k, v, out, dout, lse, dlse, cum_seqlens_q, cum_seqlens_k,
                                                     terms=terms, **band)
        else:
            grads = flash_attention_torch_bwd(q, k, v, out, dout, lse, dlse, **band, terms=terms, bias_grad=bias_grad)
    dq, dk, dv, dbias, dsink = grads
    return dq, dk, dv, q.new_empty(0) if dbias is None else dbias, q.new_empty(0) if dsink is None else dsink


@torch.library.custom_op("kernelops::flash_attention_bwd", mutates_args=())
def flash_attention_bwd_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor, dlse: OptTensor,
                           bias: OptTensor, alibi_slopes: OptTensor, softmax_aux: OptTensor, q_segment_ids: OptTensor,
                           kv_segment_ids: OptTensor, cum_seqlens_q: OptTensor, cum_seqlens_k: OptTensor,
                           bias_grad: bool, softmax_scale: float, win_left: int, win_right: int, softcap: float,
                           dropout_p: float, dropout_seed: int, platform: str, bwd_params: list[int],
                           op_name: str, causal: bool, windowed: bool, max_seqlen_q: int,
                           max_seqlen_k: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return bwd_impl(q, k, v, out, dout, lse, dlse, bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids,
                    cum_seqlens_q, cum_seqlens_k, bias_grad, softmax_scale, win_left, win_right, softcap, dropout_p,
                    dropout_seed, platform, bwd_params, op_name, causal, windowed, max_seqlen_q, max_seqlen_k)


@flash_attention_bwd_op.register_fake
def _bwd_fake(q, k, v, out, dout, lse, dlse, bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids,
              cum_seqlens_q, cum_seqlens_k, bias_grad, *scalars):
    dbias = bias.new_empty(bias.shape) if bias_grad and bias is not None else q.new_empty(0)
    dsink = softmax_aux.new_empty(softmax_aux.shape) if softmax_aux is not None else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias, dsink


_N_TENSORS = 10  # q, k, v and the seven optional tensors of the forward op
_N_ARGS = 25


def _save(ctx, inputs, output):
    tensors, scalars = inputs[:_N_TENSORS], inputs[_N_TENSORS:]
    out, lse = output
    ctx.save_for_backward(*tensors, out, lse)
    ctx.scalars = _backward_scalars(scalars)


def _backward_scalars(scalars: tuple) -> tuple:
    """The forward op's 15 scalars ``(softmax_scale, win_left, win_right, softcap, dropout_p,
    dropout_seed, platform, _fwd, bwd_params, op_name, causal, windowed, _train, max_seqlen_q,
    max_seqlen_k)`` as the backward takes them: all but ``_fwd`` and ``_train``."""
    return (*scalars[:7], *scalars[8:12], *scalars[13:])


def _grads(ctx, dout, dlse, bwd):
    q, k, v, bias, alibi_slopes, softmax_aux, q_seg, kv_seg, cu_q, cu_k, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    bias_grad = bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dbias, dsink = bwd(q, k, v, out, dout, lse, dlse, bias, alibi_slopes, softmax_aux, q_seg, kv_seg,
                                   cu_q, cu_k, bias_grad, *ctx.scalars)
    sink_grad = dsink if softmax_aux is not None and ctx.needs_input_grad[5] else None
    return (dq, dk, dv, dbias if bias_grad else None, None, sink_grad) + (None,) * (_N_ARGS - 6)


def _backward(ctx, dout, dlse):
    return _grads(ctx, dout, dlse, flash_attention_bwd_op)


flash_attention_fwd_op.register_autograd(_backward, setup_context=_save)


_PLATFORM = 6  # ctx.scalars[_PLATFORM]: the platform the call ran on


def _backward_plan(args, output):
    """The backward's launch plan (:func:`plans.bwd_plan`) of an eager Triton call without extra
    tensors, soft cap or dropout and with resolved backward params, looked up in the forward with
    ``out`` standing for ``dout`` (the backward uses it when ``dout`` has out's strides); else None."""
    scale, win_left, win_right, softcap, dropout_p, _, platform, _, bwd_params = args[10:19]
    if platform != "triton" or softcap or dropout_p or is_auto(bwd_params) or any(t is not None for t in args[3:10]):
        return None
    out, lse = output
    p = _bwd_params(bwd_params)
    return bwd_plan(args[0], args[1], args[2], out, out, lse, None, scale, win_left, win_right, p["q_blocksize"],
                    p["kv_blocksize"], p["num_warps"], p["num_stages"], p["ws"], p["fused"])


def _planned_grads(ctx, dout, dlse):
    """``(dq, dk, dv)`` from the plan the forward found (:func:`_backward_plan`), or None when the
    call is not the one it was found for (a dlse, no dout, dout of another dtype). A dout of other
    strides or alignment than out's (a broadcast gradient, as ``out.sum().backward()`` gives) is
    copied into out's layout first when out is contiguous: one copy instead of the general path."""
    plan = ctx.plan
    if plan is None or dlse is not None or dout is None:
        return None
    q, k, v, *_, out, lse = ctx.saved_tensors
    if dout.dtype != out.dtype:
        return None
    if dout.stride() != out.stride() or dout.data_ptr() % 16:
        if not out.is_contiguous():
            return None
        dout = dout.contiguous() if dout.data_ptr() % 16 == 0 else dout.clone(memory_format=torch.contiguous_format)
        if dout.stride() != out.stride() or dout.data_ptr() % 16:
            return None
    return run_on_device(q, plan, k, v, out, dout, lse, None)[:3]


def _triton_grads(ctx, dout, dlse):
    """The Triton backward's gradients carry no graph. Under ``create_graph`` they come back
    marked (as ``once_differentiable`` marks them, but whether or not ``dout`` requires grad:
    a loss linear in ``out`` still gives gradients that depend on q, k and v), so that
    differentiating them again raises instead of silently dropping the second-order term."""
    with torch.no_grad():
        planned = _planned_grads(ctx, dout, dlse)
        grads = _grads(ctx, dout, dlse, bwd_impl) if planned is None else planned + (None,) * (_N_ARGS - 3)
    if not torch.is_grad_enabled():
        return grads
    marked = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
    error = torch._C._functions.DelayedError(
        b"kernelops: the Triton flash_attention backward is differentiable once; use platform='torch' for "
        b"second-order gradients", len(marked))
    outs = error(*[grads[i].detach().requires_grad_() for i in marked])
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = list(grads)
    for i, g in zip(marked, outs):
        grads[i] = g
    return tuple(grads)


class FlashAttentionFunction(torch.autograd.Function):
    """The eager path: the same forward/backward as the custom ops, without torch.library's
    per-call dispatch cost (tens of microseconds, which short sequences notice).

    Second-order gradients: the torch platform's backward is made of differentiable torch ops,
    so ``create_graph=True`` works through it; the Triton backward is differentiable once."""

    @staticmethod
    def forward(ctx, *args):
        output = fwd_impl(*args)
        _save(ctx, args, output)
        ctx.plan = _backward_plan(args, output)
        # an output nothing used (lse, almost always) reaches backward as None instead of a
        # zero-filled tensor: no allocation or fill per backward, and no dlse term in the kernels
        ctx.set_materialize_grads(False)
        return output

    @staticmethod
    def backward(ctx, dout, dlse):
        if ctx.scalars[_PLATFORM] == "triton":
            return _triton_grads(ctx, dout, dlse)
        return _grads(ctx, dout, dlse, bwd_impl)


_NO_EXTRAS = (None,) * (_N_TENSORS - 3)
_UNSET = object()


class _PlannedFunction(FlashAttentionFunction):
    """:class:`FlashAttentionFunction` for a :class:`PlannedCall` layout: the forward runs its plan;
    the context is the one the general forward leaves (so the backward is the same, and the
    trailing gradients it returns for the scalars, all None, are dropped by autograd)."""

    @staticmethod
    def forward(ctx, q, k, v, call, layout):
        output = run_on_device(q, layout[0], k, v)
        if layout[1] is _UNSET:  # the backward's plan: out and lse are the plan's, the same every call
            layout[1] = _backward_plan((q, k, v, *_NO_EXTRAS, *call.args), output)
        ctx.save_for_backward(q, k, v, *_NO_EXTRAS, *output)
        ctx.scalars, ctx.plan = call.scalars, layout[1]
        ctx.set_materialize_grads(False)
        return output


class PlannedCall:
    """The eager Triton call of one executor signature whose forward is the warp-specialised
    kernel's (``args``: the forward op's 15 scalars, :func:`planned_call`): ``call(q, k, v) ->
    (out, lse)``. Per layout of the three tensors (strides and 16-byte alignment) it keeps the
    forward's plan (:func:`plans.fwd_ws_plan`) and the backward's, so a repeated call goes straight
    to them: no argument normalisation, no plan lookup, and a 5-input autograd Function. Layouts
    the plans do not take run :class:`FlashAttentionFunction` / :func:`fwd_impl` as before."""

    MAX_LAYOUTS = 64

    def __init__(self, args: tuple, grad: bool):
        self.args, self.grad = args, grad
        self.scalars = _backward_scalars(args)
        self._layouts: dict[tuple, list | None] = {}

    def __call__(self, q, k, v):
        key = (q.stride(), k.stride(), v.stride(), q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16)
        layout = self._layouts.get(key, _UNSET)
        if layout is _UNSET:
            if len(self._layouts) >= self.MAX_LAYOUTS:
                self._layouts.clear()
            plan = fwd_ws_plan(q, k, v, self.args[0], self.args[1], self.args[2])
            layout = self._layouts[key] = None if plan is None else [plan, _UNSET]
        if layout is None:
            if self.grad:
                return FlashAttentionFunction.apply(q, k, v, *_NO_EXTRAS, *self.args)
            return fwd_impl(q, k, v, *_NO_EXTRAS, *self.args)
        if self.grad:
            return _PlannedFunction.apply(q, k, v, self, layout)
        return run_on_device(q, layout[0], k, v)


def planned_call(args: tuple, grad: bool) -> PlannedCall | None:
    """A :class:`PlannedCall` for the forward op's scalars ``args`` when they select the
    warp-specialised forward on the Triton platform without soft cap or dropout (resolved, not
    decode params); else None."""
    _, _, _, softcap, dropout_p, _, platform, fwd_params = args[:8]
    if platform != "triton" or softcap or dropout_p or is_auto(fwd_params) or _is_decode(fwd_params) or \
            not _fwd_params(fwd_params)["ws"]:
        return None
    return PlannedCall(args, grad)


def flash_attention_apply(*args) -> tuple[Tensor, Tensor]:
    """Run the forward op: the custom op while torch.compile traces (an opaque node with fake
    shapes), the autograd Function in eager mode."""
    if torch.compiler.is_compiling():
        return flash_attention_fwd_op(*args)
    return FlashAttentionFunction.apply(*args)
