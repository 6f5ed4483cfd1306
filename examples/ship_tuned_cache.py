"""Shipping tuned configs to another machine: export a disk cache in the shipped format, import it
into a fresh cache, and see the executor there answer from it.

On the GPU you tune on, the same steps are commands::

    kernelops tune flash_attention --shapes B=2,S=4k,Hq=32,Hkv=8,D=128,dtype=bf16,causal=1
    kernelops cache export tuned/          # tuned/<DEVICE>/flash_attention.json
    # copy the file; on the other machine (same GPU model, same torch/triton/kernelops):
    kernelops cache import tuned/<DEVICE>/flash_attention.json
    # or commit it as autotune_cache/<DEVICE>/flash_attention.json to ship it with the package

This script plays both machines in temporary folders (the user's cache is never touched). To run
in seconds anywhere, "machine A" stores a chosen config as `kernelops tune` would store a timed
winner; on a CPU the calls run the torch platform, where the selector chain answers all the same.

    python examples/ship_tuned_cache.py
"""

import json
import pathlib
import tempfile

import torch

import kernelops
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops import ConfigCache, ConfigSelectorChain, Executor, FwdParams, PretunedStore, device_info
from kernelops.ops.cache import make_entry
from kernelops.tuning.cache_admin import CacheFileError, cache_rows, export_cache, import_cache_file
from kernelops.tuning.sinks import DiskCacheSink


def private_executor(cache: ConfigCache, empty: pathlib.Path) -> Executor:
    """An executor on ``cache`` only: no shipped files, no autotuning."""
    return Executor(ConfigSelectorChain(cache=cache, pretuned=PretunedStore(empty), policy="never"))


def main() -> dict:
    """Prints each step; returns the counts ``exported`` and ``imported``, the selector that answered
    each call on machine B before and after the import (``before``, ``after``), whether those
    answers were the tuned configs (``tuned_configs``) and whether the tampered file was refused."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    calls = []
    for seq in (128, 512):  # two keys: lengths are bucketed into the key
        q = torch.randn(1, seq, 8, 64, device=device, dtype=dtype)  # [B, S, Hq, D]
        kv = torch.randn(1, seq, 2, 64, device=device, dtype=dtype)  # [B, S, Hkv, D]
        calls.append(dict(query=q, key=kv, value=kv.clone(), causal=True))

    with tempfile.TemporaryDirectory(prefix="kernelops-ship-") as tmp:
        tmp = pathlib.Path(tmp)
        print(f"kernelops {kernelops.__version__}: shipping tuned configs on {device_info(device).key}")

        # machine A: its cache holds tuned entries under the keys the executor reads
        cache_a = ConfigCache(tmp / "machine-a")
        sink = DiskCacheSink(cache_a, FLASH_ATTENTION, device_info(device))
        tuned = {}
        for i, call in enumerate(calls):
            inputs = FLASH_ATTENTION.prepare(**call)
            heuristic = FLASH_ATTENTION.heuristic_config(inputs, device_info(device))
            config = FLASH_ATTENTION.with_params(heuristic, "fwd", FwdParams(64, 32 << i, 4, 2))
            sink.put(FLASH_ATTENTION.key(inputs), inputs, make_entry(config, candidates=1, source="example"))
            tuned[FLASH_ATTENTION.key(inputs)] = config
        print(f"machine A: {len(cache_rows(cache_a))} entries in {cache_a.directory}")

        # export: tuned/<DEVICE>/flash_attention.json, plain JSON in the shipped format
        report = export_cache(cache_a, tmp / "tuned")
        (path, count), = report.files.items()
        metadata = json.loads(path.read_text())["metadata"]
        print(f"exported {count} entries to {path.relative_to(tmp)}; metadata: {metadata}")

        # machine B: a fresh cache; before the import its executor falls back to the heuristic
        cache_b = ConfigCache(tmp / "machine-b")
        executor_b = private_executor(cache_b, tmp / "no-shipped-files")
        before = [executor_b.explain(FLASH_ATTENTION, **call).selector for call in calls]
        print(f"machine B before the import: '{before[0]}'")
        imported = import_cache_file(cache_b, path)
        print(f"machine B imported {imported.stored} entries for {imported.device_key}")
        for note in imported.notes:
            print(f"  note: {note}")

        # a new process on machine B (here: a new executor on the same folder) answers from the disk cache
        executor_b = private_executor(ConfigCache(cache_b.directory), tmp / "no-shipped-files")
        after, tuned_configs = [], []
        for call in calls:
            how = executor_b.explain(FLASH_ATTENTION, **call)
            expected = tuned[how.key]
            print(f"  S={call['query'].shape[1]}: '{how.selector}' -> fwd {how.config.fwd_params}")
            assert how.selector == "disk" and how.config == expected, how
            after.append(how.selector)
            tuned_configs.append(how.config == expected)
            out = executor_b(FLASH_ATTENTION, **call)
            assert out.shape == call["query"].shape and torch.isfinite(out).all()

        # a tampered file is refused whole, nothing is written
        bad = tmp / "tampered" / "flash_attention.json"
        bad.parent.mkdir()
        data = json.loads(path.read_text())
        next(iter(data["entries"].values()))["config"]["fwd_params"]["tile_m"] = 256
        bad.write_text(json.dumps(data))
        machine_c = ConfigCache(tmp / "machine-c")
        try:
            import_cache_file(machine_c, bad)
        except CacheFileError as exc:
            print(f"a tampered file is refused, nothing written: ...{str(exc)[-140:]}")
        else:
            raise AssertionError("the tampered file was imported")
        refused = not cache_rows(machine_c)
        machine_c.close()
    return {"exported": count, "imported": imported.stored, "before": before, "after": after,
            "tuned_configs": tuned_configs, "tampered_refused": refused}


if __name__ == "__main__":
    main()
