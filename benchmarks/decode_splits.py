"""Split count of the split-KV decode kernel against its K/V read bandwidth, beside cuDNN (GPU).

bf16, Sq=1, Hq=32, Hkv=8, D=128, not causal, for B in {1, 2, 4, 8, 16, 32} and Sk in {4k, 32k,
128k} (B * Sk up to 1M keys). Every call is timed inside a CUDA graph
(``triton.testing.do_bench_cudagraph``, median), so host time is left out: the kernels' own
bandwidth, bytes of K and V read once over the time. Per row: SDPA's cuDNN backend, the decode
launcher (``kernels/flash_attention/decode.py``) at 64-key tiles, 4 warps, 3 stages over a range of
``num_splits``, and at the rule's count (:func:`decode.split_plan`) two other tiles.

    python benchmarks/decode_splits.py --out benchmarks/results

The evidence of NOTES v44 (the one-wave split rule): ``results/NVIDIA_H200/decode_splits_ab.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

HQ, HKV, D = 32, 8, 128
SPLITS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 33, 48, 64)
OTHER_TILES = ((128, 4, 3), (64, 4, 4))  # (kv_blocksize, num_warps, num_stages) tried at the rule's count


def cudnn_graph_ms(q, k, v) -> float:
    """SDPA's cuDNN backend on BSHD ``q, k, v`` (``enable_gqa``), median ms inside a CUDA graph."""
    import triton.testing as tt
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return tt.do_bench_cudagraph(lambda: scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), rep=100,
                                     return_mode="median")


def save_rows(out_dir: str, name: str, sms: int, rows: list) -> None:
    """Write ``<out_dir>/<DEVICE>/<name>`` with the run's versions, SM count and rows."""
    import triton

    from kernelops.ops.device import device_info

    device = device_info("cuda").name
    out = pathlib.Path(out_dir) / device
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps({"device": device, "torch": torch.__version__, "triton": triton.__version__,
                                        "sms": sms, "rows": rows}, indent=1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    import triton.testing as tt

    from kernelops.kernels.common.host import num_sms
    from kernelops.kernels.flash_attention.decode import flash_attention_decode, split_plan

    dev = torch.device("cuda")
    sms = num_sms(dev, 4)
    big = 1 << 30
    rows = []
    for B in (1, 2, 4, 8, 16, 32):
        for Sk in (4096, 32768, 131072):
            if B * Sk > 8 * 131072:
                continue
            q = torch.randn(B, 1, HQ, D, device=dev, dtype=torch.bfloat16)
            k, v = (torch.randn(B, Sk, HKV, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
            tbps = lambda ms: 2 * k.numel() * 2 / ms / 1e9  # noqa: B023, E731
            ms = cudnn_graph_ms(q, k, v)
            rule = split_plan(B * HKV, Sk, 64, 0, sms)[0]
            row = dict(B=B, Sk=Sk, cudnn=tbps(ms), rule=rule)
            runs = [(s, (64, 4, 3)) for s in sorted({*SPLITS, rule}) if B * HKV * s <= 16 * sms and s <= Sk // 128]
            for s, (n, w, st) in runs + [(rule, tiles) for tiles in OTHER_TILES]:
                fn = lambda: flash_attention_decode(  # noqa: B023, E731
                    q, k, v, softmax_scale=D ** -0.5, win_left=big, win_right=big, softcap=None,  # noqa: B023
                    kv_blocksize=n, num_warps=w, num_stages=st, num_splits=s)  # noqa: B023
                row[f"s{s}_{n}_{w}_{st}"] = tbps(tt.do_bench_cudagraph(fn, rep=100, return_mode="median"))
            rows.append(row)
            swept = {key: val for key, val in row.items() if key.endswith("_64_4_3")}
            best = max(swept, key=swept.get)
            print(f"B={B} Sk={Sk} cudnn {row['cudnn']:.2f} TB/s | rule s={rule} {row[f's{rule}_64_4_3']:.2f} | "
                  f"best {best} {swept[best]:.2f} | " + " ".join(f"{key[1:].split('_')[0]}:{val:.2f}"
                                                                for key, val in swept.items()), flush=True)
    save_rows(args.out, "decode_splits_ab.json", sms, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
