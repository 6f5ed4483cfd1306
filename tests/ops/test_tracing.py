"""kernelops.ops.tracing marks functions as torch's assume_constant_result does, without importing
torch._dynamo when kernelops loads."""

import torch

from kernelops.ops.tracing import DYNAMO_CONSTANT_MARK, assume_constant_result


def test_the_mark_is_the_one_torch_sets():
    def ours():
        return 1

    def theirs():
        return 1

    assume_constant_result(ours)
    torch.compiler.assume_constant_result(theirs)
    assert vars(theirs) == {DYNAMO_CONSTANT_MARK: True}
    assert vars(ours) == vars(theirs)


def test_a_marked_function_is_a_constant_of_the_compiled_graph():
    calls = []

    @assume_constant_result
    def scale() -> float:
        calls.append(1)
        return 3.0

    def f(x):
        return x * scale()

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(5, dtype=torch.float64)
    torch.testing.assert_close(compiled(x), x * 3.0, rtol=0, atol=0)
    assert calls, "the marked function ran outside the trace"
