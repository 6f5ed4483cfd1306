"""Tests for the Executor and the selector chain (kernelops.ops.executor / selectors), with ToyOp.

No kernel runs here: ToyOp computes ``x * alpha`` and records the config each call ran with. The
autotuner is exercised on CPU by letting the autotune blocker answer None and giving the
Autotuner a FakeTimer (deterministic ms per params) instead of CUDA-event timing.
"""

from __future__ import annotations

import datetime
import threading
import warnings

import pytest
import torch

import kernelops.ops.executor as executor_mod
import kernelops.ops.selectors as selectors_mod
from kernelops.ops import (
    Autotuner, AutotunePolicy, BwdParams, ConfigCache, ConfigSelectorChain, Executor, Explanation, FwdParams, PretunedStore,
    config_overlay,
)
from kernelops.ops.cache import make_entry
from kernelops.ops.device import device_info, versions
from kernelops.ops.keys import key_text
from kernelops.ops.pretuned import write_pretuned_file
from kernelops.ops.selectors import TUNED_HERE, Context, current_overlay
from tests.ops.toy_op import (
    CPU, FAKE_CUDA, FWD_SPACE, HEURISTIC, HEURISTIC_BWD, HEURISTIC_FWD, FakeTimer, HotToyOp, ToyConfig, ToyOp,
)

ORDER = ["explicit", "overlay", "memory", "disk", "pretuned", "autotune", "heuristic"]

# fwd times (ms) the fake timer reports: FWD_SPACE[2] wins, FWD_SPACE[3] is the runner-up
TIMES = {("fwd", HEURISTIC_FWD): 5.0, ("fwd", FWD_SPACE[1]): 4.0, ("fwd", FWD_SPACE[2]): 1.0,
         ("fwd", FWD_SPACE[3]): 2.0}
WINNER = ToyConfig(FWD_SPACE[2], HEURISTIC_BWD)
RUNNER_UP = ToyConfig(FWD_SPACE[3], HEURISTIC_BWD)

# one distinct config per source, so the config that ran tells which source answered
GIVEN = {
    "explicit": ToyConfig(FwdParams(16, 16, 2, 1)),            # bwd_params left None on purpose
    "overlay": ToyConfig(FwdParams(16, 32, 2, 1)),             # idem
    "memory": ToyConfig(FwdParams(32, 32, 2, 1), HEURISTIC_BWD),
    "disk": ToyConfig(FwdParams(32, 16, 2, 1), HEURISTIC_BWD),
    "pretuned": ToyConfig(FwdParams(16, 64, 2, 1), HEURISTIC_BWD),
}
EXPECTED = {
    "explicit": ToyConfig(FwdParams(16, 16, 2, 1), HEURISTIC_BWD),  # completed from the heuristic
    "overlay": ToyConfig(FwdParams(16, 32, 2, 1), HEURISTIC_BWD),
    "memory": GIVEN["memory"], "disk": GIVEN["disk"], "pretuned": GIVEN["pretuned"],
    "autotune": WINNER, "heuristic": HEURISTIC,
}
ENTRY_FIELDS = {"config", "ms", "heuristic_ms", "runner_up", "runner_up_ms", "candidates", "source", "created",
                "versions"}


class Harness:
    """One 'process': a ToyOp, a cache/pretuned store under tmp_path, a fake-timed autotuner."""

    def __init__(self, tmp_path, policy="auto", times=TIMES, op=None):
        self.op = op if op is not None else ToyOp()
        self.cache_dir = tmp_path / "cache"
        self.pretuned_dir = tmp_path / "pretuned"
        self.cache = ConfigCache(self.cache_dir)
        self.store = PretunedStore(self.pretuned_dir)
        self.timer = FakeTimer(times)
        self.tuner = Autotuner(progress=False)
        self.tuner.time_fn = self.timer
        self.chain = ConfigSelectorChain(cache=self.cache, pretuned=self.store, autotuner=self.tuner, policy=policy)
        self.ex = Executor(self.chain)

    def context(self, x, device=CPU, policy=AutotunePolicy.AUTO) -> Context:
        inputs = self.op.prepare(x=x, alpha=2.0)
        return Context(self.op, inputs, self.op.key(inputs), device, policy)

    def put_memory(self, x, config, source="autotune"):
        self.cache.put_memory(self.context(x).memory_key, make_entry(config.to_dict(), ms=1.0, source=source))

    def put_disk(self, x, config):
        self.cache.put_disk(self.context(x).disk_key, make_entry(config.to_dict(), ms=1.0, source="autotune"))

    def put_pretuned(self, x, config, n=None):
        key = self.op.key(self.op.prepare(x=x, alpha=2.0))
        if n is not None:
            key = tuple((f, n if f == "n" else v) for f, v in key)
        write_pretuned_file(self.pretuned_dir, self.op.name, {key_text(key): make_entry(config.to_dict(), ms=1.0)},
                            CPU)
        self.store.reload()

    def explain(self, x, **kw) -> Explanation:
        return self.ex.explain(self.op, x=x, alpha=2.0, **kw)

    def call(self, x, **kw):
        out = self.ex(self.op, x=x, alpha=2.0, **kw)
        torch.testing.assert_close(out, x * 2.0)
        return self.op.runs[-1]

    def count_selects(self, monkeypatch) -> list:
        calls = []
        original = self.chain.select

        def counting(ctx):
            answer = original(ctx)
            calls.append(answer[0].source)
            return answer

        monkeypatch.setattr(self.chain, "select", counting)
        return calls


@pytest.fixture
def x():
    return torch.arange(8, dtype=torch.float32)


@pytest.fixture
def allow_autotune(monkeypatch):
    """Tuning is allowed on CPU: the blocker answers None (the FakeTimer does the 'timing')."""
    monkeypatch.setattr(selectors_mod, "autotune_blocker", lambda op, inputs, device: None)


def test_cpu_device_info_matches_the_test_constant():
    assert device_info("cpu") == CPU


# --- selector order ---------------------------------------------------------------------------
@pytest.mark.parametrize("winner", ORDER)
def test_selector_order(tmp_path, monkeypatch, x, winner):
    """Every source from ``winner`` down the chain can answer; the first one in the order wins."""
    h = Harness(tmp_path)
    present = ORDER[ORDER.index(winner):]
    if "memory" in present:
        h.put_memory(x, GIVEN["memory"])
    if "disk" in present:
        h.put_disk(x, GIVEN["disk"])
    if "pretuned" in present:
        h.put_pretuned(x, GIVEN["pretuned"])
    if "autotune" in present:
        monkeypatch.setattr(selectors_mod, "autotune_blocker", lambda op, inputs, device: None)
    kw = {"cfg": GIVEN["explicit"]} if "explicit" in present else {}
    overlay = {"toy_scale": GIVEN["overlay"]} if "overlay" in present else {}

    with config_overlay(overlay):
        expl = h.explain(x, **kw)
        assert expl.selector == winner
        assert expl.config == EXPECTED[winner]
        assert [name for name, _ in expl.declined] == ORDER[:ORDER.index(winner)]
        assert h.call(x, **kw) == EXPECTED[winner]
    if winner != "autotune":
        assert h.timer.calls == []  # a selector earlier in the chain answered: nothing was tuned
    else:
        assert len(h.timer.calls) == len(FWD_SPACE)


def test_declined_reasons_in_order(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    expl = h.explain(x)
    assert expl.selector == "heuristic" and expl.config == HEURISTIC
    assert expl.op == "toy_scale" and expl.platform == "torch" and expl.entry is None
    assert expl.key == (("dtype", "float32"), ("n", 8))
    reasons = dict(expl.declined)
    assert [name for name, _ in expl.declined] == ORDER[:-1]
    assert reasons["explicit"] == "no cfg= argument"
    assert reasons["overlay"] == "no config_overlay for this op"
    assert reasons["memory"] == "not in this process's memory cache"
    assert reasons["disk"] == f"no entry in {h.cache_dir}"
    assert "no usable cpu/toy_scale.json" in reasons["pretuned"]
    assert "no capability fallback" in reasons["pretuned"]
    assert reasons["autotune"] == "policy=never"
    text = str(expl)
    assert "config from 'heuristic' on platform 'torch'" in text
    assert "  autotune: policy=never" in text
    assert text.index("explicit:") < text.index("memory:") < text.index("pretuned:") < text.index("autotune:")


def test_declined_autotune_reason_on_cpu_with_policy_auto(tmp_path, x):
    expl = Harness(tmp_path, policy="auto").explain(x)
    assert expl.selector == "heuristic"
    assert dict(expl.declined)["autotune"] == "device cpu is not a GPU"


def test_unusable_disk_entry_is_declined_and_the_chain_goes_on(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    h.cache.put_disk(h.context(x).disk_key, make_entry({"not_a_field": 1}))
    h.put_pretuned(x, GIVEN["pretuned"])
    expl = h.explain(x)
    assert expl.selector == "pretuned" and expl.config == GIVEN["pretuned"]
    assert dict(expl.declined)["disk"].startswith("disk entry is unusable")


# --- explicit cfg= ------------------------------------------------------------------------------
def test_explicit_cfg_is_completed_and_never_cached(tmp_path, monkeypatch, x, allow_autotune):
    h = Harness(tmp_path)
    selects = h.count_selects(monkeypatch)
    ctx = h.context(x)
    for _ in range(2):
        assert h.call(x, cfg=GIVEN["explicit"]) == EXPECTED["explicit"]
    assert selects == ["explicit", "explicit"]  # cfg= calls always ask the chain (no fast path)
    assert h.ex.explain(h.op, x=x, alpha=2.0, cfg=GIVEN["explicit"]).selector == "explicit"
    assert h.timer.calls == []
    assert h.cache.get_memory(ctx.memory_key) is None
    assert h.cache.get_disk(ctx.disk_key) is None
    assert h.cache.disk_items() == []
    assert h.ex._resolved == {}  # noqa: SLF001 - the fast-path table stays empty

    # a following call without cfg= does not get the explicit config
    assert h.call(x) == WINNER
    assert EXPECTED["explicit"] not in h.ex._resolved.values()  # noqa: SLF001
    assert h.cache.get_memory(ctx.memory_key)["config"] == WINNER.to_dict()


def test_explicit_cfg_bypasses_a_memoized_fast_path(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    assert h.call(x) == HEURISTIC  # memoized (CPU: tuning ruled out for good)
    assert h.call(x, cfg=GIVEN["explicit"]) == EXPECTED["explicit"]
    assert h.call(x) == HEURISTIC


def test_explicit_cfg_fully_given_is_used_as_is(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    full = ToyConfig(FwdParams(16, 16, 2, 1), BwdParams(32, 32, 2, 1))
    h.op.counts.clear()
    assert h.call(x, cfg=full) == full
    assert h.op.counts["heuristic_config"] == 0  # nothing to complete


def test_explicit_cfg_of_wrong_type_raises(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    with pytest.raises(TypeError, match="cfg must be a ToyConfig"):
        h.call(x, cfg={"fwd_params": None})
    assert h.op.runs == []


def test_prepare_errors_name_the_argument(tmp_path):
    h = Harness(tmp_path, policy="never")
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        h.ex(h.op, x=[1.0, 2.0], alpha=1.0)
    with pytest.raises(ValueError, match=r"x\.shape=torch\.Size\(\[2, 2\]\)"):
        h.ex(h.op, x=torch.ones(2, 2), alpha=1.0)
    with pytest.raises(TypeError, match="alpha"):
        h.ex(h.op, x=torch.ones(2), alpha="2")
    assert h.op.runs == []


# --- overlay ------------------------------------------------------------------------------------
def test_overlay_nesting_inner_wins_and_is_restored(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    outer, inner = GIVEN["overlay"], GIVEN["explicit"]
    assert current_overlay() == {}
    with config_overlay({"toy_scale": outer, "other_op": "keep"}):
        assert h.explain(x).selector == "overlay"
        assert h.call(x) == EXPECTED["overlay"]
        with config_overlay({"toy_scale": inner}):
            assert h.call(x) == EXPECTED["explicit"]
            assert current_overlay()["other_op"] == "keep"  # nested overlays merge
        assert h.call(x) == EXPECTED["overlay"]  # restored after the inner block
        # an explicit cfg= still beats the overlay
        assert h.call(x, cfg=GIVEN["memory"]) == GIVEN["memory"]
    assert current_overlay() == {}
    expl = h.explain(x)
    assert expl.selector == "heuristic"
    assert h.call(x) == HEURISTIC


def test_overlay_restored_after_an_exception(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    with pytest.raises(RuntimeError):
        with config_overlay({"toy_scale": GIVEN["overlay"]}):
            raise RuntimeError("boom")
    assert current_overlay() == {}
    assert h.call(x) == HEURISTIC


def test_overlay_is_not_cached_and_beats_a_memoized_fast_path(tmp_path, monkeypatch, x, allow_autotune):
    h = Harness(tmp_path)
    ctx = h.context(x)
    assert h.call(x) == WINNER  # tuned, memoized in the fast path and cached
    tuned_entry = h.cache.get_memory(ctx.memory_key)
    with config_overlay({"toy_scale": GIVEN["overlay"]}):
        assert h.call(x) == EXPECTED["overlay"]
        assert h.call(x) == EXPECTED["overlay"]
    assert h.call(x) == WINNER
    assert h.cache.get_memory(ctx.memory_key) == tuned_entry
    assert [e["config"] for _, e in h.cache.disk_items()] == [WINNER.to_dict()]
    assert EXPECTED["overlay"] not in h.ex._resolved.values()  # noqa: SLF001


def test_overlay_for_another_op_is_ignored(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    with config_overlay({"other_op": GIVEN["overlay"]}):
        expl = h.explain(x)
        assert h.call(x) == HEURISTIC
    assert expl.selector == "heuristic"


def test_overlay_is_local_to_its_thread(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    seen = []
    with config_overlay({"toy_scale": GIVEN["overlay"]}):
        t = threading.Thread(target=lambda: seen.append(h.explain(x).selector))
        t.start()
        t.join()
        assert h.explain(x).selector == "overlay"
    assert seen == ["heuristic"]


# --- memory and disk ----------------------------------------------------------------------------
def test_autotune_winner_goes_to_memory_and_disk(tmp_path, x, allow_autotune):
    h = Harness(tmp_path)
    ctx = h.context(x)
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    expl = h.explain(x)
    after = datetime.datetime.now(datetime.timezone.utc)
    assert expl.selector == "autotune" and expl.config == WINNER
    mem = h.cache.get_memory(ctx.memory_key)
    disk = h.cache.get_disk(ctx.disk_key)
    # memory holds the disk entry plus the marker that this process tuned it (policy=always)
    assert mem == {**disk, TUNED_HERE: True} and disk == expl.entry
    assert set(disk) == ENTRY_FIELDS
    assert disk["config"] == WINNER.to_dict()
    assert disk["ms"] == 1.0 and disk["heuristic_ms"] == 5.0
    assert disk["runner_up"] == RUNNER_UP.to_dict() and disk["runner_up_ms"] == 2.0
    assert disk["candidates"] == len(FWD_SPACE)  # heuristic + 3 others, all timed
    assert disk["source"] == "autotune"
    assert disk["versions"] == versions()
    created = datetime.datetime.fromisoformat(disk["created"])
    assert created.tzinfo is not None
    assert before <= created <= after  # stamped when it was tuned, in UTC
    assert len(h.timer.calls) == len(FWD_SPACE)

    # the next call is a memory hit: nothing is re-tuned
    expl2 = h.explain(x)
    assert expl2.selector == "memory" and expl2.config == WINNER
    assert len(h.timer.calls) == len(FWD_SPACE)


def test_disk_hit_in_a_new_process_then_memory(tmp_path, x, allow_autotune):
    first = Harness(tmp_path)
    assert first.explain(x).selector == "autotune"
    first.cache.close()

    second = Harness(tmp_path)  # a new process: same cache folder, empty memory
    expl = second.explain(x)
    assert expl.selector == "disk" and expl.config == WINNER
    assert [name for name, _ in expl.declined] == ["explicit", "overlay", "memory"]
    assert second.explain(x).selector == "memory"  # the disk hit was copied to memory
    assert second.call(x) == WINNER
    assert second.timer.calls == []


def test_disk_key_holds_versions_and_source_hash(tmp_path, x):
    ctx = Harness(tmp_path).context(x)
    v = versions()
    assert ctx.memory_key == "toy_scale|dtype=float32|n=8|device=cpu"
    assert ctx.disk_key.startswith(ctx.memory_key + "|")
    for part in (f"torch={v['torch']}", f"triton={v['triton']}", f"kernelops={v['kernelops']}",
                 f"src={ToyOp.source_hash()}"):
        assert part in ctx.disk_key.split("|")


def test_changed_source_hash_misses_the_disk(tmp_path, monkeypatch, x, allow_autotune):
    first = Harness(tmp_path)
    assert first.explain(x).selector == "autotune"
    first.cache.close()
    monkeypatch.setattr(ToyOp, "source_hash", classmethod(lambda cls: "0123456789abcdef"))
    second = Harness(tmp_path, policy="never")
    expl = second.explain(x)
    assert expl.selector == "heuristic"
    assert dict(expl.declined)["disk"] == f"no entry in {second.cache_dir}"
    assert "src=0123456789abcdef" in second.context(x).disk_key


def test_changed_versions_miss_the_disk(tmp_path, monkeypatch, x, allow_autotune):
    first = Harness(tmp_path)
    assert first.explain(x).selector == "autotune"
    first.cache.close()
    upgraded = {**versions(), "triton": "99.0.0"}
    monkeypatch.setattr(selectors_mod, "versions", lambda: upgraded)
    assert Harness(tmp_path, policy="never").explain(x).selector == "heuristic"


def test_memory_cache_is_per_bucket_and_dtype(tmp_path, x, allow_autotune):
    h = Harness(tmp_path)
    assert h.explain(x).selector == "autotune"
    assert h.explain(torch.arange(5, dtype=torch.float32)).selector == "memory"  # 5 -> bucket 8
    assert h.explain(torch.arange(9, dtype=torch.float32)).selector == "autotune"  # bucket 16
    assert h.explain(x.double()).selector == "autotune"


# --- pretuned -----------------------------------------------------------------------------------
def test_pretuned_exact_key(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    h.put_pretuned(x, GIVEN["pretuned"])
    expl = h.explain(x)
    assert expl.selector == "pretuned" and expl.config == GIVEN["pretuned"]
    assert expl.entry["source"] == "pretuned"
    assert expl.entry["how"] == "exact key in cpu/toy_scale.json"
    assert h.call(x) == GIVEN["pretuned"]
    # it was copied to memory (not to disk)
    assert h.explain(x).selector == "memory"
    assert h.cache.disk_items() == []


def test_pretuned_nearest_bucket(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    near, far = GIVEN["pretuned"], GIVEN["disk"]
    h.put_pretuned(x, near, n=16)
    h.put_pretuned(x, far, n=1024)
    expl = h.explain(torch.arange(5, dtype=torch.float32))  # bucket 8: 16 is 1 away, 1024 is 7
    assert expl.selector == "pretuned" and expl.config == near
    assert expl.entry["how"].startswith("nearest bucket (distance 1.0) 'dtype=float32|n=16'")
    # the exact entry beats a nearer-looking one
    assert h.explain(torch.arange(1000, dtype=torch.float32)).config == far


def test_pretuned_never_crosses_static_fields(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    h.put_pretuned(x.double(), GIVEN["pretuned"])  # a float64 entry only
    expl = h.explain(x)
    assert expl.selector == "heuristic"
    assert "no entry in cpu/toy_scale.json matches 'dtype=float32|n=8'" in dict(expl.declined)["pretuned"]


# --- policy -------------------------------------------------------------------------------------
def test_policy_never_does_not_tune_even_when_safe(tmp_path, x, allow_autotune):
    h = Harness(tmp_path, policy="never")
    expl = h.explain(x)
    assert expl.selector == "heuristic"
    assert dict(expl.declined)["autotune"] == "policy=never"
    assert h.timer.calls == []


def test_policy_never_still_uses_caches(tmp_path, x):
    h = Harness(tmp_path, policy="never")
    h.put_disk(x, GIVEN["disk"])
    assert h.explain(x).selector == "disk"


def test_policy_auto_uses_disk_and_pretuned_before_tuning(tmp_path, x, allow_autotune):
    h = Harness(tmp_path, policy="auto")
    h.put_pretuned(x, GIVEN["pretuned"])
    assert h.explain(x).selector == "pretuned"
    assert h.timer.calls == []


def test_policy_always_ignores_disk_and_pretuned(tmp_path, x, allow_autotune):
    h = Harness(tmp_path, policy="always")
    h.put_disk(x, GIVEN["disk"])
    h.put_pretuned(x, GIVEN["pretuned"])
    h.put_memory(x, GIVEN["memory"], source="pretuned")  # e.g. left by an earlier pretuned hit
    expl = h.explain(x)
    assert expl.selector == "autotune" and expl.config == WINNER
    reasons = dict(expl.declined)
    assert reasons["memory"] == "policy=always ignores entries not tuned in this process"
    assert reasons["disk"] == "policy=always ignores the disk cache"
    assert reasons["pretuned"] == "policy=always ignores shipped caches"
    assert len(h.timer.calls) == len(FWD_SPACE)
    # tuned once per process: the second call is a memory hit, and the disk now holds the winner
    assert h.explain(x).selector == "memory"
    assert len(h.timer.calls) == len(FWD_SPACE)
    assert h.cache.get_disk(h.context(x).disk_key)["config"] == WINNER.to_dict()


def test_policy_always_does_not_reuse_a_disk_entry_loaded_into_memory(tmp_path, x, allow_autotune):
    h = Harness(tmp_path, policy="auto")
    h.put_disk(x, GIVEN["disk"])
    assert h.explain(x).selector == "disk"  # copied into memory
    h.chain.policy = "always"
    expl = h.explain(x)
    assert expl.selector == "autotune" and expl.config == WINNER


@pytest.mark.parametrize("value, policy, empty, with_disk", [
    ("never", "never", "heuristic", "disk"), ("NEVER", "never", "heuristic", "disk"),
    ("always", "always", "autotune", "autotune"), (" always ", "always", "autotune", "autotune"),
    ("auto", "auto", "autotune", "disk"), ("", "auto", "autotune", "disk"),
])
def test_policy_from_env(tmp_path, monkeypatch, x, allow_autotune, value, policy, empty, with_disk):
    """``empty``: who answers with empty caches; ``with_disk``: who answers with a disk entry."""
    monkeypatch.setenv("KERNELOPS_AUTOTUNE", value)
    h = Harness(tmp_path / "empty", policy=None)
    assert h.chain.policy is AutotunePolicy(policy)
    assert h.explain(x).selector == empty
    h = Harness(tmp_path / "disk", policy=None)
    h.put_disk(x, GIVEN["disk"])
    assert h.explain(x).selector == with_disk


def test_explicit_chain_policy_beats_env(tmp_path, monkeypatch, x, allow_autotune):
    monkeypatch.setenv("KERNELOPS_AUTOTUNE", "always")
    h = Harness(tmp_path, policy="never")
    assert h.chain.policy is AutotunePolicy.NEVER
    assert h.explain(x).selector == "heuristic"
    h.chain.policy = None  # back to the environment
    assert h.chain.policy is AutotunePolicy.ALWAYS
    assert h.explain(x).selector == "autotune"


def test_invalid_policy_env_raises(tmp_path, monkeypatch, x):
    monkeypatch.setenv("KERNELOPS_AUTOTUNE", "sometimes")
    h = Harness(tmp_path, policy=None)
    with pytest.raises(ValueError, match="KERNELOPS_AUTOTUNE must be one of auto|never|always, got 'sometimes'"):
        h.call(x)
    with pytest.raises(ValueError, match="KERNELOPS_AUTOTUNE"):
        h.explain(x)
    assert h.op.runs == []


def test_invalid_policy_argument_raises():
    with pytest.raises(ValueError):
        ConfigSelectorChain(cache=ConfigCache(disk=False), policy="sometimes")


# --- fast path ----------------------------------------------------------------------------------
def test_fast_path_skips_the_chain_after_the_first_call(tmp_path, monkeypatch, x):
    h = Harness(tmp_path, policy="never")
    selects = h.count_selects(monkeypatch)
    assert h.call(x) == HEURISTIC
    assert selects == ["heuristic"]
    h.op.counts.clear()
    assert h.call(x) == HEURISTIC
    assert h.call(torch.arange(6, dtype=torch.float32)) == HEURISTIC  # same bucket (8)
    assert selects == ["heuristic"]
    assert h.op.counts["heuristic_config"] == 0
    h.call(torch.arange(100, dtype=torch.float32))  # another bucket: the chain runs again
    assert selects == ["heuristic", "heuristic"]
    h.ex.forget()
    h.call(x)
    assert selects == ["heuristic"] * 3


def test_fast_path_remembers_an_autotuned_config(tmp_path, monkeypatch, x, allow_autotune):
    h = Harness(tmp_path)
    selects = h.count_selects(monkeypatch)
    assert h.call(x) == WINNER
    assert h.call(x) == WINNER
    assert selects == ["autotune"]
    assert len(h.timer.calls) == len(FWD_SPACE)


# --- hot path (signature -> ready launcher) -----------------------------------------------------
def test_hot_path_skips_prepare_after_the_first_call(tmp_path, monkeypatch, x):
    h = Harness(tmp_path, policy="never", op=HotToyOp())
    selects = h.count_selects(monkeypatch)
    assert h.call(x) == HEURISTIC
    assert h.op.counts["prepare"] == 1 and h.op.counts["launch"] == 0
    for _ in range(3):
        assert h.call(x) == HEURISTIC  # call() checks the output is x * 2
    assert h.op.counts["prepare"] == 1 and h.op.counts["launch"] == 3
    assert selects == ["heuristic"]
    h.call(torch.arange(6, dtype=torch.float32))  # another signature, same key: prepare, no select
    assert h.op.counts["prepare"] == 2 and selects == ["heuristic"]
    h.ex.forget()
    h.call(x)
    assert h.op.counts["prepare"] == 3 and selects == ["heuristic", "heuristic"]


def test_hot_path_is_keyed_by_the_scalars_and_their_types(tmp_path, x):
    h = Harness(tmp_path, policy="never", op=HotToyOp())
    torch.testing.assert_close(h.ex(h.op, x=x, alpha=2.0), x * 2)
    torch.testing.assert_close(h.ex(h.op, x=x, alpha=3.0), x * 3)
    with pytest.raises(TypeError, match="alpha must be a real number"):
        h.ex(h.op, x=x, alpha=True)  # True == 1 and hashes alike, but its type differs
    with pytest.raises(TypeError, match="alpha must be a real number"):
        h.ex(h.op, x=x, alpha=[2.0])  # unhashable: the full path judges it


def test_hot_path_is_bypassed_by_cfg_and_overlays(tmp_path, x):
    h = Harness(tmp_path, policy="never", op=HotToyOp())
    h.call(x)
    h.call(x)
    assert h.op.counts["launch"] == 1
    assert h.call(x, cfg=WINNER) == WINNER
    with config_overlay({h.op.name: WINNER}):
        assert h.call(x) == WINNER
    assert h.op.counts["launch"] == 1
    assert h.call(x) == HEURISTIC and h.op.counts["launch"] == 2


def test_hot_path_does_not_remember_a_transient_heuristic(tmp_path, monkeypatch, x):
    blocked = {"reason": "a CUDA graph is being captured"}
    _fake_cuda(monkeypatch, blocked)
    h = Harness(tmp_path, policy="auto", op=HotToyOp())
    assert h.call(x) == HEURISTIC and h.call(x) == HEURISTIC
    assert h.op.counts["launch"] == 0 and h.ex._launchers == {}  # noqa: SLF001
    blocked["reason"] = None
    assert h.call(x) == WINNER
    assert h.call(x) == WINNER and h.op.counts["launch"] == 1


def _fake_cuda(monkeypatch, blocked: dict):
    """Calls look as if on a GPU; the autotune blocker answers ``blocked['reason']``."""
    monkeypatch.setattr(executor_mod, "device_info", lambda device=None: FAKE_CUDA)
    monkeypatch.setattr(selectors_mod, "autotune_blocker", lambda op, inputs, device: blocked["reason"])


def test_heuristic_is_not_memoized_while_tuning_is_temporarily_blocked(tmp_path, monkeypatch, x):
    blocked = {"reason": "a CUDA graph is being captured"}
    _fake_cuda(monkeypatch, blocked)
    h = Harness(tmp_path, policy="auto")
    selects = h.count_selects(monkeypatch)
    assert h.call(x) == HEURISTIC
    assert h.call(x) == HEURISTIC
    assert selects == ["heuristic", "heuristic"]  # not memoized: asked again
    assert h.ex._resolved == {}  # noqa: SLF001
    assert h.timer.calls == []

    blocked["reason"] = None  # capture over: the next call tunes, and is then memoized
    assert h.call(x) == WINNER
    assert h.call(x) == WINNER
    assert selects == ["heuristic", "heuristic", "autotune"]
    assert len(h.timer.calls) == len(FWD_SPACE)
    expl = h.explain(x)
    assert expl.selector == "memory"
    assert "device=FAKE_GPU:sm90" in h.context(x, device=FAKE_CUDA).memory_key


def test_heuristic_is_memoized_on_a_gpu_when_policy_is_never(tmp_path, monkeypatch, x):
    _fake_cuda(monkeypatch, {"reason": None})
    h = Harness(tmp_path, policy="never")
    selects = h.count_selects(monkeypatch)
    assert h.call(x) == HEURISTIC
    assert h.call(x) == HEURISTIC
    assert selects == ["heuristic"]


def test_heuristic_is_memoized_on_cpu_with_policy_auto(tmp_path, monkeypatch, x):
    h = Harness(tmp_path, policy="auto")
    selects = h.count_selects(monkeypatch)
    for _ in range(3):
        assert h.call(x) == HEURISTIC
    assert selects == ["heuristic"]


def test_every_candidate_failing_falls_back_to_the_heuristic(tmp_path, x, allow_autotune):
    def fail(inputs, config, phase):
        raise RuntimeError("out of resources: shared memory")

    h = Harness(tmp_path, op=ToyOp(bench_hook=fail))
    with pytest.warns(RuntimeWarning, match="every candidate of toy_scale failed"):
        expl = h.explain(x)
    assert expl.selector == "autotune-failed" and expl.config == HEURISTIC
    assert expl.entry["reason"].startswith("every candidate failed: fwd: RuntimeError: out of resources")
    assert [name for name, _ in expl.declined][-1] == "pretuned"  # the autotune selector answered
    assert h.cache.disk_items() == []


def test_every_candidate_failing_on_a_gpu_is_not_retuned_on_every_call(tmp_path, monkeypatch, x):
    _fake_cuda(monkeypatch, {"reason": None})
    def fail(inputs, config, phase):
        raise RuntimeError("PTX error")

    h = Harness(tmp_path, op=ToyOp(bench_hook=fail))
    with pytest.warns(RuntimeWarning):
        assert h.call(x) == HEURISTIC
    tuned = h.op.counts["bench_fn"]
    assert tuned == len(FWD_SPACE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert h.call(x) == HEURISTIC
    assert h.op.counts["bench_fn"] == tuned  # the failed tuning is remembered, not repeated
