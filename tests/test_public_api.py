"""The import paths users copy from the README and the issue must keep working."""

import pytest
import torch


def test_public_imports():
    from kernelops.modules import FlashAttention, FlashAttentionConfig, flash_attention  # noqa: F401 (importable)
    from kernelops.ops import (AutotunePolicy, BwdParams, ConfigCache, ConfigSelectorChain, Executor,  # noqa: F401
                               FwdParams, config_overlay)
    from kernelops.types import MaskInfo
    import kernelops

    assert kernelops.flash_attention is flash_attention
    assert kernelops.FlashAttention is FlashAttention and kernelops.MaskInfo is MaskInfo
    for name in ("Executor", "ConfigSelectorChain", "ConfigCache", "FwdParams", "BwdParams", "AutotunePolicy",
                 "config_overlay", "FlashAttentionConfig"):
        assert getattr(kernelops, name) is locals()[name]


def test_every_public_name_resolves_and_is_listed():
    import kernelops
    import kernelops.modules

    for name in kernelops.__all__:
        assert getattr(kernelops, name) is not None, name
        assert name in dir(kernelops)
    assert kernelops.AttentionConfig is kernelops.modules.AttentionConfig
    assert "AttentionConfig" in kernelops.__all__
    for name in kernelops.modules.__all__:  # the op package's names are the package's, less the op listing
        if name != "operations":
            assert getattr(kernelops, name) is getattr(kernelops.modules, name), name
    namespace = {}
    exec("from kernelops import *", namespace)  # noqa: S102 - the star import users may write
    assert set(kernelops.__all__) <= set(namespace)
    assert kernelops.__version__ == __import__("kernelops.version").version.__version__


def test_subpackages_are_attributes_and_unknown_names_say_so():
    import kernelops

    assert kernelops.nn.MultiheadAttention.__name__ == "MultiheadAttention"
    assert kernelops.nn.FlashAttentionLayer is not kernelops.FlashAttention
    assert kernelops.ops.Executor is kernelops.Executor and kernelops.types.MaskInfo is kernelops.MaskInfo
    assert {"nn", "ops", "modules", "types"} <= set(dir(kernelops))
    with pytest.raises(AttributeError, match="module 'kernelops' has no attribute 'flash_atention'"):
        kernelops.flash_atention  # noqa: B018
    assert not hasattr(kernelops, "torch")


def test_maskinfo_from_segments_dense():
    seg = torch.tensor([[0, 0, 1, 1, 1], [2, 2, 2, 3, 3]])
    dense = __import__("kernelops").MaskInfo.from_segments(seg).to_dense()
    assert dense.shape == (2, 1, 5, 5) and dense.dtype == torch.bool
    want = seg[:, :, None] == seg[:, None, :]
    assert torch.equal(dense[:, 0], want)


def test_maskinfo_from_padding_mask():
    from kernelops import MaskInfo

    pad = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    dense = MaskInfo.from_attention_mask(pad, seq_q=3).to_dense()
    assert dense.shape == (2, 1, 3, 4)
    assert torch.equal(dense[0, 0, 2], torch.tensor([True, True, True, False]))
    assert torch.equal(dense[1, 0, 0], torch.tensor([True, False, False, False]))


@pytest.mark.parametrize("bad", [
    dict(q_segment_ids=torch.zeros(2, 4), kv_segment_ids=torch.zeros(2, 4)),          # float ids
    dict(q_segment_ids=torch.zeros(2, 4, dtype=torch.long), kv_segment_ids=torch.zeros(3, 4, dtype=torch.long)),
    dict(attention_mask=torch.ones(2, 4, 4, dtype=torch.bool)),                          # 3-D mask
    dict(),
])
def test_maskinfo_rejects_bad_input(bad):
    from kernelops import MaskInfo

    with pytest.raises(ValueError):
        MaskInfo(**bad)
