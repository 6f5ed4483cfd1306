"""Tests for kernelops.ops.autotune: the Autotuner and its two rounds (with fake timers),
autotune_blocker and the policy (ranks' agreement under torch.distributed: test_agreement.py).

The toy op's spaces have at most 3 candidates besides the heuristic: with the default of 3
finalists, round 1 could eliminate nothing and is skipped, so most tests see one timing per
candidate; the tests of the rounds use fewer finalists."""

from __future__ import annotations

import logging
import os
import types

import pytest
import torch

import kernelops.ops.autotune as autotune_mod
from kernelops.ops import Autotuner, AutotunePolicy, TuneResult
from kernelops.ops.autotune import PhaseResult, autotune_blocker
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


def _two_timers(full_times, quick_times, **kw) -> tuple[Autotuner, FakeTimer, FakeTimer]:
    """``(tuner, full, quick)``: round 2 timed by ``full``, round 1 by ``quick``."""
    tuner = Autotuner(progress=False, **kw)
    full, quick = FakeTimer(full_times), FakeTimer(quick_times)
    tuner.time_fn, tuner.quick_time_fn = full, quick
    return tuner, full, quick


def _inputs(op, n=8, grad=False):
    return op.prepare(x=torch.arange(n, dtype=torch.float32).requires_grad_(grad), alpha=3.0)


# --- search -------------------------------------------------------------------------------------
def test_picks_the_fastest_per_phase(monkeypatch):
    clock = _FakeClock()
    monkeypatch.setattr(autotune_mod, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    op = ToyOp()
    tuner, timer = _tuner()
    timer.on_call = clock.tick  # 1 s on the tuner's clock per timed candidate
    result = tuner._tune_local(op, _inputs(op, grad=True), CPU)  # noqa: SLF001
    assert result.config == ToyConfig(FWD_SPACE[2], HEURISTIC_BWD)
    assert result.ms == pytest.approx(1.0 + 2.0)
    assert result.heuristic_ms == pytest.approx(5.0 + 2.0)
    assert result.speedup == pytest.approx(7.0 / 3.0)
    assert result.runner_up == ToyConfig(FWD_SPACE[2], BWD_SPACE[1])
    assert result.runner_up_ms == pytest.approx(3.5)
    assert result.failures == []
    assert result.seconds == len(timer.calls) == 7  # the tuning time, read from the tuner's clock


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
    # bwd: the heuristic (on the best fwd so far) is still timed for reference, every other bwd
    # candidate is skipped
    assert [(phase, cfg.fwd_params, cfg.bwd_params) for phase, cfg in timer.calls] == [
        ("fwd", HEURISTIC_FWD, HEURISTIC_BWD), ("fwd", FWD_SPACE[1], HEURISTIC_BWD),
        ("bwd", FWD_SPACE[1], HEURISTIC_BWD)]
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


def test_log_line_names_the_winner_its_time_and_speedup(caplog):
    """One line per tuned key: the op, the candidates timed, the winner's time, its speed-up over
    the heuristic (FWD_SPACE[2]: 1 ms against the heuristic's 5 ms) and the winning config."""
    op = ToyOp()
    tuner, _ = _tuner()
    with caplog.at_level(logging.INFO, logger="kernelops"):
        result = tuner.tune(op, _inputs(op), CPU)
    assert result.config.fwd_params == FWD_SPACE[2]
    messages = [r.getMessage() for r in caplog.records if r.name == "kernelops"]
    assert len(messages) == 1, messages
    assert "tuned toy_scale" in messages[0] and "over 4 candidates: 1.0000 ms, 5.00x over the heuristic" in \
        messages[0], messages
    assert f"winner {result.config.to_dict()}" in messages[0], messages


def test_progress_bar_writes_to_stderr_when_enabled(capsys):
    op = ToyOp()
    tuner = Autotuner(progress=True)
    tuner.time_fn = FakeTimer(TIMES)
    tuner.tune(op, _inputs(op), CPU)
    err = capsys.readouterr().err
    steps = len(FWD_SPACE)  # the heuristic, then each other entry of the space
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
    steps = len(FWD_SPACE) + len(BWD_SPACE)
    assert last.startswith(f"kernelops tune toy_scale [{'#' * 24}] {steps}/{steps} "), last


# --- the two rounds -------------------------------------------------------------------------------
# round 1 ranks FWD_SPACE[1] < [2] < [3]; round 2 (the full timing) finds [2] fastest and [1] slow
QUICK = {("fwd", FWD_SPACE[1]): 1.0, ("fwd", FWD_SPACE[2]): 2.0, ("fwd", FWD_SPACE[3]): 3.0}
FULL = {("fwd", HEURISTIC_FWD): 5.0, ("fwd", FWD_SPACE[1]): 4.0, ("fwd", FWD_SPACE[2]): 0.5,
        ("fwd", FWD_SPACE[3]): 0.1}


def test_round_2_picks_the_winner_among_round_1_finalists():
    op = ToyOp()
    tuner, full, quick = _two_timers(FULL, QUICK, finalists=2)
    result = tuner.tune(op, _inputs(op), CPU)
    # FWD_SPACE[3] would be fastest in round 2, but round 1 ranked it last: only 2 finalists
    assert [cfg.fwd_params for _, cfg in full.calls] == [HEURISTIC_FWD, FWD_SPACE[1], FWD_SPACE[2]]
    assert result.config.fwd_params == FWD_SPACE[2]  # round 1's second beats its first in round 2
    assert result.ms == 0.5 and result.heuristic_ms == 5.0  # round-2 times, never round 1's
    assert result.runner_up.fwd_params == FWD_SPACE[1] and result.runner_up_ms == 4.0
    assert result.candidates == 4


def test_one_finalist_is_compared_with_the_heuristic_only():
    op = ToyOp()
    tuner, full, quick = _two_timers(FULL, QUICK, finalists=1)
    result = tuner.tune(op, _inputs(op), CPU)
    assert len(quick.calls) == 3
    assert [cfg.fwd_params for _, cfg in full.calls] == [HEURISTIC_FWD, FWD_SPACE[1]]
    assert result.config.fwd_params == FWD_SPACE[1] and result.ms == 4.0


def test_the_heuristic_wins_round_2_when_the_finalists_are_slower():
    op = ToyOp()
    slow = {**FULL, ("fwd", FWD_SPACE[1]): 6.0, ("fwd", FWD_SPACE[2]): 9.0, ("fwd", FWD_SPACE[3]): 9.0}
    tuner, full, _ = _two_timers(slow, QUICK, finalists=2)
    result = tuner.tune(op, _inputs(op), CPU)
    assert result.config == HEURISTIC and result.ms == 5.0 and result.speedup == 1.0
    assert result.runner_up.fwd_params == FWD_SPACE[1] and result.runner_up_ms == 6.0


def test_a_finalist_failing_in_round_2_is_skipped_with_its_reason():
    def on_call(fn):
        if fn.params == FWD_SPACE[2]:
            raise RuntimeError("illegal memory access")

    op = ToyOp()
    tuner, _, quick = _two_timers(FULL, QUICK, finalists=2)
    tuner.time_fn = FakeTimer(FULL, on_call=on_call)
    result = tuner.tune(op, _inputs(op), CPU)
    assert result.config.fwd_params == FWD_SPACE[1]  # the other finalist (FWD_SPACE[3] did not get there)
    assert result.failures == [(ToyConfig(FWD_SPACE[2], HEURISTIC_BWD).to_dict(),
                                "fwd: RuntimeError: illegal memory access")]


def test_phase_results_keep_each_phases_times():
    op = ToyOp()
    tuner, _ = _tuner()
    result = tuner.tune(op, _inputs(op, grad=True), CPU)
    assert list(result.phase_results) == ["fwd", "bwd"]
    fwd, bwd = result.phase_results["fwd"], result.phase_results["bwd"]
    assert fwd == PhaseResult(FWD_SPACE[2], 1.0, 5.0, FWD_SPACE[3], 3.0, candidates=4)
    assert bwd == PhaseResult(HEURISTIC_BWD, 2.0, 2.0, BWD_SPACE[1], 2.5, candidates=3)
    assert result.ms == fwd.ms + bwd.ms and result.heuristic_ms == fwd.heuristic_ms + bwd.heuristic_ms


def test_progress_callback_sees_every_step():
    seen = []
    op = ToyOp()
    tuner = Autotuner(progress=lambda done, total, note: seen.append((done, total, note)), finalists=2)
    tuner.time_fn = FakeTimer(TIMES)
    tuner.tune(op, _inputs(op, grad=True), CPU)
    # fwd: round 1 (3 others), round 2 (the heuristic + 2 finalists); bwd: 2 others <= 2 finalists,
    # so round 2 only (the heuristic + 2)
    assert [done for done, _, _ in seen] == list(range(1, 10))
    assert {total for _, total, _ in seen} == {9}
    assert [note.split(":")[0] for _, _, note in seen] == ["fwd round 1"] * 3 + ["fwd round 2"] * 3 + [
        "bwd round 2"] * 3
    assert seen[0][2] == "fwd round 1: 4.000 ms" and seen[-1][2] == "bwd round 2: 6.000 ms"


@pytest.mark.parametrize("kw", [{"finalists": 0}, {"quick_reps": 0}])
def test_round_parameters_are_checked(kw):
    with pytest.raises(ValueError, match="finalists and quick_reps must be >= 1"):
        Autotuner(**kw)


class _FakeEvent:
    """torch.cuda.Event stand-in reading the fake GPU clock of :class:`_FakeCalls`."""

    def __init__(self, enable_timing=False):
        self.stamp = None

    def record(self):
        self.stamp = _FakeCalls.gpu_clock

    def elapsed_time(self, end):
        return end.stamp - self.stamp


class _FakeCalls:
    """A kernel call whose i-th run takes ``gpu[i]`` ms on a fake GPU clock and ``host[i]`` s on a
    fake host clock (the last value repeats); installs the fake clocks with ``monkeypatch``."""

    gpu_clock = 0.0

    def __init__(self, monkeypatch, gpu, host=(0.0,)):
        self.gpu, self.host, self.calls, self.host_clock = list(gpu), list(host), 0, 0.0
        _FakeCalls.gpu_clock = 0.0
        monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        monkeypatch.setattr(autotune_mod, "time", types.SimpleNamespace(perf_counter=lambda: self.host_clock))

    def __call__(self):
        _FakeCalls.gpu_clock += self.gpu[min(self.calls, len(self.gpu) - 1)]
        self.host_clock += self.host[min(self.calls, len(self.host) - 1)]
        self.calls += 1


@pytest.mark.parametrize("gpu, host, expected_ms, expected_calls", [
    ([2.0], [0.0], 2.0, 2),           # the first call needed no warm-up; 2 fit in quick_ms = 5
    ([0.1], [0.0], 0.1, 10),          # 50 would fit: capped at quick_reps = 10
    ([30.0], [0.0], 30.0, 1),         # longer than quick_ms: its first call is the measurement
    ([2.0], [1.0, 0.0], 2.0, 3),      # the first call compiled (1 s on the host): a warm-up, then 2 timed
])
def test_quick_time_fn_sizes_round_1_from_its_first_call(monkeypatch, gpu, host, expected_ms, expected_calls):
    fn = _FakeCalls(monkeypatch, gpu, host)
    assert Autotuner(quick_ms=5.0, quick_reps=10).quick_time_fn(fn) == pytest.approx(expected_ms)
    assert fn.calls == expected_calls


@pytest.mark.parametrize("gpu, host, expected_ms, calls, bench", [
    ([2.0], [0.0], 7.0, 1, True),                # short: do_bench times it
    ([100.0], [0.0], 100.0, 3, False),           # longer than rep_ms: the median of 3 calls
    ([500.0, 100.0], [1.0, 0.0], 100.0, 4, False),  # a compiling first call is not one of the 3
    ([500.0, 2.0], [1.0, 0.0], 7.0, 2, True),    # ... nor does it make a short kernel look long
])
def test_time_fn_uses_do_bench_except_for_long_calls(monkeypatch, gpu, host, expected_ms, calls, bench):
    import triton.testing

    fn = _FakeCalls(monkeypatch, gpu, host)
    benched = []
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: benched.append(kw) or 7.0)
    assert Autotuner(warmup_ms=10, rep_ms=40).time_fn(fn) == expected_ms
    assert fn.calls == calls
    assert benched == ([{"warmup": 10, "rep": 40, "return_mode": "median"}] if bench else [])


def test_round_1_is_skipped_when_every_candidate_would_be_a_finalist():
    op = ToyOp()
    tuner, full, quick = _two_timers(TIMES, TIMES)  # 3 fwd candidates besides the heuristic, 3 finalists
    result = tuner.tune(op, _inputs(op), CPU)
    assert quick.calls == []
    assert [cfg.fwd_params for _, cfg in full.calls] == list(FWD_SPACE)
    assert result.config.fwd_params == FWD_SPACE[2]
    tuner, full, quick = _two_timers(TIMES, TIMES, finalists=2)
    tuner.tune(op, _inputs(op), CPU)
    assert [cfg.fwd_params for _, cfg in quick.calls] == list(FWD_SPACE[1:])  # never the heuristic
    assert [cfg.fwd_params for _, cfg in full.calls] == [HEURISTIC_FWD, FWD_SPACE[2], FWD_SPACE[3]]


def test_round_2_runs_after_the_budget_ran_out_in_round_1(monkeypatch):
    clock = _FakeClock()
    monkeypatch.setattr(autotune_mod, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    tuner, full, quick = _two_timers(FULL, QUICK, finalists=1, budget_s=1.5)
    full.on_call = quick.on_call = clock.tick
    op = ToyOp()
    result = tuner.tune(op, _inputs(op), CPU)
    # round 1: FWD_SPACE[1] (t=0 -> 1), [2] (1 -> 2), [3] skipped; round 2 re-times its finalist anyway
    assert [cfg.fwd_params for _, cfg in quick.calls] == [FWD_SPACE[1], FWD_SPACE[2]]
    assert [cfg.fwd_params for _, cfg in full.calls] == [HEURISTIC_FWD, FWD_SPACE[1]]
    assert result.config.fwd_params == FWD_SPACE[1] and result.ms == 4.0
    assert [reason for _, reason in result.failures] == ["fwd: skipped, tuning budget of 2s spent"]
    assert result.candidates == 2 + 1


# --- TuneResult ---------------------------------------------------------------------------------
def test_tune_result_speedup():
    assert TuneResult(HEURISTIC, 2.0, 5.0).speedup == 2.5
    assert TuneResult(HEURISTIC, None, 5.0).speedup is None
    assert TuneResult(HEURISTIC, 2.0, None).speedup is None
    assert TuneResult(HEURISTIC, 2.0, 5.0).failures == []


def test_tune_result_entry_and_its_forward_part():
    op = ToyOp()
    tuner, _ = _tuner()
    result = tuner.tune(op, _inputs(op, grad=True), CPU)
    entry = result.entry()
    assert entry["config"] == result.config.to_dict() and entry["source"] == "autotune"
    assert (entry["ms"], entry["heuristic_ms"], entry["candidates"]) == (3.0, 7.0, 7)
    assert entry["runner_up"] == result.runner_up.to_dict() and entry["runner_up_ms"] == 3.5
    fwd = result.for_phases(op, ("fwd",))  # what tuning the forward-only call finds
    assert fwd.config == result.config
    assert (fwd.ms, fwd.heuristic_ms, fwd.candidates) == (1.0, 5.0, 4)
    assert fwd.runner_up == ToyConfig(FWD_SPACE[3], HEURISTIC_BWD) and fwd.runner_up_ms == 3.0
    assert result.for_phases(op, ("decode",)) is None and result.for_phases(op, ()) is None


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


def test_policy_follows_os_environ_when_it_is_replaced(monkeypatch):
    """The policy is read from os.environ's encoded table (cheaper); a replaced os.environ (another
    mapping) is read through instead, and an assignment through os.environ shows at once."""

    monkeypatch.setenv("KERNELOPS_AUTOTUNE", "never")
    assert AutotunePolicy.from_env() is AutotunePolicy.NEVER
    os.environ["KERNELOPS_AUTOTUNE"] = "always"
    assert AutotunePolicy.from_env() is AutotunePolicy.ALWAYS
    monkeypatch.setattr(os, "environ", {"KERNELOPS_AUTOTUNE": "auto"})
    assert AutotunePolicy.from_env() is AutotunePolicy.AUTO
    monkeypatch.setattr(os, "environ", {})
    assert AutotunePolicy.from_env() is AutotunePolicy.AUTO


def test_policy_is_a_str_enum():
    assert AutotunePolicy("always") is AutotunePolicy.ALWAYS
    assert AutotunePolicy.NEVER == "never"
