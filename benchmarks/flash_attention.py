"""flash_attention beside torch SDPA (cuDNN, FlashAttention-2) and compiled FlexAttention.

Case families (``--cases``, comma-separated; default: all of them):

- ``dense``: B*S = 16k tokens (B = 16k / S, at least 1), H*D = 2048, D in {64, 128, 256}, causal
  and not, S = 512..32k, bf16 and fp16, forward and forward+backward, beside SDPA's cuDNN and
  FlashAttention-2 backends. FLOPs ``4*B*H*S*S*D``, half when causal, x3.5 for forward+backward.
- ``masks``: 16k tokens, H*D = 2048, causal: 16 random documents packed (kernelops with one offsets
  tensor, with ``max_seqlen`` and with a second offsets tensor for the keys; SDPA on the
  right-padded batch; Flex with a document mask), a 4096-key sliding window (vs Flex), GQA
  (2H/H/2 heads: vs SDPA cuDNN, FlashAttention-2 and Flex) and the window with GQA (vs Flex).
- ``window``: causal sliding windows of 1024 and 4096 keys over S = 4k and 16k, and over 16 packed
  documents, vs Flex.
- ``softcap``: logits capped at 50 (Gemma 2), causal with and without a 4096-key window, dense
  S = 8k and packed, vs Flex (the cap as its score_mod) and the same call uncapped.
- ``prefix``: chunked prefill, n sequences of 128-2048 new queries over 0-16k cached keys, packed
  with two offsets tensors, bottom-right causal, GQA 32/8, D=128, forward, vs Flex.
- ``decode``: Sq in {1, 4, 16} over Sk in {4k, 32k, 128k}, B in {1, 8}, GQA 32/8, D=128; K/V read
  TB/s against the device's copy ceiling, eager (with the time to issue one call) and under CUDA
  graphs, vs SDPA cuDNN (and FlashAttention-2 eager).

Masked rows count useful work only (the visible query-key pairs). FlexAttention is compiled per
shape after ``torch._dynamo.reset()``. Inputs are fresh random data, each implementation in its
native layout (kernelops BSHD, SDPA and Flex BHSD). kernelops tunes nothing unless ``--autotune``:
its configs come from the shipped cache and the heuristic.

    python -m benchmarks flash_attention [--cases dense,masks,decode] [--quick] [--dims 128] ...
    python -m benchmarks flash_attention --report benchmarks/results/NVIDIA_H200/flash_attention.json
"""

from __future__ import annotations

import pathlib
import sys

if __package__ in (None, ""):  # run as a file: make ``benchmarks`` importable
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import harness as H  # noqa: E402

KIND = "op"
OP = "flash_attention"
TOKENS = 16384
WIDTH = 2048  # H * D
FAMILIES = ("dense", "masks", "window", "softcap", "prefix", "decode")


# --- families ---------------------------------------------------------------------------------
def dense(record: H.Recorder, args) -> None:
    from kernelops import flash_attention

    dims = args.dims or ([128] if args.quick else [64, 128, 256])
    seqs = args.seqs or ([1024, 4096] if args.quick else [512, 1024, 2048, 4096, 8192, 16384, 32768])
    dtypes = args.dtypes or (["bf16"] if args.quick else ["bf16", "fp16"])
    impls = args.impls or ["kernelops", "sdpa_flash", "sdpa_cudnn"]
    for dtype in dtypes:
        for mode in args.modes:
            for D in dims:
                for causal in (False, True):
                    for S in seqs:
                        B, heads = max(1, TOKENS // S), WIDTH // D
                        q, k, v = (H.randn(B, S, heads, D, dtype=dtype) for _ in range(3))
                        qt, kt, vt = (H.bhsd(t) for t in (q, k, v))
                        flops = H.attention_flops(B, heads, S, S, D, causal=causal, mode=mode)
                        for impl in impls:
                            row = {"case": "dense", "impl": impl, "dtype": dtype, "mode": mode, "D": D,
                                   "causal": causal, "S": S, "B": B, "H": heads}
                            if impl == "kernelops":
                                fn, args_ = (lambda a, b, c, cz=causal: flash_attention(a, b, c, causal=cz)), (q, k, v)
                            else:
                                fn, args_ = H.sdpa(impl, causal=causal), (qt, kt, vt)
                            record(row, lambda: H.timed(fn, args_, mode), flops=flops)


def masks(record: H.Recorder, args) -> None:
    for D in args.dims or [128]:
        heads = WIDTH // D
        for mode in args.modes:
            for name, run in (("documents", _documents), ("window4096", _window4096), ("gqa", _gqa),
                              ("window_gqa", _window_gqa)):
                if args.masks and name not in args.masks:
                    continue
                run(record, mode, D, heads)


def _documents(record, mode, D, heads):
    """16 random documents in 16k tokens, causal: packed kernelops vs padded SDPA vs Flex."""
    from kernelops import flash_attention

    lens, cu = H.random_documents(TOKENS, 16, seed=0)
    flops = H.pairs_flops(sum(n * (n + 1) // 2 for n in lens), heads, D, mode)
    base = {"case": "masks", "mask": "documents", "mode": mode, "D": D, "Hq": heads, "Hkv": heads, "tokens": TOKENS}
    q, k, v = (H.randn(TOKENS, heads, D) for _ in range(3))
    longest, cu2 = max(lens), cu.clone()
    calls = {
        "kernelops": lambda a, b, c: flash_attention(a, b, c, causal=True, cum_seqlens_q=cu, cum_seqlens_k=cu),
        "kernelops_max_seqlen": lambda a, b, c: flash_attention(a, b, c, causal=True, cum_seqlens_q=cu,
                                                                cum_seqlens_k=cu, max_seqlen_q=longest,
                                                                max_seqlen_k=longest),
        "kernelops_two_offsets": lambda a, b, c: flash_attention(a, b, c, causal=True, cum_seqlens_q=cu,
                                                                 cum_seqlens_k=cu2),
    }
    for impl, fn in calls.items():
        record({**base, "impl": impl}, lambda fn=fn: H.timed(fn, (q, k, v), mode), flops=flops)
    padded = [H.randn(len(lens), heads, longest, D) for _ in range(3)]  # right-padded batch: causal keeps it exact
    for impl in ("sdpa_flash", "sdpa_cudnn"):
        fn = H.sdpa(impl, causal=True)
        record({**base, "impl": impl + "_padded"}, lambda fn=fn: H.timed(fn, padded, mode), flops=flops)
    doc = H.doc_ids(lens)
    record({**base, "impl": "flex"}, lambda: H.timed(H.flex(lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j), TOKENS,
                                                        TOKENS), [H.bhsd(t) for t in (q, k, v)], mode), flops=flops)


def _windowed(record, mode, D, hq, hkv, name):
    from kernelops import flash_attention

    left = 4095  # 4096 keys visible
    flops = H.pairs_flops(H.visible_pairs(TOKENS, TOKENS, causal=True, left=left), hq, D, mode)
    base = {"case": "masks", "mask": name, "mode": mode, "D": D, "Hq": hq, "Hkv": hkv, "tokens": TOKENS}
    q = H.randn(1, TOKENS, hq, D)
    k, v = (H.randn(1, TOKENS, hkv, D) for _ in range(2))
    record({**base, "impl": "kernelops"},
           lambda: H.timed(lambda a, b, c: flash_attention(a, b, c, causal=True, sliding_window=(left, 0)), (q, k, v),
                         mode), flops=flops)
    record({**base, "impl": "flex"},
           lambda: H.timed(H.flex(lambda b, h, i, j: (i >= j) & (i - j <= left), TOKENS, TOKENS, gqa=hq != hkv),
                         [H.bhsd(t) for t in (q, k, v)], mode), flops=flops)


def _window4096(record, mode, D, heads):
    _windowed(record, mode, D, heads, heads, "window4096")


def _window_gqa(record, mode, D, heads):
    _windowed(record, mode, D, 2 * heads, heads // 2, "window_gqa")


def _gqa(record, mode, D, heads):
    """One 16k causal sequence with 2H query and H/2 key/value heads."""
    from kernelops import flash_attention

    hq, hkv = 2 * heads, heads // 2
    flops = H.attention_flops(1, hq, TOKENS, TOKENS, D, causal=True, mode=mode)
    base = {"case": "masks", "mask": "gqa", "mode": mode, "D": D, "Hq": hq, "Hkv": hkv, "tokens": TOKENS}
    q = H.randn(1, TOKENS, hq, D)
    k, v = (H.randn(1, TOKENS, hkv, D) for _ in range(2))
    t = [H.bhsd(x) for x in (q, k, v)]
    record({**base, "impl": "kernelops"},
           lambda: H.timed(lambda a, b, c: flash_attention(a, b, c, causal=True), (q, k, v), mode), flops=flops)
    for impl in ("sdpa_cudnn", "sdpa_flash"):
        fn = H.sdpa(impl, causal=True, gqa=True)
        record({**base, "impl": impl}, lambda fn=fn: H.timed(fn, t, mode), flops=flops)
    record({**base, "impl": "flex"},
           lambda: H.timed(H.flex(lambda b, h, i, j: i >= j, TOKENS, TOKENS, gqa=True), t, mode), flops=flops)


def window(record: H.Recorder, args, *, softcap: float | None = None) -> None:
    """Causal sliding windows (``case="window"``) or capped logits (``case="softcap"``)."""
    dims = args.dims or [128]
    if softcap is None:
        seqs = args.seqs or ([4096] if args.quick else [4096, 16384])
        windows = [1024] if args.quick else [1024, 4096]
    else:
        seqs, windows = args.seqs or [8192], ([None] if args.quick else [None, 4096])
    shapes = [(D, S, W, False) for D in dims for S in seqs for W in windows if W is None or W < S - 1]
    shapes += [(D, 0, W, True) for D in dims for W in windows]
    for mode in args.modes:
        for D, S, W, packed in shapes:
            _window_case(record, mode, D, S, W, packed, softcap)


def _window_case(record, mode, D, S, left, packed, softcap):
    import torch

    from kernelops import flash_attention

    heads = WIDTH // D
    case = "window" if softcap is None else "softcap"
    if packed:
        lens, cu = H.random_documents(TOKENS, 16, seed=D + (left or 0))
        q, k, v = (H.randn(TOKENS, heads, D) for _ in range(3))
        extra = {"cum_seqlens_q": cu, "cum_seqlens_k": cu}
    else:
        lens = [S] * (TOKENS // S)
        q, k, v = (H.randn(TOKENS // S, S, heads, D) for _ in range(3))
        extra = {}
    pairs = sum(H.visible_pairs(n, n, causal=True, left=left) for n in lens)
    flops = H.pairs_flops(pairs, heads, D, mode)
    base = {"case": case, "mode": mode, "D": D, "H": heads, "S": S, "packed": packed, "window": left}
    if softcap is not None:
        base["softcap"] = softcap
    span = (1 << 30) if left is None else left

    def ours(a, b, c, cap=softcap):
        return flash_attention(a, b, c, causal=True, sliding_window=None if left is None else (left, 0),
                               logits_soft_cap=cap, **extra)

    record({**base, "impl": "kernelops"}, lambda: H.timed(ours, (q, k, v), mode), flops=flops)
    if softcap is not None:
        record({**base, "impl": "kernelops_nocap"},
               lambda: H.timed(lambda a, b, c: ours(a, b, c, None), (q, k, v), mode), flops=flops)
    score_mod = None if softcap is None else (lambda score, b, h, i, j: softcap * torch.tanh(score / softcap))
    if packed:
        doc = H.doc_ids(lens)
        fn = H.flex(lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j) & (i - j <= span), TOKENS, TOKENS,
                  score_mod=score_mod)
    else:
        fn = H.flex(lambda b, h, i, j: (i >= j) & (i - j <= span), S, S, score_mod=score_mod)
    record({**base, "impl": "flex"}, lambda: H.timed(fn, [H.bhsd(t) for t in (q, k, v)], mode), flops=flops)


def softcap(record: H.Recorder, args) -> None:
    window(record, args, softcap=50.0)


def prefix(record: H.Recorder, args) -> None:
    """Chunked prefill: packed query chunks over their cached prefixes (two offsets tensors)."""
    import torch

    from kernelops import flash_attention

    hq, hkv, D = 32, 8, 128
    for n in ([8] if args.quick else [8, 32]):
        gen = torch.Generator().manual_seed(n)
        lens_q = torch.randint(128, 2049, (n,), generator=gen).tolist()
        lens_k = [p + m for p, m in zip(torch.randint(0, 16385, (n,), generator=gen).tolist(), lens_q)]
        pairs = sum(H.visible_pairs(m, s, causal=True) for m, s in zip(lens_q, lens_k))
        flops = H.pairs_flops(pairs, hq, D)
        cq, ck = H.offsets(lens_q), H.offsets(lens_k)
        tq, tk = sum(lens_q), sum(lens_k)
        q = H.randn(tq, hq, D)
        k, v = (H.randn(tk, hkv, D) for _ in range(2))
        bounds = {"max_seqlen_q": max(lens_q), "max_seqlen_k": max(lens_k)}
        base = {"case": "prefix", "mode": "fwd", "D": D, "Hq": hq, "Hkv": hkv, "seqs": n, "tokens_q": tq,
                "tokens_k": tk}
        record({**base, "impl": "kernelops"},
               lambda: H.bench(lambda: flash_attention(q, k, v, causal=True, cum_seqlens_q=cq, cum_seqlens_k=ck,
                                                       **bounds)), flops=flops)
        doc_q, doc_k = H.doc_ids(lens_q), H.doc_ids(lens_k)
        # query i's key position: its sequence's keys start + prefix + (i - its queries' start)
        shift = (ck[1:] - (cq[1:] - cq[:-1]) - cq[:-1]).long()
        fn = H.flex(lambda b, h, i, j: (doc_q[i] == doc_k[j]) & (i + shift[doc_q[i]] >= j), tq, tk, gqa=True)
        qf, kf, vf = (H.bhsd(t) for t in (q, k, v))
        record({**base, "impl": "flex"}, lambda: H.bench(lambda: fn(qf, kf, vf)), flops=flops)


def decode(record: H.Recorder, args) -> None:
    """Few queries over long K/V: K/V read TB/s, eager and under CUDA graphs."""
    from kernelops import flash_attention

    hq, hkv = 32, 8
    for D in args.dims or [128]:
        for B in ([1] if args.quick else [1, 8]):
            for Sk in ([4096, 32768] if args.quick else [4096, 32768, 131072]):
                for Sq in ([1] if args.quick else [1, 4, 16]):
                    q = H.randn(B, Sq, hq, D)
                    k, v = (H.randn(B, Sk, hkv, D) for _ in range(2))
                    kv = H.nbytes(k, v)
                    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
                    calls = {"kernelops": lambda: flash_attention(q, k, v)}
                    for impl in ("sdpa_cudnn", "sdpa_flash"):
                        calls[impl] = lambda fn=H.sdpa(impl, gqa=True): fn(qt, kt, vt)
                    base = {"case": "decode", "mode": "fwd", "dtype": "bf16", "D": D, "B": B, "Sq": Sq, "Sk": Sk,
                            "Hq": hq, "Hkv": hkv}
                    for impl, call in calls.items():
                        record({**base, "impl": impl, "graph": False}, lambda call=call: H.bench(call), nbytes=kv,
                               host_us=lambda call=call: H.host_us(call))
                    for impl in ("kernelops", "sdpa_cudnn"):
                        record({**base, "impl": impl, "graph": True}, lambda call=calls[impl]: H.bench_graph(call),
                               nbytes=kv)


RUNNERS = {"dense": dense, "masks": masks, "window": window, "softcap": softcap, "prefix": prefix, "decode": decode}


# --- summaries, report, plots -----------------------------------------------------------------
def summaries(rows: list[dict], *, markdown: bool = False) -> str:
    """Per family, kernelops against each peer measured in the same run."""
    out = []
    peers = {"dense": ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient"],
             "masks": ["flex", "sdpa_cudnn", "sdpa_flash", "sdpa_cudnn_padded", "sdpa_flash_padded"],
             "window": ["flex"], "softcap": ["flex", "kernelops_nocap"], "prefix": ["flex"],
             "decode": ["sdpa_cudnn", "sdpa_flash"]}
    for case in FAMILIES:
        mine = [r for r in rows if r.get("case") == case]
        if not mine:
            continue
        present = {r.get("impl") for r in mine}
        names = [p for p in peers[case] if p in present]
        text = H.comparison_table(mine, peers=names, rate="tbps" if case == "decode" else "tflops", markdown=markdown)
        if text:
            out += [f"\n{case} (kernelops' rate, and its speed-up over each peer of the same run):", text]
    return "\n".join(out)


def plots(results: H.Results) -> None:
    latest = results.data.get("latest") or (results.data["runs"][-1] if results.data["runs"] else {})
    dense_rows = [r for r in results.rows if r.get("case") == "dense"]
    H.plot(results.path.with_suffix(".png"), dense_rows, panel=lambda r: (r["dtype"], r["mode"], r["D"], r["causal"]),
           x="S", y="tflops", title=lambda p: f"{p[0]} {p[1]} D={p[2]} {'causal' if p[3] else 'full'}",
           xlabel="sequence length", ylabel="TFLOP/s", ceiling=latest.get("matmul_bf16_tflops"),
           suptitle=f"flash_attention, {H.run_title(latest)} (dashed: bf16 matmul)")
    graphed = [r for r in results.rows if r.get("case") == "decode" and r.get("graph")]
    H.plot(results.path.with_name(results.path.stem + "_decode.png"), graphed,
           panel=lambda r: (r["D"], r["B"], r["Sq"]),
           x="Sk", y="tbps", title=lambda p: f"D={p[0]} B={p[1]} Sq={p[2]} (GQA 32/8), CUDA graphs",
           xlabel="key length", ylabel="K/V read TB/s", ceiling=latest.get("copy_tbps"),
           suptitle=f"flash_attention decode, {H.run_title(latest)} (dashed: copy, read+write)")


def dense_markdown(rows: list[dict], dtype: str) -> str:
    """The dense grid as docs/benchmarks.md shows it: TFLOP/s and ratios, one dtype."""
    entries = H.compare([r for r in rows if r.get("case") == "dense" and r.get("dtype") == dtype],
                        peers=["sdpa_flash", "sdpa_cudnn"])
    rate = {(r.get("run"), r["mode"], r["D"], r["causal"], r["S"], r["impl"]): r.get("tflops") for r in rows
            if r.get("case") == "dense" and r.get("dtype") == dtype}
    body = []
    for e in sorted(entries, key=lambda e: (e["mode"] != "fwd", e["D"], e["causal"], e["S"])):
        get = lambda impl: rate.get((e.get("run"), e["mode"], e["D"], e["causal"], e["S"], impl))  # noqa: E731
        body.append(["fwd" if e["mode"] == "fwd" else "fwd+bwd", str(e["D"]), "yes" if e["causal"] else "no",
                     H.size_text(e["S"])] + [H.fmt(get(i), 0) for i in ("kernelops", "sdpa_flash", "sdpa_cudnn")]
                    + [H.ratio_text(e.get("x_sdpa_flash")), H.ratio_text(e.get("x_sdpa_cudnn"))])
    return H.table(["mode", "D", "causal", "S", "kernelops", "SDPA flash", "SDPA cuDNN", "vs flash", "vs cuDNN"],
                   body, markdown=True)


def report(path: pathlib.Path, *, plot: bool = True) -> int:
    """No GPU needed: the markdown tables (dense, per dtype) and every family's summary of a
    results file, and its plots."""
    results = H.Results.load(path, OP, defaults={"case": "dense", "dtype": "bf16"})
    for dtype in ("bf16", "fp16"):
        if any(r.get("case") == "dense" and r.get("dtype") == dtype for r in results.rows):
            print(f"\n{dtype}, TFLOP/s:\n\n{dense_markdown(results.rows, dtype)}")
    print(summaries([r for r in results.rows if r.get("case") != "dense"], markdown=True))
    if plot:
        plots(results)
    return 0


def main(argv=None) -> int:
    p = H.parser(__doc__, OP)
    p.add_argument("--cases", default=",".join(FAMILIES), help=f"comma-separated families: {', '.join(FAMILIES)}")
    p.add_argument("--dims", type=int, nargs="+", help="head dims (each family has its default)")
    p.add_argument("--seqs", type=int, nargs="+", help="sequence lengths (dense, window)")
    p.add_argument("--dtypes", nargs="+", choices=["bf16", "fp16"], help="dense dtypes (default bf16 fp16)")
    p.add_argument("--modes", nargs="+", choices=["fwd", "fwdbwd"], default=["fwd", "fwdbwd"])
    p.add_argument("--impls", nargs="+", choices=["kernelops", *H.SDPA], help="dense implementations")
    p.add_argument("--masks", nargs="+", choices=["documents", "window4096", "gqa", "window_gqa"],
                   help="masks family: these cases only")
    p.add_argument("--autotune", action="store_true", help="let kernelops tune each new key (default: never)")
    p.add_argument("--report", metavar="JSON", help="no GPU: print the tables of a results file and plot it")
    args = p.parse_args(argv)
    if args.report:
        return report(pathlib.Path(args.report), plot=not args.no_plot)
    families = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        p.error(f"unknown case families {unknown}; choose from {', '.join(FAMILIES)}")
    if (code := H.require_cuda()):
        return code
    H.set_autotune_policy(args.autotune)
    results = H.Results.open(OP, args.out, defaults={"case": "dense", "dtype": "bf16"})
    results.start_run(H.metadata(), **H.ceilings(), autotune=args.autotune, cases=families, quick=args.quick)
    run = results.data["runs"][results.run]
    print(f"{H.run_title(run)}; bf16 matmul {run['matmul_bf16_tflops']:.0f} TFLOP/s, copy {run['copy_tbps']:.2f} TB/s"
          f" -> {results.path}")
    record = H.Recorder(results)
    for family in families:
        RUNNERS[family](record, args)
    print(summaries(results.this_run()))
    if not args.no_plot:
        plots(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
