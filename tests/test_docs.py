"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict``, it mentions
every name kernelops exports, and the code blocks marked ``<!-- test: run -->`` run as written."""

import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: an HTML comment (invisible on the site) right before a ```python block marks it runnable
RUNNABLE = re.compile(r"<!-- test: run -->\s*\n```python\n(.*?)\n```", re.S)


def _user_pages() -> list[pathlib.Path]:
    """Every page but the design notes (which record decisions, not usage)."""
    return sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).as_posix() != "design.md")


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (pip install mkdocs, or the [docs] extra)")
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert (site / "index.html").is_file()
    for page in _user_pages():  # every page is in the nav and was built
        built = site / page.relative_to(DOCS).with_suffix("") / "index.html"
        if page.name == "index.md":
            built = site / page.relative_to(DOCS).with_name("index.html")
        assert built.is_file(), f"{page.relative_to(ROOT)} was not built to {built.relative_to(site)}"


def test_every_public_name_is_documented():
    import kernelops

    text = "\n".join(p.read_text(encoding="utf-8") for p in _user_pages())
    missing = [name for name in kernelops.__all__ if not re.search(rf"\b{re.escape(name)}\b", text)]
    assert not missing, f"kernelops.__all__ names not mentioned anywhere in docs/: {missing}"


def test_every_image_is_used_and_exists():
    pages = {p: p.read_text(encoding="utf-8") for p in _user_pages()}
    used = set()
    for page, text in pages.items():
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", text):
            path = (page.parent / target).resolve()
            assert path.is_file(), f"{page.relative_to(ROOT)} shows a missing image {target}"
            used.add(path)
    unused = [p.relative_to(ROOT) for p in (DOCS / "img").glob("*") if p.resolve() not in used]
    assert not unused, f"images in docs/img that no page shows: {unused}"


def _runnable_pages():
    return [p for p in _user_pages() if RUNNABLE.search(p.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("page", _runnable_pages(), ids=lambda p: p.relative_to(DOCS).as_posix())
def test_marked_examples_run(page, capsys):
    """The blocks of one page run in order in one namespace (later blocks use earlier names)."""
    namespace = {"__name__": "__docs__"}
    for i, code in enumerate(RUNNABLE.findall(page.read_text(encoding="utf-8"))):
        try:
            exec(compile(code, f"{page.relative_to(ROOT)} [block {i}]", "exec"), namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - name the block in the failure
            pytest.fail(f"{page.relative_to(ROOT)}, runnable block {i} failed: {type(exc).__name__}: {exc}\n{code}")
