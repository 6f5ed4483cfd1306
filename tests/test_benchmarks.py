"""The benchmark suite on a CPU: every benchmark imports, ``python -m benchmarks --list`` works, a
run without CUDA exits cleanly, and the harness counts work and forms ratios correctly. Nothing is
timed here."""

import importlib
import json
import math
import subprocess
import sys

import pytest
import torch

import benchmarks
from benchmarks import harness as H

ROOT = benchmarks.HERE.parent
NAMES = [b.name for b in benchmarks.discover()]


def test_the_suite_has_its_benchmarks():
    assert {"flash_attention", "flash_attention_fp8", "dispatch_overhead", "host_time", "first_call"} <= set(NAMES)
    kinds = {b.name: b.kind for b in benchmarks.discover()}
    assert kinds["flash_attention"] == "op" and kinds["dispatch_overhead"] == "machinery"
    assert all(b.summary for b in benchmarks.discover())


@pytest.mark.parametrize("name", NAMES)
def test_every_benchmark_imports_and_has_main(name):
    module = importlib.import_module(f"benchmarks.{name}")
    assert callable(module.main)
    assert module.KIND in ("op", "machinery")


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_list():
    done = _run("--list")
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    assert listed == NAMES


def test_unknown_benchmark_is_a_usage_error():
    done = _run("no_such_benchmark")
    assert done.returncode == 2 and "unknown benchmark" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without CUDA gets")
def test_without_cuda_the_suite_says_so_and_exits_2():
    done = _run("--quick")
    assert done.returncode == 2
    assert "No CUDA device" in done.stderr and "Traceback" not in done.stderr


def test_report_needs_no_gpu(tmp_path):
    path = tmp_path / "flash_attention.json"
    timed = (("kernelops", 1.0), ("sdpa_flash", 2.0), ("sdpa_cudnn", 1.25))
    rows = [{"impl": impl, "dtype": "bf16", "mode": "fwd", "D": 128, "causal": True, "S": 1024, "B": 16, "H": 16,
             "ms": ms, "tflops": 1.0 / ms} for impl, ms in timed]
    path.write_text(json.dumps({"device": "X", "torch": "t", "triton": "t", "rows": rows}))  # a file of one run
    done = _run("flash_attention", "--report", str(path), "--no-plot")
    assert done.returncode == 0, done.stderr
    assert "| fwd | 128 | yes | 1k | 1 | 0 | 1 | 2.00x | 1.25x |" in done.stdout


# --- counting -----------------------------------------------------------------------------------
def test_attention_flops():
    assert H.attention_flops(2, 16, 1024, 1024, 128) == 4 * 2 * 16 * 1024 * 1024 * 128
    assert H.attention_flops(2, 16, 1024, 1024, 128, causal=True) == 2 * 2 * 16 * 1024 * 1024 * 128
    fwd = H.attention_flops(1, 8, 512, 2048, 64)
    assert fwd == 4 * 8 * 512 * 2048 * 64
    assert H.attention_flops(1, 8, 512, 2048, 64, mode="fwdbwd") == 3.5 * fwd
    assert H.attention_flops(1, 8, 512, 2048, 64, mode="bwd") == 2.5 * fwd


def _pairs_by_mask(sq, sk, causal, left):
    i = torch.arange(sq)[:, None] + (sk - sq)  # each query's key position, bottom-right aligned
    j = torch.arange(sk)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if left is not None:
        keep &= j >= i - left
    return int(keep.sum())


@pytest.mark.parametrize("sq,sk", [(1, 1), (7, 7), (113, 113), (5, 203), (64, 1000), (203, 113)])
@pytest.mark.parametrize("causal,left", [(False, None), (True, None), (True, 0), (True, 16), (True, 150),
                                         (False, 20)])
def test_visible_pairs_match_the_mask(sq, sk, causal, left):
    assert H.visible_pairs(sq, sk, causal=causal, left=left) == _pairs_by_mask(sq, sk, causal, left)


def test_visible_pairs_closed_forms():
    assert H.visible_pairs(1000, 1000, causal=True) == 1000 * 1001 // 2
    assert H.visible_pairs(1000, 5000, causal=True) == 1000 * 4000 + 1000 * 1001 // 2  # a chunk over a prefix
    assert H.visible_pairs(8, 8, causal=True, left=3) == 1 + 2 + 3 + 4 * 5
    assert H.pairs_flops(10, 4, 64) == 4 * 10 * 4 * 64
    assert H.pairs_flops(10, 4, 64, mode="fwdbwd") == 3.5 * 4 * 10 * 4 * 64


def test_bytes_and_rates():
    a = torch.empty(3, 5, dtype=torch.bfloat16)
    b = torch.empty(7, dtype=torch.float32)
    assert H.nbytes(a) == 30 and H.nbytes(a, b) == 58
    assert math.isclose(H.tflops(2e12, 1000.0), 2.0)  # 2e12 FLOPs in one second
    assert math.isclose(H.tbps(3e12, 1000.0), 3.0)
    assert math.isclose(H.tflops(4 * 2 ** 30, 0.5), 4 * 2 ** 30 / 0.5e-3 / 1e12)


# --- rows, ratios and results ------------------------------------------------------------------
def test_row_identity_leaves_out_measurements():
    row = {"case": "dense", "impl": "kernelops", "S": 1024, "causal": True, "ms": 1.0, "tflops": 2.0, "host_us": 3.0,
           "first_fwd_s": 0.5, "rel_err": 1e-3, "run": 4, "error": "x"}
    assert H.row_key(row) == (("S", 1024), ("case", "dense"), ("causal", True), ("impl", "kernelops"))
    assert H.row_key(row, without=("impl",)) == (("S", 1024), ("case", "dense"), ("causal", True))


def test_speedup_and_compare_pair_rows_of_one_run_only():
    assert H.speedup(2.0, 3.0) == 1.5
    shape = {"case": "dense", "D": 128, "S": 4096, "causal": False}
    rows = [
        {**shape, "impl": "kernelops", "ms": 2.0, "tflops": 500.0, "run": 1},
        {**shape, "impl": "sdpa_cudnn", "ms": 2.2, "run": 1},
        {**shape, "impl": "sdpa_flash", "ms": 3.0, "run": 0},  # another run: never compared
        {**shape, "S": 8192, "impl": "sdpa_cudnn", "ms": 1.0, "run": 1},  # another shape
        {**shape, "impl": "flex", "error": "NotImplementedError", "run": 1},  # no time
    ]
    (entry,) = H.compare(rows, peers=["sdpa_cudnn", "sdpa_flash", "flex"])
    assert entry["ms"] == 2.0 and entry["tflops"] == 500.0 and entry["run"] == 1
    assert math.isclose(entry["x_sdpa_cudnn"], 1.1) and entry["sdpa_cudnn_ms"] == 2.2
    assert "x_sdpa_flash" not in entry and "x_flex" not in entry
    text = H.comparison_table(rows, peers=["sdpa_cudnn"])
    assert "1.10x" in text and "500.0" in text


def test_results_merge_replaces_only_what_a_run_measures_again(tmp_path):
    path = tmp_path / "DEV" / "op.json"
    res = H.Results("op", path)
    res.start_run({"created": "first"})
    res.add({"case": "a", "impl": "kernelops", "S": 1, "ms": 1.0})
    res.add({"case": "a", "impl": "kernelops", "S": 2, "ms": 2.0})
    again = H.Results.load(path, "op")
    assert again.start_run({"created": "second"}) == 1
    again.add({"case": "a", "impl": "kernelops", "S": 2, "ms": 5.0})
    data = json.loads(path.read_text())
    assert [r["created"] for r in data["runs"]] == ["first", "second"]
    assert sorted((r["S"], r["ms"], r["run"]) for r in data["rows"]) == [(1, 1.0, 0), (2, 5.0, 1)]


def test_results_read_older_files_of_one_run(tmp_path):
    path = tmp_path / "flash_attention.json"
    path.write_text(json.dumps({"device": "X", "torch": "2.11", "rows": [{"impl": "kernelops", "S": 1, "ms": 1.0}]}))
    res = H.Results.load(path, "flash_attention", defaults={"case": "dense", "dtype": "bf16"})
    assert res.data["runs"][0]["torch"] == "2.11"
    assert res.rows == [{"case": "dense", "dtype": "bf16", "run": 0, "impl": "kernelops", "S": 1, "ms": 1.0}]


def test_the_shipped_results_load_and_compare():
    res = H.Results.load(ROOT / "benchmarks/results/NVIDIA_H200/flash_attention.json", "flash_attention",
                         defaults={"case": "dense", "dtype": "bf16"})
    entries = H.compare(res.rows, peers=["sdpa_cudnn"])
    assert entries and all(0.5 < e["x_sdpa_cudnn"] < 2.0 for e in entries if "x_sdpa_cudnn" in e)


def test_device_names_and_sizes():
    assert H.normalize_device_name(" NVIDIA  H100 80GB HBM3 ") == "NVIDIA_H100_80GB_HBM3"
    assert [H.size_text(n) for n in (512, 1024, 131072, 1000)] == ["512", "1k", "128k", "1000"]


def test_host_time_shapes_parse():
    from benchmarks.host_time import parse_shape

    assert parse_shape("B=4,S=512,H=16,D=128") == {"B": 4, "S": 512, "H": 16, "D": 128}
    with pytest.raises(ValueError):
        parse_shape("B=4,S=512")
