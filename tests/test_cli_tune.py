"""``kernelops tune`` and kernelops.tuning: CLI parsing and exit codes, the ``llm`` preset and
``--shapes`` specs, compile grouping and warm-up workers, and tiny end-to-end tunes under the
Triton interpreter (wall-clock timed) whose exported files the pretuned selector then serves."""

from __future__ import annotations

import json
import os

import pytest
import torch

from kernelops.cli import main
from kernelops.modules.flash_attention import FLASH_ATTENTION, FlashAttention
from kernelops.ops import Executor, set_default_executor
from kernelops.ops.autotune import PhaseResult, TuneResult
from kernelops.ops.cache import make_entry
from kernelops.ops.device import device_info
from kernelops.ops.keys import key_text, parse_key_text
from kernelops.ops.pretuned import write_pretuned_file
from kernelops.tuning import runner
from kernelops.tuning.compile import compile_groups, compile_shard, warm_compiles
from kernelops.tuning.presets import filter_specs, llm_fp8_preset, llm_preset
from kernelops.tuning.specs import AttentionSpec, FP8AttentionSpec, parse_attention_shape, parse_fp8_shape
from tests.conftest import HAS_CUDA

TINY = "B=1,S=40,Hq=2,Hkv=1,D=16,dtype=fp32,causal=1"
# Tests that build their calls on the CPU, count candidates of the CPU heuristic or read files under
# "cpu/" are interpreter-only by design; on a GPU the same flow is what `kernelops tune ... --export`
# ran for the shipped files.
interpreter_only = pytest.mark.skipif(HAS_CUDA, reason="interpreter flow (CPU tensors and heuristic, cpu/ folder)")


@pytest.fixture
def few_candidates(monkeypatch):
    """Four candidates per phase (so round 1 runs: more than 3 finalists), to keep the interpreter quick."""
    original = FlashAttention.candidate_params
    monkeypatch.setattr(FlashAttention, "candidate_params",
                        lambda self, inputs, device, phase: original(self, inputs, device, phase)[:4])


@pytest.fixture
def fresh_default_executor(tmp_path, monkeypatch):
    """An empty user cache and a new default executor (it reads the cache/pretuned env at creation)."""
    monkeypatch.setenv("KERNELOPS_CACHE_DIR", str(tmp_path / "user-cache"))
    previous = set_default_executor(Executor())
    yield lambda: set_default_executor(Executor())
    set_default_executor(previous)


def _run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _qkv(spec: AttentionSpec, grad: bool):
    kw = spec.kwargs("cpu")
    return {name: kw[name].detach().requires_grad_(grad) for name in ("query", "key", "value")}


# --- parsing, help and exit codes -------------------------------------------------------------------
@pytest.mark.parametrize("argv, words", [
    (["--help"], ["demo", "info", "tune"]),
    (["demo", "--help"], ["--seed"]),
    (["info", "--help"], ["usage: kernelops info"]),
    (["tune", "--help"], ["--shapes", "--preset", "--export", "--compile-jobs", "--limit-seconds", "--head-dims",
                          "--dtypes", "--max-seq", "--quiet", "--resume-since", "flash_attention", "llm"]),
])
def test_help_on_every_subcommand(capsys, argv, words):
    code, out, _ = _run(capsys, *argv)
    assert code == 0
    assert all(word in out for word in words), out


@pytest.mark.parametrize("argv, message", [
    ([], "required"),
    (["tune"], "the following arguments are required: op"),
    (["tune", "flash_attention"], "one of the arguments --shapes --preset is required"),
    (["tune", "no_such_op", "--preset", "llm"], "no tuning support for op 'no_such_op'; known: flash_attention"),
    (["tune", "flash_attention", "--preset", "huge"], "unknown preset 'huge' for flash_attention; known: llm"),
    (["tune", "flash_attention", "--preset", "llm", "--shapes", TINY], "not allowed with argument"),
    (["tune", "flash_attention", "--shapes", "B=1,S=32"], "lacks Hq, D"),
    (["tune", "flash_attention", "--shapes", TINY + ",Hd=3"], "bad part 'Hd=3'"),
    (["tune", "flash_attention", "--shapes", "B=1,S=32,Hq=3,Hkv=2,D=16"], "multiple of heads_kv"),
    (["tune", "flash_attention", "--preset", "llm", "--compile-jobs", "-1"], "must be >= 0"),
    (["tune", "flash_attention", "--preset", "llm", "--limit-seconds", "0"], "must be > 0"),
    (["tune", "flash_attention", "--preset", "llm", "--dtypes", "int8"], "unknown dtype 'int8'"),
    (["tune", "flash_attention", "--preset", "llm", "--masks", "diagonal"], "invalid choice"),
    (["tune", "flash_attention", "--preset", "llm", "--max-seq", "256"], "the filters leave no spec to tune"),
])
def test_usage_errors_exit_2_with_a_message(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert message in err, err


def test_dry_run_lists_the_filtered_preset(capsys):
    code, out, _ = _run(capsys, "tune", "flash_attention", "--preset", "llm", "--head-dims", "128", "--dtypes",
                        "bf16", "--max-seq", "16k", "--dry-run")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[-1] == "42 spec(s)"  # 3 GQA ratios x (4 lengths x 2 masks + 2 lengths x 3 masks)
    assert all(line.startswith("bf16 D128 ") for line in lines[:-1])
    assert "B=2,S=8192,Hq=16,Hkv=4,D=128,dtype=bf16,causal=1,window=4096,train=1" in out


@pytest.mark.skipif(HAS_CUDA, reason="checks the message shown without a GPU")
def test_without_gpu_or_interpreter_nothing_can_be_tuned(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, out, err = _run(capsys, "tune", "flash_attention", "--shapes", TINY)
    assert code == 1
    assert "no CUDA GPU here, so nothing can be tuned" in err and "TRITON_INTERPRET=1" in err
    assert out == ""


# --- specs and the llm preset ---------------------------------------------------------------------
def test_llm_preset_counts_and_shapes():
    specs = llm_preset()
    assert len(specs) == 414 == 3 * 2 * 3 * (4 * 2 + 5 * 3)
    assert len(set(specs)) == len(specs)
    assert all(isinstance(s, AttentionSpec) and s.train and s.seq_q == s.seq_k for s in specs)
    assert {s.head_dim for s in specs} == {64, 128, 256} and {s.dtype for s in specs} == {"bfloat16", "float16"}
    assert {s.gqa for s in specs} == {1, 4, 8}
    assert sorted({s.seq for s in specs}) == [512 << i for i in range(9)]
    assert {s.seq for s in specs if s.mask == "window"} == {8192, 16384, 32768, 65536, 131072}
    assert all(s.window == 4096 and s.causal for s in specs if s.mask == "window")
    for s in specs:
        assert s.batch * s.seq == 16384 if s.seq <= 16384 else s.batch == 1
        assert s.heads_q % s.gqa == 0 and s.heads_q >= s.gqa and s.heads_kv * s.gqa == s.heads_q
        if s.seq <= 16384:
            assert s.heads_q * s.head_dim == 2048
    shape = {(s.head_dim, s.seq, s.gqa): (s.batch, s.heads_q, s.heads_kv) for s in specs}
    assert shape[(64, 512, 4)] == (32, 32, 8)
    assert shape[(128, 32768, 1)] == (1, 8, 8)  # 16 heads halved at twice 16k
    assert shape[(128, 131072, 4)] == (1, 4, 1)  # 16 / 8 = 2 heads, raised to the GQA ratio
    assert shape[(256, 131072, 1)] == (1, 1, 1)
    assert shape[(256, 131072, 8)] == (1, 8, 1)


def test_preset_filters():
    specs = llm_preset()
    assert len(filter_specs(specs, masks=["window"])) == 5 * 18
    assert len(filter_specs(specs, gqa=[8], dtypes=["float16"])) == 3 * 23
    assert len(filter_specs(specs, min_seq=32768)) == 3 * 3 * 18
    assert filter_specs(specs) == specs


def test_specs_hold_no_tensors_until_built():
    spec = llm_preset()[-1]  # 128k tokens: never allocated by the preset
    assert not any(isinstance(v, torch.Tensor) for v in vars(spec).values())
    kw = spec.kwargs("meta")
    assert kw["query"].shape == (1, 131072, 8, 256) and kw["key"].shape == (1, 131072, 1, 256)
    assert kw["query"].dtype == torch.float16 and kw["query"].requires_grad
    assert kw["causal"] is True and kw["sliding_window"] == 4096


@pytest.mark.parametrize("text, expected", [
    ("B=2,S=4096,Hq=32,Hkv=8,D=128,dtype=bf16,causal=1", AttentionSpec(2, 4096, 4096, 32, 8, 128, "bfloat16", True)),
    ("b=1,s=8k,hq=4,d=64", AttentionSpec(1, 8192, 8192, 4, 4, 64, "bfloat16", False)),
    ("B=1,Sq=16,Sk=2k,Hq=8,Hkv=1,D=128,dtype=fp16,causal=1,window=4096,train=0",
     AttentionSpec(1, 16, 2048, 8, 1, 128, "float16", True, 4096, False)),
])
def test_shapes_parse_and_round_trip(text, expected):
    spec = parse_attention_shape(text)
    assert spec == expected
    assert parse_attention_shape(spec.text()) == spec


@pytest.mark.parametrize("text, message", [
    ("B=1,S=32,S=64,Hq=2,D=16", "S is given twice"),
    ("B=1,S=32,Sq=32,Hq=2,D=16", "give S, or Sq and Sk, not both"),
    ("B=1,Sq=32,Hq=2,D=16", "lacks S (or Sq and Sk)"),
    ("B=x,S=32,Hq=2,D=16", "B must be an integer"),
    ("B=1,S=32,Hq=2,D=16,causal=maybe", "causal must be 0 or 1"),
    ("B=1,S=32,Hq=2,D=16,dtype=int8", "unknown dtype 'int8'"),
    ("B=0,S=32,Hq=2,D=16", "batch must be a positive int"),
])
def test_bad_shapes_are_refused(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_attention_shape(text)


def test_fp8_preset_and_shapes():
    """``flash_attention_fp8``'s ``llm`` preset: the bf16 preset's shapes and masks, e4m3, forward only;
    its ``--shapes`` text round-trips; fp8 is refused for flash_attention and train=1 for fp8."""
    specs = llm_fp8_preset()
    assert len(specs) == 207 == 3 * 3 * 23
    assert all(type(s) is FP8AttentionSpec and s.dtype == "float8_e4m3fn" and not s.train for s in specs)
    bf16 = [s for s in llm_preset() if s.dtype == "bfloat16"]
    assert [(s.batch, s.seq, s.heads_q, s.heads_kv, s.head_dim, s.mask) for s in specs] == \
        [(s.batch, s.seq, s.heads_q, s.heads_kv, s.head_dim, s.mask) for s in bf16]
    spec = parse_fp8_shape("B=1,S=8k,Hq=32,Hkv=8,D=128,causal=1,window=4096")
    assert spec == FP8AttentionSpec(1, 8192, 8192, 32, 8, 128, causal=True, window=4096)
    assert parse_fp8_shape(spec.text()) == spec and "dtype=fp8" in spec.text() and "train=0" in spec.text()
    assert spec.summary() == "fp8 D128 causal+w4096 gqa4 S8k fwd"
    with pytest.raises(ValueError, match="forward-only"):
        parse_fp8_shape("B=1,S=64,Hq=2,D=16,train=1")
    with pytest.raises(ValueError, match="flash_attention_fp8 specs take dtype float8_e4m3fn"):
        parse_fp8_shape("B=1,S=64,Hq=2,D=16,dtype=bf16")
    with pytest.raises(ValueError, match="flash_attention specs take dtype"):
        parse_attention_shape("B=1,S=64,Hq=2,D=16,dtype=fp8")


def test_fp8_spec_builds_quantised_tensors_with_their_descales():
    """Each tensor is fresh normal data quantised by its own scale (max |x| / 448): stored values
    reach e4m3's largest finite value and the descaled tensor has about unit spread; on the meta
    device the tensors are empty and the descales 1."""
    spec = parse_fp8_shape("B=2,S=64,Hq=4,Hkv=2,D=32,causal=1")
    kw = spec.kwargs("cpu")
    assert kw["query"].shape == (2, 64, 4, 32) and kw["key"].shape == (2, 64, 2, 32)
    assert kw["causal"] is True and "sliding_window" not in kw
    for name in ("query", "key", "value"):
        stored, descale = kw[name].float(), kw[name[0] + "_descale"]
        assert kw[name].dtype == torch.float8_e4m3fn and stored.abs().max() == 448
        assert 0.9 < (stored * descale).std().item() < 1.1 and 0 < descale < 0.02
    assert not torch.equal(kw["key"], kw["value"])  # fresh data per tensor
    meta = spec.kwargs("meta")
    assert meta["query"].device.type == "meta" and meta["q_descale"] == meta["v_descale"] == 1.0


# --- compile grouping and warm-up ---------------------------------------------------------------------
def test_compile_groups_keep_one_smallest_spec_per_signature():
    groups = compile_groups("flash_attention", llm_preset())
    # lengths, windows and GQA share kernels, except where they set a Gluon kernel's constexprs or a
    # specialised int (FlashAttention.compile_variant): per (dtype, head dim, causal, group of 1 or
    # not) the shortest spec, plus the D=64 forward's three consumers, the D=128/256 backward's split
    # GQA heads at longer keys and causal windows (the backward's third causal mode)
    assert {(g.dtype, g.head_dim, g.causal, g.gqa == 1) for g in groups if g.seq == 512} == {
        (dt, d, c, one) for dt in ("bfloat16", "float16") for d in (64, 128, 256) for c in (False, True)
        for one in (False, True)}
    bf16 = sorted((g.head_dim, g.causal, g.seq, g.gqa, g.window) for g in groups if g.dtype == "bfloat16")
    assert bf16 == [(64, False, 512, 1, None), (64, False, 512, 8, None), (64, False, 2048, 1, None),
                    (64, False, 2048, 8, None), (64, True, 512, 1, None), (64, True, 512, 8, None),
                    (64, True, 4096, 1, None), (64, True, 4096, 8, None), (64, True, 8192, 1, 4096),
                    (64, True, 8192, 8, 4096), (128, False, 512, 1, None), (128, False, 512, 8, None),
                    (128, False, 8192, 8, None), (128, True, 512, 1, None), (128, True, 512, 8, None),
                    (128, True, 2048, 8, None), (128, True, 8192, 1, 4096), (128, True, 8192, 8, 4096),
                    (256, False, 512, 1, None), (256, False, 512, 8, None), (256, False, 8192, 8, None),
                    (256, True, 512, 1, None), (256, True, 512, 4, None), (256, True, 512, 8, None),
                    (256, True, 8192, 1, 4096), (256, True, 8192, 8, 4096)]
    assert len(groups) == 2 * len(bf16)
    specs = [parse_attention_shape(t) for t in (TINY, TINY.replace("causal=1", "causal=0"), TINY + ",train=0",
                                                TINY.replace("D=16", "D=32"), TINY.replace("S=", "S=1"))]
    assert compile_groups("flash_attention", specs) == specs[:4]  # the longer one shares the first's kernels


def test_fp8_compile_groups_split_the_gluon_kernels_variants():
    """The FP8 op runs the Gluon forward, whose causal flag, group of 1 and D=64 consumer count are
    compile-time (FlashAttentionFP8.compile_variant): one smallest spec per (head dim, causal, group
    of 1 or not), plus D=64's three-consumer lengths."""
    groups = compile_groups("flash_attention_fp8", llm_fp8_preset())
    assert sorted((g.head_dim, g.causal, g.seq, g.gqa) for g in groups) == sorted(
        [(d, c, 512, gqa) for d in (64, 128, 256) for c in (False, True) for gqa in (1, 8)]
        + [(64, False, 2048, 1), (64, False, 2048, 8), (64, True, 4096, 1), (64, True, 4096, 8)])
    assert all(g.window is None and g.dtype == "float8_e4m3fn" for g in groups)


@interpreter_only
def test_compile_shard_runs_its_share_and_reports_failures(few_candidates, monkeypatch):
    spec = parse_attention_shape(TINY)
    original = FlashAttention.bench_fn

    def bench_fn(self, inputs, config, phase):
        if phase == "bwd" and config.bwd_params.num_stages == 2:
            raise RuntimeError("out of resources")
        return original(self, inputs, config, phase)

    monkeypatch.setattr(FlashAttention, "bench_fn", bench_fn)
    results = [compile_shard("flash_attention", spec, shard, 2) for shard in (0, 1)]
    runs = sum(r for r, _ in results)
    errors = [e for _, errs in results for e in errs]
    # per phase: the heuristic's params plus 4 candidates (on CPU the heuristic is not among them)
    assert runs == 2 * (1 + 4) - 1
    assert len(errors) == 1
    assert "fp32 D16 causal gqa2 S40 fwd+bwd bwd BwdParams(q_blocksize=32, kv_blocksize=64, num_warps=4, " \
           "num_stages=2, ws=None, fused=None): RuntimeError: out of resources" == errors[0]


def fake_compile_worker(op_name, spec, shard, shards):
    """A stand-in worker for warm_compiles (module level: spawned processes import it)."""
    if spec.head_dim == 32:
        raise RuntimeError("ptxas failed")
    if spec.head_dim == 64:
        os._exit(3)  # a crashed worker process
    return 2, []


def test_warm_compiles_reports_worker_failures_and_crashes():
    specs = [parse_attention_shape(TINY), parse_attention_shape(TINY.replace("D=16", "D=32")),
             parse_attention_shape(TINY.replace("D=16", "D=64"))]
    report = warm_compiles("flash_attention", specs, 1, worker=fake_compile_worker)
    assert report.groups == 3 and report.runs == 2
    assert report.errors[0] == "compile worker failed: RuntimeError: ptxas failed"
    assert "BrokenProcessPool" in report.errors[1]


# --- the runner --------------------------------------------------------------------------------------
class _Sink:
    def __init__(self):
        self.entries, self.closed = {}, 0

    def put(self, key, inputs, entry):
        self.entries[key_text(key)] = entry
        return "sink"

    def close(self):
        self.closed += 1


def test_time_limit_stops_before_the_next_spec_and_writes_what_is_done(monkeypatch):
    tuned = []
    monkeypatch.setattr(runner, "tune_one", lambda op, spec, **kw: tuned.append(spec) or [runner.Outcome(spec, "k")])
    ticks = iter([0.0, 0.0, 1.0, 2.0, 3.0])
    specs = llm_preset()[:4]
    sink = _Sink()
    report = runner.tune_specs(FLASH_ATTENTION, specs, device=device_info("cpu"), tuner=None, sink=sink,
                               limit_s=1.5, clock=lambda: next(ticks))
    assert tuned == specs[:2] and report.left == 2 and report.stopped == "time limit"
    assert sink.closed == 1


def test_ctrl_c_stops_and_still_writes(monkeypatch):
    def tune_one(op, spec, **kw):
        if spec is specs[1]:
            raise KeyboardInterrupt
        return [runner.Outcome(spec, "k")]

    monkeypatch.setattr(runner, "tune_one", tune_one)
    specs, sink = llm_preset()[:3], _Sink()
    report = runner.tune_specs(FLASH_ATTENTION, specs, device=device_info("cpu"), tuner=None, sink=sink)
    assert len(report.outcomes) == 1 and report.left == 2 and report.stopped == "interrupted"
    assert sink.closed == 1


def test_no_inference_entry_is_derived_from_a_forward_only_call():
    spec = parse_attention_shape(TINY + ",train=0")
    inputs = FLASH_ATTENTION.prepare(**spec.kwargs("cpu", "triton"))
    params = FLASH_ATTENTION.heuristic_config(inputs, device_info("cpu")).fwd_params
    result = TuneResult(FLASH_ATTENTION.heuristic_config(inputs, device_info("cpu")), 1.0, 1.0,
                        phase_results={"fwd": PhaseResult(params, 1.0, 1.0, candidates=1)})
    assert runner.derived_inference_entry(FLASH_ATTENTION, inputs, result) is None


def test_export_sink_merges_into_the_file_as_it_goes(tmp_path):
    from kernelops.tuning.sinks import ExportSink

    cpu = device_info("cpu")
    sink = ExportSink(tmp_path, FLASH_ATTENTION, cpu, flush_s=0.0)  # flush on every put
    first, second = (("dtype", "float32"), ("seq_q", 64)), (("dtype", "float32"), ("seq_q", 128))
    where = sink.put(first, None, make_entry({"fwd_params": None}, ms=2.0))
    path = tmp_path / "cpu" / "flash_attention.json"
    assert where == str(path) and set(json.loads(path.read_text())["entries"]) == {key_text(first)}
    sink.put(second, None, make_entry({"fwd_params": None}, ms=1.0))
    sink.close()
    assert set(json.loads(path.read_text())["entries"]) == {key_text(first), key_text(second)}


# --- --resume-since -----------------------------------------------------------------------------------
def test_spec_key_on_meta_is_the_key_the_tune_writes():
    for spec in [parse_attention_shape(TINY), parse_attention_shape(TINY + ",train=0"), llm_preset()[-1]]:
        inputs = FLASH_ATTENTION.prepare(**spec.kwargs("cpu"))
        assert runner.spec_key_text(FLASH_ATTENTION, spec) == key_text(FLASH_ATTENTION.key(inputs))


def test_tuned_since_keeps_recent_entries_of_these_versions():
    from kernelops.ops.device import versions

    now = runner.parse_since("2026-11-23T12:00:00")
    assert now.tzinfo is not None and runner.parse_since("2026-11-23") < now
    ours = versions()
    entries = {"new": {"created": "2026-11-23T12:00:00+00:00", "versions": ours},
               "old": {"created": "2026-11-22T23:59:59+00:00", "versions": ours},
               "other-triton": {"created": "2026-11-24T00:00:00+00:00", "versions": {**ours, "triton": "0.0"}},
               "no-date": {"versions": ours}, "bad-date": {"created": "yesterday", "versions": ours}}
    assert runner.tuned_since(entries, now, ours) == {"new"}
    assert runner.tuned_since(entries, runner.parse_since("2026-11-22"), ours) == {"new", "old"}


@interpreter_only
def test_resume_since_skips_specs_the_export_already_holds(capsys, tmp_path):
    export, cpu = tmp_path / "export", device_info("cpu")
    other = TINY.replace("S=40", "S=72")
    done = runner.spec_key_text(FLASH_ATTENTION, parse_attention_shape(TINY))
    write_pretuned_file(export, "flash_attention", {done: make_entry({"fwd_params": None}, ms=1.0)}, cpu)
    args = ("tune", "flash_attention", "--shapes", TINY, "--shapes", other, "--export", str(export), "--dry-run")
    code, out, err = _run(capsys, *args, "--resume-since", "2000-01-01")
    assert code == 0 and "1 spec(s) already tuned" in err and "1 left" in err
    assert out.strip().splitlines() == [f"{parse_attention_shape(other).summary():40s} "
                                        f"{parse_attention_shape(other).text()}", "1 spec(s)"]
    code, out, err = _run(capsys, *args, "--resume-since", "2999-01-01")  # the entry predates it
    assert code == 0 and "0 spec(s) already tuned" in err and out.strip().endswith("2 spec(s)")
    code, out, err = _run(capsys, *args[:4], "--export", str(export), "--resume-since", "2000-01-01")
    assert code == 0 and "1 spec(s) already tuned" in err and "0 left" in err
    assert "every spec was already tuned" in out


@interpreter_only
def test_an_export_destination_that_cannot_be_written_fails_before_tuning(capsys, tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("x")
    monkeypatch.setattr(runner, "tune_specs", lambda *a, **k: pytest.fail("tuned although nothing could be kept"))
    code, _, err = _run(capsys, "tune", "flash_attention", "--shapes", TINY, "--export", str(tmp_path / "a_file"))
    assert code == 1 and "cannot write to --export" in err


@interpreter_only
def test_tune_into_an_unusable_disk_cache_fails_before_tuning(capsys, tmp_path, monkeypatch, fresh_default_executor):
    folder = tmp_path / "user-cache"
    folder.mkdir()
    (folder / "cache.db").write_bytes(os.urandom(4096))
    with pytest.warns(RuntimeWarning):
        fresh_default_executor()
        code, _, err = _run(capsys, "tune", "flash_attention", "--shapes", TINY)
    assert code == 1 and "unusable" in err and "--export" in err


@interpreter_only
def test_resume_from_a_malformed_export_file_is_reported(capsys, tmp_path):
    path = tmp_path / "export" / "cpu" / "flash_attention.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    code, _, err = _run(capsys, "tune", "flash_attention", "--shapes", TINY, "--export", str(tmp_path / "export"),
                        "--resume-since", "2026-01-01", "--dry-run")
    assert code == 1 and "cannot read" in err and str(path) in err


@pytest.mark.parametrize("extra, message", [
    (["--resume-since", "2026-11-23"], "--resume-since needs --export"),
    (["--export", "x", "--resume-since", "last week"], "not an ISO date or date-time: 'last week'"),
])
def test_resume_since_usage_errors(capsys, extra, message):
    code, _, err = _run(capsys, "tune", "flash_attention", "--shapes", TINY, *extra)
    assert code == 2 and message in err, err


# --- end to end under the interpreter --------------------------------------------------------------
@interpreter_only
def test_tune_exports_a_file_the_pretuned_selector_serves(capsys, tmp_path, monkeypatch, few_candidates,
                                                          fresh_default_executor):
    export = tmp_path / "export"
    cpu = device_info("cpu")
    old = make_entry({"fwd_params": {"q_blocksize": 16}}, ms=1.0)  # an entry from an earlier run: kept
    write_pretuned_file(export, "flash_attention", {"dtype=float64|seq_q=1": old}, cpu)
    code, out, err = _run(capsys, "tune", "flash_attention", "--shapes", TINY, "--export", str(export))
    assert code == 0, err
    path = export / "cpu" / "flash_attention.json"
    assert "written" in out and str(path) in out and "derived" in out
    assert "tuned 1 key(s) and derived 1" in out

    entries = json.loads(path.read_text())["entries"]
    spec = parse_attention_shape(TINY)
    train_key = key_text(FLASH_ATTENTION.key(FLASH_ATTENTION.prepare(**_qkv(spec, True), causal=True)))
    with torch.no_grad():
        infer_key = key_text(FLASH_ATTENTION.key(FLASH_ATTENTION.prepare(**_qkv(spec, False), causal=True)))
    assert set(entries) == {"dtype=float64|seq_q=1", train_key, infer_key}
    train, infer = entries[train_key], entries[infer_key]
    assert dict(parse_key_text(infer_key))["train"] is False and dict(parse_key_text(train_key))["train"] is True
    assert infer["derived_from"] == train_key and "derived_from" not in train
    assert infer["config"]["fwd_params"] == train["config"]["fwd_params"]
    assert 0 < infer["ms"] < train["ms"]  # the forward phase alone
    assert train["spec"] == spec.text() and train["source"] == "autotune"
    assert train["candidates"] == 2 * (4 + 1)  # per phase: 4 candidates and the heuristic

    monkeypatch.setenv("KERNELOPS_PRETUNED_DIR", str(export))
    fresh_default_executor()
    from kernelops.ops import default_executor

    for grad, entry in ((True, train), (False, infer)):
        expl = default_executor().explain(FLASH_ATTENTION, **_qkv(spec, grad), causal=True, platform="triton")
        assert expl.selector == "pretuned", expl
        assert expl.config.to_dict() == entry["config"]
        assert expl.entry["how"] == "exact key in cpu/flash_attention.json"
        assert dict(expl.declined)["disk"].startswith("no entry in")  # the user cache is empty


@interpreter_only
def test_fp8_tune_exports_a_file_the_pretuned_selector_serves(capsys, tmp_path, monkeypatch, fresh_default_executor):
    """``kernelops tune flash_attention_fp8 --export``: one forward key written to
    ``<device>/flash_attention_fp8.json`` (nothing derived: no gradients), which the pretuned selector
    then serves to the same call on a fresh executor."""
    from kernelops.modules.flash_attention_fp8 import FLASH_ATTENTION_FP8, FlashAttentionFP8

    original = FlashAttentionFP8.candidate_params
    monkeypatch.setattr(FlashAttentionFP8, "candidate_params",
                        lambda self, inputs, device, phase: original(self, inputs, device, phase)[:3])
    text = "B=1,S=40,Hq=2,Hkv=1,D=16,causal=1"
    export = tmp_path / "export"
    code, out, err = _run(capsys, "tune", "flash_attention_fp8", "--shapes", text, "--export", str(export))
    assert code == 0, err
    assert "tuned 1 key(s) and derived 0" in out
    entries = json.loads((export / "cpu" / "flash_attention_fp8.json").read_text())["entries"]
    spec = parse_fp8_shape(text)
    kw = spec.kwargs("cpu")
    key = key_text(FLASH_ATTENTION_FP8.key(FLASH_ATTENTION_FP8.prepare(**kw)))
    assert list(entries) == [key] and entries[key]["spec"] == spec.text()
    assert entries[key]["candidates"] == 3 + 1 and entries[key]["ms"] > 0

    monkeypatch.setenv("KERNELOPS_PRETUNED_DIR", str(export))
    fresh_default_executor()
    from kernelops.ops import default_executor

    expl = default_executor().explain(FLASH_ATTENTION_FP8, **{**kw, "platform": "triton"})
    assert expl.selector == "pretuned", expl
    assert expl.config.to_dict() == entries[key]["config"]


@interpreter_only
def test_tune_without_export_fills_the_user_disk_cache(capsys, few_candidates, fresh_default_executor):
    code, out, err = _run(capsys, "tune", "flash_attention", "--shapes", TINY + ",train=0", "--quiet")
    assert code == 0, err
    assert out.startswith("tuned 1 key(s) and derived 0 in ") and out.endswith("; 0 failed\n")
    assert err == ""  # --quiet: no progress, no table
    fresh_default_executor()  # a new process, as it were: memory empty, disk filled
    from kernelops.ops import default_executor

    expl = default_executor().explain(FLASH_ATTENTION, **_qkv(parse_attention_shape(TINY), False), causal=True,
                                      platform="triton")
    assert expl.selector == "disk"
    assert expl.entry["source"] == "autotune" and expl.entry["ms"] > 0


def test_a_spec_whose_every_candidate_fails_exits_1(capsys, tmp_path, monkeypatch, few_candidates):
    def broken(self, inputs, config, phase):
        raise RuntimeError("no kernel today")

    monkeypatch.setattr(FlashAttention, "bench_fn", broken)
    code, out, _ = _run(capsys, "tune", "flash_attention", "--shapes", TINY, "--export", str(tmp_path))
    assert code == 1
    assert "FAILED: every candidate failed: fwd: RuntimeError: no kernel today" in out
    assert not (tmp_path / "cpu" / "flash_attention.json").exists()


@interpreter_only
def test_an_unsupported_spec_fails_with_its_reason(capsys, tmp_path):
    code, out, _ = _run(capsys, "tune", "flash_attention", "--shapes", TINY.replace("fp32", "bf16"),
                        "--export", str(tmp_path))
    assert code == 1
    assert "FAILED: NotSupportedError" in out and "bfloat16" in out
