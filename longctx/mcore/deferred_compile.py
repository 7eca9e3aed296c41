"""Defer the `torch.compile` calls megatron-core makes while it is imported to the first call of each function.

megatron-core decorates its fused kernels with `torch.compile` at import time; each such call imports
TorchDynamo and Inductor (about 40 % of a worker's start-up on the CPU), although `torch.compile` itself
compiles only when the function is first called, and the CPU trainer calls none of them. Wrapped here, a
decorated function compiles on its first call exactly as before; one never called costs nothing.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch


def _deferred(real: Callable[..., Any]) -> Callable[..., Any]:
    def compile_later(model: Any = None, **options: Any) -> Any:
        if model is None:  # used as `@torch.compile(...)`: the decorator
            return lambda fn: compile_later(fn, **options)
        if isinstance(model, torch.nn.Module):  # a module keeps torch.compile's own wrapper
            return real(model, **options)
        compiled: Callable[..., Any] | None = None

        @functools.wraps(model)
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal compiled
            if compiled is None:
                compiled = real(model, **options)
            return compiled(*args, **kwargs)

        return call

    return compile_later


@contextlib.contextmanager
def compile_on_first_call() -> Iterator[None]:
    """While the block runs (megatron-core's import), `torch.compile` defers to each function's first call."""
    real = torch.compile
    torch.compile = _deferred(real)  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = real  # type: ignore[assignment]
