"""Before/after of the dense forward on one GPU: the same calls, kernelops imported from a given tree.

Used as ``decode_trees.py`` is (an exported old tree, runs alternated with the new one so drift
shows as a spread): ``python benchmarks/fwd_trees.py TREE TAG [D:CAUSAL:S[:WINDOW[:DOCS]] ...] >>
ab.jsonl`` per run (the cases default to :data:`CASES`; WINDOW 0: none; DOCS: the 16k tokens packed
as that many random documents, with ``max_seqlen``; ``D:CAUSAL:S:0:0:GROUP``: GQA), then ``python
benchmarks/fwd_trees.py --table ab.jsonl``. ``--fwdbwd`` (anywhere after TAG) times
forward+backward instead (``torch.autograd.grad`` of the output against a random gradient, dense
cases only; 3.5 times the forward's FLOPs), the table's second mode (NOTES v69).

Each line is JSON: the case (``B * S = 16k`` tokens, ``H * D = 2048``, bf16, ``flash_attention``'s
forward with the library's own choice of kernel; ``window``: a causal left window; ``group``: GQA,
the K/V heads ``H / GROUP``, a sixth case field, dense cases only), milliseconds
of two ``triton.testing.do_bench`` medians, and SDPA's cuDNN backend in the same process (none for
windows). Each output is checked against cuDNN (or the library's torch platform) first. ``--table``
prints per case the best time of each tag, its TFLOP/s (causal counts half the score matrix) and
its ratio to cuDNN, and the last tag's speed-up over the first.
"""

from __future__ import annotations

import collections
import json
import sys

#: ``(D, causal, S, window)``: the causal rows of D=64/128 (the diagonal-first product, NOTES v64),
#: D=256 and full rows (unchanged paths), and a windowed D=64 row (three consumers)
CASES = ([(64, True, S, None) for S in (512, 1024, 2048, 4096, 8192)]
         + [(128, True, S, None) for S in (512, 1024, 2048, 4096, 16384)]
         + [(256, True, 1024, None), (64, False, 1024, None), (128, False, 2048, None), (64, True, 16384, 4096)])


def table(path: str) -> int:
    best = collections.defaultdict(dict)
    for line in open(path):
        r = json.loads(line)
        case = best[(r.get("mode", "fwd"), r["D"], r["causal"], r["S"], r["window"], r.get("group", 1))]
        case[r["tag"]] = min(case.get(r["tag"], 1e30), *r["ms"])
        if r["cudnn_ms"]:
            case["cudnn"] = min(case.get("cudnn", 1e30), *r["cudnn_ms"])
        case["tflop"] = r["tflop"]
    for (mode, D, causal, S, window, group), case in best.items():
        tags = [t for t in case if t not in ("cudnn", "tflop")]
        ref = case.get("cudnn")
        cells = [f"{t} {case['tflop'] / case[t] * 1e3:5.0f} TFLOP/s" + (f" ({ref / case[t]:.3f}x)" if ref else "")
                 for t in tags]
        gain = f"  {tags[-1]}/{tags[0]} {case[tags[0]] / case[tags[-1]]:.3f}x" if len(tags) > 1 else ""
        print(f"{mode:6s} D={D:3d} {'causal' if causal else 'full  '} S={S:5d} window={window} group={group}  "
              + (f"cudnn {case['tflop'] / ref * 1e3:5.0f}  " if ref else "") + "  ".join(cells) + gain)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--table"]:
        return table(argv[1])
    fwdbwd = "--fwdbwd" in argv
    argv = [a for a in argv if a != "--fwdbwd"]
    tree, tag = argv[0], argv[1]
    cases = [tuple(int(x) for x in c.split(":")) for c in argv[2:]]
    cases = [(c[0], bool(c[1]), c[2], (c + (0,))[3] or None, (c + (0, 0))[4], (c + (0, 0, 1))[5])
             for c in cases] or [(*c, 0, 1) for c in CASES]
    if fwdbwd and any(window is not None or docs for _, _, _, window, docs, _ in cases):
        raise SystemExit("--fwdbwd times dense cases only (its gradients are checked against cuDNN's)")
    from trees import import_tree

    caches = import_tree(tree)
    import torch
    import triton.testing as tt
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from kernelops import flash_attention

    for D, causal, S, window, docs, group in cases:
        if docs:
            print(json.dumps(packed_row(tag, tree, D, causal, docs)), flush=True)
            continue
        torch.manual_seed(0)
        B, H = 16384 // S, 2048 // D
        q, k, v = (torch.randn(B, S, h, D, device="cuda", dtype=torch.bfloat16, requires_grad=fwdbwd)
                   for h in (H, H // group, H // group))
        kw = dict(causal=causal) if window is None else dict(causal=True, sliding_window=(window, 0))
        fn = lambda: flash_attention(q, k, v, **kw)  # noqa: E731, B023
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        cudnn = lambda: sdpa(qt, kt, vt, is_causal=causal, enable_gqa=group > 1)  # noqa: E731, B023
        if fwdbwd:  # the gradients of one random output gradient (no .grad accumulation)
            dout = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
            fn = _gradients(fn, (q, k, v), dout)
            cudnn = _gradients(cudnn, (qt, kt, vt), dout.transpose(1, 2))
        if window is None:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                ref = None if fwdbwd else cudnn().transpose(1, 2)
                cudnn_ms = [tt.do_bench(cudnn, warmup=25, rep=200, return_mode="median") for _ in range(2)]
        else:
            ref = flash_attention(q[:1], k[:1], v[:1], **kw, platform="torch")
            cudnn_ms = []
        if fwdbwd:  # every gradient against cuDNN's (dense cases)
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                want = [g.transpose(1, 2) for g in cudnn()]
            err = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(fn(), want))
            assert err < 2e-2, (tree, D, causal, S, "fwdbwd", err)  # (relative to each gradient's largest value)
        else:
            err = (fn()[: ref.shape[0]].float() - ref.float()).abs().max().item()
            assert err < 2e-2, (tree, D, causal, S, window, err)
        ms = [tt.do_bench(fn, warmup=25, rep=200, return_mode="median") for _ in range(2)]
        keys = S if window is None else window  # (a window: each query's keys, roughly)
        flops = 4 * B * H * S * keys * D * (0.5 if causal and window is None else 1.0) * (3.5 if fwdbwd else 1.0)
        print(json.dumps(dict(tag=tag, mode="fwdbwd" if fwdbwd else "fwd", D=D, causal=causal, S=S, window=window,
                              group=group, ms=ms, cudnn_ms=cudnn_ms,
                              tflop=flops / 1e12, tree=tree, caches=caches, torch=torch.__version__)), flush=True)
    return 0


def _gradients(call, inputs: tuple, dout):
    """A call that runs ``call()`` and returns the gradients of ``inputs`` for output gradient ``dout``."""
    import torch

    return lambda: torch.autograd.grad(call(), inputs, dout)


def packed_row(tag: str, tree: str, D: int, causal: bool, docs: int) -> dict:
    """One packed case: 16k tokens in ``docs`` random documents (a fixed seed), ``H = 2048 / D``,
    with ``max_seqlen``; checked against the library's torch platform; no cuDNN row (``S`` in the
    row is ``-docs``)."""
    import torch
    import triton.testing as tt
    from documents import random_documents

    from kernelops import flash_attention

    tokens, H = 16384, 2048 // D
    gen = torch.Generator().manual_seed(0)
    lens, cu = random_documents(tokens, docs, gen)
    q, k, v = (torch.randn(tokens, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    kw = dict(causal=causal, cum_seqlens_q=cu, cum_seqlens_k=cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens))
    fn = lambda: flash_attention(q, k, v, **kw)  # noqa: E731
    err = (fn().float() - flash_attention(q, k, v, **kw, platform="torch").float()).abs().max().item()
    assert err < 2e-2, (tree, D, causal, docs, err)
    ms = [tt.do_bench(fn, warmup=25, rep=200, return_mode="median") for _ in range(2)]
    pairs = sum(n * (n + 1) // 2 if causal else n * n for n in lens)
    return dict(tag=tag, D=D, causal=causal, S=-docs, window=None, ms=ms, cudnn_ms=[], tflop=4 * H * D * pairs / 1e12,
                tree=tree, torch=torch.__version__)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
