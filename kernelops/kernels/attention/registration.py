"""torch.library registration for materialised attention: the seeded dropout keep mask.

``attention`` itself is plain torch, so torch.compile traces it op by op (inductor may fuse it);
the one part dynamo cannot trace is the dropout mask drawn from a seeded ``torch.Generator``
(an opaque object created mid-graph). ``kernelops::attention_keep_mask(q, k, seed, p)`` draws it
instead, as an opaque node with a fake kernel: a boolean ``[B, Hq, Sq, Sk]`` (True = keep) for
``q [B, Sq, Hq, D]`` and ``k [B, Sk, Hkv, D]``, bitwise the mask the eager path draws.

>>> import torch
>>> q, k = torch.randn(1, 4, 2, 8), torch.randn(1, 6, 1, 8)
>>> keep_mask(q, k, seed=3, dropout_p=0.5).shape
torch.Size([1, 2, 4, 6])
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def _shape(q: Tensor, k: Tensor) -> tuple:
    return (q.shape[0], q.shape[2], q.shape[1], k.shape[1])


def keep_mask(q: Tensor, k: Tensor, seed: int, dropout_p: float) -> Tensor:
    """The keep mask, eagerly: ``rand(B, Hq, Sq, Sk) >= dropout_p`` from a generator seeded with
    ``seed`` on the query's device."""
    gen = torch.Generator(device=q.device).manual_seed(seed)
    return torch.rand(_shape(q, k), generator=gen, device=q.device) >= dropout_p


@torch.library.custom_op("kernelops::attention_keep_mask", mutates_args=())
def attention_keep_mask_op(q: Tensor, k: Tensor, seed: int, dropout_p: float) -> Tensor:
    return keep_mask(q, k, seed, dropout_p)


@attention_keep_mask_op.register_fake
def _keep_mask_fake(q, k, seed, dropout_p):
    return q.new_empty(_shape(q, k), dtype=torch.bool)


def attention_keep_mask(q: Tensor, k: Tensor, seed: int, dropout_p: float) -> Tensor:
    """The custom op while torch.compile traces (the mask does not depend on q/k values, so it
    takes detached views and has no autograd), the plain function otherwise."""
    if torch.compiler.is_compiling():
        return attention_keep_mask_op(q.detach(), k.detach(), seed, dropout_p)
    return keep_mask(q, k, seed, dropout_p)
