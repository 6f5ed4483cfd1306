"""Tests for kernelops.ops.agreement: ranks agree on one config per key through a store.

In-process tests stand two 'ranks' up as two Harnesses (own caches, own fake-timed autotuner)
sharing one ``torch.distributed.HashStore``; the last tests spawn 2 gloo processes, where the
chain finds the default process group's store itself. No kernel runs (ToyOp computes x * alpha).
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings

import pytest
import torch
import torch.distributed as dist

import kernelops.ops.selectors as selectors_mod
from kernelops.ops import config_overlay
from kernelops.ops.agreement import ANSWER, PREFIX, RankAgreement
from kernelops.ops.cache import make_entry
from kernelops.ops.selectors import RANKS
from tests.ops.test_executor import Harness, _fake_cuda
from tests.ops.toy_op import FAKE_CUDA, FWD_SPACE, HEURISTIC, HEURISTIC_BWD, ToyConfig

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")


def _times(winner: int) -> dict:
    """Fake fwd times where ``FWD_SPACE[winner]`` is fastest."""
    times = {("fwd", p): 5.0 for p in FWD_SPACE}
    times[("fwd", FWD_SPACE[winner])] = 1.0
    return times


def _tuned(winner: int) -> ToyConfig:
    return ToyConfig(FWD_SPACE[winner], HEURISTIC_BWD)


def _rank(tmp_path, store, rank: int, winner: int, **kw) -> Harness:
    """One rank: its own cache folder and timer (preferring ``FWD_SPACE[winner]``), the shared store."""
    h = Harness(tmp_path / f"rank{rank}", policy="auto", times=_times(winner))
    h.chain.agreement = RankAgreement(store, rank, **kw)
    return h


def _make_store(kind: str, tmp_path):
    if kind == "hash":
        return dist.HashStore()
    if kind == "file":
        return dist.FileStore(str(tmp_path / "filestore"), 1)
    tcp = dist.TCPStore("127.0.0.1", 0, 1, True)  # torchrun's kind (port 0: a free one)
    return tcp if kind == "tcp" else dist.PrefixStore("default_pg", tcp)


@pytest.fixture
def store():
    return dist.HashStore()


@pytest.fixture
def gpu_like(monkeypatch):
    """Calls look as if on a GPU and tuning is allowed (``blocked['reason']`` may refuse it)."""
    blocked = {"reason": None}
    _fake_cuda(monkeypatch, blocked)
    return blocked


def _store_key(h: Harness, x) -> str:
    """The store key of ``h``'s call on ``x`` (calls run on the fake GPU, policy auto)."""
    return PREFIX + h.context(x, device=FAKE_CUDA).disk_key + "|policy=auto"


def _x(n: int) -> torch.Tensor:
    return torch.randn(n)


@pytest.mark.parametrize("kind", ["hash", "file", "tcp", "prefix"])
def test_the_first_rank_tunes_and_the_other_adopts_its_answer(tmp_path, gpu_like, kind):
    store = _make_store(kind, tmp_path)
    r0, r1 = _rank(tmp_path, store, 0, winner=1), _rank(tmp_path, store, 1, winner=2)
    x = _x(8)
    assert r0.call(x) == _tuned(1)
    assert r1.call(x) == _tuned(1)  # rank 1's own timer would have picked FWD_SPACE[2]
    assert len(r0.timer.calls) == len(FWD_SPACE) and r1.timer.calls == []
    expl = r1.explain(x)  # a new resolution reads the store again
    assert expl.selector == RANKS and expl.entry["rank"] == 0 and expl.entry["rank_source"] == "autotune"
    assert expl.declined == [(RANKS, "rank 0 resolved this key first (from 'autotune')")]
    own = r0.explain(x)  # the rank that tuned reads its own answer back from its memory, entry and all
    assert own.selector == "memory" and own.config == _tuned(1) and own.entry["ms"] == 1.0
    # the adopting rank wrote nothing to its own disk cache
    assert r1.cache.get_disk(r1.context(x, device=FAKE_CUDA).disk_key) is None


def test_ranks_meeting_different_keys_resolve_their_own(tmp_path, store, gpu_like):
    """Packed batches of other lengths give ranks other keys: neither waits, neither takes the
    other's config (a broadcast inside the tuner paired such calls up)."""
    r0, r1 = _rank(tmp_path, store, 0, winner=1), _rank(tmp_path, store, 1, winner=2)
    assert r0.call(_x(8)) == _tuned(1)
    assert r1.call(_x(100)) == _tuned(2)
    assert len(r0.timer.calls) == len(r1.timer.calls) == len(FWD_SPACE)
    assert r1.call(_x(8)) == _tuned(1) and r0.call(_x(100)) == _tuned(2)  # then each adopts the other's
    assert len(r0.timer.calls) == len(r1.timer.calls) == len(FWD_SPACE)


@pytest.mark.parametrize("first", [0, 1])
def test_a_rank_with_a_disk_entry_and_one_without_agree(tmp_path, store, gpu_like, first):
    """Node-local caches disagree: whichever rank meets the key first answers for both."""
    x = _x(8)
    r0, r1 = _rank(tmp_path, store, 0, winner=1), _rank(tmp_path, store, 1, winner=2)
    r0.cache.put_disk(r0.context(x, device=FAKE_CUDA).disk_key, make_entry(_tuned(3).to_dict(), ms=1.0))
    if first == 0:
        assert r0.call(x) == _tuned(3) and r1.call(x) == _tuned(3)
        assert r0.timer.calls == r1.timer.calls == []
    else:
        assert r1.call(x) == _tuned(2) and r0.call(x) == _tuned(2)
        assert r0.timer.calls == [] and len(r1.timer.calls) == len(FWD_SPACE)


def test_a_rank_waits_briefly_for_an_answer_from_a_cache(tmp_path, store, gpu_like):
    """At its first meeting with a claimed key a rank waits up to wait_s: long enough for a
    claimer that answers from its caches (here it takes 0.2 s or more)."""
    x = _x(8)
    r0, r1 = _rank(tmp_path, store, 0, winner=1), _rank(tmp_path, store, 1, winner=2, wait_s=30)
    resolving, release = threading.Event(), threading.Event()
    r0.timer.on_call = lambda fn: (resolving.set(), release.wait(10))
    results = {}
    t0 = threading.Thread(target=lambda: results.__setitem__(0, r0.call(x)))
    t0.start()
    assert resolving.wait(10)  # rank 0 holds the claim
    t1 = threading.Thread(target=lambda: results.__setitem__(1, r1.call(x)))
    t1.start()
    t1.join(0.2)
    assert t1.is_alive() and 1 not in results  # rank 1 waits for rank 0's answer ...
    release.set()
    t0.join(10), t1.join(10)
    assert results == {0: _tuned(1), 1: _tuned(1)}  # ... and adopts it
    assert r1.timer.calls == []


def test_a_rank_runs_the_heuristic_while_another_tunes(tmp_path, store, gpu_like):
    """Past its brief wait a rank does not block (the tuning rank's device syncs may wait for a
    collective this rank has yet to queue): it runs the heuristic, unremembered, and adopts the
    answer at a call after it is published."""
    x = _x(8)
    r0, r1 = _rank(tmp_path, store, 0, winner=1), _rank(tmp_path, store, 1, winner=2, wait_s=0.05)
    tuning, release = threading.Event(), threading.Event()
    r0.timer.on_call = lambda fn: (tuning.set(), release.wait(10))
    t0 = threading.Thread(target=r0.call, args=(x,))
    t0.start()
    assert tuning.wait(10)
    assert r1.call(x) == HEURISTIC
    expl = r1.explain(x)  # no wait past the first meeting
    assert expl.selector == "heuristic" and expl.declined[0][1].startswith("rank 0 is resolving this key")
    assert r1.ex._resolved == {} and r1.timer.calls == []  # noqa: SLF001 - not remembered, not tuned
    release.set()
    t0.join(10)
    assert r1.call(x) == _tuned(1) and r1.call(x) == _tuned(1)


def test_a_claimer_that_raises_releases_the_key(tmp_path, store, gpu_like):
    x = _x(8)
    r0, r1 = _rank(tmp_path, store, 0, winner=1), _rank(tmp_path, store, 1, winner=2)

    def broken(inputs, device):
        raise RuntimeError("heuristic broke")

    r0.op.heuristic_config = broken
    with pytest.raises(RuntimeError, match="heuristic broke"):
        r0.call(x)
    assert not store.check([_store_key(r0, x)])
    assert r1.call(x) == _tuned(2)  # rank 1 claims the key itself


def test_a_stale_claim_is_resolved_locally(tmp_path, store, gpu_like):
    x = _x(8)
    r1 = _rank(tmp_path, store, 1, winner=2, wait_s=0.01, stale_s=0.2)
    key = _store_key(r1, x)
    store.set(key, "claim:0:1234:0")  # a rank that died resolving it
    assert r1.call(x) == HEURISTIC  # at first the claim may be live: the heuristic, unremembered
    time.sleep(0.25)
    with pytest.warns(RuntimeWarning, match="older than 0 s .*rank may have died"):
        assert r1.call(x) == _tuned(2)
    assert store.get(key) == b"claim:0:1234:0"  # the dead rank's claim is left as it was


def test_a_heuristic_is_not_published(tmp_path, store, gpu_like):
    """Every rank computes the same heuristic: a rank under policy=never shares nothing, and a
    rank that may tune still tunes."""
    x = _x(8)
    r0, r1 = _rank(tmp_path, store, 0, winner=1), _rank(tmp_path, store, 1, winner=2)
    r0.chain.policy = "never"
    assert r0.call(x) == HEURISTIC
    assert store.num_keys() == 0
    assert r1.call(x) == _tuned(2)


def test_ranks_under_other_policies_do_not_share(tmp_path, store, gpu_like):
    x = _x(8)
    r0, r1 = _rank(tmp_path, store, 0, winner=1), _rank(tmp_path, store, 1, winner=2)
    r0.cache.put_disk(r0.context(x, device=FAKE_CUDA).disk_key, make_entry(_tuned(3).to_dict(), ms=1.0))
    assert r0.call(x) == _tuned(3)  # policy=auto: from its disk
    r1.chain.policy = "always"  # caches ignored: rank 1 tunes rather than adopt a cached answer
    assert r1.call(x) == _tuned(2)


def test_a_heuristic_given_while_capturing_is_not_published(tmp_path, store, gpu_like):
    x = _x(8)
    r0, r1 = _rank(tmp_path, store, 0, winner=1), _rank(tmp_path, store, 1, winner=2)
    gpu_like["reason"] = "a CUDA graph is being captured"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the capture warning
        assert r0.call(x) == HEURISTIC
    assert not store.check([_store_key(r0, x)])  # released, not published
    gpu_like["reason"] = None
    assert r1.call(x) == _tuned(2)
    assert r0.call(x) == _tuned(2)  # rank 0's capture is over: it adopts rank 1's tuning


def test_cfg_and_overlay_calls_never_touch_the_store(tmp_path, store, gpu_like):
    x = _x(8)
    r0 = _rank(tmp_path, store, 0, winner=1)
    given = ToyConfig(FWD_SPACE[3], HEURISTIC_BWD)
    assert r0.call(x, cfg=given) == given
    with config_overlay({r0.op.name: given}):
        assert r0.call(x) == given
    assert store.num_keys() == 0


@pytest.mark.parametrize("answer, match", [
    ({"config": {"fwd_params": {"no_such_field": 1}}, "source": "autotune", "rank": 0}, "rank 0's entry is unusable"),
    ({"config": _tuned(1).to_dict(), "rank": 0}, r"answer for .* is unusable \(KeyError"),
    ("{not json", r"answer for .* is unusable \(JSONDecodeError"),
])
def test_an_answer_that_does_not_fit_is_resolved_locally(tmp_path, store, gpu_like, answer, match):
    x = _x(8)
    r1 = _rank(tmp_path, store, 1, winner=2)
    store.set(_store_key(r1, x), ANSWER + (answer if isinstance(answer, str) else json.dumps(answer)))
    with pytest.warns(RuntimeWarning, match=match):
        assert r1.call(x) == _tuned(2)


class _Store:
    """A HashStore whose methods named in ``fail`` raise."""

    def __init__(self, *fail):
        self.inner, self.fail = dist.HashStore(), fail

    def __getattr__(self, name):
        if name in self.fail:
            def broken(*args):
                raise RuntimeError("connection reset")
            return broken
        return getattr(self.inner, name)


def test_a_failing_store_degrades_to_local_resolution(tmp_path, gpu_like):
    h = _rank(tmp_path, _Store("compare_set"), 1, winner=2)
    with pytest.warns(RuntimeWarning, match="store failed .*connection reset"):
        assert h.call(_x(8)) == _tuned(2)


def test_a_failed_publish_releases_the_claim(tmp_path, gpu_like):
    store = _Store("set")
    h = _rank(tmp_path, store, 0, winner=2)
    with pytest.warns(RuntimeWarning, match="could not publish"):
        assert h.call(_x(8)) == _tuned(2)
    assert store.inner.num_keys() == 0  # no claim left for the other ranks to wait on


def test_a_broken_process_group_lookup_degrades_to_local_resolution(tmp_path, gpu_like):
    def find():
        raise RuntimeError("no default group")

    h = Harness(tmp_path, times=_times(2))
    h.chain.agreement = RankAgreement(find=find)
    with pytest.warns(RuntimeWarning, match="store is unavailable .*no default group"):
        assert h.call(_x(8)) == _tuned(2)


def test_without_a_process_group_the_store_is_never_looked_up(tmp_path, gpu_like):
    h = Harness(tmp_path, times=_times(2))
    assert isinstance(h.chain.agreement, RankAgreement) and h.chain.agreement.endpoint() is None
    assert h.call(_x(8)) == _tuned(2) and h.explain(_x(8)).selector == "memory"


def test_store_and_rank_come_together():
    with pytest.raises(ValueError, match="give both store and rank"):
        RankAgreement(dist.HashStore())


# --- two gloo processes: the default process group's store ---------------------------------------
def _rank_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    import pathlib

    import kernelops.ops.executor as executor_mod
    from tests.ops.toy_op import FAKE_CUDA

    executor_mod.device_info = lambda device=None: FAKE_CUDA
    selectors_mod.autotune_blocker = lambda op, inputs, device: None
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        h = Harness(pathlib.Path(out_dir) / f"rank{rank}", times=_times(1 + rank))
        shared, own = _x(8), _x(100 if rank else 30)  # one key both meet, one key each
        if rank == 1:
            dist.barrier()  # rank 0 meets the shared key first
        configs = {"shared": h.call(shared).to_dict()}
        if rank == 0:
            dist.barrier()
        configs["own"] = h.call(own).to_dict()
        dist.barrier()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"configs": configs, "timed": len(h.timer.calls)}, f)
    finally:
        dist.destroy_process_group()


def test_ranks_of_a_process_group_agree_through_its_store(tmp_path):
    import torch.multiprocessing as mp

    if not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    mp.spawn(_rank_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["configs"]["shared"] == r1["configs"]["shared"] == _tuned(1).to_dict()
    assert r0["configs"]["own"] == _tuned(1).to_dict() and r1["configs"]["own"] == _tuned(2).to_dict()
    assert r0["timed"] == 2 * len(FWD_SPACE) and r1["timed"] == len(FWD_SPACE)  # rank 1 tuned only its own key



# --- GPUs: the real flash_attention, tuned by one rank -----------------------------------------
def _gpu_worker(rank: int, backend: str, init_file: str, out_dir: str) -> None:
    from kernelops import flash_attention
    from kernelops.modules.flash_attention import FlashAttention
    from kernelops.ops import default_executor
    from tests.attention_checks import assert_matches, make_qkv, reference

    os.environ["KERNELOPS_CACHE_DIR"] = os.path.join(out_dir, f"cache{rank}")  # each rank's own, empty
    os.environ["KERNELOPS_AUTOTUNE"] = "always"  # shipped caches ignored: every key is tuned
    os.environ["KERNELOPS_AUTOTUNE_BUDGET_S"] = "15"
    dev = torch.device("cuda", rank if backend == "nccl" else 0)  # gloo: both ranks on one GPU
    torch.cuda.set_device(dev)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=2,
                            **({"device_id": dev} if backend == "nccl" else {}))
    try:
        seen = {}
        # the shared key first on rank 0, then each rank's own key (other lengths, other buckets)
        for name, S in (("shared", 256), ("own", 1000 if rank else 300)):
            if name == "shared" and rank == 1:
                dist.barrier()
            q, k, v = make_qkv(2, S, S, 4, 2, 64, torch.bfloat16, dev, requires_grad=False)
            expl = default_executor().explain(FlashAttention(), query=q, key=k, value=v, causal=True)
            out = flash_attention(q, k, v, causal=True)
            ref, _, _ = reference(q, k, v, causal=True)
            low, _, _ = reference(q, k, v, causal=True, dtype=torch.bfloat16)
            assert_matches("out", out, ref, low, torch.bfloat16)
            seen[name] = {"selector": expl.selector, "config": expl.config.to_dict(),
                          "rank": (expl.entry or {}).get("rank")}
            if name == "shared" and rank == 0:
                dist.barrier()
        total = torch.full((4,), float(rank + 1), device=dev if backend == "nccl" else "cpu")
        dist.all_reduce(total)  # the group still works after the store traffic
        seen["all_reduce"] = total.tolist()
        with open(os.path.join(out_dir, f"{backend}{rank}.json"), "w") as f:
            json.dump(seen, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [
    pytest.param("gloo", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
    pytest.param("nccl", marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")),
])
def test_gpu_ranks_tune_each_key_once_and_run_the_same_config(tmp_path, backend):
    """Two ranks (two GPUs over NCCL, or one GPU shared over gloo): the shared key is tuned by
    rank 0 alone and rank 1 runs its config; each rank's own key is tuned by that rank, while the
    other is elsewhere (no collective pairs them up)."""
    import torch.multiprocessing as mp

    if not (dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available()):
        pytest.skip(f"{backend} is not available")
    mp.spawn(_gpu_worker, args=(backend, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"{backend}{r}.json").read_text()) for r in range(2))
    assert r0["shared"]["selector"] == "autotune" and r1["shared"]["selector"] == RANKS
    assert r1["shared"]["rank"] == 0 and r1["shared"]["config"] == r0["shared"]["config"]
    assert r0["own"]["selector"] == r1["own"]["selector"] == "autotune"
    assert r0["all_reduce"] == r1["all_reduce"] == [3.0] * 4
