"""Import cost: ``import kernelops`` and the ``kernelops`` command's help and usage errors import
neither torch nor Triton; the public names load on first use. Each check runs in a fresh
interpreter (this one has imported everything already). No timing is asserted here: the import
times are measured with ``python -X importtime -c "import kernelops"``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("torch", "triton", "transformers")


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=300)


def _cli(*argv: str) -> dict:
    """Run ``kernelops.cli.main(argv)`` in a fresh interpreter: its exit code, output and which
    heavy modules it imported."""
    done = _python(f"""
        import contextlib, io, json, sys
        from kernelops.cli import main
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(sys.argv[1:])
            except SystemExit as exc:
                code = exc.code
        print(json.dumps({{"code": code, "out": out.getvalue(), "err": err.getvalue(),
                          "imported": [m for m in {HEAVY!r} if m in sys.modules]}}))
    """, *argv)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_import_kernelops_imports_neither_torch_nor_triton():
    done = _python(f"""
        import sys
        import kernelops
        assert kernelops.__version__
        print([m for m in {HEAVY!r} if m in sys.modules])
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_op_modules_import_no_triton():
    done = _python("""
        import sys
        from kernelops import flash_attention, scaled_dot_product_attention, attention, flash_attention_fp8
        import kernelops.modules, kernelops.nn
        print([m for m in ("triton", "torch._dynamo") if m in sys.modules])
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("argv", [
    ["--help"], ["demo", "--help"], ["info", "--help"], ["tune", "--help"], ["bench", "--help"], ["cache", "--help"],
    ["cache", "list", "--help"], ["cache", "import", "--help"],
])
def test_help_imports_neither_torch_nor_triton(argv):
    result = _cli(*argv)
    assert result["code"] == 0 and result["out"].startswith("usage: kernelops"), result
    assert result["imported"] == []


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: command"),
    (["nonsense"], "invalid choice: 'nonsense'"),
    (["tune"], "the following arguments are required: op"),
    (["tune", "flash_attention"], "one of the arguments --shapes --preset is required"),
    (["tune", "no_such_op", "--shapes", "B=1,S=64,Hq=2,D=16"], "no tuning support for op 'no_such_op'"),
    (["tune", "flash_attention", "--shapes", "B=x"], "--shapes: B must be an integer"),
    (["tune", "flash_attention", "--preset", "nope"], "unknown preset 'nope'"),
    (["tune", "flash_attention", "--preset", "llm", "--dtypes", "int3"], "unknown dtype 'int3'"),
    (["tune", "flash_attention", "--preset", "llm", "--head-dims", "7"], "the filters leave no spec to tune"),
    (["tune", "flash_attention", "--preset", "llm", "--resume-since", "2026-01-01"], "--resume-since needs --export"),
    (["tune", "flash_attention", "--preset", "llm", "--export", "x", "--resume-since", "soon"],
     "--resume-since: not an ISO date"),
    (["bench", "no_such_op", "--shapes", "B=1"], "invalid choice: 'no_such_op'"),
    (["bench", "flash_attention", "--shapes", "B=1,oops"], "--shapes: bad part 'oops'"),
    (["cache"], "the following arguments are required: {list,show,clear,export,import}"),
])
def test_usage_errors_import_neither_torch_nor_triton(argv, message):
    result = _cli(*argv)
    assert result["code"] == 2 and message in result["err"], result
    assert result["imported"] == []


def test_tune_dry_run_lists_specs_without_torch():
    result = _cli("tune", "flash_attention", "--shapes", "B=2,S=1k,Hq=8,Hkv=2,D=64,dtype=fp16,causal=1", "--dry-run")
    assert result["code"] == 0 and "1 spec(s)" in result["out"], result
    assert result["imported"] == []


def test_the_command_line_entry_points_run():
    """``python -m kernelops``, ``python -m kernelops.cli`` and (where installed) the console script."""
    commands = [[sys.executable, "-m", "kernelops"], [sys.executable, "-m", "kernelops.cli"]]
    script = shutil.which("kernelops")
    if script is not None:
        commands.append([script])
    for command in commands:
        done = subprocess.run(command + ["--help"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stdout.startswith("usage: kernelops"), (command, done.stderr)
        done = subprocess.run(command + ["tune"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and "required: op" in done.stderr, (command, done.stderr)
