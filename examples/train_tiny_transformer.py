"""Train a tiny decoder-only transformer built on kernelops.nn.MultiheadAttention.

The task is synthetic and learnable: each sequence repeats a random pattern of distinct tokens
(period 2..6, different per sequence), and the model predicts the next token. Once it has seen
one period it can continue the pattern by looking back (an "induction" lookup), so the loss on
those positions falls from ~ln(vocab) towards 0. The script prints the loss at intervals and
exits with status 1 if the loss did not clearly go down: the mean over the last steps must be below
half the mean over the first steps (``LOSS_BOUND``; on a CPU it gets there within 150 steps).

    python examples/train_tiny_transformer.py                 # CPU: float32, ~300 steps
    python examples/train_tiny_transformer.py --device cuda   # CUDA: bfloat16, Triton kernels

On a GPU the first step includes Triton compilation and, on a fresh cache, autotuning of the
attention's launch config (about a minute; tuned configs are kept in the disk cache for later
runs). ``KERNELOPS_AUTOTUNE=never`` skips tuning and uses the heuristic config.

Each block: RMSNorm -> MultiheadAttention (causal, GQA 4/2, rotary) -> residual, RMSNorm -> MLP
-> residual. Shapes: tokens ``[B, S]`` -> embeddings ``[B, S, E]`` -> logits ``[B, S, V]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

import torch
from torch import nn

import kernelops
from kernelops.nn import MultiheadAttention


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):                                       # [B, S, E]
        rms = x.float().pow(2).mean(-1, keepdim=True).add(self.eps).rsqrt()
        return (x.float() * rms).to(x.dtype) * self.weight


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.attn = MultiheadAttention(dim, heads, num_kv_heads=kv_heads, causal=True, rotary=True,
                                       qkv_bias=False, out_bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim, bias=False), nn.GELU(), nn.Linear(4 * dim, dim, bias=False))

    def forward(self, x):                                       # [B, S, E] -> [B, S, E]
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, kv_heads: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):                                  # [B, S] int64 -> [B, S, V]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batch(batch_size: int, seq_len: int, vocab: int, device, generator):
    """tokens ``[B, S]`` repeating a random pattern of distinct tokens, and a ``[B, S-1]`` mask of the
    targets that are predictable (those after the first period)."""
    periods = torch.randint(2, 7, (batch_size,), generator=generator)
    patterns = torch.rand(batch_size, vocab, generator=generator).argsort(-1)     # distinct tokens per row
    pos = torch.arange(seq_len)
    tokens = patterns.gather(1, pos[None, :] % periods[:, None])
    predictable = (pos[None, 1:] >= periods[:, None])                              # target index >= period
    return tokens.to(device), predictable.to(device)


#: the claim: the mean loss of the last steps is below this fraction of the mean loss of the first steps
LOSS_BOUND = 0.5


@dataclasses.dataclass
class TrainResult:
    losses: list[float]   # one per step
    first: float          # mean over the first ``window`` steps
    last: float           # mean over the last ``window`` steps
    window: int

    @property
    def went_down(self) -> bool:
        return self.last < LOSS_BOUND * self.first


def main(argv=None) -> TrainResult:
    """Trains with the command line's options (``argv``, default ``sys.argv[1:]``) and returns the losses."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    vocab = 16
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = TinyTransformer(vocab, dim=64, layers=2, heads=4, kv_heads=2).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.98),
                            eps=1e-6 if dtype == torch.bfloat16 else 1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30))
    print(f"kernelops {kernelops.__version__}: training a {sum(p.numel() for p in model.parameters())}-parameter "
          f"transformer on {device.type} ({dtype}), {args.steps} steps; "
          f"chance loss ln({vocab}) = {math.log(vocab):.3f}")

    if device.type == "cuda":
        print("kernelops: the first step compiles the Triton kernels and may autotune them "
              "(KERNELOPS_AUTOTUNE)")
    losses, start = [], time.perf_counter()
    window = max(1, min(20, args.steps // 5))
    for step in range(1, args.steps + 1):
        tokens, predictable = batch(args.batch_size, args.seq_len, vocab, device, gen)
        logits = model(tokens[:, :-1]).float()                                      # [B, S-1, V]
        per_token = nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
        loss = per_token[predictable].mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step == 1 or step % 50 == 0 or step == args.steps:
            recent = sum(losses[-window:]) / len(losses[-window:])
            print(f"step {step:4d}  loss {loss.item():.4f}  (mean of last {window}: {recent:.4f})  "
                  f"{time.perf_counter() - start:.1f}s")

    result = TrainResult(losses, sum(losses[:window]) / window, sum(losses[-window:]) / window, window)
    print(f"kernelops: loss {result.first:.3f} -> {result.last:.3f} (mean of the first / last {window} steps): "
          f"{'went down' if result.went_down else 'DID NOT go down'} (bound: below {LOSS_BOUND} x the first)")
    return result


if __name__ == "__main__":
    if not main().went_down:
        sys.exit(1)
