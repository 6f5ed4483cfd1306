"""The benchmark suite: one user-facing benchmark per op (``benchmarks/<op>.py``), the machinery
benchmarks (dispatch overhead, host time, first call) and the harness they all use.

``python -m benchmarks --list`` lists them; ``python -m benchmarks [name ...]`` runs them (all of
them without names). Each writes ``benchmarks/results/<DEVICE>/<name>.json`` and a plot.

A benchmark is any module here whose name does not start with ``_`` and is not ``harness``; it
defines ``main(argv) -> int``, a one-line docstring summary, and ``KIND = "op"`` or
``"machinery"``. Discovery reads the files (no import), so listing needs neither torch nor a GPU.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

HERE = pathlib.Path(__file__).resolve().parent
NOT_BENCHMARKS = {"harness"}


@dataclass(frozen=True)
class Benchmark:
    name: str
    kind: str
    summary: str

    @property
    def module(self) -> str:
        return f"{__name__}.{self.name}"


def discover() -> list[Benchmark]:
    """Every benchmark module, ops first, each kind in name order."""
    found = []
    for path in sorted(HERE.glob("*.py")):
        name = path.stem
        if name.startswith("_") or name in NOT_BENCHMARKS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        doc = (ast.get_docstring(tree) or "").strip()
        kind = "op"
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "KIND" for t in node.targets) \
                    and isinstance(node.value, ast.Constant):
                kind = str(node.value.value)
        found.append(Benchmark(name, kind, doc.splitlines()[0] if doc else ""))
    return sorted(found, key=lambda b: (b.kind != "op", b.name))
