"""Launch parameters resolved when the op runs, not when it is traced.

The custom ops in ``registration.py`` take their Triton launch parameters as int lists. Under
``torch.compile`` those lists are empty (:data:`AUTO`): the traced graph holds only what is
static (platform, flags), and the op asks a resolver for the parameters each time it runs,
from the real tensors. The resolver lives with the Operation (``kernelops.modules``, which may
use the executor's selector chain and caches); this module only holds the hook, so that kernels
never import modules and importing it costs nothing (no Triton).

A resolver is registered per op name (``"flash_attention"``, ``"scaled_dot_product_attention"``)
and is called as ``resolver(tensors, scalars, train)`` with

* ``tensors``: ``(q, k, v, bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids,
  cum_seqlens_q, cum_seqlens_k)`` (None where absent);
* ``scalars``: a :class:`RunTimeScalars`;
* ``train``: whether the call's key is a training key (the backward op always passes True);

and returns ``(fwd_params, bwd_params)`` as the op's int lists.

>>> from kernelops.kernels.flash_attention.runtime_config import AUTO, is_auto
>>> is_auto(AUTO), is_auto([64, 64, 4, 3])
(True, False)
"""

from __future__ import annotations

import dataclasses
from typing import Callable

#: the params value meaning "resolve when the op runs" (an empty int list in the op schema)
AUTO: list[int] = []
#: backward params meaning "resolve when the op runs, then keep the split backward": a
#: ``deterministic=True`` call traced by torch.compile (the fused dQ adds in any order)
SPLIT_AUTO: tuple[int, ...] = (0,)

_RESOLVERS: dict[str, Callable] = {}


@dataclasses.dataclass(frozen=True)
class RunTimeScalars:
    """The op's non-tensor arguments a resolver needs to rebuild the call's key."""

    softmax_scale: float
    win_left: int
    win_right: int
    softcap: float
    dropout_p: float
    dropout_seed: int
    platform: str
    causal: bool
    windowed: bool
    max_seqlen_q: int
    max_seqlen_k: int


def is_auto(params) -> bool:
    return len(params) == 0 or tuple(params) == SPLIT_AUTO


def without_fused(params: list[int]) -> list[int]:
    """Resolved backward params with the fused-dQ bit (bit 2 of a fifth element) cleared."""
    return [*params[:4], params[4] & ~4] if len(params) == 5 else list(params)


def register_resolver(op_name: str, resolver: Callable) -> None:
    """Install the resolver of ``op_name`` (the Operation's module does this when imported)."""
    _RESOLVERS[op_name] = resolver


def resolve(op_name: str, tensors: tuple, scalars: RunTimeScalars, train: bool) -> tuple[list[int], list[int]]:
    """``(fwd_params, bwd_params)`` for one run of the op, from ``op_name``'s resolver."""
    resolver = _RESOLVERS.get(op_name)
    if resolver is None:  # the op's module (kernelops.modules.<op>) registers it when imported
        raise ValueError(f"no run-time config resolver for op {op_name!r} (known: {sorted(_RESOLVERS)}); "
                         f"import kernelops.modules (calling the op through kernelops does) or pass explicit "
                         f"fwd_params/bwd_params instead of [] (auto)")
    return resolver(tensors, scalars, train)
