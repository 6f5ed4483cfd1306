"""The tree-comparison scripts' import of kernelops from an exported tree (``compare_trees.py``,
``decode_trees.py``, ``fwd_trees.py``).

Export the shipped caches with the package: ``git archive <commit> kernelops autotune_cache | tar
-x -C /tmp/old``. Without ``autotune_cache/`` beside the package, the old tree's calls miss every
pre-tuned entry and run the heuristic's configs while the new tree runs the shipped ones, so the
A/B measures the cache, not the change (NOTES v75 found a D=64 GQA row 4% apart that way).
"""

from __future__ import annotations

import os
import pathlib
import sys


def import_tree(tree: str) -> str:
    """Put ``tree`` first on the path, import kernelops from it, and return the folder of shipped
    caches it reads: the tree's own ``autotune_cache/`` (or ``$KERNELOPS_PRETUNED_DIR``); exits
    when kernelops comes from elsewhere or the tree has no caches."""
    root = pathlib.Path(tree).resolve()
    sys.path.insert(0, str(root))
    import kernelops
    from kernelops.ops.pretuned import PRETUNED_DIR_ENV, default_pretuned_root

    if not pathlib.Path(kernelops.__file__).resolve().is_relative_to(root):
        raise SystemExit(f"kernelops came from {kernelops.__file__}, not from {root}")
    caches = default_pretuned_root().resolve()
    if not os.environ.get(PRETUNED_DIR_ENV) and not (caches.is_relative_to(root) and caches.is_dir()):
        raise SystemExit(f"{root} has no autotune_cache/ (export it with the package: git archive <commit> "
                         f"kernelops autotune_cache)")
    return str(caches)
