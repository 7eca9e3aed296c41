"""AdamW for the local backend, and its state in the checkpoint layouts Megatron-LM writes and reads.

The local trainer steps a plain torch AdamW (exact on CPU and one GPU) grouped as megatron-core groups
it: no weight decay on 1-D parameters (norms, biases), each group tagged with the keys megatron-core
matches groups by on load (`wd_mult`, `lr_mult`, `is_expert_parallel`, `is_decoupled_lr`).

It saves what Megatron-LM's DistributedOptimizer saves with `--dist-ckpt-optim-fully-reshardable`
(the layout longctx's cluster argv asks for): per parameter its fp32 value and Adam moments,
param-shaped, under `optimizer.state.{param,exp_avg,exp_avg_sq}.<model key>`, the param groups
(with the step) in the common state, and content metadata naming the layout. Megatron-LM resumes
that with `--use-distributed-optimizer`, at any TP/DP.

It reads that layout, Megatron's plain fp32 optimizer (`common_step` inside `state`), its bf16 one
(`fp32_from_fp16_params` master copies) and longctx's earlier saves (`common_step` beside `state`).
The dp_reshardable layout (the state flattened in the order of Megatron's gradient buffers) is refused:
nothing in the checkpoint says where each parameter lies in those buffers.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.dist_checkpointing.mapping import ShardedStateDict, StateDict
from megatron.core.dist_checkpointing.optimizer import (
    get_param_id_to_sharded_param_map,
    make_sharded_optimizer_tensor,
    optim_state_to_sharding_state,
)

from longctx.errors import TrainError
from longctx.train.spec import LRSchedule

FULLY_RESHARDABLE = "fully_reshardable"
PLAIN = "plain"  # megatron-core's FP32Optimizer (and longctx's earlier saves)
FLOAT16 = (
    "float16"  # megatron-core's Float16OptimizerWithFloat16Params (bf16 without --use-distributed-optimizer)
)
READABLE = (FULLY_RESHARDABLE, PLAIN, FLOAT16)
MOMENTS = ("exp_avg", "exp_avg_sq")

# what Megatron-LM's save records as `content_metadata` for the layout above (its loader reads the
# distributed-optimizer layout from here, not from the argv)
CONTENT_METADATA: dict[str, Any] = {
    "distrib_optim_sharding_type": FULLY_RESHARDABLE,
    "distrib_optim_fully_reshardable_mem_efficient": False,
    "singleton_local_shards": False,
    "chained_optim_avoid_prefix": True,
}


def build_optimizer(params: list[torch.nn.Parameter], cfg: LRSchedule) -> torch.optim.AdamW:
    """AdamW over `params` (the fp32 masters of `longctx.train.precision`), grouped as Megatron groups."""
    decay, no_decay = [], []
    for p in params:
        (no_decay if p.dim() < 2 else decay).append(p)
    tags = {
        "lr_mult": 1.0,
        "is_expert_parallel": False,
        "is_decoupled_lr": False,
        "default_config": True,
        "max_lr": cfg.lr,
        "min_lr": cfg.min_lr,
    }
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay, "wd_mult": 1.0, **tags},
        {"params": no_decay, "weight_decay": 0.0, "wd_mult": 0.0, **tags},
    ]
    # foreach=None: torch's default, the batched (foreach) update on CUDA
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps)


def parameters(opt: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    """The optimizer's parameters in its own order (the ids of its state dict)."""
    return [p for g in opt.param_groups for p in g["params"]]


def model_order(
    opt: torch.optim.Optimizer, masters: list[torch.nn.Parameter], model_params: list[torch.nn.Parameter]
) -> list[torch.nn.Parameter]:
    """The model parameter of each optimizer parameter, in the optimizer's order: the checkpoint names
    an optimizer entry by its model parameter's key (masters and model parameters are aligned lists)."""
    by_master = {id(m): p for m, p in zip(masters, model_params, strict=True)}
    return [by_master[id(m)] for m in parameters(opt)]


def init_state(opt: torch.optim.AdamW) -> None:
    """Create zero moments (as the first step would) so a checkpoint can be loaded into them."""
    for p in parameters(opt):
        st = opt.state[p]
        if not st:
            st["step"] = torch.tensor(0.0)
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def current_step(opt: torch.optim.AdamW) -> float:
    steps = {float(st["step"]) for st in opt.state.values() if "step" in st}
    return max(steps) if steps else 0.0


def _groups_without_params(opt: torch.optim.AdamW, step: float) -> list[dict[str, Any]]:
    return [{**{k: v for k, v in g.items() if k != "params"}, "step": step} for g in opt.param_groups]


# -- save -------------------------------------------------------------------------------------------------


def sharded_state_dict(
    opt: torch.optim.AdamW, model_sharded: ShardedStateDict, model_params: list[torch.nn.Parameter]
) -> ShardedStateDict:
    """The optimizer's state in the distributed optimizer's fully_reshardable layout (see the module);
    `model_params`: `model_order(…)`."""
    init_state(opt)
    id_map = get_param_id_to_sharded_param_map(model_sharded, model_params)
    param_state: dict[int, dict[str, Any]] = {}
    for i, p in enumerate(parameters(opt)):
        st = opt.state[p]
        tensors = {"param": p.detach().float(), **{k: st[k].detach().float() for k in MOMENTS}}
        param_state[i] = {
            k: make_sharded_optimizer_tensor(id_map[i], t, prefix=f"optimizer.state.{k}")
            for k, t in tensors.items()
        }
    return {
        "optimizer": {"param_groups": _groups_without_params(opt, current_step(opt))},
        "param_state": param_state,
        "param_state_sharding_type": FULLY_RESHARDABLE,
    }


# -- load -------------------------------------------------------------------------------------------------


def layout_of(common: StateDict, where: str) -> str:
    """Which optimizer layout a checkpoint's common state describes; refuses the ones not readable."""
    opt = common.get("optimizer")
    if not isinstance(opt, dict):
        raise TrainError(
            "the checkpoint holds no optimizer state",
            where=where,
            fix="it was saved with --no-save-optim: start the stage from it as a pretrained checkpoint instead",
        )
    declared = opt.get("param_state_sharding_type") or (common.get("content_metadata") or {}).get(
        "distrib_optim_sharding_type"
    )
    if declared is not None:
        layout = str(declared)
    elif isinstance(opt.get("optimizer"), dict) and "param_groups" in opt["optimizer"]:
        layout = FLOAT16  # the torch optimizer's state one level down; the masters are all sharded
    elif "param_groups" in opt:
        layout = PLAIN
    else:
        raise TrainError(
            f"the checkpoint's optimizer state has a structure the local backend does not know "
            f"(keys {sorted(map(str, opt))})",
            where=where,
            fix="continue this stage on the backend that saved it, or start from it as a pretrained checkpoint",
        )
    if layout not in READABLE:
        raise TrainError(
            f"the checkpoint's optimizer state is in the distributed optimizer's {layout!r} layout, which "
            "is ordered by Megatron-LM's gradient buffers; the local backend reads fully_reshardable, "
            "plain and bf16 (fp32 master) optimizer states",
            where=where,
            fix="resave it from Megatron-LM with --dist-ckpt-optim-fully-reshardable (longctx's argv has it), "
            "or continue this stage on --backend megatron-lm",
        )
    return layout


def template(
    opt: torch.optim.AdamW,
    model_sharded: ShardedStateDict,
    layout: str,
    model_params: list[torch.nn.Parameter],
) -> ShardedStateDict:
    """The load template of `layout` for this optimizer (tensors to be filled in place or returned);
    `model_params`: `model_order(…)`."""
    init_state(opt)
    params = parameters(opt)
    id_map = get_param_id_to_sharded_param_map(model_sharded, model_params)

    def sh(i: int, key: str, like: torch.Tensor) -> Any:
        return make_sharded_optimizer_tensor(id_map[i], torch.empty_like(like, dtype=torch.float32), key)

    if layout == FULLY_RESHARDABLE:
        return {
            "param_state": {
                i: {k: sh(i, f"optimizer.state.{k}", p) for k in ("param", *MOMENTS)}
                for i, p in enumerate(params)
            }
        }
    sd = opt.state_dict()
    optim_state_to_sharding_state(sd, id_map, exclude_keys=("step",))
    if layout == PLAIN:
        return sd
    # float16: the torch optimizer's state under "optimizer", masters per group in group order
    ids = iter(range(len(params)))
    masters = [
        [sh(next(ids), "optimizer.state.fp32_param", p) for p in g["params"]] for g in opt.param_groups
    ]
    return {"optimizer": sd, "fp32_from_fp16_params": masters}


def load(opt: torch.optim.AdamW, loaded: StateDict, layout: str) -> dict[int, torch.Tensor]:
    """Put the moments and step `dist_checkpointing.load` returned for `template(…, layout)` into `opt`;
    the fp32 masters the save holds, by position in the optimizer ({} when it has none)."""
    params = parameters(opt)
    masters: dict[int, torch.Tensor] = {}
    if layout == FULLY_RESHARDABLE:
        groups = loaded["optimizer"]["param_groups"]
        step = float(groups[0].get("step", 0.0)) if groups else 0.0
        per_param = loaded["param_state"]
        moments = {int(i): {k: per_param[i][k] for k in MOMENTS} for i in per_param}
        masters = {int(i): per_param[i]["param"] for i in per_param}
    else:
        inner = loaded["optimizer"] if layout == FLOAT16 else loaded
        state = dict(inner["state"])
        # Megatron keeps the shared step inside `state`; longctx's earlier saves kept it beside it
        step = float(state.pop("common_step", inner.get("common_step", 0.0)))
        moments = {int(i): {k: st[k] for k in MOMENTS} for i, st in state.items()}
        if layout == FLOAT16:
            flat = [t for group in loaded["fp32_from_fp16_params"] for t in group]
            masters = dict(enumerate(flat))
    for i, p in enumerate(params):
        st = opt.state[p]
        for k in MOMENTS:
            st[k].copy_(moments[i][k].to(st[k].dtype))
        st["step"] = torch.tensor(step)
    return masters
