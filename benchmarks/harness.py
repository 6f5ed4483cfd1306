"""The shared machinery of the benchmark suite: every ``benchmarks/<op>.py`` uses only this.

What it gives a benchmark:

- **Timing.** :func:`bench` is ``triton.testing.do_bench``'s median after one untimed call (which
  absorbs compilation and tuning); :func:`bench_graph` times the call captured in a CUDA graph
  (``do_bench_cudagraph``), for decode-sized calls whose eager time is the host's;
  :func:`host_us` is the time to *issue* one call while a spin kernel holds the GPU, and
  :func:`wall_us` the wall-clock time per call of a loop.
- **Work counted.** :func:`attention_flops` (``4*B*H*Sq*Sk*D``, half when causal, x3.5 for
  forward+backward), :func:`visible_pairs` / :func:`pairs_flops` for masked attention (useful work
  only), :func:`nbytes` for memory-bound ops; :func:`tflops` and :func:`tbps` turn them into rates.
- **Ratios against peers from the same run**: :func:`compare` pairs rows that differ only in
  ``impl`` and were measured in one run (``row["run"]``), and gives ``peer_ms / ours_ms``.
- **The device's measured ceilings** (:func:`ceilings`): a bf16 matmul's TFLOP/s and a
  device-to-device copy's TB/s, measured once per process.
- **Metadata** (:func:`metadata`): device, capability, torch, Triton, CUDA, kernelops, commit, date.
- **Results** (:class:`Results`): ``benchmarks/results/<DEVICE>/<op>.json``, rewritten after every
  row, merged with the file already there (a row is replaced only when this run measures it again),
  and :func:`plot` (matplotlib optional).
- **Recording**: :func:`timed` (a forward, or a forward and backward with a fixed gradient) and
  :class:`Recorder` (one timed row, its rate, an error kept as the row's ``error``, printed).
- **Attention inputs and peers** shared by the attention ops: :func:`sdpa` (a torch SDPA backend),
  :func:`flex` (compiled FlexAttention with a block mask), :func:`bhsd`, :func:`random_documents`
  and :func:`offsets` for packed sequences.

A row is a flat dict. Its identity (what a later run replaces) is every field that is not a
measurement: measurements are the names in :data:`MEASURED` and names ending in one of
:data:`MEASURED_SUFFIXES`, so a new benchmark names its figures ``ms``, ``tflops``, ``tbps``,
``*_us``, ``*_s`` ... and its shape fields anything else.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Sequence

ROOT = pathlib.Path(__file__).resolve().parent
RESULTS = ROOT / "results"

#: row fields that hold measurements (never part of a row's identity)
MEASURED = frozenset({"ms", "tflops", "tbps", "error", "run", "note", "source", "kernels"})
#: so do fields with these endings (``host_us``, ``first_fwd_s``, ``rel_err`` ...)
MEASURED_SUFFIXES = ("_ms", "_us", "_s", "_tflops", "_tbps", "_err")

#: forward+backward counts 3.5 forwards (the backward's 2.5: five matrix products against two)
MODE_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}

NO_CUDA_EXIT = 2


# --- environment ------------------------------------------------------------------------------
def cuda_problem() -> str | None:
    """Why the GPU benchmarks cannot run here, or None when a CUDA device is usable."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        return f"torch is not importable ({exc}); install the package first: pip install -e \".[bench]\""
    if not torch.cuda.is_available():
        built = torch.version.cuda or "none (a CPU build)"
        return (f"No CUDA device: these benchmarks time GPU kernels and need an NVIDIA GPU. This torch "
                f"{torch.__version__} (CUDA {built}) sees none. `python -m benchmarks --list` shows the "
                f"suite; `docs/benchmarks.md` has the measured results.")
    return None


def require_cuda() -> int:
    """0 when a CUDA device is usable; else prints why and returns :data:`NO_CUDA_EXIT`."""
    problem = cuda_problem()
    if problem is None:
        return 0
    print(problem, file=sys.stderr)
    return NO_CUDA_EXIT


def normalize_device_name(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"NVIDIA_H200"`` (the results and shipped-cache folder name)."""
    return "_".join(name.strip().split())


def device_name() -> str:
    import torch

    return normalize_device_name(torch.cuda.get_device_name())


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=10"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def metadata() -> dict[str, Any]:
    """Device and versions of this run, with its date (UTC)."""
    import torch
    import triton

    meta: dict[str, Any] = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    try:
        import kernelops

        meta["kernelops"] = getattr(kernelops, "__version__", None)
    except ImportError:  # pragma: no cover
        meta["kernelops"] = None
    meta["commit"] = _git_commit()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        meta.update(device_name=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()),
                    sms=props.multi_processor_count, memory_gib=round(props.total_memory / 2 ** 30, 1))
    return meta


@functools.lru_cache(maxsize=None)
def ceilings() -> dict[str, float]:
    """The device's measured ceilings, once per process: a bf16 8192^3 matmul's TFLOP/s and a
    1 GiB device-to-device copy's TB/s (read plus write bytes)."""
    import torch

    ceiling = {"matmul_bf16_tflops": _matmul_tflops(), "copy_tbps": _copy_tbps()}
    torch.cuda.empty_cache()
    return ceiling


def _matmul_tflops(n: int = 8192) -> float:
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return tflops(2 * n ** 3, bench(lambda: a @ b, warmup=50, rep=300))


def _copy_tbps(elements: int = 2 ** 29) -> float:
    import torch

    src = torch.randn(elements, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return tbps(2 * nbytes(src), bench(lambda: dst.copy_(src), rep=200))


# --- timing -----------------------------------------------------------------------------------
def bench(fn: Callable[[], Any], *, grad_to_none: Sequence | None = None, warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds per call (``triton.testing.do_bench``), after one untimed call."""
    import triton.testing

    fn()
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="median")


def bench_graph(fn: Callable[[], Any], *, rep: int = 100) -> float:
    """Median milliseconds per call captured in a CUDA graph (GPU time without the host's launch
    cost), after one untimed eager call."""
    import torch
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")


def host_us(fn: Callable[[], Any], *, calls: int = 10, rounds: int = 5, spin_cycles: int = 100_000_000) -> float:
    """Median over ``rounds`` of the microseconds to issue one call while a spin kernel
    (``torch.cuda._sleep``, ~50 ms) holds the GPU, so no call waits for the device; a call that
    synchronises shows up as milliseconds."""
    import torch

    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(spin_cycles)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def wall_us(fn: Callable[[], Any], *, calls: int = 100, rounds: int = 5, warmup: int = 10) -> float:
    """Median over ``rounds`` of the wall-clock microseconds per call of a loop of ``calls``
    (synchronised before and after): what a training loop of such calls takes."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def gpu_us(fn: Callable[[], Any], *, calls: int = 10) -> float:
    """Device time per call: the call's kernels summed (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / calls


# --- work counted -----------------------------------------------------------------------------
def attention_flops(batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int, *, causal: bool = False,
                    mode: str = "fwd") -> float:
    """``4 * B * H * Sq * Sk * D`` per forward (two matrix products), half when causal; the
    backward counts 2.5 forwards, forward+backward 3.5 (:data:`MODE_FACTOR`)."""
    flops = 4.0 * batch * heads * seq_q * seq_k * head_dim
    return (flops / 2 if causal else flops) * MODE_FACTOR[mode]


def visible_pairs(seq_q: int, seq_k: int, *, causal: bool = False, left: int | None = None) -> int:
    """The (query, key) pairs a mask leaves visible: causal aligned bottom-right (query ``i`` sits
    at key position ``i + Sk - Sq`` and sees keys up to it), ``left`` keys to the left of that
    position as well (a sliding window ``(left, 0)``; None: unbounded)."""
    if not causal and left is None:
        return seq_q * seq_k
    total = 0
    for i in range(seq_q):
        pos = i + seq_k - seq_q
        hi = min(pos, seq_k - 1) if causal else seq_k - 1
        lo = 0 if left is None else max(0, pos - left)
        total += max(0, hi - lo + 1)
    return total


def pairs_flops(pairs: int, heads: int, head_dim: int, mode: str = "fwd") -> float:
    """Useful FLOPs of masked attention: ``4 * H * D`` per visible pair, times :data:`MODE_FACTOR`."""
    return 4.0 * pairs * heads * head_dim * MODE_FACTOR[mode]


def nbytes(*tensors) -> int:
    """Bytes the tensors hold (what a memory-bound op must move at least once)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def tflops(flops: float, ms: float) -> float:
    return flops / ms / 1e9


def tbps(num_bytes: float, ms: float) -> float:
    return num_bytes / ms / 1e9


# --- inputs and peers (attention) -------------------------------------------------------------
def dtype_of(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def randn(*shape, dtype="bf16"):
    import torch

    return torch.randn(*shape, device="cuda", dtype=dtype_of(dtype))


#: torch SDPA backends by the implementation names rows use
SDPA = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_efficient": "EFFICIENT_ATTENTION",
        "sdpa_math": "MATH"}


def sdpa(name: str, *, causal: bool = False, gqa: bool = False):
    """An SDPA backend as ``fn(q, k, v)`` on BHSD tensors; a backend that refuses ``enable_gqa``
    gets K/V expanded to the query heads (its rows still count the unexpanded bytes)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    backend = getattr(SDPBackend, SDPA[name])

    def run(q, k, v):
        with sdpa_kernel(backend):
            if not gqa:
                return scaled_dot_product_attention(q, k, v, is_causal=causal)
            try:
                return scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            except RuntimeError:
                group = q.shape[1] // k.shape[1]
                return scaled_dot_product_attention(q, torch.repeat_interleave(k, group, 1),
                                                    torch.repeat_interleave(v, group, 1), is_causal=causal)
    return run


def flex(mask_mod, seq_q: int, seq_k: int, *, score_mod=None, gqa: bool = False):
    """Compiled FlexAttention with a block mask, as ``fn(q, k, v)`` on ``[1, H, S, D]`` tensors
    (dynamo reset first, so each shape compiles alone)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()
    mask = create_block_mask(mask_mod, 1, None, seq_q, seq_k, device="cuda")
    compiled = torch.compile(flex_attention)
    kw = {"block_mask": mask, "enable_gqa": gqa}
    if score_mod is not None:
        kw["score_mod"] = score_mod
    return lambda q, k, v: compiled(q, k, v, **kw)


def bhsd(t):
    """``[B, S, H, D]`` (or packed ``[T, H, D]`` as one batch) -> contiguous ``[B, H, S, D]``."""
    if t.dim() == 3:
        t = t[None]
    return t.transpose(1, 2).contiguous()


def random_documents(tokens: int, docs: int, seed: int):
    """``(lengths, offsets)``: ``tokens`` cut at ``docs - 1`` distinct random points; the int32
    offsets ``[0, ..., tokens]`` on the GPU."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randperm(tokens - 1, generator=gen)[:docs - 1] + 1).values.tolist()
    lens = [b - a for a, b in zip([0] + cuts, cuts + [tokens])]
    return lens, offsets(lens)


def offsets(lens):
    import torch

    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")


def doc_ids(lens):
    import torch

    return torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda"))


# --- recording rows -------------------------------------------------------------------------------
def timed(fn, tensors, mode: str) -> float:
    """Milliseconds per call of ``fn(*tensors)`` (``fwd``) or of its forward and backward with a
    fixed random gradient (``fwdbwd``; the inputs' gradients reset between calls)."""
    import torch

    if mode == "fwd":
        return bench(lambda: fn(*tensors))
    leaves = [t.detach().requires_grad_(True) for t in tensors]
    dout = torch.randn_like(fn(*leaves))
    return bench(lambda: fn(*leaves).backward(dout), grad_to_none=leaves)


class Recorder:
    """Times one implementation into a row (an error becomes the row's ``error``), adds the rate
    (TFLOP/s from FLOPs, TB/s from bytes) and prints the row as it lands."""

    def __init__(self, results: Results):
        self.results = results

    def __call__(self, row: dict, measure, *, flops: float | None = None, nbytes: float | None = None,
                 **extra) -> dict:
        try:
            ms = measure()
            row = {**row, "ms": ms}
            if flops is not None:
                row["tflops"] = tflops(flops, ms)
            if nbytes is not None:
                row["tbps"] = tbps(nbytes, ms)
            for name, fn in extra.items():
                row[name] = fn()
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run a shape is reported, not fatal
            row = {**row, "error": error_text(exc)}
        self.results.add(row)
        shape = " ".join(f"{k}={fmt(v)}" for k, v in row.items()
                         if not is_measured(k) and k not in ("case", "impl"))
        rate = (f"{row['tflops']:7.1f} TFLOP/s" if "tflops" in row else f"{row['tbps']:6.2f} TB/s" if "tbps" in row
                else "") if "ms" in row else row["error"]
        host = f"  host {row['host_us']:.0f} us" if "host_us" in row else ""
        print(f"{row['case']:7s} {shape:54s} {row['impl']:22s} " + (f"{row['ms']:9.4f} ms {rate}{host}"
                                                                 if "ms" in row else rate), flush=True)
        return row


# --- rows, ratios, results --------------------------------------------------------------------
def is_measured(field: str) -> bool:
    return field in MEASURED or field.endswith(MEASURED_SUFFIXES)


def row_key(row: dict, *, without: Iterable[str] = ()) -> tuple:
    """A row's identity: its non-measurement fields (less ``without``), sorted."""
    skip = set(without)
    return tuple(sorted((k, _hashable(v)) for k, v in row.items() if not is_measured(k) and k not in skip))


def _hashable(value):
    return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


def speedup(ours_ms: float, peer_ms: float) -> float:
    """How many times faster ours ran than the peer: ``peer_ms / ours_ms``."""
    return peer_ms / ours_ms


def compare(rows: Iterable[dict], *, ours: str = "kernelops", peers: Sequence[str] | None = None) -> list[dict]:
    """One entry per timed row of ``ours``: its shape fields, ``run`` and its own measurements
    (``ms``, ``tflops`` ...), and for each peer measured in the same run on the same shape
    ``<peer>_ms`` and ``x_<peer>``, the speed-up :func:`speedup`. Rows of other runs are never
    compared."""
    timed = [r for r in rows if isinstance(r.get("ms"), (int, float)) and r["ms"] > 0]
    index = {(row_key(r, without=("impl",)), r.get("run"), r.get("impl")): r for r in timed}
    names = list(peers) if peers is not None else sorted({str(x.get("impl")) for x in timed} - {ours})
    out = []
    for r in timed:
        if r.get("impl") != ours:
            continue
        shape = row_key(r, without=("impl",))
        entry = {k: v for k, v in r.items() if k != "impl" and (not is_measured(k) or isinstance(v, (int, float)))}
        for peer in names:
            other = index.get((shape, r.get("run"), peer))
            if other is not None:
                entry[f"{peer}_ms"] = other["ms"]
                entry[f"x_{peer}"] = speedup(r["ms"], other["ms"])
        out.append(entry)
    return out


def error_text(exc: BaseException) -> str:
    """``Type: first line`` of an exception, short enough for a table."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"[:200]


class Results:
    """``<out>/<DEVICE>/<op>.json``: ``{"op", "device", "runs": [metadata...], "rows": [...]}``.

    Every row names the run that measured it (an index into ``runs``). Opening a file that exists
    keeps its runs and rows; :meth:`add` replaces a row only when this run measures the same
    identity again, so a grid can be measured in parts. :meth:`add` rewrites the file (atomically),
    so a run cut short keeps what it measured."""

    def __init__(self, op: str, path: pathlib.Path, data: dict | None = None):
        self.op, self.path = op, pathlib.Path(path)
        self.data = data if data is not None else {"op": op, "runs": [], "rows": []}
        self.data.setdefault("runs", [])
        self.data.setdefault("rows", [])
        self.run: int | None = None

    @classmethod
    def open(cls, op: str, out: str | os.PathLike | None = None, device: str | None = None,
             defaults: dict | None = None) -> Results:
        """The op's results file under ``out`` (default ``benchmarks/results``) for ``device``
        (default: this GPU), with its existing rows; ``defaults`` fill fields older rows lack."""
        folder = pathlib.Path(out) if out else RESULTS
        path = folder / (device or device_name()) / f"{op}.json"
        return cls.load(path, op, defaults)

    @classmethod
    def load(cls, path: str | os.PathLike, op: str | None = None, defaults: dict | None = None) -> Results:
        path = pathlib.Path(path)
        data = json.loads(path.read_text()) if path.exists() else None
        if data is not None and not data.get("runs"):  # a file of one run, its metadata at the top
            data["runs"] = [{k: v for k, v in data.items() if k not in ("rows", "runs")}]
        if data is not None:
            data["rows"] = [{**(defaults or {}), "run": 0, **r} for r in data.get("rows", [])]
        return cls(op or (data or {}).get("op") or path.stem, path, data)

    @property
    def rows(self) -> list[dict]:
        return self.data["rows"]

    def start_run(self, meta: dict | None = None, **extra) -> int:
        """Append this run's metadata (and the device's ceilings, when measured) and return its index."""
        run = {**(meta if meta is not None else metadata()), **extra}
        self.data["runs"].append(run)
        self.data.update(op=self.op, device=self.path.parent.name, latest=run)
        self.run = len(self.data["runs"]) - 1
        return self.run

    def add(self, row: dict, *, save: bool = True) -> dict:
        if self.run is None:
            raise RuntimeError("Results.start_run() before add()")
        row = {**row, "run": self.run}
        key = row_key(row)
        self.data["rows"] = [r for r in self.rows if row_key(r) != key] + [row]
        if save:
            self.save()
        return row

    def this_run(self) -> list[dict]:
        return [r for r in self.rows if r.get("run") == self.run]

    def save(self) -> pathlib.Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(tmp, self.path)
        return self.path


# --- output -----------------------------------------------------------------------------------
def fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence], *, markdown: bool = False) -> str:
    """A plain fixed-width table, or a markdown one."""
    cells = [[fmt(c) if not isinstance(c, str) else c for c in row] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells])
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def ratio_text(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def comparison_table(rows: Iterable[dict], *, ours: str = "kernelops", peers: Sequence[str] | None = None,
                     rate: str = "tflops", markdown: bool = False, drop: Sequence[str] = ("case",)) -> str:
    """:func:`compare`'s entries as a table: the shape fields, our rate (``tflops`` or ``tbps``)
    and our speed-up over each peer measured in the same run."""
    entries = compare(rows, ours=ours, peers=peers)
    if not entries:
        return ""
    fields = [k for k in entries[0] if not is_measured(k) and not k.startswith("x_") and k not in drop]
    names = list(peers) if peers is not None else sorted({k[2:] for e in entries for k in e if k.startswith("x_")})
    headers = fields + [f"{ours} {rate}"] + [f"x {p}" for p in names]
    digits = 2 if rate == "tbps" else 1
    body = [[e.get(f) for f in fields] + [fmt(e.get(rate), digits)] + [ratio_text(e.get(f"x_{p}")) for p in names]
            for e in entries]
    return table(headers, body, markdown=markdown)


def size_text(n: int) -> str:
    """``512``, ``4k``, ``128k``."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def plot(path: pathlib.Path, rows: Sequence[dict], *, panel: Callable[[dict], tuple], x: str, y: str,
         title: Callable[[tuple], str], xlabel: str, ylabel: str, suptitle: str, series: str = "impl",
         ceiling: float | None = None, logx: bool = True) -> pathlib.Path | None:
    """One panel per ``panel(row)``, one line per ``row[series]`` (kernelops drawn thicker), an
    optional dashed ceiling; written to ``path`` (PNG). Without matplotlib: a message, no plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot {path.name} (pip install matplotlib, or the [bench] extra)")
        return None
    rows = [r for r in rows if isinstance(r.get(y), (int, float))]
    if not rows:
        return None
    panels = sorted({panel(r) for r in rows}, key=lambda p: tuple((0, x, "") if isinstance(x, (int, float))
                                                                  else (1, 0, str(x)) for x in p))
    cols = min(len(panels), 4)
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, panels):
        mine = [r for r in rows if panel(r) == key]
        for name in sorted({str(r[series]) for r in mine}):
            pts = sorted((r[x], r[y]) for r in mine if str(r[series]) == name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name,
                    lw=2.2 if name.startswith("kernelops") else 1.2)
        if ceiling:
            ax.axhline(ceiling, ls="--", c="gray", lw=0.8)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set_title(title(key), fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.98 if nrows > 2 else 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")
    return path


def run_title(run: dict) -> str:
    """``NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0, CUDA 13.0, 2026-11-26``."""
    parts = [run.get("device_name") or "", f"torch {run.get('torch')}", f"Triton {run.get('triton')}"]
    if run.get("cuda"):
        parts.append(f"CUDA {run['cuda']}")
    parts.append(str(run.get("created", ""))[:10])
    return ", ".join(p for p in parts if p)


# --- command line -----------------------------------------------------------------------------
def parser(doc: str | None, name: str | None = None) -> argparse.ArgumentParser:
    """The options every benchmark takes: ``--out``, ``--quick``, ``--no-plot``."""
    text = (doc or "").strip()
    p = argparse.ArgumentParser(prog=f"python -m benchmarks {name}" if name else None,
                                description=text.splitlines()[0] if text else None)
    p.add_argument("--out", default=None, help=f"results root (default {RESULTS.relative_to(ROOT.parent)})")
    p.add_argument("--quick", action="store_true", help="a small grid: a smoke run in about a minute")
    p.add_argument("--no-plot", action="store_true", help="write no plot")
    return p


def set_autotune_policy(autotune: bool) -> None:
    """kernelops tunes nothing during a benchmark unless asked (its configs come from the caches
    and the heuristic): ``KERNELOPS_AUTOTUNE=never``, or ``auto`` with ``--autotune``."""
    os.environ["KERNELOPS_AUTOTUNE"] = "auto" if autotune else os.environ.get("KERNELOPS_AUTOTUNE", "never")
