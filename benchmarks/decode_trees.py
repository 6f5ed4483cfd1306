"""Before/after of the decode launcher on one GPU: the same calls, kernelops imported from a given tree.

Export the old tree beside this one and alternate the runs, so drift between them shows as a spread:

    git archive <commit> kernelops autotune_cache | tar -x -C /tmp/old
    for i in 1 2; do
        python benchmarks/decode_trees.py /tmp/old old >> ab.jsonl
        python benchmarks/decode_trees.py .        new >> ab.jsonl
    done
    python benchmarks/decode_trees.py --table ab.jsonl

Optional ``NAME=VALUE`` arguments set :mod:`decode` module switches first. Each line is JSON: the
case (bf16, Sq=1, Hq=32, Hkv=8, not causal; BSHD K/V), microseconds of two medians under CUDA graphs
(``triton.testing.do_bench_cudagraph``), the plan (``decode.decode_splits``' ``(num_splits,
split_len, key tile, programs)``) and cuDNN's time in the same process. Each output is checked
against SDPA in float32 first. ``--table`` prints per case the best time of each tag and its ratio
to cuDNN's best (K/V read rate, kernelops over cuDNN).
"""

from __future__ import annotations

import ast
import collections
import json
import pathlib
import sys

#: ``(D, B, Sk)``: the balanced plans' rows of NOTES v60-v61 (B = 17-48) and uniform ones beside them
CASES = ([(128, B, Sk) for Sk in (2048, 4096) for B in (16, 17, 18, 19, 20, 24)]
         + [(128, B, 4096) for B in (40, 48)] + [(128, B, Sk) for Sk in (16384, 32768) for B in (17, 24, 40)]
         + [(64, B, Sk) for Sk in (2048, 4096) for B in (17, 18, 20)])


def table(path: str) -> int:
    best = collections.defaultdict(dict)
    for line in open(path):
        r = json.loads(line)
        case = best[(r["D"], r["B"], r["Sk"])]
        case[r["tag"]] = min(case.get(r["tag"], 1e30), *r["us"])
        case["cudnn"] = min(case.get("cudnn", 1e30), *r["cudnn_us"])
        case.setdefault("plans", {})[r["tag"]] = r["plan"]
    for (D, B, Sk), case in best.items():
        tags = [t for t in case if t not in ("cudnn", "plans")]
        print(f"D={D:3d} B={B:2d} Sk={Sk:6d} cudnn {case['cudnn']:7.1f} us  " + "  ".join(
            f"{t} {case[t]:7.1f} us ({case['cudnn'] / case[t]:.3f}x) {case['plans'][t]}" for t in tags))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--table"]:
        return table(argv[1])
    tree, tag, settings = argv[0], argv[1], argv[2:]
    from trees import import_tree

    import_tree(tree)
    import torch
    import triton.testing as tt

    from kernelops.kernels.flash_attention import decode  # (before decode_splits puts this tree on the path)

    sys.path.insert(1, str(pathlib.Path(__file__).resolve().parent))
    from decode_splits import cudnn_graph_ms

    for item in settings:
        name, value = item.split("=", 1)
        setattr(decode, name, ast.literal_eval(value))
    big = 1 << 30
    for D, B, Sk in CASES:
        torch.manual_seed(0)
        q = torch.randn(B, 1, 32, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, Sk, 8, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        fn = lambda: decode.flash_attention_decode(  # noqa: E731, B023
            q, k, v, softmax_scale=D ** -0.5, win_left=big, win_right=big, softcap=None,  # noqa: B023
            kv_blocksize=8192 // D, num_warps=4, num_stages=3)  # noqa: B023
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2).float() for t in (q, k, v)), enable_gqa=True).transpose(1, 2)
        err = (fn()[0].float() - ref).abs().max().item()
        assert err < 2e-2, (tree, D, B, Sk, err)
        us = [tt.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3 for _ in range(2)]
        print(json.dumps(dict(tag=tag, D=D, B=B, Sk=Sk, us=us, cudnn_us=[cudnn_graph_ms(q, k, v) * 1e3],
                              plan=decode.decode_splits(q, k, big, big, 8192 // D, 0, 3)[2:], tree=tree,
                              settings=settings, torch=torch.__version__)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
