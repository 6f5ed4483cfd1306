"""kernelops/ops/ is the machinery below everything: none of its modules imports the package face
(``kernelops``), the ops (``kernelops.modules``), their kernels, the tuning tools or the command
line, at module level or inside a function (read from the source with ast, not by importing)."""

from __future__ import annotations

import ast
import pathlib

import pytest

OPS = pathlib.Path(__file__).resolve().parents[2] / "kernelops" / "ops"
FORBIDDEN = ("kernelops.modules", "kernelops.kernels", "kernelops.tuning", "kernelops.cli")


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every import in ``path``; ``from kernelops import x`` gives
    ``kernelops`` (the face) unless ``x`` is a subpackage named in FORBIDDEN or ``ops``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against kernelops.ops
                base = ["kernelops", "ops"][: max(0, 2 - (node.level - 1))]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            if module == "kernelops":
                found += [(node.lineno, f"kernelops.{alias.name}" if alias.name in ("ops", "version")
                           or f"kernelops.{alias.name}" in FORBIDDEN else "kernelops") for alias in node.names]
            else:
                found.append((node.lineno, module))
    return found


def _bad(module: str) -> bool:
    return module == "kernelops" or any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


@pytest.mark.parametrize("path", sorted(OPS.glob("*.py")), ids=lambda p: p.name)
def test_ops_module_imports_nothing_above_it(path):
    bad = [f"line {line}: {module}" for line, module in _imports(path) if _bad(module)]
    assert not bad, f"{path.name} imports above kernelops.ops: {bad}"


def test_the_check_sees_each_kind_of_import(tmp_path):
    path = tmp_path / "sample.py"
    path.write_text("import kernelops\nfrom kernelops import __version__\nfrom kernelops import modules\n"
                    "def f():\n    import kernelops.tuning.runner\n    from kernelops.cli import main\n"
                    "from .. import kernels\nfrom kernelops.version import __version__\n"
                    "from kernelops.ops import keys\nfrom . import cache\n")
    assert sorted(m for _, m in _imports(path) if _bad(m)) == sorted([
        "kernelops", "kernelops", "kernelops.modules", "kernelops.tuning.runner", "kernelops.cli", "kernelops.kernels"])
