"""Packed-sequence inputs for the benchmarks: a token count cut into random documents."""

from __future__ import annotations

import torch


def random_documents(tokens: int, docs: int, gen: torch.Generator, device: str = "cuda") -> tuple[list[int], torch.Tensor]:
    """``(lens, cu)``: ``tokens`` cut at ``docs - 1`` distinct random points drawn from ``gen``,
    the documents' lengths and their int32 offsets ``[0, ..., tokens]`` on ``device``."""
    cuts = torch.sort(torch.randperm(tokens - 1, generator=gen)[:docs - 1] + 1).values.tolist()
    lens = [b - a for a, b in zip([0] + cuts, cuts + [tokens])]
    return lens, torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
