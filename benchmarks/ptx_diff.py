"""Which kernels' sm_90 code differs between two source trees (no GPU needed).

Each tree's launchers are compiled offline for sm_90 by ``tests/kernels/sm90_compile_child.py``
(the same calls the sm_90 compile test makes), in a child process per tree; then each compiled
variant's PTX is compared with debug lines and labels (``.loc``, ``.file``, comments, ``$L__tmp``)
left out. A refactor that claims to leave the kernels as they were (a helper folded out of two
kernels, a branch moved) shows every variant ``same``; then the GPU results of the old tree hold
for the new one. Any ``DIFF`` needs the GPU tests.

    git archive <commit> kernelops tests | tar -x -C /tmp/old
    python benchmarks/ptx_diff.py /tmp/old .

Use the GPU's Triton (3.6 for the lent H100/H200 image) for the answer to carry over, e.g.
``PYTHONPATH=/tmp/t36/site`` with triton 3.6 installed there (``pip install --target``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

DUMP = """
import contextlib, io, json, re, runpy, sys
with contextlib.redirect_stdout(io.StringIO()):
    runpy.run_module("tests.kernels.sm90_compile_child", run_name="child")
from kernelops.kernels.common import offline_compile
from kernelops.kernels.flash_attention import (bwd, bwd_d256, bwd_fused, bwd_ws, decode, dropout, fwd, fwd_tma,
                                               fwd_ws, varlen)
out = {}
for module in (fwd, fwd_tma, fwd_ws, bwd, bwd_ws, bwd_fused, bwd_d256, decode, varlen, dropout):
    for name in dir(module):
        fn = getattr(module, name)
        if hasattr(fn, "device_caches") and hasattr(fn, "fn"):
            for i, kernel in enumerate(offline_compile.compiled_kernels(fn)):
                out[f"{module.__name__.rsplit('.', 1)[-1]}.{name}[{i}]"] = kernel.asm["ptx"]
json.dump(out, sys.stdout)
"""
DEBUG = re.compile(r"^\s*(\.loc|\.file|//).*$|^\$L__tmp\d+:$|\$L__tmp\d+", re.M)


def kernels_ptx(tree: str) -> dict[str, str]:
    """``{"module.kernel[variant]": ptx}`` compiled offline from ``tree``'s sources."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.abspath(tree), env.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, "-c", DUMP], cwd=tree, env=env, capture_output=True, text=True,
                         timeout=1800)
    if run.returncode:
        raise SystemExit(f"{tree}: the offline compile failed\n{run.stderr[-3000:]}")
    return json.loads(run.stdout)


def code(ptx: str) -> list[str]:
    """PTX without debug sections, debug lines, debug labels, comments and blank lines."""
    ptx = re.sub(r"\.section\s+\.debug.*", "", ptx, flags=re.S)
    lines = (re.sub(r"\s*//.*$", "", line) for line in DEBUG.sub("", ptx).splitlines())  # LLVM's block comments
    return [line for line in lines if line.strip()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", help="tree holding the old kernelops/ and tests/")
    p.add_argument("new", help="tree holding the new kernelops/ and tests/")
    args = p.parse_args(argv)
    old, new = kernels_ptx(args.old), kernels_ptx(args.new)
    differ = 0
    for name in sorted(set(old) | set(new)):
        if name not in old or name not in new:
            state = "only new" if name in new else "only old"
        else:
            state = "same" if code(old[name]) == code(new[name]) else "DIFF"
        differ += state != "same"
        print(f"{state:8s} {name}")
    print(f"{differ} of {len(set(old) | set(new))} variants differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
