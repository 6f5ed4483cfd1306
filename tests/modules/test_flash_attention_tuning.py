"""Autotuning of flash_attention end to end on a GPU: tune -> memory + disk -> a new process reads disk."""

import pytest
import torch

from kernelops import ConfigCache, ConfigSelectorChain, Executor, FlashAttention
from kernelops.ops import Autotuner, PretunedStore
from tests.attention_checks import assert_attention_matches, make_qkv


@pytest.mark.gpu
def test_autotune_then_disk_then_correct(tmp_path):
    op = FlashAttention()
    q, k, v = make_qkv(2, 1024, 1024, 8, 2, 64, torch.bfloat16, "cuda")

    def executor():
        return Executor(ConfigSelectorChain(cache=ConfigCache(tmp_path / "cache"), pretuned=PretunedStore(tmp_path),
                                            autotuner=Autotuner(budget_s=60, progress=False), policy="auto"))

    first = executor()
    tuned = first.explain(op, query=q, key=k, value=v, causal=True)
    assert tuned.selector == "autotune", str(tuned)
    assert tuned.entry["candidates"] > 2 and tuned.entry["ms"] > 0 and tuned.entry["heuristic_ms"] > 0
    again = executor().explain(op, query=q, key=k, value=v, causal=True)  # fresh memory: "another process"
    assert again.selector == "disk" and again.config == tuned.config, str(again)

    out = first(op, query=q, key=k, value=v, causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    assert_attention_matches(out, q, k, v, dout=dout, causal=True)
