"""Tests for kernelops.ops.pretuned: shipped files, lookup order and the file writer."""

from __future__ import annotations

import json
import pathlib
import warnings

import pytest

import kernelops
from kernelops.ops import pretuned
from kernelops.ops.device import DeviceInfo
from kernelops.ops.entries import MAX_ENTRIES, MAX_KEY_CHARS, MAX_TEXT_CHARS
from kernelops.ops.keys import key_text
from kernelops.ops.pretuned import PretunedStore, default_pretuned_root, write_pretuned_file

H100 = DeviceInfo("cuda", 0, "NVIDIA_H100_80GB_HBM3", (9, 0), 227 * 1024, 132)
H200 = DeviceInfo("cuda", 0, "NVIDIA_H200", (9, 0), 227 * 1024, 132)
A100 = DeviceInfo("cuda", 0, "NVIDIA_A100-SXM4-80GB", (8, 0), 163 * 1024, 108)
CPU = DeviceInfo("cpu", 0, "cpu", None, 227 * 1024, 1)

OP = "flash_attention"
BUCKETED = ("seq_q", "seq_k")


def _key(seq_q=1024, seq_k=1024, dtype="float16", causal=True):
    return (("dtype", dtype), ("causal", causal), ("seq_q", seq_q), ("seq_k", seq_k))


def _entry(tag, **extra):
    return {"config": {"tag": tag, **extra}, "ms": 1.0, "source": "autotune"}


def _entries(*pairs):
    return {key_text(k): e for k, e in pairs}


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "autotune_cache"
    h100 = _entries((_key(1024, 1024), _entry("h100-1k")), (_key(4096, 4096), _entry("h100-4k")))
    write_pretuned_file(r, OP, h100, H100)
    write_pretuned_file(r, OP, _entries((_key(1024, 1024, causal=False), _entry("h200-noncausal"))), H200)
    write_pretuned_file(r, OP, _entries((_key(1024, 1024, dtype="bfloat16"), _entry("a100-bf16"))), A100)
    return r


def _lookup(root, key, device, op=OP):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # well-formed files: no warning at all
        return PretunedStore(root).lookup(op, key, BUCKETED, device)


# --- lookup -------------------------------------------------------------------------------------
def test_exact_hit(root):
    entry, how = _lookup(root, _key(4096, 4096), H100)
    assert entry["config"]["tag"] == "h100-4k"
    assert how == f"exact key in NVIDIA_H100_80GB_HBM3/{OP}.json"


def test_nearest_bucket(root):
    entry, how = _lookup(root, _key(2048, 1024), H100)
    assert entry["config"]["tag"] == "h100-1k"  # distance 1 (to 1k x 1k) beats 3 (to 4k x 4k)
    assert how.startswith("nearest bucket (distance 1.0)") and "NVIDIA_H100_80GB_HBM3" in how
    entry, _ = _lookup(root, _key(16384, 8192), H100)
    assert entry["config"]["tag"] == "h100-4k"


def test_nearest_bucket_tie_is_deterministic(tmp_path):
    # (2048, 2048) is at distance 2 from both entries; the smaller key text wins.
    a, b = _key(1024, 4096), _key(4096, 1024)
    write_pretuned_file(tmp_path, OP, _entries((a, _entry("a")), (b, _entry("b"))), H100)
    expected = "a" if key_text(a) < key_text(b) else "b"
    for _ in range(3):
        entry, how = PretunedStore(tmp_path).lookup(OP, _key(2048, 2048), BUCKETED, H100)
        assert entry["config"]["tag"] == expected and "distance 2.0" in how


def test_same_capability_fallback(root):
    # Nothing for non-causal on H100: the H200 file (same sm90) has it; the A100 one is ignored.
    entry, how = _lookup(root, _key(1024, 1024, causal=False), H100)
    assert entry["config"]["tag"] == "h200-noncausal"
    assert how == f"same capability sm90: exact key in NVIDIA_H200/{OP}.json"
    entry, how = _lookup(root, _key(512, 1024, causal=False), H100)
    assert entry["config"]["tag"] == "h200-noncausal"
    assert how.startswith("same capability sm90: nearest bucket (distance 1.0)")


def test_own_device_wins_over_same_capability(root):
    entry, how = _lookup(root, _key(1024, 1024), H200)  # H200 file has no causal entry...
    assert entry["config"]["tag"] == "h100-1k" and how.startswith("same capability sm90")
    write_pretuned_file(root, OP, _entries((_key(2048, 2048), _entry("h200-2k"))), H200)
    entry, how = _lookup(root, _key(1024, 1024), H200)  # ...its own nearest bucket beats H100's exact
    assert entry["config"]["tag"] == "h200-2k" and how.startswith("nearest bucket")


def test_unknown_device_with_known_capability(root):
    new = DeviceInfo("cuda", 0, "NVIDIA_GH200_480GB", (9, 0), 227 * 1024, 132)
    entry, how = _lookup(root, _key(1024, 1024), new)
    assert entry["config"]["tag"] == "h100-1k"
    assert "same capability sm90" in how and "NVIDIA_H100_80GB_HBM3" in how


def test_no_match_reasons(root):
    entry, how = _lookup(root, _key(1024, 1024, dtype="float32"), H100)
    assert entry is None
    assert "NVIDIA_H100_80GB_HBM3" in how and "sm90" in how

    entry, how = _lookup(root, _key(), DeviceInfo("cuda", 0, "NVIDIA_B200", (10, 0), 227 * 1024, 148))
    assert entry is None
    assert "no usable NVIDIA_B200" in how and "sm100" in how

    entry, how = _lookup(root, _key(), H100, op="rms_norm")
    assert entry is None and "rms_norm.json" in how


def test_cpu_only_uses_its_own_folder(root, tmp_path):
    entry, how = _lookup(root, _key(), CPU)
    assert entry is None and "cpu" in how
    write_pretuned_file(root, OP, _entries((_key(), _entry("cpu"))), CPU)
    entry, how = _lookup(root, _key(), CPU)
    assert entry["config"]["tag"] == "cpu" and how == f"exact key in cpu/{OP}.json"


def test_missing_root(tmp_path):
    entry, how = PretunedStore(tmp_path / "nope").lookup(OP, _key(), BUCKETED, H100)
    assert entry is None and "no usable" in how


def test_lookup_returns_copies(root):
    store = PretunedStore(root)
    entry, _ = store.lookup(OP, _key(), BUCKETED, H100)
    entry["config"]["tag"] = "mutated"
    again, _ = store.lookup(OP, _key(), BUCKETED, H100)
    assert again["config"]["tag"] == "h100-1k"


def test_files_are_loaded_once(root, monkeypatch):
    import kernelops.ops.pretuned as pretuned

    calls = []
    real = pretuned._read_file
    monkeypatch.setattr(pretuned, "_read_file", lambda *a: calls.append(a) or real(*a))
    store = PretunedStore(root)
    for _ in range(3):
        store.lookup(OP, _key(1024, 1024, causal=False), BUCKETED, H100)
    assert len(calls) == 3  # H100, then each other device folder's file, each read once
    store.reload()
    store.lookup(OP, _key(), BUCKETED, H100)  # exact hit in the H100 file: only it is read again
    assert len(calls) == 4


# --- malformed files ----------------------------------------------------------------------------
def _good_document():
    return {
        "metadata": {
            "device": "X", "capability": [9, 0], "kernelops": "0", "torch": "0", "triton": "0", "created": "now",
        },
        "entries": {key_text(_key()): _entry("bad-file")},
    }


def _break(kind):
    doc = _good_document()
    if kind == "bad-json":
        return "{not json"
    if kind == "not-an-object":
        return "[1, 2, 3]"
    if kind == "missing-entries":
        del doc["entries"]
    elif kind == "missing-metadata-field":
        del doc["metadata"]["torch"]
    elif kind == "capability-type":
        doc["metadata"]["capability"] = "sm90"
    elif kind == "entries-type":
        doc["entries"] = [1]
    elif kind == "entry-without-config":
        doc["entries"] = {key_text(_key()): {"ms": 1.0}}
    elif kind == "bad-key-text":
        doc["entries"] = {"no-equals-sign": _entry("x")}
    elif kind == "non-canonical-key-text":
        doc["entries"] = {"seq_q=01024": _entry("x")}
    elif kind == "long-key-text":
        doc["entries"] = {"k=" + "x" * MAX_KEY_CHARS: _entry("x")}
    elif kind == "too-many-entries":
        doc["entries"] = {f"n={i}": _entry("x") for i in range(MAX_ENTRIES + 1)}
    elif kind == "long-metadata-text":
        doc["metadata"]["notes"] = "x" * (MAX_TEXT_CHARS + 1)
    return json.dumps(doc)


@pytest.mark.parametrize(
    "kind",
    [
        "bad-json", "not-an-object", "missing-entries", "missing-metadata-field", "capability-type",
        "entries-type", "entry-without-config", "bad-key-text", "non-canonical-key-text", "long-key-text",
        "too-many-entries", "long-metadata-text", "too-large",
    ],
)
def test_malformed_file_is_skipped_with_one_warning(root, kind, monkeypatch):
    bad = root / "NVIDIA_H100_80GB_HBM3" / f"{OP}.json"
    if kind == "too-large":  # a well-formed file over the size limit (lowered here to keep the test small)
        monkeypatch.setattr(pretuned, "MAX_FILE_BYTES", bad.stat().st_size - 1)
    else:
        bad.write_text(_break(kind))
    store = PretunedStore(root)
    with pytest.warns(RuntimeWarning, match="malformed pretuned file") as record:
        entry, how = store.lookup(OP, _key(), BUCKETED, H100)
        store.lookup(OP, _key(), BUCKETED, H100)
    assert len([w for w in record if issubclass(w.category, RuntimeWarning)]) == 1
    assert str(bad) in str(record[0].message)
    # the bad H100 file is skipped; the H200 (same capability) file still answers
    assert entry is None or entry["config"]["tag"] != "bad-file"
    entry, how = store.lookup(OP, _key(1024, 1024, causal=False), BUCKETED, H100)
    assert entry["config"]["tag"] == "h200-noncausal"


def test_malformed_peer_file_is_skipped(root):
    (root / "NVIDIA_H200" / f"{OP}.json").write_bytes(b"\xff\xfe garbage")
    with pytest.warns(RuntimeWarning, match="NVIDIA_H200"):
        entry, how = PretunedStore(root).lookup(OP, _key(1024, 1024, causal=False), BUCKETED, H100)
    assert entry is None and "sm90" in how


def test_capability_comes_from_metadata(root):
    # A folder named like an sm90 device but whose metadata says sm80 is not a same-capability peer.
    path = root / "NVIDIA_H200" / f"{OP}.json"
    data = json.loads(path.read_text())
    data["metadata"]["capability"] = [8, 0]
    path.write_text(json.dumps(data))
    entry, how = _lookup(root, _key(1024, 1024, causal=False), H100)
    assert entry is None


# --- writing ------------------------------------------------------------------------------------
def test_write_round_trip_and_format(tmp_path):
    entries = _entries((_key(), _entry("one")))
    path = write_pretuned_file(tmp_path, OP, entries, H100)
    assert path == tmp_path / "NVIDIA_H100_80GB_HBM3" / f"{OP}.json"
    text = path.read_text()
    data = json.loads(text)
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"
    meta = data["metadata"]
    assert meta["device"] == "NVIDIA_H100_80GB_HBM3" and meta["capability"] == [9, 0]
    assert {"kernelops", "torch", "triton", "created"} <= set(meta)
    assert meta["kernelops"] == kernelops.__version__
    assert data["entries"] == entries
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    assert path.stat().st_mode & 0o644 == 0o644
    entry, how = PretunedStore(tmp_path).lookup(OP, _key(), BUCKETED, H100)
    assert entry == entries[key_text(_key())] and how.startswith("exact key")


def test_write_merges(tmp_path):
    write_pretuned_file(tmp_path, OP, _entries((_key(1024), _entry("old-1k")), (_key(2048), _entry("old-2k"))), H100)
    new = _entries((_key(2048), _entry("new-2k")), (_key(4096), _entry("new-4k")))
    path = write_pretuned_file(tmp_path, OP, new, H100)
    entries = json.loads(path.read_text())["entries"]
    assert {k: v["config"]["tag"] for k, v in entries.items()} == {
        key_text(_key(1024)): "old-1k",
        key_text(_key(2048)): "new-2k",
        key_text(_key(4096)): "new-4k",
    }


def test_write_replaces_malformed_file(tmp_path):
    path = tmp_path / "NVIDIA_H100_80GB_HBM3" / f"{OP}.json"
    path.parent.mkdir(parents=True)
    path.write_text("{broken")
    with pytest.warns(RuntimeWarning, match="malformed"):
        write_pretuned_file(tmp_path, OP, _entries((_key(), _entry("fresh"))), H100)
    assert list(json.loads(path.read_text())["entries"]) == [key_text(_key())]


def test_write_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError):
        write_pretuned_file(tmp_path, "../escape", {}, H100)
    with pytest.raises(ValueError):
        write_pretuned_file(tmp_path, OP, {key_text(_key()): {"ms": 1.0}}, H100)  # no config
    with pytest.raises(TypeError):
        write_pretuned_file(tmp_path, OP, {key_text(_key()): {"config": {"x": object()}}}, H100)
    assert not (tmp_path / "NVIDIA_H100_80GB_HBM3" / f"{OP}.json").exists()


def test_cpu_file_has_null_capability(tmp_path):
    path = write_pretuned_file(tmp_path, OP, {}, CPU)
    assert json.loads(path.read_text())["metadata"]["capability"] is None


# --- root -----------------------------------------------------------------------------------------
def test_default_root_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELOPS_PRETUNED_DIR", str(tmp_path))
    assert default_pretuned_root() == tmp_path
    assert PretunedStore().root == tmp_path


def test_default_root_without_env(monkeypatch):
    monkeypatch.delenv("KERNELOPS_PRETUNED_DIR", raising=False)
    package = pathlib.Path(kernelops.__file__).parent
    expected = package / "autotune_cache"
    if not expected.is_dir():
        expected = package.parent / "autotune_cache"
    assert default_pretuned_root() == expected
