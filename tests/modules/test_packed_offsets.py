"""modules/packed_offsets.py: the remembered longest lengths of offset tensors, and packed calls
without ``max_seqlen`` that read a given offsets tensor on the host only once."""

import pytest
import torch

from kernelops import flash_attention
from kernelops.modules import packed_offsets
from kernelops.modules.packed_offsets import LongestLengths
from tests.attention_checks import assert_matches, reference
from tests.conftest import DEVICE


def _cu(lengths, device="cpu"):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)


def test_lengths_are_remembered_per_tensor_pair_and_version():
    memo = LongestLengths()
    cq, ck = _cu([3, 5]), _cu([4, 4])
    assert memo.get(cq, ck) is None
    memo.put(cq, ck, (5, 4))
    assert memo.get(cq, ck) == (5, 4)
    assert memo.get(ck, cq) is None  # the pair is ordered
    assert memo.get(cq.clone(), ck) is None  # equal values, another tensor: read again
    cq[1] = 4  # in place: the version counter moves
    assert memo.get(cq, ck) is None


def test_a_dead_tensor_never_answers_for_a_new_one():
    memo = LongestLengths()
    cq, ck = _cu([3, 5]), _cu([4, 4])
    memo.put(cq, ck, (5, 4))
    key = (id(cq), id(ck))
    del cq
    entry = memo._entries[key]  # noqa: SLF001
    assert entry[0]() is None  # the weak reference died with the tensor
    fresh = [_cu([7, 7]) for _ in range(64)]  # new tensors, some may reuse the dead one's id
    assert all(memo.get(t, ck) is None for t in fresh)


def test_inference_tensors_are_not_remembered_and_the_table_is_bounded():
    memo = LongestLengths(size=4)
    with torch.inference_mode():
        cq, ck = _cu([3, 5]), _cu([4, 4])
    memo.put(cq, ck, (5, 4))
    assert memo.get(cq, ck) is None
    keep = [(_cu([i, 1]), _cu([1, i])) for i in range(1, 7)]
    for cq, ck in keep:
        memo.put(cq, ck, (1, 1))
    assert len(memo._entries) <= 4  # noqa: SLF001


@pytest.mark.gpu
def test_cuda_offsets_without_bounds_are_read_once_until_changed(monkeypatch):
    reads = []
    original = packed_offsets.check_offsets_host
    monkeypatch.setattr(packed_offsets, "check_offsets_host", lambda *a: reads.append(a[0]) or original(*a))
    lengths = [9, 0, 30, 1]
    cu = _cu(lengths, DEVICE)
    q, k, v = (torch.randn(40, 4, 32, device=DEVICE, dtype=torch.float16) for _ in range(3))
    for _ in range(3):
        out = flash_attention(q, k, v, causal=True, cum_seqlens_q=cu, cum_seqlens_k=cu)
    assert len(reads) == 2  # cum_seqlens_q and cum_seqlens_k, first call only
    cu[1:] = _cu([20, 10, 5, 5], DEVICE)[1:]  # in place: read again, and the results follow
    out = flash_attention(q, k, v, causal=True, cum_seqlens_q=cu, cum_seqlens_k=cu)
    assert len(reads) == 4
    for a, b in zip(cu.tolist(), cu.tolist()[1:]):
        if b > a:
            args = (q[None, a:b], k[None, a:b], v[None, a:b])
            assert_matches("out", out[None, a:b], reference(*args, causal=True)[0],
                           reference(*args, causal=True, dtype=torch.float16)[0], torch.float16)


def test_an_offset_error_shows_the_packed_tensor_shape():
    cu = _cu([5, 10])
    for packed_q, packed_k, name, shown in [
        (torch.Size([16, 8, 32]), torch.Size([15, 2, 32]), "cum_seqlens_q", "query.shape=(16, 8, 32)"),
        (torch.Size([15, 8, 32]), torch.Size([17, 2, 32]), "cum_seqlens_k", "key.shape=(17, 2, 32)"),
        (16, 15, "cum_seqlens_q", "query.shape[0]=16"),  # a bare token count is named as such
    ]:
        with pytest.raises(ValueError) as caught:
            packed_offsets.check_offset_values(cu, cu, packed_q, packed_k, None, None)
        message = str(caught.value)
        assert message.startswith(f"{name}[-1]=15 must equal the packed token count") and shown in message
    assert packed_offsets.check_offset_values(cu, cu, torch.Size([15, 8, 32]), torch.Size([15, 2, 32]), None,
                                              None) == (10, 10)


def test_a_packed_call_with_bad_offsets_names_the_query_shape():
    q = torch.randn(16, 8, 32)
    k = v = torch.randn(15, 2, 32)
    with pytest.raises(ValueError, match=r"cum_seqlens_q\[-1\]=15 .*query\.shape=\(16, 8, 32\)"):
        flash_attention(q, k, v, cum_seqlens_q=_cu([5, 10]), cum_seqlens_k=_cu([5, 10]))
