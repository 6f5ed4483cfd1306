"""Experiment record (NOTES v23): the warp-specialised ping-pong forward beside v22 and cuDNN.

The kernel now lives in kernelops (kernels/flash_attention/fwd_ws.py; ``FwdParams.ws``); this
script times its two key-block choices beside v22 (`gluon_fwd.py`), the library's default call
and cuDNN in one run, and checks them against float64 SDPA first.

    python benchmarks/gluon_fwd_ws.py --check --bench --out DIR
    PYTHONPATH=<triton 3.6> python benchmarks/gluon_fwd_ws.py --offline
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import gluon_fwd  # noqa: E402

from kernelops.kernels.flash_attention.fwd_ws import flash_attention_fwd_ws  # noqa: E402


def ws_launch(q, k, v, causal=False, warmup_only=False, **cfg):
    return flash_attention_fwd_ws(q, k, v, softmax_scale=q.shape[-1] ** -0.5, causal=causal, warmup_only=warmup_only,
                                  **cfg)


CONFIGS = [dict(kv_blocksize=128, num_stages=2), dict(kv_blocksize=64, num_stages=3)]


def main(argv=None) -> int:
    return gluon_fwd.run(argv, __doc__.splitlines()[0], {f"ws{i}": (ws_launch, cfg) for i, cfg in enumerate(CONFIGS)},
                         "gluon_fwd_ws.json", bench_only={"v22": (gluon_fwd.gluon_attention_fwd, gluon_fwd.CONFIGS[0])})


if __name__ == "__main__":
    sys.exit(main())
