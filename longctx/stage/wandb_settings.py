"""A stage's W&B settings from the plan's [wandb] table: the same for both backends (Megatron-LM's flags,
the local trainer's spec)."""

from __future__ import annotations

from longctx.plan import paths
from longctx.plan.schema import Plan
from longctx.train.spec import WandbSettings


def stage_wandb(plan: Plan, stage: str) -> WandbSettings | None:
    """None when the plan logs no W&B; else the stage's run: `<exp_name>-<stage>`, its own save dir."""
    w = plan.wandb
    if w is None:
        return None
    root = (
        paths.resolve(w.save_dir, plan, field="wandb.save_dir")
        if w.save_dir
        else paths.stage_dir(plan, stage)
    )
    save_dir = root / stage if w.save_dir else root / "wandb"
    return WandbSettings(project=w.project, exp_name=f"{w.exp_name}-{stage}", save_dir=str(save_dir))
