"""The shipped pre-tuned files: valid, and what a fresh machine's executor picks (empty user cache).

The calls are built on the meta device and the executor is told it runs on the file's GPU, so
this runs on any machine; tests/test_packaging.py checks the files are inside the wheel.
"""

import json
import pathlib

import pytest
import torch

import kernelops.ops.executor as executor_mod
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops import ConfigCache, ConfigSelectorChain, DeviceInfo, Executor, PretunedStore
from kernelops.ops.keys import key_text, parse_key_text
from kernelops.ops.pretuned import _validate

ROOT = pathlib.Path(__file__).resolve().parents[1] / "autotune_cache"
FILES = sorted(ROOT.glob("*/flash_attention.json"))
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def test_h100_and_h200_files_are_shipped():
    assert {p.parent.name for p in FILES} >= {"NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.parent.name)
def test_file_is_valid_and_its_entries_were_tuned_on_that_device(path):
    data = json.loads(path.read_text())
    _validate(data)
    assert data["metadata"]["device"] == path.parent.name and data["metadata"]["capability"] == [9, 0]
    for text, entry in data["entries"].items():
        assert entry["source"] == "autotune" and entry["ms"] > 0 and entry["heuristic_ms"] > 0
        key = dict(parse_key_text(text))
        if "derived_from" in entry:  # an inference entry from its training key's forward phase
            assert key["train"] is False and dict(parse_key_text(entry["derived_from"]))["train"] is True
            assert entry["derived_from"] in data["entries"]


ALL_FILES = sorted(ROOT.glob("*/*.json"))


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_entry_passes_the_executors_entry_check(path):
    """The check the executor applies to each entry it reads (and `kernelops cache import` to each
    entry of a file) accepts every shipped entry, within the size limits."""
    from kernelops.ops.entries import MAX_ENTRIES, MAX_FILE_BYTES, check_entry
    from kernelops.tuning.cache_admin import operation_named

    assert path.stat().st_size <= MAX_FILE_BYTES // 4  # room to grow
    data = json.loads(path.read_text())
    assert len(data["entries"]) <= MAX_ENTRIES // 4
    op = operation_named(path.stem)
    device = DeviceInfo("cuda", 0, path.parent.name, tuple(data["metadata"]["capability"]), 232448, 132)
    for text, entry in data["entries"].items():
        check_entry(op, entry, key=text, device=device)


def _call(key: dict, device: str = "meta") -> dict:
    """Arguments of a call whose key is ``key`` (llm-preset fields), on ``device``."""
    S, D, gqa = key["seq_q"], key["head_dim"], key["gqa"]
    dtype = DTYPES[key["dtype"]]
    q = torch.empty(1, S, 2 * gqa, D, dtype=dtype, device=device, requires_grad=key["train"])
    kv = torch.empty(1, S, 2, D, dtype=dtype, device=device, requires_grad=key["train"])
    window = None if key["window"] is None else int(key["window"].split(":")[0])
    return dict(query=q, key=kv, value=kv, causal=key["causal"], sliding_window=window)


def _fresh_machine_executor(path, tmp_path, monkeypatch) -> Executor:
    """An executor on the file's GPU (as far as it can tell) with an empty user cache."""
    device = DeviceInfo("cuda", 0, path.parent.name, (9, 0), 232448, 132)
    monkeypatch.setattr(executor_mod, "device_info", lambda d=None: device)
    return Executor(ConfigSelectorChain(cache=ConfigCache(tmp_path / "empty-user-cache"), pretuned=PretunedStore(ROOT),
                                        policy="never"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.parent.name)
def test_a_fresh_executor_selects_the_shipped_entries(path, tmp_path, monkeypatch):
    data = json.loads(path.read_text())
    ex = _fresh_machine_executor(path, tmp_path, monkeypatch)
    texts = sorted(data["entries"])
    for text in texts[:: max(1, len(texts) // 40)]:  # ~40 keys spread over the file
        key = dict(parse_key_text(text))
        kwargs = _call(key)
        assert key_text(FLASH_ATTENTION.key(FLASH_ATTENTION.prepare(**kwargs))) == text
        expl = ex.explain(FLASH_ATTENTION, **kwargs)
        assert expl.selector == "pretuned", expl
        assert expl.entry["how"] == f"exact key in {path.parent.name}/flash_attention.json"
        assert expl.config.to_dict() == data["entries"][text]["config"]


FP8_FILES = sorted(ROOT.glob("*/flash_attention_fp8.json"))


def test_the_h200_fp8_file_holds_every_fp8_preset_key():
    """``kernelops tune flash_attention_fp8 --preset llm --export autotune_cache`` ran on the H200
    and every preset spec's key is in the file, each tuned there."""
    from kernelops.modules.flash_attention_fp8 import FLASH_ATTENTION_FP8
    from kernelops.tuning.presets import llm_fp8_preset
    from kernelops.tuning.runner import spec_key_text

    assert "NVIDIA_H200" in {p.parent.name for p in FP8_FILES}
    data = json.loads((ROOT / "NVIDIA_H200" / "flash_attention_fp8.json").read_text())
    _validate(data)
    assert data["metadata"]["device"] == "NVIDIA_H200" and data["metadata"]["capability"] == [9, 0]
    assert {spec_key_text(FLASH_ATTENTION_FP8, spec) for spec in llm_fp8_preset()} == set(data["entries"])
    assert all(e["source"] == "autotune" and e["ms"] > 0 and "derived_from" not in e for e in data["entries"].values())


@pytest.mark.parametrize("path", FP8_FILES, ids=lambda p: p.parent.name)
def test_a_fresh_executor_selects_the_shipped_fp8_entries(path, tmp_path, monkeypatch):
    from kernelops.modules.flash_attention_fp8 import FLASH_ATTENTION_FP8

    data = json.loads(path.read_text())
    ex = _fresh_machine_executor(path, tmp_path, monkeypatch)
    texts = sorted(data["entries"])
    for text in texts[:: max(1, len(texts) // 20)]:
        key = dict(parse_key_text(text))
        S, D, gqa = key["seq_q"], key["head_dim"], key["gqa"]
        q = torch.empty(1, S, 2 * gqa, D, dtype=torch.float8_e4m3fn, device="meta")
        kv = torch.empty(1, S, 2, D, dtype=torch.float8_e4m3fn, device="meta")
        window = None if key["window"] is None else int(key["window"].split(":")[0])
        kwargs = dict(query=q, key=kv, value=kv, causal=key["causal"], sliding_window=window)
        assert key_text(FLASH_ATTENTION_FP8.key(FLASH_ATTENTION_FP8.prepare(**kwargs))) == text
        expl = ex.explain(FLASH_ATTENTION_FP8, **kwargs)
        assert expl.selector == "pretuned", expl
        assert expl.entry["how"] == f"exact key in {path.parent.name}/flash_attention_fp8.json"
        assert expl.config.to_dict() == data["entries"][text]["config"]
