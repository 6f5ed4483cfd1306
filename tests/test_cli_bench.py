"""``kernelops bench`` and kernelops.tuning.bench: every implementation (the kernelops column of every
benchable op too) computes the spec's attention (checked against float64), FLOP counts, the table and
JSON rows, refusals, exit codes."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from kernelops.cli import main
from kernelops.tuning.bench import (
    OPS, attention_flops, build_impl, cpu_timer, format_table, make_inputs, run_bench, visible_mask, visible_pairs,
    window_bounds,
)
from kernelops.tuning.specs import parse_attention_shape

SPECS = [
    "B=2,Sq=37,Sk=53,Hq=4,Hkv=2,D=16,dtype=fp32,causal=0",  # full, GQA, Sq != Sk
    "B=1,Sq=29,Sk=70,Hq=6,Hkv=2,D=32,dtype=fp32,causal=1",  # causal bottom-right with Sq < Sk
    "B=1,S=64,Hq=2,Hkv=1,D=16,dtype=fp32,causal=1",  # causal, equal lengths
    "B=2,Sq=45,Sk=60,Hq=2,D=16,dtype=fp32,window=9",  # two-sided window
    "B=1,S=50,Hq=4,Hkv=4,D=8,dtype=fp32,causal=1,window=7",  # causal + window
]


def _reference(spec, q, k, v) -> torch.Tensor:
    """float64 attention in BSHD with the mask rule -left <= j - (i + Sk - Sq) <= right."""
    q, k, v = (t.double() for t in (q, k, v))
    group = spec.heads_q // spec.heads_kv
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(spec.head_dim)
    left, right = window_bounds(spec)
    i = torch.arange(spec.seq_q)[:, None]
    j = torch.arange(spec.seq_k)[None, :]
    rel = j - (i + spec.seq_k - spec.seq_q)
    allowed = torch.ones(spec.seq_q, spec.seq_k, dtype=torch.bool)
    if left is not None:
        allowed &= rel >= -left
    if right is not None:
        allowed &= rel <= right
    logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(logits, dim=-1), v)


def _run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# --- what each implementation computes ------------------------------------------------------------
@pytest.mark.parametrize("impl, op", [("kernelops", op) for op in OPS] + [("sdpa-math", None), ("flex", None)])
@pytest.mark.parametrize("text", SPECS)
def test_each_impl_computes_the_spec(impl, op, text):
    spec = parse_attention_shape(text)
    q, k, v = make_inputs(spec, "cpu")
    assert all(t.dtype == torch.float32 for t in (q, k, v))
    layout, run, _ = build_impl(impl, spec, "cpu", *([op] if op else []))
    args = [t.transpose(1, 2).contiguous() if layout == "bhsd" else t for t in (q, k, v)]
    with torch.no_grad():
        out = run(*args)
    out = out.transpose(1, 2) if layout == "bhsd" else out
    ref = _reference(spec, q, k, v)
    assert out.shape == ref.shape
    assert (out.double() - ref).abs().max().item() < 2e-5


def test_inputs_are_fresh_random_and_seedable():
    spec = parse_attention_shape(SPECS[0])
    a, b = make_inputs(spec, "cpu"), make_inputs(spec, "cpu")
    assert not torch.equal(a[0], b[0]) and (a[0] != 0).float().mean() > 0.99
    assert all(torch.equal(x, y) for x, y in zip(make_inputs(spec, "cpu", seed=3), make_inputs(spec, "cpu", seed=3)))
    assert a[0].shape == (2, 37, 4, 16) and a[1].shape == (2, 53, 2, 16)


# --- FLOPs ---------------------------------------------------------------------------------------------
def _pairs_by_loop(sq, sk, left, right) -> int:
    return sum(1 for i in range(sq) for j in range(sk)
               if (left is None or j - (i + sk - sq) >= -left) and (right is None or j - (i + sk - sq) <= right))


def test_visible_pairs_counts_the_mask():
    rng = random.Random()
    for _ in range(30):
        sq, sk = rng.randint(1, 40), rng.randint(1, 40)
        left, right = rng.choice([None, 0, rng.randint(0, 50)]), rng.choice([None, 0, rng.randint(0, 50)])
        expected = _pairs_by_loop(sq, sk, left, right)
        assert visible_pairs(sq, sk, left, right) == expected == int(visible_mask(sq, sk, left, right).sum())


def test_attention_flops():
    full = parse_attention_shape("B=2,Sq=100,Sk=300,Hq=8,Hkv=2,D=64,dtype=fp16")
    assert attention_flops(full) == 4 * 2 * 8 * 100 * 300 * 64
    assert attention_flops(full, "fwd+bwd") == 3.5 * attention_flops(full)
    causal = parse_attention_shape("B=2,S=1k,Hq=8,D=128,causal=1")
    assert attention_flops(causal) == 4 * 2 * 8 * 1024 * 1024 * 128 / 2
    window = parse_attention_shape("B=1,S=40,Hq=2,D=16,causal=1,window=5")
    assert attention_flops(window) == 4 * 1 * 2 * 16 * _pairs_by_loop(40, 40, 5, 0)
    with pytest.raises(ValueError, match="mode must be one of"):
        attention_flops(full, "bwd")


# --- the command ---------------------------------------------------------------------------------------
#: how each op's kernelops row says it expressed SPECS[1] (causal, Sq < Sk) and SPECS[3] (window)
OP_NOTES = {"flash_attention": ("", ""),
            "scaled_dot_product_attention": ("causal as a boolean [Sq, Sk] mask", "window as a boolean [Sq, Sk] mask"),
            "attention": ("weights materialised", "weights materialised")}


@pytest.mark.parametrize("op", OPS)
def test_bench_command_table_and_json(capsys, tmp_path, op):
    path = tmp_path / "out" / "bench.json"
    code, out, err = _run(capsys, "bench", op, "--shapes", SPECS[1], "--shapes", SPECS[3],
                          "--backward", "--rep-ms", "1", "--json", str(path), "--quiet")
    assert code == 0, err
    header = out.splitlines()[0].split()
    assert header[:5] == ["call", "impl", "ms", "TFLOP/s", "kernelops"]
    report = json.loads(path.read_text())
    assert report["torch"] == torch.__version__ and "device" in report and "created" in report
    rows = report["rows"]
    cuda = torch.cuda.is_available()
    impls = ["kernelops", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "flex"] if cuda else [
        "kernelops", "sdpa-math", "flex"]
    assert len(rows) == 2 * 2 * len(impls) and all(r["op"] == op for r in rows)
    for spec_text, op_note in zip((SPECS[1], SPECS[3]), OP_NOTES[op]):
        spec = parse_attention_shape(spec_text)
        for mode in ("fwd", "fwd+bwd"):
            group = [r for r in rows if r["spec"] == spec.text() and r["mode"] == mode]
            assert [r["impl"] for r in group] == impls
            base = group[0]["ms"]
            assert base > 0 and group[0]["speedup"] == 1.0
            assert op_note in group[0]["note"]
            for r in group:
                if r["impl"] == "flex" and mode == "fwd+bwd" and not cuda:
                    assert r["ms"] is None and "no backward on CPU" in r["note"]
                    continue
                if cuda and r["impl"].startswith("sdpa") and r["ms"] is None:
                    assert r["note"]  # a backend that refuses the call says why
                    continue
                assert r["ms"] > 0, r
                assert math.isclose(r["tflops"], attention_flops(spec, mode) / r["ms"] / 1e9, rel_tol=1e-9)
                assert math.isclose(r["speedup"], r["ms"] / base, rel_tol=1e-9)
                if mode == "fwd":
                    assert r["max_abs_diff"] is not None and r["max_abs_diff"] < (2e-5 if not cuda else 2e-3)
                else:
                    assert r["max_abs_diff"] is None
    assert f"platform {'triton' if cuda and op != 'attention' else 'torch'}" in rows[0]["note"]
    assert "wrote" not in err  # --quiet


@pytest.mark.skipif(torch.cuda.is_available(), reason="cuDNN may accept the call on a GPU")
def test_bench_reports_a_refused_backend_and_still_succeeds(capsys, tmp_path):
    path = tmp_path / "rows.json"
    code, out, _ = _run(capsys, "bench", "flash_attention", "--shapes", SPECS[0], "--impls", "sdpa-cudnn",
                        "--rep-ms", "1", "--quiet", "--json", str(path))
    assert code == 0
    kernelops, cudnn = json.loads(path.read_text())["rows"]
    assert kernelops["impl"] == "kernelops" and kernelops["ms"] > 0
    assert cudnn["impl"] == "sdpa-cudnn" and cudnn["ms"] is None and cudnn["tflops"] is None and cudnn["note"]
    assert cudnn["note"] in out


def test_bench_rows_without_a_timed_kernelops_fail(capsys):
    code, out, err = _run(capsys, "bench", "flash_attention", "--shapes", "B=1,S=16,Hq=1,D=300,dtype=fp32",
                          "--impls", "sdpa-math", "--rep-ms", "1", "--quiet")
    assert code == 1
    assert "kernelops failed on 1 row(s)" in err and "head_dim must be in 1..256" in err
    assert "sdpa-math" in out  # the other rows are still shown


@pytest.mark.parametrize("argv, message", [
    (["bench"], "required"),
    (["bench", "flash_attention"], "the following arguments are required: --shapes"),
    (["bench", "flash_attention_fp8", "--shapes", SPECS[0]], "invalid choice: 'flash_attention_fp8'"),
    (["bench", "flash_attention", "--shapes", "B=1,S=8"], "lacks Hq, D"),
    (["bench", "flash_attention", "--shapes", SPECS[0], "--impls", "xformers"], "invalid choice"),
    (["bench", "flash_attention", "--shapes", SPECS[0], "--rep-ms", "0"], "must be > 0"),
])
def test_bench_usage_errors_exit_2(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2 and message in err, err


def test_bench_unknown_op_names_the_benchable_ones(capsys):
    code, out, err = _run(capsys, "bench", "flash_attn", "--shapes", SPECS[0])
    assert code == 2 and out == ""
    assert "argument op: invalid choice: 'flash_attn'" in err and all(op in err for op in OPS), err


def test_bench_help(capsys):
    code, out, _ = _run(capsys, "bench", "--help")
    assert code == 0 and "examples:" in out and "kernelops bench flash_attention --shapes" in out
    assert all(name in out for name in ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math", "flex"))
    assert all(f"kernelops bench {op} --shapes" in out for op in OPS)


def test_format_table_groups_rows():
    rows = run_bench([parse_attention_shape(SPECS[2])], impls=["sdpa-math"], device="cpu", timer=cpu_timer(1))
    text = format_table(rows).splitlines()
    assert len(text) == 3 and text[1].startswith("fp32 D16 causal gqa2 S64 fwd") and text[2].startswith(" ")
    with pytest.raises(ValueError, match="unknown implementation"):
        run_bench([], impls=["nope"], device="cpu")
    with pytest.raises(ValueError, match="unknown op 'flash_attention_fp8'; kernelops bench knows: flash_attention, "
                                         "scaled_dot_product_attention, attention"):
        run_bench([], device="cpu", op="flash_attention_fp8")


@pytest.mark.gpu
def test_bench_on_a_gpu_against_sdpa_and_flex():
    specs = [parse_attention_shape("B=2,S=256,Hq=8,Hkv=2,D=64,dtype=bf16,causal=1"),
             parse_attention_shape("B=1,Sq=128,Sk=384,Hq=4,D=128,dtype=fp16,window=64")]
    rows = run_bench(specs, modes=("fwd", "fwd+bwd"), device="cuda")
    assert {r.impl for r in rows} == {"kernelops", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "flex"}
    for r in rows:
        assert r.ms is not None or r.note, r
        if r.impl == "kernelops":
            assert r.ms is not None and "platform triton" in r.note
        if r.ms is not None and r.mode == "fwd":
            assert r.max_abs_diff < 3e-2, r
    flex = [r for r in rows if r.impl == "flex"]
    assert all(r.ms is not None and "compiled" in r.note for r in flex), flex


def test_json_destination_that_cannot_be_written_fails_before_timing(capsys, tmp_path, monkeypatch):
    import kernelops.tuning.bench as bench_mod

    (tmp_path / "a_file").write_text("x")
    monkeypatch.setattr(bench_mod, "run_bench", lambda *a, **k: pytest.fail("timed although the report is lost"))
    code, _, err = _run(capsys, "bench", "flash_attention", "--shapes", "B=1,S=32,Hq=2,Hkv=1,D=16",
                        "--json", str(tmp_path / "a_file" / "report.json"))
    assert code == 1 and "cannot write --json" in err
