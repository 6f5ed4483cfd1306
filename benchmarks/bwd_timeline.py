"""Experiment (NOTES v31): a per-program timeline of the fused Gluon backward kernel (GPU).

A copy of ``kernels/flash_attention/bwd_fused.py`` is made in which each program's consumer
warpgroup 0 writes ``%globaltimer`` at its start, after its K/V wait and at its end, its SM id, its
query-block count and its key block into a buffer (the ``nomask`` copy also drops the causal
diagonal masks: timing only). Per row it prints the kernel time (``do_bench``: the plain kernel and
each copy), the span, the programs' mean duration and K/V wait, the gaps between programs on an SM,
the busy time per SM, and a least-squares fit of duration against query blocks (per-block cost and
per-program overhead). bf16, D = 128, B*S = 16k tokens, H = 16; causal rows with the launch order's
rule and with every head's first key block first (one chunk of all heads, the order before v31).

    python benchmarks/bwd_timeline.py [--out DIR]
    PYTHONPATH=<triton 3.6> python benchmarks/bwd_timeline.py --offline   # compile the copies only
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import pathlib
import statistics
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SRC = ROOT / "kernelops/kernels/flash_attention"
ALL_HEADS = 1 << 20  # one chunk of every head: the launch order before v31

TIMERS = '''    @gluon.jit
    def _now():
        return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)

    @gluon.jit
    def _smid():
        return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)

'''
RECORD = '''        t2 = _now()
        if WG == 0:
            slot = Prof + gl.program_id(0) * 6
            gl.store(slot + 0, t0)
            gl.store(slot + 1, t1)
            gl.store(slot + 2, t2)
            gl.store(slot + 3, _smid().to(gl.int64))
            gl.store(slot + 4, (j_end - j0).to(gl.int64))
            gl.store(slot + 5, pid_n.to(gl.int64))
'''


def _replace(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise RuntimeError(f"the kernel source changed; cannot find {old!r} once")
    return text.replace(old, new)


def _load(directory: pathlib.Path, name: str, text: str):
    path = directory / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def instrumented(variant: str, directory: pathlib.Path):
    """The copy of ``bwd_fused`` (and of ``bwd_ws``, whose block code it uses) for ``variant``."""
    ws = (SRC / "bwd_ws.py").read_text()
    if variant == "nomask":
        ws = _replace(ws, "if first_key + KEYS - 1 > j * QROWS:", "if first_key < 0:")
    _load(directory, f"bwd_ws_{variant}", ws)
    t = (SRC / "bwd_fused.py").read_text().replace("kernelops.kernels.flash_attention.bwd_ws import",
                                                   f"bwd_ws_{variant} import")
    t = _replace(t, "dq_smem, stat_rings,\n                  chunk, CAUSAL: gl.constexpr",
                 "dq_smem, stat_rings,\n                  chunk, Prof, CAUSAL: gl.constexpr")
    t = _replace(t, "        first_key = pid_n * 2 * KEYS + WG * KEYS\n",
                 "        first_key = pid_n * 2 * KEYS + WG * KEYS\n        t0 = _now()\n")
    t = _replace(t, "        mbarrier.wait(kv_bar, phase=0)\n", "        mbarrier.wait(kv_bar, phase=0)\n        t1 = _now()\n")
    t = _replace(t, "        tma.store_wait(pendings=0)\n\n    @direct_launch",
                 "        tma.store_wait(pendings=0)\n" + RECORD + "\n    @direct_launch")
    t = _replace(t, "seq, heads, group, win_left, chunk, CAUSAL: gl.constexpr,",
                 "seq, heads, group, win_left, chunk, Prof, CAUSAL: gl.constexpr,")
    for wg in (0, 1):
        t = _replace(t, f"stat_rings, chunk, CAUSAL, HEAD_DIM, {wg})", f"stat_rings, chunk, Prof, CAUSAL, HEAD_DIM, {wg})")
    t = _replace(t, "    @gluon.jit\n    def _share_ds", TIMERS + "    @gluon.jit\n    def _share_ds")
    return _load(directory, f"bwd_fused_{variant}", t)


def summary(records: list) -> dict:
    """Span, durations, K/V waits, gaps and busy time per SM (us) of one launch's program records."""
    start = min(r[0] for r in records)
    dur = [(r[2] - r[0]) / 1e3 for r in records]
    blocks = [r[4] for r in records]
    per_sm: dict = {}
    for r in records:
        per_sm.setdefault(r[3], []).append(r)
    gaps, busy = [], []
    for rs in per_sm.values():
        rs.sort(key=lambda r: r[0])
        gaps += [(b[0] - a[2]) / 1e3 for a, b in zip(rs, rs[1:])]
        busy.append(sum(r[2] - r[0] for r in rs) / 1e3)
    mean_b, mean_d = statistics.mean(blocks), statistics.mean(dur)
    spread = sum((x - mean_b) ** 2 for x in blocks)
    slope = sum((x - mean_b) * (y - mean_d) for x, y in zip(blocks, dur)) / spread if spread else 0.0
    return dict(span_us=(max(r[2] for r in records) - start) / 1e3, sms=len(per_sm), mean_dur=mean_d,
                mean_kv_wait=statistics.mean((r[1] - r[0]) / 1e3 for r in records),
                gap_mean=statistics.mean(gaps) if gaps else 0.0, busy_mean=statistics.mean(busy),
                busy_min=min(busy), busy_max=max(busy), us_per_block=slope, us_per_program=mean_d - slope * mean_b,
                blocks_total=sum(blocks))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write <out>/bwd_fused_timeline.json (summaries and every program's record)")
    p.add_argument("--offline", action="store_true", help="only compile the copies for sm_90 (no GPU)")
    args = p.parse_args(argv)
    if args.offline:
        from kernelops.kernels.common import offline_compile

        offline_compile.install()
    import triton.testing

    from kernelops import flash_attention

    plain = importlib.import_module("kernelops.kernels.flash_attention.bwd_fused")
    copies = {v: instrumented(v, pathlib.Path(tempfile.mkdtemp(prefix="kernelops_timeline_"))) for v in ("prof", "nomask")}
    rows = [(S, causal, chunk) for S in (512, 1024, 2048, 4096) for causal in (True, False)
            for chunk in ((None, ALL_HEADS) if causal else (None,))]
    device = "cpu" if args.offline else "cuda"
    results = []
    for S, causal, chunk in rows[:1] if args.offline else rows:
        D, H, B = 128, 16, 16384 // S
        q, k, v, do = (torch.randn(B, S, H, D, device=device, dtype=torch.bfloat16) for _ in range(4))
        if args.offline:
            lse = delta = torch.zeros(B, H, S, device=device)
        else:
            out, lse = flash_attention(q, k, v, return_lse=True, causal=causal)
            delta = (out.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
        dq_acc = torch.zeros(B, S, H, D, device=device, dtype=torch.float32)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        kernel, grid, kargs, meta = plain.fused_launch(q, k, v, do, lse, delta, dq_acc, dk, dv, D ** -0.5, causal,
                                                       chunk=chunk)
        row = {"S": S, "causal": causal, "chunk": kargs[-1], "programs": grid[0]}
        if not args.offline:
            row["plain_us"] = 1e3 * triton.testing.do_bench(lambda: kernel[grid](*kargs, **meta), warmup=25, rep=200)
            want = (dk.clone(), dv.clone())
        for name, module in copies.items():
            if name == "nomask" and not causal:
                continue
            records = torch.zeros(grid[0] * 6, dtype=torch.int64, device=device)
            copy, pargs = module.flash_attention_bwd_fused_kernel, (*kargs, records)
            if args.offline:
                copy.warmup(*pargs, **meta, grid=grid)
                print(name, "compiled")
                continue
            row[f"{name}_us"] = 1e3 * triton.testing.do_bench(lambda: copy[grid](*pargs, **meta), warmup=25, rep=200)
            dq_acc.zero_()
            records.zero_()
            copy[grid](*pargs, **meta)
            torch.cuda.synchronize()
            if name == "prof":
                row["same_dk_dv"] = torch.equal(dk, want[0]) and torch.equal(dv, want[1])
            table = records.view(grid[0], 6).cpu().tolist()
            row[name] = summary(table)
            row[f"{name}_records"] = table
        print(json.dumps({key: val for key, val in row.items() if not key.endswith("_records")}), flush=True)
        results.append(row)
    if args.out and not args.offline:
        path = pathlib.Path(args.out)
        path.mkdir(parents=True, exist_ok=True)
        (path / "bwd_fused_timeline.json").write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
