"""``kernelops info``: versions, device, policy, the disk cache (folder, entries, size) and which
shipped pre-tuned files match this device (exact device, same capability, or none)."""

from __future__ import annotations

import json

import pytest
import torch
import triton

import kernelops
from kernelops.cli import main
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops import ConfigCache
from kernelops.ops.cache import make_entry
from kernelops.ops.device import DeviceInfo, device_info
from kernelops.ops.pretuned import write_pretuned_file
from kernelops.tuning.cache_admin import files_for_device, shipped_files
from kernelops.tuning.sinks import DiskCacheSink

CPU = device_info("cpu")
GPU_A = DeviceInfo("cuda", 0, "FAKE_H100", (9, 0), 227 * 1024, 132)
GPU_B = DeviceInfo("cuda", 0, "FAKE_H200", (9, 0), 227 * 1024, 132)
GPU_OLD = DeviceInfo("cuda", 0, "FAKE_A100", (8, 0), 163 * 1024, 108)


def _run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _entries(n: int) -> dict[str, dict]:
    out = {}
    for i in range(n):
        q = torch.randn(1, 32 << i, 2, 16)
        inputs = FLASH_ATTENTION.prepare(query=q, key=q, value=q, causal=True)
        out[FLASH_ATTENTION.key(inputs)] = (inputs, make_entry(FLASH_ATTENTION.heuristic_config(inputs, CPU), ms=1.0 + i))
    return out


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Empty cache folder and an empty pre-tuned root for the command."""
    cache, root = tmp_path / "cache", tmp_path / "pretuned"
    root.mkdir()
    monkeypatch.setenv("KERNELOPS_CACHE_DIR", str(cache))
    monkeypatch.setenv("KERNELOPS_PRETUNED_DIR", str(root))
    return cache, root


def _write(root, device: DeviceInfo, n: int = 2):
    from kernelops.ops.keys import key_text

    entries = {key_text(key): entry for key, (_, entry) in _entries(n).items()}
    return write_pretuned_file(root, "flash_attention", entries, device)


def _op_lines(out: str) -> dict[str, tuple[str, str]]:
    """``kernelops info``'s op table: ``{op: (platforms, shipped cache)}``."""
    lines = out.split("\nops: ", 1)[1].splitlines()
    count, header, rows = int(lines[0]), lines[1], lines[2:2 + int(lines[0])]
    assert header.split()[:3] == ["op", "platforms", "shipped"]
    platforms_at, cache_at = header.index("platforms"), header.index("shipped")
    table = {row[:platforms_at].strip(): (row[platforms_at:cache_at].strip(), row[cache_at:]) for row in rows}
    assert len(table) == count
    return table


def test_info_help(capsys):
    code, out, _ = _run(capsys, "info", "--help")
    assert code == 0 and "usage: kernelops info" in out and "examples:" in out


def test_info_versions_device_and_empty_cache(capsys, env, monkeypatch):
    cache, _ = env
    monkeypatch.setenv("KERNELOPS_AUTOTUNE", "never")
    code, out, err = _run(capsys, "info")
    assert code == 0, err
    dev = device_info()
    assert f"kernelops {kernelops.__version__}, torch {torch.__version__}, triton {triton.__version__}" in out
    assert f"device: {dev.name} (" in out
    assert "autotune policy: never" in out
    assert f"disk cache: {cache} (not created yet: 0 entries)" in out
    assert not cache.exists()  # info never creates the folder
    assert "shipped pre-tuned files under" in out and ": none" in out
    assert _op_lines(out)["flash_attention"] == ("triton, torch", "no")


def test_info_counts_cache_entries_and_size(capsys, env):
    cache_dir, _ = env
    cache = ConfigCache(cache_dir)
    sink = DiskCacheSink(cache, FLASH_ATTENTION, CPU)
    for key, (inputs, entry) in _entries(3).items():
        sink.put(key, inputs, entry)
    cache.put_disk("flash_attention|seq_q=1|device=cpu|torch=0.1|triton=0.1|kernelops=0.0|src=0", make_entry({}))
    size = cache.disk_size_bytes()
    cache.close()
    code, out, _ = _run(capsys, "info")
    assert code == 0
    assert f"disk cache: {cache_dir}\n" in out
    assert f"  4 entries (3 usable by this install), {size / 1024:.1f} KiB" in out  # the 4th has old versions


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU's view: its own folder only")
def test_info_marks_the_file_of_this_device(capsys, env):
    _, root = env
    _write(root, CPU, 2)
    _write(root, GPU_A, 1)
    (root / "BROKEN").mkdir()
    (root / "BROKEN" / "flash_attention.json").write_text("{not json")
    code, out, _ = _run(capsys, "info")
    assert code == 0
    assert "shipped pre-tuned files under" in out and f"{root}: 3" in out
    assert "  cpu/flash_attention.json: 2 entries, -, " in out and "[exact device]" in out
    assert "  FAKE_H100/flash_attention.json: 1 entries, sm90, " in out and "[other device]" in out
    assert "  BROKEN/flash_attention.json: UNUSABLE (JSONDecodeError" in out
    assert _op_lines(out)["flash_attention"] == ("triton, torch", "yes: cpu/flash_attention.json (exact device)")


def test_shipped_files_relations(tmp_path):
    _write(tmp_path, GPU_A, 3)
    _write(tmp_path, GPU_OLD, 1)
    (tmp_path / "X").mkdir()
    (tmp_path / "X" / "flash_attention.json").write_text(json.dumps({"metadata": {}, "entries": {}}))
    # seen from an H200: the H100 file has the same capability, the A100 file does not
    files = {f.label: f for f in shipped_files(tmp_path, GPU_B)}
    assert files["FAKE_H100/flash_attention.json"].relation == "same capability"
    assert files["FAKE_H100/flash_attention.json"].entries == 3
    assert files["FAKE_A100/flash_attention.json"].relation == "other device"
    assert files["X/flash_attention.json"].relation == "unusable" and "metadata" in files["X/flash_attention.json"].error
    assert {op: [f.label for f in fs] for op, fs in files_for_device(list(files.values())).items()} == {
        "flash_attention": ["FAKE_H100/flash_attention.json"]}
    # seen from the H100 itself: its own file first, nothing else of sm90
    own = shipped_files(tmp_path, GPU_A)
    assert [f.label for f in files_for_device(own)["flash_attention"]] == ["FAKE_H100/flash_attention.json"]
    assert files_for_device(shipped_files(tmp_path, CPU)) == {}  # a CPU has no capability fallback
    assert shipped_files(tmp_path / "missing", CPU) == []


def test_info_reports_a_bad_policy_without_failing(capsys, env, monkeypatch):
    monkeypatch.setenv("KERNELOPS_AUTOTUNE", "sometimes")
    code, out, _ = _run(capsys, "info")
    assert code == 0 and "autotune policy: invalid (KERNELOPS_AUTOTUNE must be one of" in out


def test_demo_with_a_bad_autotune_policy_says_so(capsys, monkeypatch):
    monkeypatch.setenv("KERNELOPS_AUTOTUNE", "bogus")
    code, _, err = _run(capsys, "demo")
    assert code == 1 and "KERNELOPS_AUTOTUNE must be one of" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU prints")
def test_info_on_a_cpu_shows_no_gpu_facts(capsys, env):
    code, out, _ = _run(capsys, "info")
    assert code == 0
    device_line = next(line for line in out.splitlines() if line.startswith("device: "))
    assert device_line.startswith("device: cpu (no CUDA GPU: ops run their torch platform")
    for gpu_fact in ("smem", "SMs", "capability", "232448"):
        assert gpu_fact not in device_line


def test_info_on_a_gpu_shows_its_facts_and_the_shipped_file_of_each_op(capsys, env, monkeypatch):
    import kernelops.ops.device

    _, root = env
    _write(root, GPU_A, 3)  # same capability as GPU_B: its fallback
    _write(root, GPU_OLD, 1)
    monkeypatch.setattr(kernelops.ops.device, "device_info", lambda device=None: GPU_B)
    code, out, _ = _run(capsys, "info")
    assert code == 0
    assert f"device: FAKE_H200 (capability sm90, smem/block {227 * 1024} B, SMs 132)" in out
    ops = _op_lines(out)
    assert ops["flash_attention"] == ("triton, torch", "yes: FAKE_H100/flash_attention.json (same capability)")
    assert ops["flash_attention_fp8"] == ("triton, torch", "no")
    assert ops["attention"] == ("torch", "no (nothing to tune)")
    _write(root, GPU_B, 1)  # its own file comes first
    code, out, _ = _run(capsys, "info")
    assert _op_lines(out)["flash_attention"][1] == ("yes: FAKE_H200/flash_attention.json (exact device), "
                                                    "FAKE_H100/flash_attention.json (same capability)")


def test_info_lists_every_op_with_its_platforms(capsys, env):
    from kernelops.modules import operations

    code, out, _ = _run(capsys, "info")
    assert code == 0
    ops = _op_lines(out)
    assert set(ops) >= {"flash_attention", "scaled_dot_product_attention", "attention", "flash_attention_fp8"}
    assert set(ops) == set(operations())
    for name, op in operations().items():
        assert ops[name][0] == ", ".join(op.platforms)


def test_a_new_op_module_is_listed_without_registering_it_anywhere(capsys, env):
    import gc

    from kernelops.modules import operations
    from kernelops.ops import Operation

    probe = type("ProbeOp", (Operation,), {"name": "probe_op", "platforms": ("torch",),
                                           "__module__": "kernelops.modules.probe_op"})
    elsewhere = type("OtherOp", (Operation,), {"name": "other_op", "__module__": "tests.other"})
    try:
        assert operations()["probe_op"] is probe and "other_op" not in operations()
        code, out, _ = _run(capsys, "info")
        assert code == 0 and _op_lines(out)["probe_op"] == ("torch", "no (nothing to tune)")
    finally:
        del probe, elsewhere
        gc.collect()
    assert "probe_op" not in operations()
