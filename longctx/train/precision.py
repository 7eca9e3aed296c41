"""Mixed precision as Megatron-LM does it: bf16 compute, fp32 master weights and fp32 gradients.

In bf16 the model holds bf16 parameters (norms included, as Megatron-LM's bf16 module and its
checkpoints do). Each has an fp32 master that the optimizer steps and an fp32 gradient that every
micro batch's backward adds into (a post-accumulate hook moves the bf16 gradient there at once, so
nothing accumulates in bf16); the gradients are reduced across ranks and clipped in fp32, and after
the step the masters are rounded into the model. Stepping bf16 weights directly loses every update
smaller than half a bf16 ulp: at lr 1e-5 on weights of magnitude 0.02–0.04 most never move.

In fp32 the masters are the model's own parameters and nothing is copied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate


class MainParams:
    """The parameters the optimizer steps (`masters`), aligned with the model's (`model_params`)."""

    def __init__(self, model_params: Iterable[torch.nn.Parameter]) -> None:
        self.model_params = [p for p in model_params if p.requires_grad]
        self.mixed = any(p.dtype != torch.float32 for p in self.model_params)
        if not self.mixed:
            self.masters = self.model_params
            return
        self.masters = [torch.nn.Parameter(p.detach().float().clone()) for p in self.model_params]
        for p, master in zip(self.model_params, self.masters, strict=True):
            p.register_post_accumulate_grad_hook(_accumulate_into(master))

    def zero_grad(self) -> None:
        for p in self.masters:
            p.grad = None
        if self.mixed:
            for p in self.model_params:
                p.grad = None

    def grads(self) -> list[torch.Tensor]:
        """The fp32 gradients of the masters that received one."""
        return [p.grad for p in self.masters if p.grad is not None]

    def clip_grad_norm(self, max_norm: float, tp_group: dist.ProcessGroup | None) -> float:
        """Clip the masters' gradients to `max_norm` (0: no clipping) by the norm of the whole model's
        gradient; returns that norm. Under TP each rank holds a shard of the split weights and a copy of
        the others (norms, biases): the squares of the shards are summed over the TP group, each copy
        counted once (on TP rank 0), as Megatron-LM's clip_grad_by_total_norm_fp32 does. A norm of one
        rank's own gradients would clip each shard by a different factor."""
        counted = [
            m.grad
            for p, m in zip(self.model_params, self.masters, strict=True)
            if m.grad is not None
            and (tp_group is None or param_is_not_tensor_parallel_duplicate(p, tp_group))
        ]
        grads = self.grads()
        device = grads[0].device if grads else torch.device("cpu")
        squares = torch.zeros((), dtype=torch.float32, device=device)
        for g in counted:
            squares += g.float().square().sum()
        if tp_group is not None and dist.get_world_size(tp_group) > 1:
            on = torch.device("cuda") if dist.get_backend(tp_group) == "nccl" else torch.device("cpu")
            reduced = squares.to(on)
            dist.all_reduce(reduced, group=tp_group)
            squares = reduced.to(device)
        norm = float(squares.sqrt())
        coef = max_norm / (norm + 1e-6)
        if max_norm > 0 and coef < 1.0:
            for g in grads:
                g.mul_(coef)
        return norm

    def copy_to_model(self) -> None:
        """Round the masters into the model's parameters (after each optimizer step)."""
        if not self.mixed:
            return
        with torch.no_grad():
            for p, master in zip(self.model_params, self.masters, strict=True):
                p.copy_(master)

    def set_masters(self, values: Iterable[tuple[torch.nn.Parameter, torch.Tensor]]) -> None:
        """Masters (and the model) from fp32 values, e.g. a checkpoint's optimizer copy of each."""
        with torch.no_grad():
            for master, value in values:
                master.copy_(value.to(master.dtype))
        self.copy_to_model()

    def refresh_from_model(self) -> None:
        """Masters from the model's weights, after weights were loaded into the model itself."""
        if not self.mixed:
            return
        with torch.no_grad():
            for p, master in zip(self.model_params, self.masters, strict=True):
                master.copy_(p.float())


def _accumulate_into(master: torch.nn.Parameter) -> Callable[[torch.Tensor], None]:
    def hook(p: torch.Tensor) -> None:
        grad = p.grad
        if grad is None:
            return
        if master.grad is None:
            master.grad = grad.float()
        else:
            master.grad.add_(grad)
        p.grad = None  # the bf16 gradient is never accumulated into

    return hook
