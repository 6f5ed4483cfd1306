"""Compile warm-up for ``kernelops tune``: every distinct kernel compiled once, in parallel.

On a GPU, compiling dominates tuning: each candidate is its own Triton compile (seconds for a
backward kernel), and the autotuner meets them one after the other. Before timing anything,
:func:`warm_compiles` runs each distinct (spec, phase, candidate) once in ``jobs`` spawned worker
processes, which fills Triton's on-disk cache; the main process then loads binaries instead of
compiling them.

Many specs share their compiles: a kernel depends on the op's key *without* its runtime fields
(``Tunable.runtime_key_fields``; for flash_attention: lengths, causal, window, GQA) plus the
candidate's params, refined by the op's ``compile_variant`` (the runtime fields that some kernels
take as constexprs). :func:`compile_groups` keeps the smallest spec of each such signature; its
candidates are spread over the workers (candidate ``i`` goes to shard ``i % shards``).

Workers call the op's bench functions directly: they never read or write the kernelops config
caches. A failure (an exception in a worker, or a worker process that dies) is reported, not
fatal: what was not compiled here compiles while the main process times it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import time
from typing import Callable

from kernelops.tuning.registry import get_tunable


def default_jobs() -> int:
    """``min(8, cpu count)``: compiles are CPU-bound (LLVM, ptxas)."""
    return min(8, os.cpu_count() or 1)


def compile_signature(tunable, op, spec) -> tuple:
    """The spec's compile signature (tensors on ``meta``): its key without the runtime fields, plus
    the op's ``compile_variant(inputs)`` where it has one (constexprs that runtime fields decide in
    some of its kernels, e.g. flash_attention's causal flag in the Gluon kernels)."""
    inputs = op.prepare(**spec.kwargs("meta"))
    signature = tuple((field, value) for field, value in op.key(inputs) if field not in tunable.runtime_key_fields)
    variant = getattr(op, "compile_variant", None)
    return signature if variant is None else signature + tuple(variant(inputs))


def _numel(spec) -> int:
    import torch

    return sum(v.numel() for v in spec.kwargs("meta").values() if isinstance(v, torch.Tensor))


def compile_groups(op_name: str, specs: list) -> list:
    """One spec per distinct compile signature (the one with the fewest tensor elements), in
    the order the signatures first appear."""
    tunable = get_tunable(op_name)
    op = tunable.op()
    order, smallest = [], {}
    for spec in specs:
        signature, size = compile_signature(tunable, op, spec), _numel(spec)
        if signature not in smallest:
            order.append(signature)
        if signature not in smallest or size < smallest[signature][0]:
            smallest[signature] = (size, spec)
    return [smallest[signature][1] for signature in order]


def candidate_work(op, inputs, device) -> list[tuple[str, object]]:
    """Every ``(phase, params)`` the autotuner may time for ``inputs`` (the heuristic's first)."""
    base = op.heuristic_config(inputs, device)
    work = []
    for phase in op.phases(inputs):
        for params in [op.params_of(base, phase)] + op.candidate_params(inputs, device, phase):
            if (phase, params) not in work:
                work.append((phase, params))
    return work


def compile_shard(op_name: str, spec, shard: int, shards: int) -> tuple[int, list[str]]:
    """Worker: run once each candidate ``i`` of ``spec`` with ``i % shards == shard``, which
    compiles it; ``(runs, errors)``. Runs on the current CUDA device (without one: the Triton
    interpreter on CPU, for tests)."""
    import torch

    from kernelops.ops.device import device_info
    from kernelops.tuning.runner import torch_device, tuning_platform

    op = get_tunable(op_name).op()
    device = device_info()
    inputs = op.prepare(**spec.kwargs(torch_device(device), tuning_platform(device)))
    base = op.heuristic_config(inputs, device)
    runs, errors = 0, []
    for i, (phase, params) in enumerate(candidate_work(op, inputs, device)):
        if i % shards != shard:
            continue
        try:
            op.bench_fn(inputs, op.with_params(base, phase, params), phase)()
            if device.is_cuda:
                torch.cuda.synchronize()
            runs += 1
        except Exception as exc:  # noqa: BLE001 - reported; the candidate fails again (with its reason) when timed
            errors.append(f"{spec.summary()} {phase} {params}: {type(exc).__name__}: {str(exc)[:160]}")
    return runs, errors


def _init_worker() -> None:
    os.environ["KERNELOPS_AUTOTUNE"] = "never"  # belt and braces: workers never tune or cache configs


@dataclasses.dataclass
class WarmReport:
    """What :func:`warm_compiles` did."""

    groups: int = 0
    runs: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


def warm_compiles(op_name: str, specs: list, jobs: int, *, on_done: Callable[[int, int], None] | None = None,
                  worker: Callable = compile_shard) -> WarmReport:
    """Compile every candidate of every compile group of ``specs`` in ``jobs`` processes.

    ``on_done(done, total)`` is called as shards finish. Never raises for a worker's failure.
    """
    start = time.perf_counter()
    groups = compile_groups(op_name, specs)
    report = WarmReport(groups=len(groups))
    items = [(op_name, spec, shard, jobs) for spec in groups for shard in range(jobs)]
    context = multiprocessing.get_context("spawn")
    try:
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker) as pool:
            futures = [pool.submit(worker, *item) for item in items]
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                try:
                    runs, errors = future.result()
                    report.runs += runs
                    report.errors += errors
                except Exception as exc:  # noqa: BLE001 - a crashed worker breaks the pool: report, go on
                    report.errors.append(f"compile worker failed: {type(exc).__name__}: {exc}")
                    if isinstance(exc, concurrent.futures.process.BrokenProcessPool):
                        break
                if on_done is not None:
                    on_done(done, len(items))
    except Exception as exc:  # noqa: BLE001 - e.g. processes cannot be started here
        report.errors.append(f"compile warm-up failed: {type(exc).__name__}: {exc}")
    report.seconds = time.perf_counter() - start
    return report
