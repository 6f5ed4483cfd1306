"""The executor's host overhead: each op's public function against its ready launcher.

On a tiny shape the GPU finishes each kernel long before the host issues the next call, so the
wall time per call is the host's. Per op this times, in microseconds per call:

- ``launcher``: the ready launcher the executor remembers for the call's signature
  (``op.launcher(inputs, config)``), called directly: the floor;
- ``public``: the public function on a repeated call (the executor's hot path: one signature
  tuple, one dict lookup, then the launcher);
- ``public_cfg``: the public function with an explicit ``cfg=`` (the selector chain every call);
- ``fwdbwd``: forward and backward through autograd (``out.backward(dout)``), for scale.

The executor's overhead is ``public - launcher``; DESIGN.md's target is at most 5 us. Host
timings drift with the machine's load, so the rows alternate over several rounds and each keeps
its median.

    python -m benchmarks dispatch_overhead [--calls 5000] [--rounds 7]
"""

from __future__ import annotations

import pathlib
import statistics
import sys

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import harness as H  # noqa: E402

KIND = "machinery"
OP = "dispatch_overhead"
TARGET_US = 5.0


def operation(name: str):
    """The Operation instance of op ``name`` (found among ``kernelops.modules``' classes, so the
    benchmark does not depend on what the package exports it as)."""
    import kernelops.modules as modules
    from kernelops.ops.operation import Operation

    for value in vars(modules).values():
        if isinstance(value, type) and issubclass(value, Operation) and value is not Operation:
            try:
                op = value()
            except TypeError:
                continue
            if getattr(op, "name", None) == name:
                return op
    raise LookupError(f"no Operation named {name!r} in kernelops.modules")


def flash_attention_case():
    """``(op name, shape text, kwargs, public call, grad call)`` for a tiny causal bf16 call."""
    import torch

    from kernelops import flash_attention

    q, k, v = (torch.randn(1, 128, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    kwargs = {"query": q, "key": k, "value": v, "causal": True}
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    dout = torch.randn_like(q)

    def fwdbwd():
        flash_attention(qg, kg, vg, causal=True).backward(dout)
        qg.grad = kg.grad = vg.grad = None

    return ("flash_attention", "B=1 S=128 H=2 D=64 bf16 causal", kwargs,
            lambda cfg=None: flash_attention(q, k, v, causal=True, cfg=cfg), fwdbwd)


#: one entry per op; a new op adds its case here
CASES = {"flash_attention": flash_attention_case}


def per_call_us(fn, calls: int) -> float:
    return H.wall_us(fn, calls=calls, rounds=1, warmup=50)


def main(argv=None) -> int:
    p = H.parser(__doc__, OP)
    p.add_argument("--calls", type=int, default=5000, help="calls per row (split over the rounds)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--ops", nargs="+", choices=list(CASES), default=list(CASES))
    args = p.parse_args(argv)
    if (code := H.require_cuda()):
        return code
    H.set_autotune_policy(False)
    from kernelops.ops import default_executor

    calls = max(50, (args.calls // 10 if args.quick else args.calls) // args.rounds)
    results = H.Results.open(OP, args.out)
    results.start_run(H.metadata(), calls=calls * args.rounds, rounds=args.rounds)
    print(f"{H.run_title(results.data['runs'][results.run])} -> {results.path}")
    for name in args.ops:
        op_name, shape, kwargs, public, fwdbwd = CASES[name]()
        op = operation(op_name)
        executor = default_executor()
        inputs = op.prepare(**kwargs)
        cfg = executor.resolve(op, inputs)  # the config a call without cfg= gets
        launch = op.launcher(inputs, cfg)
        rows = {"public": lambda: public(), "public_cfg": lambda: public(cfg)}
        if launch is not None:
            rows = {"launcher": lambda: launch(kwargs), **rows}
        else:
            print(f"{op_name}: no ready launcher for this call (op.launcher returned None); timing op.run")
            rows = {"op.run": lambda: op.run(inputs, cfg), **rows}
        rounds = {row: [] for row in rows}
        for _ in range(args.rounds):  # alternate, so every row sees the same conditions
            for row, fn in rows.items():
                rounds[row].append(per_call_us(fn, calls))
        measured = {row: statistics.median(times) for row, times in rounds.items()}
        measured["fwdbwd"] = per_call_us(fwdbwd, max(20, calls // 5))
        for row, us in measured.items():
            results.add({"case": op_name, "shape": shape, "impl": row, "per_call_us": us})
            print(f"{op_name:18s} {row:12s} {us:9.1f} us/call")
        base = measured.get("launcher")
        if base is not None:
            over = measured["public"] - base
            results.add({"case": op_name, "shape": shape, "impl": "overhead", "per_call_us": over})
            verdict = "within" if over <= TARGET_US else "over"
            print(f"{op_name}: executor overhead on a repeated call {over:.1f} us "
                  f"({verdict} the {TARGET_US:g} us target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
