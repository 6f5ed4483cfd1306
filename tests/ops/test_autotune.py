"""Tests for kernelops.ops.autotune: the Autotuner (with a fake time_fn), autotune_blocker, the
policy, and the rank-0 broadcast under torch.distributed (2 gloo processes)."""

from __future__ import annotations

import json
import logging
import os
import types

import pytest
import torch

import kernelops.ops.autotune as autotune_mod
from kernelops.ops import Autotuner, AutotunePolicy, TuneResult
from kernelops.ops.autotune import autotune_blocker
from tests.ops.toy_op import (
    BWD_SPACE, CPU, FAKE_CUDA, FWD_SPACE, HEURISTIC, HEURISTIC_BWD, HEURISTIC_FWD, FakeTimer, ToyConfig, ToyOp,
)

# fwd: FWD_SPACE[2] fastest (1.0), FWD_SPACE[3] next (3.0); bwd: the heuristic's params are
# fastest (2.0), BWD_SPACE[1] next (2.5): the smallest gap, so it gives the runner-up.
TIMES = {
    ("fwd", HEURISTIC_FWD): 5.0, ("fwd", FWD_SPACE[1]): 4.0, ("fwd", FWD_SPACE[2]): 1.0, ("fwd", FWD_SPACE[3]): 3.0,
    ("bwd", HEURISTIC_BWD): 2.0, ("bwd", BWD_SPACE[1]): 2.5, ("bwd", BWD_SPACE[2]): 6.0,
}


def _tuner(times=TIMES, **kw) -> tuple[Autotuner, FakeTimer]:
    tuner = Autotuner(progress=False, **kw)
    timer = FakeTimer(times)
    tuner.time_fn = timer
    return tuner, timer


def _inputs(op, n=8, grad=False):
    return op.prepare(x=torch.arange(n, dtype=torch.float32).requires_grad_(grad), alpha=3.0)


# --- search -------------------------------------------------------------------------------------
def test_picks_the_fastest_per_phase():
    op = ToyOp()
    tuner, timer = _tuner()
    result = tuner._tune_local(op, _inputs(op, grad=True), CPU)  # noqa: SLF001
    assert result.config == ToyConfig(FWD_SPACE[2], HEURISTIC_BWD)
    assert result.ms == pytest.approx(1.0 + 2.0)
    assert result.heuristic_ms == pytest.approx(5.0 + 2.0)
    assert result.speedup == pytest.approx(7.0 / 3.0)
    assert result.runner_up == ToyConfig(FWD_SPACE[2], BWD_SPACE[1])
    assert result.runner_up_ms == pytest.approx(3.5)
    assert result.failures == []
    assert result.seconds >= 0


def test_phases_are_tuned_one_after_the_other_as_a_sum():
    op = ToyOp()
    tuner, timer = _tuner()
    result = tuner.tune(op, _inputs(op, grad=True), CPU)
    # heuristic + the 3 other fwd params, then heuristic + the 2 other bwd params: 4 + 3, not 4 * 3
    expected = 1 + len(FWD_SPACE) + 1 + len(BWD_SPACE) - 2
    assert len(timer.calls) == expected == 7
    assert result.candidates == expected
    phases = [phase for phase, _ in timer.calls]
    assert phases == ["fwd"] * len(FWD_SPACE) + ["bwd"] * len(BWD_SPACE)
    # the heuristic is timed once per phase, each other params once
    fwd_timed = [cfg.fwd_params for phase, cfg in timer.calls if phase == "fwd"]
    bwd_timed = [cfg.bwd_params for phase, cfg in timer.calls if phase == "bwd"]
    assert sorted(map(repr, fwd_timed)) == sorted(map(repr, FWD_SPACE))
    assert sorted(map(repr, bwd_timed)) == sorted(map(repr, BWD_SPACE))
    # fwd candidates are timed with the heuristic's bwd params; bwd candidates with the best fwd
    assert all(cfg.bwd_params == HEURISTIC_BWD for phase, cfg in timer.calls if phase == "fwd")
    assert all(cfg.fwd_params == FWD_SPACE[2] for phase, cfg in timer.calls[len(FWD_SPACE) + 1:])


def test_forward_only_call_tunes_the_forward_phase_only():
    op = ToyOp()
    tuner, timer = _tuner()
    result = tuner.tune(op, _inputs(op, grad=False), CPU)
    assert {phase for phase, _ in timer.calls} == {"fwd"}
    assert len(timer.calls) == len(FWD_SPACE)
    assert result.config == ToyConfig(FWD_SPACE[2], HEURISTIC_BWD)
    assert result.ms == 1.0 and result.heuristic_ms == 5.0
    assert result.runner_up == ToyConfig(FWD_SPACE[3], HEURISTIC_BWD) and result.runner_up_ms == 3.0
    assert op.counts["candidate_params:bwd"] == 0


def test_duplicate_heuristic_params_are_timed_once():
    op = ToyOp(fwd_space=[FWD_SPACE[1], HEURISTIC_FWD, HEURISTIC_FWD])
    tuner, timer = _tuner()
    result = tuner.tune(op, _inputs(op), CPU)
    assert [cfg.fwd_params for _, cfg in timer.calls] == [HEURISTIC_FWD, FWD_SPACE[1]]
    assert result.config == ToyConfig(FWD_SPACE[1], HEURISTIC_BWD)


def test_heuristic_wins_when_it_is_fastest_and_runner_up_is_absent_without_alternatives():
    op = ToyOp(fwd_space=[HEURISTIC_FWD])
    tuner, timer = _tuner()
    result = tuner.tune(op, _inputs(op), CPU)
    assert result.config == HEURISTIC
    assert result.ms == result.heuristic_ms == 5.0
    assert result.speedup == 1.0
    assert result.runner_up is None and result.runner_up_ms is None
    assert result.candidates == 1


def test_inputs_are_cloned():
    seen = []

    def mutate(inputs, config, phase):
        seen.append(inputs.x)
        with torch.no_grad():
            inputs.x.add_(100.0)  # an in-place kernel

    op = ToyOp(bench_hook=mutate)
    x = torch.arange(8, dtype=torch.float32).requires_grad_(True)
    before = x.detach().clone()
    inputs = op.prepare(x=x, alpha=3.0)
    tuner, _ = _tuner()
    tuner.tune(op, inputs, CPU)
    torch.testing.assert_close(x.detach(), before, rtol=0, atol=0)
    assert inputs.x is x
    assert seen and all(t is not x and t.data_ptr() != x.data_ptr() for t in seen)
    assert all(t.requires_grad for t in seen)  # grad flags are kept on the clones


def test_failing_candidate_is_skipped_and_its_reason_kept():
    bad = FWD_SPACE[2]  # would be the fastest

    def oom(inputs, config, phase):
        if phase == "fwd" and config.fwd_params == bad:
            raise RuntimeError("out of resources: shared memory, Required: 300000, Hardware limit: 232448\nmore")

    op = ToyOp(bench_hook=oom)
    tuner, timer = _tuner()
    result = tuner.tune(op, _inputs(op), CPU)
    assert result.config == ToyConfig(FWD_SPACE[3], HEURISTIC_BWD)  # the next fastest
    assert result.ms == 3.0
    assert all(cfg.fwd_params != bad for _, cfg in timer.calls)
    assert result.failures == [(ToyConfig(bad, HEURISTIC_BWD).to_dict(),
                                "fwd: RuntimeError: out of resources: shared memory, Required: 300000, "
                                "Hardware limit: 232448")]


def test_time_fn_failure_is_skipped_too():
    bad = FWD_SPACE[2]

    class LaunchError(Exception):
        pass

    def on_call(fn):
        if fn.params == bad:
            raise LaunchError("PTX error")

    op = ToyOp()
    tuner = Autotuner(progress=False)
    tuner.time_fn = FakeTimer(TIMES, on_call=on_call)
    result = tuner.tune(op, _inputs(op), CPU)
    assert result.config.fwd_params == FWD_SPACE[3]
    assert [reason for _, reason in result.failures] == ["fwd: LaunchError: PTX error"]


def test_every_candidate_failing_gives_the_heuristic_and_a_warning():
    def fail(inputs, config, phase):
        raise RuntimeError(f"cannot launch {phase}")

    op = ToyOp(bench_hook=fail)
    tuner, timer = _tuner()
    with pytest.warns(RuntimeWarning, match="every candidate of toy_scale failed; using the heuristic"):
        result = tuner.tune(op, _inputs(op, grad=True), CPU)
    assert result.config == HEURISTIC
    assert result.ms is None and result.heuristic_ms is None and result.speedup is None
    assert result.runner_up is None
    assert timer.calls == []
    assert len(result.failures) == len(FWD_SPACE) + len(BWD_SPACE)
    assert {r for _, r in result.failures} == {"fwd: RuntimeError: cannot launch fwd",
                                               "bwd: RuntimeError: cannot launch bwd"}


def test_failing_heuristic_leaves_heuristic_ms_unknown():
    def fail_heuristic(inputs, config, phase):
        if config.fwd_params == HEURISTIC_FWD:
            raise RuntimeError("heuristic broken")

    op = ToyOp(bench_hook=fail_heuristic)
    tuner, _ = _tuner()
    result = tuner.tune(op, _inputs(op), CPU)
    assert result.config.fwd_params == FWD_SPACE[2]
    assert result.ms == 1.0
    assert result.heuristic_ms is None and result.speedup is None


class _FakeClock:
    """perf_counter that only moves when a candidate is timed (1 s each)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def tick(self, fn):
        self.now += 1.0


@pytest.mark.parametrize("from_env", [False, True])
def test_time_budget_skips_the_rest(monkeypatch, from_env):
    clock = _FakeClock()
    monkeypatch.setattr(autotune_mod, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    if from_env:
        monkeypatch.setenv("KERNELOPS_AUTOTUNE_BUDGET_S", "1.5")
        tuner = Autotuner(progress=False)
    else:
        monkeypatch.setenv("KERNELOPS_AUTOTUNE_BUDGET_S", "1000")  # the argument wins
        tuner = Autotuner(budget_s=1.5, progress=False)
    timer = FakeTimer(TIMES, on_call=clock.tick)
    tuner.time_fn = timer
    op = ToyOp()
    result = tuner.tune(op, _inputs(op, grad=True), CPU)
    # fwd: heuristic (t=0 -> 1), FWD_SPACE[1] (1 <= 1.5 -> 2), then budget spent (2 > 1.5);
    # bwd: the heuristic is still timed for reference, every other bwd candidate is skipped
    assert [(phase, cfg.fwd_params, cfg.bwd_params) for phase, cfg in timer.calls] == [
        ("fwd", HEURISTIC_FWD, HEURISTIC_BWD), ("fwd", FWD_SPACE[1], HEURISTIC_BWD),
        ("bwd", HEURISTIC_FWD, HEURISTIC_BWD)]
    skipped = [(cfg, reason) for cfg, reason in result.failures]
    assert len(skipped) == 2 + 2
    assert all("skipped, tuning budget of 2s spent" in reason for _, reason in skipped)  # 1.5 shown as 2
    assert [reason.split(":")[0] for _, reason in skipped] == ["fwd", "fwd", "bwd", "bwd"]
    assert result.config == ToyConfig(FWD_SPACE[1], HEURISTIC_BWD)
    assert result.ms == 4.0 + 2.0
    assert result.candidates == 3


def test_zero_budget_times_only_the_heuristic():
    op = ToyOp()
    tuner, timer = _tuner(budget_s=0.0)
    result = tuner.tune(op, _inputs(op), CPU)
    assert [cfg for _, cfg in timer.calls] == [HEURISTIC]
    assert result.config == HEURISTIC and result.ms == 5.0
    assert len(result.failures) == len(FWD_SPACE) - 1
    assert all("budget" in reason for _, reason in result.failures)


def test_log_line_names_the_winner_and_speedup(caplog):
    op = ToyOp()
    tuner, _ = _tuner()
    with caplog.at_level(logging.INFO, logger="kernelops"):
        tuner.tune(op, _inputs(op), CPU)
    messages = [r.getMessage() for r in caplog.records if r.name == "kernelops"]
    assert any("tuned toy_scale" in m and "5.00x over the heuristic" in m for m in messages), messages


def test_progress_bar_writes_to_stderr_when_enabled(capsys):
    op = ToyOp()
    tuner = Autotuner(progress=True)
    tuner.time_fn = FakeTimer(TIMES)
    tuner.tune(op, _inputs(op), CPU)
    err = capsys.readouterr().err
    steps = 1 + len(FWD_SPACE)  # the heuristic, then each entry of the space
    assert "kernelops tune toy_scale" in err
    assert err.rstrip("\n").split("\r")[-1].startswith(f"kernelops tune toy_scale [{'#' * 24}] {steps}/{steps} ")
    tuner.progress = False
    tuner.tune(op, _inputs(op), CPU)
    assert capsys.readouterr().err == ""


def test_progress_bar_total_matches_the_steps_with_two_phases(capsys):
    op = ToyOp()
    tuner = Autotuner(progress=True)
    tuner.time_fn = FakeTimer(TIMES)
    tuner.tune(op, _inputs(op, grad=True), CPU)
    last = capsys.readouterr().err.rstrip("\n").split("\r")[-1]
    steps = 2 + len(FWD_SPACE) + len(BWD_SPACE)
    assert last.startswith(f"kernelops tune toy_scale [{'#' * 24}] {steps}/{steps} "), last


# --- TuneResult ---------------------------------------------------------------------------------
def test_tune_result_speedup():
    assert TuneResult(HEURISTIC, 2.0, 5.0).speedup == 2.5
    assert TuneResult(HEURISTIC, None, 5.0).speedup is None
    assert TuneResult(HEURISTIC, 2.0, None).speedup is None
    assert TuneResult(HEURISTIC, 2.0, 5.0).failures == []


# --- autotune_blocker ---------------------------------------------------------------------------
@pytest.fixture
def gpu_like(monkeypatch):
    """torch.cuda.is_current_stream_capturing raises on a CPU-only build: make it answer False."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def test_blocker_cpu_device():
    op = ToyOp()
    assert autotune_blocker(op, _inputs(op), CPU) == "device cpu is not a GPU"


def test_blocker_none_when_safe(gpu_like):
    op = ToyOp()
    assert autotune_blocker(op, _inputs(op), FAKE_CUDA) is None


def test_blocker_meta_tensors(gpu_like):
    op = ToyOp()
    inputs = op.prepare(x=torch.empty(8, device="meta"), alpha=1.0)
    assert autotune_blocker(op, inputs, FAKE_CUDA) == "inputs are fake/meta tensors"


def test_blocker_fake_tensors(gpu_like):
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = ToyOp()
    with FakeTensorMode() as mode:
        inputs = op.prepare(x=mode.from_tensor(torch.ones(8)), alpha=1.0)
        assert autotune_blocker(op, inputs, FAKE_CUDA) == "inputs are fake/meta tensors"


def test_blocker_nothing_to_tune(gpu_like):
    op = ToyOp(tunable=False)
    assert autotune_blocker(op, _inputs(op), FAKE_CUDA) == "this call has nothing to tune"


def test_blocker_cuda_graph_capture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    op = ToyOp()
    assert autotune_blocker(op, _inputs(op), FAKE_CUDA) == "a CUDA graph is being captured"


def test_blocker_torch_compile(monkeypatch, gpu_like):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    op = ToyOp()
    assert autotune_blocker(op, _inputs(op), FAKE_CUDA) == "torch.compile is tracing"


# --- policy -------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [
    (None, AutotunePolicy.AUTO), ("", AutotunePolicy.AUTO), ("auto", AutotunePolicy.AUTO),
    ("never", AutotunePolicy.NEVER), (" Never\n", AutotunePolicy.NEVER), ("ALWAYS", AutotunePolicy.ALWAYS),
])
def test_policy_from_env(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("KERNELOPS_AUTOTUNE", raising=False)
    else:
        monkeypatch.setenv("KERNELOPS_AUTOTUNE", value)
    assert AutotunePolicy.from_env() is expected


@pytest.mark.parametrize("value", ["sometimes", "1", "true", "off"])
def test_policy_from_env_rejects_unknown_values(monkeypatch, value):
    monkeypatch.setenv("KERNELOPS_AUTOTUNE", value)
    with pytest.raises(ValueError, match=f"KERNELOPS_AUTOTUNE must be one of auto|never|always, got '{value}'"):
        AutotunePolicy.from_env()


def test_policy_is_a_str_enum():
    assert AutotunePolicy("always") is AutotunePolicy.ALWAYS
    assert AutotunePolicy.NEVER == "never"


# --- torch.distributed: rank 0 tunes and broadcasts ------------------------------------------------
def _rank_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        op = ToyOp()
        # each rank's timer prefers a different fwd candidate: rank r -> FWD_SPACE[1 + r]
        times = {("fwd", p): 5.0 for p in FWD_SPACE}
        times[("fwd", FWD_SPACE[1 + rank])] = 0.5
        tuner = Autotuner(progress=False)
        timer = FakeTimer(times)
        tuner.time_fn = timer
        result = tuner.tune(op, op.prepare(x=torch.arange(8, dtype=torch.float32), alpha=1.0), CPU)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"config": result.config.to_dict(), "type": type(result.config).__name__,
                       "ms": result.ms, "timed": len(timer.calls), "candidates": result.candidates,
                       "runner_up": result.runner_up.to_dict() if result.runner_up is not None else None}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_rank0_tunes_and_broadcasts(tmp_path):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    world_size = 2
    mp.spawn(_rank_worker, args=(world_size, str(tmp_path / "init"), str(tmp_path)), nprocs=world_size, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]
    rank0_choice = ToyConfig(FWD_SPACE[1], HEURISTIC_BWD).to_dict()
    for r in results:
        assert r["config"] == rank0_choice  # every rank runs rank 0's choice
        assert r["type"] == "ToyConfig"
        assert r["ms"] == 0.5
        assert r["candidates"] == len(FWD_SPACE)
    assert results[0]["runner_up"] == results[1]["runner_up"]
    assert results[0]["timed"] == len(FWD_SPACE)
    assert results[1]["timed"] == 0  # rank 1 never timed anything
