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

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import MegatronModule

from longctx.errors import TrainError
from longctx.mcore.checkpoint import load_model_weights


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

    def set_masters_from_state(self, model: torch.nn.Module, loaded: Mapping[str, Any]) -> None:
        """Masters from the fp32 tensors of a loaded `fp32_template`, the model rounded from them."""
        name_of = {id(p): name for name, p in model.named_parameters()}
        with torch.no_grad():
            for p, master in zip(self.model_params, self.masters, strict=True):
                entry = loaded.get(name_of[id(p)])
                value = entry.data if isinstance(entry, (ShardedTensor, ShardedTensorFactory)) else entry
                # the load may leave a layer's tensor with the stacked-layer axis in front (1, …)
                if value is None or value.numel() != p.numel():
                    raise TrainError(f"no fp32 value of {name_of[id(p)]} in the loaded weights", where="load")
                master.copy_(value.reshape(p.shape))
        self.copy_to_model()


def fp32_template(sharded: Mapping[str, Any]) -> dict[str, Any]:
    """A model's sharded state dict with every tensor to be loaded in fp32 (NaN until loaded): the load
    fills them with the stored values, unrounded, wherever the model itself is bf16."""
    out: dict[str, Any] = {}
    for key, sh in sharded.items():
        if isinstance(sh, ShardedTensor):
            data = torch.full_like(sh.data, float("nan"), dtype=torch.float32)
            out[key] = dataclasses.replace(sh, data=data, dtype=torch.float32)
        elif isinstance(sh, ShardedTensorFactory):  # its pieces are views of `data`: they load into it
            out[key] = dataclasses.replace(
                sh, data=torch.full_like(sh.data, float("nan"), dtype=torch.float32)
            )
        else:
            out[key] = sh
    return out


def load_weights(
    main: MainParams, model: MegatronModule, directory: Path, model_state: Mapping[str, Any]
) -> None:
    """A checkpoint's weights into the model and its masters. In bf16 the masters take the stored tensors
    as stored (an fp32 checkpoint's weights stay fp32) and the model takes them rounded: seeding the
    masters from the rounded model would throw away every digit below bf16's before the first step."""
    if not main.mixed:
        load_model_weights(model, directory, model_state=model_state)
        return
    template = fp32_template(model_state)
    load_model_weights(model, directory, model_state=template)
    main.set_masters_from_state(model, template)
    if any(bool(m.isnan().any()) for m in main.masters):
        raise TrainError(
            "a weight of the checkpoint did not load into its fp32 master",
            where=str(directory),
            fix="load it with bf16 = false, or report the checkpoint's layout",
        )


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
