"""AdamW for the local backend and its state in Megatron-LM's fully-reshardable checkpoint layout.

Each Adam moment is saved param-shaped under `optimizer.state.<exp_avg|exp_avg_sq>.<model key>`
(megatron-core's `optim_state_to_sharding_state`), so it reshards with the model like the weights.
Megatron's DistributedOptimizer needs CUDA buffers; a plain torch AdamW with Megatron's grouping
(no weight decay on 1-D parameters: norms and biases) is exact on CPU and one GPU.
"""

from __future__ import annotations

import torch
from megatron.core.dist_checkpointing.mapping import ShardedStateDict, StateDict
from megatron.core.dist_checkpointing.optimizer import (
    get_param_id_to_sharded_param_map,
    optim_state_to_sharding_state,
)

from longctx.train.spec import LRSchedule


def build_optimizer(model: torch.nn.Module, cfg: LRSchedule) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.dim() < 2 else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps, foreach=False
    )


def _params(opt: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [p for g in opt.param_groups for p in g["params"]]


def init_state(opt: torch.optim.AdamW) -> None:
    """Create zero moments (as the first step would) so a checkpoint can be loaded into them."""
    for p in _params(opt):
        st = opt.state[p]
        if not st:
            st["step"] = torch.tensor(0.0)
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def sharded_state_dict(opt: torch.optim.AdamW, model_sharded: ShardedStateDict) -> ShardedStateDict:
    """The optimizer's state with each moment as a ShardedTensor of its parameter (Megatron's layout)."""
    init_state(opt)
    id_map = get_param_id_to_sharded_param_map(model_sharded, _params(opt))
    sd = opt.state_dict()
    steps = {int(pid): float(st["step"]) for pid, st in sd["state"].items()}
    optim_state_to_sharding_state(sd, id_map, exclude_keys=("step",))
    # every parameter takes the same number of steps; Megatron stores it once as well
    sd["common_step"] = max(steps.values()) if steps else 0.0
    return sd


def load_sharded(opt: torch.optim.AdamW, loaded: StateDict) -> None:
    """Load what `dist_checkpointing.load` returned for `sharded_state_dict`'s template."""
    step = float(loaded.pop("common_step", 0.0))
    state = {int(pid): {k: v for k, v in st.items()} for pid, st in loaded["state"].items()}
    for st in state.values():
        st["step"] = torch.tensor(step)
    current = opt.state_dict()
    groups = loaded.get("param_groups", current["param_groups"])
    # param ids are positions in the optimizer; keep this optimizer's own lists
    for g_new, g_cur in zip(groups, current["param_groups"], strict=True):
        g_new["params"] = g_cur["params"]
    opt.load_state_dict({"state": state, "param_groups": groups})
