"""Host time of eager calls: kernelops beside cuDNN SDPA at short, host-bound shapes.

At short and medium sequence lengths a training step's speed is set by the host, not the GPU.
Per shape, implementation and mode this measures:

- ``host_us``: microseconds to *issue* one call while a spin kernel holds the GPU, so nothing
  waits on the device (a call that synchronises shows up as milliseconds);
- ``wall_us``: wall-clock microseconds per call of a loop of calls (what a training loop sees);
- ``gpu_us``: the call's kernels' device time (torch.profiler), for scale.

Modes: ``fwd`` (no grad), ``fwdbwd_sum`` (``out.sum().backward()``: a stride-0 gradient, as in
many losses and tests) and ``fwdbwd_dout`` (``out.backward(dout)`` with a dense gradient); the
inputs' gradients are dropped after each call. Shapes (bf16, causal): B=1 S=128 H=8 D=64 and
B=4 S=512 H=16 D=128 (``--shapes B=2,S=1024,H=16,D=128`` adds others). kernelops runs BSHD, SDPA
BHSD, each on its own contiguous inputs.

    python -m benchmarks host_time [--shapes B=1,S=128,H=8,D=64 ...] [--no-profile]
"""

from __future__ import annotations

import pathlib
import sys

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import harness as H  # noqa: E402

KIND = "machinery"
OP = "host_time"
SHAPES = ("B=1,S=128,H=8,D=64", "B=4,S=512,H=16,D=128")
MODES = ("fwd", "fwdbwd_sum", "fwdbwd_dout")
IMPLS = ("kernelops", "sdpa_cudnn")


def parse_shape(text: str) -> dict[str, int]:
    """``"B=1,S=128,H=8,D=64"`` -> ``{"B": 1, "S": 128, "H": 8, "D": 64}``."""
    shape = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        shape[name.strip()] = int(value)
    if set(shape) != {"B", "S", "H", "D"}:
        raise ValueError(f"a shape names B, S, H and D: {text!r}")
    return shape


def make_call(impl: str, mode: str, B: int, S: int, heads: int, D: int):
    """One call of ``impl`` in ``mode`` on fresh random bf16 inputs (gradients dropped after it)."""
    import torch

    from kernelops import flash_attention

    shape = (B, S, heads, D) if impl == "kernelops" else (B, heads, S, D)
    grad = mode != "fwd"
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=grad) for _ in range(3))
    fn = (lambda a, b, c: flash_attention(a, b, c, causal=True)) if impl == "kernelops" else H.sdpa(impl, causal=True)
    if mode == "fwd":
        def call():
            with torch.no_grad():
                return fn(q, k, v)
        return call
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def call():
        out = fn(q, k, v)
        if mode == "fwdbwd_sum":
            out.sum().backward()
        else:
            out.backward(dout)
        q.grad = k.grad = v.grad = None
    return call


def main(argv=None) -> int:
    p = H.parser(__doc__, OP)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), help="B=..,S=..,H=..,D=.. (bf16, causal)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--no-profile", action="store_true", help="skip the profiler's device time (gpu_us)")
    args = p.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shapes]
    if (code := H.require_cuda()):
        return code
    H.set_autotune_policy(False)
    results = H.Results.open(OP, args.out)
    results.start_run(H.metadata())
    print(f"{H.run_title(results.data['runs'][results.run])} -> {results.path}")
    calls = 20 if args.quick else 100
    for shape in shapes:
        for mode in args.modes:
            for impl in args.impls:
                row = {"case": "host_time", "impl": impl, "mode": mode, "dtype": "bf16", "causal": True, **shape}
                try:
                    call = make_call(impl, mode, shape["B"], shape["S"], shape["H"], shape["D"])
                    row["wall_us"] = H.wall_us(call, calls=calls)
                    row["host_us"] = H.host_us(call)
                    if not args.no_profile:
                        row["gpu_us"] = H.gpu_us(call)
                except Exception as exc:  # noqa: BLE001 - reported, not fatal
                    row["error"] = H.error_text(exc)
                results.add(row)
                text = " ".join(f"{k}={shape[k]}" for k in "BSHD")
                print(f"{text:22s} {mode:12s} {impl:11s} " + (
                    f"host {row['host_us']:8.1f} us  wall {row['wall_us']:8.1f} us"
                    + (f"  gpu {row['gpu_us']:8.1f} us" if "gpu_us" in row else "") if "error" not in row
                    else row["error"]), flush=True)
    mine = results.this_run()
    body = []
    for shape in shapes:
        for mode in args.modes:
            cells = {r["impl"]: r for r in mine if r["mode"] == mode and all(r[k] == shape[k] for k in "BSHD")}
            ko, cu = cells.get("kernelops", {}), cells.get("sdpa_cudnn", {})
            body.append([" ".join(f"{k}{shape[k]}" for k in "BSHD"), mode, ko.get("host_us"), cu.get("host_us"),
                         ko.get("wall_us"), cu.get("wall_us"), ko.get("gpu_us"), cu.get("gpu_us")])
    print("\nper call, microseconds (kernelops / cuDNN SDPA):")
    print(H.table(["shape", "mode", "host kernelops", "host cuDNN", "wall kernelops", "wall cuDNN", "gpu kernelops",
                   "gpu cuDNN"], body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
