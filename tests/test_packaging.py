"""The wheel holds every kernelops subpackage and the shipped pre-tuned caches."""

import pathlib
import shutil
import subprocess
import sys
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_wheel_holds_every_package_and_the_shipped_caches(tmp_path):
    # build from a fresh copy: an in-tree build would reuse a stale build/ folder
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    for name in ("pyproject.toml", "README.md"):
        src.mkdir(exist_ok=True)
        shutil.copy(REPO / name, src / name)
    for name in ("kernelops", "autotune_cache"):
        shutil.copytree(REPO / name, src / name, ignore=skip)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(src)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("kernelops-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = [p.relative_to(REPO).as_posix() for p in (REPO / "kernelops").rglob("__init__.py")]
    assert packages and all(p in names for p in packages), sorted(set(packages) - names)
    shipped = [p for p in (REPO / "autotune_cache").rglob("*") if p.is_file()]
    assert shipped, "autotune_cache/ should hold at least its README"
    for path in shipped:
        if path.suffix == ".json" or path.name == "README.md":
            assert "kernelops/autotune_cache/" + path.relative_to(REPO / "autotune_cache").as_posix() in names
