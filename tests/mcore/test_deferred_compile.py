"""The worker's import of megatron-core defers each `torch.compile` to the function's first call."""

from __future__ import annotations

import torch

from longctx.mcore.deferred_compile import compile_on_first_call


def test_a_function_compiles_on_its_first_call_and_a_module_at_once() -> None:
    real = torch.compile
    calls: list[str] = []

    def fused(x: torch.Tensor) -> torch.Tensor:
        calls.append("traced")
        return x * 2 + 1

    with compile_on_first_call():
        assert torch.compile is not real
        as_call = torch.compile(fused, backend="eager")
        as_decorator = torch.compile(backend="eager")(fused)
        module = torch.compile(torch.nn.Linear(2, 2), backend="eager")
    assert torch.compile is real
    assert calls == [] and as_call.__wrapped__ is fused and as_decorator.__name__ == "fused"
    assert isinstance(module, torch._dynamo.eval_frame.OptimizedModule)
    x = torch.arange(4.0)
    assert torch.equal(as_call(x), x * 2 + 1) and torch.equal(as_decorator(x), x * 2 + 1)
    assert calls  # dynamo traced the function on its first call
