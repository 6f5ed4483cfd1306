"""Test set-up shared by the whole suite.

* Without CUDA the Triton kernels run under the interpreter: TRITON_INTERPRET must be set before
  triton decorates the kernels, so it is set here, before anything imports kernelops.
* Every test session gets its own empty cache folder, and autotuning is off unless a test turns
  it on, so tests never read or write the user's cache.
* ``@pytest.mark.gpu`` tests skip without CUDA.
"""

import atexit
import os
import shutil
import tempfile

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if "KERNELOPS_CACHE_DIR" not in os.environ:  # xdist workers inherit the controller's folder
    _cache_dir = tempfile.mkdtemp(prefix="kernelops-test-cache-")
    os.environ["KERNELOPS_CACHE_DIR"] = _cache_dir
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
os.environ.setdefault("KERNELOPS_AUTOTUNE", "never")

import pytest  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
