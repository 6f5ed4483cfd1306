"""``kernelops cache list|show|clear|export|import`` and kernelops.tuning.cache_admin: listing with
status, export in the shipped format, validated all-or-nothing import (device and version rules),
confirmation for clear, exit codes."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import diskcache
import pytest
import torch

from kernelops.cli import main
from kernelops.kernels.flash_attention.reference import attention_materialized
from kernelops.modules.attention_args import UNBOUNDED
from kernelops.modules.flash_attention import FLASH_ATTENTION, FlashAttentionConfig
from kernelops.ops import ConfigCache, ConfigSelectorChain, Executor, FwdParams, PretunedStore
from kernelops.ops.cache import DiskKey, make_entry
from kernelops.ops.device import DeviceInfo, device_info, versions
from kernelops.ops.entries import MAX_ENTRIES, MAX_ENTRY_FIELDS, MAX_FILE_BYTES
from kernelops.ops.keys import key_text
from kernelops.tuning.cache_admin import (
    CacheFileError, cache_rows, config_summary, device_from_key, export_cache, import_cache_file, read_cache_file,
)
from kernelops.tuning.sinks import DiskCacheSink
from tests.conftest import HAS_CUDA

#: this machine's device (the current GPU, else the CPU): the device `kernelops cache import` checks against
DEVICE = device_info()
TORCH_DEVICE = "cuda" if DEVICE.is_cuda else "cpu"
#: a config unlike the heuristic's, so that a lookup answered by it is recognisable
TUNED_FWD = FwdParams(16, 16, 2, 1)
#: the backend of the other kind of device (a config the import and the executor refuse here)
OTHER_BACKEND = "cpu" if DEVICE.is_cuda else "gpu"


def _run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _qkv(seq: int, heads: int = 2, dim: int = 16):
    gen = torch.Generator().manual_seed(seq)
    return [torch.randn(1, seq, heads, dim, generator=gen).to(TORCH_DEVICE) for _ in range(3)]


def _inputs(seq: int):
    q, k, v = _qkv(seq)
    return FLASH_ATTENTION.prepare(query=q, key=k, value=v, causal=True)


def _tuned_config(inputs) -> FlashAttentionConfig:
    heuristic = FLASH_ATTENTION.heuristic_config(inputs, DEVICE)
    return FLASH_ATTENTION.with_params(heuristic, "fwd", TUNED_FWD)


def _populate(cache: ConfigCache, seqs=(40, 100)) -> dict[str, dict]:
    """Entries under the keys the selector chain reads on this machine (written as `kernelops tune` does)."""
    sink = DiskCacheSink(cache, FLASH_ATTENTION, DEVICE)
    written = {}
    for seq in seqs:
        inputs = _inputs(seq)
        entry = make_entry(_tuned_config(inputs), ms=0.25 * seq, heuristic_ms=0.3 * seq, candidates=4)
        sink.put(FLASH_ATTENTION.key(inputs), inputs, entry)
        written[key_text(FLASH_ATTENTION.key(inputs))] = entry
    return written


def _stale_key(seq: int) -> str:
    """The disk key of ``seq``'s call as an install with torch 1.0.0 would have written it."""
    parts = DiskKey.parse(_disk_key(seq))
    return DiskKey(parts.op, parts.key_text, parts.device, "1.0.0", parts.triton, parts.kernelops, parts.src).text


def _disk_key(seq: int) -> str:
    from kernelops.ops.autotune import AutotunePolicy
    from kernelops.ops.selectors import Context

    inputs = _inputs(seq)
    return Context(FLASH_ATTENTION, inputs, FLASH_ATTENTION.key(inputs), DEVICE, AutotunePolicy.AUTO).disk_key


@pytest.fixture
def user_cache(tmp_path, monkeypatch):
    """An empty user cache folder (KERNELOPS_CACHE_DIR) for the CLI."""
    folder = tmp_path / "user-cache"
    monkeypatch.setenv("KERNELOPS_CACHE_DIR", str(folder))
    return folder


def _exported_file(tmp_path) -> str:
    source = ConfigCache(tmp_path / "source")
    _populate(source)
    export_cache(source, tmp_path / "exported")
    return str(tmp_path / "exported" / DEVICE.name / "flash_attention.json")


# --- help and usage ---------------------------------------------------------------------------------
@pytest.mark.parametrize("verb, words", [
    ("list", ["--op", "--full-keys", "--cache-dir", "--json"]), ("show", ["KEY"]),
    ("clear", ["--yes", "--stale", "terminal"]),
    ("export", ["DIR", "shipped format"]), ("import", ["--any-device", "--accept-versions", "pickle"]),
])
def test_help_of_every_cache_subcommand_has_examples(capsys, verb, words):
    code, out, _ = _run(capsys, "cache", verb, "--help")
    assert code == 0
    assert "examples:" in out and f"kernelops cache {verb}" in out
    assert all(word in out for word in words), out


@pytest.mark.parametrize("argv, message", [
    (["cache"], "required"),
    (["cache", "bogus"], "invalid choice"),
    (["cache", "show"], "the following arguments are required: KEY"),
    (["cache", "import"], "the following arguments are required: FILE"),
])
def test_cache_usage_errors_exit_2(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2 and message in err, err


def test_exit_codes_in_a_subprocess(tmp_path):
    env = {**os.environ, "KERNELOPS_CACHE_DIR": str(tmp_path / "c")}
    ok = subprocess.run([sys.executable, "-m", "kernelops", "cache", "list"], env=env, capture_output=True, text=True)
    missing = subprocess.run([sys.executable, "-m", "kernelops", "cache", "show", "nope"], env=env,
                             capture_output=True, text=True)
    usage = subprocess.run([sys.executable, "-m", "kernelops", "cache", "list", "--no-such-flag"], env=env,
                           capture_output=True, text=True)
    assert (ok.returncode, missing.returncode, usage.returncode) == (0, 1, 2), (ok.stderr, missing.stderr, usage.stderr)
    assert "no entry with key 'nope'" in missing.stderr
    assert not (tmp_path / "c").exists()  # reading commands never create the cache folder


# --- list and show ------------------------------------------------------------------------------------
FOREIGN_KEY = "not|a|kernelops|key"


def _populate_for_listing(folder) -> tuple[dict[str, dict], str, dict]:
    """Two current entries (as _populate), a stale one (an older torch) and a key of another form:
    ``(current entries by key text, the stale disk key, its entry)``."""
    cache = ConfigCache(folder)
    written = _populate(cache)
    stale, old = _stale_key(40), make_entry(_tuned_config(_inputs(40)), ms=9.5, source="old-run")
    cache.put_disk(stale, old)
    cache.put_disk(FOREIGN_KEY, {"config": {}})
    return written, stale, old


def test_list_shows_each_entry_with_its_status(capsys, user_cache):
    written, stale, _ = _populate_for_listing(user_cache)
    code, out, err = _run(capsys, "cache", "list")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].split() == ["op", "key", "config", "ms", "source", "device", "status"]
    assert len(lines) == 1 + 4 and "4 entries" in err
    for text, entry in written.items():
        row = next(line for line in lines if text in line)
        assert row.startswith("flash_attention") and row.rstrip().endswith("current")
        assert f" {entry['ms']:.4g} " in row and " autotune " in row and f" {DEVICE.key} " in row
        assert "fwd q16,kv16,w2,s1" in row  # the tuned params, not the heuristic's
    stale_row = next(line for line in lines if "old-run" in line)
    assert "stale: torch 1.0.0 (now " in stale_row
    assert any(line.startswith("?") and "not a kernelops key" in line for line in lines)

    code, out, _ = _run(capsys, "cache", "list", "--op", "attention")
    assert code == 0 and out == ""
    code, out, _ = _run(capsys, "cache", "list", "--op", "flash_attention", "--full-keys")
    assert code == 0 and _disk_key(100) in out and stale in out and "not|a|kernelops" not in out


def test_list_json_matches_the_entries(capsys, user_cache):
    written, stale, old = _populate_for_listing(user_cache)
    code, out, err = _run(capsys, "cache", "list", "--json")
    assert code == 0 and "4 entries" in err
    listed = json.loads(out)  # stdout is the JSON alone
    assert listed["cache_dir"] == str(user_cache)
    entries = {e["key"]: e for e in listed["entries"]}
    assert len(listed["entries"]) == 4 and set(entries) == {_disk_key(40), _disk_key(100), stale, FOREIGN_KEY}
    here = {**versions(), "kernel_source_hash": FLASH_ATTENTION.source_hash()}
    for seq, (text, entry) in zip((40, 100), written.items()):
        e = entries[_disk_key(seq)]
        assert (e["op"], e["key_text"], e["device"], e["versions"]) == ("flash_attention", text, DEVICE.key, here)
        assert (e["status"], e["current"]) == ("current", True)
        assert e["config"] == entry["config"] and e["config_summary"].startswith("fwd q16,kv16,w2,s1")
        assert {name: e[name] for name in ("ms", "heuristic_ms", "source", "created")} == {
            name: entry[name] for name in ("ms", "heuristic_ms", "source", "created")}
        assert e["imported_from"] is None
    e = entries[stale]
    assert e["versions"]["torch"] == "1.0.0" and e["current"] is False and e["status"].startswith("stale: torch 1.0.0")
    assert (e["ms"], e["source"], e["created"]) == (9.5, "old-run", old["created"])
    e = entries[FOREIGN_KEY]
    assert (e["op"], e["key_text"], e["device"], e["versions"], e["status"], e["current"]) == (
        None, None, None, None, "not a kernelops key", False)

    code, out, _ = _run(capsys, "cache", "list", "--json", "--op", "flash_attention")
    assert code == 0 and {e["key"] for e in json.loads(out)["entries"]} == {_disk_key(40), _disk_key(100), stale}


def test_list_json_without_a_cache_is_empty(capsys, tmp_path):
    folder = tmp_path / "none"
    code, out, err = _run(capsys, "cache", "list", "--json", "--cache-dir", str(folder))
    assert code == 0 and json.loads(out) == {"cache_dir": str(folder), "entries": []} and "no cache there yet" in err
    assert not folder.exists()


def test_list_skips_pickled_rows_without_unpickling(capsys, user_cache, monkeypatch):
    _populate(ConfigCache(user_cache), seqs=(40,))
    with diskcache.Cache(str(user_cache)) as plain:  # diskcache's default Disk pickles this value
        plain["flash_attention|evil"] = {"config": {"x": 1}}

    def boom(*args, **kwargs):
        raise AssertionError("pickle was used to read a cache row")

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    with pytest.warns(RuntimeWarning, match="pickled"):
        code, out, _ = _run(capsys, "cache", "list")
    assert code == 0 and len(out.strip().splitlines()) == 2 and "evil" not in out


def test_show_prints_the_full_entry(capsys, user_cache):
    written = _populate(ConfigCache(user_cache))
    text = next(iter(written))
    for key in (text, f"flash_attention|{text}", DiskKey.parse(_disk_key(40)).text):
        code, out, _ = _run(capsys, "cache", "show", key)
        assert code == 0
        shown = json.loads(out)
        assert list(shown) == [_disk_key(40)]
        assert shown[_disk_key(40)] == written[text]
    code, out, err = _run(capsys, "cache", "show", text.replace("seq_q=64", "seq_q=8192"))
    assert code == 1 and out == "" and "no entry with key" in err and "kernelops cache list" in err


def test_config_summary():
    config = FlashAttentionConfig(FwdParams(128, 64, 8, 3), platform="triton").to_dict()
    assert config_summary(config) == "fwd q128,kv64,w8,s3; platform=triton"
    assert config_summary({}) == "-"


# --- export ---------------------------------------------------------------------------------------------
def test_export_writes_shipped_files_the_pretuned_store_serves(capsys, user_cache, tmp_path):
    cache = ConfigCache(user_cache)
    written = _populate(cache)
    cache.put_disk(_stale_key(40), make_entry({"fwd_params": None}, source="old"))
    root = tmp_path / "ship"
    code, out, err = _run(capsys, "cache", "export", str(root))
    assert code == 0
    path = root / DEVICE.name / "flash_attention.json"
    assert f"wrote 2 entries to {path}" in out and "skipped 1 entries" in err and "stale: torch 1.0.0" in err
    data = json.loads(path.read_text())
    assert data["entries"] == written
    meta = data["metadata"]
    assert meta["device"] == DEVICE.name
    assert meta["capability"] == (None if DEVICE.capability is None else list(DEVICE.capability))
    assert {k: meta[k] for k in ("torch", "triton", "kernelops")} == versions()
    assert meta["kernel_source_hash"] == FLASH_ATTENTION.source_hash()
    store = PretunedStore(root)
    for seq in (40, 100):
        inputs = _inputs(seq)
        entry, how = store.lookup("flash_attention", FLASH_ATTENTION.key(inputs), FLASH_ATTENTION.bucketed_fields, DEVICE)
        assert entry == written[key_text(FLASH_ATTENTION.key(inputs))] and how.startswith("exact key")


def test_export_groups_by_device_and_merges(tmp_path):
    cache = ConfigCache(tmp_path / "c")
    _populate(cache, seqs=(40,))
    gpu_key = DiskKey.parse(_disk_key(100))
    gpu_key = DiskKey(gpu_key.op, gpu_key.key_text, "FAKE_GPU:sm90", gpu_key.torch, gpu_key.triton, gpu_key.kernelops,
                      gpu_key.src)
    cache.put_disk(gpu_key.text, make_entry(_tuned_config(_inputs(100)), ms=1.0))
    root = tmp_path / "ship"
    report = export_cache(cache, root)
    assert report.exported == 2 and not report.skipped
    gpu = json.loads((root / "FAKE_GPU" / "flash_attention.json").read_text())
    assert gpu["metadata"]["capability"] == [9, 0] and list(gpu["entries"]) == [gpu_key.key_text]
    # a second export merges into the files already there
    _populate(cache, seqs=(200,))
    export_cache(cache, root, op="flash_attention")
    assert len(json.loads((root / DEVICE.name / "flash_attention.json").read_text())["entries"]) == 2
    assert device_from_key("NVIDIA_H100_80GB_HBM3:sm90") == DeviceInfo("cuda", 0, "NVIDIA_H100_80GB_HBM3", (9, 0), 0, 0)
    assert device_from_key("B200:sm100").capability == (10, 0) and device_from_key("cpu").capability is None


def test_export_with_nothing_to_write_fails(capsys, user_cache, tmp_path):
    code, _, err = _run(capsys, "cache", "export", str(tmp_path / "x"))
    assert code == 1 and "no cache at" in err
    ConfigCache(user_cache).put_disk(_stale_key(40), make_entry({}, source="old"))
    code, _, err = _run(capsys, "cache", "export", str(tmp_path / "x"))
    assert code == 1 and "no current entries" in err and not (tmp_path / "x").exists()


# --- import ---------------------------------------------------------------------------------------------
def test_import_round_trip_serves_the_executor(capsys, user_cache, tmp_path):
    """Export from one cache, import into another: a fresh executor on that cache answers from
    'disk' with the tuned config, and the call it runs with it is correct (Triton interpreter or GPU)."""
    path = _exported_file(tmp_path)
    code, out, err = _run(capsys, "cache", "import", path)
    assert code == 0 and f"imported 2 flash_attention entries for {DEVICE.key} into {user_cache}" in out, err
    rows = cache_rows(ConfigCache(user_cache))
    assert len(rows) == 2 and all(r.current and r.entry["imported_from"] == path for r in rows)

    executor = Executor(ConfigSelectorChain(cache=ConfigCache(user_cache), pretuned=PretunedStore(tmp_path / "none"),
                                            policy="never"))
    q, k, v = _qkv(40)
    how = executor.explain(FLASH_ATTENTION, query=q, key=k, value=v, causal=True)
    assert how.selector == "disk" and how.config.fwd_params == TUNED_FWD
    # the Triton kernels (the interpreter on a CPU) run with the imported config's tiles
    out = executor(FLASH_ATTENTION, query=q, key=k, value=v, causal=True, platform="triton")
    ref, _ = attention_materialized(q.double(), k.double(), v.double(), softmax_scale=16 ** -0.5,
                                    win_left=UNBOUNDED, win_right=0, softcap=None)
    assert (out.double() - ref).abs().max().item() < (1e-4 if HAS_CUDA else 1e-5)
    # importing again overwrites the same keys (no duplicates)
    assert _run(capsys, "cache", "import", path)[0] == 0 and ConfigCache(user_cache).disk_count() == 2


def _rewrite(path: str, change) -> str:
    data = json.loads(open(path).read())
    change(data)
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def _first_entry(data) -> dict:
    return next(iter(data["entries"].values()))


_BAD_JSON = {
    "pickle": lambda p: open(p, "wb").write(pickle.dumps({"metadata": {}, "entries": {}})),
    "pickle protocol 0": lambda p: open(p, "wb").write(pickle.dumps({"a": 1}, protocol=0)),
    "binary garbage": lambda p: open(p, "wb").write(bytes(range(256)) * 4),
    "truncated": lambda p: _truncate(p),
    "NaN": lambda p: _replace_text(p, '"ms": 10.0', '"ms": NaN'),
    "duplicate name": lambda p: _replace_text(p, '"entries": {', '"entries": {}, "entries": {'),
    "a list": lambda p: open(p, "w").write("[1, 2, 3]"),
    "empty file": lambda p: open(p, "w").write(""),
}


def _truncate(path: str) -> None:
    text = open(path).read()
    open(path, "w").write(text[: len(text) // 2])


def _replace_text(path: str, old: str, new: str) -> None:
    text = json.dumps(json.load(open(path)))
    assert old in text, (old, text[:300])
    open(path, "w").write(text.replace(old, new, 1))


_BAD_CONTENT = {
    "unknown config field": (lambda d: _first_entry(d)["config"]["fwd_params"].update(tile_m=64), "unknown field"),
    "config not a dict": (lambda d: _first_entry(d).update(config=[1, 2]), "with a 'config' object"),
    "invalid param value": (lambda d: _first_entry(d)["config"]["fwd_params"].update(num_warps=0), "num_warps"),
    "bad runner_up": (lambda d: _first_entry(d).update(runner_up={"fwd_params": {"x": 1}}), "runner_up"),
    "missing field": (lambda d: _first_entry(d).pop("versions"), "lacks field(s) ['versions']"),
    "negative ms": (lambda d: _first_entry(d).update(ms=-1.0), "field 'ms' must be number or null"),
    "string ms": (lambda d: _first_entry(d).update(ms="fast"), "field 'ms'"),
    "bool candidates": (lambda d: _first_entry(d).update(candidates=True), "field 'candidates' must be an int"),
    "nested extra field": (lambda d: _first_entry(d).update(code={"exec": "x"}), "field 'code'"),
    "bad key text": (lambda d: d["entries"].update({"no equals sign": _first_entry(d)}), "malformed key text"),
    "non-canonical key": (lambda d: d["entries"].update({"a=01": _first_entry(d)}), "canonical"),
    "no entries": (lambda d: d.update(entries={}), "has no entries"),
    "metadata missing": (lambda d: d.pop("metadata"), "missing top-level key"),
    "capability text": (lambda d: d["metadata"].update(capability="sm90"), "capability"),
    "device path": (lambda d: d["metadata"].update(device="../etc"), "not a device name"),
    "device with a bar": (lambda d: d["metadata"].update(device="cpu|x"), "not a device name"),
    "torch version missing": (lambda d: d["metadata"].pop("torch"), "metadata.torch"),
    "source hash not text": (lambda d: d["metadata"].update(kernel_source_hash=7), "kernel_source_hash"),
    # strings of any length, too many fields or entries
    "huge extra field": (lambda d: _first_entry(d).update(notes="x" * (4 << 20)), "MAX_TEXT_CHARS"),
    "huge source": (lambda d: _first_entry(d).update(source="x" * (4 << 20)), "field 'source' is 4194304 characters"),
    "huge key text": (lambda d: d["entries"].update({"k=" + "x" * (4 << 20): _first_entry(d)}), "MAX_KEY_CHARS"),
    "huge version string": (lambda d: _first_entry(d)["versions"].update(torch="x" * 2000), "versions['torch']"),
    "huge metadata field": (lambda d: d["metadata"].update(notes="x" * 2000), "MAX_TEXT_CHARS"),
    "long field name": (lambda d: _first_entry(d).update({"x" * 100: 1}), "MAX_NAME_CHARS"),
    "many fields": (lambda d: _first_entry(d).update({f"f{i}": i for i in range(40)}), "MAX_ENTRY_FIELDS"),
    # exactly the limit in the file: the stored row would have one more (imported_from) and be refused on read
    "fields at the limit": (lambda d: _first_entry(d).update(
        {f"f{i}": i for i in range(MAX_ENTRY_FIELDS - len(_first_entry(d)))}), "MAX_ENTRY_FIELDS"),
    "too many entries": (lambda d: d["entries"].update({f"n={i}": _first_entry(d) for i in range(MAX_ENTRIES)}),
                         "MAX_ENTRIES"),
    "huge candidates": (lambda d: _first_entry(d).update(candidates=10 ** 12), "field 'candidates'"),
    # well typed but absurd configs, and tiles the executor refuses
    "block size 2^30": (lambda d: _first_entry(d)["config"]["fwd_params"].update(q_blocksize=1 << 30),
                        "MAX_BLOCKSIZE"),
    "10^9 stages": (lambda d: _first_entry(d)["config"]["bwd_params"].update(num_stages=10 ** 9), "MAX_NUM_STAGES"),
    "64 warps": (lambda d: _first_entry(d)["config"]["fwd_params"].update(num_warps=64), "MAX_NUM_WARPS"),
    "tile below 16": (lambda d: _first_entry(d)["config"]["decode_params"].update(kv_blocksize=8), "at least 16"),
    "absurd runner_up": (lambda d: _first_entry(d).update(runner_up={"fwd_params": {
        "q_blocksize": 64, "kv_blocksize": 64, "num_warps": 4, "num_stages": 10 ** 9}}),
        "runner_up.fwd_params.num_stages"),
    "unknown platform": (lambda d: _first_entry(d)["config"].update(platform="cuda"), "platform"),
    "backend of another device": (lambda d: _first_entry(d)["config"].update(backend=OTHER_BACKEND),
                                  f"backend={OTHER_BACKEND!r}"),
}


@pytest.mark.parametrize("name", list(_BAD_JSON) + list(_BAD_CONTENT))
def test_import_refuses_bad_files_whole(capsys, user_cache, tmp_path, monkeypatch, name):
    path = _exported_file(tmp_path)
    if name in _BAD_JSON:
        _BAD_JSON[name](path)
        message = {"pickle": "looks like a Python pickle", "pickle protocol 0": "pickle",
                   "binary garbage": "not UTF-8", "a list": "top level must be an object"}.get(name, "not valid JSON")
    else:
        change, message = _BAD_CONTENT[name]
        _rewrite(path, change)
    cache = ConfigCache(user_cache)
    _populate(cache, seqs=(300,))
    before = dict(cache.disk_items())
    cache.close()
    files = _folder_bytes(user_cache)

    def boom(*args, **kwargs):
        raise AssertionError("a cache file was unpickled")

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    code, out, err = _run(capsys, "cache", "import", path)
    assert code == 1 and out == ""
    assert message in err, err[:2000]
    assert len(err) < 2000  # the refused values are not echoed whole
    assert _folder_bytes(user_cache) == files  # the cache folder is byte for byte as it was
    assert dict(ConfigCache(user_cache).disk_items()) == before  # nothing partially written


def _folder_bytes(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_import_refuses_a_file_over_the_size_limit(capsys, user_cache, tmp_path):
    path = _exported_file(tmp_path)
    text = open(path).read()
    open(path, "w").write(text[:-2] + " " * MAX_FILE_BYTES + text[-2:])  # valid JSON, padded
    code, out, err = _run(capsys, "cache", "import", path)
    assert code == 1 and "MAX_FILE_BYTES" in err and not user_cache.exists()


def test_a_16_mib_field_does_not_grow_the_cache(capsys, user_cache, tmp_path):
    """A file just under the size limit whose one extra field is 15 MiB: refused, cache unchanged."""
    path = _rewrite(_exported_file(tmp_path), lambda d: _first_entry(d).update(extra="x" * (15 << 20)))
    cache = ConfigCache(user_cache)
    _populate(cache, seqs=(300,))
    size = cache.disk_size_bytes()
    cache.close()
    code, _, err = _run(capsys, "cache", "import", path)
    assert code == 1 and "field 'extra' is 15728640 characters long, more than MAX_TEXT_CHARS" in err
    assert ConfigCache(user_cache).disk_size_bytes() == size < 1 << 20


@pytest.mark.parametrize("name", ["huge source", "block size 2^30", "10^9 stages", "tile below 16", "64 warps",
                                  "unknown platform", "backend of another device", "many fields"])
def test_import_and_the_executor_refuse_alike(capsys, user_cache, tmp_path, name):
    """One validation: an entry import refuses is one the executor skips when it finds it on
    disk (written there by another tool), with the same reason."""
    change, message = _BAD_CONTENT[name]
    path = _rewrite(_exported_file(tmp_path), change)
    code, _, err = _run(capsys, "cache", "import", path)
    assert code == 1 and message in err
    text, entry = next(iter(json.loads(open(path).read())["entries"].items()))
    seq = {key_text(FLASH_ATTENTION.key(_inputs(n))): n for n in (40, 100)}[text]
    cache = ConfigCache(user_cache)
    cache.put_disk(_disk_key(seq), entry)
    executor = Executor(ConfigSelectorChain(cache=cache, pretuned=PretunedStore(tmp_path / "none"), policy="never"))
    q, k, v = _qkv(seq)
    with pytest.warns(RuntimeWarning, match="it is skipped"):
        how = executor.explain(FLASH_ATTENTION, query=q, key=k, value=v, causal=True)
    reason = dict(how.declined)["disk"]
    assert how.selector == "heuristic" and message in reason
    prefix = "disk entry is unusable (entry"
    assert reason.startswith(prefix) and reason.endswith(")")
    assert f"entry {text!r}{reason[len(prefix):-1]}" in err  # the same words, naming the key


def test_import_takes_a_partial_config_the_executor_completes(capsys, user_cache, tmp_path):
    """Fields left null (or out) are filled from the heuristic when the entry is used, on disk as for cfg=."""
    path = _rewrite(_exported_file(tmp_path), lambda d: [e["config"].pop("bwd_params") for e in d["entries"].values()])
    code, out, _ = _run(capsys, "cache", "import", path)
    assert code == 0 and "imported 2" in out
    executor = Executor(ConfigSelectorChain(cache=ConfigCache(user_cache), pretuned=PretunedStore(tmp_path / "none"),
                                            policy="never"))
    q, k, v = _qkv(40)
    how = executor.explain(FLASH_ATTENTION, query=q, key=k, value=v, causal=True)
    heuristic = FLASH_ATTENTION.heuristic_config(_inputs(40), DEVICE)
    assert how.selector == "disk" and how.config.fwd_params == TUNED_FWD
    assert how.config.bwd_params == heuristic.bwd_params


def test_import_names_the_op_from_the_file_or_the_option(capsys, user_cache, tmp_path):
    path = _exported_file(tmp_path)
    renamed = tmp_path / "tuned.json"
    renamed.write_text(open(path).read())
    code, _, err = _run(capsys, "cache", "import", str(renamed))
    assert code == 1 and "unknown op 'tuned'" in err and "--op" in err
    code, out, _ = _run(capsys, "cache", "import", str(renamed), "--op", "flash_attention")
    assert code == 0 and "imported 2" in out
    code, _, err = _run(capsys, "cache", "import", str(tmp_path / "missing.json"))
    assert code == 1 and "cannot read" in err
    code, _, err = _run(capsys, "cache", "import", str(tmp_path))
    assert code == 1 and "not a regular file" in err


def test_import_device_rule(capsys, user_cache, tmp_path):
    path = _rewrite(_exported_file(tmp_path), lambda d: d["metadata"].update(device="FAKE_GPU", capability=[9, 0]))
    code, _, err = _run(capsys, "cache", "import", path)
    assert code == 1 and f"tuned on FAKE_GPU:sm90, but this machine is {DEVICE.key}" in err and "--any-device" in err
    assert not (user_cache / "cache.db").exists() or ConfigCache(user_cache).disk_count() == 0
    code, out, err = _run(capsys, "cache", "import", path, "--any-device")
    assert code == 0 and "for FAKE_GPU:sm90" in out and "will not use them" in err
    rows = cache_rows(ConfigCache(user_cache))
    assert {r.parts.device for r in rows} == {"FAKE_GPU:sm90"} and all(r.current for r in rows)
    # the executor on this machine does not find them: they are another device's
    executor = Executor(ConfigSelectorChain(cache=ConfigCache(user_cache), pretuned=PretunedStore(tmp_path / "none"),
                                            policy="never"))
    q, k, v = _qkv(40)
    assert executor.explain(FLASH_ATTENTION, query=q, key=k, value=v, causal=True).selector == "heuristic"


def test_import_version_rule(capsys, user_cache, tmp_path):
    path = _rewrite(_exported_file(tmp_path), lambda d: d["metadata"].update(torch="1.0.0"))
    code, _, err = _run(capsys, "cache", "import", path)
    assert code == 1 and f"torch 1.0.0 (this install: {torch.__version__})" in err and "--accept-versions" in err
    code, out, err = _run(capsys, "cache", "import", path, "--accept-versions")
    assert code == 0 and "accepted version differences" in err
    rows = cache_rows(ConfigCache(user_cache))
    assert len(rows) == 2 and all(r.current for r in rows)  # stored under this install's versions
    assert all(r.entry["versions"] == versions() for r in rows)  # each entry keeps its own record

    hashed = _rewrite(_exported_file(tmp_path / "b"), lambda d: d["metadata"].update(kernel_source_hash="0" * 16))
    code, _, err = _run(capsys, "cache", "import", hashed, "--cache-dir", str(tmp_path / "other"))
    assert code == 1 and f"kernel sources {'0' * 16}" in err
    unhashed = _rewrite(_exported_file(tmp_path / "c"), lambda d: d["metadata"].pop("kernel_source_hash"))
    code, _, err = _run(capsys, "cache", "import", unhashed, "--cache-dir", str(tmp_path / "other"))
    assert code == 0 and "records no kernel_source_hash" in err


def test_read_cache_file_accepts_a_shipped_file():
    from kernelops.ops.pretuned import default_pretuned_root

    files = sorted(default_pretuned_root().glob("*/flash_attention.json"))
    if not files:
        pytest.skip("no shipped files in this checkout")
    for path in files:
        parsed = read_cache_file(path)
        assert parsed.op == "flash_attention" and parsed.device_key == f"{path.parent.name}:sm90"
        assert len(parsed.entries) == len(json.loads(path.read_text())["entries"])


def test_import_refuses_when_the_disk_is_unusable(tmp_path):
    path = _exported_file(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.warns(RuntimeWarning, match="unusable"), pytest.raises(CacheFileError, match="nothing was imported"):
        import_cache_file(ConfigCache(tmp_path / "file" / "cache"), path)


# --- clear ------------------------------------------------------------------------------------------------
def test_clear_reports_an_unusable_cache(capsys, user_cache):
    user_cache.mkdir()
    (user_cache / "cache.db").write_bytes(os.urandom(4096))
    with pytest.warns(RuntimeWarning):
        code, out, err = _run(capsys, "cache", "clear", "--yes")
    assert code == 1 and "unusable" in err and "nothing to delete" not in out


def test_clear_needs_confirmation_off_a_terminal(capsys, user_cache, monkeypatch):
    _populate(ConfigCache(user_cache))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False, raising=False)
    code, _, err = _run(capsys, "cache", "clear")
    assert code == 1 and "pass --yes" in err and ConfigCache(user_cache).disk_count() == 2
    code, out, _ = _run(capsys, "cache", "clear", "--yes")
    assert code == 0 and "deleted 2 entries" in out and ConfigCache(user_cache).disk_count() == 0


@pytest.mark.parametrize("answer, left", [("y", 0), ("n", 2), ("", 2)])
def test_clear_asks_on_a_terminal(capsys, user_cache, monkeypatch, answer, left):
    _populate(ConfigCache(user_cache))

    class Tty:
        def isatty(self):
            return True

        def readline(self):
            return answer + "\n"

    monkeypatch.setattr(sys, "stdin", Tty())
    monkeypatch.setattr("builtins.input", lambda prompt: answer)
    code, _, _ = _run(capsys, "cache", "clear")
    assert code == (0 if left == 0 else 1) and ConfigCache(user_cache).disk_count() == left


def test_clear_by_op_and_staleness(capsys, user_cache):
    cache = ConfigCache(user_cache)
    _populate(cache)
    cache.put_disk(_stale_key(40), make_entry({}, source="old"))
    cache.put_disk("attention|x=1|device=cpu|torch=1|triton=2|kernelops=3|src=h", make_entry({}, source="other-op"))
    code, out, _ = _run(capsys, "cache", "clear", "--stale", "--yes")
    assert code == 0 and "deleted 2 entries" in out
    assert {r.key for r in cache_rows(ConfigCache(user_cache))} == {_disk_key(40), _disk_key(100)}
    cache.put_disk("attention|x=1|device=cpu|torch=1|triton=2|kernelops=3|src=h", make_entry({}, source="other-op"))
    code, out, _ = _run(capsys, "cache", "clear", "--op", "flash_attention", "--yes")
    assert code == 0 and "deleted 2 entries" in out
    assert [r.op for r in cache_rows(ConfigCache(user_cache))] == ["attention"]
    code, out, _ = _run(capsys, "cache", "clear", "--op", "flash_attention", "--yes")
    assert code == 0 and "nothing to delete" in out


def test_clear_without_a_cache_creates_nothing(capsys, user_cache):
    code, out, _ = _run(capsys, "cache", "clear", "--yes")
    assert code == 0 and "no cache at" in out and not user_cache.exists()


def test_entries_survive_a_json_round_trip_of_the_file(tmp_path):
    """What import stores equals what export read from the source cache (plus imported_from)."""
    source = ConfigCache(tmp_path / "source")
    written = _populate(source)
    export_cache(source, tmp_path / "ship")
    target = ConfigCache(tmp_path / "target")
    report = import_cache_file(target, tmp_path / "ship" / DEVICE.name / "flash_attention.json")
    assert report.stored == 2 and report.device_key == DEVICE.key and report.notes == []
    got = {row.parts.key_text: {k: v for k, v in row.entry.items() if k != "imported_from"}
           for row in cache_rows(target)}
    assert got == written
