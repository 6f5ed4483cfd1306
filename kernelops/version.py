"""The package version: the one source that pyproject.toml and ``kernelops.__version__`` read."""

__version__ = "0.1.0"
