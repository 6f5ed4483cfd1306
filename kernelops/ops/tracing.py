"""Helpers for code that torch.compile traces, importable without loading torch._dynamo.

``torch.compiler.assume_constant_result`` imports ``torch._dynamo`` (and with it Triton, about
1.7 s on a CPU machine) the moment it decorates a function; kernelops decorates functions when its
modules load, and ``import kernelops`` must stay cheap. :func:`assume_constant_result` marks a
function the way torch's decorator does, without that import (tests/ops/test_tracing.py checks
that the mark is still the one torch sets).
"""

from __future__ import annotations

#: the attribute torch._dynamo.assume_constant_result sets on the function it marks
DYNAMO_CONSTANT_MARK = "_dynamo_marked_constant"


def assume_constant_result(fn):
    """Mark ``fn`` so that torch.compile evaluates it outside the trace and keeps its result as a
    constant of the graph, as ``torch.compiler.assume_constant_result`` does."""
    setattr(fn, DYNAMO_CONSTANT_MARK, True)
    return fn
