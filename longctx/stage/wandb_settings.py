"""A stage's W&B settings from the plan's [wandb] table: the same for both backends (Megatron-LM's flags,
the local trainer's spec)."""

from __future__ import annotations

from longctx.plan.derive import ResolvedStage
from longctx.train.spec import WandbSettings


def stage_wandb(st: ResolvedStage) -> WandbSettings | None:
    """None when the plan logs no W&B; else the stage's run: `<exp_name>-<stage>`, its own save dir."""
    w = st.wandb
    if w is None:
        return None
    return WandbSettings(project=w.project, exp_name=w.exp_name, save_dir=str(w.save_dir))
