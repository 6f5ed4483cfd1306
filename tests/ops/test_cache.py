"""Tests for kernelops.ops.cache: JSON-only disk rows, degradation to memory, several processes."""

from __future__ import annotations

import contextlib
import datetime
import json
import multiprocessing
import os
import pathlib
import pickle
import sqlite3
import subprocess
import sys
import threading
import warnings

import diskcache
import platformdirs
import pytest

import kernelops.ops.cache as cache_module
from kernelops.ops.cache import ConfigCache, JsonDisk, PickledRowError, default_cache_dir, make_entry

ENTRY = {"config": {"q_blocksize": 128, "num_warps": 8}, "ms": 0.41, "source": "autotune"}


# --- helpers ------------------------------------------------------------------------------------
def _write_marker(path: str) -> None:
    """What a malicious pickle would run on load: leaves a visible trace."""
    pathlib.Path(path).write_text("pwned")


class _Evil:
    """Unpickling this object calls ``_write_marker(path)``."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (_write_marker, (self.path,))


@contextlib.contextmanager
def _runtime_warnings():
    """Record every RuntimeWarning (no de-duplication by the warnings registry)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got: list[warnings.WarningMessage] = []
        yield got
    got.extend(w for w in caught if issubclass(w.category, RuntimeWarning))


@pytest.fixture
def no_unpickling(monkeypatch):
    """Fail loudly if anything calls pickle.load/loads during the test."""

    def boom(*args, **kwargs):
        raise AssertionError("pickle was used to read a cache row")

    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)


def _put_many(directory: str, tag: str, count: int, barrier) -> None:
    """Process body for the multi-process test: write ``count`` distinct keys."""
    cache = ConfigCache(directory, timeout=30.0)
    barrier.wait(timeout=60)
    for i in range(count):
        cache.put(f"{tag}-{i}", {"config": {"i": i, "tag": tag}, "ms": float(i)})
    if not cache.disk_available:
        raise SystemExit(3)


# --- basics -------------------------------------------------------------------------------------
def test_default_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELOPS_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    assert ConfigCache().directory == tmp_path / "mine"


def test_default_cache_dir_platform(monkeypatch):
    monkeypatch.delenv("KERNELOPS_CACHE_DIR", raising=False)
    assert default_cache_dir() == pathlib.Path(platformdirs.user_cache_dir("kernelops"))


def test_make_entry_shape():
    entry = make_entry(
        {"num_warps": 4}, ms=0.5, heuristic_ms=0.7, runner_up={"num_warps": 8}, runner_up_ms=0.6, candidates=3
    )
    assert set(entry) == {
        "config", "ms", "heuristic_ms", "runner_up", "runner_up_ms", "candidates", "source", "created", "versions",
    }
    assert entry["config"] == {"num_warps": 4} and entry["runner_up"] == {"num_warps": 8}
    assert (entry["ms"], entry["heuristic_ms"], entry["runner_up_ms"], entry["candidates"]) == (0.5, 0.7, 0.6, 3)
    assert entry["source"] == "autotune"
    assert datetime.datetime.fromisoformat(entry["created"]).utcoffset() == datetime.timedelta(0)
    assert set(entry["versions"]) == {"kernelops", "torch", "triton"}
    bare = make_entry({})
    assert bare["ms"] is None and bare["runner_up"] is None and bare["candidates"] == 0


def test_round_trip_across_instances(tmp_path):
    first = ConfigCache(tmp_path)
    first.put("k1", ENTRY)
    assert first.get("k1") == ENTRY
    second = ConfigCache(tmp_path)
    assert second.get_memory("k1") is None
    assert second.get_disk("k1") == ENTRY
    assert second.get("k1") == ENTRY
    assert second.get_memory("k1") == ENTRY  # the disk hit was copied into memory
    assert second.get("missing") is None
    assert second.disk_available


def test_memory_and_disk_are_separate(tmp_path):
    cache = ConfigCache(tmp_path)
    cache.put_memory("mem", ENTRY)
    cache.put_disk("disk", ENTRY)
    assert cache.get_disk("mem") is None
    assert cache.get_memory("disk") is None
    assert ConfigCache(tmp_path).get("disk") == ENTRY


def test_disk_false_stays_in_memory(tmp_path):
    cache = ConfigCache(tmp_path / "never", disk=False)
    cache.put("k", ENTRY)
    assert cache.get("k") == ENTRY
    assert cache.get_disk("k") is None and cache.disk_items() == [] and cache.disk_size_bytes() == 0
    assert not cache.disk_available
    assert not (tmp_path / "never").exists()


def test_delete_clear_items_size(tmp_path):
    cache = ConfigCache(tmp_path)
    for i in range(3):
        cache.put(f"k{i}", {"config": {"i": i}})
    assert [k for k, _ in cache.disk_items()] == ["k0", "k1", "k2"]
    assert cache.disk_size_bytes() > 0
    cache.delete("k1")
    cache.delete("never-there")
    assert cache.get("k1") is None
    assert [k for k, _ in ConfigCache(tmp_path).disk_items()] == ["k0", "k2"]
    cache.clear(memory=False)
    assert cache.get_memory("k0") is not None and cache.get_disk("k0") is None
    cache.put_disk("k5", ENTRY)
    cache.clear(disk=False)
    assert cache.get_memory("k0") is None and cache.get_disk("k5") == ENTRY
    cache.clear()
    assert cache.disk_items() == [] and cache.get("k5") is None


def test_large_entry_round_trip(tmp_path):
    """Values above diskcache's inline limit go to a text file; still JSON, still read back."""
    big = {"config": {"blob": "x" * 100_000}}
    ConfigCache(tmp_path).put("big", big)
    assert ConfigCache(tmp_path).get("big") == big


def test_entries_are_stored_as_sorted_json(tmp_path):
    ConfigCache(tmp_path).put("k", {"b": 1, "a": [1, 2]})
    with diskcache.Cache(str(tmp_path), disk=JsonDisk) as raw:
        assert raw.get("k") == '{"a": [1, 2], "b": 1}'


def test_put_rejects_non_json(tmp_path):
    cache = ConfigCache(tmp_path)
    with pytest.raises(TypeError):
        cache.put("k", ["not", "a", "dict"])
    with pytest.raises(TypeError):
        cache.put("k", {"config": object()})
    assert cache.get("k") is None


def test_rows_that_are_not_json_objects_are_absent(tmp_path):
    with diskcache.Cache(str(tmp_path)) as plain:
        plain["bad-json"] = "{not json"
        plain["a-list"] = "[1, 2]"
        plain["an-int"] = 7
        plain["bytes"] = b"{}"
    cache = ConfigCache(tmp_path)
    with _runtime_warnings() as got:
        for key in ("bad-json", "a-list", "an-int", "bytes"):
            assert cache.get(key) is None
        assert cache.disk_items() == []
    assert got == [] and cache.disk_available


def test_threads_share_one_lazy_open(tmp_path):
    cache = ConfigCache(tmp_path)
    threads = [
        threading.Thread(target=lambda t=t: [cache.put(f"t{t}-{i}", {"config": {}}) for i in range(20)])
        for t in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ConfigCache(tmp_path).disk_items()) == 80 and cache.disk_available


# --- JsonDisk: no pickle, ever ------------------------------------------------------------------
def test_json_disk_refuses_non_text(tmp_path):
    disk = JsonDisk(str(tmp_path))
    with pytest.raises(TypeError):
        disk.store({"a": 1}, False)
    with pytest.raises(TypeError):
        disk.store(b"bytes", False)
    with pytest.raises(TypeError):
        disk.put(("tuple", "key"))
    with pytest.raises(PickledRowError):
        disk.get(b"\x80\x04N.", False)
    with pytest.raises(PickledRowError):
        disk.fetch(diskcache.core.MODE_PICKLE, None, b"\x80\x04N.", False)
    assert issubclass(PickledRowError, ValueError)


def test_pickled_value_is_refused(tmp_path, no_unpickling):
    marker = tmp_path / "marker"
    folder = tmp_path / "cache"
    with diskcache.Cache(str(folder)) as plain:  # default Disk: pickles the object
        plain["k"] = _Evil(str(marker))
        plain["big"] = [_Evil(str(marker)), "y" * 100_000]  # pickled into a separate file
        plain["fine"] = '{"config": {}}'
    cache = ConfigCache(folder)
    with _runtime_warnings() as got:
        assert cache.get("k") is None
        assert cache.get_disk("big") is None
        assert cache.get("k") is None
        items = cache.disk_items()
    assert not marker.exists()
    assert items == [("fine", {"config": {}})]
    assert len(got) == 1 and "pickled" in str(got[0].message) and str(folder) in str(got[0].message)
    assert cache.disk_available  # a refused row is not a broken cache
    cache.put("k", ENTRY)  # overwriting the refused row is fine
    assert ConfigCache(folder).get("k") == ENTRY
    assert not marker.exists()


def test_pickled_key_is_refused(tmp_path, no_unpickling):
    marker = tmp_path / "marker"
    folder = tmp_path / "cache"
    with diskcache.Cache(str(folder)) as plain:
        plain[_Evil(str(marker))] = '{"config": {}}'  # default Disk pickles the key
        plain["fine"] = '{"config": {"ok": 1}}'
    cache = ConfigCache(folder)
    with _runtime_warnings() as got:
        items = cache.disk_items()
        assert cache.disk_items() == items
    assert items == [("fine", {"config": {"ok": 1}})]
    assert not marker.exists()
    assert len(got) == 1 and "pickled" in str(got[0].message)
    with diskcache.Cache(str(folder), disk=JsonDisk) as json_only, pytest.raises(PickledRowError):
        list(json_only.iterkeys())
    assert not marker.exists()


# --- degradation --------------------------------------------------------------------------------
def _assert_degraded(cache: ConfigCache, got: list) -> None:
    assert not cache.disk_available
    assert len(got) == 1, [str(w.message) for w in got]
    assert str(cache.directory) in str(got[0].message)
    assert got[0].filename == __file__  # the warning points at the caller, not at cache.py


def test_corrupt_database(tmp_path):
    (tmp_path / "cache.db").write_bytes(os.urandom(4096))
    cache = ConfigCache(tmp_path)
    with _runtime_warnings() as got:
        assert cache.get("k") is None
        cache.put("k", ENTRY)
        assert cache.get("k") == ENTRY
        cache.put_disk("j", ENTRY)
        assert cache.get_disk("j") is None
        cache.delete("j")
        cache.clear()
        assert cache.disk_items() == [] and cache.disk_size_bytes() == 0
    _assert_degraded(cache, got)
    assert "DatabaseError" in str(got[0].message)


def _is_writable(folder: pathlib.Path) -> bool:
    probe = folder / "probe"
    try:
        probe.write_text("x")
    except OSError:
        return False
    probe.unlink()
    return True


#: how to run the read-only folder tests where neither way below works (in their skip reasons)
HOW_TO_RUN_READ_ONLY = ("run the tests as a user other than root (chmod 555 then makes a folder read-only), or as "
                        "root with CAP_LINUX_IMMUTABLE on a file system with immutable attributes (chattr +i), or "
                        "where `unshare --mount` may bind-mount a folder read-only (CAP_SYS_ADMIN, or unprivileged "
                        "user namespaces: `unshare --map-root-user --mount true` succeeds)")


def _chattr(flag: str, folder: pathlib.Path) -> bool:
    try:
        return subprocess.run(["chattr", flag, str(folder)], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@contextlib.contextmanager
def _read_only(folder: pathlib.Path):
    """Make ``folder`` read-only for this process: ``chmod 555`` (enough unless the process is
    root, which may write anyway), else, as root, the immutable attribute (``chattr +i``). Yields
    the way that worked, or None (the folder is left as it was)."""
    folder.chmod(0o555)
    try:
        if not _is_writable(folder):
            yield "chmod 555"
            return
        immutable = _chattr("+i", folder)
        try:
            if immutable and not _is_writable(folder):
                yield "chattr +i"
                return
        finally:
            if immutable:
                _chattr("-i", folder)
        yield None
    finally:
        folder.chmod(0o755)


def test_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    with _read_only(folder) as how:
        if how is None:
            pytest.skip(f"cannot make a folder read-only for this process: {HOW_TO_RUN_READ_ONLY} "
                        "(test_read_only_bind_mount covers the same case through a mount namespace)")
        cache = ConfigCache(folder)
        with _runtime_warnings() as got:
            cache.put("k", ENTRY)
            assert cache.get("k") == ENTRY
            assert cache.get_disk("k") is None
        _assert_degraded(cache, got)


#: what the child of test_read_only_bind_mount runs, on a folder bind-mounted read-only
_READ_ONLY_CHILD = """
import importlib.util, json, sys, warnings
# kernelops/ops/cache.py alone (it needs neither torch nor the package): the child starts quickly
spec = importlib.util.spec_from_file_location("kernelops_cache_under_test", sys.argv[3])
module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
entry = json.loads(sys.argv[2])
cache = module.ConfigCache(sys.argv[1])
with warnings.catch_warnings(record=True) as got:
    warnings.simplefilter("always")
    cache.put("k", entry)
    memory, disk = cache.get("k"), cache.get_disk("k")
print(json.dumps({"available": cache.disk_available, "memory": memory, "disk": disk, "file": __file__,
                  "warnings": [[w.category.__name__, str(w.message), w.filename] for w in got]}))
"""


def _in_read_only_mount(folder: pathlib.Path, script: pathlib.Path, *args: str):
    """Run ``python script folder *args`` in a private mount namespace where ``folder`` is
    bind-mounted read-only (for root as for anyone): the namespace, and the mount, end with the
    child. None when ``unshare`` is missing or not permitted here."""
    mount = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" && shift && exec "$@"'
    command = ["sh", "-c", mount, "sh", str(folder), sys.executable, str(script), str(folder), *args]
    for unshare in (["unshare", "--mount", "--propagation", "private"],
                    ["unshare", "--map-root-user", "--mount", "--propagation", "private"]):
        try:
            done = subprocess.run(unshare + command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode == 0:
            return done
    return None


def test_read_only_bind_mount(tmp_path):
    """The read-only folder case through a read-only bind mount in a mount namespace of a child
    process, which works as root too (root can write a chmod 555 folder)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    script = tmp_path / "child.py"
    script.write_text(_READ_ONLY_CHILD)
    done = _in_read_only_mount(folder, script, json.dumps(ENTRY), cache_module.__file__)
    if done is None:
        pytest.skip(f"cannot bind-mount a folder read-only in a mount namespace here: {HOW_TO_RUN_READ_ONLY}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["available"] is False and got["memory"] == ENTRY and got["disk"] is None
    assert len(got["warnings"]) == 1, got["warnings"]
    category, message, filename = got["warnings"][0]
    assert category == "RuntimeWarning" and str(folder) in message and "in-memory cache only" in message
    assert filename == got["file"]  # the warning points at the caller, not at cache.py
    assert _is_writable(folder) and list(folder.iterdir()) == []  # the mount ended with the child


def test_folder_that_cannot_be_created(tmp_path):
    """A cache dir below a regular file cannot be created (works even as root)."""
    (tmp_path / "file").write_text("x")
    cache = ConfigCache(tmp_path / "file" / "cache")
    with _runtime_warnings() as got:
        cache.put("k", ENTRY)
        assert cache.get("k") == ENTRY
    _assert_degraded(cache, got)


@contextlib.contextmanager
def _locked(db: pathlib.Path):
    """Hold an exclusive transaction on ``db`` from another connection."""
    con = sqlite3.connect(str(db), isolation_level=None)
    try:
        con.execute("BEGIN EXCLUSIVE")
        yield
    finally:
        con.execute("ROLLBACK")
        con.close()


def _connect_timeouts(monkeypatch) -> list:
    """Record the busy timeout of every sqlite connection opened from now on (the cache's own and
    diskcache's): a locked database makes a connection wait that long, then fail."""
    seen, connect = [], sqlite3.connect

    def spy(*args, **kwargs):
        seen.append(kwargs.get("timeout", 5.0))  # 5.0: sqlite3's default
        return connect(*args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", spy)
    return seen


@pytest.mark.parametrize("existing", [True, False], ids=["existing-db", "fresh-db"])
def test_locked_database_at_open(tmp_path, existing, monkeypatch):
    if existing:
        ConfigCache(tmp_path).put("old", ENTRY)
    cache = ConfigCache(tmp_path, timeout=0.2)
    with _locked(tmp_path / "cache.db"), _runtime_warnings() as got:
        timeouts = _connect_timeouts(monkeypatch)
        cache.put("k", ENTRY)
        assert cache.get("k") == ENTRY
        assert cache.get("old") is None
    _assert_degraded(cache, got)
    assert timeouts and set(timeouts) == {0.2}  # it waits its own timeout, never sqlite's default
    assert ConfigCache(tmp_path).get_disk("k") is None  # nothing half-written


def test_locked_database_while_in_use(tmp_path):
    cache = ConfigCache(tmp_path, timeout=0.2)
    cache.put("before", ENTRY)
    with _locked(tmp_path / "cache.db"), _runtime_warnings() as got:
        cache.put("during", ENTRY)
        cache.put("again", ENTRY)
    _assert_degraded(cache, got)
    assert "locked" in str(got[0].message) and "0.2 s" in str(got[0].message)  # after its own timeout
    assert cache.get("during") == ENTRY  # still served from memory
    assert ConfigCache(tmp_path).get("before") == ENTRY  # the folder itself is fine


# --- several processes --------------------------------------------------------------------------
def test_two_processes_lose_no_entries(tmp_path):
    ConfigCache(tmp_path).put("seed", ENTRY)  # create the database before the race
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    count = 200
    procs = [ctx.Process(target=_put_many, args=(str(tmp_path), tag, count, barrier)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    reader = ConfigCache(tmp_path)
    keys = {k for k, _ in reader.disk_items()}
    expected = {f"{tag}-{i}" for tag in ("a", "b") for i in range(count)} | {"seed"}
    assert keys == expected
    assert reader.get("b-199") == {"config": {"i": 199, "tag": "b"}, "ms": 199.0}


# --- disk keys and the bulk methods (kernelops cache) -------------------------------------------
def test_disk_key_parses_and_rebuilds_the_selector_chain_keys():
    import torch

    from kernelops.ops.autotune import AutotunePolicy
    from kernelops.ops.cache import DiskKey
    from kernelops.ops.device import versions
    from kernelops.ops.keys import key_text
    from kernelops.ops.selectors import Context
    from tests.ops.toy_op import CPU, FAKE_CUDA, ToyOp

    op = ToyOp()
    inputs = op.prepare(x=torch.randn(37), alpha=0.5)
    for device in (CPU, FAKE_CUDA):
        ctx = Context(op, inputs, op.key(inputs), device, AutotunePolicy.AUTO)
        parts = DiskKey.parse(ctx.disk_key)
        assert parts is not None
        assert parts.text == ctx.disk_key and parts.memory_key == ctx.memory_key
        assert (parts.op, parts.key_text, parts.device, parts.src) == (
            op.name, key_text(op.key(inputs)), device.key, op.source_hash())
        assert parts.versions == versions()


@pytest.mark.parametrize("text", [
    "plain", "", "op|k=1|device=cpu|torch=1|triton=2|kernelops=3",  # no src
    "op|k=1|torch=1|device=cpu|triton=2|kernelops=3|src=h",  # tail out of order
    "op|device=cpu|torch=1|triton=2|kernelops=3|src=h",  # no key text
    "|k=1|device=cpu|torch=1|triton=2|kernelops=3|src=h",  # no op
    "a=b|k=1|device=cpu|torch=1|triton=2|kernelops=3|src=h",  # op text is a key field
])
def test_disk_key_refuses_other_forms(text):
    from kernelops.ops.cache import DiskKey

    assert DiskKey.parse(text) is None


def test_disk_key_keeps_a_multi_field_key_text():
    from kernelops.ops.cache import DiskKey

    key = DiskKey("op", "a=1|b=x|c=None", "NVIDIA_H100_80GB_HBM3:sm90", "2.5.0+cu124", "3.1.0", "0.1.0", "0123abcd")
    assert DiskKey.parse(key.text) == key
    assert key.text == ("op|a=1|b=x|c=None|device=NVIDIA_H100_80GB_HBM3:sm90|torch=2.5.0+cu124|triton=3.1.0"
                        "|kernelops=0.1.0|src=0123abcd")


def test_put_disk_many_and_delete_many(tmp_path):
    cache = ConfigCache(tmp_path)
    entries = {f"k{i}": {"config": {"i": i}, "ms": i / 3} for i in range(5)}
    assert cache.put_disk_many(entries)
    reader = ConfigCache(tmp_path)
    assert dict(reader.disk_items()) == entries and reader.disk_count() == 5
    assert cache.get_memory("k0") is None  # disk only
    cache.put_memory("k1", entries["k1"])
    assert cache.delete_many(["k1", "k3", "never-there"]) == 2
    assert cache.get_memory("k1") is None
    assert sorted(k for k, _ in ConfigCache(tmp_path).disk_items()) == ["k0", "k2", "k4"]
    assert cache.delete_many([]) == 0 and cache.disk_count() == 3
    with diskcache.Cache(str(tmp_path), disk=JsonDisk) as raw:  # stored as JSON text, not pickled
        assert raw.get("k2") == '{"config": {"i": 2}, "ms": 0.6666666666666666}'


def test_put_disk_many_writes_nothing_when_an_entry_is_bad(tmp_path):
    cache = ConfigCache(tmp_path)
    cache.put_disk("old", ENTRY)
    with pytest.raises(TypeError):
        cache.put_disk_many({"a": ENTRY, "b": {"config": object()}, "c": ENTRY})
    with pytest.raises(TypeError):
        cache.put_disk_many({"a": ENTRY, ("tuple",): ENTRY})
    assert [k for k, _ in ConfigCache(tmp_path).disk_items()] == ["old"]


def test_put_disk_many_is_one_transaction(tmp_path, monkeypatch):
    """A failure after some rows were set rolls every row of the call back (and degrades)."""
    cache = ConfigCache(tmp_path)
    cache.put_disk("old", ENTRY)
    store = cache._open()  # noqa: SLF001 - inject a failure into the open diskcache store
    real_set, calls = store.set, []

    def failing_set(key, value, *args, **kwargs):
        calls.append(key)
        if len(calls) == 3:
            raise sqlite3.OperationalError("disk I/O error (injected)")
        return real_set(key, value, *args, **kwargs)

    monkeypatch.setattr(store, "set", failing_set)
    with _runtime_warnings() as got:
        assert cache.put_disk_many({f"n{i}": ENTRY for i in range(5)}) is False
    assert calls == ["n0", "n1", "n2"]
    _assert_degraded(cache, got)
    assert [k for k, _ in ConfigCache(tmp_path).disk_items()] == ["old"]


def test_bulk_methods_without_a_disk(tmp_path):
    cache = ConfigCache(tmp_path / "never", disk=False)
    assert cache.put_disk_many({"a": ENTRY}) is False
    cache.put_memory("a", ENTRY)
    assert cache.delete_many(["a"]) == 0 and cache.get_memory("a") is None
    assert cache.disk_count() == 0 and not (tmp_path / "never").exists()


def test_disk_count_includes_refused_pickled_rows(tmp_path, no_unpickling):
    folder = tmp_path / "cache"
    with diskcache.Cache(str(folder)) as plain:
        plain[("pickled", "key")] = '{"config": {}}'
        plain["fine"] = '{"config": {}}'
    cache = ConfigCache(folder)
    with _runtime_warnings():
        assert cache.disk_count() == 2 and [k for k, _ in cache.disk_items()] == ["fine"]
        assert cache.delete_many(["fine"]) == 1
        assert cache.disk_count() == 1
